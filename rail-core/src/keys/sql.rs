//! [`KeyStore`](super::KeyStore) on SQL databases: SQLite (one host, several processes) and
//! PostgreSQL (several hosts). Both use one table:
//!
//! ```sql
//! CREATE TABLE rail_keys (ns TEXT, key TEXT, token BIGINT, state TEXT, fingerprint BLOB/BYTEA,
//!                         value TEXT, expires_at BIGINT, lease_until BIGINT, PRIMARY KEY (ns, key));
//! ```
//!
//! `insert_if_absent` is one statement, `INSERT … ON CONFLICT (ns, key) DO UPDATE … WHERE
//! rail_keys.expires_at <= now RETURNING token`: the primary key makes two concurrent inserters
//! of one key serialize on the row, and only one of them sees its own token returned. A record
//! without retention (`expires_at IS NULL`: in flight) is never overwritten, whatever its lease.
//!
//! **Clocks.** Every statement computes times from one `now`: PostgreSQL's
//! `statement_timestamp()` by default (one clock for every host sharing the database), the
//! host's clock for SQLite (one host), or an injected [`Clock`](crate::Clock) for either.
//! The statements are the same text for both databases apart from that `now`, so one
//! implementation, stamped out per database by `sql_key_store!`, serves both.

use crate::error::RailError;

fn storage(e: &sqlx::Error) -> RailError {
    RailError::Storage(e.to_string())
}

