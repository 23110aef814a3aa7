//! The two storage backends of the one engine: SQLite and PostgreSQL.
//!
//! Each batch is one database transaction: take the journal head (PostgreSQL `SELECT … FOR
//! UPDATE`, SQLite `BEGIN IMMEDIATE`), load what the batch touches, run [`engine::apply_batch`],
//! write accounts, entries, statuses and the new head, commit. Holding the head serializes
//! writers across processes, so the hash chain stays linear and no two processes can apply one
//! transfer id twice; batching many requests per commit is what makes durable commits fast.

use std::collections::BTreeSet;
#[cfg(feature = "postgres")]
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
#[cfg(feature = "postgres")]
use futures::TryStreamExt;
use rail_core::{Asset, Timestamp};
#[cfg(feature = "postgres")]
use sqlx::Row;

use crate::engine::{self, Command, Outcome, Snapshot};
use crate::error::LedgerError;
use crate::types::{
    Account, AccountId, SideBalances, Transfer, TransferId, TransferKind, TransferStatus,
};
use crate::verify::{Verifier, VerifyReport};

/// The result of a batch run under the journal-head lock (the slow path).
#[derive(Debug)]
pub(crate) struct Executed {
    pub(crate) outcomes: Vec<Outcome>,
    /// The journal head as loaded under the lock, before the batch.
    pub(crate) loaded_head: (i64, [u8; 32]),
    /// The state the batch saw and left: fresh as of its commit.
    pub(crate) snap: Snapshot,
    pub(crate) changes: engine::Changes,
    /// The earliest expiry among open holds after the batch, if any.
    pub(crate) next_due: Option<Timestamp>,
}

/// How an optimistic write ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FastWrite {
    /// Written and committed.
    Committed,
    /// Another writer moved the journal head first: nothing was written.
    HeadMoved,
    /// A transfer id already exists in storage: nothing was written.
    Duplicate,
    /// The batch's timestamp was not within the tolerance of the database's clock when the
    /// write ran ([`ClockCheck`]): nothing was written.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    ClockOff,
}

/// The time a locked batch runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BatchTime {
    /// This time (the ledger's clock: SQLite's host clock, or an injected clock).
    At(Timestamp),
    /// The database's clock, read once the journal head is locked (PostgreSQL
    /// `clock_timestamp()`; SQLite has no server: its host's clock).
    Database,
}

/// An optimistic write's check on its batch's timestamp: written only if `stamped` is within
/// `tolerance_ms` of the database's clock as the write runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClockCheck {
    pub(crate) stamped: Timestamp,
    pub(crate) tolerance_ms: i64,
}

/// How an optimistic write ended, and the database's clock as it ran (when the backend
/// reports it: PostgreSQL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FastOutcome {
    pub(crate) write: FastWrite,
    pub(crate) db_now: Option<Timestamp>,
}

/// What the ledger needs from storage.
#[async_trait]
pub(crate) trait Backend: Send + Sync + std::fmt::Debug {
    /// Runs a batch under the journal-head lock: load, apply, write, commit.
    async fn execute(&self, cmds: &[Command], time: BatchTime) -> Result<Executed, LedgerError>;
    /// Writes an already-applied batch if the journal head is still `expect` (sequence and hash:
    /// another writer may reach the same sequence number, never the same hash) and, with a
    /// `check`, the batch's timestamp is close enough to the database's clock: one atomic
    /// compare-and-set on the head plus the rows, or nothing.
    async fn write_fast(
        &self,
        expect: (i64, [u8; 32]),
        snap: &Snapshot,
        changes: &engine::Changes,
        check: Option<ClockCheck>,
    ) -> Result<FastOutcome, LedgerError>;
    /// The database's clock (SQLite: the host's).
    async fn db_now(&self) -> Result<Timestamp, LedgerError>;
    /// How many optimistic writes may be in flight at once.
    fn pipeline_depth(&self) -> usize;
    async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError>;
    async fn transfer(
        &self,
        id: TransferId,
    ) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError>;
    /// The last `limit` entries that move `account`, newest first.
    async fn history(&self, account: AccountId, limit: u32) -> Result<Vec<Transfer>, LedgerError>;
    /// Replays the journal; with an `anchor` (seq, hash), entry `seq` must hash to it.
    async fn verify(&self, anchor: Option<(i64, [u8; 32])>) -> Result<VerifyReport, LedgerError>;
    /// The journal head: the last entry's seq and hash.
    async fn head(&self) -> Result<(i64, [u8; 32]), LedgerError>;
    fn name(&self) -> &'static str;
}

