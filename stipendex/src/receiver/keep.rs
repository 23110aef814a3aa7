//! The bound on what one receiver instance keeps for lost-answer replays
//! (`docs/stipendex-profile.md` §3 and §4b).
//!
//! Every answer this instance writes for a replay — a Proof's answer record
//! ([`super::answers`]) or a tab lane's last answer ([`super::tab`]) — is counted here by the
//! bytes of the value written, from the moment room is made for it until it is dropped. A tab's
//! answer waiting for its write (it rides on the tab's next write) is counted from the moment
//! it is given, so what waits in memory is within the bound too.
//!
//! **The bound** ([`KeepBounds`]): at most `bytes` of kept answers and at most `entries` of
//! them at once, per instance (default [`DEFAULT_KEEP_BYTES`], 64 MiB, and
//! [`DEFAULT_KEEP_ENTRIES`], 65 536). With the default store (memory) that is the memory kept
//! answers take; with a shared store (SQLite, PostgreSQL) it is what this instance leaves there
//! — instances sharing a store each keep within their own bound, and what an instance wrote
//! before a restart goes with its retention.
//!
//! **The policy: oldest first.** Before an answer is written, room is made for it:
//! 1. kept answers whose retention has ended are removed first;
//! 2. for bytes, the oldest answer that still has its body: a Proof's record loses its body and
//!    keeps the rest (the request it answered, its status and Receipt: about 1 KiB), so the
//!    same Proof again is told `answer_gone` with its Receipt; a tab lane's answer is removed
//!    (the same voucher again is refused `answer_gone`); when no answer with a body is left,
//!    the oldest record without one is removed (the same Proof again is `answer_gone` without
//!    its Receipt);
//! 3. for entries, the oldest record without a body is removed, else the oldest answer.
//!
//! An answer that cannot fit at all (larger than the bound, or with the bound taken by answers
//! still waiting for their writes) is not kept: a Proof then keeps its record without the
//! body, a lane keeps nothing. Nothing is ever run twice or charged again for it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rail_core::keys::Write;
use rail_core::{KeyStore, SharedClock};

/// The default most bytes of kept answers per receiver instance: 64 MiB.
pub const DEFAULT_KEEP_BYTES: u64 = 64 * 1024 * 1024;

/// The default most kept answers per receiver instance: 65 536.
pub const DEFAULT_KEEP_ENTRIES: usize = 65_536;

/// How much one receiver instance keeps for lost-answer replays
/// ([`super::Builder::kept_answers`]); past it the oldest kept answers are dropped first (the
/// module's policy, `docs/stipendex-profile.md` §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeepBounds {
    /// The most bytes of kept answers at once (the values written: body, Receipt, request).
    pub bytes: u64,
    /// The most kept answers at once (records without their body included).
    pub entries: usize,
}

impl Default for KeepBounds {
    fn default() -> Self {
        KeepBounds {
            bytes: DEFAULT_KEEP_BYTES,
            entries: DEFAULT_KEEP_ENTRIES,
        }
    }
}

/// Where a kept answer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Space {
    /// A Proof's answer record (namespace `stipendex/<who>/answers`).
    Proof,
    /// A tab lane's last answer (namespace `stipendex/<who>/tabs`).
    Lane,
}

/// One kept answer this instance wrote.
#[derive(Clone, Debug)]
struct Entry {
    space: Space,
    key: String,
    token: i64,
    cost: u64,
    /// When its retention ends (Unix seconds, by the receiver's clock).
    until: u64,
    /// Its bytes once its body is dropped, for a Proof's record that keeps the rest.
    strip_to: Option<u64>,
}

/// The kept answers, in the order they were kept.
#[derive(Debug, Default)]
struct State {
    next: u64,
    /// Answers with their bodies, oldest first.
    bodies: BTreeMap<u64, Entry>,
    /// Proof records whose body was dropped, oldest first.
    bare: BTreeMap<u64, Entry>,
    by_key: HashMap<(Space, String), u64>,
    /// Bytes of the entries above.
    bytes: u64,
    /// Bytes made room for and not yet written (or waiting for their write).
    reserved: u64,
    reservations: usize,
}

impl State {
    fn over_bytes(&self, bounds: KeepBounds) -> bool {
        self.bytes.saturating_add(self.reserved) > bounds.bytes
    }

    fn over_entries(&self, bounds: KeepBounds) -> bool {
        self.bodies
            .len()
            .saturating_add(self.bare.len())
            .saturating_add(self.reservations)
            > bounds.entries
    }