/// A statement with its time placeholder `{now}` and the index of the parameter that carries an
/// injected clock's time.
struct Template(&'static str, u8);

const INSERT_IF_ABSENT: Template = Template(
    "INSERT INTO rail_keys (ns, key, token, state, fingerprint, value, expires_at, lease_until)
     VALUES ($1, $2, $3, $4, $5, $6, {now} + $7, {now} + $8)
     ON CONFLICT (ns, key) DO UPDATE SET token = EXCLUDED.token, state = EXCLUDED.state,
        fingerprint = EXCLUDED.fingerprint, value = EXCLUDED.value,
        expires_at = EXCLUDED.expires_at, lease_until = EXCLUDED.lease_until
     WHERE rail_keys.expires_at IS NOT NULL AND rail_keys.expires_at <= {now}
     RETURNING token",
    9,
);
const REPLACE: Template = Template(
    "UPDATE rail_keys SET token = $1, state = $2, fingerprint = $3, value = $4,
     expires_at = {now} + $5, lease_until = {now} + $6 WHERE ns = $7 AND key = $8 AND token = $9",
    10,
);
const TAKE_OVER: Template = Template(
    "UPDATE rail_keys SET token = $1, state = $2, fingerprint = $3, value = $4,
     expires_at = {now} + $5, lease_until = {now} + $6
     WHERE ns = $7 AND key = $8 AND token = $9 AND lease_until IS NOT NULL
       AND lease_until <= {now}",
    10,
);
const RENEW: Template = Template(
    "UPDATE rail_keys SET lease_until = {now} + $1
     WHERE ns = $2 AND key = $3 AND token = $4 AND lease_until IS NOT NULL",
    5,
);
const REMOVE: &str = "DELETE FROM rail_keys WHERE ns = $1 AND key = $2 AND token = $3";
const GET: Template = Template(
    "SELECT token, state, fingerprint, value, expires_at, lease_until, {now} AS now
     FROM rail_keys WHERE ns = $1 AND key = $2 AND (expires_at IS NULL OR expires_at > {now})",
    3,
);
const NOW: Template = Template("SELECT {now}", 1);
const PURGE: Template = Template(
    "DELETE FROM rail_keys WHERE expires_at IS NOT NULL AND expires_at <= {now}",
    1,
);

/// The statements of one database, `{now}` filled in.
struct Statements {
    insert_if_absent: String,
    replace: String,
    take_over: String,
    renew: String,
    get: String,
    purge: String,
    now: String,
}

impl Statements {
    /// `now(i)`: the time expression given the index of the injected-clock parameter.
    fn new(now: fn(u8) -> String) -> Self {
        let fill = |t: &Template| t.0.replace("{now}", &now(t.1));
        Statements {
            insert_if_absent: fill(&INSERT_IF_ABSENT),
            replace: fill(&REPLACE),
            take_over: fill(&TAKE_OVER),
            renew: fill(&RENEW),
            get: fill(&GET),
            purge: fill(&PURGE),
            now: fill(&NOW),
        }
    }
}

/// One write to the key table, owned so it can wait in a group commit's queue. Every write
/// answers one thing: whether it took effect (the insert won, the compare-and-set matched).
#[derive(Debug)]
enum Op {
    Insert {
        ns: String,
        key: String,
        rec: Write,
    },
    /// `REPLACE` (`take_over: false`) or `TAKE_OVER`.
    Cas {
        take_over: bool,
        ns: String,
        key: String,
        token: i64,
        rec: Write,
    },
    Renew {
        ns: String,
        key: String,
        token: i64,
        lease: std::time::Duration,
    },
    Remove {
        ns: String,
        key: String,
        token: i64,
    },
}

use super::store::Write;

/// The [`KeyStore`](super::KeyStore) implementation, for a store type with `pool` and
/// `clock: Option<SharedClock>` fields, a `STATEMENTS` static, and a `write(&self, Op)` method
/// that runs a write with [`run`] (SQLite: in a group commit; PostgreSQL: on its own).
macro_rules! sql_key_store {
    ($store:ty, $row:ty, $conn:ty) => {
        /// Runs `op` on `conn`: whether it took effect.
        async fn run(
            conn: &mut $conn,
            op: &super::Op,
            now: Option<i64>,
        ) -> Result<bool, sqlx::Error> {
            use super::Op;
            let affected = match op {
                Op::Insert { ns, key, rec } => {
                    return sqlx::query(&STATEMENTS.insert_if_absent)
                        .bind(ns)
                        .bind(key)
                        .bind(rec.token)
                        .bind(&rec.state)
                        .bind(&rec.fingerprint)
                        .bind(&rec.value)
                        .bind(rec.retain.map(millis))
                        .bind(rec.lease.map(millis))
                        .bind(now)
                        // Every row, so the statement runs to its end here: on SQLite a lone
                        // write commits there, and a failed commit is this call's error.
                        .fetch_all(&mut *conn)
                        .await
                        .map(|won| !won.is_empty());
                }
                Op::Cas {
                    take_over,
                    ns,
                    key,
                    token,
                    rec,
                } => {
                    let sql = if *take_over {
                        &STATEMENTS.take_over
                    } else {
                        &STATEMENTS.replace
                    };
                    sqlx::query(sql)
                        .bind(rec.token)
                        .bind(&rec.state)
                        .bind(&rec.fingerprint)
                        .bind(&rec.value)
                        .bind(rec.retain.map(millis))
                        .bind(rec.lease.map(millis))
                        .bind(ns)
                        .bind(key)
                        .bind(token)
                        .bind(now)
                        .execute(&mut *conn)
                        .await?
                }
                Op::Renew {
                    ns,
                    key,
                    token,
                    lease,
                } => {
                    sqlx::query(&STATEMENTS.renew)
                        .bind(millis(*lease))
                        .bind(ns)
                        .bind(key)
                        .bind(token)
                        .bind(now)
                        .execute(&mut *conn)
                        .await?
                }
                Op::Remove { ns, key, token } => {
                    sqlx::query(REMOVE)
                        .bind(ns)
                        .bind(key)
                        .bind(token)
                        .execute(&mut *conn)
                        .await?
                }
            };
            Ok(affected.rows_affected() == 1)
        }

        fn record(row: &$row) -> Result<Seen, sqlx::Error> {
            Ok(Seen {
                record: KeyRecord {
                    token: row.try_get("token")?,
                    state: row.try_get("state")?,
                    fingerprint: row.try_get("fingerprint")?,
                    value: row.try_get("value")?,
                    expires_at: row.try_get::<Option<i64>, _>("expires_at")?.map(Timestamp),
                    lease_until: row.try_get::<Option<i64>, _>("lease_until")?.map(Timestamp),
                },
                now: Timestamp(row.try_get("now")?),
            })
        }

        impl $store {
            /// The injected clock's time, or `None` for the database's own.
            fn now(&self) -> Option<i64> {
                self.clock.as_ref().map(|c| c.now().0)
            }
        }

        #[async_trait]
        impl KeyStore for $store {
            async fn insert_if_absent(
                &self,
                ns: &str,
                key: &str,
                rec: &Write,
            ) -> RailResult<Option<Seen>> {
                for _ in 0..3 {
                    let won = self
                        .write(super::Op::Insert {
                            ns: ns.to_owned(),
                            key: key.to_owned(),
                            rec: rec.clone(),
                        })
                        .await?;
                    if won {
                        return Ok(None);
                    }
                    if let Some(existing) = self.get(ns, key).await? {
                        return Ok(Some(existing));
                    }
                    // The blocking record vanished between the two statements: try again.
                }
                Err(crate::RailError::Storage(format!(
                    "key {ns}/{key} kept changing under contention"
                )))
            }

            async fn replace(
                &self,
                ns: &str,
                key: &str,
                token: i64,
                rec: &Write,
            ) -> RailResult<bool> {
                self.write(super::Op::Cas {
                    take_over: false,
                    ns: ns.to_owned(),
                    key: key.to_owned(),
                    token,
                    rec: rec.clone(),
                })
                .await
            }

            async fn take_over(
                &self,
                ns: &str,
                key: &str,
                token: i64,
                rec: &Write,
            ) -> RailResult<bool> {
                self.write(super::Op::Cas {
                    take_over: true,
                    ns: ns.to_owned(),
                    key: key.to_owned(),
                    token,
                    rec: rec.clone(),
                })
                .await
            }

            async fn renew(
                &self,
                ns: &str,
                key: &str,
                token: i64,
                lease: Duration,
            ) -> RailResult<bool> {
                self.write(super::Op::Renew {
                    ns: ns.to_owned(),
                    key: key.to_owned(),
                    token,
                    lease,
                })
                .await
            }

            async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
                self.write(super::Op::Remove {
                    ns: ns.to_owned(),
                    key: key.to_owned(),
                    token,
                })
                .await
            }

            async fn get(&self, ns: &str, key: &str) -> RailResult<Option<Seen>> {
                let row = sqlx::query(&STATEMENTS.get)
                    .bind(ns)
                    .bind(key)
                    .bind(self.now())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| storage(&e))?;
                row.as_ref()
                    .map(record)
                    .transpose()
                    .map_err(|e| storage(&e))
            }

            async fn now(&self) -> RailResult<Timestamp> {
                if let Some(t) = self.now() {
                    return Ok(Timestamp(t));
                }
                sqlx::query_scalar::<_, i64>(&STATEMENTS.now)
                    .bind(None::<i64>)
                    .fetch_one(&self.pool)
                    .await
                    .map(Timestamp)
                    .map_err(|e| storage(&e))
            }

            async fn purge_expired(&self) -> RailResult<u64> {
                let r = sqlx::query(&STATEMENTS.purge)
                    .bind(self.now())
                    .execute(&self.pool)
                    .await
                    .map_err(|e| storage(&e))?;
                Ok(r.rows_affected())
            }
        }
    };
}

