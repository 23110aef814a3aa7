//! Verifying a payment for its payee, once per offer ("redeem").

use rail_account::RAIL;
use rail_account::api::{AccountOfferDetails, AccountProof, RedeemRequest};
use rail_core::keys::Write;
use rail_core::{Binding, PaymentMode, PaymentState, RailError, RailId, RailResult, Verified};
use rail_ledger::{
    AccountId, TransferId, TransferKind, TransferStatus, check_hold_terms, offer_binding,
};
use sha2::{Digest, Sha256};

use super::{Facilitator, NS_REDEEMED, money, parse_id};
use crate::store::ReviewState;

/// How long a redeemed offer is remembered after it expires (after that the offer itself is
/// refused as expired).
const REDEEMED_MARGIN: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

impl Facilitator {
    /// Checks `req.payment` against the caller's own `req.offer` and consumes the offer: the
    /// same idempotency key `key` again answers the same, any other key is `replayed`.
    ///
    /// # Errors
    /// A mismatch on the first binding that fails, `wrong_network`, `offer_expired`,
    /// `not_found`, `invalid_state`, a hold refusal, `pending_review`, `declined`, `replayed`.
    pub async fn redeem(
        &self,
        caller: AccountId,
        key: &str,
        payment_id: &str,
        req: RedeemRequest,
    ) -> RailResult<Verified> {
        let RedeemRequest { offer, payment } = req;
        let record = format!("{caller}/{}", offer.id);
        let fingerprint = Sha256::digest(key.as_bytes()).to_vec();
        // Answered before under this key: the same answer.
        if let Some(seen) = self.keys.get(NS_REDEEMED, &record).await? {
            return answered(&seen.record, &fingerprint, &offer.id);
        }
        let verified = self.check(caller, payment_id, &offer, &payment).await?;
        let value =
            serde_json::to_string(&verified).map_err(|e| RailError::Storage(e.to_string()))?;
        let mut w = Write::finished(
            rand::random(),
            "redeemed",
            Some(offer.retention(self.clock.now(), REDEEMED_MARGIN)),
        );
        w.fingerprint = fingerprint.clone();
        w.value = Some(value);
        match self.keys.insert_if_absent(NS_REDEEMED, &record, &w).await? {
            None => Ok(verified),
            Some(seen) => answered(&seen.record, &fingerprint, &offer.id),
        }
    }

