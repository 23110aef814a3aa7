//! Opening a facilitator on a database URL.

use std::path::Path;
use std::sync::Arc;

use rail_core::keys::StoreUrl;
use rail_core::{KeyStore, SharedClock};
use rail_ledger::Ledger;

use super::Facilitator;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::store::Pool;

/// Opens the facilitator whose data is at `url`: `sqlite://PATH` (one instance; created if
/// missing) or `postgres://…` (several instances; `schema` keeps one facilitator's tables
/// apart, created if missing). `clock` replaces the system's and the database's time (tests
/// that travel in time); `None` judges holds by the database's clock on PostgreSQL.
///
/// # Errors
/// [`Error::Config`] for a URL of another kind or a backend not compiled in;
/// [`Error::Rail`] (storage) when the database cannot be opened.
pub async fn open(
    url: &str,
    schema: Option<&str>,
    config: Config,
    clock: Option<SharedClock>,
) -> Result<Facilitator> {
    let host: SharedClock = clock
        .clone()
        .unwrap_or_else(|| Arc::new(rail_core::SystemClock));
    match StoreUrl::parse(url) {
        Some(StoreUrl::Sqlite(path)) => open_sqlite(url, path, config, host, clock).await,
        Some(StoreUrl::Postgres(_)) => open_postgres(url, schema, config, host, clock).await,
        _ => Err(Error::Config(format!(
            "the facilitator's database URL must start with sqlite:// or postgres://, not {:?}",
            url.split(':').next().unwrap_or("")
        ))),
    }
}

/// The facilitator's own tables created, the instance assembled.
async fn assemble(
    ledger: Ledger,
    pool: Pool,
    keys: Arc<dyn KeyStore>,
    host: SharedClock,
    config: Config,
) -> Result<Facilitator> {
    pool.migrate().await?;
    Ok(Facilitator::new(ledger, pool, keys, host, config))
}

#[cfg(feature = "sqlite")]
async fn open_sqlite(
    url: &str,
    path: &Path,
    config: Config,
    host: SharedClock,
    clock: Option<SharedClock>,
) -> Result<Facilitator> {
    let ledger = Ledger::sqlite_with_clock(url, host.clone()).await?;
    let pool = rail_core::keys::sql::sqlite_pool(path).await?;
    let mut keys = rail_core::keys::sql::SqliteKeyStore::new(pool.clone()).await?;
    if let Some(c) = clock {
        keys = keys.with_clock(c);
    }
    assemble(ledger, Pool::Sqlite(pool), Arc::new(keys), host, config).await
}

#[cfg(not(feature = "sqlite"))]
async fn open_sqlite(
    _url: &str,
    _path: &Path,
    _config: Config,
    _host: SharedClock,
    _clock: Option<SharedClock>,
) -> Result<Facilitator> {
    Err(Error::Config(
        "this build has no SQLite support: enable the `sqlite` feature".into(),
    ))
}

#[cfg(feature = "postgres")]
async fn open_postgres(
    url: &str,
    schema: Option<&str>,
    config: Config,
    host: SharedClock,
    clock: Option<SharedClock>,
) -> Result<Facilitator> {
    let ledger = match &clock {
        Some(c) => Ledger::postgres_with_clock(url, schema, c.clone()).await?,
        None => Ledger::postgres_with_host_clock(url, schema, host.clone()).await?,
    };
    let pool = rail_core::keys::sql::postgres_pool(url, schema)
        .await
        .map_err(|e| match e {
            rail_core::RailError::InvalidInput(why) => Error::Config(why),
            e => Error::Rail(e),
        })?;
    let mut keys = rail_core::keys::sql::PgKeyStore::new(pool.clone()).await?;
    if let Some(c) = clock {
        keys = keys.with_clock(c);
    }
    assemble(ledger, Pool::Postgres(pool), Arc::new(keys), host, config).await
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(
    _url: &str,
    _schema: Option<&str>,
    _config: Config,
    _host: SharedClock,
    _clock: Option<SharedClock>,
) -> Result<Facilitator> {
    Err(Error::Config(
        "this build has no PostgreSQL support: enable the `postgres` feature".into(),
    ))
}
