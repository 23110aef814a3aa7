//! The SQLite key store: one file shared by the processes of one host, every write through one
//! group commit.

use std::path::Path;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use super::group::{Batches, Job, Writes, batch_now};
use super::{REMOVE, Statements, storage};
use crate::clock::{SharedClock, SystemClock, Timestamp};
use crate::error::RailResult;
use crate::keys::{KeyRecord, KeyStore, Seen, Write, millis};

/// The pool every SQLite store of the workspace opens (the key store, the facilitator's
/// tables): the file created if missing, WAL so readers never wait for the writer, a 30 s
/// busy timeout so several processes of one host share it, 4 connections.
///
/// # Errors
/// [`crate::RailError::Storage`] if the file cannot be opened.
pub async fn sqlite_pool(path: &Path) -> RailResult<SqlitePool> {
    let opts = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(30));
    SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(opts)
        .await
        .map_err(|e| storage(&e))
}

/// SQLite's `now` is always bound: the host's clock (or an injected one).
static STATEMENTS: LazyLock<Statements> = LazyLock::new(|| Statements::new(|i| format!("${i}")));

/// A key store in a SQLite database (shares the file with other processes on one host).
/// Times are the host's clock ([`crate::SystemClock`]) unless one is injected: every process
/// sharing the file shares that clock.
#[derive(Debug, Clone)]
pub struct SqliteKeyStore {
    pool: SqlitePool,
    clock: Option<SharedClock>,
    writes: Writes,
}

/// How many times the writer yields for more writes before sending a batch.
const LINGER: usize = 4;

impl SqliteKeyStore {
    /// Runs one write through the group commit.
    async fn write(&self, op: super::Op) -> RailResult<bool> {
        self.writes.write(op, self.now()).await
    }
}

/// Runs a batch (distinct keys). sqlx runs each SQLite connection on a thread of its own, and
/// every query is a round trip to it. A lone write is one statement, which SQLite commits on
/// its own, as durably. More are one query of its own: `BEGIN IMMEDIATE`, a statement per kind
/// of write over the batch's rows (JSON arrays, `json_each`), `COMMIT` ([`BATCH`]) — one round
/// trip and one fsync for the whole batch. A failure anywhere rolls all of it back.
impl Batches for SqlitePool {
    async fn commit(&self, batch: &[Job]) -> Result<Vec<bool>, sqlx::Error> {
        let pool = self;
        let mut conn = pool.acquire().await?;
        if let [job] = batch {
            return run(&mut conn, &job.op, job.now).await.map(|won| vec![won]);
        }
        let [ins, cas, renew, del] = rows(batch);
        let took = sqlx::query(BATCH)
            .bind(ins)
            .bind(cas)
            .bind(renew)
            .bind(del)
            .bind(batch_now(batch))
            .fetch_all(&mut *conn)
            .await;
        match took {
            Ok(rows) => {
                let took = rows
                    .iter()
                    .map(|r| Ok((r.try_get("ns")?, r.try_get("key")?)))
                    .collect::<Result<std::collections::HashSet<(String, String)>, sqlx::Error>>(
                    )?;
                Ok(batch.iter().map(|j| took.contains(&j.key)).collect())
            }
            Err(e) => {
                // The query stopped at the failing statement, inside the transaction (or at its
                // COMMIT): nothing of it may stay.
                if let Err(r) = sqlx::query("ROLLBACK").execute(&mut *conn).await {
                    tracing::debug!(error = %r, "rollback after a failed key-store batch");
                }
                Err(e)
            }
        }
    }
}

/// A batch as one query. Each statement is the one its writes would run alone (see the
/// shared statements), set-wise over its rows; they touch distinct keys, so their order does
/// not matter. `RETURNING` names the keys whose write took effect. `$5` is the batch's time.
const BATCH: &str = "BEGIN IMMEDIATE;
INSERT INTO rail_keys (ns, key, token, state, fingerprint, value, expires_at, lease_until)
  SELECT j.value ->> 'ns', j.value ->> 'key', j.value ->> 'token', j.value ->> 'state',
         unhex(j.value ->> 'fp'), j.value ->> 'value', $5 + (j.value ->> 'retain'),
         $5 + (j.value ->> 'lease')
  FROM json_each($1) AS j WHERE true
  ON CONFLICT (ns, key) DO UPDATE SET token = excluded.token, state = excluded.state,
     fingerprint = excluded.fingerprint, value = excluded.value,
     expires_at = excluded.expires_at, lease_until = excluded.lease_until
  WHERE rail_keys.expires_at IS NOT NULL AND rail_keys.expires_at <= $5
  RETURNING ns, key;
