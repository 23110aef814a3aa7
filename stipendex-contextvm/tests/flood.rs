//! Floods of unpaid priced requests (issue 47), as load tests on nwc-devnet: one key, or many
//! throwaway keys (new Nostr keys are free), asking for payment requests they never pay. What
//! must hold: one key never holds more than its share of the pending payments nor makes the
//! shop's wallet create more invoices than its limits; throwaway keys never hold more than the
//! server's cap; and an honest payer — a fresh key that pays — is still served.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Tools, call, text, world};
use nostr::{Event, Keys, Kind, PublicKey, Timestamp};
use nostr_sdk::Filter;
use nwc_devnet::ListFilter;
use serde_json::{Value, json};
use stipendex_contextvm::payments::ServerPayments;
use stipendex_contextvm::transport::relay::{RelaySettings, Relays};
use stipendex_contextvm::transport::server::{Server, ServerOptions};
use stipendex_contextvm::transport::wire::{self, Wrap};
use tokio::sync::mpsc;

/// An attacker's connection: publishes anything, and reads what the server sends to any of
/// `keys` (one subscription for all of them).
struct Mallory {
    relays: Relays,
    inbox: mpsc::Receiver<Event>,
    keys: Vec<Keys>,
}

impl Mallory {
    async fn connect(url: &str, keys: Vec<Keys>) -> Self {
        let filter = Filter::new()
            .kinds([
                Kind::from(wire::MESSAGE),
                Kind::from(wire::GIFT_WRAP),
                Kind::from(wire::EPHEMERAL_GIFT_WRAP),
            ])
            .pubkeys(keys.iter().map(Keys::public_key))
            .since(Timestamp::now() - 60);
        let (relays, inbox) = Relays::connect(
            &keys[0],
            &[url.to_owned()],
            filter,
            RelaySettings::default(),
        )
        .await
        .unwrap();
        Mallory {
            relays,
            inbox,
            keys,
        }
    }

    /// Sends `tools/call name {q}` with JSON-RPC id `id` from key `k`, gift-wrapped, saying it
    /// pays over Lightning; returns the request's event id.
    async fn call(
        &self,
        k: usize,
        server: &PublicKey,
        name: &str,
        q: &str,
        id: usize,
    ) -> nostr::EventId {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                          "params": {"name": name, "arguments": {"q": q}}});
        let inner = wire::message(
            &self.keys[k],
            server,
            &body,
            vec![wire::pmi_tag("bitcoin-lightning-bolt11")],
        )
        .unwrap();
        let event = inner.id;
        self.relays
            .publish(&wire::wrap(&inner, server, Wrap::Ephemeral).unwrap())
            .await
            .unwrap();
        event
    }

    async fn search(&self, k: usize, server: &PublicKey, q: &str) -> nostr::EventId {
        self.call(k, server, "search", q, 1).await
    }

    /// The next message to any of the keys (opened, as JSON-RPC), or `None` within `wait`.
    async fn next(&mut self, wait: Duration) -> Option<Value> {
        let ev = tokio::time::timeout(wait, self.inbox.recv()).await.ok()??;
        let to = ev.tags.public_keys().next().copied()?;
        let k = self.keys.iter().find(|k| k.public_key() == to)?;
        let (inner, _) = wire::open(k, &ev).ok()?;
        wire::json_rpc(&inner).ok()
    }

    /// Reads until `n` messages came or `wait` passed; returns them.
    async fn read(&mut self, n: usize, wait: Duration) -> Vec<Value> {
        let until = tokio::time::Instant::now() + wait;
        let mut out = Vec::new();
        while out.len() < n {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            match self.next(left).await {
                Some(m) => out.push(m),
                None => break,
            }
        }
        out
    }
}

fn method(m: &Value) -> &str {
    m.get("method").and_then(Value::as_str).unwrap_or_default()
}

/// Invoices the shop's wallet made (paid or not).
fn invoices(w: &common::World) -> usize {
    w.devnet
        .network()
        .list_transactions(
            "shop",
            &ListFilter {
                unpaid: true,
                kind: Some("incoming".into()),
                ..ListFilter::default()
            },
        )
        .unwrap()
        .len()
}

