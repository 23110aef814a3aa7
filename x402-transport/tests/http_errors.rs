//! Issue 46: a request that gets no answer is told in one sentence a person can act on —
//! where it went and why — not reqwest's `error sending request`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Duration;

use axum::Router;
use axum::routing::get;
use x402_transport::client::{
    Client, ClientError, MAX_REDIRECTS, describe_http_error, describe_http_error_after,
};

/// An HTTP client builder with the workspace's TLS provider installed, giving up after
/// `timeout`.
fn builder(timeout: Duration) -> reqwest::ClientBuilder {
    rail_x402::rpc::http_builder(timeout)
}

/// A listener on loopback and its origin.
async fn listen() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    (listener, base)
}

/// The address of a port that was just closed: nobody listens there.
async fn closed_port() -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

#[tokio::test]
async fn a_closed_port_is_a_refused_connection_to_its_address() {
    let addr = closed_port().await;
    let e = builder(Duration::from_secs(10))
        .build()
        .unwrap()
        .get(format!("http://{addr}/weather?key=s3cr3t"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        describe_http_error(&e),
        format!("could not connect to {addr} (connection refused)")
    );
    assert!(e.to_string().contains("error sending request"), "{e}");

    // The paying client says the same, before anything is paid.
    let client = Client::new(builder(Duration::from_secs(10))).unwrap();
    let Err(ClientError::Http(why)) = client.get(&format!("http://{addr}/weather")).await else {
        panic!("expected an HTTP error");
    };
    assert_eq!(
        why,
        format!("could not connect to {addr} (connection refused)")
    );
    let e = client
        .get(&format!("http://{addr}/weather"))
        .await
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("could not connect to {addr} (connection refused)")
    );
}

#[tokio::test]
async fn a_redirect_loop_names_where_it_went_last() {
    let (listener, base) = listen().await;
    let app = Router::new().route(
        "/loop",
        get(|| async { axum::response::Redirect::temporary("/loop") }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    // The paying client follows unpaid redirects itself, up to MAX_REDIRECTS.
    let client = Client::new(builder(Duration::from_secs(10))).unwrap();
    let e = client.get(&format!("{base}/loop")).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("more than {MAX_REDIRECTS} redirects (the last to {base}/loop)")
    );

    // reqwest's own redirect policy, described the same way.
    let e = builder(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::limited(3))
        .build()
        .unwrap()
        .get(format!("{base}/loop"))
        .send()
        .await
        .unwrap_err();
    assert!(e.is_redirect(), "{e:?}");
    assert_eq!(
        describe_http_error(&e),
        format!("too many redirects (the last to {base}/loop)")
    );
}

#[tokio::test]
async fn a_timeout_says_how_long_it_waited_and_for_whom() {
    let (listener, base) = listen().await;
    let app = Router::new().route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            "late"
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let host = base.trim_start_matches("http://");

    let started = std::time::Instant::now();
    let e = builder(Duration::from_millis(300))
        .build()
        .unwrap()
        .get(format!("{base}/slow"))
        .send()
        .await
        .unwrap_err();
    assert!(e.is_timeout(), "{e:?}");
    assert_eq!(
        describe_http_error(&e),
        format!("timed out waiting for {host}")
    );
    let said = describe_http_error_after(&e, started.elapsed());
    assert!(said.starts_with("timed out after "), "{said}");
    assert!(said.ends_with(&format!(" waiting for {host}")), "{said}");
    assert_eq!(
        describe_http_error_after(&e, Duration::from_millis(300)),
        format!("timed out after 300 ms waiting for {host}")
    );
    assert_eq!(
        describe_http_error_after(&e, Duration::from_secs(30)),
        format!("timed out after 30 s waiting for {host}")
    );
    assert_eq!(
        describe_http_error_after(&e, Duration::from_millis(1500)),
        format!("timed out after 1.5 s waiting for {host}")
    );

    // The paying client measures the wait itself.
    let client = Client::new(builder(Duration::from_secs(1))).unwrap();
    let e = client.get(&format!("{base}/slow")).await.unwrap_err();
    let said = e.to_string();
    assert!(said.starts_with("timed out after "), "{said}");
    assert!(said.ends_with(&format!(" s waiting for {host}")), "{said}");
}
