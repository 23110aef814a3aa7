//! The receiver side: [`StripeReceiver`] makes offers (one PaymentIntent each), verifies
//! payments by asking Stripe, gives back an expired offer's payment, and takes webhook
//! deliveries. Capture, void and refund are in `settle.rs`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rail_core::keys::KeyStore;
use rail_core::{
    Asset, Binding, Capabilities, Charge, Idempotency, Money, Offer, OpId, Payment, PaymentMode,
    PaymentState, Rail, RailError, RailId, RailReceiver, RailResult, ReplayGuard, SharedClock,
    Verified, glue,
};
use stripe_client_core::StripeRequest;
use stripe_core::payment_intent::{
    CancelPaymentIntent, CreatePaymentIntent, RetrievePaymentIntent,
};
use stripe_core::refund::CreateRefund;
use stripe_core::{PaymentIntent, PaymentIntentCaptureMethod, PaymentIntentStatus};
use stripe_types::Expandable;

use super::{
    META_OFFER, META_PAYEE, OfferDetails, RAIL, StripeProof, capabilities, currency_of, key,
    status_str, stripe_err,
};
use crate::client::StripeHttp;
use crate::currency;

/// How long one webhook event is held while its handler runs (a crashed handler's event is
/// taken again after this).
pub const WEBHOOK_PROCESSING_LEASE: Duration = Duration::from_secs(300);

/// How long past its offer's life a verified intent's single-use mark is kept, and so how long
/// after an offer expired a payment presented late is given back automatically: the mark is what
/// tells a payment verified in time (the receiver's) from a late one. A payment presented after
/// this window is refused and reported, never refunded blindly (it may have been served).
pub const GIVE_BACK_WINDOW: Duration = Duration::from_secs(30 * 24 * 3600);

/// The receiver: a Stripe account (secret key) and the payee name its intents carry.
#[derive(Clone, Debug)]
pub struct StripeReceiver {
    pub(super) api: StripeHttp,
    publishable_key: String,
    pub(super) payee: String,
    asset: Asset,
    guard: ReplayGuard,
    pub(super) idem: Idempotency,
    store: Arc<dyn KeyStore>,
    clock: SharedClock,
}

impl StripeReceiver {
    /// A receiver on the account of `api` (a secret key), offering in `asset`, whose intents
    /// carry `payee` (so another receiver on the same account cannot touch them). `store` keeps
    /// the single-use marks and operation results: share it between instances.
    #[must_use]
    pub fn new(
        api: StripeHttp,
        publishable_key: impl Into<String>,
        payee: impl Into<String>,
        asset: Asset,
        store: Arc<dyn KeyStore>,
        clock: SharedClock,
    ) -> Self {
        StripeReceiver {
            api,
            publishable_key: publishable_key.into(),
            payee: payee.into(),
            asset,
            guard: ReplayGuard::new(store.clone(), "stripe/verified"),
            // The lease outlasts the transport's worst case (4 attempts of 30 s, plus backoff).
            idem: Idempotency::new(store.clone(), "stripe/receiver")
                .with_windows(Duration::from_secs(180), Duration::from_secs(24 * 3600)),
            store,
            clock,
        }
    }

    /// The payee name.
    #[must_use]
    pub fn payee(&self) -> &str {
        &self.payee
    }

    /// Takes a webhook delivery: verifies `Stripe-Signature` against `secret` (tolerance
    /// 300 s) before reading anything, refuses an event id seen before (a replayed delivery),
    /// and returns what the event says (a hold captured, canceled or lapsed; a refund).
    /// Receivers that keep their own view of payments feed it from here; verification never
    /// depends on it (it always asks Stripe).
    ///
    /// The event id is marked handled on receipt: use [`StripeReceiver::handle_webhook`] when
    /// processing an event can fail (then Stripe's retry of it must be processed, not refused).
    ///
    /// # Errors
    /// [`RailError::BadSignature`] (bad or stale signature), [`RailError::MalformedPayment`],
    /// [`RailError::Replayed`].
    pub async fn on_webhook(
        &self,
        payload: &str,
        signature: &str,
        secret: &str,
    ) -> RailResult<crate::webhook::Event> {
        self.handle_webhook(payload, signature, secret, |_| async {
            Ok::<(), std::convert::Infallible>(())
        })
        .await
        .map(|handled| match handled {
            Ok(event) => event,
            Err(never) => match never {},
        })
    }

