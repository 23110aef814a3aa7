//! [`SpendLimit`] and its durable [`Budget`]: limits per payment, per period and in total.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::clock::Timestamp;
use crate::error::{RailError, RailResult};
use crate::keys::{KeyStore, Write, millis, new_token};
use crate::money::{Asset, Money};
use crate::rail::{Capabilities, HoldPayer, Payer, Rail};
use crate::types::{Offer, OpId, Payment, RailId};

/// Namespace of budget records in the key store.
const NS: &str = "budget";

/// What a [`Budget`] allows. Every amount is in one asset; `None` = no such limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The most one payment may be.
    pub per_payment: Option<Money>,
    /// The most that may be spent in one period (periods are aligned on the Unix epoch: a
    /// period of one day is a UTC calendar day).
    pub per_period: Option<(Duration, Money)>,
    /// The most that may ever be spent.
    pub total: Option<Money>,
}

impl Limits {
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

/// The stored state of one budget (JSON in the key store).
#[derive(Clone, Debug, Serialize, Deserialize)]
struct State {
    /// Index of the current period (`now / period`), 0 without a period limit.
    period: i64,
    period_spent: Money,
    total_spent: Money,
    /// Operations counted in this period and the previous one (a retry of one operation is
    /// counted once, also across a period boundary).
    ops: BTreeMap<String, Money>,
    prev_ops: BTreeMap<String, Money>,
}

/// A durable spending budget, shared by every process that uses the same store: one record
/// per scope (an agent, a mandate, a receiver within a mandate), updated by compare-and-set,
/// so concurrent payments never overspend it. Times are the store's clock.
#[derive(Clone, Debug)]
pub struct Budget {
    store: Arc<dyn KeyStore>,
    scope: String,
    asset: Asset,
    limits: Limits,
}

/// Money counted against a [`Budget`] for one operation.
#[derive(Debug)]
#[must_use = "release a spend whose payment did not happen"]
pub struct Spend {
    budget: Budget,
    op: String,
    amount: Money,
    counted_now: bool,
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
        self.counted_now
    }

    /// The payment did not happen, for certain: give the amount back. Does nothing for an
    /// operation counted by an earlier attempt.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn release(self) -> RailResult<()> {
        if !self.counted_now {
            return Ok(());
        }
        let op = self.op;
        self.budget
            .update(|st, _| {
                if let Some(m) = st.ops.remove(&op) {
                    st.period_spent = st.period_spent.checked_sub(&m)?;
                    st.total_spent = st.total_spent.checked_sub(&m)?;
                } else if let Some(m) = st.prev_ops.remove(&op) {
                    st.total_spent = st.total_spent.checked_sub(&m)?;
                }
                Ok(())
            })
            .await
    }
}

fn exceeded(limit: &str, left: &Money, asked: &Money) -> RailError {
    RailError::LimitExceeded {
        limit: limit.to_owned(),
        left: left.to_string(),
        asked: asked.to_string(),
    }
}

impl Budget {
    /// A budget for `scope` (one record in `store`) with `limits`.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] if the limits name more than one asset or a zero period.
    pub fn new(
        store: Arc<dyn KeyStore>,
        scope: impl Into<String>,
        limits: Limits,
    ) -> RailResult<Self> {
        if limits.per_payment.is_none() && limits.per_period.is_none() && limits.total.is_none() {
            return Err(RailError::InvalidInput(
                "a budget needs at least one limit".into(),
            ));
        }
        if limits
            .per_period
            .as_ref()
            .is_some_and(|(p, _)| p.as_millis() == 0)
        {
            return Err(RailError::InvalidInput(
                "a budget period must not be zero".into(),
            ));
        }
        Ok(Budget {
            store,
            scope: scope.into(),
            asset: limits.asset()?.ok_or_else(|| {
                RailError::InvalidInput("a budget needs at least one limit".into())
            })?,
            limits,
        })
    }

    /// The limits.
    #[must_use]
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn period_of(&self, now: Timestamp) -> i64 {
        match &self.limits.per_period {
            Some((p, _)) => now.millis().div_euclid(millis(*p).max(1)),
            None => 0,
        }
    }

