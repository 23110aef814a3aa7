//! CEP-8 end to end on nwc-devnet: an rmcp server behind this crate's server transport and
//! `ServerPayments` (Lightning through the shop's own wallet), called by an rmcp client over
//! this crate's client transport, paying with a `LightningHandler`.
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

/// The hook rejects `secret` (no payment request is made, the client's handler is never
/// called, nothing runs), waives `prepaid` (runs free), and quotes `search` with `meta`, which
/// reaches the client in `payment_required`'s `_meta`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_makes_no_payment_request_and_waive_runs_free() {
    use stipendex::receiver::{Decision, PricedCapability, Request, ResolvePrice};
    let w = world().await;
    let hook: Arc<dyn ResolvePrice> =
        Arc::new(
            |cap: &PricedCapability, req: &Request| match req.name.as_str() {
                "secret" => Decision::reject("Access denied"),
                "prepaid" => Decision::Waive,
                _ => Decision::quote(cap.price.clone()),
            },
        );
    let tools = Tools::default();
    let server = w.server(tools.clone(), Some(w.payments(Some(hook)))).await;
    let watch = Arc::new(common::Watch::new(w.agent("agent").await));
    let client = w.client(&server, Some(watch.clone())).await;

    let err = tokio::time::timeout(
        Duration::from_secs(10),
        client.call_tool(call("secret", "x")),
    )
    .await
    .expect("ended in time")
    .unwrap_err();
    assert!(
        err.to_string().contains("Payment rejected: Access denied"),
        "{err}"
    );
    assert_eq!(watch.seen.load(Ordering::SeqCst), 0, "no payment was asked");
    assert_eq!(tools.runs.load(Ordering::SeqCst), 0, "nothing ran");

    let r = client.call_tool(call("prepaid", "y")).await.unwrap();
    assert_eq!(text(&r), "prepaid: y");
    assert_eq!(
        watch.seen.load(Ordering::SeqCst),
        0,
        "waived: nothing to pay"
    );
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 0);
    server.shutdown().await;
}

/// A priced request whose payment never comes is never forwarded: at the TTL the server says
/// `payment_rejected` and the client's call ends; the invoice expired with the TTL, so paying
/// it late is refused by the wallet and the shop is never paid for nothing it served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unpaid_request_is_never_forwarded_and_a_late_payment_is_refused() {
    let w = world().await;
    let tools = Tools::default();
    let payments = w.payments(None).ttl(Duration::from_secs(2));
    let server = w.server(tools.clone(), Some(payments)).await;
    let agent = w.agent("agent").await;
    let mut watch = common::Watch::new(agent.clone());
    watch.pay = false;
    let watch = Arc::new(watch);
    let client = w.client(&server, Some(watch.clone())).await;

    let err = tokio::time::timeout(
        Duration::from_secs(15),
        client.call_tool(call("search", "x")),
    )
    .await
    .expect("ended in time")
    .unwrap_err();
    assert!(err.to_string().contains("Payment rejected"), "{err}");
    assert_eq!(
        tools.runs.load(Ordering::SeqCst),
        0,
        "never forwarded unpaid"
    );
    let required = watch
        .last
        .lock()
        .unwrap()
        .clone()
        .expect("a payment request");
    assert_eq!(required.amount, 10);
    assert_eq!(required.ttl, Some(2));

    // Paying it now: the invoice has expired.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let request = stipendex_contextvm::transport::client::PaidRequest {
        server: server.public_key(),
        event_id: nostr::EventId::all_zeros(),
        message: serde_json::json!({}),
    };
    let late = agent.pay(&request, &required).await;
    assert!(late.is_err(), "a late payment went through: {late:?}");
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 0);
    server.shutdown().await;
}