    /// As [`StripeReceiver::on_webhook`], but the event id is marked handled only once
    /// `handler` succeeded. While it runs, a concurrent delivery of the same event is refused
    /// as a replay (Stripe retries it later); if it fails, the id is freed and Stripe's next
    /// delivery of the event is processed. Returns the handler's error inside `Ok`.
    ///
    /// # Errors
    /// As [`StripeReceiver::on_webhook`]; the handler's own failure is `Ok(Err(e))`.
    pub async fn handle_webhook<F, Fut, E>(
        &self,
        payload: &str,
        signature: &str,
        secret: &str,
        handler: F,
    ) -> RailResult<Result<crate::webhook::Event, E>>
    where
        F: FnOnce(&crate::webhook::Event) -> Fut + Send,
        Fut: std::future::Future<Output = Result<(), E>> + Send,
    {
        let now = self.clock.now().unix_seconds();
        let event = crate::webhook::parse(
            payload,
            signature,
            secret,
            now,
            crate::webhook::DEFAULT_TOLERANCE_SECS,
        )
        .map_err(|e| match e {
            crate::webhook::WebhookError::Payload(m) => RailError::MalformedPayment(m),
            other => RailError::BadSignature(other.to_string()),
        })?;
        // Stripe retries deliveries; keep ids longer than its retry window (3 days).
        // One namespace per receiver: receivers sharing a store (and a Stripe account) each
        // take their own deliveries.
        let seen = ReplayGuard::new(self.guard_store(), format!("stripe/events/{}", self.payee));
        let taken = seen
            .reserve(&event.id, WEBHOOK_PROCESSING_LEASE)
            .await
            .map_err(|e| match e {
                RailError::Replayed { .. } => RailError::Replayed {
                    key: event.id.clone(),
                },
                other => other,
            })?;
        tracing::info!(event = %event.id, kind = %event.kind, "stripe: webhook");
        // The lease is kept alive while the handler runs: a slow handler keeps its event.
        match taken.keep_alive(handler(&event)).await {
            Ok(()) => {
                taken
                    .commit(Some(Duration::from_secs(7 * 24 * 3600)))
                    .await?;
                Ok(Ok(event))
            }
            Err(e) => {
                // Not handled: Stripe's next delivery of this event must be processed.
                taken.release().await?;
                Ok(Err(e))
            }
        }
    }

