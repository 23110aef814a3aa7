//! The costly-quote limit over HTTP (issue 47): who a client is (behind a trusted proxy, the
//! address it vouches for; a spoofed `X-Forwarded-For` from anyone else changes nothing; IPv6
//! by its /64), and a fleet of instances sharing a store (one SQLite file, one PostgreSQL
//! database) admits the limit once between them, not once per instance.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use rail_core::keys::sql::{PgKeyStore, SqliteKeyStore};
use stipendex::envelope::SecretKey;
use stipendex::http::{Binding, IpNet, TrustedProxies};
use stipendex::receiver::{PricedCapability, Receiver};
use stipendex::{Asset, KeyStore, Money};

const LIMIT: u32 = 3;

/// A rail whose every offer is an object elsewhere (as a Stripe PaymentIntent is), counted.
struct Costly(Arc<AtomicUsize>);

impl stipendex::Rail for Costly {
    fn id(&self) -> stipendex::rail_core::RailId {
        stipendex::rail_core::RailId::new("stripe")
    }
    fn capabilities(&self) -> stipendex::rail_core::Capabilities {
        stipendex::rail_core::Capabilities::pay_only(
            stipendex::rail_core::Finality::Immediate,
            vec![Asset::usd()],
        )
    }
}

#[async_trait::async_trait]
impl stipendex::RailReceiver for Costly {
    async fn offer(
        &self,
        charge: &stipendex::Charge,
    ) -> stipendex::rail_core::RailResult<stipendex::Offer> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Ok(stipendex::Offer {
            rail: stipendex::rail_core::RailId::new("stripe"),
            id: format!("off_{}", rand::random::<u64>()),
            amount: charge.amount.clone(),
            payee: "shop".into(),
            mode: charge.mode,
            expires_at: stipendex::rail_core::Timestamp(i64::MAX),
            details: serde_json::Value::Null,
        })
    }
    fn offers_cost(&self) -> bool {
        true
    }
    async fn verify(
        &self,
        _: &stipendex::Offer,
        _: &stipendex::rail_core::Payment,
    ) -> stipendex::rail_core::RailResult<stipendex::rail_core::Verified> {
        Err(stipendex::rail_core::RailError::InvalidInput(
            "not paid here".into(),
        ))
    }
}

/// One instance of receiver `id` (its only rail costly), on `store` if given, trusting
/// `trusted`; its origin, and how many costly offers it made.
async fn instance(
    id: &str,
    key: &SecretKey,
    store: Option<Arc<dyn KeyStore>>,
    trusted: TrustedProxies,
) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let made = Arc::new(AtomicUsize::new(0));
    let mut b = Receiver::builder(id, key.clone())
        .origin(&base)
        .rail(
            "card",
            stipendex::rail_core::ReceiverHandle::pay_only(Costly(made.clone())),
        )
        .price(PricedCapability::fixed(
            "GET",
            "/api/search",
            Money::parse(Asset::usd(), "0.05").unwrap(),
        ))
        .costly_quotes_per_client(LIMIT, Duration::from_secs(60));
    if let Some(s) = store {
        b = b.store(s);
    }
    let app = Binding::new(b.build().unwrap())
        .unwrap()
        .trusted_proxies(trusted)
        .apply(Router::new().route("/api/search", get(|| async { "results" })));
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    (base, made)
}

fn client() -> reqwest::Client {
    stipendex::http::reqwest_client(Duration::from_secs(10)).unwrap()
}

/// The status of an unpaid request to `base`, sent with `X-Forwarded-For: xff` if given.
async fn status(base: &str, xff: Option<&str>) -> u16 {
    let mut r = client().get(format!("{base}/api/search"));
    if let Some(x) = xff {
        r = r.header("x-forwarded-for", x);
    }
    r.send().await.unwrap().status().as_u16()
}

fn loopback() -> TrustedProxies {
    TrustedProxies::nets(vec!["127.0.0.0/8".parse::<IpNet>().unwrap()])
}

/// The attacker's test: a client that writes its own `X-Forwarded-For` to a server that trusts
/// no proxy is still its peer address; one window, whatever it claims.
#[tokio::test]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_gets_no_new_window() {
    let (base, made) = instance(
        "search",
        &SecretKey::generate(),
        None,
        TrustedProxies::default(),
    )
    .await;
    let mut got = Vec::new();
    for i in 0..6 {
        got.push(status(&base, Some(&format!("198.51.100.{i}"))).await);
    }
    assert_eq!(got, [402, 402, 402, 429, 429, 429]);
    assert_eq!(made.load(Ordering::SeqCst), 3);
}

