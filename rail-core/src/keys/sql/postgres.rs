//! The PostgreSQL key store: one database shared by every process and host.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::postgres::PgPool;

use super::group::{Batches, Job, Writes, batch_now};
use super::{REMOVE, Statements, storage};
use crate::clock::{SharedClock, Timestamp};
use crate::error::{RailError, RailResult};
use crate::keys::{KeyRecord, KeyStore, Seen, Write, millis};

/// The pool every PostgreSQL store of the workspace opens (the key store, the
/// facilitator's tables): 16 connections, `search_path` set to `schema` when given, and the
/// workspace's connection settings ([`tuned`]).
///
/// # Errors
/// [`RailError::InvalidInput`] for a URL sqlx cannot read; [`RailError::Storage`] if the
/// database cannot be reached.
pub async fn postgres_pool(url: &str, schema: Option<&str>) -> RailResult<PgPool> {
    let opts: sqlx::postgres::PgConnectOptions = url.parse().map_err(|e: sqlx::Error| {
        RailError::InvalidInput(format!("the PostgreSQL URL is invalid: {e}"))
    })?;
    let mut opts = tuned(opts, url);
    if let Some(s) = schema {
        opts = opts.options([("search_path", s)]);
    }
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect_with(opts)
        .await
        .map_err(|e| storage(&e))
}

/// The workspace's PostgreSQL connection settings over what `url` says:
/// - statements planned once: `plan_cache_mode = force_generic_plan`, so a prepared statement
///   (every statement here is one, cached per connection) is not planned again for each set of
///   parameters — the key store's batch statement spent 6.5 % of the database's time in
///   planning (decision 0033);
/// - joins by nested loop only (`enable_hashjoin` and `enable_mergejoin` off): the only joins
///   the workspace makes are the key store's batch (each write's row looked up by its primary
///   key), and a plan made while the table was small (a new store: every connection plans once,
///   before any statistics) hashed the whole table for every batch as it grew — 14 million rows
///   read for 1,800 paid calls, two thirds of the database's time (decision 0047);
/// - [`plain_on_this_host`].
#[must_use]
pub fn tuned(
    opts: sqlx::postgres::PgConnectOptions,
    url: &str,
) -> sqlx::postgres::PgConnectOptions {
    // A setting the URL or PGOPTIONS names is theirs (ours would come after it and win).
    let pgoptions = std::env::var("PGOPTIONS").unwrap_or_default();
    let ours: Vec<(&str, &str)> = [
        ("plan_cache_mode", "force_generic_plan"),
        ("enable_hashjoin", "off"),
        ("enable_mergejoin", "off"),
    ]
    .into_iter()
    .filter(|(name, _)| !url.contains(name) && !pgoptions.contains(name))
    .collect();
    let opts = if ours.is_empty() {
        opts
    } else {
        opts.options(ours)
    };
    plain_on_this_host(opts, url)
}

/// No TLS to a server on this host (`localhost`, a loopback address or a Unix socket) when
/// nothing asked for a TLS mode (`sslmode=` or `ssl-mode=` in `url`, `PGSSLMODE`): TLS on
/// loopback protects nothing that leaves the host and cost 4–6 % of a paid call. A server on
/// another host, or a mode asked for, keeps what sqlx reads (`prefer` by default).
#[must_use]
pub fn plain_on_this_host(
    opts: sqlx::postgres::PgConnectOptions,
    url: &str,
) -> sqlx::postgres::PgConnectOptions {
    let asked = url.contains("sslmode=")
        || url.contains("ssl-mode=")
        || std::env::var_os("PGSSLMODE").is_some()
        || !matches!(opts.get_ssl_mode(), sqlx::postgres::PgSslMode::Prefer);
    if asked || !on_this_host(&opts) {
        return opts;
    }
    opts.ssl_mode(sqlx::postgres::PgSslMode::Disable)
}

