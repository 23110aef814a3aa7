//! `stipendex fetch` from outside (issue 23): the wallet's HTTP client as a command pays the
//! request it was asked to make, at the origin the mandate pins, and refuses a hostile server
//! that relays an allowlisted receiver's Quote — one sentence, a non-zero exit, nothing sent.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::get;

use common::limits;
use stipendex::envelope::{Allow, Limits, Mandate, SecretKey, Signed};
use stipendex::http::Binding;
use stipendex::receiver::{PricedCapability, Receiver};
use stipendex::{Asset, Money, Registry};

async fn listen() -> (tokio::net::TcpListener, String) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", l.local_addr().unwrap());
    (l, base)
}

async fn fetch(dir: &Path, args: &[&str]) -> (bool, String, String) {
    fetch_with(dir, args, &[]).await
}

/// `stipendex fetch --config DIR/wallet.toml ARGS…` with `env` set: success, stdout, stderr.
async fn fetch_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    stipendex(&["fetch"], dir, args, env).await
}

/// `stipendex COMMAND… --config DIR/wallet.toml ARGS…` with `env` set: success, stdout, stderr.
async fn stipendex(
    command: &[&str],
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_stipendex"))
        .args(command)
        .arg("--config")
        .arg(dir.join("wallet.toml"))
        .args(args)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn stipendex_fetch_pays_its_own_request_and_refuses_a_relayed_quote() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // One ledger on SQLite: a bank, the agent (funded with 10.00) and the shop.
    let (_ledger, ledger_url, agent, shop) = common::funded_ledger(dir, 1000).await;

    // The receiver, at its own origin.
    let (listener, base, receiver, shop_key) = search_shop(
        &common::payee_rails(&dir.join("receiver.db"), &ledger_url, shop),
        &stipendex::ProcessEnv,
    )
    .await;
    serve_search(listener, receiver);

    // A hostile server relaying the shop's 402 for its own query.
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let record = seen.clone();
    let target = format!("{base}/api/search?q=evil");
    let http = stipendex::http::reqwest_client(std::time::Duration::from_secs(10)).unwrap();
    let evil_app = Router::new().fallback(move |req: axum::extract::Request| {
        let (target, record, http) = (target.clone(), record.clone(), http.clone());
        async move {
            for (name, v) in req.headers() {
                if name.as_str().contains("payment") {
                    record.lock().unwrap().push(v.to_str().unwrap().to_owned());
                }
            }
            let got = http.get(&target).send().await.unwrap();
            let status = axum::http::StatusCode::from_u16(got.status().as_u16()).unwrap();
            (status, got.bytes().await.unwrap()).into_response()
        }
    });
    let (evil_listener, evil) = listen().await;
    tokio::spawn(async move { axum::serve(evil_listener, evil_app).await.unwrap() });

    // The wallet: its key, the principal's mandate (the shop pinned at its origin), its rails.
    let (principal, mandate) = common::write_wallet(
        dir,
        limits("1.00", "5.00"),
        vec![common::allow_shop(&shop_key, &base)],
        "journal = \"chains\"\n",
        &format!("sqlite://{}", dir.join("wallet.db").display()),
        &common::payer_rail(&ledger_url, agent),
    );

    // Its own request: paid, the body on stdout, one line on stderr.
    let (ok, out, err) = fetch(dir, &[&format!("{base}/api/search?q=rust")]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "results");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("paid 0.05 USD over house"), "{err}");
    assert!(err.contains("receipt r_"), "{err}");

    // The relay, at evil's origin (and behind a backslash URL a naive split reads as the
    // shop's): refused in one sentence, non-zero, nothing sent to evil, nothing moved.
    let host = base.trim_start_matches("http://");
    for url in [
        format!("{evil}/api/search?q=evil"),
        format!("{evil}\\@{host}/api/search?q=evil"),
    ] {
        let (ok, out, err) = fetch(dir, &[&url]).await;
        assert!(!ok, "{url} was paid: {out}");
        assert!(out.is_empty());
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with("stipendex: not paid (denied): ") && err.contains("not allowlisted at"),
            "{err}"
        );
    }
    assert!(seen.lock().unwrap().is_empty(), "evil was sent a payment");
    let chains: Vec<_> = std::fs::read_dir(dir.join("chains"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "jws"))
        })
        .collect();
    assert_eq!(chains.len(), 1, "one payment, one chain");

    // A bad header is one sentence too.
    let (ok, _, err) = fetch(dir, &["-H", "nocolon", &format!("{base}/api/search")]).await;
    assert!(!ok);
    assert!(err.contains("is not a header"), "{err}");

    // Nothing is left pending (issue 24); resuming what is not pending is one sentence.
    let (ok, out, err) = stipendex(&["wallet", "pending"], dir, &[], &[]).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "no pending payments");
    let (ok, _, err) = stipendex(&["wallet", "resume"], dir, &["q_nothing-00000000"], &[]).await;
    assert!(!ok);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("no pending payment q_nothing-00000000"),
        "{err}"
    );

    // verify-chain with the principal's revocations (issue 24): a revocation after the payment
    // leaves its chain intact; one dated before it breaks the chain at the proof.
    let chain = std::fs::read_dir(dir.join("chains"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "jws"))
        .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let verify = |revocation_iat: u64| {
        let rev = stipendex::wallet::revoke(&mandate, &principal, revocation_iat).unwrap();
        let path = dir.join(format!("revocation-{revocation_iat}.jws"));
        std::fs::write(&path, rev.jws()).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_stipendex"))
            .args([
                "verify-chain",
                "--principal",
                &principal.public().to_string(),
            ])
            .arg("--revocation")
            .arg(&path)
            .arg(&chain)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (ok, out) = verify(now + 60);
    assert!(ok && out.starts_with("ok "), "{out}");
    let (ok, out) = verify(now - 3600);
    assert!(!ok, "{out}");
    assert!(
        out.contains("BROKEN") && out.contains("revoked at"),
        "{out}"
    );
}

