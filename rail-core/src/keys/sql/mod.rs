//! [`KeyStore`](super::KeyStore) on SQL databases: SQLite (one host, several processes) and
//! PostgreSQL (several hosts). Both use one table:
//!
//! ```sql
//! CREATE TABLE rail_keys (ns TEXT, key TEXT, token BIGINT, state TEXT, fingerprint BLOB/BYTEA,
//!                         value TEXT, expires_at BIGINT, lease_until BIGINT, PRIMARY KEY (ns, key));
//! ```
//!
//! On SQLite the rows live in a rowid table with `(ns, key)` unique through an index ordered
//! key first (`sqlite::SCHEMA`: a payment's records share pages), and a file an earlier release
//! wrote (`WITHOUT ROWID`, keyed by `(ns, key)`) is migrated when opened.
//!
//! `insert_if_absent` is one statement, `INSERT … ON CONFLICT (ns, key) DO UPDATE … WHERE
//! rail_keys.expires_at <= now RETURNING token`: the unique key makes two concurrent inserters
//! of one key serialize on the row, and only one of them sees its own token returned. A record
//! without retention (`expires_at IS NULL`: in flight) is never overwritten, whatever its lease.
//!
//! `count` (a windowed counter) is one statement too, `INSERT … ON CONFLICT (ns, key) DO UPDATE
//! SET value = value + 1 (or 1 once the window ended) … RETURNING value`, run on the pool
//! outside the group commit (it answers a value): concurrent counters of one key serialize on
//! the row, and its record expires with its window like any other.
//!
//! **Clocks.** Every statement computes times from one `now`: PostgreSQL's
//! `statement_timestamp()` by default (one clock for every host sharing the database), the
//! host's clock for SQLite (one host), or an injected [`Clock`](crate::Clock) for either.
//! The statements are the same text for both databases apart from that `now`, so one
//! implementation, stamped out per database by `sql_key_store!`, serves both.
//!
//! **Writes** go through a group commit (`group`): what is in flight is written as one batch,
//! each write answered only after its batch committed. A batch is one query — on PostgreSQL one
//! statement with a `WITH` clause per kind of write over arrays, on SQLite `BEGIN IMMEDIATE`, a
//! statement per kind over JSON rows, `COMMIT` — and holds one write per key, so its writes
//! commute and a key's writes keep their order. A lone write is its own statement.

#[cfg(feature = "postgres")]
use crate::error::RailError;

#[cfg(feature = "postgres")]
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
/// One event counted (`KeyStore::count`): a fresh counter at 1, or the present one plus 1, or
/// an expired record (of any kind) overwritten by a fresh counter, in one statement: the row
/// lock makes concurrent counters of one key serialize, each seeing its own count. Every `SET`
/// reads the row as it was. A present record that is not a counter is left alone (no row).
/// `$3` is the state [`COUNTED`](crate::keys::COUNTED), `$4` an empty fingerprint, `$5` the
/// window (ms).
const COUNT: Template = Template(
    "INSERT INTO rail_keys (ns, key, token, state, fingerprint, value, expires_at, lease_until)
     VALUES ($1, $2, 0, $3, $4, '1', {now} + $5, NULL)
     ON CONFLICT (ns, key) DO UPDATE SET
        value = CASE WHEN rail_keys.expires_at <= {now} THEN '1'
                ELSE CAST(CAST(rail_keys.value AS BIGINT) + 1 AS TEXT) END,
        expires_at = CASE WHEN rail_keys.expires_at <= {now} THEN EXCLUDED.expires_at
                     ELSE rail_keys.expires_at END,
        token = 0, state = EXCLUDED.state, fingerprint = EXCLUDED.fingerprint,
        lease_until = NULL
     WHERE rail_keys.expires_at IS NOT NULL
       AND (rail_keys.expires_at <= {now} OR rail_keys.state = EXCLUDED.state)
     RETURNING value, expires_at, {now} AS now",
    6,
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
    count: String,
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
            count: fill(&COUNT),
            now: fill(&NOW),
        }
    }
}

/// One write to the key table, owned so it can wait in a group commit's queue. Every write
/// answers one thing: whether it took effect (the insert won, the compare-and-set matched).
#[derive(Debug)]
struct Op {
    ns: String,
    key: String,
    kind: Kind,
}

/// What a write does to its key.
#[derive(Debug)]
enum Kind {
    /// `INSERT_IF_ABSENT`.
    Insert(Write),
    /// `REPLACE` or `TAKE_OVER`.
    Cas(Cas),
    /// `RENEW` the lease of the record holding `token`.
    Renew {
        token: i64,
        lease: std::time::Duration,
    },
    /// `REMOVE` the record holding `token`.
    Remove { token: i64 },
}

/// A compare-and-set: `REPLACE` (`take_over: false`) or `TAKE_OVER` of the record holding
/// `token` by `rec`.
#[derive(Debug)]
struct Cas {
    take_over: bool,
    token: i64,
    rec: Write,
}

use super::store::Write;

