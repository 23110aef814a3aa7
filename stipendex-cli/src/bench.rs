//! `stipendex bench [http]`: the HTTP binding's throughput and latency over the ledger rail on
//! embedded SQLite (or, `--backend postgres`, with the ledger and every store in one PostgreSQL
//! schema), and the wallet's overhead above the bare rail call.
//!
//! 1. unpaid: concurrent `GET`s of a priced route, each answered 402 with a fresh signed Quote;
//! 2. paid: concurrent agents, each request quote → wallet pay (mandate checks, durable limits,
//!    a ledger transfer, a signed Proof) → retry → accept (verify on the ledger) → receipt;
//! 3. the wallet's `pay(quote)` against the bare `Payer::pay(offer)` of the same rail, one at a
//!    time.
//!
//! `stipendex bench mcp` measures the MCP binding and the proxy instead ([`crate::bench_mcp`]),
//! `stipendex bench gateway` the gateway beside its upstream ([`crate::bench_gateway`]).

// Timings and rates, never money: floats are fine here.
#![allow(clippy::float_arithmetic, clippy::cast_precision_loss)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use rail_core::{Charge, Money, OpId};
use stipendex::http::{Binding, Client};
use stipendex::receiver::{Gate, PricedCapability, Request};

use crate::bench_common::{Fixture, JournalAt, fixture_on, load, percentiles};
use crate::{CliError, msg};

/// What to measure.
#[derive(Clone, Copy, Debug, Default, clap::ValueEnum)]
pub(crate) enum What {
    /// The HTTP binding (402 + Quote) and the wallet's overhead.
    #[default]
    Http,
    /// The MCP binding (-32402 + Quote) and the proxy (`bench_mcp`).
    Mcp,
    /// The gateway beside the upstream it fronts, and the reference x402 express paywall
    /// where installed (`bench_gateway`).
    Gateway,
    /// Paid calls inside tab sessions beside the per-call path (`bench_tab`).
    Tabs,
}

#[derive(clap::Args)]
pub(crate) struct Args {
    /// What to measure: `http` (default), `mcp`, `gateway` or `tabs`.
    #[arg(value_enum, default_value_t = What::Http)]
    what: What,
    /// Concurrent clients.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Seconds per load phase.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Sequential payments in the overhead phase.
    #[arg(long, default_value_t = 300)]
    payments: usize,
    /// Where the databases go (default: a temporary directory, removed).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Where `http`'s wallet keeps its journal: `default` (in its store, SQLite or
    /// PostgreSQL, as `stipendex init` configures it), `folder` or `off`.
    #[arg(long, value_enum, default_value_t = JournalAt::Default)]
    journal: JournalAt,
    /// Where `http` keeps the ledger and every store.
    #[command(flatten)]
    store: StoreArgs,
}

/// Where a bench keeps its databases (`stipendex bench`, `stipendex facilitator bench`).
#[derive(clap::Args, Clone, Debug)]
pub(crate) struct StoreArgs {
    /// `sqlite` (files) or `postgres` (fresh schemas on `--pg-url`, dropped at the end).
    #[arg(long, default_value = "sqlite")]
    pub(crate) backend: String,
    /// The PostgreSQL server of `--backend postgres`.
    #[arg(
        long,
        env = "STIPENDEX_PG_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/test",
        hide_env_values = true
    )]
    pub(crate) pg_url: String,
}

impl StoreArgs {
    /// A fresh PostgreSQL schema name for measurement `name` (`None`: SQLite).
    ///
    /// # Errors
    /// A `--backend` other than `sqlite` or `postgres`.
    pub(crate) fn fresh_schema(&self, name: &str) -> Result<Option<String>, CliError> {
        match self.backend.as_str() {
            "sqlite" => Ok(None),
            "postgres" => Ok(Some(format!("bench_{name}_{:08x}", rand::random::<u32>()))),
            other => Err(msg(format!("--backend {other:?}: use sqlite or postgres"))),
        }
    }
}

/// Runs `sql` (a bench schema's creation or removal) on the PostgreSQL server at `url`.
pub(crate) async fn pg_admin(url: &str, sql: &str) -> Result<(), CliError> {
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .map_err(|e| {
            msg(format!(
                "cannot reach PostgreSQL at --pg-url (STIPENDEX_PG_URL): {e}"
            ))
        })?;
    let done = sqlx::query(sql)
        .execute(&pool)
        .await
        .map_err(|e| msg(format!("cannot {sql}: {e}")));
    pool.close().await;
    done.map(|_| ())
}

