//! The HTTP binding: one route payable by a Stipendex wallet (Quote in the 402 body,
//! `Stipendex-Payment`, `Stipendex-Receipt`) and by a plain x402 client (`PAYMENT-REQUIRED`,
//! `PAYMENT-SIGNATURE`) — the x402 side on the in-memory EIP-3009 token.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::sync::Arc;

use alloy_primitives::{Address, U256};
use axum::Router;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use common::{pin, usd, world};
use rail_x402::client::EvmFetched;
use rail_x402::evm::LocalSigner;
use rail_x402::payer::{Policy as EvmPolicy, X402Payer};
use rail_x402::{ExactEvm, Token};
use stipendex::http::{Binding, Client, FinalAmount};
use stipendex::receiver::{PricedCapability, Receiver};
use x402_devnet::DevnetFacilitator;
use x402_transport::paywall::Paywall;
use x402_transport::{Accepts, Scheme};

const NET: &str = "eip155:84532";

/// The wallet's HTTP client (redirects are the client's business: it turns them off).
fn client(wallet: stipendex::wallet::Wallet) -> Client {
    Client::new(
        rail_x402::rpc::http_builder(std::time::Duration::from_secs(10)),
        wallet,
    )
    .unwrap()
}

/// A plain HTTP client (no wallet), with the workspace's TLS provider installed.
fn raw_client() -> reqwest::Client {
    stipendex::http::reqwest_client(std::time::Duration::from_secs(10)).unwrap()
}

/// An x402 `exact` route on EVM for `GET /api/search` at 0.05 USDC, paid to `pay_to`: the
/// devnet facilitator, its token, and a payer key minted 1.00 USDC.
struct EvmRoute {
    mock: Arc<DevnetFacilitator>,
    token: Token,
    key: LocalSigner,
    paywall: Paywall,
}

fn evm_search_route(pay_to: Address) -> EvmRoute {
    evm_search_route_funded(pay_to, 1_000_000)
}

/// [`evm_search_route`] with the payer minted `funded` atomic units.
fn evm_search_route_funded(pay_to: Address, funded: u64) -> EvmRoute {
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let token = Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2");
    let key = LocalSigner::random();
    mock.mint(token.address, key.address(), U256::from(funded))
        .unwrap();
    let evm: Arc<dyn Scheme> = Arc::new(ExactEvm::new(mock.clone(), token.clone(), pay_to));
    let paywall = Paywall::new().route(
        "/api/search",
        "one search",
        Accepts::one(evm, 50_000).unwrap(),
    );
    EvmRoute {
        mock,
        token,
        key,
        paywall,
    }
}

/// A listener on loopback and its origin.
async fn listen() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    (listener, base)
}

#[tokio::test]
async fn a_stipendex_wallet_and_a_plain_x402_client_pay_the_same_route() {
    let w = world().await;
    // The x402 side of the route: exact on EVM, 0.05 USDC.
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let token = Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2");
    let evm_pay_to = Address::repeat_byte(0x22);
    let evm_key = LocalSigner::random();
    mock.mint(token.address, evm_key.address(), U256::from(1_000_000))
        .unwrap();
    let evm: Arc<dyn Scheme> = Arc::new(ExactEvm::new(mock.clone(), token.clone(), evm_pay_to));
    let paywall = Paywall::new().route(
        "/api/search",
        "one search",
        Accepts::one(evm, 50_000).unwrap(),
    );

    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")).describe("one search"))
        .price(PricedCapability::estimate(
            "POST",
            "/api/order",
            usd("3.00"),
            "0.50".parse().unwrap(),
        ))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let binding = Binding::new(receiver).unwrap().with_x402(paywall).unwrap();
    let app = binding.apply(
        Router::new()
            .route("/api/search", get(|| async { "results" }))
            .route(
                "/api/order",
                post(|| async {
                    let mut r = "order 42".into_response();
                    r.extensions_mut().insert(FinalAmount(usd("3.20")));
                    r
                }),
            )
            .route("/free", get(|| async { "free" })),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = rail_x402::rpc::http_client(std::time::Duration::from_secs(10)).unwrap();

    // The unpaid 402 speaks both: a Quote in the body, x402 v2 in the header and the body.
    let unpaid = http
        .get(format!("{base}/api/search?q=rust"))
        .send()
        .await
        .unwrap();
    assert_eq!(unpaid.status(), 402);
    assert!(unpaid.headers().contains_key("payment-required"));
    let body: serde_json::Value = unpaid.json().await.unwrap();
    assert_eq!(body["quote"]["stipendex"], "quote/0.1");
    assert_eq!(body["x402Version"], 2);
    assert_eq!(body["accepts"][0]["scheme"], "exact");

    // The descriptor.
    let d: serde_json::Value = http
        .get(format!("{base}/.well-known/stipendex.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(d["id"], "search");
    assert_eq!(d["key"], w.receiver_key.public().to_string());
    assert_eq!(d["profiles"], serde_json::json!(["service", "checkout"]));

    // A Stipendex wallet pays it.
    let client = client(w.wallet(w.mandate(|m| pin(m, &base)), true));
    let r = client
        .get(&format!("{base}/api/search?q=rust"))
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"results");
    let receipt = r.receipt.expect("a receipt");
    assert_eq!(receipt.object().amount, "0.05".parse().unwrap());

    // The same proof again (the answer lost on the way) gets the same answer, not a second run.
    let proof = r.paid.unwrap().proof.to_header();
    let replay = http
        .get(format!("{base}/api/search?q=rust"))
        .header("stipendex-payment", &proof)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 200);
    assert_eq!(
        replay.headers()["stipendex-receipt"].to_str().unwrap(),
        receipt.to_header()
    );
    // …and for another request it is refused as a mismatch before anything is verified,
    // with a fresh quote.
    let other = http
        .get(format!("{base}/api/search?q=other"))
        .header("stipendex-payment", &proof)
        .send()
        .await
        .unwrap();
    let body: serde_json::Value = other.json().await.unwrap();
    assert_eq!(body["error"], "mismatch", "{body}");
    assert!(body["quote"]["jws"].is_string());

    // A plain x402 client pays the same route, with its own scheme.
    let x402 = rail_x402::client::client(X402Payer::new(
        evm_key,
        EvmPolicy::new(NET, token.address, U256::from(100_000)),
    ))
    .unwrap();
    let paid = EvmFetched::from(
        x402.get(&format!("{base}/api/search?q=rust"))
            .await
            .unwrap(),
    );
    assert_eq!(paid.status, 200);
    assert!(paid.settlement.expect("a PAYMENT-RESPONSE").success);
    assert_eq!(
        mock.balance(token.address, evm_pay_to).unwrap(),
        U256::from(50_000)
    );

    // A checkout: held, confirmed by the human, captured for the handler's final amount.
    let r = client.post(&format!("{base}/api/order")).await.unwrap();
    assert_eq!(r.status, 200, "{:?}", r.body);
    let paid = r.paid.unwrap();
    assert!(paid.confirmation.is_some());
    assert_eq!(r.receipt.unwrap().object().amount, "3.2".parse().unwrap());

    // Free routes pass untouched.
    let free = client.get(&format!("{base}/free")).await.unwrap();
    assert_eq!((free.status.as_u16(), free.paid.is_none()), (200, true));
}

#[tokio::test]
async fn the_wallet_pays_a_plain_x402_route_under_its_mandate() {
    use stipendex::envelope::{Allow, Limits};
    let w = world().await;
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let token = Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2");
    let pay_to = Address::repeat_byte(0x33);
    let evm_key = LocalSigner::random();
    mock.mint(token.address, evm_key.address(), U256::from(10_000_000))
        .unwrap();
    let evm: Arc<dyn Scheme> = Arc::new(ExactEvm::new(mock.clone(), token.clone(), pay_to));
    let paywall = Paywall::new()
        .route(
            "/weather",
            "the weather",
            Accepts::one(evm.clone(), 20_000).unwrap(),
        )
        .route(
            "/forecast",
            "a forecast",
            Accepts::one(evm, 900_000).unwrap(),
        );
    let app = paywall.apply(
        Router::new()
            .route("/weather", get(|| async { "sunny" }))
            .route("/forecast", get(|| async { "rain" })),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let usdc = stipendex::Asset::usdc();
    let payer = Arc::new(X402Payer::new(
        evm_key,
        EvmPolicy::new(NET, token.address, U256::from(1_000_000)),
    ));
    let wallet_for = |allow: bool| {
        let mandate = w.mandate(|m| {
            m.limits.push(Limits {
                asset: usdc.clone(),
                per_call: Some("0.50".parse().unwrap()),
                per_period: None,
                total: Some("5.00".parse().unwrap()),
                per_receiver: None,
                confirm_above: Some("0.10".parse().unwrap()),
                tab_cap: None,
                open_tabs: None,
            });
            if allow {
                m.allow.push(Allow::X402Http {
                    origin: base.clone(),
                    pay_to: format!("{pay_to:#x}").to_uppercase().replace("0X", "0x"),
                });
            }
        });
        stipendex::wallet::Wallet::builder(w.wallet_key.clone(), mandate)
            .store(w.store.clone())
            .scheme_payer(payer.clone())
            .journal(w.journal.clone())
            .build()
            .unwrap()
    };

    // Allowlisted by origin and payTo (an EVM address compares without case): paid.
    let client = client(wallet_for(true));
    let r = client.get(&format!("{base}/weather")).await.unwrap();
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"sunny"[..]));
    let paid = r.x402.expect("an x402 payment");
    assert_eq!(
        paid.amount,
        stipendex::Money::parse(usdc.clone(), "0.02").unwrap()
    );
    assert_eq!(paid.header, "payment-signature");
    assert_eq!(r.settlement.unwrap()["success"], true);
    assert_eq!(
        mock.balance(token.address, pay_to).unwrap(),
        U256::from(20_000)
    );
    // Its audit chain: mandate -> proof (the challenge as seen), verified offline.
    let name = stipendex::wallet::chain_name(&base, &paid.proof.object().id);
    let chain = w.journal.chain(&name);
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    let c = stipendex::chain::verify_chain(&refs, Some(&w.principal.public())).unwrap();
    assert!(c.quote.is_none() && c.proof.object().challenge.is_some());
    // A challenge proof whose recorded entry asks another amount, or whose payTo is not the
    // entry's, breaks the chain at the proof (issue 24).
    let forge = |edit: &dyn Fn(&mut stipendex::envelope::Challenge)| {
        let mut p = c.proof.object().clone();
        edit(p.challenge.as_mut().unwrap());
        let forged = stipendex::envelope::Signed::sign(p, &w.wallet_key).unwrap();
        let objects = [refs[0], forged.jws()];
        stipendex::chain::verify_chain(&objects, Some(&w.principal.public()))
            .map(|_| ())
            .map_err(|e| match e {
                stipendex::Error::Broken { link, .. } => link.to_owned(),
                e => e.to_string(),
            })
    };
    for edit in [
        &(|ch: &mut stipendex::envelope::Challenge| ch.entry["amount"] = "1".into())
            as &dyn Fn(&mut stipendex::envelope::Challenge),
        &|ch: &mut stipendex::envelope::Challenge| {
            ch.entry["payTo"] = ch.pay_to.to_lowercase().replace('3', "4").into();
        },
    ] {
        assert_eq!(
            forge(edit),
            Err("proof".to_owned()),
            "a forged challenge proof"
        );
    }

    // Above the per-call limit: refused, nothing signed.
    let err = client.get(&format!("{base}/forecast")).await.unwrap_err();
    assert_eq!(err.code(), "limit_exceeded", "{err}");

    // Not allowlisted: denied.
    let client = self::client(wallet_for(false));
    let err = client.get(&format!("{base}/weather")).await.unwrap_err();
    assert_eq!(err.code(), "denied", "{err}");
    assert_eq!(
        mock.balance(token.address, pay_to).unwrap(),
        U256::from(20_000)
    );

    // A v1-only server (issue 24): its 402 is a v1 body (`maxAmountRequired`, a network
    // name) and no PAYMENT-REQUIRED header. The wallet judges the v1 entry as its v2
    // equivalent under the same mandate and pays it as v1 (`X-PAYMENT`).
    let evm_v1: Arc<dyn Scheme> = Arc::new(
        ExactEvm::new(mock.clone(), token.clone(), pay_to)
            .accept_v1(None)
            .unwrap(),
    );
    let v1_app = Paywall::new()
        .route(
            "/old",
            "an old route",
            Accepts::one(evm_v1, 10_000).unwrap(),
        )
        .apply(Router::new().route("/old", get(|| async { "old" })))
        .layer(axum::middleware::map_response(
            |mut r: axum::response::Response| async move {
                r.headers_mut().remove("payment-required");
                r
            },
        ));
    let (listener, v1_base) = listen().await;
    tokio::spawn(async move { axum::serve(listener, v1_app).await.unwrap() });
    let unpaid = raw_client()
        .get(format!("{v1_base}/old"))
        .send()
        .await
        .unwrap();
    assert!(!unpaid.headers().contains_key("payment-required"));
    let body: serde_json::Value = unpaid.json().await.unwrap();
    assert_eq!(body["x402Version"], 1, "{body}");
    let mandate = w.mandate(|m| {
        m.limits.push(Limits {
            asset: usdc.clone(),
            per_call: Some("0.50".parse().unwrap()),
            per_period: None,
            total: Some("5.00".parse().unwrap()),
            per_receiver: None,
            confirm_above: None,
            tab_cap: None,
            open_tabs: None,
        });
        m.allow.push(Allow::X402Http {
            origin: v1_base.clone(),
            pay_to: format!("{pay_to:#x}"),
        });
    });
    let v1_wallet = stipendex::wallet::Wallet::builder(w.wallet_key.clone(), mandate)
        .store(w.store.clone())
        .scheme_payer(payer.clone())
        .journal(w.journal.clone())
        .build()
        .unwrap();
    let r = self::client(v1_wallet)
        .get(&format!("{v1_base}/old"))
        .await
        .unwrap();
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"old"[..]));
    let paid = r.x402.expect("an x402 v1 payment");
    assert_eq!(paid.header, "x-payment");
    assert_eq!(
        paid.amount,
        stipendex::Money::parse(usdc.clone(), "0.01").unwrap()
    );
    assert_eq!(
        mock.balance(token.address, pay_to).unwrap(),
        U256::from(30_000)
    );
    let name = stipendex::wallet::chain_name(&v1_base, &paid.proof.object().id);
    let chain = w.journal.chain(&name);
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    stipendex::chain::verify_chain(&refs, Some(&w.principal.public())).unwrap();
}

