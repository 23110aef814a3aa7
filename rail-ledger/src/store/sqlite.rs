//! The SQLite backend.

use std::collections::HashMap;

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

/// This dialect's 64-bit integer, small integer and bytes types ([`in_dialect`]).
const TYPES: [&str; 3] = ["INTEGER", "INTEGER", "BLOB"];

/// The schema, each statement passed through [`in_dialect`] with [`TYPES`].
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS ledger_accounts (id BLOB PRIMARY KEY, asset TEXT NOT NULL,
        scale INTEGER NOT NULL, no_overdraft BOOLEAN NOT NULL, debits_pending INTEGER NOT NULL,
        debits_posted INTEGER NOT NULL, credits_pending INTEGER NOT NULL,
        credits_posted INTEGER NOT NULL, created_at INTEGER NOT NULL) WITHOUT ROWID",
    TRANSFERS_TABLE,
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
            sqlx::query(&in_dialect(s, TYPES))
                .execute(&pool)
                .await
                .map_err(|e| db(&e))?;
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

/// `BEGIN IMMEDIATE` (see [`begin_locked`]) already holds the write lock.
const HEAD_SQL: &str = "SELECT seq, hash FROM ledger_head WHERE id = 1";
/// SQLite runs in this process: its clock is the host's.
const CLOCK_SQL: Option<&str> = None;

const NAME: &str = "sqlite";
/// One writer at a time: a second write would only queue on the file lock.
const PIPELINE_DEPTH: usize = 1;
const LOCK: &str = "BEGIN IMMEDIATE";
/// A deferred transaction in WAL mode reads one snapshot.
const VERIFY_PRELUDE: Option<&str> = None;

sql_backend!(SqliteBackend);

/// SQLite has no server: its clock is the host's.
async fn db_clock(_pool: &SqlitePool) -> Result<Timestamp, LedgerError> {
    Ok(rail_core::Clock::now(&rail_core::SystemClock))
}

/// Opens the transaction of a locked batch: `BEGIN IMMEDIATE` takes the write lock.
async fn begin_locked(pool: &SqlitePool) -> Result<Tx<'static>, sqlx::Error> {
    pool.begin_with("BEGIN IMMEDIATE").await
}

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

/// Loads the transfers `tids` and, of those found, their status rows into `snap`.
async fn load_transfers(
    tx: &mut Tx<'_>,
    snap: &mut Snapshot,
    tids: BTreeSet<TransferId>,
) -> Result<(), LedgerError> {
    let sql = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers WHERE id = ?1");
    let status_sql = "SELECT status, amount FROM ledger_status WHERE id = ?1";
    for id in &tids {
        if let Some(row) = sqlx::query(sql.as_str())
            .bind(id.to_bytes().to_vec())
            .fetch_optional(&mut **tx)
            .await
            .map_err(|e| db(&e))?
        {
            let t = Cols(&row).transfer()?;
            if let Some(s) = sqlx::query(status_sql)
                .bind(id.to_bytes().to_vec())
                .fetch_optional(&mut **tx)
                .await
                .map_err(|e| db(&e))?
            {
                snap.statuses.insert(t.id, Cols(&s).status()?);
            }
            snap.transfers.insert(t.id, t);
        }
    }
    Ok(())
}

/// The accounts `aids` (those found).
async fn load_accounts(tx: &mut Tx<'_>, aids: Vec<AccountId>) -> Result<Vec<Account>, LedgerError> {
    let sql = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts WHERE id = ?1");
    let mut found = Vec::new();
    for id in aids {
        if let Some(row) = sqlx::query(sql.as_str())
            .bind(id.to_bytes().to_vec())
            .fetch_optional(&mut **tx)
            .await
            .map_err(|e| db(&e))?
        {
            found.push(Cols(&row).account()?);
        }
    }
    Ok(found)
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
            "ON CONFLICT (id) DO UPDATE SET status = excluded.status, amount = excluded.amount, \
             expires_at = excluded.expires_at",
        )
    })
}

/// A statement with its parameters bound (all owned).
type Query = sqlx::query::Query<'static, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'static>>;

/// Writes `rows` as multi-row statements (`sql(n)` for `n` rows, `bind` adding one row's
/// parameters), in chunks of the fixed sizes [`CHUNKS`] so the prepared statements stay few
/// and cached.
async fn write_rows<T>(
    tx: &mut Tx<'_>,
    rows: &[T],
    sql: fn(usize) -> &'static str,
    bind: impl Fn(Query, &T) -> Query,
) -> Result<(), sqlx::Error> {
    let mut rest = rows;
    while !rest.is_empty() {
        let n = CHUNKS.into_iter().find(|&n| n <= rest.len()).unwrap_or(1);
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        let q = chunk.iter().fold(sqlx::query(sql(n)), &bind);
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Writes a batch as four statements whatever its size (rows travel as JSON arrays):
/// compare-and-set the head, then accounts, entries and statuses. `false` if the head
/// was not at `expect` (nothing written).
async fn write_locked(tx: &mut Tx<'_>, batch: Batch<'_>) -> Result<bool, sqlx::Error> {
    let Batch { expect, snap, ch } = batch;
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
    write_rows(
        tx,
        &changed_accounts(snap, ch),
        upsert_accounts_sql,
        |q, a| {
            q.bind(a.id.to_bytes().to_vec())
                .bind(a.asset.code().to_owned())
                .bind(i16::from(a.asset.scale()))
                .bind(a.no_overdraft)
                .bind(i(a.debits_pending))
                .bind(i(a.debits_posted))
                .bind(i(a.credits_pending))
                .bind(i(a.credits_posted))
                .bind(a.created_at.0)
        },
    )
    .await?;
    // Entries as multi-row VALUES with bound parameters.
    write_rows(tx, &ch.new_transfers, insert_transfers_sql, |q, t| {
        q.bind(t.seq)
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
            .bind(t.hash.to_vec())
    })
    .await?;
    write_rows(
        tx,
        &changed_statuses(snap, ch),
        upsert_statuses_sql,
        |q, s| {
            q.bind(s.id.clone())
                .bind(s.code)
                .bind(s.amount)
                .bind(s.expires_at)
        },
    )
    .await?;
    Ok(true)
}

/// [`write_locked`] on its own, in a `BEGIN IMMEDIATE` transaction committed if the head
/// matched. SQLite's time is the host's, the same clock the batch was stamped with: there is
/// no clock to check (`_check`) or report.
async fn write_alone(
    pool: &SqlitePool,
    batch: Batch<'_>,
    _check: Option<ClockCheck>,
) -> Result<Result<(bool, Option<Timestamp>), sqlx::Error>, LedgerError> {
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(|e| db(&e))?;
    let written = write_locked(&mut tx, batch).await;
    if let Ok(true) = written {
        tx.commit().await.map_err(|e| db(&e))?;
    }
    Ok(written.map(|matched| (matched, None)))
}
