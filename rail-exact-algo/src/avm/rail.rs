//! The rail-core traits for the AVM scheme (rail `exact-avm`): [`AvmPayer`] is a [`Payer`],
//! [`AvmReceiver`] a [`RailReceiver`], so the Stipendex wallet, the registry and the conformance
//! suite drive it as any other rail.
//!
//! An [`Offer`]'s `details` is the scheme's entry ([`Requirements`]); a [`Payment`]'s proof is
//! `{"header": <PAYMENT-SIGNATURE value>}`. The scheme itself binds a payment to a price, not to
//! one offer (x402 has no nonce in an AVM entry), so the rail-core payer writes the offer's id
//! into the transfer's note (`x402-payment-<offer id>`), and the receiver accepts a payment
//! only for the offer its note names. Money moves when the receiver verifies (its facilitator
//! submits the group); a payment is served once (the served-once record, keyed as the paywall
//! keys it) and settled once (the facilitator's settlement record).

use std::time::Duration;

use async_trait::async_trait;
use rail_core::{
    Asset, Binding, Capabilities, Charge, Finality, Money, Offer, OpId, Payer, Payment,
    PaymentMode, PaymentState, Rail, RailError, RailId, RailReason, RailReceiver, RailResult,
    SharedClock, Verified, glue,
};
use serde::{Deserialize, Serialize};
use x402_transport::served::{ServedOnce, Taken};

use super::facilitator::AvmError;
use super::payer::AvmPayer;
use super::scheme::ExactAvm;
// Defined beside the scheme's label, which the payer's `SchemePayer::rail` reads too (payer.rs
// imports scheme.rs, never this file); re-exported here at its path.
pub use super::scheme::RAIL;
use super::wire::{Envelope, Requirements, code};
use crate::txn::Transaction;

/// How long a served payment's record is kept: longer than a group's validity window.
const SERVED_RETENTION: Duration = Duration::from_secs(2 * 3600);

/// The longest an offer lives (the entry's `maxTimeoutSeconds`).
const MAX_TTL: Duration = Duration::from_secs(super::scheme::MAX_TIMEOUT_SECONDS);

/// A payment's proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AvmProof {
    /// The `PAYMENT-SIGNATURE` header value (base64 of the envelope's JSON).
    pub header: String,
}

/// The note a rail-core payment's transfer carries for `offer_id`.
#[must_use]
pub fn offer_note(offer_id: &str) -> Vec<u8> {
    format!("x402-payment-{offer_id}").into_bytes()
}

fn capabilities() -> Capabilities {
    Capabilities::sign_only(Finality::Immediate, vec![Asset::usdc()])
}

fn base_units(m: &Money, asset: &Asset) -> RailResult<u64> {
    if m.asset() != asset {
        return Err(RailError::InvalidInput(format!(
            "asset {} is not this exact-avm rail's ({asset})",
            m.asset()
        )));
    }
    u64::try_from(m.minor_units())
        .map_err(|_| RailError::InvalidInput(format!("{m} does not fit an Algorand amount")))
}

impl Rail for AvmPayer {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities()
    }
}

#[async_trait]
impl Payer for AvmPayer {
    fn accepts(&self, offer: &Offer) -> RailResult<()> {
        offer.check_pay_only(RAIL)?;
        let r: Requirements = offer.details_as()?;
        base_units(&offer.amount, &Asset::usdc())?;
        match self.refusal_of(&r) {
            Some(why) => Err(RailError::InvalidInput(why)),
            None => Ok(()),
        }
    }

