//! CEP-8 end to end on nwc-devnet: an rmcp server behind this crate's server transport and
//! `ServerPayments` (Lightning through the shop's own wallet), called by an rmcp client over
//! this crate's client transport, paying with a `LightningHandler`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Tools, call, text, world};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_free_tool_answers_and_a_priced_tool_is_paid_once() {
    let w = world().await;
    let tools = Tools::default();
    let server = w.server(tools.clone(), Some(w.payments(None))).await;
    let agent = w.agent("agent").await;
    let client = w.client(&server, Some(agent)).await;

    let tools_list = client.list_tools(None).await.unwrap();
    assert_eq!(tools_list.tools.len(), 2);

    let r = client.call_tool(call("echo", "hi")).await.unwrap();
    assert_eq!(text(&r), "echo: hi");
    assert_eq!(
        w.devnet.balance_msat("shop").unwrap(),
        0,
        "a free call costs nothing"
    );

    let r = tokio::time::timeout(
        Duration::from_secs(20),
        client.call_tool(call("search", "rust")),
    )
    .await
    .expect("answered in time")
    .unwrap();
    assert_eq!(text(&r), "search: rust");
    assert_eq!(
        w.devnet.balance_msat("shop").unwrap(),
        10_000,
        "10 sats paid"
    );
    assert_eq!(w.devnet.balance_msat("agent").unwrap(), 990_000);
    assert_eq!(tools.runs.load(Ordering::SeqCst), 2, "each call ran once");

    // A second call is a second payment.
    let r = client.call_tool(call("search", "again")).await.unwrap();
    assert_eq!(text(&r), "search: again");
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 20_000);
    client.cancel().await.unwrap();
    server.shutdown().await;
    let _ = Arc::clone(&w.shop);
}
