//! The SQLite key store: one file shared by the processes of one host. Writes go through the
//! file's writer thread ([`SqliteDb`]): whatever is queued commits as one transaction, each
//! write a statement run in place (no JSON batch, no hand-off per statement); reads run on the
//! caller's thread.

use std::path::Path;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, params};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

use super::{Kind, Op, REMOVE, Statements};
use crate::clock::{SharedClock, SystemClock, Timestamp};
use crate::error::{RailError, RailResult};
use crate::keys::{KeyRecord, KeyStore, Seen, Tally, Write, millis};
use crate::sqlite::{Commit, SqliteDb};

/// The sqlx pool the facilitator's own tables use on a SQLite file: the file created if
/// missing, WAL so readers never wait for the writer, a 30 s busy timeout so several
/// processes (and the file's [`SqliteDb`] writer) share it, 4 connections.
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
        .map_err(|e| RailError::Storage(e.to_string()))
}

/// SQLite's statements: `{now}` is always bound (the host's clock or an injected one), and
/// parameters are numbered `?N` (SQLite numbers `$N` by first appearance, not by `N`).
static STATEMENTS: LazyLock<Statements> = LazyLock::new(|| {
    let mut s = Statements::new(|i| format!("?{i}"));
    for sql in [
        &mut s.insert_if_absent,
        &mut s.replace,
        &mut s.take_over,
        &mut s.renew,
        &mut s.get,
        &mut s.purge,
        &mut s.count,
        &mut s.now,
    ] {
        *sql = sql.replace('$', "?");
    }
    s
});
static REMOVE_Q: LazyLock<String> = LazyLock::new(|| REMOVE.replace('$', "?"));

/// The table: rows in a rowid table, appended in the order they are first written, so that a
/// call's records and its later updates share the table's last pages instead of each dirtying a
/// random leaf; `(ns, key)` unique through an index ordered by key first, so that the records
/// one payment keeps under one key in several namespaces (a receiver's claim, verdict,
/// delivery mark and kept answer of a Quote; a wallet's limits marker and paid record of an
/// operation) share one leaf of it; the expiry index `purge_expired` walks. Rows of a few KiB
/// stay inline (a `WITHOUT ROWID` table spills any row above about 1 KiB into an overflow page
/// of its own). Measured in docs/performance.md ("Pages per paid call").
const SCHEMA: [&str; 3] = [
    "CREATE TABLE IF NOT EXISTS rail_keys (
    id INTEGER PRIMARY KEY, ns TEXT NOT NULL, key TEXT NOT NULL, token INTEGER NOT NULL,
    state TEXT NOT NULL, fingerprint BLOB NOT NULL, value TEXT,
    expires_at INTEGER, lease_until INTEGER)",
    "CREATE UNIQUE INDEX IF NOT EXISTS rail_keys_key ON rail_keys (key, ns)",
    "CREATE INDEX IF NOT EXISTS rail_keys_expiry ON rail_keys (expires_at)",
];

/// The table as releases before the rowid layout wrote it (`WITHOUT ROWID`, keyed by
/// `(ns, key)`) is renamed, keeping its expiry index, which orders the copy into [`SCHEMA`]'s
/// table (no sort of whole rows); the index is made again on the new table once the old one
/// is dropped.
const RENAME: &str = "ALTER TABLE rail_keys RENAME TO rail_keys_without_rowid";
const COPY: &str = "INSERT INTO rail_keys
    (ns, key, token, state, fingerprint, value, expires_at, lease_until)
    SELECT ns, key, token, state, fingerprint, value, expires_at, lease_until
    FROM rail_keys_without_rowid ORDER BY expires_at";

/// Creates the table, or brings one an earlier release wrote to [`SCHEMA`]'s layout: the
/// `lease_until` column added, a `WITHOUT ROWID` table copied row for row. Runs in the writer's
/// transaction: another process opening the file at once waits, then finds it done.
fn create_or_migrate(c: &Connection) -> rusqlite::Result<()> {
    let without_rowid: Option<bool> = c
        .query_row(
            "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = 'rail_keys'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if without_rowid == Some(true) {
        crate::sqlite::add_column_if_missing(c, "rail_keys", "lease_until", "INTEGER")?;
        c.execute(RENAME, [])?;
        let [table, key_index, expiry_index] = SCHEMA;
        c.execute(table, [])?;
        c.execute(key_index, [])?;
        let copied = c.execute(COPY, [])?;
        c.execute("DROP TABLE rail_keys_without_rowid", [])?;
        c.execute(expiry_index, [])?;
        tracing::info!(
            records = copied,
            "SQLite key store: the table was copied into the rowid layout"
        );
        return Ok(());
    }
    for sql in SCHEMA {
        c.execute(sql, [])?;
    }
    Ok(())
}

