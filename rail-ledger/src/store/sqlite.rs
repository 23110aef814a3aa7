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
    time: BatchTime,
) -> Result<(Snapshot, Timestamp), LedgerError> {
    // BEGIN IMMEDIATE already holds the write lock. SQLite runs in this process: its clock is
    // the host's.
    let (mut snap, now) = head_and_due(
        tx,
        "SELECT seq, hash FROM ledger_head WHERE id = 1",
        time,
        None,
    )
    .await?;
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
    Ok((snap, now))
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

    async fn execute(&self, cmds: &[Command], time: BatchTime) -> Result<Executed, LedgerError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| db(&e))?;
        let (mut snap, now) = load(&mut tx, cmds, time).await?;
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
        // SQLite's time is the host's, the same clock the batch was stamped with.
        _check: Option<ClockCheck>,
    ) -> Result<FastOutcome, LedgerError> {
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(|e| db(&e))?;
        let write = match write(&mut tx, expect, snap, changes).await {
            Ok(true) => {
                tx.commit().await.map_err(|e| db(&e))?;
                FastWrite::Committed
            }
            Ok(false) => FastWrite::HeadMoved,
            Err(e) if is_unique_violation(&e) => FastWrite::Duplicate,
            Err(e) => return Err(db(&e)),
        };
        Ok(FastOutcome {
            write,
            db_now: None,
        })
    }

    async fn db_now(&self) -> Result<Timestamp, LedgerError> {
        Ok(rail_core::Clock::now(&rail_core::SystemClock))
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

    async fn verify(&self, anchor: Option<(i64, [u8; 32])>) -> Result<VerifyReport, LedgerError> {
        read_verify(&self.pool, anchor).await
    }

    async fn head(&self) -> Result<(i64, [u8; 32]), LedgerError> {
        read_head(&self.pool).await
    }

    async fn history(&self, account: AccountId, limit: u32) -> Result<Vec<Transfer>, LedgerError> {
        read_history(&self.pool, account, limit).await
    }
}
