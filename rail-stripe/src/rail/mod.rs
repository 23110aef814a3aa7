//! The Stripe rail: PaymentIntents for pay (automatic capture) and hold (manual capture),
//! partial capture, void (cancel) and refunds.
//!
//! # Who calls what, with which key
//! | step | side | call | key |
//! |---|---|---|---|
//! | offer | receiver | `POST /v1/payment_intents` (amount, currency, `capture_method`, metadata binding the offer) | secret key |
//! | pay / hold | payer | `GET /v1/payment_intents/{id}?client_secret=…`, then `POST /v1/payment_intents/{id}/confirm` (`payment_method`, `client_secret`) | the receiver's **publishable** key from the offer |
//! | verify | receiver | `GET /v1/payment_intents/{id}` | secret key |
//! | capture / void | receiver | `POST …/capture` (`amount_to_capture`) / `POST …/cancel` | secret key |
//! | refund | receiver | `POST /v1/refunds` (`payment_intent`, `amount`) | secret key |
//!
//! The payer never holds a key that could move money elsewhere: a publishable key with one
//! intent's client secret can confirm that intent, for its amount, to its merchant, and nothing
//! else — the same thing Stripe.js does in a browser. The payer checks the intent's amount,
//! currency and capture method against the offer before confirming, so a receiver cannot charge
//! more than it offered.
//!
//! Every mutating call carries an `Idempotency-Key` derived from the operation id (`stipendex-…`),
//! and a local idempotency record answers a repeated operation without calling Stripe again.

// One file a part; this one keeps what both sides use (the offer and proof types, the
// idempotency keys, the error and currency mapping).
mod payer; // StripePayer: checks an offer's intent, then confirms it
mod receiver; // StripeReceiver: offer, verify, expired offers' give-back, webhooks
mod settle; // StripeReceiver: capture, void, refund

use rail_core::{Asset, Capabilities, Finality, OpId, RailError, RailResult};
use serde::{Deserialize, Serialize};
use stripe_client_core::{IdempotencyKey, RequestStrategy};
use stripe_core::PaymentIntentStatus;
use stripe_types::Currency;

use crate::client::StripeFailure;
use crate::currency;

pub use payer::StripePayer;
pub use receiver::{GIVE_BACK_WINDOW, StripeReceiver, WEBHOOK_PROCESSING_LEASE};

/// The rail's name.
pub const RAIL: &str = "stripe";
/// Metadata key binding an intent to its offer.
pub const META_OFFER: &str = "stipendex_offer";
/// Metadata key naming the receiver (payee) an intent belongs to.
pub const META_PAYEE: &str = "stipendex_payee";

/// What an offer carries for the payer. `Debug` hides the client secret (it lets its holder
/// confirm the intent).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfferDetails {
    /// `pi_…`.
    pub payment_intent: String,
    /// The intent's client secret (lets the holder confirm this intent only).
    pub client_secret: String,
    /// The merchant's publishable key.
    pub publishable_key: String,
    /// The receiver the intent belongs to (the offer's `payee`).
    pub payee: String,
}

impl std::fmt::Debug for OfferDetails {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OfferDetails")
            .field("payment_intent", &self.payment_intent)
            .field("client_secret", &"<redacted>")
            .field("publishable_key", &self.publishable_key)
            .field("payee", &self.payee)
            .finish()
    }
}

/// A payment's proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StripeProof {
    /// The confirmed intent.
    pub payment_intent: String,
}

fn capabilities(asset: &Asset) -> Capabilities {
    // Card payments can be disputed (chargebacks).
    rail_core::glue::full_capabilities(Finality::Reversible, asset)
}

fn key(prefix: &str, op: &OpId) -> RailResult<RequestStrategy> {
    IdempotencyKey::new(format!("stipendex-{prefix}-{}", op.as_str()))
        .map(RequestStrategy::Idempotent)
        .map_err(|e| RailError::InvalidInput(format!("idempotency key: {e:?}")))
}

#[allow(clippy::needless_pass_by_value)] // used as `map_err(stripe_err)`
fn stripe_err(e: StripeFailure) -> RailError {
    e.to_rail_error()
}

fn currency_of(asset: &Asset) -> Currency {
    currency::code(asset)
        .parse()
        .unwrap_or_else(|_| Currency::Unknown(currency::code(asset)))
}

fn status_str(s: &PaymentIntentStatus) -> String {
    s.as_str().to_owned()
}
