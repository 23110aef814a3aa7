//! Tab sessions end to end on the ledger rail (`docs/stipendex-profile.md` §4b): the wallet
//! opens a tab offered beside a Quote, pays calls by vouchers, the receiver captures exactly the
//! last vouchers, and the wallet gets the rest of the cap back — with the attacks on each step.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{World, pin, usd, world};
use stipendex::chain::verify_tab_chain;
use stipendex::envelope::{Digest, Mandate, Resource, Signed, Tab, Voucher};
use stipendex::receiver::{Answer, PricedCapability, Receiver, Request, TabCall, TabTerms};
use stipendex::wallet::chain_name;
use stipendex::wallet::{TabHold, Wallet};

const ORIGIN: &str = "https://search.example";

fn resource(path: &str, q: &str) -> Resource {
    Resource {
        origin: ORIGIN.into(),
        method: "GET".into(),
        path: path.into(),
        query: Some(format!("q={q}")),
    }
}

fn tab_mandate(w: &World, total: &str, open_tabs: u32) -> Signed<Mandate> {
    w.mandate(|m| {
        pin(m, ORIGIN);
        let l = &mut m.limits[0];
        l.total = Some(total.parse().unwrap());
        l.tab_cap = Some("2.00".parse().unwrap());
        l.open_tabs = Some(open_tabs);
        l.per_call = Some("1.00".parse().unwrap());
    })
}

fn tab_receiver(w: &World, cap: &str) -> Receiver {
    Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .origin(ORIGIN)
        .price(PricedCapability::fixed("GET", "/search", usd("0.05")))
        .price(PricedCapability::fixed("GET", "/report/{id}", usd("0.20")))
        .price(PricedCapability::fixed("GET", "/big", usd("0.90")))
        .tabs(TabTerms::new(usd(cap)).lanes(4))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap()
}

/// A store several receiver instances share (SQLite, on the world's clock).
async fn shop_store(w: &World, dir: &std::path::Path) -> Arc<dyn stipendex::KeyStore> {
    Arc::new(
        rail_core::keys::sql::SqliteKeyStore::open(&dir.join("shop.db"))
            .await
            .unwrap()
            .with_clock(Arc::new(w.clock.clone())),
    )
}

