//! The paymentId lifecycle: issued (with a 402 challenge) → submitting (one settlement in
//! flight, its transaction id written ahead) → settled, on the rail-core replay guard, so
//! several receiver instances sharing one store (PostgreSQL) agree.
//!
//! Three single-use keys per paymentId:
//! - `issued` (`{paymentId}:{binding}`) is written with the challenge and lapses after
//!   `maxTimeoutSeconds`. The binding digests what the challenge was for (resource, amount,
//!   payee), so a paymentId issued for a cheap resource is unknown to a dear one.
//! - `intent` is reserved when a settlement starts and immediately records the transaction id
//!   it is about to submit (write-ahead). Only one transaction can ever be settled for a
//!   paymentId: another transaction with the same note is refused as `paymentId already used`
//!   for as long as the record is kept ([`INTENT_RETENTION`], longer than any validity window).
//!   A refusal by the chain releases it (the payer may try again).
//!
//! Whoever answers the payer with a receipt does so once per paymentId under the transport's
//! served-once record ([`x402_transport::ServedOnce`]), also when a settler crashed after
//! submitting and the payer retried the same transaction ([`Begin::Resume`]).

use std::sync::Arc;
use std::time::Duration;

use rail_core::SettlementBook;
use rail_core::keys::{KeyStore, Opened};
use rail_core::{RailError, ReplayGuard};
use sha2::{Digest, Sha256};

use crate::wire::{
    ErrorCode, PAYMENT_ID_ALREADY_USED, SETTLEMENT_FAILED, UNKNOWN_OR_EXPIRED_PAYMENT_ID,
};

/// How long a paymentId's settlement record is kept: longer than the longest validity window
/// (1000 rounds, under an hour), so a second transaction for it can never be settled.
pub const INTENT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Why a paymentId cannot be settled now. [`LifecycleError::code`] is the seed's error code,
/// [`LifecycleError::reason`] the finer one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LifecycleError {
    /// No such challenge (for this resource), or it lapsed.
    #[error("unknown or expired paymentId")]
    UnknownOrExpired,
    /// Settled, or a settlement is in flight, or another transaction was settled for it.
    #[error("paymentId already used")]
    AlreadyUsed,
    /// This very transaction is being settled right now (by this or another instance): retry
    /// the same payment after `retry_after` — never pay again.
    #[error("settlement in progress; retry the same payment in {retry_after:?}")]
    InProgress {
        /// When the settler's time is up (after it, the same payment resumes on chain).
        retry_after: Duration,
    },
    /// The store failed.
    #[error(transparent)]
    Store(RailError),
}

impl LifecycleError {
    /// How it goes on the wire: the seed's `unknown or expired paymentId` and `paymentId
    /// already used` as they are; a settlement in flight and a store failure (both answered
    /// as retryable: send the same payment again) under `settlement failed`, with
    /// `settlement in progress` / `storage error` as the reason.
    #[must_use]
    pub fn error_code(&self) -> ErrorCode {
        match self {
            LifecycleError::UnknownOrExpired => ErrorCode::seed(UNKNOWN_OR_EXPIRED_PAYMENT_ID),
            LifecycleError::AlreadyUsed => ErrorCode::seed(PAYMENT_ID_ALREADY_USED),
            LifecycleError::InProgress { .. } => {
                ErrorCode::finer(SETTLEMENT_FAILED, "settlement in progress")
            }
            LifecycleError::Store(_) => ErrorCode::finer(SETTLEMENT_FAILED, "storage error"),
        }
    }

    /// The `error` on the wire: one of the seed's codes (see [`LifecycleError::error_code`]).
    #[must_use]
    pub fn code(&self) -> &'static str {
        self.error_code().error
    }

    /// The finer `reason` beside [`LifecycleError::code`], `None` for the seed's own cases.
    #[must_use]
    pub fn reason(&self) -> Option<&'static str> {
        self.error_code().reason
    }
}

fn store(e: RailError) -> LifecycleError {
    LifecycleError::Store(e)
}

