//! The PostgreSQL key store: one database shared by every process and host.

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
    let mut opts: sqlx::postgres::PgConnectOptions = url.parse().map_err(|e: sqlx::Error| {
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