    fn take(&mut self, n: u64) -> Option<Entry> {
        let e = self.bodies.remove(&n).or_else(|| self.bare.remove(&n))?;
        self.by_key.remove(&(e.space, e.key.clone()));
        self.bytes = self.bytes.saturating_sub(e.cost);
        Some(e)
    }

    fn insert(&mut self, n: u64, e: Entry, body: bool) {
        if let Some(old) = self.by_key.get(&(e.space, e.key.clone())).copied() {
            // The same key written again (a lane's next answer): the old value is gone.
            self.take(old);
        }
        self.by_key.insert((e.space, e.key.clone()), n);
        self.bytes = self.bytes.saturating_add(e.cost);
        if body {
            self.bodies.insert(n, e);
        } else {
            self.bare.insert(n, e);
        }
    }

    /// What to drop, by the policy, for the state to be within `bounds`: (its age, the entry,
    /// whether to drop its body only). An entry losing its body is counted at once as it will
    /// be without it (at the same age, until [`State::stripped`] says how it went).
    fn victims(&mut self, bounds: KeepBounds, now: u64) -> Vec<(u64, Entry, bool)> {
        let mut out = Vec::new();
        for body in [true, false] {
            loop {
                let map = if body { &self.bodies } else { &self.bare };
                let Some((&n, e)) = map.first_key_value() else {
                    break;
                };
                if e.until > now {
                    break;
                }
                if let Some(e) = self.take(n) {
                    out.push((n, e, false));
                }
            }
        }
        loop {
            let oldest_body = self.bodies.keys().next().copied();
            let oldest_bare = self.bare.keys().next().copied();
            let for_entries = self.over_entries(bounds);
            let n = if for_entries {
                match oldest_bare.or(oldest_body) {
                    Some(n) => n,
                    None => break,
                }
            } else if self.over_bytes(bounds) {
                match oldest_body.or(oldest_bare) {
                    Some(n) => n,
                    None => break,
                }
            } else {
                break;
            };
            let Some(e) = self.take(n) else { break };
            let strip = !for_entries && e.strip_to.is_some_and(|b| b < e.cost);
            if let (true, Some(bare)) = (strip, e.strip_to) {
                self.insert(
                    n,
                    Entry {
                        cost: bare,
                        strip_to: None,
                        ..e.clone()
                    },
                    false,
                );
            }
            out.push((n, e, strip));
        }
        out
    }

    /// How dropping the body of entry `n` (under `key`) went: its new token and bytes, or
    /// `None` (it is not in the store as this instance wrote it: not counted any more).
    fn stripped(&mut self, n: u64, space: Space, key: &str, done: Option<(i64, u64)>) {
        if self.by_key.get(&(space, key.to_owned())) != Some(&n) {
            return;
        }
        match done {
            Some((token, cost)) => {
                if let Some(e) = self.bare.get_mut(&n) {
                    self.bytes = self.bytes.saturating_sub(e.cost).saturating_add(cost);
                    e.token = token;
                    e.cost = cost;
                }
            }
            None => {
                self.take(n);
            }
        }
    }
}

/// This instance's kept answers and their bound.
#[derive(Debug)]
pub(crate) struct Keep {
    store: Arc<dyn KeyStore>,
    answers_ns: String,
    tabs_ns: String,
    bounds: KeepBounds,
    clock: SharedClock,
    state: Mutex<State>,
}

/// Room made for one answer: counted until it is written ([`Reserved::kept`]) or dropped.
#[derive(Debug)]
pub(crate) struct Reserved {
    keep: Arc<Keep>,
    cost: u64,
    done: bool,
}

impl Reserved {
    /// The answer was written under `key` with `token`, kept until `until` (Unix seconds):
    /// with its body (`body`), and, for a Proof's record, `strip_to`: its bytes once its body
    /// is dropped.
    pub(crate) fn kept(
        mut self,
        space: Space,
        key: &str,
        token: i64,
        until: u64,
        body: bool,
        strip_to: Option<u64>,
    ) {
        self.done = true;
        let mut st = self.keep.lock();
        st.reserved = st.reserved.saturating_sub(self.cost);
        st.reservations = st.reservations.saturating_sub(1);
        let n = st.next;
        st.next = st.next.saturating_add(1);
        st.insert(
            n,
            Entry {
                space,
                key: key.to_owned(),
                token,
                cost: self.cost,
                until,
                strip_to,
            },
            body,
        );
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if !self.done {
            let mut st = self.keep.lock();
            st.reserved = st.reserved.saturating_sub(self.cost);
            st.reservations = st.reservations.saturating_sub(1);
        }
    }
}

