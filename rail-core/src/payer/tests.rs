use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::error::{RailError, RailReason, RailResult};
use crate::keys::{KeyStore, MemoryKeyStore, Seen, Write};
use crate::money::{Asset, Money};
use crate::rail::{Capabilities, Finality, Payer, Rail};
use crate::types::{Offer, OpId, Payment, PaymentMode, RailId};

/// A payer that counts its payments; it can be told to block (to drop its future mid-payment)
/// or to fail.
#[derive(Default)]
struct Counting {
    paid: AtomicU32,
    found: AtomicU32,
    block: tokio::sync::Notify,
    blocking: std::sync::atomic::AtomicBool,
    fail: std::sync::Mutex<Option<RailError>>,
}

impl Rail for Counting {
    fn id(&self) -> RailId {
        RailId::new("counting")
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::pay_only(Finality::Immediate, vec![Asset::usd()])
    }
}

fn payment(offer: &Offer, n: u32) -> Payment {
    Payment {
        rail: RailId::new("counting"),
        offer_id: offer.id.clone(),
        mode: PaymentMode::Capture,
        payer: format!("payer-{n}"),
        amount: offer.amount.clone(),
        proof: serde_json::json!({ "n": n }),
    }
}

#[async_trait]
impl Payer for Counting {
    async fn pay(&self, _op: &OpId, offer: &Offer) -> RailResult<Payment> {
        if let Some(e) = self.fail.lock().unwrap().take() {
            return Err(e);
        }
        let n = self.paid.fetch_add(1, Ordering::SeqCst) + 1;
        if self.blocking.load(Ordering::SeqCst) {
            self.block.notified().await;
        }
        Ok(payment(offer, n))
    }
}

#[async_trait]
impl FindPayment for Counting {
    async fn find_payment(
        &self,
        _op: &OpId,
        offer: &Offer,
        _mode: PaymentMode,
    ) -> RailResult<Option<Payment>> {
        self.found.fetch_add(1, Ordering::SeqCst);
        // The rail says: the earlier attempt paid (it counted one payment).
        Ok((self.paid.load(Ordering::SeqCst) > 0).then(|| payment(offer, 1)))
    }
}

fn usd(s: &str) -> Money {
    Money::parse(Asset::usd(), s).unwrap()
}

fn offer(amount: &str) -> Offer {
    Offer {
        rail: RailId::new("counting"),
        id: format!("q_{}", rand::random::<u64>()),
        amount: usd(amount),
        payee: "shop".into(),
        mode: PaymentMode::Capture,
        expires_at: Timestamp(i64::MAX),
        details: serde_json::Value::Null,
    }
}

fn store() -> (Arc<dyn KeyStore>, ManualClock) {
    let clock = ManualClock::at(Timestamp(1_000_000_000));
    (
        Arc::new(MemoryKeyStore::with_clock(Arc::new(clock.clone()))),
        clock,
    )
}

#[tokio::test]
async fn idempotent_pays_once_per_operation() {
    let (store, _) = store();
    let p = Idempotent::new(Counting::default(), store);
    let (op, o) = (OpId::random(), offer("1.00"));
    let first = p.pay(&op, &o).await.unwrap();
    assert_eq!(p.pay(&op, &o).await.unwrap(), first);
    assert_eq!(p.inner().paid.load(Ordering::SeqCst), 1);
    assert!(matches!(
        p.pay(&op, &offer("2.00")).await,
        Err(RailError::IdempotencyConflict { .. })
    ));
}