/// Behind a trusted proxy, each client the proxy vouches for has a window of its own (one
/// client at its limit does not take the costly offers out of everyone's Quotes); the
/// addresses of one IPv6 /64 are one client, however many it cycles through.
#[tokio::test]
async fn behind_a_trusted_proxy_each_forwarded_client_has_its_own_window() {
    let (base, made) = instance("search", &SecretKey::generate(), None, loopback()).await;
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(status(&base, Some("198.51.100.1")).await);
    }
    assert_eq!(got, [402, 402, 402, 429], "one client past its limit");
    assert_eq!(
        status(&base, Some("198.51.100.2")).await,
        402,
        "another client behind the same proxy"
    );
    assert_eq!(
        status(&base, Some("6.6.6.6, 198.51.100.3")).await,
        402,
        "the address the proxy vouches for, not what the client wrote left of it"
    );
    let mut v6 = Vec::new();
    for i in 1..=5 {
        v6.push(status(&base, Some(&format!("2001:db8:7:7::{i:x}"))).await);
    }
    assert_eq!(v6, [402, 402, 402, 429, 429], "one /64, one window");
    assert_eq!(
        status(&base, Some("2001:db8:7:8::1")).await,
        402,
        "the next /64"
    );
    assert_eq!(made.load(Ordering::SeqCst), 3 + 1 + 1 + 3 + 1);
}

/// Sends 4 × LIMIT requests at once, spread over `instances`: how many got a Quote (402) and
/// how many were refused (429).
async fn flood(instances: &[String]) -> (usize, usize) {
    let tasks: Vec<_> = (0..4 * LIMIT as usize)
        .map(|i| {
            let base = instances[i % instances.len()].clone();
            tokio::spawn(async move { status(&base, None).await })
        })
        .collect();
    let (mut quoted, mut refused) = (0, 0);
    for t in tasks {
        match t.await.unwrap() {
            402 => quoted += 1,
            429 => refused += 1,
            other => panic!("unexpected status {other}"),
        }
    }
    (quoted, refused)
}

/// Two instances of one receiver on `stores` (each its own connection to one database): the
/// same client, sending to both at once, gets the limit once between them.
async fn fleet_admits_the_limit_once(stores: [Arc<dyn KeyStore>; 2]) {
    // A fresh receiver id per run: its counters are its own.
    let id = format!("search-{:016x}", rand::random::<u64>());
    let key = SecretKey::generate();
    let [a, b] = stores;
    let (base_a, made_a) = instance(&id, &key, Some(a), TrustedProxies::default()).await;
    let (base_b, made_b) = instance(&id, &key, Some(b), TrustedProxies::default()).await;
    let (quoted, refused) = flood(&[base_a.clone(), base_b.clone()]).await;
    assert_eq!(
        (quoted, refused),
        (LIMIT as usize, 3 * LIMIT as usize),
        "the fleet admits the limit once, not once per instance"
    );
    assert_eq!(
        made_a.load(Ordering::SeqCst) + made_b.load(Ordering::SeqCst),
        LIMIT as usize
    );
    // Refused now by both, whichever counted.
    assert_eq!(status(&base_a, None).await, 429);
    assert_eq!(status(&base_b, None).await, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_sqlite_store_admit_the_limit_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("receiver.db");
    let a: Arc<dyn KeyStore> = Arc::new(SqliteKeyStore::open(&path).await.unwrap());
    let b: Arc<dyn KeyStore> = Arc::new(SqliteKeyStore::open(&path).await.unwrap());
    fleet_admits_the_limit_once([a, b]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_postgres_store_admit_the_limit_once() {
    let url = test_kit::localnet::postgres_url();
    let connect =
        || async { tokio::time::timeout(Duration::from_secs(5), PgKeyStore::connect(&url)).await };
    let (a, b) = match (connect().await, connect().await) {
        (Ok(Ok(a)), Ok(Ok(b))) => (a, b),
        (Ok(Err(e)), _) | (_, Ok(Err(e))) => {
            return test_kit::localnet::missing("PostgreSQL", &e.to_string());
        }
        _ => return test_kit::localnet::missing("PostgreSQL", "connection timed out"),
    };
    fleet_admits_the_limit_once([Arc::new(a), Arc::new(b)]).await;
}

/// Without a shared store each instance counts alone (the fallback): two instances admit the
/// limit each — what the shared count above prevents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_store_each_instance_counts_alone() {
    let key = SecretKey::generate();
    let (a, _) = instance("search", &key, None, TrustedProxies::default()).await;
    let (b, _) = instance("search", &key, None, TrustedProxies::default()).await;
    let (quoted, _) = flood(&[a, b]).await;
    assert_eq!(quoted, 2 * LIMIT as usize);
}