/// One instance of the shop on `store`, pricing `GET /search` (tabs to be set).
fn shop_instance(w: &World, store: &Arc<dyn stipendex::KeyStore>) -> stipendex::receiver::Builder {
    Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .store(store.clone())
        .origin(ORIGIN)
        .price(PricedCapability::fixed("GET", "/search", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
}

/// Offers, opens (wallet then receiver) a tab for `GET /search`.
async fn open(w: &World, r: &Receiver, wallet: &Wallet) -> TabHold {
    open_until(w, r, wallet).await.0
}

/// As [`open`], with the tab's end as the receiver opened it.
async fn open_until(w: &World, r: &Receiver, wallet: &Wallet) -> (TabHold, u64) {
    let sent = resource("/search", "first");
    let tab = r
        .offer_tab(&Request::from_resource(&sent))
        .await
        .unwrap()
        .expect("a tab is offered");
    let hold = wallet.open_tab(&tab, &sent).await.unwrap();
    let opened = r.open_tab(hold.proof().jws()).await.unwrap();
    assert!(opened.end <= tab.object().exp && opened.end > w.now());
    (hold, opened.end)
}

/// One call: the voucher, the receiver's check, the answer.
async fn call(r: &Receiver, wallet: &Wallet, hold: &TabHold, req: &Request) -> Signed<Voucher> {
    let v = wallet.voucher(hold, req).await.unwrap();
    match r.tab_call(req, v.voucher.jws()).await.unwrap() {
        TabCall::Run(serving) => {
            let body = format!("result of {}", req.name).into_bytes();
            wallet
                .tab_result(hold, &v.voucher, &Digest::of(&body))
                .await
                .unwrap();
            let result = Digest::of(&body);
            r.tab_answered(
                *serving,
                Answer {
                    status: 200,
                    content_type: None,
                    body,
                    receipt: None,
                    headers: Vec::new(),
                },
                &result,
            )
            .await;
        }
        TabCall::Answered { .. } | TabCall::Waived { .. } => {
            panic!("a new voucher was answered from the store")
        }
    }
    v.voucher.clone()
}

fn req(path: &str, q: &str) -> Request {
    Request::from_resource(&resource(path, q))
}

#[tokio::test]
async fn a_tab_captures_exactly_its_last_vouchers_and_gives_the_rest_back() {
    let w = world().await;
    let r = tab_receiver(&w, "1.00");
    let wallet = w.wallet(tab_mandate(&w, "1.50", 1), true);
    let (agent0, _) = w.balance(w.agent).await;
    let (shop0, _) = w.balance(w.shop).await;
    let hold = open(&w, &r, &wallet).await;
    // The cap is held on the ledger.
    assert_eq!(w.balance(w.agent).await.1, 100);

    for i in 0..5 {
        call(&r, &wallet, &hold, &req("/search", &i.to_string())).await;
    }
    let last = call(&r, &wallet, &hold, &req("/report/7", "x")).await;
    // The same voucher again: its kept answer, not a second charge.
    match r
        .tab_call(&req("/report/7", "x"), last.jws())
        .await
        .unwrap()
    {
        TabCall::Answered { answer, .. } => assert_eq!(answer.body, b"result of /report/7"),
        TabCall::Run(_) | TabCall::Waived { .. } => panic!("a voucher ran twice"),
    }
    assert_eq!(hold.spent().unwrap(), usd("0.45"));

    let close = wallet.close_request(&hold).unwrap();
    let receipt = r.close_tab(close.jws()).await.unwrap();
    let ro = receipt.object();
    assert_eq!(ro.captured, "0.45".parse().unwrap());
    assert_eq!(ro.calls, 6);
    // Closing again answers the same Receipt; the rail captured once.
    let again = r.close_tab(close.jws()).await.unwrap();
    assert_eq!(again.object().id, ro.id);
    wallet.tab_closed(&hold, receipt.jws()).await.unwrap();

    // The audit: the tab's chain, streamed, reproduces every call and the Receipt's root.
    let lines = w
        .journal
        .chain(&chain_name("search", &hold.tab().object().id));
    let anchor = w.principal.public();
    let chain = verify_tab_chain(lines.iter().map(String::as_str), Some(&anchor)).unwrap();
    assert!(chain.root_checked);
    assert_eq!((chain.vouchers, chain.spent), (6, "0.45".parse().unwrap()));
    let broken = |lines: Vec<String>| {
        verify_tab_chain(lines.iter().map(String::as_str), Some(&anchor))
            .unwrap_err()
            .to_string()
    };
    let is_voucher = |l: &String| stipendex::chain::claimed_kind(l).as_deref() == Some("voucher");
    // A missing voucher: a sequence gap in its lane (or a capture at a voucher not seen).
    let first_voucher = lines.iter().position(is_voucher).unwrap();
    let mut gap = lines.clone();
    gap.remove(first_voucher);
    let e = broken(gap);
    assert!(e.contains("voucher") || e.contains("tab-receipt"), "{e}");
    // A result that is not the one received: the root does not match.
    let mut other = lines.clone();
    let result = other.iter().position(|l| l.starts_with('{')).unwrap();
    other[result] = stipendex::chain::result_line(
        &Signed::<Voucher>::parse(&lines[result - 1])
            .unwrap()
            .digest()
            .clone(),
        &Digest::of(b"something else"),
    );
    assert!(broken(other).contains("root"));
    // A capture above the last vouchers, signed by the receiver: a broken link.
    let mut greedy = receipt.object().clone();
    greedy.lanes[0].cumulative = greedy.lanes[0]
        .cumulative
        .checked_add("0.05".parse().unwrap())
        .unwrap();
    greedy.captured = greedy
        .captured
        .checked_add("0.05".parse().unwrap())
        .unwrap();
    let greedy = Signed::sign(greedy, &w.receiver_key).unwrap();
    let mut taken = lines.clone();
    *taken.last_mut().unwrap() = greedy.jws().to_owned();
    assert!(broken(taken).contains("did not sign"));
    // Another principal's view: the mandate is not anchored there.
    let stranger = stipendex::envelope::SecretKey::generate().public();
    assert!(verify_tab_chain(lines.iter().map(String::as_str), Some(&stranger)).is_err());

    let (agent1, held) = w.balance(w.agent).await;
    let (shop1, _) = w.balance(w.shop).await;
    assert_eq!((agent0 - agent1, shop1 - shop0, held), (45, 45, 0));

    // The rest of the cap went back to the limits: a second tab of 1.00 fits the total of
    // 1.50 (0.45 spent), which it would not had the whole cap stayed counted.
    let hold2 = open(&w, &r, &wallet).await;
    call(&r, &wallet, &hold2, &req("/search", "again")).await;
}

#[tokio::test]
async fn vouchers_that_break_the_rules_are_refused_and_change_nothing() {
    let w = world().await;
    let r = tab_receiver(&w, "1.00");
    let wallet = w.wallet(tab_mandate(&w, "10.00", 2), true);
    let hold = open(&w, &r, &wallet).await;
    let first = call(&r, &wallet, &hold, &req("/search", "1")).await;

    let code = |e: stipendex::Error| e.code();
    // Another request than the voucher's.
    let v = wallet.voucher(&hold, &req("/search", "2")).await.unwrap();
    let e = r
        .tab_call(&req("/search", "3"), v.voucher.jws())
        .await
        .unwrap_err();
    assert_eq!(code(e), "mismatch");
    drop(v);
    let lane0 = first.object().lane;
    let mut old = first.object().clone();
    old.id = "v_other".into();
    let forged = Signed::sign(old, &w.wallet_key).unwrap();
    let e = r
        .tab_call(&req("/search", "1"), forged.jws())
        .await
        .unwrap_err();
    // Lane 0's last sequence with another voucher: equivocation, and the tab is closed.
    assert_eq!(code(e), "equivocation", "lane {lane0}");
    let e = r
        .tab_call(
            &req("/search", "4"),
            wallet
                .voucher(&hold, &req("/search", "4"))
                .await
                .unwrap()
                .voucher
                .jws(),
        )
        .await
        .unwrap_err();
    assert_eq!(code(e), "tab_closed");
    // Closed at once, capturing what the honest vouchers add up to.
    let receipt = r
        .close_tab(wallet.close_request(&hold).unwrap().jws())
        .await
        .unwrap();
    assert_eq!(receipt.object().captured, "0.05".parse().unwrap());
}

#[tokio::test]
async fn a_voucher_out_of_order_above_the_cap_or_mispriced_is_refused() {
    let w = world().await;
    let r = tab_receiver(&w, "1.00");
    let wallet = w.wallet(tab_mandate(&w, "10.00", 2), true);
    let (hold, end) = open_until(&w, &r, &wallet).await;
    let v1 = call(&r, &wallet, &hold, &req("/search", "1")).await;
    let sign = |edit: &dyn Fn(&mut Voucher)| {
        let mut v = v1.object().clone();
        v.id = stipendex::envelope::new_id("v_");
        edit(&mut v);
        Signed::sign(v, &w.wallet_key).unwrap()
    };
    let at = |q: &str| req("/search", q);
    let with_req = |v: &mut Voucher, q: &str| {
        let rq = at(q);
        v.request = rq.digest();
        v.resource = rq.resource().unwrap();
    };
    // A gap in the lane's sequence.
    let gap = sign(&|v| {
        with_req(v, "g");
        v.seq = 3;
        v.cumulative = "0.15".parse().unwrap();
    });
    assert_eq!(
        r.tab_call(&at("g"), gap.jws()).await.unwrap_err().code(),
        "voucher_out_of_order"
    );
    // The wrong price for the call.
    let cheap = sign(&|v| {
        with_req(v, "c");
        v.seq = 2;
        v.amount = "0.01".parse().unwrap();
        v.cumulative = "0.06".parse().unwrap();
    });
    assert_eq!(
        r.tab_call(&at("c"), cheap.jws()).await.unwrap_err().code(),
        "wrong_price"
    );
    // A cumulative that does not follow.
    let jump = sign(&|v| {
        with_req(v, "j");
        v.seq = 2;
        v.cumulative = "0.50".parse().unwrap();
    });
    assert_eq!(
        r.tab_call(&at("j"), jump.jws()).await.unwrap_err().code(),
        "bad_cumulative"
    );
    // Above the cap: the wallet refuses to sign it, and the receiver refuses it signed.
    call(&r, &wallet, &hold, &req("/big", "1")).await; // 0.95 of 1.00
    call(&r, &wallet, &hold, &req("/search", "fill")).await; // 1.00 of 1.00
    let e = wallet
        .voucher(&hold, &req("/search", "over"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "above_cap");
    let over2 = sign(&|v| {
        with_req(v, "p");
        v.lane = 3;
        v.seq = 1;
        v.amount = "0.05".parse().unwrap();
        v.cumulative = "0.05".parse().unwrap();
    });
    assert_eq!(
        r.tab_call(&at("p"), over2.jws()).await.unwrap_err().code(),
        "above_cap"
    );
    // Another wallet's voucher for the tab.
    let mut stranger = over2.object().clone();
    let thief = stipendex::envelope::SecretKey::generate();
    stranger.wallet = thief.public();
    let stranger = Signed::sign(stranger, &thief).unwrap();
    assert_eq!(
        r.tab_call(&at("p"), stranger.jws())
            .await
            .unwrap_err()
            .code(),
        "mismatch"
    );
    // After the tab's end nothing is accepted, and the receiver closes it by itself.
    assert!(r.close_due().await.unwrap().is_empty(), "not due yet");
    w.clock.advance(Duration::from_secs(end - w.now()));
    let late = wallet.voucher(&hold, &req("/search", "late")).await;
    assert!(late.is_err());
    let due = r.close_due().await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].object().captured, "1.00".parse().unwrap());
}

#[tokio::test]
async fn a_tab_relayed_from_another_origin_or_over_the_policy_is_not_opened() {
    let w = world().await;
    let r = tab_receiver(&w, "1.00");
    let wallet = w.wallet(tab_mandate(&w, "10.00", 1), true);
    let sent = resource("/search", "x");
    let tab: Signed<Tab> = r
        .offer_tab(&Request::from_resource(&sent))
        .await
        .unwrap()
        .unwrap();
    // Relayed: offered for a request to search.example, presented for one to evil.example.
    let relayed = Resource {
        origin: "https://evil.example".into(),
        ..sent.clone()
    };
    assert_eq!(
        wallet.open_tab(&tab, &relayed).await.unwrap_err().code(),
        "denied"
    );
    // A cap above the mandate's tab_cap.
    let big = tab_receiver(&w, "3.00");
    let tab3 = big
        .offer_tab(&Request::from_resource(&sent))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        wallet.open_tab(&tab3, &sent).await.unwrap_err().code(),
        "limit_exceeded"
    );
    // One open tab at most: a second is refused until the first closes.
    let hold = wallet.open_tab(&tab, &sent).await.unwrap();
    let tab_b = r
        .offer_tab(&Request::from_resource(&sent))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        wallet.open_tab(&tab_b, &sent).await.unwrap_err().code(),
        "limit_exceeded"
    );
    // Opening the same tab again holds nothing more.
    let same = wallet.open_tab(&tab, &sent).await.unwrap();
    assert_eq!(same.proof().digest(), hold.proof().digest());
    assert_eq!(w.balance(w.agent).await.1, 100);
    // The receiver opens it once; another Proof for it is refused.
    r.open_tab(hold.proof().jws()).await.unwrap();
    r.open_tab(hold.proof().jws()).await.unwrap();
    let receipt = r
        .close_tab(wallet.close_request(&hold).unwrap().jws())
        .await
        .unwrap();
    assert_eq!(
        receipt.object().captured,
        "0".parse().unwrap(),
        "no call: voided"
    );
    assert_eq!(w.balance(w.agent).await.1, 0);
    wallet.tab_closed(&hold, receipt.jws()).await.unwrap();
    let hold_b = wallet.open_tab(&tab_b, &sent).await.unwrap();
    r.open_tab(hold_b.proof().jws()).await.unwrap();
}

