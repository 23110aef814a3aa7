//! The rail traits: small, one concern each.
//!
//! | side | trait | operations |
//! |---|---|---|
//! | both | [`Rail`] | `id`, `capabilities` |
//! | payer | [`Payer`] | `pay` |
//! | payer | [`HoldPayer`] | `hold` |
//! | receiver | [`RailReceiver`] | `offer`, `verify` |
//! | receiver | [`HoldReceiver`] | `capture`, `void` |
//! | receiver | [`RefundReceiver`] | `refund` |
//!
//! A rail that cannot hold simply does not implement [`HoldPayer`]/[`HoldReceiver`], so calling
//! `hold` on it does not compile. Where rails are chosen at run time, [`RailHandle`] carries the
//! optional parts as `Option<Arc<dyn …>>` and [`Capabilities`] says what the rail claims; the
//! conformance suite checks that the two agree.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{RailError, RailResult};
use crate::money::{Asset, Money};
use crate::types::{Captured, Charge, Offer, OpId, Payment, RailId, Refunded, Verified, Voided};

/// When a settled payment is final.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finality {
    /// Final when the call returns (a ledger commit, a confirmed block with instant finality).
    Immediate,
    /// Final after the rail confirms it (a block inclusion, a webhook).
    Confirmed,
    /// Reversible for a while (card payments: chargebacks).
    Reversible,
}

/// What [`Payer::pay`] does with money: where a payment actually moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayEffect {
    /// `pay` moves the money: when it returns, the payer has paid (a ledger transfer, a
    /// confirmed Stripe PaymentIntent, a Lightning payment with its preimage). The receiver's
    /// `verify` checks the payment and consumes the offer; it moves nothing.
    Moves,
    /// `pay` only signs an authorisation and moves nothing (an x402 EIP-3009 signature, a
    /// signed Algorand transaction): the receiver's `verify` settles it on the rail. A signed
    /// payment that is never verified costs the payer nothing.
    SignsOnly,
}

/// What a rail claims it can do. A claimed capability that fails conformance is a failure.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[allow(clippy::struct_excessive_bools)] // a descriptor of independent yes/no capabilities
pub struct Capabilities {
    /// `pay` pays (every rail so far).
    pub pay: bool,
    /// Where the money moves: in `pay`, or in the receiver's `verify`.
    pub pay_effect: PayEffect,
    /// `hold` authorises without settling; `capture`/`void` finish it.
    pub hold: bool,
    /// A hold can be captured for less than its amount (the rest is released).
    pub partial_capture: bool,
    /// Settled money can be refunded.
    pub refund: bool,
    /// A refund may be less than the settled amount.
    pub partial_refund: bool,
    /// When money is final.
    pub finality: Finality,
    /// The assets the rail moves.
    pub assets: Vec<Asset>,
}

impl Capabilities {
    /// Pay only, `pay` moving the money: no holds, no refunds.
    #[must_use]
    pub fn pay_only(finality: Finality, assets: Vec<Asset>) -> Self {
        Capabilities {
            pay: true,
            pay_effect: PayEffect::Moves,
            hold: false,
            partial_capture: false,
            refund: false,
            partial_refund: false,
            finality,
            assets,
        }
    }

    /// Pay only, `pay` signing and the receiver's `verify` settling (x402, exact-algo).
    #[must_use]
    pub fn sign_only(finality: Finality, assets: Vec<Asset>) -> Self {
        Capabilities {
            pay_effect: PayEffect::SignsOnly,
            ..Self::pay_only(finality, assets)
        }
    }

    /// Refuses an asset the rail does not move.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`].
    pub fn check_asset(&self, money: &Money) -> RailResult<()> {
        if self.assets.iter().any(|a| a == money.asset()) {
            Ok(())
        } else {
            Err(RailError::InvalidInput(format!(
                "asset {} is not carried by this rail",
                money.asset()
            )))
        }
    }
}

/// Every rail: a name and a capability descriptor.
pub trait Rail: Send + Sync {
    /// The rail's name (`ledger`, `x402`, …), the `rail` tag of its offers and payments.
    fn id(&self) -> RailId;
    /// What the rail can do.
    fn capabilities(&self) -> Capabilities;
}

/// The payer side: pays offers.
#[async_trait]
pub trait Payer: Rail {
    /// Pays `offer` in full. A rail never pays one offer twice where it can tell (a ledger
    /// transfer id, a Stripe `Idempotency-Key`, an invoice paid once, an EIP-3009 nonce); "same
    /// `op` and same offer → the same payment, returned again" is the
    /// [`crate::payer::Idempotent`] layer's guarantee, which a wallet stacks on every rail.
    ///
    /// # Errors
    /// [`RailError::OfferExpired`], [`RailError::InsufficientFunds`], a mismatch between the
    /// offer and this payer's rail, or a rail error.
    async fn pay(&self, op: &OpId, offer: &Offer) -> RailResult<Payment>;

