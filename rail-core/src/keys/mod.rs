//! Single-use and idempotency records for every rail, on one small storage trait.
//!
//! | piece | what it is |
//! |---|---|
//! | [`KeyStore`] | the storage primitive: insert-if-absent, compare-and-set on an owner token, leases, windowed counters; memory, SQLite, PostgreSQL |
//! | [`ReplayGuard`] | single-use keys (offer ids, paymentIds, nonces, payment hashes): claim → (advance) → finish, or release |
//! | [`Idempotency`] | operation ids: same id + content → the first result |
//! | [`SettlementBook`] | the typed write-ahead record of a settlement: what was sent, its id on the rail, its state |
//! | [`open`] | the store a URL names (`memory`, `sqlite://PATH`, `postgres://…`), its SQL pools configured in one place |
//!
//! # The rules
//!
//! **Leases.** Work that holds a key holds a *lease* (60 s by default) and keeps it alive while
//! it runs ([`Reservation::keep_alive`], [`Idempotency::run`]): slow work never loses its key.
//! A record in flight has no retention, so time alone never frees it — unless its claimer
//! gave it an end ([`ReplayGuard::claim_until`], [`Idempotency::begin_until`]) because past
//! that the work cannot be asked for again (a receiver's claim on a Proof, after its Quote's
//! grace): then it is forgotten at its end, whatever state it was left in. A lease lapses only when
//! its holder stops renewing (crash, lost connection, dropped future); the next claimer then
//! *recovers* ([`Claim::Recover`], [`Attempt::Recovering`]): it takes the key over with a
//! compare-and-set (one recoverer wins), reads what the previous holder wrote ahead, asks the
//! rail what happened, and only then acts. [`ReplayGuard::reserve`] takes a lapsed key over
//! directly, and is only for work that moves no money.
//!
//! **Acknowledgements.** A write whose answer is lost (a timeout after the database committed)
//! is read back and compared by owner token before it is reported as failed. A result that was
//! obtained but could not be stored is still returned; the record is recovered later.
//!
//! **Retention.** Finished records (used, served, refused, refunded, settled) are remembered for
//! a window chosen by the record's owner — at least as long as what they protect stays valid —
//! then purged ([`KeyStore::purge_expired`]); nothing is remembered for ever by default.
//!
//! **One clock per store.** Every time in a record is written and judged by the store's clock:
//! PostgreSQL's own clock by default (several hosts share it, so a host whose clock runs ahead
//! cannot lapse another's lease); for SQLite and memory stores the host's clock (one host). An
//! injected clock overrides either (tests travel in time with a [`crate::ManualClock`]).
//!
//! ```
//! # async fn demo() -> rail_core::RailResult<()> {
//! use rail_core::keys::{Claim, MemoryKeyStore, ReplayGuard};
//! use std::{sync::Arc, time::Duration};
//! let guard = ReplayGuard::new(Arc::new(MemoryKeyStore::default()), "quotes");
//! let Claim::Fresh(r) = guard.claim("q_123", Duration::from_secs(60)).await? else { panic!() };
//! let settled = r.keep_alive(async { /* settle on the rail */ 42 }).await;
//! r.commit(Some(Duration::from_secs(24 * 3600))).await?;        // used, remembered for a day
//! assert!(matches!(guard.claim("q_123", Duration::from_secs(60)).await?, Claim::Finished(_)));
//! # let _ = settled; Ok(()) }
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(demo()).unwrap();
//! ```

mod guard;
mod idempotency;
mod open;
mod settlement;
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub mod sql;
mod store;
#[cfg(any(test, feature = "test-util"))]
pub mod suite;

pub(crate) use guard::new_token;
pub use guard::{Claim, ReplayGuard, Reservation};
pub use idempotency::{Attempt, Begin, Idempotency, Lease, fingerprint};
pub use open::{STORE_URLS, StoreUrl, open, open_at};
pub use settlement::{Opened, Settlement, SettlementBook, SettlementState, Settling};
pub use store::{
    KeyRecord, KeyStore, MemoryKeyStore, Seen, Tally, Write, anchored, deferred, millis,
};

/// State name of a claimed key (in flight, nothing written ahead yet).
pub const RESERVED: &str = "reserved";
/// State name of a committed key (used for good, or an operation's stored result).
pub const COMMITTED: &str = "committed";
/// State name of a counter ([`KeyStore::count`]): its value is the count in its window.
pub const COUNTED: &str = "counted";

#[cfg(test)]
mod tests;
