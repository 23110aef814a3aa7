//! The SQLite key store: one file shared by the processes of one host, every write through one
//! group commit.

use std::path::Path;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

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
    writes: tokio::sync::mpsc::Sender<Job>,
}

/// A write waiting for the group commit, and who waits for its answer.
#[derive(Debug)]
struct Job {
    op: super::Op,
    now: Option<i64>,
    done: tokio::sync::oneshot::Sender<RailResult<bool>>,
}

/// The most writes one commit takes.
const MAX_BATCH: usize = 512;
/// How many times the writer yields for more writes before committing a small batch: a
/// yield costs microseconds and lets callers just answered submit again and share the
/// commit (the ledger's group commit does the same).
const LINGER_YIELDS: usize = 4;

/// The group commit: one task takes every write of the store (of all its clones), runs as
/// many as are queued in one transaction (`BEGIN IMMEDIATE` … `COMMIT`: one fsync for all
/// of them), and answers each only after the commit — so every answer is durable, and a
/// single writer never waits on SQLite's write lock against itself. Each write is the same
/// statement it would be alone, in the order taken: the batch has the semantics of running
/// them one after another.
async fn writer(pool: SqlitePool, mut jobs: tokio::sync::mpsc::Receiver<Job>) {
    while let Some(first) = jobs.recv().await {
        let mut batch = vec![first];
        let mut yields = 0;
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) if yields < LINGER_YIELDS => {
                    yields += 1;
                    tokio::task::yield_now().await;
                }
                Err(_) => break,
            }
        }
        match commit(&pool, &batch).await {
            Ok(results) => {
                for (job, r) in batch.into_iter().zip(results) {
                    let _ = job.done.send(r.map_err(|e| storage(&e)));
                }
            }
            Err(e) => {
                let why = e.to_string();
                for job in batch {
                    let _ = job.done.send(Err(crate::RailError::Storage(why.clone())));
                }
            }
        }
    }
}

/// Runs `batch` in one transaction: each write's own outcome, or the transaction's failure
/// (nothing of it was committed). A lone write is one statement, which SQLite commits on
/// its own, as durably: one round trip to the connection's thread instead of three
/// (`BEGIN`, the write, `COMMIT`), which is what a payment's dependent writes mostly are.
async fn commit(
    pool: &SqlitePool,
    batch: &[Job],
) -> Result<Vec<Result<bool, sqlx::Error>>, sqlx::Error> {
    let mut conn = pool.acquire().await?;
    if let [job] = batch {
        return Ok(vec![run(&mut conn, &job.op, job.now).await]);
    }
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let mut out = Vec::with_capacity(batch.len());
    for job in batch {
        out.push(run(&mut conn, &job.op, job.now).await);
    }
    if let Err(e) = sqlx::query("COMMIT").execute(&mut *conn).await {
        let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        return Err(e);
    }
    Ok(out)
}

impl SqliteKeyStore {
    /// Runs one write through the group commit.
    async fn write(&self, op: super::Op) -> RailResult<bool> {
        let (done, answer) = tokio::sync::oneshot::channel();
        self.writes
            .send(Job {
                op,
                now: self.now(),
                done,
            })
            .await
            .map_err(|_| crate::RailError::Storage("the key store's writer stopped".into()))?;
        answer.await.map_err(|_| {
            crate::RailError::Storage(
                "the key store's writer stopped before the write was answered".into(),
            )
        })?
    }
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
        let (writes, jobs) = tokio::sync::mpsc::channel(MAX_BATCH * 4);
        tokio::spawn(writer(pool.clone(), jobs));
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