/// Whether the options name a server on this host.
fn on_this_host(opts: &sqlx::postgres::PgConnectOptions) -> bool {
    if opts.get_socket().is_some() {
        return true;
    }
    let host = opts
        .get_host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.starts_with('/')
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// PostgreSQL's `now`: an injected clock's time when bound, else the database's clock
/// (`statement_timestamp()`, one value for the whole statement).
static STATEMENTS: LazyLock<Statements> = LazyLock::new(|| Statements::new(pg_now));

/// The time expression given the index of the injected-clock parameter.
fn pg_now(i: u8) -> String {
    format!(
        "COALESCE(${i}::bigint, floor(extract(epoch from statement_timestamp()) * 1000)::bigint)"
    )
}

/// A key store in PostgreSQL, shared by every process and host that uses the database.
/// Times are the **database's** clock, so hosts whose clocks disagree still agree on every
/// lease and retention; an injected clock overrides it ([`PgKeyStore::with_clock`]).
///
/// Writes go through a group commit (`keys::sql::group`): what is in flight is written by one
/// statement per batch, and each write is answered only after that statement has committed.
#[derive(Debug, Clone)]
pub struct PgKeyStore {
    pool: PgPool,
    clock: Option<SharedClock>,
    writes: Writes,
    /// Writes under way (alone or in the group commit), for [`PgKeyStore::write`]'s choice.
    busy: Arc<AtomicUsize>,
}

impl PgKeyStore {
    /// Connects to the database at `url` (a pool of up to 16 connections) and creates (or
    /// upgrades) the table if needed.
    ///
    /// # Errors
    /// [`crate::RailError::Storage`] if the database cannot be reached or the schema
    /// cannot be created.
    pub async fn connect(url: &str) -> RailResult<Self> {
        Self::new(postgres_pool(url, None).await?).await
    }

    /// Uses `pool`, creating (or upgrading) the table if needed.
    ///
    /// # Errors
    /// [`crate::RailError::Storage`] if the schema cannot be created.
    pub async fn new(pool: PgPool) -> RailResult<Self> {
        // Serialize concurrent schema creation across processes.
        let mut tx = pool.begin().await.map_err(|e| storage(&e))?;
        for sql in [
            "SELECT pg_advisory_xact_lock(7262897411)",
            "CREATE TABLE IF NOT EXISTS rail_keys (
                ns TEXT NOT NULL, key TEXT NOT NULL, token BIGINT NOT NULL,
                state TEXT NOT NULL, fingerprint BYTEA NOT NULL, value TEXT,
                expires_at BIGINT, lease_until BIGINT, PRIMARY KEY (ns, key))",
            "ALTER TABLE rail_keys ADD COLUMN IF NOT EXISTS lease_until BIGINT",
            "CREATE INDEX IF NOT EXISTS rail_keys_expiry ON rail_keys (expires_at)",
        ] {
            sqlx::query(sql)
                .execute(&mut *tx)
                .await
                .map_err(|e| storage(&e))?;
        }
        tx.commit().await.map_err(|e| storage(&e))?;
        // Four batches in flight, their keys disjoint (so they never wait on each other's row
        // locks, nor deadlock), each lingering a few yields for company: on the paid path at 64
        // clients this beat 1, 2, 8 and 16 in flight and beat no lingering (docs/decisions/0033-key-store-group-commit.md).
        let writes = Writes::start(pool.clone(), DEPTH, LINGER);
        Ok(PgKeyStore {
            pool,
            clock: None,
            writes,
            busy: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// Judges time by `clock` instead of the database's (tests that travel in time).
    #[must_use]
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = Some(clock);
        self
    }
}

impl PgKeyStore {
    /// Runs one write: alone on a connection of its own while fewer than [`ALONE_BELOW`]
    /// writes are under way (a light load gains nothing from a batch and pays its hand-off to
    /// the writer), else through the group commit. A write alone is one statement on one row,
    /// so it cannot deadlock with a batch, and writes that overlap in time have no order
    /// between them to keep.
    async fn write(&self, op: super::Op) -> RailResult<bool> {
        struct Busy<'a>(&'a AtomicUsize);
        impl Drop for Busy<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let under_way = self.busy.fetch_add(1, Ordering::Relaxed);
        let _busy = Busy(&self.busy);
        if under_way >= ALONE_BELOW {
            return self.writes.write(op, self.now()).await;
        }
        let job = [super::group::Job::alone(op, self.now())];
        self.pool
            .commit(&job)
            .await
            .map_err(|e| storage(&e))?
            .first()
            .copied()
            .ok_or_else(|| RailError::Storage("a write was not answered".into()))
    }
}

/// How many batches are in flight at once.
const DEPTH: usize = 4;
/// How many times the writer yields for more writes before sending a batch.
const LINGER: usize = 4;
/// Below this many writes under way, a write runs alone instead of through the group commit.
const ALONE_BELOW: usize = 4;
/// How many times a batch the server refused as a deadlock or serialization victim is tried
/// (another process's writes took the same rows in another order).
const ATTEMPTS: usize = 3;

/// Runs a batch (distinct keys): a lone write as its own statement, more as one statement
/// ([`BATCH`]), committed on its own — one statement is atomic, so a failed batch wrote
/// nothing and can be sent again when the server chose it as a deadlock victim.
impl Batches for PgPool {
    async fn commit(&self, batch: &[Job]) -> Result<Vec<bool>, sqlx::Error> {
        let pool = self;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let r = match pool.acquire().await {
                Ok(mut conn) => {
                    if let [job] = batch {
                        run(&mut conn, &job.op, job.now).await.map(|won| vec![won])
                    } else {
                        run_batch(&mut conn, batch).await
                    }
                }
                Err(e) => Err(e),
            };
            match r {
                Err(e) if attempt < ATTEMPTS && retryable(&e) => {
                    tracing::debug!(error = %e, writes = batch.len(), "key-store batch lost a lock race; trying it again");
                }
                r => return r,
            }
        }
    }
}

