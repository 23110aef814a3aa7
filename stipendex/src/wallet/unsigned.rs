//! The steps every unsigned demand shares once it is admitted (allowlisted by where it came
//! from, the mandate valid) and priced: an x402 challenge ([`Wallet::pay_challenge`]) and a
//! ContextVM payment request ([`Wallet::pay_offer`]). Limits counted durably, the human asked
//! above the threshold, the rail or scheme payer asked, the count kept or given back by the
//! outcome, and the Proof journaled with what the wallet saw — in this order, written once.

use std::future::Future;

use rail_core::{Money, OpId, Payment, RailError};
use serde_json::Value;

use super::{Ask, Confirmer, PaidFor, Wallet, Why, above_threshold, chain_name, limits_in};
use crate::Error;
use crate::envelope::{Challenge, Confirmation, Proof, Signed};

/// An unsigned demand, admitted and priced: what the shared steps need.
pub(super) struct Unsigned<'a> {
    /// What the wallet saw (recorded in the Proof; the Confirmation binds its digest).
    pub challenge: Challenge,
    /// What it pays.
    pub amount: Money,
    /// The operation: the count and the rail's idempotency key.
    pub op: OpId,
    /// Who is paid, for the per-receiver count.
    pub payee: &'a str,
    /// The confirmation's kind (`x402`, `contextvm`).
    pub what: &'static str,
    /// The audit chain's key (`None`: the Proof's id).
    pub key: Option<&'a str>,
}

/// An unsigned demand paid: the rail's payment, what the payer returned beside it, the
/// journaled Proof and the human's Confirmation if one was needed.
pub(super) struct UnsignedPaid<T> {
    pub payment: Payment,
    #[cfg_attr(not(feature = "challenges"), allow(dead_code))]
    pub extra: T,
    pub proof: Signed<Proof>,
    pub confirmation: Option<Signed<Confirmation>>,
}

impl Wallet {
    /// Runs the shared steps for `u`; `pay` asks the rail (or signs) once the count and the
    /// confirmation hold. A refusal for certain gives the count back; an unknown outcome
    /// keeps it (asking again is the same operation).
    pub(super) async fn pay_unsigned<T, F, Fut>(
        &self,
        u: Unsigned<'_>,
        now: u64,
        confirmer: &dyn Confirmer,
        pay: F,
    ) -> Result<UnsignedPaid<T>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(Payment, T), RailError>>,
    {
        let limits = limits_in(self.0.mandate.object(), u.amount.asset())?;
        let budgets = self.budgets(limits)?;
        let counted = budgets.reserve(&u.op, u.payee, &u.amount).await?;
        let confirmation = self
            .confirm_unsigned(&u, limits, &budgets, now, confirmer)
            .await;
        let (confirmation, counted) = counted.unless_err(confirmation).await?;
        let (payment, extra) = match pay().await {
            Ok(paid) => {
                counted.keep().await;
                paid
            }
            Err(e) => {
                counted.after_rail_error(&e).await;
                return Err(Error::Payment(e));
            }
        };
        let rail = payment.rail.as_str().to_owned();
        let proof = self
            .record_unsigned(
                u.challenge,
                confirmation.as_ref(),
                payment.clone(),
                rail,
                now,
                u.key,
            )
            .await?;
        Ok(UnsignedPaid {
            payment,
            extra,
            proof,
            confirmation,
        })
    }

    /// Above `limits`' threshold, asks the human to confirm paying `u`'s amount for its
    /// challenge; the Confirmation binds the challenge's digest. `None` at or below the
    /// threshold.
    async fn confirm_unsigned(
        &self,
        u: &Unsigned<'_>,
        limits: &crate::envelope::Limits,
        budgets: &super::spend::Budgets,
        now: u64,
        confirmer: &dyn Confirmer,
    ) -> Result<Option<Signed<Confirmation>>, Error> {
        let (challenge, amount, what) = (&u.challenge, &u.amount, u.what);
        if !above_threshold(limits, amount) {
            return Ok(None);
        }
        let (left_in_period, left_in_total) = budgets.left().await;
        let ask = Ask {
            why: Why::AboveThreshold,
            receiver: challenge.origin.clone(),
            description: challenge
                .entry
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned),
            total: amount.clone(),
            tolerance: rail_core::Amount::ZERO,
            left_in_period,
            left_in_total,
        };
        self.ask_human(&ask, challenge.digest(), what, now, confirmer)
            .await
            .map(Some)
    }

    /// The signed Proof of `payment` for the unsigned `challenge`, journaled with the mandate
    /// and the Confirmation in the chain of the challenge's origin and `key` (the Proof's id
    /// when `None`).
    async fn record_unsigned(
        &self,
        challenge: Challenge,
        confirmation: Option<&Signed<Confirmation>>,
        payment: Payment,
        rail: String,
        now: u64,
        key: Option<&str>,
    ) -> Result<Signed<Proof>, Error> {
        let origin = challenge.origin.clone();
        let proof = self.proof_of(
            PaidFor::Challenge(challenge),
            confirmation,
            payment,
            rail,
            now,
        )?;
        let chain = chain_name(&origin, key.unwrap_or(&proof.object().id));
        let objects = self.chain_objects(confirmation, &[proof.jws()]);
        self.journal_all(&chain, objects, "payment").await;
        Ok(proof)
    }
}
