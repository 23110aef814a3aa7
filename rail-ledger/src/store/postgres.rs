//! The PostgreSQL backend.

use super::*;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

/// The PostgreSQL backend (`synchronous_commit` as the server has it: on by default).
#[derive(Debug, Clone)]
pub(crate) struct PgBackend {
    pub(crate) pool: PgPool,
}

impl Fields for sqlx::postgres::PgRow {
    fn int(&self, c: &str) -> Result<i64, LedgerError> {
        self.try_get(c).map_err(|e| db(&e))
    }
    fn small(&self, c: &str) -> Result<i16, LedgerError> {
        self.try_get(c).map_err(|e| db(&e))
    }
    fn flag(&self, c: &str) -> Result<bool, LedgerError> {
        self.try_get(c).map_err(|e| db(&e))
    }
    fn text(&self, c: &str) -> Result<String, LedgerError> {
        self.try_get(c).map_err(|e| db(&e))
    }
    fn blob(&self, c: &str) -> Result<Vec<u8>, LedgerError> {
        self.try_get(c).map_err(|e| db(&e))
    }
    fn opt_blob(&self, c: &str) -> Result<Option<Vec<u8>>, LedgerError> {
        self.try_get(c).map_err(|e| db(&e))
    }
}

/// This dialect's 64-bit integer, small integer and bytes types ([`in_dialect`]).
const TYPES: [&str; 3] = ["BIGINT", "SMALLINT", "BYTEA"];

/// The schema, each statement passed through [`in_dialect`] with [`TYPES`].
const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS ledger_accounts (id BYTEA PRIMARY KEY, asset TEXT NOT NULL,
        scale SMALLINT NOT NULL, no_overdraft BOOLEAN NOT NULL, debits_pending BIGINT NOT NULL,
        debits_posted BIGINT NOT NULL, credits_pending BIGINT NOT NULL,
        credits_posted BIGINT NOT NULL, created_at BIGINT NOT NULL,
        CHECK (debits_pending >= 0 AND debits_posted >= 0 AND credits_pending >= 0 AND credits_posted >= 0))",
    TRANSFERS_TABLE,
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
        let mut opts = rail_core::keys::sql::tuned_postgres(
            PgConnectOptions::from_str(url).map_err(|e| db(&e))?,
            url,
        );
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
            sqlx::query(&in_dialect(s, TYPES))
                .execute(&mut *tx)
                .await
                .map_err(|e| db(&e))?;
        }
        tx.commit().await.map_err(|e| db(&e))?;
        Ok(PgBackend { pool })
    }
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Postgres>;

/// The database's clock in milliseconds since the epoch (rounded down).
const DB_NOW: &str = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8";

/// The head row lock serializes every writer of this ledger, in every process.
const HEAD_SQL: &str = "SELECT seq, hash FROM ledger_head WHERE id = 1 FOR UPDATE";
/// The database's clock is read after the head lock is taken, so batches' times follow their
/// order.
const CLOCK_SQL: Option<&str> = Some(DB_NOW);

const NAME: &str = "postgres";
/// Several writes in flight would race to the server over separate connections: a later
/// batch arriving first fails its compare-and-set and is redone on the slow path, which costs
/// more than the overlap gains. One at a time.
const PIPELINE_DEPTH: usize = 1;
const LOCK: &str = "its row lock";
const VERIFY_PRELUDE: Option<&str> =
    Some("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY");

sql_backend!(PgBackend);

/// The database's clock.
async fn db_clock(pool: &PgPool) -> Result<Timestamp, LedgerError> {
    sqlx::query_scalar::<_, i64>(DB_NOW)
        .fetch_one(pool)
        .await
        .map(Timestamp)
        .map_err(|e| db(&e))
}

/// Opens the transaction of a locked batch (the lock is [`HEAD_SQL`]'s).
async fn begin_locked(pool: &PgPool) -> Result<Tx<'static>, sqlx::Error> {
    pool.begin().await
}

