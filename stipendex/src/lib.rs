//! # stipendex
//!
//! The one crate a wallet or a receiver depends on: [`rail_core`]'s traits, money and
//! records, each rail behind a cargo feature, and a run-time [`Registry`] that creates the
//! rails a configuration names.
//!
//! ## Pick rails at build time: cargo features
//!
//! | feature | what it adds |
//! |---|---|
//! | `ledger` (default) | [`ledger`]: the embedded double-entry ledger rail |
//! | `account` | [`account`]: accounts at a hosted Stipendex facilitator (`stipendex facilitator`) |
//! | `x402` | [`x402`]: x402 v2 `exact` on EVM (EIP-3009) |
//! | `exact-algo` | [`exact_algo`]: native ALGO in an x402-style envelope |
//! | `stripe` | [`stripe`]: Stripe PaymentIntents |
//! | `ln-nwc` | [`ln_nwc`]: Lightning over Nostr Wallet Connect |
//! | `full` | every rail, both stores |
//! | `sqlite` (default), `postgres` | the stores (sqlx drivers): key store, ledger backend |
//! | `paywall` | receivers' surfaces: the axum paywalls of x402 and exact-algo |
//! | `http` | [`http`]: the Stipendex HTTP binding (402 + Quote; the reqwest client) |
//! | `mcp`, `mcp-http` | [`mcp`]: the Stipendex MCP binding (-32402 + Quote) on rmcp; over Streamable HTTP |
//! | `gateway` | `gateway`: a paid front for an HTTP API or an MCP server (what `stipendex gateway` runs) |
//!
//! ```toml
//! # a wallet that pays x402 and Lightning, nothing else compiled in
//! stipendex = { version = "0.1", default-features = false, features = ["x402", "ln-nwc", "sqlite"] }
//! ```
//!
//! ## Pick rails at run time: the registry
//!
//! A TOML file names the rails (secrets come from the environment only; the format, with
//! one example per rail, is documented in [`registry`]). A rail named in the file but not
//! compiled in is an error naming the missing feature.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::collections::BTreeMap;
//! use std::time::Duration;
//! use stipendex::ledger::{AccountId, Ledger, NewAccount, TransferId, TransferRequest};
//! use stipendex::{Asset, Charge, Money, OpId, Registry};
//!
//! // An operator made the ledger and its accounts (here: a fresh SQLite file).
//! let dir = tempfile::tempdir()?;
//! let url = format!("sqlite://{}/ledger.db", dir.path().display());
//! let ledger = Ledger::sqlite(&url).await?;
//! let (bank, agent, shop) = (AccountId::random(), AccountId::random(), AccountId::random());
//! for (id, no_overdraft) in [(bank, false), (agent, true), (shop, true)] {
//!     ledger.create_account(NewAccount { id, asset: Asset::usd(), no_overdraft }).await?;
//! }
//! ledger.transfer(TransferRequest::Single { id: TransferId::random(), debit: bank, credit: agent, amount: 1_000, user_data: 0 }).await?;
//!
//! let config = format!(r#"
//!     [store]
//!     url = "memory"
//!
//!     [rails.house]
//!     kind = "ledger"
//!     url = "{url}"
//!     asset = "USD"
//!     payer_account = "{agent}"
//!     payee_account = "{shop}"
//! "#);
//! let registry = Registry::from_toml(&config, &BTreeMap::new()).await?;
//!
//! // A receiver quotes on its side of the rail…
//! let receiver = registry.receiver("house")?;
//! let offer = receiver.receiver.offer(&Charge::capture(Money::parse(Asset::usd(), "2.50")?, Duration::from_secs(60))).await?;
//! // …the wallet asks which of its rails can pay it, and pays.
//! assert_eq!(registry.can_pay(&offer), ["house"]);
//! let payment = registry.payer("house")?.payer.pay(&OpId::random(), &offer).await?;
//! let verified = receiver.receiver.verify(&offer, &payment).await?;
//! assert_eq!(verified.amount, offer.amount);
//! # Ok(())
//! # }
//! ```

pub mod chain;
pub mod envelope;
mod error;
#[cfg(feature = "gateway")]
pub mod gateway;
#[cfg(feature = "http")]
pub mod http;
pub mod mcp;
pub mod origin;
pub mod receiver;
pub mod registry;
pub mod wallet;

pub use error::Error;
pub use registry::{Entry, Env, ProcessEnv, Registry};

pub use rail_core;
/// rail-core's receiving side of a rail, named apart from this crate's Stipendex
/// [`receiver::Receiver`] (which quotes, verifies over such a rail and signs receipts).
pub use rail_core::RailReceiver;
pub use rail_core::{
    Amount, Asset, Capabilities, Captured, Charge, Clock, Finality, HoldPayer, HoldReceiver,
    KeyStore, ManualClock, MemoryKeyStore, Money, Offer, OpId, Payer, PayerHandle, Payment,
    PaymentMode, Rail, RailError, RailHandle, RailResult, ReceiverHandle, RefundReceiver,
    ReplayGuard, SharedClock, SystemClock, Timestamp, Verified,
};

/// Accounts at a hosted Stipendex facilitator (`rail-account`).
#[cfg(feature = "account")]
pub use rail_account as account;
/// The embedded double-entry ledger rail (`rail-ledger`).
#[cfg(feature = "ledger")]
pub use rail_ledger as ledger;

/// x402 v2 `exact` on EVM (`rail-x402`).
#[cfg(feature = "x402")]
pub use rail_x402 as x402;

/// Native-ALGO exact-algo (`rail-exact-algo`).
#[cfg(feature = "exact-algo")]
pub use rail_exact_algo as exact_algo;

/// Stripe PaymentIntents (`rail-stripe`).
#[cfg(feature = "stripe")]
pub use rail_stripe as stripe;

/// Lightning over Nostr Wallet Connect (`rail-ln-nwc`).
#[cfg(feature = "ln-nwc")]
pub use rail_ln_nwc as ln_nwc;
