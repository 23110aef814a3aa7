//! The plain data that flows through the rail traits.
//!
//! A receiver turns a [`Charge`] into an [`Offer`]; a payer turns the offer into a [`Payment`];
//! the receiver checks the payment against the offer and gets a [`Verified`]; holds then end in a
//! [`Captured`] or a [`Voided`], settled money may come back as a [`Refunded`].
//!
//! [`Offer`] and [`Payment`] are serializable and carry a `rail` tag, so they can ride inside a
//! Stipendex Quote and Proof. Their rail-specific part (`details`, `proof`) is JSON the rail
//! defines and checks itself ([`Offer::details_as`], [`Payment::proof_as`]).

use std::fmt;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::{Binding, RailError, RailResult};
use crate::money::Money;

/// The name of a rail (`ledger`, `x402`, `exact-algo`, `stripe`, `ln-nwc`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RailId(pub String);

impl RailId {
    /// A rail id.
    pub fn new(s: impl Into<String>) -> Self {
        RailId(s.into())
    }
    /// The id as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RailId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The caller's idempotency key for one state-changing call.
///
/// Same id and same content → the first result again; same id and different content →
/// [`RailError::IdempotencyConflict`]. 1–128 printable ASCII characters.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct OpId(String);

impl OpId {
    /// An operation id.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] unless 1–128 printable ASCII characters.
    pub fn new(s: impl Into<String>) -> RailResult<Self> {
        let s = s.into();
        if s.is_empty() || s.len() > 128 || !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(RailError::InvalidInput(
                "operation id must be 1-128 printable ASCII characters".into(),
            ));
        }
        Ok(OpId(s))
    }

    /// A fresh random operation id (`op_` + 32 hex digits).
    #[must_use]
    pub fn random() -> Self {
        OpId(format!("op_{}", hex::encode(rand::random::<[u8; 16]>())))
    }

    /// The id as text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A derived id for a sub-step (`"{self}/{suffix}"`), for example the capture of a payment.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] if the result is not a valid id.
    pub fn child(&self, suffix: &str) -> RailResult<Self> {
        OpId::new(format!("{}/{}", self.0, suffix))
    }
}

impl TryFrom<String> for OpId {
    type Error = RailError;
    fn try_from(s: String) -> RailResult<Self> {
        OpId::new(s)
    }
}

impl From<OpId> for String {
    fn from(o: OpId) -> String {
        o.0
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpId({})", self.0)
    }
}

/// Whether money moves now or is only authorised.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentMode {
    /// The payment settles in full (the Stipendex "capture" proof mode).
    Capture,
    /// The payment is an authorisation to be captured (in part) or voided later.
    Hold,
}

impl fmt::Display for PaymentMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PaymentMode::Capture => "capture",
            PaymentMode::Hold => "hold",
        })
    }
}

/// What a receiver wants to be paid: the input of [`crate::RailReceiver::offer`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// The price.
    pub amount: Money,
    /// Settle now or hold.
    pub mode: PaymentMode,
    /// What is being sold, for humans.
    pub description: String,
    /// How long the offer stays payable.
    #[serde(with = "duration_secs")]
    pub ttl: Duration,
    /// The receiver's own reference (a Stipendex quote id, an order id), bound into the offer.
    pub reference: Option<String>,
}

impl Charge {
    /// A charge that settles now.
    #[must_use]
    pub fn capture(amount: Money, ttl: Duration) -> Self {
        Charge {
            amount,
            mode: PaymentMode::Capture,
            description: String::new(),
            ttl,
            reference: None,
        }
    }

    /// A charge that holds `amount` for later capture.
    #[must_use]
    pub fn hold(amount: Money, ttl: Duration) -> Self {
        Charge {
            mode: PaymentMode::Hold,
            ..Charge::capture(amount, ttl)
        }
    }
}

mod duration_secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(super) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_secs())
    }
    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_secs)
    }
}

/// How long after its offer's end a payment made while the offer was live may still be
/// verified by a caller that keeps its own single-use record ([`crate::RailReceiver::verify_as`]):
/// the wallet's time to present a payment whose answer was lost, or that waited for review.
/// Shorter than the 24 hours rails keep their single-use marks past an offer's end, so a
/// replay within it is still refused by the rail.
pub const LATE_PROOF_GRACE: Duration = Duration::from_secs(12 * 3600);

/// A single-use offer to be paid on one rail: what the receiver hands to the payer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offer {
    /// The rail that must carry the payment.
    pub rail: RailId,
    /// Unique offer id (single use); the payment is bound to it.
    pub id: String,
    /// Exactly what must be paid.
    pub amount: Money,
    /// Who is paid, in the rail's own addressing (account id, address, node key).
    pub payee: String,
    /// Settle or hold.
    pub mode: PaymentMode,
    /// After this instant the offer is refused.
    pub expires_at: Timestamp,
    /// Rail-specific requirements (an invoice, a paymentId, a client secret, …).
    #[serde(default)]
    pub details: serde_json::Value,
}

impl Offer {
    /// The rail-specific details, decoded.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] when they do not decode as `T`.
    pub fn details_as<T: DeserializeOwned>(&self) -> RailResult<T> {
        serde_json::from_value(self.details.clone())
            .map_err(|e| RailError::InvalidInput(format!("offer details: {e}")))
    }

    /// Refuses the offer once `now` has reached its expiry.
    ///
    /// # Errors
    /// [`RailError::OfferExpired`].
    pub fn check_live(&self, now: Timestamp) -> RailResult<()> {
        if now >= self.expires_at {
            return Err(RailError::OfferExpired {
                offer_id: self.id.clone(),
                expired_at: self.expires_at,
            });
        }
        Ok(())
    }