async fn start(w: &common::World, tools: Tools, payments: &Arc<ServerPayments>) -> Server {
    Server::start(
        Keys::generate(),
        ServerOptions::new(vec![w.url()]),
        move || tools.clone(),
        Some(payments.clone() as _),
    )
    .await
    .unwrap()
}

/// One key asks for many payment requests and pays none: it gets at most its share of the
/// pending payments, the wallet makes at most that many invoices for it, and an honest payer
/// arriving after it is served — the server's pending payments are never all one key's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_cannot_take_every_pending_slot_nor_make_invoices_without_end() {
    let w = world().await;
    let tools = Tools::default();
    let payments = Arc::new(w.payments(None).max_pending(10));
    let server = start(&w, tools.clone(), &payments).await;
    let mut mallory = Mallory::connect(&w.url(), vec![Keys::generate()]).await;

    // Thirty distinct calls, none paid: each is answered (a payment request, or a refusal).
    let n = 30;
    for i in 0..n {
        mallory
            .search(0, &server.public_key(), &format!("q{i}"))
            .await;
    }
    let got = mallory.read(n, Duration::from_secs(30)).await;
    assert_eq!(got.len(), n, "every request was answered: {got:?}");
    let required = got
        .iter()
        .filter(|m| method(m) == "notifications/payment_required")
        .count();
    let refused = got.iter().filter(|m| m.get("error").is_some()).count();
    assert_eq!(required + refused, n);
    assert!(
        required <= 8,
        "one key got {required} payment requests at once"
    );
    assert!(
        invoices(&w) <= 8,
        "the wallet made {} invoices",
        invoices(&w)
    );
    let held = payments.pending_for(&mallory.keys[0].public_key());
    assert!(held <= 8, "one key holds {held} pending payments");
    assert_eq!(payments.pending(), held, "all of them its own");

    // An honest payer, a fresh key, is served.
    let agent = w.agent("agent").await;
    let client = w.client(&server, Some(agent)).await;
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        client.call_tool(call("search", "honest")),
    )
    .await
    .expect("answered in time")
    .expect("the honest payer is served");
    assert_eq!(text(&r), "search: honest");
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 10_000);
    client.cancel().await.unwrap();
    mallory.relays.shutdown().await;
    server.shutdown().await;
}

fn count(got: &[Value], m: &str) -> usize {
    got.iter().filter(|x| method(x) == m).count()
}

fn errors(got: &[Value]) -> Vec<&Value> {
    got.iter().filter_map(|m| m.get("error")).collect()
}

/// One key asking for the same call again and again (a new request event each time): its
/// unpaid payment is replaced, never added to (the replaced request is told
/// `payment_rejected`), and the wallet makes no more invoices than the client's rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_asking_the_same_call_again_replaces_its_own_and_stays_within_its_rate() {
    let w = world().await;
    let payments = Arc::new(
        w.payments(None)
            .payment_requests_per_client(5, Duration::from_secs(60)),
    );
    let server = start(&w, Tools::default(), &payments).await;
    let mut mallory = Mallory::connect(&w.url(), vec![Keys::generate()]).await;
    let n = 20;
    for i in 0..n {
        mallory
            .call(0, &server.public_key(), "search", "same", i)
            .await;
        // In order: each one after the one it replaces.
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    // Each request is answered (a payment request or a refusal); each replaced one is rejected.
    let got = mallory.read(n + 4, Duration::from_secs(30)).await;
    let required = count(&got, "notifications/payment_required");
    let rejected = count(&got, "notifications/payment_rejected");
    let refused = errors(&got);
    assert!(required <= 5, "{required} payment requests for one key");
    assert_eq!(required + refused.len(), n, "{got:?}");
    assert_eq!(rejected, required - 1, "each replaced request is told");
    for e in &refused {
        assert_eq!(e["code"], -32000);
        assert!(e["data"]["retry_after"].as_u64().unwrap() > 0, "{e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("too many payment requests from this client"),
            "{e}"
        );
    }
    assert!(
        invoices(&w) <= 5,
        "the wallet made {} invoices",
        invoices(&w)
    );
    assert_eq!(payments.pending_for(&mallory.keys[0].public_key()), 1);
    mallory.relays.shutdown().await;
    server.shutdown().await;
}