#[cfg(feature = "postgres")]
fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("23505") || d.code().as_deref() == Some("2067") || d.code().as_deref() == Some("1555"))
}

const TRANSFER_COLS: &str = "seq, id, kind, debit, credit, amount, reference, user_data, \
    timeout_ms, ts, dr_pending_before, dr_pending_after, dr_posted_before, dr_posted_after, \
    cr_pending_before, cr_pending_after, cr_posted_before, cr_posted_after, prev_hash, hash";

/// The journal table, the same columns on both backends in the dialect's types: `{int}` a
/// 64-bit integer, `{small}` a small one, `{blob}` bytes (see [`in_dialect`]).
const TRANSFERS_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS ledger_transfers (seq {int} PRIMARY KEY, id {blob} NOT NULL UNIQUE,
        kind {small} NOT NULL, debit {blob} NOT NULL, credit {blob} NOT NULL, amount {int} NOT NULL,
        reference {blob}, user_data {blob} NOT NULL, timeout_ms {int} NOT NULL, ts {int} NOT NULL,
        dr_pending_before {int} NOT NULL, dr_pending_after {int} NOT NULL,
        dr_posted_before {int} NOT NULL, dr_posted_after {int} NOT NULL,
        cr_pending_before {int} NOT NULL, cr_pending_after {int} NOT NULL,
        cr_posted_before {int} NOT NULL, cr_posted_after {int} NOT NULL,
        prev_hash {blob} NOT NULL, hash {blob} NOT NULL)";

/// `sql` with its type placeholders (`{int}`, `{small}`, `{blob}`) filled in from `types`, in
/// that order.
fn in_dialect(sql: &str, types: [&str; 3]) -> String {
    let [int, small, blob] = types;
    sql.replace("{int}", int)
        .replace("{small}", small)
        .replace("{blob}", blob)
}

const ACCOUNT_COLS: &str = "id, asset, scale, no_overdraft, debits_pending, debits_posted, \
    credits_pending, credits_posted, created_at";

/// The earliest expiry among open holds.
const NEXT_DUE: &str = "SELECT min(expires_at) FROM ledger_status WHERE status = 1";

fn u(v: i64, what: &str) -> Result<u64, LedgerError> {
    u64::try_from(v).map_err(|_| LedgerError::Corrupt(format!("negative {what}: {v}")))
}

/// A counter, amount or timeout as SQL `BIGINT`. Only called on values [`storable`] has
/// checked (the engine never produces larger ones), so the fallback is unreachable.
fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Whether every value of a batch fits `BIGINT`: a batch holding one beyond it is refused,
/// not clamped. The engine's overflow checks make a refusal unreachable; it is the storage
/// layer's own guarantee that no conversion below is lossy.
fn fits(snap: &Snapshot, ch: &engine::Changes) -> bool {
    let ok = |v: u64| v <= engine::MAX_COUNTER;
    let accounts_ok = ch.accounts.iter().chain(ch.new_accounts.iter()).all(|id| {
        snap.accounts.get(id).is_none_or(|a| {
            [
                a.debits_pending,
                a.debits_posted,
                a.credits_pending,
                a.credits_posted,
            ]
            .into_iter()
            .all(ok)
        })
    });
    let transfers_ok = ch.new_transfers.iter().all(|t| {
        let (d, c) = (t.debit_side, t.credit_side);
        [
            t.amount,
            t.timeout_ms,
            d.pending_before,
            d.pending_after,
            d.posted_before,
        ]
        .into_iter()
        .chain([
            d.posted_after,
            c.pending_before,
            c.pending_after,
            c.posted_before,
        ])
        .chain([c.posted_after])
        .all(ok)
    });
    let statuses_ok = ch.statuses.iter().all(|id| match snap.statuses.get(id) {
        Some(TransferStatus::Posted { amount: v } | TransferStatus::Settled { reversed: v }) => {
            ok(*v)
        }
        _ => true,
    });
    accounts_ok && transfers_ok && statuses_ok
}

