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

#[tokio::test]
async fn a_route_paywalled_through_the_hosted_facilitator_in_ten_lines() {
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
            review_above: None,
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
            Money::parse(Asset::usd(), "0.01").unwrap(),
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
    let wallet = Wallet::builder(w.wallet_key.clone(), mandate)
        .registry(&wallet_rails)
        .store(w.store.clone())
        .journal(Arc::new(MemoryJournal::default()))
        .principal(w.principal.public())
        .build()
        .unwrap();
    let client = Client::new(
        stipendex::http::reqwest_builder(std::time::Duration::from_secs(10)),
        wallet,
    )
    .unwrap();
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
