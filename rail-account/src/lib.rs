//! # rail-account
//!
//! The Stipendex **`account` rail**: payers and receivers that keep no ledger of their own
//! hold accounts at a hosted facilitator (`stipendex facilitator`), which runs the ledger,
//! verifies payments once for every receiver instance, holds, captures, voids, refunds, and
//! sends large payments to a human review queue.
//!
//! - [`AccountPayer`] pays and holds offers from the client's account;
//!   a payment held for review is [`rail_core::RailError::PendingReview`] (or
//!   [`Submitted::PendingReview`] from [`AccountPayer::submit`]), and the same operation again
//!   reports the decision.
//! - [`AccountReceiver`] makes offers into its account and has the facilitator verify,
//!   capture, void and refund.
//! - [`AccountClient`] signs every request with the account's Ed25519 key ([`auth`]) and
//!   fails over between the facilitator's instances with the same idempotency key.
//! - [`api`] is the wire protocol, shared with the facilitator.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use rail_account::{AccountClient, AccountKey, AccountPayer, AccountReceiver};
//! use rail_core::{Asset, Charge, Money, OpId, Payer, RailReceiver};
//!
//! let network = "facilitator.example";
//! let shop_key = AccountKey::from_hex(&std::env::var("SHOP_ACCOUNT_KEY")?)?;
//! let shop = AccountClient::new(["https://facilitator.example"], "00000000000000000000000000000b0b", shop_key, network)?;
//! let agent_key = AccountKey::from_hex(&std::env::var("AGENT_ACCOUNT_KEY")?)?;
//! let agent = AccountClient::new(["https://facilitator.example"], "0000000000000000000000000000a11c", agent_key, network)?;
//!
//! let receiver = AccountReceiver::new(shop, Asset::usd());
//! let payer = AccountPayer::new(agent, Asset::usd());
//! let offer = receiver.offer(&Charge::capture(Money::parse(Asset::usd(), "0.25")?, Duration::from_secs(60))).await?;
//! let payment = payer.pay(&OpId::random(), &offer).await?;
//! let verified = receiver.verify(&offer, &payment).await?; // once: a second verify is `replayed`
//! assert_eq!(verified.amount.minor_units(), 25);
//! # Ok(()) }
//! ```

pub mod api;
pub mod auth;
mod client;
mod payer;
mod receiver;

use rail_core::{Asset, Capabilities, Finality, RailError, RailResult};

pub use auth::{AccountKey, AccountPublicKey, AuthError};
pub use client::{AccountClient, Answer, DEFAULT_TIMEOUT, DOWN_FOR};
pub use payer::{AccountPayer, Submitted};
pub use receiver::{AccountReceiver, DEFAULT_HOLD};

/// The rail's name.
pub const RAIL: &str = "account";

/// What the rail can do: everything the ledger behind the facilitator can.
#[must_use]
pub fn capabilities(asset: &Asset) -> Capabilities {
    rail_core::glue::full_capabilities(Finality::Immediate, asset)
}

/// Refuses an account or payment id that is not 32 lowercase hex digits.
///
/// # Errors
/// [`RailError::InvalidInput`].
pub fn check_id(id: &str) -> RailResult<()> {
    if id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(RailError::InvalidInput(format!(
            "{id:?} is not an account or payment id (32 lowercase hex digits)"
        )))
    }
}