    /// Whether this payer could pay `offer`, checked offline and without side effects: the
    /// offer's rail is this rail, its asset one this payer carries, and (rails override this)
    /// its network, token or currency the payer's own. A wallet asks it to choose among rails
    /// (`stipendex::Registry::can_pay`); `pay` checks it again, with the balance and the clock.
    ///
    /// # Errors
    /// [`RailError::Mismatch`] (another rail) or [`RailError::InvalidInput`] (an asset, network
    /// or limit this payer does not pay).
    fn accepts(&self, offer: &Offer) -> RailResult<()> {
        let id = self.id();
        if offer.rail != id {
            return Err(RailError::mismatch(crate::Binding::Rail, id, &offer.rail));
        }
        self.capabilities().check_asset(&offer.amount)
    }
}

/// The payer side of holds: authorises an offer's amount without settling it.
#[async_trait]
pub trait HoldPayer: Payer {
    /// Holds `offer`'s amount for the receiver to capture or void.
    ///
    /// # Errors
    /// As [`Payer::pay`].
    async fn hold(&self, op: &OpId, offer: &Offer) -> RailResult<Payment>;
}

/// The receiver side: makes offers and verifies payments for them.
#[async_trait]
pub trait RailReceiver: Rail {
    /// Makes a single-use offer for `charge`, payable to this receiver.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] for a charge the rail cannot carry (asset, precision).
    async fn offer(&self, charge: &Charge) -> RailResult<Offer>;

    /// Whether making an offer costs something outside this process — an object at a
    /// processor (a Stripe PaymentIntent), an invoice at a wallet (Lightning) — so that a
    /// receiver quoting every unpaid request rate-limits it per client. Default: `false` (an
    /// offer is a local record or a signed statement).
    fn offers_cost(&self) -> bool {
        false
    }

    /// Checks `payment` against `offer` on the rail and consumes the offer: a second verify of
    /// the same payment (or of another payment for the same offer) is [`RailError::Replayed`].
    /// Nothing is consumed when verification fails.
    ///
    /// # Errors
    /// [`RailError::MalformedPayment`], [`RailError::Mismatch`], [`RailError::OfferExpired`],
    /// [`RailError::Replayed`], [`RailError::BadSignature`], [`RailError::NotFound`], …
    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified>;

    /// [`RailReceiver::verify`] under the caller's operation id `op`, for a caller that keeps its
    /// own single-use record of the payment (a Stipendex receiver's used-Proof record):
    /// - the same `op` again — the caller recovering a verification whose answer was lost,
    ///   from any instance — answers that verification's result instead of
    ///   [`RailError::Replayed`]; a payment consumed under another `op` is still
    ///   [`RailError::Replayed`];
    /// - a payment the rail shows was made while the offer was live is verified after the
    ///   offer's end, within [`crate::LATE_PROOF_GRACE`] ([`Offer::check_paid_in_time`]): its
    ///   money moved in time. A rail that moves the money at verification (x402, exact-algo)
    ///   still refuses an expired offer: nothing moved.
    ///
    /// The default is [`RailReceiver::verify`]: right for a rail whose verification cannot lose its
    /// answer after consuming and moves money at verification. The `account` rail derives the
    /// facilitator's idempotency key from `op`; the `ledger` and `account` rails verify late
    /// payments made in time.
    ///
    /// # Errors
    /// As [`RailReceiver::verify`].
    async fn verify_as(&self, op: &OpId, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        let _ = op;
        self.verify(offer, payment).await
    }
}

/// The receiver side of holds.
#[async_trait]
pub trait HoldReceiver: RailReceiver {
    /// Captures `amount` (≤ the held amount) of a verified hold; the rest is released.
    ///
    /// # Errors
    /// [`RailError::ExceedsAvailable`], [`RailError::InvalidState`] (voided, expired, already
    /// captured), [`RailError::IdempotencyConflict`].
    async fn capture(&self, op: &OpId, held: &Verified, amount: &Money) -> RailResult<Captured>;

    /// Releases a verified hold in full.
    ///
    /// # Errors
    /// [`RailError::InvalidState`] (captured, voided, expired).
    async fn void(&self, op: &OpId, held: &Verified) -> RailResult<Voided>;
}

/// The receiver side of refunds.
#[async_trait]
pub trait RefundReceiver: RailReceiver {
    /// Sends `amount` of settled money back to the payer. `payment_ref` is the `payment_ref`
    /// of a settled [`Verified`] or the `capture_ref` of a [`Captured`]. The sum of refunds
    /// never exceeds what was settled.
    ///
    /// # Errors
    /// [`RailError::ExceedsAvailable`], [`RailError::NotFound`], [`RailError::IdempotencyConflict`].
    async fn refund(&self, op: &OpId, payment_ref: &str, amount: &Money) -> RailResult<Refunded>;
}