/// Why [`fits`] refused a batch.
const TOO_BIG: &str = "refused to write: a value exceeds the BIGINT storage range";

/// The accounts a batch changed or created, each once, in id order, as they now stand.
fn changed_accounts<'s>(snap: &'s Snapshot, ch: &engine::Changes) -> Vec<&'s Account> {
    ch.accounts
        .iter()
        .chain(ch.new_accounts.iter())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter_map(|id| snap.accounts.get(id))
        .collect()
}

/// A `ledger_status` row to write.
struct StatusRow {
    id: Vec<u8>,
    code: i16,
    amount: i64,
    expires_at: Option<i64>,
}

/// The status rows a batch changed, as they now stand, with their holds' expiry.
fn changed_statuses(snap: &Snapshot, ch: &engine::Changes) -> Vec<StatusRow> {
    ch.statuses
        .iter()
        .filter_map(|id| {
            let (code, amount) = snap.statuses.get(id)?.encode();
            Some(StatusRow {
                id: id.to_bytes().to_vec(),
                code,
                amount,
                expires_at: snap
                    .transfers
                    .get(id)
                    .and_then(Transfer::expires_at)
                    .map(|t| t.0),
            })
        })
        .collect()
}

/// An applied batch to write: the journal head it expects to replace (sequence and hash), and
/// the state and changes it left.
#[cfg(feature = "postgres")]
#[derive(Clone, Copy)]
struct Batch<'a> {
    expect: (i64, [u8; 32]),
    snap: &'a Snapshot,
    ch: &'a engine::Changes,
}

/// Whether an optimistic write that did not match failed its clock check: the database's
/// clock `now` (when the backend reports it) was beyond the check's tolerance.
#[cfg(feature = "postgres")]
fn clock_off(check: Option<ClockCheck>, now: Option<Timestamp>) -> bool {
    match (check, now) {
        (Some(c), Some(now)) => now.0.saturating_sub(c.stamped.0).saturating_abs() > c.tolerance_ms,
        _ => false,
    }
}

fn hash32(b: &[u8], what: &str) -> Result<[u8; 32], LedgerError> {
    <[u8; 32]>::try_from(b).map_err(|_| LedgerError::Corrupt(format!("{what} is not 32 bytes")))
}

fn id16<T>(b: &[u8], f: fn(&[u8]) -> Option<T>, what: &str) -> Result<T, LedgerError> {
    f(b).ok_or_else(|| LedgerError::Corrupt(format!("{what} is not 16 bytes")))
}

fn u128_of(b: &[u8]) -> Result<u128, LedgerError> {
    <[u8; 16]>::try_from(b)
        .map(u128::from_be_bytes)
        .map_err(|_| LedgerError::Corrupt("user_data is not 16 bytes".into()))
}

#[cfg(feature = "postgres")]
fn db(e: &sqlx::Error) -> LedgerError {
    LedgerError::Storage(e.to_string())
}

/// A row's columns by name and type: what [`Cols`] reads a row of the ledger's tables with, on
/// either backend (an sqlx row on PostgreSQL, a rusqlite row on SQLite).
pub(crate) trait Fields {
    /// A 64-bit integer.
    fn int(&self, c: &str) -> Result<i64, LedgerError>;
    /// A small integer.
    fn small(&self, c: &str) -> Result<i16, LedgerError>;
    /// A boolean.
    fn flag(&self, c: &str) -> Result<bool, LedgerError>;
    /// Text.
    fn text(&self, c: &str) -> Result<String, LedgerError>;
    /// Bytes.
    fn blob(&self, c: &str) -> Result<Vec<u8>, LedgerError>;
    /// Bytes or `NULL`.
    fn opt_blob(&self, c: &str) -> Result<Option<Vec<u8>>, LedgerError>;
}

