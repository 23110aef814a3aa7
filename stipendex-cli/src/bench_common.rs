//! What every `stipendex bench` measurement shares: the [`Fixture`] it runs on and the load
//! loop and percentiles it measures with ([`crate::bench`], [`crate::bench_mcp`],
//! [`crate::bench_gateway`], [`crate::bench_tab`]).

// Timings and rates, never money: floats are fine here.
#![allow(clippy::float_arithmetic, clippy::cast_precision_loss)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rail_core::SystemClock;
use rail_core::keys::sql::SqliteKeyStore;
use stipendex::envelope::{Allow, Limits, Mandate, Party, SecretKey, Signed};
use stipendex::receiver::Receiver;
use stipendex::wallet::Wallet;

use crate::{CliError, msg};

/// p50 and p99 of `v` (sorted in place), in milliseconds.
pub(crate) fn percentiles(v: &mut [Duration]) -> (f64, f64) {
    v.sort_unstable();
    let at = |q: usize| {
        let i = (v.len().saturating_sub(1) * q) / 100;
        v.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    (at(50), at(99))
}

/// `concurrency` agents, agent `i` calling `one(i)` in a loop for `seconds`: (successes,
/// failures, the successes' latencies).
pub(crate) async fn load<F, Fut>(
    concurrency: usize,
    seconds: u64,
    one: F,
) -> (usize, usize, Vec<Duration>)
where
    F: Fn(usize) -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for agent in 0..concurrency {
        let one = one.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut bad, mut lat) = (0usize, 0usize, Vec::new());
            while Instant::now() < until {
                let t = Instant::now();
                if one(agent).await {
                    ok += 1;
                    lat.push(t.elapsed());
                } else {
                    bad += 1;
                }
            }
            (ok, bad, lat)
        }));
    }
    let (mut ok, mut bad, mut lat) = (0, 0, Vec::new());
    for t in tasks {
        if let Ok((o, b, l)) = t.await {
            ok += o;
            bad += b;
            lat.extend(l);
        }
    }
    (ok, bad, lat)
}

/// What every bench runs on: the embedded ledger, a listener on 127.0.0.1 and its origin, a
/// wallet whose mandate lets it pay `bench-shop` at that origin (0.01 a call, no confirmation),
/// and `bench-shop`'s receiver, its origin and rail set, to be priced.
pub(crate) struct Fixture {
    pub(crate) stage: stipendex_app::demo::Stage,
    pub(crate) listener: tokio::net::TcpListener,
    pub(crate) base: String,
    pub(crate) wallet: Wallet,
    pub(crate) shop: stipendex::receiver::Builder,
    /// `bench-shop`'s key (for a second receiver of the same shop).
    pub(crate) shop_key: SecretKey,
}

/// The [`Fixture`], its databases in `dir`, the wallet's journal in its store (as `stipendex
/// init` configures it; the MCP, gateway and tabs benches before issue 50 ran without one).
pub(crate) async fn fixture(dir: &std::path::Path) -> Result<Fixture, CliError> {
    fixture_on(dir, None, JournalAt::Default).await
}

/// Where the bench's wallet keeps its journal (`stipendex bench --journal`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum JournalAt {
    /// As `stipendex init` configures it: in the wallet's store (its SQLite file, or its
    /// PostgreSQL database).
    #[default]
    Default,
    /// In a folder of chain files (`journal = "chains"`), whatever the store.
    Folder,
    /// None: pending payments in memory only (`journal = false`).
    Off,
}