/// Many throwaway keys, one unpaid request each: the server never holds more than its cap
/// (the oldest unpaid payments are withdrawn, and their clients told), and an honest payer —
/// a fresh key that pays — is served while the crowd goes on asking.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throwaway_keys_stay_within_the_global_cap_and_an_honest_payer_is_still_served() {
    let w = world().await;
    let tools = Tools::default();
    let cap = 16;
    let payments = Arc::new(w.payments(None).max_pending(cap));
    let server = start(&w, tools.clone(), &payments).await;
    let crowd: Vec<Keys> = (0..60).map(|_| Keys::generate()).collect();
    let mut mallory = Mallory::connect(&w.url(), crowd).await;
    for k in 0..40 {
        mallory.search(k, &server.public_key(), "flood").await;
        assert!(payments.pending() <= cap, "{} pending", payments.pending());
    }
    let got = mallory.read(40 + 40 - cap, Duration::from_secs(30)).await;
    assert_eq!(count(&got, "notifications/payment_required"), 40);
    assert_eq!(
        count(&got, "notifications/payment_rejected"),
        40 - cap,
        "each withdrawn payment's client is told"
    );
    assert_eq!(payments.pending(), cap);

    // The honest payer asks while the crowd goes on (fewer newcomers than the cap meanwhile).
    let agent = w.agent("agent").await;
    let client = w.client(&server, Some(agent)).await;
    let server_key = server.public_key();
    let flood = tokio::spawn(async move {
        for k in 40..50 {
            mallory.search(k, &server_key, "more").await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        mallory
    });
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        client.call_tool(call("search", "honest")),
    )
    .await
    .expect("answered in time")
    .expect("the honest payer is served");
    assert_eq!(text(&r), "search: honest");
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 10_000);
    let mallory = flood.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(payments.pending() <= cap, "{} pending", payments.pending());
    assert_eq!(
        tools.runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the paid call ran"
    );
    client.cancel().await.unwrap();
    mallory.relays.shutdown().await;
    server.shutdown().await;
}

/// New keys are free, so the per-key limits do not bound what a crowd makes the wallet do: the
/// server's own rate does. Past it, requests are refused with a time to retry and no invoice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_servers_rate_bounds_the_invoices_a_crowd_of_keys_makes() {
    let w = world().await;
    let payments = Arc::new(
        w.payments(None)
            .payment_requests(10, Duration::from_secs(60)),
    );
    let server = start(&w, Tools::default(), &payments).await;
    let crowd: Vec<Keys> = (0..30).map(|_| Keys::generate()).collect();
    let mut mallory = Mallory::connect(&w.url(), crowd).await;
    for k in 0..30 {
        mallory.search(k, &server.public_key(), "flood").await;
    }
    let got = mallory.read(30, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 30, "{got:?}");
    let required = count(&got, "notifications/payment_required");
    // 10 at once, and one more each 6 s meanwhile.
    assert!((10..=11).contains(&required), "{required} payment requests");
    for e in errors(&got) {
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .starts_with("too many payment requests now"),
            "{e}"
        );
        assert!(e["data"]["retry_after"].as_u64().unwrap() > 0);
    }
    assert_eq!(invoices(&w), required, "no invoice for a refused request");
    mallory.relays.shutdown().await;
    server.shutdown().await;
}

