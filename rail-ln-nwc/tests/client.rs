#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! `NwcClient` against a small in-test wallet service on a real `LocalRelay`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nostr_relay_builder::prelude::{LocalRelay, RateLimit, RelayBuilder};
use nostr_sdk::{
    Client, Event, EventBuilder, EventId, Filter, Keys, Kind, PublicKey, RelayMessage,
    RelayOptions, RelayPoolNotification, RelayUrl, SubscriptionId,
};
use rail_ln_nwc::client::{ClientOptions, NwcClient, NwcError};
use rail_ln_nwc::nip47::{
    ConnectionUri, Encryption, ErrorCode, KIND_INFO, KIND_REQUEST, Notification, Request,
    Transaction,
};
use rail_ln_nwc::wire;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;

// ---------------------------------------------------------------- relay

fn builder(port: Option<u16>) -> RelayBuilder {
    let b = RelayBuilder::default()
        .addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
        // The default is 60 events a minute per connection.
        .rate_limit(RateLimit {
            max_reqs: 500,
            notes_per_minute: 1_000_000,
        });
    match port {
        Some(p) => b.port(p),
        None => b,
    }
}

async fn start_relay() -> (LocalRelay, RelayUrl) {
    let relay = LocalRelay::new(builder(None));
    relay.run().await.unwrap();
    let url = relay.url().await;
    (relay, url)
}

