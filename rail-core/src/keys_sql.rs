//! [`KeyStore`](crate::keys::KeyStore) on SQL databases: SQLite (one host, several processes)
//! and PostgreSQL (several hosts). Both use one table:
//!
//! ```sql
//! CREATE TABLE rail_keys (ns TEXT, key TEXT, token BIGINT, state TEXT, fingerprint BLOB/BYTEA,
//!                         value TEXT, expires_at BIGINT, PRIMARY KEY (ns, key));
//! ```
//!
//! `insert_if_absent` is one statement, `INSERT … ON CONFLICT (ns, key) DO UPDATE … WHERE
//! rail_keys.expires_at <= now RETURNING token`: the primary key makes two concurrent inserters
//! of one key serialize on the row, and only one of them sees its own token returned.
//!
//! The statements are the same text for both databases (`$N` placeholders, which SQLite also
//! accepts), so one implementation, stamped out per database by `sql_key_store!`, serves both;
//! only the schema differs.

use crate::error::RailError;

fn storage(e: &sqlx::Error) -> RailError {
    RailError::Storage(e.to_string())
}

const INSERT_IF_ABSENT: &str =
    "INSERT INTO rail_keys (ns, key, token, state, fingerprint, value, expires_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7)
     ON CONFLICT (ns, key) DO UPDATE SET token = EXCLUDED.token, state = EXCLUDED.state,
        fingerprint = EXCLUDED.fingerprint, value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
     WHERE rail_keys.expires_at IS NOT NULL AND rail_keys.expires_at <= $8
     RETURNING token";
const REPLACE: &str = "UPDATE rail_keys SET token = $1, state = $2, fingerprint = $3, value = $4,
     expires_at = $5 WHERE ns = $6 AND key = $7 AND token = $8";
const REMOVE: &str = "DELETE FROM rail_keys WHERE ns = $1 AND key = $2 AND token = $3";
const GET: &str = "SELECT token, state, fingerprint, value, expires_at FROM rail_keys
     WHERE ns = $1 AND key = $2 AND (expires_at IS NULL OR expires_at > $3)";
const PURGE: &str = "DELETE FROM rail_keys WHERE expires_at IS NOT NULL AND expires_at <= $1";

/// The [`KeyStore`](crate::keys::KeyStore) implementation, for a store type with a `pool` field.
macro_rules! sql_key_store {
    ($store:ty, $row:ty) => {
        fn record(row: &$row) -> Result<KeyRecord, sqlx::Error> {
            Ok(KeyRecord {
                token: row.try_get("token")?,
                state: row.try_get("state")?,
                fingerprint: row.try_get("fingerprint")?,
                value: row.try_get("value")?,
                expires_at: row.try_get::<Option<i64>, _>("expires_at")?.map(Timestamp),
            })
        }

        #[async_trait]
        impl KeyStore for $store {
            async fn insert_if_absent(
                &self,
                ns: &str,
                key: &str,
                rec: &KeyRecord,
                now: Timestamp,
            ) -> RailResult<Option<KeyRecord>> {
                for _ in 0..3 {
                    let won = sqlx::query(INSERT_IF_ABSENT)
                        .bind(ns)
                        .bind(key)
                        .bind(rec.token)
                        .bind(&rec.state)
                        .bind(&rec.fingerprint)
                        .bind(&rec.value)
                        .bind(rec.expires_at.map(|t| t.0))
                        .bind(now.0)
                        .fetch_optional(&self.pool)
                        .await
                        .map_err(|e| storage(&e))?;
                    if won.is_some() {
                        return Ok(None);
                    }
                    if let Some(existing) = self.get(ns, key, now).await? {
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
                rec: &KeyRecord,
            ) -> RailResult<bool> {
                let r = sqlx::query(REPLACE)
                    .bind(rec.token)
                    .bind(&rec.state)
                    .bind(&rec.fingerprint)
                    .bind(&rec.value)
                    .bind(rec.expires_at.map(|t| t.0))
                    .bind(ns)
                    .bind(key)
                    .bind(token)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| storage(&e))?;
                Ok(r.rows_affected() == 1)
            }

            async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
                let r = sqlx::query(REMOVE)
                    .bind(ns)
                    .bind(key)
                    .bind(token)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| storage(&e))?;
                Ok(r.rows_affected() == 1)
            }

            async fn get(
                &self,
                ns: &str,
                key: &str,
                now: Timestamp,
            ) -> RailResult<Option<KeyRecord>> {
                let row = sqlx::query(GET)
                    .bind(ns)
                    .bind(key)
                    .bind(now.0)
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| storage(&e))?;
                row.as_ref()
                    .map(record)
                    .transpose()
                    .map_err(|e| storage(&e))
            }

            async fn purge_expired(&self, now: Timestamp) -> RailResult<u64> {
                let r = sqlx::query(PURGE)
                    .bind(now.0)
                    .execute(&self.pool)
                    .await
                    .map_err(|e| storage(&e))?;
                Ok(r.rows_affected())
            }
        }
    };
}

