//! The review queue: payments above their payer's threshold wait for an operator.
//!
//! A decision is applied to the ledger first, then recorded: approving a payment posts its
//! hold in full, rejecting voids it (approving a hold only lets its payee verify it). The
//! transfers' ids derive from the payment, so a decision taken twice (two operators, or one
//! interrupted half-way) is applied once; the ledger refuses the second of two opposite ones.

use rail_core::{OpId, RailError, RailResult};
use rail_ledger::{
    LedgerError, Transfer, TransferError, TransferId, TransferKind, TransferRequest,
    TransferStatus, op_transfer_id,
};

use super::{Facilitator, parse_id};
use crate::store::{ReviewRecord, ReviewState};

/// The id of the transfer that carries decision `what` on payment `t`.
pub(crate) fn decision_id(t: &Transfer, what: &str) -> RailResult<TransferId> {
    Ok(op_transfer_id(t.debit, what, &OpId::new(t.id.to_string())?))
}

impl Facilitator {
    /// The review queue: reviews in `state` (all when `None`), oldest first.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn reviews(
        &self,
        state: Option<ReviewState>,
        limit: i64,
    ) -> RailResult<Vec<ReviewRecord>> {
        self.pool.reviews(state, limit).await
    }

    /// Approves a payment in review: a payment is posted to its payee in full, a hold becomes
    /// verifiable. Approving an approved payment again changes nothing.
    ///
    /// # Errors
    /// [`RailError::NotFound`] (not in review), [`RailError::InvalidState`] (rejected, or the
    /// hold lapsed first: it is then recorded as expired).
    pub async fn approve(
        &self,
        payment_id: &str,
        operator: &str,
        note: Option<&str>,
    ) -> RailResult<ReviewRecord> {
        let (r, t) = self.in_review(payment_id).await?;
        match r.state {
            ReviewState::Approved => return Ok(r),
            ReviewState::Pending => {}
            other => {
                return Err(RailError::InvalidState {
                    op: "approve",
                    state: other.as_str().into(),
                });
            }
        }
        let left = r.offer_expires_at.0.saturating_sub(self.clock.now().0);
        let margin = i64::try_from(self.config.approval_margin.as_millis()).unwrap_or(i64::MAX);
        if left < margin {
            // Too late to be presented and verified: release the funds instead.
            self.release(&t).await?;
            self.record(
                &r,
                ReviewState::Expired,
                operator,
                Some("the offer expires before the payment could be verified"),
            )
            .await?;
            return Err(RailError::InvalidState {
                op: "approve",
                state: format!(
                    "expired: its offer ends in {} s, under the {} s an approval leaves the payer to present it",
                    left.max(0) / 1000,
                    margin / 1000
                ),
            });
        }
        if r.mode == "capture" {
            let post = TransferRequest::Post {
                id: decision_id(&t, "review-approve")?,
                pending_id: t.id,
                amount: t.amount,
            };
            match self.ledger.transfer(post).await {
                Ok(_) => {}
                Err(LedgerError::Refused(TransferError::PendingExpired)) => {
                    self.record(&r, ReviewState::Expired, operator, note)
                        .await?;
                    return Err(RailError::InvalidState {
                        op: "approve",
                        state: "expired".into(),
                    });
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.record(&r, ReviewState::Approved, operator, note).await
    }

    /// Rejects a payment in review: its hold is released to the payer.
    ///
    /// # Errors
    /// [`RailError::NotFound`] (not in review), [`RailError::InvalidState`] (approved).
    pub async fn reject(
        &self,
        payment_id: &str,
        operator: &str,
        note: Option<&str>,
    ) -> RailResult<ReviewRecord> {
        let (r, t) = self.in_review(payment_id).await?;
        match r.state {
            ReviewState::Rejected | ReviewState::Expired => return Ok(r),
            ReviewState::Pending => {}
            ReviewState::Approved => {
                return Err(RailError::InvalidState {
                    op: "reject",
                    state: "approved".into(),
                });
            }
        }
        self.release(&t).await?;
        self.record(&r, ReviewState::Rejected, operator, note).await
    }

    /// Voids a payment's hold (once, whoever asks first).
    async fn release(&self, t: &Transfer) -> RailResult<()> {
        let void = TransferRequest::Void {
            id: decision_id(t, "review-reject")?,
            pending_id: t.id,
        };
        match self.ledger.transfer(void).await {
            // Voided now or before (by this decision, or by the payee releasing its hold), or
            // lapsed: nothing is held any more.
            Ok(_)
            | Err(LedgerError::Refused(
                TransferError::AlreadyVoided | TransferError::PendingExpired,
            )) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn in_review(&self, payment_id: &str) -> RailResult<(ReviewRecord, Transfer)> {
        let id: TransferId = parse_id(payment_id, "payment id")?;
        let not_found = || RailError::NotFound(format!("payment {payment_id} in the review queue"));
        let (t, _) = self
            .ledger
            .lookup_transfer(id)
            .await?
            .ok_or_else(not_found)?;
        let r = self.reconciled_review(&t).await?.ok_or_else(not_found)?;
        Ok((r, t))
    }

    /// Records a decision; a decision recorded meanwhile by someone else is what is returned.
    async fn record(
        &self,
        r: &ReviewRecord,
        state: ReviewState,
        operator: &str,
        note: Option<&str>,
    ) -> RailResult<ReviewRecord> {
        self.pool
            .decide(&r.payment_id, state, self.clock.now(), operator, note)
            .await?;
        self.pool.review(&r.payment_id).await?.ok_or_else(|| {
            RailError::NotFound(format!("payment {} in the review queue", r.payment_id))
        })
    }

    /// The review of payment `t`, if it went to review, brought in line with the ledger: a
    /// pending review whose hold lapsed is recorded as expired.
    pub(crate) async fn reconciled_review(&self, t: &Transfer) -> RailResult<Option<ReviewRecord>> {
        if t.kind != TransferKind::Pending {
            return Ok(None);
        }
        let Some(r) = self.pool.review(&t.id.to_string()).await? else {
            return Ok(None);
        };
        if r.state != ReviewState::Pending {
            return Ok(Some(r));
        }
        let lapsed = match self.ledger.lookup_transfer(t.id).await? {
            Some((_, Some(TransferStatus::Expired))) => true,
            Some((_, Some(TransferStatus::Pending))) => t
                .expires_at()
                .is_some_and(|e| e <= self.ledger.clock().now()),
            _ => false,
        };
        if lapsed {
            return self
                .record(
                    &r,
                    ReviewState::Expired,
                    "facilitator",
                    Some("the hold lapsed before a decision"),
                )
                .await
                .map(Some);
        }
        Ok(Some(r))
    }
}