/// A deadlock or serialization failure: the server rolled the statement back, so it can be
/// sent again.
fn retryable(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(sqlx::error::DatabaseError::code)
        .is_some_and(|c| c == "40P01" || c == "40001")
}

/// Every kind of write of a batch in one statement: each kind's rows as parallel arrays
/// (`unnest`), each kind a data-modifying `WITH` clause, and the keys of the writes that took
/// effect returned. The clauses touch distinct keys (a batch holds one write per key), so
/// running them together on one snapshot is running them one after another. `{now}` is one
/// time for the whole batch. Each clause is the statement the write would run alone.
const BATCH: super::Template = super::Template(
    "WITH ins AS (
        INSERT INTO rail_keys (ns, key, token, state, fingerprint, value, expires_at, lease_until)
        SELECT t.ns, t.key, t.token, t.state, t.fp, t.value, {now} + t.retain, {now} + t.lease
        FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], $5::bytea[], $6::text[],
                    $7::int8[], $8::int8[])
          AS t(ns, key, token, state, fp, value, retain, lease)
        ON CONFLICT (ns, key) DO UPDATE SET token = EXCLUDED.token, state = EXCLUDED.state,
           fingerprint = EXCLUDED.fingerprint, value = EXCLUDED.value,
           expires_at = EXCLUDED.expires_at, lease_until = EXCLUDED.lease_until
        WHERE rail_keys.expires_at IS NOT NULL AND rail_keys.expires_at <= {now}
        RETURNING ns, key
     ), cas AS (
        UPDATE rail_keys k SET token = t.token, state = t.state, fingerprint = t.fp,
           value = t.value, expires_at = {now} + t.retain, lease_until = {now} + t.lease
        FROM unnest($9::text[], $10::text[], $11::int8[], $12::bool[], $13::int8[], $14::text[],
                    $15::bytea[], $16::text[], $17::int8[], $18::int8[])
          AS t(ns, key, expect, take_over, token, state, fp, value, retain, lease)
        WHERE k.ns = t.ns AND k.key = t.key AND k.token = t.expect
          AND (NOT t.take_over OR (k.lease_until IS NOT NULL AND k.lease_until <= {now}))
        RETURNING k.ns, k.key
     ), renew AS (
        UPDATE rail_keys k SET lease_until = {now} + t.lease
        FROM unnest($19::text[], $20::text[], $21::int8[], $22::int8[]) AS t(ns, key, expect, lease)
        WHERE k.ns = t.ns AND k.key = t.key AND k.token = t.expect AND k.lease_until IS NOT NULL
        RETURNING k.ns, k.key
     ), del AS (
        DELETE FROM rail_keys k
        USING unnest($23::text[], $24::text[], $25::int8[]) AS t(ns, key, expect)
        WHERE k.ns = t.ns AND k.key = t.key AND k.token = t.expect
        RETURNING k.ns, k.key
     )
     SELECT ns, key FROM ins UNION ALL SELECT ns, key FROM cas
     UNION ALL SELECT ns, key FROM renew UNION ALL SELECT ns, key FROM del",
    26,
);

static BATCH_SQL: LazyLock<String> = LazyLock::new(|| BATCH.0.replace("{now}", &pg_now(BATCH.1)));

