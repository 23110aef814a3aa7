//! Wrappers around any payer, written once (tower's shape): each is a [`crate::Payer`] that
//! adds one concern to the payer it wraps.
//!
//! | wrapper | concern |
//! |---|---|
//! | [`Idempotent`] | one payment per operation id: a repeat returns the first payment; an attempt whose holder died is recovered on the rail ([`FindPayment`]) before anything is paid again |
//! | [`SpendLimit`] | a durable [`Budget`]: per payment, per period, in total; a refusal moves nothing |
//!
//! Layer them outside in: `SpendLimit<Idempotent<P>>` — a repeat of one operation is counted once
//! by the budget and paid once by the rail.
//!
//! ```
//! # async fn demo(raw: impl rail_core::payer::FindPayment + rail_core::Payer + 'static) -> rail_core::RailResult<()> {
//! use rail_core::payer::{Budget, Idempotent, BudgetLimits, SpendLimit};
//! use rail_core::{Asset, MemoryKeyStore, Money};
//! use std::{sync::Arc, time::Duration};
//! let store = Arc::new(MemoryKeyStore::default());
//! let limits = BudgetLimits {
//!     per_payment: Some(Money::parse(Asset::usd(), "5.00")?),
//!     per_period: Some((Duration::from_secs(24 * 3600), Money::parse(Asset::usd(), "20.00")?)),
//!     total: None,
//! };
//! let payer = SpendLimit::new(Idempotent::new(raw, store.clone()), Budget::new(store, "agent-1", limits)?);
//! # let _ = payer; Ok(()) }
//! ```

mod idempotent;
mod limit;

pub use idempotent::{FindPayment, Idempotent};
pub use limit::{Budget, BudgetLimits, Spend, SpendLimit};

#[cfg(test)]
mod tests;
