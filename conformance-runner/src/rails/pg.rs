//! One PostgreSQL schema per harness, for the localnet tiers: created on demand, reached through
//! pools whose `search_path` is the schema, dropped at teardown.

use std::sync::Arc;
use std::time::Duration;

use rail_core::keys::sql::PgKeyStore;
use rail_core::{KeyStore, SharedClock};

use conformance::HarnessError;

/// A harness's schema: the server and the schema's name.
#[derive(Clone, Debug)]
pub struct Schema {
    /// The server URL.
    pub url: String,
    /// The schema.
    pub name: String,
}

fn setup(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Setup(e.to_string())
}

impl Schema {
    /// A fresh schema `conformance_<prefix>_<random>` on the project's PostgreSQL.
    ///
    /// # Errors
    /// [`HarnessError::Unavailable`] when PostgreSQL cannot be reached.
    pub async fn create(prefix: &str) -> Result<Self, HarnessError> {
        let url = test_kit::localnet::postgres_url();
        let name = format!("conformance_{prefix}_{:016x}", rand::random::<u64>());
        let opts: sqlx::postgres::PgConnectOptions = url.parse().map_err(setup)?;
        let admin = tokio::time::timeout(
            Duration::from_secs(5),
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect_with(opts),
        )
        .await
        .map_err(|_| HarnessError::Unavailable(format!("PostgreSQL at {url}: timed out")))?
        .map_err(|e| HarnessError::Unavailable(format!("PostgreSQL at {url}: {e}")))?;
        sqlx::query(&format!("CREATE SCHEMA {name}"))
            .execute(&admin)
            .await
            .map_err(setup)?;
        admin.close().await;
        Ok(Schema { url, name })
    }

    /// A key store in the schema, on a pool of its own (another process would have one), judging
    /// time by the harness's `clock` (behaviours travel in time).
    ///
    /// # Errors
    /// [`HarnessError::Setup`].
    pub async fn key_store(&self, clock: SharedClock) -> Result<Arc<dyn KeyStore>, HarnessError> {
        let opts: sqlx::postgres::PgConnectOptions = self.url.parse().map_err(setup)?;
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect_with(opts.options([("search_path", self.name.as_str())]))
            .await
            .map_err(setup)?;
        Ok(Arc::new(
            PgKeyStore::new(pool)
                .await
                .map_err(setup)?
                .with_clock(clock),
        ))
    }

    /// Drops the schema and everything in it (best effort).
    pub async fn drop_all(&self) {
        if let Ok(pool) = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .connect(&self.url)
            .await
        {
            let _ = sqlx::query(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name))
                .execute(&pool)
                .await;
            pool.close().await;
        }
    }
}
