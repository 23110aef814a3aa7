#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! `StripeHttp` (our transport under async-stripe) against a scripted HTTP server (mockito),
//! with real async-stripe request builders and response bodies shaped like Stripe's.
//!
//! Error bodies follow Stripe's API reference, "Errors" (https://docs.stripe.com/api/errors):
//! `{"error": {"type": "api_error" | "card_error" | "idempotency_error" |
//! "invalid_request_error", "code": …, "decline_code": …, "message": …, "param": …}}`, with the
//! HTTP status summary there (402 for a failed charge, 409 for a conflicting idempotent request,
//! 429 for too many requests, 5xx for Stripe-side errors) and the `Request-Id` header on every
//! answer. `Stripe-Should-Retry` is described in Stripe's "Low-level error handling"
//! (https://docs.stripe.com/error-low-level).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mockito::{Matcher, Server};
use rail_stripe::{StripeFailure, StripeHttp};
use stripe_client_core::{IdempotencyKey, RequestStrategy, StripeRequest};
use stripe_core::PaymentIntentStatus;
use stripe_core::payment_intent::{CapturePaymentIntent, RetrievePaymentIntent};

/// A minimal PaymentIntent as Stripe returns it (captured: 100 of 1000).
const PI: &str = r#"{"id":"pi_1","object":"payment_intent","amount":1000,"amount_capturable":0,"amount_received":100,"capture_method":"manual","confirmation_method":"automatic","created":1700000000,"currency":"usd","livemode":false,"metadata":{},"payment_method_types":["card"],"status":"succeeded"}"#;

const CAPTURE_PATH: &str = "/v1/payment_intents/pi_1/capture";
const RETRIEVE_PATH: &str = "/v1/payment_intents/pi_1";

fn error_body(kind: &str, code: Option<&str>, decline_code: Option<&str>, message: &str) -> String {
    let mut e = serde_json::json!({"type": kind, "message": message});
    if let Some(c) = code {
        e["code"] = c.into();
    }
    if let Some(d) = decline_code {
        e["decline_code"] = d.into();
    }
    serde_json::json!({ "error": e }).to_string()
}

fn client(server: &Server) -> StripeHttp {
    StripeHttp::new(&server.url(), "sk_test_x")
        .unwrap()
        .with_retries(3, Duration::from_millis(5))
}

fn idempotent(key: &str) -> RequestStrategy {
    RequestStrategy::Idempotent(IdempotencyKey::new(key).unwrap())
}

/// Captures 100 of `pi_1` with idempotency key `k1`.
async fn capture_k1(http: &StripeHttp) -> Result<stripe_core::PaymentIntent, StripeFailure> {
    CapturePaymentIntent::new("pi_1")
        .amount_to_capture(100)
        .customize()
        .request_strategy(idempotent("k1"))
        .send(http)
        .await
}

