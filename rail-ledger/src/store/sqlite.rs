//! The SQLite backend: the file's writer thread ([`SqliteDb`]) runs each batch (load, apply,
//! write) as one write of its transaction, so a batch is one hand-off and shares its commit
//! with whatever else the process queued on that file; reads run on the caller's thread.

use std::collections::HashMap;
use std::path::PathBuf;

use rail_core::sqlite::SqliteDb;
use rusqlite::{Connection, OptionalExtension, Row, params, params_from_iter};

use super::*;

/// The SQLite backend: WAL journal, `synchronous = FULL` (durable commits).
#[derive(Debug, Clone)]
pub(crate) struct SqliteBackend {
    db: SqliteDb,
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

/// Transfer ids are random, so every insert dirties a random page of the id index, and every
/// dirty page is written to the WAL at commit: small pages (1 KiB) cut that volume fourfold, a
/// larger checkpoint interval keeps checkpoints off most commits (they run in the background,
/// in [`SqliteDb`]'s checkpointer; this is the backstop), and a big cache keeps the index in
/// memory.
const TUNING: &[(&str, &str)] = &[
    ("page_size", "1024"),
    ("wal_autocheckpoint", "65536"),
    ("cache_size", "-65536"),
    ("mmap_size", "268435456"),
    ("temp_store", "memory"),
];

/// The file a `sqlite://PATH` (or `sqlite:PATH`) URL names, percent-decoded as sqlx read it.
/// The only parameter is `mode`: `rwc` (the default: created if missing) or `rw` (it must
/// exist); any other is refused rather than ignored.
fn path_of(url: &str) -> Result<PathBuf, LedgerError> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .ok_or_else(|| {
            LedgerError::Storage(format!("{url:?} is not a sqlite:// URL (sqlite://PATH)"))
        })?;
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() || path == ":memory:" {
        return Err(LedgerError::Storage(format!(
            "{url:?} names no file: the ledger keeps its journal in a file (sqlite://PATH)"
        )));
    }
    let path = PathBuf::from(percent_decode(path).ok_or_else(|| {
        LedgerError::Storage(format!(
            "{url:?}: a %-escape in the path is not valid UTF-8 hex"
        ))
    })?);
    for param in query.split('&').filter(|p| !p.is_empty()) {
        match param.split_once('=') {
            Some(("mode", "rwc")) => {}
            Some(("mode", "rw")) if path.exists() => {}
            Some(("mode", "rw")) => {
                return Err(LedgerError::Storage(format!(
                    "{url:?}: mode=rw and {} does not exist: create the ledger first, or drop mode=rw",
                    path.display()
                )));
            }
            _ => {
                return Err(LedgerError::Storage(format!(
                    "{url:?}: the parameter {param:?} is not supported (only mode=rwc or mode=rw)"
                )));
            }
        }
    }
    Ok(path)
}

/// `%XX` escapes decoded; `None` for a bad escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        if c == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What a write inside the writer's transaction can end with besides its value.
#[derive(Debug)]
enum Stop {
    /// A transfer id already in the journal (nothing of the write is kept).
    Duplicate,
    /// Anything else.
    Ledger(LedgerError),
}

impl From<rusqlite::Error> for Stop {
    fn from(e: rusqlite::Error) -> Self {
        if is_unique_violation(&e) {
            Stop::Duplicate
        } else {
            Stop::Ledger(sql(&e))
        }
    }
}

impl From<LedgerError> for Stop {
    fn from(e: LedgerError) -> Self {
        Stop::Ledger(e)
    }
}

impl From<rail_core::RailError> for Stop {
    fn from(e: rail_core::RailError) -> Self {
        Stop::Ledger(e.into())
    }
}

impl From<Stop> for LedgerError {
    fn from(s: Stop) -> Self {
        match s {
            Stop::Duplicate => LedgerError::Storage("a transfer id is already journaled".into()),
            Stop::Ledger(e) => e,
        }
    }
}

fn sql(e: &rusqlite::Error) -> LedgerError {
    LedgerError::Storage(e.to_string())
}

fn is_unique_violation(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _)
        if f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE
            || f.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY)
}

