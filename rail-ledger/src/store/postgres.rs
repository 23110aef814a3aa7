//! The PostgreSQL backend.

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

/// The database's clock in milliseconds since the epoch (rounded down).
const DB_NOW: &str = "SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::int8";

async fn load(
    tx: &mut Tx<'_>,
    cmds: &[Command],
    time: BatchTime,
) -> Result<(Snapshot, Timestamp), LedgerError> {
    // The head row lock serializes every writer of this ledger, in every process; the
    // database's clock is read after it is taken, so batches' times follow their order.
    let (mut snap, now) = head_and_due(
        tx,
        "SELECT seq, hash FROM ledger_head WHERE id = 1 FOR UPDATE",
        time,
        Some(DB_NOW),
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
    Ok((snap, now))
}

/// The whole write of a batch as ONE statement: a compare-and-set on the journal head (and,
/// with a `check`, on the batch's timestamp against the database's clock) and, only if it
/// matched, the accounts, entries and statuses (data-modifying CTEs run atomically as one
/// statement). Returns whether it matched, and the database's clock as the statement ran. Run
/// alone it is its own durable transaction: one round trip per batch.
async fn write<'e, E>(
    ex: E,
    expect: (i64, [u8; 32]),
    snap: &Snapshot,
    ch: &engine::Changes,
    check: Option<ClockCheck>,
) -> Result<(bool, Timestamp), sqlx::Error>
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

#[async_trait]
impl Backend for PgBackend {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn execute(&self, cmds: &[Command], time: BatchTime) -> Result<Executed, LedgerError> {
        let mut tx = self.pool.begin().await.map_err(|e| db(&e))?;
        let (mut snap, now) = load(&mut tx, cmds, time).await?;
        let expect = (snap.head_seq, snap.head_hash);
        let (outcomes, changes) = engine::apply_batch(&mut snap, cmds, now);
        if !changes.is_empty()
            && !write(&mut *tx, expect, &snap, &changes, None)
                .await
                .map_err(|e| db(&e))?
                .0
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
        check: Option<ClockCheck>,
    ) -> Result<FastOutcome, LedgerError> {
        let (write, db_now) = match write(&self.pool, expect, snap, changes, check).await {
            Ok((true, now)) => (FastWrite::Committed, Some(now)),
            Ok((false, now)) => {
                let off = check.is_some_and(|c| {
                    now.0.saturating_sub(c.stamped.0).saturating_abs() > c.tolerance_ms
                });
                let w = if off {
                    FastWrite::ClockOff
                } else {
                    FastWrite::HeadMoved
                };
                (w, Some(now))
            }
            Err(e) if is_unique_violation(&e) => (FastWrite::Duplicate, None),
            Err(e) => return Err(db(&e)),
        };
        Ok(FastOutcome { write, db_now })
    }

    async fn db_now(&self) -> Result<Timestamp, LedgerError> {
        sqlx::query_scalar::<_, i64>(DB_NOW)
            .fetch_one(&self.pool)
            .await
            .map(Timestamp)
            .map_err(|e| db(&e))
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
