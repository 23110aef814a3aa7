//! Single-use keys with leases: [`ReplayGuard`], [`Claim`], [`Reservation`].
//!
//! A key is claimed with a *lease*. While the holder works it keeps the lease alive
//! ([`Reservation::keep_alive`]); a record in flight has no retention, so time alone never frees
//! it — unless its claimer gave it an *end* ([`ReplayGuard::claim_until`]): a time past which
//! the work cannot be asked for again (a receiver refuses a Proof past its Quote's grace), so
//! that what an unknown outcome leaves in flight is forgotten then. When a holder dies (crash, lost connection, a dropped future) its lease lapses and the
//! next claimer gets [`Claim::Recover`]: it now holds the key, and must find out what the
//! previous holder did (the record carries whatever was written ahead, [`Reservation::advance`])
//! before acting. Finishing ([`Reservation::finish`]) drops the lease and starts the record's
//! retention window.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use crate::error::{RailError, RailResult};

use super::store::{KeyRecord, KeyStore, Seen, Write};
use super::{COMMITTED, RESERVED};

pub(crate) fn new_token() -> i64 {
    rand::random::<i64>()
}

/// Single-use keys in one namespace of a [`KeyStore`].
#[derive(Clone, Debug)]
pub struct ReplayGuard {
    store: Arc<dyn KeyStore>,
    ns: String,
}

/// What [`ReplayGuard::claim`] found.
#[derive(Debug)]
#[must_use = "a claim that holds the key must be finished or released"]
pub enum Claim {
    /// The key was free: this caller holds it.
    Fresh(Reservation),
    /// The previous holder's lease lapsed with the key in flight. This caller now holds it (a
    /// compare-and-set, so only one recoverer wins), and must first find out what the previous
    /// holder did — `previous` carries its state and what it wrote ahead — and only then act.
    Recover {
        /// The key, now held by this caller (the previous state and value are kept).
        reservation: Reservation,
        /// The record as the previous holder left it.
        previous: KeyRecord,
    },
    /// Another holder's lease is live.
    Busy {
        /// Its state.
        state: String,
        /// When its lease runs out (unless renewed).
        retry_after: Duration,
    },
    /// The key is finished (used, served, settled…) and still remembered.
    Finished(KeyRecord),
    /// The key is held or remembered for other content (another fingerprint): nothing was
    /// taken over.
    Conflict(KeyRecord),
}

impl ReplayGuard {
    /// A guard over `store` whose keys live in namespace `ns` (one per kind of key).
    pub fn new(store: Arc<dyn KeyStore>, ns: impl Into<String>) -> Self {
        ReplayGuard {
            store,
            ns: ns.into(),
        }
    }

