//! The behaviours every [`KeyStore`] implementation must show, with the records on top of it
//! (run by this crate's tests for the memory store and by the SQL stores' tests against real
//! SQLite and PostgreSQL), and [`FaultyStore`], a store wrapper that loses acknowledgements or goes down.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::missing_panics_doc,
    clippy::panic
)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::clock::ManualClock;
use crate::error::{RailError, RailResult};
use crate::types::OpId;

use super::*;

/// A [`KeyStore`] with injected faults: the next write's acknowledgement lost (applied, then
/// reported as failed: the database committed, the answer did not arrive), or the database
/// unreachable (every call fails before touching it).
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn KeyStore>,
    lose_ack: AtomicBool,
    down: AtomicBool,
}

impl FaultyStore {
    /// Wraps `inner`, with no fault armed.
    pub fn new(inner: Arc<dyn KeyStore>) -> Self {
        FaultyStore {
            inner,
            lose_ack: AtomicBool::new(false),
            down: AtomicBool::new(false),
        }
    }

    /// Loses the acknowledgement of the next write.
    pub fn lose_next_ack(&self) {
        self.lose_ack.store(true, Ordering::SeqCst);
    }

    /// Makes the database unreachable (`true`) or reachable again.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn reachable(&self) -> RailResult<()> {
        if self.down.load(Ordering::SeqCst) {
            Err(RailError::Storage("database unreachable".into()))
        } else {
            Ok(())
        }
    }

    async fn write<T>(&self, op: impl Future<Output = RailResult<T>>) -> RailResult<T> {
        self.reachable()?;
        let r = op.await;
        if r.is_ok() && self.lose_ack.swap(false, Ordering::SeqCst) {
            Err(RailError::Storage(
                "connection reset (acknowledgement lost)".into(),
            ))
        } else {
            r
        }
    }
}

#[async_trait]
impl KeyStore for FaultyStore {
    async fn insert_if_absent(&self, ns: &str, key: &str, rec: &Write) -> RailResult<Option<Seen>> {
        self.write(self.inner.insert_if_absent(ns, key, rec)).await
    }
    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.write(self.inner.replace(ns, key, token, rec)).await
    }
    async fn take_over(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.write(self.inner.take_over(ns, key, token, rec)).await
    }
    async fn renew(&self, ns: &str, key: &str, token: i64, lease: Duration) -> RailResult<bool> {
        self.write(self.inner.renew(ns, key, token, lease)).await
    }
    async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
        self.write(self.inner.remove(ns, key, token)).await
    }
    async fn get(&self, ns: &str, key: &str) -> RailResult<Option<Seen>> {
        self.reachable()?;
        self.inner.get(ns, key).await
    }
    async fn purge_expired(&self) -> RailResult<u64> {
        self.inner.purge_expired().await
    }
    async fn now(&self) -> RailResult<crate::clock::Timestamp> {
        self.inner.now().await
    }
    async fn count(&self, ns: &str, key: &str, window: Duration) -> RailResult<Tally> {
        self.write(self.inner.count(ns, key, window)).await
    }
}

const S: Duration = Duration::from_secs(1);

fn fresh(c: Claim) -> Reservation {
    match c {
        Claim::Fresh(r) => r,
        other => panic!("expected a fresh claim, got {other:?}"),
    }
}

/// Runs every behaviour. `store` must judge time by `clock`.
pub async fn run_all(store: Arc<dyn KeyStore>, clock: ManualClock) {
    let ns = format!("suite-{}", rand::random::<u64>());
    claim_release_commit(&store, &clock, &ns).await;
    lapsed_lease_is_recovered_not_taken_over(&store, &clock, &ns).await;
    renewal_keeps_a_slow_holder(&store, &clock, &ns).await;
    in_flight_records_never_expire_by_time(&store, &clock, &ns).await;
    in_flight_records_with_an_end(&store, &clock, &ns).await;
    named_holders(&store, &ns).await;
    retention_window(&store, &clock, &ns).await;
    one_winner_under_contention(&store, &ns).await;
    idempotency_lifecycle(&store, &clock, &ns).await;
    settlement_book_writes_ahead(&store, &clock, &ns).await;
    lost_acknowledgements_are_read_back(&store, &ns).await;
    late_renewals_and_takeovers(&store, &clock, &ns).await;
    every_kind_of_write_at_once(&store, &clock, &ns).await;
    odd_keys_are_kept_exactly(&store, &ns).await;
    counters_count_in_windows(&store, &clock, &ns).await;
    counters_under_contention(&store, &ns).await;
    deferred_writes_are_seen_at_once(&store, &ns).await;
}

