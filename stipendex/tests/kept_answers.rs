//! Kept answers (issue 47): what a receiver keeps for lost-answer replays is bounded per
//! instance, and a tab's record stays small whatever its lanes' answers weigh.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{World, pin, usd, world};
use rail_core::keys::{Seen, Tally, Write};
use rail_core::{RailResult, Timestamp};
use stipendex::envelope::{Digest, Mandate, Resource, Signed};
use stipendex::receiver::{
    Admitted, Answer, KeepBounds, Presented, PricedCapability, Receiver, Request, TabCall, TabTerms,
};
use stipendex::wallet::{TabHold, Wallet};
use stipendex::{KeyStore, MemoryKeyStore};

const ORIGIN: &str = "https://search.example";
const MIB: usize = 1024 * 1024;

/// A key store that counts the bytes of every value written, and the values it holds now.
#[derive(Debug)]
struct Counting {
    inner: Arc<dyn KeyStore>,
    written: AtomicU64,
    live: Mutex<HashMap<(String, String), usize>>,
}

impl Counting {
    fn new(inner: Arc<dyn KeyStore>) -> Arc<Self> {
        Arc::new(Counting {
            inner,
            written: AtomicU64::new(0),
            live: Mutex::new(HashMap::new()),
        })
    }

    fn wrote(&self, ns: &str, key: &str, rec: &Write) {
        let n = rec.value.as_ref().map_or(0, String::len);
        self.written.fetch_add(n as u64, Ordering::SeqCst);
        self.live
            .lock()
            .unwrap()
            .insert((ns.to_owned(), key.to_owned()), n);
    }

    /// Bytes of values written so far.
    fn written(&self) -> u64 {
        self.written.load(Ordering::SeqCst)
    }

    /// The records held now whose namespace ends with `ns_end` and whose key contains `key`:
    /// how many, and the bytes of their values.
    fn held(&self, ns_end: &str, key: &str) -> (usize, usize) {
        let live = self.live.lock().unwrap();
        live.iter()
            .filter(|((n, k), _)| n.ends_with(ns_end) && k.contains(key))
            .fold((0, 0), |(c, b), (_, len)| (c + 1, b + len))
    }
}

#[async_trait]
impl KeyStore for Counting {
    async fn insert_if_absent(&self, ns: &str, key: &str, rec: &Write) -> RailResult<Option<Seen>> {
        let r = self.inner.insert_if_absent(ns, key, rec).await?;
        if r.is_none() {
            self.wrote(ns, key, rec);
        }
        Ok(r)
    }

    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        let r = self.inner.replace(ns, key, token, rec).await?;
        if r {
            self.wrote(ns, key, rec);
        }
        Ok(r)
    }

    async fn take_over(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        let r = self.inner.take_over(ns, key, token, rec).await?;
        if r {
            self.wrote(ns, key, rec);
        }
        Ok(r)
    }

    async fn renew(&self, ns: &str, key: &str, token: i64, lease: Duration) -> RailResult<bool> {
        self.inner.renew(ns, key, token, lease).await
    }

    async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
        let r = self.inner.remove(ns, key, token).await?;
        if r {
            self.live
                .lock()
                .unwrap()
                .remove(&(ns.to_owned(), key.to_owned()));
        }
        Ok(r)
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

    async fn count(&self, ns: &str, key: &str, window: Duration) -> RailResult<Tally> {
        self.inner.count(ns, key, window).await
    }
}

fn resource(q: &str) -> Resource {
    Resource {
        origin: ORIGIN.into(),
        method: "GET".into(),
        path: "/search".into(),
        query: Some(format!("q={q}")),
    }
}

fn req(q: &str) -> Request {
    Request::from_resource(&resource(q))
}

fn wide_mandate(w: &World) -> Signed<Mandate> {
    w.mandate(|m| {
        pin(m, ORIGIN);
        let l = &mut m.limits[0];
        l.total = Some("50.00".parse().unwrap());
        l.tab_cap = Some("10.00".parse().unwrap());
        l.open_tabs = Some(1);
        l.per_call = Some("1.00".parse().unwrap());
        l.confirm_above = Some("20.00".parse().unwrap());
    })
}

