//! # rail-core
//!
//! The foundation of Stipendex rails: the traits every payment rail implements, exact money,
//! one error type with stable codes, single-use keys (replay guard) and operation-id
//! idempotency, and an injectable clock.
//!
//! | what | where |
//! |---|---|
//! | payer / receiver traits, capabilities | [`rail`] ([`Payer`], [`HoldPayer`], [`RailReceiver`], [`HoldReceiver`], [`RefundReceiver`]) |
//! | offers, payments, results | [`types`] ([`Offer`], [`Payment`], [`Verified`], …) |
//! | exact amounts and assets | [`money`] ([`Amount`], [`Asset`], [`Money`]) |
//! | errors | [`error`] ([`RailError`], codes, retry classes) |
//! | single-use keys, leases, idempotency, write-ahead settlements | [`keys`] (+ SQLite/PostgreSQL stores behind the `sqlite` / `postgres` features) |
//! | wrappers around any payer: idempotency, spending limits | [`payer`] ([`payer::Idempotent`], [`payer::SpendLimit`], [`payer::Budget`]) |
//! | what every rail's trait glue repeats: offers, payments, verifications, checks | [`glue`] |
//! | time | [`clock`] ([`Clock`], [`ManualClock`]; [`rfc3339`] for the times people read) |
//!
//! A receiver and a payer, end to end, with any rail that implements the traits:
//!
//! ```
//! use rail_core::{Charge, Money, Asset, OpId, Payer, RailReceiver, RailResult};
//! use std::time::Duration;
//!
//! async fn sell(receiver: &dyn RailReceiver, payer: &dyn Payer) -> RailResult<()> {
//!     let price = Money::parse(Asset::usd(), "0.05")?;
//!     let offer = receiver.offer(&Charge::capture(price, Duration::from_secs(120))).await?;
//!     let payment = payer.pay(&OpId::random(), &offer).await?;      // the wallet's side
//!     let verified = receiver.verify(&offer, &payment).await?;      // single use: a replay fails
//!     assert_eq!(verified.amount, offer.amount);
//!     Ok(())
//! }
//! ```

pub mod clock;
pub mod error;
pub mod glue;
pub mod keys;
pub mod money;
pub mod payer;
pub mod rail;
pub mod route;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod types;

pub use clock::{Clock, ManualClock, SharedClock, SystemClock, Timestamp, rfc3339};
pub use error::{Binding, RailError, RailReason, RailResult};
pub use keys::{Idempotency, KeyStore, MemoryKeyStore, ReplayGuard, SettlementBook};
pub use money::{Amount, Asset, Money, MoneyError};
pub use rail::{
    Capabilities, Finality, HoldPayer, HoldReceiver, PayEffect, Payer, PayerHandle, Rail,
    RailHandle, RailReceiver, ReceiverHandle, RefundReceiver,
};
pub use types::{
    Captured, Charge, LATE_PROOF_GRACE, Offer, OpId, Payment, PaymentMode, PaymentState, RailId,
    Refunded, Verified, Voided,
};
