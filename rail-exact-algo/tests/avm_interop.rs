#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::print_stderr,
    missing_docs
)]
//! Interop with the x402-avm SDK (PyPI 2.0.2, `scripts/x402-avm/peer.py` in the virtualenv
//! `scripts/x402-avm/install.sh` makes), all four ways, on the algod devnet posing as Algorand
//! testnet (its genesis id and hash, and USDC as ASA 10458941: the SDK knows only testnet's and
//! mainnet's network ids):
//!
//! 1. the SDK's client pays this crate's paywall (our facilitator, with and without a fee payer);
//! 2. this crate's payer pays a server built with the SDK, settling through the SDK's facilitator;
//! 3. the SDK's facilitator settles what this crate's payer signed, for this crate's paywall;
//! 4. this crate's facilitator settles what the SDK's client signed, for the SDK's server.
//!
//! The SDK's algod URL is always set (`ALGOD_TESTNET_URL`; unset, it would use a public node).
//! Without the virtualenv the tests report SKIPPED, and fail in CI.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use algod_devnet::{Devnet, DevnetConfig, RunningDevnet, TESTNET_USDC};
use axum::Router;
use axum::routing::get;
use ed25519_dalek::SigningKey;
use rail_core::{KeyStore, MemoryKeyStore};
use rail_exact_algo::AlgodClient;
use rail_exact_algo::address::Address;
use rail_exact_algo::avm::{
    AvmFacilitator, AvmPayer, AvmPolicy, ExactAvm, FeePayer, RemoteFacilitator,
};
use serde_json::Value;
use x402_transport::Accepts;
use x402_transport::client::Client;
use x402_transport::paywall::Paywall;
use x402_transport::settle::SettleWhen;

const PRICE: u64 = 10_000; // $0.01 in USDC base units
const STARTUP: Duration = Duration::from_secs(60);

fn python() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("X402_AVM_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = PathBuf::from(
        std::env::var("X402_AVM_VENV").unwrap_or_else(|_| "/var/tmp/x402-avm-venv".into()),
    )
    .join("bin/python");
    venv.exists().then_some(venv)
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/x402-avm/peer.py")
}

fn need_python() -> Option<PathBuf> {
    let p = python();
    if p.is_none() {
        test_kit::localnet::missing(
            "the x402-avm SDK (PyPI 2.0.2)",
            "no /var/tmp/x402-avm-venv; scripts/x402-avm/install.sh (run by scripts/setup-localnets) makes it",
        );
    }
    p
}

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

/// A child process killed (and reaped) when dropped.
struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the SDK's `role` (facilitator or server) and returns it with its URL.
fn start(python: &PathBuf, role: &str, env: &[(&str, String)]) -> (Proc, String) {
    let mut cmd = Command::new(python);
    cmd.arg(script()).arg(role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start the SDK's {role}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let proc = Proc { child };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + STARTUP;
    loop {
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => {
                if let Some((_, url)) = line.split_once("listening on ") {
                    return (proc, url.trim().to_owned());
                }
            }
            Err(e) => panic!("the SDK's {role}: no 'listening on' line within {STARTUP:?}: {e}"),
        }
    }
}

/// The SDK's client pays `url` once; its JSON summary.
fn sdk_pays(python: &PathBuf, algod: &str, payer: &SigningKey, url: &str) -> Value {
    let out = Command::new(python)
        .arg(script())
        .args(["client", url])
        .env("ALGOD_TESTNET_URL", algod)
        .env("AVM_PAYER_SEED", hex::encode(payer.to_bytes()))
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "the SDK's client failed");
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the SDK's client printed {text:?}: {e}"))
}

struct World {
    net: RunningDevnet,
    algod: AlgodClient,
    payer: SigningKey,
    merchant: Address,
    fee_payer: SigningKey,
    store: Arc<dyn KeyStore>,
}

async fn world() -> World {
    let (issuer, payer, merchant, fee_payer) = (key(0x61), key(0x62), key(0x63), key(0x64));
    let net = Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (addr(&issuer), 10_000_000),
                (addr(&payer), 1_000_000),
                (addr(&merchant), 1_000_000),
                (addr(&fee_payer), 10_000_000),
            ],
            ..DevnetConfig::testnet(addr(&issuer))
        },
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let d = &net.devnet;
    d.opt_in(addr(&payer), TESTNET_USDC).unwrap();
    d.fund_asset(addr(&payer), TESTNET_USDC, 1_000_000).unwrap();
    d.opt_in(addr(&merchant), TESTNET_USDC).unwrap();
    let algod = AlgodClient::new(&net.url, None).unwrap();
    World {
        net,
        algod,
        payer,
        merchant: addr(&merchant),
        fee_payer,
        store: Arc::new(MemoryKeyStore::default()),
    }
}

impl World {
    async fn facilitator(&self, with_fee_payer: bool) -> AvmFacilitator {
        AvmFacilitator::connect(
            self.algod.clone(),
            with_fee_payer.then(|| FeePayer::new(self.fee_payer.clone())),
            self.store.clone(),
        )
        .await
        .unwrap()
    }

    fn usdc(&self, a: &Address) -> Option<u64> {
        self.net.devnet.asset_balance(a, TESTNET_USDC)
    }

    async fn client(&self) -> Client {
        let payer = AvmPayer::connect(
            self.payer.clone(),
            self.algod.clone(),
            AvmPolicy::usdc(100_000),
        )
        .await
        .unwrap();
        Client::new(reqwest::Client::builder().timeout(Duration::from_secs(30)))
            .unwrap()
            .with_payer(Arc::new(payer))
    }
}

