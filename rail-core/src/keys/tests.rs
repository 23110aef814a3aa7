use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use super::*;
use crate::clock::{Clock, ManualClock, Timestamp};
use crate::error::{RailError, RailResult};
use crate::types::OpId;

fn setup() -> (Arc<dyn KeyStore>, ManualClock) {
    let clock = ManualClock::at(Timestamp(1_000_000));
    (
        Arc::new(MemoryKeyStore::with_clock(Arc::new(clock.clone()))),
        clock,
    )
}

#[tokio::test]
async fn memory_store_passes_the_key_store_suite() {
    let (store, clock) = setup();
    suite::run_all(store, clock).await;
}

/// A clock that follows tokio's monotonic time, so leases and sleeps move together. (Real time,
/// with margins far above scheduling delays: paused time would need tokio's `test-util` in every
/// build of the workspace.)
#[derive(Debug)]
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        Timestamp(1_000_000).plus(self.0.elapsed())
    }
}

/// The work takes twice the lease; a second caller arrives after the lease would have lapsed.
/// Before leases were renewed, the second caller won the key and ran the side effect again.
#[tokio::test]
async fn slow_work_keeps_its_key() {
    let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(Arc::new(TokioClock(
        tokio::time::Instant::now(),
    ))));
    let idem = Idempotency::new(store, "ops")
        .with_windows(Duration::from_millis(1500), Duration::from_secs(3600));
    let op = OpId::new("slow").unwrap();
    let runs = Arc::new(AtomicU32::new(0));
    let first = {
        let (idem, op, runs) = (idem.clone(), op.clone(), runs.clone());
        tokio::spawn(async move {
            idem.run(&op, "pay 5", |_| async {
                runs.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3500)).await;
                Ok(1u32)
            })
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let second = idem
        .run(&op, "pay 5", |_| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok(2u32)
        })
        .await;
    assert!(
        matches!(second, Err(RailError::InProgress { .. })),
        "the first caller still holds the operation: {second:?}"
    );
    assert_eq!(first.await.unwrap().unwrap(), 1);
    assert_eq!(
        idem.run(&op, "pay 5", |_| async { Ok(3u32) })
            .await
            .unwrap(),
        1
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// The same for a single-use key held by a slow settler.
#[tokio::test]
async fn keep_alive_renews_a_reservation() {
    let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(Arc::new(TokioClock(
        tokio::time::Instant::now(),
    ))));
    let guard = ReplayGuard::new(store, "served");
    let Claim::Fresh(r) = guard
        .claim("p1", Duration::from_millis(1500))
        .await
        .unwrap()
    else {
        panic!("fresh")
    };
    let probe = guard.clone();
    let seen = r
        .keep_alive(async move {
            tokio::time::sleep(Duration::from_millis(3500)).await;
            probe
                .claim("p1", Duration::from_millis(1500))
                .await
                .unwrap()
        })
        .await;
    assert!(matches!(seen, Claim::Busy { .. }), "{seen:?}");
    r.commit(None).await.unwrap();
}

/// The work succeeded but its result could not be stored: the result is returned (the money
/// moved), and the next attempt recovers instead of running the work blindly again.
#[tokio::test]
async fn a_result_that_could_not_be_stored_is_still_returned() {
    let (store, clock) = setup();
    let failing = Arc::new(suite::FaultyStore::new(store));
    let idem = Idempotency::new(failing.clone(), "ops");
    let op = OpId::new("charge").unwrap();
    let out = idem
        .run(&op, "pay 5", |_| async {
            failing.set_down(true);
            Ok(5u32)
        })
        .await;
    assert_eq!(out.unwrap(), 5, "a charge that happened is never an error");
    failing.set_down(false);
    clock.advance(Duration::from_secs(61));
    let attempt = idem
        .run(&op, "pay 5", |a| async move {
            Ok(if a == Attempt::Recovering { 5u32 } else { 0 })
        })
        .await
        .unwrap();
    assert_eq!(attempt, 5, "the next attempt is a recovery");
}

