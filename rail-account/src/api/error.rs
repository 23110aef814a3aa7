//! Errors on the wire: a stable code, a sentence, whether to retry, and the fields that make
//! the error typed again on the client ([`WireError::into_rail`]).

use rail_core::{Amount, Binding, RailError, RailReason, Timestamp};
use serde::{Deserialize, Serialize};

use crate::auth::AuthError;

/// The body of every error answer: `{"error": {...}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The error.
    pub error: WireError,
}

/// One error.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// Stable machine code ([`RailError::code`], or an authentication code).
    pub code: String,
    /// One human sentence.
    pub message: String,
    /// Whether the same request again (same idempotency key) may succeed.
    pub retryable: bool,
    /// Mismatches: what the offer said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// Mismatches: what the payment said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual: Option<String>,
    /// Expired offers: the offer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offer_id: Option<String>,
    /// Expired offers: when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_at: Option<Timestamp>,
    /// Refused states and amounts: the operation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// Refused states: the state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Amounts above what is available: asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested: Option<Amount>,
    /// Amounts above what is available: what there is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub available: Option<Amount>,
    /// Payments in review, replays: the payment or key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
    /// The error's own text, without the sentence around it (invalid input, malformed
    /// payments, bad signatures, insufficient funds, not found).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// A rail's own reason (declines, rail errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<RailReason>,
}

const BINDINGS: &[Binding] = &[
    Binding::Amount,
    Binding::Asset,
    Binding::Payee,
    Binding::Offer,
    Binding::Mode,
    Binding::Rail,
    Binding::Payer,
];

impl WireError {
    /// A bare error.
    pub fn new(code: &str, message: impl Into<String>, retryable: bool) -> Self {
        WireError {
            code: code.to_owned(),
            message: message.into(),
            retryable,
            ..WireError::default()
        }
    }

    /// The wire form of a rail error, every typed field kept.
    #[must_use]
    pub fn from_rail(e: &RailError) -> Self {
        let mut w = WireError::new(e.code(), e.to_string(), e.is_retryable());
        match e {
            RailError::Mismatch {
                expected, actual, ..
            }
            | RailError::WrongNetwork { expected, actual } => {
                w.expected = Some(expected.clone());
                w.actual = Some(actual.clone());
            }
            RailError::OfferExpired {
                offer_id,
                expired_at,
            } => {
                w.offer_id = Some(offer_id.clone());
                w.expired_at = Some(*expired_at);
            }
            RailError::InvalidState { op, state } => {
                w.op = Some((*op).to_owned());
                w.state = Some(state.clone());
            }
            RailError::ExceedsAvailable {
                op,
                requested,
                available,
            } => {
                w.op = Some((*op).to_owned());
                w.requested = Some(*requested);
                w.available = Some(*available);
            }
            RailError::PendingReview {
                payment_ref,
                reason,
            } => {
                w.reference = Some(payment_ref.clone());
                w.reason = Some(RailReason::new("review", reason.clone()));
            }
            RailError::Replayed { key } => w.reference = Some(key.clone()),
            RailError::InvalidInput(d)
            | RailError::MalformedPayment(d)
            | RailError::BadSignature(d)
            | RailError::InsufficientFunds(d)
            | RailError::NotFound(d) => w.detail = Some(d.clone()),
            RailError::IdempotencyConflict { op_id } | RailError::InProgress { op_id } => {
                w.reference = Some(op_id.clone());
            }
            RailError::Declined(r)
            | RailError::Unavailable(r)
            | RailError::Rail { reason: r, .. } => {
                w.reason = Some(r.clone());
            }
            _ => {}
        }
        w
    }

    /// The wire form of an authentication refusal.
    #[must_use]
    pub fn from_auth(e: &AuthError) -> Self {
        WireError::new(e.code(), e.to_string(), e.is_retryable())
    }

