//! Public announcements: the server's `initialize` result (kind 11316, with its `pmi` and `cap`
//! tags) and its tools list (kind 11317, with the `cap` tags), in the clear, signed by the
//! server's key, read back from the relay by anyone.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::time::Duration;

use common::{Tools, world};
use nostr::{Filter, Kind};

fn tag<'a>(ev: &'a nostr::Event, name: &str) -> Vec<Vec<&'a str>> {
    ev.tags
        .iter()
        .filter(|t| t.kind() == nostr::TagKind::custom(name))
        .map(|t| t.as_slice().iter().skip(1).map(String::as_str).collect())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_announces_itself_its_tools_and_their_prices() {
    let w = world().await;
    let server = w.server(Tools::default(), Some(w.payments(None))).await;
    let published = server.announce().await.unwrap();
    assert_eq!(
        published
            .iter()
            .map(|e| e.kind.as_u16())
            .collect::<Vec<_>>(),
        [11316, 11317],
        "a tools-only server announces itself and its tools"
    );

    let reader = nostr_sdk::Client::default();
    reader.add_relay(w.url()).await.unwrap();
    reader.connect().await;
    let events = reader
        .fetch_events(
            Filter::new()
                .author(server.public_key())
                .kinds([Kind::from(11316), Kind::from(11317)]),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let by = |k: u16| {
        events
            .iter()
            .find(|e| e.kind.as_u16() == k)
            .unwrap_or_else(|| panic!("no kind {k} on the relay"))
    };
    let server_ev = by(11316);
    server_ev.verify().unwrap();
    let init: serde_json::Value = serde_json::from_str(&server_ev.content).unwrap();
    assert!(init["capabilities"]["tools"].is_object(), "{init}");
    assert_eq!(tag(server_ev, "pmi"), [["bitcoin-lightning-bolt11"]]);
    assert!(
        tag(server_ev, "cap").contains(&vec!["tool:search", "10", "sats"]),
        "{:?}",
        server_ev.tags
    );
    assert!(
        server_ev
            .tags
            .iter()
            .any(|t| t.as_slice() == ["support_encryption"])
    );
    let tools_ev = by(11317);
    let tools: serde_json::Value = serde_json::from_str(&tools_ev.content).unwrap();
    let names: Vec<&str> = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["echo", "search"]);
    assert!(tag(tools_ev, "cap").contains(&vec!["tool:search", "10", "sats"]));
    assert!(
        tag(tools_ev, "pmi").is_empty(),
        "list announcements carry cap tags only"
    );
    reader.shutdown().await;
    server.shutdown().await;
}
