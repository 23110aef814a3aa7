//! # rail-exact-algo
//!
//! The native-ALGO `exact-algo` scheme (`docs/exact-algo.md`): an x402-style envelope (`402` +
//! `PAYMENT-REQUIRED`, `PAYMENT-SIGNATURE`, `PAYMENT-RESPONSE`) that settles in native ALGO. A
//! payer signs one native `pay` transaction with the challenge's paymentId as its note; the
//! receiver checks it strictly, submits it to algod and answers with a receipt.
//!
//! | module | what |
//! |---|---|
//! | [`payer`] | [`ExactAlgoPayer`]: chooses an option by [`Policy`], checks the network and the balance, signs |
//! | [`receiver`] | [`ExactAlgoReceiver`]: challenges, strict verification, settlement, receipts exactly once |
//! | [`avm`] | x402's own `exact` on Algorand: USDC and other ASAs, the fee-payer group, its facilitator and payer |
//! | [`scheme`] | [`ExactAlgo`]: the scheme for the shared x402 transport (its paywall serves the HTTP flow, `docs/exact-algo.md` §1–§2) |
//! | [`http`] | the discovery documents (`/llms.txt`, `/.well-known/exact-algo.json`) |
//! | [`mcp`] | the MCP surface (`docs/exact-algo.md` §5) on rmcp: `payment_instructions`, price annotations (the endpoint and the paid tools are the shared transport's) |
//! | [`rail`] | the rail-core traits ([`rail_core::Payer`], [`rail_core::RailReceiver`]) |
//! | [`algod`] | a small algod v2 REST client |
//! | [`txn`], [`msgpack`], [`address`] | strict canonical decoding, txids, Ed25519 `verify_strict` |
//! | [`rules`] | every rule of `docs/exact-algo.md` §3, each with its error code |
//! | [`payment_id`] | paymentId lifecycle (issued → submitting → settled) on the rail-core replay guard |
//! | [`wire`] | the 402 body, the envelope and the receipt; the six error codes (`docs/exact-algo.md` §4.1); both spellings of a network |
//!
//! ## Features
//!
//! A default build is what a payer or a receiver's verifier needs: no HTTP server, no devnet,
//! no command-line tool, no SQL driver. The algod-compatible devnet, the example receiver app and
//! their binaries (`algod-devnet`, `exact-algo-receiver`) are the `algod-devnet` crate
//! (`devnets/algod`), a dev-dependency here.
//!
//! | feature | what it adds |
//! |---|---|
//! | `paywall` | [`http`] (the axum paywall and discovery documents) and [`mcp`] (axum, tower) |
//! | `postgres` | `rail_core::keys::sql::PgKeyStore`, to share paymentIds between instances |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use ed25519_dalek::SigningKey;
//! use rail_core::{MemoryKeyStore, SystemClock};
//! use algod_devnet::{Devnet, DevnetConfig};
//! use rail_exact_algo::{
//!     Address, AlgodClient, ExactAlgoPayer, ExactAlgoReceiver, Policy, Price,
//! };
//!
//! let payer_key = SigningKey::from_bytes(&[1; 32]);
//! let treasury = Address(SigningKey::from_bytes(&[2; 32]).verifying_key().to_bytes());
//! // A devnet in process (use a real algod's URL and token instead).
//! let net = Devnet::spawn(
//!     DevnetConfig {
//!         accounts: vec![(Address(payer_key.verifying_key().to_bytes()), 1_000_000), (treasury, 100_000)],
//!         ..DevnetConfig::default()
//!     },
//!     "127.0.0.1:0".parse()?,
//! )
//! .await?;
//! let algod = AlgodClient::new(&net.url, None)?;
//! let store = Arc::new(MemoryKeyStore::default()); // PgKeyStore to share between instances
//!
//! // Receiver: a challenge for one resource, then settle what the payer sends.
//! let receiver = ExactAlgoReceiver::connect(algod.clone(), treasury, store.clone(), Arc::new(SystemClock)).await?;
//! let price = Price { resource: "/api/posts/1".into(), description: "read post body".into(), amount: 1000 };
//! let required = receiver.payment_required(&price, "payment required").await?;
//!
//! // Payer: pays within its policy (never above 1 ALGO here).
//! let payer = ExactAlgoPayer::new(payer_key, algod, Policy { max_amount: 1_000_000, ..Policy::default() }, store.clone(), Arc::new(SystemClock));
//! let signed = payer.pay_required(&required).await?;
//!
//! let receipt = receiver.settle(&signed.header, &price, None).await?;
//! assert!(receipt.success);
//! assert_eq!(net.devnet.balance(&treasury), 101_000);
//! // The same payment again is refused with `paymentId already used` (`docs/exact-algo.md` §8).
//! let again = receiver.settle(&signed.header, &price, None).await.unwrap_err();
//! assert_eq!(again.code(), "paymentId already used");
//! # Ok(())
//! # }
//! ```

pub mod address;
pub mod algod;
pub mod avm;
#[cfg(feature = "paywall")]
pub mod http;
#[cfg(feature = "paywall")]
pub mod mcp;
pub mod msgpack;
pub mod payer;
pub mod payment_id;
pub mod rail;
pub mod receiver;
pub mod rules;
pub mod scheme;
pub mod txn;
pub mod wire;

pub use address::Address;
pub use algod::{AlgodClient, AlgodError};
#[cfg(feature = "paywall")]
pub use http::{ServiceInfo, discovery_router};
pub use payer::{ExactAlgoPayer, PayError, Policy, SignedPayment};
pub use rail::{ExactAlgoProof, RAIL};
pub use receiver::{ExactAlgoReceiver, Price, Refusal, Settlement};
pub use scheme::ExactAlgo;
