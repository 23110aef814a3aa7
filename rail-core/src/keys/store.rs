//! The storage primitive under every single-use and idempotency record: [`KeyStore`], its
//! record types, and [`MemoryKeyStore`].
//!
//! Times are the **store's**: a write says "keep this for 24 h" or "lease it for 60 s" and the
//! store turns that into instants on its own clock; a read returns the store's `now` with the
//! record ([`Seen`]), so whoever judges a lease judges it by the same clock that wrote it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::{SharedClock, SystemClock, Timestamp};
use crate::error::{RailError, RailResult};

/// One stored record, as read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRecord {
    /// Random owner token: only the holder may change or remove the record.
    pub token: i64,
    /// A short state name ([`super::RESERVED`], [`super::COMMITTED`], or a record type's own).
    pub state: String,
    /// A digest of the content the key stands for (idempotency), or empty.
    pub fingerprint: Vec<u8>,
    /// A stored value (JSON): a result, or what an in-flight holder wrote ahead.
    pub value: Option<String>,
    /// When the record may be forgotten (its retention ends); `None` = kept until removed.
    /// Records that stand for work in flight have no retention — time alone never frees them —
    /// unless their claimer gave them an end ([`super::ReplayGuard::claim_until`]).
    pub expires_at: Option<Timestamp>,
    /// Until when the holder's lease runs (in-flight records only; renewable). A record whose
    /// lease has lapsed is *stale*: it is recovered, never silently overwritten.
    pub lease_until: Option<Timestamp>,
}

/// A record and the store's time when it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The record.
    pub record: KeyRecord,
    /// The store's clock at the read.
    pub now: Timestamp,
}

impl Seen {
    /// The record is in flight (leased) and its lease has lapsed: its holder is gone or stuck.
    #[must_use]
    pub fn lease_lapsed(&self) -> bool {
        self.record.lease_until.is_some_and(|t| t <= self.now)
    }

    /// How long the current lease still runs (zero when lapsed or not leased).
    #[must_use]
    pub fn lease_left(&self) -> Duration {
        self.record.lease_until.map_or(Duration::ZERO, |t| {
            Duration::from_millis(u64::try_from(t.0.saturating_sub(self.now.0)).unwrap_or(0))
        })
    }
}

/// A record to write. Times are relative; the store anchors them on its own clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    /// The owner token the record will carry.
    pub token: i64,
    /// The state name.
    pub state: String,
    /// Content digest (idempotency), or empty.
    pub fingerprint: Vec<u8>,
    /// Stored value (JSON), if any.
    pub value: Option<String>,
    /// Keep the record this long, then forget it; `None` = until removed.
    pub retain: Option<Duration>,
    /// The holder's lease (in flight); `None` = not leased (finished).
    pub lease: Option<Duration>,
}

impl Write {
    /// A bare in-flight record: `state`, leased for `lease`, no retention.
    #[must_use]
    pub fn leased(token: i64, state: &str, lease: Duration) -> Self {
        Write {
            token,
            state: state.to_owned(),
            fingerprint: Vec::new(),
            value: None,
            retain: None,
            lease: Some(lease),
        }
    }

    /// A bare finished record: `state`, kept for `retain` (`None` = for ever).
    #[must_use]
    pub fn finished(token: i64, state: &str, retain: Option<Duration>) -> Self {
        Write {
            token,
            state: state.to_owned(),
            fingerprint: Vec::new(),
            value: None,
            retain,
            lease: None,
        }
    }

    /// Whether `seen` is what this write left behind (used to read back a lost acknowledgement).
    #[must_use]
    pub fn landed_as(&self, seen: &KeyRecord) -> bool {
        seen.token == self.token
            && seen.state == self.state
            && seen.fingerprint == self.fingerprint
            && seen.value == self.value
    }
}

