//! # conformance-runner
//!
//! The `conformance` binary and what it runs: the harnesses of this workspace's rails
//! ([`rails`]), the localnets it starts for their localnet tier ([`localnet`]), the ledger's
//! load test ([`bench`]) and the `stipendex demo` scenario over a rail's localnet ([`demo`]).
//! The rail suite — behaviours, the [`conformance::Harness`] trait, the report — is the
//! `conformance` library, which depends on `rail-core` alone; the Stipendex protocol behaviours
//! are `stipendex-conformance`, which the runner runs beside it.
//!
//! ```no_run
//! # async fn demo() {
//! use conformance::{Tier, report};
//! use conformance_runner::rails;
//! let rows =
//!     stipendex_conformance::run_rail_tier(&rails::all()[0], Tier::Mock, &[], &mut |_| {}).await;
//! print!("{}", report::matrix(&rows));
//! # }
//! ```

pub mod bench;
mod bench_common; // what bench and pgledger share (BenchConfig, Phase re-exported in bench)
pub mod demo;
pub mod localnet;
pub mod pgledger;
pub mod rails;