UPDATE rail_keys SET token = t.token, state = t.state, fingerprint = t.fp, value = t.value,
     expires_at = $5 + t.retain, lease_until = $5 + t.lease
  FROM (SELECT j.value ->> 'ns' AS ns, j.value ->> 'key' AS key, j.value ->> 'expect' AS expect,
               j.value ->> 'take_over' AS take_over, j.value ->> 'token' AS token,
               j.value ->> 'state' AS state, unhex(j.value ->> 'fp') AS fp,
               j.value ->> 'value' AS value, j.value ->> 'retain' AS retain,
               j.value ->> 'lease' AS lease
        FROM json_each($2) AS j) AS t
  WHERE rail_keys.ns = t.ns AND rail_keys.key = t.key AND rail_keys.token = t.expect
    AND (NOT t.take_over OR (rail_keys.lease_until IS NOT NULL AND rail_keys.lease_until <= $5))
  RETURNING ns, key;
UPDATE rail_keys SET lease_until = $5 + t.lease
  FROM (SELECT j.value ->> 'ns' AS ns, j.value ->> 'key' AS key, j.value ->> 'expect' AS expect,
               j.value ->> 'lease' AS lease
        FROM json_each($3) AS j) AS t
  WHERE rail_keys.ns = t.ns AND rail_keys.key = t.key AND rail_keys.token = t.expect
    AND rail_keys.lease_until IS NOT NULL
  RETURNING ns, key;
DELETE FROM rail_keys WHERE (ns, key, token) IN
  (SELECT j.value ->> 'ns', j.value ->> 'key', j.value ->> 'expect' FROM json_each($4) AS j)
  RETURNING ns, key;
COMMIT;";

/// The batch's rows as four JSON arrays: inserts, compare-and-sets, renewals, removals.
fn rows(batch: &[Job]) -> [String; 4] {
    use super::Kind;
    use serde_json::{Value, json};
    let rec = |r: &Write, mut row: serde_json::Map<String, Value>| {
        row.insert("token".into(), json!(r.token));
        row.insert("state".into(), json!(r.state));
        row.insert("fp".into(), json!(hex::encode(&r.fingerprint)));
        row.insert("value".into(), json!(r.value));
        row.insert("retain".into(), json!(r.retain.map(millis)));
        row.insert("lease".into(), json!(r.lease.map(millis)));
        Value::Object(row)
    };
    let mut kinds: [Vec<Value>; 4] = Default::default();
    for job in batch {
        let (ns, key) = job.op.key();
        let mut m = serde_json::Map::new();
        m.insert("ns".into(), json!(ns));
        m.insert("key".into(), json!(key));
        match &job.op.kind {
            Kind::Insert(r) => kinds[0].push(rec(r, m)),
            Kind::Cas(c) => {
                m.insert("expect".into(), json!(c.token));
                m.insert("take_over".into(), json!(i64::from(c.take_over)));
                kinds[1].push(rec(&c.rec, m));
            }
            Kind::Renew { token, lease } => {
                m.insert("expect".into(), json!(token));
                m.insert("lease".into(), json!(millis(*lease)));
                kinds[2].push(Value::Object(m));
            }
            Kind::Remove { token } => {
                m.insert("expect".into(), json!(token));
                kinds[3].push(Value::Object(m));
            }
        }
    }
    kinds.map(|k| Value::Array(k).to_string())
}

impl SqliteKeyStore {
    /// Opens (or creates) the key store file at `path`: WAL mode, a 30 s busy timeout so
    /// several processes can share it.
    ///
    /// # Errors
    /// [`crate::RailError::Storage`] if the file cannot be opened or the schema created.
    pub async fn open(path: &Path) -> RailResult<Self> {
        Self::new(sqlite_pool(path).await?).await
    }

    /// Uses `pool`, creating (or upgrading) the table if needed.
    ///
    /// # Errors
    /// [`crate::RailError::Storage`] if the schema cannot be created.
    pub async fn new(pool: SqlitePool) -> RailResult<Self> {
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS rail_keys (
                ns TEXT NOT NULL, key TEXT NOT NULL, token INTEGER NOT NULL,
                state TEXT NOT NULL, fingerprint BLOB NOT NULL, value TEXT,
                expires_at INTEGER, lease_until INTEGER, PRIMARY KEY (ns, key)) WITHOUT ROWID",
        )
        .execute(&pool)
        .await
        .map_err(|e| storage(&e))?;
        let has_lease: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pragma_table_info('rail_keys') WHERE name = 'lease_until'",
        )
        .fetch_one(&pool)
        .await
        .map_err(|e| storage(&e))?;
        if has_lease == 0 {
            sqlx::query("ALTER TABLE rail_keys ADD COLUMN lease_until INTEGER")
                .execute(&pool)
                .await
                .map_err(|e| storage(&e))?;
        }
        sqlx::query("CREATE INDEX IF NOT EXISTS rail_keys_expiry ON rail_keys (expires_at)")
            .execute(&pool)
            .await
            .map_err(|e| storage(&e))?;
        // One batch at a time: SQLite has one writer per file.
        let writes = Writes::start(pool.clone(), 1, LINGER);
        Ok(SqliteKeyStore {
            pool,
            clock: Some(Arc::new(SystemClock)),
            writes,
        })
    }

    /// Judges time by `clock` instead of the host's (tests).
    #[must_use]
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = Some(clock);
        self
    }
}

sql_key_store!(
    SqliteKeyStore,
    sqlx::sqlite::SqliteRow,
    sqlx::SqliteConnection
);