/// A key store in a SQLite database (shares the file with other processes on one host).
/// Times are the host's clock ([`crate::SystemClock`]) unless one is injected: every process
/// sharing the file shares that clock.
///
/// Its writes are durable when answered; [`KeyStore::deferred`] gives a handle whose writes are
/// answered once committed ([`SqliteDb::write_deferred`]) and made durable by its
/// [`KeyStore::sync`] or the file's next durable write.
#[derive(Debug, Clone)]
pub struct SqliteKeyStore {
    db: SqliteDb,
    clock: SharedClock,
    /// A deferred handle's last commit (`None`: a durable handle).
    deferred: Option<Arc<Mutex<Commit>>>,
}

impl SqliteKeyStore {
    /// Opens (or creates) the key store file at `path`: WAL mode, a 30 s busy timeout so
    /// several processes can share it.
    ///
    /// # Errors
    /// [`crate::RailError::Storage`] if the file cannot be opened or the schema created.
    pub async fn open(path: &Path) -> RailResult<Self> {
        Self::on(SqliteDb::open(path)?).await
    }

    /// The key store in the file `pool` opened (its own writer and readers on that file; the
    /// pool stays the caller's for its other tables).
    ///
    /// # Errors
    /// [`crate::RailError::Storage`] if the file cannot be opened or the schema created.
    pub async fn new(pool: SqlitePool) -> RailResult<Self> {
        let path = pool.connect_options().get_filename().to_owned();
        let name = path.to_string_lossy();
        if name.starts_with("file:sqlx-in-memory") || name == ":memory:" {
            return Err(RailError::InvalidInput(
                "an in-memory SQLite pool has no file for the key store: open a file (sqlite://PATH) or use the memory store".into(),
            ));
        }
        Self::open(&path).await
    }

    /// The key store in `db` (a process's one store: its other tables share the commits),
    /// creating (or upgrading) the table if needed.
    ///
    /// # Errors
    /// [`crate::RailError::Storage`] if the schema cannot be created.
    pub async fn on(db: SqliteDb) -> RailResult<Self> {
        db.write(create_or_migrate).await?;
        Ok(SqliteKeyStore {
            db,
            clock: Arc::new(SystemClock),
            deferred: None,
        })
    }

    /// Judges time by `clock` instead of the host's (tests).
    #[must_use]
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// The database the store lives in.
    #[must_use]
    pub fn db(&self) -> &SqliteDb {
        &self.db
    }

    fn now(&self) -> i64 {
        self.clock.now().0
    }

    /// Runs one write in the writer's next batch: whether it took effect.
    async fn write(&self, op: Op) -> RailResult<bool> {
        let now = self.now();
        self.apply(true, move |c| run(c, &op, now)).await
    }

    /// Runs `f` in the writer's next batch: answered once durable, or for a deferred handle
    /// once committed (its commit remembered for [`KeyStore::sync`]). `one_statement`: `f` is
    /// one statement changing the file, whose error can only be that statement's
    /// ([`SqliteDb::write_with`]: no savepoint).
    async fn apply<T, F>(&self, one_statement: bool, f: F) -> RailResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        let (v, at) = self
            .db
            .write_with(self.deferred.is_none(), one_statement, f)
            .await?;
        if let Some(last) = &self.deferred {
            let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
            *last = (*last).max(at);
        }
        Ok(v)
    }
}

/// Runs `op` at `now`: whether it took effect (the insert won, the compare-and-set matched).
fn run(c: &Connection, op: &Op, now: i64) -> rusqlite::Result<bool> {
    let Op { ns, key, kind } = op;
    let s = &*STATEMENTS;
    let changed = match kind {
        Kind::Insert(r) => {
            let mut st = c.prepare_cached(&s.insert_if_absent)?;
            let mut rows = st.query(params![
                ns,
                key,
                r.token,
                r.state,
                r.fingerprint,
                r.value,
                r.retain.map(millis),
                r.lease.map(millis),
                now
            ])?;
            return Ok(rows.next()?.is_some());
        }
        Kind::Cas(cas) => {
            let r = &cas.rec;
            let sql = if cas.take_over {
                &s.take_over
            } else {
                &s.replace
            };
            c.prepare_cached(sql)?.execute(params![
                r.token,
                r.state,
                r.fingerprint,
                r.value,
                r.retain.map(millis),
                r.lease.map(millis),
                ns,
                key,
                cas.token,
                now
            ])?
        }
        Kind::Renew { token, lease } => {
            c.prepare_cached(&s.renew)?
                .execute(params![millis(*lease), ns, key, token, now])?
        }
        Kind::Remove { token } => c
            .prepare_cached(&REMOVE_Q)?
            .execute(params![ns, key, token])?,
    };
    Ok(changed == 1)
}

