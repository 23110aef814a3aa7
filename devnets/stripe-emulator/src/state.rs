//! The emulator's state machine: PaymentIntents, charges, refunds, cards (test cards and cards
//! with limits), the merchant's balance, idempotency keys, authorisation lapse on the
//! configured clock, and the events it emits. No HTTP here: operations take the request's
//! parameters and answer the object's JSON or a Stripe error ([`super::error`]).

use std::collections::{BTreeMap, HashMap};

// `http::StatusCode`, as in [`super::error`]: not the server's crate.
use reqwest::StatusCode;
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};

use super::error::{ApiError, api_error, invalid, no_such, unexpected_state};
use super::{AUTHORIZATION_LIFETIME, Emulator, IDEMPOTENCY_TTL, MIN_CHARGE_USD};

#[derive(Clone, Debug)]
struct Card {
    id: String,
    brand: &'static str,
    last4: &'static str,
    decline: Option<(&'static str, &'static str, &'static str)>,
    limit: Option<u64>,
    /// Authorised or captured and not refunded (counts against the limit).
    used: u64,
}

#[derive(Clone, Debug)]
struct Intent {
    id: String,
    amount: u64,
    currency: String,
    capture_method: String,
    status: String,
    client_secret: String,
    metadata: BTreeMap<String, String>,
    description: Option<String>,
    payment_method: Option<String>,
    latest_charge: Option<String>,
    amount_capturable: u64,
    amount_received: u64,
    created: i64,
    canceled_at: Option<i64>,
    cancellation_reason: Option<String>,
    last_payment_error: Option<Json>,
    /// When an authorisation lapses.
    capture_before: Option<i64>,
}

#[derive(Clone, Debug)]
struct ChargeRec {
    id: String,
    payment_intent: String,
    amount: u64,
    amount_captured: u64,
    amount_refunded: u64,
    captured: bool,
    currency: String,
    payment_method: String,
    created: i64,
    status: String,
}

#[derive(Clone, Debug)]
struct RefundRec {
    id: String,
    amount: u64,
    charge: String,
    payment_intent: String,
    currency: String,
    created: i64,
    metadata: BTreeMap<String, String>,
}

#[derive(Clone, Debug)]
struct Stored {
    fingerprint: [u8; 32],
    status: u16,
    body: Json,
    expires: i64,
}

/// Everything the emulator knows, behind one lock.
#[derive(Debug, Default)]
pub(super) struct StateInner {
    intents: HashMap<String, Intent>,
    charges: HashMap<String, ChargeRec>,
    refunds: HashMap<String, RefundRec>,
    cards: HashMap<String, Card>,
    idempotency: HashMap<(String, String), Stored>,
    /// Events not yet delivered, in order.
    outbox: Vec<Json>,
    /// Every event, for the tests.
    events: Vec<Json>,
    /// Captured minus refunded, per currency: the merchant's balance.
    balance: BTreeMap<String, i128>,
}

/// A Stripe-like object id: `prefix_` and 24 random alphanumerics.
pub(super) fn random_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let tail: String = rand::random::<[u8; 24]>()
        .iter()
        .map(|b| {
            char::from(
                ALPHABET
                    .get(usize::from(*b) % ALPHABET.len())
                    .copied()
                    .unwrap_or(b'0'),
            )
        })
        .collect();
    format!("{prefix}_{tail}")
}

/// One of Stripe's test PaymentMethods (`pm_card_visa`, `pm_card_chargeDeclined`, …).
fn test_card(id: &str) -> Option<Card> {
    let (brand, last4, decline) = match id {
        "pm_card_visa" => ("visa", "4242", None),
        "pm_card_mastercard" => ("mastercard", "4444", None),
        "pm_card_chargeDeclined" => (
            "visa",
            "0002",
            Some((
                "card_declined",
                "generic_decline",
                "Your card was declined.",
            )),
        ),
        "pm_card_chargeDeclinedInsufficientFunds" => (
            "visa",
            "9995",
            Some((
                "card_declined",
                "insufficient_funds",
                "Your card has insufficient funds.",
            )),
        ),
        "pm_card_chargeDeclinedFraudulent" => (
            "visa",
            "0019",
            Some(("card_declined", "fraudulent", "Your card was declined.")),
        ),
        "pm_card_chargeDeclinedExpiredCard" => (
            "visa",
            "0069",
            Some(("expired_card", "expired_card", "Your card has expired.")),
        ),
        "pm_card_chargeDeclinedIncorrectCvc" => (
            "visa",
            "0127",
            Some((
                "incorrect_cvc",
                "incorrect_cvc",
                "Your card's security code is incorrect.",
            )),
        ),
        "pm_card_chargeDeclinedProcessingError" => (
            "visa",
            "0119",
            Some((
                "processing_error",
                "processing_error",
                "An error occurred while processing your card. Try again in a little bit.",
            )),
        ),
        _ => return None,
    };
    Some(Card {
        id: id.to_owned(),
        brand,
        last4,
        decline,
        limit: None,
        used: 0,
    })
}