    /// The checks of a redeem, consuming nothing.
    async fn check(
        &self,
        caller: AccountId,
        payment_id: &str,
        offer: &rail_core::Offer,
        payment: &rail_core::Payment,
    ) -> RailResult<Verified> {
        payment.check_envelope(offer)?;
        if offer.rail.as_str() != RAIL {
            return Err(RailError::mismatch(Binding::Rail, RAIL, &offer.rail));
        }
        let details: AccountOfferDetails = offer.details_as()?;
        if details.network != self.config.network {
            return Err(RailError::WrongNetwork {
                expected: self.config.network.clone(),
                actual: details.network,
            });
        }
        if offer.payee != caller.to_string() {
            return Err(RailError::mismatch(Binding::Payee, caller, &offer.payee));
        }
        let proof: AccountProof = payment.proof_as()?;
        if proof.payment_id != payment_id {
            return Err(RailError::MalformedPayment(format!(
                "the proof names payment {}, the request {payment_id}",
                proof.payment_id
            )));
        }
        let id: TransferId = parse_id(&proof.payment_id, "proof payment_id")
            .map_err(|e| RailError::MalformedPayment(e.to_string()))?;
        let payer: AccountId = parse_id(&payment.payer, "payment payer")
            .map_err(|e| RailError::MalformedPayment(e.to_string()))?;
        let (t, status) = self
            .ledger
            .lookup_transfer(id)
            .await?
            .ok_or_else(|| RailError::NotFound(format!("payment {id}")))?;
        // A payment made while the offer was live is redeemed after its end (within the
        // grace): its money moved in time. The redeemed record, kept a day past the offer's
        // end, still refuses a replay. (The account rail's plain `verify` refuses an expired
        // offer itself, before asking.)
        offer.check_paid_in_time(t.timestamp, self.clock.now())?;
        if t.credit != caller {
            return Err(RailError::mismatch(Binding::Payee, caller, t.credit));
        }
        if t.user_data != offer_binding(&offer.id) {
            return Err(RailError::mismatch(
                Binding::Offer,
                &offer.id,
                "a payment for another offer",
            ));
        }
        let paid = money(offer.amount.asset(), t.amount)?;
        if paid != offer.amount {
            return Err(RailError::mismatch(Binding::Amount, &offer.amount, &paid));
        }
        if t.debit != payer {
            return Err(RailError::mismatch(Binding::Payer, &payment.payer, t.debit));
        }
        if t.kind == TransferKind::Pending {
            self.review_gate(&t).await?;
        }
        let state = match (offer.mode, t.kind) {
            (PaymentMode::Capture, TransferKind::Single) => {
                expect(status, TransferStatus::Settled { reversed: 0 })?;
                PaymentState::Settled
            }
            // A payment approved in review: its hold posted in full.
            (PaymentMode::Capture, TransferKind::Pending) => {
                expect(status, TransferStatus::Posted { amount: t.amount })?;
                PaymentState::Settled
            }
            (PaymentMode::Hold, TransferKind::Pending) => {
                let asked_ms = details
                    .hold_ms
                    .unwrap_or(super::pay::millis(rail_account::DEFAULT_HOLD));
                check_hold_terms(&t, asked_ms, self.ledger.now().await?, None)?;
                expect(status, TransferStatus::Pending)?;
                PaymentState::Held {
                    capturable: paid.clone(),
                    expires_at: t.expires_at(),
                }
            }
            (mode, kind) => {
                return Err(RailError::mismatch(
                    Binding::Mode,
                    mode,
                    format!("{kind:?}"),
                ));
            }
        };
        Ok(Verified {
            rail: RailId::new(RAIL),
            offer_id: offer.id.clone(),
            payment_ref: t.id.to_string(),
            payer: t.debit.to_string(),
            amount: paid,
            state,
        })
    }

    /// Refuses a payment whose review is not approved (a pending transfer without review
    /// passes: an ordinary hold).
    pub(crate) async fn review_gate(&self, t: &rail_ledger::Transfer) -> RailResult<()> {
        let Some(r) = self.reconciled_review(t).await? else {
            return Ok(());
        };
        match r.state {
            ReviewState::Approved => Ok(()),
            ReviewState::Pending => Err(RailError::PendingReview {
                payment_ref: r.payment_id,
                reason: r.reason,
            }),
            ReviewState::Rejected | ReviewState::Expired => {
                Err(RailError::Declined(rail_core::RailReason::new(
                    format!("review_{}", r.state.as_str()),
                    format!("the payment was {} in review", r.state.as_str()),
                )))
            }
        }
    }
}

fn expect(status: Option<TransferStatus>, want: TransferStatus) -> RailResult<()> {
    if status == Some(want) {
        return Ok(());
    }
    Err(RailError::InvalidState {
        op: "verify",
        state: match status {
            Some(TransferStatus::Pending) => "held",
            Some(TransferStatus::Posted { .. }) => "captured",
            Some(TransferStatus::Voided) => "voided",
            Some(TransferStatus::Expired) => "expired",
            Some(TransferStatus::Settled { .. }) => "refunded",
            None => "unknown",
        }
        .into(),
    })
}

/// The answer to a redeem already recorded: the same for the same key, `replayed` for another.
fn answered(
    record: &rail_core::keys::KeyRecord,
    fingerprint: &[u8],
    offer_id: &str,
) -> RailResult<Verified> {
    use subtle::ConstantTimeEq as _;
    if let Some(v) = record
        .value
        .as_ref()
        .filter(|_| bool::from(record.fingerprint.as_slice().ct_eq(fingerprint)))
    {
        return serde_json::from_str(v).map_err(|e| RailError::Storage(e.to_string()));
    }
    Err(RailError::Replayed {
        key: offer_id.to_owned(),
    })
}
