//! Paying and holding: the payer's side.
//!
//! A payment is one ledger transfer from the payer to the payee, its id derived from the
//! payer's account and the request's idempotency key (one id per key, whatever the mode), the
//! offer bound into its `user_data`. A payment above the payer's review threshold is a hold
//! (pending transfer) instead, posted when an operator approves it and voided when one rejects
//! it; until then the payer is told it is pending.
//!
//! **The review row comes first.** A payment that goes to review is queued *before* its hold
//! is written, and a queued review is never deleted: a payee that knows the (predictable)
//! payment id can never find the hold in the ledger without its review, so it cannot capture
//! or verify it before an operator decides. Whether a payment
//! is reviewed is decided once, when its transfer is first written; a retry is answered from
//! the transfer and its review as they are, whatever the threshold says now.

use rail_account::RAIL;
use rail_account::api::{AccountOfferDetails, AccountProof, PayAnswer, PayRequest};
use rail_core::{
    Binding, Offer, OpId, Payment, PaymentMode, RailError, RailId, RailReason, RailResult,
};
use rail_ledger::{
    AccountId, HoldRefusal, LedgerError, Transfer, TransferError, TransferKind, TransferRequest,
    offer_binding, op_transfer_id,
};

use super::{Facilitator, account_error, parse_id, units};
use crate::store::{ReviewRecord, ReviewState};

impl Facilitator {
    /// Pays (or holds, by the offer's mode) `req.offer` from `caller`'s account, once per
    /// idempotency key `key`.
    ///
    /// # Errors
    /// `rail_mismatch`, `wrong_network`, `asset_mismatch`, `offer_expired`,
    /// `insufficient_funds`, `idempotency_conflict`, `not_found` (no such payee), a hold
    /// refusal, `declined` (rejected in review), `storage_error`.
    pub async fn pay(
        &self,
        caller: AccountId,
        key: &OpId,
        req: PayRequest,
    ) -> RailResult<PayAnswer> {
        let offer = req.offer;
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
        let payer = self.account(caller).await.map_err(account_error)?;
        if offer.amount.asset() != &payer.asset {
            return Err(RailError::mismatch(
                Binding::Asset,
                &payer.asset,
                offer.amount.asset(),
            ));
        }
        let payee: AccountId = parse_id(&offer.payee, "offer payee")?;
        let amount = units(&offer.amount)?;
        if amount == 0 {
            return Err(RailError::InvalidInput("amount must not be zero".into()));
        }
        let id = payment_id(caller, key);
        let user_data = offer_binding(&offer.id);
        let paid = Paid {
            mode: offer.mode,
            payer: caller,
            payee,
            amount,
            user_data,
        };
        if let Err(expired) = offer.check_live(self.clock.now()) {
            // A payment made under this key while the offer was live is answered, not
            // refused: an approval, or an answer lost with a dead instance, can reach the
            // payer after the offer's end, and its money moved. Nothing new is paid.
            return match self.ledger.lookup_transfer(id).await? {
                Some((t, _)) if paid.is(&t) => self.answer(caller, &offer, &t).await,
                _ => Err(expired),
            };
        }
        // Above the threshold, unless applied before: a payment is answered as it was made
        // (below), never re-decided (a look-up only for the few payments over the threshold;
        // one made for review and retried under a higher threshold is matched by
        // `apply_payment`).
        let review = payer.review_above.is_some_and(|limit| amount > limit)
            && self.ledger.lookup_transfer(id).await?.is_none();
        let request = match offer.mode {
            PaymentMode::Capture if !review => TransferRequest::Single {
                id,
                debit: caller,
                credit: payee,
                amount,
                user_data,
            },
            PaymentMode::Capture => TransferRequest::Pending {
                id,
                debit: caller,
                credit: payee,
                amount,
                user_data,
                // The hold never outlives the offer: unreviewed by then, the funds come back.
                timeout_ms: millis(self.config.review_hold).min(
                    u64::try_from(offer.expires_at.0.saturating_sub(self.clock.now().0))
                        .unwrap_or(0)
                        .max(1),
                ),
            },
            PaymentMode::Hold => {
                let asked_ms = details
                    .hold_ms
                    .unwrap_or(millis(rail_account::DEFAULT_HOLD));
                if asked_ms == 0 {
                    return Err(HoldRefusal::NoTimeout("the offer's hold duration").into());
                }
                let max_ms = millis(self.config.max_hold);
                if asked_ms > max_ms {
                    return Err(HoldRefusal::TooLong { asked_ms, max_ms }.into());
                }
                TransferRequest::Pending {
                    id,
                    debit: caller,
                    credit: payee,
                    amount,
                    user_data,
                    timeout_ms: asked_ms,
                }
            }
        };
        if review {
            self.queue_review(
                key,
                ReviewRecord {
                    payment_id: id.to_string(),
                    payer: caller.to_string(),
                    payee: payee.to_string(),
                    amount: i64::try_from(amount)
                        .map_err(|_| RailError::InvalidInput("amount too large".into()))?,
                    asset: payer.asset.code().to_owned(),
                    mode: offer.mode.to_string(),
                    offer_id: offer.id.clone(),
                    offer_expires_at: offer.expires_at,
                    reason: format!(
                        "above the payer's review threshold of {} minor units",
                        payer.review_above.unwrap_or_default()
                    ),
                    state: ReviewState::Pending,
                    created_at: self.clock.now(),
                    decided_at: None,
                    decided_by: None,
                    note: None,
                },
            )
            .await?;
        }
        // A refused transfer leaves its queued review standing for nothing: it is never
        // deleted (a concurrent attempt may be writing its hold), and a review whose payment
        // is not a hold is ignored everywhere (`reconciled_review`, `reviews`).
        let t = self.apply_payment(key, &paid, request).await?;
        self.answer(caller, &offer, &t).await
    }