/// A paid retry that gets no verdict (a 503, as a proxy or a restarting server answers) is
/// sent again as the same payment by the x402 client the wallet pays through: one signature,
/// one charge, the content served — never a second payment for one request.
#[tokio::test]
async fn the_wallet_resends_the_same_x402_payment_when_its_outcome_is_unknown() {
    use std::sync::Mutex;
    use stipendex::envelope::{Allow, Limits};
    let w = world().await;
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let token = Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2");
    let pay_to = Address::repeat_byte(0x44);
    let evm_key = LocalSigner::random();
    mock.mint(token.address, evm_key.address(), U256::from(1_000_000))
        .unwrap();
    let evm = ExactEvm::new(mock.clone(), token.clone(), pay_to);
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let app = evm
        .paywall(&[("/weather", 20_000, "the weather")])
        .unwrap()
        .apply(Router::new().route("/weather", get(|| async { "sunny" })))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let record = record.clone();
                async move {
                    let presented = req
                        .headers()
                        .get("payment-signature")
                        .map(|v| v.to_str().unwrap().to_owned());
                    if let Some(p) = presented {
                        let first = {
                            let mut seen = record.lock().unwrap();
                            seen.push(p);
                            seen.len() == 1
                        };
                        if first {
                            // Lost on the way: the server never saw it; the client cannot know.
                            return (axum::http::StatusCode::SERVICE_UNAVAILABLE, "try again")
                                .into_response();
                        }
                    }
                    next.run(req).await
                }
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mandate = w.mandate(|m| {
        m.limits.push(Limits {
            asset: stipendex::Asset::usdc(),
            per_call: Some("0.50".parse().unwrap()),
            per_period: None,
            total: Some("5.00".parse().unwrap()),
            per_receiver: None,
            confirm_above: None,
            tab_cap: None,
            open_tabs: None,
        });
        m.allow.push(Allow::X402Http {
            origin: base.clone(),
            pay_to: format!("{pay_to:#x}"),
        });
    });
    let wallet = stipendex::wallet::Wallet::builder(w.wallet_key.clone(), mandate)
        .store(w.store.clone())
        .scheme_payer(Arc::new(X402Payer::new(
            evm_key.clone(),
            EvmPolicy::new(NET, token.address, U256::from(1_000_000)),
        )))
        .journal(w.journal.clone())
        .build()
        .unwrap();
    let r = client(wallet)
        .get(&format!("{base}/weather"))
        .await
        .unwrap();
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"sunny"[..]));
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "presented once, then once again");
    assert_eq!(seen[0], seen[1], "the same payment, not a second one");
    assert_eq!(
        mock.balance(token.address, pay_to).unwrap(),
        U256::from(20_000)
    );
    assert_eq!(
        mock.balance(token.address, evm_key.address()).unwrap(),
        U256::from(980_000),
        "one charge"
    );
}