/// A retryable failure (outcome unknown) hands the operation over for recovery; a permanent
/// one gives it back for a fresh attempt.
#[tokio::test]
async fn unknown_outcomes_are_recovered_and_refusals_retried_afresh() {
    let (store, _clock) = setup();
    let idem = Idempotency::new(store, "ops");
    let op = OpId::new("nwc-pay").unwrap();
    let e = idem
        .run(&op, "invoice", |_| async {
            Err::<u32, _>(RailError::Unavailable(crate::RailReason::new(
                "timeout",
                "no answer",
            )))
        })
        .await;
    assert!(e.is_err());
    let seen = idem
        .run(&op, "invoice", |a| async move {
            Ok(a).map(|a| a == Attempt::Recovering)
        })
        .await
        .unwrap();
    assert!(seen, "after an unknown outcome the retry looks first");

    let op = OpId::new("declined").unwrap();
    let _ = idem
        .run(&op, "card", |_| async {
            Err::<bool, _>(RailError::Declined(crate::RailReason::new(
                "card_declined",
                "",
            )))
        })
        .await;
    let first = idem
        .run(&op, "card", |a| async move { Ok(a == Attempt::First) })
        .await
        .unwrap();
    assert!(first, "after a refusal the retry starts afresh");
}

/// A store that keeps [`KeyStore::count`]'s default (read, then compare-and-set), as a store
/// written elsewhere would.
#[derive(Debug)]
struct DefaultCount(Arc<dyn KeyStore>);

#[async_trait::async_trait]
impl KeyStore for DefaultCount {
    async fn insert_if_absent(&self, ns: &str, key: &str, rec: &Write) -> RailResult<Option<Seen>> {
        self.0.insert_if_absent(ns, key, rec).await
    }
    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.0.replace(ns, key, token, rec).await
    }
    async fn take_over(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.0.take_over(ns, key, token, rec).await
    }
    async fn renew(&self, ns: &str, key: &str, token: i64, lease: Duration) -> RailResult<bool> {
        self.0.renew(ns, key, token, lease).await
    }
    async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
        self.0.remove(ns, key, token).await
    }
    async fn get(&self, ns: &str, key: &str) -> RailResult<Option<Seen>> {
        self.0.get(ns, key).await
    }
    async fn purge_expired(&self) -> RailResult<u64> {
        self.0.purge_expired().await
    }
    async fn now(&self) -> RailResult<Timestamp> {
        self.0.now().await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_counter_counts_like_the_stores_own() {
    let (inner, clock) = setup();
    let store: Arc<dyn KeyStore> = Arc::new(DefaultCount(inner));
    let ns = "default-count";
    suite::counters_count_in_windows(&store, &clock, ns).await;
    suite::counters_under_contention(&store, ns).await;
}

/// A reservation for a check (`reserve_for_check`) is committed without an `fsync` of its own;
/// its commit is durable and makes it durable with it. A release goes without one too. A plain
/// reservation is durable at once.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn a_reservation_waits_for_its_commit_to_be_durable() {
    let dir = tempfile::tempdir().unwrap();
    let keys = super::sql::SqliteKeyStore::open(&dir.path().join("records.db"))
        .await
        .unwrap();
    let db = keys.db().clone();
    let guard = ReplayGuard::new(Arc::new(keys), "offers");
    // A plain reservation (the served-once mark, which records settlement progress) is
    // durable at once.
    let syncs = db.stats().syncs;
    let plain = guard.reserve("q_0", Duration::from_secs(10)).await.unwrap();
    assert!(db.stats().syncs > syncs, "a plain reservation is durable");
    plain.release().await.unwrap();
    let syncs = db.stats().syncs;
    let r = guard
        .reserve_for_check("q_1", Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(db.stats().syncs, syncs, "the reservation has no fsync");
    assert!(db.durable_through() < db.last_commit());
    assert!(matches!(
        guard.reserve("q_1", Duration::from_secs(10)).await,
        Err(RailError::Replayed { .. })
    ));
    r.commit(None).await.unwrap();
    assert!(
        db.durable_through() >= db.last_commit(),
        "the commit is durable"
    );
    assert_eq!(
        guard.state("q_1").await.unwrap().as_deref(),
        Some(COMMITTED)
    );

    let syncs = db.stats().syncs;
    let r = guard
        .reserve_for_check("q_2", Duration::from_secs(10))
        .await
        .unwrap();
    r.release().await.unwrap();
    assert_eq!(db.stats().syncs, syncs, "nothing was done: no fsync");
    assert_eq!(guard.state("q_2").await.unwrap(), None);
}
