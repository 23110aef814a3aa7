//! Unsigned rail offers a server hands over in its own protocol, paid under the mandate: a
//! ContextVM server's CEP-8 `payment_required` (a BOLT11 invoice for
//! `bitcoin-lightning-bolt11`) becomes an `ln-nwc` offer that the wallet's rail for it pays.
//!
//! Like an x402 challenge it carries no Stipendex signature, so the allowlist is keyed by where
//! it comes from — the server's Nostr key ([`crate::envelope::Allow::Contextvm`]) — and the
//! mandate's validity, limits and confirmation threshold apply as to a Quote. The operation id
//! is derived from the server and the offer (for Lightning, the invoice's payment hash), and
//! the rail payer is idempotent per operation: the same payment request asked again — a lost
//! answer, a retried request — is the same payment, never a second one, and it is counted
//! against the limits once. The audit chain records a Proof whose `challenge` holds what the
//! wallet saw.

use rail_core::{Offer, OpId, Payment};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use super::unsigned::Unsigned;
use super::{Wallet, deny, now_secs, rail_allowed};
use crate::Error;
use crate::envelope::{Challenge, ChallengeSource, Confirmation, Proof, Signed};

/// A paid offer: the rail's payment, and its Proof for the audit.
#[derive(Clone, Debug)]
pub struct OfferPaid {
    /// What the rail returned (for Lightning, the preimage in its proof).
    pub payment: Payment,
    /// The Proof recorded in the audit chain.
    pub proof: Signed<Proof>,
    /// The human's Confirmation, if one was needed.
    pub confirmation: Option<Signed<Confirmation>>,
}

/// The operation id of paying `offer` for `server`: the same offer from the same server is
/// the same operation.
fn op_for(server: &str, offer: &Offer) -> Result<OpId, Error> {
    let mut h = Sha256::new();
    h.update(b"stipendex contextvm offer\0");
    h.update(server.to_ascii_lowercase().as_bytes());
    h.update(b"\0");
    h.update(offer.rail.as_str().as_bytes());
    h.update(b"\0");
    h.update(offer.details.to_string().as_bytes());
    OpId::new(format!("cvm_{}", hex::encode(h.finalize()))).map_err(Error::Payment)
}

impl Wallet {
    /// Pays `offer`, which the ContextVM server `server` (its Nostr key, hex) asked for with
    /// `entry` (the CEP-8 `payment_required` params, recorded as seen), under the mandate:
    /// allowlist (a denial is escalated), mandate validity and revocation, limits, the
    /// confirmation threshold; then the wallet's rail for `offer.rail` pays it — once per
    /// server and offer, however often it is asked.
    ///
    /// # Errors
    /// [`Error::Denied`], [`Error::Revoked`], [`Error::Expired`] (mandate),
    /// [`Error::LimitExceeded`], [`Error::NotConfirmed`], [`Error::NoRail`] (no rail of the
    /// wallet carries the offer), [`Error::Payment`] (the rail refused: nothing counted, unless
    /// the outcome is unknown — then it stays counted, and asking again asks the rail again).
    pub async fn pay_offer(
        &self,
        server: &str,
        offer: &Offer,
        entry: Value,
    ) -> Result<OfferPaid, Error> {
        self.offer_with(server, offer, entry, self.0.confirmer.as_ref())
            .await
    }

    /// [`Wallet::pay_offer`] asking `confirmer` (and telling it of a denial).
    pub(super) async fn offer_with(
        &self,
        server: &str,
        offer: &Offer,
        entry: Value,
        confirmer: &dyn super::Confirmer,
    ) -> Result<OfferPaid, Error> {
        let me = &self.0;
        let mandate = me.mandate.object();
        let now = now_secs(&me.clock);
        let challenge = Challenge {
            source: ChallengeSource::Contextvm,
            origin: server.to_ascii_lowercase(),
            pay_to: offer.payee.clone(),
            entry,
        };
        if !crate::chain::challenge_allowed(&mandate.allow, &challenge) {
            let why = format!(
                "ContextVM server {server} is not in mandate {}'s allowlist",
                mandate.id
            );
            let amount = Some(offer.amount.clone());
            return Err(deny(confirmer, server.to_owned(), None, amount, why).await);
        }
        self.check_mandate(now).await?;
        let rail = me
            .rails
            .iter()
            .find(|r| r.handle.payer.id() == offer.rail)
            .ok_or_else(|| {
                Error::NoRail(format!(
                    "this wallet has no {} rail to pay {server}'s request",
                    offer.rail
                ))
            })?;
        if !rail_allowed(mandate, offer.rail.as_str()) {
            return Err(Error::Denied(format!(
                "mandate {} does not allow paying over {}",
                mandate.id, offer.rail
            )));
        }
        let op = op_for(server, offer)?;
        let unsigned = Unsigned {
            challenge,
            amount: offer.amount.clone(),
            op: op.clone(),
            payee: server,
            what: "contextvm",
            key: Some(op.as_str()),
        };
        let paid = self
            .pay_unsigned(unsigned, now, confirmer, || async {
                rail.handle.payer.pay(&op, offer).await.map(|p| (p, ()))
            })
            .await?;
        let payment = paid.payment;
        tracing::info!(server = %server, amount = %payment.amount.amount(), asset = %payment.amount.asset(), rail = %rail.name, "paid a ContextVM payment request");
        Ok(OfferPaid {
            payment,
            proof: paid.proof,
            confirmation: paid.confirmation,
        })
    }
}
