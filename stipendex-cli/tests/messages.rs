//! Messages a person can act on (issue 46), from outside: every refusal is one sentence naming
//! what was wrong and what to do, with a non-zero exit; times are RFC 3339 (UTC); no file is
//! overwritten without `--force`; public keys are `--…-pubkey` (the old spellings still work);
//! no colour through a pipe; start-up checks of the serving commands warn or refuse in one
//! line; a network failure is the network's one sentence; a TOML error names its file, line
//! and column.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::now;
use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};
use stipendex::Asset;
use stipendex::envelope::{Allow, SecretKey};
use tokio::io::{AsyncBufReadExt as _, BufReader};

const BIN: &str = env!("CARGO_BIN_EXE_stipendex");

fn stipendex<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
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

/// A refusal: a non-zero exit, one line on stderr starting `stipendex: `, no Debug dump;
/// its text.
fn refusal(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "expected a refusal: {}", text(o));
    assert!(err.starts_with("stipendex: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one sentence: {err}");
    assert!(
        !err.contains("Error(") && !err.contains("\\u{a}") && !err.contains(" { "),
        "no Debug dump: {err}"
    );
    err
}

/// `stipendex key new --out DIR/NAME`: the public key it prints.
fn key(dir: &Path, name: &str) -> String {
    let out = stipendex(&["key", "new", "--out", &dir.join(name).display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn mandate_messages_name_the_keys_the_times_and_the_way_on() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |name: &str| tmp.path().join(name).display().to_string();
    let principal = key(tmp.path(), "principal.key");
    let wallet = key(tmp.path(), "wallet.key");

    // --days 0: refused at once, before anything is read or written.
    let out = stipendex(&[
        "mandate",
        "new",
        "--principal-key",
        &p("missing.key"),
        "--wallet-pubkey",
        &wallet,
        "--days",
        "0",
        "--per-call",
        "1.00",
        "--out",
        &p("m0.json"),
    ]);
    let t = refusal(&out);
    assert!(
        t.contains("--days 0") && t.contains("--days 1 or more"),
        "{t}"
    );
    assert!(!Path::new(&p("m0.json")).exists());

    // The public key is --wallet-pubkey; --wallet still works.
    let new = |flag: &str, out: &str, force: bool| {
        let mut args = vec![
            "mandate".to_owned(),
            "new".into(),
            "--principal-key".into(),
            p("principal.key"),
            flag.into(),
            wallet.clone(),
            "--per-call".into(),
            "1.00".into(),
            "--out".into(),
            p(out),
        ];
        if force {
            args.push("--force".into());
        }
        stipendex(&args)
    };
    let out = new("--wallet-pubkey", "mandate.json", false);
    assert!(out.status.success(), "{}", text(&out));
    let out = new("--wallet", "old-spelling.json", false);
    assert!(out.status.success(), "{}", text(&out));
    let t = refusal(&stipendex(&[
        "mandate",
        "new",
        "--principal-key",
        &p("principal.key"),
        "--wallet-pubkey",
        "ed25519:nope",
        "--per-call",
        "1.00",
        "--out",
        &p("m1.json"),
    ]));
    assert!(
        t.contains("--wallet-pubkey \"ed25519:nope\" is not a public key"),
        "{t}"
    );

    // Never overwritten without --force (mandate new, sign, revoke).
    let t = refusal(&new("--wallet-pubkey", "mandate.json", false));
    assert!(
        t.contains("mandate.json already exists") && t.contains("--force"),
        "{t}"
    );
    let out = new("--wallet-pubkey", "mandate.json", true);
    assert!(out.status.success(), "{}", text(&out));
    let sign = |key_file: &str, json: &str, out: &str, force: bool| {
        let mut args = vec![
            "mandate".to_owned(),
            "sign".into(),
            "--key".into(),
            p(key_file),
            p(json),
            "--out".into(),
            p(out),
        ];
        if force {
            args.push("--force".into());
        }
        stipendex(&args)
    };
    let out = sign("principal.key", "mandate.json", "mandate.jws", false);
    assert!(out.status.success(), "{}", text(&out));
    let t = refusal(&sign("principal.key", "mandate.json", "mandate.jws", false));
    assert!(t.contains("mandate.jws already exists"), "{t}");
    let out = sign("principal.key", "mandate.json", "mandate.jws", true);
    assert!(out.status.success(), "{}", text(&out));

    // Signed with the wallet's key: which key signed, which key the mandate names.
    let t = refusal(&sign("wallet.key", "mandate.json", "other.jws", false));
    assert!(
        t.contains(&format!("--key {} is the key {wallet}", p("wallet.key")))
            && t.contains(&format!("names the principal key {principal}"))
            && t.contains("sign with the principal's own key"),
        "{t}"
    );
    assert!(!Path::new(&p("other.jws")).exists());

    // show: the validity in RFC 3339, UTC.
    let out = stipendex(&["mandate", "show", &p("mandate.jws")]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let valid = t.lines().find(|l| l.contains("valid from")).unwrap();
    let words: Vec<&str> = valid.split_whitespace().collect();
    assert_eq!(words[0..2], ["valid", "from"], "{valid}");
    for w in [words[2], words[4]] {
        assert_eq!(w.len(), 20, "{valid}");
        assert!(w.ends_with('Z') && w.as_bytes()[10] == b'T', "{valid}");
    }
    assert!(!t.contains("Unix seconds") && !t.contains("EXPIRED"), "{t}");

    // Expired, and not yet valid: said so.
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(p("mandate.json")).unwrap()).unwrap();
    for (name, nbf, exp, says) in [
        ("expired", now() - 7200, now() - 3600, "EXPIRED at "),
        ("later", now() + 3600, now() + 7200, "NOT YET VALID"),
    ] {
        let mut m = json.clone();
        m["nbf"] = json!(nbf);
        m["exp"] = json!(exp);
        std::fs::write(p(&format!("{name}.json")), m.to_string()).unwrap();
        let out = sign(
            "principal.key",
            &format!("{name}.json"),
            &format!("{name}.jws"),
            false,
        );
        assert!(out.status.success(), "{}", text(&out));
        let out = stipendex(&["mandate", "show", &p(&format!("{name}.jws"))]);
        let t = text(&out);
        assert!(t.contains(says), "{t}");
        assert!(
            t.contains(&rail_core::clock::rfc3339(if name == "expired" {
                exp
            } else {
                nbf
            })),
            "{t}"
        );
    }

    // revoke: with the wrong key, the keys named the right way round; the file is not
    // overwritten without --force.
    let revoke = |key_file: &str, force: bool| {
        let mut args = vec![
            "mandate".to_owned(),
            "revoke".into(),
            "--key".into(),
            p(key_file),
            p("mandate.jws"),
        ];
        if force {
            args.push("--force".into());
        }
        stipendex(&args)
    };
    let t = refusal(&revoke("wallet.key", false));
    assert!(
        t.contains(&format!("is the key {wallet}"))
            && t.contains(&format!("signed by the principal key {principal}")),
        "{t}"
    );
    let out = revoke("principal.key", false);
    assert!(out.status.success(), "{}", text(&out));
    let t = refusal(&revoke("principal.key", false));
    assert!(
        t.contains("mandate.revocation.jws already exists") && t.contains("--force"),
        "{t}"
    );
    let out = revoke("principal.key", true);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn public_keys_are_pubkey_flags_and_the_old_spellings_still_work() {
    let tmp = tempfile::tempdir().unwrap();
    let k = key(tmp.path(), "holder.key");
    let db = format!("sqlite://{}", tmp.path().join("facilitator.db").display());
    for flag in ["--account-pubkey", "--key"] {
        let out = stipendex(&["facilitator", "account", "new", "--db", &db, flag, &k]);
        assert!(out.status.success(), "{flag}: {}", text(&out));
    }
    let t = refusal(&stipendex(&[
        "facilitator",
        "account",
        "new",
        "--db",
        &db,
        "--account-pubkey",
        "nope",
    ]));
    assert!(t.contains("--account-pubkey is not a public key"), "{t}");
    // verify-chain's trust anchor: --principal-pubkey (or --principal).
    let t = refusal(&stipendex(&["verify-chain", "nothing.jws"]));
    assert!(t.contains("--principal-pubkey"), "{t}");
    for flag in ["--principal-pubkey", "--principal"] {
        let out = stipendex(&["verify-chain", flag, "ed25519:nope", "nothing.jws"]);
        let t = text(&out);
        assert!(!t.contains("unexpected argument"), "{flag}: {t}");
    }
}

/// A wallet configuration in `dir` (no rail; its store `wallet.db`): its mandate signed by a fresh
/// principal, `extra` lines appended to `[wallet]`.
fn bare_wallet(dir: &Path, extra: &str) -> PathBuf {
    common::write_wallet(
        dir,
        common::limits_in(Asset::usd(), "1.00", None),
        Vec::new(),
        extra,
        "sqlite://wallet.db",
        "",
    );
    dir.join("wallet.toml")
}

#[test]
fn wallet_pending_shows_times_in_rfc3339() {
    let tmp = tempfile::tempdir().unwrap();
    let config = bare_wallet(tmp.path(), "");
    let chains = tmp.path().join("chains");
    std::fs::create_dir_all(&chains).unwrap();
    std::fs::write(
        chains.join("q_waiting-0001.pending"),
        json!({
            "chain": "q_waiting-0001",
            "quote": "not.a.quote",
            "rail": "house",
            "op": "op-1",
            "since": 1_796_563_998_u64,
            "unknown": true,
        })
        .to_string(),
    )
    .unwrap();
    let out = stipendex(&[
        "wallet",
        "pending",
        "--config",
        &config.display().to_string(),
    ]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("q_waiting-0001") && t.contains("since 2026-12-06T13:33:18Z"),
        "{t}"
    );
    assert!(!t.contains("1796563998"), "{t}");
}

#[test]
fn the_demo_through_a_pipe_has_no_colour_and_says_held_then_captured() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["demo", "--dir"])
        .arg(tmp.path().join("demo"))
        // Its logs on too: tracing colours its lines on a terminal.
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(!out.stderr.is_empty(), "the logs are on: {t}");
    assert!(
        !out.stdout.contains(&0x1b) && !out.stderr.contains(&0x1b),
        "no ANSI escape through a pipe: {t}"
    );
    assert!(
        t.contains("held 3.50, captured 3.20 USD over ledger"),
        "{t}"
    );
}

#[tokio::test]
async fn fetch_prints_a_network_failure_as_one_sentence() {
    let tmp = tempfile::tempdir().unwrap();
    let config = bare_wallet(tmp.path(), "journal = false\n");
    let config = config.display().to_string();

    // A closed port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}/api/search");
    let out = stipendex(&["fetch", "--config", &config, &url]);
    let t = refusal(&out);
    assert!(
        t.starts_with(&format!("stipendex: could not connect to 127.0.0.1:{port}")),
        "{t}"
    );
    assert!(
        !t.contains("not paid") && !t.contains("rail unavailable") && !t.contains("http: "),
        "{t}"
    );

    // A redirect loop.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().fallback(|uri: axum::http::Uri| async move {
        axum::response::Redirect::temporary(&format!("{}x", uri.path()))
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let url = format!("{base}/loop");
    let out = tokio::task::spawn_blocking(move || stipendex(&["fetch", "--config", &config, &url]))
        .await
        .unwrap();
    let t = refusal(&out);
    assert!(t.contains("more than 10 redirects"), "{t}");
    assert!(
        !t.contains("not paid") && !t.contains("rail unavailable"),
        "{t}"
    );
}

#[test]
fn toml_errors_name_the_file_line_and_column_on_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    // The wallet's configuration (fetch, proxy, wallet).
    let config = bare_wallet(tmp.path(), "confirm = \"sometimes\"\n");
    let out = stipendex(&[
        "fetch",
        "--config",
        &config.display().to_string(),
        "http://127.0.0.1:9/",
    ]);
    let t = refusal(&out);
    assert!(
        t.contains(&format!("{} line 5, column 11:", config.display())),
        "{t}"
    );
    assert!(t.contains("sometimes"), "{t}");

    // Broken TOML.
    std::fs::write(&config, "[wallet]\nkey_file = [\"a\",\n").unwrap();
    let t = refusal(&stipendex(&[
        "wallet",
        "pending",
        "--config",
        &config.display().to_string(),
    ]));
    assert!(t.contains(&format!("{} line ", config.display())), "{t}");

    // The gateway's: a field of [gateway] no gateway knows.
    std::fs::write(
        tmp.path().join("shop.key"),
        SecretKey::generate().to_hex().as_str(),
    )
    .unwrap();
    let gateway = tmp.path().join("gateway.toml");
    std::fs::write(
        &gateway,
        "[receiver]\nid = \"shop\"\nkey_file = \"shop.key\"\norigins = [\"http://127.0.0.1:8402\"]\n\n[gateway]\nlisten = \"127.0.0.1:8402\"\nlisen = \"x\"\n\n[upstream]\nurl = \"http://127.0.0.1:9\"\n",
    )
    .unwrap();
    let t = refusal(&stipendex(&[
        "gateway",
        "--config",
        &gateway.display().to_string(),
    ]));
    assert!(
        t.contains(&format!("{} line 8, column 1:", gateway.display())) && t.contains("lisen"),
        "{t}"
    );
}

