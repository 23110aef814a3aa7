//! The paymentId lifecycle: issued (with a 402 challenge) → submitting (one settlement in
//! flight, its transaction id written ahead) → settled, on the rail-core replay guard, so
//! several receiver instances sharing one store (PostgreSQL) agree.
//!
//! A paymentId and two single-use keys per paymentId:
//! - **issued**: nothing is stored when a challenge is made (anyone can ask for one, unpaid,
//!   as often as they like: a record per challenge would be a table any client grows). The
//!   paymentId carries its own proof of issue: when it lapses (`maxTimeoutSeconds` after it was
//!   issued, by the store's clock) and a MAC, under a key the store keeps once for every
//!   instance sharing it, over that time, a random part and the binding. The binding digests
//!   what the challenge was for (resource, amount, payee), so a paymentId issued for a cheap
//!   resource is unknown to a dear one, and a lapsed or made-up one is unknown everywhere.
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

use rail_core::RailError;
use rail_core::SettlementBook;
use rail_core::keys::{KeyStore, Opened, Write};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq as _;
use tokio::sync::OnceCell;

use crate::wire::{
    ErrorCode, PAYMENT_ID_ALREADY_USED, SETTLEMENT_FAILED, UNKNOWN_OR_EXPIRED_PAYMENT_ID,
};

/// How long a paymentId's settlement record is kept: longer than the longest validity window
/// (1000 rounds, under an hour), so a second transaction for it can never be settled.
pub const INTENT_RETENTION: Duration = Duration::from_secs(24 * 3600);

/// Why a paymentId cannot be settled now. [`LifecycleError::code`] is the error code
/// (`docs/exact-algo.md` §4.1), [`LifecycleError::reason`] the finer one.
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
    /// How it goes on the wire (`docs/exact-algo.md` §4): `unknown or expired paymentId` and
    /// `paymentId already used` as they are; a settlement in flight and a store failure (both
    /// answered as retryable: send the same payment again) under `settlement failed`, with
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
}

crate::rules::code_and_reason!(
    LifecycleError,
    code: [
        " The `error` on the wire: one of the codes of `docs/exact-algo.md` §4.1 (see",
        " [`LifecycleError::error_code`]).",
    ],
    reason: [
        " The finer `reason` beside [`LifecycleError::code`], `None` for the cases §4.1 names.",
    ]
);

fn store(e: RailError) -> LifecycleError {
    LifecycleError::Store(e)
}

/// The namespace of the key paymentIds are issued under (one record, kept for good).
const ISSUER_NS: &str = "exact-algo/issuer";
/// Its key in [`ISSUER_NS`].
const ISSUER_KEY: &str = "mac-key";

/// A paymentId's bytes: when it lapses (ms, 48 bits), a random part, then the MAC.
const PID_LEN: usize = 16;
const EXP_LEN: usize = 6;
const RANDOM_LEN: usize = 5;
const MAC_AT: usize = EXP_LEN + RANDOM_LEN;

/// Issues and consumes paymentIds.
#[derive(Clone)]
pub struct PaymentIds {
    store: Arc<dyn KeyStore>,
    /// The issuing key, read from (or first written to) the store once.
    key: Arc<OnceCell<[u8; 32]>>,
    /// The write-ahead settlement record per paymentId: the transaction (its id on the rail)
    /// and what it pays for.
    intent: SettlementBook<Intent>,
}

impl std::fmt::Debug for PaymentIds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the issuing key.
        f.debug_struct("PaymentIds")
            .field("intent", &self.intent)
            .finish_non_exhaustive()
    }
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

/// HMAC-SHA256 (RFC 2104) of `parts` under `key`, a 32-byte key (shorter than the block).
fn hmac(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let (mut inner, mut outer) = ([0x36u8; 64], [0x5cu8; 64]);
    for (i, k) in key.iter().enumerate() {
        if let (Some(a), Some(b)) = (inner.get_mut(i), outer.get_mut(i)) {
            *a ^= k;
            *b ^= k;
        }
    }
    let mut h = Sha256::new();
    h.update(inner);
    for p in parts {
        h.update(u64::try_from(p.len()).unwrap_or(u64::MAX).to_be_bytes());
        h.update(p);
    }
    Sha256::new()
        .chain_update(outer)
        .chain_update(h.finalize())
        .finalize()
        .into()
}

