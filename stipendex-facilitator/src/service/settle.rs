//! Capturing, voiding and refunding: the payee's side after a payment was verified. The
//! ledger rail's receiver does the work, for the calling account.

use rail_account::api::{CaptureRequest, RefundRequest, VoidRequest};
use rail_core::{
    Captured, HoldReceiver, OpId, PaymentMode, RailError, RailResult, RefundReceiver, Refunded,
    ReplayGuard, Voided,
};
use rail_ledger::{AccountId, LedgerReceiver, TransferId, TransferKind};

use super::{Facilitator, parse_id};
use crate::store::ReviewState;

impl Facilitator {
    /// The ledger rail's receiver for `caller` (its offers are never verified through it: the
    /// facilitator verifies with [`Facilitator::redeem`]).
    async fn receiver_for(&self, caller: AccountId) -> RailResult<LedgerReceiver> {
        let account = self.account(caller).await.map_err(super::account_error)?;
        Ok(LedgerReceiver::new(
            self.ledger.clone(),
            caller,
            account.asset,
            ReplayGuard::new(self.keys.clone(), "facilitator/unused"),
        ))
    }

    fn same_payment(path_id: &str, held: &rail_core::Verified) -> RailResult<()> {
        if held.payment_ref == path_id {
            Ok(())
        } else {
            Err(RailError::InvalidInput(format!(
                "the request is for payment {path_id}, its body for {}",
                held.payment_ref
            )))
        }
    }

    /// Captures part or all of a verified hold paid to `caller`, once per key `op`.
    ///
    /// # Errors
    /// `exceeds_available`, `invalid_state`, `not_found`, `pending_review`,
    /// `idempotency_conflict`.
    pub async fn capture(
        &self,
        caller: AccountId,
        op: &OpId,
        payment_id: &str,
        req: CaptureRequest,
    ) -> RailResult<Captured> {
        Self::same_payment(payment_id, &req.held)?;
        let id: TransferId = parse_id(payment_id, "payment id")?;
        // A hold that went to review is captured only once approved. The ledger is read
        // first: a review is queued before its hold is written, so a hold found here has its
        // review visible (read the other way round, a hold written between the two reads
        // would pass without its review).
        let (t, _) = self
            .ledger
            .lookup_transfer(id)
            .await?
            .ok_or_else(|| RailError::NotFound(format!("hold {id} for this receiver")))?;
        if t.credit == caller {
            self.review_gate(&t).await?;
        }
        self.receiver_for(caller)
            .await?
            .capture(op, &req.held, &req.amount)
            .await
    }

    /// Releases a verified hold paid to `caller`, once per key `op`.
    ///
    /// # Errors
    /// `invalid_state`, `not_found`, `idempotency_conflict`.
    pub async fn void(
        &self,
        caller: AccountId,
        op: &OpId,
        payment_id: &str,
        req: VoidRequest,
    ) -> RailResult<Voided> {
        Self::same_payment(payment_id, &req.held)?;
        self.receiver_for(caller).await?.void(op, &req.held).await
    }

    /// Refunds settled money of a payment (or a capture) paid to `caller`, once per key `op`.
    /// A payment approved in review is refunded from the transfer that settled it.
    ///
    /// # Errors
    /// `exceeds_available`, `not_found`, `idempotency_conflict`.
    pub async fn refund(
        &self,
        caller: AccountId,
        op: &OpId,
        payment_ref: &str,
        req: RefundRequest,
    ) -> RailResult<Refunded> {
        let id: TransferId = parse_id(payment_ref, "payment reference")?;
        // A payment approved in review was settled by the post of its hold: refunds go back
        // from that post. Anything else is the ledger receiver's to check (a hold is refused
        // there: refund a captured hold by its capture_ref).
        let mut settled_by = id;
        if let Some((t, _)) = self.ledger.lookup_transfer(id).await?
            && t.kind == TransferKind::Pending
            && t.credit == caller
            // Reconciled: an approval interrupted after its post is approved here too.
            && self.reconciled_review(&t).await?.is_some_and(|r| {
                r.state == ReviewState::Approved && r.mode == PaymentMode::Capture.to_string()
            })
        {
            settled_by = super::review::decision_id(&t, "review-approve")?;
        }
        let mut refunded = self
            .receiver_for(caller)
            .await?
            .refund(op, &settled_by.to_string(), &req.amount)
            .await?;
        refunded.payment_ref = payment_ref.to_owned();
        Ok(refunded)
    }
}