/// A serve-mcp configuration in `dir` over a ledger rail in USD, pricing `prices`.
async fn shop(dir: &Path, prices: &str) -> PathBuf {
    let (_ledger, ledger_url, _agent, shop) = common::funded_ledger(dir, 100).await;
    std::fs::write(
        dir.join("shop.key"),
        SecretKey::generate().to_hex().as_str(),
    )
    .unwrap();
    let path = dir.join("shop.toml");
    std::fs::write(
        &path,
        format!(
            "[store]\nurl = \"memory\"\n\n[rails.house]\nkind = \"ledger\"\nurl = \"{ledger_url}\"\npayee_account = \"{shop}\"\n\n[receiver]\nid = \"shop\"\nkey_file = \"shop.key\"\norigins = [\"https://shop.example\"]\n\n{prices}"
        ),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn serve_mcp_refuses_a_price_no_rail_receives_and_warns_of_an_unlisted_tool() {
    let tmp = tempfile::tempdir().unwrap();
    let config = shop(
        tmp.path(),
        "[[price]]\nkind = \"tool\"\npattern = \"search\"\namount = \"0.05\"\nasset = \"USDC\"\n",
    )
    .await;
    let t = refusal(&stipendex(&[
        "serve-mcp",
        "--config",
        &config.display().to_string(),
    ]));
    assert!(
        t.contains("[[price]] entry 1 (search): no configured rail receives USDC: price it in USD"),
        "{t}"
    );

    let tmp = tempfile::tempdir().unwrap();
    let config = shop(
        tmp.path(),
        "[[price]]\nkind = \"tool\"\npattern = \"search\"\namount = \"0.05\"\nasset = \"USD\"\n\n[[price]]\nkind = \"tool\"\npattern = \"serach\"\namount = \"0.05\"\nasset = \"USD\"\n",
    )
    .await;
    // Over stdio with no host: it warns at start, then ends (nobody initializes).
    let out = stipendex(&["serve-mcp", "--config", &config.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    let warning = err
        .lines()
        .find(|l| l.starts_with("stipendex serve-mcp: warning: "))
        .unwrap_or_else(|| panic!("no warning: {err}"));
    assert!(
        warning.contains("\"serach\", which the upstream does not list (echo, search, render)"),
        "{warning}"
    );
    assert!(!warning.contains("\"search\""), "{warning}");
}

/// A free port on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A gateway started on `port`: the process, and its stderr as it comes (its warnings and
/// its JSON log lines).
async fn gateway(config: &Path, port: u16) -> (tokio::process::Child, Arc<Mutex<String>>) {
    let mut child = tokio::process::Command::new(BIN)
        .arg("gateway")
        .arg("--config")
        .arg(config)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let err = Arc::new(Mutex::new(String::new()));
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let into = err.clone();
    tokio::spawn(async move {
        while let Ok(Some(l)) = lines.next_line().await {
            let mut e = into.lock().unwrap();
            e.push_str(&l);
            e.push('\n');
        }
    });
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let started = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(l)) = out.next_line().await {
            if l.starts_with("Listening on ") {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(
        started,
        "the gateway did not start: {}",
        err.lock().unwrap()
    );
    (child, err)
}

#[tokio::test]
async fn the_gateway_warns_of_a_listen_address_its_origins_do_not_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (_ledger, ledger_url, _agent, shop) = common::funded_ledger(tmp.path(), 100).await;
    std::fs::write(
        tmp.path().join("shop.key"),
        SecretKey::generate().to_hex().as_str(),
    )
    .unwrap();
    let (port, other) = (free_port(), free_port());
    let config = tmp.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"memory\"\n\n[rails.house]\nkind = \"ledger\"\nurl = \"{ledger_url}\"\npayee_account = \"{shop}\"\n\n[receiver]\nid = \"weather-co\"\nkey_file = \"shop.key\"\norigins = [\"http://127.0.0.1:{other}\"]\n\n[upstream]\nurl = \"http://127.0.0.1:9\"\n\n[[price]]\nkind = \"route\"\nmethod = \"GET\"\npattern = \"/api/x\"\namount = \"0.05\"\nasset = \"USD\"\n"
        ),
    )
    .unwrap();
    let (mut child, err) = gateway(&config, port).await;
    child.kill().await.unwrap();
    let err = err.lock().unwrap().clone();
    assert!(
        err.contains(&format!(
            "stipendex gateway: warning: listening on http://127.0.0.1:{port}, which is not among [receiver] origins (http://127.0.0.1:{other}): wallets will refuse its quotes; add it to origins\n"
        )),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paid_mcp_call_through_the_gateway_is_logged_with_its_amount() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_ledger, ledger_url, agent, shop_account) = common::funded_ledger(dir, 1_000).await;
    // The upstream: the example MCP server, over stdio (its own price on `echo` only).
    std::fs::create_dir_all(dir.join("upstream")).unwrap();
    let upstream = shop(
        &dir.join("upstream"),
        "[[price]]\nkind = \"tool\"\npattern = \"echo\"\namount = \"0.01\"\nasset = \"USD\"\n",
    )
    .await;
    let port = free_port();
    let origin = format!("http://127.0.0.1:{port}");
    let gateway_key = SecretKey::generate();
    std::fs::write(dir.join("gateway.key"), gateway_key.to_hex().as_str()).unwrap();
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[store]\nurl = \"sqlite://{store}\"\n\n[rails.house]\nkind = \"ledger\"\nurl = \"{ledger_url}\"\npayee_account = \"{shop_account}\"\n\n[receiver]\nid = \"weather-co\"\nkey_file = \"gateway.key\"\norigins = [\"{origin}\"]\n\n[upstream]\ncommand = [{bin:?}, \"serve-mcp\", \"--config\", {up:?}]\n\n[[price]]\nkind = \"tool\"\npattern = \"search\"\namount = \"0.05\"\nasset = \"USD\"\n\n[[price]]\nkind = \"tool\"\npattern = \"nosuch\"\namount = \"0.05\"\nasset = \"USD\"\n",
            store = dir.join("gateway.db").display(),
            bin = BIN,
            up = upstream.display().to_string(),
        ),
    )
    .unwrap();
    let (mut child, err) = gateway(&config, port).await;

    // The payer: `stipendex proxy` in front of the gateway's MCP endpoint, for an rmcp host.
    let (principal, wallet_key) = common::wallet_keys(dir);
    let mut m = common::draft(&principal, &wallet_key);
    m.limits.push(common::limits("1.00", "5.00"));
    m.allow.push(Allow::Receiver {
        id: "weather-co".into(),
        key: gateway_key.public(),
        origins: vec![origin.clone()],
    });
    common::sign_to(dir, "wallet.jws", m, &principal);
    std::fs::write(
        dir.join("wallet.toml"),
        common::wallet_toml(
            "wallet.jws",
            &principal,
            "",
            &format!("sqlite://{}", dir.join("wallet.db").display()),
            &common::payer_rail(&ledger_url, agent),
        ),
    )
    .unwrap();
    let mut cmd = tokio::process::Command::new(BIN);
    cmd.arg("proxy")
        .arg("--config")
        .arg(dir.join("wallet.toml"))
        .arg("--url")
        .arg(format!("{origin}/mcp"))
        .env_remove("RUST_LOG");
    let host = ().serve(rmcp::transport::TokioChildProcess::new(cmd).unwrap()).await.unwrap();
    let mut call = CallToolRequestParams::new("search");
    call.arguments = json!({"query": "rust"}).as_object().cloned();
    let r = host.call_tool(call).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(
        r.meta.as_ref().unwrap().0["stipendex/receipt"]["stipendex"],
        "receipt/0.1"
    );
    host.cancel().await.unwrap();

    // Its log line: the outcome and the amount.
    let mut paid = None;
    for _ in 0..50 {
        paid = err
            .lock()
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["message"] == "mcp call" && v["outcome"] == "paid");
        if paid.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().await.unwrap();
    let err = err.lock().unwrap().clone();
    let paid = paid.unwrap_or_else(|| panic!("no log line of the paid call: {err}"));
    assert_eq!(paid["amount"], "0.05 USD", "{paid}");
    assert_eq!(paid["rail"], "house", "{paid}");
    assert_eq!(paid["level"], "INFO", "{paid}");

    // At start: the priced tool its upstream does not list; its listen address is an origin.
    assert!(
        err.contains("stipendex gateway: warning: [[price]] prices the tool \"nosuch\", which the upstream does not list (echo, search, render)"),
        "{err}"
    );
    assert!(!err.contains("warning: listening on"), "{err}");
}