    /// The store.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn KeyStore> {
        &self.store
    }

    /// Inserts `w` unless a record is present; a lost acknowledgement is read back.
    async fn insert(&self, key: &str, w: &Write) -> RailResult<Option<Seen>> {
        match self.store.insert_if_absent(&self.ns, key, w).await {
            Ok(r) => Ok(r),
            Err(e) => match self.store.get(&self.ns, key).await {
                // The write landed, its answer did not.
                Ok(Some(seen)) if w.landed_as(&seen.record) => {
                    tracing::warn!(ns = %self.ns, key, error = %e, "key store lost an insert's acknowledgement; the insert landed");
                    Ok(None)
                }
                Ok(Some(seen)) => Ok(Some(seen)),
                _ => Err(e),
            },
        }
    }

    /// Compare-and-set on `token`; a lost acknowledgement is read back.
    async fn replace(&self, key: &str, token: i64, w: &Write) -> RailResult<bool> {
        let r = self.store.replace(&self.ns, key, token, w).await;
        self.read_back(key, token, w, r).await
    }

    /// Takes a lapsed record over by compare-and-set on its token *and* its lapsed lease; a lost
    /// acknowledgement is read back.
    async fn take_over(&self, key: &str, token: i64, w: &Write) -> RailResult<bool> {
        let r = self.store.take_over(&self.ns, key, token, w).await;
        self.read_back(key, token, w, r).await
    }

    /// The answer of a compare-and-set of `w` over `token`; when it failed, what the store holds
    /// says whether the write landed (its answer lost) or not.
    async fn read_back(
        &self,
        key: &str,
        token: i64,
        w: &Write,
        answer: RailResult<bool>,
    ) -> RailResult<bool> {
        let Err(e) = answer else { return answer };
        match self.store.get(&self.ns, key).await {
            Ok(Some(seen)) if w.landed_as(&seen.record) => {
                tracing::warn!(ns = %self.ns, key, error = %e, "key store lost a write's acknowledgement; the write landed");
                Ok(true)
            }
            // Someone else's record, or none: the compare would have failed anyway.
            Ok(Some(seen)) if seen.record.token != token => Ok(false),
            Ok(None) => Ok(false),
            _ => Err(e),
        }
    }

    /// Marks `key` used at once (no work in between), kept for `retain` (`None` = for ever;
    /// keep it at least as long as the thing it protects is valid). `true` if this call won.
    ///
    /// # Errors
    /// [`RailError::Storage`] if the store fails.
    pub async fn insert_if_absent(&self, key: &str, retain: Option<Duration>) -> RailResult<bool> {
        let w = Write::finished(new_token(), COMMITTED, retain);
        Ok(self.insert(key, &w).await?.is_none())
    }

    /// Claims `key` for work that may move money, with a renewable lease of `lease`.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn claim(&self, key: &str, lease: Duration) -> RailResult<Claim> {
        self.claim_as(key, lease, Vec::new()).await
    }

    /// As [`ReplayGuard::claim`], for content with digest `fingerprint`: a record left for other
    /// content is a [`Claim::Conflict`] (compared in constant time) and is never taken over.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn claim_as(
        &self,
        key: &str,
        lease: Duration,
        fingerprint: Vec<u8>,
    ) -> RailResult<Claim> {
        self.claim_over(key, lease, fingerprint, false).await
    }

    /// As [`ReplayGuard::claim_as`]; with `holder_gone`, a record in flight is taken over even
    /// before its lease lapses ([`Claim::Recover`]): the caller knows its holder has ended (a
    /// process whose lock is free), so waiting for the lease would only delay the recovery.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn claim_over(
        &self,
        key: &str,
        lease: Duration,
        fingerprint: Vec<u8>,
        holder_gone: bool,
    ) -> RailResult<Claim> {
        let holders = if holder_gone {
            Holders::Gone
        } else {
            Holders::Leases
        };
        self.claim_ending(key, lease, fingerprint, holders, None)
            .await
    }

    /// Claims `key` for the holder named `me` (a process), writing the name as the record's
    /// value — in the first write, and in the very write that takes a record over. A record in
    /// flight whose named holder `gone` says has ended is taken over at once (before its lease
    /// lapses), by compare-and-set on the token of the record judged: a holder that took the
    /// key over meanwhile names itself in that same write, so it is never mistaken for the one
    /// that ended. For keys that hold nothing but their holder (what a holder wrote ahead is
    /// not kept).
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn claim_named(
        &self,
        key: &str,
        lease: Duration,
        me: &str,
        gone: &(dyn Fn(&str) -> bool + Send + Sync),
    ) -> RailResult<Claim> {
        self.claim_ending(key, lease, Vec::new(), Holders::Named { me, gone }, None)
            .await
    }

    /// As [`ReplayGuard::claim_as`], for work that cannot be asked for again after `end` from
    /// now: the record this claim writes is forgotten then, whatever state it is left in —
    /// in flight, handed over or stale — and a claim of the key after `end` is
    /// [`Claim::Fresh`]. A recoverer's takeover keeps the same end; finishing replaces it with
    /// the finished record's retention.
    ///
    /// Only for work whose caller refuses, by itself, every request for it after `end` (a
    /// receiver refuses a Proof presented past its Quote's grace before claiming it): the end
    /// bounds how long a claim whose outcome stays unknown is kept, which for work that could
    /// still be asked for would let it run twice.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn claim_until(
        &self,
        key: &str,
        lease: Duration,
        fingerprint: Vec<u8>,
        end: Duration,
    ) -> RailResult<Claim> {
        self.claim_ending(key, lease, fingerprint, Holders::Leases, Some(end))
            .await
    }

    pub(crate) async fn claim_ending(
        &self,
        key: &str,
        lease: Duration,
        fingerprint: Vec<u8>,
        holders: Holders<'_>,
        end: Option<Duration>,
    ) -> RailResult<Claim> {
        let mut w = Write::leased(new_token(), RESERVED, lease);
        w.fingerprint = fingerprint;
        w.retain = end;
        if let Holders::Named { me, .. } = holders {
            w.value = Some(me.to_owned());
        }
        for _ in 0..4 {
            let Some(seen) = self.insert(key, &w).await? else {
                return Ok(Claim::Fresh(self.reservation(key, &w)));
            };
            let same: bool = seen.record.fingerprint.ct_eq(&w.fingerprint).into();
            if !same {
                return Ok(Claim::Conflict(seen.record));
            }
            // Finished: no lease. (A renewal never lands on a finished record: every store
            // renews only a record that still has a lease. A record in flight may have a
            // retention: its end, `claim_until`.)
            if seen.record.lease_until.is_none() {
                return Ok(Claim::Finished(seen.record));
            }
            let holder_gone = match holders {
                Holders::Leases => false,
                Holders::Gone => true,
                Holders::Named { gone, .. } => seen.record.value.as_deref().is_some_and(gone),
            };
            if !seen.lease_lapsed() && !holder_gone {
                return Ok(Claim::Busy {
                    retry_after: seen.lease_left(),
                    state: seen.record.state,
                });
            }
            // Take the stale record over, keeping what the previous holder wrote ahead, and
            // its end if it has one (the same instant, by the store's clock).
            let lapsed = seen.lease_lapsed();
            let ends_in = seen.record.expires_at.map(|t| {
                Duration::from_millis(u64::try_from(t.0.saturating_sub(seen.now.0)).unwrap_or(0))
            });
            let previous = seen.record;
            let take = Write {
                token: new_token(),
                state: previous.state.clone(),
                fingerprint: previous.fingerprint.clone(),
                value: match holders {
                    Holders::Named { me, .. } => Some(me.to_owned()),
                    Holders::Leases | Holders::Gone => previous.value.clone(),
                },
                retain: ends_in,
                lease: Some(lease),
            };
            // A live lease whose holder the caller knows has ended is taken by compare-and-set
            // on its token alone; a lapsed one by token and lapse (a holder that renewed in time
            // keeps its key).
            let taken = if holder_gone && !lapsed {
                self.replace(key, previous.token, &take).await?
            } else {
                self.take_over(key, previous.token, &take).await?
            };
            if taken {
                tracing::info!(ns = %self.ns, key, state = %previous.state, "took over a lapsed lease; recovering");
                return Ok(Claim::Recover {
                    reservation: self.reservation(key, &take),
                    previous,
                });
            }
            // Another recoverer won, or the holder renewed in time: look again.
        }
        Err(RailError::Storage(format!(
            "key {}/{key} kept changing under contention",
            self.ns
        )))
    }

    /// Reserves `key` for work that **moves no money** (a read-only check, a local decision):
    /// a lapsed reservation is taken over, since redoing such work is harmless. Work that moves
    /// money uses [`ReplayGuard::claim`] and recovers first.
    ///
    /// # Errors
    /// [`RailError::Replayed`] if the key is held or used.
    pub async fn reserve(&self, key: &str, lease: Duration) -> RailResult<Reservation> {
        match self.claim(key, lease).await? {
            Claim::Fresh(r) | Claim::Recover { reservation: r, .. } => Ok(r),
            Claim::Busy { .. } | Claim::Finished(_) | Claim::Conflict(_) => {
                Err(RailError::Replayed {
                    key: key.to_owned(),
                })
            }
        }
    }

    /// [`ReplayGuard::reserve`] for a check whose outcome is recorded only by the
    /// reservation's [`Reservation::finish`] (or [`Reservation::commit`]), nothing acting on it
    /// before: a receiver's single-use mark on an offer it verifies by reading its rail.
    ///
    /// The reservation is written through the store's deferred handle
    /// ([`KeyStore::deferred`]: committed, every process sees it, not yet `fsync`ed); the
    /// finish is durable and, in the same file, makes the reservation durable with it. A power
    /// loss before the finish loses at most a reservation under which nothing was done. Its
    /// release, renewals and [`Reservation::advance`] go through the deferred handle too: do
    /// not record progress with it that must survive a power loss.
    ///
    /// # Errors
    /// [`RailError::Replayed`] if the key is held or used.
    pub async fn reserve_for_check(&self, key: &str, lease: Duration) -> RailResult<Reservation> {
        let quick = ReplayGuard {
            store: super::store::deferred(&self.store),
            ns: self.ns.clone(),
        };
        let mut r = quick.reserve(key, lease).await?;
        r.finish_on = Some(self.store.clone());
        Ok(r)
    }

    /// The state of `key` (`reserved`, `committed`, …) if it is present.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn state(&self, key: &str) -> RailResult<Option<String>> {
        Ok(self.seen(key).await?.map(|s| s.record.state))
    }

    /// The record of `key` and the store's time, if present.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn seen(&self, key: &str) -> RailResult<Option<Seen>> {
        self.store.get(&self.ns, key).await
    }

    fn reservation(&self, key: &str, w: &Write) -> Reservation {
        Reservation {
            guard: self.clone(),
            key: key.to_owned(),
            token: w.token,
            lease: w.lease.unwrap_or_default(),
            fingerprint: w.fingerprint.clone(),
            end: w.retain.map(|d| (Instant::now(), d)),
            finish_on: None,
        }
    }
}

