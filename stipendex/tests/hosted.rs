//! A route paywalled through the hosted facilitator, exactly as the README shows it (the
//! receiver keeps no ledger and no store: the facilitator verifies each payment once), paid
//! by a Stipendex wallet whose rail is its own account at the same facilitator.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use common::{usd, world};
use rail_account::AccountKey;
use stipendex::envelope::{Allow, SecretKey};
use stipendex::http::{Binding, Client};
use stipendex::ledger::AccountId;
use stipendex::receiver::{PricedCapability, Receiver};
use stipendex::wallet::{MemoryJournal, Wallet};
use stipendex::{Asset, Money, Registry};
use stipendex_facilitator::{Config, NewAccount};

async fn forecast() -> &'static str {
    "sunny"
}

/// The facilitator with the agent's and weather's accounts, weather's route paywalled through
/// it, and a wallet paying from the agent's account (payments above `review_above` wait for
/// an operator's review).
struct Hosted {
    _dir: tempfile::TempDir,
    _w: common::World,
    fac: stipendex_facilitator::Facilitator,
    agent: AccountId,
    weather: AccountId,
    base: String,
    client: Client,
    wallet: Wallet,
    journal: Arc<MemoryJournal>,
}

#[tokio::test]
async fn a_route_paywalled_through_the_hosted_facilitator_in_ten_lines() {
    let h = hosted(None, "0.01").await;
    let (fac, agent, weather, base, client) = (&h.fac, h.agent, h.weather, &h.base, &h.client);
    let http = stipendex::http::reqwest_client(std::time::Duration::from_secs(10)).unwrap();
    let r = client.get(&format!("{base}/forecast")).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(&r.body[..], b"sunny");
    let receipt = r.receipt.expect("a signed receipt");
    assert_eq!(receipt.object().amount, "0.01".parse().unwrap());
    // The money moved at the facilitator, once.
    let ledger = fac.ledger();
    assert_eq!(
        ledger.account(agent).await.unwrap().unwrap().available(),
        499
    );
    assert_eq!(
        ledger
            .account(weather)
            .await
            .unwrap()
            .unwrap()
            .posted_balance(),
        1
    );
    // The same Proof presented again (its answer lost on the way) gets the same answer and
    // Receipt, and nothing more moves.
    let proof = r.paid.unwrap().proof.to_header();
    let replay = http
        .get(format!("{base}/forecast"))
        .header("stipendex-payment", &proof)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 200);
    assert_eq!(
        replay.headers()["stipendex-receipt"].to_str().unwrap(),
        receipt.to_header()
    );
    assert_eq!(&replay.bytes().await.unwrap()[..], b"sunny");
    assert_eq!(
        ledger
            .account(weather)
            .await
            .unwrap()
            .unwrap()
            .posted_balance(),
        1
    );
}

/// A payment held for review (issue 24): the wallet keeps it pending (counted, journaled,
/// listed by `Wallet::pending`); asked again before the decision it is still pending and is
/// not paid twice; once an operator approves, the agent's retry of the same request resumes
/// it — the first Quote's Proof is presented, not a fresh Quote paid — into one full chain
/// and one charge.
#[tokio::test]
async fn a_payment_held_for_review_is_resumed_into_one_chain_and_one_charge() {
    let h = hosted(Some(usd("0.05")), "0.10").await;
    let url = format!("{}/forecast", h.base);
    let ledger = h.fac.ledger();
    let available = || async { ledger.account(h.agent).await.unwrap().unwrap().available() };
    for _ in 0..2 {
        let e = h.client.get(&url).await.unwrap_err();
        assert_eq!(e.code(), "pending_review", "{e}");
        let pending = h.wallet.pending().await.unwrap();
        assert_eq!(
            pending.len(),
            1,
            "one payment pending, whatever the retries"
        );
        assert_eq!(available().await, 490, "reserved once");
    }
    let pending = h.wallet.pending().await.unwrap().remove(0);
    let queue = h
        .fac
        .reviews(Some(stipendex_facilitator::store::ReviewState::Pending), 10)
        .await
        .unwrap();
    assert_eq!(queue.len(), 1);
    h.fac
        .approve(&queue[0].payment_id, "ops@test", None)
        .await
        .unwrap();

    let r = h.client.get(&url).await.unwrap();
    assert_eq!((r.status.as_u16(), &r.body[..]), (200, &b"sunny"[..]));
    let paid = r.paid.unwrap();
    let quote = stipendex::envelope::Signed::<stipendex::envelope::Quote>::parse(
        paid.proof.object().quote_jws.as_deref().unwrap(),
    )
    .unwrap();
    assert_eq!(
        stipendex::wallet::chain_name("weather", &quote.object().id),
        pending.chain,
        "the first quote's proof was presented"
    );
    assert!(h.wallet.pending().await.unwrap().is_empty());
    assert_eq!(h.journal.names(), vec![pending.chain.clone()]);
    let chain = h.journal.chain(&pending.chain);
    assert_eq!(chain.len(), 4, "mandate, quote, proof, receipt");
    let objects: Vec<&str> = chain.iter().map(String::as_str).collect();
    stipendex::chain::verify_chain(&objects, Some(&h._w.principal.public())).unwrap();
    assert_eq!(available().await, 490);
    assert_eq!(
        ledger
            .account(h.weather)
            .await
            .unwrap()
            .unwrap()
            .posted_balance(),
        10,
        "paid once"
    );
}