/// A wallet whose spend counters would not outlive the process is refused at start, with the
/// fix: no `[store]`, or `url = "memory"` (its limits would restart on every run).
#[test]
fn a_wallet_without_a_lasting_store_is_refused_with_the_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let config = bare_wallet(tmp.path(), "");
    let good = std::fs::read_to_string(&config).unwrap();
    for (wrong, says) in [
        (
            good.replace("[store]\nurl = \"sqlite://wallet.db\"\n", ""),
            "has no [store]",
        ),
        (
            good.replace("sqlite://wallet.db", "memory"),
            "forgets the wallet's spend counters",
        ),
    ] {
        std::fs::write(&config, wrong).unwrap();
        let out = stipendex(&["wallet", "pending", "--config", config.to_str().unwrap()]);
        let t = text(&out);
        assert!(!out.status.success(), "{t}");
        assert!(t.contains(says) && t.contains("sqlite://wallet.db"), "{t}");
        assert_eq!(t.trim().lines().count(), 1, "{t}");
    }
}

/// `journal = "store"` keeps the chains in the store itself: its SQLite file, or its
/// PostgreSQL database (the journal's tables made at start, beside the key store's).
#[test]
fn a_journal_in_the_store_lives_in_its_sqlite_file_or_its_postgres_database() {
    let tmp = tempfile::tempdir().unwrap();
    let config = bare_wallet(tmp.path(), "journal = \"store\"\n");
    let good = std::fs::read_to_string(&config).unwrap();
    let out = stipendex(&["wallet", "pending", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(stipendex::wallet::SqliteJournal::holds_chains(&tmp.path().join("wallet.db")).unwrap());

    let url = test_kit::localnet::postgres_url();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pool = match rt.block_on(async {
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&url),
        )
        .await
    }) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return test_kit::localnet::missing("PostgreSQL", &e.to_string()),
        Err(_) => return test_kit::localnet::missing("PostgreSQL", "connection timed out"),
    };
    std::fs::write(&config, good.replace("sqlite://wallet.db", &url)).unwrap();
    let out = stipendex(&["wallet", "pending", "--config", config.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let tables: i64 = rt
        .block_on(
            sqlx::query_scalar(
                "SELECT count(*) FROM information_schema.tables
                WHERE table_name IN ('stipendex_chain', 'stipendex_pending', 'stipendex_mandate')
                AND table_schema = current_schema()",
            )
            .fetch_one(&pool),
        )
        .unwrap();
    assert_eq!(
        tables, 3,
        "the journal's tables are in the store's database"
    );
}