#[cfg(feature = "sqlite")]
pub use self::sqlite::{SqliteKeyStore, sqlite_pool};

#[cfg(feature = "postgres")]
pub use self::postgres::{PgKeyStore, postgres_pool};

#[cfg(feature = "sqlite")]
mod sqlite {
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
    static STATEMENTS: LazyLock<Statements> =
        LazyLock::new(|| Statements::new(|i| format!("${i}")));

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
}

#[cfg(feature = "postgres")]
mod postgres {
    use std::sync::LazyLock;
    use std::time::Duration;

    use async_trait::async_trait;
    use sqlx::Row;
    use sqlx::postgres::PgPool;

    use super::{REMOVE, Statements, storage};
    use crate::clock::{SharedClock, Timestamp};
    use crate::error::{RailError, RailResult};
    use crate::keys::{KeyRecord, KeyStore, Seen, Write, millis};

    /// The pool every PostgreSQL store of the workspace opens (the key store, the
    /// facilitator's tables): 16 connections, and `search_path` set to `schema` when given.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] for a URL sqlx cannot read; [`RailError::Storage`] if the
    /// database cannot be reached.
    pub async fn postgres_pool(url: &str, schema: Option<&str>) -> RailResult<PgPool> {
        let mut opts: sqlx::postgres::PgConnectOptions =
            url.parse().map_err(|e: sqlx::Error| {
                RailError::InvalidInput(format!("the PostgreSQL URL is invalid: {e}"))
            })?;
        if let Some(s) = schema {
            opts = opts.options([("search_path", s)]);
        }
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(16)
            .connect_with(opts)
            .await
            .map_err(|e| storage(&e))
    }

    /// PostgreSQL's `now`: an injected clock's time when bound, else the database's clock
    /// (`statement_timestamp()`, one value for the whole statement).
    static STATEMENTS: LazyLock<Statements> = LazyLock::new(|| {
        Statements::new(|i| {
            format!(
                "COALESCE(${i}::bigint, floor(extract(epoch from statement_timestamp()) * 1000)::bigint)"
            )
        })
    });

    /// A key store in PostgreSQL, shared by every process and host that uses the database.
    /// Times are the **database's** clock, so hosts whose clocks disagree still agree on every
    /// lease and retention; an injected clock overrides it ([`PgKeyStore::with_clock`]).
    #[derive(Debug, Clone)]
    pub struct PgKeyStore {
        pool: PgPool,
        clock: Option<SharedClock>,
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
            Ok(PgKeyStore { pool, clock: None })
        }

        /// Judges time by `clock` instead of the database's (tests that travel in time).
        #[must_use]
        pub fn with_clock(mut self, clock: SharedClock) -> Self {
            self.clock = Some(clock);
            self
        }
    }

    impl PgKeyStore {
        /// Runs one write on its own (PostgreSQL commits each statement; many connections
        /// write at once).
        async fn write(&self, op: super::Op) -> RailResult<bool> {
            let mut conn = self.pool.acquire().await.map_err(|e| storage(&e))?;
            run(&mut conn, &op, self.now())
                .await
                .map_err(|e| storage(&e))
        }
    }

    sql_key_store!(PgKeyStore, sqlx::postgres::PgRow, sqlx::PgConnection);
}
