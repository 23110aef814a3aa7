//! The rail-core traits for exact-algo: [`ExactAlgoPayer`] is a [`Payer`],
//! [`ExactAlgoReceiver`] a [`RailReceiver`].
//!
//! An [`Offer`] carries the challenge (`accepts[]` entry) in `details`; its id is the
//! paymentId. A [`Payment`]'s proof is `{"header": <PAYMENT-SIGNATURE value>}`. Money moves
//! when the receiver verifies (it submits the signed transaction), not when the payer signs:
//! exact-algo is settled by the receiver. The rail cannot hold or refund (a native payment is
//! final and the receiver holds no key the rail could refund with).

use async_trait::async_trait;
use rail_core::{
    Asset, Binding, Capabilities, Charge, Finality, Money, Offer, OpId, Payer, Payment,
    PaymentMode, PaymentState, Rail, RailError, RailId, RailReceiver, RailResult, Verified, glue,
};
use serde::{Deserialize, Serialize};

use crate::address::Address;
use crate::payer::ExactAlgoPayer;
use crate::receiver::{ExactAlgoReceiver, Price};
use crate::wire::{self, Accept};

/// The rail's name.
pub const RAIL: &str = "exact-algo";

/// The total supply of ALGO in µALGO: no offer can ask for more.
pub const MAX_MICROALGO: u64 = 10_000_000_000_000_000;

/// A payment's proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExactAlgoProof {
    /// The `PAYMENT-SIGNATURE` header value.
    pub header: String,
}

fn capabilities() -> Capabilities {
    // Algorand blocks are final when committed.
    Capabilities::sign_only(Finality::Immediate, vec![Asset::algo()])
}

fn micro(m: &Money) -> RailResult<u64> {
    if m.asset() != &Asset::algo() {
        return Err(RailError::InvalidInput(format!(
            "asset {} is not carried by exact-algo (ALGO only)",
            m.asset()
        )));
    }
    let n = u64::try_from(m.minor_units())
        .map_err(|_| RailError::InvalidInput(format!("{m} does not fit in µALGO")))?;
    if n > MAX_MICROALGO {
        return Err(RailError::InvalidInput(format!(
            "{m} is more than the ALGO supply"
        )));
    }
    Ok(n)
}

impl Rail for ExactAlgoPayer {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities()
    }
}

impl Rail for ExactAlgoReceiver {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities()
    }
}

#[async_trait]
impl Payer for ExactAlgoPayer {
    /// The offer is exact-algo in ALGO, within this payer's `max_amount`, on an Algorand
    /// network that is one of its policy's networks, in either spelling (with no networks
    /// named, the network is checked against algod's when paying).
    fn accepts(&self, offer: &Offer) -> RailResult<()> {
        offer.check_pay_only(RAIL)?;
        let accept: Accept = offer.details_as()?;
        if wire::normalize_network(&accept.network).is_none() {
            return Err(RailError::InvalidInput(format!(
                "network {} is not an Algorand network",
                accept.network
            )));
        }
        let amount = micro(&offer.amount)?;
        let policy = self.policy();
        if amount > policy.max_amount {
            return Err(RailError::InvalidInput(format!(
                "{amount} µALGO is above this payer's limit of {} µALGO",
                policy.max_amount
            )));
        }
        if !policy.networks.is_empty() && !policy.allows(&accept.network) {
            return Err(RailError::InvalidInput(format!(
                "network {} is not one this payer pays on",
                accept.network
            )));
        }
        Ok(())
    }

    async fn pay(&self, _op: &OpId, offer: &Offer) -> RailResult<Payment> {
        offer.check_pay_only(RAIL)?;
        let accept: Accept = offer.details_as()?;
        let amount = micro(&offer.amount)?;
        let pay_to: Address = offer
            .payee
            .parse()
            .map_err(|e| RailError::InvalidInput(format!("payee: {e}")))?;
        // One signer at a time: the balance check and the signature are one step.
        let _guard = self.lock.lock().await;
        offer.check_live(self.clock.now())?;
        let signed = self
            .sign(&accept, pay_to, amount, &offer.id)
            .await
            .map_err(|e| e.to_rail_error())?;
        glue::payment(
            RAIL,
            offer,
            PaymentMode::Capture,
            self.address().to_string(),
            &ExactAlgoProof {
                header: signed.header,
            },
        )
    }
}

/// The payer records every signed payment before handing it out (one transaction per
/// paymentId): paying again *is* the look-up, and returns the recorded transaction.
impl glue::NothingToFind for ExactAlgoPayer {}

#[async_trait]
impl RailReceiver for ExactAlgoReceiver {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        rail_core::types::check_capture_mode(RAIL, charge.mode)?;
        let amount = micro(&charge.amount)?;
        let price = Price {
            resource: charge
                .reference
                .clone()
                .unwrap_or_else(|| "stipendex:offer".into()),
            description: charge.description.clone(),
            amount,
        };
        let ttl = charge.ttl.min(self.max_timeout());
        let accept = self.clone().with_max_timeout(ttl).challenge(&price).await?;
        // A capture offer: `check_capture_mode` refused anything else above.
        glue::offer(
            RAIL,
            accept.extra.payment_id.clone(),
            charge,
            self.pay_to().to_string(),
            self.clock().now().plus(ttl),
            &accept,
        )
    }

    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        payment.check_envelope(offer)?;
        offer.check_live(self.clock().now())?;
        let proof: ExactAlgoProof = payment.proof_as()?;
        let accept: Accept = offer.details_as()?;
        let amount = micro(&offer.amount)?;
        let (_, signed) = wire::decode_payment_header(&proof.header, self.network())
            .map_err(|e| crate::receiver::Refusal::from(e).to_rail_error())?;
        if payment.payer != signed.txn.sender.to_string() {
            return Err(RailError::mismatch(
                Binding::Payer,
                signed.txn.sender,
                &payment.payer,
            ));
        }
        let price = Price {
            resource: accept.resource,
            description: accept.description,
            amount,
        };
        let receipt = self
            .settle_signed(&signed, &price, Some(&offer.id))
            .await
            .map_err(|r| r.to_rail_error())?;
        let paid = Money::from_minor(Asset::algo(), u128::from(signed.txn.amount))?;
        Ok(glue::verified(
            RAIL,
            offer,
            receipt.transaction,
            receipt.payer,
            paid,
            PaymentState::Settled,
        ))
    }
}