impl Keep {
    /// The kept answers of `receiver` in `store`, within `bounds`.
    pub(crate) fn new(
        store: Arc<dyn KeyStore>,
        receiver: &str,
        bounds: KeepBounds,
        clock: SharedClock,
    ) -> Arc<Self> {
        let who = super::answer_record::who(receiver);
        Arc::new(Keep {
            store,
            answers_ns: format!("stipendex/{who}/answers"),
            tabs_ns: format!("stipendex/{who}/tabs"),
            bounds,
            clock,
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Now, in Unix seconds, by the receiver's clock.
    pub(crate) fn now(&self) -> u64 {
        u64::try_from(self.clock.now().unix_seconds()).unwrap_or(0)
    }

    /// How many answers are kept, and their bytes (room made for answers not yet written
    /// included).
    pub(crate) fn held(&self) -> (usize, u64) {
        let st = self.lock();
        (
            st.bodies
                .len()
                .saturating_add(st.bare.len())
                .saturating_add(st.reservations),
            st.bytes.saturating_add(st.reserved),
        )
    }

    /// Makes room for an answer of `cost` bytes, dropping the oldest kept answers as the policy
    /// says; `None` if it cannot fit (larger than the bound, or the bound taken by answers
    /// waiting for their writes).
    pub(crate) async fn reserve(self: &Arc<Self>, cost: u64) -> Option<Reserved> {
        let victims = {
            let mut st = self.lock();
            let fits = st.reserved.saturating_add(cost) <= self.bounds.bytes
                && st.reservations.saturating_add(1) <= self.bounds.entries;
            if !fits {
                return None;
            }
            st.reserved = st.reserved.saturating_add(cost);
            st.reservations = st.reservations.saturating_add(1);
            st.victims(self.bounds, self.now())
        };
        let reserved = Reserved {
            keep: self.clone(),
            cost,
            done: false,
        };
        for (n, e, body) in victims {
            self.drop_entry(n, e, body).await;
        }
        Some(reserved)
    }

    /// The answer under (`space`, `key`) was removed by its owner (a closed tab's): it is not
    /// counted any more.
    pub(crate) fn forget(&self, space: Space, key: &str) {
        let mut st = self.lock();
        if let Some(n) = st.by_key.get(&(space, key.to_owned())).copied() {
            st.take(n);
        }
    }

    /// Drops one kept answer from the store: a Proof's record loses its body (`strip`: it is
    /// counted, without it, at its age); anything else is removed. A failure is logged: the
    /// record then goes with its retention.
    async fn drop_entry(&self, n: u64, e: Entry, strip: bool) {
        let ns = match e.space {
            Space::Proof => &self.answers_ns,
            Space::Lane => &self.tabs_ns,
        };
        if strip {
            let done = match self.strip(&e).await {
                Ok(done) => {
                    if done.is_some() {
                        tracing::info!(key = %e.key, bytes = e.cost, "a kept answer's body was dropped (oldest first, to keep within the bound); its record stays");
                    }
                    done
                }
                Err(why) => {
                    tracing::warn!(key = %e.key, error = %why, "could not drop a kept answer's body; it goes with its retention");
                    None
                }
            };
            self.lock().stripped(n, e.space, &e.key, done);
            return;
        }
        match self.store.remove(ns, &e.key, e.token).await {
            Ok(_) => {
                tracing::debug!(key = %e.key, bytes = e.cost, "a kept answer was dropped (oldest first, or past its retention)");
            }
            Err(why) => {
                tracing::warn!(key = %e.key, error = %why, "could not drop a kept answer; it goes with its retention");
            }
        }
    }

    /// Rewrites Proof record `e` without its body: its new token and bytes; `None` if it is
    /// not there as this instance wrote it any more.
    async fn strip(&self, e: &Entry) -> Result<Option<(i64, u64)>, String> {
        let ns = &self.answers_ns;
        let Some(seen) = self
            .store
            .get(ns, &e.key)
            .await
            .map_err(|x| x.to_string())?
        else {
            return Ok(None);
        };
        if seen.record.token != e.token {
            return Ok(None);
        }
        let Some(bare) = seen
            .record
            .value
            .as_deref()
            .and_then(super::answer_record::without_body)
        else {
            // Unreadable, or already without its body: removed.
            self.store
                .remove(ns, &e.key, e.token)
                .await
                .map_err(|x| x.to_string())?;
            return Ok(None);
        };
        let token = rand::random::<i64>();
        let retain = Duration::from_secs(e.until.saturating_sub(self.now()).max(1));
        let cost = bare.len() as u64;
        let mut w = Write::finished(token, super::answer_record::ANSWER_STATE, Some(retain));
        w.value = Some(bare);
        if self
            .store
            .replace(ns, &e.key, e.token, &w)
            .await
            .map_err(|x| x.to_string())?
        {
            Ok(Some((token, cost)))
        } else {
            Ok(None)
        }
    }
}

impl super::Builder {
    /// How much this instance keeps for lost-answer replays (default [`KeepBounds::default`]:
    /// 64 MiB in 65 536 answers); past it the oldest kept answers are dropped first, and a
    /// repeat whose answer was dropped is told `answer_gone` (a Proof's with its Receipt while
    /// its record is kept) — never run again, never charged again. The bound is this
    /// instance's: instances sharing a store each keep within their own.
    #[must_use]
    pub fn kept_answers(mut self, bounds: KeepBounds) -> Self {
        self.keep = bounds;
        self
    }
}

impl super::Receiver {
    /// How many answers this instance keeps for lost-answer replays, and their bytes (for
    /// metrics): always within its [`KeepBounds`], but for the records of answers whose
    /// body was just dropped.
    #[must_use]
    pub fn kept_answers(&self) -> (usize, u64) {
        self.0.answers.bound().held()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn entry(key: &str, cost: u64, until: u64) -> Entry {
        Entry {
            space: Space::Lane,
            key: key.to_owned(),
            token: 1,
            cost,
            until,
            strip_to: None,
        }
    }

    #[test]
    fn the_oldest_go_first_records_without_a_body_first_for_entries() {
        let bounds = KeepBounds {
            bytes: 100,
            entries: 3,
        };
        let mut st = State::default();
        st.insert(0, entry("a", 40, 99), true);
        st.insert(1, entry("b", 5, 99), false);
        st.insert(2, entry("c", 40, 99), true);
        assert!(st.victims(bounds, 10).is_empty());
        // Room for one more of 30 bytes: the oldest record without a body goes for the entry,
        // then the oldest answer for the bytes.
        st.reserved = 30;
        st.reservations = 1;
        let keys =
            |v: Vec<(u64, Entry, bool)>| v.into_iter().map(|(_, e, _)| e.key).collect::<Vec<_>>();
        assert_eq!(keys(st.victims(bounds, 10)), ["b", "a"]);
        // Room for 100: the rest.
        st.reserved = 100;
        assert_eq!(keys(st.victims(bounds, 10)), ["c"]);
        assert_eq!(st.bytes, 0);
    }

    #[test]
    fn a_proof_record_loses_its_body_for_bytes_and_goes_whole_for_entries() {
        let bounds = KeepBounds {
            bytes: 100,
            entries: 2,
        };
        let proof = |key: &str| Entry {
            space: Space::Proof,
            strip_to: Some(5),
            ..entry(key, 60, 99)
        };
        let mut st = State::default();
        st.insert(0, proof("p"), true);
        // Room for 60 bytes: p keeps its record (5 bytes), without its body.
        st.reserved = 60;
        st.reservations = 1;
        let v = st.victims(bounds, 10);
        assert_eq!((v.len(), v[0].2), (1, true));
        assert_eq!((st.bytes, st.bare.len()), (5, 1));
        st.stripped(0, Space::Proof, "p", Some((7, 6)));
        assert_eq!((st.bytes, st.bare[&0].token), (6, 7));
        // Two more entries: the record goes whole.
        st.reservations = 2;
        st.reserved = 0;
        let v = st.victims(bounds, 10);
        assert_eq!((v.len(), v[0].2), (1, false));
        assert_eq!((st.bytes, st.bare.len()), (0, 0));
    }

    #[test]
    fn what_is_past_its_retention_goes_first_and_a_key_written_again_counts_once() {
        let bounds = KeepBounds {
            bytes: 1000,
            entries: 10,
        };
        let mut st = State::default();
        st.insert(0, entry("old", 10, 5), true);
        st.insert(1, entry("lane", 10, 99), true);
        st.insert(2, entry("lane", 20, 99), true);
        assert_eq!((st.bytes, st.bodies.len()), (30, 2));
        let v = st.victims(bounds, 10);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].1.key, "old");
        assert_eq!((st.bytes, st.bodies.len()), (20, 1));
    }
}
