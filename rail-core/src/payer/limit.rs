//! [`SpendLimit`] and its durable [`Budget`]: limits per payment, per period and in total.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::{RailError, RailResult};
use crate::keys::{
    Claim, KeyStore, ReplayGuard, Reservation, Write, fingerprint, millis, new_token,
};
use crate::money::{Asset, Money};
use crate::rail::{Capabilities, HoldPayer, Payer, Rail};
use crate::types::{Offer, OpId, Payment, RailId};

/// Namespace of budget records in the key store.
const NS: &str = "budget";

/// What a [`Budget`] allows. Every amount is in one asset; `None` = no such limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetLimits {
    /// The most one payment may be.
    pub per_payment: Option<Money>,
    /// The most that may be spent in one period (periods are aligned on the Unix epoch: a
    /// period of one day is a UTC calendar day).
    pub per_period: Option<(Duration, Money)>,
    /// The most that may ever be spent.
    pub total: Option<Money>,
}

impl BudgetLimits {
    fn asset(&self) -> RailResult<Option<Asset>> {
        let mut assets = [
            self.per_payment.as_ref(),
            self.per_period.as_ref().map(|(_, m)| m),
            self.total.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|m| m.asset().clone());
        let first = assets.next();
        if let Some(a) = &first
            && assets.any(|b| &b != a)
        {
            return Err(RailError::InvalidInput(
                "a budget's limits must all be in one asset".into(),
            ));
        }
        Ok(first)
    }
}

/// The counters of one budget (JSON in the key store): a few numbers, whatever the number of
/// payments.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct State {
    /// Index of the current period (`now / period`), 0 without a period limit.
    period: i64,
    period_spent: Money,
    total_spent: Money,
}

/// What one counted operation left: its amount and the period it was counted in.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Counted {
    amount: Money,
    period: i64,
}

/// A durable spending budget, shared by every process that uses the same store: one counter
/// record per scope (an agent, a mandate, a receiver within a mandate), updated by
/// compare-and-set, so concurrent payments never overspend it; one marker per counted operation,
/// so a retry is counted once. Times are the store's clock.
#[derive(Clone, Debug)]
pub struct Budget {
    store: Arc<dyn KeyStore>,
    scope: String,
    ops: ReplayGuard,
    asset: Asset,
    limits: BudgetLimits,
    /// Updates of this budget from this process (its clones) are combined: whoever holds the
    /// turn applies every update queued meanwhile and writes the counters once for all of them
    /// (one commit for a batch of payments instead of one each). Across processes sharing the
    /// store, compare-and-set still decides.
    pub(super) combiner: Arc<Combiner>,
}

/// A change of the counters, applied to a copy of them.
type Apply = Box<dyn Fn(&mut State) -> RailResult<()> + Send + Sync>;

/// One queued change of a budget's counters: applied to a copy of the state (a refusal leaves
/// the state as it was), answered once the write that carries it is committed, with the period
/// it was counted in.
pub(super) struct Job {
    apply: Apply,
    done: tokio::sync::oneshot::Sender<RailResult<i64>>,
}

/// The updates of one budget record in this process: a queue and a turn.
#[derive(Default)]
pub(super) struct Combiner {
    pub(super) queue: std::sync::Mutex<Vec<Job>>,
    pub(super) turn: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Combiner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Combiner").finish_non_exhaustive()
    }
}

/// Money counted against a [`Budget`] for one operation. While the payment runs its marker is
/// held (a concurrent retry of the operation waits); [`Spend::keep`] or [`Spend::release`] it
/// once the outcome is known. Dropped without either, the marker lapses and the next attempt
/// counts the operation again (never less than what was spent).
#[derive(Debug)]
#[must_use = "keep or release a spend once the payment's outcome is known"]
pub struct Spend {
    budget: Budget,
    amount: Money,
    /// This attempt's marker and what it counted; `None`: counted by an earlier attempt.
    marker: Option<(Reservation, Counted)>,
}

impl Spend {
    /// The amount counted.
    #[must_use]
    pub fn amount(&self) -> &Money {
        &self.amount
    }

    /// Whether this call counted it (`false`: the operation was counted before, by an earlier
    /// attempt).
    #[must_use]
    pub fn counted_now(&self) -> bool {
        self.marker.is_some()
    }

    /// Runs `work` (the payment) while keeping the operation's marker alive.
    pub async fn keep_alive<F: Future>(&self, work: F) -> F::Output {
        match &self.marker {
            Some((r, _)) => r.keep_alive(work).await,
            None => work.await,
        }
    }

