//! The ledger as a payment rail (`ledger`; the hosted `account` rail runs on it): pay = transfer, hold = pending
//! transfer, capture = post, void, refund = reversal, verify = look the transfer up and bind it
//! to the offer (amount, payee, offer id) — once.
//!
//! [`payer`] spends from one account ([`LedgerPayer`]); [`receiver`] offers, verifies once,
//! captures, voids and refunds ([`LedgerReceiver`]); this module holds what both sides share:
//! the proof, the offer details, hold terms, and the binding of transfers to offers and
//! operations.
//!
//! Offer ids are bound into each transfer's `user_data` (the first 16 bytes of
//! `SHA-256("stipendex-ledger/offer" || offer id)`); transfer ids are derived from the caller's
//! operation id, so a retried operation is the same transfer and never a second one.

use std::time::Duration;

use rail_core::{
    Amount, Asset, Capabilities, Finality, Money, OpId, RailError, RailReason, RailResult,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ledger::Ledger;
use crate::types::{AccountId, Created, Transfer, TransferError, TransferId, TransferRequest};

mod payer;
mod receiver;

pub use payer::LedgerPayer;
pub use receiver::LedgerReceiver;
/// The rail's name.
pub const RAIL: &str = "ledger";

/// The ledger rail's proof of payment: the transfer id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerProof {
    /// The transfer (single or pending) that pays the offer.
    pub transfer_id: TransferId,
}

/// The ledger rail's offer details.
///
/// Hold offers say how long the payer must hold the funds, in milliseconds (`hold_ms`).
/// Offers written before milliseconds carried whole seconds (`hold_secs`): still read, never
/// written. An offer carrying both must have them agree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerOfferDetails {
    /// How long a hold must last, in milliseconds (hold offers only; never 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
    /// The same in whole seconds, as older offers said it (read only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_secs: Option<u64>,
}

/// How long a hold lasts when a hold offer names no duration.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(3600);

/// The longest hold a [`LedgerPayer`] agrees to by default.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(6 * 3600);

impl LedgerOfferDetails {
    /// The hold duration the offer asks for, in milliseconds: `hold_ms`, else `hold_secs` ×
    /// 1000, else [`DEFAULT_HOLD`]. Not checked against any limit here (0 included).
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] when `hold_secs` does not fit in milliseconds, or the two
    /// fields disagree.
    pub fn hold_duration_ms(&self) -> RailResult<u64> {
        let from_secs = self
            .hold_secs
            .map(|s| {
                s.checked_mul(1000).ok_or_else(|| {
                    RailError::InvalidInput(format!(
                        "offer details: hold_secs {s} does not fit in milliseconds"
                    ))
                })
            })
            .transpose()?;
        match (self.hold_ms, from_secs) {
            (Some(ms), Some(s)) if ms != s => Err(RailError::InvalidInput(format!(
                "offer details: hold_ms {ms} and hold_secs {} disagree",
                self.hold_secs.unwrap_or_default()
            ))),
            (Some(ms), _) | (None, Some(ms)) => Ok(ms),
            (None, None) => Ok(millis(DEFAULT_HOLD)),
        }
    }
}

/// A duration in whole milliseconds (rounded down), saturating at `u64::MAX` (584 million
/// years: only ever a limit, never an amount of time anything lasts).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why the ledger rail refused a hold: on the payer's side the duration an offer asks for, on
/// the receiver's side the hold presented. Reaches callers as [`RailError::Rail`] with
/// [`HoldRefusal::code`] as the reason's code (not retryable).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HoldRefusal {
    /// A hold without a timeout: 0 ms means "never expires" on the ledger, which would lock
    /// the payer's funds until the receiver acts.
    #[error("{0} is 0 ms: a hold must have a timeout (0 means it never expires)")]
    NoTimeout(&'static str),
    /// The offer asks for a longer hold than this payer agrees to.
    #[error("the offer asks for a {asked_ms} ms hold, above this payer's maximum of {max_ms} ms")]
    TooLong {
        /// What the offer asks.
        asked_ms: u64,
        /// The payer's cap ([`LedgerPayer::with_max_hold`]).
        max_ms: u64,
    },
    /// The hold is shorter than the offer asked.
    #[error("the hold lasts {hold_ms} ms, the offer asks for {asked_ms} ms")]
    TooShort {
        /// The hold's timeout.
        hold_ms: u64,
        /// What the offer asked.
        asked_ms: u64,
    },
    /// Too little of the hold is left for the receiver to capture it.
    #[error("the hold has {left_ms} ms left, {required_ms} ms required")]
    TooLittleLeft {
        /// Time left before the hold lapses, by the ledger's time.
        left_ms: i64,
        /// What the receiver requires ([`LedgerReceiver::with_min_hold_left`]).
        required_ms: u64,
    },
}