fn record(row: &Row<'_>) -> rusqlite::Result<Seen> {
    Ok(Seen {
        record: KeyRecord {
            token: row.get("token")?,
            state: row.get("state")?,
            fingerprint: row.get("fingerprint")?,
            value: row.get("value")?,
            expires_at: row.get::<_, Option<i64>>("expires_at")?.map(Timestamp),
            lease_until: row.get::<_, Option<i64>>("lease_until")?.map(Timestamp),
        },
        now: Timestamp(row.get("now")?),
    })
}

#[async_trait]
impl KeyStore for SqliteKeyStore {
    async fn insert_if_absent(&self, ns: &str, key: &str, rec: &Write) -> RailResult<Option<Seen>> {
        for _ in 0..3 {
            if self
                .write(Op::new(ns, key, Kind::Insert(rec.clone())))
                .await?
            {
                return Ok(None);
            }
            if let Some(existing) = self.get(ns, key).await? {
                return Ok(Some(existing));
            }
            // The blocking record vanished between the two statements: try again.
        }
        Err(RailError::Storage(format!(
            "key {ns}/{key} kept changing under contention"
        )))
    }

    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.write(Op::cas(false, ns, key, token, rec)).await
    }

    async fn take_over(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.write(Op::cas(true, ns, key, token, rec)).await
    }

    async fn renew(&self, ns: &str, key: &str, token: i64, lease: Duration) -> RailResult<bool> {
        self.write(Op::new(ns, key, Kind::Renew { token, lease }))
            .await
    }

    async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
        self.write(Op::new(ns, key, Kind::Remove { token })).await
    }

    async fn get(&self, ns: &str, key: &str) -> RailResult<Option<Seen>> {
        let now = self.now();
        self.db.read(|c| {
            c.prepare_cached(&STATEMENTS.get)?
                .query_row(params![ns, key, now], record)
                .optional()
        })
    }

    async fn now(&self) -> RailResult<Timestamp> {
        Ok(Timestamp(self.now()))
    }

    async fn purge_expired(&self) -> RailResult<u64> {
        let now = self.now();
        let n = self
            .apply(true, move |c| {
                c.prepare_cached(&STATEMENTS.purge)?.execute(params![now])
            })
            .await?;
        Ok(u64::try_from(n).unwrap_or(u64::MAX))
    }

    fn deferred(&self) -> Option<Arc<dyn KeyStore>> {
        Some(Arc::new(SqliteKeyStore {
            db: self.db.clone(),
            clock: self.clock.clone(),
            deferred: Some(Arc::new(Mutex::new(Commit::default()))),
        }))
    }

    fn file(&self) -> Option<&Path> {
        Some(self.db.path())
    }

    async fn sync(&self) -> RailResult<()> {
        let Some(last) = &self.deferred else {
            return Ok(());
        };
        let at = *last.lock().unwrap_or_else(PoisonError::into_inner);
        self.db.sync_to(at).await
    }

    async fn count(&self, ns: &str, key: &str, window: Duration) -> RailResult<Tally> {
        let now = self.now();
        let (n, k) = (ns.to_owned(), key.to_owned());
        let row: Option<(String, i64, i64)> = self
            .apply(false, move |c| {
                c.prepare_cached(&STATEMENTS.count)?
                    .query_row(
                        params![
                            n,
                            k,
                            crate::keys::COUNTED,
                            Vec::<u8>::new(),
                            millis(window),
                            now
                        ],
                        |r| Ok((r.get("value")?, r.get("expires_at")?, r.get("now")?)),
                    )
                    .optional()
            })
            .await?;
        let Some((value, end, now)) = row else {
            return Err(RailError::Storage(format!(
                "key {ns}/{key} holds a record that is not a counter"
            )));
        };
        let count = value
            .parse::<u64>()
            .map_err(|_| RailError::Storage(format!("the counter {ns}/{key} holds no count")))?;
        Ok(Tally {
            count,
            left: Duration::from_millis(u64::try_from(end.saturating_sub(now)).unwrap_or(0))
                .min(window),
        })
    }
}