/// The `metadata[k]=v` parameters, as `k → v`.
fn metadata(params: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    params
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix("metadata[")
                .and_then(|r| r.strip_suffix(']'))
                .map(|k| (k.to_owned(), v.clone()))
        })
        .collect()
}

/// The integer parameter `name`, if given.
pub(super) fn amount_param(
    params: &BTreeMap<String, String>,
    name: &str,
) -> Result<Option<u64>, ApiError> {
    match params.get(name) {
        None => Ok(None),
        Some(v) => v.parse::<u64>().map(Some).map_err(|_| {
            invalid(
                Some("parameter_invalid_integer"),
                Some(name),
                &format!("Invalid integer: {v}"),
            )
        }),
    }
}

/// What makes a request the same request for its idempotency key: method, path, parameters.
pub(super) fn fingerprint(method: &str, path: &str, params: &BTreeMap<String, String>) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(method);
    h.update(path);
    for (k, v) in params {
        h.update(k.len().to_be_bytes());
        h.update(k);
        h.update(v.len().to_be_bytes());
        h.update(v);
    }
    h.finalize().into()
}

impl Emulator {
    /// A test card with a credit limit (minor units): charges beyond it decline with
    /// `insufficient_funds`. Returns its PaymentMethod id.
    pub fn create_card(&self, limit: u64) -> String {
        self.lock().add_card(limit)
    }

    /// What a card can still be charged (its limit minus what is held or captured and not
    /// refunded).
    #[must_use]
    pub fn card_available(&self, pm: &str) -> Option<u64> {
        let mut s = self.lock();
        self.expire(&mut s);
        s.card_available(pm)
    }

    /// The merchant's balance in `currency` (captured minus refunded), minor units.
    #[must_use]
    pub fn balance(&self, currency: &str) -> i128 {
        let mut s = self.lock();
        self.expire(&mut s);
        s.balance.get(currency).copied().unwrap_or(0)
    }

    /// Every event emitted so far.
    #[must_use]
    pub fn events(&self) -> Vec<Json> {
        self.lock().events.clone()
    }

    /// Lapses authorisations whose time is up (Stripe cancels them, reason `automatic`).
    fn expire(&self, s: &mut StateInner) {
        let now = self.now();
        let due: Vec<String> = s
            .intents
            .values()
            .filter(|i| {
                i.status == "requires_capture" && i.capture_before.is_some_and(|t| now >= t)
            })
            .map(|i| i.id.clone())
            .collect();
        for id in due {
            if let Some(i) = s.intents.get(&id).cloned() {
                release(s, &i, i.amount_capturable);
                if let Some(i) = s.intents.get_mut(&id) {
                    i.status = "canceled".into();
                    i.cancellation_reason = Some("automatic".into());
                    i.canceled_at = Some(now);
                    i.amount_capturable = 0;
                }
                if let Some(ch) = i.latest_charge.as_ref().and_then(|c| s.charges.get_mut(c)) {
                    ch.amount_refunded = ch.amount;
                }
                self.event(s, "payment_intent.canceled", &id);
            }
        }
    }

