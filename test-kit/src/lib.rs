//! # test-kit
//!
//! What the workspace's tests, benches and test tools share, and nothing a library user needs:
//! a dev-dependency only (the `conformance` suite and its runner, being test tools, take it as a
//! normal one).
//!
//! - [`localnet`]: the rule for a test whose local network or service (PostgreSQL, a devnet)
//!   is missing — a failure in CI (`CI=true`), a visible `SKIPPED:` line elsewhere — and the
//!   PostgreSQL URL tests use.
//! - `events` (feature `events`): counting `tracing` events of one target (a step that must
//!   run once).
//!
//! ```
//! if !test_kit::localnet::in_ci() {
//!     // outside CI, a missing localnet is reported and the test returns early
//!     test_kit::localnet::missing("postgres", "connection refused");
//! }
//! assert!(test_kit::localnet::postgres_url().starts_with("postgres://"));
//! ```

#[cfg(feature = "events")]
pub mod events;
pub mod localnet;
