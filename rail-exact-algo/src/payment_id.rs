//! The paymentId lifecycle: issued (with a 402 challenge) → pending (one settlement in flight)
//! → settled, on the rail-core replay guard, so several receiver instances sharing one store
//! (PostgreSQL) agree.
//!
//! Two single-use keys per paymentId: `issued` is written when the challenge is made and lapses
//! after `maxTimeoutSeconds`; `used` is reserved when a settlement starts (only one caller can),
//! committed when it succeeds, released when it fails (the payer may retry the same paymentId).

use std::sync::Arc;
use std::time::Duration;

use rail_core::keys::{KeyStore, Reservation};
use rail_core::{RailError, ReplayGuard, SharedClock};

/// How long a settled paymentId is remembered after settlement.
pub const SETTLED_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Why a paymentId cannot be settled now. [`LifecycleError::code`] is the seed's error text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LifecycleError {
    /// No such challenge, or it lapsed.
    #[error("unknown or expired paymentId")]
    UnknownOrExpired,
    /// Settled, or a settlement is in flight.
    #[error("paymentId already used")]
    AlreadyUsed,
    /// The store failed.
    #[error(transparent)]
    Store(RailError),
}

impl LifecycleError {
    /// The seed's error string (`unknown or expired paymentId`, `paymentId already used`).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            LifecycleError::UnknownOrExpired => "unknown or expired paymentId",
            LifecycleError::AlreadyUsed => "paymentId already used",
            LifecycleError::Store(_) => "storage error",
        }
    }
}

/// Issues and consumes paymentIds.
#[derive(Clone, Debug)]
pub struct PaymentIds {
    issued: ReplayGuard,
    used: ReplayGuard,
}

/// A settlement in flight for one paymentId: finish it with [`Settling::settled`] or
/// [`Settling::failed`].
#[derive(Debug)]
#[must_use = "a settlement must end as settled or failed"]
pub struct Settling {
    reservation: Reservation,
}

impl PaymentIds {
    /// PaymentIds kept in `store` (share it between receiver instances).
    pub fn new(store: Arc<dyn KeyStore>, clock: SharedClock) -> Self {
        PaymentIds {
            issued: ReplayGuard::new(store.clone(), clock.clone(), "exact-algo/issued"),
            used: ReplayGuard::new(store, clock, "exact-algo/used"),
        }
    }

    /// A fresh paymentId (32 lowercase hex digits) valid for `ttl` (`maxTimeoutSeconds`).
    ///
    /// # Errors
    /// [`LifecycleError::Store`].
    pub async fn issue(&self, ttl: Duration) -> Result<String, LifecycleError> {
        loop {
            let pid = hex::encode(rand::random::<[u8; 16]>());
            if self
                .issued
                .insert_if_absent(&pid, Some(ttl))
                .await
                .map_err(LifecycleError::Store)?
            {
                return Ok(pid);
            }
        }
    }

    /// Starts settling `pid`: it must be issued and live, and not used. Only one caller, in
    /// any process sharing the store, gets past this for a given paymentId at a time.
    /// `timeout` bounds the settlement (a crashed settler frees the id after it).
    ///
    /// # Errors
    /// [`LifecycleError::UnknownOrExpired`], [`LifecycleError::AlreadyUsed`].
    pub async fn begin(&self, pid: &str, timeout: Duration) -> Result<Settling, LifecycleError> {
        if self
            .issued
            .state(pid)
            .await
            .map_err(LifecycleError::Store)?
            .is_none()
        {
            return Err(LifecycleError::UnknownOrExpired);
        }
        match self.used.reserve(pid, timeout).await {
            Ok(reservation) => Ok(Settling { reservation }),
            Err(RailError::Replayed { .. }) => Err(LifecycleError::AlreadyUsed),
            Err(e) => Err(LifecycleError::Store(e)),
        }
    }
}

impl Settling {
    /// The network accepted the payment: the paymentId is used for good.
    ///
    /// # Errors
    /// [`LifecycleError::AlreadyUsed`] if the reservation lapsed and another settler took it.
    pub async fn settled(self) -> Result<(), LifecycleError> {
        self.reservation
            .commit(Some(SETTLED_RETENTION))
            .await
            .map_err(|e| match e {
                RailError::Replayed { .. } => LifecycleError::AlreadyUsed,
                other => LifecycleError::Store(other),
            })
    }

    /// The network refused the payment: the paymentId may be tried again.
    ///
    /// # Errors
    /// [`LifecycleError::Store`].
    pub async fn failed(self) -> Result<(), LifecycleError> {
        self.reservation
            .release()
            .await
            .map_err(LifecycleError::Store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rail_core::{ManualClock, MemoryKeyStore, Timestamp};

    fn ids() -> (PaymentIds, ManualClock) {
        let clock = ManualClock::at(Timestamp(1_000_000));
        (
            PaymentIds::new(Arc::new(MemoryKeyStore::default()), Arc::new(clock.clone())),
            clock,
        )
    }

    const T: Duration = Duration::from_secs(30);

    #[tokio::test]
    async fn issued_settled_once() {
        let (ids, _) = ids();
        let pid = ids.issue(Duration::from_secs(120)).await.unwrap();
        assert_eq!(pid.len(), 32);
        assert!(
            pid.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        let s = ids.begin(&pid, T).await.unwrap();
        assert_eq!(
            ids.begin(&pid, T).await.unwrap_err().code(),
            "paymentId already used"
        );
        s.settled().await.unwrap();
        assert_eq!(
            ids.begin(&pid, T).await.unwrap_err().code(),
            "paymentId already used"
        );
    }

    #[tokio::test]
    async fn unknown_and_expired_ids_are_refused() {
        let (ids, clock) = ids();
        assert_eq!(
            ids.begin("00000000000000000000000000000000", T)
                .await
                .unwrap_err()
                .code(),
            "unknown or expired paymentId"
        );
        let pid = ids.issue(Duration::from_secs(120)).await.unwrap();
        clock.advance(Duration::from_secs(121));
        assert_eq!(
            ids.begin(&pid, T).await.unwrap_err().code(),
            "unknown or expired paymentId"
        );
    }

    #[tokio::test]
    async fn a_failed_settlement_frees_the_id_and_a_crashed_one_lapses() {
        let (ids, clock) = ids();
        let pid = ids.issue(Duration::from_secs(600)).await.unwrap();
        ids.begin(&pid, T).await.unwrap().failed().await.unwrap();
        let crashed = ids.begin(&pid, T).await.unwrap();
        clock.advance(T + Duration::from_secs(1));
        let retry = ids.begin(&pid, T).await.unwrap();
        assert_eq!(
            crashed.settled().await.unwrap_err().code(),
            "paymentId already used"
        );
        retry.settled().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sixteen_concurrent_settlements_one_wins() {
        let (ids, _) = ids();
        let pid = ids.issue(Duration::from_secs(120)).await.unwrap();
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let (ids, pid) = (ids.clone(), pid.clone());
            tasks.push(tokio::spawn(
                async move { ids.begin(&pid, T).await.is_ok() },
            ));
        }
        let mut wins = 0;
        for t in tasks {
            wins += usize::from(t.await.unwrap());
        }
        assert_eq!(wins, 1);
    }
}