/// `stipendex fetch` pays a plain x402 402 (exact-algo, on an in-process algod devnet) with
/// the scheme payer of the wallet's configured exact-algo rail, under the mandate's origin and
/// `payTo` allowlist; without the entry it is denied.
#[tokio::test(flavor = "multi_thread")]
async fn stipendex_fetch_pays_an_x402_challenge_under_the_mandate() {
    use algod_devnet::{Devnet, DevnetConfig};
    use ed25519_dalek::SigningKey;
    use rail_core::{MemoryKeyStore, SystemClock};
    use rail_exact_algo::{Address, AlgodClient, ExactAlgo, ExactAlgoReceiver};
    use x402_transport::{Accepts, paywall::Paywall};

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let seed = [9u8; 32];
    let payer = Address(SigningKey::from_bytes(&seed).verifying_key().to_bytes());
    let treasury = Address(SigningKey::from_bytes(&[10; 32]).verifying_key().to_bytes());
    let algod = Devnet::spawn(
        DevnetConfig {
            accounts: vec![(payer, 5_000_000), (treasury, 100_000)],
            ..DevnetConfig::default()
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let receiver = ExactAlgoReceiver::connect(
        AlgodClient::new(&algod.url, None).unwrap(),
        treasury,
        Arc::new(MemoryKeyStore::default()),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let scheme: Arc<dyn x402_transport::Scheme> = Arc::new(ExactAlgo::new(receiver.clone()));
    let app = Paywall::new()
        .with_served(receiver.served().clone())
        .route(
            "/weather",
            "the weather",
            Accepts::one(scheme, 2_000).unwrap(),
        )
        .apply(Router::new().route("/weather", get(|| async { "sunny" })));
    let (listener, base) = listen().await;
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let write = |allow: bool| {
        let _ = std::fs::remove_file(dir.join("wallet.key"));
        let allow = if allow {
            vec![Allow::X402Http {
                origin: base.clone(),
                pay_to: treasury.to_string(),
            }]
        } else {
            Vec::new()
        };
        common::write_wallet(
            dir,
            common::limits_in(Asset::algo(), "0.01", Some("1")),
            allow,
            "",
            "sqlite://wallet.db",
            &format!(
                "[rails.algo]\nkind = \"exact-algo\"\nalgod_url = \"{}\"\npayer_key_env = \"FETCH_TEST_ALGO_KEY\"\nmax_amount = \"0.5\"\n",
                algod.url
            ),
        );
    };
    let key = hex::encode(seed);
    let env = [("FETCH_TEST_ALGO_KEY", key.as_str())];
    let url = format!("{base}/weather");
    write(true);
    let (ok, out, err) = fetch_with(dir, &[&url], &env).await;
    assert!(ok, "{err}");
    assert_eq!(out, "sunny");
    assert!(
        err.starts_with("paid 0.002 ALGO over x402 (exact-algo)"),
        "{err}"
    );
    assert_eq!(algod.devnet.balance(&treasury), 102_000);

    write(false);
    let (ok, _, err) = fetch_with(dir, &[&url], &env).await;
    assert!(!ok);
    assert!(err.starts_with("stipendex: not paid (denied): "), "{err}");
    assert_eq!(algod.devnet.balance(&treasury), 102_000);
}

/// A shop at its own origin selling `GET /api/search` at 0.05 USD over the ledger in `dir`
/// (its records beside it), and a wallet's files in `dir`: its key, a principal's key, and the
/// mandate `limits` allow it (the shop pinned at its origin): (the origin, the principal).
async fn shop_and_wallet(dir: &Path, limits: Limits) -> (String, SecretKey) {
    let (_ledger, ledger_url, agent, shop) = common::funded_ledger(dir, 1000).await;
    let (listener, base, receiver, shop_key) = search_shop(
        &common::payee_rails(&dir.join("receiver.db"), &ledger_url, shop),
        &stipendex::ProcessEnv,
    )
    .await;
    serve_search(listener, receiver);
    // The wallet's file, every path relative to it. The ledger file is the one the shop uses.
    let (principal, _) = common::write_wallet(
        dir,
        limits,
        vec![common::allow_shop(&shop_key, &base)],
        "",
        "sqlite://wallet-records.db",
        &common::payer_rail("sqlite://ledger.db", agent),
    );
    std::fs::write(dir.join("principal.key"), principal.to_hex().as_str()).unwrap();
    (base, principal)
}

/// `stipendex ARGS…` run in `cwd`: success, stdout, stderr.
async fn run_in(cwd: &Path, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_stipendex"))
        .args(args)
        .current_dir(cwd)
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 45: a mandate's limits and its revocation follow the wallet's configuration wherever
/// the command runs — every relative path (the store's, the ledger's) is read beside the file
/// that names it — and a revocation kept beside the mandate is honoured whatever store is open.
#[tokio::test(flavor = "multi_thread")]
async fn the_wallets_limits_and_revocation_follow_its_config_wherever_it_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (base, _) = shop_and_wallet(dir, limits("0.05", "0.10")).await;
    let sub = dir.join("elsewhere");
    std::fs::create_dir(&sub).unwrap();
    let url = format!("{base}/api/search?q=rust");
    for _ in 0..2 {
        let (ok, _, err) = run_in(dir, &["fetch", "--config", "wallet.toml", &url]).await;
        assert!(ok, "{err}");
    }
    let (ok, _, err) = run_in(dir, &["fetch", "--config", "wallet.toml", &url]).await;
    assert!(!ok && err.contains("limit_exceeded"), "{err}");
    // The same configuration from another directory: the same store, the same limit.
    let (ok, out, err) = run_in(&sub, &["fetch", "--config", "../wallet.toml", &url]).await;
    assert!(!ok, "the limit held in {}: {out}", dir.display());
    assert!(err.contains("limit_exceeded"), "{err}");
    assert!(
        !sub.join("wallet-records.db").exists(),
        "no fresh store in the working directory"
    );
    assert!(
        !sub.join("ledger.db").exists(),
        "no fresh ledger in the working directory"
    );

    // Revocation, recorded through the wallet's configuration from yet another directory.
    let tmp2 = tempfile::tempdir().unwrap();
    let dir2 = tmp2.path();
    let (base2, _) = shop_and_wallet(dir2, limits("0.05", "1.00")).await;
    let url2 = format!("{base2}/api/search?q=rust");
    let (ok, _, err) = run_in(dir2, &["fetch", "--config", "wallet.toml", &url2]).await;
    assert!(ok, "{err}");
    let config = dir2.join("wallet.toml").display().to_string();
    let (ok, _, err) = run_in(
        dir,
        &[
            "mandate",
            "revoke",
            "--key",
            &dir2.join("principal.key").display().to_string(),
            &dir2.join("mandate.jws").display().to_string(),
            "--config",
            &config,
            "--out",
            &dir.join("elsewhere.revocation.jws").display().to_string(),
        ],
    )
    .await;
    assert!(ok, "{err}");
    let (ok, _, err) = run_in(&sub, &["fetch", "--config", &config, &url2]).await;
    assert!(!ok && err.contains("(revoked)"), "{err}");

    // A revocation written beside the mandate only (recorded in no store the wallet opens) is
    // honoured too.
    let tmp3 = tempfile::tempdir().unwrap();
    let dir3 = tmp3.path();
    let (base3, _) = shop_and_wallet(dir3, limits("0.05", "1.00")).await;
    let (ok, _, err) = run_in(
        dir3,
        &[
            "mandate",
            "revoke",
            "--key",
            "principal.key",
            "mandate.jws",
            "--store",
            &format!("sqlite://{}", dir3.join("somewhere-else.db").display()),
        ],
    )
    .await;
    assert!(ok, "{err}");
    let (ok, _, err) = run_in(
        &sub,
        &[
            "fetch",
            "--config",
            &dir3.join("wallet.toml").display().to_string(),
            &format!("{base3}/api/search"),
        ],
    )
    .await;
    assert!(!ok && err.contains("(revoked)"), "{err}");
}

/// Issue 45: a wallet that does not know its principal does not start (one sentence saying how
/// to set it); one that does refuses a mandate signed by anyone else, however generous.
#[tokio::test(flavor = "multi_thread")]
async fn a_wallet_without_its_principal_does_not_start_and_a_stranger_s_mandate_pays_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (base, principal) = shop_and_wallet(dir, limits("0.05", "1.00")).await;
    let url = format!("{base}/api/search");
    let config = std::fs::read_to_string(dir.join("wallet.toml")).unwrap();
    let principal_line = format!("principal = \"{}\"\n", principal.public());
    std::fs::write(dir.join("wallet.toml"), config.replace(&principal_line, "")).unwrap();
    let (ok, out, err) = run_in(dir, &["fetch", "--config", "wallet.toml", &url]).await;
    assert!(!ok && out.is_empty());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("[wallet] principal is not set") && err.contains("add principal = "),
        "{err}"
    );
    // A mandate signed by a fresh key, allowing 100 USD a call: refused, nothing paid.
    let stranger = SecretKey::generate();
    let m: Signed<Mandate> = Signed::parse(
        std::fs::read_to_string(dir.join("mandate.jws"))
            .unwrap()
            .trim(),
    )
    .unwrap();
    let mut forged = m.object().clone();
    forged.principal.key = stranger.public();
    forged.limits = vec![limits("100.00", "1000.00")];
    std::fs::write(
        dir.join("mandate.jws"),
        Signed::sign(forged, &stranger).unwrap().jws(),
    )
    .unwrap();
    std::fs::write(dir.join("wallet.toml"), config).unwrap();
    let (ok, out, err) = run_in(dir, &["fetch", "--config", "wallet.toml", &url]).await;
    assert!(!ok && out.is_empty(), "a stranger's mandate paid: {out}");
    assert!(err.contains("not the trusted principal"), "{err}");
}

/// Issue 45: the journal is on by default, beside the configuration; turned off, every payment
/// says so. The store and the journal must belong together: a store that has never seen the
/// mandate whose payments the journal holds (its limits would start from zero) is refused, and
/// so is a journal emptied under a store that counted them.
#[tokio::test(flavor = "multi_thread")]
async fn the_journal_is_on_by_default_and_must_belong_with_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (base, _) = shop_and_wallet(dir, limits("0.05", "1.00")).await;
    let url = format!("{base}/api/search");
    let (ok, _, err) = run_in(dir, &["fetch", "--config", "wallet.toml", &url]).await;
    assert!(ok, "{err}");
    assert!(!err.contains("no audit journal"), "{err}");
    assert_eq!(
        common::count_jws(&dir.join("chains")),
        1,
        "the payment's chain, by default"
    );

    // Another store under the same journal: refused, nothing paid.
    let config = std::fs::read_to_string(dir.join("wallet.toml")).unwrap();
    std::fs::write(
        dir.join("wallet.toml"),
        config.replace("wallet-records.db", "fresh-records.db"),
    )
    .unwrap();
    let (ok, out, err) = run_in(dir, &["fetch", "--config", "wallet.toml", &url]).await;
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("has no record of mandate"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // The journal gone, the store kept: refused too.
    std::fs::write(dir.join("wallet.toml"), &config).unwrap();
    std::fs::remove_dir_all(dir.join("chains")).unwrap();
    let (ok, _, err) = run_in(dir, &["fetch", "--config", "wallet.toml", &url]).await;
    assert!(!ok);
    assert!(err.contains("journal has no chain of mandate"), "{err}");
    // Turned off explicitly: it pays, and says it keeps no trail.
    std::fs::write(
        dir.join("wallet.toml"),
        config.replace("[wallet]\n", "[wallet]\njournal = false\n"),
    )
    .unwrap();
    let (ok, _, err) = run_in(dir, &["fetch", "--config", "wallet.toml", &url]).await;
    assert!(ok, "{err}");
    assert!(
        err.contains("(no audit journal: [wallet] journal = false)"),
        "{err}"
    );
}

/// Issue 45: an answer lost after the wallet paid is never paid twice. `fetch` pays and sends
/// its Proof; the server never answers (a hung upstream, a dropped connection) and `fetch`
/// gives up (`--timeout`). The payment is kept with its Proof, listed by `wallet pending`;
/// `wallet resume` reports that Proof; and `fetch` of the same request presents it again —
/// served once, charged once — instead of paying the fresh Quote it is offered.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_answer_is_presented_again_and_never_paid_twice() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_ledger, ledger_url, agent, shop) = common::funded_ledger(dir, 1000).await;
    let (listener, base, receiver, shop_key) = search_shop(
        &common::payee_rails(&dir.join("receiver.db"), &ledger_url, shop),
        &stipendex::ProcessEnv,
    )
    .await;
    // The first paid request is swallowed before it reaches the receiver: its answer is lost.
    let swallow = Arc::new(AtomicBool::new(true));
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Binding::new(receiver)
        .unwrap()
        .apply(Router::new().route(
            "/api/search",
            get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { "results" }
            }),
        ))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let swallow = swallow.clone();
                async move {
                    if req.headers().contains_key("stipendex-payment")
                        && swallow.swap(false, Ordering::SeqCst)
                    {
                        std::future::pending::<()>().await;
                    }
                    next.run(req).await
                }
            },
        ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    common::write_wallet(
        dir,
        limits("1.00", "5.00"),
        vec![common::allow_shop(&shop_key, &base)],
        "",
        "sqlite://wallet.db",
        &common::payer_rail(&ledger_url, agent),
    );
    let url = format!("{base}/api/search?q=rust");
    let balance = || {
        let url = ledger_url.clone();
        async move {
            let l = rail_ledger::Ledger::sqlite(&url).await.unwrap();
            l.account(agent).await.unwrap().unwrap().posted_balance()
        }
    };
    let before = balance().await;

    let (ok, out, err) = fetch(dir, &["--timeout", "3", &url]).await;
    assert!(!ok && out.is_empty(), "{out}");
    assert!(err.contains("no answer within 3 s"), "{err}");
    assert_eq!(before - balance().await, 5, "paid once");
    let (ok, out, err) = stipendex(&["wallet", "pending"], dir, &[], &[]).await;
    assert!(ok, "{err}");
    assert!(out.contains("paid, its answer not received"), "{out}");
    let chain = out.split_whitespace().next().unwrap().to_owned();
    let (ok, out, err) = stipendex(&["wallet", "resume"], dir, &[&chain], &[]).await;
    assert!(ok, "{err}");
    assert!(out.contains("its answer not received yet"), "{out}");

    // The same request again: the same Proof, served once; nothing more paid.
    let (ok, out, err) = fetch(dir, &[&url]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "results");
    assert!(err.contains("receipt r_"), "{err}");
    assert_eq!(before - balance().await, 5, "still paid once");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // Answered now: nothing is kept, and the next call pays its own Quote.
    let (ok, out, _) = stipendex(&["wallet", "pending"], dir, &[], &[]).await;
    assert!(ok);
    assert_eq!(out.trim(), "no pending payments");
    let (ok, _, err) = fetch(dir, &[&url]).await;
    assert!(ok, "{err}");
    assert_eq!(before - balance().await, 10);
}