/// The shop on `store`, offering tabs of 10 USD with `lanes` lanes.
fn tab_shop(w: &World, store: &Arc<Counting>, lanes: u16) -> stipendex::receiver::Builder {
    let store: Arc<dyn KeyStore> = store.clone();
    Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .store(store)
        .origin(ORIGIN)
        .price(PricedCapability::fixed("GET", "/search", usd("0.05")))
        .tabs(TabTerms::new(usd("10.00")).lanes(lanes))
        .clock(Arc::new(w.clock.clone()))
}

async fn open_tab(r: &Receiver, wallet: &Wallet) -> TabHold {
    let sent = resource("first");
    let tab = r
        .offer_tab(&Request::from_resource(&sent))
        .await
        .unwrap()
        .expect("a tab is offered");
    let hold = wallet.open_tab(&tab, &sent).await.unwrap();
    r.open_tab(hold.proof().jws()).await.unwrap();
    hold
}

/// The body of call `q`, `len` bytes.
fn body_of(q: &str, len: usize) -> Vec<u8> {
    let mut b = format!("result of {q}:").into_bytes();
    b.resize(len, b'x');
    b
}

/// One call inside the tab, answered with a body of `len` bytes; its voucher (compact JWS).
async fn tab_call(
    r: &Receiver,
    wallet: &Wallet,
    hold: &TabHold,
    q: &str,
    len: usize,
) -> (String, Vec<u8>) {
    let v = wallet.voucher(hold, &req(q)).await.unwrap();
    let TabCall::Run(serving) = r.tab_call(&req(q), v.voucher.jws()).await.unwrap() else {
        panic!("a new voucher was not run");
    };
    let body = body_of(q, len);
    let result = Digest::of(&body);
    wallet.tab_result(hold, &v.voucher, &result).await.unwrap();
    r.tab_answered(
        *serving,
        Answer {
            status: 200,
            content_type: Some("text/plain".into()),
            body: body.clone(),
            receipt: None,
            headers: Vec::new(),
        },
        &result,
    )
    .await;
    (v.voucher.jws().to_owned(), body)
}

/// (b) A tab of 64 lanes, each lane's last answer 1 MiB: one more voucher writes the small
/// record (its lane's answer rides on the next write), not 64 MiB of answers; the lanes'
/// lost answers still replay, at this instance and at another on the same store.
#[tokio::test]
async fn a_voucher_writes_its_lane_and_a_small_record_not_every_lane_s_answer() {
    let w = world().await;
    let store = Counting::new(Arc::new(MemoryKeyStore::with_clock(Arc::new(
        w.clock.clone(),
    ))));
    // Room for every lane's answer: nothing is dropped for the bound here.
    let room = KeepBounds {
        bytes: 256 * MIB as u64,
        entries: 1024,
    };
    let r = tab_shop(&w, &store, 64).kept_answers(room).build().unwrap();
    let wallet = w.wallet(wide_mandate(&w), true);
    let hold = open_tab(&r, &wallet).await;
    let mut calls = Vec::new();
    for i in 0..64 {
        calls.push(tab_call(&r, &wallet, &hold, &format!("fill{i}"), MIB).await);
    }
    r.flush_tabs().await.unwrap();

    // One more call (lane 0 again): the voucher's write, then its answer's.
    let before = store.written();
    let q = "one-more";
    let v = wallet.voucher(&hold, &req(q)).await.unwrap();
    let TabCall::Run(serving) = r.tab_call(&req(q), v.voucher.jws()).await.unwrap() else {
        panic!("a new voucher was not run");
    };
    let accepted = store.written() - before;
    let body = body_of(q, MIB);
    let result = Digest::of(&body);
    wallet.tab_result(&hold, &v.voucher, &result).await.unwrap();
    r.tab_answered(
        *serving,
        Answer {
            status: 200,
            content_type: Some("text/plain".into()),
            body: body.clone(),
            receipt: None,
            headers: Vec::new(),
        },
        &result,
    )
    .await;
    r.flush_tabs().await.unwrap();
    let with_answer = store.written() - before;
    eprintln!(
        "bytes written per voucher, 64 lanes of 1 MiB answers: {accepted} to accept it, {with_answer} with its answer"
    );
    assert!(
        accepted < 64 * 1024,
        "accepting a voucher wrote {accepted} bytes"
    );
    assert!(
        with_answer < (MIB as u64) * 3 / 2 + 64 * 1024,
        "a voucher and its answer wrote {with_answer} bytes"
    );

    // The lost answers replay: the newest call's, and an older lane's last call's.
    let (v1, b1) = &calls[1];
    for (voucher, body, q) in [
        (v.voucher.jws(), &body, q.to_owned()),
        (v1.as_str(), b1, "fill1".to_owned()),
    ] {
        match r.tab_call(&req(&q), voucher).await.unwrap() {
            TabCall::Answered { answer, .. } => assert_eq!(&answer.body, body),
            other => panic!("a lost answer was not replayed: {other:?}"),
        }
    }
    // Another instance on the same store reads them from the store.
    let twin = tab_shop(&w, &store, 64).kept_answers(room).build().unwrap();
    match twin.tab_call(&req("fill1"), v1).await.unwrap() {
        TabCall::Answered { answer, .. } => assert_eq!(&answer.body, b1),
        other => panic!("a lost answer was not replayed at another instance: {other:?}"),
    }
}

