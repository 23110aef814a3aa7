//! # stipendex-app
//!
//! What the `stipendex` command and the test runner (`conformance demo`, `conformance bench`)
//! share, so that neither depends on the other and the binary stays commands plus one config
//! loader:
//!
//! - [`demo`]: the end-to-end scenario ([`demo::run_stage`] on a [`demo::Stage`]): the
//!   command runs it on the embedded ledger, the runner over each rail's localnet;
//! - [`measure`]: percentiles and milliseconds without floats, for the benches;
//! - [`show`]: what a mandate allows and what a tab captured, in lines for a human;
//! - [`verify`]: audit-chain files verified, a line each (`stipendex verify-chain`);
//! - [`files`]: the files the commands read and write (keys readable by their owner only,
//!   never overwritten);
//! - [`Error`]: one sentence for a human.
//!
//! ```
//! use stipendex_app::demo::Prices;
//! // The demo's prices over a rail whose smallest practical charge is 125 minor units: what
//! // the payer must hold is a search, a report, a checkout's hold and a tab's cap (ten searches).
//! let prices = Prices::from_base(125).expect("small enough");
//! assert_eq!(prices.needed(), Some(125 + 3 * 125 + 3 * 125 + 62 + 10 * 125));
//! assert!(Prices::from_base(u128::MAX / 2).is_none());
//! ```

pub mod demo;
mod error;
pub mod files;
pub mod measure;
pub mod show;
pub mod verify;

pub use error::{Error, msg};