/// The first attempt's future is dropped while the payment is on the wire (the caller timed
/// out). A retry before its lease lapses is told to wait; after it lapses, the retry asks the
/// rail and returns the payment that went through — it never pays again.
#[tokio::test]
async fn a_dropped_attempt_is_recovered_from_the_rail() {
    let (store, clock) = store();
    let p = Arc::new(Idempotent::new(Counting::default(), store));
    p.inner().blocking.store(true, Ordering::SeqCst);
    let (op, o) = (OpId::random(), offer("1.00"));
    let task = {
        let (p, op, o) = (p.clone(), op.clone(), o.clone());
        tokio::spawn(async move { p.pay(&op, &o).await })
    };
    while p.inner().paid.load(Ordering::SeqCst) == 0 {
        tokio::task::yield_now().await;
    }
    task.abort();
    let _ = task.await;
    p.inner().blocking.store(false, Ordering::SeqCst);
    assert!(matches!(
        p.pay(&op, &o).await,
        Err(RailError::InProgress { .. })
    ));
    clock.advance(Duration::from_secs(61));
    let recovered = p.pay(&op, &o).await.unwrap();
    assert_eq!(recovered.payer, "payer-1");
    assert_eq!(p.inner().paid.load(Ordering::SeqCst), 1, "never paid twice");
    assert_eq!(p.inner().found.load(Ordering::SeqCst), 1);
    assert_eq!(p.pay(&op, &o).await.unwrap(), recovered);
}

fn limits(per_payment: &str, per_day: &str, total: &str) -> BudgetLimits {
    BudgetLimits {
        per_payment: Some(usd(per_payment)),
        per_period: Some((Duration::from_secs(24 * 3600), usd(per_day))),
        total: Some(usd(total)),
    }
}

#[tokio::test]
async fn spend_limit_refuses_before_paying_and_counts_each_operation_once() {
    let (store, clock) = store();
    let budget = Budget::new(store.clone(), "agent", limits("5.00", "8.00", "12.00")).unwrap();
    let p = SpendLimit::new(Idempotent::new(Counting::default(), store.clone()), budget);
    let refused = p.pay(&OpId::random(), &offer("5.01")).await.unwrap_err();
    assert_eq!(refused.code(), "limit_exceeded");
    assert!(refused.to_string().contains("per_payment"), "{refused}");
    let op = OpId::random();
    let o = offer("5.00");
    p.pay(&op, &o).await.unwrap();
    p.pay(&op, &o).await.unwrap(); // a retry is counted once
    p.pay(&OpId::random(), &offer("3.00")).await.unwrap();
    let e = p.pay(&OpId::random(), &offer("0.01")).await.unwrap_err();
    assert!(
        e.to_string().contains("per_period limit leaves 0 USD"),
        "{e}"
    );
    assert_eq!(
        p.budget().spent().await.unwrap(),
        (usd("8.00"), usd("8.00"))
    );
    assert_eq!(
        p.inner().inner().paid.load(Ordering::SeqCst),
        2,
        "refusals paid nothing"
    );
    // The next day: the period is fresh, the total is not.
    clock.advance(Duration::from_secs(24 * 3600));
    p.pay(&OpId::random(), &offer("4.00")).await.unwrap();
    let e = p.pay(&OpId::random(), &offer("0.01")).await.unwrap_err();
    assert!(e.to_string().contains("total"), "{e}");
    // Durable: another process's budget over the same store sees the same spending.
    let again = Budget::new(store, "agent", limits("5.00", "8.00", "12.00")).unwrap();
    assert_eq!(again.spent().await.unwrap(), (usd("4.00"), usd("12.00")));
}

#[tokio::test]
async fn a_refused_payment_gives_its_budget_back_an_unknown_one_keeps_it() {
    let (store, _) = store();
    let budget = Budget::new(store.clone(), "agent", limits("5.00", "100.00", "100.00")).unwrap();
    let p = SpendLimit::new(Counting::default(), budget);
    *p.inner().fail.lock().unwrap() =
        Some(RailError::Declined(RailReason::new("card_declined", "")));
    let (op, o) = (OpId::random(), offer("5.00"));
    assert!(p.pay(&op, &o).await.is_err());
    assert_eq!(p.budget().spent().await.unwrap().1, usd("0.00"));
    // The same operation tried again after the refusal is counted again (and paid).
    p.pay(&op, &o).await.unwrap();
    assert_eq!(p.budget().spent().await.unwrap().1, usd("5.00"));
    *p.inner().fail.lock().unwrap() = Some(RailError::Unavailable(RailReason::new("timeout", "")));
    assert!(p.pay(&OpId::random(), &offer("5.00")).await.is_err());
    assert_eq!(
        p.budget().spent().await.unwrap().1,
        usd("10.00"),
        "may have paid: kept"
    );
}

