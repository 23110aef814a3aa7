//! Quotes whose offers cost something (a Stripe PaymentIntent, a Lightning invoice) are limited
//! per client: an unpaid request must not make the receiver create objects without end.
//!
//! **Who.** A client is [`super::Request::client`]: over HTTP the key
//! [`crate::http::client_key`] computes (the TCP peer, or behind a trusted proxy the address it
//! vouches for; IPv6 by its /64). Requests without one share one window.
//!
//! **How many.** `max` Quotes with costly offers per client per fixed window of `per`, the
//! window opening at the client's first such Quote.
//!
//! **Where it is counted.** With a store given to the receiver (the store its instances
//! share: PostgreSQL, or SQLite on one host), in that store ([`KeyStore::count`]: one atomic
//! statement per costly Quote), so a fleet of instances admits the limit once, not once per
//! instance. A client refused there is remembered by the instance until its window ends, and
//! refused again without asking the store. Without a store — or while the store fails (logged)
//! — in a table in the instance's memory.
//!
//! **The table's bound.** The table keeps at most [`CAPACITY`] clients' windows. A look-up is
//! a hash-map access and keeping windows in order of their end a B-tree one: O(log n) per
//! request, never a scan. Ended windows are dropped as requests pass (a few per request,
//! oldest first); a new client at capacity evicts the window that ends first — an ended one
//! if any, else the oldest. An evicted client starts a fresh window. That is acceptable: the
//! cap is what bounds the memory an attacker can make the receiver hold; to be evicted, a
//! client must be pushed out by [`CAPACITY`] newer clients within one window, which takes as
//! many IPv4 addresses or IPv6 /64s (not addresses: /64 keying); and where the count is
//! shared, the store still holds the evicted client's count (eviction only forgets this
//! instance's memory of a refusal).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rail_core::keys::KeyStore;
use sha2::{Digest as _, Sha256};

/// The default: 60 Quotes with costly offers per client per minute.
pub const DEFAULT_COSTLY_QUOTES: (u32, Duration) = (60, Duration::from_secs(60));

/// The most clients' windows one instance keeps in memory.
pub(crate) const CAPACITY: usize = 10_000;

/// The window requests without a client share.
const NO_CLIENT: &str = "?";

/// A client key longer than this is counted by its digest (a key's size is bounded too).
const MAX_KEY: usize = 64;

/// How many ended windows each admission drops, beside what it looks up.
const SWEEP: usize = 2;

/// How often an instance asks the shared store to purge expired records (counters whose
/// window ended among them), at least.
const PURGE_EVERY: Duration = Duration::from_secs(60);

/// One client's window: when it ends (ms), what it counted, and its place in the order of ends.
#[derive(Debug)]
struct Window {
    end: i64,
    count: u32,
    seq: u64,
}

/// Windows by client, bounded, in order of their end.
#[derive(Debug)]
struct Table {
    capacity: usize,
    windows: HashMap<String, Window>,
    by_end: BTreeMap<(i64, u64), String>,
    seq: u64,
}

impl Table {
    fn new(capacity: usize) -> Self {
        Table {
            capacity: capacity.max(1),
            windows: HashMap::new(),
            by_end: BTreeMap::new(),
            seq: 0,
        }
    }

    /// Drops up to `n` windows that ended by `now`, first ended first.
    fn sweep(&mut self, now: i64, n: usize) {
        for _ in 0..n {
            match self.by_end.first_key_value() {
                Some((&(end, _), _)) if end <= now => {
                    if let Some((_, client)) = self.by_end.pop_first() {
                        self.windows.remove(&client);
                    }
                }
                _ => break,
            }
        }
    }

    /// `client`'s window, if it runs at `now`.
    fn live(&self, client: &str, now: i64) -> Option<&Window> {
        self.windows.get(client).filter(|w| w.end > now)
    }

    /// Gives `client` the window ending at `end` with `count`, replacing its own; a new client
    /// at capacity evicts the window that ends first.
    fn set(&mut self, client: &str, end: i64, count: u32) {
        if let Some(old) = self.windows.get(client) {
            self.by_end.remove(&(old.end, old.seq));
        } else if self.windows.len() >= self.capacity
            && let Some((_, evicted)) = self.by_end.pop_first()
        {
            self.windows.remove(&evicted);
        }
        self.seq = self.seq.wrapping_add(1);
        self.by_end.insert((end, self.seq), client.to_owned());
        self.windows.insert(
            client.to_owned(),
            Window {
                end,
                count,
                seq: self.seq,
            },
        );
    }