    /// The payment happened (or may have): the amount stays counted.
    ///
    /// # Errors
    /// [`RailError::Storage`] (the marker then lapses and a retry counts the operation again:
    /// never less than what was spent).
    pub async fn keep(self) -> RailResult<()> {
        let Some((marker, counted)) = self.marker else {
            return Ok(());
        };
        marker
            .finish_with(
                "counted",
                Some(encode(&counted)?),
                Some(self.budget.marker_retention()),
            )
            .await
    }

    /// The payment did not happen, for certain: give the amount back. Does nothing for an
    /// operation counted by an earlier attempt.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn release(self) -> RailResult<()> {
        let Some((marker, counted)) = self.marker else {
            return Ok(());
        };
        // The counters first, the marker last: a crash between leaves a lapsing marker, and the
        // next attempt counts the operation afresh.
        let undo = counted.clone();
        self.budget
            .update(move |st| {
                let counted = &undo;
                if st.period == counted.period {
                    st.period_spent = st.period_spent.checked_sub(&counted.amount)?;
                }
                st.total_spent = st.total_spent.checked_sub(&counted.amount)?;
                Ok(())
            })
            .await?;
        marker.release().await
    }
}

/// Namespace of the operation markers of budget `scope`.
fn ops_ns(scope: &str) -> String {
    format!("{NS}-ops/{scope}")
}

/// `e` again, for each update of a batch that failed with it (the error types are not
/// `Clone`: a store's failure is kept as it was, anything else as a storage error naming it).
fn shared(e: &RailError) -> RailError {
    match e {
        RailError::Unavailable(r) => RailError::Unavailable(r.clone()),
        RailError::Storage(m) => RailError::Storage(m.clone()),
        other => RailError::Storage(other.to_string()),
    }
}

fn decode<T: serde::de::DeserializeOwned>(v: Option<&str>, what: &str) -> RailResult<T> {
    serde_json::from_str(v.unwrap_or_default())
        .map_err(|e| RailError::Storage(format!("budget record {what}: {e}")))
}

fn encode<T: Serialize>(v: &T) -> RailResult<String> {
    serde_json::to_string(v).map_err(|e| RailError::Storage(format!("budget record: {e}")))
}

/// What `max` still allows after `spent` (zero when a lowered limit is already exceeded).
fn left(max: &Money, spent: &Money) -> Money {
    max.checked_sub(spent)
        .unwrap_or_else(|_| Money::zero(max.asset().clone()))
}

fn exceeded(limit: &str, left: &Money, asked: &Money) -> RailError {
    RailError::LimitExceeded {
        limit: limit.to_owned(),
        left: left.to_string(),
        asked: asked.to_string(),
    }
}

/// The combiner of the budget `scope` in `store` in this process: every `Budget` value for the
/// same record (a wallet makes one per payment) queues on the same one.
fn combiner_of(store: &Arc<dyn KeyStore>, scope: &str) -> Arc<Combiner> {
    type Combiners = HashMap<(usize, String), Weak<Combiner>>;
    static COMBINERS: LazyLock<std::sync::Mutex<Combiners>> = LazyLock::new(Default::default);
    // The store's address names it: two handles on one store share its combiners.
    let key = (Arc::as_ptr(store).cast::<()>() as usize, scope.to_owned());
    let Ok(mut all) = COMBINERS.lock() else {
        return Arc::default();
    };
    if let Some(c) = all.get(&key).and_then(Weak::upgrade) {
        return c;
    }
    if all.len() >= 1024 {
        all.retain(|_, c| c.strong_count() > 0);
    }
    let c: Arc<Combiner> = Arc::default();
    all.insert(key, Arc::downgrade(&c));
    c
}

impl Budget {
    /// Refuses, without counting anything, an amount in another asset or above the
    /// per-payment limit: the checks that do not depend on what was spent.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] (another asset), [`RailError::LimitExceeded`].
    pub fn check_per_payment(&self, amount: &Money) -> RailResult<()> {
        if amount.asset() != &self.asset {
            return Err(RailError::InvalidInput(format!(
                "a budget in {} cannot count a payment in {}",
                self.asset,
                amount.asset()
            )));
        }
        match &self.limits.per_payment {
            Some(max) if amount.amount() > max.amount() => {
                Err(exceeded("per_payment", max, amount))
            }
            _ => Ok(()),
        }
    }