    fn event(&self, s: &mut StateInner, kind: &str, object_id: &str) {
        let object = if kind.starts_with("charge.") {
            s.charges
                .get(object_id)
                .map(|c| self.charge_json(s, c))
                .unwrap_or(Json::Null)
        } else {
            s.intents
                .get(object_id)
                .map(|i| self.intent_json(s, i))
                .unwrap_or(Json::Null)
        };
        let ev = json!({
            "id": random_id("evt"),
            "object": "event",
            "api_version": "2025-09-30.clover",
            "created": self.now(),
            "data": {"object": object},
            "livemode": false,
            "pending_webhooks": i32::from(self.cfg.webhook.is_some()),
            "request": {"id": null, "idempotency_key": null},
            "type": kind,
        });
        s.events.push(ev.clone());
        if self.cfg.webhook.is_some() {
            s.outbox.push(ev);
        }
    }

    fn intent_json(&self, s: &StateInner, i: &Intent) -> Json {
        let charge = i.latest_charge.clone();
        let _ = s;
        json!({
            "id": i.id,
            "object": "payment_intent",
            "amount": i.amount,
            "amount_capturable": i.amount_capturable,
            "amount_details": {"tip": {}},
            "amount_received": i.amount_received,
            "application": null,
            "application_fee_amount": null,
            "automatic_payment_methods": null,
            "canceled_at": i.canceled_at,
            "cancellation_reason": i.cancellation_reason,
            "capture_method": i.capture_method,
            "client_secret": i.client_secret,
            "confirmation_method": "automatic",
            "created": i.created,
            "currency": i.currency,
            "customer": null,
            "description": i.description,
            "excluded_payment_method_types": null,
            "invoice": null,
            "last_payment_error": i.last_payment_error,
            "latest_charge": charge,
            "livemode": false,
            "metadata": i.metadata,
            "next_action": null,
            "on_behalf_of": null,
            "payment_method": i.payment_method,
            "payment_method_configuration_details": null,
            "payment_method_options": {},
            "payment_method_types": ["card"],
            "processing": null,
            "receipt_email": null,
            "review": null,
            "setup_future_usage": null,
            "shipping": null,
            "source": null,
            "statement_descriptor": null,
            "statement_descriptor_suffix": null,
            "status": i.status,
            "transfer_data": null,
            "transfer_group": null,
        })
    }

    fn charge_json(&self, _s: &StateInner, c: &ChargeRec) -> Json {
        json!({
            "id": c.id,
            "object": "charge",
            "amount": c.amount,
            "amount_captured": c.amount_captured,
            "amount_refunded": c.amount_refunded,
            "application": null,
            "application_fee": null,
            "application_fee_amount": null,
            "balance_transaction": null,
            "billing_details": {"address": {"city": null, "country": null, "line1": null, "line2": null, "postal_code": null, "state": null}, "email": null, "name": null, "phone": null, "tax_id": null},
            "calculated_statement_descriptor": "STIPENDEX",
            "captured": c.captured,
            "created": c.created,
            "currency": c.currency,
            "customer": null,
            "description": null,
            "disputed": false,
            "failure_balance_transaction": null,
            "failure_code": null,
            "failure_message": null,
            "fraud_details": {},
            "livemode": false,
            "metadata": {},
            "on_behalf_of": null,
            "outcome": {"network_status": "approved_by_network", "reason": null, "risk_level": "normal", "seller_message": "Payment complete.", "type": "authorized"},
            "paid": true,
            "payment_intent": c.payment_intent,
            "payment_method": c.payment_method,
            "payment_method_details": null,
            "receipt_email": null,
            "receipt_number": null,
            "receipt_url": null,
            "refunded": c.amount_refunded > 0 && c.amount_refunded == c.amount_captured && c.captured,
            "review": null,
            "shipping": null,
            "source_transfer": null,
            "statement_descriptor": null,
            "statement_descriptor_suffix": null,
            "status": c.status,
            "transfer_data": null,
            "transfer_group": null,
        })
    }

    fn refund_json(r: &RefundRec) -> Json {
        json!({
            "id": r.id,
            "object": "refund",
            "amount": r.amount,
            "balance_transaction": null,
            "charge": r.charge,
            "created": r.created,
            "currency": r.currency,
            "destination_details": null,
            "metadata": r.metadata,
            "payment_intent": r.payment_intent,
            "reason": null,
            "receipt_number": null,
            "source_transfer_reversal": null,
            "status": "succeeded",
            "transfer_reversal": null,
        })
    }

