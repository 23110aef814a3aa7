//! The two storage backends of the one engine: SQLite and PostgreSQL.
//!
//! Each batch is one database transaction: take the journal head (PostgreSQL `SELECT … FOR
//! UPDATE`, SQLite `BEGIN IMMEDIATE`), load what the batch touches, run [`engine::apply_batch`],
//! write accounts, entries, statuses and the new head, commit. Holding the head serializes
//! writers across processes, so the hash chain stays linear and no two processes can apply one
//! transfer id twice; batching many requests per commit is what makes durable commits fast.

use std::collections::BTreeSet;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use rail_core::{Asset, Timestamp};
use sqlx::{ColumnIndex, Decode, Row, Type};

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

fn is_unique_violation(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(d) if d.code().as_deref() == Some("23505") || d.code().as_deref() == Some("2067") || d.code().as_deref() == Some("1555"))
}

const TRANSFER_COLS: &str = "seq, id, kind, debit, credit, amount, reference, user_data, \
    timeout_ms, ts, dr_pending_before, dr_pending_after, dr_posted_before, dr_posted_after, \
    cr_pending_before, cr_pending_after, cr_posted_before, cr_posted_after, prev_hash, hash";

const ACCOUNT_COLS: &str = "id, asset, scale, no_overdraft, debits_pending, debits_posted, \
    credits_pending, credits_posted, created_at";

fn u(v: i64, what: &str) -> Result<u64, LedgerError> {
    u64::try_from(v).map_err(|_| LedgerError::Corrupt(format!("negative {what}: {v}")))
}

/// A counter, amount or timeout as SQL `BIGINT`. Only called on values [`storable`] has
/// checked (the engine never produces larger ones), so the fallback is unreachable.
fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Refuses to write a batch holding any value beyond `BIGINT`, rather than clamp it. The
/// engine's overflow checks make this unreachable; it is the storage layer's own guarantee
/// that no conversion below is lossy.
fn storable(snap: &Snapshot, ch: &engine::Changes) -> Result<(), sqlx::Error> {
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
    if accounts_ok && transfers_ok && statuses_ok {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(
            "refused to write: a value exceeds the BIGINT storage range".into(),
        ))
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

fn db(e: &sqlx::Error) -> LedgerError {
    LedgerError::Storage(e.to_string())
}

fn transfer_row<'r, R>(r: &'r R) -> Result<Transfer, LedgerError>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    i16: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    Option<Vec<u8>>: Decode<'r, R::Database> + Type<R::Database>,
{
    let g = |c: &'r str| r.try_get::<i64, _>(c).map_err(|e| db(&e));
    let b = |c: &'r str| r.try_get::<Vec<u8>, _>(c).map_err(|e| db(&e));
    let gu = |c: &'r str| -> Result<u64, LedgerError> { u(g(c)?, c) };
    let kind_code: i16 = r.try_get("kind").map_err(|e| db(&e))?;
    let reference: Option<Vec<u8>> = r.try_get("reference").map_err(|e| db(&e))?;
    Ok(Transfer {
        seq: g("seq")?,
        id: id16(&b("id")?, TransferId::from_slice, "transfer id")?,
        kind: TransferKind::from_code(kind_code)
            .ok_or_else(|| LedgerError::Corrupt(format!("unknown transfer kind {kind_code}")))?,
        debit: id16(&b("debit")?, AccountId::from_slice, "debit account")?,
        credit: id16(&b("credit")?, AccountId::from_slice, "credit account")?,
        amount: u(g("amount")?, "amount")?,
        reference: reference
            .map(|r| id16(&r, TransferId::from_slice, "reference"))
            .transpose()?,
        user_data: u128_of(&b("user_data")?)?,
        timeout_ms: u(g("timeout_ms")?, "timeout")?,
        timestamp: Timestamp(g("ts")?),
        debit_side: SideBalances {
            pending_before: gu("dr_pending_before")?,
            pending_after: gu("dr_pending_after")?,
            posted_before: gu("dr_posted_before")?,
            posted_after: gu("dr_posted_after")?,
        },
        credit_side: SideBalances {
            pending_before: gu("cr_pending_before")?,
            pending_after: gu("cr_pending_after")?,
            posted_before: gu("cr_posted_before")?,
            posted_after: gu("cr_posted_after")?,
        },
        prev_hash: hash32(&b("prev_hash")?, "prev_hash")?,
        hash: hash32(&b("hash")?, "hash")?,
    })
}

