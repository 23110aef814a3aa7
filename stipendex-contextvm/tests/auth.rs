//! A relay that asks for NIP-42 authentication (for reading and for writing) is answered: the
//! server and the client each authenticate with their own Nostr key, and a call goes through.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use common::{Tools, call, text};
use nostr::Keys;
use nostr_relay_builder::prelude::{
    LocalRelay, RateLimit, RelayBuilder, RelayBuilderNip42, RelayBuilderNip42Mode,
};
use rmcp::ServiceExt;
use stipendex_contextvm::transport::client::{ClientOptions, ClientTransport};
use stipendex_contextvm::transport::server::{Server, ServerOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_asking_for_nip42_authentication_is_answered() {
    let relay = LocalRelay::new(
        RelayBuilder::default()
            .addr(IpAddr::V4(Ipv4Addr::LOCALHOST))
            .rate_limit(RateLimit {
                max_reqs: 500,
                notes_per_minute: 1_000_000,
            })
            .nip42(RelayBuilderNip42 {
                mode: RelayBuilderNip42Mode::Both,
            }),
    );
    relay.run().await.unwrap();
    let url = relay.url().await.to_string();

    // The control: a client that cannot authenticate (no signer) is refused.
    let anon = nostr_sdk::Client::default();
    anon.add_relay(&url).await.unwrap();
    anon.connect().await;
    anon.wait_for_connection(Duration::from_secs(5)).await;
    let ev = nostr::EventBuilder::text_note("hi")
        .sign_with_keys(&Keys::generate())
        .unwrap();
    let out = anon.send_event(&ev).await.unwrap();
    assert!(
        out.success.is_empty(),
        "the relay took an unauthenticated event: {out:?}"
    );
    anon.shutdown().await;
    let tools = Tools::default();
    let t = tools.clone();
    let server = Server::start(
        Keys::generate(),
        ServerOptions::new(vec![url.clone()]),
        move || t.clone(),
        None,
    )
    .await
    .unwrap();
    let transport = ClientTransport::connect(
        Keys::generate(),
        ClientOptions::new(vec![url], server.public_key()),
        None,
    )
    .await
    .unwrap();
    let client = tokio::time::timeout(Duration::from_secs(15), ().serve(transport))
        .await
        .expect("initialized through an authenticating relay")
        .unwrap();
    let r = client
        .call_tool(call("echo", "authenticated"))
        .await
        .unwrap();
    assert_eq!(text(&r), "echo: authenticated");
    client.cancel().await.unwrap();
    server.shutdown().await;
    relay.shutdown();
}