/// The [`Fixture`], its databases in `dir` or in PostgreSQL schema `pg`, the wallet's journal
/// where `journal` says.
pub(crate) async fn fixture_on(
    dir: &std::path::Path,
    pg: Option<&stipendex_app::demo::PgSchema<'_>>,
    journal_at: JournalAt,
) -> Result<Fixture, CliError> {
    let stage = stipendex_app::demo::ledger_stage(dir, 100_000_000, pg).await?;
    let (principal, wallet_key, shop_key) = (
        SecretKey::generate(),
        SecretKey::generate(),
        SecretKey::generate(),
    );
    let now = u64::try_from(rail_core::Clock::now(&SystemClock).unix_seconds()).unwrap_or(0);
    let mut m = Mandate::draft(
        Party {
            id: "bench".into(),
            key: principal.public(),
        },
        wallet_key.public(),
        now - 60,
        86_400,
    );
    m.limits.push(Limits {
        asset: stipendex::Asset::usd(),
        per_call: Some("1.00".parse().map_err(|_| msg("limit"))?),
        per_period: None,
        total: Some("900000.00".parse().map_err(|_| msg("limit"))?),
        per_receiver: None,
        confirm_above: None,
        // Tabs are used only where a receiver offers them (`stipendex bench tabs`).
        tab_cap: Some("1000.00".parse().map_err(|_| msg("limit"))?),
        open_tabs: Some(256),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| msg(e.to_string()))?;
    let base = format!(
        "http://{}",
        listener.local_addr().map_err(|e| msg(e.to_string()))?
    );
    m.allow.push(Allow::Receiver {
        id: "bench-shop".into(),
        key: shop_key.public(),
        origins: vec![base.clone()],
    });
    let mandate = Signed::sign(m, &principal)?;
    let kind = stage.payer.payer.id().as_str().to_owned();
    // The wallet as `stipendex fetch` runs it from `stipendex init`'s configuration: its
    // journal on, in its store (`journal = "store"`): its SQLite file, or its PostgreSQL
    // database.
    let (store, journal): (
        Arc<dyn rail_core::KeyStore>,
        Arc<dyn stipendex::wallet::Journal>,
    ) = match pg {
        None => {
            let file = dir.join("wallet.db");
            (
                Arc::new(
                    SqliteKeyStore::open(&file)
                        .await
                        .map_err(|e| msg(format!("wallet store: {e}")))?,
                ),
                Arc::new(stipendex::wallet::SqliteJournal::open(&file).await?),
            )
        }
        Some(p) => {
            let pool = rail_core::keys::sql::postgres_pool(p.url, Some(p.schema))
                .await
                .map_err(|e| msg(format!("wallet store: {e}")))?;
            (
                Arc::new(
                    rail_core::keys::sql::PgKeyStore::new(pool.clone())
                        .await
                        .map_err(|e| msg(format!("wallet store: {e}")))?,
                ),
                Arc::new(stipendex::wallet::PgJournal::new(pool).await?),
            )
        }
    };
    let journal: Arc<dyn stipendex::wallet::Journal> = match journal_at {
        JournalAt::Default => journal,
        JournalAt::Folder => Arc::new(stipendex::wallet::DirJournal::new(dir.join("chains"))?),
        JournalAt::Off => Arc::new(stipendex::wallet::NoJournal::default()),
    };
    let wallet = Wallet::builder(wallet_key, mandate)
        .rail(&kind, stage.payer.clone())
        .store(store)
        .journal(journal)
        .build()?;
    // The receiver as `stipendex gateway` and `serve-mcp` deploy it: its records in the
    // registry's store, beside its rails' (one store per process on the receiver's side).
    let mut shop = Receiver::builder("bench-shop", shop_key.clone())
        .origin(&base)
        .rail(&kind, stage.receiver.clone());
    if let Some(records) = &stage.store {
        shop = shop.store(records.clone());
    }
    Ok(Fixture {
        stage,
        listener,
        base,
        wallet,
        shop,
        shop_key,
    })
}

/// The SQLite files of a bench's folder that this process writes through
/// [`rail_core::sqlite::SqliteDb`], and their writers' counts at the start of a phase.
pub(crate) struct StoreCounts(
    Vec<(
        String,
        rail_core::sqlite::SqliteDb,
        rail_core::sqlite::Stats,
    )>,
);

impl StoreCounts {
    /// The counts now, for every `*.db` file of `dir` this process has a writer on.
    pub(crate) fn start(dir: &std::path::Path) -> Self {
        let mut v = Vec::new();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let path = e.path();
                if path.extension().is_some_and(|x| x == "db")
                    && let Some(db) = rail_core::sqlite::SqliteDb::open_here(&path)
                {
                    let name = path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    let at = db.stats();
                    v.push((name, db, at));
                }
            }
        }
        v.sort_by(|a, b| a.0.cmp(&b.0));
        StoreCounts(v)
    }

    /// Prints each file's writes, commits and `fsync`s per call over `calls` calls since
    /// [`StoreCounts::start`].
    pub(crate) fn print(&self, calls: usize) {
        if self.0.is_empty() || calls == 0 {
            return;
        }
        let per = |n: u64| n as f64 / calls as f64;
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(name, db, at)| {
                let now = db.stats();
                format!(
                    "{name} {:.2} writes, {:.2} commits, {:.2} fsyncs",
                    per(now.writes - at.writes),
                    per(now.commits - at.commits),
                    per(now.syncs - at.syncs)
                )
            })
            .collect();
        #[allow(clippy::print_stdout)]
        {
            println!("  per paid call:            {}", parts.join("; "));
        }
    }
}
