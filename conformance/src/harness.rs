//! What a rail gives the suite: a [`Harness`] (a funded payer, a payee, an offer factory through
//! the receiver, a clock) for one [`Tier`].

use std::fmt;

use async_trait::async_trait;
use futures::future::BoxFuture;
use rail_core::{Asset, ManualClock, Payment, RailHandle, RailResult};
use serde::{Deserialize, Serialize};

/// Where a rail runs for the suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    /// In-process, deterministic, always available.
    Mock,
    /// Real local servers (databases, chains, relays).
    Localnet,
}

impl Tier {
    /// The tier's name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Mock => "mock",
            Tier::Localnet => "localnet",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Observable money of the two parties, in the asset's minor units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Balances {
    /// What the payer can still spend (held money is not spendable).
    pub payer_available: i128,
    /// What the payee has received, settled.
    pub payee_settled: i128,
}

/// One rail under test on one tier: both sides wired to the same rail, the payer funded.
///
/// What the suite expects of the parts it is given, beyond each trait's own contract:
/// - **One payment per operation id.** `idempotent_retry_same_result` and
///   `same_op_different_content_conflicts` call `pay`, `hold`, `capture`, `void` and `refund`
///   twice with one [`rail_core::OpId`]: the second call returns the first result, and the same
///   id with other content is [`rail_core::RailError::IdempotencyConflict`]. A rail that does
///   not do this itself gets it for payers by handing the suite
///   `rail_core::payer::Idempotent::new(payer, store)` (which needs a `FindPayment` impl); its
///   receiver must still be idempotent per operation id for capture, void and refund.
/// - **A refund accepts a capture's reference**: `refund_after_capture` refunds by
///   [`rail_core::Captured::capture_ref`].
/// - **Optional hooks** (`other_receiver`, `twin_receiver`, `hold_lifetime`, `rail_checks`):
///   a behaviour whose hook is absent is skipped with [`crate::behaviours::SKIP_NO_HOOK`].
#[async_trait]
pub trait Harness: Send + Sync {
    /// The rail's parts.
    fn rail(&self) -> &RailHandle;
    /// The clock both sides use; behaviours move it to test expiry.
    fn clock(&self) -> &ManualClock;
    /// The asset offers are made in.
    fn asset(&self) -> Asset;
    /// How much the payer was funded with, in minor units.
    fn funded(&self) -> u128;
    /// The smallest amount the rail can carry, in minor units (1 unless the rail has a minimum
    /// charge, as Stripe's $0.50).
    fn smallest_payable(&self) -> u128 {
        1
    }
    /// Another payee the payer can pay (to test that a payment to someone else is refused).
    fn other_payee(&self) -> String;
    /// The parties' current balances.
    async fn balances(&self) -> RailResult<Balances>;
    /// Rail-specific malformed variants of a valid payment (the suite adds generic ones).
    fn malformed(&self, _valid: &Payment) -> Vec<(String, Payment)> {
        Vec::new()
    }
    /// A second receiver on the same rail, paid into another account (to check that one
    /// receiver cannot capture, void or refund another's payments). `None` skips those checks.
    fn other_receiver(&self) -> Option<RailHandle> {
        None
    }
    /// How long the rail keeps a hold before it lapses, if holds lapse. `None` skips the
    /// hold-expiry behaviour.
    fn hold_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
    /// Another instance of this harness's receiver (same payee, same replay store, its own
    /// connections), as a second server behind a load balancer would be. `None` skips the check
    /// that one payment presented at both settles once.
    fn twin_receiver(&self) -> Option<RailHandle> {
        None
    }
    /// The rail's own cases (one per protocol rule and error code), each with its verdict.
    /// Empty skips them.
    async fn rail_checks(&self) -> Vec<(String, Result<(), String>)> {
        Vec::new()
    }
    /// Releases what the harness holds (databases, temporary files, servers).
    async fn teardown(&self) {}
}

/// Why a harness could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The tier's local network is not there (a skip on a developer machine, a failure in CI).
    #[error("localnet unavailable: {0}")]
    Unavailable(String),
    /// Building it failed.
    #[error("harness setup failed: {0}")]
    Setup(String),
}

/// Builds harnesses of one rail: [`Harness`] for the rail suite, or an extension trait of it
/// for a suite built on this one.
pub type HarnessFactory<H = dyn Harness> =
    fn(Tier) -> BoxFuture<'static, Result<Box<H>, HarnessError>>;

/// A rail the suite knows how to test, its harnesses of type `H` ([`Harness`], or an
/// extension trait of it for a suite built on this one).
pub struct RailEntry<H: ?Sized = dyn Harness> {
    /// The rail's name (`ledger`, …).
    pub name: &'static str,
    /// One line on what each tier runs against.
    pub tiers: &'static [(Tier, &'static str)],
    /// Builds a fresh harness for one behaviour.
    pub make: HarnessFactory<H>,
}

impl<H: ?Sized> Clone for RailEntry<H> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H: ?Sized> Copy for RailEntry<H> {}

impl<H: ?Sized> RailEntry<H> {
    /// What the rail's `tier` runs against, if the rail offers that tier.
    #[must_use]
    pub fn tier(&self, tier: Tier) -> Option<&'static str> {
        self.tiers.iter().find(|(t, _)| *t == tier).map(|(_, d)| *d)
    }
}
