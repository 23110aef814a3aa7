#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! Issue #47: what unpaid requests can make the receiver keep. A 402 is free to ask for, and a
//! payment that does not pay is free to send: over the example app's HTTP paywall in front of
//! a devnet, neither leaves a record behind in the receiver's store, and an honest payer is
//! served in the middle of the flood.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use algod_devnet::example::example_app;
use algod_devnet::{Devnet, DevnetConfig};
use async_trait::async_trait;
use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use rail_core::keys::{KeyStore, Seen, Write};
use rail_core::{ManualClock, MemoryKeyStore, RailResult, SharedClock, Timestamp};
use rail_exact_algo::wire::PaymentRequired;
use rail_exact_algo::{Address, AlgodClient, ExactAlgoPayer, ExactAlgoReceiver, Policy};
use reqwest::StatusCode;

/// The memory store, counting the records that live in it (inserted, less removed).
#[derive(Debug)]
struct Counted {
    inner: MemoryKeyStore,
    live: AtomicI64,
}

impl Counted {
    fn new(clock: SharedClock) -> Self {
        Counted {
            inner: MemoryKeyStore::with_clock(clock),
            live: AtomicI64::new(0),
        }
    }

    fn live(&self) -> i64 {
        self.live.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl KeyStore for Counted {
    async fn insert_if_absent(&self, ns: &str, key: &str, rec: &Write) -> RailResult<Option<Seen>> {
        let r = self.inner.insert_if_absent(ns, key, rec).await;
        if matches!(r, Ok(None)) {
            self.live.fetch_add(1, Ordering::SeqCst);
        }
        r
    }
    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.inner.replace(ns, key, token, rec).await
    }
    async fn take_over(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.inner.take_over(ns, key, token, rec).await
    }
    async fn renew(&self, ns: &str, key: &str, token: i64, lease: Duration) -> RailResult<bool> {
        self.inner.renew(ns, key, token, lease).await
    }
    async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
        let r = self.inner.remove(ns, key, token).await;
        if matches!(r, Ok(true)) {
            self.live.fetch_sub(1, Ordering::SeqCst);
        }
        r
    }
    async fn get(&self, ns: &str, key: &str) -> RailResult<Option<Seen>> {
        self.inner.get(ns, key).await
    }
    async fn purge_expired(&self) -> RailResult<u64> {
        self.inner.purge_expired().await
    }
    async fn now(&self) -> RailResult<Timestamp> {
        self.inner.now().await
    }
}

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

async fn challenge(http: &reqwest::Client, url: &str, payment: Option<&str>) -> PaymentRequired {
    let mut r = http.get(url);
    if let Some(p) = payment {
        r = r.header("PAYMENT-SIGNATURE", p);
    }
    let resp = r.send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::PAYMENT_REQUIRED);
    let header = resp.headers()["PAYMENT-REQUIRED"].to_str().unwrap();
    serde_json::from_slice(&BASE64.decode(header.as_bytes()).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unpaid_challenges_and_payments_that_do_not_pay_leave_nothing_and_an_honest_payer_is_served()
 {
    let (honest_key, mallory_key, treasury) = (key(1), key(3), addr(&key(2)));
    let net = Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (addr(&honest_key), 5_000_000),
                (addr(&mallory_key), 5_000_000),
                (treasury, 100_000),
            ],
            token: Some("t0ken".into()),
            ..DevnetConfig::default()
        },
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let algod = AlgodClient::new(&net.url, Some("t0ken".into())).unwrap();
    let manual = ManualClock::starting_now();
    let clock: SharedClock = Arc::new(manual.clone());
    let store = Arc::new(Counted::new(clock.clone()));
    let receiver =
        ExactAlgoReceiver::connect(algod.clone(), treasury, store.clone(), clock.clone())
            .await
            .unwrap();
    // The payers keep their own records elsewhere: only the receiver's are counted.
    let payer = |k: SigningKey| {
        let own: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(clock.clone()));
        ExactAlgoPayer::new(k, algod.clone(), Policy::default(), own, clock.clone())
    };
    let (honest, mallory) = (payer(honest_key), payer(mallory_key));
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = example_app(&receiver, 200_000);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = rail_exact_algo::algod::http_client(Duration::from_secs(30)).unwrap();

    // The issuing key, written once when the first challenge is made.
    let first = challenge(&http, &format!("{base}/api/posts/1"), None).await;
    let baseline = store.live();
    assert_eq!(baseline, 1);

    // 1,500 challenges across the priced posts, unpaid.
    for i in 0..1_500u32 {
        let url = format!("{base}/api/posts/{}", 1 + i % 3);
        let pr = challenge(&http, &url, None).await;
        assert_ne!(
            pr.accepts[0].extra.payment_id,
            first.accepts[0].extra.payment_id
        );
    }
    assert_eq!(store.live(), baseline, "a challenge leaves nothing behind");

    // 40 payments signed for another post than the one asked (checked, then refused: its
    // paymentId is unknown there), 40 for a challenge that has lapsed, and 40 made-up
    // headers: whatever record is taken for them is given back.
    for _ in 0..40 {
        let pr = challenge(&http, &format!("{base}/api/posts/3"), None).await;
        let signed = mallory.pay_required(&pr).await.unwrap();
        let refused = challenge(&http, &format!("{base}/api/posts/1"), Some(&signed.header)).await;
        assert_eq!(refused.error, "unknown or expired paymentId");
        challenge(
            &http,
            &format!("{base}/api/posts/3"),
            Some("bm90IGEgcGF5bWVudA=="),
        )
        .await;
    }
    let mut lapsed = Vec::new();
    for _ in 0..40 {
        let pr = challenge(&http, &format!("{base}/api/posts/3"), None).await;
        lapsed.push(mallory.pay_required(&pr).await.unwrap());
    }
    manual.advance(Duration::from_secs(121));
    for signed in &lapsed {
        let refused = challenge(&http, &format!("{base}/api/posts/3"), Some(&signed.header)).await;
        assert_eq!(refused.error, "unknown or expired paymentId");
    }
    assert_eq!(
        store.live(),
        baseline,
        "a payment that does not pay leaves nothing behind"
    );

    // The honest payer is served, once.
    let honest_pr = challenge(&http, &format!("{base}/api/posts/2"), None).await;
    let signed = honest.pay_required(&honest_pr).await.unwrap();
    let paid = http
        .get(format!("{base}/api/posts/2"))
        .header("PAYMENT-SIGNATURE", &signed.header)
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), StatusCode::OK);
    assert!(paid.headers().contains_key("PAYMENT-RESPONSE"));
    // What it paid for is kept (its settlement, its served-once mark), nothing more.
    assert_eq!(store.live(), baseline + 2);
}
