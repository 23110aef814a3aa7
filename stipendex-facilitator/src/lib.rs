//! # stipendex-facilitator
//!
//! The hosted Stipendex facilitator (adoption level L1, `docs/stipendex-profile.md` §0): a signed
//! HTTP service that runs accounts over the ledger for wallets and receivers that keep none of
//! their own. Payers pay and hold from their account; receivers have it verify a payment once,
//! capture, void and refund; payments above an account's threshold wait in a review queue for an
//! operator. The client is the `account` rail ([`rail_account`]).
//!
//! - **One instance on SQLite, or several on one PostgreSQL.** Instances share nothing but the
//!   database: every operation is idempotent by a key derived from the caller's idempotency
//!   key, so a request retried on another instance after the first died is applied once.
//! - **Every request is signed** by its account's Ed25519 key over method, path, body hash,
//!   time and nonce ([`rail_account::auth`]); stale and replayed requests are refused.
//! - **Operators' basics**: `GET /v1/health`, `GET /metrics` (Prometheus text: requests,
//!   latencies, refusals by code), one structured log line per request (never a secret).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use stipendex_facilitator::{Config, open, serve};
//!
//! let fac = open("sqlite://facilitator.db", None, Config::new("facilitator.example"), None).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8402").await?;
//! serve(listener, fac, std::future::pending()).await?;
//! # Ok(()) }
//! ```

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("stipendex-facilitator needs a database: enable `sqlite` or `postgres`");

mod config;
mod error;
pub mod http;
mod service;
pub mod store;

use std::future::Future;
use std::time::Duration;

pub use config::Config;
pub use error::{Error, Result};
pub use http::router;
pub use service::{Authenticated, Facilitator, NewAccount, open, payment_id, treasury_id};

/// How often an instance sweeps expired nonces, redeemed offers, lapsed holds and reviews
/// undecided when their offer ended.
pub const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Serves `fac` on `listener` until `shutdown` completes (then finishes the requests in
/// flight), sweeping expired records every [`SWEEP_EVERY`].
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    fac: Facilitator,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let sweeper = fac.clone();
    let sweep = Sweeper(tokio::spawn(async move {
        let mut every = tokio::time::interval(SWEEP_EVERY);
        loop {
            every.tick().await;
            if let Err(e) = sweeper.sweep().await {
                tracing::warn!(error = %e, "sweep failed; retried at the next one");
            }
        }
    }));
    let result = axum::serve(listener, router(fac))
        .with_graceful_shutdown(shutdown)
        .await;
    drop(sweep);
    result
}

/// Stops the sweeper with the server, however the server's future ends (returned, or
/// dropped: an aborted task must not leave the sweeper holding the database).
struct Sweeper(tokio::task::JoinHandle<()>);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}