async fn hosted(review_above: Option<Money>, price: &str) -> Hosted {
    // The facilitator (an operator runs `stipendex facilitator serve`), with two accounts.
    let dir = tempfile::tempdir().unwrap();
    let fac = stipendex_facilitator::open(
        &format!("sqlite://{}/fac.db", dir.path().display()),
        None,
        Config::new("facilitator.test"),
        None,
    )
    .await
    .unwrap();
    let (agent, weather) = (AccountId::random(), AccountId::random());
    let (agent_key, weather_account_key) = (AccountKey::generate(), AccountKey::generate());
    for (id, key) in [(agent, &agent_key), (weather, &weather_account_key)] {
        fac.create_account(NewAccount {
            id: Some(id),
            key: key.public(),
            asset: Asset::usd(),
            review_above: if id == agent {
                review_above.clone()
            } else {
                None
            },
            label: String::new(),
        })
        .await
        .unwrap();
    }
    fac.fund(agent, &usd("5.00"), "deposit-1").await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let facilitator = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(stipendex_facilitator::serve(
        listener,
        fac.clone(),
        std::future::pending(),
    ));

    let receiver_toml = format!(
        r#"
        [rails.hosted]
        kind = "account"
        url = "{facilitator}"
        network = "facilitator.test"
        payee_account = "{weather}"
        payee_key_env = "WEATHER_ACCOUNT_KEY"
        "#
    );
    let env: BTreeMap<String, String> = [
        (
            "WEATHER_ACCOUNT_KEY".to_owned(),
            weather_account_key.to_hex().to_string(),
        ),
        (
            "AGENT_ACCOUNT_KEY".to_owned(),
            agent_key.to_hex().to_string(),
        ),
    ]
    .into();
    let weather_key = SecretKey::generate();

    // ---- The README's lines: a receiver paywalling a route through the facilitator. ----
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let registry = Registry::from_toml(&receiver_toml, &env).await.unwrap();
    let receiver = Receiver::builder("weather", weather_key.clone())
        .origin(&base)
        .registry(&registry)
        .price(PricedCapability::fixed(
            "GET",
            "/forecast",
            Money::parse(Asset::usd(), price).unwrap(),
        ))
        .build()
        .unwrap();
    let app = Binding::new(receiver)
        .unwrap()
        .apply(Router::new().route("/forecast", get(forecast)));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    // ---- end of the README's lines. ----

    // A wallet paying from its own account at the facilitator, under a mandate.
    let w = world().await;
    let wallet_toml = format!(
        r#"
        [store]
        url = "memory"
        [rails.hosted]
        kind = "account"
        url = "{facilitator}"
        network = "facilitator.test"
        payer_account = "{agent}"
        payer_key_env = "AGENT_ACCOUNT_KEY"
        "#
    );
    let wallet_rails = Registry::from_toml(&wallet_toml, &env).await.unwrap();
    let mandate = w.mandate(|m| {
        m.allow.push(Allow::Receiver {
            id: "weather".into(),
            key: weather_key.public(),
            origins: vec![base.clone()],
        });
    });
    let journal = Arc::new(MemoryJournal::default());
    let wallet = Wallet::builder(w.wallet_key.clone(), mandate)
        .registry(&wallet_rails)
        .store(w.store.clone())
        .journal(journal.clone())
        .principal(w.principal.public())
        .build()
        .unwrap();
    let client = Client::new(
        stipendex::http::reqwest_builder(std::time::Duration::from_secs(10)),
        wallet.clone(),
    )
    .unwrap();
    Hosted {
        _dir: dir,
        _w: w,
        fac,
        agent,
        weather,
        base,
        client,
        wallet,
        journal,
    }
}
