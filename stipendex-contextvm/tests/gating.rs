//! CEP-8's explicit gating, built from the ContextVM documentation (0.11.14 has none): a
//! client that asks for `explicit_gating` gets `-32042 Payment Required` with the payment
//! option, `-32043 Payment Pending` while the payment is verified, and the result on a repeat
//! of the same invocation once paid — one run per payment; a server that accepts transparent
//! payments only answers `-32602` with what it supports.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Tools, call, text, world};
use nostr::Keys;
use rmcp::ServiceExt;
use rmcp::service::{RoleClient, RunningService, ServiceError};
use stipendex_contextvm::payments::notify::PaymentRequired;
use stipendex_contextvm::payments::server::Interaction;
use stipendex_contextvm::transport::client::{ClientOptions, ClientTransport, PaidRequest};

async fn explicit_client(
    w: &common::World,
    server: &stipendex_contextvm::transport::server::Server,
) -> RunningService<RoleClient, ()> {
    let mut opts = ClientOptions::new(vec![w.url()], server.public_key());
    opts.interaction = Some("explicit_gating".into());
    let t = ClientTransport::connect(Keys::generate(), opts, None)
        .await
        .unwrap();
    ().serve(t).await.unwrap()
}

fn code(e: &ServiceError) -> (i32, serde_json::Value) {
    match e {
        ServiceError::McpError(d) => (d.code.0, d.data.clone().unwrap_or_default()),
        other => panic!("not a JSON-RPC error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explicit_gating_asks_then_pends_then_runs_once_per_payment() {
    let w = world().await;
    let tools = Tools::default();
    let server = w.server(tools.clone(), Some(w.payments(None))).await;
    let client = explicit_client(&w, &server).await;

    // Free calls are not gated.
    assert_eq!(
        text(&client.call_tool(call("echo", "hi")).await.unwrap()),
        "echo: hi"
    );

    let (c, data) = code(&client.call_tool(call("search", "q")).await.unwrap_err());
    assert_eq!(c, -32042);
    let option: PaymentRequired =
        serde_json::from_value(data["payment_options"][0].clone()).unwrap();
    assert_eq!(option.amount, 10);
    assert_eq!(option.pmi, "bitcoin-lightning-bolt11");
    assert!(
        data["instructions"]
            .as_str()
            .unwrap()
            .contains("same method and params")
    );
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1, "only echo ran");

    // Not paid yet: the same invocation is pending.
    let (c, data) = code(&client.call_tool(call("search", "q")).await.unwrap_err());
    assert_eq!(c, -32043);
    assert!(data["retry_after"].as_u64().unwrap() >= 1);

    // The agent pays the option, then repeats the same call until it runs.
    let agent = w.agent("agent").await;
    let req = PaidRequest {
        server: server.public_key(),
        event_id: nostr::EventId::all_zeros(),
        message: serde_json::json!({}),
    };
    agent.pay(&req, &option).await.unwrap();
    let result = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match client.call_tool(call("search", "q")).await {
                Ok(r) => return r,
                Err(e) => {
                    assert_eq!(code(&e).0, -32043, "{e}");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    })
    .await
    .expect("ran in time");
    assert_eq!(text(&result), "search: q");
    assert_eq!(tools.runs.load(Ordering::SeqCst), 2);
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 10_000);

    // The authorization was consumed: the same call again, and another call, each need a
    // payment of their own.
    assert_eq!(
        code(&client.call_tool(call("search", "q")).await.unwrap_err()).0,
        -32042
    );
    assert_eq!(
        code(&client.call_tool(call("search", "other")).await.unwrap_err()).0,
        -32042
    );
    assert_eq!(tools.runs.load(Ordering::SeqCst), 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transparent_only_server_refuses_explicit_gating_with_32602() {
    let w = world().await;
    let tools = Tools::default();
    let payments = w.payments(None).interaction(Interaction::Transparent);
    let server = w.server(tools.clone(), Some(payments)).await;
    let client = explicit_client(&w, &server).await;

    assert_eq!(
        text(&client.call_tool(call("echo", "hi")).await.unwrap()),
        "echo: hi"
    );
    let (c, data) = code(&client.call_tool(call("search", "q")).await.unwrap_err());
    assert_eq!(c, -32602);
    assert_eq!(data["requested"], "explicit_gating");
    assert_eq!(data["supported"], serde_json::json!(["transparent"]));
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1);
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 0);
    let _ = Arc::clone(&w.shop);
    server.shutdown().await;
}