/// A row of the ledger's tables, read by column name, on either backend.
struct Cols<'r, R: Fields + ?Sized>(&'r R);

impl<R: Fields + ?Sized> Cols<'_, R> {
    /// Column `c`, a `BIGINT` that must not be negative (`what` names it in the error).
    fn unsigned(&self, c: &str, what: &str) -> Result<u64, LedgerError> {
        u(self.0.int(c)?, what)
    }

    /// A balance side's four counters, the columns `{side}_pending_before` … `_posted_after`.
    fn side(&self, cols: [&str; 4]) -> Result<SideBalances, LedgerError> {
        let [pending_before, pending_after, posted_before, posted_after] = cols;
        Ok(SideBalances {
            pending_before: self.unsigned(pending_before, pending_before)?,
            pending_after: self.unsigned(pending_after, pending_after)?,
            posted_before: self.unsigned(posted_before, posted_before)?,
            posted_after: self.unsigned(posted_after, posted_after)?,
        })
    }

    /// A `ledger_head` row: seq and hash.
    fn head(&self) -> Result<(i64, [u8; 32]), LedgerError> {
        Ok((self.0.int("seq")?, hash32(&self.0.blob("hash")?, "head")?))
    }

    /// A `ledger_transfers` row ([`TRANSFER_COLS`]).
    fn transfer(&self) -> Result<Transfer, LedgerError> {
        let b = |c: &str| self.0.blob(c);
        let kind_code = self.0.small("kind")?;
        let reference = self.0.opt_blob("reference")?;
        Ok(Transfer {
            seq: self.0.int("seq")?,
            id: id16(&b("id")?, TransferId::from_slice, "transfer id")?,
            kind: TransferKind::from_code(kind_code).ok_or_else(|| {
                LedgerError::Corrupt(format!("unknown transfer kind {kind_code}"))
            })?,
            debit: id16(&b("debit")?, AccountId::from_slice, "debit account")?,
            credit: id16(&b("credit")?, AccountId::from_slice, "credit account")?,
            amount: self.unsigned("amount", "amount")?,
            reference: reference
                .map(|r| id16(&r, TransferId::from_slice, "reference"))
                .transpose()?,
            user_data: u128_of(&b("user_data")?)?,
            timeout_ms: self.unsigned("timeout_ms", "timeout")?,
            timestamp: Timestamp(self.0.int("ts")?),
            debit_side: self.side([
                "dr_pending_before",
                "dr_pending_after",
                "dr_posted_before",
                "dr_posted_after",
            ])?,
            credit_side: self.side([
                "cr_pending_before",
                "cr_pending_after",
                "cr_posted_before",
                "cr_posted_after",
            ])?,
            prev_hash: hash32(&b("prev_hash")?, "prev_hash")?,
            hash: hash32(&b("hash")?, "hash")?,
        })
    }

    /// A `ledger_status` row's status and amount.
    fn status(&self) -> Result<TransferStatus, LedgerError> {
        let code = self.0.small("status")?;
        let amount = self.0.int("amount")?;
        TransferStatus::decode(code, amount)
            .ok_or_else(|| LedgerError::Corrupt(format!("bad status {code}/{amount}")))
    }

    /// A `ledger_status` row with its id.
    fn id_status(&self) -> Result<(TransferId, TransferStatus), LedgerError> {
        let id = self.0.blob("id")?;
        Ok((
            id16(&id, TransferId::from_slice, "status id")?,
            self.status()?,
        ))
    }

    /// A `ledger_accounts` row ([`ACCOUNT_COLS`]).
    fn account(&self) -> Result<Account, LedgerError> {
        let code = self.0.text("asset")?;
        let scale = self.0.small("scale")?;
        let scale =
            u8::try_from(scale).map_err(|_| LedgerError::Corrupt("bad asset scale".into()))?;
        let id = self.0.blob("id")?;
        let counter = |c: &str| self.unsigned(c, c);
        Ok(Account {
            id: id16(&id, AccountId::from_slice, "account id")?,
            asset: Asset::new(&code, scale).map_err(|e| LedgerError::Corrupt(e.to_string()))?,
            no_overdraft: self.0.flag("no_overdraft")?,
            debits_pending: counter("debits_pending")?,
            debits_posted: counter("debits_posted")?,
            credits_pending: counter("credits_pending")?,
            credits_posted: counter("credits_posted")?,
            created_at: Timestamp(self.0.int("created_at")?),
        })
    }
}