/// Issues and consumes paymentIds.
#[derive(Clone, Debug)]
pub struct PaymentIds {
    issued: ReplayGuard,
    /// The write-ahead settlement record per paymentId: the transaction (its id on the rail)
    /// and what it pays for.
    intent: SettlementBook<Intent>,
}

/// What a settlement of a paymentId is for (written ahead with its transaction id).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Intent {
    /// The challenge's binding (resource, amount, payee), see [`binding`].
    pub binding: String,
}

/// How a settlement may proceed.
#[derive(Debug)]
#[must_use = "a settlement must end as settled or failed"]
pub enum Begin {
    /// This caller settles: submit the transaction, then [`Settling::settled`] or
    /// [`Settling::failed`].
    Fresh(Settling),
    /// This exact transaction was submitted by a settler that did not finish in time (it
    /// crashed, or lost its connection), or was settled and perhaps never answered: check the
    /// chain, and serve it once if it confirmed. `Some`: this caller took the settler's record
    /// over and ends it ([`Settling::settled`], [`Settling::failed`]).
    Resume(Option<Settling>),
}

/// A settlement in flight for one paymentId.
#[derive(Debug)]
#[must_use = "a settlement must end as settled or failed"]
pub struct Settling {
    settling: rail_core::keys::Settling<Intent>,
    txid: String,
    binding: String,
}

/// What a challenge was issued for: a digest of the resource, the amount and the payee.
#[must_use]
pub fn binding(resource: &str, amount: u64, pay_to: &str) -> String {
    let mut h = Sha256::new();
    for part in [
        resource.as_bytes(),
        &amount.to_be_bytes(),
        pay_to.as_bytes(),
    ] {
        h.update(u64::try_from(part.len()).unwrap_or(u64::MAX).to_be_bytes());
        h.update(part);
    }
    hex::encode(h.finalize().get(..16).unwrap_or_default())
}

impl PaymentIds {
    /// PaymentIds kept in `store` (share it between receiver instances).
    pub fn new(store: Arc<dyn KeyStore>) -> Self {
        PaymentIds {
            issued: ReplayGuard::new(store.clone(), "exact-algo/issued"),
            intent: SettlementBook::new(store, "exact-algo/intent", INTENT_RETENTION),
        }
    }

    /// A fresh paymentId (32 lowercase hex digits) valid for `ttl` (`maxTimeoutSeconds`) for
    /// what `binding` names (see [`binding`]).
    ///
    /// # Errors
    /// [`LifecycleError::Store`].
    pub async fn issue(&self, ttl: Duration, binding: &str) -> Result<String, LifecycleError> {
        loop {
            let pid = hex::encode(rand::random::<[u8; 16]>());
            if self
                .issued
                .insert_if_absent(&format!("{pid}:{binding}"), Some(ttl))
                .await
                .map_err(store)?
            {
                return Ok(pid);
            }
        }
    }

    /// Whether `pid` was issued for `binding` and is still live.
    ///
    /// # Errors
    /// [`LifecycleError::UnknownOrExpired`], [`LifecycleError::Store`].
    pub async fn check_issued(&self, pid: &str, binding: &str) -> Result<(), LifecycleError> {
        match self
            .issued
            .state(&format!("{pid}:{binding}"))
            .await
            .map_err(store)?
        {
            Some(_) => Ok(()),
            None => Err(LifecycleError::UnknownOrExpired),
        }
    }