    /// A budget for `scope` (records in `store`) with `limits`.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] if the limits name more than one asset, none at all, or a
    /// zero period.
    pub fn new(
        store: Arc<dyn KeyStore>,
        scope: impl Into<String>,
        limits: BudgetLimits,
    ) -> RailResult<Self> {
        if limits
            .per_period
            .as_ref()
            .is_some_and(|(p, _)| p.as_millis() == 0)
        {
            return Err(RailError::InvalidInput(
                "a budget period must not be zero".into(),
            ));
        }
        let scope = scope.into();
        Ok(Budget {
            ops: ReplayGuard::new(store.clone(), ops_ns(&scope)),
            combiner: combiner_of(&store, &scope),
            store,
            scope,
            asset: limits.asset()?.ok_or_else(|| {
                RailError::InvalidInput("a budget needs at least one limit".into())
            })?,
            limits,
        })
    }

    /// Keeps the operations' markers through `markers` (a handle on the same store, such as a
    /// deferred one: [`KeyStore::deferred`]) while the counters, combined across this process's
    /// calls, stay on the store the budget was made with. A marker written through a deferred
    /// handle is made durable by the counters' write that follows it (when both live in one
    /// file) or by that handle's sync.
    #[must_use]
    pub fn with_markers(mut self, markers: Arc<dyn KeyStore>) -> Self {
        self.ops = ReplayGuard::new(markers, ops_ns(&self.scope));
        self
    }

    /// The limits.
    #[must_use]
    pub fn limits(&self) -> &BudgetLimits {
        &self.limits
    }

    fn period_of(&self, now: Timestamp) -> i64 {
        match &self.limits.per_period {
            Some((p, _)) => now.millis().div_euclid(millis(*p).max(1)),
            None => 0,
        }
    }

    /// How long an operation's marker is kept: two periods (a retry across a period boundary
    /// is still recognised), at least a day.
    fn marker_retention(&self) -> Duration {
        let day = Duration::from_secs(24 * 3600);
        self.limits
            .per_period
            .as_ref()
            .map_or(day, |(p, _)| (*p * 2).max(day))
    }