/// A receiver of `GET /search` on `store`, keeping answers within `bounds`.
fn shop(w: &World, store: &Arc<Counting>, bounds: KeepBounds) -> Receiver {
    let store: Arc<dyn KeyStore> = store.clone();
    Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .store(store)
        .origin(ORIGIN)
        .price(PricedCapability::fixed("GET", "/search", usd("0.05")))
        .kept_answers(bounds)
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap()
}

/// A paid request `q`: quoted, paid, admitted, answered with `len` bytes and a Receipt. Its
/// Proof (compact JWS), body and Receipt.
async fn paid_call(
    r: &Receiver,
    wallet: &Wallet,
    q: &str,
    len: usize,
) -> (String, Vec<u8>, String) {
    let quote = common::quote(r, &req(q)).await;
    let paid = wallet.pay_for(&quote, &resource(q)).await.unwrap();
    let Presented::Admitted(Admitted::Run(paying)) =
        r.present(&req(q), paid.proof.jws()).await.unwrap()
    else {
        panic!("a new proof was not run");
    };
    let body = body_of(q, len);
    let receipt = r.receipt(&paying.accepted, &body).unwrap();
    let answer = Answer {
        status: 200,
        content_type: Some("text/plain".into()),
        body: body.clone(),
        receipt: Some(receipt.jws().to_owned()),
        headers: Vec::new(),
    };
    r.answered(*paying, Some(&answer)).await.unwrap();
    (paid.proof.jws().to_owned(), body, receipt.jws().to_owned())
}