fn status_row<'r, R>(r: &'r R) -> Result<TransferStatus, LedgerError>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    i16: Decode<'r, R::Database> + Type<R::Database>,
{
    let code: i16 = r.try_get("status").map_err(|e| db(&e))?;
    let amount: i64 = r.try_get("amount").map_err(|e| db(&e))?;
    TransferStatus::decode(code, amount)
        .ok_or_else(|| LedgerError::Corrupt(format!("bad status {code}/{amount}")))
}

fn id_status_row<'r, R>(r: &'r R) -> Result<(TransferId, TransferStatus), LedgerError>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    i16: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let id: Vec<u8> = r.try_get("id").map_err(|e| db(&e))?;
    Ok((
        id16(&id, TransferId::from_slice, "status id")?,
        status_row(r)?,
    ))
}

fn account_row<'r, R>(r: &'r R) -> Result<Account, LedgerError>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    i16: Decode<'r, R::Database> + Type<R::Database>,
    bool: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
{
    let g = |c: &'r str| r.try_get::<i64, _>(c).map_err(|e| db(&e));
    let code: String = r.try_get("asset").map_err(|e| db(&e))?;
    let scale: i16 = r.try_get("scale").map_err(|e| db(&e))?;
    let scale = u8::try_from(scale).map_err(|_| LedgerError::Corrupt("bad asset scale".into()))?;
    let id: Vec<u8> = r.try_get("id").map_err(|e| db(&e))?;
    Ok(Account {
        id: id16(&id, AccountId::from_slice, "account id")?,
        asset: Asset::new(&code, scale).map_err(|e| LedgerError::Corrupt(e.to_string()))?,
        no_overdraft: r.try_get("no_overdraft").map_err(|e| db(&e))?,
        debits_pending: u(g("debits_pending")?, "debits_pending")?,
        debits_posted: u(g("debits_posted")?, "debits_posted")?,
        credits_pending: u(g("credits_pending")?, "credits_pending")?,
        credits_posted: u(g("credits_posted")?, "credits_posted")?,
        created_at: Timestamp(g("created_at")?),
    })
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

/// The read side (lookups and journal verification): the same statements for both backends
/// (`$N` placeholders work on SQLite too), stamped out per database because sqlx's pool and
/// executor types differ (each module defines its `Tx`). `$prelude` runs first in the
/// verification transaction.
macro_rules! reads {
    ($pool:ty, $prelude:expr) => {
        /// The start of a locked batch: the journal head (read with `head_sql`, which takes the
        /// lock where the backend needs one), the batch's time (given, or the database's clock
        /// read with `clock_sql` once the head is held; without one, the host's clock), and the
        /// holds due for expiry at that time.
        async fn head_and_due(
            tx: &mut Tx<'_>,
            head_sql: &'static str,
            time: BatchTime,
            clock_sql: Option<&'static str>,
        ) -> Result<(Snapshot, Timestamp), LedgerError> {
            let mut snap = Snapshot::default();
            let head = sqlx::query(head_sql)
                .fetch_one(&mut **tx)
                .await
                .map_err(|e| db(&e))?;
            snap.head_seq = head.try_get("seq").map_err(|e| db(&e))?;
            snap.head_hash = hash32(
                &head.try_get::<Vec<u8>, _>("hash").map_err(|e| db(&e))?,
                "head",
            )?;
            let now = match (time, clock_sql) {
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
                let id: Vec<u8> = r.try_get("id").map_err(|e| db(&e))?;
                snap.due.push(id16(&id, TransferId::from_slice, "due id")?);
            }
            Ok((snap, now))
        }

        async fn read_account(pool: &$pool, id: AccountId) -> Result<Option<Account>, LedgerError> {
            let sql = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts WHERE id = $1");
            sqlx::query(sql.as_str())
                .bind(id.to_bytes().to_vec())
                .fetch_optional(pool)
                .await
                .map_err(|e| db(&e))?
                .map(|r| account_row(&r))
                .transpose()
        }

        async fn read_transfer(
            pool: &$pool,
            id: TransferId,
        ) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError> {
            let sql = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers WHERE id = $1");
            let Some(row) = sqlx::query(sql.as_str())
                .bind(id.to_bytes().to_vec())
                .fetch_optional(pool)
                .await
                .map_err(|e| db(&e))?
            else {
                return Ok(None);
            };
            let t = transfer_row(&row)?;
            let st = sqlx::query("SELECT status, amount FROM ledger_status WHERE id = $1")
                .bind(id.to_bytes().to_vec())
                .fetch_optional(pool)
                .await
                .map_err(|e| db(&e))?
                .map(|s| status_row(&s))
                .transpose()?;
            Ok(Some((t, st)))
        }

        /// The last `limit` journal entries that debit or credit `account`, newest first.
        async fn read_history(
            pool: &$pool,
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
                .fetch_all(pool)
                .await
                .map_err(|e| db(&e))?
                .iter()
                .map(transfer_row)
                .collect()
        }

        /// Replays the journal inside one read transaction: a consistent view of entries,
        /// head, accounts and statuses.
        async fn read_head(pool: &$pool) -> Result<(i64, [u8; 32]), LedgerError> {
            let head = sqlx::query("SELECT seq, hash FROM ledger_head WHERE id = 1")
                .fetch_one(pool)
                .await
                .map_err(|e| db(&e))?;
            Ok((
                head.try_get("seq").map_err(|e| db(&e))?,
                hash32(
                    &head.try_get::<Vec<u8>, _>("hash").map_err(|e| db(&e))?,
                    "head",
                )?,
            ))
        }

        async fn read_verify(
            pool: &$pool,
            anchor: Option<(i64, [u8; 32])>,
        ) -> Result<VerifyReport, LedgerError> {
            let mut tx = pool.begin().await.map_err(|e| db(&e))?;
            let prelude: Option<&'static str> = $prelude;
            if let Some(p) = prelude {
                sqlx::query(p).execute(&mut *tx).await.map_err(|e| db(&e))?;
            }
            let mut v = Verifier::new(anchor);
            // Accounts first (their no-overdraft flags are rules the replay checks), then the
            // entries, then the status rows.
            // Every table is streamed row by row (never loaded whole): memory stays bounded
            // by the verifier's own state (accounts, holds, reversed transfers).
            let sql = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts");
            let mut rows = sqlx::query(sql.as_str()).fetch(&mut *tx);
            while let Some(r) = rows.try_next().await.map_err(|e| db(&e))? {
                v.account(&account_row(&r)?);
            }
            drop(rows);
            let sql = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers ORDER BY seq");
            let mut rows = sqlx::query(sql.as_str()).fetch(&mut *tx);
            while let Some(r) = rows.try_next().await.map_err(|e| db(&e))? {
                v.entry(&transfer_row(&r)?);
            }
            drop(rows);
            let head = sqlx::query("SELECT seq, hash FROM ledger_head WHERE id = 1")
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| db(&e))?;
            let head_seq: i64 = head.try_get("seq").map_err(|e| db(&e))?;
            let head_hash = hash32(
                &head.try_get::<Vec<u8>, _>("hash").map_err(|e| db(&e))?,
                "head",
            )?;
            let mut rows = sqlx::query("SELECT id, status, amount, expires_at FROM ledger_status")
                .fetch(&mut *tx);
            while let Some(s) = rows.try_next().await.map_err(|e| db(&e))? {
                let (id, st) = id_status_row(&s)?;
                let expires: Option<i64> = s.try_get("expires_at").map_err(|e| db(&e))?;
                v.status(id, st, expires.map(Timestamp));
            }
            drop(rows);
            tx.rollback().await.map_err(|e| db(&e))?;
            Ok(v.finish((head_seq, head_hash)))
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
        assert!(storable(&snap, &ch).is_ok());
        ch.new_transfers.push(entry(engine::MAX_COUNTER + 1));
        assert!(storable(&snap, &ch).is_err());
    }
}
