//! The two storage backends of the one engine: SQLite and PostgreSQL.
//!
//! Each batch is one database transaction: take the journal head (PostgreSQL `SELECT … FOR
//! UPDATE`, SQLite `BEGIN IMMEDIATE`), load what the batch touches, run [`engine::apply_batch`],
//! write accounts, entries, statuses and the new head, commit. Holding the head serializes
//! writers across processes, so the hash chain stays linear and no two processes can apply one
//! transfer id twice; batching many requests per commit is what makes durable commits fast.

use std::collections::{BTreeSet, HashMap};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use rail_core::{Asset, Timestamp};
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::engine::{self, Command, Outcome, Snapshot, Verifier, VerifyReport};
use crate::error::LedgerError;
use crate::types::{
    Account, AccountId, SideBalances, Transfer, TransferId, TransferKind, TransferStatus,
};

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
}

/// What the ledger needs from storage.
#[async_trait]
pub(crate) trait Backend: Send + Sync + std::fmt::Debug {
    /// Runs a batch under the journal-head lock: load, apply, write, commit.
    async fn execute(&self, cmds: &[Command], now: Timestamp) -> Result<Executed, LedgerError>;
    /// Writes an already-applied batch if the journal head is still `expect` (sequence and hash:
    /// another writer may reach the same sequence number, never the same hash): one atomic
    /// compare-and-set on the head plus the rows, or nothing.
    async fn write_fast(
        &self,
        expect: (i64, [u8; 32]),
        snap: &Snapshot,
        changes: &engine::Changes,
    ) -> Result<FastWrite, LedgerError>;
    /// How many optimistic writes may be in flight at once.
    fn pipeline_depth(&self) -> usize;
    async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError>;
    async fn transfer(
        &self,
        id: TransferId,
    ) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError>;
    async fn verify(&self) -> Result<VerifyReport, LedgerError>;
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
        /// lock where the backend needs one) and the holds due for expiry at `now`.
        async fn head_and_due(
            tx: &mut Tx<'_>,
            head_sql: &'static str,
            now: Timestamp,
        ) -> Result<Snapshot, LedgerError> {
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
            Ok(snap)
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

        /// Replays the journal inside one read transaction: a consistent view of entries,
        /// head, accounts and statuses.
        async fn read_verify(pool: &$pool) -> Result<VerifyReport, LedgerError> {
            let mut tx = pool.begin().await.map_err(|e| db(&e))?;
            let prelude: Option<&'static str> = $prelude;
            if let Some(p) = prelude {
                sqlx::query(p).execute(&mut *tx).await.map_err(|e| db(&e))?;
            }
            let mut v = Verifier::new();
            let sql = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers ORDER BY seq");
            for r in sqlx::query(sql.as_str())
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db(&e))?
            {
                v.entry(&transfer_row(&r)?);
            }
            let head = sqlx::query("SELECT seq, hash FROM ledger_head WHERE id = 1")
                .fetch_one(&mut *tx)
                .await
                .map_err(|e| db(&e))?;
            let head_seq: i64 = head.try_get("seq").map_err(|e| db(&e))?;
            let head_hash = hash32(
                &head.try_get::<Vec<u8>, _>("hash").map_err(|e| db(&e))?,
                "head",
            )?;
            let sql = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts");
            let accounts = sqlx::query(sql.as_str())
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db(&e))?
                .iter()
                .map(account_row)
                .collect::<Result<Vec<_>, _>>()?;
            let mut statuses = HashMap::new();
            for s in sqlx::query("SELECT id, status, amount FROM ledger_status")
                .fetch_all(&mut *tx)
                .await
                .map_err(|e| db(&e))?
            {
                let (id, st) = id_status_row(&s)?;
                statuses.insert(id, st);
            }
            tx.rollback().await.map_err(|e| db(&e))?;
            Ok(v.finish((head_seq, head_hash), &accounts, &statuses))
        }
    };
}

// ---------------------------------------------------------------------------------------------
// SQLite

pub(crate) mod sqlite {
    use super::*;
    use sqlx::sqlite::{
        SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
    };

    /// The SQLite backend: WAL journal, `synchronous = FULL` (durable commits).
    #[derive(Debug, Clone)]
    pub(crate) struct SqliteBackend {
        pub(crate) pool: SqlitePool,
        /// Dropped with the backend: tells the background checkpointer to stop.
        _alive: std::sync::Arc<()>,
    }