/// A crowd of new keys takes every session while an honest client pays: its session is
/// evicted, and its paid request is still run and answered (a new session serves it) — the
/// payment is never lost. (The crowd's calls run too: only the paid one is checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payers_session_evicted_by_new_keys_while_it_pays_still_serves_the_paid_call() {
    let w = world().await;
    let tools = Tools::default();
    let payments = Arc::new(w.payments(None));
    let t = tools.clone();
    let mut opts = ServerOptions::new(vec![w.url()]);
    opts.max_sessions = 4;
    let server = Server::start(
        Keys::generate(),
        opts,
        move || t.clone(),
        Some(payments.clone() as _),
    )
    .await
    .unwrap();
    let (url, server_key) = (w.url(), server.public_key());
    let mut watch = common::Watch::new(w.agent("agent").await);
    watch.before = Some(Box::new(move || {
        let url = url.clone();
        Box::pin(async move {
            // Before paying: ten new keys, a slow free call each (their sessions busy too, so
            // none is spared for being idle): the payer's session, the least recently used,
            // is evicted.
            let crowd: Vec<Keys> = (0..10).map(|_| Keys::generate()).collect();
            let mut m = Mallory::connect(&url, crowd).await;
            for k in 0..10 {
                m.call(k, &server_key, "slow", "hi", 1).await;
            }
            // The last sessions stay and answer; the others were evicted in turn.
            assert!(!m.read(10, Duration::from_secs(8)).await.is_empty());
            m.relays.shutdown().await;
        })
    }));
    let watch = Arc::new(watch);
    let client = w.client(&server, Some(watch.clone())).await;
    let r = tokio::time::timeout(
        Duration::from_secs(40),
        client.call_tool(call("search", "paid")),
    )
    .await
    .expect("answered in time")
    .expect("the paid call is served");
    assert_eq!(text(&r), "search: paid");
    assert!(server.sessions() <= 4);
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 10_000);
    client.cancel().await.unwrap();
    server.shutdown().await;
}

/// One key sends many calls to a slow tool: past its session's bound on requests in flight they
/// are refused at once without running, and the server goes on serving another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_key_flooding_a_slow_tool_is_refused_past_its_bound_and_others_are_served() {
    let w = world().await;
    let tools = Tools::default();
    let server = start(&w, tools.clone(), &Arc::new(w.payments(None))).await;
    let mut mallory = Mallory::connect(&w.url(), vec![Keys::generate()]).await;
    let n = 200;
    for i in 0..n {
        mallory.call(0, &server.public_key(), "slow", "x", i).await;
    }
    let other = w.client(&server, None).await;
    let r = tokio::time::timeout(Duration::from_secs(5), other.call_tool(call("echo", "hi")))
        .await
        .expect("another client is served meanwhile")
        .unwrap();
    assert_eq!(text(&r), "echo: hi");
    let got = mallory.read(n, Duration::from_secs(30)).await;
    assert_eq!(got.len(), n);
    let refused = errors(&got)
        .iter()
        .filter(|e| {
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains("in flight") || m.contains("busy"))
        })
        .count();
    assert!(refused >= 200 - 128, "{refused} refused");
    let ran = tools.runs.load(std::sync::atomic::Ordering::SeqCst);
    assert!(ran <= 128 + 1, "{ran} ran");
    other.cancel().await.unwrap();
    mallory.relays.shutdown().await;
    server.shutdown().await;
}

/// A crowd of new keys with quick calls takes the sessions while an honest client's slow call
/// runs: idle sessions go first, so the call in flight is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_in_flight_outlives_a_crowd_of_new_keys_with_quick_calls() {
    let w = world().await;
    let tools = Tools::default();
    let t = tools.clone();
    let mut opts = ServerOptions::new(vec![w.url()]);
    opts.max_sessions = 4;
    let server = Server::start(Keys::generate(), opts, move || t.clone(), None)
        .await
        .unwrap();
    let client = Arc::new(w.client(&server, None).await);
    let c = client.clone();
    let slow = tokio::spawn(async move { c.call_tool(call("slow", "honest")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let crowd: Vec<Keys> = (0..10).map(|_| Keys::generate()).collect();
    let mut m = Mallory::connect(&w.url(), crowd).await;
    for k in 0..10 {
        m.call(k, &server.public_key(), "echo", "hi", 1).await;
        // Each answered before the next comes: the crowd's sessions are idle.
        assert!(m.next(Duration::from_secs(10)).await.is_some());
    }
    let r = tokio::time::timeout(Duration::from_secs(20), slow)
        .await
        .expect("answered in time")
        .unwrap()
        .expect("the call in flight is answered");
    assert_eq!(text(&r), "slow: honest");
    assert!(server.sessions() <= 4);
    m.relays.shutdown().await;
    server.shutdown().await;
}
