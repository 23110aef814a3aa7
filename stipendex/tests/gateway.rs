//! The gateway embedded in a Rust program (`stipendex::gateway`, feature `gateway`): a paid
//! front for an HTTP API that knows nothing of payments — quoted, paid by a wallet, forwarded
//! once without the payment's headers, receipted; free routes forwarded untouched; operations
//! only on their own router.

#![cfg(feature = "gateway")]
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::get;
use common::{pin, usd, world};
use stipendex::gateway::{Gateway, Parts, Settings, Upstream};
use stipendex::http::Client;
use stipendex::receiver::{PricedCapability, Receiver};

/// A listener on loopback and its origin.
async fn listen() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    (listener, base)
}

/// Serves `router` on `listener` (with the peer's address, as the gateway needs).
fn serve_on(listener: tokio::net::TcpListener, router: Router) {
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
}

/// Serves `router` on a loopback listener of its own: its origin.
async fn serve(router: Router) -> String {
    let (listener, base) = listen().await;
    serve_on(listener, router);
    base
}

#[tokio::test]
async fn an_embedded_gateway_quotes_forwards_once_and_receipts() {
    let w = world().await;
    // The upstream: it counts its runs and says whether a payment header reached it.
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let upstream = serve(
        Router::new()
            .route(
                "/api/search",
                get(move |h: HeaderMap| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let leaked = h.keys().any(|k| k.as_str().starts_with("stipendex-"));
                    async move { format!("results (payment headers seen: {leaked})") }
                }),
            )
            .route("/free", get(|| async { "free from upstream" })),
    )
    .await;

    // The gateway's own listener first: its origin is the one Quotes are bound to.
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")).describe("one search"))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let settings = Settings::new(Upstream::Http(upstream.parse().unwrap()));
    let gateway = Gateway::assemble(settings, Parts::from_registry(receiver, &w.registry))
        .await
        .unwrap();
    serve_on(listener, gateway.router());

    let http = stipendex::http::reqwest_client(std::time::Duration::from_secs(10)).unwrap();
    // Unpaid: a 402 with a Quote; nothing reached the upstream.
    let unpaid = http
        .get(format!("{base}/api/search?q=rust"))
        .send()
        .await
        .unwrap();
    assert_eq!(unpaid.status(), 402);
    let body: serde_json::Value = unpaid.json().await.unwrap();
    assert_eq!(body["quote"]["stipendex"], "quote/0.1");
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Paid by a wallet: forwarded once, without the payment's headers, and receipted.
    let client = Client::new(
        stipendex::http::reqwest_builder(std::time::Duration::from_secs(10)),
        w.wallet(w.mandate(|m| pin(m, &base)), true),
    )
    .unwrap();
    let r = client
        .get(&format!("{base}/api/search?q=rust"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"results (payment headers seen: false)");
    assert_eq!(
        r.receipt.expect("a receipt").object().amount,
        "0.05".parse().unwrap()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A free route is forwarded as it is; the operations are not on the public router.
    let free = http.get(format!("{base}/free")).send().await.unwrap();
    assert_eq!(free.text().await.unwrap(), "free from upstream");
    let metrics = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 404, "the upstream's 404, not the metrics");

    // ... they are on their own router.
    let ops = serve(gateway.operations()).await;
    let health = http.get(format!("{ops}/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = http
        .get(format!("{ops}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("stipendex_gateway_"), "{metrics}");
}