/// claim → busy → release → claim → commit → finished (also long after).
pub async fn claim_release_commit(store: &Arc<dyn KeyStore>, clock: &ManualClock, ns: &str) {
    assert_eq!(
        store.now().await.unwrap(),
        crate::clock::Clock::now(clock),
        "the store judges time by its clock"
    );
    let guard = ReplayGuard::new(store.clone(), format!("{ns}-a"));
    let r = fresh(guard.claim("k1", 10 * S).await.unwrap());
    assert_eq!(r.key(), "k1");
    assert!(matches!(
        guard.claim("k1", 10 * S).await.unwrap(),
        Claim::Busy { ref state, retry_after } if state == RESERVED && retry_after == 10 * S
    ));
    assert!(matches!(
        guard.reserve("k1", 10 * S).await,
        Err(RailError::Replayed { .. })
    ));
    r.release().await.unwrap();
    assert_eq!(guard.state("k1").await.unwrap(), None);
    let r = fresh(guard.claim("k1", 10 * S).await.unwrap());
    r.commit(None).await.unwrap();
    clock.advance(3600 * S);
    assert!(
        matches!(guard.claim("k1", 10 * S).await.unwrap(), Claim::Finished(ref rec) if rec.state == COMMITTED)
    );
    assert!(guard.reserve("k1", 10 * S).await.is_err());
}

/// A holder that stopped renewing is recovered: the next claimer takes over (one winner), sees
/// what was written ahead, and the late holder can no longer write.
pub async fn lapsed_lease_is_recovered_not_taken_over(
    store: &Arc<dyn KeyStore>,
    clock: &ManualClock,
    ns: &str,
) {
    let guard = ReplayGuard::new(store.clone(), format!("{ns}-b"));
    let stale = fresh(guard.claim("k2", 5 * S).await.unwrap());
    stale
        .advance("submitted", Some("\"tx-1\"".into()))
        .await
        .unwrap();
    clock.advance(6 * S);
    let Claim::Recover {
        reservation,
        previous,
    } = guard.claim("k2", 5 * S).await.unwrap()
    else {
        panic!("a lapsed lease must be recovered")
    };
    assert_eq!(previous.state, "submitted");
    assert_eq!(previous.value.as_deref(), Some("\"tx-1\""));
    // A second recoverer finds the key held, and the late holder cannot write.
    assert!(matches!(
        guard.claim("k2", 5 * S).await.unwrap(),
        Claim::Busy { ref state, .. } if state == "submitted"
    ));
    assert!(matches!(
        stale.commit(None).await,
        Err(RailError::Replayed { .. })
    ));
    assert!(stale_renew_fails(&guard).await);
    reservation.commit(Some(60 * S)).await.unwrap();
}

async fn stale_renew_fails(guard: &ReplayGuard) -> bool {
    // A reservation taken from a different claim of the same key cannot renew someone else's.
    let other = ReplayGuard::new(guard.store().clone(), "unrelated-ns");
    let r = fresh(other.claim("k2", S).await.unwrap());
    let ok = r.renew().await.is_ok();
    r.release().await.unwrap();
    ok
}

/// Renewing keeps a slow holder's key: without renewal it would lapse to the next caller.
pub async fn renewal_keeps_a_slow_holder(store: &Arc<dyn KeyStore>, clock: &ManualClock, ns: &str) {
    let guard = ReplayGuard::new(store.clone(), format!("{ns}-c"));
    let r = fresh(guard.claim("slow", 10 * S).await.unwrap());
    for _ in 0..5 {
        clock.advance(8 * S);
        r.renew().await.unwrap();
    }
    clock.advance(8 * S);
    assert!(
        matches!(
            guard.claim("slow", 10 * S).await.unwrap(),
            Claim::Busy { .. }
        ),
        "a renewed lease is still held 48 s after a 10 s lease began"
    );
    r.commit(Some(60 * S)).await.unwrap();
}