    /// Starts settling `pid` with transaction `txid`: it must be issued for `binding` and live,
    /// and no other settlement may have started. Only one caller, in any process sharing the
    /// store, gets [`Begin::Fresh`] for a paymentId. `timeout` is how long the settler has to
    /// finish before a retry of the same transaction may [`Begin::Resume`].
    ///
    /// # Errors
    /// [`LifecycleError::UnknownOrExpired`], [`LifecycleError::AlreadyUsed`].
    pub async fn begin(
        &self,
        pid: &str,
        binding: &str,
        txid: &str,
        timeout: Duration,
    ) -> Result<Begin, LifecycleError> {
        // What the record names: the transaction and what it paid for, so a resumed settlement
        // can only serve the resource the payment was made for. Its digest is the record's
        // fingerprint: a record for another transaction is never taken over.
        // The record's fingerprint digests the transaction and what it pays for: a record for
        // another transaction (or the same one presented for something else) is never taken
        // over, and answers "used".
        let fingerprint = Sha256::digest(format!("{binding}/{txid}").as_bytes()).to_vec();
        let settling = |settling| Settling {
            settling,
            txid: txid.to_owned(),
            binding: binding.to_owned(),
        };
        let book = self.intent.clone().with_lease(timeout);
        let fresh = match book.open_as(pid, fingerprint).await.map_err(store)? {
            // Free, or held by a settler that died before writing anything ahead (so nothing
            // was submitted): this caller settles.
            Opened::Fresh(s) | Opened::Recover(s, None) => s,
            // The same transaction, whose settler did not finish (it crashed, or lost its
            // connection): this caller now holds the record and resumes it on chain.
            Opened::Recover(s, Some(_)) => return Ok(Begin::Resume(Some(settling(s)))),
            // The same transaction is being settled right now: retry it, never pay again.
            Opened::InFlight { retry_after, .. } => {
                return Err(LifecycleError::InProgress { retry_after });
            }
            // Settled, but perhaps never answered (a crash, a lost store write): the same
            // transaction is checked on chain and served at most once.
            Opened::Settled(_) => return Ok(Begin::Resume(None)),
            Opened::Conflict => return Err(LifecycleError::AlreadyUsed),
        };
        if let Err(e) = self.check_issued(pid, binding).await {
            fresh.failed().await.map_err(store)?;
            return Err(e);
        }
        // Written ahead: from here on only this transaction can settle the paymentId.
        fresh
            .submitting(
                txid,
                Intent {
                    binding: binding.to_owned(),
                },
            )
            .await
            .map_err(|e| match e {
                RailError::Replayed { .. } => LifecycleError::AlreadyUsed,
                other => store(other),
            })?;
        Ok(Begin::Fresh(settling(fresh)))
    }
}

impl Settling {
    /// The transaction being settled.
    #[must_use]
    pub fn txid(&self) -> &str {
        &self.txid
    }

    /// The network confirmed the payment: the paymentId is used for good.
    ///
    /// # Errors
    /// [`LifecycleError::Store`].
    pub async fn settled(self) -> Result<(), LifecycleError> {
        self.settling
            .settled(
                &self.txid,
                Intent {
                    binding: self.binding,
                },
            )
            .await
            .map_err(store)
    }

    /// Runs `work` (submission, confirmation wait) while keeping the record's lease alive.
    pub async fn keep_alive<F: std::future::Future>(&self, work: F) -> F::Output {
        self.settling.keep_alive(work).await
    }