#[tokio::test]
async fn a_restarted_wallet_goes_on_from_its_persisted_lanes() {
    let w = world().await;
    let r = tab_receiver(&w, "1.00");
    let mandate = tab_mandate(&w, "10.00", 1);
    let wallet = w.wallet(mandate.clone(), true);
    let hold = open(&w, &r, &wallet).await;
    for i in 0..3 {
        call(&r, &wallet, &hold, &req("/search", &i.to_string())).await;
    }
    // A new wallet process on the same store finds the tab and its lanes where they were.
    let restarted = w.wallet(mandate, true);
    let again = restarted.tab(hold.tab()).await.unwrap();
    assert_eq!(again.spent().unwrap(), usd("0.15"));
    call(&r, &restarted, &again, &req("/search", "after")).await;
    let receipt = r
        .close_tab(restarted.close_request(&again).unwrap().jws())
        .await
        .unwrap();
    assert_eq!(receipt.object().captured, "0.20".parse().unwrap());
    restarted.tab_closed(&again, receipt.jws()).await.unwrap();
}

#[tokio::test]
async fn over_http_one_402_opens_a_tab_and_the_next_calls_go_straight_through() {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::Router;
    use axum::routing::get;
    use stipendex::http::{Binding, Client};

    let w = world().await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .origin(&base)
        .price(PricedCapability::fixed("GET", "/search", usd("0.05")))
        .tabs(TabTerms::new(usd("1.00")).lanes(4))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let (asked, paid_402) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (a, p) = (asked.clone(), paid_402.clone());
    let app = Binding::new(receiver)
        .unwrap()
        .apply(Router::new().route("/search", get(|| async { "results" })))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let (a, p) = (a.clone(), p.clone());
                async move {
                    a.fetch_add(1, Ordering::SeqCst);
                    let resp = next.run(req).await;
                    if resp.status() == axum::http::StatusCode::PAYMENT_REQUIRED {
                        p.fetch_add(1, Ordering::SeqCst);
                    }
                    resp
                }
            },
        ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mandate = w.mandate(|m| {
        pin(m, &base);
        m.limits[0].tab_cap = Some("1.00".parse().unwrap());
    });
    let client = Client::new(
        stipendex::http::reqwest_builder(Duration::from_secs(10)),
        w.wallet(mandate, true),
    )
    .unwrap();
    let (agent0, _) = w.balance(w.agent).await;
    for i in 0..5 {
        let resp = client.get(&format!("{base}/search?q={i}")).await.unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(&resp.body[..], b"results");
        let call = resp.tab_call.expect("paid inside the tab");
        assert_eq!(call.amount, usd("0.05"));
        assert_eq!(
            resp.headers
                .get("stipendex-tab-call")
                .unwrap()
                .to_str()
                .unwrap(),
            format!(
                "voucher={}; result={}",
                call.voucher.as_str(),
                call.result.as_str()
            )
        );
    }
    // One 402 (the first call), then every call straight through with its voucher.
    assert_eq!(paid_402.load(Ordering::SeqCst), 1);
    assert_eq!(asked.load(Ordering::SeqCst), 6);
    // The close endpoint: POST only, a bounded body, a signed request of the tab's wallet.
    let raw = stipendex::http::reqwest_client(Duration::from_secs(10)).unwrap();
    let close_url = format!("{base}{}", stipendex::http::TAB_CLOSE);
    assert_eq!(raw.get(&close_url).send().await.unwrap().status(), 405);
    let big = raw
        .post(&close_url)
        .body(vec![b'a'; 20_000])
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 413);
    let junk = raw.post(&close_url).body("not a jws").send().await.unwrap();
    assert_eq!(junk.status(), 400);
    let receipts = client.close_tabs().await.unwrap();
    assert_eq!(receipts.len(), 1);
    assert_eq!(receipts[0].object().captured, "0.25".parse().unwrap());
    assert_eq!(receipts[0].object().calls, 5);
    let (agent1, held) = w.balance(w.agent).await;
    assert_eq!((agent0 - agent1, held), (25, 0));
}

