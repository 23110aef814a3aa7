//! `stipendex facilitator` as an operator runs it: one instance on SQLite paid through the
//! `account` rail with a review in between; and two instances on one PostgreSQL, one killed
//! with SIGKILL in the middle of a burst of payments: every payment is applied once or
//! refused, nothing is doubled, and the journal verifies.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::print_stderr,
    missing_docs
)]

use std::io::{BufRead as _, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rail_account::{AccountClient, AccountKey, AccountPayer, AccountReceiver};
use rail_core::{Asset, Charge, Money, OpId, Payer, RailError, RailReceiver};
use rail_ledger::{AccountId, TransferStatus};
use stipendex_facilitator::{Config, NewAccount};

fn stipendex() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_stipendex"));
    c.env_remove("RUST_LOG");
    c
}

/// A running `stipendex facilitator serve`, killed when dropped.
struct Instance {
    child: Child,
    url: String,
}

impl Instance {
    fn start(db: &str, schema: Option<&str>, network: &str, name: &str) -> Instance {
        Self::logging(db, schema, network, name, None)
    }

    /// As [`Instance::start`], its `info` logs written to `log`.
    fn logging(
        db: &str,
        schema: Option<&str>,
        network: &str,
        name: &str,
        log: Option<&std::path::Path>,
    ) -> Instance {
        let mut cmd = stipendex();
        cmd.args([
            "facilitator",
            "serve",
            "--db",
            db,
            "--network",
            network,
            "--listen",
            "127.0.0.1:0",
            "--instance",
            name,
            "--log-json",
        ]);
        if let Some(s) = schema {
            cmd.args(["--schema", s]);
        }
        let (level, stderr) = match log {
            Some(path) => ("info", Stdio::from(std::fs::File::create(path).unwrap())),
            None => ("warn", Stdio::inherit()),
        };
        let mut child = cmd
            .env("RUST_LOG", level)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let url = line
            .trim()
            .rsplit(' ')
            .next()
            .filter(|u| u.starts_with("http://"))
            .unwrap_or_else(|| panic!("the facilitator did not say where it serves: {line:?}"))
            .to_owned();
        Instance { child, url }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Party {
    id: AccountId,
    key: AccountKey,
}

async fn party(fac: &stipendex_facilitator::Facilitator, review_above: Option<&str>) -> Party {
    let p = Party {
        id: AccountId::random(),
        key: AccountKey::generate(),
    };
    fac.create_account(NewAccount {
        id: Some(p.id),
        key: p.key.public(),
        asset: Asset::usd(),
        review_above: review_above.map(|v| Money::parse(Asset::usd(), v).unwrap()),
        label: "test".into(),
    })
    .await
    .unwrap();
    p
}

fn client(urls: &[String], p: &Party, network: &str) -> AccountClient {
    AccountClient::new(urls.to_vec(), &p.id.to_string(), p.key.clone(), network).unwrap()
}

fn usd(s: &str) -> Money {
    Money::parse(Asset::usd(), s).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_on_sqlite_with_a_review() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}/fac.db", dir.path().display());
    let fac = stipendex_facilitator::open(&db, None, Config::new("cli.test"), None)
        .await
        .unwrap();
    let (agent, shop) = (party(&fac, Some("1.00")).await, party(&fac, None).await);
    fac.fund(agent.id, &usd("10.00"), "t").await.unwrap();
    drop(fac);
    let log = dir.path().join("facilitator.log");
    let server = Instance::logging(&db, None, "cli.test", "solo", Some(&log));
    let urls = vec![server.url.clone()];
    let payer = AccountPayer::new(client(&urls, &agent, "cli.test"), Asset::usd());
    let receiver = AccountReceiver::new(client(&urls, &shop, "cli.test"), Asset::usd());
    let offer = receiver
        .offer(&Charge::capture(usd("2.00"), Duration::from_secs(600)))
        .await
        .unwrap();
    let op = OpId::random();
    let RailError::PendingReview { payment_ref, .. } = payer.pay(&op, &offer).await.unwrap_err()
    else {
        panic!("a payment above 1.00 waits for review");
    };
    // The operator sees it and approves it from the command line.
    let list = stipendex()
        .args(["facilitator", "review", "list", "--db", &db])
        .output()
        .unwrap();
    assert!(list.status.success());
    assert!(String::from_utf8_lossy(&list.stdout).contains(&payment_ref));
    let ok = stipendex()
        .args([
            "facilitator",
            "review",
            "approve",
            "--db",
            &db,
            &payment_ref,
            "--by",
            "ops",
            "--note",
            "fine",
        ])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let payment = payer.pay(&op, &offer).await.unwrap();
    assert_eq!(
        receiver.verify(&offer, &payment).await.unwrap().amount,
        usd("2.00")
    );
    // Deciding again is refused with one sentence.
    let again = stipendex()
        .args(["facilitator", "review", "reject", "--db", &db, &payment_ref])
        .output()
        .unwrap();
    assert!(!again.status.success());
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        err.starts_with("stipendex: payment ") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    // Metrics and health on the live process.
    let health = reqwest::get(format!("{}/v1/health", server.url))
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let metrics = reqwest::get(format!("{}/metrics", server.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("stipendex_facilitator_refusals_total"),
        "{metrics}"
    );
    // One JSON line per request, naming the route, status and account; never a key, a
    // signature or a nonce.
    drop(server);
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let paid = lines
        .iter()
        .find(|l| l["route"] == "/v1/payments" && l["status"] == 202)
        .unwrap_or_else(|| panic!("no access line for the payment: {text}"));
    assert_eq!(paid["account"], agent.id.to_string());
    assert_eq!(paid["code"], "");
    for secret in [
        agent.key.to_hex().to_string(),
        shop.key.to_hex().to_string(),
    ] {
        assert!(!text.contains(&secret), "a secret key is in the logs");
    }
    for header in [
        "stipendex-signature",
        "stipendex-nonce",
        "signature",
        "nonce",
    ] {
        assert!(
            !text.to_lowercase().contains(header),
            "{header} is in the logs: {text}"
        );
    }
}

/// Two instances on one PostgreSQL; instance A is killed (SIGKILL) a quarter of the way into a
/// burst of 200 payments from 20 concurrent clients that fail over to B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_killed_mid_burst_loses_and_doubles_nothing() {
    const CLIENTS: usize = 20;
    const EACH: usize = 10;
    let url = test_kit::localnet::postgres_url();
    let schema = format!("kill_{:016x}", rand::random::<u64>());
    let network = "kill.test";
    let fac = match tokio::time::timeout(
        Duration::from_secs(5),
        stipendex_facilitator::open(&url, Some(&schema), Config::new(network), None),
    )
    .await
    {
        Ok(Ok(f)) => f,
        Ok(Err(e)) => return test_kit::localnet::missing("PostgreSQL", &e.to_string()),
        Err(_) => return test_kit::localnet::missing("PostgreSQL", "connection timed out"),
    };
    let (agent, shop) = (party(&fac, None).await, party(&fac, None).await);
    fac.fund(agent.id, &usd("1000.00"), "kill-test")
        .await
        .unwrap();
    let a = Instance::start(&url, Some(&schema), network, "a");
    let b = Instance::start(&url, Some(&schema), network, "b");
    let urls = vec![a.url.clone(), b.url.clone()];
    let payer = Arc::new(AccountPayer::new(
        client(&urls, &agent, network),
        Asset::usd(),
    ));
    let receiver = Arc::new(AccountReceiver::new(
        client(&urls, &shop, network),
        Asset::usd(),
    ));

    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let (payer, receiver, done) = (payer.clone(), receiver.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in 0..EACH {
                // Distinct amounts: 1..=200 cents.
                let cents = u128::try_from(c * EACH + i + 1).unwrap();
                let offer = receiver
                    .offer(&Charge::capture(
                        Money::from_minor(Asset::usd(), cents).unwrap(),
                        Duration::from_secs(600),
                    ))
                    .await
                    .unwrap();
                let op = OpId::random();
                let paid = payer.pay(&op, &offer).await;
                let verified = match &paid {
                    Ok(p) => Some(receiver.verify(&offer, p).await),
                    Err(_) => None,
                };
                done.fetch_add(1, Ordering::SeqCst);
                out.push((op, offer, cents, paid, verified));
            }
            out
        }));
    }
    // Kill A once a quarter of the payments are through.
    let start = Instant::now();
    while done.load(Ordering::SeqCst) < CLIENTS * EACH / 4 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the burst does not progress"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut a = a;
    a.child.kill().unwrap(); // SIGKILL
    a.child.wait().unwrap();
    let killed_at = done.load(Ordering::SeqCst);
    let mut results = Vec::new();
    for t in tasks {
        results.extend(t.await.unwrap());
    }
    assert!(killed_at < CLIENTS * EACH, "A was killed after the burst");

    let ledger = fac.ledger();
    let (mut applied, mut refused, mut expected_paid) = (0, 0, 0u128);
    for (op, offer, cents, paid, verified) in &results {
        let id = stipendex_facilitator::payment_id(agent.id, op);
        let on_ledger = ledger.lookup_transfer(id).await.unwrap();
        match paid {
            Ok(p) => {
                let (t, st) = on_ledger.expect("a payment the client got is on the ledger");
                assert_eq!(u128::from(t.amount), *cents);
                assert_eq!(st, Some(TransferStatus::Settled { reversed: 0 }));
                // The same operation again, after the kill: the same payment, not a second.
                assert_eq!(&payer.pay(op, offer).await.unwrap(), p);
                assert!(matches!(verified, Some(Ok(_))), "{verified:?}");
                applied += 1;
                expected_paid += cents;
            }
            Err(e) => {
                // Refused (or unanswered): retried now, it is applied once or still refused,
                // never twice.
                eprintln!("payment refused during the kill: {e}");
                match payer.pay(op, offer).await {
                    Ok(_) => {
                        applied += 1;
                        expected_paid += cents;
                    }
                    Err(_) => {
                        assert!(ledger.lookup_transfer(id).await.unwrap().is_none());
                        refused += 1;
                    }
                }
            }
        }
    }
    let payer_account = ledger.account(agent.id).await.unwrap().unwrap();
    let shop_account = ledger.account(shop.id).await.unwrap().unwrap();
    assert_eq!(
        u128::from(payer_account.debits_posted),
        expected_paid,
        "paid exactly once each"
    );
    assert_eq!(u128::from(shop_account.credits_posted), expected_paid);
    assert_eq!(applied + refused, CLIENTS * EACH);
    let report = ledger.verify_journal().await.unwrap();
    assert!(report.is_intact(), "{:?}", report.problems);
    eprintln!(
        "kill test: {applied} applied, {refused} refused, A killed after {killed_at} of {} payments, journal of {} entries intact",
        CLIENTS * EACH,
        report.entries
    );
    drop(b);
    drop(fac);
    if let Ok(pool) = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
    {
        let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .execute(&pool)
            .await;
    }
}
