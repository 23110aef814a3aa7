#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! Webhooks end to end: the emulator POSTs signed events to an axum endpoint in this process,
//! which feeds each delivery to `StripeReceiver::on_webhook`, while a real flow (hold → partial
//! capture → refund, or a hold left to lapse) runs through the rail against the emulator.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use rail_core::payer::Idempotent;
use rail_core::{
    Asset, Charge, Clock, HoldPayer, HoldReceiver, KeyStore, ManualClock, MemoryKeyStore, Money,
    OpId, Payer, PaymentState, RailError, RailReceiver, RefundReceiver, SharedClock,
};
use rail_stripe::rail::GIVE_BACK_WINDOW;
use rail_stripe::webhook::{self, Event, EventKind};
use rail_stripe::{StripeHttp, StripePayer, StripeReceiver};
use serde_json::{Value, json};
use stripe_core::PaymentIntentStatus;
use stripe_core::payment_intent::RetrievePaymentIntent;
use stripe_emulator::{AUTHORIZATION_LIFETIME, Emulator, EmulatorConfig, RunningEmulator};

const SECRET_KEY: &str = "sk_test_emulator";
const PUBLISHABLE_KEY: &str = "pk_test_emulator";
const WHSEC: &str = "whsec_webhooks_test";

/// One delivery as the endpoint saw it.
#[derive(Debug)]
struct Delivery {
    payload: String,
    signature: String,
    outcome: Result<Event, RailError>,
}

struct Endpoint {
    receiver: Arc<StripeReceiver>,
    secret: String,
    deliveries: Mutex<Vec<Delivery>>,
}

async fn deliver(State(ep): State<Arc<Endpoint>>, headers: HeaderMap, body: String) -> StatusCode {
    let signature = headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let outcome = ep.receiver.on_webhook(&body, &signature, &ep.secret).await;
    let status = if outcome.is_ok() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    };
    ep.deliveries.lock().unwrap().push(Delivery {
        payload: body,
        signature,
        outcome,
    });
    status
}