#[tokio::test]
async fn parallel_lanes_and_two_instances_never_lose_or_double_a_call() {
    let w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let store = shop_store(&w, dir.path()).await;
    let instance = || {
        shop_instance(&w, &store)
            .tabs(TabTerms::new(usd("20.00")).lanes(4))
            .build()
            .unwrap()
    };
    let (a, b) = (instance(), instance());
    let wallet = w.wallet(
        w.mandate(|m| {
            pin(m, ORIGIN);
            let l = &mut m.limits[0];
            l.tab_cap = Some("20.00".parse().unwrap());
            l.per_period = None;
        }),
        true,
    );
    let sent = resource("/search", "first");
    let tab = a
        .offer_tab(&Request::from_resource(&sent))
        .await
        .unwrap()
        .unwrap();
    let hold = wallet.open_tab(&tab, &sent).await.unwrap();
    a.open_tab(hold.proof().jws()).await.unwrap();
    // Eight agents over four lanes, alternating between the two instances; a voucher refused
    // as retryable (the other instance wrote the tab) is sent again as it is.
    let mut tasks = Vec::new();
    for agent in 0..8u32 {
        let (wallet, hold) = (wallet.clone(), hold.clone());
        let (a, b) = (a.clone(), b.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..15u32 {
                let rq = req("/search", &format!("{agent}-{i}"));
                let v = wallet.voucher(&hold, &rq).await.unwrap();
                let mut tries = 0;
                loop {
                    let r = if (agent + i + tries) % 2 == 0 { &a } else { &b };
                    match r.tab_call(&rq, v.voucher.jws()).await {
                        Ok(TabCall::Run(serving)) => {
                            r.tab_answered(
                                *serving,
                                Answer {
                                    status: 200,
                                    content_type: None,
                                    body: b"ok".to_vec(),
                                    receipt: None,
                                    headers: Vec::new(),
                                },
                                &Digest::of(b"ok"),
                            )
                            .await;
                            break;
                        }
                        Ok(TabCall::Answered { .. } | TabCall::Waived { .. }) => {
                            panic!("a new voucher was answered or waived")
                        }
                        Err(e) if e.code() == "in_progress" && tries < 50 => {
                            tries += 1;
                            tokio::task::yield_now().await;
                        }
                        Err(e) => panic!("agent {agent} call {i}: {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let receipt = b
        .close_tab(wallet.close_request(&hold).unwrap().jws())
        .await
        .unwrap();
    assert_eq!(receipt.object().calls, 120);
    assert_eq!(receipt.object().captured, "6.00".parse().unwrap());
    wallet.tab_closed(&hold, receipt.jws()).await.unwrap();
    // The other instance answers the same Receipt, and captures nothing more.
    let again = a
        .close_tab(wallet.close_request(&hold).unwrap().jws())
        .await
        .unwrap();
    assert_eq!(again.object().id, receipt.object().id);
}

#[tokio::test]
async fn a_receiver_that_stops_after_recording_a_voucher_answers_its_retry_without_a_second_charge()
{
    let w = world().await;
    let dir = tempfile::tempdir().unwrap();
    let store = shop_store(&w, dir.path()).await;
    let instance = || {
        shop_instance(&w, &store)
            .tabs(TabTerms::new(usd("1.00")).lanes(2))
            .claim_lease(Duration::from_secs(5))
            .build()
            .unwrap()
    };
    let wallet = w.wallet(tab_mandate(&w, "10.00", 1), true);
    let first = instance();
    let hold = open(&w, &first, &wallet).await;
    // The voucher is recorded, then the instance stops before its answer.
    let rq = req("/search", "lost");
    let v = wallet.voucher(&hold, &rq).await.unwrap();
    let TabCall::Run(serving) = first.tab_call(&rq, v.voucher.jws()).await.unwrap() else {
        panic!("a new voucher was answered");
    };
    drop(serving);
    drop(first);
    // Another instance: while the first might still run it, the retry is in progress; after
    // its lease, an idempotent call runs again (Delivery::Again) — the same voucher, no second
    // increment.
    let second = instance();
    assert_eq!(
        second
            .tab_call(&rq, v.voucher.jws())
            .await
            .unwrap_err()
            .code(),
        "in_progress"
    );
    w.clock.advance(Duration::from_secs(6));
    match second.tab_call(&rq, v.voucher.jws()).await.unwrap() {
        TabCall::Run(s) => {
            assert_eq!(s.delivery, stipendex::receiver::Delivery::Again);
            second
                .tab_answered(
                    *s,
                    Answer {
                        status: 200,
                        content_type: None,
                        body: b"again".to_vec(),
                        receipt: None,
                        headers: Vec::new(),
                    },
                    &Digest::of(b"again"),
                )
                .await;
        }
        TabCall::Answered { .. } | TabCall::Waived { .. } => {
            panic!("the lost call had no answer to replay")
        }
    }
    drop(v);
    let receipt = second
        .close_tab(wallet.close_request(&hold).unwrap().jws())
        .await
        .unwrap();
    assert_eq!(
        (receipt.object().calls, receipt.object().captured),
        (1, "0.05".parse().unwrap())
    );
    // A receipt capturing above the wallet's vouchers is refused by the wallet, which gives
    // nothing back for it.
    let mut greedy = receipt.object().clone();
    greedy.lanes[0].cumulative = "0.10".parse().unwrap();
    greedy.captured = "0.10".parse().unwrap();
    let greedy = Signed::sign(greedy, &w.receiver_key).unwrap();
    assert_eq!(
        wallet
            .tab_closed(&hold, greedy.jws())
            .await
            .unwrap_err()
            .code(),
        "capture_above"
    );
    wallet.tab_closed(&hold, receipt.jws()).await.unwrap();
}

#[tokio::test]
async fn a_voucher_for_another_tab_is_refused_and_two_wallet_instances_never_pass_the_total() {
    let w = world().await;
    let r = tab_receiver(&w, "1.00");
    // A total that fits one tab of 1.00, not two: two wallet instances on one mandate and one
    // store open tabs at once.
    let mandate = tab_mandate(&w, "1.50", 2);
    let (one, two) = (w.wallet(mandate.clone(), true), w.wallet(mandate, true));
    let sent = resource("/search", "x");
    let t1 = r
        .offer_tab(&Request::from_resource(&sent))
        .await
        .unwrap()
        .unwrap();
    let t2 = r
        .offer_tab(&Request::from_resource(&sent))
        .await
        .unwrap()
        .unwrap();
    let (a, b) = tokio::join!(one.open_tab(&t1, &sent), two.open_tab(&t2, &sent));
    let opened: Vec<_> = [a, b].into_iter().filter_map(Result::ok).collect();
    assert_eq!(opened.len(), 1, "both instances held a tab above the total");
    assert_eq!(w.balance(w.agent).await.1, 100);
    // The open tab's voucher presented as another tab's (its digest names the first).
    let hold = &opened[0];
    r.open_tab(hold.proof().jws()).await.unwrap();
    let v = one.voucher(hold, &req("/search", "1")).await.unwrap();
    let mut other = v.voucher.object().clone();
    let other_tab = if hold.tab().object().id == t1.object().id {
        &t2
    } else {
        &t1
    };
    other.tab = other_tab.object().id.clone();
    let other = Signed::sign(other, &w.wallet_key).unwrap();
    assert_eq!(
        r.tab_call(&req("/search", "1"), other.jws())
            .await
            .unwrap_err()
            .code(),
        "tab_closed",
        "a tab that was never opened here"
    );
    // Vouchers naming tabs that were never opened here, each signed by a key of its own: refused,
    // and nothing of them kept.
    let cached = r.tabs_cached();
    for _ in 0..50 {
        let mut made_up = v.voucher.object().clone();
        made_up.tab = stipendex::envelope::new_id("t_");
        let k = stipendex::envelope::SecretKey::generate();
        made_up.wallet = k.public();
        let made_up = Signed::sign(made_up, &k).unwrap();
        assert_eq!(
            r.tab_call(&req("/search", "1"), made_up.jws())
                .await
                .unwrap_err()
                .code(),
            "tab_closed"
        );
    }
    assert_eq!(r.tabs_cached(), cached);
    let mut wrong_digest = v.voucher.object().clone();
    wrong_digest.tab_digest = other_tab.digest().clone();
    let wrong_digest = Signed::sign(wrong_digest, &w.wallet_key).unwrap();
    assert_eq!(
        r.tab_call(&req("/search", "1"), wrong_digest.jws())
            .await
            .unwrap_err()
            .code(),
        "mismatch"
    );
}

/// Issue 44: the price hook runs for every call inside a tab, as for every priced request: a
/// refusal takes nothing (`rejected`), a waiver runs the call free, a price other than the
/// tab's is `wrong_price`; the wallet gives back the lane of a voucher the receiver did not
/// count, and the chain verifies.
#[tokio::test]
async fn the_price_hook_runs_for_every_call_inside_a_tab() {
    use stipendex::receiver::{Decision, Price};
    let w = world().await;
    let r = Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .origin(ORIGIN)
        .price(PricedCapability::fixed("GET", "/search", usd("0.05")))
        .resolve_price(Arc::new(|cap: &PricedCapability, req: &Request| match req
            .params
            .get("q")
            .and_then(|q| q.as_str())
        {
            Some("blocked") => Decision::reject("not for you"),
            Some("free") => Decision::Waive,
            Some("dear") => Decision::quote(Price::Fixed(usd("0.40"))),
            _ => Decision::quote(cap.price.clone()),
        }))
        .tabs(TabTerms::new(usd("1.00")).lanes(1))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let wallet = w.wallet(tab_mandate(&w, "1.50", 1), true);
    let hold = open(&w, &r, &wallet).await;
    call(&r, &wallet, &hold, &req("/search", "a")).await;
    // Refused by the hook: not counted; the wallet gives the lane back.
    let v = wallet
        .voucher(&hold, &req("/search", "blocked"))
        .await
        .unwrap();
    let e = r
        .tab_call(&req("/search", "blocked"), v.voucher.jws())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "rejected", "{e}");
    wallet.voucher_uncounted(&v).await.unwrap();
    drop(v);
    // Waived by the hook: run free, not counted.
    let v = wallet
        .voucher(&hold, &req("/search", "free"))
        .await
        .unwrap();
    match r
        .tab_call(&req("/search", "free"), v.voucher.jws())
        .await
        .unwrap()
    {
        TabCall::Waived { voucher } => assert_eq!(&voucher, v.voucher.digest()),
        other => panic!("not waived: {other:?}"),
    }
    wallet.voucher_uncounted(&v).await.unwrap();
    drop(v);
    // Priced otherwise by the hook: refused; no tab is offered beside its Quote either.
    let v = wallet
        .voucher(&hold, &req("/search", "dear"))
        .await
        .unwrap();
    let e = r
        .tab_call(&req("/search", "dear"), v.voucher.jws())
        .await
        .unwrap_err();
    assert_eq!(e.code(), "wrong_price", "{e}");
    wallet.voucher_uncounted(&v).await.unwrap();
    drop(v);
    let dear = req("/search", "dear");
    let q = common::quote(&r, &dear).await;
    assert!(r.offer_tab_beside(&dear, &q).await.unwrap().is_none());
    let listed = req("/search", "z");
    let q = common::quote(&r, &listed).await;
    assert!(r.offer_tab_beside(&listed, &q).await.unwrap().is_some());
    // The lane went back each time: the next voucher carries sequence 2.
    let last = call(&r, &wallet, &hold, &req("/search", "b")).await;
    assert_eq!(last.object().seq, 2);
    let receipt = r
        .close_tab(wallet.close_request(&hold).unwrap().jws())
        .await
        .unwrap();
    assert_eq!(
        (receipt.object().calls, receipt.object().captured),
        (2, "0.10".parse().unwrap())
    );
    wallet.tab_closed(&hold, receipt.jws()).await.unwrap();
    let lines = w
        .journal
        .chain(&chain_name("search", &hold.tab().object().id));
    assert_eq!(
        lines.iter().filter(|l| l.contains("tab_uncounted")).count(),
        3
    );
    let chain = verify_tab_chain(
        lines.iter().map(String::as_str),
        Some(&w.principal.public()),
    )
    .unwrap();
    assert!(chain.root_checked);
    assert_eq!((chain.vouchers, chain.spent), (2, "0.10".parse().unwrap()));
}

/// Issue 44: a refused tab opening (a bogus hold, another wallet's key, a made-up tab) leaves
/// nothing behind at the receiver, however many come.
#[tokio::test]
async fn refused_tab_openings_leave_nothing_behind() {
    let w = world().await;
    let r = tab_receiver(&w, "1.00");
    let wallet = w.wallet(tab_mandate(&w, "5.00", 1), true);
    // One real hold, of a tab the receiver never opens: its Proof is the template.
    let sent = resource("/search", "first");
    let tab = r
        .offer_tab(&Request::from_resource(&sent))
        .await
        .unwrap()
        .unwrap();
    let hold = wallet.open_tab(&tab, &sent).await.unwrap();
    let mut forged_vouchers = Vec::new();
    for _ in 0..300 {
        // A fresh tab from a 402, sent back with a throwaway key and another tab's hold.
        let fresh = r
            .offer_tab(&Request::from_resource(&sent))
            .await
            .unwrap()
            .unwrap();
        let mut p = hold.proof().object().clone();
        let key = stipendex::envelope::SecretKey::generate();
        p.id = stipendex::envelope::new_id("p_");
        p.wallet = key.public();
        p.tab = Some(fresh.digest().clone());
        p.tab_jws = Some(fresh.jws().to_owned());
        let forged = Signed::sign(p, &key).unwrap();
        assert!(r.open_tab(forged.jws()).await.is_err());
        // A voucher for it, too.
        let v = stipendex::envelope::Voucher {
            stipendex: stipendex::envelope::Tag::current("voucher"),
            id: stipendex::envelope::new_id("v_"),
            wallet: key.public(),
            tab: fresh.object().id.clone(),
            tab_digest: fresh.digest().clone(),
            lane: 0,
            seq: 1,
            asset: stipendex::Asset::usd(),
            amount: "0.05".parse().unwrap(),
            cumulative: "0.05".parse().unwrap(),
            resource: sent.clone(),
            request: Request::from_resource(&sent).digest(),
            iat: w.now(),
        };
        forged_vouchers.push(Signed::sign(v, &key).unwrap());
    }
    assert_eq!(r.tabs_cached(), 0, "nothing kept of a refused opening");
    for v in &forged_vouchers {
        assert!(
            r.tab_call(&Request::from_resource(&sent), v.jws())
                .await
                .is_err()
        );
    }
    assert_eq!(
        r.tabs_cached(),
        0,
        "nothing kept of a voucher for an unopened tab"
    );
    // And the keeper drops what a request in flight had left.
    r.close_due().await.unwrap();
    assert_eq!(r.tabs_cached(), 0);
}

/// Issue 44: no voucher is signed once the mandate has ended (revoked or expired), whatever is
/// left of the tab; and `verify-chain` refuses a voucher dated outside its mandate.
#[tokio::test]
async fn no_voucher_after_the_mandate_ends() {
    let w = world().await;
    let r = tab_receiver(&w, "1.00");
    // Revoked.
    let mandate = tab_mandate(&w, "1.50", 1);
    let wallet = w.wallet(mandate.clone(), true);
    let hold = open(&w, &r, &wallet).await;
    call(&r, &wallet, &hold, &req("/search", "a")).await;
    let revocation = stipendex::wallet::revoke(&mandate, &w.principal, w.now()).unwrap();
    stipendex::wallet::Revocations::new(w.store.clone())
        .record(&revocation)
        .await
        .unwrap();
    let e = wallet
        .voucher(&hold, &req("/search", "b"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "revoked", "{e}");
    // Closing is still allowed: it gives money back.
    let receipt = r
        .close_tab(wallet.close_request(&hold).unwrap().jws())
        .await
        .unwrap();
    wallet.tab_closed(&hold, receipt.jws()).await.unwrap();

    // Expired: a mandate of ten minutes, a tab of an hour.
    let w = world().await;
    let r = tab_receiver(&w, "1.00");
    let mandate = w.mandate(|m| {
        pin(m, ORIGIN);
        m.exp = m.nbf + 600;
        let l = &mut m.limits[0];
        l.tab_cap = Some("2.00".parse().unwrap());
        l.open_tabs = Some(1);
    });
    let wallet = w.wallet(mandate, true);
    let hold = open(&w, &r, &wallet).await;
    let first = call(&r, &wallet, &hold, &req("/search", "a")).await;
    w.clock.advance(Duration::from_secs(700));
    let e = wallet
        .voucher(&hold, &req("/search", "b"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "expired", "{e}");
    assert!(e.to_string().contains("mandate"), "{e}");
    // A voucher signed after the mandate's end (by a wallet that did not check) breaks the
    // chain.
    let mut late = first.object().clone();
    late.id = stipendex::envelope::new_id("v_");
    late.seq = 2;
    late.cumulative = "0.10".parse().unwrap();
    late.iat = w.now();
    let late = Signed::sign(late, &w.wallet_key).unwrap();
    let mut lines = w
        .journal
        .chain(&chain_name("search", &hold.tab().object().id));
    lines.push(late.jws().to_owned());
    let e = verify_tab_chain(
        lines.iter().map(String::as_str),
        Some(&w.principal.public()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("mandate's validity"), "{e}");
}