/// Loads the transfers' accounts that the batch did not name itself.
fn accounts_of(snap: &Snapshot, mut want: BTreeSet<AccountId>) -> Vec<AccountId> {
    for t in snap.transfers.values() {
        want.insert(t.debit);
        want.insert(t.credit);
    }
    want.into_iter().collect()
}

#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn bytes<T: Copy>(ids: impl IntoIterator<Item = T>, f: fn(T) -> [u8; 16]) -> Vec<Vec<u8>> {
    ids.into_iter().map(|i| f(i).to_vec()).collect()
}

const MAX_DUE: i64 = 256;

/// [`Backend`] for a backend type with a `pool: $pool` field: the same statements for both
/// backends (`$N` placeholders work on SQLite too), stamped out per database because sqlx's
/// pool and executor types differ. The invoking module defines what differs:
/// - `NAME`, the backend's name, `PIPELINE_DEPTH`, how many optimistic writes may be in flight
///   at once, and `db_clock(&pool)`, the database's clock;
/// - `Tx`, its transaction type, and `begin_locked(&pool)`, which opens the transaction of a
///   locked batch (`LOCK` names its lock in errors);
/// - `HEAD_SQL`, which reads the journal head (taking the lock where the backend needs one),
///   and `CLOCK_SQL`, the database's clock once the head is held (`None`: the host's clock);
/// - `load_transfers(tx, snap, ids)` and `load_accounts(tx, ids)`, which load what a batch
///   touches;
/// - `write_locked(tx, batch)`, which writes an applied [`Batch`] inside a locked batch, and
///   `write_alone(pool, batch, check)`, which writes one on its own (committed if it
///   matched), each answering whether the head was at `expect` (`false`: nothing written);
///   the latter also the database's clock as it ran where the backend reports it, and its
///   outer error a failure around the write (not the write's own);
/// - `VERIFY_PRELUDE`, run first in the verification transaction.
#[cfg(feature = "postgres")]
macro_rules! sql_backend {
    ($backend:ty) => {
        /// The start of a locked batch: the journal head, the batch's time (given, or the
        /// database's clock read once the head is held), the holds due for expiry at that
        /// time, and what the batch touches.
        async fn load(
            tx: &mut Tx<'_>,
            cmds: &[Command],
            time: BatchTime,
        ) -> Result<(Snapshot, Timestamp), LedgerError> {
            let mut snap = Snapshot::default();
            let head = sqlx::query(HEAD_SQL)
                .fetch_one(&mut **tx)
                .await
                .map_err(|e| db(&e))?;
            (snap.head_seq, snap.head_hash) = Cols(&head).head()?;
            let now = match (time, CLOCK_SQL) {
                (BatchTime::At(t), _) => t,
                (BatchTime::Database, Some(sql)) => Timestamp(
                    sqlx::query_scalar::<_, i64>(sql)
                        .fetch_one(&mut **tx)
                        .await
                        .map_err(|e| db(&e))?,
                ),
                (BatchTime::Database, None) => rail_core::Clock::now(&rail_core::SystemClock),
            };
            let due = sqlx::query(
                "SELECT id FROM ledger_status WHERE status = 1 AND expires_at <= $1
                 ORDER BY expires_at LIMIT $2",
            )
            .bind(now.0)
            .bind(MAX_DUE)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| db(&e))?;
            for r in due {
                let id = r.blob("id")?;
                snap.due.push(id16(&id, TransferId::from_slice, "due id")?);
            }
            let needs = engine::needs(cmds);
            let mut tids: BTreeSet<TransferId> = needs.transfers.clone();
            tids.extend(snap.due.iter().copied());
            load_transfers(tx, &mut snap, tids).await?;
            for a in load_accounts(tx, accounts_of(&snap, needs.accounts)).await? {
                snap.accounts.insert(a.id, a);
            }
            Ok((snap, now))
        }

        #[async_trait]
        impl Backend for $backend {
            fn name(&self) -> &'static str {
                NAME
            }

            fn pipeline_depth(&self) -> usize {
                PIPELINE_DEPTH
            }

            async fn db_now(&self) -> Result<Timestamp, LedgerError> {
                db_clock(&self.pool).await
            }

            async fn execute(
                &self,
                cmds: &[Command],
                time: BatchTime,
            ) -> Result<Executed, LedgerError> {
                let mut tx = begin_locked(&self.pool).await.map_err(|e| db(&e))?;
                let (mut snap, now) = load(&mut tx, cmds, time).await?;
                let expect = (snap.head_seq, snap.head_hash);
                let (outcomes, changes) = engine::apply_batch(&mut snap, cmds, now);
                if !changes.is_empty()
                    && !write_locked(
                        &mut tx,
                        Batch {
                            expect,
                            snap: &snap,
                            ch: &changes,
                        },
                    )
                    .await
                    .map_err(|e| db(&e))?
                {
                    return Err(LedgerError::Storage(format!(
                        "journal head moved under {LOCK}"
                    )));
                }
                let next_due: Option<i64> = sqlx::query_scalar(NEXT_DUE)
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| db(&e))?;
                tx.commit().await.map_err(|e| db(&e))?;
                Ok(Executed {
                    outcomes,
                    loaded_head: expect,
                    snap,
                    changes,
                    next_due: next_due.map(Timestamp),
                })
            }

            async fn write_fast(
                &self,
                expect: (i64, [u8; 32]),
                snap: &Snapshot,
                changes: &engine::Changes,
                check: Option<ClockCheck>,
            ) -> Result<FastOutcome, LedgerError> {
                let batch = Batch {
                    expect,
                    snap,
                    ch: changes,
                };
                let (write, db_now) = match write_alone(&self.pool, batch, check).await? {
                    Ok((true, now)) => (FastWrite::Committed, now),
                    Ok((false, now)) if clock_off(check, now) => (FastWrite::ClockOff, now),
                    Ok((false, now)) => (FastWrite::HeadMoved, now),
                    Err(e) if is_unique_violation(&e) => (FastWrite::Duplicate, None),
                    Err(e) => return Err(db(&e)),
                };
                Ok(FastOutcome { write, db_now })
            }

            async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError> {
                let sql = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts WHERE id = $1");
                sqlx::query(sql.as_str())
                    .bind(id.to_bytes().to_vec())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| db(&e))?
                    .map(|r| Cols(&r).account())
                    .transpose()
            }

            async fn transfer(
                &self,
                id: TransferId,
            ) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError> {
                let sql = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers WHERE id = $1");
                let Some(row) = sqlx::query(sql.as_str())
                    .bind(id.to_bytes().to_vec())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| db(&e))?
                else {
                    return Ok(None);
                };
                let t = Cols(&row).transfer()?;
                let st = sqlx::query("SELECT status, amount FROM ledger_status WHERE id = $1")
                    .bind(id.to_bytes().to_vec())
                    .fetch_optional(&self.pool)
                    .await
                    .map_err(|e| db(&e))?
                    .map(|s| Cols(&s).status())
                    .transpose()?;
                Ok(Some((t, st)))
            }

            /// The last `limit` journal entries that debit or credit `account`, newest first.
            async fn history(
                &self,
                account: AccountId,
                limit: u32,
            ) -> Result<Vec<Transfer>, LedgerError> {
                let sql = format!(
                    "SELECT {TRANSFER_COLS} FROM ledger_transfers WHERE debit = $1 OR credit = $1 \
                     ORDER BY seq DESC LIMIT $2"
                );
                sqlx::query(sql.as_str())
                    .bind(account.to_bytes().to_vec())
                    .bind(i64::from(limit))
                    .fetch_all(&self.pool)
                    .await
                    .map_err(|e| db(&e))?
                    .iter()
                    .map(|r| Cols(r).transfer())
                    .collect()
            }

            async fn head(&self) -> Result<(i64, [u8; 32]), LedgerError> {
                let head = sqlx::query("SELECT seq, hash FROM ledger_head WHERE id = 1")
                    .fetch_one(&self.pool)
                    .await
                    .map_err(|e| db(&e))?;
                Cols(&head).head()
            }

            /// Replays the journal inside one read transaction: a consistent view of entries,
            /// head, accounts and statuses.
            async fn verify(
                &self,
                anchor: Option<(i64, [u8; 32])>,
            ) -> Result<VerifyReport, LedgerError> {
                let mut tx = self.pool.begin().await.map_err(|e| db(&e))?;
                if let Some(p) = VERIFY_PRELUDE {
                    sqlx::query(p).execute(&mut *tx).await.map_err(|e| db(&e))?;
                }
                let mut v = Verifier::new(anchor);
                // Accounts first (their no-overdraft flags are rules the replay checks), then
                // the entries, then the status rows.
                // Every table is streamed row by row (never loaded whole): memory stays bounded
                // by the verifier's own state (accounts, holds, reversed transfers).
                let sql = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts");
                let mut rows = sqlx::query(sql.as_str()).fetch(&mut *tx);
                while let Some(r) = rows.try_next().await.map_err(|e| db(&e))? {
                    v.account(&Cols(&r).account()?);
                }
                drop(rows);
                let sql = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers ORDER BY seq");
                let mut rows = sqlx::query(sql.as_str()).fetch(&mut *tx);
                while let Some(r) = rows.try_next().await.map_err(|e| db(&e))? {
                    v.entry(&Cols(&r).transfer()?);
                }
                drop(rows);
                let head = sqlx::query("SELECT seq, hash FROM ledger_head WHERE id = 1")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(|e| db(&e))?;
                let head = Cols(&head).head()?;
                let mut rows =
                    sqlx::query("SELECT id, status, amount, expires_at FROM ledger_status")
                        .fetch(&mut *tx);
                while let Some(s) = rows.try_next().await.map_err(|e| db(&e))? {
                    let (id, st) = Cols(&s).id_status()?;
                    let expires: Option<i64> = s.try_get("expires_at").map_err(|e| db(&e))?;
                    v.status(id, st, expires.map(Timestamp));
                }
                drop(rows);
                tx.rollback().await.map_err(|e| db(&e))?;
                Ok(v.finish(head))
            }
        }
    };
}

#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{SideBalances, TransferKind};

    fn entry(amount: u64) -> Transfer {
        Transfer {
            seq: 1,
            id: TransferId(1),
            kind: TransferKind::Single,
            debit: AccountId(1),
            credit: AccountId(2),
            amount,
            reference: None,
            user_data: 0,
            timeout_ms: 0,
            timestamp: Timestamp(0),
            debit_side: SideBalances::default(),
            credit_side: SideBalances::default(),
            prev_hash: [0; 32],
            hash: [0; 32],
        }
    }

    #[test]
    fn values_beyond_bigint_are_refused_not_clamped() {
        let snap = Snapshot::default();
        let mut ch = engine::Changes::default();
        ch.new_transfers.push(entry(engine::MAX_COUNTER));
        assert!(fits(&snap, &ch));
        ch.new_transfers.push(entry(engine::MAX_COUNTER + 1));
        assert!(!fits(&snap, &ch));
    }
}