#[cfg(feature = "sqlite")]
pub use self::sqlite::SqliteKeyStore;

#[cfg(feature = "postgres")]
pub use self::postgres::PgKeyStore;

#[cfg(feature = "sqlite")]
mod sqlite {
    use std::path::Path;
    use std::time::Duration;

    use async_trait::async_trait;
    use sqlx::Row;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

    use super::{GET, INSERT_IF_ABSENT, PURGE, REMOVE, REPLACE, storage};
    use crate::clock::Timestamp;
    use crate::error::RailResult;
    use crate::keys::{KeyRecord, KeyStore};

    /// A key store in a SQLite database (shares the file with other processes on one host).
    #[derive(Debug, Clone)]
    pub struct SqliteKeyStore {
        pool: SqlitePool,
    }

    impl SqliteKeyStore {
        /// Opens (or creates) the key store file at `path`: WAL mode, a 30 s busy timeout so
        /// several processes can share it.
        ///
        /// # Errors
        /// [`crate::RailError::Storage`] if the file cannot be opened or the schema created.
        pub async fn open(path: &Path) -> RailResult<Self> {
            let opts = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .busy_timeout(Duration::from_secs(30));
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(opts)
                .await
                .map_err(|e| storage(&e))?;
            Self::new(pool).await
        }

        /// Uses `pool`, creating the table if needed.
        ///
        /// # Errors
        /// [`crate::RailError::Storage`] if the schema cannot be created.
        pub async fn new(pool: SqlitePool) -> RailResult<Self> {
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS rail_keys (
                    ns TEXT NOT NULL, key TEXT NOT NULL, token INTEGER NOT NULL,
                    state TEXT NOT NULL, fingerprint BLOB NOT NULL, value TEXT,
                    expires_at INTEGER, PRIMARY KEY (ns, key)) WITHOUT ROWID",
            )
            .execute(&pool)
            .await
            .map_err(|e| storage(&e))?;
            sqlx::query("CREATE INDEX IF NOT EXISTS rail_keys_expiry ON rail_keys (expires_at)")
                .execute(&pool)
                .await
                .map_err(|e| storage(&e))?;
            Ok(SqliteKeyStore { pool })
        }
    }

    sql_key_store!(SqliteKeyStore, sqlx::sqlite::SqliteRow);
}

#[cfg(feature = "postgres")]
mod postgres {
    use async_trait::async_trait;
    use sqlx::Row;
    use sqlx::postgres::PgPool;

    use super::{GET, INSERT_IF_ABSENT, PURGE, REMOVE, REPLACE, storage};
    use crate::clock::Timestamp;
    use crate::error::RailResult;
    use crate::keys::{KeyRecord, KeyStore};

    /// A key store in PostgreSQL, shared by every process and host that uses the database.
    #[derive(Debug, Clone)]
    pub struct PgKeyStore {
        pool: PgPool,
    }

    impl PgKeyStore {
        /// Uses `pool`, creating the table if needed.
        ///
        /// # Errors
        /// [`crate::RailError::Storage`] if the schema cannot be created.
        pub async fn new(pool: PgPool) -> RailResult<Self> {
            // Serialize concurrent schema creation across processes.
            let mut tx = pool.begin().await.map_err(|e| storage(&e))?;
            sqlx::query("SELECT pg_advisory_xact_lock(7262897411)")
                .execute(&mut *tx)
                .await
                .map_err(|e| storage(&e))?;
            sqlx::query(
                "CREATE TABLE IF NOT EXISTS rail_keys (
                    ns TEXT NOT NULL, key TEXT NOT NULL, token BIGINT NOT NULL,
                    state TEXT NOT NULL, fingerprint BYTEA NOT NULL, value TEXT,
                    expires_at BIGINT, PRIMARY KEY (ns, key))",
            )
            .execute(&mut *tx)
            .await
            .map_err(|e| storage(&e))?;
            sqlx::query("CREATE INDEX IF NOT EXISTS rail_keys_expiry ON rail_keys (expires_at)")
                .execute(&mut *tx)
                .await
                .map_err(|e| storage(&e))?;
            tx.commit().await.map_err(|e| storage(&e))?;
            Ok(PgKeyStore { pool })
        }
    }

    sql_key_store!(PgKeyStore, sqlx::postgres::PgRow);
}