    /// Applies `f` to the counters, in one write with every other update of this budget queued
    /// in this process meanwhile; answers, with the period it was counted in, once that write is
    /// committed. `f` sees a copy of the state: when it refuses, nothing of it is kept and the
    /// others' changes still are.
    async fn update(
        &self,
        f: impl Fn(&mut State) -> RailResult<()> + Send + Sync + 'static,
    ) -> RailResult<i64> {
        let (done, mut answer) = tokio::sync::oneshot::channel();
        // The queue holds no invariant a panic could break (a push, a take): a poisoned lock is
        // used as it is.
        let queue = || {
            self.combiner
                .queue
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        queue().push(Job {
            apply: Box::new(f),
            done,
        });
        let dropped = || RailError::Storage("a budget update was dropped unanswered".into());
        let _turn = self.combiner.turn.lock().await;
        // Answered by the holder of the turn before us, or ours to write, with whatever was
        // queued behind us (the holder answers everything it took before letting go).
        match answer.try_recv() {
            Ok(v) => v,
            Err(tokio::sync::oneshot::error::TryRecvError::Closed) => Err(dropped()),
            Err(tokio::sync::oneshot::error::TryRecvError::Empty) => {
                let jobs = std::mem::take(&mut *queue());
                // A task of its own: a caller that gives up waiting never leaves the others it
                // carries unanswered, nor a write half-known.
                let me = self.clone();
                let _ = tokio::spawn(async move { me.write_batch(jobs).await }).await;
                answer.await.unwrap_or_else(|_| Err(dropped()))
            }
        }
    }

    /// Writes `jobs` in one compare-and-set of the counters (retried when another process
    /// wrote between), then answers each: its own refusal, the write's failure (nothing was
    /// kept), or success.
    async fn write_batch(&self, jobs: Vec<Job>) {
        let mut attempt = 0u32;
        let verdicts = loop {
            if attempt > 0 {
                let pause = rand::random::<u64>() % (1 + u64::from(attempt.min(10)) * 2);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            attempt += 1;
            match self.try_batch(&jobs).await {
                Ok(Some(v)) => break Ok(v),
                Ok(None) if attempt < 64 => continue,
                Ok(None) => {
                    break Err(RailError::Storage(format!(
                        "budget {} kept changing under contention",
                        self.scope
                    )));
                }
                Err(e) => break Err(e),
            }
        };
        match verdicts {
            Ok(v) => {
                for (job, verdict) in jobs.into_iter().zip(v) {
                    let _ = job.done.send(verdict);
                }
            }
            Err(e) => {
                // The write failed or its outcome is unknown: every update it carried is told,
                // none of them acknowledged.
                for job in jobs {
                    let _ = job.done.send(Err(shared(&e)));
                }
            }
        }
    }

    /// One attempt of [`Self::write_batch`]: `None` when the counters changed under it.
    async fn try_batch(&self, jobs: &[Job]) -> RailResult<Option<Vec<RailResult<i64>>>> {
        let (mut st, token, now) = match self.store.get(NS, &self.scope).await? {
            Some(s) => (
                decode::<State>(s.record.value.as_deref(), &self.scope)?,
                Some(s.record.token),
                s.now,
            ),
            None => {
                let now = self.store.now().await?;
                let st = State {
                    period: self.period_of(now),
                    period_spent: Money::zero(self.asset.clone()),
                    total_spent: Money::zero(self.asset.clone()),
                };
                (st, None, now)
            }
        };
        // Periods only move forward: a clock stepping back never grants a period again.
        let period = self.period_of(now);
        if period > st.period {
            st.period = period;
            st.period_spent = Money::zero(self.asset.clone());
        }
        let verdicts: Vec<RailResult<i64>> = jobs
            .iter()
            .map(|job| {
                let mut next = st.clone();
                (job.apply)(&mut next)?;
                st = next;
                Ok(st.period)
            })
            .collect();
        if verdicts.iter().all(Result::is_err) {
            return Ok(Some(verdicts)); // nothing to write
        }
        let w = Write {
            token: new_token(),
            state: "budget".into(),
            fingerprint: Vec::new(),
            value: Some(encode(&st)?),
            retain: None,
            lease: None,
        };
        let written = match token {
            Some(t) => self.store.replace(NS, &self.scope, t, &w).await?,
            None => self
                .store
                .insert_if_absent(NS, &self.scope, &w)
                .await?
                .is_none(),
        };
        Ok(written.then_some(verdicts))
    }

    /// Counts `amount` for operation `op` if every limit allows it; a refusal changes nothing.
    /// An operation already counted (a retry) is not counted again.
    ///
    /// # Errors
    /// [`RailError::LimitExceeded`] naming the limit, what is left and what was asked;
    /// [`RailError::InvalidInput`] for another asset; [`RailError::InProgress`] while another
    /// attempt of `op` is being counted; [`RailError::Storage`].
    pub async fn reserve(&self, op: &OpId, amount: &Money) -> RailResult<Spend> {
        // What does not depend on what was spent is refused before any record is touched.
        self.check_per_payment(amount)?;
        let spend = |marker| Spend {
            budget: self.clone(),
            amount: amount.clone(),
            marker,
        };
        // The operation's marker first (one counter of an operation at a time): a marker left
        // by a crashed attempt is counted again — the safe direction, never under-counted.
        let marker = match self
            .ops
            .claim_as(
                op.as_str(),
                Duration::from_secs(60),
                fingerprint(amount)?.to_vec(),
            )
            .await?
        {
            Claim::Finished(_) => return Ok(spend(None)),
            Claim::Conflict(_) => {
                return Err(RailError::IdempotencyConflict {
                    op_id: op.to_string(),
                });
            }
            Claim::Busy { .. } => {
                return Err(RailError::InProgress {
                    op_id: op.to_string(),
                });
            }
            Claim::Fresh(r) | Claim::Recover { reservation: r, .. } => r,
        };
        let (limits, asked) = (self.limits.clone(), amount.clone());
        let counted = self
            .update(move |st| {
                let amount = &asked;
                let period_spent = st.period_spent.checked_add(amount)?;
                if let Some((_, max)) = &limits.per_period
                    && period_spent.amount() > max.amount()
                {
                    return Err(exceeded("per_period", &left(max, &st.period_spent), amount));
                }
                let total_spent = st.total_spent.checked_add(amount)?;
                if let Some(max) = &limits.total
                    && total_spent.amount() > max.amount()
                {
                    return Err(exceeded("total", &left(max, &st.total_spent), amount));
                }
                st.period_spent = period_spent;
                st.total_spent = total_spent;
                Ok(())
            })
            .await
            .map(|period| Counted {
                amount: amount.clone(),
                period,
            });
        match counted {
            // Held in flight until the payment's outcome is known.
            Ok(c) => Ok(spend(Some((marker, c)))),
            Err(e) => {
                // Nothing was counted: the marker goes, so the operation may be tried again.
                if let Err(r) = marker.release().await {
                    tracing::warn!(op = %op, error = %r, "could not free a budget marker");
                }
                Err(e)
            }
        }
    }

    /// Gives back `amount` of what operation `op` kept counted ([`Spend::keep`]): the part of a
    /// hold that was never captured (a tab closed below its cap, a checkout captured below its
    /// maximum). At most once per operation, and never more than was counted. The give-back is
    /// marked before the counters move: a crash between leaves the amount counted (over, never
    /// under).
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] for an operation that was not counted, or an amount above
    /// what it counted or in another asset; [`RailError::InProgress`] while the operation's
    /// payment still runs; [`RailError::Storage`].
    pub async fn give_back(&self, op: &OpId, amount: &Money) -> RailResult<()> {
        let seen = self.ops.seen(op.as_str()).await?.ok_or_else(|| {
            RailError::InvalidInput(format!(
                "operation {op} was not counted against budget {}",
                self.scope
            ))
        })?;
        if seen.record.state != "counted" {
            return Err(RailError::InProgress {
                op_id: op.to_string(),
            });
        }
        let counted: Counted = decode(seen.record.value.as_deref(), &self.scope)?;
        if amount.asset() != counted.amount.asset() || amount.amount() > counted.amount.amount() {
            return Err(RailError::InvalidInput(format!(
                "cannot give back {amount} of operation {op}, which counted {}",
                counted.amount
            )));
        }
        if amount.amount().is_zero() {
            return Ok(());
        }
        let back = format!("{}/back", op.as_str());
        if !self
            .ops
            .insert_if_absent(&back, Some(self.marker_retention()))
            .await?
        {
            return Ok(()); // given back before
        }
        let (period, back) = (counted.period, amount.clone());
        self.update(move |st| {
            if st.period == period {
                st.period_spent = st.period_spent.checked_sub(&back)?;
            }
            st.total_spent = st.total_spent.checked_sub(&back)?;
            Ok(())
        })
        .await
        .map(|_| ())
    }

    /// What was spent in the current period and in total (read only).
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn spent(&self) -> RailResult<(Money, Money)> {
        let zero = Money::zero(self.asset.clone());
        let Some(s) = self.store.get(NS, &self.scope).await? else {
            return Ok((zero.clone(), zero));
        };
        let st: State = decode(s.record.value.as_deref(), &self.scope)?;
        let period = if st.period == self.period_of(s.now) {
            st.period_spent
        } else {
            zero
        };
        Ok((period, st.total_spent))
    }
}

/// A payer that spends only within a [`Budget`]: the budget is checked and counted before the
/// inner payer is asked (a refusal moves nothing), given back when the payment was refused for
/// certain, and kept when its outcome is unknown.
#[derive(Debug)]
pub struct SpendLimit<P> {
    inner: P,
    budget: Budget,
}

impl<P> SpendLimit<P> {
    /// Wraps `inner` with `budget`.
    pub fn new(inner: P, budget: Budget) -> Self {
        SpendLimit { inner, budget }
    }