    const SCHEMA: &[&str] = &[
        "CREATE TABLE IF NOT EXISTS ledger_accounts (id BLOB PRIMARY KEY, asset TEXT NOT NULL,
            scale INTEGER NOT NULL, no_overdraft BOOLEAN NOT NULL, debits_pending INTEGER NOT NULL,
            debits_posted INTEGER NOT NULL, credits_pending INTEGER NOT NULL,
            credits_posted INTEGER NOT NULL, created_at INTEGER NOT NULL) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS ledger_transfers (seq INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE,
            kind INTEGER NOT NULL, debit BLOB NOT NULL, credit BLOB NOT NULL, amount INTEGER NOT NULL,
            reference BLOB, user_data BLOB NOT NULL, timeout_ms INTEGER NOT NULL, ts INTEGER NOT NULL,
            dr_pending_before INTEGER NOT NULL, dr_pending_after INTEGER NOT NULL,
            dr_posted_before INTEGER NOT NULL, dr_posted_after INTEGER NOT NULL,
            cr_pending_before INTEGER NOT NULL, cr_pending_after INTEGER NOT NULL,
            cr_posted_before INTEGER NOT NULL, cr_posted_after INTEGER NOT NULL,
            prev_hash BLOB NOT NULL, hash BLOB NOT NULL)",
        "CREATE TABLE IF NOT EXISTS ledger_status (id BLOB PRIMARY KEY, status INTEGER NOT NULL,
            amount INTEGER NOT NULL, expires_at INTEGER) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS ledger_status_due ON ledger_status (expires_at) WHERE status = 1",
        "CREATE TABLE IF NOT EXISTS ledger_head (id INTEGER PRIMARY KEY, seq INTEGER NOT NULL,
            hash BLOB NOT NULL)",
        "INSERT INTO ledger_head (id, seq, hash) VALUES (1, 0, zeroblob(32)) ON CONFLICT DO NOTHING",
        "CREATE TRIGGER IF NOT EXISTS ledger_transfers_no_update BEFORE UPDATE ON ledger_transfers
            BEGIN SELECT RAISE(ABORT, 'ledger journal is append-only'); END",
        "CREATE TRIGGER IF NOT EXISTS ledger_transfers_no_delete BEFORE DELETE ON ledger_transfers
            BEGIN SELECT RAISE(ABORT, 'ledger journal is append-only'); END",
    ];

    impl SqliteBackend {
        pub(crate) async fn open(url: &str) -> Result<Self, LedgerError> {
            let opts = SqliteConnectOptions::from_str(url)
                .map_err(|e| db(&e))?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(Duration::from_secs(30))
                .foreign_keys(false)
                // Transfer ids are random, so every insert dirties a random page of the id
                // index, and every dirty page is written to the WAL at commit: small pages
                // (1 KiB) cut that volume fourfold, a larger checkpoint interval keeps
                // checkpoints off most commits, and a big cache keeps the index in memory.
                .page_size(1024)
                // Checkpoints run in the background (see `checkpointer`); this is the backstop.
                .pragma("wal_autocheckpoint", "65536")
                .pragma("cache_size", "-65536")
                .pragma("mmap_size", "268435456")
                .pragma("temp_store", "memory");
            let pool = SqlitePoolOptions::new()
                .max_connections(4)
                .connect_with(opts)
                .await
                .map_err(|e| db(&e))?;
            for s in SCHEMA {
                sqlx::query(s).execute(&pool).await.map_err(|e| db(&e))?;
            }
            let alive = std::sync::Arc::new(());
            tokio::spawn(checkpointer(
                pool.clone(),
                std::sync::Arc::downgrade(&alive),
            ));
            Ok(SqliteBackend {
                pool,
                _alive: alive,
            })
        }
    }

    type Tx<'a> = sqlx::Transaction<'a, sqlx::Sqlite>;

    // A deferred transaction in WAL mode reads one snapshot.
    reads!(SqlitePool, None);

    /// Copies the WAL back into the database file off the commit path: a passive checkpoint
    /// every 250 ms never blocks writers, so commits stop paying for checkpoints.
    async fn checkpointer(pool: SqlitePool, alive: std::sync::Weak<()>) {
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if alive.upgrade().is_none() || pool.is_closed() {
                return;
            }
            if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                .execute(&pool)
                .await
            {
                tracing::debug!(error = %e, "background WAL checkpoint failed; the next one retries");
            }
        }
    }

    async fn load(
        tx: &mut Tx<'_>,
        cmds: &[Command],
        now: Timestamp,
    ) -> Result<Snapshot, LedgerError> {
        // BEGIN IMMEDIATE already holds the write lock.
        let mut snap =
            head_and_due(tx, "SELECT seq, hash FROM ledger_head WHERE id = 1", now).await?;
        let needs = engine::needs(cmds);
        let mut tids: BTreeSet<TransferId> = needs.transfers.clone();
        tids.extend(snap.due.iter().copied());
        let sql = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers WHERE id = ?1");
        let status_sql = "SELECT status, amount FROM ledger_status WHERE id = ?1";
        for id in &tids {
            if let Some(row) = sqlx::query(sql.as_str())
                .bind(id.to_bytes().to_vec())
                .fetch_optional(&mut **tx)
                .await
                .map_err(|e| db(&e))?
            {
                let t = transfer_row(&row)?;
                if let Some(s) = sqlx::query(status_sql)
                    .bind(id.to_bytes().to_vec())
                    .fetch_optional(&mut **tx)
                    .await
                    .map_err(|e| db(&e))?
                {
                    snap.statuses.insert(t.id, status_row(&s)?);
                }
                snap.transfers.insert(t.id, t);
            }
        }
        let sql = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts WHERE id = ?1");
        for id in accounts_of(&snap, needs.accounts) {
            if let Some(row) = sqlx::query(sql.as_str())
                .bind(id.to_bytes().to_vec())
                .fetch_optional(&mut **tx)
                .await
                .map_err(|e| db(&e))?
            {
                snap.accounts.insert(id, account_row(&row)?);
            }
        }
        Ok(snap)
    }

    /// Row counts of the multi-row statements: a batch is written in at most one statement of
    /// each size, and only these few statements are ever prepared.
    const CHUNKS: [usize; 8] = [128, 64, 32, 16, 8, 4, 2, 1];

    fn values_sql(head: &str, cols: usize, n: usize, tail: &str) -> String {
        let row = format!("({})", vec!["?"; cols].join(", "));
        format!("{head} VALUES {} {tail}", vec![row; n].join(", "))
    }

    type SqlBySize = std::sync::OnceLock<HashMap<usize, String>>;

    fn by_size(cell: &'static SqlBySize, n: usize, make: impl Fn(usize) -> String) -> &'static str {
        cell.get_or_init(|| CHUNKS.into_iter().map(|n| (n, make(n))).collect())
            .get(&n)
            .map_or("", String::as_str)
    }

    /// `INSERT INTO ledger_transfers … VALUES (…), (…)` for `n` rows, built once per size.
    fn insert_transfers_sql(n: usize) -> &'static str {
        static SQL: SqlBySize = SqlBySize::new();
        by_size(&SQL, n, |n| {
            values_sql(
                &format!("INSERT INTO ledger_transfers ({TRANSFER_COLS})"),
                20,
                n,
                "",
            )
        })
    }

    /// The accounts upsert for `n` rows, built once per size.
    fn upsert_accounts_sql(n: usize) -> &'static str {
        static SQL: SqlBySize = SqlBySize::new();
        by_size(&SQL, n, |n| {
            values_sql(
                &format!("INSERT INTO ledger_accounts ({ACCOUNT_COLS})"),
                9,
                n,
                "ON CONFLICT (id) DO UPDATE SET debits_pending = excluded.debits_pending, \
                 debits_posted = excluded.debits_posted, credits_pending = excluded.credits_pending, \
                 credits_posted = excluded.credits_posted",
            )
        })
    }

    /// The statuses upsert for `n` rows, built once per size.
    fn upsert_statuses_sql(n: usize) -> &'static str {
        static SQL: SqlBySize = SqlBySize::new();
        by_size(&SQL, n, |n| {
            values_sql(
                "INSERT INTO ledger_status (id, status, amount, expires_at)",
                4,
                n,
                "ON CONFLICT (id) DO UPDATE SET status = excluded.status, amount = excluded.amount",
            )
        })
    }

    /// Writes a batch as four statements whatever its size (rows travel as JSON arrays):
    /// compare-and-set the head, then accounts, entries and statuses. `false` if the head
    /// was not at `expect` (nothing written).
    async fn write(
        tx: &mut Tx<'_>,
        expect: (i64, [u8; 32]),
        snap: &Snapshot,
        ch: &engine::Changes,
    ) -> Result<bool, sqlx::Error> {
        storable(snap, ch)?;
        let moved = sqlx::query(
            "UPDATE ledger_head SET seq = ?1, hash = ?2 WHERE id = 1 AND seq = ?3 AND hash = ?4",
        )
        .bind(snap.head_seq)
        .bind(snap.head_hash.to_vec())
        .bind(expect.0)
        .bind(expect.1.to_vec())
        .execute(&mut **tx)
        .await?;
        if moved.rows_affected() != 1 {
            return Ok(false);
        }
        let accs: Vec<&Account> = ch
            .accounts
            .iter()
            .chain(ch.new_accounts.iter())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|id| snap.accounts.get(id))
            .collect();
        let mut rest: &[&Account] = &accs;
        while !rest.is_empty() {
            let n = CHUNKS.into_iter().find(|&n| n <= rest.len()).unwrap_or(1);
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            let mut q = sqlx::query(upsert_accounts_sql(n));
            for a in chunk {
                q = q
                    .bind(a.id.to_bytes().to_vec())
                    .bind(a.asset.code().to_owned())
                    .bind(i16::from(a.asset.scale()))
                    .bind(a.no_overdraft)
                    .bind(i(a.debits_pending))
                    .bind(i(a.debits_posted))
                    .bind(i(a.credits_pending))
                    .bind(i(a.credits_posted))
                    .bind(a.created_at.0);
            }
            q.execute(&mut **tx).await?;
        }
        // Entries as multi-row VALUES with bound parameters, in chunks of fixed sizes so the
        // prepared statements stay few and cached.
        let mut rest: &[Transfer] = &ch.new_transfers;
        while !rest.is_empty() {
            let n = CHUNKS.into_iter().find(|&n| n <= rest.len()).unwrap_or(1);
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            let sql = insert_transfers_sql(n);
            let mut q = sqlx::query(sql);
            for t in chunk {
                q = q
                    .bind(t.seq)
                    .bind(t.id.to_bytes().to_vec())
                    .bind(t.kind.code())
                    .bind(t.debit.to_bytes().to_vec())
                    .bind(t.credit.to_bytes().to_vec())
                    .bind(i(t.amount))
                    .bind(t.reference.map(|r| r.to_bytes().to_vec()))
                    .bind(t.user_data.to_be_bytes().to_vec())
                    .bind(i(t.timeout_ms))
                    .bind(t.timestamp.0)
                    .bind(i(t.debit_side.pending_before))
                    .bind(i(t.debit_side.pending_after))
                    .bind(i(t.debit_side.posted_before))
                    .bind(i(t.debit_side.posted_after))
                    .bind(i(t.credit_side.pending_before))
                    .bind(i(t.credit_side.pending_after))
                    .bind(i(t.credit_side.posted_before))
                    .bind(i(t.credit_side.posted_after))
                    .bind(t.prev_hash.to_vec())
                    .bind(t.hash.to_vec());
            }
            q.execute(&mut **tx).await?;
        }
        let sts: Vec<(TransferId, TransferStatus)> = ch
            .statuses
            .iter()
            .filter_map(|id| Some((*id, *snap.statuses.get(id)?)))
            .collect();
        let mut rest: &[(TransferId, TransferStatus)] = &sts;
        while !rest.is_empty() {
            let n = CHUNKS.into_iter().find(|&n| n <= rest.len()).unwrap_or(1);
            let (chunk, tail) = rest.split_at(n);
            rest = tail;
            let mut q = sqlx::query(upsert_statuses_sql(n));
            for (id, st) in chunk {
                let (code, amount) = st.encode();
                let expires = snap
                    .transfers
                    .get(id)
                    .and_then(Transfer::expires_at)
                    .map(|t| t.0);
                q = q
                    .bind(id.to_bytes().to_vec())
                    .bind(code)
                    .bind(amount)
                    .bind(expires);
            }
            q.execute(&mut **tx).await?;
        }
        Ok(true)
    }

    async fn next_due(tx: &mut Tx<'_>) -> Result<Option<Timestamp>, LedgerError> {
        let v: Option<i64> =
            sqlx::query_scalar("SELECT min(expires_at) FROM ledger_status WHERE status = 1")
                .fetch_one(&mut **tx)
                .await
                .map_err(|e| db(&e))?;
        Ok(v.map(Timestamp))
    }

    #[async_trait]
    impl Backend for SqliteBackend {
        fn name(&self) -> &'static str {
            "sqlite"
        }

        async fn execute(&self, cmds: &[Command], now: Timestamp) -> Result<Executed, LedgerError> {
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(|e| db(&e))?;
            let mut snap = load(&mut tx, cmds, now).await?;
            let expect = (snap.head_seq, snap.head_hash);
            let (outcomes, changes) = engine::apply_batch(&mut snap, cmds, now);
            if !changes.is_empty()
                && !write(&mut tx, expect, &snap, &changes)
                    .await
                    .map_err(|e| db(&e))?
            {
                return Err(LedgerError::Storage(
                    "journal head moved under BEGIN IMMEDIATE".into(),
                ));
            }
            let next_due = next_due(&mut tx).await?;
            tx.commit().await.map_err(|e| db(&e))?;
            Ok(Executed {
                outcomes,
                loaded_head: expect,
                snap,
                changes,
                next_due,
            })
        }

        async fn write_fast(
            &self,
            expect: (i64, [u8; 32]),
            snap: &Snapshot,
            changes: &engine::Changes,
        ) -> Result<FastWrite, LedgerError> {
            let mut tx = self
                .pool
                .begin_with("BEGIN IMMEDIATE")
                .await
                .map_err(|e| db(&e))?;
            match write(&mut tx, expect, snap, changes).await {
                Ok(true) => {
                    tx.commit().await.map_err(|e| db(&e))?;
                    Ok(FastWrite::Committed)
                }
                Ok(false) => Ok(FastWrite::HeadMoved),
                Err(e) if is_unique_violation(&e) => Ok(FastWrite::Duplicate),
                Err(e) => Err(db(&e)),
            }
        }

        fn pipeline_depth(&self) -> usize {
            // One writer at a time: a second write would only queue on the file lock.
            1
        }

        async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError> {
            read_account(&self.pool, id).await
        }

        async fn transfer(
            &self,
            id: TransferId,
        ) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError> {
            read_transfer(&self.pool, id).await
        }

        async fn verify(&self) -> Result<VerifyReport, LedgerError> {
            read_verify(&self.pool).await
        }
    }
}