/// A deferred handle on `store` ([`KeyStore::deferred`]), or `store` itself when its writes are
/// durable when answered: what a caller that syncs before its next effect writes through.
#[must_use]
pub fn deferred(store: &Arc<dyn KeyStore>) -> Arc<dyn KeyStore> {
    store.deferred().unwrap_or_else(|| store.clone())
}

/// Milliseconds of `d` as SQL `BIGINT` (saturating at about 292 million years).
#[must_use]
pub fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// One event counted by [`KeyStore::count`]: the count in its key's current window and how
/// long that window still runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tally {
    /// The events counted in the window, this one included.
    pub count: u64,
    /// How long the window still runs, by the store's clock.
    pub left: Duration,
}

/// The value a counter record holds: its count, or an error for a record of another kind.
fn count_of(record: &KeyRecord, ns: &str, key: &str) -> RailResult<u64> {
    if record.state != super::COUNTED {
        return Err(RailError::Storage(format!(
            "key {ns}/{key} holds a {} record, not a counter",
            record.state
        )));
    }
    record
        .value
        .as_deref()
        .and_then(|v| v.parse::<u64>().ok())
        .ok_or_else(|| RailError::Storage(format!("the counter {ns}/{key} holds no count")))
}

/// Storage for single-use and idempotency records.
///
/// Contract (checked by `keys::suite`, behind the `test-util` feature):
/// - [`KeyStore::insert_if_absent`] is atomic across every client of the same store: of
///   concurrent inserters of one key, exactly one wins.
/// - A record is *present* until its retention ends (`expires_at`), leased or not; a record
///   without retention stays until removed, whatever its lease says. Only a record whose
///   retention ended may be overwritten by an insert.
/// - A record is finished when it has no lease, in flight while it has one: a renewal never
///   gives a finished record a lease again.
/// - [`KeyStore::replace`], [`KeyStore::renew`] and [`KeyStore::remove`] act only when the
///   record's token is the caller's (a compare-and-set).
/// - Times are the store's own clock (for PostgreSQL the database's, unless a clock is
///   injected); reads report that clock's `now`.
#[async_trait]
pub trait KeyStore: Send + Sync + fmt::Debug {
    /// Inserts `rec` under `(ns, key)` unless a present record is there.
    /// Returns `None` when inserted, or the record that prevented it.
    async fn insert_if_absent(&self, ns: &str, key: &str, rec: &Write) -> RailResult<Option<Seen>>;

    /// Replaces the record whose token is `token` with `rec`; `false` if it is gone or owned by
    /// another.
    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool>;