#[allow(
    clippy::print_stdout,
    clippy::cast_precision_loss,
    clippy::float_arithmetic
)]
pub(crate) async fn run(args: Args) -> Result<ExitCode, CliError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tmp;
    let dir = match args.dir.clone() {
        Some(d) => d,
        None => {
            tmp = tempfile::tempdir()
                .map_err(|e| msg(format!("cannot create a temporary directory: {e}")))?;
            tmp.path().to_path_buf()
        }
    };
    std::fs::create_dir_all(&dir)
        .map_err(|e| msg(format!("cannot create {}: {e}", dir.display())))?;
    if let What::Mcp = args.what {
        Box::pin(crate::bench_mcp::run(&dir, args.concurrency, args.seconds)).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if let What::Gateway = args.what {
        Box::pin(crate::bench_gateway::run(&dir, args.seconds)).await?;
        return Ok(ExitCode::SUCCESS);
    }
    if let What::Tabs = args.what {
        Box::pin(crate::bench_tab::run(&dir, args.seconds)).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let schema = args.store.fresh_schema("http")?;
    let pg = schema
        .as_deref()
        .map(|schema| stipendex_app::demo::PgSchema {
            url: &args.store.pg_url,
            schema,
        });
    if let Some(p) = &pg {
        pg_admin(p.url, &format!("CREATE SCHEMA {}", p.schema)).await?;
    }
    let out = Box::pin(http(&args, &dir, pg.as_ref())).await;
    if let Some(p) = &pg {
        pg_admin(
            p.url,
            &format!("DROP SCHEMA IF EXISTS {} CASCADE", p.schema),
        )
        .await?;
    }
    out
}

/// The `http` measurements, on SQLite files in `dir` or in PostgreSQL schema `pg`.
#[allow(
    clippy::print_stdout,
    clippy::cast_precision_loss,
    clippy::float_arithmetic
)]
async fn http(
    args: &Args,
    dir: &std::path::Path,
    pg: Option<&stipendex_app::demo::PgSchema<'_>>,
) -> Result<ExitCode, CliError> {
    let Fixture {
        stage,
        listener,
        base,
        wallet,
        shop,
        ..
    } = fixture_on(dir, pg, args.journal).await?;
    let usd = |s: &str| Money::parse(stipendex::Asset::usd(), s).map_err(|e| msg(e.to_string()));
    let receiver = shop
        .price(PricedCapability::fixed("GET", "/api/search", usd("0.01")?))
        .build()?;
    let binding = Binding::new(receiver.clone())?;
    let app = binding.apply(Router::new().route("/api/search", get(|| async { "results" })));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let http = stipendex::http::reqwest_client(Duration::from_secs(30))?;
    let url = format!("{base}/api/search?q=bench");
    println!(
        "stipendex bench: {}, HTTP on 127.0.0.1, {} clients, {} s per phase, the wallet's journal {}",
        stage.label,
        args.concurrency,
        args.seconds,
        match args.journal {
            JournalAt::Default => "in its store",
            JournalAt::Folder => "in a folder",
            JournalAt::Off => "off",
        }
    );

    // 1. Unpaid 402s.
    let h = http.clone();
    let u = url.clone();
    let (ok, bad, mut lat) = load(args.concurrency, args.seconds, move |_| {
        let (h, u) = (h.clone(), u.clone());
        async move { matches!(h.get(&u).send().await, Ok(r) if r.status().as_u16() == 402) }
    })
    .await;
    let (p50, p99) = percentiles(&mut lat);
    println!(
        "unpaid 402 (signed quote):  {:>8.0} /s   p50 {p50:>6.2} ms   p99 {p99:>6.2} ms   ({ok} ok, {bad} errors)",
        ok as f64 / args.seconds as f64
    );

    // 2. Paid requests, end to end.
    let client = Client::new(
        stipendex::http::reqwest_builder(Duration::from_secs(30)),
        wallet.clone(),
    )?;
    // Each paid call is a request of its own (`q=bench-<n>`): the wallet makes identical
    // requests wait for each other (one payment per request), which is not what this phase
    // measures.
    let u = url.clone();
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let files = crate::bench_common::StoreCounts::start(dir);
    let (ok, bad, mut lat) = load(args.concurrency, args.seconds, move |_| {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (c, u) = (client.clone(), format!("{u}-{n}"));
        async move {
            matches!(c.get(&u).await, Ok(r) if r.status.as_u16() == 200 && r.receipt.is_some())
        }
    })
    .await;
    let (p50, p99) = percentiles(&mut lat);
    println!(
        "paid (quote, pay, receipt): {:>8.0} /s   p50 {p50:>6.2} ms   p99 {p99:>6.2} ms   ({ok} ok, {bad} errors)",
        ok as f64 / args.seconds as f64
    );
    files.print(ok);

    // 3. The wallet's pay above the bare rail call, one at a time.
    let req = Request::new("GET", "/api/search");
    let (mut wallet_t, mut bare_t) = (Vec::new(), Vec::new());
    for _ in 0..args.payments {
        let Gate::Quote(q) = receiver.gate(&req).await? else {
            return Err(msg("the bench route is not priced"));
        };
        let t = Instant::now();
        wallet.pay(&q).await?;
        wallet_t.push(t.elapsed());
        let offer = stage
            .receiver
            .receiver
            .offer(&Charge::capture(usd("0.01")?, Duration::from_secs(120)))
            .await
            .map_err(|e| msg(format!("offer: {e}")))?;
        let t = Instant::now();
        stage
            .payer
            .payer
            .pay(&OpId::random(), &offer)
            .await
            .map_err(|e| msg(format!("pay: {e}")))?;
        bare_t.push(t.elapsed());
    }
    let (w50, w99) = percentiles(&mut wallet_t);
    let (b50, b99) = percentiles(&mut bare_t);
    println!(
        "wallet pay(quote):          p50 {w50:>6.2} ms   p99 {w99:>6.2} ms   ({} payments)",
        args.payments
    );
    println!("bare rail pay(offer):       p50 {b50:>6.2} ms   p99 {b99:>6.2} ms");
    // The medians' difference only: the tails of two separate samples do not subtract (their
    // difference was at times below zero).
    println!(
        "wallet overhead:            p50 {:>6.2} ms   (the medians' difference)",
        w50 - b50
    );
    Ok(ExitCode::SUCCESS)
}