struct World {
    running: RunningEmulator,
    clock: ManualClock,
    api: StripeHttp,
    receiver: Arc<StripeReceiver>,
    payer: Idempotent<StripePayer>,
    store: Arc<dyn KeyStore>,
    endpoint: Arc<Endpoint>,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn usd(cents: u128) -> Money {
    Money::from_minor(Asset::usd(), cents).unwrap()
}

impl World {
    /// An emulator delivering to an endpoint in this process, and a receiver and payer wired
    /// as the conformance harness wires them.
    async fn new() -> World {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let hook_url = format!("http://{}/webhook", listener.local_addr().unwrap());
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let running = Emulator::spawn(
            EmulatorConfig {
                webhook: Some((hook_url, WHSEC.to_owned())),
                clock: shared.clone(),
                ..EmulatorConfig::default()
            },
            SocketAddr::from(([127, 0, 0, 1], 0)),
        )
        .await
        .unwrap();
        let api = StripeHttp::new(&running.url, SECRET_KEY).unwrap();
        let card: Value = reqwest::Client::new()
            .post(format!("{}/_emulator/cards", running.url))
            .bearer_auth(SECRET_KEY)
            .form(&[("limit", "1000000")])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let card = card["id"].as_str().unwrap().to_owned();
        let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(shared.clone()));
        let receiver = Arc::new(StripeReceiver::new(
            api.clone(),
            PUBLISHABLE_KEY,
            "shop-webhooks",
            Asset::usd(),
            store.clone(),
            shared.clone(),
        ));
        let payer = Idempotent::new(
            StripePayer::new(&running.url, card, usd(1_000_000), shared).unwrap(),
            store.clone(),
        );
        let endpoint = Arc::new(Endpoint {
            receiver: receiver.clone(),
            secret: WHSEC.to_owned(),
            deliveries: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/webhook", post(deliver))
            .with_state(endpoint.clone());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        World {
            running,
            clock,
            api,
            receiver,
            payer,
            store,
            endpoint,
            server,
        }
    }

    fn now(&self) -> i64 {
        self.clock.now().unix_seconds()
    }

    /// Kinds of the deliveries so far, each of which must have been accepted.
    fn accepted(&self) -> Vec<(String, Event)> {
        self.endpoint
            .deliveries
            .lock()
            .unwrap()
            .iter()
            .map(|d| match &d.outcome {
                Ok(e) => (d.payload.clone(), e.clone()),
                Err(err) => panic!("a genuine delivery was refused: {err} ({})", d.payload),
            })
            .collect()
    }

    fn delivery_of(&self, kind: &str) -> (String, String) {
        let ds = self.endpoint.deliveries.lock().unwrap();
        let d = ds
            .iter()
            .find(|d| matches!(&d.outcome, Ok(e) if e.kind == kind))
            .unwrap_or_else(|| panic!("no {kind} delivery"));
        (d.payload.clone(), d.signature.clone())
    }

    /// A hold of `cents`, verified by the receiver.
    async fn hold(&self, cents: u128) -> rail_core::Verified {
        let offer = self
            .receiver
            .offer(&Charge::hold(usd(cents), Duration::from_secs(600)))
            .await
            .unwrap();
        let payment = self.payer.hold(&OpId::random(), &offer).await.unwrap();
        let verified = self.receiver.verify(&offer, &payment).await.unwrap();
        assert!(
            matches!(verified.state, PaymentState::Held { .. }),
            "{verified:?}"
        );
        verified
    }
}

fn pi_event(e: &Event) -> (&str, &str, u64, u64, Option<&str>) {
    match &e.what {
        EventKind::PaymentIntent {
            id,
            status,
            amount_capturable,
            amount_received,
            cancellation_reason,
        } => (
            id,
            status,
            *amount_capturable,
            *amount_received,
            cancellation_reason.as_deref(),
        ),
        other => panic!("{}: not a payment intent event: {other:?}", e.kind),
    }
}

#[tokio::test]
async fn hold_partial_capture_and_refund_are_seen_in_order_and_verified() {
    let w = World::new().await;
    let held = w.hold(1000).await;
    let pi = held.payment_ref.clone();
    let captured = w
        .receiver
        .capture(&OpId::random(), &held, &usd(600))
        .await
        .unwrap();
    assert_eq!(captured.captured, usd(600));
    assert_eq!(captured.released, usd(400));
    let refunded = w
        .receiver
        .refund(&OpId::random(), &pi, &usd(200))
        .await
        .unwrap();
    assert_eq!(refunded.amount, usd(200));

    // The emulator delivers before it answers; every event it emitted arrived, in order,
    // and was accepted (signature verified, never seen before).
    let accepted = w.accepted();
    let kinds: Vec<&str> = accepted.iter().map(|(_, e)| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "payment_intent.created",
            "payment_intent.amount_capturable_updated",
            "charge.captured",
            "payment_intent.succeeded",
            "charge.refunded",
        ]
    );
    let emitted: Vec<String> = w
        .running
        .emulator
        .events()
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_owned())
        .collect();
    let delivered: Vec<String> = accepted.iter().map(|(_, e)| e.id.clone()).collect();
    assert_eq!(delivered, emitted);

    let event = |kind: &str| {
        accepted
            .iter()
            .find(|(_, e)| e.kind == kind)
            .map(|(_, e)| e.clone())
            .unwrap()
    };
    assert_eq!(
        pi_event(&event("payment_intent.amount_capturable_updated")),
        (pi.as_str(), "requires_capture", 1000, 0, None)
    );
    assert_eq!(
        pi_event(&event("payment_intent.succeeded")),
        (pi.as_str(), "succeeded", 0, 600, None)
    );
    match event("charge.refunded").what {
        EventKind::ChargeRefunded {
            charge,
            payment_intent,
            amount_refunded,
        } => {
            assert!(charge.starts_with("ch_"), "{charge}");
            assert_eq!(payment_intent.as_deref(), Some(pi.as_str()));
            // Stripe's capture reference: "Any additional amount will be automatically
            // refunded" — the 400 left uncaptured counts as refunded on the charge, plus the
            // 200 refunded since.
            assert_eq!(amount_refunded, 400 + 200);
        }
        other => panic!("charge.refunded: {other:?}"),
    }
}