/// Loads the transfers `tids` and their status rows into `snap`.
async fn load_transfers(
    tx: &mut Tx<'_>,
    snap: &mut Snapshot,
    tids: BTreeSet<TransferId>,
) -> Result<(), LedgerError> {
    let ids = bytes(tids, TransferId::to_bytes);
    let sql = format!("SELECT {TRANSFER_COLS} FROM ledger_transfers WHERE id = ANY($1)");
    for row in sqlx::query(sql.as_str())
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await
        .map_err(|e| db(&e))?
    {
        let t = Cols(&row).transfer()?;
        snap.transfers.insert(t.id, t);
    }
    for s in sqlx::query("SELECT id, status, amount FROM ledger_status WHERE id = ANY($1)")
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await
        .map_err(|e| db(&e))?
    {
        let (id, st) = Cols(&s).id_status()?;
        snap.statuses.insert(id, st);
    }
    Ok(())
}

/// The accounts `aids`.
async fn load_accounts(tx: &mut Tx<'_>, aids: Vec<AccountId>) -> Result<Vec<Account>, LedgerError> {
    let aids = bytes(aids, AccountId::to_bytes);
    let sql = format!("SELECT {ACCOUNT_COLS} FROM ledger_accounts WHERE id = ANY($1)");
    sqlx::query(sql.as_str())
        .bind(&aids)
        .fetch_all(&mut **tx)
        .await
        .map_err(|e| db(&e))?
        .iter()
        .map(|r| Cols(r).account())
        .collect()
}

/// [`write`] inside a locked batch, without a clock check.
async fn write_locked(tx: &mut Tx<'_>, batch: Batch<'_>) -> Result<bool, sqlx::Error> {
    Ok(write(&mut **tx, batch, None).await?.0)
}

/// [`write`] on its own: one statement is its own transaction.
async fn write_alone(
    pool: &PgPool,
    batch: Batch<'_>,
    check: Option<ClockCheck>,
) -> Result<Result<(bool, Option<Timestamp>), sqlx::Error>, LedgerError> {
    Ok(write(pool, batch, check)
        .await
        .map(|(matched, now)| (matched, Some(now))))
}

/// The whole write of a batch as ONE statement: a compare-and-set on the journal head (and,
/// with a `check`, on the batch's timestamp against the database's clock) and, only if it
/// matched, the accounts, entries and statuses (data-modifying CTEs run atomically as one
/// statement). Returns whether it matched, and the database's clock as the statement ran. Run
/// alone it is its own durable transaction: one round trip per batch.
async fn write<'e, E>(
    ex: E,
    batch: Batch<'_>,
    check: Option<ClockCheck>,
) -> Result<(bool, Timestamp), sqlx::Error>
where
    E: sqlx::PgExecutor<'e>,
{
    let Batch { expect, snap, ch } = batch;
    if !fits(snap, ch) {
        return Err(sqlx::Error::Protocol(TOO_BIG.into()));
    }
    let accs = changed_accounts(snap, ch);
    let ts = &ch.new_transfers;
    let col = |f: fn(&Transfer) -> i64| ts.iter().map(f).collect::<Vec<i64>>();
    let mut sids = Vec::new();
    let mut scodes = Vec::new();
    let mut samounts = Vec::new();
    let mut sexpires = Vec::new();
    for s in changed_statuses(snap, ch) {
        sids.push(s.id);
        scodes.push(s.code);
        samounts.push(s.amount);
        sexpires.push(s.expires_at);
    }
    let (n, db_now): (i64, i64) = sqlx::query_as(&format!(
        "WITH c AS (SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8 AS now),
         h AS (UPDATE ledger_head SET seq = $1, hash = $2
            WHERE id = 1 AND seq = $3 AND hash = $37
                AND ($38::int8 IS NULL OR abs((SELECT now FROM c) - $38::int8) <= $39::int8)
            RETURNING 1),
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
            ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, amount = EXCLUDED.amount,
                expires_at = EXCLUDED.expires_at)
         SELECT (SELECT count(*) FROM h), (SELECT now FROM c)"
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
    .bind(check.map(|c| c.stamped.0))
    .bind(check.map_or(0, |c| c.tolerance_ms))
    .fetch_one(ex)
    .await?;
    Ok((n == 1, Timestamp(db_now)))
}
