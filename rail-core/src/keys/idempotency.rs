//! Operation-id idempotency: same id + same content → the first result; same id + other
//! content → [`RailError::IdempotencyConflict`]; same id while the first call still runs →
//! [`RailError::InProgress`] (retryable); same id after the first caller died mid-way → a
//! *recovering* attempt that must find out what the first one did before acting.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};

use crate::error::{RailError, RailResult};
use crate::types::OpId;

use super::COMMITTED;
use super::guard::{Claim, Holders, ReplayGuard, Reservation};
use super::store::KeyStore;

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
    /// An earlier attempt started and never recorded a result (its holder died, or its outcome
    /// was unknown): find out what it did on the rail first, then finish or act.
    Recover(Lease),
    /// Done before with the same content: here is the first result.
    Replay(T),
}

/// Which attempt of an operation [`Idempotency::run`] is making.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Nobody tried this operation before: act.
    First,
    /// An earlier attempt may have acted (it died, or its outcome was unknown): look on the rail
    /// first (the operation's own idempotency key, the chain, the wallet service), and act only
    /// if nothing happened.
    Recovering,
}

/// The right to run one operation, held by one caller at a time (a renewable lease).
#[derive(Debug)]
#[must_use = "finish or abandon the lease"]
pub struct Lease {
    op: String,
    reservation: Reservation,
}

impl Lease {
    /// The store handle the lease was claimed through (every write of the lease goes through
    /// it): a deferred handle ([`super::KeyStore::deferred`]) makes them durable at its
    /// [`super::KeyStore::sync`].
    #[must_use]
    pub fn store(&self) -> &Arc<dyn KeyStore> {
        self.reservation.store()
    }

    /// Runs `work` while keeping the lease alive.
    pub async fn keep_alive<F: Future>(&self, work: F) -> F::Output {
        self.reservation.keep_alive(work).await
    }
}

/// Operation-id idempotency records in one namespace.
#[derive(Clone, Debug)]
pub struct Idempotency {
    guard: ReplayGuard,
    lease: Duration,
    retain: Duration,
}

impl Idempotency {
    /// Idempotency records in namespace `ns`: a running operation holds its id with a 60 s
    /// lease (renewed while it runs), a finished one is remembered for 24 hours (Stripe's window).
    pub fn new(store: Arc<dyn KeyStore>, ns: impl Into<String>) -> Self {
        Idempotency {
            guard: ReplayGuard::new(store, ns),
            lease: Duration::from_secs(60),
            retain: Duration::from_secs(24 * 3600),
        }
    }

