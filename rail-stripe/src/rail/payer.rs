//! The payer side: [`StripePayer`] checks an offer's intent against the offer, then confirms it
//! with the receiver's publishable key and the intent's client secret.

use std::sync::Arc;

use async_trait::async_trait;
use rail_core::{
    Asset, Binding, Capabilities, HoldPayer, Money, Offer, OpId, Payer, Payment, PaymentMode, Rail,
    RailError, RailId, RailResult, SharedClock, glue,
};
use serde::Serialize;
use stripe_client_core::{RequestBuilder, StripeMethod};
use stripe_core::{PaymentIntent, PaymentIntentCaptureMethod, PaymentIntentStatus};

use super::{
    OfferDetails, RAIL, StripeProof, capabilities, currency_of, key, status_str, stripe_err,
};
use crate::client::StripeHttp;
use crate::currency;

/// The payer: a card (PaymentMethod) the principal controls, and a spending limit.
#[derive(Clone, Debug)]
pub struct StripePayer {
    http: StripeHttp,
    payment_method: String,
    asset: Asset,
    max_amount: Money,
    clock: SharedClock,
    lock: Arc<tokio::sync::Mutex<()>>,
}

#[derive(Serialize)]
struct ConfirmForm<'a> {
    payment_method: &'a str,
    client_secret: &'a str,
}

#[derive(Serialize)]
struct SecretQuery<'a> {
    client_secret: &'a str,
}

impl StripePayer {
    /// A payer paying with `payment_method` through Stripe at `base` (`https://api.stripe.com`),
    /// never more than `max_amount` per payment. It holds no Stripe key of its own: each offer
    /// brings its merchant's publishable key and one intent's client secret.
    ///
    /// # Errors
    /// [`RailError::Unavailable`] if the HTTP client cannot be built.
    pub fn new(
        base: &str,
        payment_method: impl Into<String>,
        max_amount: Money,
        clock: SharedClock,
    ) -> RailResult<Self> {
        Ok(StripePayer {
            http: StripeHttp::new(base, "pk_none").map_err(stripe_err)?,
            payment_method: payment_method.into(),
            asset: max_amount.asset().clone(),
            max_amount,
            clock,
            lock: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// The offer's checks: rail, mode, asset, this payer's limit, payee = the intent's merchant.
    fn checked(&self, offer: &Offer, mode: PaymentMode) -> RailResult<(OfferDetails, i64)> {
        glue::check_rail_and_mode(offer, RAIL, mode)?;
        if offer.amount.asset() != &self.asset {
            return Err(RailError::InvalidInput(format!(
                "this payer pays in {}, the offer asks {}",
                self.asset,
                offer.amount.asset()
            )));
        }
        glue::check_payer_limit(&offer.amount, &self.max_amount)?;
        let details: OfferDetails = offer.details_as()?;
        // The destination is the intent's merchant, whatever the envelope says: an offer whose
        // payee is not the intent's is refused before anything is paid.
        if details.payee != offer.payee {
            return Err(RailError::mismatch(
                Binding::Payee,
                &details.payee,
                &offer.payee,
            ));
        }
        let want = currency::to_stripe(&offer.amount)?;
        Ok((details, want))
    }

    /// The intent behind an offer, read with its client secret.
    async fn intent(&self, details: &OfferDetails) -> RailResult<PaymentIntent> {
        let api = self.http.with_key(details.publishable_key.clone());
        RequestBuilder::new(
            StripeMethod::Get,
            format!("/payment_intents/{}", details.payment_intent),
        )
        .query(&SecretQuery {
            client_secret: &details.client_secret,
        })
        .customize()
        .send(&api)
        .await
        .map_err(stripe_err)
    }

    fn payment(&self, offer: &Offer, mode: PaymentMode, intent: &str) -> RailResult<Payment> {
        glue::payment(
            RAIL,
            offer,
            mode,
            self.payment_method.clone(),
            &StripeProof {
                payment_intent: intent.to_owned(),
            },
        )
    }

    async fn confirm(&self, op: &OpId, offer: &Offer, mode: PaymentMode) -> RailResult<Payment> {
        let (details, want) = self.checked(offer, mode)?;
        let _serial = self.lock.lock().await;
        offer.check_live(self.clock.now())?;
        let api = self.http.with_key(details.publishable_key.clone());
        // Check the intent before confirming: the payer pays what was offered, no more.
        let pi = self.intent(&details).await?;
        let manual = pi.capture_method == PaymentIntentCaptureMethod::Manual;
        if pi.amount != want
            || pi.currency != currency_of(&self.asset)
            || manual != (mode == PaymentMode::Hold)
        {
            return Err(RailError::mismatch(
                Binding::Amount,
                format!("{want} {} ({mode:?})", self.asset),
                format!("{} {} (manual capture: {manual})", pi.amount, pi.currency),
            ));
        }
        let done: PaymentIntent = RequestBuilder::new(
            StripeMethod::Post,
            format!("/payment_intents/{}/confirm", details.payment_intent),
        )
        .form(&ConfirmForm {
            payment_method: &self.payment_method,
            client_secret: &details.client_secret,
        })
        .customize()
        .request_strategy(key("pay", op)?)
        .send(&api)
        .await
        .map_err(stripe_err)?;
        // The intent may have changed between the check and the confirm: what was confirmed
        // must be what was offered.
        let moved = match mode {
            PaymentMode::Capture => done.amount_received,
            PaymentMode::Hold => done.amount_capturable,
        };
        if done.amount != want || moved != want || done.currency != currency_of(&self.asset) {
            tracing::error!(intent = %done.id, offered = want, charged = moved, "stripe: confirmed intent differs from the offer");
            return Err(RailError::mismatch(Binding::Amount, want, moved));
        }
        let ok = match mode {
            PaymentMode::Capture => done.status == PaymentIntentStatus::Succeeded,
            PaymentMode::Hold => done.status == PaymentIntentStatus::RequiresCapture,
        };
        if !ok {
            return Err(RailError::InvalidState {
                op: "pay",
                state: format!("payment intent is {}", status_str(&done.status)),
            });
        }
        self.payment(offer, mode, done.id.as_str())
    }
}

/// An earlier attempt whose outcome is unknown is looked up on the intent itself: confirmed
/// for the offer's amount (succeeded, or held for capture) means it paid — returned even past
/// the offer's time, so a charge that happened is never lost; otherwise nothing moved and the
/// attempt confirms now (under the same `Idempotency-Key`).
#[async_trait]
impl rail_core::payer::FindPayment for StripePayer {
    async fn find_payment(
        &self,
        _op: &OpId,
        offer: &Offer,
        mode: PaymentMode,
    ) -> RailResult<Option<Payment>> {
        let (details, want) = self.checked(offer, mode)?;
        let pi = self.intent(&details).await?;
        let (status, moved) = match mode {
            PaymentMode::Capture => (PaymentIntentStatus::Succeeded, pi.amount_received),
            PaymentMode::Hold => (PaymentIntentStatus::RequiresCapture, pi.amount_capturable),
        };
        if pi.status == status && moved == want && pi.currency == currency_of(&self.asset) {
            self.payment(offer, mode, pi.id.as_str()).map(Some)
        } else {
            Ok(None)
        }
    }
}

impl Rail for StripePayer {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities(&self.asset)
    }
}

#[async_trait]
impl Payer for StripePayer {
    async fn pay(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.confirm(op, offer, PaymentMode::Capture).await
    }
}

#[async_trait]
impl HoldPayer for StripePayer {
    async fn hold(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.confirm(op, offer, PaymentMode::Hold).await
    }
}
