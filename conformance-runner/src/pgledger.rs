//! pgledger (github.com/pgr0ss/pgledger, a ledger in PostgreSQL functions) under the same load
//! as `conformance bench ledger`, for a side-by-side figure in one run.
//!
//! pgledger's code is not part of this repository: the bench runs the SQL of a checkout it is
//! given (`--versus-pgledger DIR`; fetch commit `c18c7d2`), in a fresh schema of the local
//! PostgreSQL, loading what its `justfile`'s `dbload` loads (the vendored ULID helpers, then
//! `pgledger.sql`). The load is its own `go/performance_check.go`'s: each client keeps one
//! `select id from pgledger_create_transfer($1, $2, $3)` in flight between two distinct
//! random accounts (pgledger's accounts allow negative balances by default; ours are funded
//! first instead), one transfer per transaction.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Executor;
use sqlx::postgres::PgPoolOptions;

use crate::bench_common::{BenchConfig, Phase, gather, pick};

/// The files `dbload` loads, in its order.
const FILES: [&str; 3] = [
    "vendor/scoville-pgsql-ulid/ulid-to-uuid.sql",
    "vendor/scoville-pgsql-ulid/uuid-to-ulid.sql",
    "pgledger.sql",
];

/// pgledger's SQL from the checkout `dir`, in the order `dbload` loads it.
///
/// # Errors
/// A missing file (`dir` is not a pgledger checkout).
pub fn read_sql(dir: &Path) -> Result<Vec<String>, String> {
    FILES
        .iter()
        .map(|f| {
            let p = dir.join(f);
            std::fs::read_to_string(&p).map_err(|e| {
                format!(
                    "cannot read {} ({e}): give --versus-pgledger a pgledger checkout",
                    p.display()
                )
            })
        })
        .collect()
}

/// Loads pgledger's `sql` ([`read_sql`]) into a fresh schema and runs the transfer phase of
/// `cfg` against it.
///
/// # Errors
/// An unreachable PostgreSQL, SQL that does not load.
pub async fn transfers(sql: &[String], cfg: &BenchConfig) -> Result<Phase, String> {
    let schema = format!("pgledger_{:016x}", rand::random::<u64>());
    let url = test_kit::localnet::postgres_url();
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .map_err(|e| format!("PostgreSQL at {url}: {e}"))?;
    admin
        .execute(format!("CREATE SCHEMA {schema}").as_str())
        .await
        .map_err(|e| e.to_string())?;
    // The schema goes whatever happens in it.
    let out = load_and_run(&url, &schema, sql, cfg).await;
    let _ = admin
        .execute(format!("DROP SCHEMA {schema} CASCADE").as_str())
        .await;
    out
}

/// Loads `sql` into `schema` and runs the transfer load there.
async fn load_and_run(
    url: &str,
    schema: &str,
    sql: &[String],
    cfg: &BenchConfig,
) -> Result<Phase, String> {
    let path = format!("SET search_path TO {schema}, public");
    // The same transport as the ledger's own connections (no TLS to this host), so the two
    // are compared on the database's work, not on encryption one of them skips.
    let opts: sqlx::postgres::PgConnectOptions =
        url.parse().map_err(|e: sqlx::Error| e.to_string())?;
    let opts = rail_core::keys::sql::plain_on_this_host(opts, url);
    let pool = PgPoolOptions::new()
        // One connection per client, as pgxpool gives the Go check (its default is larger).
        .max_connections(u32::try_from(cfg.clients).unwrap_or(u32::MAX).max(1))
        .after_connect(move |conn, _| {
            let path = path.clone();
            Box::pin(async move {
                conn.execute(path.as_str()).await?;
                Ok(())
            })
        })
        .connect_with(opts)
        .await
        .map_err(|e| e.to_string())?;
    {
        let mut conn = pool.acquire().await.map_err(|e| e.to_string())?;
        for s in sql {
            sqlx::raw_sql(s)
                .execute(&mut *conn)
                .await
                .map_err(|e| format!("loading pgledger: {e}"))?;
        }
    }
    let mut accounts = Vec::with_capacity(cfg.accounts);
    for _ in 0..cfg.accounts {
        let id: String =
            sqlx::query_scalar("select id from pgledger_create_account('acct', 'USD')")
                .fetch_one(&pool)
                .await
                .map_err(|e| e.to_string())?;
        accounts.push(id);
    }
    let accounts = Arc::new(accounts);
    let deadline = Instant::now() + Duration::from_secs(cfg.seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..cfg.clients {
        let (pool, accounts) = (pool.clone(), accounts.clone());
        tasks.push(tokio::spawn(async move {
            let (mut ops, mut refused, mut lat) = (0u64, 0u64, Vec::new());
            // The same sequence of pairs and amounts as the ledger's clients.
            let mut n = c.wrapping_mul(7919);
            while Instant::now() < deadline {
                let (d, k, amount) = pick(&mut n, accounts.len());
                let (Some(from), Some(to)) = (accounts.get(d), accounts.get(k)) else {
                    break;
                };
                let amount = i64::try_from(amount).unwrap_or(i64::MAX);
                let t0 = Instant::now();
                let r: Result<String, _> = sqlx::query_scalar(
                    "select id from pgledger_create_transfer($1, $2, $3::numeric)",
                )
                .bind(from)
                .bind(to)
                .bind(amount)
                .fetch_one(&pool)
                .await;
                match r {
                    Ok(_) => ops += 1,
                    Err(_) => refused += 1,
                }
                lat.push(u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            (ops, refused, lat)
        }));
    }
    let p = gather(tasks, start).await;
    pool.close().await;
    Ok(p)
}
