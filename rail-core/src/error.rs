//! The one error type of the rail traits: [`RailError`].
//!
//! Every variant has a stable machine code ([`RailError::code`]) that wallets and receivers may
//! match on and put on the wire, and a retry class ([`RailError::is_retryable`]). Where the error
//! came from the rail itself (an x402 `invalidReason`, an exact-algo `underpaid`, a NIP-47 code,
//! a Stripe `decline_code`), the rail's own words are kept in a [`RailReason`].

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::money::{Amount, MoneyError};

/// A rail's own error code and message, preserved verbatim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RailReason {
    /// The rail's code (`insufficient_funds`, `PAYMENT_FAILED`, `card_declined`, …).
    pub code: String,
    /// The rail's message, if any.
    pub message: String,
}

impl RailReason {
    /// A reason from a code and a message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        RailReason {
            code: code.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for RailReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            f.write_str(&self.code)
        } else {
            write!(f, "{}: {}", self.code, self.message)
        }
    }
}

/// Which binding between a payment and its offer did not hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Binding {
    /// The amount paid is not the amount offered.
    Amount,
    /// The asset paid is not the asset offered.
    Asset,
    /// The money went to someone other than the offer's payee.
    Payee,
    /// The payment was made for another offer.
    Offer,
    /// The payment is of another mode (hold vs capture) than the offer asks.
    Mode,
    /// The payment names another rail.
    Rail,
    /// The money came from someone other than the payment claims.
    Payer,
}

impl Binding {
    /// The machine code of a mismatch on this binding.
    #[must_use]
    pub const fn code(self) -> &'static str {
        match self {
            Binding::Amount => "amount_mismatch",
            Binding::Asset => "asset_mismatch",
            Binding::Payee => "payee_mismatch",
            Binding::Offer => "offer_mismatch",
            Binding::Mode => "mode_mismatch",
            Binding::Rail => "rail_mismatch",
            Binding::Payer => "payer_mismatch",
        }
    }
}

impl fmt::Display for Binding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// An error from a rail operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RailError {
    /// The caller's input is invalid (an empty id, a zero amount where one is needed, …).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The payment object cannot be understood (wrong shape, wrong types, missing fields).
    #[error("malformed payment: {0}")]
    MalformedPayment(String),
    /// An amount could not be parsed or converted exactly.
    #[error(transparent)]
    Money(#[from] MoneyError),
    /// The offer's time is up.
    #[error("offer {offer_id} expired at {expired_at}")]
    OfferExpired {
        /// The offer.
        offer_id: String,
        /// When it expired.
        expired_at: Timestamp,
    },
    /// This payment, offer or nonce has been used already (single use).
    #[error("already used: {key}")]
    Replayed {
        /// What was replayed.
        key: String,
    },
    /// The payment does not match the offer it is presented for.
    #[error("{binding}: expected {expected}, got {actual}")]
    Mismatch {
        /// Which binding failed.
        binding: Binding,
        /// What the offer says.
        expected: String,
        /// What the payment says.
        actual: String,
    },
    /// The payment is for another network or chain.
    #[error("wrong network: expected {expected}, got {actual}")]
    WrongNetwork {
        /// Our network.
        expected: String,
        /// The payment's.
        actual: String,
    },
    /// A signature or preimage does not verify.
    #[error("bad signature: {0}")]
    BadSignature(String),
    /// The payer cannot cover the amount.
    #[error("insufficient funds: {0}")]
    InsufficientFunds(String),
    /// A capture above the hold, or a refund above what was captured.
    #[error("{op} of {requested} exceeds the {available} available")]
    ExceedsAvailable {
        /// `capture` or `refund`.
        op: &'static str,
        /// What was asked.
        requested: Amount,
        /// What there is.
        available: Amount,
    },
    /// The operation is not allowed in the payment's current state (capture after void, …).
    #[error("cannot {op}: payment is {state}")]
    InvalidState {
        /// The refused operation.
        op: &'static str,
        /// The state that refuses it.
        state: String,
    },
    /// A spending limit refuses the payment; nothing was paid.
    #[error("limit_exceeded: the {limit} limit leaves {left}, the payment asks {asked}")]
    LimitExceeded {
        /// Which limit (`per_payment`, `per_period`, `total`).
        limit: String,
        /// What the limit still allows.
        left: String,
        /// What the payment asked.
        asked: String,
    },
    /// The operation id was used before with different content.
    #[error("operation id {op_id} was already used with different content")]
    IdempotencyConflict {
        /// The operation id.
        op_id: String,
    },
    /// An operation with this id is still running elsewhere; retry later.
    #[error("operation {op_id} is in progress")]
    InProgress {
        /// The operation id.
        op_id: String,
    },
    /// The rail accepted the payment and holds it for a decision (a human review): nothing is
    /// settled yet, the payer's funds are reserved. The same operation again (same operation
    /// id) reports the decision once it is taken: the payment, or [`RailError::Declined`].
    #[error("payment {payment_ref} is pending review: {reason}")]
    PendingReview {
        /// The payment on the rail, to look it up or quote it to an operator.
        payment_ref: String,
        /// Why it waits (the rule that sent it to review).
        reason: String,
    },
    /// The rail does not know the referenced payment, offer or account.
    #[error("not found: {0}")]
    NotFound(String),
    /// The rail cannot do this at all (see [`crate::Capabilities`]).
    #[error("{rail} does not support {op}")]
    Unsupported {
        /// The rail.
        rail: String,
        /// The operation.
        op: &'static str,
    },
    /// The rail declined the payment (a card decline, a routing failure); permanent.
    #[error("declined: {0}")]
    Declined(RailReason),
    /// The rail or its store is unreachable or overloaded; retry with the same operation id.
    #[error("rail unavailable: {0}")]
    Unavailable(RailReason),
    /// Any other rail error, with the rail's own reason.
    #[error("rail error: {reason}")]
    Rail {
        /// The rail's own code and message.
        reason: RailReason,
        /// Whether a retry with the same operation id may succeed.
        retryable: bool,
    },
    /// The local store (database) failed.
    #[error("storage error: {0}")]
    Storage(String),
}

