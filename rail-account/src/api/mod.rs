//! The facilitator's HTTP API: paths, request and response bodies. Amounts are
//! [`rail_core::Money`] (decimal strings with their asset), never floats.
//!
//! | call | path | who | body → answer |
//! |---|---|---|---|
//! | health | `GET /v1/health` | anyone | → [`Health`] |
//! | metrics | `GET /metrics` | anyone | → Prometheus text |
//! | own account | `GET /v1/account` | the account | → [`AccountView`] |
//! | pay or hold | `POST /v1/payments` | payer | [`PayRequest`] → [`PayAnswer`] (201, or 202 pending review) |
//! | look up | `GET /v1/payments/{id}` | payer or payee | → [`PaymentView`] |
//! | verify once | `POST /v1/payments/{id}/redeem` | payee | [`RedeemRequest`] → [`rail_core::Verified`] |
//! | capture | `POST /v1/payments/{id}/capture` | payee | [`CaptureRequest`] → [`rail_core::Captured`] |
//! | void | `POST /v1/payments/{id}/void` | payee | [`VoidRequest`] → [`rail_core::Voided`] |
//! | refund | `POST /v1/payments/{id}/refund` | payee | [`RefundRequest`] → [`rail_core::Refunded`] |
//!
//! Every call but health and metrics is signed ([`crate::auth`]); every `POST` carries an
//! `Idempotency-Key`: the same key with the same body is applied once and answered the same,
//! the same key with another body is refused (`idempotency_conflict`). Errors are
//! [`ErrorBody`] with a stable code.

mod error;

use rail_core::{Money, Offer, Payment, PaymentMode, Timestamp, Verified};
use serde::{Deserialize, Serialize};

pub use error::{ErrorBody, WireError, http_status};

/// `GET`: liveness and identity of the instance.
pub const HEALTH: &str = "/v1/health";
/// `GET`: Prometheus text.
pub const METRICS: &str = "/metrics";
/// `GET`: the signing account.
pub const ACCOUNT: &str = "/v1/account";
/// `POST`: pay or hold an offer.
pub const PAYMENTS: &str = "/v1/payments";

/// `/v1/payments/{id}`.
#[must_use]
pub fn payment(id: &str) -> String {
    format!("{PAYMENTS}/{id}")
}

/// `/v1/payments/{id}/{action}` (`redeem`, `capture`, `void`, `refund`).
#[must_use]
pub fn payment_action(id: &str, action: &str) -> String {
    format!("{PAYMENTS}/{id}/{action}")
}

/// An account-rail offer's rail-specific details.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountOfferDetails {
    /// The facilitator that keeps the accounts (its network name): a payer of another
    /// facilitator cannot pay the offer.
    pub network: String,
    /// How long a hold must last, in milliseconds (hold offers only; never 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
}

/// The account rail's proof of payment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountProof {
    /// The payment at the facilitator (32 hex digits).
    pub payment_id: String,
}

/// `POST /v1/payments`: pay (or hold, by the offer's mode) an account-rail offer from the
/// signing account. The `Idempotency-Key` is the payer's operation id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayRequest {
    /// The receiver's offer.
    pub offer: Offer,
}

/// The answer to a [`PayRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum PayAnswer {
    /// Paid (or held): the payment to hand to the receiver. HTTP 201.
    Paid {
        /// The payment.
        payment: Payment,
    },
    /// Waiting for an operator's decision; the payer's funds are reserved. HTTP 202. The same
    /// request again answers the decision once taken.
    PendingReview {
        /// The payment at the facilitator.
        payment_ref: String,
        /// Why it waits.
        reason: String,
    },
}

/// `POST /v1/payments/{id}/redeem`: the payee checks a payment against its own offer and
/// consumes the offer (once: another key for the same offer is `replayed`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedeemRequest {
    /// The payee's own offer (from its store or a Quote it signed).
    pub offer: Offer,
    /// The payment the payer presented.
    pub payment: Payment,
}

/// `POST /v1/payments/{id}/capture`: capture `amount` of a verified hold. The
/// `Idempotency-Key` is the receiver's operation id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRequest {
    /// The verified hold.
    pub held: Verified,
    /// How much to capture (≤ the hold; the rest is released).
    pub amount: Money,
}

/// `POST /v1/payments/{id}/void`: release a verified hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoidRequest {
    /// The verified hold.
    pub held: Verified,
}

/// `POST /v1/payments/{id}/refund`: send settled money back; `{id}` is a payment's
/// `payment_ref` or a capture's `capture_ref`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefundRequest {
    /// How much (the sum of refunds never exceeds what was settled).
    pub amount: Money,
}

/// Where a payment stands at the facilitator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    /// Paid; `refunded` tells how much went back.
    Settled,
    /// A hold, open.
    Held,
    /// A hold, captured (in part or in full).
    Captured,
    /// A hold, released by the payee (or a payment rejected in review).
    Voided,
    /// A hold that lapsed.
    Expired,
    /// Waiting for an operator's decision.
    PendingReview,
}

/// `GET /v1/payments/{id}`: a payment as its payer or payee sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentView {
    /// The payment id.
    pub payment_ref: String,
    /// Who paid.
    pub payer: String,
    /// Who is paid.
    pub payee: String,
    /// How much was paid or held.
    pub amount: Money,
    /// Pay or hold.
    pub mode: PaymentMode,
    /// Where it stands.
    pub status: PaymentStatus,
    /// How much was captured (holds) or settled.
    pub settled: Money,
    /// How much went back: known for payments; a captured hold's refunds go by its
    /// capture's reference and are not summed here (`None`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refunded: Option<Money>,
    /// The review's decision, when the payment went to review (`pending`, `approved`,
    /// `rejected`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review: Option<String>,
    /// When the facilitator applied it.
    pub created_at: Timestamp,
    /// When an open hold lapses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
}

/// `GET /v1/account`: the signing account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountView {
    /// The account id.
    pub id: String,
    /// Its registered public key.
    pub key: String,
    /// Settled balance.
    pub balance: Money,
    /// Held by open holds and payments in review.
    pub held: Money,
    /// What it can still spend.
    pub available: Money,
    /// Payments above this amount wait for an operator's review.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub review_above: Option<Money>,
}

/// `GET /v1/health`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// `ok` when the database answers.
    pub status: String,
    /// The facilitator's network name (offers carry it).
    pub network: String,
    /// This instance's name.
    pub instance: String,
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// The crate version.
    pub version: String,
}
