//! Durable spend accounting under a mandate, on rail-core's [`Budget`]: one budget per asset for
//! the mandate (per call, per period, total) and one per receiver (`per_receiver`), in the
//! wallet's store (SQLite for one wallet, PostgreSQL for a fleet sharing one mandate).

use std::sync::Arc;
use std::time::Duration;

use rail_core::payer::{Budget, BudgetLimits, Spend};
use rail_core::{KeyStore, Money, OpId, RailError};

use crate::Error;
use crate::envelope::Limits;

/// What is counted for one payment: the mandate's spend and the receiver's.
#[derive(Debug)]
pub(crate) struct Counted {
    spends: Vec<Spend>,
}

impl Counted {
    /// The payment happened, or may have: everything stays counted.
    pub(crate) async fn keep(self) {
        for s in self.spends {
            if let Err(e) = s.keep().await {
                tracing::warn!(error = %e, "could not record a spend; the operation is counted again on its next attempt");
            }
        }
    }

    /// Nothing was paid, for certain: give everything back.
    pub(crate) async fn release(self) {
        for s in self.spends {
            if let Err(e) = s.release().await {
                tracing::warn!(error = %e, "could not give a spend back; its marker lapses");
            }
        }
    }

    /// After the rail's failure `e`: kept when its outcome is unknown (`e` is retryable: the
    /// payment may have happened), given back when the rail refused for certain. Whether it
    /// was given back.
    pub(crate) async fn after_rail_error(self, e: &RailError) -> bool {
        if e.is_retryable() {
            self.keep().await;
            false
        } else {
            self.release().await;
            true
        }
    }

    /// A step between counting and paying (the human's confirmation): its value, and this
    /// count still held; its failure gives everything back first.
    pub(crate) async fn unless_err<T>(self, step: Result<T, Error>) -> Result<(T, Self), Error> {
        match step {
            Ok(t) => Ok((t, self)),
            Err(e) => {
                self.release().await;
                Err(e)
            }
        }
    }
}

fn limit_error(e: RailError) -> Error {
    match e {
        RailError::LimitExceeded { limit, left, asked } => Error::LimitExceeded(format!(
            "the mandate's {limit} limit leaves {left}; the payment asks {asked}"
        )),
        RailError::Storage(s) => Error::Storage(s),
        e => Error::Payment(e),
    }
}

/// The budgets of one mandate in one asset.
#[derive(Clone, Debug)]
pub(crate) struct Budgets {
    store: Arc<dyn KeyStore>,
    /// Where the operations' markers are written (the store, or a handle on it).
    markers: Arc<dyn KeyStore>,
    mandate_id: String,
    scope: String,
    limits: Limits,
    mandate: Option<Budget>,
}

impl Budgets {
    pub(crate) fn new(
        store: Arc<dyn KeyStore>,
        mandate_id: &str,
        limits: &Limits,
    ) -> Result<Self, Error> {
        let scope = format!("stipendex/{mandate_id}/{}", limits.asset);
        let m = |a| limits.money(a);
        let mandate_limits = BudgetLimits {
            per_payment: limits.per_call.map(m).transpose()?,
            per_period: limits
                .per_period
                .as_ref()
                .map(|p| Ok::<_, Error>((Duration::from_secs(p.seconds), m(p.amount)?)))
                .transpose()?,
            total: limits.total.map(m).transpose()?,
        };
        let any = mandate_limits.per_payment.is_some()
            || mandate_limits.per_period.is_some()
            || mandate_limits.total.is_some();
        let mandate = if any {
            Some(
                Budget::new(store.clone(), scope.clone(), mandate_limits)
                    .map_err(|e| Error::Malformed(format!("mandate limits: {e}")))?,
            )
        } else {
            None
        };
        Ok(Budgets {
            markers: store.clone(),
            store,
            mandate_id: mandate_id.to_owned(),
            scope,
            limits: limits.clone(),
            mandate,
        })
    }

    /// Writes the operations' markers through `markers` (a deferred handle of the same store:
    /// [`Budget::with_markers`]); the counters stay on the store, combined across calls.
    pub(crate) fn with_markers(mut self, markers: Arc<dyn KeyStore>) -> Self {
        self.mandate = self.mandate.map(|b| b.with_markers(markers.clone()));
        self.markers = markers;
        self
    }