/// How a claim judges the holder of a record in flight.
#[derive(Clone, Copy)]
pub(crate) enum Holders<'a> {
    /// By its lease alone: a live lease is busy.
    Leases,
    /// The caller knows the current holder has ended.
    Gone,
    /// The record's value names its holder; `gone` says whether that holder has ended, and
    /// this claim names `me`.
    Named {
        me: &'a str,
        gone: &'a (dyn Fn(&str) -> bool + Send + Sync),
    },
}

/// A held key; [`Reservation::finish`] or [`Reservation::release`] it. Keep it alive with
/// [`Reservation::keep_alive`] while work runs.
#[derive(Debug)]
#[must_use = "a reservation must be finished or released"]
pub struct Reservation {
    guard: ReplayGuard,
    key: String,
    token: i64,
    lease: Duration,
    fingerprint: Vec<u8>,
    /// The record's end, if its claim gave one ([`ReplayGuard::claim_until`]): when it was
    /// written (this process's clock) and how long it then had to run. A rewrite in flight
    /// ([`Reservation::advance`]) keeps what is left of it.
    end: Option<(Instant, Duration)>,
    /// The durable store its finish is written through, when the key was reserved through a
    /// deferred handle ([`ReplayGuard::reserve_for_check`]); `None`: through `guard`'s.
    finish_on: Option<Arc<dyn KeyStore>>,
}