/// (a) The attack: many paid answers, together far above the bound. What the instance keeps
/// stays within it (bytes and entries, in the store as in its count); the latest payer still
/// gets its answer back; the earliest, whose answer was dropped, is told `answer_gone` with its
/// Receipt — not run again, not charged again — and its Proof stays refused as a payment.
#[tokio::test]
async fn many_paid_answers_past_the_bound_stay_within_it_and_an_evicted_payer_is_told_answer_gone()
{
    let w = world().await;
    let store = Counting::new(Arc::new(MemoryKeyStore::with_clock(Arc::new(
        w.clock.clone(),
    ))));
    let bounds = KeepBounds {
        bytes: MIB as u64,
        entries: 16,
    };
    let r = shop(&w, &store, bounds);
    let wallet = w.wallet(w.mandate(|m| pin(m, ORIGIN)), true);
    let mut paid = Vec::new();
    for i in 0..12 {
        paid.push(paid_call(&r, &wallet, &format!("big{i}"), 200 * 1024).await);
        let (entries, bytes) = store.held("/answers", "");
        let (counted, counted_bytes) = r.kept_answers();
        assert!(entries <= bounds.entries, "{entries} answers kept");
        // The bound, give or take the records that just lost their bodies (about 1 KiB each).
        assert!(
            bytes as u64 <= bounds.bytes + 8 * 1024,
            "{bytes} bytes of answers kept"
        );
        assert_eq!((entries, bytes as u64), (counted, counted_bytes));
    }
    // Far more was answered than kept.
    assert!(paid.iter().map(|p| p.1.len()).sum::<usize>() > 2 * MIB);

    let before = w.balance(w.agent).await;
    // The latest payer's answer was lost: the same Proof again gets it, with its Receipt.
    let (proof, body, receipt) = paid.last().unwrap();
    match r.present(&req("big11"), proof).await.unwrap() {
        Presented::Admitted(Admitted::Answered { answer, .. }) => {
            assert_eq!(&answer.body, body);
            assert_eq!(answer.receipt.as_deref(), Some(receipt.as_str()));
        }
        other => panic!("the latest answer was not replayed: {other:?}"),
    }
    // The earliest payer's answer was dropped: answer_gone, with its Receipt.
    let (proof, _, receipt) = &paid[0];
    match r.present(&req("big0"), proof).await.unwrap() {
        Presented::Gone(g) => {
            assert_eq!(g.receipt.as_deref(), Some(receipt.as_str()));
            assert_eq!(g.status, Some(200));
            assert!(g.message.contains("not run again"), "{}", g.message);
        }
        other => panic!("an evicted answer was not answer_gone: {other:?}"),
    }
    // Through admit (the MCP binding's), the same repeat is quote_used: refused, not run.
    let e = r.admit(&req("big0"), proof).await.unwrap_err();
    assert_eq!(e.code(), "quote_used", "{e}");
    // Another request with the same Proof is still refused.
    assert!(r.present(&req("other"), proof).await.is_err());
    assert_eq!(w.balance(w.agent).await, before, "a repeat was charged");

    // Many small answers: the entries bound holds too, and the latest still replays.
    let mut small = Vec::new();
    for i in 0..20 {
        small.push(paid_call(&r, &wallet, &format!("small{i}"), 100).await);
    }
    let (entries, _) = store.held("/answers", "");
    assert!(entries <= bounds.entries, "{entries} answers kept");
    let (proof, body, _) = small.last().unwrap();
    match r.present(&req("small19"), proof).await.unwrap() {
        Presented::Admitted(Admitted::Answered { answer, .. }) => assert_eq!(&answer.body, body),
        other => panic!("the latest small answer was not replayed: {other:?}"),
    }
    // Its records gone altogether, the earliest is still answer_gone (without its Receipt).
    match r.present(&req("big0"), &paid[0].0).await.unwrap() {
        Presented::Gone(g) => assert_eq!(g.receipt, None),
        other => panic!("an evicted answer was not answer_gone: {other:?}"),
    }
}

