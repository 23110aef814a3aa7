//! One opener for the key store a URL names (`memory`, `sqlite://PATH`, `postgres://…`), and
//! the one place its SQL pools are configured ([`crate::keys::sql::sqlite_pool`],
//! [`crate::keys::sql::postgres_pool`]).

use std::path::Path;
use std::sync::Arc;

use crate::clock::SharedClock;
use crate::error::{RailError, RailResult};
use crate::keys::{KeyStore, MemoryKeyStore};

/// What the store URLs may be, for messages.
pub const STORE_URLS: &str = "memory, sqlite://PATH or postgres://…";

/// The store a URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreUrl<'a> {
    /// `memory`: this process only, gone when it exits.
    Memory,
    /// `sqlite://PATH`: a file shared by the processes of one host.
    Sqlite(&'a Path),
    /// `postgres://…` or `postgresql://…` (the whole URL): shared by several hosts.
    Postgres(&'a str),
}

impl<'a> StoreUrl<'a> {
    /// What `url` names; `None` if it is none of [`STORE_URLS`].
    #[must_use]
    pub fn parse(url: &'a str) -> Option<Self> {
        if url == "memory" {
            Some(Self::Memory)
        } else if let Some(path) = url.strip_prefix("sqlite://") {
            Some(Self::Sqlite(Path::new(path)))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Some(Self::Postgres(url))
        } else {
            None
        }
    }

    /// The cargo feature of rail-core this store needs (`None` for memory).
    #[must_use]
    pub const fn feature(&self) -> Option<&'static str> {
        match self {
            Self::Memory => None,
            Self::Sqlite(_) => Some("sqlite"),
            Self::Postgres(_) => Some("postgres"),
        }
    }

    /// Whether this build carries the store's driver.
    #[must_use]
    pub const fn compiled(&self) -> bool {
        match self {
            Self::Memory => true,
            Self::Sqlite(_) => cfg!(feature = "sqlite"),
            Self::Postgres(_) => cfg!(feature = "postgres"),
        }
    }
}

/// Opens the key store `url` names, its times judged by `clock` when given (else the store's
/// own: the host's for memory and SQLite, the database's for PostgreSQL).
///
/// # Errors
/// [`RailError::InvalidInput`] for a URL that names no store or a store whose driver this build
/// does not carry; [`RailError::Storage`] when the database cannot be opened.
pub async fn open(url: &str, clock: Option<SharedClock>) -> RailResult<Arc<dyn KeyStore>> {
    let store = StoreUrl::parse(url).ok_or_else(|| {
        RailError::InvalidInput(format!(
            "{:?} is not a store URL: use {STORE_URLS}",
            url.split(':').next().unwrap_or("")
        ))
    })?;
    open_at(store, clock).await
}

/// [`open`] for a URL already parsed (a caller that words its own refusals).
///
/// # Errors
/// As [`open`].
pub async fn open_at(
    store: StoreUrl<'_>,
    clock: Option<SharedClock>,
) -> RailResult<Arc<dyn KeyStore>> {
    match store {
        StoreUrl::Memory => Ok(Arc::new(match clock {
            Some(c) => MemoryKeyStore::with_clock(c),
            None => MemoryKeyStore::default(),
        })),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => {
            let mut s = crate::keys::sql::SqliteKeyStore::open(path).await?;
            if let Some(c) = clock {
                s = s.with_clock(c);
            }
            Ok(Arc::new(s))
        }
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(url) => {
            let mut s = crate::keys::sql::PgKeyStore::connect(url).await?;
            if let Some(c) = clock {
                s = s.with_clock(c);
            }
            Ok(Arc::new(s))
        }
        #[allow(unreachable_patterns)] // a driver not compiled in
        other => Err(RailError::InvalidInput(format!(
            "this build has no {} store: enable rail-core's `{}` feature",
            other.feature().unwrap_or("memory"),
            other.feature().unwrap_or("")
        ))),
    }
}