    /// The network refused the payment for certain: the paymentId may be tried again.
    ///
    /// # Errors
    /// [`LifecycleError::Store`].
    pub async fn failed(self) -> Result<(), LifecycleError> {
        self.settling.failed().await.map_err(store)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rail_core::{ManualClock, MemoryKeyStore, Timestamp};

    fn ids() -> (PaymentIds, ManualClock) {
        let clock = ManualClock::at(Timestamp(1_000_000));
        (
            PaymentIds::new(Arc::new(MemoryKeyStore::with_clock(Arc::new(
                clock.clone(),
            )))),
            clock,
        )
    }

    const T: Duration = Duration::from_secs(30);
    const B: &str = "binding-a";

    fn fresh(b: Begin) -> Settling {
        match b {
            Begin::Fresh(s) => s,
            Begin::Resume(_) => panic!("expected a fresh settlement"),
        }
    }

    #[tokio::test]
    async fn issued_settled_once() {
        let (ids, _) = ids();
        let pid = ids.issue(Duration::from_secs(120), B).await.unwrap();
        assert_eq!(pid.len(), 32);
        assert!(
            pid.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        let s = fresh(ids.begin(&pid, B, "TX1", T).await.unwrap());
        // The same transaction while it settles: retry later, never "used" (that would send
        // a client that got a 503 to pay again).
        let busy = ids.begin(&pid, B, "TX1", T).await.unwrap_err();
        assert_eq!(
            (busy.code(), busy.reason()),
            ("settlement failed", Some("settlement in progress"))
        );
        assert_eq!(
            ids.begin(&pid, B, "TX2", T).await.unwrap_err().code(),
            "paymentId already used"
        );
        s.settled().await.unwrap();
        // Settled: the same transaction is checked on chain again (served at most once by
        // `serve_once`); any other is refused.
        assert!(matches!(
            ids.begin(&pid, B, "TX1", T).await.unwrap(),
            Begin::Resume(_)
        ));
        assert_eq!(
            ids.begin(&pid, B, "TX2", T).await.unwrap_err().code(),
            "paymentId already used"
        );
    }

    #[tokio::test]
    async fn unknown_expired_and_foreign_ids_are_refused() {
        let (ids, clock) = ids();
        assert_eq!(
            ids.begin("00000000000000000000000000000000", B, "TX", T)
                .await
                .unwrap_err()
                .code(),
            "unknown or expired paymentId"
        );
        let pid = ids.issue(Duration::from_secs(120), B).await.unwrap();
        // Issued for another resource/amount/payee: unknown here.
        assert_eq!(
            ids.begin(&pid, "binding-b", "TX", T)
                .await
                .unwrap_err()
                .code(),
            "unknown or expired paymentId"
        );
        clock.advance(Duration::from_secs(121));
        assert_eq!(
            ids.begin(&pid, B, "TX", T).await.unwrap_err().code(),
            "unknown or expired paymentId"
        );
    }

    #[tokio::test]
    async fn a_refused_settlement_frees_the_id() {
        let (ids, _) = ids();
        let pid = ids.issue(Duration::from_secs(600), B).await.unwrap();
        fresh(ids.begin(&pid, B, "TX1", T).await.unwrap())
            .failed()
            .await
            .unwrap();
        let s = fresh(ids.begin(&pid, B, "TX2", T).await.unwrap());
        assert_eq!(s.txid(), "TX2");
        s.settled().await.unwrap();
    }

    #[tokio::test]
    async fn a_crashed_settler_is_resumed_only_for_its_own_transaction() {
        let (ids, clock) = ids();
        let pid = ids.issue(Duration::from_secs(600), B).await.unwrap();
        let crashed = fresh(ids.begin(&pid, B, "TX1", T).await.unwrap());
        // Still within the settler's time: nobody else may touch it.
        assert!(ids.begin(&pid, B, "TX1", T).await.is_err());
        clock.advance(T + Duration::from_secs(1));
        // Another transaction for the same paymentId is never settled.
        assert_eq!(
            ids.begin(&pid, B, "TX2", T).await.unwrap_err().code(),
            "paymentId already used"
        );
        // The same transaction presented for something else: refused.
        assert_eq!(
            ids.begin(&pid, "binding-b", "TX1", T)
                .await
                .unwrap_err()
                .code(),
            "paymentId already used"
        );
        // The same transaction may be checked on chain and served once; the resumer now holds
        // the record (taken over by compare-and-set).
        let Begin::Resume(Some(resumer)) = ids.begin(&pid, B, "TX1", T).await.unwrap() else {
            panic!("the crashed settler's record is taken over")
        };
        // The crashed settler wakes up: its record is no longer its own (it cannot write), the
        // resumer records the settlement, and nobody serves again.
        assert!(crashed.settled().await.is_err());
        resumer.settled().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sixteen_concurrent_settlements_one_wins() {
        let (ids, _) = ids();
        let pid = ids.issue(Duration::from_secs(120), B).await.unwrap();
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (ids, pid) = (ids.clone(), pid.clone());
            tasks.push(tokio::spawn(async move {
                ids.begin(&pid, B, &format!("TX{}", i % 2), T).await.is_ok()
            }));
        }
        let mut wins = 0;
        for t in tasks {
            wins += usize::from(t.await.unwrap());
        }
        assert_eq!(wins, 1);
    }
}