#[tokio::test]
async fn replayed_tampered_foreign_and_stale_deliveries_are_refused() {
    let w = World::new().await;
    let held = w.hold(1000).await;
    w.receiver
        .capture(&OpId::random(), &held, &usd(1000))
        .await
        .unwrap();
    let (payload, signature) = w.delivery_of("payment_intent.succeeded");

    // The same delivery again (Stripe retries deliveries): refused as a replay.
    let again = w
        .receiver
        .on_webhook(&payload, &signature, WHSEC)
        .await
        .unwrap_err();
    assert_eq!(again.code(), "replayed", "{again:?}");
    assert!(matches!(again, RailError::Replayed { .. }));

    // An event nobody has seen, so that only the signature decides.
    let mut fresh: Value = serde_json::from_str(&payload).unwrap();
    fresh["id"] = json!("evt_fresh_for_this_test_0001");
    let fresh = fresh.to_string();
    let now = w.now();

    // Tampered: the amount changed after signing.
    let genuine = webhook::sign(&fresh, WHSEC, now);
    let tampered = fresh.replace("\"amount_received\":1000", "\"amount_received\":100000");
    assert_ne!(tampered, fresh);
    let e = w
        .receiver
        .on_webhook(&tampered, &genuine, WHSEC)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "bad_signature", "{e:?}");

    // Signed with another endpoint's secret.
    let foreign = webhook::sign(&fresh, "whsec_someone_else", now);
    let e = w
        .receiver
        .on_webhook(&fresh, &foreign, WHSEC)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "bad_signature", "{e:?}");

    // Malformed header.
    let e = w
        .receiver
        .on_webhook(&fresh, "v1=deadbeef", WHSEC)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "bad_signature", "{e:?}");

    // Genuinely signed, but 301 s ago: outside Stripe's 300 s tolerance.
    let stale = webhook::sign(&fresh, WHSEC, now - 301);
    let e = w
        .receiver
        .on_webhook(&fresh, &stale, WHSEC)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "bad_signature", "{e:?}");
    assert!(e.to_string().contains("tolerance"), "{e}");

    // None of the refusals burnt the event id: signed just within the tolerance, it is taken
    // once, and then it is a replay.
    let recent = webhook::sign(&fresh, WHSEC, now - 299);
    let ok = w.receiver.on_webhook(&fresh, &recent, WHSEC).await.unwrap();
    assert_eq!(ok.id, "evt_fresh_for_this_test_0001");
    assert_eq!(ok.kind, "payment_intent.succeeded");
    let e = w
        .receiver
        .on_webhook(&fresh, &recent, WHSEC)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "replayed", "{e:?}");

    // A verified payload that is not an event: malformed, not a signature problem.
    let junk = r#"{"not":"an event"}"#;
    let e = w
        .receiver
        .on_webhook(junk, &webhook::sign(junk, WHSEC, now), WHSEC)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "malformed_payment", "{e:?}");
}

#[tokio::test]
async fn an_uncaptured_authorisation_lapses_after_seven_days() {
    let w = World::new().await;
    let held = w.hold(800).await;
    let pi = held.payment_ref.clone();
    let before = w.accepted().len();

    w.clock
        .advance(AUTHORIZATION_LIFETIME + Duration::from_secs(1));
    // Any API call lets the emulator notice the lapse.
    let now_pi = RetrievePaymentIntent::new(pi.as_str())
        .send(&w.api)
        .await
        .unwrap();
    assert_eq!(now_pi.status, PaymentIntentStatus::Canceled);
    assert!(
        matches!(&now_pi.cancellation_reason, Some(r) if r.as_str() == "automatic"),
        "{:?}",
        now_pi.cancellation_reason
    );
    assert_eq!(now_pi.amount_capturable, 0);

    let accepted = w.accepted();
    let lapsed: Vec<&Event> = accepted.iter().skip(before).map(|(_, e)| e).collect();
    assert_eq!(lapsed.len(), 1, "{lapsed:?}");
    assert_eq!(lapsed[0].kind, "payment_intent.canceled");
    assert_eq!(
        pi_event(lapsed[0]),
        (pi.as_str(), "canceled", 0, 0, Some("automatic"))
    );

    // The hold can no longer be captured.
    let e = w
        .receiver
        .capture(&OpId::random(), &held, &usd(800))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_state", "{e:?}");
}