impl Fields for Row<'_> {
    fn int(&self, c: &str) -> Result<i64, LedgerError> {
        self.get(c).map_err(|e| sql(&e))
    }
    fn small(&self, c: &str) -> Result<i16, LedgerError> {
        self.get(c).map_err(|e| sql(&e))
    }
    fn flag(&self, c: &str) -> Result<bool, LedgerError> {
        self.get(c).map_err(|e| sql(&e))
    }
    fn text(&self, c: &str) -> Result<String, LedgerError> {
        self.get(c).map_err(|e| sql(&e))
    }
    fn blob(&self, c: &str) -> Result<Vec<u8>, LedgerError> {
        self.get(c).map_err(|e| sql(&e))
    }
    fn opt_blob(&self, c: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        self.get(c).map_err(|e| sql(&e))
    }
}

impl SqliteBackend {
    pub(crate) async fn open(url: &str) -> Result<Self, LedgerError> {
        let path = path_of(url)?;
        let db = SqliteDb::open_tuned(&path, TUNING)?;
        db.write_as(|c| {
            for s in SCHEMA {
                c.execute_batch(&in_dialect(s, TYPES))
                    .map_err(|e| sql(&e))?;
            }
            Ok::<(), LedgerError>(())
        })
        .await?;
        Ok(SqliteBackend { db })
    }
}

/// The rows an applied batch writes, taken out of the snapshot so the writer owns them.
struct Rows {
    head: (i64, [u8; 32]),
    accounts: Vec<Account>,
    transfers: Vec<Transfer>,
    statuses: Vec<StatusRow>,
}

impl Rows {
    fn of(snap: &Snapshot, ch: &engine::Changes) -> Result<Rows, LedgerError> {
        if !fits(snap, ch) {
            return Err(LedgerError::Storage(TOO_BIG.into()));
        }
        Ok(Rows {
            head: (snap.head_seq, snap.head_hash),
            accounts: changed_accounts(snap, ch).into_iter().cloned().collect(),
            transfers: ch.new_transfers.clone(),
            statuses: changed_statuses(snap, ch),
        })
    }
}

const HEAD_SQL: &str = "SELECT seq, hash FROM ledger_head WHERE id = 1";

/// The start of a locked batch (the writer holds the file's lock): the journal head, the
/// batch's time, the holds due for expiry at that time, and what the batch touches.
fn load(
    c: &Connection,
    cmds: &[Command],
    time: BatchTime,
) -> Result<(Snapshot, Timestamp), LedgerError> {
    let mut snap = Snapshot::default();
    (snap.head_seq, snap.head_hash) = c
        .prepare_cached(HEAD_SQL)
        .and_then(|mut s| s.query_row([], |r| Ok(Cols(r).head())))
        .map_err(|e| sql(&e))??;
    let now = match time {
        BatchTime::At(t) => t,
        // SQLite has no server: its clock is the host's.
        BatchTime::Database => rail_core::Clock::now(&rail_core::SystemClock),
    };
    {
        let mut st = c
            .prepare_cached(
                "SELECT id FROM ledger_status WHERE status = 1 AND expires_at <= ?1
                 ORDER BY expires_at LIMIT ?2",
            )
            .map_err(|e| sql(&e))?;
        let mut rows = st.query(params![now.0, MAX_DUE]).map_err(|e| sql(&e))?;
        while let Some(r) = rows.next().map_err(|e| sql(&e))? {
            let id = r.blob("id")?;
            snap.due.push(id16(&id, TransferId::from_slice, "due id")?);
        }
    }
    let needs = engine::needs(cmds);
    let mut tids: BTreeSet<TransferId> = needs.transfers.clone();
    tids.extend(snap.due.iter().copied());
    load_transfers(c, &mut snap, &tids)?;
    for id in accounts_of(&snap, needs.accounts) {
        if let Some(a) = account_in(c, id)? {
            snap.accounts.insert(a.id, a);
        }
    }
    Ok((snap, now))
}