async fn paywall(scheme: ExactAvm, when: SettleWhen) -> String {
    let paywall = Paywall::new().settle(when).route(
        "/paid",
        "a paid thing",
        Accepts::one(Arc::new(scheme), u128::from(PRICE)).unwrap(),
    );
    let app = paywall.apply(Router::new().route("/paid", get(|| async { "paid content" })));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/paid", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn serve_facilitator(f: AvmFacilitator) -> String {
    let app = rail_exact_algo::avm::server::router(f);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_client_pays_this_crates_paywall() {
    let Some(py) = need_python() else { return };
    for (with_fee_payer, when) in [(true, SettleWhen::After), (false, SettleWhen::Before)] {
        let w = world().await;
        let url = paywall(
            ExactAvm::usdc(w.facilitator(with_fee_payer).await, w.merchant),
            when,
        )
        .await;
        let algo_before = w.net.devnet.balance(&addr(&w.payer));
        let (python, algod, payer) = (py.clone(), w.net.url.clone(), w.payer.clone());
        let out = tokio::task::spawn_blocking(move || sdk_pays(&python, &algod, &payer, &url))
            .await
            .unwrap();
        assert_eq!(out["status"], 200, "fee payer {with_fee_payer}: {out}");
        assert_eq!(out["body"], "paid content");
        assert_eq!(out["paymentResponse"]["success"], true);
        assert_eq!(out["paymentResponse"]["payer"], addr(&w.payer).to_string());
        assert_eq!(w.usdc(&w.merchant), Some(PRICE));
        let fee = if with_fee_payer { 0 } else { 1_000 };
        assert_eq!(w.net.devnet.balance(&addr(&w.payer)), algo_before - fee);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_crates_payer_pays_a_server_built_with_the_sdk() {
    let Some(py) = need_python() else { return };
    let w = world().await;
    let algod = ("ALGOD_TESTNET_URL", w.net.url.clone());
    let (_fac, fac_url) = start(
        &py,
        "facilitator",
        &[
            algod.clone(),
            ("AVM_FEE_PAYER_SEED", hex::encode(w.fee_payer.to_bytes())),
        ],
    );
    let (_srv, srv_url) = start(
        &py,
        "server",
        &[
            algod,
            ("FACILITATOR_URL", fac_url),
            ("PAY_TO", w.merchant.to_string()),
            ("PRICE", "$0.01".into()),
        ],
    );
    let paid = w
        .client()
        .await
        .get(&format!("{srv_url}/paid"))
        .await
        .unwrap();
    assert_eq!(
        paid.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&paid.body)
    );
    let response = paid.response.unwrap();
    assert_eq!(response["success"], true);
    assert_eq!(w.usdc(&w.merchant), Some(PRICE), "$0.01 is 10 000 µUSDC");
    assert_eq!(
        w.net.devnet.balance(&addr(&w.fee_payer)),
        10_000_000 - 2_000
    );
    // The SDK's facilitator answers the group's first transaction (the fee payer's), not the
    // payment as the spec says: a client must not assume the id names the transfer.
    let envelope = paid.payment.unwrap().envelope;
    let first = rail_exact_algo::avm::verify::decode_member(
        0,
        envelope["payload"]["paymentGroup"][0].as_str().unwrap(),
    )
    .unwrap();
    assert_eq!(response["transaction"], first.txn().id());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdks_facilitator_settles_what_this_crates_payer_signed() {
    let Some(py) = need_python() else { return };
    let w = world().await;
    let (_fac, fac_url) = start(
        &py,
        "facilitator",
        &[
            ("ALGOD_TESTNET_URL", w.net.url.clone()),
            ("AVM_FEE_PAYER_SEED", hex::encode(w.fee_payer.to_bytes())),
        ],
    );
    let remote = RemoteFacilitator::new(&fac_url, Duration::from_secs(30)).unwrap();
    let scheme = ExactAvm::usdc(w.facilitator(false).await, w.merchant)
        .settled_by(remote)
        .await
        .unwrap();
    let url = paywall(scheme, SettleWhen::After).await;
    let paid = w.client().await.get(&url).await.unwrap();
    assert_eq!(
        paid.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&paid.body)
    );
    assert_eq!(paid.response.unwrap()["success"], true);
    assert_eq!(w.usdc(&w.merchant), Some(PRICE));
    assert_eq!(
        w.net.devnet.balance(&addr(&w.fee_payer)),
        10_000_000 - 2_000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn this_crates_facilitator_settles_what_the_sdks_client_signed() {
    let Some(py) = need_python() else { return };
    let w = world().await;
    let fac_url = serve_facilitator(w.facilitator(true).await).await;
    let algod = ("ALGOD_TESTNET_URL", w.net.url.clone());
    let (_srv, srv_url) = start(
        &py,
        "server",
        &[
            algod,
            ("FACILITATOR_URL", fac_url),
            ("PAY_TO", w.merchant.to_string()),
            ("PRICE", format!("{PRICE}:{TESTNET_USDC}")),
        ],
    );
    let (python, algod, payer) = (py.clone(), w.net.url.clone(), w.payer.clone());
    let url = format!("{srv_url}/paid");
    let out = tokio::task::spawn_blocking(move || sdk_pays(&python, &algod, &payer, &url))
        .await
        .unwrap();
    assert_eq!(out["status"], 200, "{out}");
    assert_eq!(out["paymentResponse"]["success"], true);
    assert_eq!(w.usdc(&w.merchant), Some(PRICE));
    assert_eq!(
        w.net.devnet.balance(&addr(&w.fee_payer)),
        10_000_000 - 2_000
    );
}
