//! The review queue: payments above their payer's threshold wait for an operator.
//!
//! **The ledger decides.** A decision is applied to the ledger first, then recorded:
//! approving a payment posts its hold in full, rejecting voids it (approving a hold only lets
//! its payee verify it). The transfers' ids derive from the payment, so a decision taken twice
//! (two operators, or one interrupted half-way) is applied once, and the ledger refuses the
//! second of two opposite ones. Every decision first reads where the hold stands and records
//! that (posted: approved; voided: rejected; lapsed: expired), so a decision interrupted after
//! its ledger step is finished, never contradicted, by the next attempt.

use rail_core::{OpId, RailError, RailResult};
use rail_ledger::{
    AccountId, LedgerError, Transfer, TransferError, TransferId, TransferKind, TransferRequest,
    TransferStatus, offer_binding, op_transfer_id,
};

use super::{Facilitator, parse_id};
use crate::store::{ReviewRecord, ReviewState};

/// How long after its offer's end a review whose payment was never held is closed (longer
/// than any request can take between the offer check and the hold's write).
const NEVER_HELD_AFTER_MS: i64 = 10 * 60 * 1000;

/// The id of the transfer that carries decision `what` on payment `t`.
pub(crate) fn decision_id(t: &Transfer, what: &str) -> RailResult<TransferId> {
    Ok(op_transfer_id(t.debit, what, &OpId::new(t.id.to_string())?))
}

/// Whether review `r` was queued for a payment of `amount` from `payer` to `payee` for the
/// offer bound as `user_data` (what the operator is shown is what the hold carries).
pub(crate) fn describes(
    r: &ReviewRecord,
    payer: AccountId,
    payee: AccountId,
    amount: u64,
    user_data: u128,
) -> bool {
    r.payer == payer.to_string()
        && r.payee == payee.to_string()
        && u64::try_from(r.amount).is_ok_and(|a| a == amount)
        && offer_binding(&r.offer_id) == user_data
}

/// What the ledger says of a review's hold.
enum Standing {
    /// Still held.
    Held,
    /// Posted (a payment approved, or a hold the payee captured after approval).
    Posted,
    /// Voided (rejected, or released by its payee).
    Voided,
    /// Lapsed.
    Lapsed,
}

impl Standing {
    /// The review state the ledger's word implies; a hold still held is `held_as`.
    fn state(&self, held_as: ReviewState) -> ReviewState {
        match self {
            Standing::Held => held_as,
            Standing::Posted => ReviewState::Approved,
            Standing::Voided => ReviewState::Rejected,
            Standing::Lapsed => ReviewState::Expired,
        }
    }

    /// Why a review ended otherwise than decided.
    fn why(&self) -> &'static str {
        match self {
            Standing::Held => "still held",
            Standing::Posted => "posted before it was recorded",
            Standing::Voided => "released before a decision",
            Standing::Lapsed => "the hold lapsed before a decision",
        }
    }

    /// Where a decision's ledger step left the hold: `done` when it applied, else what the
    /// ledger's refusal says of the hold.
    fn after(
        result: Result<rail_ledger::Created, LedgerError>,
        done: Standing,
    ) -> RailResult<Standing> {
        match result {
            Ok(_) => Ok(done),
            Err(LedgerError::Refused(TransferError::AlreadyPosted)) => Ok(Standing::Posted),
            Err(LedgerError::Refused(TransferError::AlreadyVoided)) => Ok(Standing::Voided),
            Err(LedgerError::Refused(TransferError::PendingExpired)) => Ok(Standing::Lapsed),
            Err(e) => Err(e.into()),
        }
    }
}

