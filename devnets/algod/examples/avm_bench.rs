//! Paid calls per second over x402's `exact` on Algorand, the `rail-exact-algo` crate ("this
//! crate" in the rows) against the x402-avm SDK (PyPI 2.0.2) on the same devnet and machine:
//! each client paying each server, sequentially (the SDK's client pays one call at a time),
//! plus the rail's client with calls in flight. An example of the devnet's crate, which
//! depends on the rail (never the other way).
//!
//! ```text
//! cargo run --release -p algod-devnet --example avm_bench -- [CALLS] [IN_FLIGHT]
//! ```
//! Needs the SDK's virtualenv (`scripts/x402-avm/install.sh`) for the SDK's rows; without it
//! only the rail's rows are measured. The devnet commits a block per group (algod's dev
//! mode), so the figures are the software's, not a network's block time.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::float_arithmetic,
    // A measurement, not money: latencies in floating-point milliseconds.
    clippy::arithmetic_side_effects
)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use algod_devnet::{Devnet, DevnetConfig, TESTNET_USDC};
use axum::Router;
use axum::routing::get;
use ed25519_dalek::SigningKey;
use rail_core::MemoryKeyStore;
use rail_exact_algo::avm::{AvmFacilitator, AvmPayer, AvmPolicy, ExactAvm, FeePayer};
use rail_exact_algo::{Address, AlgodClient};
use x402_transport::Accepts;
use x402_transport::client::Client;
use x402_transport::paywall::Paywall;

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

struct Row {
    name: &'static str,
    calls: usize,
    errors: usize,
    seconds: f64,
    p50: f64,
    p99: f64,
}

fn print(r: &Row) {
    println!(
        "| {} | {:.1} | {:.1} | {:.1} | {} / {} |",
        r.name,
        r.calls as f64 / r.seconds,
        r.p50,
        r.p99,
        r.errors,
        r.calls
    );
}

async fn ours(
    name: &'static str,
    client: &Client,
    url: &str,
    calls: usize,
    in_flight: usize,
) -> Row {
    let start = Instant::now();
    let mut lat = Vec::new();
    let mut errors = 0;
    let mut left = calls;
    while left > 0 {
        let n = left.min(in_flight);
        let runs = (0..n).map(|_| async {
            let t = Instant::now();
            let ok = client.get(url).await.is_ok_and(|p| p.status == 200);
            (ok, t.elapsed().as_secs_f64() * 1000.0)
        });
        for (ok, ms) in futures_join(runs).await {
            errors += usize::from(!ok);
            lat.push(ms);
        }
        left -= n;
    }
    let seconds = start.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    let pick = |q: f64| lat[((lat.len() as f64 * q) as usize).min(lat.len() - 1)];
    Row {
        name,
        calls,
        errors,
        seconds,
        p50: pick(0.5),
        p99: pick(0.99),
    }
}