    /// For a payment refused because its offer expired: cancels this offer's intent if it
    /// holds the payer's money (`requires_capture`), refunds it in full if it took it
    /// (`succeeded`). Best effort, idempotent (keys derived from the intent): a failure is
    /// logged and the next verify of the same payment tries again.
    async fn give_back_expired(&self, offer: &Offer, payment: &Payment) {
        let Ok(proof) = payment.proof_as::<StripeProof>() else {
            return;
        };
        let Ok(details) = offer.details_as::<OfferDetails>() else {
            return;
        };
        if proof.payment_intent != details.payment_intent || offer.payee != self.payee {
            return;
        }
        let Ok(pi) = self.own(&proof.payment_intent).await else {
            return;
        };
        if pi.metadata.get(META_OFFER) != Some(&offer.id) {
            return;
        }
        // A payment verified in time is the receiver's: a late replay of it gives nothing back.
        // Its mark lives for the give-back window; past it, nothing is given back blindly.
        // (A day short of the mark's life: clocks of hosts and store may differ.)
        let cutoff = GIVE_BACK_WINDOW.saturating_sub(Duration::from_secs(24 * 3600));
        if self.clock.now() >= offer.expires_at.plus(cutoff) {
            tracing::warn!(intent = %pi.id, offer = %offer.id, "stripe: a payment presented after the give-back window of its expired offer: refused, not refunded (check it by hand)");
            return;
        }
        if !matches!(self.guard.state(pi.id.as_str()).await, Ok(None)) {
            return;
        }
        let Ok(op) = OpId::new(format!("expired-{}", pi.id)) else {
            return;
        };
        let outcome = match pi.status {
            PaymentIntentStatus::RequiresCapture => match key("expired-cancel", &op) {
                Ok(k) => CancelPaymentIntent::new(pi.id.clone())
                    .customize()
                    .request_strategy(k)
                    .send(&self.api)
                    .await
                    .map(|_| "canceled")
                    .map_err(stripe_err),
                Err(e) => Err(e),
            },
            PaymentIntentStatus::Succeeded => match key("expired-refund", &op) {
                Ok(k) => CreateRefund::new()
                    .payment_intent(pi.id.as_str())
                    .customize()
                    .request_strategy(k)
                    .send(&self.api)
                    .await
                    .map(|_| "refunded")
                    .map_err(stripe_err),
                Err(e) => Err(e),
            },
            _ => return,
        };
        match outcome {
            Ok(what) => {
                tracing::info!(intent = %pi.id, offer = %offer.id, what, "stripe: expired offer's payment given back");
            }
            Err(e) => {
                tracing::warn!(intent = %pi.id, offer = %offer.id, error = %e, "stripe: could not give back an expired offer's payment");
            }
        }
    }

    pub(super) fn guard_store(&self) -> Arc<dyn KeyStore> {
        self.store.clone()
    }

    async fn retrieve(&self, id: &str) -> RailResult<PaymentIntent> {
        RetrievePaymentIntent::new(id)
            .expand(vec!["latest_charge".to_owned()])
            .send(&self.api)
            .await
            .map_err(stripe_err)
    }

    /// An intent of this receiver's (its metadata names this payee), or `NotFound`.
    pub(super) async fn own(&self, id: &str) -> RailResult<PaymentIntent> {
        let pi = match self.retrieve(id).await {
            Err(RailError::NotFound(_)) | Err(RailError::InvalidInput(_)) => {
                return Err(RailError::NotFound(format!("payment {id}")));
            }
            other => other?,
        };
        if pi.metadata.get(META_PAYEE).map(String::as_str) != Some(self.payee.as_str()) {
            return Err(RailError::NotFound(format!(
                "payment {id} for this receiver"
            )));
        }
        Ok(pi)
    }

    pub(super) fn money(&self, n: i64) -> RailResult<Money> {
        currency::from_stripe(&self.asset, n)
    }
}

impl Rail for StripeReceiver {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities(&self.asset)
    }
}