/// Loads the transfers `tids` and, of those found, their status rows into `snap`.
fn load_transfers(
    c: &Connection,
    snap: &mut Snapshot,
    tids: &BTreeSet<TransferId>,
) -> Result<(), LedgerError> {
    for id in tids {
        if let Some((t, st)) = transfer_in(c, *id)? {
            if let Some(st) = st {
                snap.statuses.insert(t.id, st);
            }
            snap.transfers.insert(t.id, t);
        }
    }
    Ok(())
}

fn account_in(c: &Connection, id: AccountId) -> Result<Option<Account>, LedgerError> {
    let q = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts WHERE id = ?1");
    c.prepare_cached(&q)
        .and_then(|mut s| {
            s.query_row([id.to_bytes().to_vec()], |r| Ok(Cols(r).account()))
                .optional()
        })
        .map_err(|e| sql(&e))?
        .transpose()
}

fn transfer_in(
    c: &Connection,
    id: TransferId,
) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError> {
    let q = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers WHERE id = ?1");
    let Some(t) = c
        .prepare_cached(&q)
        .and_then(|mut s| {
            s.query_row([id.to_bytes().to_vec()], |r| Ok(Cols(r).transfer()))
                .optional()
        })
        .map_err(|e| sql(&e))?
        .transpose()?
    else {
        return Ok(None);
    };
    let st = c
        .prepare_cached("SELECT status, amount FROM ledger_status WHERE id = ?1")
        .and_then(|mut s| {
            s.query_row([id.to_bytes().to_vec()], |r| Ok(Cols(r).status()))
                .optional()
        })
        .map_err(|e| sql(&e))?
        .transpose()?;
    Ok(Some((t, st)))
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

/// One parameter of a multi-row statement.
type Value = rusqlite::types::Value;

/// Writes `rows` as multi-row statements (`sql(n)` for `n` rows, `values` giving one row's
/// parameters), in chunks of the fixed sizes [`CHUNKS`] so the prepared statements stay few
/// and cached.
fn write_rows<T>(
    c: &Connection,
    rows: &[T],
    sql_of: fn(usize) -> &'static str,
    values: impl Fn(&T, &mut Vec<Value>),
) -> rusqlite::Result<()> {
    let mut rest = rows;
    let mut args: Vec<Value> = Vec::new();
    while !rest.is_empty() {
        let n = CHUNKS.into_iter().find(|&n| n <= rest.len()).unwrap_or(1);
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        args.clear();
        for r in chunk {
            values(r, &mut args);
        }
        c.prepare_cached(sql_of(n))?
            .execute(params_from_iter(args.iter()))?;
    }
    Ok(())
}

fn blob(b: impl Into<Vec<u8>>) -> Value {
    Value::Blob(b.into())
}

/// Writes an applied batch: compare-and-set the head, then accounts, entries and statuses.
/// `false` if the head was not at `expect` (nothing written).
fn write_locked(c: &Connection, expect: (i64, [u8; 32]), rows: &Rows) -> rusqlite::Result<bool> {
    let moved = c
        .prepare_cached(
            "UPDATE ledger_head SET seq = ?1, hash = ?2 WHERE id = 1 AND seq = ?3 AND hash = ?4",
        )?
        .execute(params![
            rows.head.0,
            rows.head.1.as_slice(),
            expect.0,
            expect.1.as_slice()
        ])?;
    if moved != 1 {
        return Ok(false);
    }
    write_rows(c, &rows.accounts, upsert_accounts_sql, |a, v| {
        v.extend([
            blob(a.id.to_bytes()),
            Value::Text(a.asset.code().to_owned()),
            Value::Integer(i64::from(a.asset.scale())),
            Value::Integer(i64::from(a.no_overdraft)),
            Value::Integer(i(a.debits_pending)),
            Value::Integer(i(a.debits_posted)),
            Value::Integer(i(a.credits_pending)),
            Value::Integer(i(a.credits_posted)),
            Value::Integer(a.created_at.0),
        ]);
    })?;
    write_rows(c, &rows.transfers, insert_transfers_sql, |t, v| {
        v.extend([
            Value::Integer(t.seq),
            blob(t.id.to_bytes()),
            Value::Integer(i64::from(t.kind.code())),
            blob(t.debit.to_bytes()),
            blob(t.credit.to_bytes()),
            Value::Integer(i(t.amount)),
            t.reference.map_or(Value::Null, |r| blob(r.to_bytes())),
            blob(t.user_data.to_be_bytes()),
            Value::Integer(i(t.timeout_ms)),
            Value::Integer(t.timestamp.0),
            Value::Integer(i(t.debit_side.pending_before)),
            Value::Integer(i(t.debit_side.pending_after)),
            Value::Integer(i(t.debit_side.posted_before)),
            Value::Integer(i(t.debit_side.posted_after)),
            Value::Integer(i(t.credit_side.pending_before)),
            Value::Integer(i(t.credit_side.pending_after)),
            Value::Integer(i(t.credit_side.posted_before)),
            Value::Integer(i(t.credit_side.posted_after)),
            blob(t.prev_hash),
            blob(t.hash),
        ]);
    })?;
    write_rows(c, &rows.statuses, upsert_statuses_sql, |s, v| {
        v.extend([
            blob(s.id.clone()),
            Value::Integer(i64::from(s.code)),
            Value::Integer(s.amount),
            s.expires_at.map_or(Value::Null, Value::Integer),
        ]);
    })?;
    Ok(true)
}

#[async_trait]
impl Backend for SqliteBackend {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    /// One writer at a time: a second write would only queue on the file lock.
    fn pipeline_depth(&self) -> usize {
        1
    }

    /// SQLite has no server: its clock is the host's.
    async fn db_now(&self) -> Result<Timestamp, LedgerError> {
        Ok(rail_core::Clock::now(&rail_core::SystemClock))
    }

    async fn execute(&self, cmds: &[Command], time: BatchTime) -> Result<Executed, LedgerError> {
        let cmds = cmds.to_vec();
        self.db
            .write_as(move |c| {
                let (mut snap, now) = load(c, &cmds, time)?;
                let expect = (snap.head_seq, snap.head_hash);
                let (outcomes, changes) = engine::apply_batch(&mut snap, &cmds, now);
                if !changes.is_empty() {
                    let rows = Rows::of(&snap, &changes)?;
                    if !write_locked(c, expect, &rows).map_err(|e| sql(&e))? {
                        return Err(LedgerError::Storage(
                            "journal head moved under BEGIN IMMEDIATE".into(),
                        ));
                    }
                }
                let next_due: Option<i64> = c
                    .prepare_cached(NEXT_DUE)
                    .and_then(|mut s| s.query_row([], |r| r.get(0)))
                    .map_err(|e| sql(&e))?;
                Ok(Executed {
                    outcomes,
                    loaded_head: expect,
                    snap,
                    changes,
                    next_due: next_due.map(Timestamp),
                })
            })
            .await
    }

    /// SQLite's time is the host's, the same clock the batch was stamped with: there is no
    /// clock to check (`_check`) or report.
    async fn write_fast(
        &self,
        expect: (i64, [u8; 32]),
        snap: &Snapshot,
        changes: &engine::Changes,
        _check: Option<ClockCheck>,
    ) -> Result<FastOutcome, LedgerError> {
        let rows = Rows::of(snap, changes)?;
        let written = self
            .db
            .write_as(move |c| Ok::<bool, Stop>(write_locked(c, expect, &rows)?))
            .await;
        let write = match written {
            Ok(true) => FastWrite::Committed,
            Ok(false) => FastWrite::HeadMoved,
            Err(Stop::Duplicate) => FastWrite::Duplicate,
            Err(Stop::Ledger(e)) => return Err(e),
        };
        Ok(FastOutcome {
            write,
            db_now: None,
        })
    }

    async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError> {
        self.db.read(|c| Ok(account_in(c, id)))?
    }

    async fn transfer(
        &self,
        id: TransferId,
    ) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError> {
        self.db.read(|c| Ok(transfer_in(c, id)))?
    }

    /// The last `limit` journal entries that debit or credit `account`, newest first.
    async fn history(&self, account: AccountId, limit: u32) -> Result<Vec<Transfer>, LedgerError> {
        let q = format!(
            "SELECT {TRANSFER_COLS} FROM ledger_transfers WHERE debit = ?1 OR credit = ?1 \
             ORDER BY seq DESC LIMIT ?2"
        );
        self.db
            .read(|c| {
                let mut st = c.prepare_cached(&q)?;
                let mut rows = st.query(params![account.to_bytes().to_vec(), i64::from(limit)])?;
                let mut out = Vec::new();
                while let Some(r) = rows.next()? {
                    out.push(Cols(r).transfer());
                }
                Ok(out)
            })?
            .into_iter()
            .collect()
    }

    async fn head(&self) -> Result<(i64, [u8; 32]), LedgerError> {
        self.db.read(|c| {
            c.prepare_cached(HEAD_SQL)?
                .query_row([], |r| Ok(Cols(r).head()))
        })?
    }

    /// Replays the journal inside one read transaction: a consistent view of entries, head,
    /// accounts and statuses. Every table is streamed row by row (never loaded whole): memory
    /// stays bounded by the verifier's own state (accounts, holds, reversed transfers).
    async fn verify(&self, anchor: Option<(i64, [u8; 32])>) -> Result<VerifyReport, LedgerError> {
        // The whole journal: off the runtime's threads.
        let db = self.db.clone();
        tokio::task::spawn_blocking(move || db.read(|c| Ok(verify_in(c, anchor))))
            .await
            .map_err(|e| LedgerError::Storage(format!("the verification stopped: {e}")))??
    }
}

/// [`Backend::verify`] on one read connection, in one transaction.
fn verify_in(c: &Connection, anchor: Option<(i64, [u8; 32])>) -> Result<VerifyReport, LedgerError> {
    let mut v = Verifier::new(anchor);
    c.execute_batch("BEGIN").map_err(|e| sql(&e))?;
    let replay = (|| -> Result<VerifyReport, LedgerError> {
        // Accounts first (their no-overdraft flags are rules the replay checks), then the
        // entries, then the status rows.
        let q = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts");
        let mut st = c.prepare(&q).map_err(|e| sql(&e))?;
        let mut rows = st.query([]).map_err(|e| sql(&e))?;
        while let Some(r) = rows.next().map_err(|e| sql(&e))? {
            v.account(&Cols(r).account()?);
        }
        let q = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers ORDER BY seq");
        let mut st = c.prepare(&q).map_err(|e| sql(&e))?;
        let mut rows = st.query([]).map_err(|e| sql(&e))?;
        while let Some(r) = rows.next().map_err(|e| sql(&e))? {
            v.entry(&Cols(r).transfer()?);
        }
        let head = c
            .query_row(HEAD_SQL, [], |r| Ok(Cols(r).head()))
            .map_err(|e| sql(&e))??;
        let mut st = c
            .prepare("SELECT id, status, amount, expires_at FROM ledger_status")
            .map_err(|e| sql(&e))?;
        let mut rows = st.query([]).map_err(|e| sql(&e))?;
        while let Some(s) = rows.next().map_err(|e| sql(&e))? {
            let (id, st) = Cols(s).id_status()?;
            let expires: Option<i64> = s.get("expires_at").map_err(|e| sql(&e))?;
            v.status(id, st, expires.map(Timestamp));
        }
        Ok(v.finish(head))
    })();
    if let Err(e) = c.execute_batch("ROLLBACK") {
        tracing::debug!(error = %e, "ending the verification's read transaction");
    }
    replay
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sqlite_url_names_its_file() {
        let p = |u: &str| path_of(u).map(|p| p.display().to_string());
        assert_eq!(
            p("sqlite:///var/x/ledger.db").ok(),
            Some("/var/x/ledger.db".into())
        );
        assert_eq!(
            p("sqlite://ledger.db?mode=rwc").ok(),
            Some("ledger.db".into())
        );
        assert_eq!(p("sqlite:ledger.db").ok(), Some("ledger.db".into()));
        for bad in [
            "sqlite::memory:",
            "sqlite://",
            "postgres://h/db",
            "ledger.db",
        ] {
            let e = path_of(bad)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("sqlite://PATH"), "{bad}: {e}");
        }
    }
}