    async fn pay(&self, _op: &OpId, offer: &Offer) -> RailResult<Payment> {
        offer.check_pay_only(RAIL)?;
        let r: Requirements = offer.details_as()?;
        let amount = base_units(&offer.amount, &Asset::usdc())?;
        if r.amount != amount.to_string() {
            return Err(RailError::mismatch(Binding::Amount, &r.amount, amount));
        }
        if r.pay_to != offer.payee {
            return Err(RailError::mismatch(Binding::Payee, &r.pay_to, &offer.payee));
        }
        offer.check_live(self.clock().now())?;
        let payload = self
            .payload_with_note(&r, &offer.id)
            .await
            .map_err(|e| e.to_rail_error())?;
        let envelope = Envelope {
            x402_version: 2,
            payload,
            accepted: r,
            resource: None,
            extensions: None,
        };
        let header = x402_transport::wire::encode_base64_json(&envelope)
            .map_err(|e| RailError::InvalidInput(e.to_string()))?;
        glue::payment(
            RAIL,
            offer,
            PaymentMode::Capture,
            self.address().to_string(),
            &AvmProof { header },
        )
    }
}

/// Nothing to look up: the idempotency wrapper records each payment before handing it out.
/// Its repeat is **not** safe: every `pay` signs a new transaction (a new id), and the
/// receiver's single-use check is by transaction, so the wrapper's claim must be durable before
/// the transaction is signed ([`rail_core::payer::FindPayment::repeat_is_safe`] is `false`).
#[async_trait]
impl rail_core::payer::FindPayment for AvmPayer {
    async fn find_payment(
        &self,
        _op: &OpId,
        _offer: &Offer,
        _mode: PaymentMode,
    ) -> RailResult<Option<Payment>> {
        Ok(None)
    }
}

/// The receiving side of the rail: offers priced in the scheme's asset, verified and settled by
/// its facilitator, each payment served once (see the module docs).
#[derive(Clone, Debug)]
pub struct AvmReceiver {
    scheme: ExactAvm,
    served: ServedOnce,
    clock: SharedClock,
    /// The asset's total supply, read from algod once: no offer asks for more.
    supply: std::sync::Arc<tokio::sync::OnceCell<u64>>,
}

impl AvmReceiver {
    /// A receiver settling through `scheme`'s facilitator, recording served payments in
    /// `served` (share it between instances), judging offers by `clock`.
    #[must_use]
    pub fn new(scheme: ExactAvm, served: ServedOnce, clock: SharedClock) -> Self {
        AvmReceiver {
            scheme,
            served,
            clock,
            supply: std::sync::Arc::default(),
        }
    }

    async fn supply(&self) -> RailResult<u64> {
        let algod = self.scheme.facilitator().algod();
        let asset = self.scheme.asset();
        self.supply
            .get_or_try_init(|| async move {
                algod.asset_total(asset).await.map_err(|e| {
                    RailError::Unavailable(RailReason::new("algod", format!("ASA {asset}: {e}")))
                })
            })
            .await
            .copied()
    }

    /// The scheme.
    #[must_use]
    pub fn scheme(&self) -> &ExactAvm {
        &self.scheme
    }
}

impl Rail for AvmReceiver {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities()
    }
}

fn refusal(code: &str, detail: String) -> RailError {
    match code {
        code::RECIPIENT_MISMATCH => {
            RailError::mismatch(Binding::Payee, "the offer's payee", detail)
        }
        code::AMOUNT_INSUFFICIENT => {
            RailError::mismatch(Binding::Amount, "the offer's amount", detail)
        }
        code::ASSET_ID_MISMATCH => RailError::mismatch(Binding::Asset, "the offer's asset", detail),
        code::NETWORK_MISMATCH | code::GENESIS_HASH_MISMATCH => RailError::WrongNetwork {
            expected: "this receiver's network".into(),
            actual: detail,
        },
        code::INVALID_SIGNATURE | code::MISSING_SIGNATURE => RailError::BadSignature(detail),
        code::EXPIRED => RailError::Declined(RailReason::new("transaction_expired", detail)),
        code::ALREADY_SETTLED => RailError::Replayed { key: detail },
        code::SIMULATION_FAILED | code::TRANSACTION_FAILED => {
            RailError::Declined(RailReason::new(code, detail))
        }
        _ => RailError::MalformedPayment(format!("{code}: {detail}")),
    }
}

