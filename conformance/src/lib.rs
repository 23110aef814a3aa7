//! # conformance
//!
//! One behaviour suite that every rail must pass, run against mocks and against real local
//! networks, with a runner (`conformance list`, `conformance run`, `conformance bench`).
//!
//! - [`behaviours`]: one plain `async fn` per behaviour (`pay_then_verify`, `replay_refused`,
//!   `concurrent_verify_settles_once`, `hold_then_partial_capture`, …), each taking the rail
//!   through a [`Harness`]. A behaviour runs only where the rail claims the capability; a
//!   claimed capability that fails is a failure, never a skip.
//! - [`harness`]: what a rail provides (funded payer, payee, clock, balances) per [`Tier`].
//! - [`rails`]: the registry of rails under test.
//! - [`report`]: running, the matrix, JSON and JUnit.
//!
//! Running the suite from code, as the tests do:
//!
//! ```no_run
//! # async fn demo() {
//! use conformance::{rails, report, Tier};
//! let rows = report::run_rail_tier(&rails::all()[0], Tier::Mock, &[], &mut |_| {}).await;
//! print!("{}", report::matrix(&rows));
//! # }
//! ```

pub mod behaviours;
pub mod bench;
pub mod harness;
pub mod rails;
pub mod report;

pub use harness::{Balances, Harness, HarnessError, RailEntry, Tier};