    /// For a late verification ([`crate::RailReceiver::verify_as`]): the payment, made at
    /// `paid_at`, was made while the offer was live, and `now` is within
    /// [`LATE_PROOF_GRACE`] of the offer's end.
    ///
    /// # Errors
    /// [`RailError::OfferExpired`].
    pub fn check_paid_in_time(&self, paid_at: Timestamp, now: Timestamp) -> RailResult<()> {
        if paid_at >= self.expires_at || now >= self.expires_at.plus(LATE_PROOF_GRACE) {
            return Err(RailError::OfferExpired {
                offer_id: self.id.clone(),
                expired_at: self.expires_at,
            });
        }
        Ok(())
    }

    /// How long a single-use mark for a payment of this offer must be kept, from `now`: the
    /// offer's remaining life (after it, the offer itself refuses any payment) plus `margin`
    /// (clock skew, and whatever the rail lets outlive the offer, such as a hold).
    #[must_use]
    pub fn retention(&self, now: Timestamp, margin: std::time::Duration) -> std::time::Duration {
        let left = u64::try_from(self.expires_at.0.saturating_sub(now.0)).unwrap_or(0);
        std::time::Duration::from_millis(left).saturating_add(margin)
    }

    /// For a pay-only rail's payer: the offer is for `rail` and asks for a payment, not a hold.
    ///
    /// # Errors
    /// [`RailError::Mismatch`] (another rail's offer), [`RailError::Unsupported`] (a hold).
    pub fn check_pay_only(&self, rail: &str) -> RailResult<()> {
        if self.rail.as_str() != rail {
            return Err(RailError::mismatch(Binding::Rail, rail, &self.rail));
        }
        check_capture_mode(rail, self.mode)
    }
}

/// For a pay-only rail: `mode` must be [`PaymentMode::Capture`].
///
/// # Errors
/// [`RailError::Unsupported`] for a hold.
pub fn check_capture_mode(rail: &str, mode: PaymentMode) -> RailResult<()> {
    if mode != PaymentMode::Capture {
        return Err(RailError::Unsupported {
            rail: rail.into(),
            op: "hold",
        });
    }
    Ok(())
}

/// A payment (or hold) made for an offer: what the payer hands back to the receiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payment {
    /// The rail that carried it.
    pub rail: RailId,
    /// The offer it pays.
    pub offer_id: String,
    /// Settle or hold.
    pub mode: PaymentMode,
    /// Who paid, in the rail's own addressing.
    pub payer: String,
    /// What was paid (or held).
    pub amount: Money,
    /// Rail-specific evidence (a transfer id, a signed transaction, a preimage, …).
    pub proof: serde_json::Value,
}

impl Payment {
    /// The rail-specific proof, decoded.
    ///
    /// # Errors
    /// [`RailError::MalformedPayment`] when it does not decode as `T`.
    pub fn proof_as<T: DeserializeOwned>(&self) -> RailResult<T> {
        serde_json::from_value(self.proof.clone())
            .map_err(|e| RailError::MalformedPayment(format!("proof: {e}")))
    }

    /// Checks the envelope against the offer: rail, offer id, mode, asset and amount.
    /// Rails call this first, then check their own evidence.
    ///
    /// # Errors
    /// [`RailError::Mismatch`] naming the first binding that fails.
    pub fn check_envelope(&self, offer: &Offer) -> RailResult<()> {
        if self.rail != offer.rail {
            return Err(RailError::mismatch(Binding::Rail, &offer.rail, &self.rail));
        }
        if self.offer_id != offer.id {
            return Err(RailError::mismatch(
                Binding::Offer,
                &offer.id,
                &self.offer_id,
            ));
        }
        if self.mode != offer.mode {
            return Err(RailError::mismatch(Binding::Mode, offer.mode, self.mode));
        }
        if self.amount.asset() != offer.amount.asset() {
            return Err(RailError::mismatch(
                Binding::Asset,
                offer.amount.asset(),
                self.amount.asset(),
            ));
        }
        if self.amount != offer.amount {
            return Err(RailError::mismatch(
                Binding::Amount,
                &offer.amount,
                &self.amount,
            ));
        }
        Ok(())
    }
}

/// Where a verified payment stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum PaymentState {
    /// The money has moved to the payee.
    Settled,
    /// The money is held; up to `capturable` may be captured before `expires_at`.
    Held {
        /// What may still be captured.
        capturable: Money,
        /// When the hold lapses, if the rail says.
        expires_at: Option<Timestamp>,
    },
}

/// A payment the receiver has checked against its offer (and consumed: single use).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verified {
    /// The rail.
    pub rail: RailId,
    /// The offer it paid.
    pub offer_id: String,
    /// The rail's id for the payment (transfer id, txid, payment hash, PaymentIntent id).
    pub payment_ref: String,
    /// Who paid.
    pub payer: String,
    /// What was paid or held.
    pub amount: Money,
    /// Settled or held.
    pub state: PaymentState,
}

/// The result of capturing a hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Captured {
    /// The held payment.
    pub payment_ref: String,
    /// The rail's id for the capture.
    pub capture_ref: String,
    /// What moved to the payee.
    pub captured: Money,
    /// What went back to the payer (a partial capture releases the rest).
    pub released: Money,
}

/// The result of voiding a hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Voided {
    /// The held payment.
    pub payment_ref: String,
    /// What went back to the payer.
    pub released: Money,
}

/// The result of a refund.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refunded {
    /// The refunded payment.
    pub payment_ref: String,
    /// The rail's id for the refund.
    pub refund_ref: String,
    /// This refund.
    pub amount: Money,
}