impl Reservation {
    /// The store handle the key was claimed through.
    #[must_use]
    pub fn store(&self) -> &Arc<dyn KeyStore> {
        &self.guard.store
    }

    /// The reserved key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The lease length.
    #[must_use]
    pub fn lease(&self) -> Duration {
        self.lease
    }

    fn lost(&self) -> RailError {
        RailError::Replayed {
            key: self.key.clone(),
        }
    }

    /// Extends the lease by its length from now.
    ///
    /// # Errors
    /// [`RailError::Replayed`] if the key is no longer this holder's; [`RailError::Storage`].
    pub async fn renew(&self) -> RailResult<()> {
        if self
            .guard
            .store
            .renew(&self.guard.ns, &self.key, self.token, self.lease)
            .await?
        {
            Ok(())
        } else {
            Err(self.lost())
        }
    }

    /// Runs `work` while renewing the lease every third of its length, so slow work never
    /// lets the key lapse to another caller. A failed renewal is logged and tried again; the
    /// work is never cut short (money may be moving).
    pub async fn keep_alive<F: Future>(&self, work: F) -> F::Output {
        // Boxed: the work's state (often large: HTTP clients, JSON) lives on the heap, not
        // inline in every caller's future.
        let work = Box::pin(work);
        let period = (self.lease / 3).max(Duration::from_millis(10));
        let renewals = async {
            loop {
                tokio::time::sleep(period).await;
                if let Err(e) = self.renew().await {
                    tracing::error!(ns = %self.guard.ns, key = %self.key, error = %e, "could not renew a lease while its work runs");
                }
            }
        };
        tokio::select! {
            biased;
            out = work => out,
            () = renewals => unreachable!("the renewal loop never ends"),
        }
    }