/// (a) Over a tab: lanes' answers past the bound are dropped oldest first; the same voucher
/// again is refused `answer_gone` (not run, not counted again) and the newest still replays.
#[tokio::test]
async fn a_lane_answer_dropped_for_the_bound_is_answer_gone_and_the_newest_replays() {
    let w = world().await;
    let store = Counting::new(Arc::new(MemoryKeyStore::with_clock(Arc::new(
        w.clock.clone(),
    ))));
    let bounds = KeepBounds {
        bytes: 700 * 1024,
        entries: 64,
    };
    let r = tab_shop(&w, &store, 4)
        .kept_answers(bounds)
        .build()
        .unwrap();
    let wallet = w.wallet(wide_mandate(&w), true);
    let hold = open_tab(&r, &wallet).await;
    let mut calls = Vec::new();
    for i in 0..4 {
        calls.push(tab_call(&r, &wallet, &hold, &format!("lane{i}"), 200 * 1024).await);
        r.flush_tabs().await.unwrap();
        let (_, bytes) = store.held("/tabs", "/answer/");
        assert!(
            bytes as u64 <= bounds.bytes,
            "{bytes} bytes of answers kept"
        );
    }
    let e = r
        .tab_call(&req("lane0"), &calls[0].0)
        .await
        .expect_err("a dropped answer was replayed");
    assert_eq!(e.code(), "answer_gone", "{e}");
    match r.tab_call(&req("lane3"), &calls[3].0).await.unwrap() {
        TabCall::Answered { answer, .. } => assert_eq!(answer.body, calls[3].1),
        other => panic!("the newest answer was not replayed: {other:?}"),
    }
    // Nothing was counted twice: the close captures the four calls.
    let close = wallet.close_request(&hold).unwrap();
    let receipt = r.close_tab(close.jws()).await.unwrap();
    assert_eq!(receipt.object().captured, "0.20".parse().unwrap());
    // A closed tab's answers are removed.
    assert_eq!(store.held("/tabs", "/answer/").0, 0);
}

/// (a) Over HTTP: a Proof whose kept answer was dropped is answered `410` `answer_gone` with
/// its Receipt in the body — not a 402 (nothing is to be paid again), not a second run.
#[tokio::test]
async fn over_http_an_evicted_answer_is_410_answer_gone_with_its_receipt() {
    use axum::Router;
    use axum::routing::get;
    use std::sync::atomic::AtomicUsize;
    use stipendex::http::Binding;

    let w = world().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .kept_answers(KeepBounds {
            bytes: 700 * 1024,
            entries: 64,
        })
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let r1 = runs.clone();
    let app = Binding::new(receiver).unwrap().apply(Router::new().route(
        "/api/search",
        get(move || async move {
            r1.fetch_add(1, Ordering::SeqCst);
            vec![b'y'; 200 * 1024]
        }),
    ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = stipendex::http::reqwest_client(Duration::from_secs(10)).unwrap();
    let wallet = w.wallet(w.mandate(|m| pin(m, &base)), true);
    let mut paid = Vec::new();
    for i in 0..5 {
        let url = format!("{base}/api/search?q={i}");
        let body: serde_json::Value = http.get(&url).send().await.unwrap().json().await.unwrap();
        let quote: Signed<stipendex::envelope::Quote> =
            serde_json::from_value(body["quote"].clone()).unwrap();
        let sent = quote.object().resource.clone().unwrap();
        let p = wallet.pay_for(&quote, &sent).await.unwrap();
        let resp = http
            .get(&url)
            .header("stipendex-payment", p.proof.to_header())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let receipt = resp.headers()["stipendex-receipt"]
            .to_str()
            .unwrap()
            .to_owned();
        resp.bytes().await.unwrap();
        paid.push((url, p, receipt));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 5);
    let before = w.balance(w.agent).await;

    let (url, p, _) = &paid[0];
    let resp = http
        .get(url)
        .header("stipendex-payment", p.proof.to_header())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 410);
    assert!(resp.headers().get("stipendex-receipt").is_none());
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["error"], "answer_gone", "{body}");
    let receipt: Signed<stipendex::envelope::Receipt> =
        serde_json::from_value(body["receipt"].clone()).unwrap();
    assert_eq!(&receipt.object().proof, p.proof.digest());
    wallet
        .receipt_for(p, receipt.jws(), &vec![b'y'; 200 * 1024])
        .await
        .expect("the Receipt binds the answer that was given");

    // The latest payer's lost answer is still replayed, with its Receipt.
    let (url, p, receipt) = paid.last().unwrap();
    let resp = http
        .get(url)
        .header("stipendex-payment", p.proof.to_header())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["stipendex-receipt"].to_str().unwrap(),
        receipt
    );
    assert_eq!(resp.bytes().await.unwrap().len(), 200 * 1024);
    assert_eq!(runs.load(Ordering::SeqCst), 5, "a repeat ran the handler");
    assert_eq!(w.balance(w.agent).await, before, "a repeat was charged");
}