    fn card_json(c: &Card, now: i64) -> Json {
        json!({
            "id": c.id,
            "object": "payment_method",
            "allow_redisplay": "unspecified",
            "billing_details": {"address": {"city": null, "country": null, "line1": null, "line2": null, "postal_code": null, "state": null}, "email": null, "name": null, "phone": null, "tax_id": null},
            "card": {
                "brand": c.brand,
                "checks": {"address_line1_check": null, "address_postal_code_check": null, "cvc_check": "pass"},
                "country": "US",
                "display_brand": c.brand,
                "exp_month": 12,
                "exp_year": 2034,
                "fingerprint": "StipendexEmu0001",
                "funding": "credit",
                "generated_from": null,
                "last4": c.last4,
                "networks": {"available": [c.brand], "preferred": null},
                "regulated_status": "unregulated",
                "three_d_secure_usage": {"supported": true},
                "wallet": null,
            },
            "created": now,
            "customer": null,
            "livemode": false,
            "metadata": {},
            "type": "card",
        })
    }

    fn card(&self, s: &mut StateInner, id: &str) -> Option<Card> {
        if let Some(c) = s.cards.get(id) {
            return Some(c.clone());
        }
        let c = test_card(id)?;
        s.cards.insert(id.to_owned(), c.clone());
        Some(c)
    }

    // --- reads ---------------------------------------------------------------------------

    /// The intent `id`, its latest charge expanded when `expand_charge`
    /// (`expand[]=latest_charge`).
    pub(super) fn retrieve_intent(
        &self,
        s: &StateInner,
        id: &str,
        expand_charge: bool,
    ) -> Result<Json, ApiError> {
        let i = s
            .intents
            .get(id)
            .ok_or_else(|| no_such("payment_intent", id))?;
        let mut j = self.intent_json(s, i);
        if expand_charge
            && let Some(c) = i.latest_charge.as_ref().and_then(|c| s.charges.get(c))
            && let Some(o) = j.as_object_mut()
        {
            o.insert("latest_charge".into(), self.charge_json(s, c));
        }
        Ok(j)
    }

    /// The refund `id`.
    pub(super) fn retrieve_refund(s: &StateInner, id: &str) -> Result<Json, ApiError> {
        s.refunds
            .get(id)
            .map(Emulator::refund_json)
            .ok_or_else(|| no_such("refund", id))
    }

    /// The charge `id`.
    pub(super) fn retrieve_charge(&self, s: &StateInner, id: &str) -> Result<Json, ApiError> {
        s.charges
            .get(id)
            .map(|c| self.charge_json(s, c))
            .ok_or_else(|| no_such("charge", id))
    }

    /// The PaymentMethod `id`: a card created with a limit, or a test card.
    pub(super) fn retrieve_payment_method(
        &self,
        s: &mut StateInner,
        id: &str,
    ) -> Result<Json, ApiError> {
        let now = self.now();
        self.card(s, id)
            .map(|c| Emulator::card_json(&c, now))
            .ok_or_else(|| no_such("PaymentMethod", id))
    }

    // --- idempotency ---------------------------------------------------------------------

