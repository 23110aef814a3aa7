//! `stipendex facilitator bench`: paid payments per second (pay, then verify once) through the
//! hosted facilitator at N concurrent clients, p50/p99, beside the embedded ledger rail doing
//! the same on the same machine and database; and what request signing costs.
//!
//! Closed loop: each client keeps one payment in flight; a payment is the payer's `pay` and
//! the receiver's `verify`, timed together. The facilitator runs in this process (the load
//! generator shares its cores, as the embedded rail shares them with its caller).

#![allow(clippy::print_stdout)] // a command's output

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use rail_account::auth::{self, Canonical, RequestParts, SignedRequest};
use rail_account::{AccountClient, AccountKey, AccountPayer, AccountReceiver};
use rail_core::{
    Asset, Charge, Money, OpId, Payer, RailReceiver, ReplayGuard, SharedClock, SystemClock,
};
use rail_ledger::{
    AccountId, Ledger, LedgerPayer, LedgerReceiver, NewAccount, TransferId, TransferRequest,
};
use stipendex_facilitator::{Config, Facilitator};

use crate::measure::{Ms, pct};

use crate::{CliError, msg};

/// What to measure.
#[derive(Args, Clone)]
pub(crate) struct BenchArgs {
    /// Where the measurements keep their databases: SQLite (one instance) or PostgreSQL (one
    /// and two instances, each measurement in a fresh schema).
    #[command(flatten)]
    store: crate::bench::StoreArgs,
    /// Concurrent clients.
    #[arg(long, default_value_t = 20)]
    clients: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

type PayFn =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

struct Figures {
    per_sec: u64,
    p50_us: u64,
    p99_us: u64,
    failed: u64,
}

async fn closed_loop(clients: usize, seconds: u64, pay: PayFn) -> Figures {
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let pay = pay.clone();
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut failed) = (Vec::new(), 0u64);
            while Instant::now() < until {
                let t = Instant::now();
                match pay().await {
                    Ok(()) => lat.push(u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX)),
                    Err(_) => failed += 1,
                }
            }
            (lat, failed)
        }));
    }
    let (mut all, mut failed) = (Vec::new(), 0);
    for t in tasks {
        if let Ok((l, f)) = t.await {
            all.extend(l);
            failed += f;
        }
    }
    all.sort_unstable();
    Figures {
        per_sec: u64::try_from(all.len()).unwrap_or(u64::MAX) / seconds.max(1),
        p50_us: pct(&all, 50),
        p99_us: pct(&all, 99),
        failed,
    }
}

fn usd(units: u128) -> Result<Money, CliError> {
    Money::from_minor(Asset::usd(), units).map_err(|e| msg(e.to_string()))
}

fn err(e: impl std::fmt::Display) -> CliError {
    msg(format!("bench setup: {e}"))
}

/// The database of one measurement: a file in `dir`, or a fresh PostgreSQL schema.
struct Db {
    url: String,
    schema: Option<String>,
}

impl Db {
    fn new(args: &BenchArgs, dir: &std::path::Path, name: &str) -> Result<Db, CliError> {
        Ok(match args.store.fresh_schema(name)? {
            None => Db {
                url: format!("sqlite://{}/{name}.db", dir.display()),
                schema: None,
            },
            schema => Db {
                url: args.store.pg_url.clone(),
                schema,
            },
        })
    }

    async fn drop_schema(&self) {
        if let Some(s) = &self.schema {
            let _ =
                crate::bench::pg_admin(&self.url, &format!("DROP SCHEMA IF EXISTS {s} CASCADE"))
                    .await;
        }
    }
}

