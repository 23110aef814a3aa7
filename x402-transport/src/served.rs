//! The served-once record: one per payment key ([`crate::Verified::key`]), shared by the HTTP
//! paywall, the MCP adapter and the rails' receivers — one payment is served once across all of
//! them, and across instances sharing a [`KeyStore`] (PostgreSQL).
//!
//! A request reserves the key before it settles (its lease kept alive while it works), records
//! `paid:<transaction>` once settled (so a copy presented while the paid work runs is refused,
//! not served again), and commits once the payer got what it paid for. A failed handler releases
//! the key: the same payment may be presented again, and its scheme answers the recorded
//! settlement (no second charge). A crashed server's reservation lapses after [`SERVE_WINDOW`].

use std::sync::Arc;
use std::time::Duration;

use rail_core::keys::{KeyStore, RESERVED, Reservation};
use rail_core::{MemoryKeyStore, RailError, ReplayGuard};

/// How long a request holds a payment while it settles and runs, unless kept alive.
pub const SERVE_WINDOW: Duration = Duration::from_secs(120);
/// How long a served payment is remembered: longer than any validity window a payer signs
/// (x402 EVM payers sign at most an hour; an Algorand transaction lives at most 1,000 rounds).
pub const SERVED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);
/// The record's namespace in the key store (as before the transport was shared, so records
/// written by earlier versions keep their meaning).
pub const NAMESPACE: &str = "x402/served";

const PAID: &str = "paid";
const RUNNING: &str = "running";

/// Why a payment cannot be reserved.
#[derive(Debug, thiserror::Error)]
pub enum Taken {
    /// Another request holds it right now: retry the same payment shortly.
    #[error("this payment is being processed by another request")]
    InFlight,
    /// It was served already.
    #[error("this payment was already used")]
    Used,
    /// The store failed.
    #[error("served-once store: {0}")]
    Store(RailError),
}

/// The served-once record. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ServedOnce {
    guard: ReplayGuard,
}

impl Default for ServedOnce {
    fn default() -> Self {
        ServedOnce::new(Arc::new(MemoryKeyStore::default()))
    }
}

impl ServedOnce {
    /// The record kept in `store` (share it between instances).
    #[must_use]
    pub fn new(store: Arc<dyn KeyStore>) -> Self {
        ServedOnce {
            guard: ReplayGuard::new(store, NAMESPACE),
        }
    }

    /// Reserves `key` for one request.
    ///
    /// # Errors
    /// [`Taken`].
    pub async fn reserve(&self, key: &str) -> Result<Reservation, Taken> {
        match self.guard.reserve(key, SERVE_WINDOW).await {
            Ok(r) => Ok(r),
            Err(RailError::Replayed { .. }) => match self.guard.state(key).await {
                Ok(Some(s)) if s == RESERVED || s == RUNNING => Err(Taken::InFlight),
                Ok(_) => Err(Taken::Used),
                Err(e) => Err(Taken::Store(e)),
            },
            Err(e) => Err(Taken::Store(e)),
        }
    }
}

/// Marks a reservation as running paid work (settle-after: verified, not yet settled).
///
/// # Errors
/// The store's.
pub async fn running(serving: &Reservation) -> Result<(), RailError> {
    serving.advance(RUNNING, None).await
}

/// Records a settled payment before its content is produced. `false` when the record is no
/// longer this request's (another request took it over, and will answer the payer): then this
/// one must not produce the content. A store failure answers `true`: the charge happened, so
/// the payer is served.
pub async fn mark_paid(serving: &Reservation, transaction: &str) -> bool {
    match serving
        .advance(&format!("{PAID}:{transaction}"), None)
        .await
    {
        Ok(()) => true,
        Err(RailError::Replayed { .. }) => {
            tracing::warn!(tx = %transaction, "x402: paid, but another request holds the payment's record; not serving twice");
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, tx = %transaction, "x402: paid, but could not record it");
            true
        }
    }
}

/// The payer was served: the payment is used for good.
pub async fn commit(serving: Reservation) {
    if let Err(e) = serving.commit(Some(SERVED_RETENTION)).await {
        tracing::warn!(error = %e, "x402: served, but could not record it");
    }
}

/// Frees a reservation: the same payment may be presented again.
pub async fn release(serving: Reservation) {
    if let Err(e) = serving.release().await {
        tracing::warn!(error = %e, "x402: could not release a serve reservation (it lapses)");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_key_is_served_once_and_a_released_one_again() {
        let served = ServedOnce::default();
        let r = served.reserve("k").await.unwrap();
        assert!(matches!(served.reserve("k").await, Err(Taken::InFlight)));
        release(r).await;
        let r = served.reserve("k").await.unwrap();
        running(&r).await.unwrap();
        assert!(matches!(served.reserve("k").await, Err(Taken::InFlight)));
        assert!(mark_paid(&r, "0xabc").await);
        assert!(matches!(served.reserve("k").await, Err(Taken::Used)));
        commit(r).await;
        assert!(matches!(served.reserve("k").await, Err(Taken::Used)));
        assert!(served.reserve("other").await.is_ok());
    }
}