// ---------------------------------------------------------------------------------------------
// PostgreSQL

pub(crate) mod postgres {
    use super::*;
    use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

    /// The PostgreSQL backend (`synchronous_commit` as the server has it: on by default).
    #[derive(Debug, Clone)]
    pub(crate) struct PgBackend {
        pub(crate) pool: PgPool,
    }

    const SCHEMA: &[&str] = &[
        "CREATE TABLE IF NOT EXISTS ledger_accounts (id BYTEA PRIMARY KEY, asset TEXT NOT NULL,
            scale SMALLINT NOT NULL, no_overdraft BOOLEAN NOT NULL, debits_pending BIGINT NOT NULL,
            debits_posted BIGINT NOT NULL, credits_pending BIGINT NOT NULL,
            credits_posted BIGINT NOT NULL, created_at BIGINT NOT NULL,
            CHECK (debits_pending >= 0 AND debits_posted >= 0 AND credits_pending >= 0 AND credits_posted >= 0))",
        "CREATE TABLE IF NOT EXISTS ledger_transfers (seq BIGINT PRIMARY KEY, id BYTEA NOT NULL UNIQUE,
            kind SMALLINT NOT NULL, debit BYTEA NOT NULL, credit BYTEA NOT NULL, amount BIGINT NOT NULL,
            reference BYTEA, user_data BYTEA NOT NULL, timeout_ms BIGINT NOT NULL, ts BIGINT NOT NULL,
            dr_pending_before BIGINT NOT NULL, dr_pending_after BIGINT NOT NULL,
            dr_posted_before BIGINT NOT NULL, dr_posted_after BIGINT NOT NULL,
            cr_pending_before BIGINT NOT NULL, cr_pending_after BIGINT NOT NULL,
            cr_posted_before BIGINT NOT NULL, cr_posted_after BIGINT NOT NULL,
            prev_hash BYTEA NOT NULL, hash BYTEA NOT NULL)",
        "CREATE TABLE IF NOT EXISTS ledger_status (id BYTEA PRIMARY KEY, status SMALLINT NOT NULL,
            amount BIGINT NOT NULL, expires_at BIGINT)",
        "CREATE INDEX IF NOT EXISTS ledger_status_due ON ledger_status (expires_at) WHERE status = 1",
        "CREATE TABLE IF NOT EXISTS ledger_head (id SMALLINT PRIMARY KEY, seq BIGINT NOT NULL,
            hash BYTEA NOT NULL)",
        "INSERT INTO ledger_head (id, seq, hash) VALUES (1, 0, decode(repeat('00', 32), 'hex'))
            ON CONFLICT DO NOTHING",
        "CREATE OR REPLACE FUNCTION ledger_append_only() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'ledger journal is append-only'; END $$",
        "DROP TRIGGER IF EXISTS ledger_transfers_append_only ON ledger_transfers",
        "CREATE TRIGGER ledger_transfers_append_only BEFORE UPDATE OR DELETE ON ledger_transfers
            FOR EACH ROW EXECUTE FUNCTION ledger_append_only()",
    ];

    impl PgBackend {
        /// Connects; `schema` (created if missing) isolates one ledger from others in the
        /// same database.
        pub(crate) async fn open(url: &str, schema: Option<&str>) -> Result<Self, LedgerError> {
            let mut opts = PgConnectOptions::from_str(url).map_err(|e| db(&e))?;
            if let Some(s) = schema {
                if !s
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                {
                    return Err(LedgerError::Storage(format!("bad schema name {s:?}")));
                }
                let admin = PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with(opts.clone())
                    .await
                    .map_err(|e| db(&e))?;
                sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS {s}"))
                    .execute(&admin)
                    .await
                    .map_err(|e| db(&e))?;
                admin.close().await;
                opts = opts.options([("search_path", s)]);
            }
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(10))
                .connect_with(opts)
                .await
                .map_err(|e| db(&e))?;
            let mut tx = pool.begin().await.map_err(|e| db(&e))?;
            // Serialize schema creation across processes starting together.
            sqlx::query("SELECT pg_advisory_xact_lock(7262897412)")
                .execute(&mut *tx)
                .await
                .map_err(|e| db(&e))?;
            for s in SCHEMA {
                sqlx::query(s).execute(&mut *tx).await.map_err(|e| db(&e))?;
            }
            tx.commit().await.map_err(|e| db(&e))?;
            Ok(PgBackend { pool })
        }
    }

    type Tx<'a> = sqlx::Transaction<'a, sqlx::Postgres>;

    reads!(
        PgPool,
        Some("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
    );

    async fn load(
        tx: &mut Tx<'_>,
        cmds: &[Command],
        now: Timestamp,
    ) -> Result<Snapshot, LedgerError> {
        // The head row lock serializes every writer of this ledger, in every process.
        let mut snap = head_and_due(
            tx,
            "SELECT seq, hash FROM ledger_head WHERE id = 1 FOR UPDATE",
            now,
        )
        .await?;
        let needs = engine::needs(cmds);
        let mut tids: BTreeSet<TransferId> = needs.transfers.clone();
        tids.extend(snap.due.iter().copied());
        let ids = bytes(tids, TransferId::to_bytes);
        let sql = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers WHERE id = ANY($1)");
        for row in sqlx::query(sql.as_str())
            .bind(&ids)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| db(&e))?
        {
            let t = transfer_row(&row)?;
            snap.transfers.insert(t.id, t);
        }
        for s in sqlx::query("SELECT id, status, amount FROM ledger_status WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| db(&e))?
        {
            let (id, st) = id_status_row(&s)?;
            snap.statuses.insert(id, st);
        }
        let aids = bytes(accounts_of(&snap, needs.accounts), AccountId::to_bytes);
        let sql = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts WHERE id = ANY($1)");
        for row in sqlx::query(sql.as_str())
            .bind(&aids)
            .fetch_all(&mut **tx)
            .await
            .map_err(|e| db(&e))?
        {
            let a = account_row(&row)?;
            snap.accounts.insert(a.id, a);
        }
        Ok(snap)
    }

    /// The whole write of a batch as ONE statement: a compare-and-set on the journal head and,
    /// only if it matched, the accounts, entries and statuses (data-modifying CTEs run atomically
    /// as one statement). Returns whether the head matched. Run alone it is its own durable
    /// transaction: one round trip per batch.
    async fn write<'e, E>(
        ex: E,
        expect: (i64, [u8; 32]),
        snap: &Snapshot,
        ch: &engine::Changes,
    ) -> Result<bool, sqlx::Error>
    where
        E: sqlx::PgExecutor<'e>,
    {
        storable(snap, ch)?;
        let accs: Vec<&Account> = ch
            .accounts
            .iter()
            .chain(ch.new_accounts.iter())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|id| snap.accounts.get(id))
            .collect();
        let ts = &ch.new_transfers;
        let col = |f: fn(&Transfer) -> i64| ts.iter().map(f).collect::<Vec<i64>>();
        let mut sids = Vec::new();
        let mut scodes = Vec::new();
        let mut samounts = Vec::new();
        let mut sexpires = Vec::new();
        for id in &ch.statuses {
            let Some(st) = snap.statuses.get(id) else {
                continue;
            };
            let (c, a) = st.encode();
            sids.push(id.to_bytes().to_vec());
            scodes.push(c);
            samounts.push(a);
            sexpires.push(
                snap.transfers
                    .get(id)
                    .and_then(Transfer::expires_at)
                    .map(|t| t.0),
            );
        }
        let n: i64 = sqlx::query_scalar(&format!(
            "WITH h AS (UPDATE ledger_head SET seq = $1, hash = $2
                WHERE id = 1 AND seq = $3 AND hash = $37 RETURNING 1),
             a AS (INSERT INTO ledger_accounts (id, asset, scale, no_overdraft, debits_pending,
                    debits_posted, credits_pending, credits_posted, created_at)
                SELECT u.* FROM UNNEST($4::bytea[], $5::text[], $6::int2[], $7::bool[], $8::int8[],
                    $9::int8[], $10::int8[], $11::int8[], $12::int8[]) AS u
                WHERE EXISTS (SELECT 1 FROM h)
                ON CONFLICT (id) DO UPDATE SET debits_pending = EXCLUDED.debits_pending,
                    debits_posted = EXCLUDED.debits_posted, credits_pending = EXCLUDED.credits_pending,
                    credits_posted = EXCLUDED.credits_posted),
             t AS (INSERT INTO ledger_transfers ({TRANSFER_COLS})
                SELECT u.* FROM UNNEST($13::int8[], $14::bytea[], $15::int2[], $16::bytea[], $17::bytea[],
                    $18::int8[], $19::bytea[], $20::bytea[], $21::int8[], $22::int8[], $23::int8[],
                    $24::int8[], $25::int8[], $26::int8[], $27::int8[], $28::int8[], $29::int8[],
                    $30::int8[], $31::bytea[], $32::bytea[]) AS u
                WHERE EXISTS (SELECT 1 FROM h)),
             s AS (INSERT INTO ledger_status (id, status, amount, expires_at)
                SELECT u.* FROM UNNEST($33::bytea[], $34::int2[], $35::int8[], $36::int8[]) AS u
                WHERE EXISTS (SELECT 1 FROM h)
                ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, amount = EXCLUDED.amount)
             SELECT count(*) FROM h"
        ))
        .bind(snap.head_seq)
        .bind(snap.head_hash.to_vec())
        .bind(expect.0)
        .bind(accs.iter().map(|a| a.id.to_bytes().to_vec()).collect::<Vec<_>>())
        .bind(accs.iter().map(|a| a.asset.code().to_owned()).collect::<Vec<_>>())
        .bind(accs.iter().map(|a| i16::from(a.asset.scale())).collect::<Vec<_>>())
        .bind(accs.iter().map(|a| a.no_overdraft).collect::<Vec<_>>())
        .bind(accs.iter().map(|a| i(a.debits_pending)).collect::<Vec<_>>())
        .bind(accs.iter().map(|a| i(a.debits_posted)).collect::<Vec<_>>())
        .bind(accs.iter().map(|a| i(a.credits_pending)).collect::<Vec<_>>())
        .bind(accs.iter().map(|a| i(a.credits_posted)).collect::<Vec<_>>())
        .bind(accs.iter().map(|a| a.created_at.0).collect::<Vec<_>>())
        .bind(col(|t| t.seq))
        .bind(ts.iter().map(|t| t.id.to_bytes().to_vec()).collect::<Vec<_>>())
        .bind(ts.iter().map(|t| t.kind.code()).collect::<Vec<_>>())
        .bind(ts.iter().map(|t| t.debit.to_bytes().to_vec()).collect::<Vec<_>>())
        .bind(ts.iter().map(|t| t.credit.to_bytes().to_vec()).collect::<Vec<_>>())
        .bind(col(|t| i(t.amount)))
        .bind(ts.iter().map(|t| t.reference.map(|r| r.to_bytes().to_vec())).collect::<Vec<_>>())
        .bind(ts.iter().map(|t| t.user_data.to_be_bytes().to_vec()).collect::<Vec<_>>())
        .bind(col(|t| i(t.timeout_ms)))
        .bind(col(|t| t.timestamp.0))
        .bind(col(|t| i(t.debit_side.pending_before)))
        .bind(col(|t| i(t.debit_side.pending_after)))
        .bind(col(|t| i(t.debit_side.posted_before)))
        .bind(col(|t| i(t.debit_side.posted_after)))
        .bind(col(|t| i(t.credit_side.pending_before)))
        .bind(col(|t| i(t.credit_side.pending_after)))
        .bind(col(|t| i(t.credit_side.posted_before)))
        .bind(col(|t| i(t.credit_side.posted_after)))
        .bind(ts.iter().map(|t| t.prev_hash.to_vec()).collect::<Vec<_>>())
        .bind(ts.iter().map(|t| t.hash.to_vec()).collect::<Vec<_>>())
        .bind(sids)
        .bind(scodes)
        .bind(samounts)
        .bind(sexpires)
        .bind(expect.1.to_vec())
        .fetch_one(ex)
        .await?;
        Ok(n == 1)
    }

    #[async_trait]
    impl Backend for PgBackend {
        fn name(&self) -> &'static str {
            "postgres"
        }

        async fn execute(&self, cmds: &[Command], now: Timestamp) -> Result<Executed, LedgerError> {
            let mut tx = self.pool.begin().await.map_err(|e| db(&e))?;
            let mut snap = load(&mut tx, cmds, now).await?;
            let expect = (snap.head_seq, snap.head_hash);
            let (outcomes, changes) = engine::apply_batch(&mut snap, cmds, now);
            if !changes.is_empty()
                && !write(&mut *tx, expect, &snap, &changes)
                    .await
                    .map_err(|e| db(&e))?
            {
                return Err(LedgerError::Storage(
                    "journal head moved under its row lock".into(),
                ));
            }
            let next_due: Option<i64> =
                sqlx::query_scalar("SELECT min(expires_at) FROM ledger_status WHERE status = 1")
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
        ) -> Result<FastWrite, LedgerError> {
            match write(&self.pool, expect, snap, changes).await {
                Ok(true) => Ok(FastWrite::Committed),
                Ok(false) => Ok(FastWrite::HeadMoved),
                Err(e) if is_unique_violation(&e) => Ok(FastWrite::Duplicate),
                Err(e) => Err(db(&e)),
            }
        }

        fn pipeline_depth(&self) -> usize {
            // Several writes in flight would race to the server over separate connections:
            // a later batch arriving first fails its compare-and-set and is redone on the slow
            // path, which costs more than the overlap gains. One at a time.
            1
        }

        async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError> {
            read_account(&self.pool, id).await
        }

        async fn transfer(
            &self,
            id: TransferId,
        ) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError> {
            read_transfer(&self.pool, id).await
        }

        async fn verify(&self) -> Result<VerifyReport, LedgerError> {
            read_verify(&self.pool).await
        }
    }
}

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