/// The paying parts of a rail chosen at run time (a wallet's side of a [`RailHandle`]).
#[derive(Clone)]
pub struct PayerHandle {
    /// Pays.
    pub payer: Arc<dyn Payer>,
    /// Holds, where the rail can.
    pub hold_payer: Option<Arc<dyn HoldPayer>>,
}

impl PayerHandle {
    /// A payer that holds too: both parts from one value.
    pub fn with_holds<P: HoldPayer + 'static>(payer: P) -> Self {
        let p = Arc::new(payer);
        PayerHandle {
            payer: p.clone(),
            hold_payer: Some(p),
        }
    }

    /// A payer without holds.
    pub fn pay_only<P: Payer + 'static>(payer: P) -> Self {
        PayerHandle {
            payer: Arc::new(payer),
            hold_payer: None,
        }
    }
}

/// The receiving parts of a rail chosen at run time (a receiver's side of a [`RailHandle`]).
#[derive(Clone)]
pub struct ReceiverHandle {
    /// Offers and verifies.
    pub receiver: Arc<dyn RailReceiver>,
    /// Captures and voids holds, where the rail can.
    pub hold_receiver: Option<Arc<dyn HoldReceiver>>,
    /// Refunds, where the rail can.
    pub refunds: Option<Arc<dyn RefundReceiver>>,
}

impl ReceiverHandle {
    /// A receiver without holds or refunds.
    pub fn pay_only<R: RailReceiver + 'static>(receiver: R) -> Self {
        ReceiverHandle {
            receiver: Arc::new(receiver),
            hold_receiver: None,
            refunds: None,
        }
    }

    /// A receiver that captures and voids holds, without refunds.
    pub fn with_holds<R: HoldReceiver + 'static>(receiver: R) -> Self {
        let r = Arc::new(receiver);
        ReceiverHandle {
            receiver: r.clone(),
            hold_receiver: Some(r),
            refunds: None,
        }
    }

    /// A receiver with every part: holds and refunds.
    pub fn full<R: HoldReceiver + RefundReceiver + 'static>(receiver: R) -> Self {
        let r = Arc::new(receiver);
        ReceiverHandle {
            receiver: r.clone(),
            hold_receiver: Some(r.clone()),
            refunds: Some(r),
        }
    }
}

/// The two hold parts of a [`RailHandle`].
pub type HoldParts<'a> = (&'a Arc<dyn HoldPayer>, &'a Arc<dyn HoldReceiver>);

/// A rail chosen at run time: the parts it implements, as trait objects.
///
/// The optional parts are `Some` exactly when the rail's [`Capabilities`] claim them; the
/// conformance suite's `capabilities_are_honest` behaviour checks it.
#[derive(Clone)]
pub struct RailHandle {
    /// Payer side.
    pub payer: Arc<dyn Payer>,
    /// Payer side of holds.
    pub hold_payer: Option<Arc<dyn HoldPayer>>,
    /// Receiver side.
    pub receiver: Arc<dyn RailReceiver>,
    /// Receiver side of holds.
    pub hold_receiver: Option<Arc<dyn HoldReceiver>>,
    /// Refunds.
    pub refunds: Option<Arc<dyn RefundReceiver>>,
}

impl RailHandle {
    /// Both sides of one rail, from their parts.
    #[must_use]
    pub fn from_parts(payer: PayerHandle, receiver: ReceiverHandle) -> Self {
        RailHandle {
            payer: payer.payer,
            hold_payer: payer.hold_payer,
            receiver: receiver.receiver,
            hold_receiver: receiver.hold_receiver,
            refunds: receiver.refunds,
        }
    }

    /// The receiver's capabilities.
    #[must_use]
    pub fn capabilities(&self) -> Capabilities {
        self.receiver.capabilities()
    }

    /// The rail's name.
    #[must_use]
    pub fn id(&self) -> RailId {
        self.receiver.id()
    }

    /// The hold parts, or a typed error naming what is missing.
    ///
    /// # Errors
    /// [`RailError::Unsupported`] when the rail cannot hold.
    pub fn holds(&self) -> RailResult<HoldParts<'_>> {
        match (&self.hold_payer, &self.hold_receiver) {
            (Some(p), Some(r)) => Ok((p, r)),
            _ => Err(RailError::Unsupported {
                rail: self.id().0,
                op: "hold",
            }),
        }
    }

    /// The refund part, or a typed error.
    ///
    /// # Errors
    /// [`RailError::Unsupported`] when the rail cannot refund.
    pub fn refunder(&self) -> RailResult<&Arc<dyn RefundReceiver>> {
        self.refunds.as_ref().ok_or_else(|| RailError::Unsupported {
            rail: self.id().0,
            op: "refund",
        })
    }
}