/// Issue 45's shops: `GET /api/search` at 0.05 USD over the receiving side of `rails` (a
/// registry's TOML, `env` its variables), at its own origin: the listener, the origin, the
/// receiver and its key.
async fn search_shop(
    rails: &str,
    env: &dyn stipendex::Env,
) -> (tokio::net::TcpListener, String, Receiver, SecretKey) {
    let (listener, base) = listen().await;
    let rails = Registry::from_toml(rails, env).await.unwrap();
    let shop_key = SecretKey::generate();
    let receiver = Receiver::builder("shop", shop_key.clone())
        .origin(&base)
        .registry(&rails)
        .price(PricedCapability::fixed(
            "GET",
            "/api/search",
            Money::parse(Asset::usd(), "0.05").unwrap(),
        ))
        .build()
        .unwrap();
    (listener, base, receiver, shop_key)
}

/// `receiver` in front of `GET /api/search` answering "results", served on `listener`.
fn serve_search(listener: tokio::net::TcpListener, receiver: Receiver) {
    let app = Binding::new(receiver)
        .unwrap()
        .apply(Router::new().route("/api/search", get(|| async { "results" })));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
}

/// The wallet's files in `dir`: its key, a principal's mandate (1.00 a call, 5.00 in all) that
/// pins the shop of `shop_key` at `base`, and `wallet.toml` paying over `rail` (a `[rails.*]`
/// section), its store and journal (the default, `chains`) beside it.
fn search_wallet(dir: &Path, base: &str, shop_key: &SecretKey, rail: &str) {
    common::write_wallet(
        dir,
        limits("1.00", "5.00"),
        vec![common::allow_shop(shop_key, base)],
        "",
        "sqlite://wallet.db",
        rail,
    );
}