    /// Runs `op` under Stripe's idempotency rules, once lapsed authorisations are cancelled.
    /// An `idempotency_key` already used in `scope` (the authenticating key) with the same
    /// `fingerprint` replays the stored answer; with another fingerprint it is an
    /// `idempotency_error`. A new key stores the answer for [`IDEMPOTENCY_TTL`], unless it
    /// was a 401 or a server error. Answers the status, the body and whether it was replayed.
    pub(super) fn idempotent(
        &self,
        scope: String,
        idempotency_key: Option<&str>,
        fingerprint: [u8; 32],
        op: impl FnOnce(&Self, &mut StateInner) -> Result<Json, ApiError>,
    ) -> (StatusCode, Json, bool) {
        let idem = idempotency_key;
        let mut s = self.lock();
        self.expire(&mut s);
        let now = self.now();
        s.idempotency.retain(|_, v| v.expires > now);
        match idem.and_then(|k| s.idempotency.get(&(scope.clone(), k.to_owned())).cloned()) {
            Some(stored) if stored.fingerprint == fingerprint => (
                StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK),
                stored.body,
                true,
            ),
            Some(_) => {
                let k = idem.unwrap_or_default();
                let e = api_error(
                    StatusCode::BAD_REQUEST,
                    "idempotency_error",
                    None,
                    &format!(
                        "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{k}' if you meant to execute a different request."
                    ),
                );
                (e.status, e.body, false)
            }
            None => {
                let (status, body) = match op(self, &mut s) {
                    Ok(b) => (StatusCode::OK, b),
                    Err(e) => (e.status, e.body),
                };
                if let Some(k) = idem
                    && status != StatusCode::UNAUTHORIZED
                    && !status.is_server_error()
                {
                    s.idempotency.insert(
                        (scope, k.to_owned()),
                        Stored {
                            fingerprint,
                            status: status.as_u16(),
                            body: body.clone(),
                            expires: now
                                + i64::try_from(IDEMPOTENCY_TTL.as_secs()).unwrap_or(i64::MAX),
                        },
                    );
                }
                (status, body, false)
            }
        }
    }

    // --- operations --------------------------------------------------------------------
    // Each takes the request's parameters and answers the object or Stripe's error.

    /// `POST /v1/payment_intents` (with `confirm=true`, confirmed at once).
    pub(super) fn create_intent(
        &self,
        s: &mut StateInner,
        p: &BTreeMap<String, String>,
    ) -> Result<Json, ApiError> {
        let amount = amount_param(p, "amount")?.ok_or_else(|| {
            invalid(
                Some("parameter_missing"),
                Some("amount"),
                "Missing required param: amount.",
            )
        })?;
        let currency = p
            .get("currency")
            .map(|c| c.to_ascii_lowercase())
            .ok_or_else(|| {
                invalid(
                    Some("parameter_missing"),
                    Some("currency"),
                    "Missing required param: currency.",
                )
            })?;
        if currency == "usd" && amount < MIN_CHARGE_USD {
            return Err(invalid(
                Some("amount_too_small"),
                Some("amount"),
                "Amount must be at least $0.50 usd",
            ));
        }
        if amount > 99_999_999 {
            return Err(invalid(
                Some("amount_too_large"),
                Some("amount"),
                "Amount must be no more than $999,999.99",
            ));
        }
        let capture_method = p
            .get("capture_method")
            .cloned()
            .unwrap_or_else(|| "automatic".into());
        if !["automatic", "automatic_async", "manual"].contains(&capture_method.as_str()) {
            return Err(invalid(
                Some("parameter_invalid_string"),
                Some("capture_method"),
                "Invalid capture_method: must be one of automatic, automatic_async, or manual",
            ));
        }
        let id = random_id("pi");
        let mut i = Intent {
            client_secret: format!("{id}_secret_{}", random_id("s").trim_start_matches("s_")),
            id: id.clone(),
            amount,
            currency,
            capture_method,
            status: "requires_payment_method".into(),
            metadata: metadata(p),
            description: p.get("description").cloned(),
            payment_method: None,
            latest_charge: None,
            amount_capturable: 0,
            amount_received: 0,
            created: self.now(),
            canceled_at: None,
            cancellation_reason: None,
            last_payment_error: None,
            capture_before: None,
        };
        if let Some(pm) = p.get("payment_method") {
            if self.card(s, pm).is_none() {
                return Err(no_such("PaymentMethod", pm));
            }
            i.payment_method = Some(pm.clone());
            i.status = "requires_confirmation".into();
        }
        s.intents.insert(id.clone(), i);
        self.event(s, "payment_intent.created", &id);
        if p.get("confirm").map(String::as_str) == Some("true") {
            return self.confirm(s, &id, p);
        }
        s.intents
            .get(&id)
            .map(|i| self.intent_json(s, i))
            .ok_or_else(|| no_such("payment_intent", &id))
    }

    /// `POST /v1/payment_intents/{id}/confirm`: authorises (manual capture) or charges the card,
    /// or records the decline.
    pub(super) fn confirm(
        &self,
        s: &mut StateInner,
        id: &str,
        p: &BTreeMap<String, String>,
    ) -> Result<Json, ApiError> {
        let mut i = intent(s, id)?;
        if !["requires_payment_method", "requires_confirmation"].contains(&i.status.as_str()) {
            return Err(unexpected_state(
                "PaymentIntent",
                &i.status,
                "requires_payment_method, requires_confirmation, requires_action",
                "confirmed",
            ));
        }
        if let Some(pm) = p.get("payment_method") {
            i.payment_method = Some(pm.clone());
        }
        let Some(pm) = i.payment_method.clone() else {
            return Err(invalid(
                Some("payment_intent_unexpected_state"),
                Some("payment_method"),
                "You cannot confirm this PaymentIntent because it's missing a payment method. To confirm the PaymentIntent with cus_… , specify a payment method attached to this customer along with the customer ID.",
            ));
        };
        let card = self
            .card(s, &pm)
            .ok_or_else(|| no_such("PaymentMethod", &pm))?;
        let decline = card.decline.or_else(|| {
            card.limit
                .filter(|l| card.used.saturating_add(i.amount) > *l)
                .map(|_| {
                    (
                        "card_declined",
                        "insufficient_funds",
                        "Your card has insufficient funds.",
                    )
                })
        });
        let now = self.now();
        let charge_id = random_id("ch");
        if let Some((code, decline_code, message)) = decline {
            let err = json!({
                "type": "card_error",
                "code": code,
                "decline_code": decline_code,
                "message": message,
                "charge": charge_id,
                "doc_url": format!("https://stripe.com/docs/error-codes/{}", code.replace('_', "-")),
                "payment_method": Self::card_json(&card, now),
            });
            i.status = "requires_payment_method".into();
            i.last_payment_error = Some(err.clone());
            i.payment_method = None;
            s.charges.insert(
                charge_id.clone(),
                ChargeRec {
                    id: charge_id.clone(),
                    payment_intent: id.to_owned(),
                    amount: i.amount,
                    amount_captured: 0,
                    amount_refunded: 0,
                    captured: false,
                    currency: i.currency.clone(),
                    payment_method: pm.clone(),
                    created: now,
                    status: "failed".into(),
                },
            );
            i.latest_charge = Some(charge_id);
            s.intents.insert(id.to_owned(), i.clone());
            self.event(s, "payment_intent.payment_failed", id);
            let mut body = json!({ "error": err });
            if let Some(o) = body.get_mut("error").and_then(Json::as_object_mut) {
                o.insert("payment_intent".into(), self.intent_json(s, &i));
            }
            return Err(ApiError {
                status: StatusCode::PAYMENT_REQUIRED,
                body,
            });
        }
        // Authorise: the amount is held on the card.
        if let Some(c) = s.cards.get_mut(&pm) {
            c.used = c.used.saturating_add(i.amount);
        }
        let manual = i.capture_method == "manual";
        s.charges.insert(
            charge_id.clone(),
            ChargeRec {
                id: charge_id.clone(),
                payment_intent: id.to_owned(),
                amount: i.amount,
                amount_captured: if manual { 0 } else { i.amount },
                amount_refunded: 0,
                captured: !manual,
                currency: i.currency.clone(),
                payment_method: pm,
                created: now,
                status: "succeeded".into(),
            },
        );
        i.latest_charge = Some(charge_id.clone());
        i.last_payment_error = None;
        if manual {
            i.status = "requires_capture".into();
            i.amount_capturable = i.amount;
            i.capture_before =
                Some(now + i64::try_from(AUTHORIZATION_LIFETIME.as_secs()).unwrap_or(i64::MAX));
        } else {
            i.status = "succeeded".into();
            i.amount_received = i.amount;
            *s.balance.entry(i.currency.clone()).or_default() += i128::from(i.amount);
        }
        s.intents.insert(id.to_owned(), i.clone());
        if manual {
            self.event(s, "payment_intent.amount_capturable_updated", id);
        } else {
            self.event(s, "charge.succeeded", &charge_id);
            self.event(s, "payment_intent.succeeded", id);
        }
        Ok(self.intent_json(s, &i))
    }

    /// `POST /v1/payment_intents/{id}/capture`: all or part of the authorisation, once.
    pub(super) fn capture(
        &self,
        s: &mut StateInner,
        id: &str,
        p: &BTreeMap<String, String>,
    ) -> Result<Json, ApiError> {
        let mut i = intent(s, id)?;
        if i.status != "requires_capture" {
            return Err(unexpected_state(
                "PaymentIntent",
                &i.status,
                "requires_capture",
                "captured",
            ));
        }
        let take = amount_param(p, "amount_to_capture")?.unwrap_or(i.amount_capturable);
        if take > i.amount_capturable {
            return Err(invalid(
                Some("amount_too_large"),
                Some("amount_to_capture"),
                &format!(
                    "The amount to capture ({take}) cannot be greater than the amount capturable ({}).",
                    i.amount_capturable
                ),
            ));
        }
        if take == 0 {
            return Err(invalid(
                Some("amount_too_small"),
                Some("amount_to_capture"),
                "The amount to capture must be greater than zero.",
            ));
        }
        let released = i.amount_capturable - take;
        release(s, &i, released);
        if let Some(ch) = i.latest_charge.as_ref().and_then(|c| s.charges.get_mut(c)) {
            ch.amount_captured = take;
            ch.captured = true;
            // A partial capture refunds the uncaptured rest on the charge.
            ch.amount_refunded = released;
        }
        i.status = "succeeded".into();
        i.amount_received = take;
        i.amount_capturable = 0;
        *s.balance.entry(i.currency.clone()).or_default() += i128::from(take);
        s.intents.insert(id.to_owned(), i.clone());
        if let Some(c) = i.latest_charge.clone() {
            self.event(s, "charge.captured", &c);
        }
        self.event(s, "payment_intent.succeeded", id);
        Ok(self.intent_json(s, &i))
    }

    /// `POST /v1/payment_intents/{id}/cancel`: releases what is held.
    pub(super) fn cancel(
        &self,
        s: &mut StateInner,
        id: &str,
        p: &BTreeMap<String, String>,
    ) -> Result<Json, ApiError> {
        let mut i = intent(s, id)?;
        let cancelable = [
            "requires_payment_method",
            "requires_capture",
            "requires_confirmation",
            "requires_action",
            "processing",
        ];
        if !cancelable.contains(&i.status.as_str()) {
            return Err(invalid(
                Some("payment_intent_unexpected_state"),
                None,
                &format!(
                    "You cannot cancel this PaymentIntent because it has a status of {}. Only a PaymentIntent with one of the following statuses may be canceled: {}.",
                    i.status,
                    cancelable.join(", ")
                ),
            ));
        }
        release(s, &i, i.amount_capturable);
        if let Some(ch) = i.latest_charge.as_ref().and_then(|c| s.charges.get_mut(c))
            && !ch.captured
            && ch.status == "succeeded"
        {
            ch.amount_refunded = ch.amount;
        }
        i.status = "canceled".into();
        i.canceled_at = Some(self.now());
        i.cancellation_reason = Some(
            p.get("cancellation_reason")
                .cloned()
                .unwrap_or_else(|| "requested_by_customer".into()),
        );
        i.amount_capturable = 0;
        s.intents.insert(id.to_owned(), i.clone());
        self.event(s, "payment_intent.canceled", id);
        Ok(self.intent_json(s, &i))
    }

    /// `POST /v1/refunds`: at most what was captured and not yet refunded.
    pub(super) fn refund(
        &self,
        s: &mut StateInner,
        p: &BTreeMap<String, String>,
    ) -> Result<Json, ApiError> {
        let (pi_id, charge_id) = match (p.get("payment_intent"), p.get("charge")) {
            (Some(pi), _) => {
                let i = s
                    .intents
                    .get(pi)
                    .ok_or_else(|| no_such("payment_intent", pi))?;
                let ch = i.latest_charge.clone().ok_or_else(|| {
                    invalid(
                        Some("charge_not_refundable"),
                        Some("payment_intent"),
                        &format!(
                            "This PaymentIntent ({pi}) does not have a successful charge to refund."
                        ),
                    )
                })?;
                (pi.clone(), ch)
            }
            (None, Some(ch)) => {
                let c = s.charges.get(ch).ok_or_else(|| no_such("charge", ch))?;
                (c.payment_intent.clone(), ch.clone())
            }
            (None, None) => {
                return Err(invalid(
                    Some("parameter_missing"),
                    None,
                    "One of the following params should be provided for this request: payment_intent or charge.",
                ));
            }
        };
        let c = s
            .charges
            .get(&charge_id)
            .cloned()
            .ok_or_else(|| no_such("charge", &charge_id))?;
        if !c.captured || c.status != "succeeded" {
            return Err(invalid(
                Some("charge_not_refundable"),
                None,
                &format!(
                    "Charge {charge_id} has not been captured and cannot be refunded. Cancel the PaymentIntent instead."
                ),
            ));
        }
        // What may still be refunded: captured minus refunded (a partial capture's released
        // rest is counted in amount_refunded but was never captured).
        let uncaptured = c.amount - c.amount_captured;
        let refunded = c.amount_refunded.saturating_sub(uncaptured);
        let left = c.amount_captured.saturating_sub(refunded);
        let amount = amount_param(p, "amount")?.unwrap_or(left);
        if left == 0 {
            return Err(invalid(
                Some("charge_already_refunded"),
                None,
                &format!("Charge {charge_id} has already been refunded."),
            ));
        }
        if amount > left {
            return Err(invalid(
                Some("amount_too_large"),
                Some("amount"),
                &format!(
                    "Refund amount ({amount}) is greater than unrefunded amount on charge ({left})"
                ),
            ));
        }
        if amount == 0 {
            return Err(invalid(
                Some("amount_too_small"),
                Some("amount"),
                "Refund amount must be greater than zero.",
            ));
        }
        if let Some(ch) = s.charges.get_mut(&charge_id) {
            ch.amount_refunded += amount;
        }
        if let Some(card) = s.cards.get_mut(&c.payment_method) {
            card.used = card.used.saturating_sub(amount);
        }
        *s.balance.entry(c.currency.clone()).or_default() -= i128::from(amount);
        let r = RefundRec {
            id: random_id("re"),
            amount,
            charge: charge_id.clone(),
            payment_intent: pi_id,
            currency: c.currency,
            created: self.now(),
            metadata: metadata(p),
        };
        s.refunds.insert(r.id.clone(), r.clone());
        self.event(s, "charge.refunded", &charge_id);
        Ok(Self::refund_json(&r))
    }
}