    /// Replaces the record whose token is `token` with `rec` only if its lease has lapsed (a
    /// recoverer's takeover: a holder that renewed in time keeps its key); `false` otherwise.
    async fn take_over(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool>;

    /// Extends the lease of the in-flight record whose token is `token` to `now + lease`;
    /// `false` if it is gone, owned by another, or finished (a finished record is never leased
    /// again, even by a renewal that arrives late).
    async fn renew(&self, ns: &str, key: &str, token: i64, lease: Duration) -> RailResult<bool>;

    /// Removes the record whose token is `token`; `false` if it is gone or owned by another.
    async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool>;

    /// The record, if present.
    async fn get(&self, ns: &str, key: &str) -> RailResult<Option<Seen>>;

    /// Deletes records whose retention ended (a record in flight with an end, too); returns how
    /// many. Never touches a record without retention, however old its lease.
    async fn purge_expired(&self) -> RailResult<u64>;

    /// The store's clock (for PostgreSQL the database's, unless a clock is injected).
    async fn now(&self) -> RailResult<Timestamp>;

    /// A handle on this store whose writes are answered once applied, before they are durable,
    /// and whose [`KeyStore::sync`] makes them durable. Every client of the store sees such a
    /// write at once and a crash of this process keeps it; a power loss (or a crash of the
    /// host) may undo it until the handle's `sync`, or a durable write of the same store made
    /// after it, has returned. For records that nothing outside the store acts on before then:
    /// sync before money moves or an answer leaves on the strength of them.
    ///
    /// Each call gives a new handle, whose `sync` waits only for its own writes. `None` (the
    /// default): every write is durable when answered, and there is nothing to defer.
    fn deferred(&self) -> Option<Arc<dyn KeyStore>> {
        None
    }

    /// The SQLite file whose commits this store's writes join, if it lives in one: a durable
    /// write of another store in the same file (a journal's) makes the deferred writes made
    /// before it durable. `None` (the default): it shares commits with nothing else.
    fn file(&self) -> Option<&std::path::Path> {
        None
    }

    /// Makes every write answered through this handle durable. Nothing to do (the default) for
    /// a handle whose writes are durable when answered.
    ///
    /// # Errors
    /// [`RailError::Storage`] if they cannot be made durable (the store has then stopped
    /// acknowledging writes).
    async fn sync(&self) -> RailResult<()> {
        Ok(())
    }

    /// Counts one event under `(ns, key)`, atomically across every client of the store (of
    /// concurrent counters of one key, each gets a count of its own): the count in the key's
    /// current window, this event included, and how long the window still runs.
    ///
    /// A key's window opens at its first event (count 1) and lasts `window` by the store's
    /// clock; the first event after it ends opens the next. The counter is a record of state
    /// [`super::COUNTED`] whose value is the count and whose retention ends with the window,
    /// so [`KeyStore::purge_expired`] forgets it and the next window overwrites it. `ns` holds
    /// counters only.
    ///
    /// The SQL and memory stores count in one statement (`INSERT … ON CONFLICT DO UPDATE SET
    /// value = value + 1 … RETURNING`). This default, for stores written elsewhere, reads and
    /// then compare-and-sets, trying again when another counter got there first.
    ///
    /// # Errors
    /// [`RailError::Storage`] if the store fails, if `(ns, key)` holds a record that is not a
    /// counter, or if the counter kept changing under contention.
    async fn count(&self, ns: &str, key: &str, window: Duration) -> RailResult<Tally> {
        for _ in 0..COUNT_ATTEMPTS {
            match self.get(ns, key).await? {
                None => {
                    let first = counter(1, window);
                    if self.insert_if_absent(ns, key, &first).await?.is_none() {
                        return Ok(Tally {
                            count: 1,
                            left: window,
                        });
                    }
                }
                Some(seen) => {
                    let count = count_of(&seen.record, ns, key)?.saturating_add(1);
                    let left = seen.record.expires_at.map_or(Duration::ZERO, |t| {
                        Duration::from_millis(
                            u64::try_from(t.0.saturating_sub(seen.now.0)).unwrap_or(0),
                        )
                    });
                    let next = counter(count, left);
                    if self.replace(ns, key, seen.record.token, &next).await? {
                        return Ok(Tally { count, left });
                    }
                }
            }
        }
        Err(RailError::Storage(format!(
            "the counter {ns}/{key} kept changing under contention"
        )))
    }
}

/// How many times [`KeyStore::count`]'s default reads and compare-and-sets before giving up.
const COUNT_ATTEMPTS: usize = 16;

/// A counter record holding `count`, kept `left`.
fn counter(count: u64, left: Duration) -> Write {
    Write {
        token: super::new_token(),
        state: super::COUNTED.to_owned(),
        fingerprint: Vec::new(),
        value: Some(count.to_string()),
        retain: Some(left),
        lease: None,
    }
}

/// A [`KeyStore`] in process memory (one process; lost on restart). Its clock is the system's
/// unless one is injected ([`MemoryKeyStore::with_clock`]).
#[derive(Debug)]
pub struct MemoryKeyStore {
    map: Mutex<HashMap<(String, String), KeyRecord>>,
    clock: SharedClock,
}

impl Default for MemoryKeyStore {
    fn default() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }
}

impl MemoryKeyStore {
    /// An empty store judging time by `clock`.
    #[must_use]
    pub fn with_clock(clock: SharedClock) -> Self {
        MemoryKeyStore {
            map: Mutex::new(HashMap::new()),
            clock,
        }
    }