fn api(f: &StripeFailure) -> &rail_stripe::client::ApiError {
    match f {
        StripeFailure::Api(e) => e,
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn a_500_then_200_succeeds_with_the_same_idempotency_key() {
    let mut server = Server::new_async().await;
    let failed = server
        .mock("POST", CAPTURE_PATH)
        .match_header("idempotency-key", "k1")
        .match_header("authorization", "Bearer sk_test_x")
        .match_body(Matcher::UrlEncoded(
            "amount_to_capture".into(),
            "100".into(),
        ))
        .with_status(500)
        .with_header("request-id", "req_500")
        .with_header("content-type", "application/json")
        .with_body(error_body(
            "api_error",
            None,
            None,
            "An unknown error occurred",
        ))
        .expect(1)
        .create_async()
        .await;
    let ok = server
        .mock("POST", CAPTURE_PATH)
        .match_header("idempotency-key", "k1")
        .match_header("authorization", "Bearer sk_test_x")
        .match_body(Matcher::UrlEncoded(
            "amount_to_capture".into(),
            "100".into(),
        ))
        .with_status(200)
        .with_header("request-id", "req_200")
        .with_header("content-type", "application/json")
        .with_body(PI)
        .expect(1)
        .create_async()
        .await;
    let pi = capture_k1(&client(&server)).await.unwrap();
    assert_eq!(pi.id.as_str(), "pi_1");
    assert_eq!(pi.amount_received, 100);
    assert_eq!(pi.status, PaymentIntentStatus::Succeeded);
    // Exactly two requests, both carrying `Idempotency-Key: k1`.
    failed.assert_async().await;
    ok.assert_async().await;
}

#[tokio::test]
async fn a_429_with_should_retry_true_is_retried() {
    let mut server = Server::new_async().await;
    let limited = server
        .mock("POST", CAPTURE_PATH)
        .match_header("idempotency-key", "k1")
        .with_status(429)
        .with_header("stripe-should-retry", "true")
        .with_header("request-id", "req_429")
        .with_body(error_body(
            "invalid_request_error",
            Some("rate_limit"),
            None,
            "Too many requests hit the API too quickly.",
        ))
        .expect(1)
        .create_async()
        .await;
    let ok = server
        .mock("POST", CAPTURE_PATH)
        .match_header("idempotency-key", "k1")
        .with_status(200)
        .with_body(PI)
        .expect(1)
        .create_async()
        .await;
    let pi = capture_k1(&client(&server)).await.unwrap();
    assert_eq!(pi.id.as_str(), "pi_1");
    limited.assert_async().await;
    ok.assert_async().await;
}

#[tokio::test]
async fn should_retry_false_stops_at_once_and_keeps_the_request_id() {
    let mut server = Server::new_async().await;
    let failed = server
        .mock("POST", CAPTURE_PATH)
        .match_header("idempotency-key", "k1")
        .with_status(500)
        .with_header("stripe-should-retry", "false")
        .with_header("request-id", "req_no_retry_123")
        .with_body(error_body(
            "api_error",
            None,
            None,
            "Something went wrong on Stripe's end.",
        ))
        .expect(1)
        .create_async()
        .await;
    let err = capture_k1(&client(&server)).await.unwrap_err();
    failed.assert_async().await;
    let e = api(&err);
    assert_eq!(e.status, 500);
    assert_eq!(e.request_id.as_deref(), Some("req_no_retry_123"));
    assert_eq!(e.kind, "api_error");
    assert_eq!(e.message, "Something went wrong on Stripe's end.");
    // The request id travels into the rail error and its display.
    assert!(err.to_string().contains("req_no_retry_123"), "{err}");
    let rail = err.to_rail_error();
    assert!(rail.to_string().contains("req_no_retry_123"), "{rail}");
}

#[tokio::test]
async fn card_errors_map_to_rail_codes() {
    let cases = [
        (
            "insufficient_funds",
            "Your card has insufficient funds.",
            "insufficient_funds",
        ),
        ("generic_decline", "Your card was declined.", "declined"),
    ];
    for (decline_code, message, want) in cases {
        let mut server = Server::new_async().await;
        let declined = server
            .mock("POST", CAPTURE_PATH)
            .with_status(402)
            .with_header("request-id", "req_card")
            .with_body(error_body(
                "card_error",
                Some("card_declined"),
                Some(decline_code),
                message,
            ))
            // A decline is final: not retried.
            .expect(1)
            .create_async()
            .await;
        let err = capture_k1(&client(&server)).await.unwrap_err();
        declined.assert_async().await;
        let e = api(&err);
        assert_eq!(e.status, 402);
        assert_eq!(e.kind, "card_error");
        assert_eq!(e.code.as_deref(), Some("card_declined"));
        assert_eq!(e.decline_code.as_deref(), Some(decline_code));
        assert_eq!(err.code(), Some("card_declined"));
        let rail = err.to_rail_error();
        assert_eq!(rail.code(), want, "{decline_code}: {rail:?}");
        assert!(!rail.is_retryable(), "{decline_code}: {rail:?}");
    }
}

#[tokio::test]
async fn an_idempotency_error_is_a_conflict() {
    let mut server = Server::new_async().await;
    let conflict = server
        .mock("POST", CAPTURE_PATH)
        .match_header("idempotency-key", "k1")
        .with_status(400)
        .with_header("request-id", "req_idem")
        .with_body(error_body(
            "idempotency_error",
            None,
            None,
            "Keys for idempotent requests can only be used with the same parameters they were first used with.",
        ))
        .expect(1)
        .create_async()
        .await;
    let err = capture_k1(&client(&server)).await.unwrap_err();
    conflict.assert_async().await;
    assert_eq!(api(&err).kind, "idempotency_error");
    let rail = err.to_rail_error();
    assert_eq!(rail.code(), "idempotency_conflict", "{rail:?}");
    assert!(!rail.is_retryable());
}

#[tokio::test]
async fn a_truncated_200_body_is_a_decode_error() {
    let mut server = Server::new_async().await;
    let truncated = PI.get(..PI.len() / 2).unwrap();
    let m = server
        .mock("POST", CAPTURE_PATH)
        .with_status(200)
        .with_header("content-type", "application/json")
        .with_body(truncated)
        .expect(1)
        .create_async()
        .await;
    let err = capture_k1(&client(&server)).await.unwrap_err();
    m.assert_async().await;
    assert!(matches!(err, StripeFailure::Decode(_)), "{err:?}");
    let rail = err.to_rail_error();
    assert_eq!(rail.code(), "rail_error");
    assert!(!rail.is_retryable());
}

#[tokio::test]
async fn an_html_502_repeatedly_gives_up_after_the_retries_as_retryable() {
    let mut server = Server::new_async().await;
    let gateway = server
        .mock("POST", CAPTURE_PATH)
        .match_header("idempotency-key", "k1")
        .with_status(502)
        .with_header("content-type", "text/html")
        .with_body("<html><head><title>502 Bad Gateway</title></head><body><h1>Bad Gateway</h1></body></html>")
        // The first attempt and three retries.
        .expect(4)
        .create_async()
        .await;
    let err = capture_k1(&client(&server)).await.unwrap_err();
    gateway.assert_async().await;
    let e = api(&err);
    assert_eq!(e.status, 502);
    assert!(e.message.contains("502"), "{}", e.message);
    assert!(e.message.contains("Bad Gateway"), "{}", e.message);
    let rail = err.to_rail_error();
    assert_eq!(rail.code(), "unavailable", "{rail:?}");
    assert!(rail.is_retryable());
}

#[tokio::test]
async fn a_post_without_an_idempotency_key_is_not_retried() {
    let mut server = Server::new_async().await;
    let failed = server
        .mock("POST", CAPTURE_PATH)
        .match_header("idempotency-key", Matcher::Missing)
        .with_status(500)
        .with_header("request-id", "req_once")
        .with_body(error_body(
            "api_error",
            None,
            None,
            "An unknown error occurred",
        ))
        .expect(1)
        .create_async()
        .await;
    let err = CapturePaymentIntent::new("pi_1")
        .amount_to_capture(100)
        .send(&client(&server))
        .await
        .unwrap_err();
    failed.assert_async().await;
    let e = api(&err);
    assert_eq!(e.status, 500);
    assert_eq!(e.request_id.as_deref(), Some("req_once"));
    // The caller may retry the operation itself: Stripe said it was a server error.
    assert!(err.to_rail_error().is_retryable());
}

#[tokio::test]
async fn a_get_is_retried_without_a_key() {
    let mut server = Server::new_async().await;
    let unavailable = server
        .mock("GET", RETRIEVE_PATH)
        .match_header("idempotency-key", Matcher::Missing)
        .with_status(503)
        .with_body(error_body("api_error", None, None, "Service unavailable"))
        .expect(2)
        .create_async()
        .await;
    let ok = server
        .mock("GET", RETRIEVE_PATH)
        .match_header("idempotency-key", Matcher::Missing)
        .with_status(200)
        .with_body(PI)
        .expect(1)
        .create_async()
        .await;
    let pi = RetrievePaymentIntent::new("pi_1")
        .send(&client(&server))
        .await
        .unwrap();
    assert_eq!(pi.id.as_str(), "pi_1");
    assert_eq!(pi.amount, 1000);
    unavailable.assert_async().await;
    ok.assert_async().await;
}

#[tokio::test]
async fn a_silent_server_times_out_after_the_retries() {
    // Accepts connections and never answers (holding them open).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(socket);
        }
    });
    let http = StripeHttp::new(&format!("http://{addr}"), "sk_test_x")
        .unwrap()
        .with_retries(3, Duration::from_millis(5))
        .with_timeout(Duration::from_millis(50));
    let started = Instant::now();
    let err = capture_k1(&http).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, StripeFailure::Transport(_)), "{err:?}");
    // Four attempts of 50 ms each, and the backoffs between them.
    assert!(took >= Duration::from_millis(200), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    // A timed-out connection is not reused: one connection per attempt.
    assert_eq!(accepted.load(Ordering::SeqCst), 4);
    let rail = err.to_rail_error();
    assert_eq!(rail.code(), "unavailable");
    assert!(rail.is_retryable());
    silent.abort();
}

#[tokio::test]
async fn an_unreachable_server_is_a_transport_error() {
    // A port nobody listens on (bound, then released).
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let http = StripeHttp::new(&format!("http://{addr}"), "sk_test_x")
        .unwrap()
        .with_retries(2, Duration::from_millis(5));
    let err = capture_k1(&http).await.unwrap_err();
    assert!(matches!(err, StripeFailure::Transport(_)), "{err:?}");
    assert_eq!(err.to_rail_error().code(), "unavailable");
}

#[test]
fn the_secret_key_never_appears_in_debug() {
    for key in ["sk_test_x", "sk_live_51HxYzSuperSecretValue0123456789"] {
        let http = StripeHttp::new("https://api.stripe.com", key).unwrap();
        let shown = format!("{http:?}");
        let pretty = format!("{http:#?}");
        assert!(!shown.contains(key), "{shown}");
        assert!(!pretty.contains(key), "{pretty}");
        // The key's kind is shown, nothing after it.
        let kind = key.split('_').take(2).collect::<Vec<_>>().join("_");
        assert!(shown.contains(&kind), "{shown}");
        let tail = key.split('_').nth(2).unwrap();
        if tail.len() > 3 {
            assert!(!shown.contains(tail), "{shown}");
        }
    }
}
