//! # conformance
//!
//! One behaviour suite that every rail must pass, run against mocks and against real local
//! networks. This library depends on `rail-core` alone, so a rail written anywhere runs the
//! whole suite from its own `cargo test` (see [`check`]); the `conformance` binary and the
//! harnesses of this workspace's rails are the `conformance-runner` crate.
//!
//! - [`behaviours`]: one plain `async fn` per behaviour (`pay_then_verify`, `replay_refused`,
//!   `concurrent_verify_settles_once`, `hold_then_partial_capture`, …), each taking the rail
//!   through a [`Harness`]. A behaviour runs only where the rail claims the capability; a
//!   claimed capability that fails is a failure, never a skip.
//! - [`harness`]: what a rail provides (funded payer, payee, clock, balances) per [`Tier`].
//! - [`report`]: running, the matrix, JSON and JUnit.
//!
//! A rail's own test runs the whole suite in a few lines: describe the rail with a
//! [`RailEntry`] (a name and a function that builds a [`Harness`] per [`Tier`]) and call
//! [`check`], which prints the matrix and fails on any failed behaviour:
//!
//! ```no_run
//! # async fn demo(entry: conformance::RailEntry) {
//! // in tests/conformance.rs, inside a #[tokio::test]:
//! conformance::check(&entry, conformance::Tier::Mock).await.unwrap();
//! # }
//! ```
//!
//! The toy rail in `examples/toy-rail` of this repository is a complete example.

pub mod behaviours;
pub mod harness;
pub mod report;
pub use harness::{Balances, Harness, HarnessError, HarnessFactory, RailEntry, Tier};

/// The boxed future a [`HarnessFactory`] returns, re-exported so a rail's tests need no
/// `futures` dependency of their own.
pub use futures::future::BoxFuture;

/// What [`check`] found wrong: one line per failed behaviour (`behaviour: why`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} behaviour(s) failed:\n{}", .0.len(), .0.join("\n"))]
pub struct Failures(pub Vec<String>);

/// Runs every behaviour for `entry` on `tier`, prints the matrix, and returns the failures.
/// Behaviours the rail does not claim, and a localnet that is not there (outside CI), are
/// skips; in CI (`CI=true`) a missing localnet is a failure.
///
/// # Errors
/// [`Failures`], naming each failed behaviour and why.
pub async fn check(entry: &RailEntry, tier: Tier) -> Result<Vec<report::ResultRow>, Failures> {
    let rows = report::run_rail_tier(entry, tier, &[], &mut |_| {}).await;
    #[allow(clippy::print_stdout)] // the matrix is what a test run shows
    {
        print!("{}", report::matrix(&rows));
    }
    let failed: Vec<String> = rows
        .iter()
        .filter(|r| r.outcome == report::Outcome::Fail)
        .map(|r| format!("{}/{} {}: {}", r.rail, r.tier, r.behaviour, r.detail))
        .collect();
    if failed.is_empty() {
        Ok(rows)
    } else {
        Err(Failures(failed))
    }
}