/// The MAC of a paymentId's first [`MAC_AT`] bytes for `binding`.
fn mac_of(key: &[u8; 32], head: &[u8], binding: &str) -> [u8; PID_LEN - MAC_AT] {
    let full = hmac(key, &[b"exact-algo/paymentId", head, binding.as_bytes()]);
    let mut out = [0u8; PID_LEN - MAC_AT];
    out.copy_from_slice(
        full.get(..PID_LEN - MAC_AT)
            .unwrap_or(&[0; PID_LEN - MAC_AT]),
    );
    out
}

impl PaymentIds {
    /// PaymentIds kept in `store` (share it between receiver instances: they then share the
    /// issuing key, and any of them settles a paymentId another issued).
    pub fn new(store: Arc<dyn KeyStore>) -> Self {
        PaymentIds {
            intent: SettlementBook::new(store.clone(), "exact-algo/intent", INTENT_RETENTION),
            key: Arc::new(OnceCell::new()),
            store,
        }
    }

    /// The issuing key: the one in the store, or a fresh one written there first (of
    /// instances starting at once, the first write wins and every instance reads it).
    async fn key(&self) -> Result<&[u8; 32], LifecycleError> {
        self.key
            .get_or_try_init(|| async {
                let fresh: [u8; 32] = rand::random();
                let mut w = Write::finished(rand::random(), "key", None);
                w.value = Some(hex::encode(fresh));
                let value = match self
                    .store
                    .insert_if_absent(ISSUER_NS, ISSUER_KEY, &w)
                    .await
                    .map_err(store)?
                {
                    None => return Ok(fresh),
                    Some(seen) => seen.record.value.unwrap_or_default(),
                };
                let mut key = [0u8; 32];
                hex::decode_to_slice(value.as_bytes(), &mut key).map_err(|_| {
                    LifecycleError::Store(RailError::Storage(format!(
                        "{ISSUER_NS}/{ISSUER_KEY} holds no 32-byte key"
                    )))
                })?;
                Ok(key)
            })
            .await
    }

    /// A fresh paymentId (32 lowercase hex digits) valid for `ttl` (`maxTimeoutSeconds`) for
    /// what `binding` names (see [`binding`]). Nothing is stored per paymentId: it carries its
    /// end and a MAC over it and `binding` ([`PaymentIds::check_issued`] checks both).
    ///
    /// # Errors
    /// [`LifecycleError::Store`] (the issuing key cannot be read, or the store's clock).
    pub async fn issue(&self, ttl: Duration, binding: &str) -> Result<String, LifecycleError> {
        let key = self.key().await?;
        let now = self.store.now().await.map_err(store)?;
        let end = u64::try_from(now.plus(ttl).millis())
            .unwrap_or(0)
            .min((1 << (8 * EXP_LEN)) - 1);
        let mut pid = [0u8; PID_LEN];
        let (head, mac) = pid.split_at_mut(MAC_AT);
        let (exp, random) = head.split_at_mut(EXP_LEN);
        exp.copy_from_slice(end.to_be_bytes().get(8 - EXP_LEN..).unwrap_or_default());
        random.copy_from_slice(&rand::random::<[u8; RANDOM_LEN]>());
        mac.copy_from_slice(&mac_of(key, head, binding));
        Ok(hex::encode(pid))
    }

