//! # conformance-runner
//!
//! The `conformance` binary and what it runs: the harnesses of this workspace's rails
//! ([`rails`]), the localnets it starts for their localnet tier ([`localnet`]) and the ledger's
//! load test ([`bench`]). The suite itself — behaviours, the
//! [`conformance::Harness`] trait, the report — is the `conformance` library, which depends on
//! `rail-core` alone.
//!
//! ```no_run
//! # async fn demo() {
//! use conformance::{Tier, report};
//! use conformance_runner::rails;
//! let rows = report::run_rail_tier(&rails::all()[0], Tier::Mock, &[], &mut |_| {}).await;
//! print!("{}", report::matrix(&rows));
//! # }
//! ```

pub mod bench;
pub mod localnet;
pub mod rails;