    fn lock(&self) -> RailResult<std::sync::MutexGuard<'_, HashMap<(String, String), KeyRecord>>> {
        self.map
            .lock()
            .map_err(|_| RailError::Storage("memory key store lock poisoned".into()))
    }
}

/// The stored form of `w` written at `now`.
#[must_use]
pub fn anchored(w: &Write, now: Timestamp) -> KeyRecord {
    KeyRecord {
        token: w.token,
        state: w.state.clone(),
        fingerprint: w.fingerprint.clone(),
        value: w.value.clone(),
        expires_at: w.retain.map(|d| now.plus(d)),
        lease_until: w.lease.map(|d| now.plus(d)),
    }
}

fn present(r: &KeyRecord, now: Timestamp) -> bool {
    r.expires_at.is_none_or(|t| t > now)
}

#[async_trait]
impl KeyStore for MemoryKeyStore {
    async fn insert_if_absent(&self, ns: &str, key: &str, rec: &Write) -> RailResult<Option<Seen>> {
        let now = self.clock.now();
        let mut map = self.lock()?;
        let k = (ns.to_owned(), key.to_owned());
        match map.get(&k) {
            Some(existing) if present(existing, now) => Ok(Some(Seen {
                record: existing.clone(),
                now,
            })),
            _ => {
                map.insert(k, anchored(rec, now));
                Ok(None)
            }
        }
    }

    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        let now = self.clock.now();
        let mut map = self.lock()?;
        match map.get_mut(&(ns.to_owned(), key.to_owned())) {
            Some(existing) if existing.token == token => {
                *existing = anchored(rec, now);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn take_over(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        let now = self.clock.now();
        let mut map = self.lock()?;
        match map.get_mut(&(ns.to_owned(), key.to_owned())) {
            Some(existing)
                if existing.token == token && existing.lease_until.is_some_and(|t| t <= now) =>
            {
                *existing = anchored(rec, now);
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    async fn renew(&self, ns: &str, key: &str, token: i64, lease: Duration) -> RailResult<bool> {
        let now = self.clock.now();
        let mut map = self.lock()?;
        match map.get_mut(&(ns.to_owned(), key.to_owned())) {
            Some(existing) if existing.token == token && existing.lease_until.is_some() => {
                existing.lease_until = Some(now.plus(lease));
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

    async fn get(&self, ns: &str, key: &str) -> RailResult<Option<Seen>> {
        let now = self.clock.now();
        let map = self.lock()?;
        Ok(map
            .get(&(ns.to_owned(), key.to_owned()))
            .filter(|r| present(r, now))
            .map(|r| Seen {
                record: r.clone(),
                now,
            }))
    }

    async fn now(&self) -> RailResult<Timestamp> {
        Ok(self.clock.now())
    }

    async fn purge_expired(&self) -> RailResult<u64> {
        let now = self.clock.now();
        let mut map = self.lock()?;
        let before = map.len();
        map.retain(|_, r| present(r, now));
        Ok(u64::try_from(before - map.len()).unwrap_or(u64::MAX))
    }

    async fn count(&self, ns: &str, key: &str, window: Duration) -> RailResult<Tally> {
        let now = self.clock.now();
        let mut map = self.lock()?;
        let k = (ns.to_owned(), key.to_owned());
        if let Some(existing) = map.get_mut(&k)
            && present(existing, now)
        {
            let count = count_of(existing, ns, key)?.saturating_add(1);
            let Some(end) = existing.expires_at else {
                return Err(RailError::Storage(format!(
                    "the counter {ns}/{key} has no window"
                )));
            };
            existing.value = Some(count.to_string());
            return Ok(Tally {
                count,
                left: Duration::from_millis(
                    u64::try_from(end.0.saturating_sub(now.0)).unwrap_or(0),
                ),
            });
        }
        map.insert(k, anchored(&counter(1, window), now));
        Ok(Tally {
            count: 1,
            left: window,
        })
    }
}