    async fn write(&self, w: &Write) -> RailResult<()> {
        self.write_via(&self.guard, w).await
    }

    /// Compare-and-set of `w` on this holder's token, through `guard`.
    async fn write_via(&self, guard: &ReplayGuard, w: &Write) -> RailResult<()> {
        if guard.replace(&self.key, self.token, w).await? {
            Ok(())
        } else {
            Err(self.lost())
        }
    }

    /// Moves the key to an in-flight `state`, writing `value` ahead (what is about to be sent
    /// and its id on the rail), and renews the lease. The record stays in flight: it has no
    /// retention (or keeps what is left of its end, [`ReplayGuard::claim_until`]) and a
    /// recoverer will see `state` and `value`.
    ///
    /// # Errors
    /// [`RailError::Replayed`] if the key is no longer this holder's; [`RailError::Storage`].
    pub async fn advance(&self, state: &str, value: Option<String>) -> RailResult<()> {
        self.write(&Write {
            token: self.token,
            state: state.to_owned(),
            fingerprint: self.fingerprint.clone(),
            value,
            retain: self
                .end
                .map(|(at, d)| d.saturating_sub(at.elapsed()).max(Duration::from_millis(1))),
            lease: Some(self.lease),
        })
        .await
    }

    /// Finishes the key in `state` with `value`, remembered for `retain` (`None` = for ever).
    ///
    /// # Errors
    /// [`RailError::Replayed`] if the key is no longer this holder's; [`RailError::Storage`].
    pub async fn finish_with(
        self,
        state: &str,
        value: Option<String>,
        retain: Option<Duration>,
    ) -> RailResult<()> {
        let w = Write {
            token: self.token,
            state: state.to_owned(),
            fingerprint: self.fingerprint.clone(),
            value,
            retain,
            lease: None,
        };
        match &self.finish_on {
            Some(store) => {
                let durable = ReplayGuard::new(store.clone(), self.guard.ns.clone());
                self.write_via(&durable, &w).await
            }
            None => self.write(&w).await,
        }
    }

    /// Finishes the key in `state`, remembered for `retain` (`None` = for ever).
    ///
    /// # Errors
    /// As [`Reservation::finish_with`].
    pub async fn finish(self, state: &str, retain: Option<Duration>) -> RailResult<()> {
        self.finish_with(state, None, retain).await
    }

    /// Marks the key used for good ([`COMMITTED`]), remembered for `retain`.
    ///
    /// # Errors
    /// As [`Reservation::finish_with`].
    pub async fn commit(self, retain: Option<Duration>) -> RailResult<()> {
        self.finish(COMMITTED, retain).await
    }

    /// Hands the key over for recovery: it stays in flight with what was written ahead, and its
    /// lease ends now, so the next claimer gets [`Claim::Recover`] at once. For work whose
    /// outcome is unknown (a timeout after sending): never [`Reservation::release`] that.
    ///
    /// # Errors
    /// [`RailError::Storage`] (the lease then lapses by itself).
    pub async fn hand_over(self) -> RailResult<()> {
        self.guard
            .store
            .renew(&self.guard.ns, &self.key, self.token, Duration::ZERO)
            .await
            .map(|_| ())
    }

    /// Frees the key (nothing was spent).
    ///
    /// # Errors
    /// [`RailError::Storage`] (the key then stays held until its lease lapses and a recoverer
    /// finds nothing done).
    pub async fn release(self) -> RailResult<()> {
        match self
            .guard
            .store
            .remove(&self.guard.ns, &self.key, self.token)
            .await
        {
            Ok(_) => Ok(()),
            // A lost acknowledgement: gone (or someone else's) means the removal happened.
            Err(e) => match self.guard.seen(&self.key).await {
                Ok(Some(seen)) if seen.record.token == self.token => Err(e),
                Ok(_) => Ok(()),
                Err(_) => Err(e),
            },
        }
    }
}
