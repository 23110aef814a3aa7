//! The facilitator protocol written once (`x402_transport::facilitator`): its routes and its
//! client against each other and against raw HTTP — what a hostile or broken peer on either
//! side gets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use x402_transport::facilitator::{
    Facilitator, MAX_BODY, Remote, RemoteError, SettleResponse, Supported, Unavailable,
    VerifyResponse, router,
};

/// A facilitator whose answers the payload picks: `{"do": "refuse" | "unknown" | "hollow"}`,
/// anything else settles as `0xabc`.
struct Scripted<const VERSION_REQUIRED: bool>;

#[async_trait]
impl<const R: bool> Facilitator for Scripted<R> {
    type Payload = Value;
    type Requirements = Value;
    const VERSION_REQUIRED: bool = R;

    async fn verify(&self, p: &Value, _: &Value) -> Result<VerifyResponse, Unavailable> {
        Ok(VerifyResponse {
            is_valid: p["do"] != "refuse",
            invalid_reason: (p["do"] == "refuse").then(|| "insufficient_funds".into()),
            invalid_message: None,
            payer: Some("payer".into()),
        })
    }

    async fn settle(&self, p: &Value, _: &Value) -> Result<SettleResponse, Unavailable> {
        let answer = |success: bool, tx: &str| SettleResponse {
            success,
            error_reason: (!success).then(|| "insufficient_funds".into()),
            error_message: None,
            transaction: tx.into(),
            network: "test:1".into(),
            payer: Some("payer".into()),
        };
        match p["do"].as_str() {
            Some("refuse") => Ok(answer(false, "")),
            Some("unknown") => Err(Unavailable {
                message: "the chain did not answer".into(),
                retry_after: std::time::Duration::from_secs(7),
            }),
            Some("hollow") => Ok(answer(true, "")),
            _ => Ok(answer(true, "0xabc")),
        }
    }

    async fn supported(&self) -> Result<Supported, Unavailable> {
        Ok(Supported::default())
    }
}

async fn serve<F: Facilitator>(f: F) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(Arc::new(f))).await });
    url
}

/// An HTTP client with the workspace's one rustls provider (ring).
fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::new()
}

fn remote(url: &str) -> Remote {
    Remote::new(http(), url)
}

fn body(payload: &Value) -> Value {
    json!({"x402Version": 2, "paymentPayload": payload, "paymentRequirements": {}})
}

#[tokio::test]
async fn an_unknown_outcome_is_a_503_no_client_can_read_as_a_refusal() {
    let url = serve(Scripted::<true>).await;
    let raw = http()
        .post(format!("{url}/settle"))
        .json(&body(&json!({"do": "unknown"})))
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 503);
    assert_eq!(raw.headers()["retry-after"], "7");
    let answer: Value = raw.json().await.unwrap();
    assert_eq!(answer["error"], "facilitator_unavailable");
    assert!(answer.get("success").is_none(), "{answer}");
    assert!(answer.get("isValid").is_none(), "{answer}");
    let e = remote(&url)
        .settle(&json!({"do": "unknown"}), &json!({}), None)
        .await
        .unwrap_err();
    assert!(matches!(e, RemoteError::NotAnAnswer(_)), "{e:?}");
}

#[tokio::test]
async fn a_refusal_is_an_answer_and_a_settlement_is_read() {
    let url = serve(Scripted::<true>).await;
    let r = remote(&url);
    let refused = r
        .settle(&json!({"do": "refuse"}), &json!({}), None)
        .await
        .unwrap();
    assert!(!refused.success);
    assert_eq!(refused.error_reason.as_deref(), Some("insufficient_funds"));
    let settled = r.settle(&json!({}), &json!({}), None).await.unwrap();
    assert_eq!(settled.transaction, "0xabc");
    let invalid = r
        .verify(&json!({"do": "refuse"}), &json!({}), None)
        .await
        .unwrap();
    assert!(!invalid.is_valid);
}

#[tokio::test]
async fn a_success_without_a_transaction_is_not_an_answer() {
    let url = serve(Scripted::<true>).await;
    let e = remote(&url)
        .settle(&json!({"do": "hollow"}), &json!({}), None)
        .await
        .unwrap_err();
    assert!(
        matches!(e, RemoteError::NotAnAnswer(ref m) if m.contains("without a transaction")),
        "{e:?}"
    );
}

#[tokio::test]
async fn unreadable_requests_are_400s_of_the_answers_shape_and_oversized_ones_413s() {
    let url = serve(Scripted::<true>).await;
    let http = http();
    let post = |path: &str, b: Value| http.post(format!("{url}/{path}")).json(&b).send();

    let other = post(
        "verify",
        json!({"x402Version": 3, "paymentPayload": {}, "paymentRequirements": {}}),
    )
    .await
    .unwrap();
    assert_eq!(other.status(), 400);
    let v: Value = other.json().await.unwrap();
    assert_eq!(v["isValid"], false);
    assert_eq!(v["invalidReason"], "invalid_payload");

    let missing = post(
        "settle",
        json!({"paymentPayload": {}, "paymentRequirements": {}}),
    )
    .await
    .unwrap();
    assert_eq!(missing.status(), 400, "x402Version is required here");
    let s: Value = missing.json().await.unwrap();
    assert_eq!(s["success"], false);
    assert_eq!(s["errorReason"], "invalid_payload");

    let big = json!({"x402Version": 2, "paymentPayload": {"pad": "x".repeat(MAX_BODY)}, "paymentRequirements": {}});
    assert_eq!(post("settle", big).await.unwrap().status(), 413);

    // The client reads a 400 of the answer's shape as the answer.
    let r = remote(&url);
    let e = r.supported(None).await.unwrap();
    assert!(e.kinds.is_empty());
}

#[tokio::test]
async fn a_scheme_may_read_a_missing_version_as_2() {
    let url = serve(Scripted::<false>).await;
    let ok = http()
        .post(format!("{url}/settle"))
        .json(&json!({"paymentPayload": {}, "paymentRequirements": {}}))
        .send()
        .await
        .unwrap();
    let status = ok.status();
    let text = ok.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    let s: SettleResponse = serde_json::from_str(&text).unwrap();
    assert!(s.success);
}

#[tokio::test]
async fn the_client_refuses_an_oversized_or_misshapen_answer_and_names_refused_credentials() {
    use axum::routing::{get, post};
    let app = axum::Router::new()
        .route("/settle", post(|| async { "x".repeat(100 * 1024) }))
        .route(
            "/verify",
            post(|| async { (axum::http::StatusCode::OK, "<html>502</html>") }),
        )
        .route(
            "/supported",
            get(|| async { axum::http::StatusCode::UNAUTHORIZED }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let r = remote(&url);
    let big = r.settle(&json!({}), &json!({}), None).await.unwrap_err();
    assert!(
        matches!(big, RemoteError::NotAnAnswer(ref m) if m.contains("longer than")),
        "{big:?}"
    );
    let html = r.verify(&json!({}), &json!({}), None).await.unwrap_err();
    assert!(
        matches!(html, RemoteError::NotAnAnswer(ref m) if m.contains("not understood")),
        "{html:?}"
    );
    let refused = r.supported(None).await.unwrap_err();
    assert!(
        matches!(refused, RemoteError::Refused(s) if s == 401),
        "{refused:?}"
    );
    let gone = remote("http://127.0.0.1:9")
        .supported(None)
        .await
        .unwrap_err();
    assert!(matches!(gone, RemoteError::Unanswered(_)), "{gone:?}");
}