#[async_trait]
impl RailReceiver for StripeReceiver {
    /// Every offer is an object at the processor or the wallet: quoting is rate-limited.
    fn offers_cost(&self) -> bool {
        true
    }

    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        if charge.amount.asset() != &self.asset {
            return Err(RailError::InvalidInput(format!(
                "asset {} is not this receiver's {}",
                charge.amount.asset(),
                self.asset
            )));
        }
        let amount = currency::to_stripe(&charge.amount)?;
        let offer_id = format!("off_{}", hex::encode(rand::random::<[u8; 12]>()));
        let mut metadata = std::collections::HashMap::new();
        metadata.insert(META_OFFER.to_owned(), offer_id.clone());
        metadata.insert(META_PAYEE.to_owned(), self.payee.clone());
        if let Some(r) = &charge.reference {
            metadata.insert("stipendex_reference".to_owned(), r.clone());
        }
        let capture = match charge.mode {
            PaymentMode::Capture => PaymentIntentCaptureMethod::Automatic,
            PaymentMode::Hold => PaymentIntentCaptureMethod::Manual,
        };
        let mut req = CreatePaymentIntent::new(amount, currency_of(&self.asset))
            .capture_method(capture)
            .metadata(metadata);
        if !charge.description.is_empty() {
            req = req.description(charge.description.clone());
        }
        let pi = req
            .customize()
            .request_strategy(key("offer", &OpId::new(offer_id.clone())?)?)
            .send(&self.api)
            .await
            .map_err(stripe_err)?;
        let secret = pi.client_secret.clone().ok_or_else(|| RailError::Rail {
            reason: rail_core::RailReason::new("stripe", "intent has no client_secret"),
            retryable: false,
        })?;
        glue::offer(
            RAIL,
            offer_id,
            charge,
            self.payee.clone(),
            self.clock.now().plus(charge.ttl),
            &OfferDetails {
                payment_intent: pi.id.to_string(),
                client_secret: secret,
                publishable_key: self.publishable_key.clone(),
                payee: self.payee.clone(),
            },
        )
    }

    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        payment.check_envelope(offer)?;
        if let Err(expired) = offer.check_live(self.clock.now()) {
            // Refused; but if the payer's money is already held or taken for this offer, give
            // it back: an expired offer must not keep anyone's money.
            self.give_back_expired(offer, payment).await;
            return Err(expired);
        }
        if offer.payee != self.payee {
            return Err(RailError::mismatch(
                Binding::Payee,
                &self.payee,
                &offer.payee,
            ));
        }
        let proof: StripeProof = payment.proof_as()?;
        let details: OfferDetails = offer.details_as()?;
        if proof.payment_intent != details.payment_intent {
            return Err(RailError::mismatch(
                Binding::Offer,
                &details.payment_intent,
                &proof.payment_intent,
            ));
        }
        let pi = self.own(&proof.payment_intent).await?;
        if pi.metadata.get(META_OFFER) != Some(&offer.id) {
            return Err(RailError::mismatch(
                Binding::Offer,
                &offer.id,
                "another offer",
            ));
        }
        let want = currency::to_stripe(&offer.amount)?;
        if pi.amount != want {
            return Err(RailError::mismatch(Binding::Amount, want, pi.amount));
        }
        if pi.currency != currency_of(&self.asset) {
            return Err(RailError::mismatch(
                Binding::Asset,
                &self.asset,
                pi.currency,
            ));
        }
        if pi.livemode == self.api.is_test_mode() {
            return Err(RailError::InvalidState {
                op: "verify",
                state: format!(
                    "livemode {} with a {} key",
                    pi.livemode,
                    self.api.key_kind()
                ),
            });
        }
        let pm = match &pi.payment_method {
            Some(Expandable::Id(id)) => id.to_string(),
            Some(Expandable::Object(o)) => o.id.to_string(),
            None => String::new(),
        };
        if payment.payer != pm {
            return Err(RailError::mismatch(Binding::Payer, &pm, &payment.payer));
        }
        let state = match (offer.mode, &pi.status) {
            (PaymentMode::Capture, PaymentIntentStatus::Succeeded)
                if pi.amount_received == want =>
            {
                PaymentState::Settled
            }
            (PaymentMode::Hold, PaymentIntentStatus::RequiresCapture)
                if pi.amount_capturable == want
                    && pi.capture_method == PaymentIntentCaptureMethod::Manual =>
            {
                PaymentState::Held {
                    capturable: offer.amount.clone(),
                    expires_at: None,
                }
            }
            (_, s) => {
                return Err(RailError::InvalidState {
                    op: "verify",
                    state: format!("payment intent {} is {}", pi.id, status_str(s)),
                });
            }
        };
        // Single use, across every instance sharing the store.
        self.guard
            .reserve(pi.id.as_str(), Duration::from_secs(30))
            .await?
            .commit(Some(offer.retention(self.clock.now(), GIVE_BACK_WINDOW)))
            .await?;
        Ok(glue::verified(
            RAIL,
            offer,
            pi.id.to_string(),
            pm,
            offer.amount.clone(),
            state,
        ))
    }
}