/// A record in flight has no retention: a day later, purged or not, it is recovered, not free.
pub async fn in_flight_records_never_expire_by_time(
    store: &Arc<dyn KeyStore>,
    clock: &ManualClock,
    ns: &str,
) {
    let guard = ReplayGuard::new(store.clone(), format!("{ns}-d"));
    let r = fresh(guard.claim("money", 5 * S).await.unwrap());
    r.advance("submitted", None).await.unwrap();
    clock.advance(24 * 3600 * S);
    store.purge_expired().await.unwrap();
    assert_eq!(
        guard.state("money").await.unwrap().as_deref(),
        Some("submitted")
    );
    assert!(!guard.insert_if_absent("money", None).await.unwrap());
    let Claim::Recover { reservation, .. } = guard.claim("money", 5 * S).await.unwrap() else {
        panic!("a day-old record in flight is recovered")
    };
    // Handing over ends the lease at once: the next claimer recovers without waiting.
    reservation.hand_over().await.unwrap();
    let Claim::Recover { reservation, .. } = guard.claim("money", 5 * S).await.unwrap() else {
        panic!("a handed-over record is recovered at once")
    };
    reservation.release().await.unwrap();
}

/// A claim with an end (`claim_until`): in flight, handed over, taken over by a recoverer or
/// written ahead, it is the same record until its end; then it is gone — purged, and the key
/// free — whatever state it was left in. Finishing replaces the end with the retention. The
/// idempotency records on top behave the same (`begin_until`).
pub async fn in_flight_records_with_an_end(
    store: &Arc<dyn KeyStore>,
    clock: &ManualClock,
    ns: &str,
) {
    let guard = ReplayGuard::new(store.clone(), format!("{ns}-end"));
    let r = fresh(
        guard
            .claim_until("q", 5 * S, vec![1], 100 * S)
            .await
            .unwrap(),
    );
    r.advance("verifying", Some("\"v\"".into())).await.unwrap();
    r.hand_over().await.unwrap();
    clock.advance(60 * S);
    // Before its end: recovered (with what was written ahead), not free.
    let Claim::Recover {
        reservation,
        previous,
    } = guard
        .claim_until("q", 5 * S, vec![1], 100 * S)
        .await
        .unwrap()
    else {
        panic!("a handed-over claim is recovered before its end")
    };
    assert_eq!(previous.value.as_deref(), Some("\"v\""));
    // The recoverer's takeover keeps the first end (60 s of the 100 s are gone), not a new one.
    let seen = guard.seen("q").await.unwrap().unwrap();
    let left = seen.record.expires_at.unwrap().0 - seen.now.0;
    assert!(
        (39_000..=40_000).contains(&left),
        "the end moved: {left} ms left"
    );
    reservation.hand_over().await.unwrap();
    clock.advance(39 * S);
    assert!(matches!(
        guard
            .claim_until("q", 5 * S, vec![2], 100 * S)
            .await
            .unwrap(),
        Claim::Conflict(_)
    ));
    clock.advance(2 * S);
    // Past its end: gone, purged, and the key free.
    assert!(guard.seen("q").await.unwrap().is_none());
    assert!(store.purge_expired().await.unwrap() >= 1);
    assert!(guard.seen("q").await.unwrap().is_none());
    let r = fresh(
        guard
            .claim_until("q", 5 * S, vec![2], 100 * S)
            .await
            .unwrap(),
    );
    // Finished: the retention replaces the end.
    r.commit(Some(1000 * S)).await.unwrap();
    clock.advance(500 * S);
    store.purge_expired().await.unwrap();
    assert!(matches!(
        guard
            .claim_until("q", 5 * S, vec![2], 100 * S)
            .await
            .unwrap(),
        Claim::Finished(_)
    ));
    // A stale holder (its lease lapsed, never handed over) is forgotten at the end too.
    let stale = fresh(
        guard
            .claim_until("dead", 5 * S, vec![], 30 * S)
            .await
            .unwrap(),
    );
    drop(stale);
    clock.advance(10 * S);
    assert!(matches!(
        guard
            .claim_until("dead", 5 * S, vec![], 30 * S)
            .await
            .unwrap(),
        Claim::Recover { .. }
    ));
    clock.advance(21 * S);
    assert!(store.purge_expired().await.unwrap() >= 1);
    assert!(guard.seen("dead").await.unwrap().is_none());
    // Idempotency: an operation handed over with an end is recovered before it and forgotten
    // after it.
    let idem = Idempotency::new(store.clone(), format!("{ns}-end-ops"));
    let op = OpId::new("verify-1").unwrap();
    let Begin::<u32>::Fresh(lease) = idem.begin_until(&op, b"p", 50 * S).await.unwrap() else {
        panic!("fresh")
    };
    idem.hand_over(lease).await.unwrap();
    let Begin::<u32>::Recover(lease) = idem.begin_until(&op, b"p", 50 * S).await.unwrap() else {
        panic!("a handed-over operation is recovered before its end")
    };
    idem.hand_over(lease).await.unwrap();
    clock.advance(51 * S);
    store.purge_expired().await.unwrap();
    let Begin::<u32>::Fresh(lease) = idem.begin_until(&op, b"p", 50 * S).await.unwrap() else {
        panic!("an operation past its end is forgotten")
    };
    idem.finish(lease, &7u32).await.unwrap();
}