/// An event whose processing failed is not marked handled: Stripe's next delivery of it is
/// processed; once processed, it is a replay.
#[tokio::test]
async fn a_failed_handler_leaves_the_event_to_stripes_retry() {
    let w = World::new().await;
    let held = w.hold(1000).await;
    w.receiver
        .capture(&OpId::random(), &held, &usd(1000))
        .await
        .unwrap();
    let (payload, _) = w.delivery_of("payment_intent.succeeded");
    let mut fresh: Value = serde_json::from_str(&payload).unwrap();
    fresh["id"] = json!("evt_handler_fails_first_0001");
    let fresh = fresh.to_string();
    let sig = webhook::sign(&fresh, WHSEC, w.now());

    let failed = w
        .receiver
        .handle_webhook(&fresh, &sig, WHSEC, |_| async {
            Err::<(), _>("database down")
        })
        .await
        .unwrap();
    assert_eq!(failed.unwrap_err(), "database down");

    let handled = w
        .receiver
        .handle_webhook(&fresh, &sig, WHSEC, |e| {
            let kind = e.kind.clone();
            async move {
                assert_eq!(kind, "payment_intent.succeeded");
                Ok::<(), &str>(())
            }
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(handled.id, "evt_handler_fails_first_0001");

    let again = w
        .receiver
        .handle_webhook(&fresh, &sig, WHSEC, |_| async { Ok::<(), &str>(()) })
        .await
        .unwrap_err();
    assert_eq!(again.code(), "replayed");
}

/// A proxy to the emulator that forwards every request but answers the first `lose` refund
/// creations with an HTML 502 — the refund is made at Stripe, its answer lost on the way back.
async fn lossy_proxy(upstream: String, lose: usize) -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let lost = Arc::new(AtomicUsize::new(0));
    let http = reqwest::Client::new();
    let app = Router::new().fallback(
        move |method: axum::http::Method,
              uri: axum::http::Uri,
              headers: HeaderMap,
              body: axum::body::Bytes| {
            let (http, upstream, lost) = (http.clone(), upstream.clone(), lost.clone());
            async move {
                let mut req = http.request(method.clone(), format!("{upstream}{uri}"));
                for (k, v) in &headers {
                    if k != "host" && k != "content-length" {
                        req = req.header(k, v);
                    }
                }
                let resp = req.body(body).send().await.unwrap();
                let status = resp.status().as_u16();
                let body = resp.bytes().await.unwrap();
                if method == axum::http::Method::POST
                    && uri.path() == "/v1/refunds"
                    && lost.fetch_add(1, Ordering::SeqCst) < lose
                {
                    return (
                        StatusCode::BAD_GATEWAY,
                        "<html>502 Bad Gateway</html>".to_owned(),
                    );
                }
                (
                    StatusCode::from_u16(status).unwrap(),
                    String::from_utf8_lossy(&body).into_owned(),
                )
            }
        },
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A refund whose answer was lost (after every transport retry) is retried with the same
/// operation id: Stripe replays it under the same idempotency key — one refund, not a refusal
/// ("nothing left to refund") and not a second refund.
#[tokio::test]
async fn a_refund_whose_answer_was_lost_is_retried_into_the_same_refund() {
    let w = World::new().await;
    let held = w.hold(1000).await;
    w.receiver
        .capture(&OpId::random(), &held, &usd(1000))
        .await
        .unwrap();
    let proxy = lossy_proxy(w.running.url.clone(), 4).await;
    let api = StripeHttp::new(&proxy, SECRET_KEY)
        .unwrap()
        .with_retries(3, Duration::from_millis(10));
    let clock: SharedClock = Arc::new(w.clock.clone());
    let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(clock.clone()));
    let receiver = StripeReceiver::new(
        api,
        PUBLISHABLE_KEY,
        "shop-webhooks",
        Asset::usd(),
        store,
        clock,
    );
    let op = OpId::random();
    let lost = receiver
        .refund(&op, &held.payment_ref, &usd(1000))
        .await
        .unwrap_err();
    assert!(lost.is_retryable(), "{lost:?}");
    let done = receiver
        .refund(&op, &held.payment_ref, &usd(1000))
        .await
        .unwrap();
    assert_eq!(done.amount, usd(1000));
    let pi = RetrievePaymentIntent::new(held.payment_ref.as_str())
        .expand(vec!["latest_charge".to_owned()])
        .send(&w.api)
        .await
        .unwrap();
    let charge = match pi.latest_charge.unwrap() {
        stripe_types::Expandable::Object(c) => c,
        stripe_types::Expandable::Id(_) => panic!("charge not expanded"),
    };
    assert_eq!(charge.amount_refunded, 1000, "one refund of 10.00, not two");
    // A new operation asking for more is refused before Stripe is asked.
    let more = receiver
        .refund(&OpId::random(), &held.payment_ref, &usd(1))
        .await
        .unwrap_err();
    assert_eq!(more.code(), "exceeds_available");
}

async fn intent(w: &World, id: &str) -> stripe_core::PaymentIntent {
    RetrievePaymentIntent::new(id)
        .expand(vec!["latest_charge".to_owned()])
        .send(&w.api)
        .await
        .unwrap()
}

fn refunded(pi: &stripe_core::PaymentIntent) -> i64 {
    match pi.latest_charge.as_ref() {
        Some(stripe_types::Expandable::Object(c)) => c.amount_refunded,
        _ => 0,
    }
}

/// An expired offer's payment is refused — and the payer's money is given back: a charge is
/// refunded, a hold canceled. A payment verified in time is not given back by a late replay.
#[tokio::test]
async fn an_expired_offers_payment_is_refused_and_given_back() {
    let w = World::new().await;
    let ttl = Duration::from_secs(60);

    // A charge made in time, presented late.
    let offer = w
        .receiver
        .offer(&Charge::capture(usd(700), ttl))
        .await
        .unwrap();
    let payment = w.payer.pay(&OpId::random(), &offer).await.unwrap();
    w.clock.advance(ttl + Duration::from_secs(1));
    let e = w.receiver.verify(&offer, &payment).await.unwrap_err();
    assert_eq!(e.code(), "offer_expired");
    let pi = intent(&w, payment.proof["payment_intent"].as_str().unwrap()).await;
    assert_eq!(refunded(&pi), 700, "the late charge is refunded in full");
    // Asking again changes nothing more (one refund).
    let _ = w.receiver.verify(&offer, &payment).await.unwrap_err();
    let pi = intent(&w, pi.id.as_str()).await;
    assert_eq!(refunded(&pi), 700);

    // A hold made in time, presented late: released.
    let mut hold = Charge::capture(usd(300), ttl);
    hold.mode = rail_core::PaymentMode::Hold;
    let offer = w.receiver.offer(&hold).await.unwrap();
    let payment = w.payer.hold(&OpId::random(), &offer).await.unwrap();
    w.clock.advance(ttl + Duration::from_secs(1));
    let e = w.receiver.verify(&offer, &payment).await.unwrap_err();
    assert_eq!(e.code(), "offer_expired");
    let pi = intent(&w, payment.proof["payment_intent"].as_str().unwrap()).await;
    assert_eq!(pi.status, PaymentIntentStatus::Canceled);

    // Verified in time, replayed late: refused, and nothing is given back.
    let offer = w
        .receiver
        .offer(&Charge::capture(usd(500), ttl))
        .await
        .unwrap();
    let payment = w.payer.pay(&OpId::random(), &offer).await.unwrap();
    w.receiver.verify(&offer, &payment).await.unwrap();
    w.clock.advance(ttl + Duration::from_secs(1));
    assert!(w.receiver.verify(&offer, &payment).await.is_err());
    let pi = intent(&w, payment.proof["payment_intent"].as_str().unwrap()).await;
    assert_eq!(refunded(&pi), 0, "a payment verified in time stays paid");
}

/// A verified intent's single-use mark lasts its offer's life plus the give-back window, not
/// for ever (before, every verified intent was kept for ever and the store grew without bound);
/// and once it is gone, a late replay is refused without anything being refunded — the
/// give-back stops a day before the mark does.
#[tokio::test]
async fn verified_marks_lapse_after_the_give_back_window_and_nothing_is_refunded_blindly() {
    let w = World::new().await;
    let ttl = Duration::from_secs(60);
    let offer = w
        .receiver
        .offer(&Charge::capture(usd(500), ttl))
        .await
        .unwrap();
    let payment = w.payer.pay(&OpId::random(), &offer).await.unwrap();
    w.receiver.verify(&offer, &payment).await.unwrap();
    let pi_id = payment.proof["payment_intent"].as_str().unwrap().to_owned();
    let mark = w
        .store
        .get("stripe/verified", &pi_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        mark.record.expires_at,
        Some(offer.expires_at.plus(GIVE_BACK_WINDOW)),
        "kept for the offer's life and the give-back window"
    );
    w.clock
        .advance(ttl + GIVE_BACK_WINDOW + Duration::from_secs(1));
    assert!(w.store.purge_expired().await.unwrap() >= 1);
    let e = w.receiver.verify(&offer, &payment).await.unwrap_err();
    assert_eq!(e.code(), "offer_expired");
    let pi = intent(&w, &pi_id).await;
    assert_eq!(
        refunded(&pi),
        0,
        "a mark-less late payment is never refunded blindly"
    );
}