/// Two clients, three priced calls each, all at once: six payments, six runs, each answer to
/// its own caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_priced_requests_from_two_clients_are_each_paid_once() {
    let w = world().await;
    let tools = Tools::default();
    let server = w.server(tools.clone(), Some(w.payments(None))).await;
    let a = w.client(&server, Some(w.agent("a").await)).await;
    let b = w.client(&server, Some(w.agent("b").await)).await;
    let calls = (0..3).flat_map(|i| [(&a, format!("a{i}")), (&b, format!("b{i}"))]);
    let results = futures::future::join_all(calls.map(|(c, q)| async move {
        let r = tokio::time::timeout(Duration::from_secs(30), c.call_tool(call("search", &q)))
            .await
            .expect("answered in time")
            .unwrap();
        (q, text(&r))
    }))
    .await;
    for (q, t) in &results {
        assert_eq!(t, &format!("search: {q}"));
    }
    assert_eq!(tools.runs.load(Ordering::SeqCst), 6);
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 60_000);
    assert_eq!(w.devnet.balance_msat("a").unwrap(), 970_000);
    assert_eq!(w.devnet.balance_msat("b").unwrap(), 970_000);
    server.shutdown().await;
}

/// The relay restarts between `payment_required` and the payment: both sides reconnect and
/// resubscribe, the shop's wallet sees the payment, the answer arrives, paid once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_restart_mid_payment_loses_nothing() {
    let w = Arc::new(world().await);
    let tools = Tools::default();
    let server = w.server(tools.clone(), Some(w.payments(None))).await;
    let mut watch = common::Watch::new(w.agent("agent").await);
    let restarts = w.clone();
    watch.before = Some(Box::new(move || {
        let w = restarts.clone();
        Box::pin(async move {
            w.devnet.restart_relay().await.unwrap();
        })
    }));
    let client = w.client(&server, Some(Arc::new(watch))).await;
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        client.call_tool(call("search", "storm")),
    )
    .await
    .expect("answered in time")
    .unwrap();
    assert_eq!(text(&r), "search: storm");
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1);
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 10_000);
    // The session goes on after the restart.
    let r = client.call_tool(call("echo", "after")).await.unwrap();
    assert_eq!(text(&r), "echo: after");
    server.shutdown().await;
}

/// What is priced is the receiver's one route table: an explicit wildcard (`private://*`) prices
/// every resource under it, the most specific pattern wins, and what no pattern names is free —
/// the same decision as the HTTP binding's and the MCP gate's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wildcards_price_what_they_name_and_nothing_else() {
    use rail_core::ReceiverHandle;
    use stipendex::envelope::SecretKey;
    use stipendex::receiver::{PricedCapability, Receiver};
    use stipendex_contextvm::payments::{NwcProcessor, ServerPayments};
    use stipendex_contextvm::transport::server::Middleware as _;

    let w = world().await;
    let receiver = Receiver::builder("shop", SecretKey::generate())
        .rail(
            "ln-nwc",
            ReceiverHandle::with_holds(w.shop_receiver.clone()),
        )
        .price(PricedCapability::fixed(
            "resources/read",
            "private://*",
            common::sats(5),
        ))
        .price(PricedCapability::fixed(
            "tools/call",
            "search_*",
            common::sats(10),
        ))
        .build()
        .unwrap();
    let payments = ServerPayments::new(
        receiver,
        vec![Arc::new(NwcProcessor::new(
            w.shop_receiver.clone(),
            w.shop.clone(),
        ))],
    )
    .unwrap();
    let read = |uri: &str| serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "resources/read", "params": {"uri": uri}});
    let tool = |name: &str| serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name}});
    assert!(payments.holds(&read("private://reports/2026")).is_some());
    assert!(payments.holds(&read("public://readme")).is_none());
    assert!(payments.holds(&tool("search_web")).is_some());
    assert!(payments.holds(&tool("echo")).is_none());
    assert!(
        payments
            .holds(&serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
            .is_none()
    );
    let cap: Vec<Vec<String>> = payments
        .list_tags()
        .iter()
        .map(|t| t.as_slice().to_vec())
        .collect();
    assert!(cap.contains(&vec![
        "cap".into(),
        "resource:private://*".into(),
        "5".into(),
        "sats".into()
    ]));
}
