//! Interop with the reference TypeScript SDK (npm `@x402/*` 2.27.0, installed by
//! `scripts/x402/install.sh`), both directions, on the anvil localnet with FiatTokenV2_2:
//! - the reference client (`@x402/fetch` + `@x402/evm`, `scripts/x402/ref-pay.mjs`) pays our
//!   axum paywall;
//! - our client pays the reference server (`@x402/express`, `ref-server.mjs`) settled by the
//!   reference facilitator (`@x402/core/facilitator` + `@x402/evm`, `ref-facilitator.mjs`).
//!
//! Without node, the packages or the localnet: SKIPPED on a developer's machine, a failure in
//! CI.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    unreachable_pub
)]

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::U256;
use axum::Router;
use axum::routing::get;
use rail_core::MemoryKeyStore;
use rail_x402::ExactEvm;
use rail_x402::client::{EvmFetched, client};
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{LocalFacilitator, X402SettlementBook};
use rail_x402::payer::{Policy, X402Payer};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use x402_devnet::anvil::Localnet;

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/x402")
}

fn sdk_installed() -> bool {
    let ok = scripts().join("node_modules/@x402/fetch").is_dir()
        && std::process::Command::new("node")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
    if !ok {
        test_kit::localnet::missing(
            "x402 reference SDK",
            "node or scripts/x402/node_modules missing (run scripts/x402/install.sh)",
        );
    }
    ok
}

/// A hex private key and its funded signer (anvil_setBalance / mint).
fn random_key() -> (String, LocalSigner) {
    let hex_key = format!("0x{}", hex::encode(rand::random::<[u8; 32]>()));
    let s = LocalSigner::from_hex(&hex_key).unwrap();
    (hex_key, s)
}

/// Starts `node script` with `env` and waits for its "Listening on URL" line.
async fn start(script: &str, env: &[(&str, String)]) -> (Child, String) {
    let mut cmd = Command::new("node");
    cmd.arg(scripts().join(script))
        .current_dir(scripts())
        .env("PORT", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if let Some(url) = line.strip_prefix("Listening on ") {
                return url.trim().to_owned();
            }
        }
        panic!("{script} exited before listening");
    })
    .await
    .unwrap();
    (child, url)
}

#[tokio::test]
async fn reference_client_pays_our_server() {
    let Some(net) = Localnet::from_env().await else {
        return;
    };
    if !sdk_installed() {
        return;
    }
    let settler = net.funded_settler().await.unwrap();
    let store = Arc::new(MemoryKeyStore::default());
    let facilitator = LocalFacilitator::connect(
        net.rpc.clone(),
        settler,
        X402SettlementBook::new(store.clone()),
    )
    .await
    .unwrap();
    let pay_to = LocalSigner::random().address();
    let paywall = ExactEvm::new(Arc::new(facilitator), net.token.clone(), pay_to)
        .paywall(&[("/weather", 1000, "weather")])
        .unwrap()
        .with_store(store);
    let app = paywall.apply(Router::new().route(
        "/weather",
        get(|| async { axum::Json(serde_json::json!({"weather": "sunny"})) }),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let (key, payer) = random_key();
    net.mint(payer.address(), U256::from(5000)).await.unwrap();
    let out = Command::new("node")
        .arg(scripts().join("ref-pay.mjs"))
        .arg(format!("http://{addr}/weather"))
        .current_dir(scripts())
        .env("X402_PAYER_KEY", key)
        .env("X402_RPC_URL", net.rpc.url())
        .env("X402_TOKEN", net.token.address.to_checksum(None))
        .env("X402_CHAIN_ID", net.chain_id.to_string())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ref-pay failed: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(line["status"], 200);
    assert_eq!(line["paymentResponse"]["success"], true);
    assert_eq!(net.balance(pay_to).await.unwrap(), U256::from(1000));
    assert_eq!(
        net.balance(payer.address()).await.unwrap(),
        U256::from(4000)
    );
}

#[tokio::test]
async fn our_client_pays_the_reference_server() {
    let Some(net) = Localnet::from_env().await else {
        return;
    };
    if !sdk_installed() {
        return;
    }
    let (settler_key, settler) = random_key();
    net.set_eth(settler.address(), U256::from(10u64).pow(U256::from(20u64)))
        .await
        .unwrap();
    let common = [
        ("X402_RPC_URL", net.rpc.url().to_owned()),
        ("X402_TOKEN", net.token.address.to_checksum(None)),
        ("X402_CHAIN_ID", net.chain_id.to_string()),
    ];
    let mut fenv = common.to_vec();
    fenv.push(("X402_FACILITATOR_KEY", settler_key));
    let (_facilitator, furl) = start("ref-facilitator.mjs", &fenv).await;
    let pay_to = LocalSigner::random().address();
    let mut senv = common.to_vec();
    senv.push(("X402_FACILITATOR_URL", furl));
    senv.push(("X402_PAY_TO", pay_to.to_checksum(None)));
    let (_server, surl) = start("ref-server.mjs", &senv).await;

    let key = net.funded_payer(U256::from(5000)).await.unwrap();
    let from = key.address();
    let client = client(X402Payer::new(
        key,
        Policy::new(&net.token.network, net.token.address, U256::from(1000)),
    ))
    .unwrap();
    let paid = EvmFetched::from(client.get(&format!("{surl}/weather")).await.unwrap());
    assert_eq!(paid.status, 200, "{}", String::from_utf8_lossy(&paid.body));
    let settlement = paid.settlement.unwrap();
    assert!(settlement.success);
    assert_eq!(net.balance(pay_to).await.unwrap(), U256::from(1000));
    assert_eq!(net.balance(from).await.unwrap(), U256::from(4000));
    // The reference's 402 was read and checked by our decoder.
    let pr = paid.payment_required.unwrap();
    assert_eq!(pr.accepts[0].network, net.token.network);
}

/// The reference client's payments, good and bad, sent to our facilitator server: every
/// answer matches what the reference facilitator answers (`scripts/x402/probe-facilitator.mjs`
/// encodes the reference's answers: 200 with `isValid:false` and its reason, 400 for a
/// malformed body, a settle replay refused as `invalid_exact_evm_nonce_already_used`).
#[tokio::test]
async fn our_facilitator_answers_as_the_reference_does() {
    let Some(net) = Localnet::from_env().await else {
        return;
    };
    if !sdk_installed() {
        return;
    }
    let facilitator = LocalFacilitator::connect(
        net.rpc.clone(),
        net.funded_settler().await.unwrap(),
        X402SettlementBook::new(Arc::new(MemoryKeyStore::default())),
    )
    .await
    .unwrap();
    let app = rail_x402::server::router(Arc::new(facilitator));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let (key, payer) = random_key();
    net.mint(payer.address(), U256::from(100_000))
        .await
        .unwrap();
    let out = Command::new("node")
        .arg(scripts().join("probe-facilitator.mjs"))
        .arg(format!("http://{addr}"))
        .current_dir(scripts())
        .env("X402_PAYER_KEY", key)
        .env("X402_TOKEN", net.token.address.to_checksum(None))
        .env(
            "X402_PAY_TO",
            LocalSigner::random().address().to_checksum(None),
        )
        .env("X402_CHAIN_ID", net.chain_id.to_string())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "probe disagrees:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("probe: 11 passed, 0 failed"), "{stdout}");
}