/// The intent `id`, or Stripe's `resource_missing`.
fn intent(s: &StateInner, id: &str) -> Result<Intent, ApiError> {
    s.intents
        .get(id)
        .cloned()
        .ok_or_else(|| no_such("payment_intent", id))
}

/// Releases `amount` of an authorisation back to its card.
fn release(s: &mut StateInner, i: &Intent, amount: u64) {
    if let Some(pm) = &i.payment_method
        && let Some(c) = s.cards.get_mut(pm)
    {
        c.used = c.used.saturating_sub(amount);
    }
}

impl StateInner {
    /// Adds a card with a credit limit (minor units); returns its PaymentMethod id.
    pub(super) fn add_card(&mut self, limit: u64) -> String {
        let id = random_id("pm");
        let card = Card {
            id: id.clone(),
            brand: "visa",
            last4: "4242",
            decline: None,
            limit: Some(limit),
            used: 0,
        };
        self.cards.insert(id.clone(), card);
        id
    }

    /// What the card `pm` can still be charged, if it has a limit.
    pub(super) fn card_available(&self, pm: &str) -> Option<u64> {
        self.cards
            .get(pm)
            .and_then(|c| c.limit.map(|l| l.saturating_sub(c.used)))
    }

    /// The merchant's balances, and what `card` can still be charged.
    pub(super) fn balances_json(&self, card: Option<&str>) -> Json {
        let card = card.and_then(|pm| self.card_available(pm));
        json!({"merchant": self.balance, "card_available": card})
    }

    /// The client secret of the intent `id`.
    pub(super) fn client_secret(&self, id: &str) -> Result<&str, ApiError> {
        self.intents
            .get(id)
            .map(|i| i.client_secret.as_str())
            .ok_or_else(|| no_such("payment_intent", id))
    }

    /// The events not yet delivered, in order; the outbox is left empty.
    pub(super) fn take_outbox(&mut self) -> Vec<Json> {
        std::mem::take(&mut self.outbox)
    }
}
