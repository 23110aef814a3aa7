//! The README's first paid call, exactly as written there: the three commands of its
//! `<!-- first-paid-call -->` block run from a fresh folder against a local API, and the call is
//! paid, answered with a Receipt, and leaves a chain `verify-chain` accepts.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The three command lines of the README's block, comments and a trailing `&` removed.
fn readme_commands() -> Vec<String> {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme
        .find("<!-- first-paid-call -->")
        .expect("README has a <!-- first-paid-call --> block");
    let rest = &readme[start..];
    let open = rest.find("```sh\n").unwrap() + "```sh\n".len();
    let close = open + rest[open..].find("```").unwrap();
    rest[open..close]
        .lines()
        .map(|l| l.split(" #").next().unwrap().trim())
        .map(|l| l.trim_end_matches('&').trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Splits a README line into words (no quoting is used there) and runs `stipendex` with them.
fn words(line: &str) -> Vec<String> {
    let mut w: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
    assert_eq!(w[0], "stipendex", "a README command runs stipendex: {line}");
    w.remove(0);
    w
}

fn run(dir: &Path, args: &[String]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stipendex"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plain HTTP API that knows nothing of payments.
fn upstream(port: u16) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let app = axum::Router::new().fallback(|uri: axum::http::Uri| async move {
                format!("hello from your API at {}\n", uri.path())
            });
            let l = tokio::net::TcpListener::bind(("127.0.0.1", port))
                .await
                .unwrap();
            axum::serve(l, app).await.unwrap();
        });
    })
}

#[test]
fn the_readmes_three_commands_make_a_paid_call_with_a_receipt_and_a_verified_chain() {
    let lines = readme_commands();
    assert_eq!(lines.len(), 3, "three commands: {lines:?}");
    assert!(lines[0].starts_with("stipendex init "), "{lines:?}");
    assert!(lines[1].starts_with("stipendex gateway "), "{lines:?}");
    assert!(lines[2].starts_with("stipendex fetch "), "{lines:?}");

    // The README's ports, moved to free ones so that the test runs beside others.
    let (api, gw) = (free_port(), free_port());
    let local = |l: &str| {
        l.replace("127.0.0.1:8080", &format!("127.0.0.1:{api}"))
            .replace("127.0.0.1:8402", &format!("127.0.0.1:{gw}"))
    };
    let _api = upstream(api);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();

    // 1. init (listening where the test's gateway will)
    let mut init = words(&local(&lines[0]));
    if !init.iter().any(|w| w == "--listen") {
        init.extend(["--listen".into(), format!("127.0.0.1:{gw}")]);
    }
    let out = run(dir, &init);
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    let principal = said
        .lines()
        .find_map(|l| l.strip_prefix("principal "))
        .expect("init prints the principal's public key")
        .trim()
        .to_owned();
    assert!(said.contains("printed once"), "{said}");

    // 2. the gateway
    let gateway = Killed(
        Command::new(env!("CARGO_BIN_EXE_stipendex"))
            .args(words(&lines[1]))
            .current_dir(dir)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", gw)).is_err() {
        assert!(Instant::now() < deadline, "the gateway did not start");
        std::thread::sleep(Duration::from_millis(50));
    }

    // 3. the paid call
    let out = run(dir, &words(&local(&lines[2])));
    let (body, said) = (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    );
    assert!(out.status.success(), "{body}{said}");
    assert!(body.starts_with("hello from your API at /api/"), "{body}");
    assert!(said.contains("paid 0.01 USD"), "{said}");
    assert!(said.contains("receipt r_"), "{said}");

    // The chain it left, in the wallet's store, verifies under the principal init printed.
    let wallet_dir = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("wallet/wallet.db").is_file())
        .expect("a wallet store")
        .join("wallet");
    let store = wallet_dir.join("wallet.db");
    let verify = vec![
        "verify-chain".to_owned(),
        "--principal-pubkey".into(),
        principal,
        store.display().to_string(),
    ];
    let out = run(dir, &verify);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).starts_with("ok "), "{}", text(&out));
    assert_eq!(
        text(&out).lines().filter(|l| l.starts_with("ok ")).count(),
        1,
        "one payment, one chain: {}",
        text(&out)
    );
    assert!(text(&out).contains("receipt r_"), "{}", text(&out));

    // The money moved on the local ledger: 10.00 funded, 0.01 paid.
    let out = run(
        dir,
        &[
            "ledger".into(),
            "account".into(),
            "balance".into(),
            "--config".into(),
            wallet_dir.join("wallet.toml").display().to_string(),
        ],
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(": 9.99 USD available"),
        "{}",
        text(&out)
    );
    drop(gateway);
}