/// The holder named by the record under `key` (which must be there).
async fn holder(guard: &ReplayGuard, key: &str) -> Option<String> {
    guard.seen(key).await.unwrap().unwrap().record.value
}

/// Claims that name their holder (`claim_named`): a record whose holder has ended is taken
/// over at once, and the takeover names its new holder in the same write — so a third claimer
/// that judges by the name finds a live holder (busy), never the ended one's name on a record
/// someone else now holds.
pub async fn named_holders(store: &Arc<dyn KeyStore>, ns: &str) {
    let guard = ReplayGuard::new(store.clone(), format!("{ns}-named"));
    let alive = |h: &str| h != "a";
    let gone = |h: &str| !alive(h);
    let a = fresh(guard.claim_named("req", 60 * S, "a", &gone).await.unwrap());
    assert_eq!(
        holder(&guard, "req").await.as_deref(),
        Some("a"),
        "the first write names its holder"
    );
    // "b" finds "a" ended: taken over at once (the lease still runs), named "b".
    let Claim::Recover { reservation: b, .. } =
        guard.claim_named("req", 60 * S, "b", &gone).await.unwrap()
    else {
        panic!("a claim whose holder ended is taken over at once")
    };
    assert_eq!(holder(&guard, "req").await.as_deref(), Some("b"));
    // "c" judges by the name: "b" lives, so it waits; the ended "a" can no longer write.
    assert!(matches!(
        guard.claim_named("req", 60 * S, "c", &gone).await.unwrap(),
        Claim::Busy { .. }
    ));
    assert!(matches!(a.release().await, Ok(())));
    assert!(
        guard.seen("req").await.unwrap().is_some(),
        "a's release removed nothing"
    );
    b.release().await.unwrap();
    assert!(matches!(
        guard.claim_named("req", 60 * S, "c", &gone).await.unwrap(),
        Claim::Fresh(_)
    ));
}

/// Finished records are remembered for their window, then the key is free.
pub async fn retention_window(store: &Arc<dyn KeyStore>, clock: &ManualClock, ns: &str) {
    let guard = ReplayGuard::new(store.clone(), format!("{ns}-e"));
    let r = fresh(guard.claim("k3", 5 * S).await.unwrap());
    r.finish("served", Some(60 * S)).await.unwrap();
    clock.advance(59 * S);
    assert!(
        matches!(guard.claim("k3", 5 * S).await.unwrap(), Claim::Finished(ref rec) if rec.state == "served")
    );
    clock.advance(2 * S);
    assert!(store.purge_expired().await.unwrap() >= 1);
    assert!(
        guard.insert_if_absent("k3", None).await.unwrap(),
        "retention lapsed"
    );
    assert!(!guard.insert_if_absent("k3", None).await.unwrap());
}

/// Of concurrent inserters of one key, exactly one wins.
pub async fn one_winner_under_contention(store: &Arc<dyn KeyStore>, ns: &str) {
    let guard = ReplayGuard::new(store.clone(), format!("{ns}-f"));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let g = guard.clone();
        tasks.push(tokio::spawn(async move {
            if i % 2 == 0 {
                g.insert_if_absent("hot", None).await.unwrap()
            } else {
                matches!(g.claim("hot", 10 * S).await.unwrap(), Claim::Fresh(_))
            }
        }));
    }
    let mut wins = 0;
    for t in tasks {
        if t.await.unwrap() {
            wins += 1;
        }
    }
    assert_eq!(wins, 1, "exactly one concurrent insert wins");
}