impl RailError {
    /// The stable machine code of this error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            RailError::InvalidInput(_) => "invalid_input",
            RailError::MalformedPayment(_) => "malformed_payment",
            RailError::Money(_) => "invalid_amount",
            RailError::OfferExpired { .. } => "offer_expired",
            RailError::Replayed { .. } => "replayed",
            RailError::Mismatch { binding, .. } => binding.code(),
            RailError::WrongNetwork { .. } => "wrong_network",
            RailError::BadSignature(_) => "bad_signature",
            RailError::InsufficientFunds(_) => "insufficient_funds",
            RailError::ExceedsAvailable { .. } => "exceeds_available",
            RailError::InvalidState { .. } => "invalid_state",
            RailError::LimitExceeded { .. } => "limit_exceeded",
            RailError::IdempotencyConflict { .. } => "idempotency_conflict",
            RailError::InProgress { .. } => "in_progress",
            RailError::PendingReview { .. } => "pending_review",
            RailError::NotFound(_) => "not_found",
            RailError::Unsupported { .. } => "unsupported",
            RailError::Declined(_) => "declined",
            RailError::Unavailable(_) => "unavailable",
            RailError::Rail { .. } => "rail_error",
            RailError::Storage(_) => "storage_error",
        }
    }

    /// Whether retrying the same operation (same operation id) may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            RailError::InProgress { .. }
            | RailError::PendingReview { .. }
            | RailError::Unavailable(_)
            | RailError::Storage(_) => true,
            RailError::Rail { retryable, .. } => *retryable,
            _ => false,
        }
    }

    /// The rail's own reason, when the error came from the rail.
    #[must_use]
    pub fn rail_reason(&self) -> Option<&RailReason> {
        match self {
            RailError::Declined(r) | RailError::Unavailable(r) => Some(r),
            RailError::Rail { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// A mismatch on `binding`.
    pub fn mismatch(
        binding: Binding,
        expected: impl fmt::Display,
        actual: impl fmt::Display,
    ) -> Self {
        RailError::Mismatch {
            binding,
            expected: expected.to_string(),
            actual: actual.to_string(),
        }
    }
}

/// The result of a rail operation.
pub type RailResult<T> = Result<T, RailError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_stable_and_retry_classes_hold() {
        let e = RailError::Unavailable(RailReason::new("timeout", "algod did not answer"));
        assert_eq!(e.code(), "unavailable");
        assert!(e.is_retryable());
        assert_eq!(e.rail_reason().unwrap().code, "timeout");
        let e = RailError::mismatch(Binding::Payee, "alice", "mallory");
        assert_eq!(e.code(), "payee_mismatch");
        assert!(!e.is_retryable());
        assert_eq!(e.to_string(), "payee_mismatch: expected alice, got mallory");
        let e = RailError::Declined(RailReason::new("card_declined", "insufficient_funds"));
        assert!(!e.is_retryable());
    }
}