async fn embedded_ledger(db: &Db, dir: &std::path::Path) -> Result<PayFn, CliError> {
    let ledger = match &db.schema {
        None => Ledger::sqlite(&db.url).await.map_err(err)?,
        Some(s) => Ledger::postgres(&db.url, Some(s)).await.map_err(err)?,
    };
    let keys: Arc<dyn rail_core::KeyStore> = match &db.schema {
        None => Arc::new(
            rail_core::keys::sql::SqliteKeyStore::open(&dir.join("ledger-keys.db"))
                .await
                .map_err(err)?,
        ),
        Some(s) => {
            let pool = rail_core::keys::sql::postgres_pool(&db.url, Some(s))
                .await
                .map_err(err)?;
            Arc::new(
                rail_core::keys::sql::PgKeyStore::new(pool)
                    .await
                    .map_err(err)?,
            )
        }
    };
    let (bank, agent, shop) = (
        AccountId::random(),
        AccountId::random(),
        AccountId::random(),
    );
    for (id, no_overdraft) in [(bank, false), (agent, true), (shop, true)] {
        ledger
            .create_account(NewAccount {
                id,
                asset: Asset::usd(),
                no_overdraft,
            })
            .await
            .map_err(err)?;
    }
    ledger
        .transfer(TransferRequest::Single {
            id: TransferId::random(),
            debit: bank,
            credit: agent,
            amount: 1 << 40,
            user_data: 0,
        })
        .await
        .map_err(err)?;
    let payer = Arc::new(LedgerPayer::new(ledger.clone(), agent, Asset::usd()));
    let receiver = Arc::new(LedgerReceiver::new(
        ledger,
        shop,
        Asset::usd(),
        ReplayGuard::new(keys, "bench"),
    ));
    paid_payment(payer, receiver)
}

/// One paid payment of one cent: the receiver's offer, the payer's `pay`, one `verify`.
fn paid_payment(payer: Arc<dyn Payer>, receiver: Arc<dyn RailReceiver>) -> Result<PayFn, CliError> {
    let price = usd(1)?;
    Ok(Arc::new(move || {
        let (payer, receiver, price) = (payer.clone(), receiver.clone(), price.clone());
        Box::pin(async move {
            let offer = receiver
                .offer(&Charge::capture(price, Duration::from_secs(60)))
                .await
                .map_err(|e| e.to_string())?;
            let p = payer
                .pay(&OpId::random(), &offer)
                .await
                .map_err(|e| e.to_string())?;
            receiver
                .verify(&offer, &p)
                .await
                .map_err(|e| e.to_string())?;
            Ok(())
        })
    }))
}

/// Facilitator instances on `db`, served on loopback; the payer and receiver clients.
async fn hosted(
    db: &Db,
    instances: usize,
) -> Result<(PayFn, Vec<tokio::task::JoinHandle<()>>), CliError> {
    let mut facs: Vec<Facilitator> = Vec::new();
    for i in 0..instances {
        facs.push(
            stipendex_facilitator::open(
                &db.url,
                db.schema.as_deref(),
                Config::new("bench").with_instance(&format!("i{i}")),
                None,
            )
            .await
            .map_err(err)?,
        );
    }
    let first = facs.first().ok_or_else(|| msg("no instance"))?;
    let (agent, shop) = (AccountKey::generate(), AccountKey::generate());
    let mut ids = Vec::new();
    for key in [&agent, &shop] {
        let r = first
            .create_account(stipendex_facilitator::NewAccount {
                id: None,
                key: key.public(),
                asset: Asset::usd(),
                review_above: None,
                label: "bench".into(),
            })
            .await
            .map_err(err)?;
        ids.push(r.id);
    }
    let (agent_id, shop_id) = (
        ids.first().cloned().unwrap_or_default(),
        ids.get(1).cloned().unwrap_or_default(),
    );
    first
        .fund(agent_id.parse().map_err(err)?, &usd(1 << 40)?, "bench")
        .await
        .map_err(err)?;
    let mut urls = Vec::new();
    let mut servers = Vec::new();
    for fac in facs {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(err)?;
        urls.push(format!("http://{}", listener.local_addr().map_err(err)?));
        servers.push(tokio::spawn(async move {
            let _ = stipendex_facilitator::serve(listener, fac, std::future::pending()).await;
        }));
    }
    let payer = Arc::new(AccountPayer::new(
        AccountClient::new(urls.clone(), &agent_id, agent, "bench").map_err(err)?,
        Asset::usd(),
    ));
    let receiver = Arc::new(AccountReceiver::new(
        AccountClient::new(urls, &shop_id, shop, "bench").map_err(err)?,
        Asset::usd(),
    ));
    let pay = paid_payment(payer, receiver)?;
    Ok((pay, servers))
}

