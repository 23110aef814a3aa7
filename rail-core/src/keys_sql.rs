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

use crate::error::RailError;

fn storage(e: &sqlx::Error) -> RailError {
    RailError::Storage(e.to_string())
}

#[cfg(feature = "sqlite")]
pub use self::sqlite::SqliteKeyStore;

#[cfg(feature = "postgres")]
pub use self::postgres::PgKeyStore;

#[cfg(feature = "sqlite")]
mod sqlite {
    use async_trait::async_trait;
    use sqlx::Row;
    use sqlx::sqlite::SqlitePool;

    use super::storage;
    use crate::clock::Timestamp;
    use crate::error::RailResult;
    use crate::keys::{KeyRecord, KeyStore};

    /// A key store in a SQLite database (shares the file with other processes on one host).
    #[derive(Debug, Clone)]
    pub struct SqliteKeyStore {
        pool: SqlitePool,
    }

    impl SqliteKeyStore {
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

    fn record(row: &sqlx::sqlite::SqliteRow) -> Result<KeyRecord, sqlx::Error> {
        Ok(KeyRecord {
            token: row.try_get("token")?,
            state: row.try_get("state")?,
            fingerprint: row.try_get("fingerprint")?,
            value: row.try_get("value")?,
            expires_at: row.try_get::<Option<i64>, _>("expires_at")?.map(Timestamp),
        })
    }

    #[async_trait]
    impl KeyStore for SqliteKeyStore {
        async fn insert_if_absent(
            &self,
            ns: &str,
            key: &str,
            rec: &KeyRecord,
            now: Timestamp,
        ) -> RailResult<Option<KeyRecord>> {
            for _ in 0..3 {
                let won = sqlx::query(
                    "INSERT INTO rail_keys (ns, key, token, state, fingerprint, value, expires_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                     ON CONFLICT (ns, key) DO UPDATE SET token = excluded.token,
                        state = excluded.state, fingerprint = excluded.fingerprint,
                        value = excluded.value, expires_at = excluded.expires_at
                     WHERE rail_keys.expires_at IS NOT NULL AND rail_keys.expires_at <= ?8
                     RETURNING token",
                )
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
            let r = sqlx::query(
                "UPDATE rail_keys SET token = ?1, state = ?2, fingerprint = ?3, value = ?4,
                    expires_at = ?5 WHERE ns = ?6 AND key = ?7 AND token = ?8",
            )
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
            let r = sqlx::query("DELETE FROM rail_keys WHERE ns = ?1 AND key = ?2 AND token = ?3")
                .bind(ns)
                .bind(key)
                .bind(token)
                .execute(&self.pool)
                .await
                .map_err(|e| storage(&e))?;
            Ok(r.rows_affected() == 1)
        }

        async fn get(&self, ns: &str, key: &str, now: Timestamp) -> RailResult<Option<KeyRecord>> {
            let row = sqlx::query(
                "SELECT token, state, fingerprint, value, expires_at FROM rail_keys
                 WHERE ns = ?1 AND key = ?2 AND (expires_at IS NULL OR expires_at > ?3)",
            )
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
            let r = sqlx::query(
                "DELETE FROM rail_keys WHERE expires_at IS NOT NULL AND expires_at <= ?1",
            )
            .bind(now.0)
            .execute(&self.pool)
            .await
            .map_err(|e| storage(&e))?;
            Ok(r.rows_affected())
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use async_trait::async_trait;
    use sqlx::Row;
    use sqlx::postgres::PgPool;

    use super::storage;
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

    fn record(row: &sqlx::postgres::PgRow) -> Result<KeyRecord, sqlx::Error> {
        Ok(KeyRecord {
            token: row.try_get("token")?,
            state: row.try_get("state")?,
            fingerprint: row.try_get("fingerprint")?,
            value: row.try_get("value")?,
            expires_at: row.try_get::<Option<i64>, _>("expires_at")?.map(Timestamp),
        })
    }

    #[async_trait]
    impl KeyStore for PgKeyStore {
        async fn insert_if_absent(
            &self,
            ns: &str,
            key: &str,
            rec: &KeyRecord,
            now: Timestamp,
        ) -> RailResult<Option<KeyRecord>> {
            for _ in 0..3 {
                let won = sqlx::query(
                    "INSERT INTO rail_keys (ns, key, token, state, fingerprint, value, expires_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (ns, key) DO UPDATE SET token = EXCLUDED.token,
                        state = EXCLUDED.state, fingerprint = EXCLUDED.fingerprint,
                        value = EXCLUDED.value, expires_at = EXCLUDED.expires_at
                     WHERE rail_keys.expires_at IS NOT NULL AND rail_keys.expires_at <= $8
                     RETURNING token",
                )
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
            let r = sqlx::query(
                "UPDATE rail_keys SET token = $1, state = $2, fingerprint = $3, value = $4,
                    expires_at = $5 WHERE ns = $6 AND key = $7 AND token = $8",
            )
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
            let r = sqlx::query("DELETE FROM rail_keys WHERE ns = $1 AND key = $2 AND token = $3")
                .bind(ns)
                .bind(key)
                .bind(token)
                .execute(&self.pool)
                .await
                .map_err(|e| storage(&e))?;
            Ok(r.rows_affected() == 1)
        }

        async fn get(&self, ns: &str, key: &str, now: Timestamp) -> RailResult<Option<KeyRecord>> {
            let row = sqlx::query(
                "SELECT token, state, fingerprint, value, expires_at FROM rail_keys
                 WHERE ns = $1 AND key = $2 AND (expires_at IS NULL OR expires_at > $3)",
            )
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
            let r = sqlx::query(
                "DELETE FROM rail_keys WHERE expires_at IS NOT NULL AND expires_at <= $1",
            )
            .bind(now.0)
            .execute(&self.pool)
            .await
            .map_err(|e| storage(&e))?;
            Ok(r.rows_affected())
        }
    }
}