#[async_trait]
impl RailReceiver for AvmReceiver {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        rail_core::types::check_capture_mode(RAIL, charge.mode)?;
        let amount = base_units(&charge.amount, &Asset::usdc())?;
        if amount == 0 {
            return Err(RailError::InvalidInput(
                "a price of zero is not a payment".into(),
            ));
        }
        let supply = self.supply().await?;
        if amount > supply {
            return Err(RailError::InvalidInput(format!(
                "{} is more than the supply of ASA {} ({supply} base units)",
                charge.amount,
                self.scheme.asset()
            )));
        }
        let r = self.scheme.requirements_for(amount);
        let ttl = charge.ttl.min(MAX_TTL);
        // A capture offer: `check_capture_mode` refused anything else above.
        glue::offer(
            RAIL,
            hex::encode(rand::random::<[u8; 16]>()),
            charge,
            r.pay_to.clone(),
            self.clock.now().plus(ttl),
            &r,
        )
    }

    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        payment.check_envelope(offer)?;
        offer.check_live(self.clock.now())?;
        let proof: AvmProof = payment.proof_as()?;
        let r: Requirements = offer.details_as()?;
        let amount = base_units(&offer.amount, &Asset::usdc())?;
        if r.amount != amount.to_string() {
            return Err(RailError::mismatch(Binding::Amount, &r.amount, amount));
        }
        let ours = self.scheme.requirements_for(amount);
        if r.pay_to != ours.pay_to || offer.payee != ours.pay_to {
            return Err(RailError::mismatch(
                Binding::Payee,
                &ours.pay_to,
                &offer.payee,
            ));
        }
        if r.asset != ours.asset {
            return Err(RailError::mismatch(Binding::Asset, &ours.asset, &r.asset));
        }
        let envelope: Envelope = x402_transport::wire::decode_base64_json(&proof.header)
            .map_err(|e| RailError::MalformedPayment(e.to_string()))?;
        let a = &envelope.accepted;
        if !super::wire::same(&a.network, &ours.network) {
            return Err(RailError::WrongNetwork {
                expected: ours.network.clone(),
                actual: a.network.clone(),
            });
        }
        if a.asset != ours.asset || a.amount != ours.amount || a.pay_to != ours.pay_to {
            return Err(RailError::mismatch(
                Binding::Offer,
                format!("{} of ASA {} to {}", ours.amount, ours.asset, ours.pay_to),
                format!("{} of ASA {} to {}", a.amount, a.asset, a.pay_to),
            ));
        }
        // Signatures first, then every offline rule.
        let p = self
            .scheme
            .facilitator()
            .check(&envelope, &ours)
            .map_err(|v| refusal(v.code, v.detail))?;
        let note = match p.members.get(p.index).map(crate::txn::Member::txn) {
            Some(Transaction::Axfer(t)) => t.note.clone(),
            _ => Vec::new(),
        };
        if note != offer_note(&offer.id) {
            return Err(RailError::mismatch(
                Binding::Offer,
                &offer.id,
                String::from_utf8_lossy(&note),
            ));
        }
        if payment.payer != p.payer.to_string() {
            return Err(RailError::mismatch(Binding::Payer, p.payer, &payment.payer));
        }
        let network = ours.network.clone();
        let serving = self
            .served
            .reserve(&p.key(&network))
            .await
            .map_err(|e| match e {
                Taken::Used | Taken::InFlight => glue::served_already(&offer.id),
                Taken::Store(e) => e,
            })?;
        let settled = serving
            .keep_alive(self.scheme.facilitator().settle(&p, &network))
            .await;
        match settled {
            Ok(s) => {
                serving.commit(Some(SERVED_RETENTION)).await?;
                Ok(glue::verified(
                    RAIL,
                    offer,
                    s.txid,
                    s.payer,
                    offer.amount.clone(),
                    PaymentState::Settled,
                ))
            }
            Err(AvmError::Refused { code, detail }) => {
                x402_transport::served::release(serving).await;
                Err(refusal(code, detail))
            }
            Err(AvmError::Unknown(detail)) => {
                x402_transport::served::release(serving).await;
                Err(glue::settlement_unknown(detail))
            }
        }
    }
}