/// Microseconds per signature and per check, over `n` requests with a 300-byte body.
fn signing_cost(n: u32) -> (u64, u64) {
    let key = AccountKey::generate();
    let public = key.public();
    let account = "0000000000000000000000000000a11c";
    let body = vec![b'x'; 300];
    let clock: SharedClock = Arc::new(SystemClock);
    let now = rail_core::Clock::now(clock.as_ref());
    let nonce = auth::nonce();
    let canonical = Canonical {
        network: "bench",
        method: "POST",
        path_and_query: "/v1/payments",
        account,
        timestamp_ms: now.0,
        nonce: &nonce,
        idempotency_key: Some("op_0123456789abcdef"),
        body: &body,
    };
    let t = Instant::now();
    let mut sig = key.sign(&canonical);
    for _ in 1..n {
        sig = key.sign(&canonical);
    }
    let sign_us = u64::try_from(t.elapsed().as_micros() / u128::from(n)).unwrap_or(0);
    let signed = SignedRequest {
        account: account.into(),
        timestamp_ms: now.0,
        nonce: nonce.clone(),
        signature: sig,
    };
    let parts = RequestParts {
        network: "bench",
        method: "POST",
        path_and_query: "/v1/payments",
        idempotency_key: Some("op_0123456789abcdef"),
        body: &body,
    };
    let t = Instant::now();
    for _ in 0..n {
        let _ = auth::check(&signed, &public, &parts, now, auth::DEFAULT_WINDOW);
    }
    let check_us = u64::try_from(t.elapsed().as_micros() / u128::from(n)).unwrap_or(0);
    (sign_us, check_us)
}

fn row(name: &str, f: &Figures) {
    println!(
        "{name:<40} {:>8}/s  p50 {:>6} ms  p99 {:>6} ms{}",
        f.per_sec,
        Ms(f.p50_us),
        Ms(f.p99_us),
        if f.failed > 0 {
            format!("  ({} failed)", f.failed)
        } else {
            String::new()
        }
    );
}

pub(crate) async fn run(args: BenchArgs) -> Result<std::process::ExitCode, CliError> {
    let dir = tempfile::tempdir().map_err(err)?;
    println!(
        "paid payments (offer, pay, verify once), {} concurrent clients, {} s each, {} backend, durable commits",
        args.clients, args.seconds, args.store.backend
    );
    let db = Db::new(&args, dir.path(), "ledger")?;
    let pay = embedded_ledger(&db, dir.path()).await?;
    row(
        "ledger rail, embedded",
        &closed_loop(args.clients, args.seconds, pay).await,
    );
    db.drop_schema().await;
    let counts: &[usize] = if args.store.backend == "postgres" {
        &[1, 2]
    } else {
        &[1]
    };
    for &n in counts {
        let db = Db::new(&args, dir.path(), &format!("account{n}"))?;
        let (pay, servers) = hosted(&db, n).await?;
        let label = format!(
            "account rail, {n} facilitator instance{}",
            if n > 1 { "s" } else { "" }
        );
        row(&label, &closed_loop(args.clients, args.seconds, pay).await);
        for s in servers {
            s.abort();
        }
        db.drop_schema().await;
    }
    let (sign_us, check_us) = signing_cost(2000);
    println!(
        "request signing: {sign_us} µs to sign, {check_us} µs to check (Ed25519 over the canonical request, 300-byte body)"
    );
    Ok(std::process::ExitCode::SUCCESS)
}
