//! # rail-ledger
//!
//! A double-entry ledger and the `ledger` rail on top of it (the hosted facilitator of the
//! Stipendex `account` rail runs on it).
//!
//! - **Accounts** hold one asset each and keep TigerBeetle's four counters (debits/credits,
//!   pending/posted); `no_overdraft` refuses debits (pending ones included) above credits.
//! - **Transfers** have client-chosen 128-bit ids and are idempotent: the same request again
//!   answers [`Created::Exists`]; the same id with other fields is refused with
//!   [`TransferError::ExistsWithDifferentFields`].
//! - **Two-phase transfers**: a pending transfer (a hold) is posted (in part: the rest is
//!   released), voided, or expires after its timeout.
//! - **An immutable journal**: every change is an entry with the balances before and after, in a
//!   SHA-256 hash chain; [`Ledger::verify_journal`] replays it (streamed) and reports broken
//!   links, balances that do not add up and broken rules (a post above its hold, a hold
//!   resolved twice, an overdraft, an early expiry). [`Ledger::anchor`] exports the head as an
//!   HMAC'd [`JournalAnchor`] to keep elsewhere; [`Ledger::verify_journal_against`] then also
//!   catches a consistent rewrite (hash chain recomputed) of anything up to it.
//! - **Two backends, one engine**: SQLite (embedded default, WAL, durable commits) and
//!   PostgreSQL. Requests are applied many per commit (group commit).
//!
//! ## Features
//!
//! | feature | what it adds |
//! |---|---|
//! | `sqlite` (default) | [`Ledger::sqlite`]: the embedded backend (rusqlite, on the file's writer thread: `rail_core::sqlite`) |
//! | `postgres` | [`Ledger::postgres`]: several processes on one database (sqlx's PostgreSQL driver) |
//!
//! With neither, the crate compiles (a facade can name it) but no ledger can be opened.
//!
//! The rail ([`LedgerPayer`], [`LedgerReceiver`]) implements the `rail-core` traits:
//! pay = transfer, hold = pending transfer, capture = post, void, refund = reversal,
//! verify = look the transfer up and bind it to the offer (amount, payee, offer id), once.
//!
//! ```
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::{sync::Arc, time::Duration};
//! use rail_core::{Asset, Charge, Money, OpId, Payer, RailReceiver, ReplayGuard, MemoryKeyStore, SystemClock};
//! use rail_ledger::{AccountId, Ledger, LedgerPayer, LedgerReceiver, NewAccount, TransferId, TransferRequest};
//!
//! let dir = tempfile::tempdir()?;
//! let ledger = Ledger::sqlite(&format!("sqlite://{}/l.db", dir.path().display())).await?;
//! let (bank, agent, shop) = (AccountId::random(), AccountId::random(), AccountId::random());
//! for (id, no_overdraft) in [(bank, false), (agent, true), (shop, true)] {
//!     ledger.create_account(NewAccount { id, asset: Asset::usd(), no_overdraft }).await?;
//! }
//! ledger.transfer(TransferRequest::Single { id: TransferId::random(), debit: bank, credit: agent, amount: 1_000, user_data: 0 }).await?;
//!
//! let guard = ReplayGuard::new(Arc::new(MemoryKeyStore::default()), "offers");
//! let receiver = LedgerReceiver::new(ledger.clone(), shop, Asset::usd(), guard);
//! let payer = LedgerPayer::new(ledger.clone(), agent, Asset::usd());
//!
//! let offer = receiver.offer(&Charge::capture(Money::parse(Asset::usd(), "2.50")?, Duration::from_secs(60))).await?;
//! let payment = payer.pay(&OpId::random(), &offer).await?;
//! let verified = receiver.verify(&offer, &payment).await?;
//! assert_eq!(verified.amount.minor_units(), 250);
//! assert!(receiver.verify(&offer, &payment).await.is_err()); // single use
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

// Without a backend feature the storage helpers shared by both backends are unused.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "postgres")),
    allow(dead_code, unused_imports, unused_macros)
)]

mod anchor;
mod engine;
mod error;
mod ledger;
mod rail;
mod store;
mod types;
mod verify;

pub use anchor::{AnchorError, JournalAnchor, MIN_ANCHOR_KEY};
pub use engine::{MAX_COUNTER, entry_hash};
pub use error::LedgerError;
pub use ledger::{FAST_CLOCK_TOLERANCE, Ledger, MAX_BATCH};
pub use rail::{
    DEFAULT_HOLD, DEFAULT_MAX_HOLD, HoldRefusal, LedgerOfferDetails, LedgerPayer, LedgerProof,
    LedgerReceiver, RAIL, check_hold_terms, offer_binding, op_transfer_id,
};
pub use types::{
    Account, AccountCreated, AccountId, Created, NewAccount, RESERVED_BIT, SideBalances, Transfer,
    TransferError, TransferId, TransferKind, TransferRequest, TransferStatus,
};
pub use verify::{MAX_PROBLEMS, Problem, VerifyReport};