    /// The wrapped payer.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The budget.
    pub fn budget(&self) -> &Budget {
        &self.budget
    }

    async fn within<F, Fut>(&self, op: &OpId, offer: &Offer, act: F) -> RailResult<Payment>
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = RailResult<Payment>> + Send,
    {
        let spend = self.budget.reserve(op, &offer.amount).await?;
        let out = spend.keep_alive(act()).await;
        let ended = match &out {
            // Refused for certain: nothing was paid, the amount goes back.
            Err(e) if !e.is_retryable() => spend.release().await,
            // Paid, or perhaps paid: counted.
            _ => spend.keep().await,
        };
        if let Err(store) = ended {
            tracing::warn!(op = %op, error = %store, "could not record a payment's budget outcome; the operation is counted again on its next attempt");
        }
        out
    }
}

impl<P: Rail> Rail for SpendLimit<P> {
    fn id(&self) -> RailId {
        self.inner.id()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait]
impl<P: Payer> Payer for SpendLimit<P> {
    async fn pay(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.within(op, offer, || self.inner.pay(op, offer)).await
    }

    /// The inner payer's answer, and the per-payment limit (the period and total limits
    /// depend on what is spent when `pay` runs).
    fn accepts(&self, offer: &Offer) -> RailResult<()> {
        self.inner.accepts(offer)?;
        self.budget.check_per_payment(&offer.amount)
    }
}

#[async_trait]
impl<P: HoldPayer> HoldPayer for SpendLimit<P> {
    async fn hold(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.within(op, offer, || self.inner.hold(op, offer)).await
    }
}