/// fresh → in progress → finish → replay; conflict; abandon; hand over → recover.
pub async fn idempotency_lifecycle(store: &Arc<dyn KeyStore>, clock: &ManualClock, ns: &str) {
    let idem = Idempotency::new(store.clone(), format!("{ns}-ops"));
    let op = OpId::new("op-a").unwrap();
    let Begin::Fresh(lease) = idem.begin::<String>(&op, b"one").await.unwrap() else {
        panic!("first begin must be fresh")
    };
    assert!(matches!(
        idem.begin::<String>(&op, b"one").await,
        Err(RailError::InProgress { .. })
    ));
    assert!(matches!(
        idem.begin::<String>(&op, b"two").await,
        Err(RailError::IdempotencyConflict { .. })
    ));
    idem.finish(lease, &"result".to_owned()).await.unwrap();
    match idem.begin::<String>(&op, b"one").await.unwrap() {
        Begin::Replay(v) => assert_eq!(v, "result"),
        other => panic!("must replay, got {other:?}"),
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
    let Begin::Fresh(lease) = idem.begin::<String>(&op2, b"x").await.unwrap() else {
        panic!("an abandoned operation starts afresh")
    };
    idem.hand_over(lease).await.unwrap();
    // Other content never takes a handed-over operation.
    assert!(matches!(
        idem.begin::<String>(&op2, b"y").await,
        Err(RailError::IdempotencyConflict { .. })
    ));
    let Begin::Recover(lease) = idem.begin::<String>(&op2, b"x").await.unwrap() else {
        panic!("a handed-over operation is recovered")
    };
    idem.finish(lease, &"found".to_owned()).await.unwrap();

    // A lease that lapses (its holder died) is recovered, not run afresh.
    let op3 = OpId::new("op-c").unwrap();
    let Begin::Fresh(_dead) = idem.begin::<String>(&op3, b"z").await.unwrap() else {
        panic!("fresh")
    };
    clock.advance(61 * S);
    assert!(matches!(
        idem.begin::<String>(&op3, b"z").await.unwrap(),
        Begin::Recover(_)
    ));
}

/// A settlement writes ahead what it sends; a recoverer follows it; a settled one is final.
pub async fn settlement_book_writes_ahead(
    store: &Arc<dyn KeyStore>,
    clock: &ManualClock,
    ns: &str,
) {
    let book: SettlementBook<String> =
        SettlementBook::new(store.clone(), format!("{ns}-settle"), 3600 * S).with_lease(10 * S);
    let Opened::Fresh(s) = book.open("auth-1").await.unwrap() else {
        panic!("fresh")
    };
    s.submitting("0xabc", "bytes".into()).await.unwrap();
    assert!(matches!(
        book.open("auth-1").await.unwrap(),
        Opened::InFlight { settlement: Some(ref x), .. } if x.rail_id == "0xabc"
    ));
    clock.advance(11 * S);
    let Opened::Recover(s, Some(previous)) = book.open("auth-1").await.unwrap() else {
        panic!("a lapsed settler is recovered with what it wrote ahead")
    };
    assert_eq!(previous.state, SettlementState::Submitted);
    assert_eq!(previous.rail_id, "0xabc");
    s.settled(&previous.rail_id, previous.sent.clone())
        .await
        .unwrap();
    let Opened::Settled(done) = book.open("auth-1").await.unwrap() else {
        panic!("settled")
    };
    assert_eq!(done.state, SettlementState::Settled);
    assert_eq!(book.get("auth-1").await.unwrap().unwrap().rail_id, "0xabc");
    // A settlement refused for certain frees the key.
    let Opened::Fresh(s) = book.open("auth-2").await.unwrap() else {
        panic!("fresh")
    };
    s.failed().await.unwrap();
    assert!(matches!(
        book.open("auth-2").await.unwrap(),
        Opened::Fresh(_)
    ));
}

/// A write that landed with its answer lost is read back, never reported as failed.
pub async fn lost_acknowledgements_are_read_back(store: &Arc<dyn KeyStore>, ns: &str) {
    let lossy = Arc::new(FaultyStore::new(store.clone()));
    let guard = ReplayGuard::new(lossy.clone(), format!("{ns}-lossy"));
    lossy.lose_next_ack();
    let r = fresh(guard.claim("k", 10 * S).await.unwrap());
    lossy.lose_next_ack();
    r.advance("submitted", Some("1".into())).await.unwrap();
    lossy.lose_next_ack();
    r.commit(Some(60 * S)).await.unwrap();
    assert_eq!(guard.state("k").await.unwrap().as_deref(), Some(COMMITTED));
    lossy.lose_next_ack();
    assert!(guard.insert_if_absent("marker", None).await.unwrap());
    let r = fresh(guard.claim("gone", 10 * S).await.unwrap());
    lossy.lose_next_ack();
    r.release().await.unwrap();
    assert_eq!(guard.state("gone").await.unwrap(), None);

    let idem = Idempotency::new(lossy.clone(), format!("{ns}-lossy-ops"));
    let op = OpId::new("op-lossy").unwrap();
    lossy.lose_next_ack();
    let Begin::Fresh(lease) = idem.begin::<u32>(&op, b"c").await.unwrap() else {
        panic!("an insert whose answer was lost still wins")
    };
    lossy.lose_next_ack();
    idem.finish(lease, &7u32).await.unwrap();
    assert!(matches!(
        idem.begin::<u32>(&op, b"c").await.unwrap(),
        Begin::Replay(7)
    ));
}

/// A holder that renews after its lease lapsed but before a recoverer's takeover keeps its key
/// (the takeover checks the lease, not only the token); a renewal that arrives after the
/// finish never makes a finished record look in flight.
pub async fn late_renewals_and_takeovers(store: &Arc<dyn KeyStore>, clock: &ManualClock, ns: &str) {
    let guard = ReplayGuard::new(store.clone(), format!("{ns}-g"));
    let holder = fresh(guard.claim("k", 10 * S).await.unwrap());
    clock.advance(11 * S);
    // The recoverer has read the lapsed record; the holder renews before the takeover lands.
    let seen = guard.seen("k").await.unwrap().unwrap();
    assert!(seen.lease_lapsed());
    holder.renew().await.unwrap();
    let take = Write::leased(12345, RESERVED, 10 * S);
    assert!(
        !store
            .take_over(&format!("{ns}-g"), "k", seen.record.token, &take)
            .await
            .unwrap(),
        "a renewed lease is not taken over"
    );
    holder.commit(Some(60 * S)).await.unwrap();
    // A renewal statement that lands after the finish changes nothing.
    assert!(
        !store
            .renew(&format!("{ns}-g"), "k", seen.record.token, 10 * S)
            .await
            .unwrap()
    );
    assert!(matches!(
        guard.claim("k", 10 * S).await.unwrap(),
        Claim::Finished(_)
    ));
}

/// 64 holders, each on its own key, run every kind of write at the same time — an insert that
/// wins and one that loses, a compare-and-set with the wrong token and with the right one, a
/// renewal and a takeover each both ways, a removal both ways — so a store that groups writes
/// into batches mixes every kind in one batch. Each write answers what it would alone, and the
/// records end as a serial run would leave them.
pub async fn every_kind_of_write_at_once(store: &Arc<dyn KeyStore>, clock: &ManualClock, ns: &str) {
    let ns = format!("{ns}-mix");
    // Half the keys hold a lapsed lease before the race, for the takeovers to find.
    for i in (0..64).step_by(2) {
        let rec = Write::leased(1_000 + i, RESERVED, S);
        assert!(
            store
                .insert_if_absent(&ns, &format!("k{i}"), &rec)
                .await
                .unwrap()
                .is_none()
        );
    }
    clock.advance(2 * S);
    let mut tasks = Vec::new();
    for i in 0..64_i64 {
        let (store, ns) = (store.clone(), ns.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("k{i}");
            let mine = 10_000 + i;
            let leased = Write::leased(mine, RESERVED, 60 * S);
            if i % 2 == 0 {
                // A lapsed lease: taken over with its token, not with another.
                assert!(!store.take_over(&ns, &key, 7, &leased).await.unwrap());
                assert!(
                    store
                        .take_over(&ns, &key, 1_000 + i, &leased)
                        .await
                        .unwrap()
                );
                // Live now: not taken over again.
                assert!(!store.take_over(&ns, &key, mine, &leased).await.unwrap());
            } else {
                assert!(
                    store
                        .insert_if_absent(&ns, &key, &leased)
                        .await
                        .unwrap()
                        .is_none()
                );
            }
            let seen = store.insert_if_absent(&ns, &key, &leased).await.unwrap();
            assert_eq!(
                seen.map(|s| s.record.token),
                Some(mine),
                "{key}: the second insert loses"
            );
            assert!(!store.renew(&ns, &key, mine + 1, 60 * S).await.unwrap());
            assert!(store.renew(&ns, &key, mine, 60 * S).await.unwrap());
            let mut done = Write::finished(mine + 1, "done", Some(3_600 * S));
            done.value = Some(format!("\"answer {i}\""));
            done.fingerprint = vec![u8::try_from(i).unwrap(), 0, 255];
            assert!(!store.replace(&ns, &key, mine + 1, &done).await.unwrap());
            assert!(store.replace(&ns, &key, mine, &done).await.unwrap());
            if i % 4 == 1 {
                assert!(!store.remove(&ns, &key, mine).await.unwrap());
                assert!(store.remove(&ns, &key, mine + 1).await.unwrap());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for i in 0..64_i64 {
        let seen = store.get(&ns, &format!("k{i}")).await.unwrap();
        if i % 4 == 1 {
            assert!(seen.is_none(), "k{i} was removed");
            continue;
        }
        let r = seen.expect("kept").record;
        assert_eq!(r.token, 10_001 + i);
        assert_eq!(r.state, "done");
        assert_eq!(r.value.as_deref(), Some(format!("\"answer {i}\"").as_str()));
        assert_eq!(r.fingerprint, vec![u8::try_from(i).unwrap(), 0, 255]);
        assert!(
            r.lease_until.is_none() && r.expires_at.is_some(),
            "k{i}: finished, retained"
        );
    }
}

/// Keys are kept exactly, whatever bytes they carry (they can come from the network: a nonce,
/// an offer id): quotes, backslashes, SQL and JSON syntax, non-ASCII, a long key, and a key that
/// is another's prefix. Written at once, so a store that batches writes encodes them in its
/// batch; each is read back as itself and never as another.
pub async fn odd_keys_are_kept_exactly(store: &Arc<dyn KeyStore>, ns: &str) {
    let ns = format!("{ns}-odd");
    let mut keys: Vec<String> = [
        "plain",
        "plain2",
        "quote'd",
        "dq\"uote",
        "back\\slash",
        "json\":{}[]",
        "'); DROP TABLE rail_keys; --",
        "naïve ключ 鍵 🔑",
        "tab\tnew\nline",
        "%_wild*",
        "",
    ]
    .iter()
    .map(|k| (*k).to_owned())
    .collect();
    keys.push("x".repeat(4_096));
    let mut tasks = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let (store, ns, key) = (store.clone(), ns.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let token = 500 + i64::try_from(i).unwrap();
            let w = Write::leased(token, RESERVED, 60 * S);
            assert!(
                store
                    .insert_if_absent(&ns, &key, &w)
                    .await
                    .unwrap()
                    .is_none(),
                "{key:?}"
            );
            let done = Write::finished(token + 1, "done", Some(60 * S));
            assert!(
                store.replace(&ns, &key, token, &done).await.unwrap(),
                "{key:?}"
            );
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for (i, key) in keys.iter().enumerate() {
        let r = store.get(&ns, key).await.unwrap().expect("kept").record;
        assert_eq!(
            r.token,
            501 + i64::try_from(i).unwrap(),
            "{key:?} read back as another key"
        );
    }
    assert!(
        store.get(&ns, "plai").await.unwrap().is_none(),
        "a prefix is not a key"
    );
}

/// A counter counts in its window (1, 2, 3…), says how long the window still runs, starts again
/// at 1 once the window ended, is a record of its own kind (forgotten by the purge once its
/// window ended), and refuses to count over a record of another kind (which stays as it was).
pub async fn counters_count_in_windows(store: &Arc<dyn KeyStore>, clock: &ManualClock, ns: &str) {
    let ns = format!("{ns}-count");
    let minute = 60 * S;
    let tally = |count, left| Tally { count, left };
    assert_eq!(
        store.count(&ns, "a", minute).await.unwrap(),
        tally(1, minute)
    );
    assert_eq!(
        store.count(&ns, "a", minute).await.unwrap(),
        tally(2, minute)
    );
    assert_eq!(
        store.count(&ns, "b", minute).await.unwrap(),
        tally(1, minute),
        "another key counts apart"
    );
    clock.advance(20 * S);
    assert_eq!(
        store.count(&ns, "a", minute).await.unwrap(),
        tally(3, 40 * S),
        "the window opened at the first event"
    );
    let seen = store
        .get(&ns, "a")
        .await
        .unwrap()
        .expect("a counter is a record");
    assert_eq!(seen.record.state, COUNTED);
    assert_eq!(seen.record.value.as_deref(), Some("3"));
    clock.advance(40 * S);
    assert_eq!(
        store.count(&ns, "a", minute).await.unwrap(),
        tally(1, minute),
        "the next window starts again"
    );
    clock.advance(minute);
    assert!(store.purge_expired().await.unwrap() >= 2);
    assert!(store.get(&ns, "a").await.unwrap().is_none(), "purged");
    assert!(store.get(&ns, "b").await.unwrap().is_none(), "purged");
    assert_eq!(
        store.count(&ns, "a", minute).await.unwrap(),
        tally(1, minute)
    );

    let w = Write::leased(77, RESERVED, 10 * S);
    assert!(
        store
            .insert_if_absent(&ns, "held", &w)
            .await
            .unwrap()
            .is_none()
    );
    let refused = store.count(&ns, "held", minute).await;
    assert!(
        matches!(refused, Err(RailError::Storage(_))),
        "{refused:?}: a record of another kind is no counter"
    );
    let seen = store.get(&ns, "held").await.unwrap().expect("untouched");
    assert_eq!(
        (seen.record.token, seen.record.state.as_str()),
        (77, RESERVED)
    );
}

/// Concurrent counters of one key each get a count of their own: 1 to n, none twice, none lost.
pub async fn counters_under_contention(store: &Arc<dyn KeyStore>, ns: &str) {
    let ns = format!("{ns}-count-hot");
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (store, ns) = (store.clone(), ns.clone());
            tokio::spawn(async move { store.count(&ns, "hot", 60 * S).await.unwrap().count })
        })
        .collect();
    let mut counts = Vec::new();
    for t in tasks {
        counts.push(t.await.unwrap());
    }
    counts.sort_unstable();
    assert_eq!(counts, (1..=32).collect::<Vec<u64>>());
}

/// A deferred handle's writes ([`KeyStore::deferred`]) are seen at once by every other handle
/// of the store and hold keys as any write does; its `sync` succeeds. Nothing for a store
/// without deferred writes.
pub async fn deferred_writes_are_seen_at_once(store: &Arc<dyn KeyStore>, ns: &str) {
    let Some(quick) = store.deferred() else {
        store
            .sync()
            .await
            .expect("a durable store's sync is a no-op");
        return;
    };
    let ns = format!("{ns}-deferred");
    let mine = ReplayGuard::new(quick.clone(), ns.clone());
    let theirs = ReplayGuard::new(store.clone(), ns.clone());
    let r = fresh(mine.claim("k", Duration::from_secs(60)).await.unwrap());
    assert!(
        matches!(
            theirs.claim("k", Duration::from_secs(60)).await.unwrap(),
            Claim::Busy { .. }
        ),
        "a deferred claim was not seen by another handle"
    );
    r.commit(Some(Duration::from_secs(3600))).await.unwrap();
    quick.sync().await.unwrap();
    assert!(matches!(
        theirs.claim("k", Duration::from_secs(60)).await.unwrap(),
        Claim::Finished(_)
    ));
    // Two deferred handles contend as two clients: one wins.
    let other = ReplayGuard::new(store.deferred().unwrap(), ns.clone());
    let (a, b) = tokio::join!(
        mine.claim("both", Duration::from_secs(60)),
        other.claim("both", Duration::from_secs(60))
    );
    let won = [a.unwrap(), b.unwrap()]
        .iter()
        .filter(|c| matches!(c, Claim::Fresh(_)))
        .count();
    assert_eq!(won, 1, "two deferred handles both won a key");
}