    fn receiver_budget(&self, receiver: &str) -> Result<Option<Budget>, Error> {
        let Some(max) = self.limits.per_receiver else {
            return Ok(None);
        };
        let limits = BudgetLimits {
            per_payment: None,
            per_period: None,
            total: Some(self.limits.money(max)?),
        };
        // The receiver's name is hashed: it may hold any character.
        let who = crate::wallet::journal::chain_name(receiver, "to");
        Budget::new(self.store.clone(), format!("{}/{who}", self.scope), limits)
            .map(|b| Some(b.with_markers(self.markers.clone())))
            .map_err(|e| Error::Malformed(format!("mandate limits: {e}")))
    }

    /// Counts `amount` for operation `op` paying `receiver` against every limit; a refusal
    /// changes nothing. A retry of `op` is counted once.
    pub(crate) async fn reserve(
        &self,
        op: &OpId,
        receiver: &str,
        amount: &Money,
    ) -> Result<Counted, Error> {
        let mut spends = Vec::new();
        if let Some(b) = &self.mandate {
            b.check_per_payment(amount).map_err(limit_error)?;
            spends.push(b.reserve(op, amount).await.map_err(limit_error)?);
        }
        if let Some(b) = self.receiver_budget(receiver)? {
            match b.reserve(op, amount).await {
                Ok(s) => spends.push(s),
                Err(e) => {
                    Counted { spends }.release().await;
                    return Err(match limit_error(e) {
                        Error::LimitExceeded(m) => {
                            Error::LimitExceeded(m.replacen("total", "per_receiver", 1))
                        }
                        e => e,
                    });
                }
            }
        }
        Ok(Counted { spends })
    }

    /// A tab's cap: counted like [`Budgets::reserve`] against the period, total and
    /// per-receiver limits, but not against the per-call limit (which applies to each call's
    /// increment, [`Budgets::check_per_call`]).
    pub(crate) async fn reserve_cap(
        &self,
        op: &OpId,
        receiver: &str,
        cap: &Money,
    ) -> Result<Counted, Error> {
        let mut limits = self.limits.clone();
        limits.per_call = None;
        let no_per_call = Budgets::new(self.store.clone(), &self.mandate_id, &limits)?
            .with_markers(self.markers.clone());
        no_per_call.reserve(op, receiver, cap).await
    }

    /// Whether one call of `amount` is within the per-call limit.
    pub(crate) fn check_per_call(&self, amount: &Money) -> Result<(), Error> {
        match self.limits.per_call {
            Some(max) if amount.amount() > max => Err(Error::LimitExceeded(format!(
                "the mandate's per_call limit is {max} {}; the call costs {}",
                self.limits.asset,
                amount.amount()
            ))),
            _ => Ok(()),
        }
    }

    /// Gives back `amount` of what operation `op` (paying `receiver`) kept counted: the part
    /// of a tab's cap it never captured. Once per operation; never more than was counted.
    pub(crate) async fn give_back(
        &self,
        op: &OpId,
        receiver: &str,
        amount: &Money,
    ) -> Result<(), Error> {
        if let Some(b) = &self.mandate {
            b.give_back(op, amount).await.map_err(limit_error)?;
        }
        if let Some(b) = self.receiver_budget(receiver)? {
            b.give_back(op, amount).await.map_err(limit_error)?;
        }
        Ok(())
    }

    /// What the mandate still allows: (in this period, in total).
    pub(crate) async fn left(&self) -> (Option<Money>, Option<Money>) {
        let Some(b) = &self.mandate else {
            return (None, None);
        };
        let Ok((period, total)) = b.spent().await else {
            return (None, None);
        };
        let left = |max: Option<&Money>, spent: &Money| {
            max.map(|m| {
                m.checked_sub(spent)
                    .unwrap_or_else(|_| Money::zero(m.asset().clone()))
            })
        };
        let l = b.limits();
        (
            left(l.per_period.as_ref().map(|(_, m)| m), &period),
            left(l.total.as_ref(), &total),
        )
    }
}