    /// Applies `f` to the state by compare-and-set, retrying under contention.
    async fn update<R>(&self, f: impl Fn(&mut State, Timestamp) -> RailResult<R>) -> RailResult<R> {
        for _ in 0..64 {
            let seen = self.store.get(NS, &self.scope).await?;
            let (mut st, token, now) = match seen {
                Some(s) => {
                    let st: State = serde_json::from_str(s.record.value.as_deref().unwrap_or("{}"))
                        .map_err(|e| RailError::Storage(format!("budget {}: {e}", self.scope)))?;
                    (st, Some(s.record.token), s.now)
                }
                None => {
                    let asset = self.asset.clone();
                    let now = self.store.now().await?;
                    let st = State {
                        period: self.period_of(now),
                        period_spent: Money::zero(asset.clone()),
                        total_spent: Money::zero(asset),
                        ops: BTreeMap::new(),
                        prev_ops: BTreeMap::new(),
                    };
                    (st, None, now)
                }
            };
            let period = self.period_of(now);
            if st.period != period {
                st.prev_ops = if period == st.period.saturating_add(1) {
                    std::mem::take(&mut st.ops)
                } else {
                    BTreeMap::new()
                };
                st.ops.clear();
                st.period = period;
                st.period_spent = Money::zero(st.period_spent.asset().clone());
            }
            let out = f(&mut st, now)?;
            let w = Write {
                token: new_token(),
                state: "budget".into(),
                fingerprint: Vec::new(),
                value: Some(
                    serde_json::to_string(&st)
                        .map_err(|e| RailError::Storage(format!("budget {}: {e}", self.scope)))?,
                ),
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
            if written {
                return Ok(out);
            }
        }
        Err(RailError::Storage(format!(
            "budget {} kept changing under contention",
            self.scope
        )))
    }

    /// Counts `amount` for operation `op` if every limit allows it; a refusal changes nothing.
    /// An operation already counted (a retry) is not counted again.
    ///
    /// # Errors
    /// [`RailError::LimitExceeded`] naming the limit, what is left and what was asked;
    /// [`RailError::InvalidInput`] for another asset; [`RailError::Storage`].
    pub async fn reserve(&self, op: &OpId, amount: &Money) -> RailResult<Spend> {
        if amount.asset() != &self.asset {
            return Err(RailError::InvalidInput(format!(
                "a budget in {} cannot count a payment in {}",
                self.asset,
                amount.asset()
            )));
        }
        let limits = &self.limits;
        let counted_now = self
            .update(|st, _| {
                if st.ops.contains_key(op.as_str()) || st.prev_ops.contains_key(op.as_str()) {
                    return Ok(false);
                }
                if let Some(max) = &limits.per_payment
                    && amount.amount() > max.amount()
                {
                    return Err(exceeded("per_payment", max, amount));
                }
                let period_spent = st.period_spent.checked_add(amount)?;
                if let Some((_, max)) = &limits.per_period
                    && period_spent.amount() > max.amount()
                {
                    return Err(exceeded(
                        "per_period",
                        &max.checked_sub(&st.period_spent)?,
                        amount,
                    ));
                }
                let total_spent = st.total_spent.checked_add(amount)?;
                if let Some(max) = &limits.total
                    && total_spent.amount() > max.amount()
                {
                    return Err(exceeded(
                        "total",
                        &max.checked_sub(&st.total_spent)?,
                        amount,
                    ));
                }
                st.period_spent = period_spent;
                st.total_spent = total_spent;
                st.ops.insert(op.as_str().to_owned(), amount.clone());
                Ok(true)
            })
            .await?;
        Ok(Spend {
            budget: self.clone(),
            op: op.as_str().to_owned(),
            amount: amount.clone(),
            counted_now,
        })
    }

    /// What was spent in the current period and in total.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn spent(&self) -> RailResult<(Money, Money)> {
        self.update(|st, _| Ok((st.period_spent.clone(), st.total_spent.clone())))
            .await
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
        match act().await {
            Ok(p) => Ok(p),
            Err(e) => {
                if !e.is_retryable()
                    && let Err(store) = spend.release().await
                {
                    tracing::warn!(op = %op, error = %store, "could not give back a refused payment's budget");
                }
                Err(e)
            }
        }
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
}

#[async_trait]
impl<P: HoldPayer> HoldPayer for SpendLimit<P> {
    async fn hold(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.within(op, offer, || self.inner.hold(op, offer)).await
    }
}