    /// Counts one more in `client`'s window (its end, and so its place, unchanged).
    fn bump(&mut self, client: &str) {
        if let Some(w) = self.windows.get_mut(client) {
            w.count = w.count.saturating_add(1);
        }
    }
}

/// The count shared by the instances: a store's counters.
#[derive(Debug)]
struct Shared {
    store: Arc<dyn KeyStore>,
    ns: String,
    /// When (the receiver's clock, ms) this instance next asks the store to purge.
    next_purge: AtomicI64,
}

/// The costly-quote limiter of one receiver instance.
#[derive(Debug)]
pub(crate) struct Limiter {
    max: u32,
    per: Duration,
    per_ms: i64,
    table: Mutex<Table>,
    shared: Option<Shared>,
}

impl Limiter {
    /// `max` per client per `per`, counted in this instance's memory.
    pub(crate) fn new(max: u32, per: Duration) -> Self {
        Self::with_capacity(max, per, CAPACITY)
    }

    fn with_capacity(max: u32, per: Duration, capacity: usize) -> Self {
        Limiter {
            max,
            per,
            per_ms: i64::try_from(per.as_millis()).unwrap_or(i64::MAX).max(1),
            table: Mutex::new(Table::new(capacity)),
            shared: None,
        }
    }

    /// Counts in `store` (shared by the receiver's instances), under the receiver `who`'s
    /// namespace; this instance's table remembers refusals and stands in while the store fails.
    pub(crate) fn shared(mut self, store: Arc<dyn KeyStore>, who: &str) -> Self {
        self.shared = Some(Shared {
            store,
            ns: format!("stipendex/{who}/costly"),
            next_purge: AtomicI64::new(i64::MIN),
        });
        self
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // The table holds counts only: one left half-updated by a panic is still a table.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one costly Quote for `client` at `now_ms` (the receiver's clock): `Ok` if within
    /// the limit, else the milliseconds until its window ends.
    pub(crate) async fn admit(&self, client: Option<&str>, now_ms: i64) -> Result<(), i64> {
        let key = key_of(client);
        let Some(shared) = &self.shared else {
            return self.admit_here(&key, now_ms);
        };
        if let Some(wait) = self.refused_here(&key, now_ms) {
            return Err(wait);
        }
        self.purge_now_and_then(shared, now_ms);
        match shared.store.count(&shared.ns, &key, self.per).await {
            Ok(t) if t.count <= u64::from(self.max) => Ok(()),
            Ok(t) => {
                let wait = i64::try_from(t.left.as_millis())
                    .unwrap_or(self.per_ms)
                    .max(1);
                self.table()
                    .set(&key, now_ms.saturating_add(wait), self.max);
                Err(wait)
            }
            Err(e) => {
                tracing::warn!(error = %e, "the shared count of costly quotes is unavailable; counting on this instance alone");
                self.admit_here(&key, now_ms)
            }
        }
    }

    /// Counts in this instance's table.
    fn admit_here(&self, key: &str, now_ms: i64) -> Result<(), i64> {
        let mut t = self.table();
        t.sweep(now_ms, SWEEP);
        match t.live(key, now_ms).map(|w| (w.end, w.count)) {
            Some((end, count)) if count >= self.max => Err(end.saturating_sub(now_ms)),
            Some(_) => {
                t.bump(key);
                Ok(())
            }
            None if self.max == 0 => Err(self.per_ms),
            None => {
                t.set(key, now_ms.saturating_add(self.per_ms), 1);
                Ok(())
            }
        }
    }

    /// How long `key` stays refused, if this instance knows it is over the limit.
    fn refused_here(&self, key: &str, now_ms: i64) -> Option<i64> {
        let mut t = self.table();
        t.sweep(now_ms, SWEEP);
        t.live(key, now_ms)
            .filter(|w| w.count >= self.max)
            .map(|w| w.end.saturating_sub(now_ms))
    }

    /// Asks the store, in the background and at most once per window (at least a minute), to
    /// forget expired records: counters of clients gone quiet among them.
    fn purge_now_and_then(&self, shared: &Shared, now_ms: i64) {
        let due = shared.next_purge.load(Ordering::Relaxed);
        if now_ms < due {
            return;
        }
        let every = self
            .per_ms
            .max(i64::try_from(PURGE_EVERY.as_millis()).unwrap_or(60_000));
        if shared
            .next_purge
            .compare_exchange(
                due,
                now_ms.saturating_add(every),
                Ordering::Relaxed,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = shared.store.clone();
        runtime.spawn(async move {
            match store.purge_expired().await {
                Ok(n) => tracing::debug!(purged = n, "expired records purged"),
                Err(e) => tracing::debug!(error = %e, "cannot purge expired records now"),
            }
        });
    }

    #[cfg(test)]
    fn clients_kept(&self) -> usize {
        self.table().windows.len()
    }
}

/// The key `client` is counted under: itself, or its digest when long; [`NO_CLIENT`] for none.
fn key_of(client: Option<&str>) -> String {
    match client {
        None => NO_CLIENT.to_owned(),
        Some(c) if c.len() <= MAX_KEY => c.to_owned(),
        Some(c) => format!("#{}", hex::encode(Sha256::digest(c.as_bytes()))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use rail_core::clock::{ManualClock, Timestamp};
    use rail_core::keys::MemoryKeyStore;

    const MIN: Duration = Duration::from_secs(60);

    async fn admit(l: &Limiter, client: &str, now: i64) -> Result<(), i64> {
        l.admit(Some(client), now).await
    }

    /// 100,000 distinct clients (an attacker cycling addresses) within one window: the table
    /// never holds more than its capacity, a request never scans it, and an honest client is
    /// still admitted.
    #[tokio::test]
    async fn a_flood_of_clients_stays_within_the_table_and_an_honest_client_is_admitted() {
        let l = Limiter::new(5, MIN);
        let started = std::time::Instant::now();
        for i in 0..100_000u32 {
            let now = i64::from(i / 10);
            assert!(admit(&l, &format!("attacker-{i}"), now).await.is_ok());
            assert!(l.clients_kept() <= CAPACITY);
            if i % 25_000 == 0 {
                assert!(admit(&l, "honest", now).await.is_ok(), "honest at {i}");
            }
        }
        assert_eq!(l.clients_kept(), CAPACITY);
        assert!(admit(&l, "honest", 10_000).await.is_ok());
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no scan per request: {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_window_admits_its_limit_per_client_then_resets() {
        let l = Limiter::new(2, MIN);
        assert!(admit(&l, "a", 0).await.is_ok());
        assert!(admit(&l, "a", 1).await.is_ok());
        assert_eq!(admit(&l, "a", 2).await, Err(59_998));
        assert!(
            admit(&l, "b", 2).await.is_ok(),
            "another client has its own window"
        );
        assert!(admit(&l, "a", 60_000).await.is_ok(), "a new window");
        assert_eq!(
            l.admit(None, 0).await.and(l.admit(None, 0).await),
            Ok(()),
            "no client: one shared window"
        );
        assert!(l.admit(None, 0).await.is_err());
        assert!(Limiter::new(0, MIN).admit(Some("a"), 0).await.is_err());
    }

    /// Ended windows go first; past them, the oldest: a client still in its window is evicted
    /// only by newer clients filling the table, and then starts afresh.
    #[tokio::test]
    async fn eviction_drops_ended_windows_first_then_the_oldest() {
        let l = Limiter::with_capacity(1, MIN, 3);
        assert!(admit(&l, "old", 0).await.is_ok());
        assert!(admit(&l, "mid", 10_000).await.is_ok());
        assert!(admit(&l, "new", 20_000).await.is_ok());
        assert!(admit(&l, "old", 30_000).await.is_err());
        // `old`'s window ended at 60 000: it goes, `mid` and `new` stay refused.
        assert!(admit(&l, "newest", 65_000).await.is_ok());
        assert!(admit(&l, "mid", 65_000).await.is_err());
        assert!(admit(&l, "new", 65_000).await.is_err());
        // Full of running windows: the oldest (`mid`, ending at 70 000) is evicted.
        assert!(admit(&l, "another", 66_000).await.is_ok());
        assert_eq!(l.clients_kept(), 3);
        assert!(
            admit(&l, "new", 66_000).await.is_err(),
            "newer windows kept"
        );
        assert!(
            admit(&l, "mid", 66_000).await.is_ok(),
            "evicted: a fresh window"
        );
    }

    #[test]
    fn long_client_keys_are_counted_by_their_digest() {
        let long = "x".repeat(10_000);
        let k = key_of(Some(&long));
        assert_eq!(k.len(), 65);
        assert_ne!(k, key_of(Some(&"x".repeat(10_001))));
        assert_eq!(key_of(Some("203.0.113.7")), "203.0.113.7");
        assert_eq!(key_of(None), NO_CLIENT);
    }

    /// Two instances on one store admit the limit between them; a refused client is then
    /// refused by the instance without asking the store again, until its window ends.
    #[tokio::test]
    async fn instances_sharing_a_store_admit_the_limit_once() {
        let clock = ManualClock::at(Timestamp(1_000_000));
        let store: Arc<dyn KeyStore> =
            Arc::new(MemoryKeyStore::with_clock(Arc::new(clock.clone())));
        let a = Limiter::new(3, MIN).shared(store.clone(), "r");
        let b = Limiter::new(3, MIN).shared(store.clone(), "r");
        let admitted = [
            admit(&a, "c", 0).await,
            admit(&b, "c", 0).await,
            admit(&a, "c", 0).await,
            admit(&b, "c", 0).await,
            admit(&a, "c", 0).await,
        ];
        assert_eq!(
            admitted.iter().filter(|r| r.is_ok()).count(),
            3,
            "{admitted:?}"
        );
        assert_eq!(admitted.get(3), Some(&Err(60_000)));
        let before = store.get("stipendex/r/costly", "c").await.unwrap().unwrap();
        assert!(admit(&b, "c", 1).await.is_err());
        let after = store.get("stipendex/r/costly", "c").await.unwrap().unwrap();
        assert_eq!(
            before.record.value, after.record.value,
            "refused without a count"
        );
        clock.advance(MIN);
        assert!(admit(&a, "c", 60_000).await.is_ok(), "the next window");
    }

    /// A store that is down.
    #[derive(Debug)]
    struct Down;

    fn down<T>() -> rail_core::RailResult<T> {
        Err(rail_core::RailError::Storage("database unreachable".into()))
    }

    #[async_trait::async_trait]
    impl KeyStore for Down {
        async fn insert_if_absent(
            &self,
            _: &str,
            _: &str,
            _: &rail_core::keys::Write,
        ) -> rail_core::RailResult<Option<rail_core::keys::Seen>> {
            down()
        }
        async fn replace(
            &self,
            _: &str,
            _: &str,
            _: i64,
            _: &rail_core::keys::Write,
        ) -> rail_core::RailResult<bool> {
            down()
        }
        async fn take_over(
            &self,
            _: &str,
            _: &str,
            _: i64,
            _: &rail_core::keys::Write,
        ) -> rail_core::RailResult<bool> {
            down()
        }
        async fn renew(
            &self,
            _: &str,
            _: &str,
            _: i64,
            _: Duration,
        ) -> rail_core::RailResult<bool> {
            down()
        }
        async fn remove(&self, _: &str, _: &str, _: i64) -> rail_core::RailResult<bool> {
            down()
        }
        async fn get(
            &self,
            _: &str,
            _: &str,
        ) -> rail_core::RailResult<Option<rail_core::keys::Seen>> {
            down()
        }
        async fn purge_expired(&self) -> rail_core::RailResult<u64> {
            down()
        }
        async fn now(&self) -> rail_core::RailResult<Timestamp> {
            down()
        }
    }

    /// While the shared store fails, the instance counts alone (logged) rather than refusing
    /// every client or admitting without limit.
    #[tokio::test]
    async fn a_failing_store_falls_back_to_the_instance_table() {
        let l = Limiter::new(2, MIN).shared(Arc::new(Down), "r");
        assert!(admit(&l, "c", 0).await.is_ok());
        assert!(admit(&l, "c", 0).await.is_ok());
        assert!(admit(&l, "c", 0).await.is_err());
    }
}
