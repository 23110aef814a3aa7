//! Single-use keys: the [`ReplayGuard`] (quote ids, paymentIds, nonces, payment hashes) and
//! operation-id [`Idempotency`], both on one small storage trait, [`KeyStore`].
//!
//! The store has one primitive that matters: **insert if absent (or expired)**, atomic across
//! every process that shares the store. [`MemoryKeyStore`] serves one process; the SQLite and
//! PostgreSQL stores (features `sqlite`, `postgres`) serve several, and two processes sharing one
//! PostgreSQL never both win a key (a primary key plus `INSERT … ON CONFLICT DO UPDATE … WHERE
//! expired`, which PostgreSQL executes atomically per row).
//!
//! Expiry is judged by the caller's [`crate::Clock`] (injectable for tests): hosts sharing a store
//! must keep their clocks in sync (NTP), and reservations and retention should be much longer
//! than any plausible skew. An [`Idempotency`] lease (60 s by default) must outlast the
//! operation it guards; after it lapses another caller may run the operation again.
//!
//! Settlement follows reserve → settle → commit, never settle-then-check:
//!
//! ```
//! # async fn demo() -> rail_core::RailResult<()> {
//! use rail_core::keys::{MemoryKeyStore, ReplayGuard};
//! use rail_core::clock::SystemClock;
//! use std::{sync::Arc, time::Duration};
//! let guard = ReplayGuard::new(Arc::new(MemoryKeyStore::default()), Arc::new(SystemClock), "quotes");
//! let r = guard.reserve("q_123", Duration::from_secs(60)).await?;   // only one caller gets here
//! // ... settle on the rail ...
//! r.commit(None).await?;                                            // used for good
//! assert!(guard.reserve("q_123", Duration::from_secs(60)).await.is_err());
//! # Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(demo()).unwrap();
//! ```

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::clock::{SharedClock, Timestamp};
use crate::error::{RailError, RailResult};
use crate::types::OpId;

/// State name of a reserved key (in flight).
pub const RESERVED: &str = "reserved";
/// State name of a committed key (used for good, or an operation's stored result).
pub const COMMITTED: &str = "committed";

/// One stored key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    /// Random owner token: only the holder may change or remove the record.
    pub token: i64,
    /// A short state name ([`RESERVED`], [`COMMITTED`], or a rail's own).
    pub state: String,
    /// A digest of the content the key stands for (idempotency), or empty.
    pub fingerprint: Vec<u8>,
    /// A stored result (JSON), if any.
    pub value: Option<String>,
    /// When the record lapses; `None` = never.
    pub expires_at: Option<Timestamp>,
}

impl KeyRecord {
    /// A record that only marks a key (no fingerprint, no stored value): the replay guard's.
    fn marker(token: i64, state: &str, expires_at: Option<Timestamp>) -> Self {
        KeyRecord {
            token,
            state: state.to_owned(),
            fingerprint: Vec::new(),
            value: None,
            expires_at,
        }
    }

    fn live_at(&self, now: Timestamp) -> bool {
        self.expires_at.is_none_or(|t| t > now)
    }
}

/// Storage for single-use keys. Implementations must make [`KeyStore::insert_if_absent`]
/// atomic across every client of the same store.
#[async_trait]
pub trait KeyStore: Send + Sync + fmt::Debug {
    /// Inserts `rec` under `(ns, key)` unless a record is there and still live at `now`.
    /// Returns `None` when inserted, or the live record that prevented it.
    async fn insert_if_absent(
        &self,
        ns: &str,
        key: &str,
        rec: &KeyRecord,
        now: Timestamp,
    ) -> RailResult<Option<KeyRecord>>;

    /// Replaces the record whose token is `token`; `false` if it is gone or owned by another.
    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &KeyRecord) -> RailResult<bool>;

    /// Removes the record whose token is `token`; `false` if it is gone or owned by another.
    async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool>;

    /// The record, if present and live at `now`.
    async fn get(&self, ns: &str, key: &str, now: Timestamp) -> RailResult<Option<KeyRecord>>;

    /// Deletes records that lapsed before `now`; returns how many.
    async fn purge_expired(&self, now: Timestamp) -> RailResult<u64>;
}

/// A [`KeyStore`] in process memory (one process; lost on restart).
#[derive(Debug, Default)]
pub struct MemoryKeyStore {
    map: Mutex<HashMap<(String, String), KeyRecord>>,
}

