//! Interop with the ContextVM TypeScript SDK 0.11.14 (npm `@contextvm/sdk`, pinned in
//! `scripts/contextvm/package-lock.json`), both ways, on nwc-devnet's relay and wallets:
//!
//! - the SDK's client (`withClientPayments` + `LnBolt11NwcPaymentHandler`, NIP-04 NWC) pays this
//!   crate's server (`ServerPayments` + `NwcProcessor`);
//! - this crate's client (`WalletHandler`, a Stipendex wallet under its mandate) pays the SDK's
//!   server (`withServerPayments` + `LnBolt11NwcPaymentProcessor`).
//!
//! The scripts are `scripts/contextvm/client.mjs` and `server.mjs`. Without node or the SDK
//! installed (`scripts/setup-localnets`), the tests fail in CI and are skipped elsewhere.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Tools, call, stipendex_wallet, text, world};
use nwc_devnet::WalletSpec;
use serde_json::Value;
use stipendex_contextvm::payments::WalletHandler;

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/contextvm")
}

/// Whether node and the SDK are installed: a failure in CI, a visible skip elsewhere.
fn sdk_installed() -> bool {
    let node = Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let sdk = scripts()
        .join("node_modules/@contextvm/sdk/package.json")
        .is_file();
    if node && sdk {
        return true;
    }
    test_kit::localnet::missing(
        "ContextVM SDK",
        if node {
            "scripts/contextvm/node_modules is not installed (scripts/contextvm/install.sh)"
        } else {
            "node is not on PATH"
        },
    );
    false
}