/// The rows of one kind of write in a batch, as parallel arrays (one per column).
#[derive(Default)]
struct Rows {
    ns: Vec<String>,
    key: Vec<String>,
    /// The token the write expects to find (compare-and-set, renew, remove).
    expect: Vec<i64>,
    take_over: Vec<bool>,
    token: Vec<i64>,
    state: Vec<String>,
    fingerprint: Vec<Vec<u8>>,
    value: Vec<Option<String>>,
    retain: Vec<Option<i64>>,
    lease: Vec<Option<i64>>,
}

impl Rows {
    fn at(&mut self, ns: &str, key: &str) -> &mut Self {
        self.ns.push(ns.to_owned());
        self.key.push(key.to_owned());
        self
    }

    fn record(&mut self, rec: &Write) {
        self.token.push(rec.token);
        self.state.push(rec.state.clone());
        self.fingerprint.push(rec.fingerprint.clone());
        self.value.push(rec.value.clone());
        self.retain.push(rec.retain.map(millis));
        self.lease.push(rec.lease.map(millis));
    }
}

/// Runs a batch of writes (distinct keys) as one statement: whether each took effect, in the
/// batch's order.
async fn run_batch(conn: &mut sqlx::PgConnection, batch: &[Job]) -> Result<Vec<bool>, sqlx::Error> {
    use super::Kind;
    let (mut ins, mut cas, mut renew, mut del) = (
        Rows::default(),
        Rows::default(),
        Rows::default(),
        Rows::default(),
    );
    for job in batch {
        let (ns, key) = job.op.key();
        match &job.op.kind {
            Kind::Insert(rec) => ins.at(ns, key).record(rec),
            Kind::Cas(c) => {
                let r = cas.at(ns, key);
                r.expect.push(c.token);
                r.take_over.push(c.take_over);
                r.record(&c.rec);
            }
            Kind::Renew { token, lease } => {
                let r = renew.at(ns, key);
                r.expect.push(*token);
                r.lease.push(Some(millis(*lease)));
            }
            Kind::Remove { token } => del.at(ns, key).expect.push(*token),
        }
    }
    let now = batch_now(batch);
    let took: std::collections::HashSet<(String, String)> = sqlx::query_as(&BATCH_SQL)
        .bind(ins.ns)
        .bind(ins.key)
        .bind(ins.token)
        .bind(ins.state)
        .bind(ins.fingerprint)
        .bind(ins.value)
        .bind(ins.retain)
        .bind(ins.lease)
        .bind(cas.ns)
        .bind(cas.key)
        .bind(cas.expect)
        .bind(cas.take_over)
        .bind(cas.token)
        .bind(cas.state)
        .bind(cas.fingerprint)
        .bind(cas.value)
        .bind(cas.retain)
        .bind(cas.lease)
        .bind(renew.ns)
        .bind(renew.key)
        .bind(renew.expect)
        .bind(renew.lease)
        .bind(del.ns)
        .bind(del.key)
        .bind(del.expect)
        .bind(now)
        .fetch_all(&mut *conn)
        .await?
        .into_iter()
        .collect();
    Ok(batch.iter().map(|j| took.contains(&j.key)).collect())
}

sql_key_store!(PgKeyStore, sqlx::postgres::PgRow, sqlx::PgConnection);

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(url: &str) -> sqlx::postgres::PgConnectOptions {
        tuned(url.parse().unwrap_or_else(|e| panic!("{e}")), url)
    }

    #[test]
    fn no_tls_on_this_host_unless_asked_and_generic_plans_always() {
        use sqlx::postgres::PgSslMode;
        for (url, want) in [
            ("postgres://u@localhost/db", PgSslMode::Disable),
            ("postgres://u@127.0.0.1:5432/db", PgSslMode::Disable),
            ("postgres://u@[::1]/db", PgSslMode::Disable),
            (
                "postgres://u@localhost/db?sslmode=require",
                PgSslMode::Require,
            ),
            (
                "postgres://u@localhost/db?ssl-mode=require",
                PgSslMode::Require,
            ),
            ("postgres://u@localhost.evil.com/db", PgSslMode::Prefer),
            ("postgres://u@db.example.com/db", PgSslMode::Prefer),
        ] {
            assert_eq!(
                format!("{:?}", opts(url).get_ssl_mode()),
                format!("{want:?}"),
                "{url}"
            );
        }
        let o = opts("postgres://u@db.example.com/db");
        assert!(
            o.get_options()
                .is_some_and(|s| s.contains("plan_cache_mode=force_generic_plan")),
            "{:?}",
            o.get_options()
        );
    }
}
