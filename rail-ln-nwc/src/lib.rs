//! # rail-ln-nwc
//!
//! Lightning over Nostr Wallet Connect (NIP-47) as a Stipendex rail.
//!
//! | module | what |
//! |---|---|
//! | [`rail`] | [`rail::NwcReceiver`] / [`rail::NwcPayer`]: preimage-verified payments, hold invoices |
//! | [`client`] | the NIP-47 client on nostr-sdk 0.44 (NIP-44 v2, NIP-04 fallback) |
//! | [`nip47`] | the wire JSON, tolerant of unknown codes, methods and states; the connection URI |
//! | [`relays`] | relay plumbing any Nostr request/response protocol can use: resubscribe on reconnect, wait for relays, read stored events to EOSE, republish until a relay accepts |
//! | [`wire`] | sealing and opening the four event kinds |
//!
//! ## Features
//!
//! None: a library build carries the client and the rail only. The test double — an NWC wallet
//! service over a real relay, backed by an in-process Lightning network, and its binary
//! `nwc-devnet` — is the `nwc-devnet` crate (`devnets/nwc`).
//!
//! ## Example
//!
//! Against the devnet (`nwc-devnet`, a dev-dependency):
//!
//! ```
//! # #[tokio::main(flavor = "multi_thread", worker_threads = 2)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use lightning_invoice::Currency;
//! use rail_core::{Asset, Charge, MemoryKeyStore, Money, OpId, Payer, RailReceiver, SystemClock};
//! use rail_ln_nwc::client::{ClientOptions, NwcClient};
//! use nwc_devnet::{Devnet, DevnetConfig, WalletSpec};
//! use rail_ln_nwc::rail::{NwcPayer, NwcReceiver};
//!
//! // A relay, a wallet service and two funded wallets, in process.
//! let net = Devnet::start(DevnetConfig::default()).await?;
//! let agent = net.create_wallet(WalletSpec::new("agent", 1_000_000)).await?;
//! let shop = net.create_wallet(WalletSpec::new("shop", 0)).await?;
//! let connect = |uri| async move { NwcClient::connect(uri, ClientOptions::default()).await.map(Arc::new) };
//! let (store, clock) = (Arc::new(MemoryKeyStore::default()), Arc::new(SystemClock));
//!
//! let receiver = NwcReceiver::new(connect(&shop.uri).await?, rand::random(), store.clone(), clock.clone()).await?;
//! let payer = NwcPayer::new(connect(&agent.uri).await?, Currency::Regtest,
//!     Money::parse(Asset::btc(), "0.00001")?, clock);
//!
//! let price = Money::from_minor(Asset::btc(), 21_000)?; // 21 sat, in msat
//! let offer = receiver.offer(&Charge::capture(price, std::time::Duration::from_secs(600))).await?;
//! let payment = payer.pay(&OpId::random(), &offer).await?;  // checks the invoice, then the preimage
//! receiver.verify(&offer, &payment).await?;                  // sha256(preimage) == payment hash
//! assert_eq!(net.balance_msat("shop")?, 21_000);
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod nip47;
pub mod rail;
pub mod relays;
pub mod wire;