impl MemoryKeyStore {
    fn lock(&self) -> RailResult<std::sync::MutexGuard<'_, HashMap<(String, String), KeyRecord>>> {
        self.map
            .lock()
            .map_err(|_| RailError::Storage("memory key store lock poisoned".into()))
    }
}

#[async_trait]
impl KeyStore for MemoryKeyStore {
    async fn insert_if_absent(
        &self,
        ns: &str,
        key: &str,
        rec: &KeyRecord,
        now: Timestamp,
    ) -> RailResult<Option<KeyRecord>> {
        let mut map = self.lock()?;
        let k = (ns.to_owned(), key.to_owned());
        match map.get(&k) {
            Some(existing) if existing.live_at(now) => Ok(Some(existing.clone())),
            _ => {
                map.insert(k, rec.clone());
                Ok(None)
            }
        }
    }

    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &KeyRecord) -> RailResult<bool> {
        let mut map = self.lock()?;
        match map.get_mut(&(ns.to_owned(), key.to_owned())) {
            Some(existing) if existing.token == token => {
                *existing = rec.clone();
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
        let mut map = self.lock()?;
        let k = (ns.to_owned(), key.to_owned());
        if map.get(&k).is_some_and(|r| r.token == token) {
            map.remove(&k);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    async fn get(&self, ns: &str, key: &str, now: Timestamp) -> RailResult<Option<KeyRecord>> {
        let map = self.lock()?;
        Ok(map
            .get(&(ns.to_owned(), key.to_owned()))
            .filter(|r| r.live_at(now))
            .cloned())
    }

    async fn purge_expired(&self, now: Timestamp) -> RailResult<u64> {
        let mut map = self.lock()?;
        let before = map.len();
        map.retain(|_, r| r.live_at(now));
        Ok(u64::try_from(before - map.len()).unwrap_or(u64::MAX))
    }
}

fn new_token() -> i64 {
    rand::random::<i64>()
}

/// Single-use keys with expiry: reserve → commit, or release.
#[derive(Clone, Debug)]
pub struct ReplayGuard {
    store: Arc<dyn KeyStore>,
    clock: SharedClock,
    ns: String,
}

impl ReplayGuard {
    /// A guard over `store` whose keys live in namespace `ns` (one per kind of key).
    pub fn new(store: Arc<dyn KeyStore>, clock: SharedClock, ns: impl Into<String>) -> Self {
        ReplayGuard {
            store,
            clock,
            ns: ns.into(),
        }
    }

    /// Marks `key` used, if it is not already. `retain` bounds how long the mark is kept
    /// (`None` = forever; keep it at least as long as the thing it protects is valid).
    /// Returns `true` if this call won the key.
    ///
    /// # Errors
    /// [`RailError::Storage`] if the store fails.
    pub async fn insert_if_absent(&self, key: &str, retain: Option<Duration>) -> RailResult<bool> {
        let now = self.clock.now();
        let rec = KeyRecord::marker(new_token(), COMMITTED, retain.map(|d| now.plus(d)));
        Ok(self
            .store
            .insert_if_absent(&self.ns, key, &rec, now)
            .await?
            .is_none())
    }

    /// Reserves `key` for `ttl`. A reservation neither committed nor released lapses after
    /// `ttl` (a crashed holder does not block the key for ever).
    ///
    /// # Errors
    /// [`RailError::Replayed`] if the key is reserved or used.
    pub async fn reserve(&self, key: &str, ttl: Duration) -> RailResult<Reservation> {
        let now = self.clock.now();
        let rec = KeyRecord::marker(new_token(), RESERVED, Some(now.plus(ttl)));
        match self
            .store
            .insert_if_absent(&self.ns, key, &rec, now)
            .await?
        {
            None => Ok(Reservation {
                guard: self.clone(),
                key: key.to_owned(),
                token: rec.token,
            }),
            Some(_) => Err(RailError::Replayed {
                key: key.to_owned(),
            }),
        }
    }

    /// The state of `key` (`reserved`, `committed`, …) if it is live.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn state(&self, key: &str) -> RailResult<Option<String>> {
        Ok(self
            .store
            .get(&self.ns, key, self.clock.now())
            .await?
            .map(|r| r.state))
    }
}

/// A reserved key; [`Reservation::commit`] or [`Reservation::release`] it.
#[derive(Debug)]
#[must_use = "a reservation must be committed or released"]
pub struct Reservation {
    guard: ReplayGuard,
    key: String,
    token: i64,
}

impl Reservation {
    /// The reserved key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Moves the reservation to a named state (for multi-step lifecycles such as
    /// issued → pending → settled), keeping ownership.
    ///
    /// # Errors
    /// [`RailError::Replayed`] if the reservation lapsed and another caller took the key.
    pub async fn set_state(&self, state: &str, retain: Option<Duration>) -> RailResult<()> {
        let now = self.guard.clock.now();
        let rec = KeyRecord::marker(self.token, state, retain.map(|d| now.plus(d)));
        if self
            .guard
            .store
            .replace(&self.guard.ns, &self.key, self.token, &rec)
            .await?
        {
            Ok(())
        } else {
            Err(RailError::Replayed {
                key: self.key.clone(),
            })
        }
    }

    /// Marks the key used for good (`retain`: how long to remember; `None` = forever).
    ///
    /// # Errors
    /// [`RailError::Replayed`] if the reservation lapsed and another caller took the key.
    pub async fn commit(self, retain: Option<Duration>) -> RailResult<()> {
        self.set_state(COMMITTED, retain).await
    }

    /// Frees the key (nothing was spent).
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn release(self) -> RailResult<()> {
        self.guard
            .store
            .remove(&self.guard.ns, &self.key, self.token)
            .await?;
        Ok(())
    }
}

/// SHA-256 of the canonical JSON of `content` (object keys sorted): the fingerprint that
/// tells "same operation again" from "same id, different content".
///
/// # Errors
/// [`RailError::InvalidInput`] if `content` does not serialize.
pub fn fingerprint<T: Serialize + ?Sized>(content: &T) -> RailResult<[u8; 32]> {
    // `serde_json::Value` keeps object keys in a BTreeMap (no `preserve_order`), so this is canonical.
    let value = serde_json::to_value(content)
        .map_err(|e| RailError::InvalidInput(format!("cannot fingerprint: {e}")))?;
    let bytes = serde_json::to_vec(&value)
        .map_err(|e| RailError::InvalidInput(format!("cannot fingerprint: {e}")))?;
    Ok(Sha256::digest(&bytes).into())
}

/// What [`Idempotency::begin`] found.
#[derive(Debug)]
pub enum Begin<T> {
    /// First time: do the work, then [`Idempotency::finish`] (or [`Idempotency::abandon`]).
    Fresh(Lease),
    /// Done before with the same content: here is the first result.
    Replay(T),
}

/// The right to run one operation, held by one caller at a time.
#[derive(Debug)]
#[must_use = "finish or abandon the lease"]
pub struct Lease {
    op: String,
    token: i64,
    fingerprint: Vec<u8>,
}

/// Operation-id idempotency: same id + same content → the first result; same id + different
/// content → [`RailError::IdempotencyConflict`]; same id while the first call still runs →
/// [`RailError::InProgress`] (retryable).
#[derive(Clone, Debug)]
pub struct Idempotency {
    store: Arc<dyn KeyStore>,
    clock: SharedClock,
    ns: String,
    lease: Duration,
    retain: Duration,
}

impl Idempotency {
    /// Idempotency records in namespace `ns`: a running operation holds its id for 60 s, a
    /// finished one is remembered for 24 hours (Stripe's window).
    pub fn new(store: Arc<dyn KeyStore>, clock: SharedClock, ns: impl Into<String>) -> Self {
        Idempotency {
            store,
            clock,
            ns: ns.into(),
            lease: Duration::from_secs(60),
            retain: Duration::from_secs(24 * 3600),
        }
    }

    /// Sets how long a running operation holds its id and how long results are kept.
    #[must_use]
    pub fn with_windows(mut self, lease: Duration, retain: Duration) -> Self {
        self.lease = lease;
        self.retain = retain;
        self
    }

    /// Starts operation `op` whose content has fingerprint `fp` (see [`fingerprint`]).
    ///
    /// # Errors
    /// [`RailError::IdempotencyConflict`], [`RailError::InProgress`], [`RailError::Storage`].
    pub async fn begin<T: DeserializeOwned>(&self, op: &OpId, fp: &[u8]) -> RailResult<Begin<T>> {
        let now = self.clock.now();
        let rec = KeyRecord {
            token: new_token(),
            state: RESERVED.into(),
            fingerprint: fp.to_vec(),
            value: None,
            expires_at: Some(now.plus(self.lease)),
        };
        let Some(existing) = self
            .store
            .insert_if_absent(&self.ns, op.as_str(), &rec, now)
            .await?
        else {
            return Ok(Begin::Fresh(Lease {
                op: op.as_str().to_owned(),
                token: rec.token,
                fingerprint: fp.to_vec(),
            }));
        };
        let same: bool = existing.fingerprint.ct_eq(fp).into();
        if !same {
            return Err(RailError::IdempotencyConflict {
                op_id: op.to_string(),
            });
        }
        match (existing.state.as_str(), existing.value) {
            (COMMITTED, Some(v)) => serde_json::from_str(&v)
                .map(Begin::Replay)
                .map_err(|e| RailError::Storage(format!("stored result for {op}: {e}"))),
            _ => Err(RailError::InProgress {
                op_id: op.to_string(),
            }),
        }
    }

    /// Stores the result of a fresh operation.
    ///
    /// # Errors
    /// [`RailError::Storage`]; [`RailError::InProgress`] if the lease lapsed and another caller
    /// took the id.
    pub async fn finish<T: Serialize>(&self, lease: Lease, result: &T) -> RailResult<()> {
        let value = serde_json::to_string(result)
            .map_err(|e| RailError::Storage(format!("cannot store result: {e}")))?;
        let rec = KeyRecord {
            token: lease.token,
            state: COMMITTED.into(),
            fingerprint: lease.fingerprint,
            value: Some(value),
            expires_at: Some(self.clock.now().plus(self.retain)),
        };
        if self
            .store
            .replace(&self.ns, &lease.op, lease.token, &rec)
            .await?
        {
            Ok(())
        } else {
            Err(RailError::InProgress { op_id: lease.op })
        }
    }

    /// Gives the id back without a result, so a retry runs the operation again.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn abandon(&self, lease: Lease) -> RailResult<()> {
        self.store.remove(&self.ns, &lease.op, lease.token).await?;
        Ok(())
    }

    /// Runs `work` at most once per (`op`, content): a repeat returns the stored result.
    /// A failed `work` stores nothing, so the same id may be retried.
    ///
    /// # Errors
    /// Those of [`Idempotency::begin`], or `work`'s.
    pub async fn run<C, T, F, Fut>(&self, op: &OpId, content: &C, work: F) -> RailResult<T>
    where
        C: Serialize + ?Sized + Sync,
        T: Serialize + DeserializeOwned + Send,
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = RailResult<T>> + Send,
    {
        let fp = fingerprint(content)?;
        match self.begin::<T>(op, &fp).await? {
            Begin::Replay(t) => Ok(t),
            Begin::Fresh(lease) => match work().await {
                Ok(t) => {
                    self.finish(lease, &t).await?;
                    Ok(t)
                }
                Err(e) => {
                    // The work's error is the answer; a failed abandon only delays a retry
                    // until the lease lapses.
                    if let Err(abandon) = self.abandon(lease).await {
                        tracing::warn!(op = %op, error = %abandon, "could not abandon an idempotency lease");
                    }
                    Err(e)
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn setup() -> (Arc<dyn KeyStore>, ManualClock) {
        (
            Arc::new(MemoryKeyStore::default()),
            ManualClock::at(Timestamp(1_000_000)),
        )
    }

    #[tokio::test]
    async fn memory_store_passes_the_key_store_suite() {
        let (store, clock) = setup();
        crate::keys::suite::run_all(store, clock).await;
    }

    #[tokio::test]
    async fn idempotency_runs_once() {
        let (store, clock) = setup();
        let idem = Idempotency::new(store, Arc::new(clock), "ops");
        let op = OpId::new("op-1").unwrap();
        let calls = std::sync::atomic::AtomicU32::new(0);
        for _ in 0..3 {
            let r: u32 = idem
                .run(&op, "pay 5", || async {
                    Ok(calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 41)
                })
                .await
                .unwrap();
            assert_eq!(r, 41);
        }
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        let err = idem
            .run(&op, "pay 6", || async { Ok(0u32) })
            .await
            .unwrap_err();
        assert_eq!(err.code(), "idempotency_conflict");
    }
}

/// A behaviour suite every [`KeyStore`] implementation must pass (run by this crate's tests for
/// the memory store and by the SQL stores' tests against real SQLite and PostgreSQL).
#[doc(hidden)]
pub mod suite {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    /// Runs every key-store behaviour; panics on the first failure.
    ///
    /// # Panics
    /// When a behaviour fails.
    #[allow(clippy::unwrap_used, clippy::expect_used, clippy::missing_panics_doc)]
    pub async fn run_all(store: Arc<dyn KeyStore>, clock: ManualClock) {
        let ns = format!("suite-{}", rand::random::<u64>());
        let shared: SharedClock = Arc::new(clock.clone());
        let guard = ReplayGuard::new(store.clone(), shared.clone(), ns.clone());

        // reserve → second reserve refused → release → reserve again → commit → refused
        let r = guard.reserve("k1", Duration::from_secs(10)).await.unwrap();
        assert_eq!(r.key(), "k1");
        assert!(matches!(
            guard.reserve("k1", Duration::from_secs(10)).await,
            Err(RailError::Replayed { .. })
        ));
        assert_eq!(guard.state("k1").await.unwrap().as_deref(), Some(RESERVED));
        r.release().await.unwrap();
        assert_eq!(guard.state("k1").await.unwrap(), None);
        let r = guard.reserve("k1", Duration::from_secs(10)).await.unwrap();
        r.commit(None).await.unwrap();
        clock.advance(Duration::from_secs(3600));
        assert!(guard.reserve("k1", Duration::from_secs(10)).await.is_err());
        assert_eq!(guard.state("k1").await.unwrap().as_deref(), Some(COMMITTED));

        // an abandoned reservation lapses after its ttl; the late holder cannot commit
        let stale = guard.reserve("k2", Duration::from_secs(5)).await.unwrap();
        clock.advance(Duration::from_secs(6));
        let fresh = guard.reserve("k2", Duration::from_secs(5)).await.unwrap();
        assert!(matches!(
            stale.commit(None).await,
            Err(RailError::Replayed { .. })
        ));
        fresh.commit(Some(Duration::from_secs(60))).await.unwrap();
        clock.advance(Duration::from_secs(61));
        assert!(
            guard.insert_if_absent("k2", None).await.unwrap(),
            "retention lapsed"
        );
        assert!(!guard.insert_if_absent("k2", None).await.unwrap());

        // insert_if_absent under contention: exactly one winner
        let mut tasks = Vec::new();
        for _ in 0..16 {
            let g = guard.clone();
            tasks.push(tokio::spawn(async move {
                g.insert_if_absent("hot", None).await.unwrap()
            }));
        }
        let mut wins = 0;
        for t in tasks {
            if t.await.unwrap() {
                wins += 1;
            }
        }
        assert_eq!(wins, 1, "exactly one concurrent insert wins");

        // idempotency: fresh → finish → replay; conflict on different content; in progress
        let idem = Idempotency::new(store.clone(), shared.clone(), format!("{ns}-ops"));
        let op = OpId::new("op-a").unwrap();
        let Begin::Fresh(lease) = idem.begin::<String>(&op, b"one").await.unwrap() else {
            panic!("first begin must be fresh")
        };
        assert!(matches!(
            idem.begin::<String>(&op, b"one").await,
            Err(RailError::InProgress { .. })
        ));
        idem.finish(lease, &"result".to_owned()).await.unwrap();
        match idem.begin::<String>(&op, b"one").await.unwrap() {
            Begin::Replay(v) => assert_eq!(v, "result"),
            Begin::Fresh(_) => panic!("must replay"),
        }
        assert!(matches!(
            idem.begin::<String>(&op, b"two").await,
            Err(RailError::IdempotencyConflict { .. })
        ));
        let op2 = OpId::new("op-b").unwrap();
        let Begin::Fresh(lease) = idem.begin::<String>(&op2, b"x").await.unwrap() else {
            panic!("fresh")
        };
        idem.abandon(lease).await.unwrap();
        assert!(matches!(
            idem.begin::<String>(&op2, b"x").await.unwrap(),
            Begin::Fresh(_)
        ));

        // purge drops lapsed records only
        clock.advance(Duration::from_secs(48 * 3600));
        let purged = store.purge_expired(clock.now()).await.unwrap();
        assert!(purged >= 1);
        assert_eq!(guard.state("k1").await.unwrap().as_deref(), Some(COMMITTED));
    }
}