fn port_of(url: &RelayUrl) -> u16 {
    url.as_str()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A new relay on the port of `url` (the old one shut down), retrying the bind.
async fn restart_relay(url: &RelayUrl) -> LocalRelay {
    let port = port_of(url);
    for _ in 0..100 {
        let relay = LocalRelay::new(builder(Some(port)));
        if relay.run().await.is_ok() {
            assert_eq!(relay.url().await, *url);
            return relay;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("could not re-bind port {port}");
}

// ---------------------------------------------------------------- fake wallet service

/// What the wallet does with a request.
enum Reply {
    /// Answers with this response content.
    Json(Value),
    /// Answers with this content, but signed by another key.
    From(Keys, Value),
}

type Handler = Arc<dyn Fn(&Request) -> Vec<Reply> + Send + Sync>;

#[derive(Clone, Copy, PartialEq, Eq)]
enum InfoKind {
    /// `encryption` tag `nip44_v2 nip04`.
    Both,
    /// No `encryption` tag at all (a NIP-04-only wallet).
    Legacy,
}

struct Wallet {
    keys: Keys,
    client: Client,
    /// The `encryption` tag of every request received.
    seen: Arc<Mutex<Vec<Option<Option<Encryption>>>>>,
    /// The id of every request event received.
    ids: Arc<Mutex<Vec<EventId>>>,
    /// The requests' subscription.
    sub: (SubscriptionId, Filter),
}

async fn sdk_client(keys: &Keys, urls: &[RelayUrl]) -> Client {
    let client = Client::builder().signer(keys.clone()).build();
    let opts = RelayOptions::new()
        .retry_interval(Duration::from_millis(300))
        .adjust_retry_interval(false);
    for u in urls {
        client
            .pool()
            .add_relay(u.clone(), opts.clone())
            .await
            .unwrap();
    }
    client.connect().await;
    client.wait_for_connection(Duration::from_secs(5)).await;
    client
}

/// Keeps the mock wallet service's subscription on `url` as the client keeps its own: the
/// crate's relay plumbing (re-sent on every reconnect, and until the relay confirms it), so the
/// side a relay restart may leave deaf is the one under test.
async fn keep_subscribed(c: &Client, url: &RelayUrl, id: SubscriptionId, filter: Filter) {
    let relay = c.relay(url.clone()).await.unwrap();
    let notifications = relay.notifications();
    tokio::spawn(rail_ln_nwc::relays::keep_subscribed(
        "mock wallet",
        relay,
        notifications,
        id,
        filter,
        Arc::new(rail_ln_nwc::relays::Listening::default()),
    ));
}

async fn publish(c: &Client, ev: &Event) {
    for _ in 0..50 {
        if let Ok(out) = c.send_event(ev).await
            && !out.success.is_empty()
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("wallet could not publish {}", ev.id);
}

async fn spawn_wallet(urls: &[RelayUrl], info: InfoKind, handler: Handler) -> Wallet {
    let keys = Keys::generate();
    let client = sdk_client(&keys, urls).await;
    let info_ev = match info {
        InfoKind::Both => wire::info_event(
            &keys,
            &[
                "get_balance",
                "get_info",
                "pay_invoice",
                "lookup_invoice",
                "make_invoice",
            ],
            &[Encryption::Nip44V2, Encryption::Nip04],
            &["payment_received", "payment_sent"],
        )
        .unwrap(),
        InfoKind::Legacy => EventBuilder::new(Kind::from(KIND_INFO), "get_balance pay_invoice")
            .sign_with_keys(&keys)
            .unwrap(),
    };
    publish(&client, &info_ev).await;

    let mut rx = client.notifications();
    let filter = Filter::new()
        .kind(Kind::from(KIND_REQUEST))
        .pubkey(keys.public_key());
    let id = client
        .subscribe(filter.clone(), None)
        .await
        .unwrap()
        .val
        .clone();
    let mut eose = 0;
    tokio::time::timeout(Duration::from_secs(5), async {
        while eose < urls.len() {
            if let Ok(RelayPoolNotification::Message {
                message: RelayMessage::EndOfStoredEvents(sid),
                ..
            }) = rx.recv().await
                && *sid == id
            {
                eose += 1;
            }
        }
    })
    .await
    .expect("wallet EOSE");
    for u in urls {
        keep_subscribed(&client, u, id.clone(), filter.clone()).await;
    }
    let sub = (id.clone(), filter.clone());

    let seen = Arc::new(Mutex::new(Vec::new()));
    let ids = Arc::new(Mutex::new(Vec::new()));
    let (k, c, s, i) = (keys.clone(), client.clone(), seen.clone(), ids.clone());
    tokio::spawn(async move {
        loop {
            let event = match rx.recv().await {
                Ok(RelayPoolNotification::Event { event, .. }) => event,
                Ok(RelayPoolNotification::Shutdown) | Err(RecvError::Closed) => break,
                _ => continue,
            };
            if event.kind != Kind::from(KIND_REQUEST) {
                continue;
            }
            let tag = wire::encryption_tag(&event);
            s.lock().unwrap().push(tag);
            i.lock().unwrap().push(event.id);
            let enc = match tag {
                None => Encryption::Nip04,
                Some(Some(e)) => e,
                Some(None) => continue,
            };
            let Ok(req) = wire::open::<Request>(&k, &event, enc) else {
                continue;
            };
            for reply in handler(&req) {
                let (signer, body) = match reply {
                    Reply::Json(v) => (k.clone(), v),
                    Reply::From(other, v) => (other, v),
                };
                let resp =
                    wire::response_event(&signer, &event.pubkey, event.id, enc, &body).unwrap();
                publish(&c, &resp).await;
            }
        }
    });
    Wallet {
        keys,
        client,
        seen,
        ids,
        sub,
    }
}

impl Wallet {
    fn uri(&self, app: &Keys, urls: &[RelayUrl]) -> ConnectionUri {
        ConnectionUri {
            wallet_pubkey: self.keys.public_key().to_hex(),
            relays: urls.iter().map(ToString::to_string).collect(),
            secret: app.secret_key().to_secret_hex(),
            lud16: None,
        }
    }

    fn seen(&self) -> Vec<Option<Option<Encryption>>> {
        self.seen.lock().unwrap().clone()
    }
}

fn ok(result_type: &str, result: Value) -> Vec<Reply> {
    let mut body = json!({ "result_type": result_type });
    body["result"] = result;
    vec![Reply::Json(body)]
}

fn balance_handler(msat: u64) -> Handler {
    Arc::new(move |req: &Request| match req.method.as_str() {
        "get_balance" => ok("get_balance", json!({ "balance": msat })),
        _ => vec![Reply::Json(json!({
            "result_type": req.method,
            "error": { "code": "NOT_IMPLEMENTED", "message": "no" }
        }))],
    })
}

fn opts(timeout_ms: u64) -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_millis(timeout_ms),
        ..ClientOptions::default()
    }
}

async fn setup(info: InfoKind, handler: Handler) -> (LocalRelay, RelayUrl, Wallet, NwcClient) {
    let (relay, url) = start_relay().await;
    let wallet = spawn_wallet(std::slice::from_ref(&url), info, handler).await;
    let app = Keys::generate();
    let client = NwcClient::connect(
        &wallet.uri(&app, std::slice::from_ref(&url)),
        ClientOptions::default(),
    )
    .await
    .unwrap();
    (relay, url, wallet, client)
}

// ---------------------------------------------------------------- tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_balance_round_trip_with_nip44_and_latency() {
    let (relay, url) = start_relay().await;
    let wallet = spawn_wallet(
        std::slice::from_ref(&url),
        InfoKind::Both,
        balance_handler(21_000),
    )
    .await;
    let app = Keys::generate();
    let t = Instant::now();
    let client = NwcClient::connect(
        &wallet.uri(&app, std::slice::from_ref(&url)),
        ClientOptions::default(),
    )
    .await
    .unwrap();
    println!("connect took {:?}", t.elapsed());
    assert_eq!(client.encryption(), Encryption::Nip44V2);
    assert_eq!(client.pubkey(), app.public_key().to_hex());
    assert!(client.info().methods.iter().any(|m| m == "get_balance"));
    assert_eq!(
        client.info().encryptions,
        [Encryption::Nip44V2, Encryption::Nip04]
    );
    assert_eq!(
        client.info().notifications,
        ["payment_received", "payment_sent"]
    );
    let dbg = format!("{client:?}");
    assert!(!dbg.contains(&app.secret_key().to_secret_hex()), "{dbg}");

    let mut rtts = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        assert_eq!(client.get_balance().await.unwrap(), 21_000);
        rtts.push(t.elapsed());
    }
    rtts.sort();
    println!(
        "get_balance round trip over LocalRelay (n=20, debug): min {:?} median {:?} max {:?}",
        rtts[0], rtts[10], rtts[19]
    );
    assert!(
        wallet
            .seen()
            .iter()
            .all(|t| *t == Some(Some(Encryption::Nip44V2)))
    );
    // A method the wallet refuses: its error comes back as a wallet error.
    let e = client.get_info().await.unwrap_err();
    assert_eq!(e.code(), "NOT_IMPLEMENTED");
    client.shutdown().await;
    assert!(matches!(
        client.get_balance().await,
        Err(NwcError::Relay(_))
    ));
    relay.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_balance_with_a_nip04_only_wallet() {
    let (relay, _url, wallet, client) = setup(InfoKind::Legacy, balance_handler(7)).await;
    assert_eq!(client.encryption(), Encryption::Nip04);
    assert_eq!(client.info().encryptions, [Encryption::Nip04]);
    assert_eq!(client.info().methods, ["get_balance", "pay_invoice"]);
    assert_eq!(client.get_balance().await.unwrap(), 7);
    assert_eq!(wallet.seen(), [Some(Some(Encryption::Nip04))]);
    client.shutdown().await;
    relay.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_error_code_is_kept() {
    let handler: Handler = Arc::new(|req: &Request| {
        vec![Reply::Json(json!({
            "result_type": req.method,
            "error": { "code": "BAD_REQUEST", "message": "nope" },
            "result": null
        }))]
    });
    let (relay, _url, _wallet, client) = setup(InfoKind::Both, handler).await;
    let e = client.get_balance().await.unwrap_err();
    assert_eq!(
        e,
        NwcError::Wallet {
            code: ErrorCode::Unknown("BAD_REQUEST".into()),
            message: "nope".into()
        }
    );
    assert_eq!(e.code(), "BAD_REQUEST");
    assert!(!e.is_retryable());
    client.shutdown().await;
    relay.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_from_another_key_is_ignored() {
    let mallory = Keys::generate();
    let handler: Handler = Arc::new(move |_req: &Request| {
        vec![
            Reply::From(
                mallory.clone(),
                json!({ "result_type": "get_balance", "result": { "balance": 1 } }),
            ),
            Reply::Json(json!({ "result_type": "get_balance", "result": { "balance": 42 } })),
        ]
    });
    let (relay, _url, _wallet, client) = setup(InfoKind::Both, handler).await;
    assert_eq!(client.get_balance().await.unwrap(), 42);
    assert_eq!(client.get_balance().await.unwrap(), 42);
    client.shutdown().await;
    relay.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_result_type_is_a_protocol_error() {
    let handler: Handler = Arc::new(|_req: &Request| {
        ok(
            "pay_invoice",
            json!({ "preimage": "00".repeat(32), "balance": 5 }),
        )
    });
    let (relay, _url, _wallet, client) = setup(InfoKind::Both, handler).await;
    let e = client.get_balance().await.unwrap_err();
    assert!(matches!(e, NwcError::Protocol(_)), "{e:?}");
    assert_eq!(e.code(), "PROTOCOL");
    // The background task survived: the client still works for a matching answer.
    let r = client.pay_invoice("lnbcrt1", None).await.unwrap();
    assert_eq!(r.preimage, "00".repeat(32));
    client.shutdown().await;
    relay.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silence_is_a_timeout() {
    let (relay, url) = start_relay().await;
    let handler: Handler = Arc::new(|_req: &Request| Vec::new());
    let wallet = spawn_wallet(std::slice::from_ref(&url), InfoKind::Both, handler).await;
    let app = Keys::generate();
    let client = NwcClient::connect(&wallet.uri(&app, std::slice::from_ref(&url)), opts(700))
        .await
        .unwrap();
    let t = Instant::now();
    let e = client.get_balance().await.unwrap_err();
    let took = t.elapsed();
    assert_eq!(
        e,
        NwcError::Timeout {
            method: "get_balance".into()
        }
    );
    assert!(e.is_retryable());
    assert!(
        took >= Duration::from_millis(650) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(wallet.seen().len(), 1, "the request did reach the wallet");
    client.shutdown().await;
    relay.shutdown();
}

/// A request the wallet service never saw — it reached the relay while the service had no
/// subscription (a relay passes an ephemeral event only to the subscriptions it has at that
/// instant, as in the moment after a reconnect) — is sent again as the same event, and the
/// answer to the copy completes the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_wallet_missed_is_sent_again_as_the_same_event() {
    let (relay, _url, wallet, client) = setup(InfoKind::Both, balance_handler(5_000)).await;
    // The service's subscription is gone for 300 ms, as between a reconnect and its REQ.
    let (id, filter) = wallet.sub.clone();
    wallet.client.unsubscribe(&id).await;
    // The CLOSE is on the wallet's own connection: let the relay take it before the request
    // arrives on the client's.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let back = {
        let c = wallet.client.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            c.subscribe_with_id(id, filter, None).await.unwrap();
        })
    };
    let t = Instant::now();
    assert_eq!(client.get_balance().await.unwrap(), 5_000);
    let took = t.elapsed();
    back.await.unwrap();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(3),
        "answered by the copy sent after about a second: {took:?}"
    );
    assert_eq!(
        wallet.ids.lock().unwrap().len(),
        1,
        "the wallet got the request once: the first copy was lost, the second answered"
    );
    client.shutdown().await;
    relay.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_info_event_is_a_timeout_at_connect() {
    let (relay, url) = start_relay().await;
    let app = Keys::generate();
    let uri = ConnectionUri {
        wallet_pubkey: Keys::generate().public_key().to_hex(),
        relays: vec![url.to_string()],
        secret: app.secret_key().to_secret_hex(),
        lud16: None,
    };
    let t = Instant::now();
    let e = NwcClient::connect(&uri, opts(800)).await.unwrap_err();
    assert_eq!(
        e,
        NwcError::Timeout {
            method: "info".into()
        }
    );
    assert!(t.elapsed() < Duration::from_secs(3));
    relay.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_concurrent_calls_over_two_relays_are_all_answered() {
    let (relay_a, url_a) = start_relay().await;
    let (relay_b, url_b) = start_relay().await;
    let urls = [url_a, url_b];
    let handler: Handler = Arc::new(|req: &Request| {
        let hash = req.params["payment_hash"].as_str().unwrap_or_default();
        let amount: u64 = hash.trim_start_matches('0').parse().unwrap_or(0);
        ok(
            "lookup_invoice",
            json!({ "type": "incoming", "state": "settled", "payment_hash": hash,
                    "amount": amount * 1000, "created_at": 1 }),
        )
    });
    let wallet = spawn_wallet(&urls, InfoKind::Both, handler).await;
    let app = Keys::generate();
    let client = Arc::new(
        NwcClient::connect(&wallet.uri(&app, &urls), ClientOptions::default())
            .await
            .unwrap(),
    );
    let mut set = tokio::task::JoinSet::new();
    for i in 1..=10u64 {
        let c = client.clone();
        set.spawn(async move {
            let hash = format!("{i:064}");
            let tx: Transaction = c.lookup_invoice(&hash).await.unwrap();
            assert_eq!(tx.payment_hash, hash);
            assert_eq!(tx.amount, i * 1000);
            i
        });
    }
    let mut done: Vec<u64> = Vec::new();
    while let Some(r) = set.join_next().await {
        done.push(r.unwrap());
    }
    done.sort_unstable();
    assert_eq!(done, (1..=10).collect::<Vec<_>>());
    // Each request went out on both relays, and was answered (at least) once per relay seen.
    assert!(wallet.seen().len() >= 10);
    client.shutdown().await;
    relay_a.shutdown();
    relay_b.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifications_are_delivered_once() {
    let (relay, url, wallet, client) = setup(InfoKind::Both, balance_handler(1)).await;
    let mut rx = client.notifications();
    let app = PublicKey::from_hex(&client.pubkey()).unwrap();
    let n1 = Notification {
        notification_type: "payment_received".into(),
        notification: json!({ "type": "incoming", "payment_hash": "aa", "amount": 1000 }),
    };
    let n2 = Notification {
        notification_type: "payment_sent".into(),
        notification: json!({ "type": "outgoing", "payment_hash": "bb", "amount": 2000 }),
    };
    let ev1 = wire::notification_event(&wallet.keys, &app, Encryption::Nip44V2, &n1).unwrap();
    // The same event twice, then the same notification as a legacy NIP-04 event (23196).
    publish(&wallet.client, &ev1).await;
    publish(&wallet.client, &ev1).await;
    let legacy = wire::notification_event(&wallet.keys, &app, Encryption::Nip04, &n1).unwrap();
    publish(&wallet.client, &legacy).await;
    // One signed by another key (never delivered), then the second notification.
    let forged =
        wire::notification_event(&Keys::generate(), &app, Encryption::Nip44V2, &n2).unwrap();
    publish(&wallet.client, &forged).await;
    let ev2 = wire::notification_event(&wallet.keys, &app, Encryption::Nip44V2, &n2).unwrap();
    publish(&wallet.client, &ev2).await;

    let got1 = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    let got2 = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got1, n1);
    assert_eq!(got2, n2);
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err(),
        "a duplicate was delivered"
    );
    // Requests still work alongside.
    assert_eq!(client.get_balance().await.unwrap(), 1);
    client.shutdown().await;
    relay.shutdown();
    drop(url);
}

/// Waits until `c` is connected to `url` again.
async fn wait_connected(c: &Client, url: &RelayUrl) {
    let relay = c.relay(url.clone()).await.unwrap();
    let t = Instant::now();
    while !relay.is_connected() {
        assert!(t.elapsed() < Duration::from_secs(10), "no reconnect");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_restart_on_the_same_port_does_not_leave_the_client_deaf() {
    let (relay, url, wallet, client) = setup(InfoKind::Both, balance_handler(99)).await;
    assert_eq!(client.get_balance().await.unwrap(), 99);
    let mut relay = relay;
    // Twice, back to back: the second reconnect tends to land in the same wall-clock second
    // as the (re)subscription, where nostr-relay-pool 0.44 alone would not resubscribe.
    for round in 0..2 {
        relay.shutdown();
        drop(relay);
        tokio::time::sleep(Duration::from_millis(100)).await;
        relay = restart_relay(&url).await;
        let t = Instant::now();
        wait_connected(&wallet.client, &url).await;
        let reconnect = t.elapsed();
        // Let both sides reconnect (retry interval 300 ms) and resubscribe. A deaf client never
        // answers again; a loaded machine may need more than one retry interval, so the check is
        // "answers within 10 s", not "answers at the first call".
        tokio::time::sleep(Duration::from_millis(700)).await;
        let c = Instant::now();
        let mut answer = client.get_balance().await;
        while answer.is_err() && c.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(300)).await;
            answer = client.get_balance().await;
        }
        assert_eq!(answer.unwrap(), 99, "round {round}");
        println!(
            "round {round}: wallet reconnected after {:?}; call after restart took {:?}",
            reconnect,
            c.elapsed()
        );
    }
    client.shutdown().await;
    relay.shutdown();
}
