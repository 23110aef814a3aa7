//! Settling what the receiver verified: [`StripeReceiver`]'s capture and void of a hold
//! (`HoldReceiver`) and its refunds (`RefundReceiver`), each under an `Idempotency-Key` derived
//! from the operation id.

use std::time::Duration;

use async_trait::async_trait;
use rail_core::{
    Captured, HoldReceiver, Money, OpId, RailError, RailResult, RefundReceiver, Refunded,
    ReplayGuard, Verified, Voided,
};
use stripe_client_core::StripeRequest;
use stripe_core::payment_intent::{CancelPaymentIntent, CapturePaymentIntent};
use stripe_core::refund::CreateRefund;
use stripe_core::{PaymentIntent, PaymentIntentStatus};
use stripe_types::Expandable;

use super::{META_OFFER, StripeReceiver, key, stripe_err};
use crate::currency;

/// Captured, and refunded so far, of an intent's charge.
fn captured_and_refunded(pi: &PaymentIntent) -> (i64, i64) {
    match &pi.latest_charge {
        Some(Expandable::Object(c)) => {
            // A partial capture records the released rest as refunded on the charge.
            let released = c.amount - c.amount_captured;
            (c.amount_captured, (c.amount_refunded - released).max(0))
        }
        _ => (pi.amount_received, 0),
    }
}

#[async_trait]
impl HoldReceiver for StripeReceiver {
    async fn capture(&self, op: &OpId, held: &Verified, amount: &Money) -> RailResult<Captured> {
        let content = (
            "capture",
            &held.payment_ref,
            &held.offer_id,
            amount.to_string(),
        );
        self.idem
            // Stripe's Idempotency-Key (from the operation id) makes doing it again the recovery.
            .run(op, &content, |_| async {
                let pi = self.own(&held.payment_ref).await?;
                if pi.metadata.get(META_OFFER) != Some(&held.offer_id) {
                    return Err(RailError::NotFound(format!(
                        "hold {} of offer {}",
                        held.payment_ref, held.offer_id
                    )));
                }
                let take = currency::to_stripe(amount)?;
                // Checked here only while the hold is open. Otherwise Stripe answers: the same
                // idempotency key replays a capture whose response was lost; anything else is
                // refused there as payment_intent_unexpected_state.
                if pi.status == PaymentIntentStatus::RequiresCapture && take > pi.amount_capturable
                {
                    return Err(RailError::ExceedsAvailable {
                        op: "capture",
                        requested: amount.amount(),
                        available: self.money(pi.amount_capturable)?.amount(),
                    });
                }
                let done = CapturePaymentIntent::new(pi.id.clone())
                    .amount_to_capture(take)
                    .customize()
                    .request_strategy(key("capture", op)?)
                    .send(&self.api)
                    .await
                    .map_err(stripe_err)?;
                Ok(Captured {
                    payment_ref: done.id.to_string(),
                    capture_ref: done.id.to_string(),
                    captured: self.money(done.amount_received)?,
                    released: self.money(done.amount - done.amount_received)?,
                })
            })
            .await
    }

    async fn void(&self, op: &OpId, held: &Verified) -> RailResult<Voided> {
        let content = ("void", &held.payment_ref, &held.offer_id);
        self.idem
            // Stripe's Idempotency-Key (from the operation id) makes doing it again the recovery.
            .run(op, &content, |_| async {
                let pi = self.own(&held.payment_ref).await?;
                if pi.metadata.get(META_OFFER) != Some(&held.offer_id) {
                    return Err(RailError::NotFound(format!("hold {}", held.payment_ref)));
                }
                // As for capture: a lost cancel is replayed by Stripe under the same key; a
                // cancel of a captured intent is refused there.
                let done = CancelPaymentIntent::new(pi.id.clone())
                    .customize()
                    .request_strategy(key("void", op)?)
                    .send(&self.api)
                    .await
                    .map_err(stripe_err)?;
                Ok(Voided {
                    payment_ref: done.id.to_string(),
                    released: self.money(done.amount - done.amount_received)?,
                })
            })
            .await
    }
}

#[async_trait]
impl RefundReceiver for StripeReceiver {
    async fn refund(&self, op: &OpId, payment_ref: &str, amount: &Money) -> RailResult<Refunded> {
        let content = ("refund", payment_ref, amount.to_string());
        self.idem
            // Stripe's Idempotency-Key (from the operation id) makes doing it again the recovery.
            .run(op, &content, |_| async {
                let pi = self.own(payment_ref).await?;
                let want = currency::to_stripe(amount)?;
                let (captured, refunded) = captured_and_refunded(&pi);
                let left = captured - refunded;
                // Was this operation's refund sent before (its answer lost)? Then Stripe
                // replays it under the same idempotency key, and the refunded total already
                // counts it: the local check below would wrongly refuse the retry.
                let sent = ReplayGuard::new(
                    self.guard_store(),
                    format!("stripe/refund-sent/{}", self.payee),
                );
                let resend = sent.state(op.as_str()).await?.is_some();
                // Refused here, before Stripe is asked (unless this is a resend).
                if want > left && !resend {
                    return Err(RailError::ExceedsAvailable {
                        op: "refund",
                        requested: amount.amount(),
                        available: self.money(left.max(0))?.amount(),
                    });
                }
                // Written ahead, kept as long as Stripe keeps idempotency keys (24 h).
                sent.insert_if_absent(op.as_str(), Some(Duration::from_secs(24 * 3600)))
                    .await?;
                let r = CreateRefund::new()
                    .payment_intent(pi.id.as_str())
                    .amount(want)
                    .customize()
                    .request_strategy(key("refund", op)?)
                    .send(&self.api)
                    .await
                    .map_err(stripe_err)?;
                Ok(Refunded {
                    payment_ref: payment_ref.to_owned(),
                    refund_ref: r.id.to_string(),
                    amount: self.money(r.amount)?,
                })
            })
            .await
    }
}