/// A 402 whose body is larger than any payment requirement is refused before it is all read
/// (before any Quote or requirement in it is looked at), and the wallet says why.
#[tokio::test]
async fn an_oversized_402_is_refused_unread_and_unpaid() {
    let w = world().await;
    let app = Router::new().route(
        "/big",
        get(|| async {
            (
                axum::http::StatusCode::PAYMENT_REQUIRED,
                "x".repeat(x402_transport::client::MAX_402_BODY + 1),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = client(w.wallet(w.mandate(|_| {}), true));
    let err = client.get(&format!("{base}/big")).await.unwrap_err();
    assert_eq!(err.code(), "malformed", "{err}");
    assert!(err.to_string().contains("over"), "{err}");
}

/// A relaying server (`evil`) that answers every request with the 402 it gets itself from
/// `target` (its own query, its own request), and records any payment header it is sent.
async fn relay(target: String) -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    let seen: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let app = Router::new().fallback(move |req: axum::extract::Request| {
        let (target, record) = (target.clone(), record.clone());
        async move {
            for h in ["stipendex-payment", "payment-signature", "x-payment"] {
                if let Some(v) = req.headers().get(h) {
                    record.lock().unwrap().push(v.to_str().unwrap().to_owned());
                }
            }
            let got = raw_client().get(&target).send().await.unwrap();
            let status = axum::http::StatusCode::from_u16(got.status().as_u16()).unwrap();
            (status, got.bytes().await.unwrap()).into_response()
        }
    });
    let (listener, base) = listen().await;
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, seen)
}

/// The receiver `search` at its own origin, pricing `GET /api/search` (and `GET /api/posts/{id}`).
async fn search_receiver(w: &common::World) -> String {
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let app = Binding::new(receiver)
        .unwrap()
        .apply(Router::new().route("/api/search", get(|| async { "results" })));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// Confused deputy (issue 23): a Quote that `evil` got from an allowlisted receiver for its
/// own query, relayed to the agent, is refused — at evil's origin, behind a backslash URL that
/// a naive split reads as the receiver's, and for another request at the right origin. The
/// wallet's entry without origins is not payable over HTTP. Nothing is paid, nothing reaches
/// evil, nothing is journalled; each denial is escalated.
#[tokio::test]
async fn a_quote_relayed_from_another_request_is_refused() {
    use std::sync::atomic::Ordering;
    let w = world().await;
    let search = search_receiver(&w).await;
    let (evil, seen) = relay(format!("{search}/api/search?q=evil")).await;
    let wallet = w.wallet(w.mandate(|m| pin(m, &search)), true);
    let client = client(wallet.clone());
    let search_host = search.trim_start_matches("http://");
    for url in [
        format!("{evil}/x"),
        format!("{evil}/api/search?q=evil"),
        format!("{evil}\\@{search_host}/api/search?q=evil"),
    ] {
        let err = client.get(&url).await.unwrap_err();
        assert_eq!(err.code(), "denied", "{url}: {err}");
        assert!(err.to_string().contains("not allowlisted at"), "{err}");
    }
    assert_eq!(w.denied.load(Ordering::SeqCst), 3);

    // At the receiver's own origin, a quote issued for another query is not paid either.
    let quote = |url: String| async move {
        let body: serde_json::Value = raw_client()
            .get(url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        serde_json::from_value::<stipendex::envelope::Signed<stipendex::envelope::Quote>>(
            body["quote"].clone(),
        )
        .unwrap()
    };
    let q = quote(format!("{search}/api/search?q=evil")).await;
    let r = q
        .object()
        .resource
        .clone()
        .expect("the quote names its resource");
    assert_eq!(
        (r.origin.as_str(), r.method.as_str(), r.path.as_str()),
        (search.as_str(), "GET", "/api/search")
    );
    assert_eq!(r.query.as_deref(), Some("q=evil"));
    let mine = stipendex::envelope::Resource {
        query: Some("q=mine".into()),
        ..r.clone()
    };
    let err = wallet.pay_for(&q, &mine).await.unwrap_err();
    assert_eq!(err.code(), "denied", "{err}");
    assert!(err.to_string().contains("relayed"), "{err}");

    // A receiver entry without origins is not payable over HTTP, and says how to fix it.
    let unpinned = self::client(w.wallet(w.mandate(|_| {}), true));
    let err = unpinned
        .get(&format!("{search}/api/search?q=rust"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "denied", "{err}");
    assert!(err.to_string().contains("--origin"), "{err}");

    assert!(seen.lock().unwrap().is_empty(), "evil was sent a payment");
    assert!(
        w.journal.names().is_empty(),
        "a refused quote was journalled"
    );
    // The same wallet pays the request it makes itself, at the pinned origin.
    let ok = client
        .get(&format!("{search}/api/search?q=rust"))
        .await
        .unwrap();
    assert_eq!((ok.status.as_u16(), ok.receipt.is_some()), (200, true));
}

/// Redirects (issue 23): an unpaid request's redirect to another origin is followed as a new
/// request, and the 402 found there is judged at *that* origin (denied here); a paid request
/// answered with a redirect is not followed — the payment header never reaches the other
/// origin, in the wallet's client and in the x402 client alike.
#[tokio::test]
async fn a_payment_header_never_follows_a_redirect() {
    let w = world().await;
    // The receiver's origin: a priced route behind the binding, a free route that redirects,
    // and (outside the binding) a proxy that bounces every paid request to evil, which relays
    // the receiver's own 402s.
    let (listener, base) = listen().await;
    let (evil, seen) = relay(format!("{base}/api/search?q=evil")).await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let token = Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2");
    let pay_to = Address::repeat_byte(0x55);
    let evm_key = LocalSigner::random();
    mock.mint(token.address, evm_key.address(), U256::from(1_000_000))
        .unwrap();
    let evm = ExactEvm::new(mock.clone(), token.clone(), pay_to);
    let to = format!("{evil}/collect");
    let moved = to.clone();
    let app = evm
        .paywall(&[("/x402/weather", 20_000, "the weather")])
        .unwrap()
        .apply(
            Binding::new(receiver).unwrap().apply(
                Router::new()
                    .route("/api/search", get(|| async { "results" }))
                    .route("/x402/weather", get(|| async { "sunny" }))
                    .route(
                        "/moved",
                        get(move || {
                            let to = moved.clone();
                            async move { axum::response::Redirect::temporary(&to) }
                        }),
                    ),
            ),
        )
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let to = to.clone();
                async move {
                    let paid = ["stipendex-payment", "payment-signature"]
                        .iter()
                        .any(|h| req.headers().contains_key(*h));
                    if paid {
                        return axum::response::Redirect::temporary(&to).into_response();
                    }
                    next.run(req).await
                }
            },
        ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let wallet = w.wallet(w.mandate(|m| pin(m, &base)), true);
    let client = client(wallet);

    // Before payment: followed, and judged where it landed (evil relays nothing payable).
    let err = client.get(&format!("{base}/moved")).await.unwrap_err();
    assert_eq!(err.code(), "denied", "{err}");
    assert!(err.to_string().contains("not allowlisted at"), "{err}");
    // After payment: the 307 is the answer; nothing follows it.
    let r = client
        .get(&format!("{base}/api/search?q=rust"))
        .await
        .unwrap();
    assert_eq!(r.status.as_u16(), 307);
    assert!(r.paid.is_some() && r.receipt.is_none());
    // The plain x402 client, the same.
    let x402 = rail_x402::client::client(X402Payer::new(
        evm_key,
        EvmPolicy::new(NET, token.address, U256::from(100_000)),
    ))
    .unwrap();
    let paid = x402.get(&format!("{base}/x402/weather")).await.unwrap();
    assert_eq!(paid.status.as_u16(), 307);
    assert!(paid.payment.is_some());
    assert!(
        seen.lock().unwrap().is_empty(),
        "a payment header followed a redirect to another origin"
    );
}

/// `method path` sent as raw bytes (no client normalises it): the status and the body.
async fn raw(base: &str, method: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// One decision on the normalised path (issue 23): every spelling of a priced path — HEAD for
/// GET, percent-encoded segments, `//`, `.` and `..` (raw and encoded), another case — on
/// every pattern kind (literal, `{id}`, `{*rest}`, prefix `*`) is a 402 unpaid or a 404, never
/// the priced handler's work; OPTIONS is answered by the binding, never by a priced handler.
#[tokio::test]
async fn no_spelling_of_a_priced_path_is_served_unpaid() {
    let w = world().await;
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/report", usd("0.05")))
        .price(PricedCapability::fixed(
            "GET",
            "/api/posts/{id}",
            usd("0.05"),
        ))
        .price(PricedCapability::fixed(
            "GET",
            "/files/{*path}",
            usd("0.05"),
        ))
        .price(PricedCapability::fixed("GET", "/docs/*", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let work = || async { "PAID WORK" };
    let app = Binding::new(receiver).unwrap().apply(
        Router::new()
            .route("/api/report", axum::routing::any(work))
            .route("/api/posts/{id}", get(work))
            .route("/files/{*path}", get(work))
            .route("/docs/{*rest}", get(work)),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let cases = [
        ("HEAD", "/api/report", 402),
        ("GET", "/api/%72eport", 402),
        // A path that could name another path to a server: refused before any decision.
        ("GET", "/api//report", 400),
        ("GET", "/api/x/../report", 400),
        ("GET", "/api/%2e%2e/api/report", 400),
        ("GET", "/api/./report", 400),
        ("GET", "/api%2Freport", 400),
        ("GET", "/api/report;x=1", 400),
        ("GET", "/api/report%00", 400),
        ("GET", "/api/%zzreport", 400),
        ("get", "/api/report", 400),
        // Another case, or a trailing slash: priced as the route (the default, lenient).
        ("GET", "/API/report", 402),
        ("GET", "/api/report/", 402),
        ("GET", "/api/posts/%31", 402),
        ("HEAD", "/api/posts/1", 402),
        ("GET", "/api/posts//1", 400),
        ("GET", "/api/Posts/1", 402),
        ("GET", "/api/posts/%2E%2E", 400),
        ("GET", "/files/%61", 402),
        ("HEAD", "/files/a/b", 402),
        ("GET", "/files/a/../../api/report", 400),
        ("GET", "/Files/a", 402),
        ("GET", "/docs/x", 402),
        ("HEAD", "/docs/x", 402),
        ("GET", "/docs/./x", 400),
        ("GET", "/DOCS/x", 402),
        ("GET", "/api\\report", 400),
    ];
    for (method, path, want) in cases {
        let (status, text) = raw(&base, method, path).await;
        assert_eq!(status, want, "{method} {path}: {text}");
        assert!(
            !text.contains("PAID WORK"),
            "{method} {path} was served: {text}"
        );
    }
    // OPTIONS never reaches the priced handler (routed with `any`): the binding answers.
    let (status, text) = raw(&base, "OPTIONS", "/api/report").await;
    assert_eq!(status, 204, "{text}");
    assert!(
        text.to_lowercase().contains("allow: get, head, options"),
        "{text}"
    );
    assert!(!text.contains("PAID WORK"));
    // Another method than the priced one is not priced (the application's routing decides).
    let (status, text) = raw(&base, "POST", "/api/posts/1").await;
    assert_eq!(status, 405, "{text}");
}

/// Checkout (issue 23): a Proof whose Confirmation consents to less than the Quote's maximum
/// is refused before the handler runs (the capture would have failed after the work, the hold
/// voided, the goods kept); capture and void ids are the receiver's own (its Quote's), so a
/// wallet that reuses a Proof id cannot make the capture fail either.
#[tokio::test]
async fn a_checkout_the_capture_would_refuse_is_refused_before_the_work() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use stipendex::envelope::{Confirmation, Proof, Quote, Resource, Signed, new_id};
    let w = world().await;
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::estimate(
            "POST",
            "/api/order",
            usd("3.00"),
            "0.50".parse().unwrap(),
        ))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = runs.clone();
    let app = Binding::new(receiver).unwrap().apply(Router::new().route(
        "/api/order",
        post(move || {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, Ordering::SeqCst);
                let mut r = "order 42".into_response();
                r.extensions_mut().insert(FinalAmount(usd("3.20")));
                r
            }
        }),
    ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let wallet = w.wallet(w.mandate(|m| pin(m, &base)), true);
    let http = raw_client();
    let url = format!("{base}/api/order");
    let sent = Resource {
        origin: base.clone(),
        method: "POST".into(),
        path: "/api/order".into(),
        query: None,
    };
    let quote = || async {
        let body: serde_json::Value = http.post(&url).send().await.unwrap().json().await.unwrap();
        serde_json::from_value::<Signed<Quote>>(body["quote"].clone()).unwrap()
    };
    let present = |proof: String| async {
        http.post(&url)
            .header("stipendex-payment", proof)
            .send()
            .await
            .unwrap()
    };

    // 1. A confirmation for 0.01 of a 3.50 checkout.
    let paid = wallet.pay_for(&quote().await, &sent).await.unwrap();
    let honest = paid.confirmation.clone().unwrap().object().clone();
    let low = Signed::sign(
        Confirmation {
            id: new_id("c_"),
            total: "0.01".parse().unwrap(),
            tolerance: "0".parse().unwrap(),
            ..honest
        },
        &w.wallet_key,
    )
    .unwrap();
    let forged = Signed::sign(
        Proof {
            id: new_id("p_"),
            confirmation: Some(low.digest().clone()),
            confirmation_jws: Some(low.jws().to_owned()),
            ..paid.proof.object().clone()
        },
        &w.wallet_key,
    )
    .unwrap();
    let r = present(forged.to_header()).await;
    assert_eq!(r.status(), 402);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "not_confirmed", "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the handler ran");
    // The honest proof of the same payment is served and captured.
    let r = present(paid.proof.to_header()).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("stipendex-receipt"));

    // 2. A second checkout whose proof reuses the first proof's id: captured all the same.
    let second = wallet.pay_for(&quote().await, &sent).await.unwrap();
    let reused = Signed::sign(
        Proof {
            id: paid.proof.object().id.clone(),
            ..second.proof.object().clone()
        },
        &w.wallet_key,
    )
    .unwrap();
    let r = present(reused.to_header()).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The client checks that the Receipt binds the bytes it received (issue 24): a body changed
/// on the way (here by a proxy outside the binding) is a `mismatch`, and its Receipt is not
/// journaled as the chain's; the same client reads no body over its cap.
#[tokio::test]
async fn a_receipt_that_does_not_bind_the_body_received_is_refused() {
    let w = world().await;
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let app = Binding::new(receiver)
        .unwrap()
        .apply(
            Router::new()
                .route("/api/search", get(|| async { "results" }))
                .route(
                    "/huge",
                    get(|| async { "x".repeat(x402_transport::client::MAX_BODY + 1) }),
                ),
        )
        .layer(axum::middleware::from_fn(
            |req: axum::extract::Request, next: axum::middleware::Next| async move {
                let resp = next.run(req).await;
                if resp.headers().contains_key("stipendex-receipt") {
                    let (mut parts, _) = resp.into_parts();
                    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
                    return axum::response::Response::from_parts(
                        parts,
                        axum::body::Body::from("other results"),
                    );
                }
                resp
            },
        ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = client(w.wallet(w.mandate(|m| pin(m, &base)), true));
    let err = client
        .get(&format!("{base}/api/search?q=rust"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "mismatch", "{err}");
    assert!(err.to_string().contains("does not bind"), "{err}");
    let names = w.journal.names();
    assert_eq!(names.len(), 1);
    let chain = w.journal.chain(&names[0]);
    assert_eq!(
        chain.len(),
        3,
        "mandate, quote, proof: no receipt journaled"
    );

    let err = client.get(&format!("{base}/huge")).await.unwrap_err();
    assert_eq!(err.code(), "malformed", "{err}");
    assert!(err.to_string().contains("over"), "{err}");
}

/// Hostile redirects (issue 23): a redirect loop ends after `MAX_REDIRECTS` hops, and a
/// `Location` outside http(s) is not followed; each is an error, nothing paid.
#[tokio::test]
async fn a_redirect_loop_or_a_non_http_location_is_refused() {
    let w = world().await;
    let app = Router::new()
        .route(
            "/loop",
            get(|| async { axum::response::Redirect::temporary("/loop") }),
        )
        .route(
            "/file",
            get(|| async { axum::response::Redirect::to("file:///etc/passwd") }),
        );
    let (listener, base) = listen().await;
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let client = client(w.wallet(w.mandate(|m| pin(m, &base)), true));
    let err = client.get(&format!("{base}/loop")).await.unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "more than {} redirects",
            x402_transport::client::MAX_REDIRECTS
        )),
        "{err}"
    );
    let err = client.get(&format!("{base}/file")).await.unwrap_err();
    assert!(
        err.to_string()
            .contains("without a usable http(s) Location"),
        "{err}"
    );
    assert!(w.journal.names().is_empty(), "nothing was paid");
}

/// The 402's Quote for `GET url`, and the request it was sent for.
async fn quote_for(
    url: &str,
) -> (
    stipendex::envelope::Signed<stipendex::envelope::Quote>,
    stipendex::envelope::Resource,
) {
    let body: serde_json::Value = raw_client()
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let q: stipendex::envelope::Signed<stipendex::envelope::Quote> =
        serde_json::from_value(body["quote"].clone()).unwrap();
    let sent = q
        .object()
        .resource
        .clone()
        .expect("the quote names its resource");
    (q, sent)
}

/// A lost answer (issue 24): the same Proof presented again for the same request gets the
/// kept answer and the same Receipt — the handler does not run again, the rail is not asked
/// again; the Proof for another request is a mismatch; a handler that failed after a service
/// payment is answered the same failure again (the profile's rule: not refunded, not run twice).
#[tokio::test]
async fn the_same_proof_again_after_a_lost_answer_gets_the_same_answer() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let w = world().await;
    let (listener, base) = listen().await;
    // The receivers' shared store (PostgreSQL for a fleet; memory here, shared by two).
    let store: Arc<dyn stipendex::KeyStore> = Arc::new(stipendex::MemoryKeyStore::default());
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .store(store.clone())
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .price(PricedCapability::fixed("GET", "/api/broken", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let (r1, r2) = (runs.clone(), runs.clone());
    let app = Binding::new(receiver).unwrap().apply(
        Router::new()
            .route(
                "/api/search",
                get(move || async move {
                    let n = r1.fetch_add(1, Ordering::SeqCst) + 1;
                    format!("results {n}")
                }),
            )
            .route(
                "/api/broken",
                get(move || async move {
                    r2.fetch_add(1, Ordering::SeqCst);
                    (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "broken")
                }),
            ),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let wallet = w.wallet(w.mandate(|m| pin(m, &base)), true);
    let send = |url: String, proof: String| async move {
        let r = raw_client()
            .get(url)
            .header("stipendex-payment", proof)
            .send()
            .await
            .unwrap();
        let receipt = r
            .headers()
            .get("stipendex-receipt")
            .map(|v| v.to_str().unwrap().to_owned());
        (r.status().as_u16(), receipt, r.text().await.unwrap())
    };

    let url = format!("{base}/api/search?q=rust");
    let (quote, sent) = quote_for(&url).await;
    let paid = wallet.pay_for(&quote, &sent).await.unwrap();
    let header = paid.proof.to_header();
    let first = send(url.clone(), header.clone()).await; // this answer is lost on the way
    assert_eq!((first.0, first.2.as_str()), (200, "results 1"));
    let again = send(url.clone(), header.clone()).await;
    assert_eq!(again, first, "the same proof again gets the same answer");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the handler ran twice");
    use base64::Engine as _;
    let jws = String::from_utf8(
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(again.1.unwrap())
            .unwrap(),
    )
    .unwrap();
    wallet
        .receipt_for(&paid, &jws, again.2.as_bytes())
        .await
        .expect("the kept answer's receipt binds its body");

    // The same Proof for another request: refused, nothing run.
    let other = send(format!("{base}/api/search?q=other"), header.clone()).await;
    assert_eq!(other.0, 402);
    assert!(other.2.contains("\"mismatch\""), "{}", other.2);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Another instance of the receiver on the same store answers the repeat too (the first
    // instance's answer was lost): same answer, no second run.
    let (listener, second) = listen().await;
    let twin = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .store(store.clone())
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let r3 = runs.clone();
    let app = Binding::new(twin).unwrap().apply(Router::new().route(
        "/api/search",
        get(move || async move {
            r3.fetch_add(1, Ordering::SeqCst);
            "twin results"
        }),
    ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let at_twin = raw_client()
        .get(format!("{second}/api/search?q=rust"))
        .header("host", base.trim_start_matches("http://"))
        .header("stipendex-payment", header.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(at_twin.status(), 200);
    assert_eq!(at_twin.text().await.unwrap(), "results 1");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the twin ran the handler");

    // A handler that fails after a service payment: the same failure again, not a second run.
    let url = format!("{base}/api/broken");
    let (quote, sent) = quote_for(&url).await;
    let paid = wallet.pay_for(&quote, &sent).await.unwrap();
    let header = paid.proof.to_header();
    let first = send(url.clone(), header.clone()).await;
    assert_eq!(
        (first.0, first.1.as_deref(), first.2.as_str()),
        (500, None, "broken")
    );
    assert_eq!(send(url, header).await, first);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the failed handler ran twice"
    );
}

/// At most once per Proof (issue 26): an instance admitted a Proof, handed the request to its
/// work and stopped before the answer was kept. The same Proof at another instance, once the
/// stopped one's claim lapsed, runs an idempotent request again but not a `POST`: that gets
/// `409 outcome_unknown`, kept for the next repeat, and the handler never runs a second time.
#[tokio::test]
async fn a_proof_whose_instance_stopped_mid_request_runs_again_only_if_idempotent() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use stipendex::receiver::{Admitted, Delivery, Request};
    let w = world().await;
    let (listener, base) = listen().await;
    let store: Arc<dyn stipendex::KeyStore> = Arc::new(stipendex::MemoryKeyStore::default());
    let instance = || {
        Receiver::builder("search", w.receiver_key.clone())
            .origin(&base)
            .registry(&w.registry)
            .store(store.clone())
            .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
            .price(PricedCapability::fixed("POST", "/api/order", usd("0.05")))
            .clock(Arc::new(w.clock.clone()))
            .claim_lease(std::time::Duration::from_secs(1))
            .build()
            .unwrap()
    };
    let (stopped, serving) = (instance(), instance());
    let runs = Arc::new(AtomicUsize::new(0));
    let (r1, r2) = (runs.clone(), runs.clone());
    let app = Binding::new(serving).unwrap().apply(
        Router::new()
            .route(
                "/api/search",
                get(move || async move {
                    r1.fetch_add(1, Ordering::SeqCst);
                    "results"
                }),
            )
            .route(
                "/api/order",
                post(move || async move {
                    r2.fetch_add(1, Ordering::SeqCst);
                    "ordered"
                }),
            ),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let wallet = w.wallet(w.mandate(|m| pin(m, &base)), true);

    for (method, path, rerun) in [("POST", "/api/order", false), ("GET", "/api/search", true)] {
        let url = format!("{base}{path}");
        let m: axum::http::Method = method.parse().unwrap();
        let body: serde_json::Value = raw_client()
            .request(m.clone(), &url)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let quote: stipendex::envelope::Signed<stipendex::envelope::Quote> =
            serde_json::from_value(body["quote"].clone()).unwrap();
        let sent = quote.object().resource.clone().unwrap();
        let paid = wallet.pay_for(&quote, &sent).await.unwrap();
        // The stopped instance: admitted, handed over, never answered.
        let sreq = Request {
            origin: Some(base.clone()),
            ..Request::new(method, path)
        };
        let Admitted::Run(p) = stopped.admit(&sreq, paid.proof.jws()).await.unwrap() else {
            panic!("a fresh proof is run");
        };
        assert_eq!(stopped.deliver(&p).await.unwrap(), Delivery::First);
        drop(p);
        tokio::time::sleep(std::time::Duration::from_millis(1600)).await;

        let before = runs.load(Ordering::SeqCst);
        let again = || async {
            let r = raw_client()
                .request(m.clone(), &url)
                .header("stipendex-payment", paid.proof.to_header())
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        };
        let first = again().await;
        if rerun {
            assert_eq!(first, (200, "results".to_owned()), "{method}");
            assert_eq!(runs.load(Ordering::SeqCst), before + 1);
        } else {
            assert_eq!(first.0, 409, "{}", first.1);
            assert!(first.1.contains("\"outcome_unknown\""), "{}", first.1);
            assert_eq!(runs.load(Ordering::SeqCst), before, "a POST ran twice");
        }
        assert_eq!(again().await, first, "the repeat gets the kept answer");
        assert_eq!(runs.load(Ordering::SeqCst), before + usize::from(rerun));
    }
}

/// A rail whose every offer is an object elsewhere (as a Stripe PaymentIntent is), counted.
struct Costly(Arc<std::sync::atomic::AtomicUsize>);

impl stipendex::Rail for Costly {
    fn id(&self) -> stipendex::rail_core::RailId {
        stipendex::rail_core::RailId::new("stripe")
    }
    fn capabilities(&self) -> stipendex::rail_core::Capabilities {
        stipendex::rail_core::Capabilities::pay_only(
            stipendex::rail_core::Finality::Immediate,
            vec![stipendex::Asset::usd()],
        )
    }
}

#[async_trait::async_trait]
impl stipendex::RailReceiver for Costly {
    async fn offer(
        &self,
        charge: &stipendex::Charge,
    ) -> stipendex::rail_core::RailResult<stipendex::Offer> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
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

/// Unpaid requests cannot make the receiver create costly offers without end (issue 24): past
/// the per-client limit the costly rail drops out of that client's Quotes (the free rails
/// stand); with no other rail the answer is 429 with `Retry-After`; another client (another
/// address) still gets its own.
#[tokio::test]
async fn quotes_with_costly_offers_are_limited_per_client() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let w = world().await;
    let serve = |with_ledger: bool, made: Arc<AtomicUsize>| {
        let w = &w;
        async move {
            let (listener, base) = listen().await;
            let mut b = Receiver::builder("search", w.receiver_key.clone())
                .origin(&base)
                .rail(
                    "card",
                    stipendex::rail_core::ReceiverHandle::pay_only(Costly(made)),
                )
                .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
                .costly_quotes_per_client(3, std::time::Duration::from_secs(60));
            if with_ledger {
                b = b.registry(&w.registry);
            }
            let app = Binding::new(b.build().unwrap())
                .unwrap()
                .apply(Router::new().route("/api/search", get(|| async { "results" })));
            tokio::spawn(async move {
                axum::serve(
                    listener,
                    app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
                )
                .await
                .unwrap();
            });
            base
        }
    };
    let made = Arc::new(AtomicUsize::new(0));
    let base = serve(true, made.clone()).await;
    let mut offered = Vec::new();
    for _ in 0..5 {
        let (q, _) = quote_for(&format!("{base}/api/search?q=spam")).await;
        offered.push(q.object().rails.len());
    }
    assert_eq!(
        offered,
        [2, 2, 2, 1, 1],
        "the costly rail drops out past the limit"
    );
    assert_eq!(made.load(Ordering::SeqCst), 3);

    let made = Arc::new(AtomicUsize::new(0));
    let base = serve(false, made.clone()).await;
    for _ in 0..3 {
        let r = raw_client()
            .get(format!("{base}/api/search"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 402);
    }
    let r = raw_client()
        .get(format!("{base}/api/search"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "rate_limited", "{body}");
    assert_eq!(made.load(Ordering::SeqCst), 3);
    // Another client, from another address, has its own window.
    let other = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let r = other
        .get(format!("{base}/api/search"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402);
    assert_eq!(made.load(Ordering::SeqCst), 4);
}

/// The same request sent several times at once by one wallet (issue 24's pending payments
/// must not entangle them): each is paid once with its own Quote and answered with its own
/// Receipt — a payment in flight for an identical request is not "resumed" by another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_requests_at_once_each_pay_their_own_quote() {
    let w = world().await;
    let base = search_receiver(&w).await;
    let client = client(w.wallet(w.mandate(|m| pin(m, &base)), true));
    let url = format!("{base}/api/search?q=same");
    let agents = (0..8).map(|_| {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            for _ in 0..10 {
                let a = client.get(&url).await.expect("each request is paid");
                assert_eq!((a.status.as_u16(), a.receipt.is_some()), (200, true));
            }
        })
    });
    for a in futures::future::join_all(agents).await {
        a.unwrap();
    }
    assert_eq!(
        w.journal.names().len(),
        80,
        "eighty payments, eighty chains"
    );
    assert!(client.wallet().pending().await.unwrap().is_empty());
}

/// Load (issue 30): sixty-four agents of one wallet pay the same route at once, over SQLite
/// stores, five calls each. Every call is answered — 200 with a Receipt, none lost, none refused
/// for contention — and the money adds up to the cent: each call moved its price once, the
/// combined budget counter counted each once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_agents_paying_at_once_are_each_answered_and_charged_once() {
    const AGENTS: usize = 64;
    const CALLS: usize = 5;
    let w = world().await;
    let search = search_receiver(&w).await;
    let before = w.balance(w.agent).await.0;
    let shop_before = w.balance(w.shop).await.0;
    let wallet = w.wallet(w.mandate(|m| pin(m, &search)), true);
    let client = client(wallet);
    let mut tasks = Vec::new();
    for agent in 0..AGENTS {
        let (c, base) = (client.clone(), search.clone());
        tasks.push(tokio::spawn(async move {
            let mut failures = Vec::new();
            for call in 0..CALLS {
                match c.get(&format!("{base}/api/search?q={agent}-{call}")).await {
                    Ok(r) if r.status.as_u16() == 200 && r.receipt.is_some() => {}
                    Ok(r) => failures.push(format!("{agent}-{call}: status {}", r.status)),
                    Err(e) => failures.push(format!("{agent}-{call}: {e}")),
                }
            }
            failures
        }));
    }
    let mut failures = Vec::new();
    for t in tasks {
        failures.extend(t.await.unwrap());
    }
    assert!(
        failures.is_empty(),
        "{} of {} calls failed: {:?}",
        failures.len(),
        AGENTS * CALLS,
        &failures[..failures.len().min(5)]
    );
    let cents = i128::try_from(AGENTS * CALLS * 5).unwrap();
    assert_eq!(
        w.balance(w.agent).await.0,
        before - cents,
        "each call paid once"
    );
    assert_eq!(w.balance(w.shop).await.0, shop_before + cents);
}

/// The work behind a receiver (a gateway's upstream), away or not: [`Receiver::guard`] asks it
/// before any payment is taken.
#[derive(Default)]
struct Away(std::sync::atomic::AtomicBool);

impl Away {
    fn set(&self, away: bool) {
        self.0.store(away, std::sync::atomic::Ordering::SeqCst);
    }
}

#[async_trait::async_trait]
impl stipendex::receiver::Ready for Away {
    async fn ready(&self) -> Result<(), String> {
        if self.0.load(std::sync::atomic::Ordering::SeqCst) {
            Err("the service is away".into())
        } else {
            Ok(())
        }
    }
}

/// A mandate allowing tabs of up to 1.00 USD, two at a time, at `base`.
fn tab_mandate(
    w: &common::World,
    base: &str,
) -> stipendex::envelope::Signed<stipendex::envelope::Mandate> {
    w.mandate(|m| {
        pin(m, base);
        let l = &mut m.limits[0];
        l.tab_cap = Some("1.00".parse().unwrap());
        l.open_tabs = Some(2);
    })
}

/// Issue 44: every way to pay — a Proof, a voucher, a tab's opening, an x402 payload — passes
/// the receiver's one guard before anything is taken: while the work is away each is answered
/// 503 and nothing is consumed, counted or settled; once it is back, the same payment works.
#[tokio::test]
async fn every_way_to_pay_passes_the_one_guard_and_nothing_is_taken_while_the_work_is_away() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let w = world().await;
    let away = Arc::new(Away::default());
    let evm_pay_to = Address::repeat_byte(0x23);
    let EvmRoute {
        mock,
        token,
        key: evm_key,
        paywall,
    } = evm_search_route(evm_pay_to);
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .tabs(stipendex::receiver::TabTerms::new(usd("0.50")).lanes(2))
        .ready(away.clone())
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let app = Binding::new(receiver.clone())
        .unwrap()
        .with_x402(paywall)
        .unwrap()
        .apply(Router::new().route(
            "/api/search",
            get(move || {
                count.fetch_add(1, Ordering::SeqCst);
                async { "results" }
            }),
        ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = raw_client();
    let url = format!("{base}/api/search?q=rust");

    // A Proof: refused before it is claimed; the same Proof works once the service is back.
    away.set(true);
    let quote: stipendex::envelope::Signed<stipendex::envelope::Quote> = {
        let r = http.get(&url).send().await.unwrap();
        assert_eq!(r.status(), 402, "quoting needs no payment, so it goes on");
        let body: serde_json::Value = r.json().await.unwrap();
        serde_json::from_value(body["quote"].clone()).unwrap()
    };
    let wallet = w.wallet(tab_mandate(&w, &base), true);
    let sent = quote.object().resource.clone().unwrap();
    let proof = wallet
        .pay_for(&quote, &sent)
        .await
        .unwrap()
        .proof
        .to_header();
    let r = http
        .get(&url)
        .header("stipendex-payment", &proof)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"], "upstream_unavailable", "{body}");
    assert_eq!(served.load(Ordering::SeqCst), 0);
    away.set(false);
    let r = http
        .get(&url)
        .header("stipendex-payment", &proof)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the same Proof, now served");
    assert!(r.headers().contains_key("stipendex-receipt"));
    assert_eq!(served.load(Ordering::SeqCst), 1);

    // An x402 payload: not settled while away (the payer's token balance stays).
    away.set(true);
    let x402 = rail_x402::client::client(X402Payer::new(
        evm_key,
        EvmPolicy::new(NET, token.address, U256::from(100_000)),
    ))
    .unwrap();
    assert!(
        x402.get(&url).await.is_err(),
        "503 until the retries run out"
    );
    assert_eq!(
        mock.balance(token.address, evm_pay_to).unwrap(),
        U256::ZERO,
        "nothing settled while away"
    );
    assert_eq!(served.load(Ordering::SeqCst), 1);
    away.set(false);
    let paid = EvmFetched::from(x402.get(&url).await.unwrap());
    assert_eq!(paid.status, 200);
    assert_eq!(
        mock.balance(token.address, evm_pay_to).unwrap(),
        U256::from(50_000)
    );
    assert_eq!(served.load(Ordering::SeqCst), 2);

    // A tab's opening (its hold Proof with the first voucher): not opened while away.
    let c = client(w.wallet(tab_mandate(&w, &base), true));
    away.set(true);
    let r = c.get(&format!("{base}/api/search?q=a")).await.unwrap();
    assert_eq!(r.status, 503);
    assert!(r.tab_call.is_none(), "nothing was paid");
    assert_eq!(receiver.tabs_cached(), 0, "nothing kept of an unopened tab");
    assert_eq!(served.load(Ordering::SeqCst), 2);

    // A voucher: not counted while away; the wallet's lane is given back, and the next voucher
    // carries the same sequence.
    away.set(false);
    let r = c.get(&format!("{base}/api/search?q=b")).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.tab_call.is_some(), "paid inside the tab");
    away.set(true);
    let r = c.get(&format!("{base}/api/search?q=c")).await.unwrap();
    assert_eq!(r.status, 503);
    assert!(r.tab_call.is_none(), "the voucher was not counted");
    assert!(
        r.headers["stipendex-tab-call"]
            .to_str()
            .unwrap()
            .ends_with("; uncounted")
    );
    away.set(false);
    let r = c.get(&format!("{base}/api/search?q=d")).await.unwrap();
    assert_eq!(r.status, 200);
    let paid = r.tab_call.expect("paid inside the tab");
    let receipts = c.close_tabs().await.unwrap();
    let receipt = receipts.last().unwrap().object();
    assert_eq!(
        (receipt.calls, receipt.captured),
        (2, "0.10".parse().unwrap()),
        "two calls served, two captured"
    );
    // The wallet's audit chain holds the uncounted voucher and verifies.
    let lines = w
        .journal
        .chain(&stipendex::wallet::chain_name("search", &paid.tab));
    assert!(lines.iter().any(|l| l.contains("tab_uncounted")));
    let chain = stipendex::chain::verify_tab_chain(
        lines.iter().map(String::as_str),
        Some(&w.principal.public()),
    )
    .unwrap();
    assert_eq!(chain.vouchers, 2);
    assert_eq!(served.load(Ordering::SeqCst), 4);
}

/// Issue 44: an answer the work made itself because nothing reached the service behind it
/// (`Undelivered`) is never kept as a paid answer: a Proof stays usable (served later, charged
/// once), a voucher is taken back (the next call reuses its sequence and cumulative).
#[tokio::test]
async fn work_that_never_reached_the_service_is_kept_as_no_answer_and_charges_nothing() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let w = world().await;
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .price(PricedCapability::fixed("POST", "/api/order", usd("0.05")))
        .tabs(stipendex::receiver::TabTerms::new(usd("0.50")).lanes(2))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let down = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let work = {
        let (down, served) = (down.clone(), served.clone());
        move || {
            let (down, served) = (down.clone(), served.clone());
            async move {
                if down.load(Ordering::SeqCst) {
                    // What a gateway answers when its upstream refused the connection.
                    let mut r =
                        (axum::http::StatusCode::BAD_GATEWAY, "unreachable").into_response();
                    r.extensions_mut().insert(stipendex::http::Undelivered);
                    r
                } else {
                    served.fetch_add(1, Ordering::SeqCst);
                    "results".into_response()
                }
            }
        }
    };
    let app = Binding::new(receiver).unwrap().apply(
        Router::new()
            .route("/api/search", get(work.clone()))
            .route("/api/order", post(work)),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = raw_client();

    // A Proof, for a request that is not idempotent: its first presentation never reached the
    // service; the same Proof again runs it (not `outcome_unknown`), once, with its Receipt.
    let url = format!("{base}/api/order");
    let r = http.post(&url).send().await.unwrap();
    let body: serde_json::Value = r.json().await.unwrap();
    let quote: stipendex::envelope::Signed<stipendex::envelope::Quote> =
        serde_json::from_value(body["quote"].clone()).unwrap();
    let wallet = w.wallet(tab_mandate(&w, &base), true);
    let shop_before = w.balance(w.shop).await.0;
    let proof = wallet
        .pay_for(&quote, &quote.object().resource.clone().unwrap())
        .await
        .unwrap()
        .proof
        .to_header();
    down.store(true, Ordering::SeqCst);
    let r = http
        .post(&url)
        .header("stipendex-payment", &proof)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(!r.headers().contains_key("stipendex-receipt"));
    down.store(false, Ordering::SeqCst);
    let r = http
        .post(&url)
        .header("stipendex-payment", &proof)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("stipendex-receipt"));
    assert_eq!(served.load(Ordering::SeqCst), 1);
    assert_eq!(w.balance(w.shop).await.0 - shop_before, 5, "paid once");

    // A voucher: taken back, and the wallet's next voucher carries the same sequence.
    let c = client(w.wallet(tab_mandate(&w, &base), true));
    let r = c.get(&format!("{base}/api/search?q=1")).await.unwrap();
    assert!(r.tab_call.is_some());
    down.store(true, Ordering::SeqCst);
    let r = c.get(&format!("{base}/api/search?q=2")).await.unwrap();
    assert_eq!(r.status, 503);
    assert!(r.tab_call.is_none(), "the voucher was taken back");
    down.store(false, Ordering::SeqCst);
    let r = c.get(&format!("{base}/api/search?q=3")).await.unwrap();
    assert!(r.tab_call.is_some());
    let receipts = c.close_tabs().await.unwrap();
    let receipt = receipts.last().unwrap().object();
    assert_eq!(
        (receipt.calls, receipt.captured),
        (2, "0.10".parse().unwrap()),
        "the undelivered call is not captured"
    );
    assert_eq!(served.load(Ordering::SeqCst), 3);
}

/// Issue 44: a paid answer larger than the wallet or the receiver held in memory is delivered
/// whole with its Receipt (spooled at the receiver, streamed to the wallet's writer); one
/// larger than the binding delivers is not delivered, and its payment is given back.
#[tokio::test]
async fn a_large_paid_answer_is_delivered_whole_or_its_payment_given_back() {
    let w = world().await;
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/big", usd("0.05")))
        .price(PricedCapability::fixed("GET", "/api/huge", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    const BIG: usize = 17 * 1024 * 1024;
    let app = Binding::new(receiver)
        .unwrap()
        .max_answer(20 * 1024 * 1024)
        .apply(
            Router::new()
                .route("/api/big", get(|| async { vec![b'x'; BIG] }))
                .route("/api/huge", get(|| async { vec![b'y'; 21 * 1024 * 1024] })),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let c = client(w.wallet(w.mandate(|m| pin(m, &base)), true));
    let agent_before = w.balance(w.agent).await.0;
    let mut out: Vec<u8> = Vec::new();
    let r = c
        .execute_to(
            reqwest::Method::GET,
            &format!("{base}/api/big"),
            reqwest::header::HeaderMap::new(),
            None,
            &mut out,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(out.len(), BIG, "the whole body");
    assert!(out.iter().all(|b| *b == b'x'));
    let receipt = r
        .receipt
        .expect("its Receipt, checked against the bytes received");
    assert_eq!(
        receipt.object().result.as_ref().unwrap(),
        &stipendex::envelope::Digest::of(&out)
    );
    assert_eq!(agent_before - w.balance(w.agent).await.0, 5);

    // Over the binding's limit: not delivered, and the service payment refunded (the ledger
    // refunds), so nothing is charged.
    let before = w.balance(w.agent).await.0;
    let err = c.get(&format!("{base}/api/huge")).await;
    let r = err.unwrap();
    assert_eq!(r.status, 502);
    let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(body["error"], "answer_undeliverable", "{body}");
    assert_eq!(w.balance(w.agent).await.0, before, "given back");
}

/// Issue 44: a 3xx the paid work answers (a presigned download's redirect) is a delivered
/// answer: receipted, like any answer; the wallet does not follow it with its payment.
#[tokio::test]
async fn a_paid_redirect_is_a_delivered_answer_with_its_receipt() {
    let w = world().await;
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/download", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let app = Binding::new(receiver).unwrap().apply(Router::new().route(
        "/api/download",
        get(|| async {
            axum::response::Redirect::temporary("https://cdn.example/presigned?sig=abc")
        }),
    ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let c = client(w.wallet(w.mandate(|m| pin(m, &base)), true));
    let r = c.get(&format!("{base}/api/download")).await.unwrap();
    assert_eq!(r.status, 307);
    assert_eq!(
        r.headers["location"].to_str().unwrap(),
        "https://cdn.example/presigned?sig=abc"
    );
    assert!(r.receipt.is_some(), "a delivered answer, receipted");
}

/// Issue 44: x402 settles before non-safe work (`SettleWhen::AfterIfSafe`: a `POST`'s effects
/// are never produced for a payment that then fails to settle) and after safe work; a paid 3xx
/// (a presigned download's redirect) is a delivered answer, settled.
#[tokio::test]
async fn x402_settles_before_work_with_effects_and_a_paid_redirect_is_settled() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let token = Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2");
    let pay_to = Address::repeat_byte(0x24);
    let payer = LocalSigner::random();
    mock.mint(token.address, payer.address(), U256::from(1_000_000))
        .unwrap();
    let evm: Arc<dyn Scheme> = Arc::new(ExactEvm::new(mock.clone(), token.clone(), pay_to));
    let paywall = Paywall::new()
        .settle(x402_transport::SettleWhen::AfterIfSafe)
        .route(
            "/order",
            "an order",
            Accepts::one(evm.clone(), 10_000).unwrap(),
        )
        .route(
            "/report",
            "a report",
            Accepts::one(evm.clone(), 10_000).unwrap(),
        )
        .route(
            "/download",
            "a download",
            Accepts::one(evm, 10_000).unwrap(),
        );
    // What each handler saw of the settlement when it ran.
    let order_saw_settled = Arc::new(AtomicBool::new(false));
    let report_saw_settled = Arc::new(AtomicBool::new(true));
    let settled = {
        let (mock, token) = (mock.clone(), token.clone());
        move || mock.balance(token.address, pay_to).unwrap() > U256::ZERO
    };
    let app = paywall.apply(
        Router::new()
            .route(
                "/order",
                post({
                    let (saw, settled) = (order_saw_settled.clone(), settled.clone());
                    move || {
                        saw.store(settled(), Ordering::SeqCst);
                        async { "ordered" }
                    }
                }),
            )
            .route(
                "/report",
                get({
                    let (saw, settled) = (report_saw_settled.clone(), settled.clone());
                    move || {
                        saw.store(settled(), Ordering::SeqCst);
                        async { "report" }
                    }
                }),
            )
            .route(
                "/download",
                get(|| async {
                    axum::response::Redirect::to("https://cdn.example/presigned?sig=abc")
                }),
            ),
    );
    let (listener, base) = listen().await;
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let x402 = rail_x402::client::client(X402Payer::new(
        payer,
        EvmPolicy::new(NET, token.address, U256::from(100_000)),
    ))
    .unwrap();
    // A safe GET: the handler runs before settlement (nothing settled yet when it ran).
    let paid = EvmFetched::from(x402.get(&format!("{base}/report")).await.unwrap());
    assert_eq!(paid.status, 200);
    assert!(
        !report_saw_settled.load(Ordering::SeqCst),
        "settled after the safe work"
    );
    // A POST: settled before the handler runs.
    let paid = EvmFetched::from(
        x402.send(reqwest::Method::POST, &format!("{base}/order"), None)
            .await
            .unwrap(),
    );
    assert_eq!(paid.status, 200);
    assert!(
        order_saw_settled.load(Ordering::SeqCst),
        "settled before the work with effects"
    );
    // A paid redirect: delivered and settled (PAYMENT-RESPONSE), not free.
    let paid = EvmFetched::from(x402.get(&format!("{base}/download")).await.unwrap());
    assert_eq!(paid.status, 303);
    assert!(paid.settlement.expect("settled").success);
    assert_eq!(
        mock.balance(token.address, pay_to).unwrap(),
        U256::from(30_000)
    );
}

/// The price hook decides for x402 payers too (issue 49's inventory found x402 payments went
/// to the paywall without it): the x402 route is priced at the list price, so it is offered and
/// taken only when the hook keeps that price. A request the hook refuses, waives or prices
/// otherwise is never paid around at the list price — not by a plain x402 client, and not by an
/// x402 payment signed for another request of the route.
#[tokio::test]
async fn an_x402_payment_cannot_pay_around_the_price_hook() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use stipendex::receiver::{Decision, Price, ResolvePrice};
    /// How often the hook was asked (a payment set aside is priced once, not twice).
    static ASKED: AtomicUsize = AtomicUsize::new(0);
    struct Hook;
    #[async_trait::async_trait]
    impl ResolvePrice for Hook {
        async fn resolve(
            &self,
            cap: &PricedCapability,
            req: &stipendex::receiver::Request,
        ) -> Decision {
            ASKED.fetch_add(1, Ordering::SeqCst);
            match req.params.get("q").and_then(serde_json::Value::as_str) {
                Some("blocked") => Decision::reject("this query is not sold"),
                Some("vip") => Decision::Waive,
                Some("big") => Decision::quote(Price::Fixed(usd("0.10"))),
                _ => Decision::quote(cap.price.clone()),
            }
        }
    }
    let w = world().await;
    let pay_to = Address::repeat_byte(0x24);
    let EvmRoute {
        mock,
        token,
        key: evm_key,
        paywall,
    } = evm_search_route(pay_to);
    let (listener, base) = listen().await;
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
        .resolve_price(Arc::new(Hook))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Binding::new(receiver)
        .unwrap()
        .with_x402(paywall)
        .unwrap()
        .apply(Router::new().route(
            "/api/search",
            get(move || {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { "results" }
            }),
        ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = raw_client();
    let paid_to = || mock.balance(token.address, pay_to).unwrap();

    // The hook's other price: the 402 carries its Quote alone, no x402 offer at the list price.
    let big = http
        .get(format!("{base}/api/search?q=big"))
        .send()
        .await
        .unwrap();
    assert_eq!(big.status(), 402);
    assert!(!big.headers().contains_key("payment-required"));
    let body: serde_json::Value = big.json().await.unwrap();
    assert_eq!(body["quote"]["stipendex"], "quote/0.1");
    assert!(body.get("accepts").is_none(), "{body}");

    // An x402 payment signed for the list price (another request of the route) …
    let unpaid = http
        .get(format!("{base}/api/search?q=rust"))
        .send()
        .await
        .unwrap();
    use base64::Engine as _;
    let required: serde_json::Value = serde_json::from_slice(
        &base64::engine::general_purpose::STANDARD
            .decode(unpaid.headers()["payment-required"].as_bytes())
            .unwrap(),
    )
    .unwrap();
    let required = x402_transport::client::Required::from_value(required).unwrap();
    let payer = X402Payer::new(
        evm_key.clone(),
        EvmPolicy::new(NET, token.address, U256::from(100_000)),
    );
    let sent = x402_transport::client::sign(&payer, &required, &required.entries()[0])
        .await
        .unwrap();
    let (name, value) = (sent.header_name(), sent.header_value().unwrap());
    // … presented for the request the hook prices higher: not taken, the Quote instead — the
    // hook asked once for it (its decision both sets the payment aside and makes the Quote).
    let asked = ASKED.load(Ordering::SeqCst);
    let around = http
        .get(format!("{base}/api/search?q=big"))
        .header(name, &value)
        .send()
        .await
        .unwrap();
    assert_eq!(around.status(), 402);
    assert_eq!(
        ASKED.load(Ordering::SeqCst) - asked,
        1,
        "the hook once per request"
    );
    // … for the one it refuses: refused.
    let refused = http
        .get(format!("{base}/api/search?q=blocked"))
        .header(name, &value)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    // … for the one it waives: served free, the payment not settled.
    let waived = http
        .get(format!("{base}/api/search?q=vip"))
        .header(name, &value)
        .send()
        .await
        .unwrap();
    assert_eq!(waived.status(), 200);
    assert!(!waived.headers().contains_key("payment-response"));
    assert_eq!(paid_to(), U256::ZERO, "nothing settled around the hook");
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "only the waived call ran"
    );

    // At the list price the same payment is taken, once.
    let paid = http
        .get(format!("{base}/api/search?q=rust"))
        .header(name, &value)
        .send()
        .await
        .unwrap();
    assert_eq!(paid.status(), 200);
    assert_eq!(paid_to(), U256::from(50_000));
}

/// The receiver engine over HTTP: every priced request is decided once (one
/// `Receiver::decide`) and asks the price hook once — the Quote's request, its paid retry by
/// Proof (the Quote already holds the hook's price: not asked again), and each call paid by a
/// voucher inside a tab (the hook is authorisation too: asked for every call). Before the
/// engine a tab's call decided three times and its 402 three times.
#[tokio::test]
async fn over_http_a_paid_request_decides_once_and_asks_the_hook_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use common::{CountingHook, Decisions};
    use stipendex::receiver::TabTerms;

    for tabs in [false, true] {
        let w = world().await;
        let (listener, base) = listen().await;
        let hook = CountingHook::default();
        let mut builder = Receiver::builder("search", w.receiver_key.clone())
            .origin(&base)
            .registry(&w.registry)
            .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")))
            .resolve_price(Arc::new(hook.clone()))
            .clock(Arc::new(w.clock.clone()));
        if tabs {
            builder = builder.tabs(TabTerms::new(usd("1.00")).lanes(2));
        }
        let receiver = builder.build().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = requests.clone();
        let app = Binding::new(receiver)
            .unwrap()
            .apply(Router::new().route("/api/search", get(|| async { "results" })))
            .layer(axum::middleware::from_fn(
                move |req: axum::extract::Request, next: axum::middleware::Next| {
                    let seen = seen.clone();
                    async move {
                        if req.uri().path() == "/api/search" {
                            seen.fetch_add(1, Ordering::SeqCst);
                        }
                        next.run(req).await
                    }
                },
            ));
        let decisions = Decisions::start();
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
        for i in 0..3 {
            let resp = client
                .get(&format!("{base}/api/search?q={i}"))
                .await
                .unwrap();
            assert_eq!(resp.status, 200);
            assert_eq!(resp.tab_call.is_some(), tabs);
        }
        let requests = requests.load(Ordering::SeqCst);
        // Without tabs: a 402 and a paid retry per call. With tabs: one 402, then vouchers.
        assert_eq!(requests, if tabs { 4 } else { 6 }, "tabs: {tabs}");
        assert_eq!(
            decisions.take(),
            requests,
            "one decision per request (tabs: {tabs})"
        );
        let asked = if tabs { requests } else { requests / 2 };
        assert_eq!(
            hook.take(),
            asked,
            "the hook once per request it prices (tabs: {tabs})"
        );
    }
}

/// Receiver `id` pricing `GET /api/search` at 0.05 USD and offering `paywall`'s x402 route
/// beside it (its records in `store`, else the registry's), in front of a handler that counts
/// its runs and answers `results #<run>`: its origin and the count.
async fn serve_counted_search(
    w: &common::World,
    id: &str,
    paywall: &Paywall,
    store: Option<Arc<dyn rail_core::KeyStore>>,
) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let (listener, base) = listen().await;
    let mut b = Receiver::builder(id, w.receiver_key.clone())
        .origin(&base)
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.05")).describe("one search"))
        .clock(Arc::new(w.clock.clone()));
    if let Some(s) = store {
        b = b.store(s);
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Binding::new(b.build().unwrap())
        .unwrap()
        .with_x402(paywall.clone())
        .unwrap()
        .apply(Router::new().route(
            "/api/search",
            get(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                async move { format!("results #{n}") }
            }),
        ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, runs)
}

/// `header` presented as `PAYMENT-SIGNATURE` on `url` by a plain HTTP client.
async fn present_x402(url: &str, header: &str) -> reqwest::Response {
    raw_client()
        .get(url)
        .header("payment-signature", header)
        .send()
        .await
        .unwrap()
}

/// `resp` is the 402 of an x402 payment used already: a fresh challenge naming EVM's "nonce
/// already used".
async fn assert_used(resp: reqwest::Response) {
    assert_eq!(resp.status(), 402);
    assert!(resp.headers().contains_key("payment-required"));
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(
        body["error"], "invalid_exact_evm_nonce_already_used",
        "{body}"
    );
}

/// A plain x402 client paying with `key` on `token`, up to 0.10 USDC a payment.
fn x402_client(key: &LocalSigner, token: &Token) -> x402_transport::client::Client {
    rail_x402::client::client(X402Payer::new(
        key.clone(),
        EvmPolicy::new(NET, token.address, U256::from(100_000)),
    ))
    .unwrap()
}

/// Decision 0038: an x402 payment on a Stipendex route is served under the receiver's one
/// served-once record. The same payment presented again after its answer was lost gets the kept
/// answer (with its `PAYMENT-RESPONSE`) and settles once; the handler runs once; for another
/// request the payment is refused as used, with a fresh challenge.
#[tokio::test]
async fn over_http_the_same_x402_payment_after_a_lost_answer_gets_the_kept_answer_and_settles_once()
{
    use std::sync::atomic::Ordering;
    let w = world().await;
    let pay_to = Address::repeat_byte(0x44);
    let EvmRoute {
        mock,
        token,
        key,
        paywall,
    } = evm_search_route(pay_to);
    let (base, runs) = serve_counted_search(&w, "search", &paywall, None).await;
    let x402 = x402_client(&key, &token);
    let first = x402
        .get(&format!("{base}/api/search?q=rust"))
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(&first.body[..], b"results #1");
    let settlement = first.headers["payment-response"].clone();
    let header = first.payment.expect("a payment").header_value().unwrap();
    let balances = || {
        (
            mock.balance(token.address, pay_to).unwrap(),
            mock.balance(token.address, key.address()).unwrap(),
        )
    };
    assert_eq!(balances(), (U256::from(50_000), U256::from(950_000)));

    // The answer was lost: the same payment again gets the kept answer, not a second run or
    // a second settlement.
    let again = present_x402(&format!("{base}/api/search?q=rust"), &header).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["payment-response"], settlement);
    assert_eq!(
        again.headers()["cache-control"].to_str().unwrap(),
        "private, no-store"
    );
    assert_eq!(&again.bytes().await.unwrap()[..], b"results #1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(balances(), (U256::from(50_000), U256::from(950_000)));

    // The same payment in another encoding (its JSON written with other whitespace and key
    // order): not the same presentation, so no kept answer — and not served again either.
    let mut envelope: serde_json::Value =
        x402_transport::wire::decode_base64_json(&header).unwrap();
    if let Some(o) = envelope.as_object_mut() {
        let x402_version = o.remove("x402Version").unwrap();
        o.insert("x402Version".into(), x402_version);
    }
    let reencoded = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .encode(serde_json::to_string_pretty(&envelope).unwrap())
    };
    assert_ne!(reencoded, header);
    assert_used(present_x402(&format!("{base}/api/search?q=rust"), &reencoded).await).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(balances(), (U256::from(50_000), U256::from(950_000)));

    // For another request the payment is used: a 402 with a fresh challenge naming it.
    assert_used(present_x402(&format!("{base}/api/search?q=other"), &header).await).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(balances(), (U256::from(50_000), U256::from(950_000)));
}

/// An x402 payment is served once across every surface that shares the store's served-once
/// mark (the x402 rail's Stipendex Proofs, a plain x402 paywall, another receiver): served by
/// one receiver, the same payment presented to another on the same store is refused as used,
/// and its work does not run.
#[tokio::test]
async fn an_x402_payment_served_by_one_surface_is_refused_by_another_on_the_same_store() {
    use std::sync::atomic::Ordering;
    let w = world().await;
    let pay_to = Address::repeat_byte(0x45);
    let EvmRoute {
        mock,
        token,
        key,
        paywall,
    } = evm_search_route(pay_to);
    let store: Arc<dyn rail_core::KeyStore> = Arc::new(rail_core::MemoryKeyStore::default());
    let (base_a, runs_a) = serve_counted_search(&w, "search", &paywall, Some(store.clone())).await;
    let (base_b, runs_b) = serve_counted_search(&w, "search-b", &paywall, Some(store)).await;
    let runs = || runs_a.load(Ordering::SeqCst) + runs_b.load(Ordering::SeqCst);
    let bases = [base_a, base_b];
    let x402 = x402_client(&key, &token);
    let first = x402
        .get(&format!("{}/api/search?q=rust", bases[0]))
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    let header = first.payment.expect("a payment").header_value().unwrap();

    assert_used(present_x402(&format!("{}/api/search?q=rust", bases[1]), &header).await).await;
    assert_eq!(runs(), 1);
    assert_eq!(
        mock.balance(token.address, pay_to).unwrap(),
        U256::from(50_000)
    );
}

/// A refused x402 payment leaves nothing used: the payer's settlement fails (no funds yet), the
/// 402 names the refusal and the work does not run; once funded, the same payment is served.
#[tokio::test]
async fn a_refused_x402_payment_leaves_nothing_used_and_is_served_once_funded() {
    use std::sync::atomic::Ordering;
    let w = world().await;
    let pay_to = Address::repeat_byte(0x46);
    // No funds yet.
    let EvmRoute {
        mock,
        token,
        key,
        paywall,
    } = evm_search_route_funded(pay_to, 0);
    let (base, runs) = serve_counted_search(&w, "search", &paywall, None).await;
    let x402 = x402_client(&key, &token);
    let refused = x402
        .get(&format!("{base}/api/search?q=rust"))
        .await
        .unwrap();
    assert_eq!(
        refused.status,
        402,
        "{:?}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let header = refused.payment.expect("a payment").header_value().unwrap();

    mock.mint(token.address, key.address(), U256::from(50_000))
        .unwrap();
    let served = present_x402(&format!("{base}/api/search?q=rust"), &header).await;
    assert_eq!(served.status(), 200);
    assert!(served.headers().contains_key("payment-response"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(
        mock.balance(token.address, pay_to).unwrap(),
        U256::from(50_000)
    );
}