impl Op {
    /// A write of `kind` to `ns`/`key`.
    fn new(ns: &str, key: &str, kind: Kind) -> Self {
        Op {
            ns: ns.to_owned(),
            key: key.to_owned(),
            kind,
        }
    }

    /// `REPLACE` (`take_over: false`) or `TAKE_OVER` of `ns`/`key` from `token` to `rec`.
    fn cas(take_over: bool, ns: &str, key: &str, token: i64, rec: &Write) -> Self {
        let rec = rec.clone();
        Op::new(
            ns,
            key,
            Kind::Cas(Cas {
                take_over,
                token,
                rec,
            }),
        )
    }

    /// The namespace and key the write is to.
    #[cfg(feature = "postgres")]
    fn key(&self) -> (&str, &str) {
        (&self.ns, &self.key)
    }
}

/// The [`KeyStore`](super::KeyStore) implementation, for a store type with `pool` and
/// `clock: Option<SharedClock>` fields, a `STATEMENTS` static, and a `write(&self, Op)` method
/// that runs a write with [`run`] (in a group commit: SQLite one transaction per batch,
/// PostgreSQL one statement per batch; a lone write is its own statement on both).
#[cfg(feature = "postgres")]
macro_rules! sql_key_store {
    ($store:ty, $row:ty, $conn:ty) => {
        /// Runs `op` on `conn`: whether it took effect.
        async fn run(
            conn: &mut $conn,
            op: &super::Op,
            now: Option<i64>,
        ) -> Result<bool, sqlx::Error> {
            use super::Kind;
            let super::Op { ns, key, kind } = op;
            let affected = match kind {
                Kind::Insert(rec) => {
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
                Kind::Cas(cas) => {
                    let rec = &cas.rec;
                    let sql = if cas.take_over {
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
                        .bind(cas.token)
                        .bind(now)
                        .execute(&mut *conn)
                        .await?
                }
                Kind::Renew { token, lease } => {
                    sqlx::query(&STATEMENTS.renew)
                        .bind(millis(*lease))
                        .bind(ns)
                        .bind(key)
                        .bind(token)
                        .bind(now)
                        .execute(&mut *conn)
                        .await?
                }
                Kind::Remove { token } => {
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
                    let insert = super::Kind::Insert(rec.clone());
                    let won = self.write(super::Op::new(ns, key, insert)).await?;
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
                self.write(super::Op::cas(false, ns, key, token, rec)).await
            }

            async fn take_over(
                &self,
                ns: &str,
                key: &str,
                token: i64,
                rec: &Write,
            ) -> RailResult<bool> {
                self.write(super::Op::cas(true, ns, key, token, rec)).await
            }

            async fn renew(
                &self,
                ns: &str,
                key: &str,
                token: i64,
                lease: Duration,
            ) -> RailResult<bool> {
                let renew = super::Kind::Renew { token, lease };
                self.write(super::Op::new(ns, key, renew)).await
            }

            async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
                let remove = super::Kind::Remove { token };
                self.write(super::Op::new(ns, key, remove)).await
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

            async fn count(
                &self,
                ns: &str,
                key: &str,
                window: Duration,
            ) -> RailResult<crate::keys::Tally> {
                // One statement on a connection of its own, outside the group commit: its
                // answer is a value, and a limiter asks once per request.
                let rows = sqlx::query(&STATEMENTS.count)
                    .bind(ns)
                    .bind(key)
                    .bind(crate::keys::COUNTED)
                    .bind(Vec::<u8>::new())
                    .bind(millis(window))
                    .bind(self.now())
                    // Every row, so the statement runs to its end (on SQLite, its commit).
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| storage(&e))?;
                let Some(row) = rows.first() else {
                    return Err(crate::RailError::Storage(format!(
                        "key {ns}/{key} holds a record that is not a counter"
                    )));
                };
                let read = || -> Result<(String, i64, i64), sqlx::Error> {
                    Ok((
                        row.try_get("value")?,
                        row.try_get("expires_at")?,
                        row.try_get("now")?,
                    ))
                };
                let (value, end, now) = read().map_err(|e| storage(&e))?;
                let count = value.parse::<u64>().map_err(|_| {
                    crate::RailError::Storage(format!("the counter {ns}/{key} holds no count"))
                })?;
                // `now` was read before the statement waited for the database's lock: another
                // instance may have opened the window after it, so what is left is at most the
                // window.
                Ok(crate::keys::Tally {
                    count,
                    left: Duration::from_millis(
                        u64::try_from(end.saturating_sub(now)).unwrap_or(0),
                    )
                    .min(window),
                })
            }
        }
    };
}

#[cfg(feature = "sqlite")]
pub use self::sqlite::{SqliteKeyStore, sqlite_pool};

#[cfg(feature = "postgres")]
pub use self::postgres::{PgKeyStore, plain_on_this_host, postgres_pool, tuned as tuned_postgres};

#[cfg(feature = "postgres")]
mod group;

#[cfg(feature = "sqlite")]
mod sqlite;

#[cfg(feature = "postgres")]
mod postgres;
