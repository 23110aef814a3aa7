//! Mock tier: a paywall in front of a facilitator that misbehaves (mockito, and a socket that
//! never answers). Whatever the facilitator does short of a well-formed `success: true`, the
//! paid content is not served. The answers' shapes are the reference facilitator's
//! (`@x402/core` `HTTPFacilitatorClient` reads `SettleResponse` JSON from `POST /settle`).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use alloy_primitives::{Address, U256};
use axum::Router;
use axum::routing::get;
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::RemoteFacilitator;
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::rpc::{RpcClient, RpcError};
use rail_x402::wire::PaymentRequired;
use rail_x402::{ExactEvm, Token};
use x402_transport::wire::PAYMENT_SIGNATURE;

const TOKEN: Address = Address::repeat_byte(0x11);

async fn serve(facilitator_url: &str, hits: Arc<AtomicUsize>) -> String {
    let remote = RemoteFacilitator::new(facilitator_url, Duration::from_millis(500)).unwrap();
    let paywall = ExactEvm::new(
        Arc::new(remote),
        Token::new("eip155:31337", TOKEN, "USD Coin", "2"),
        Address::repeat_byte(0x22),
    )
    .paywall(&[("/paid", 1000, "paid")])
    .unwrap();
    let app = paywall.apply(Router::new().route(
        "/paid",
        get(move || {
            let hits = hits.clone();
            async move {
                hits.fetch_add(1, Ordering::SeqCst);
                "secret"
            }
        }),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/paid")
}

async fn pay(url: &str) -> reqwest::Response {
    let http = rail_x402::rpc::http_client(Duration::from_secs(10)).unwrap();
    let r = http.get(url).send().await.unwrap();
    let pr =
        PaymentRequired::from_header(r.headers()["payment-required"].to_str().unwrap()).unwrap();
    let payer = X402Payer::new(
        LocalSigner::random(),
        Policy::new("eip155:31337", TOKEN, U256::from(1000)),
    );
    let payment = payer.pay(&pr).unwrap();
    http.get(url)
        .header(PAYMENT_SIGNATURE, payment.to_header().unwrap())
        .send()
        .await
        .unwrap()
}

async fn not_served(name: &str, settle: impl FnOnce(&mut mockito::ServerGuard) -> mockito::Mock) {
    let mut server = mockito::Server::new_async().await;
    let _mock = settle(&mut server);
    let hits = Arc::new(AtomicUsize::new(0));
    let url = serve(&server.url(), hits.clone()).await;
    let r = pay(&url).await;
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert!(
        status == 402 || status == 503,
        "{name}: status {status}, body {body}"
    );
    assert!(!body.contains("secret"), "{name}: content leaked");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "{name}: handler ran");
}

#[tokio::test]
async fn facilitator_failures_never_release_content() {
    not_served("html 502", |s| {
        s.mock("POST", "/settle")
            .with_status(502)
            .with_header("content-type", "text/html")
            .with_body("<html><body><h1>502 Bad Gateway</h1></body></html>")
            .create()
    })
    .await;
    not_served("503 with a success body", |s| {
        s.mock("POST", "/settle")
            .with_status(503)
            .with_body(r#"{"success":true,"transaction":"0x01","network":"eip155:31337"}"#)
            .create()
    })
    .await;
    not_served("truncated body", |s| {
        s.mock("POST", "/settle")
            .with_status(200)
            .with_body(r#"{"success":true,"transaction":"0xab"#)
            .create()
    })
    .await;
    not_served("success:false", |s| {
        s.mock("POST", "/settle")
            .with_status(200)
            .with_body(r#"{"success":false,"errorReason":"invalid_exact_evm_transaction_failed","transaction":"","network":"eip155:31337"}"#)
            .create()
    })
    .await;
    not_served("success without a transaction", |s| {
        s.mock("POST", "/settle")
            .with_status(200)
            .with_body(r#"{"success":true,"transaction":"","network":"eip155:31337"}"#)
            .create()
    })
    .await;
    not_served("settlement pending", |s| {
        s.mock("POST", "/settle")
            .with_status(200)
            .with_body(r#"{"success":false,"errorReason":"settlement_pending","transaction":"0x0102","network":"eip155:31337"}"#)
            .create()
    })
    .await;
}

#[tokio::test]
async fn a_facilitator_that_never_answers_is_a_503() {
    // Accepts connections, reads, never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((sock, _)) = listener.accept().await {
            held.push(sock);
        }
    });
    let hits = Arc::new(AtomicUsize::new(0));
    let url = serve(&format!("http://{addr}"), hits.clone()).await;
    let r = pay(&url).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_facilitator_that_is_down_is_a_503() {
    let hits = Arc::new(AtomicUsize::new(0));
    let url = serve("http://127.0.0.1:9", hits.clone()).await;
    assert_eq!(pay(&url).await.status(), 503);
    assert_eq!(hits.load(Ordering::SeqCst), 0);
}

/// JSON-RPC answers as geth/anvil shape them (`ethereum/execution-apis`; a revert is code 3
/// with the ABI-encoded `Error(string)` in `data`).
#[tokio::test]
async fn rpc_errors_are_typed() {
    let mut s = mockito::Server::new_async().await;
    let rpc = RpcClient::new(&s.url()).unwrap();
    let m = s
        .mock("POST", "/")
        .with_body(r#"{"jsonrpc":"2.0","id":1,"error":{"code":3,"message":"execution reverted: FiatTokenV2: invalid signature","data":"0x08c379a00000000000000000000000000000000000000000000000000000000000000020000000000000000000000000000000000000000000000000000000000000001e46696174546f6b656e56323a20696e76616c6964207369676e61747572650000"}}"#)
        .create_async()
        .await;
    let e = rpc
        .call(None, TOKEN, &Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, RpcError::Reverted { reason } if reason == "FiatTokenV2: invalid signature"),
        "{e}"
    );
    m.remove_async().await;
    let m = s
        .mock("POST", "/")
        .with_body(r#"{"jsonrpc":"2.0","id":1,"error":{"code":-32000,"message":"nonce too low"}}"#)
        .create_async()
        .await;
    let e = rpc.chain_id().await.unwrap_err();
    assert!(matches!(&e, RpcError::Rpc { code: -32000, message } if message == "nonce too low"));
    m.remove_async().await;
    let _m = s
        .mock("POST", "/")
        .with_status(502)
        .with_body("<html>bad gateway</html>")
        .create_async()
        .await;
    let e = rpc.chain_id().await.unwrap_err();
    assert!(e.is_transient(), "{e}");
}
