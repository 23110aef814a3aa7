//! Issue 46, "messages a person can act on", over HTTP: a receiver that names another origin
//! than the one its request went to is told how to fix it, the descriptor lists only the
//! profiles its routes quote, and a request that gets no answer says where it went and why —
//! and, after a payment, that the payment is kept for the same request asked again.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use common::{pin, usd, world};
use stipendex::Error;
use stipendex::http::{Binding, Client};
use stipendex::receiver::{PricedCapability, Receiver};

/// The wallet's HTTP client, giving up on an answer after `timeout`.
fn client(wallet: stipendex::wallet::Wallet, timeout: Duration) -> Client {
    Client::new(stipendex::http::reqwest_builder(timeout), wallet).unwrap()
}

/// A listener on loopback and its origin.
async fn listen() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    (listener, base)
}

/// The receiver `search` (configured at `origins`), pricing `GET /api/search` at 0.05 USD,
/// and whatever `edit` adds.
fn search(
    w: &common::World,
    origins: &[&str],
    edit: impl FnOnce(stipendex::receiver::Builder) -> stipendex::receiver::Builder,
) -> Receiver {
    let mut b = Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .clock(Arc::new(w.clock.clone()));
    for o in origins {
        b = b.origin(*o);
    }
    edit(b).build().unwrap()
}

/// A receiver configured at `https://shop.example` but reached at a local port names its
/// configured origin in the Quote: the wallet refuses it (the same code as before, `denied`)
/// with the fix, not as an attack.
#[tokio::test]
async fn a_quote_naming_another_origin_says_how_to_add_it() {
    let w = world().await;
    let (listener, base) = listen().await;
    let receiver = search(&w, &["https://shop.example"], |b| b);
    let app = Binding::new(receiver)
        .unwrap()
        .apply(Router::new().route("/api/search", get(|| async { "results" })));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = client(
        w.wallet(w.mandate(|m| pin(m, &base)), true),
        Duration::from_secs(10),
    );
    let err = client
        .get(&format!("{base}/api/search?q=rust"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "denied", "{err}");
    let msg = err.to_string();
    assert!(
        msg.ends_with(&format!(
            " of search names origin https://shop.example, but the request went to {base}: if {base} is this receiver, add \"{base}\" to [receiver] origins"
        )),
        "{msg}"
    );
    assert!(msg.starts_with("denied: quote q_"), "{msg}");
    assert!(!msg.contains("relayed"), "{msg}");
    assert!(w.journal.names().is_empty(), "nothing was paid");
}

/// `/.well-known/stipendex.json` lists a profile only where a priced route quotes it: a
/// receiver whose rail can hold, but that prices nothing by estimate, lists no checkout.
#[tokio::test]
async fn the_descriptor_lists_only_the_profiles_its_routes_use() {
    let w = world().await;
    let (listener, base) = listen().await;
    let app = Binding::new(search(&w, &[&base], |b| b))
        .unwrap()
        .apply(Router::new().route("/api/search", get(|| async { "results" })));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let d: serde_json::Value = stipendex::http::reqwest_client(Duration::from_secs(10))
        .unwrap()
        .get(format!("{base}{}", stipendex::http::WELL_KNOWN))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(d["profiles"], serde_json::json!(["service"]), "{d}");

    let estimate =
        || PricedCapability::estimate("POST", "/api/order", usd("3.00"), "0.50".parse().unwrap());
    let both = search(&w, &[], |b| b.price(estimate())).descriptor();
    let names = |d: &stipendex::receiver::Descriptor| serde_json::to_value(&d.profiles).unwrap();
    assert_eq!(names(&both), serde_json::json!(["service", "checkout"]));
    let only_checkout = Receiver::builder("shop", w.receiver_key.clone())
        .registry(&w.registry)
        .price(estimate())
        .build()
        .unwrap()
        .descriptor();
    assert_eq!(names(&only_checkout), serde_json::json!(["checkout"]));
}

/// A request to a port nobody listens on, and a redirect loop: one sentence each, saying where
/// the request went and why it got no answer (not `error sending request`), retryable.
#[tokio::test]
async fn a_request_that_gets_no_answer_says_where_and_why() {
    let w = world().await;
    let client = client(w.wallet(w.mandate(|_| {}), true), Duration::from_secs(10));

    // A port that was just closed.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = closed.local_addr().unwrap();
    drop(closed);
    let err = client
        .get(&format!("http://{addr}/api/search"))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Network(_)), "{err:?}");
    assert_eq!(err.code(), "unavailable", "{err}");
    assert_eq!(
        err.to_string(),
        format!("could not connect to {addr} (connection refused)")
    );

    // A redirect loop ends after MAX_REDIRECTS hops, naming where it went last.
    let (listener, base) = listen().await;
    let app = Router::new().route(
        "/loop",
        get(|| async { axum::response::Redirect::temporary("/loop") }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let err = client.get(&format!("{base}/loop")).await.unwrap_err();
    assert_eq!(err.code(), "unavailable", "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "more than {} redirects (the last to {base}/loop)",
            x402_transport::client::MAX_REDIRECTS
        )
    );
    assert!(w.journal.names().is_empty(), "nothing was paid");
}

/// A paid request whose answer does not come in time: the message says how long it waited,
/// where, and that the payment is kept — and the same request asked again presents it, gets
/// the answer and its Receipt, and pays nothing more.
#[tokio::test]
async fn a_paid_request_without_an_answer_says_the_payment_is_kept() {
    let w = world().await;
    let (listener, base) = listen().await;
    let slow = Arc::new(AtomicBool::new(true));
    let handler = {
        let slow = slow.clone();
        move || {
            let slow = slow.clone();
            async move {
                if slow.swap(false, Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(2500)).await;
                }
                "results"
            }
        }
    };
    // A claim of one second: the call the client gave up on is recovered soon after.
    let receiver = search(&w, &[&base], |b| b.claim_lease(Duration::from_secs(1)));
    let app = Binding::new(receiver)
        .unwrap()
        .apply(Router::new().route("/api/search", get(handler)));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = client(
        w.wallet(w.mandate(|m| pin(m, &base)), true),
        Duration::from_secs(1),
    );
    let before = w.balance(w.agent).await.0;
    let url = format!("{base}/api/search?q=rust");
    let err = client.get(&url).await.unwrap_err();
    assert_eq!(err.code(), "unavailable", "{err}");
    let msg = err.to_string();
    let host = base.trim_start_matches("http://");
    assert!(msg.starts_with("timed out after "), "{msg}");
    assert!(
        msg.contains(&format!(" waiting for {host}, after quote q_")),
        "{msg}"
    );
    assert!(
        msg.ends_with(
            " of search was paid: the payment is kept and will be presented again when the same request is retried (nothing is paid twice)"
        ),
        "{msg}"
    );
    assert_eq!(before - w.balance(w.agent).await.0, 5, "paid once");

    // Asked again once its claim has lapsed (`in_progress`, retryable, until then): the same
    // payment, the answer and its Receipt.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let mut r = client.get(&url).await.unwrap();
    for _ in 0..10 {
        if r.status.as_u16() != 503 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        r = client.get(&url).await.unwrap();
    }
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"results"[..]));
    assert!(r.receipt.is_some());
    assert_eq!(
        before - w.balance(w.agent).await.0,
        5,
        "nothing more was paid"
    );
}