    /// Queues `review`. A review already queued under the key must be for
    /// the very same payment (what the operator is shown is what an approval pays): one for
    /// another payment (another offer, payee or amount under the same key, now or in an
    /// earlier attempt whose transfer was refused) is an idempotency conflict.
    async fn queue_review(&self, key: &OpId, review: ReviewRecord) -> RailResult<()> {
        self.pool.queue_review(&review).await?;
        let stored = self.pool.review(&review.payment_id).await?;
        if stored.is_some_and(|r| r.is_for(&review)) {
            Ok(())
        } else {
            Err(RailError::IdempotencyConflict {
                op_id: key.to_string(),
            })
        }
    }

    /// What the payer is told about payment `t`: the payment, or its review's state.
    async fn answer(
        &self,
        caller: AccountId,
        offer: &Offer,
        t: &Transfer,
    ) -> RailResult<PayAnswer> {
        // Only a hold can be in review: a settled payment needs no look-up.
        if t.kind == TransferKind::Pending
            && let Some(r) = self.reconciled_review(t).await?
        {
            match r.state {
                ReviewState::Pending => {
                    return Ok(PayAnswer::PendingReview {
                        payment_ref: t.id.to_string(),
                        reason: r.reason,
                    });
                }
                ReviewState::Rejected | ReviewState::Expired => {
                    return Err(RailError::Declined(RailReason::new(
                        format!("review_{}", r.state.as_str()),
                        r.note.unwrap_or_else(|| {
                            format!("the payment was {} in review", r.state.as_str())
                        }),
                    )));
                }
                ReviewState::Approved => {}
            }
        }
        Ok(PayAnswer::Paid {
            payment: Payment {
                rail: RailId::new(RAIL),
                offer_id: offer.id.clone(),
                mode: offer.mode,
                payer: caller.to_string(),
                amount: offer.amount.clone(),
                proof: serde_json::to_value(AccountProof {
                    payment_id: t.id.to_string(),
                })
                .map_err(|e| RailError::InvalidInput(e.to_string()))?,
            },
        })
    }

    /// Applies a payment's transfer. The same key again is the same transfer; a transfer the
    /// key made before in the other form (held for review, or not) is that payment if
    /// [`Paid::is`] says so; anything else under the key is a conflict.
    async fn apply_payment(
        &self,
        key: &OpId,
        paid: &Paid,
        request: TransferRequest,
    ) -> RailResult<Transfer> {
        match self.ledger.transfer(request.clone()).await {
            Ok(created) => Ok(created.transfer().clone()),
            Err(LedgerError::Refused(TransferError::ExistsWithDifferentFields)) => {
                match self.ledger.lookup_transfer(request.id()).await? {
                    Some((t, _)) if paid.is(&t) => Ok(t),
                    _ => Err(RailError::IdempotencyConflict {
                        op_id: key.to_string(),
                    }),
                }
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// What a payment request pays: the facts its transfer must carry, whatever form it took.
struct Paid {
    mode: PaymentMode,
    payer: AccountId,
    payee: AccountId,
    amount: u64,
    user_data: u128,
}

impl Paid {
    /// Whether `t` is this payment: the same offer, amount and accounts, in a form the mode
    /// allows (a payment is a single transfer, or a hold when it went to review; a hold is only
    /// ever a pending transfer). The hold's duration is not compared: a review's hold lasts as
    /// long as was left of the offer when it was made.
    fn is(&self, t: &Transfer) -> bool {
        let form = match self.mode {
            PaymentMode::Capture => matches!(t.kind, TransferKind::Single | TransferKind::Pending),
            PaymentMode::Hold => t.kind == TransferKind::Pending,
        };
        form && (t.debit, t.credit, t.amount, t.user_data)
            == (self.payer, self.payee, self.amount, self.user_data)
    }
}

/// The id of the payment `payer` makes under idempotency key `key` (pay or hold alike): the
/// ledger transfer that carries it.
#[must_use]
pub fn payment_id(payer: AccountId, key: &OpId) -> rail_ledger::TransferId {
    op_transfer_id(payer, "payment", key)
}

/// Whole milliseconds of `d`, saturating.
pub(crate) fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