    /// Sets the lease of a running operation and how long results are kept.
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
        self.begin_over(op, fp, false).await
    }

    /// As [`Idempotency::begin`]; with `holder_gone`, an attempt in flight whose holder has
    /// ended (the caller knows: a process whose lock is free) is recovered at once
    /// ([`Begin::Recover`]) rather than after its lease lapses.
    ///
    /// # Errors
    /// As [`Idempotency::begin`].
    pub async fn begin_over<T: DeserializeOwned>(
        &self,
        op: &OpId,
        fp: &[u8],
        holder_gone: bool,
    ) -> RailResult<Begin<T>> {
        self.begin_ending(op, fp, holder_gone, None).await
    }

    /// As [`Idempotency::begin`], for an operation that cannot be asked for again after `end`
    /// from now: what it leaves in flight (its outcome unknown, [`Idempotency::hand_over`]) is
    /// forgotten then ([`ReplayGuard::claim_until`], whose contract the caller keeps: it
    /// refuses the operation by itself after `end`).
    ///
    /// # Errors
    /// As [`Idempotency::begin`].
    pub async fn begin_until<T: DeserializeOwned>(
        &self,
        op: &OpId,
        fp: &[u8],
        end: Duration,
    ) -> RailResult<Begin<T>> {
        self.begin_ending(op, fp, false, Some(end)).await
    }

    async fn begin_ending<T: DeserializeOwned>(
        &self,
        op: &OpId,
        fp: &[u8],
        holder_gone: bool,
        end: Option<Duration>,
    ) -> RailResult<Begin<T>> {
        let lease = |reservation| Lease {
            op: op.as_str().to_owned(),
            reservation,
        };
        match self
            .guard
            .claim_ending(
                op.as_str(),
                self.lease,
                fp.to_vec(),
                if holder_gone {
                    Holders::Gone
                } else {
                    Holders::Leases
                },
                end,
            )
            .await?
        {
            Claim::Fresh(r) => Ok(Begin::Fresh(lease(r))),
            Claim::Recover { reservation, .. } => Ok(Begin::Recover(lease(reservation))),
            Claim::Conflict(_) => Err(RailError::IdempotencyConflict {
                op_id: op.to_string(),
            }),
            Claim::Busy { .. } => Err(RailError::InProgress {
                op_id: op.to_string(),
            }),
            Claim::Finished(rec) => match (rec.state.as_str(), rec.value) {
                (COMMITTED, Some(v)) => serde_json::from_str(&v)
                    .map(Begin::Replay)
                    .map_err(|e| RailError::Storage(format!("stored result for {op}: {e}"))),
                _ => Err(RailError::Storage(format!(
                    "operation {op} finished as {} without a result",
                    rec.state
                ))),
            },
        }
    }

    /// Stores the result of an operation.
    ///
    /// # Errors
    /// [`RailError::Storage`]; [`RailError::InProgress`] if the lease was lost to a recoverer.
    pub async fn finish<T: Serialize>(&self, lease: Lease, result: &T) -> RailResult<()> {
        let value = serde_json::to_string(result)
            .map_err(|e| RailError::Storage(format!("cannot store result: {e}")))?;
        let op = lease.op;
        lease
            .reservation
            .finish_with(COMMITTED, Some(value), Some(self.retain))
            .await
            .map_err(|e| match e {
                RailError::Replayed { .. } => RailError::InProgress { op_id: op },
                e => e,
            })
    }

    /// Gives the id back without a result: nothing happened on the rail, so a retry runs the
    /// operation afresh.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn abandon(&self, lease: Lease) -> RailResult<()> {
        lease.reservation.release().await
    }

    /// Hands the id over for recovery: the outcome is unknown, so the next attempt is a
    /// [`Begin::Recover`] that looks on the rail before acting.
    ///
    /// # Errors
    /// [`RailError::Storage`] (the lease then lapses by itself).
    pub async fn hand_over(&self, lease: Lease) -> RailResult<()> {
        lease.reservation.hand_over().await
    }

    /// Runs `work` at most once per (`op`, content); a repeat returns the stored result.
    ///
    /// `work` is told which [`Attempt`] it makes: on [`Attempt::Recovering`] it must look on the
    /// rail for what an earlier attempt did before acting (for work the rail itself makes
    /// idempotent by the operation id — a ledger transfer id, a Stripe `Idempotency-Key` — doing
    /// it again *is* that look). The lease is kept alive while `work` runs.
    ///
    /// - `work` succeeded: the result is stored and returned. If storing it fails the result is
    ///   still returned (the charge happened; the failure is logged and the record is recovered
    ///   by the next attempt).
    /// - `work` failed permanently (nothing moved): the id is given back.
    /// - `work` failed with a retryable error (the outcome may be unknown): the id is handed
    ///   over, so the next attempt recovers.
    ///
    /// # Errors
    /// Those of [`Idempotency::begin`], or `work`'s.
    pub async fn run<C, T, F, Fut>(&self, op: &OpId, content: &C, work: F) -> RailResult<T>
    where
        C: Serialize + ?Sized + Sync,
        T: Serialize + DeserializeOwned + Send,
        F: FnOnce(Attempt) -> Fut + Send,
        Fut: Future<Output = RailResult<T>> + Send,
    {
        let fp = fingerprint(content)?;
        let (lease, attempt) = match self.begin::<T>(op, &fp).await? {
            Begin::Replay(t) => return Ok(t),
            Begin::Fresh(l) => (l, Attempt::First),
            Begin::Recover(l) => (l, Attempt::Recovering),
        };
        // Boxed: the work's state lives on the heap, not inline in every caller's future.
        let work = Box::pin(work(attempt));
        match lease.keep_alive(work).await {
            Ok(t) => {
                if let Err(e) = self.finish(lease, &t).await {
                    tracing::error!(op = %op, error = %e, "an operation succeeded but its result could not be stored; returning it (the next attempt recovers)");
                }
                Ok(t)
            }
            Err(e) => {
                let handed = if e.is_retryable() {
                    self.hand_over(lease).await
                } else {
                    self.abandon(lease).await
                };
                if let Err(store) = handed {
                    tracing::warn!(op = %op, error = %store, "could not end an idempotency lease; it lapses by itself");
                }
                Err(e)
            }
        }
    }
}
