//! # stipendex-conformance
//!
//! The Stipendex protocol behaviours (`stipendex_*`: quote, pay under a mandate, receipt, the
//! audit chain, allowlists, limits, confirmations, replays, checkout, plain x402 402s), run on
//! every rail over the rail's own harness, beside the rail suite of the `conformance` crate.
//!
//! The rail suite depends on rail-core alone; this crate adds the `stipendex` facade on top. A
//! rail takes part by implementing [`StipendexHarness`] — an extension of
//! [`conformance::Harness`] whose one optional hook, [`StipendexHarness::x402`], gives the
//! rail's x402 side — and describing itself with a [`StipendexEntry`]. [`run_rail_tier`] then
//! runs the rail suite *and* these behaviours, reported the same way.
//!
//! ```no_run
//! # async fn demo(entry: stipendex_conformance::StipendexEntry) {
//! use conformance::{Tier, report};
//! let rows = stipendex_conformance::run_rail_tier(&entry, Tier::Mock, &[], &mut |_| {}).await;
//! print!("{}", report::matrix(&rows));
//! # }
//! ```

pub mod behaviours;

use std::sync::Arc;

use async_trait::async_trait;
use conformance::report::{self, ResultRow};
use conformance::{BoxFuture, Harness, HarnessError, RailEntry, Tier};

pub use behaviours::all;

/// A rail's harness for the Stipendex behaviours: the rail suite's [`Harness`] and what only
/// these behaviours need.
#[async_trait]
pub trait StipendexHarness: Harness {
    /// The rail as an x402 scheme: a receiving scheme for the x402 paywall and a payer's
    /// scheme payer, on this harness's parties. `None` (the default) skips the behaviour that
    /// pays a plain x402 402 under a mandate.
    async fn x402(&self) -> Option<X402Parts> {
        None
    }
}

/// A rail's x402 side, for the Stipendex behaviour that pays a plain x402 402.
#[derive(Clone)]
pub struct X402Parts {
    /// The receiving scheme (for `x402_transport::paywall::Paywall`), paying the harness's payee.
    pub scheme: Arc<dyn x402_transport::Scheme>,
    /// The harness's payer as a scheme payer.
    pub payer: Arc<dyn x402_transport::client::SchemePayer>,
    /// The payee as the 402's `payTo` spells it.
    pub pay_to: String,
}

/// A rail under the rail suite and the Stipendex behaviours: its harnesses are
/// [`StipendexHarness`]es.
pub type StipendexEntry = RailEntry<dyn StipendexHarness>;

/// The names of every behaviour [`run_rail_tier`] runs: the rail suite's, then these.
#[must_use]
pub fn names() -> Vec<(&'static str, &'static str)> {
    conformance::behaviours::all()
        .iter()
        .map(|b| (b.name, b.about))
        .chain(all().iter().map(|b| (b.name, b.about)))
        .collect()
}

/// Runs the rail suite and then the Stipendex behaviours matching `only` (all when empty) for
/// `entry` on `tier`, calling `progress` after each.
pub async fn run_rail_tier(
    entry: &StipendexEntry,
    tier: Tier,
    only: &[String],
    progress: &mut (dyn FnMut(&ResultRow) + Send),
) -> Vec<ResultRow> {
    // The rail suite's behaviours take a `&dyn Harness`: its harnesses are this rail's, upcast.
    let e = *entry;
    let upcast = move |t: Tier| -> BoxFuture<'static, Result<Box<dyn Harness>, HarnessError>> {
        Box::pin(async move { make_harness(&e, t).await })
    };
    let rail = report::select(&conformance::behaviours::all(), only);
    let mut rows = report::run_with(entry.name, entry.tiers, &upcast, &rail, tier, progress).await;
    let ours = report::select(&all(), only);
    rows.extend(report::run_behaviours(entry, &ours, tier, progress).await);
    rows
}

/// One harness of `entry` on `tier`, as the rail suite's `Box<dyn Harness>`.
///
/// # Errors
/// The rail's [`HarnessError`].
pub async fn make_harness(
    entry: &StipendexEntry,
    tier: Tier,
) -> Result<Box<dyn Harness>, HarnessError> {
    (entry.make)(tier).await.map(|h| -> Box<dyn Harness> { h })
}
