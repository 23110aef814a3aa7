//! The wallet pays an x402-style MCP `isError` result under its mandate: the exact-algo board's
//! MCP server (rmcp, Streamable HTTP, the shared MCP paywall) on the algod devnet answers an
//! unpaid `post_read` with `isError` and the payment requirement in `structuredContent`; the
//! wallet reads it, pays within its mandate (allowlisted by server and payTo) and the host
//! retries with `params._meta["x402/payment"]`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use algod_devnet::{Devnet, DevnetConfig};
use common::world;
use ed25519_dalek::SigningKey;
use rail_core::SystemClock;
use rail_exact_algo::{AlgodClient, ExactAlgoPayer, ExactAlgoReceiver, Policy};
use serde_json::{Value, json};
use stipendex::envelope::{Allow, Limits};
use stipendex::wallet::{Answer, Callback, ChallengePaid, Demand, Required, Source, Wallet};

fn addr(k: &SigningKey) -> rail_exact_algo::Address {
    rail_exact_algo::Address(k.verifying_key().to_bytes())
}

async fn rpc(http: &reqwest::Client, url: &str, body: Value) -> Value {
    let r = http
        .post(url)
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    r.json().await.unwrap()
}

#[tokio::test]
async fn the_wallet_pays_an_mcp_is_error_result_under_its_mandate() {
    let w = world().await;
    let payer_key = SigningKey::from_bytes(&[4; 32]);
    let treasury = addr(&SigningKey::from_bytes(&[5; 32]));
    let net = Devnet::spawn(
        DevnetConfig {
            accounts: vec![(addr(&payer_key), 5_000_000), (treasury, 100_000)],
            ..DevnetConfig::default()
        },
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let algod = AlgodClient::new(&net.url, None).unwrap();
    let store = Arc::new(rail_core::MemoryKeyStore::default());
    let receiver = ExactAlgoReceiver::connect(
        algod.clone(),
        treasury,
        store.clone(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let app = algod_devnet::example::example_app(&receiver, 2_000);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mcp = format!("http://{}/mcp", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = stipendex::http::reqwest_client(std::time::Duration::from_secs(10)).unwrap();

    let algo_payer = ExactAlgoPayer::new(
        payer_key,
        algod,
        Policy::default(),
        Arc::new(rail_core::MemoryKeyStore::default()),
        Arc::new(SystemClock),
    )
    .for_client()
    .await
    .unwrap();
    let wallet_over = |allow: bool, rails: Option<Vec<String>>| {
        let mandate = w.mandate(|m| {
            m.rails = rails;
            m.limits.push(Limits {
                asset: stipendex::Asset::algo(),
                per_call: Some("0.01".parse().unwrap()),
                per_period: None,
                total: Some("1".parse().unwrap()),
                per_receiver: None,
                confirm_above: None,
                tab_cap: None,
                open_tabs: None,
            });
            if allow {
                m.allow.push(Allow::X402Mcp {
                    server: mcp.clone(),
                    pay_to: treasury.to_string(),
                });
            }
        });
        Wallet::builder(w.wallet_key.clone(), mandate)
            .store(w.store.clone())
            .scheme_payer(Arc::new(algo_payer.clone()))
            .journal(w.journal.clone())
            .build()
            .unwrap()
    };
    let wallet = |allow: bool| wallet_over(allow, None);

    let call = |meta: Option<Value>| {
        let mut params = json!({"name": "post_read", "arguments": {"post_id": "1"}});
        if let Some(m) = meta {
            params["_meta"] = m;
        }
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params})
    };
    let unpaid = rpc(&http, &mcp, call(None)).await;
    let result = &unpaid["result"];
    let required = Required::from_mcp_result(result).expect("an x402 payment requirement");

    // Not allowlisted: denied.
    let err = wallet(false)
        .pay_challenge(&Source::mcp(&mcp), &required)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "denied", "{err}");

    // Through the wallet's engine, the denial is told to the confirmer the binding passed (its
    // call's), not to the wallet's own.
    let told = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = told.clone();
    let call_confirmer = Callback::new(|_| Answer::No { why: "no".into() }).on_denial(move |_| {
        counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    });
    let source = Source::mcp(&mcp);
    let demand = Demand::Challenge {
        source: &source,
        required: &required,
    };
    let err = wallet(false)
        .settle_demand(demand, &call_confirmer)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "denied", "{err}");
    assert_eq!(told.load(std::sync::atomic::Ordering::SeqCst), 1);

    // Allowlisted, but the mandate allows only other rails: a challenge is not a way around
    // `rails` — denied, nothing signed, nothing counted.
    let err = wallet_over(true, Some(vec!["ledger".into()]))
        .pay_challenge(&Source::mcp(&mcp), &required)
        .await
        .unwrap_err();
    assert_eq!(err.code(), "denied", "{err}");
    assert!(
        err.to_string()
            .contains("does not allow paying over exact-algo"),
        "{err}"
    );
    // Its own rail listed: paid as without a list (below).
    wallet_over(true, Some(vec!["exact-algo".into()]))
        .pay_challenge(&Source::mcp(&mcp), &required)
        .await
        .unwrap();

    // Allowlisted by server and payTo: paid; the retry returns the post.
    let paid = wallet(true)
        .pay_challenge(&Source::mcp(&mcp), &required)
        .await
        .unwrap();
    assert_eq!(
        paid.amount,
        stipendex::Money::parse(stipendex::Asset::algo(), "0.002").unwrap()
    );
    let meta = json!({ ChallengePaid::MCP_META: paid.envelope });
    let answer = rpc(&http, &mcp, call(Some(meta))).await;
    let result = &answer["result"];
    assert_ne!(result["isError"], true, "{answer}");
    assert!(
        result["structuredContent"]["post"]["body"].is_string(),
        "{answer}"
    );
    assert!(
        result["_meta"]["x402/payment-response"].is_object(),
        "{answer}"
    );
}