    /// Whether `pid` was issued for `binding` (its MAC, under the issuing key) and is still
    /// live (its end, by the store's clock).
    ///
    /// # Errors
    /// [`LifecycleError::UnknownOrExpired`], [`LifecycleError::Store`].
    pub async fn check_issued(&self, pid: &str, binding: &str) -> Result<(), LifecycleError> {
        let mut bytes = [0u8; PID_LEN];
        if pid.bytes().any(|b| b.is_ascii_uppercase())
            || hex::decode_to_slice(pid.as_bytes(), &mut bytes).is_err()
        {
            return Err(LifecycleError::UnknownOrExpired);
        }
        let key = self.key().await?;
        let (head, mac) = bytes.split_at(MAC_AT);
        if !bool::from(mac.ct_eq(&mac_of(key, head, binding))) {
            return Err(LifecycleError::UnknownOrExpired);
        }
        let mut end = [0u8; 8];
        if let (Some(to), Some(from)) = (end.get_mut(8 - EXP_LEN..), head.get(..EXP_LEN)) {
            to.copy_from_slice(from);
        }
        let end = i64::try_from(u64::from_be_bytes(end)).unwrap_or(i64::MAX);
        let now = self.store.now().await.map_err(store)?;
        if now.millis() < end {
            Ok(())
        } else {
            Err(LifecycleError::UnknownOrExpired)
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

    /// A store that counts the records inserted into it (the rest as the memory store).
    #[derive(Debug, Default)]
    struct Counted {
        inner: MemoryKeyStore,
        inserted: std::sync::atomic::AtomicUsize,
    }

    impl Counted {
        fn inserted(&self) -> usize {
            self.inserted.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[async_trait::async_trait]
    impl KeyStore for Counted {
        async fn insert_if_absent(
            &self,
            ns: &str,
            key: &str,
            rec: &Write,
        ) -> rail_core::RailResult<Option<rail_core::keys::Seen>> {
            let r = self.inner.insert_if_absent(ns, key, rec).await;
            if matches!(r, Ok(None)) {
                self.inserted
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            r
        }
        async fn replace(
            &self,
            ns: &str,
            key: &str,
            token: i64,
            rec: &Write,
        ) -> rail_core::RailResult<bool> {
            self.inner.replace(ns, key, token, rec).await
        }
        async fn take_over(
            &self,
            ns: &str,
            key: &str,
            token: i64,
            rec: &Write,
        ) -> rail_core::RailResult<bool> {
            self.inner.take_over(ns, key, token, rec).await
        }
        async fn renew(
            &self,
            ns: &str,
            key: &str,
            token: i64,
            lease: Duration,
        ) -> rail_core::RailResult<bool> {
            self.inner.renew(ns, key, token, lease).await
        }
        async fn remove(&self, ns: &str, key: &str, token: i64) -> rail_core::RailResult<bool> {
            self.inner.remove(ns, key, token).await
        }
        async fn get(
            &self,
            ns: &str,
            key: &str,
        ) -> rail_core::RailResult<Option<rail_core::keys::Seen>> {
            self.inner.get(ns, key).await
        }
        async fn purge_expired(&self) -> rail_core::RailResult<u64> {
            self.inner.purge_expired().await
        }
        async fn now(&self) -> rail_core::RailResult<Timestamp> {
            self.inner.now().await
        }
    }

    /// Issue #47: a challenge is free to ask for, so issuing one stores nothing. 20,000
    /// unpaid challenges for one resource and for many (every resource, amount and payee is a
    /// binding of its own) leave one record in the store (the issuing key), every paymentId
    /// is distinct, and an honest payer's paymentId issued in the middle of the flood still
    /// settles — at another instance sharing the store too.
    #[tokio::test]
    async fn a_flood_of_unpaid_challenges_stores_nothing_and_an_honest_payer_settles() {
        let store = Arc::new(Counted::default());
        let ids = PaymentIds::new(store.clone());
        let mut seen = std::collections::HashSet::new();
        let mut honest = None;
        for i in 0..20_000u32 {
            let b = if i % 2 == 0 {
                B.to_owned()
            } else {
                binding(&format!("/api/posts/{i}"), u64::from(i), "PAYEE")
            };
            let pid = ids.issue(Duration::from_secs(120), &b).await.unwrap();
            assert!(seen.insert(pid.clone()), "paymentId {pid} issued twice");
            if i == 10_000 {
                honest = Some(pid);
            }
        }
        assert_eq!(store.inserted(), 1, "only the issuing key is stored");
        let honest = honest.unwrap();
        let other_instance = PaymentIds::new(store.clone());
        let s = fresh(other_instance.begin(&honest, B, "TX1", T).await.unwrap());
        s.settled().await.unwrap();
        // Made-up, malformed and upper-case paymentIds are unknown; nothing was kept for them.
        let before = store.inserted();
        for made_up in [
            "0123456789abcdef0123456789abcdef",
            "not hex",
            &honest.to_ascii_uppercase(),
        ] {
            assert_eq!(
                ids.check_issued(made_up, B).await.unwrap_err().code(),
                "unknown or expired paymentId"
            );
        }
        assert_eq!(store.inserted(), before);
        // Another receiver (its own store, its own key) does not know this one's paymentIds.
        let (foreign, _) = self::ids();
        assert!(foreign.check_issued(&honest, B).await.is_err());
    }

    #[tokio::test]
    async fn a_paymentid_lapses_at_its_end_by_the_stores_clock() {
        let (ids, clock) = ids();
        let pid = ids.issue(Duration::from_secs(120), B).await.unwrap();
        clock.advance(Duration::from_millis(119_999));
        ids.check_issued(&pid, B).await.unwrap();
        clock.advance(Duration::from_millis(1));
        assert!(ids.check_issued(&pid, B).await.is_err());
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