/// A hold counted in full and captured in part gives the rest back once: a retry of the
/// give-back, more than was counted, or an operation never counted change nothing.
#[tokio::test]
async fn a_partial_give_back_returns_the_uncaptured_part_once() {
    let (store, _) = store();
    let budget = Budget::new(store.clone(), "agent", limits("5.00", "8.00", "12.00")).unwrap();
    let p = SpendLimit::new(Idempotent::new(Counting::default(), store.clone()), budget);
    let op = OpId::random();
    p.pay(&op, &offer("5.00")).await.unwrap();
    let b = p.budget();
    assert_eq!(b.spent().await.unwrap(), (usd("5.00"), usd("5.00")));
    let e = b.give_back(&op, &usd("5.01")).await.unwrap_err();
    assert_eq!(e.code(), "invalid_input", "{e}");
    b.give_back(&op, &usd("3.75")).await.unwrap();
    assert_eq!(b.spent().await.unwrap(), (usd("1.25"), usd("1.25")));
    b.give_back(&op, &usd("3.75")).await.unwrap(); // a retry gives nothing more
    assert_eq!(b.spent().await.unwrap(), (usd("1.25"), usd("1.25")));
    let e = b
        .give_back(&OpId::random(), &usd("1.00"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_input", "{e}");
    assert_eq!(b.spent().await.unwrap().1, usd("1.25"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_payments_never_overspend() {
    let (store, _) = store();
    let budget = Budget::new(store.clone(), "agent", limits("1.00", "5.00", "5.00")).unwrap();
    let p = Arc::new(SpendLimit::new(Counting::default(), budget));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let p = p.clone();
        tasks.push(tokio::spawn(async move {
            p.pay(&OpId::random(), &offer("1.00")).await.is_ok()
        }));
    }
    let mut ok = 0;
    for t in tasks {
        if t.await.unwrap() {
            ok += 1;
        }
    }
    assert_eq!(ok, 5);
    assert_eq!(p.inner().paid.load(Ordering::SeqCst), 5);
}

#[test]
fn budgets_need_one_asset_and_a_limit() {
    let (store, _) = store();
    let none = BudgetLimits {
        per_payment: None,
        per_period: None,
        total: None,
    };
    assert!(Budget::new(store.clone(), "x", none).is_err());
    let mixed = BudgetLimits {
        per_payment: Some(usd("1")),
        per_period: None,
        total: Some(Money::parse(Asset::btc(), "1").unwrap()),
    };
    assert!(Budget::new(store, "x", mixed).is_err());
}

/// A store whose writes of budget counters take a while (as a durable commit does) and can be
/// told to fail; it counts them.
#[derive(Debug)]
struct SlowCounters {
    inner: MemoryKeyStore,
    writes: AtomicU32,
    fail_next: std::sync::atomic::AtomicBool,
}

impl SlowCounters {
    async fn slow_write<T>(
        &self,
        ns: &str,
        w: impl Future<Output = RailResult<T>>,
    ) -> RailResult<T> {
        if ns == "budget" {
            tokio::time::sleep(Duration::from_millis(5)).await;
            self.writes.fetch_add(1, Ordering::SeqCst);
            if self.fail_next.swap(false, Ordering::SeqCst) {
                return Err(RailError::Storage("disk I/O error (injected)".into()));
            }
        }
        w.await
    }
}

#[async_trait]
impl KeyStore for SlowCounters {
    async fn insert_if_absent(&self, ns: &str, key: &str, rec: &Write) -> RailResult<Option<Seen>> {
        self.slow_write(ns, self.inner.insert_if_absent(ns, key, rec))
            .await
    }
    async fn replace(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.slow_write(ns, self.inner.replace(ns, key, token, rec))
            .await
    }
    async fn take_over(&self, ns: &str, key: &str, token: i64, rec: &Write) -> RailResult<bool> {
        self.inner.take_over(ns, key, token, rec).await
    }
    async fn renew(&self, ns: &str, key: &str, token: i64, lease: Duration) -> RailResult<bool> {
        self.inner.renew(ns, key, token, lease).await
    }
    async fn remove(&self, ns: &str, key: &str, token: i64) -> RailResult<bool> {
        self.inner.remove(ns, key, token).await
    }
    async fn get(&self, ns: &str, key: &str) -> RailResult<Option<Seen>> {
        self.inner.get(ns, key).await
    }
    async fn purge_expired(&self) -> RailResult<u64> {
        self.inner.purge_expired().await
    }
    async fn now(&self) -> RailResult<Timestamp> {
        self.inner.now().await
    }
}

fn slow_counters() -> Arc<SlowCounters> {
    Arc::new(SlowCounters {
        inner: MemoryKeyStore::default(),
        writes: AtomicU32::new(0),
        fail_next: std::sync::atomic::AtomicBool::new(false),
    })
}

/// `n` spends of `amount`, each of a fresh operation, started at once.
fn spawn_reserves(
    budget: &Budget,
    n: usize,
    amount: &str,
) -> Vec<tokio::task::JoinHandle<RailResult<Spend>>> {
    (0..n)
        .map(|_| {
            let (b, m) = (budget.clone(), usd(amount));
            tokio::spawn(async move { b.reserve(&OpId::random(), &m).await })
        })
        .collect()
}

/// `n` spends of one dollar queued behind the turn, which the caller holds until it drops the
/// guard.
async fn queued_behind_the_turn(
    budget: &Budget,
    n: usize,
) -> (
    tokio::sync::MutexGuard<'_, ()>,
    Vec<tokio::task::JoinHandle<RailResult<Spend>>>,
) {
    let turn = budget.combiner.turn.lock().await;
    let tasks = spawn_reserves(budget, n, "1.00");
    while budget.combiner.queue.lock().unwrap().len() < n {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (turn, tasks)
}

/// Reserves `n` spends of `amount` at once; their outcomes.
async fn reserve_at_once(budget: &Budget, n: usize, amount: &str) -> Vec<RailResult<Spend>> {
    let tasks = spawn_reserves(budget, n, amount);
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// Concurrent spends of one budget share counter writes (one per batch, not one per payment),
/// and each is still checked against the limits in order: exactly what the limit allows is
/// counted, the rest refused, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_spends_share_counter_writes_and_still_respect_the_limit() {
    let store = slow_counters();
    let budget = Budget::new(store.clone(), "agent", limits("1.00", "40.00", "40.00")).unwrap();
    let out = reserve_at_once(&budget, 64, "1.00").await;
    let ok = out.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 40);
    for r in &out {
        if let Err(e) = r {
            assert_eq!(e.code(), "limit_exceeded", "{e}");
        }
    }
    assert_eq!(budget.spent().await.unwrap(), (usd("40.00"), usd("40.00")));
    let writes = store.writes.load(Ordering::SeqCst);
    assert!(
        writes < 20,
        "64 concurrent spends took {writes} counter writes: they were not combined"
    );
    for s in out.into_iter().flatten() {
        s.keep().await.unwrap();
    }
}

/// A batch whose write fails acknowledges none of the spends it carried, and counts nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_counter_write_fails_acknowledges_nothing() {
    let store = slow_counters();
    let budget = Budget::new(store.clone(), "agent", limits("1.00", "100.00", "100.00")).unwrap();
    // The record exists first (the batch's write is then a replace).
    budget
        .reserve(&OpId::random(), &usd("1.00"))
        .await
        .unwrap()
        .keep()
        .await
        .unwrap();
    let before = store.writes.load(Ordering::SeqCst);
    // Hold the turn so that the spends queue up behind it, then fail the write that carries
    // them.
    let (turn, tasks) = queued_behind_the_turn(&budget, 8).await;
    store.fail_next.store(true, Ordering::SeqCst);
    drop(turn);
    for t in tasks {
        let e = t.await.unwrap().unwrap_err();
        assert_eq!(e.code(), "storage_error", "{e}");
    }
    assert_eq!(
        store.writes.load(Ordering::SeqCst) - before,
        1,
        "eight spends, one failed write"
    );
    assert_eq!(
        budget.spent().await.unwrap().1,
        usd("1.00"),
        "nothing counted"
    );
    // Their operations can be tried again (their markers were freed) and are counted then.
    let again = reserve_at_once(&budget, 8, "1.00").await;
    assert!(again.iter().all(Result::is_ok));
    assert_eq!(budget.spent().await.unwrap().1, usd("9.00"));
}

/// A lost answer: a spend whose caller gives up while its batch is being written (here, the
/// first of eight, which may be the one writing) leaves every other spend answered, and the
/// write carries all eight — counted, never under-counted (the abandoned one's marker lapses
/// and a retry of its operation is counted again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spend_abandoned_mid_batch_leaves_the_others_answered() {
    let store = slow_counters();
    let budget = Budget::new(store.clone(), "agent", limits("1.00", "100.00", "100.00")).unwrap();
    let (turn, mut tasks) = queued_behind_the_turn(&budget, 8).await;
    drop(turn);
    tokio::time::sleep(Duration::from_millis(1)).await;
    tasks.remove(0).abort();
    for t in tasks {
        t.await.unwrap().unwrap().keep().await.unwrap();
    }
    assert_eq!(budget.spent().await.unwrap().1, usd("8.00"));
}

/// A payer that, when asked, notes whether every commit of `db` is durable, and whose repeat is
/// safe or not as told.
#[cfg(feature = "sqlite")]
struct Noting {
    db: crate::sqlite::SqliteDb,
    repeat_is_safe: bool,
    durable_when_asked: std::sync::Mutex<Option<bool>>,
}

#[cfg(feature = "sqlite")]
impl Rail for Noting {
    fn id(&self) -> RailId {
        RailId::new("counting")
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::pay_only(Finality::Immediate, vec![Asset::usd()])
    }
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl Payer for Noting {
    async fn pay(&self, _op: &OpId, offer: &Offer) -> RailResult<Payment> {
        let durable = self.db.durable_through() >= self.db.last_commit();
        *self.durable_when_asked.lock().unwrap() = Some(durable);
        Ok(payment(offer, 1))
    }
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl FindPayment for Noting {
    async fn find_payment(
        &self,
        _op: &OpId,
        _offer: &Offer,
        _mode: PaymentMode,
    ) -> RailResult<Option<Payment>> {
        Ok(None)
    }
    fn repeat_is_safe(&self) -> bool {
        self.repeat_is_safe
    }
}

/// A payer that must look its earlier attempts up has its claim on disk before the rail is
/// asked; one whose repeat is safe (the rail answers it) writes its records without an `fsync`
/// of their own, and a repeat still returns the first payment.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn an_operation_is_durable_before_the_rail_unless_its_repeat_is_safe() {
    use crate::keys::sql::SqliteKeyStore;
    for safe in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let keys = SqliteKeyStore::open(&dir.path().join("records.db"))
            .await
            .unwrap();
        let db = keys.db().clone();
        let p = Idempotent::new(
            Noting {
                db: db.clone(),
                repeat_is_safe: safe,
                durable_when_asked: std::sync::Mutex::new(None),
            },
            Arc::new(keys),
        );
        let (op, o) = (OpId::random(), offer("1.00"));
        let syncs = db.stats().syncs;
        let first = p.pay(&op, &o).await.unwrap();
        let asked = p.inner().durable_when_asked.lock().unwrap().take();
        assert_eq!(asked, Some(!safe), "repeat safe: {safe}");
        assert_eq!(
            db.stats().syncs == syncs,
            safe,
            "the records' own fsyncs (repeat safe: {safe})"
        );
        assert_eq!(p.pay(&op, &o).await.unwrap(), first);
        assert!(p.inner().durable_when_asked.lock().unwrap().is_none());
    }
}