/// The files of `dir/chains` ending in `.ext`, by name without it.
fn journal_files(dir: &Path, ext: &str) -> Vec<String> {
    std::fs::read_dir(dir.join("chains"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == ext))
                .filter_map(|e| {
                    e.path()
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Issue 45: two `stipendex fetch` processes of one wallet asking the same request at the same
/// moment pay once: one pays, the other waits for that payment and presents its Proof — served
/// by the kept answer, or told to ask again — never paying its own Quote beside it. The shop
/// answers both unpaid requests together (both hold a fresh Quote for the request at once), and
/// the wallet's store is busy for 1.5 s just then (a slow disk): this makes the moment a
/// wallet decides that no payment for the request is under way, and the moment it records its
/// own, as far apart as a loaded machine can make them — without it the test pays twice about
/// one run in eight on an unfixed wallet, with it every time.
#[tokio::test(flavor = "multi_thread")]
async fn two_fetches_of_the_same_request_at_once_pay_once() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (_ledger, ledger_url, agent, shop) = common::funded_ledger(dir, 1000).await;
    let (listener, base, receiver, shop_key) = search_shop(
        &common::payee_rails(&dir.join("receiver.db"), &ledger_url, shop),
        &std::collections::BTreeMap::<String, String>::new(),
    )
    .await;
    // The unpaid requests are held until both have come and the store is busy (at most 15 s),
    // then answered 402 together; the paid work takes 2 s.
    let unpaid = Arc::new(AtomicUsize::new(0));
    let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (arrived, release) = (unpaid.clone(), go.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = Binding::new(receiver)
        .unwrap()
        .apply(Router::new().route(
            "/api/search",
            get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async {
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                    "results"
                }
            }),
        ))
        .layer(axum::middleware::from_fn(
            move |req: axum::extract::Request, next: axum::middleware::Next| {
                let (unpaid, go) = (unpaid.clone(), go.clone());
                async move {
                    if !req.headers().contains_key("stipendex-payment") {
                        unpaid.fetch_add(1, Ordering::SeqCst);
                        for _ in 0..750 {
                            if go.load(Ordering::SeqCst) {
                                break;
                            }
                            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                        }
                    }
                    next.run(req).await
                }
            },
        ));
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    search_wallet(
        dir,
        &base,
        &shop_key,
        &common::payer_rail(&ledger_url, agent),
    );
    let paid = || {
        let url = ledger_url.clone();
        async move {
            let l = rail_ledger::Ledger::sqlite(&url).await.unwrap();
            let a = l.account(agent).await.unwrap().unwrap();
            (a.debits_posted, a.debits_pending)
        }
    };
    let url = format!("{base}/api/search?q=rust");

    let args = [url.as_str()];
    let busy_store = async {
        use sqlx::Connection as _;
        for _ in 0..300 {
            if arrived.load(Ordering::SeqCst) >= 2 {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let mut db = sqlx::sqlite::SqliteConnection::connect(&format!(
            "sqlite://{}",
            dir.join("wallet.db").display()
        ))
        .await
        .unwrap();
        sqlx::query("BEGIN EXCLUSIVE")
            .execute(&mut db)
            .await
            .unwrap();
        release.store(true, Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        sqlx::query("ROLLBACK").execute(&mut db).await.unwrap();
    };
    let (a, b, ()) = tokio::join!(fetch(dir, &args), fetch(dir, &args), busy_store);
    assert_eq!(paid().await, (5, 0), "one payment for both: {a:?} {b:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the work ran once: {a:?} {b:?}"
    );
    assert_eq!(journal_files(dir, "jws").len(), 1, "one chain: {a:?} {b:?}");
    let served = [&a, &b]
        .iter()
        .filter(|(ok, out, _)| *ok && out == "results")
        .count();
    assert!(served >= 1, "neither was served: {a:?} {b:?}");
    for (ok, out, err) in [&a, &b] {
        if !(*ok && out == "results") {
            // Not served: told in one sentence that the payment made is its, to ask again.
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            assert!(
                !err.contains("not paid ("),
                "refused instead of waiting: {err}"
            );
        }
    }

    // Asked again once both have ended: nothing is left to pay for the first answer, and the
    // new request pays its own Quote — one more payment, never two.
    let (ok, out, _) = stipendex(&["wallet", "pending"], dir, &[], &[]).await;
    assert!(ok);
    assert_eq!(out.trim(), "no pending payments");
    let (ok, out, err) = fetch(dir, &[&url]).await;
    assert!(ok && out == "results", "{err}");
    assert_eq!(paid().await, (10, 0));
}

/// `stipendex facilitator serve` on SQLite (network [`HUNG_NET`]) with an agent funded with
/// 10.00 and a shop, reached by the wallet through a relay that can hang (a facilitator that
/// stopped answering); a shop selling `GET /api/search` at 0.05 USD over the `account` rail at
/// its own origin; the wallet's files in `dir`, paying over the relay.
struct HungRail {
    _tmp: tempfile::TempDir,
    dir: std::path::PathBuf,
    facilitator: std::process::Child,
    db: String,
    agent: rail_ledger::AccountId,
    agent_key: String,
    base: String,
    hung: Arc<std::sync::atomic::AtomicBool>,
    runs: Arc<std::sync::atomic::AtomicUsize>,
}

const HUNG_NET: &str = "hang.test";

impl Drop for HungRail {
    fn drop(&mut self) {
        let _ = self.facilitator.kill();
        let _ = self.facilitator.wait();
    }
}

impl HungRail {
    async fn new() -> Self {
        use std::io::BufRead as _;
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let db = format!("sqlite://{}", dir.join("facilitator.db").display());
        let (agent, agent_key) = (
            rail_ledger::AccountId::random(),
            rail_account::AccountKey::generate(),
        );
        let (shop, shop_key) = (
            rail_ledger::AccountId::random(),
            rail_account::AccountKey::generate(),
        );
        {
            let fac = stipendex_facilitator::open(
                &db,
                None,
                stipendex_facilitator::Config::new(HUNG_NET),
                None,
            )
            .await
            .unwrap();
            for (id, key) in [(agent, &agent_key), (shop, &shop_key)] {
                fac.create_account(stipendex_facilitator::NewAccount {
                    id: Some(id),
                    key: key.public(),
                    asset: Asset::usd(),
                    review_above: None,
                    label: "test".into(),
                })
                .await
                .unwrap();
            }
            fac.fund(agent, &Money::parse(Asset::usd(), "10.00").unwrap(), "t")
                .await
                .unwrap();
        }
        let mut facilitator = std::process::Command::new(env!("CARGO_BIN_EXE_stipendex"))
            .args([
                "facilitator",
                "serve",
                "--db",
                &db,
                "--network",
                HUNG_NET,
                "--listen",
                "127.0.0.1:0",
            ])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(facilitator.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let fac_url = line
            .trim()
            .rsplit(' ')
            .next()
            .filter(|u| u.starts_with("http://"))
            .unwrap_or_else(|| panic!("the facilitator did not say where it serves: {line:?}"))
            .to_owned();

        // The wallet's link to the facilitator: a relay that, hung, takes a connection and never
        // answers it.
        let hung = Arc::new(AtomicBool::new(false));
        let relay = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_url = format!("http://{}", relay.local_addr().unwrap());
        let upstream = fac_url.trim_start_matches("http://").to_owned();
        let hanging = hung.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = relay.accept().await {
                let (hung, upstream) = (hanging.load(Ordering::SeqCst), upstream.clone());
                tokio::spawn(async move {
                    if hung {
                        let _ = tokio::io::copy(&mut inbound, &mut tokio::io::sink()).await;
                    } else if let Ok(mut out) = tokio::net::TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
            }
        });

        // The shop reaches the facilitator directly.
        let env = std::collections::BTreeMap::from([(
            "SHOP_ACCOUNT_KEY".to_owned(),
            shop_key.to_hex().to_string(),
        )]);
        let (listener, base, receiver, receiver_key) = search_shop(
            &format!(
                "[store]\nurl = \"sqlite://{}\"\n[rails.fac]\nkind = \"account\"\nurl = \"{fac_url}\"\nnetwork = \"{HUNG_NET}\"\npayee_account = \"{shop}\"\npayee_key_env = \"SHOP_ACCOUNT_KEY\"\n",
                dir.join("receiver.db").display()
            ),
            &env,
        )
        .await;
        let runs = Arc::new(AtomicUsize::new(0));
        let counted = runs.clone();
        let app = Binding::new(receiver).unwrap().apply(Router::new().route(
            "/api/search",
            get(move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { "results" }
            }),
        ));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        search_wallet(
            &dir,
            &base,
            &receiver_key,
            &format!(
                "[rails.fac]\nkind = \"account\"\nurl = \"{relay_url}\"\nnetwork = \"{HUNG_NET}\"\npayer_account = \"{agent}\"\npayer_key_env = \"FETCH_TEST_ACCOUNT_KEY\"\n"
            ),
        );
        HungRail {
            _tmp: tmp,
            dir,
            facilitator,
            db,
            agent,
            agent_key: agent_key.to_hex().to_string(),
            base,
            hung,
            runs,
        }
    }

    fn hang(&self, hung: bool) {
        self.hung.store(hung, std::sync::atomic::Ordering::SeqCst);
    }

    fn runs(&self) -> usize {
        self.runs.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// `stipendex COMMAND… --config DIR/wallet.toml ARGS…` with the payer's key.
    async fn run(&self, command: &[&str], args: &[&str]) -> (bool, String, String) {
        stipendex(
            command,
            &self.dir,
            args,
            &[("FETCH_TEST_ACCOUNT_KEY", self.agent_key.as_str())],
        )
        .await
    }

    /// What the agent has paid at the facilitator, in cents (posted, and held).
    async fn paid(&self) -> (u64, u64) {
        let l = rail_ledger::Ledger::sqlite(&self.db).await.unwrap();
        let a = l.account(self.agent).await.unwrap().unwrap();
        (a.debits_posted, a.debits_pending)
    }

    /// `stipendex wallet pending`'s chains.
    async fn pending(&self) -> Vec<String> {
        let (ok, out, err) = self.run(&["wallet", "pending"], &[]).await;
        assert!(ok, "{err}");
        if out.trim() == "no pending payments" {
            return Vec::new();
        }
        out.lines()
            .map(|l| l.split_whitespace().next().unwrap().to_owned())
            .collect()
    }
}

/// Issue 45: a rail that hangs after the 402 (the wallet's facilitator stops answering) is
/// reported while `fetch` waits — "still waiting" after 10 s, not a minute of silence — and
/// `--timeout` ends it in one sentence. The payment it started stays pending; once the rail is
/// back, the same request finishes that payment and is served: paid once, never beside it.
#[tokio::test(flavor = "multi_thread")]
async fn a_hung_rail_is_reported_while_fetch_waits() {
    let h = HungRail::new().await;
    let url = format!("{}/api/search?q=rust", h.base);
    h.hang(true);
    let started = std::time::Instant::now();
    let (ok, out, err) = h.run(&["fetch"], &["--timeout", "14", &url]).await;
    let took = started.elapsed();
    assert!(!ok && out.is_empty(), "{out}");
    let lines: Vec<&str> = err.trim_end().lines().collect();
    assert_eq!(lines.len(), 2, "a notice, then one sentence: {err}");
    assert!(
        lines[0].starts_with("still waiting after 10 s: "),
        "no notice at 10 s: {err}"
    );
    assert!(
        lines[1].starts_with("stipendex: no answer within 14 s (--timeout): ")
            && lines[1].contains("stipendex wallet pending"),
        "{err}"
    );
    assert!(
        took >= std::time::Duration::from_secs(14) && took < std::time::Duration::from_secs(25),
        "{took:?}"
    );
    assert_eq!(h.paid().await, (0, 0), "nothing paid while the rail hung");
    assert_eq!(h.runs(), 0);
    let pending = h.pending().await;
    assert_eq!(pending.len(), 1, "{pending:?}");

    // The rail back: the same request finishes that payment, served, paid once.
    h.hang(false);
    let (ok, out, err) = h.run(&["fetch"], &[&url]).await;
    assert!(ok, "{err}");
    assert_eq!(out, "results");
    assert!(err.starts_with("paid 0.05 USD over fac"), "{err}");
    assert_eq!(h.paid().await, (5, 0), "paid once");
    assert_eq!(h.runs(), 1);
    assert_eq!(
        journal_files(&h.dir, "jws"),
        pending,
        "the payment left pending must be the one finished, not a fresh Quote paid beside it"
    );
    let left = h.pending().await;
    assert!(
        left.is_empty(),
        "{left:?} is left pending: `wallet resume` would pay it, a second payment for one answer"
    );
}

/// Issue 45: a payment left in progress by a `fetch` that was killed (its rail hung) is not
/// "in progress; resume it again later" for the length of a lease. While that `fetch` runs,
/// `wallet resume` says the payment is being made and that it is taken over at once when its
/// process ends; once it is killed, `wallet resume` takes it over at once and finishes it with
/// one Proof; the same request then presents that Proof — served, paid once.
#[tokio::test(flavor = "multi_thread")]
async fn wallet_resume_says_when_an_interrupted_payment_can_be_taken_over() {
    let h = HungRail::new().await;
    let url = format!("{}/api/search?q=rust", h.base);
    h.hang(true);
    let mut first = tokio::process::Command::new(env!("CARGO_BIN_EXE_stipendex"))
        .args(["fetch", "--config"])
        .arg(h.dir.join("wallet.toml"))
        .arg(&url)
        .env("FETCH_TEST_ACCOUNT_KEY", &h.agent_key)
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The payment is pending (journaled before the rail was asked), its rail hung.
    let mut chain = None;
    for _ in 0..200 {
        if let Some(c) = journal_files(&h.dir, "pending").pop() {
            chain = Some(c);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let chain = chain.expect("the payment was never pending");
    assert_eq!(h.pending().await, std::slice::from_ref(&chain));

    // Its process still running: resume says so, and when it can be taken over.
    let (ok, out, err) = h.run(&["wallet", "resume"], &[&chain]).await;
    assert!(!ok && out.is_empty(), "{out}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "payment {chain} is being made now by another call that is still running"
        )) && err.contains("a payment whose process has ended is taken over at once"),
        "{err}"
    );
    assert_eq!(h.paid().await, (0, 0));

    // Killed mid-payment; the rail back. Taken over at once (not after a lease), paid once.
    first.kill().await.unwrap();
    h.hang(false);
    let started = std::time::Instant::now();
    let (ok, out, err) = h.run(&["wallet", "resume"], &[&chain]).await;
    assert!(ok, "{err}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "taken over after {:?}",
        started.elapsed()
    );
    let prefix = format!("paid: {chain}, 0.05 USD over fac, proof p_");
    assert!(out.starts_with(&prefix), "{out}");
    assert!(out.contains("its answer not received yet"), "{out}");
    assert_eq!(h.paid().await, (5, 0), "paid once");
    // Resumed again: the same Proof, nothing more.
    let (ok, again, err) = h.run(&["wallet", "resume"], &[&chain]).await;
    assert!(ok, "{err}");
    assert_eq!(again, out);
    assert_eq!(h.paid().await, (5, 0));

    // The same request presents that Proof: served, still paid once, nothing left pending.
    let (ok, body, err) = h.run(&["fetch"], &[&url]).await;
    assert!(ok, "{err}");
    assert_eq!(body, "results");
    assert!(err.contains("receipt r_"), "{err}");
    assert_eq!(h.paid().await, (5, 0), "still paid once");
    assert_eq!(h.runs(), 1);
    assert!(h.pending().await.is_empty());
    assert_eq!(journal_files(&h.dir, "jws"), [chain]);
}
