//! A payment as its payer or payee sees it.

use rail_account::api::{PaymentStatus, PaymentView};
use rail_core::{PaymentMode, RailError, RailResult};
use rail_ledger::{AccountId, TransferId, TransferKind, TransferStatus};

use super::{Facilitator, money, parse_id};
use crate::store::ReviewState;

impl Facilitator {
    /// Payment `payment_id`, if `caller` paid it or is paid by it (to anyone else it does not
    /// exist).
    ///
    /// # Errors
    /// [`RailError::NotFound`], [`RailError::Storage`].
    pub async fn payment_view(
        &self,
        caller: AccountId,
        payment_id: &str,
    ) -> RailResult<PaymentView> {
        let id: TransferId = parse_id(payment_id, "payment id")?;
        let not_found = || RailError::NotFound(format!("payment {payment_id}"));
        let (t, status) = self
            .ledger
            .lookup_transfer(id)
            .await?
            .ok_or_else(not_found)?;
        if !matches!(t.kind, TransferKind::Single | TransferKind::Pending)
            || (t.debit != caller && t.credit != caller)
        {
            return Err(not_found());
        }
        let asset = self
            .ledger
            .account(t.debit)
            .await?
            .ok_or_else(not_found)?
            .asset;
        let review = self.reconciled_review(&t).await?;
        let mode = match (&t.kind, &review) {
            (TransferKind::Single, _) => PaymentMode::Capture,
            (_, Some(r)) if r.mode == PaymentMode::Capture.to_string() => PaymentMode::Capture,
            _ => PaymentMode::Hold,
        };
        let zero = money(&asset, 0)?;
        let (status, settled, refunded) = match status {
            Some(TransferStatus::Settled { reversed }) => (
                PaymentStatus::Settled,
                money(&asset, t.amount)?,
                Some(money(&asset, reversed)?),
            ),
            Some(TransferStatus::Pending)
                if review
                    .as_ref()
                    .is_some_and(|r| r.state == ReviewState::Pending) =>
            {
                (PaymentStatus::PendingReview, zero, None)
            }
            Some(TransferStatus::Pending) => (PaymentStatus::Held, zero, None),
            Some(TransferStatus::Posted { amount }) if mode == PaymentMode::Capture => {
                // Approved in review: the settling transfer carries the refunds.
                let by = super::review::decision_id(&t, "review-approve")?;
                let reversed = match self.ledger.lookup_transfer(by).await? {
                    Some((_, Some(TransferStatus::Settled { reversed }))) => reversed,
                    _ => 0,
                };
                (
                    PaymentStatus::Settled,
                    money(&asset, amount)?,
                    Some(money(&asset, reversed)?),
                )
            }
            Some(TransferStatus::Posted { amount }) => {
                (PaymentStatus::Captured, money(&asset, amount)?, None)
            }
            Some(TransferStatus::Voided) => (PaymentStatus::Voided, zero, None),
            Some(TransferStatus::Expired) => (PaymentStatus::Expired, zero, None),
            None => return Err(not_found()),
        };
        Ok(PaymentView {
            payment_ref: t.id.to_string(),
            payer: t.debit.to_string(),
            payee: t.credit.to_string(),
            amount: money(&asset, t.amount)?,
            mode,
            status,
            settled,
            refunded,
            review: review.map(|r| r.state.as_str().to_owned()),
            created_at: t.timestamp,
            expires_at: (status == PaymentStatus::Held || status == PaymentStatus::PendingReview)
                .then(|| t.expires_at())
                .flatten(),
        })
    }
}
