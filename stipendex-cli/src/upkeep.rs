//! Background upkeep of a long-running server's store: expired records swept.

use std::sync::Arc;
use std::time::Duration;

use rail_core::KeyStore;

/// How often a server's store is swept of expired records.
const PURGE_EVERY: Duration = Duration::from_secs(60);

/// A task that removes the store's expired records every minute (claims, kept answers and
/// settled marks carry their expiry; without a sweep they would stay, in memory or in SQL),
/// until the returned guard is dropped.
pub(crate) fn purge_expired_every_minute(store: Arc<dyn KeyStore>) -> Purge {
    Purge(tokio::spawn(async move {
        let mut every = tokio::time::interval(PURGE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match store.purge_expired().await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(removed = n, "swept expired records from the store"),
                Err(e) => {
                    tracing::warn!(error = %e, "could not sweep expired records from the store");
                }
            }
        }
    }))
}

/// Stops the sweep when dropped.
pub(crate) struct Purge(tokio::task::JoinHandle<()>);

impl Drop for Purge {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rail_core::{ManualClock, MemoryKeyStore, ReplayGuard, SharedClock, Timestamp};

    /// Records whose retention ended are swept by the task (at once, then every minute), and
    /// a record still kept is not.
    #[tokio::test]
    async fn expired_records_are_swept_and_kept_ones_stay() {
        let clock = ManualClock::at(Timestamp(1_700_000_000_000));
        let shared: SharedClock = Arc::new(clock.clone());
        let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(shared));
        let guard = ReplayGuard::new(store.clone(), "served");
        for i in 0..100 {
            guard
                .insert_if_absent(&format!("old-{i}"), Some(Duration::from_secs(1)))
                .await
                .unwrap();
        }
        guard
            .insert_if_absent("kept", Some(Duration::from_secs(3600)))
            .await
            .unwrap();
        clock.advance(Duration::from_secs(2));
        let purge = purge_expired_every_minute(store.clone());
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(store.purge_expired().await.unwrap(), 0, "already swept");
        assert!(guard.seen("kept").await.unwrap().is_some());
        drop(purge);
    }
}