    /// The typed rail error this wire error stands for. Codes this version does not know
    /// (and authentication refusals) come back as [`RailError::Rail`] with the code kept.
    #[must_use]
    pub fn into_rail(self) -> RailError {
        let text = |o: Option<String>| o.unwrap_or_default();
        let detail = self.detail.clone().unwrap_or_else(|| self.message.clone());
        let static_op = |op: Option<String>| -> &'static str {
            match op.as_deref() {
                Some("capture") => "capture",
                Some("refund") => "refund",
                Some("void") => "void",
                Some("verify") => "verify",
                Some("capture or void") => "capture or void",
                _ => "this operation",
            }
        };
        let reason = |w: &WireError| {
            w.reason
                .clone()
                .unwrap_or_else(|| RailReason::new(w.code.clone(), w.message.clone()))
        };
        if let Some(b) = BINDINGS.iter().find(|b| b.code() == self.code) {
            return RailError::Mismatch {
                binding: *b,
                expected: text(self.expected),
                actual: text(self.actual),
            };
        }
        match self.code.as_str() {
            "invalid_input" | "invalid_amount" => RailError::InvalidInput(detail),
            "malformed_payment" => RailError::MalformedPayment(detail),
            "offer_expired" => RailError::OfferExpired {
                offer_id: text(self.offer_id),
                expired_at: self.expired_at.unwrap_or(Timestamp(0)),
            },
            "replayed" => RailError::Replayed {
                key: self.reference.unwrap_or(self.message),
            },
            "wrong_network" => RailError::WrongNetwork {
                expected: text(self.expected),
                actual: text(self.actual),
            },
            "bad_signature" => RailError::BadSignature(detail),
            "insufficient_funds" => RailError::InsufficientFunds(detail),
            "exceeds_available" => RailError::ExceedsAvailable {
                op: static_op(self.op),
                requested: self.requested.unwrap_or(Amount::ZERO),
                available: self.available.unwrap_or(Amount::ZERO),
            },
            "invalid_state" => RailError::InvalidState {
                op: static_op(self.op),
                state: text(self.state),
            },
            "idempotency_conflict" => RailError::IdempotencyConflict {
                op_id: text(self.reference),
            },
            "in_progress" => RailError::InProgress {
                op_id: text(self.reference),
            },
            "pending_review" => RailError::PendingReview {
                payment_ref: text(self.reference),
                reason: self.reason.map(|r| r.message).unwrap_or_default(),
            },
            "not_found" => RailError::NotFound(detail),
            "declined" => RailError::Declined(reason(&self)),
            "unavailable" => RailError::Unavailable(reason(&self)),
            "storage_error" => {
                RailError::Unavailable(RailReason::new("storage_error", self.message))
            }
            _ => RailError::Rail {
                reason: reason(&self),
                retryable: self.retryable,
            },
        }
    }
}

/// The HTTP status an error code is answered with.
#[must_use]
pub fn http_status(code: &str) -> u16 {
    match code {
        "unauthenticated"
        | "bad_request_signature"
        | "stale_request"
        | "replayed_request"
        | "unknown_account"
        | "bad_key" => 401,
        "not_found" => 404,
        "idempotency_conflict"
        | "replayed"
        | "invalid_state"
        | "in_progress"
        | "pending_review" => 409,
        "insufficient_funds" | "declined" | "exceeds_available" | "limit_exceeded" => 402,
        "offer_expired" => 410,
        "unavailable" | "storage_error" => 503,
        "unsupported" => 501,
        "rail_error" => 500,
        _ => 400,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rail_core::{Asset, Money};

    #[test]
    fn every_typed_error_survives_the_wire() {
        let amount = Money::parse(Asset::usd(), "2.50").unwrap().amount();
        let cases = vec![
            RailError::mismatch(Binding::Payee, "a", "b"),
            RailError::OfferExpired {
                offer_id: "q_1".into(),
                expired_at: Timestamp(5),
            },
            RailError::Replayed { key: "q_1".into() },
            RailError::WrongNetwork {
                expected: "x".into(),
                actual: "y".into(),
            },
            RailError::ExceedsAvailable {
                op: "capture",
                requested: amount,
                available: Amount::ZERO,
            },
            RailError::InvalidState {
                op: "verify",
                state: "expired".into(),
            },
            RailError::IdempotencyConflict {
                op_id: "op_1".into(),
            },
            RailError::PendingReview {
                payment_ref: "p".into(),
                reason: "above 10.00".into(),
            },
            RailError::Declined(RailReason::new("review_rejected", "no")),
            RailError::InsufficientFunds("short".into()),
            RailError::NotFound("transfer x".into()),
        ];
        for e in cases {
            let json = serde_json::to_string(&WireError::from_rail(&e)).unwrap();
            let back: WireError = serde_json::from_str(&json).unwrap();
            let back = back.into_rail();
            assert_eq!(back.code(), e.code(), "{json}");
            assert_eq!(back.to_string(), e.to_string(), "{json}");
        }
    }
}