impl HoldRefusal {
    /// The stable machine code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            HoldRefusal::NoTimeout(_) => "hold_without_timeout",
            HoldRefusal::TooLong { .. } => "hold_too_long",
            HoldRefusal::TooShort { .. } => "hold_too_short",
            HoldRefusal::TooLittleLeft { .. } => "hold_time_left_too_short",
        }
    }
}

impl From<HoldRefusal> for RailError {
    fn from(h: HoldRefusal) -> Self {
        RailError::Rail {
            reason: RailReason::new(h.code(), h.to_string()),
            retryable: false,
        }
    }
}

/// `user_data` binding a transfer to an offer id.
#[must_use]
pub fn offer_binding(offer_id: &str) -> u128 {
    let h = Sha256::new()
        .chain_update(b"stipendex-ledger/offer")
        .chain_update(offer_id.as_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(h.get(..16).unwrap_or(&[0; 16]));
    u128::from_be_bytes(b)
}

/// The transfer id of operation `op` by `account` doing `what`.
#[must_use]
pub fn op_transfer_id(account: AccountId, what: &str, op: &OpId) -> TransferId {
    let h = Sha256::new()
        .chain_update(b"stipendex-ledger/op")
        .chain_update(account.to_bytes())
        .chain_update(what.as_bytes())
        .chain_update([0u8])
        .chain_update(op.as_str().as_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(h.get(..16).unwrap_or(&[0; 16]));
    TransferId((u128::from_be_bytes(b) | 1) & !crate::types::RESERVED_BIT)
}

fn capabilities(asset: &Asset) -> Capabilities {
    rail_core::glue::full_capabilities(Finality::Immediate, asset)
}

fn minor(money: &Money) -> RailResult<u64> {
    let v = money.minor_i64()?;
    u64::try_from(v).map_err(|_| RailError::InvalidInput("negative amount".into()))
}

fn money(asset: &Asset, units: u64) -> RailResult<Money> {
    Ok(Money::from_minor(asset.clone(), u128::from(units))?)
}

fn amount_of(asset: &Asset, units: u64) -> Amount {
    money(asset, units).map_or(Amount::ZERO, |m| m.amount())
}

/// Applies one transfer for operation `op` (which asked for `requested`) and maps a refusal
/// to the rail error the caller sees: a reused operation id is an idempotency conflict
/// naming `op`, a capture or refund above what is left says both amounts.
async fn apply(
    ledger: &Ledger,
    op: &OpId,
    req: TransferRequest,
    asset: &Asset,
    requested: Amount,
) -> RailResult<Created> {
    let exceeds = |what: &'static str, available: u64| RailError::ExceedsAvailable {
        op: what,
        requested,
        available: amount_of(asset, available),
    };
    ledger.transfer(req).await.map_err(|e| match e {
        crate::LedgerError::Refused(TransferError::ExistsWithDifferentFields) => {
            RailError::IdempotencyConflict {
                op_id: op.to_string(),
            }
        }
        crate::LedgerError::Refused(TransferError::ExceedsPendingAmount { pending }) => {
            exceeds("capture", pending)
        }
        crate::LedgerError::Refused(TransferError::ExceedsReversible { available }) => {
            exceeds("refund", available)
        }
        other => other.into(),
    })
}

/// Checks a hold presented for an offer that asked for `asked_ms`: it has a timeout, lasts at
/// least what was asked, has not lapsed by `now` (the clock the ledger expires holds by) and
/// has `min_left` still to run (by default half of `asked_ms`), so that it can still be
/// captured. Shared by [`LedgerReceiver`] and services that verify ledger holds for others.
///
/// # Errors
/// A [`HoldRefusal`] (as [`RailError::Rail`]), or [`RailError::InvalidState`] (`expired`).
pub fn check_hold_terms(
    t: &Transfer,
    asked_ms: u64,
    now: rail_core::Timestamp,
    min_left: Option<Duration>,
) -> RailResult<()> {
    if t.timeout_ms == 0 {
        return Err(HoldRefusal::NoTimeout("the hold's timeout").into());
    }
    if t.timeout_ms < asked_ms {
        return Err(HoldRefusal::TooShort {
            hold_ms: t.timeout_ms,
            asked_ms,
        }
        .into());
    }
    let left_ms = t
        .expires_at()
        .map_or(i64::MAX, |e| e.0.saturating_sub(now.0));
    if left_ms <= 0 {
        return Err(RailError::InvalidState {
            op: "verify",
            state: "expired".into(),
        });
    }
    let required_ms = min_left.map_or(asked_ms / 2, millis);
    if u64::try_from(left_ms).is_ok_and(|left| left < required_ms) {
        return Err(HoldRefusal::TooLittleLeft {
            left_ms,
            required_ms,
        }
        .into());
    }
    Ok(())
}

fn parse_account(s: &str, what: &str) -> RailResult<AccountId> {
    s.parse()
        .map_err(|e| RailError::InvalidInput(format!("{what}: {e}")))
}