/// Kills the child when the test ends, however it ends.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `client.mjs` with `args` to completion; its JSON lines.
fn sdk_client(args: &[&str]) -> (bool, Vec<Value>, String) {
    let out = Command::new("node")
        .arg(scripts().join("client.mjs"))
        .args(args)
        .env("CVM_TIMEOUT_MS", "20000")
        .output()
        .unwrap();
    let lines = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (
        out.status.success(),
        lines,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_client_pays_this_crates_server() {
    if !sdk_installed() {
        return;
    }
    let w = world().await;
    let tools = Tools::default();
    let server = w.server(tools.clone(), Some(w.payments(None))).await;
    let agent = w
        .devnet
        .create_wallet(WalletSpec::new("sdk-agent", 1_000_000))
        .await
        .unwrap();
    let (url, pk, uri) = (w.url(), server.public_key().to_hex(), agent.uri.to_string());
    let (ok, lines, err) = tokio::task::spawn_blocking(move || {
        sdk_client(&[
            "--relay",
            &url,
            "--server",
            &pk,
            "--nwc",
            &uri,
            "--list",
            "--tool",
            "echo",
            "--args",
            r#"{"q":"hi"}"#,
        ])
    })
    .await
    .unwrap();
    assert!(ok, "the SDK client failed: {lines:?}\n{err}");
    assert_eq!(lines[0]["tools"], serde_json::json!(["echo", "search"]));
    assert_eq!(lines[1]["text"], "echo: hi");

    let (url, pk, uri) = (w.url(), server.public_key().to_hex(), agent.uri.to_string());
    let (ok, lines, err) = tokio::task::spawn_blocking(move || {
        sdk_client(&[
            "--relay",
            &url,
            "--server",
            &pk,
            "--nwc",
            &uri,
            "--tool",
            "search",
            "--args",
            r#"{"q":"sats"}"#,
            "--count",
            "2",
        ])
    })
    .await
    .unwrap();
    assert!(ok, "the SDK client failed to pay: {lines:?}\n{err}");
    assert_eq!(lines.len(), 2);
    for l in &lines {
        assert_eq!(l["text"], "search: sats");
        assert_eq!(l["paid_sats"], 10);
    }
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 20_000);
    assert_eq!(w.devnet.balance_msat("sdk-agent").unwrap(), 980_000);
    assert_eq!(tools.runs.load(Ordering::SeqCst), 3);
    server.shutdown().await;
}

/// The SDK's server on the devnet's relay, paid into a new `sdk-shop` wallet: its key, and the
/// process (killed when dropped).
async fn sdk_server(w: &common::World) -> (String, Kill) {
    let shop = w
        .devnet
        .create_wallet(WalletSpec::new("sdk-shop", 0))
        .await
        .unwrap();
    let mut child = Command::new("node")
        .arg(scripts().join("server.mjs"))
        .args(["--relay", &w.url(), "--nwc", &shop.uri.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let kill = Kill(child);
    let pubkey = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line
    });
    let line = tokio::time::timeout(Duration::from_secs(30), pubkey)
        .await
        .expect("the SDK server started in time")
        .unwrap();
    let ready: Value = serde_json::from_str(&line).expect("a {\"pubkey\"} line");
    (ready["pubkey"].as_str().unwrap().to_owned(), kill)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_crates_wallet_pays_the_sdk_server() {
    if !sdk_installed() {
        return;
    }
    let w = world().await;
    let (pk, _server) = sdk_server(&w).await;
    let server_pk = nostr::PublicKey::from_hex(&pk).unwrap();

    let (wallet, journal) =
        stipendex_wallet(&w, "agent", std::slice::from_ref(&pk), 100, 1000).await;
    let t = stipendex_contextvm::transport::client::ClientTransport::connect(
        nostr::Keys::generate(),
        stipendex_contextvm::transport::client::ClientOptions::new(vec![w.url()], server_pk),
        Some(Arc::new(WalletHandler::new(wallet))),
    )
    .await
    .unwrap();
    let client = tokio::time::timeout(Duration::from_secs(20), rmcp::ServiceExt::serve((), t))
        .await
        .expect("initialized in time")
        .unwrap();
    let tools = client.list_tools(None).await.unwrap();
    let names: Vec<&str> = tools.tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["echo", "search"]);
    assert_eq!(
        text(&client.call_tool(call("echo", "hi")).await.unwrap()),
        "echo: hi"
    );
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(30),
        client.call_tool(call("search", "q")),
    )
    .await
    .expect("paid in time")
    .unwrap();
    assert_eq!(text(&r), "search: q");
    eprintln!("paid call to the SDK server: {:?}", started.elapsed());
    assert_eq!(w.devnet.balance_msat("sdk-shop").unwrap(), 10_000);
    assert_eq!(w.devnet.balance_msat("agent").unwrap(), 990_000);
    assert_eq!(journal.names().len(), 1, "one payment audited");
    client.cancel().await.unwrap();
}

/// A client that asks for explicit gating, facing 0.11.14 (which ignores `payment_interaction`
/// and sends a transparent `payment_required`): CEP-8's negotiation failed, so it pays nothing
/// automatically and the call ends with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asking_the_sdk_server_for_explicit_gating_pays_nothing() {
    if !sdk_installed() {
        return;
    }
    let w = world().await;
    let (pk, _server) = sdk_server(&w).await;
    let server_pk = nostr::PublicKey::from_hex(&pk).unwrap();
    let (wallet, journal) =
        stipendex_wallet(&w, "agent", std::slice::from_ref(&pk), 100, 1000).await;
    let mut opts =
        stipendex_contextvm::transport::client::ClientOptions::new(vec![w.url()], server_pk);
    opts.interaction = Some("explicit_gating".into());
    let t = stipendex_contextvm::transport::client::ClientTransport::connect(
        nostr::Keys::generate(),
        opts,
        Some(Arc::new(WalletHandler::new(wallet))),
    )
    .await
    .unwrap();
    let client = rmcp::ServiceExt::serve((), t).await.unwrap();
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        client.call_tool(call("search", "q")),
    )
    .await
    .expect("ended in time")
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("Payment declined by client policy"),
        "{err}"
    );
    assert_eq!(w.devnet.balance_msat("agent").unwrap(), 1_000_000);
    assert!(journal.names().is_empty());
    client.cancel().await.unwrap();
}