async fn futures_join<F: std::future::Future>(fs: impl Iterator<Item = F>) -> Vec<F::Output> {
    let handles: Vec<_> = fs.collect();
    let mut out = Vec::new();
    // Poll them together on this task.
    let mut pinned: Vec<_> = handles.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = (0..pinned.len()).map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (i, f) in pinned.iter_mut().enumerate() {
            if done[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => done[i] = Some(v),
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    out.extend(done.into_iter().flatten());
    out
}

fn sdk_python() -> Option<PathBuf> {
    let p = PathBuf::from("/var/tmp/x402-avm-venv/bin/python");
    p.exists().then_some(p)
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/x402-avm/peer.py")
}

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start(py: &PathBuf, role: &str, env: &[(&str, String)]) -> (Proc, String) {
    let mut cmd = Command::new(py);
    cmd.arg(script()).arg(role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().unwrap().unwrap();
        if let Some((_, u)) = line.split_once("listening on ") {
            break u.trim().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    (Proc(child), url)
}

fn sdk_client(
    py: &PathBuf,
    name: &'static str,
    algod: &str,
    payer: &SigningKey,
    url: &str,
    calls: usize,
) -> Row {
    let out = Command::new(py)
        .arg(script())
        .args(["client", url, &calls.to_string()])
        .env("ALGOD_TESTNET_URL", algod)
        .env("AVM_PAYER_SEED", hex::encode(payer.to_bytes()))
        .stderr(Stdio::null())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or("{}"),
    )
    .unwrap();
    Row {
        name,
        calls,
        errors: v["errors"].as_u64().unwrap_or(0) as usize,
        seconds: v["seconds"].as_f64().unwrap_or(1.0),
        p50: v["p50"].as_f64().unwrap_or(0.0),
        p99: v["p99"].as_f64().unwrap_or(0.0),
    }
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let calls: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    let in_flight: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let (issuer, payer, merchant, fee_payer) = (
        SigningKey::from_bytes(&[0x71; 32]),
        SigningKey::from_bytes(&[0x72; 32]),
        SigningKey::from_bytes(&[0x73; 32]),
        SigningKey::from_bytes(&[0x74; 32]),
    );
    let net = Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (addr(&issuer), 10_000_000),
                (addr(&payer), 10_000_000),
                (addr(&merchant), 1_000_000),
                (addr(&fee_payer), 1_000_000_000),
            ],
            ..DevnetConfig::testnet(addr(&issuer))
        },
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let d = &net.devnet;
    d.opt_in(addr(&payer), TESTNET_USDC).unwrap();
    d.fund_asset(addr(&payer), TESTNET_USDC, 1_000_000_000)
        .unwrap();
    d.opt_in(addr(&merchant), TESTNET_USDC).unwrap();
    let algod = AlgodClient::new(&net.url, None).unwrap();

    // The rail's paywall with its facilitator (fees sponsored).
    let f = AvmFacilitator::connect(
        algod.clone(),
        Some(FeePayer::new(fee_payer.clone())),
        Arc::new(MemoryKeyStore::default()),
    )
    .await
    .unwrap();
    let paywall = Paywall::new().route(
        "/paid",
        "a paid thing",
        Accepts::one(Arc::new(ExactAvm::usdc(f, addr(&merchant))), 10_000).unwrap(),
    );
    let app = paywall.apply(Router::new().route("/paid", get(|| async { "paid content" })));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let our_url = format!("http://{}/paid", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let avm_payer = AvmPayer::connect(payer.clone(), algod.clone(), AvmPolicy::usdc(1_000_000))
        .await
        .unwrap();
    let client = Client::new(reqwest::Client::builder().timeout(Duration::from_secs(30)))
        .unwrap()
        .with_payer(Arc::new(avm_payer));

    println!("| client → server | paid calls/s | p50 ms | p99 ms | errors |");
    println!("|---|---|---|---|---|");
    let _ = ours("warm-up", &client, &our_url, 10, 1).await;
    print(
        &ours(
            "this crate → this crate, sequential",
            &client,
            &our_url,
            calls,
            1,
        )
        .await,
    );
    print(
        &ours(
            "this crate → this crate, in flight",
            &client,
            &our_url,
            calls,
            in_flight,
        )
        .await,
    );

    let Some(py) = sdk_python() else {
        println!("(no /var/tmp/x402-avm-venv: the SDK's rows are not measured)");
        return;
    };
    let algod_env = ("ALGOD_TESTNET_URL", net.url.clone());
    let (_fac, fac_url) = start(
        &py,
        "facilitator",
        &[
            algod_env.clone(),
            ("AVM_FEE_PAYER_SEED", hex::encode(fee_payer.to_bytes())),
        ],
    );
    let (_srv, srv_url) = start(
        &py,
        "server",
        &[
            algod_env,
            ("FACILITATOR_URL", fac_url),
            ("PAY_TO", addr(&merchant).to_string()),
            ("PRICE", "$0.01".into()),
        ],
    );
    let sdk_url = format!("{srv_url}/paid");
    let n = calls.min(100);
    let _ = ours("warm-up", &client, &sdk_url, 5, 1).await;
    print(&sdk_client(
        &py,
        "SDK → SDK (server + facilitator)",
        &net.url,
        &payer,
        &sdk_url,
        n,
    ));
    print(&sdk_client(
        &py,
        "SDK → this crate",
        &net.url,
        &payer,
        &our_url,
        n,
    ));
    print(&ours("this crate → SDK", &client, &sdk_url, n, 1).await);
}