impl Facilitator {
    /// The review queue: reviews in `state` (all when `None`), oldest first, each brought in
    /// line with the ledger. A review whose payment was never held (the hold was refused after
    /// the review was queued) is left out.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn reviews(
        &self,
        state: Option<ReviewState>,
        limit: i64,
    ) -> RailResult<Vec<ReviewRecord>> {
        let mut out = Vec::new();
        for r in self.pool.reviews(state, limit).await? {
            let id: TransferId = parse_id(&r.payment_id, "payment id")?;
            if let Some((t, _)) = self.ledger.lookup_transfer(id).await?
                && let Some(r) = self.reconciled_review(&t).await?
            {
                out.push(r);
            }
        }
        Ok(out)
    }

    /// Approves a payment in review: a payment is posted to its payee in full, a hold becomes
    /// verifiable. Approving an approved payment again changes nothing.
    ///
    /// # Errors
    /// [`RailError::NotFound`] (not in review), [`RailError::InvalidState`] (rejected, expired,
    /// or too little of its offer left: the funds are then released).
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
            // Too late to be presented and verified: release the funds instead (an approval
            // that reached the ledger first stands).
            let released = match self.release(&t).await? {
                Standing::Posted => Standing::Posted,
                _ => Standing::Lapsed,
            };
            let why = Some("the offer ends before the payment could be verified");
            let r = self
                .record_standing(&r, &released, ReviewState::Expired, operator, why)
                .await?;
            if r.state == ReviewState::Approved {
                return Ok(r);
            }
            return Err(RailError::InvalidState {
                op: "approve",
                state: format!(
                    "expired: its offer ends in {} s, under the {} s an approval leaves the payer to present it",
                    left.max(0) / 1000,
                    margin / 1000
                ),
            });
        }
        let standing = if r.mode == "capture" {
            let post = TransferRequest::Post {
                id: decision_id(&t, "review-approve")?,
                pending_id: t.id,
                amount: t.amount,
            };
            Standing::after(self.ledger.transfer(post).await, Standing::Posted)?
        } else {
            self.standing(&t).await?
        };
        let r = self
            .record_standing(&r, &standing, ReviewState::Approved, operator, note)
            .await?;
        if r.state == ReviewState::Approved {
            Ok(r)
        } else {
            Err(RailError::InvalidState {
                op: "approve",
                state: r.state.as_str().into(),
            })
        }
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
        // An approval that got to the ledger first stands.
        let released = self.release(&t).await?;
        let r = self
            .record_standing(&r, &released, ReviewState::Rejected, operator, note)
            .await?;
        if r.state == ReviewState::Approved {
            return Err(RailError::InvalidState {
                op: "reject",
                state: "approved".into(),
            });
        }
        Ok(r)
    }

    /// Brings the pending reviews whose offer has ended in line with the ledger (their holds
    /// released, recorded expired), at most `limit` of them, oldest first; how many.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn expire_reviews(&self, limit: i64) -> RailResult<u64> {
        let now = self.clock.now();
        let mut done = 0;
        for r in self.pool.reviews_ended(now, limit).await? {
            let id: TransferId = parse_id(&r.payment_id, "payment id")?;
            let ended = match self.ledger.lookup_transfer(id).await? {
                Some((t, _)) => match self.reconciled_review(&t).await? {
                    Some(r) => r.state != ReviewState::Pending,
                    // Queued for another payment under this id, refused before its hold was
                    // written: the id is taken now, that payment can never be held.
                    None => self.close_never_held(&r, now).await?,
                },
                // Never held (its transfer was refused), and past any request still in flight
                // when its offer ended. A hold written after this is refused as expired by
                // every reader (funds back at its lapse).
                None if now.0.saturating_sub(r.offer_expires_at.0) > NEVER_HELD_AFTER_MS => {
                    self.close_never_held(&r, now).await?
                }
                None => false,
            };
            done += u64::from(ended);
        }
        Ok(done)
    }

    /// Closes review `r`, whose payment was never held, so that no sweep reads it again.
    async fn close_never_held(
        &self,
        r: &ReviewRecord,
        now: rail_core::Timestamp,
    ) -> RailResult<bool> {
        let why = Some("never held: the payment's transfer was refused");
        self.pool
            .decide(&r.payment_id, ReviewState::Expired, now, "facilitator", why)
            .await
    }

    /// Voids a payment's hold (once, whoever asks first); what the ledger then says of it.
    async fn release(&self, t: &Transfer) -> RailResult<Standing> {
        let void = TransferRequest::Void {
            id: decision_id(t, "review-reject")?,
            pending_id: t.id,
        };
        Standing::after(self.ledger.transfer(void).await, Standing::Voided)
    }

    /// Where a hold stands by the ledger (a hold past its time counts as lapsed, by the
    /// ledger's clock).
    async fn standing(&self, t: &Transfer) -> RailResult<Standing> {
        let status = self
            .ledger
            .lookup_transfer(t.id)
            .await?
            .and_then(|(_, s)| s);
        Ok(match status {
            Some(TransferStatus::Posted { .. }) => Standing::Posted,
            Some(TransferStatus::Voided) => Standing::Voided,
            Some(TransferStatus::Expired) => Standing::Lapsed,
            _ => {
                // The clock the ledger lapses holds by (the database's on PostgreSQL).
                let now = self.ledger.now().await?;
                if t.expires_at().is_some_and(|e| e <= now) {
                    Standing::Lapsed
                } else {
                    Standing::Held
                }
            }
        })
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

    /// Records a decision on a pending review; the review as stored after (a decision recorded
    /// meanwhile by someone else is kept, and returned).
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

    /// Records what the ledger says of review `r`'s hold: a hold still held (or the decision
    /// made) is `decided`, with the operator's `note`; a hold the ledger says otherwise of is
    /// recorded as such, with why.
    async fn record_standing(
        &self,
        r: &ReviewRecord,
        standing: &Standing,
        decided: ReviewState,
        operator: &str,
        note: Option<&str>,
    ) -> RailResult<ReviewRecord> {
        let state = standing.state(decided);
        let note = if state == decided {
            note
        } else {
            Some(standing.why())
        };
        self.record(r, state, operator, note).await
    }

    /// The review of payment `t`, if it went to review, brought in line with the ledger: a
    /// pending review whose hold was posted is approved (an approval interrupted after its
    /// ledger step), one whose hold was voided is rejected, one whose hold lapsed, or whose
    /// offer ended undecided, is expired (the hold is released first: a void that an approval
    /// cannot race). A review queued under the payment's id for another payment (an attempt
    /// refused before its hold was written) is not this payment's.
    pub(crate) async fn reconciled_review(&self, t: &Transfer) -> RailResult<Option<ReviewRecord>> {
        if t.kind != TransferKind::Pending {
            return Ok(None);
        }
        let Some(r) = self.pool.review(&t.id.to_string()).await? else {
            return Ok(None);
        };
        if !describes(&r, t.debit, t.credit, t.amount, t.user_data) {
            return Ok(None);
        }
        if r.state != ReviewState::Pending {
            return Ok(Some(r));
        }
        let standing = match self.standing(t).await? {
            // Undecided when its offer ended: nobody can verify it now, so the payer's funds
            // come back (a hold asked for longer than the offer would keep them till its end).
            Standing::Held if self.clock.now() >= r.offer_expires_at => {
                match self.release(t).await? {
                    Standing::Posted => Standing::Posted,
                    _ => Standing::Lapsed,
                }
            }
            Standing::Held => return Ok(Some(r)),
            // Made final by a void (an approval that reached the ledger first stands).
            Standing::Lapsed => match self.release(t).await? {
                Standing::Posted => Standing::Posted,
                _ => Standing::Lapsed,
            },
            other => other,
        };
        self.record_standing(&r, &standing, ReviewState::Pending, "facilitator", None)
            .await
            .map(Some)
    }
}
