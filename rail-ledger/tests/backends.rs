//! The same ledger tests on both backends: SQLite (always) and PostgreSQL (localnet: the
//! project machines' service, or `STIPENDEX_PG_URL`; required in CI).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rail_core::{Asset, Clock, ManualClock, SharedClock, SystemClock, Timestamp};
use rail_ledger::{
    Account, AccountId, Created, Ledger, LedgerError, NewAccount, Problem, RESERVED_BIT,
    SideBalances, Transfer, TransferError, TransferId, TransferKind, TransferRequest,
    TransferStatus, VerifyReport, entry_hash,
};

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

struct Fixture {
    ledger: Ledger,
    clock: ManualClock,
    _dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

/// A direct connection to a fixture's database, past the ledger.
enum Raw {
    Pg(sqlx::postgres::PgPool),
    Lite(sqlx::sqlite::SqlitePool),
}

impl Fixture {
    /// A second handle on the same database (another "process": its own pool and batcher).
    async fn second_handle(&self) -> Ledger {
        let clock: SharedClock = Arc::new(self.clock.clone());
        match (&self.pg, &self._dir) {
            (Some((url, schema)), _) => Ledger::postgres_with_clock(url, Some(schema), clock)
                .await
                .unwrap(),
            (None, Some(dir)) => Ledger::sqlite_with_clock(&sqlite_url(dir), clock)
                .await
                .unwrap(),
            _ => unreachable!(),
        }
    }

    /// One connection straight to the database (on PostgreSQL, in the fixture's schema).
    async fn raw(&self) -> Raw {
        match (&self.pg, &self._dir) {
            (Some((url, schema)), _) => {
                let opts: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect_with(opts.options([("search_path", schema.as_str())]))
                    .await
                    .unwrap();
                Raw::Pg(pool)
            }
            (None, Some(dir)) => {
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .max_connections(1)
                    .connect(&sqlite_url(dir))
                    .await
                    .unwrap();
                Raw::Lite(pool)
            }
            _ => unreachable!(),
        }
    }

    /// Runs `sql` directly on the database, as someone with write access could.
    async fn try_exec(&self, sql: &str) -> Result<(), sqlx::Error> {
        match self.raw().await {
            Raw::Pg(pool) => sqlx::raw_sql(sql).execute(&pool).await.map(|_| ()),
            Raw::Lite(pool) => sqlx::raw_sql(sql).execute(&pool).await.map(|_| ()),
        }
    }

    /// [`Fixture::try_exec`], which must succeed.
    async fn raw_exec(&self, sql: &str) {
        self.try_exec(sql).await.unwrap();
    }

    /// One integer from a query run directly on the database (`NULL` reads as `None`).
    async fn raw_i64(&self, sql: &str) -> Option<i64> {
        match self.raw().await {
            Raw::Pg(pool) => sqlx::query_scalar::<_, Option<i64>>(sql)
                .fetch_one(&pool)
                .await
                .unwrap(),
            Raw::Lite(pool) => sqlx::query_scalar::<_, Option<i64>>(sql)
                .fetch_one(&pool)
                .await
                .unwrap(),
        }
    }

    /// Drops the journal's append-only guard (its triggers), as an attacker with database
    /// rights could.
    async fn drop_guard(&self) {
        let sql = if self.pg.is_none() {
            "DROP TRIGGER ledger_transfers_no_update; DROP TRIGGER ledger_transfers_no_delete;"
        } else {
            "DROP TRIGGER ledger_transfers_append_only ON ledger_transfers;"
        };
        self.raw_exec(sql).await;
    }
}

/// Drops the PostgreSQL test schema at `url` (best effort: a cleanup).
async fn drop_schema(url: &str, schema: &str) {
    if let Ok(pool) = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
    {
        let _ = sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&pool)
            .await;
    }
}

fn sqlite_url(dir: &tempfile::TempDir) -> String {
    format!("sqlite://{}/ledger.db", dir.path().display())
}

async fn fixture(b: Backend) -> Option<Fixture> {
    let clock = ManualClock::at(Timestamp(1_700_000_000_000));
    let shared: SharedClock = Arc::new(clock.clone());
    match b {
        Backend::Sqlite => {
            let dir = tempfile::tempdir().unwrap();
            let ledger = Ledger::sqlite_with_clock(&sqlite_url(&dir), shared)
                .await
                .unwrap();
            Some(Fixture {
                ledger,
                clock,
                _dir: Some(dir),
                pg: None,
            })
        }
        Backend::Postgres => {
            let url = test_kit::localnet::postgres_url();
            let schema = format!("t_{:016x}", rand::random::<u64>());
            match tokio::time::timeout(
                Duration::from_secs(5),
                Ledger::postgres_with_clock(&url, Some(&schema), shared),
            )
            .await
            {
                Ok(Ok(ledger)) => Some(Fixture {
                    ledger,
                    clock,
                    _dir: None,
                    pg: Some((url, schema)),
                }),
                Ok(Err(e)) => {
                    test_kit::localnet::missing("PostgreSQL", &e.to_string());
                    None
                }
                Err(_) => {
                    test_kit::localnet::missing("PostgreSQL", "connection timed out");
                    None
                }
            }
        }
    }
}

async fn account(l: &Ledger, no_overdraft: bool) -> AccountId {
    let id = AccountId::random();
    l.create_account(NewAccount {
        id,
        asset: Asset::usd(),
        no_overdraft,
    })
    .await
    .unwrap();
    id
}

fn single(debit: AccountId, credit: AccountId, amount: u64) -> TransferRequest {
    TransferRequest::Single {
        id: TransferId::random(),
        debit,
        credit,
        amount,
        user_data: 7,
    }
}

/// A hold `id` of `amount` from `debit` for `credit`, lapsing after `timeout_ms` (0: never).
fn pending(
    id: TransferId,
    debit: AccountId,
    credit: AccountId,
    amount: u64,
    user_data: u128,
    timeout_ms: u64,
) -> TransferRequest {
    TransferRequest::Pending {
        id,
        debit,
        credit,
        amount,
        user_data,
        timeout_ms,
    }
}

/// Posting `amount` of the hold `pending_id`.
fn post(pending_id: TransferId, amount: u64) -> TransferRequest {
    TransferRequest::Post {
        id: TransferId::random(),
        pending_id,
        amount,
    }
}

/// Voiding the hold `pending_id`.
fn void(pending_id: TransferId) -> TransferRequest {
    TransferRequest::Void {
        id: TransferId::random(),
        pending_id,
    }
}

/// Reversing `amount` of the posted transfer `of`.
fn reverse(of: TransferId, amount: u64) -> TransferRequest {
    TransferRequest::Reverse {
        id: TransferId::random(),
        of,
        amount,
    }
}

fn refused(r: Result<Created, LedgerError>) -> TransferError {
    match r {
        Err(LedgerError::Refused(e)) => e,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Why `l` refuses `req` (it must refuse it).
async fn refusal(l: &Ledger, req: TransferRequest) -> TransferError {
    refused(l.transfer(req).await)
}

/// Applies `req` (it must not be refused): its entry, new or existing.
async fn entry(l: &Ledger, req: TransferRequest) -> Transfer {
    l.transfer(req).await.unwrap().transfer().clone()
}

/// The account `id` as stored (it must exist).
async fn stored(l: &Ledger, id: AccountId) -> Account {
    l.account(id).await.unwrap().unwrap()
}

/// The status of transfer `id` (it must exist).
async fn status(l: &Ledger, id: TransferId) -> Option<TransferStatus> {
    l.lookup_transfer(id).await.unwrap().unwrap().1
}

/// Verifies the journal of `l`, which must be intact: the report.
async fn assert_intact(l: &Ledger) -> VerifyReport {
    let report = l.verify_journal().await.unwrap();
    assert!(report.is_intact(), "{report:?}");
    report
}

/// Verifies the journal of `l`, which must report a problem that `is` recognises.
async fn assert_problem(l: &Ledger, is: impl Fn(&Problem) -> bool) {
    let r = l.verify_journal().await.unwrap();
    assert!(r.problems.iter().any(is), "{r:?}");
}

/// In `l`: a bank, a no-overdraft account funded from it with `funds`, and a no-overdraft shop;
/// (bank, funded account, shop, the funding entry).
async fn parties(l: &Ledger, funds: u64) -> (AccountId, AccountId, AccountId, Transfer) {
    let bank = account(l, false).await;
    let alice = account(l, true).await;
    let shop = account(l, true).await;
    let funding = entry(l, single(bank, alice, funds)).await;
    (bank, alice, shop, funding)
}

async fn transfers_and_idempotency(f: Fixture) {
    let l = &f.ledger;
    let bank = account(l, false).await;
    let alice = account(l, true).await;
    let bob = account(l, true).await;
    let fund = single(bank, alice, 1_000);
    assert!(matches!(
        l.transfer(fund.clone()).await.unwrap(),
        Created::Created(_)
    ));
    assert!(matches!(
        l.transfer(fund.clone()).await.unwrap(),
        Created::Exists(_)
    ));
    let TransferRequest::Single { id, .. } = fund else {
        unreachable!()
    };
    let changed = TransferRequest::Single {
        id,
        debit: bank,
        credit: alice,
        amount: 1_001,
        user_data: 7,
    };
    assert_eq!(
        refusal(l, changed).await,
        TransferError::ExistsWithDifferentFields
    );
    assert_eq!(
        refusal(l, single(alice, bob, 1_001)).await,
        TransferError::ExceedsCredits { available: 1_000 }
    );
    assert_eq!(
        refusal(l, single(alice, alice, 1)).await,
        TransferError::AccountsMustBeDifferent
    );
    assert_eq!(
        refusal(l, single(alice, bob, 0)).await,
        TransferError::AmountMustNotBeZero
    );
    assert_eq!(
        refusal(l, single(alice, AccountId::random(), 1)).await,
        TransferError::CreditAccountNotFound
    );
    let eur = AccountId::random();
    l.create_account(NewAccount {
        id: eur,
        asset: Asset::new("EUR", 2).unwrap(),
        no_overdraft: false,
    })
    .await
    .unwrap();
    assert_eq!(
        refusal(l, single(eur, alice, 1)).await,
        TransferError::AssetMismatch
    );
    assert_eq!(
        l.create_account(NewAccount {
            id: eur,
            asset: Asset::usd(),
            no_overdraft: false
        })
        .await
        .unwrap_err()
        .to_string(),
        "refused: account exists with different fields"
    );
    l.transfer(single(alice, bob, 400)).await.unwrap();
    let (a, b) = (stored(l, alice).await, stored(l, bob).await);
    assert_eq!((a.posted_balance(), b.posted_balance()), (600, 400));
    let report = assert_intact(l).await;
    assert_eq!(report.entries, 2);
}

async fn two_phase(f: Fixture) {
    let l = &f.ledger;
    let (_, alice, shop, _) = parties(l, 1_000).await;
    let hold = TransferId::random();
    l.transfer(pending(hold, alice, shop, 700, 1, 60_000))
        .await
        .unwrap();
    // Pending debits count against no-overdraft.
    assert_eq!(
        refusal(l, single(alice, shop, 301)).await,
        TransferError::ExceedsCredits { available: 300 }
    );
    // Post above the hold: refused; partial post releases the rest.
    assert_eq!(
        refusal(l, post(hold, 701)).await,
        TransferError::ExceedsPendingAmount { pending: 700 }
    );
    let partial = post(hold, 450);
    l.transfer(partial.clone()).await.unwrap();
    assert!(matches!(
        l.transfer(partial).await.unwrap(),
        Created::Exists(_)
    ));
    let a = stored(l, alice).await;
    assert_eq!((a.available(), a.debits_pending), (550, 0));
    assert_eq!(stored(l, shop).await.posted_balance(), 450);
    assert_eq!(refusal(l, void(hold)).await, TransferError::AlreadyPosted);
    assert_eq!(
        status(l, hold).await,
        Some(TransferStatus::Posted { amount: 450 })
    );

    // Void releases; post after void refused.
    let h2 = TransferId::random();
    l.transfer(pending(h2, alice, shop, 500, 2, 0))
        .await
        .unwrap();
    l.transfer(void(h2)).await.unwrap();
    assert_eq!(refusal(l, post(h2, 1)).await, TransferError::AlreadyVoided);
    assert_eq!(stored(l, alice).await.available(), 550);

    // Expiry: a hold lapses after its timeout and can no longer be posted.
    let h3 = TransferId::random();
    l.transfer(pending(h3, alice, shop, 550, 3, 10_000))
        .await
        .unwrap();
    assert_eq!(stored(l, alice).await.available(), 0);
    f.clock.advance(Duration::from_secs(11));
    l.expire_pending().await.unwrap();
    assert_eq!(stored(l, alice).await.available(), 550);
    assert_eq!(status(l, h3).await, Some(TransferStatus::Expired));
    assert_eq!(refusal(l, post(h3, 1)).await, TransferError::PendingExpired);
    // A lapsed hold that no sweep has reached yet is expired by the post that finds it.
    let h4 = TransferId::random();
    l.transfer(pending(h4, alice, shop, 50, 4, 1_000))
        .await
        .unwrap();
    f.clock.advance(Duration::from_secs(2));
    assert_eq!(
        refusal(l, post(h4, 50)).await,
        TransferError::PendingExpired
    );
    assert_eq!(stored(l, alice).await.available(), 550);

    // Reversal (refund): never more than posted, in total.
    let pay = TransferId::random();
    l.transfer(TransferRequest::Single {
        id: pay,
        debit: alice,
        credit: shop,
        amount: 100,
        user_data: 5,
    })
    .await
    .unwrap();
    l.transfer(reverse(pay, 60)).await.unwrap();
    assert_eq!(
        refusal(l, reverse(pay, 41)).await,
        TransferError::ExceedsReversible { available: 40 }
    );
    l.transfer(reverse(pay, 40)).await.unwrap();
    assert_eq!(
        refusal(l, reverse(h2, 1)).await,
        TransferError::CannotReverse
    );
    assert_eq!(stored(l, alice).await.available(), 550);
    assert_intact(l).await;
}

async fn tampering_is_detected(f: Fixture) {
    let l = &f.ledger;
    let bank = account(l, false).await;
    let alice = account(l, true).await;
    for _ in 0..5 {
        l.transfer(single(bank, alice, 10)).await.unwrap();
    }
    assert_intact(l).await;
    // The journal refuses edits while its guard is in place.
    assert!(
        f.try_exec("UPDATE ledger_transfers SET amount = 11 WHERE seq = 3")
            .await
            .is_err(),
        "the journal must be append-only"
    );
    // An attacker with database rights drops the guard and edits an entry: caught.
    f.drop_guard().await;
    f.raw_exec("UPDATE ledger_transfers SET amount = 11 WHERE seq = 3")
        .await;
    assert_problem(l, |p| p.seq == 3 && p.what.contains("hash")).await;
    f.raw_exec("UPDATE ledger_transfers SET amount = 10 WHERE seq = 3")
        .await;
    assert_intact(l).await;
    // Balances edited behind the journal's back: caught.
    f.raw_exec("UPDATE ledger_accounts SET credits_posted = credits_posted + 1000")
        .await;
    assert_problem(l, |p| p.what.contains("stored balances differ")).await;
    f.raw_exec("UPDATE ledger_accounts SET credits_posted = credits_posted - 1000")
        .await;
    assert_intact(l).await;
    // The last entry deleted: the head no longer matches.
    f.raw_exec("DELETE FROM ledger_transfers WHERE seq = 5")
        .await;
    assert_problem(l, |p| p.what.contains("journal head")).await;
}

/// Many tasks, two handles (as two processes), a few hot accounts: money is conserved,
/// no no-overdraft account goes negative, and no id is applied twice.
async fn concurrency_conserves_money(f: Fixture) {
    let l = f.ledger.clone();
    let other = f.second_handle().await;
    let bank = account(&l, false).await;
    let mut hot = Vec::new();
    for _ in 0..4 {
        let a = account(&l, true).await;
        l.transfer(single(bank, a, 500)).await.unwrap();
        hot.push(a);
    }
    let ids: Vec<TransferId> = (0..400).map(|_| TransferId::random()).collect();
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let handle = if t % 2 == 0 { l.clone() } else { other.clone() };
        let hot = hot.clone();
        let ids = ids.clone();
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u32;
            for k in 0..100usize {
                // Tasks share ids pairwise, so every id is submitted twice concurrently.
                let n = (t / 2) * 50 + (k % 50);
                let d = hot[n % 4];
                let c = hot[(n + 1 + n / 4) % 4];
                if d == c {
                    continue;
                }
                let amount = 1 + (n as u64 * 37) % 90;
                let req = if n % 5 == 0 {
                    TransferRequest::Pending {
                        id: ids[n],
                        debit: d,
                        credit: c,
                        amount,
                        user_data: 0,
                        timeout_ms: 0,
                    }
                } else {
                    TransferRequest::Single {
                        id: ids[n],
                        debit: d,
                        credit: c,
                        amount,
                        user_data: 0,
                    }
                };
                match handle.transfer(req).await {
                    Ok(Created::Created(_)) => ok += 1,
                    Ok(Created::Exists(_))
                    | Err(LedgerError::Refused(TransferError::ExceedsCredits { .. })) => {}
                    Err(e) => panic!("unexpected {e}"),
                }
            }
            ok
        }));
    }
    let mut created = 0;
    for t in tasks {
        created += t.await.unwrap();
    }
    let mut total: i128 = 0;
    for a in hot.iter().chain([&bank]) {
        let acc = stored(&l, *a).await;
        total += acc.posted_balance();
        if *a != bank {
            assert!(
                acc.available() >= 0,
                "no-overdraft account went negative: {acc:?}"
            );
        }
    }
    assert_eq!(total, 0, "money created or destroyed");
    let mut seen = HashSet::new();
    let mut applied = 0;
    for id in &ids {
        if let Some((t, _)) = l.lookup_transfer(*id).await.unwrap() {
            assert!(seen.insert(t.id));
            assert!(matches!(
                t.kind,
                TransferKind::Single | TransferKind::Pending
            ));
            applied += 1;
        }
    }
    assert_eq!(applied, created, "each created id applied exactly once");
    assert_intact(&l).await;
}

/// Two handles on one database (two processes): each handle's cache must never overwrite
/// what the other committed, even right after a locked-path batch refreshed part of it.
async fn caches_never_overwrite_another_process(f: Fixture) {
    let a = f.ledger.clone();
    let b = f.second_handle().await;
    let (bank, x, y, _) = parties(&a, 1_000).await;
    // A caches x and y through fast-path traffic.
    a.transfer(single(x, y, 1)).await.unwrap();
    a.transfer(single(y, x, 1)).await.unwrap();
    // B spends most of x behind A's back.
    b.transfer(single(x, y, 900)).await.unwrap();
    // A runs a locked-path batch that touches neither x nor y (an account creation).
    account(&a, false).await;
    // A now spends from x: only 100 is left, so 500 must be refused, and 100 must not
    // resurrect B's 900.
    assert_eq!(
        refusal(&a, single(x, y, 500)).await,
        TransferError::ExceedsCredits { available: 100 }
    );
    a.transfer(single(x, y, 100)).await.unwrap();
    let xa = stored(&a, x).await;
    assert_eq!(xa.available(), 0, "{xa:?}");
    assert_intact(&a).await;
    // A retried transfer id long gone from the cache is still recognised.
    let old = single(bank, x, 5);
    a.transfer(old.clone()).await.unwrap();
    b.transfer(old.clone()).await.unwrap();
    assert!(matches!(a.transfer(old).await.unwrap(), Created::Exists(_)));
}

/// `expire_pending` on one handle releases a lapsed hold another handle created, even when
/// the first handle's cache knows of no due hold.
async fn expiry_sees_other_processes_holds(f: Fixture) {
    let a = f.ledger.clone();
    let b = f.second_handle().await;
    let (_, x, y, _) = parties(&a, 100).await;
    a.transfer(single(x, y, 1)).await.unwrap(); // A's cache is warm and knows no hold
    let hold = TransferId::random();
    b.transfer(pending(hold, x, y, 50, 0, 1_000)).await.unwrap();
    f.clock.advance(Duration::from_secs(2));
    a.expire_pending().await.unwrap();
    assert_eq!(status(&a, hold).await, Some(TransferStatus::Expired));
    assert_eq!(stored(&a, x).await.available(), 99);
}

/// A corrupted expiry index (`ledger_status.expires_at`) must never release a live hold: the
/// sweep re-checks the hold's own expiry (its entry's timestamp + timeout) first, and puts the
/// index right.
async fn expiry_rechecks_the_holds_own_time(f: Fixture) {
    let l = &f.ledger;
    let (_, alice, shop, _) = parties(l, 100).await;
    let hold = TransferId::random();
    let created = entry(l, pending(hold, alice, shop, 80, 0, 60_000)).await;
    let due_at = created.expires_at().unwrap().0;
    // The index row now says the hold lapsed long ago; the hold itself has 60 s left.
    f.raw_exec("UPDATE ledger_status SET expires_at = 0 WHERE status = 1")
        .await;
    l.expire_pending().await.unwrap();
    let cold = f.second_handle().await; // a cold cache: goes by the index alone
    cold.expire_pending().await.unwrap();
    assert_eq!(
        status(l, hold).await,
        Some(TransferStatus::Pending),
        "a live hold was released by a corrupted index row"
    );
    assert_eq!(stored(l, alice).await.available(), 20);
    assert_eq!(
        f.raw_i64("SELECT expires_at FROM ledger_status WHERE status = 1")
            .await,
        Some(due_at),
        "the sweep puts the index row right"
    );
    f.clock.advance(Duration::from_secs(30));
    l.transfer(post(hold, 80)).await.unwrap();
    assert_eq!(stored(l, shop).await.posted_balance(), 80);
    assert_intact(l).await;
}

/// A blob literal in the fixture's SQL dialect.
fn blob(f: &Fixture, b: &[u8]) -> String {
    if f.pg.is_some() {
        format!("'\\x{}'::bytea", hex::encode(b))
    } else {
        format!("X'{}'", hex::encode(b))
    }
}

/// An entry to forge: what it does and the pending amount it releases (a post releases the
/// whole hold, a void or an expiry the amount it names).
struct Forged {
    kind: TransferKind,
    debit: AccountId,
    credit: AccountId,
    amount: u64,
    reference: Option<TransferId>,
    timeout_ms: u64,
    ts: Timestamp,
    release: u64,
    /// The status row it leaves: (transfer, status code, amount).
    status: Option<(TransferId, i16, u64)>,
}

impl Forged {
    /// A `kind` entry of `amount` resolving `hold` at `ts`: it releases the whole hold and
    /// leaves the hold's status row at `code` with `status_amount`.
    fn resolving(
        kind: TransferKind,
        hold: &Transfer,
        amount: u64,
        ts: Timestamp,
        code: i16,
        status_amount: u64,
    ) -> Self {
        Forged {
            kind,
            debit: hold.debit,
            credit: hold.credit,
            amount,
            reference: Some(hold.id),
            timeout_ms: 0,
            ts,
            release: hold.amount,
            status: Some((hold.id, code, status_amount)),
        }
    }
}

fn kind_code(k: TransferKind) -> i16 {
    match k {
        TransferKind::Single => 1,
        TransferKind::Pending => 2,
        TransferKind::PostPending => 3,
        TransferKind::VoidPending => 4,
        TransferKind::ExpirePending => 5,
        TransferKind::Reversal => 6,
    }
}

/// Appends an entry directly in the database, as someone with write access could: the hash
/// chain continues from `prev` (the last entry), the head moves, and the accounts' stored
/// balances and the status row follow, so that only the rule the entry breaks is wrong.
async fn forge(f: &Fixture, prev: &Transfer, e: Forged) -> Transfer {
    let d = f.ledger.account(e.debit).await.unwrap().unwrap();
    let c = f.ledger.account(e.credit).await.unwrap().unwrap();
    let (pend_add, post_add) = match e.kind {
        TransferKind::Pending => (e.amount, 0),
        TransferKind::VoidPending | TransferKind::ExpirePending => (0, 0),
        _ => (0, e.amount),
    };
    let side = |pending: u64, posted: u64| SideBalances {
        pending_before: pending,
        pending_after: pending + pend_add - e.release,
        posted_before: posted,
        posted_after: posted + post_add,
    };
    let mut t = Transfer {
        seq: prev.seq + 1,
        id: if e.kind == TransferKind::ExpirePending {
            TransferId(TransferId::random().0 | RESERVED_BIT)
        } else {
            TransferId::random()
        },
        kind: e.kind,
        debit: e.debit,
        credit: e.credit,
        amount: e.amount,
        reference: e.reference,
        user_data: 0,
        timeout_ms: e.timeout_ms,
        timestamp: e.ts,
        debit_side: side(d.debits_pending, d.debits_posted),
        credit_side: side(c.credits_pending, c.credits_posted),
        prev_hash: prev.hash,
        hash: [0; 32],
    };
    t.hash = entry_hash(&t);
    let (ds, cs) = (t.debit_side, t.credit_side);
    let reference = t
        .reference
        .map_or("NULL".to_owned(), |r| blob(f, &r.to_bytes()));
    let mut sql = format!(
        "INSERT INTO ledger_transfers (seq, id, kind, debit, credit, amount, reference, user_data,
            timeout_ms, ts, dr_pending_before, dr_pending_after, dr_posted_before, dr_posted_after,
            cr_pending_before, cr_pending_after, cr_posted_before, cr_posted_after, prev_hash, hash)
         VALUES ({}, {}, {}, {}, {}, {}, {reference}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {});
         UPDATE ledger_accounts SET debits_pending = {}, debits_posted = {} WHERE id = {};
         UPDATE ledger_accounts SET credits_pending = {}, credits_posted = {} WHERE id = {};
         UPDATE ledger_head SET seq = {}, hash = {} WHERE id = 1;",
        t.seq,
        blob(f, &t.id.to_bytes()),
        kind_code(t.kind),
        blob(f, &t.debit.to_bytes()),
        blob(f, &t.credit.to_bytes()),
        t.amount,
        blob(f, &t.user_data.to_be_bytes()),
        t.timeout_ms,
        t.timestamp.0,
        ds.pending_before,
        ds.pending_after,
        ds.posted_before,
        ds.posted_after,
        cs.pending_before,
        cs.pending_after,
        cs.posted_before,
        cs.posted_after,
        blob(f, &t.prev_hash),
        blob(f, &t.hash),
        ds.pending_after,
        ds.posted_after,
        blob(f, &t.debit.to_bytes()),
        cs.pending_after,
        cs.posted_after,
        blob(f, &t.credit.to_bytes()),
        t.seq,
        blob(f, &t.hash),
    );
    if let Some((id, code, amount)) = e.status {
        sql.push_str(&format!(
            "INSERT INTO ledger_status (id, status, amount, expires_at) VALUES ({}, {code}, {amount}, NULL)
             ON CONFLICT (id) DO UPDATE SET status = excluded.status, amount = excluded.amount;",
            blob(f, &id.to_bytes())
        ));
    }
    f.raw_exec(&sql).await;
    t
}

/// The report holds exactly one problem, at entry `seq`, saying all of `needles`.
fn only_problem(r: &VerifyReport, seq: i64, needles: &[&str]) {
    assert_eq!(r.problems.len(), 1, "{r:#?}");
    let p = &r.problems[0];
    assert_eq!(p.seq, seq, "{r:#?}");
    for n in needles {
        assert!(p.what.contains(n), "{:?} does not say {n:?}", p.what);
    }
}

/// The journal of `l` verified: exactly one problem, at entry `seq`, saying all of `needles`.
async fn journal_has_only(l: &Ledger, seq: i64, needles: &[&str]) {
    only_problem(&l.verify_journal().await.unwrap(), seq, needles);
}

/// A 60 s hold of `amount` from `alice` for `shop`: its entry.
async fn hold(f: &Fixture, alice: AccountId, shop: AccountId, amount: u64) -> Transfer {
    let req = pending(TransferId::random(), alice, shop, amount, 0, 60_000);
    entry(&f.ledger, req).await
}

/// A post above what its hold held, written with a consistent hash chain and balances.
async fn journal_rule_post_above_hold(f: Fixture) {
    let (_, alice, shop, _) = parties(&f.ledger, 1_000).await;
    let h = hold(&f, alice, shop, 100).await;
    let ts = Timestamp(h.timestamp.0 + 1_000);
    let post = forge(
        &f,
        &h,
        Forged::resolving(TransferKind::PostPending, &h, 150, ts, 2, 150),
    )
    .await;
    journal_has_only(
        &f.ledger,
        post.seq,
        &[
            &format!("entry {}", post.seq),
            "posts 150",
            &h.id.to_string(),
            "held 100",
        ],
    )
    .await;
}

/// A hold resolved twice (posted, then posted again).
async fn journal_rule_one_resolution_per_hold(f: Fixture) {
    let (_, alice, shop, _) = parties(&f.ledger, 1_000).await;
    let h1 = hold(&f, alice, shop, 100).await;
    // Another open hold keeps the pending counter from going below zero: only the rule breaks.
    hold(&f, alice, shop, 100).await;
    let first = entry(&f.ledger, post(h1.id, 60)).await;
    let ts = Timestamp(first.timestamp.0 + 1_000);
    let again = forge(
        &f,
        &first,
        Forged::resolving(TransferKind::PostPending, &h1, 40, ts, 2, 40),
    )
    .await;
    journal_has_only(
        &f.ledger,
        again.seq,
        &[
            &format!("entry {}", again.seq),
            &h1.id.to_string(),
            "again",
            &format!("entry {}", first.seq),
        ],
    )
    .await;
}

/// A no-overdraft account spending more than it has.
async fn journal_rule_no_overdraft(f: Fixture) {
    let (_, alice, shop, funding) = parties(&f.ledger, 100).await;
    let spend = forge(
        &f,
        &funding,
        Forged {
            kind: TransferKind::Single,
            debit: alice,
            credit: shop,
            amount: 150,
            reference: None,
            timeout_ms: 0,
            ts: Timestamp(funding.timestamp.0 + 1_000),
            release: 0,
            status: None,
        },
    )
    .await;
    journal_has_only(
        &f.ledger,
        spend.seq,
        &[
            &format!("entry {}", spend.seq),
            "overdraws",
            &alice.to_string(),
            "150",
            "100",
        ],
    )
    .await;
}

/// A hold expired before its time.
async fn journal_rule_expiry_after_the_holds_time(f: Fixture) {
    let (_, alice, shop, _) = parties(&f.ledger, 1_000).await;
    let h = hold(&f, alice, shop, 100).await;
    let early = Timestamp(h.timestamp.0 + 10_000);
    let expiry = forge(
        &f,
        &h,
        Forged::resolving(TransferKind::ExpirePending, &h, 100, early, 4, 0),
    )
    .await;
    journal_has_only(
        &f.ledger,
        expiry.seq,
        &[
            &format!("entry {}", expiry.seq),
            "expires hold",
            &h.id.to_string(),
            &early.to_string(),
            &h.expires_at().unwrap().to_string(),
        ],
    )
    .await;
}

/// Someone with write access rewrites an entry at or before an anchored head and recomputes
/// the hash chain after it, the head and all: plain verification finds the journal intact
/// (there is nothing inconsistent to find); verification against the anchor, kept outside the
/// database, names the anchored entry.
async fn anchored_head_detects_a_consistent_rewrite(f: Fixture) {
    let l = &f.ledger;
    let key = [0x5au8; 32];
    let bank = account(l, false).await;
    let alice = account(l, true).await;
    let mut entries = Vec::new();
    for _ in 0..5 {
        entries.push(entry(l, single(bank, alice, 10)).await);
    }
    let anchor = l.anchor(&key).await.unwrap();
    assert_eq!((anchor.seq, anchor.hash), (entries[4].seq, entries[4].hash));
    let token = anchor.to_string();
    for _ in 0..3 {
        entries.push(entry(l, single(bank, alice, 10)).await);
    }
    assert!(
        l.verify_journal_against(&anchor, &key)
            .await
            .unwrap()
            .is_intact()
    );

    // Rebind entry 3 to another caller reference (say, another offer), then recompute every
    // hash from there on and move the head: a consistent journal.
    f.drop_guard().await;
    let mut sql = String::new();
    let mut prev = entries[1].hash;
    for t in entries.iter_mut().skip(2) {
        if t.seq == 3 {
            t.user_data = 0xbad;
        }
        t.prev_hash = prev;
        t.hash = entry_hash(t);
        prev = t.hash;
        sql.push_str(&format!(
            "UPDATE ledger_transfers SET user_data = {}, prev_hash = {}, hash = {} WHERE seq = {};",
            blob(&f, &t.user_data.to_be_bytes()),
            blob(&f, &t.prev_hash),
            blob(&f, &t.hash),
            t.seq
        ));
    }
    sql.push_str(&format!(
        "UPDATE ledger_head SET hash = {} WHERE id = 1;",
        blob(&f, &prev)
    ));
    f.raw_exec(&sql).await;
    let plain = l.verify_journal().await.unwrap();
    assert!(plain.is_intact(), "the rewrite is consistent: {plain:?}");
    let r = l.verify_journal_against(&anchor, &key).await.unwrap();
    only_problem(
        &r,
        anchor.seq,
        &["anchored hash", &format!("entry {}", anchor.seq)],
    );

    // The anchor itself cannot be moved or re-keyed.
    let parsed: rail_ledger::JournalAnchor = token.parse().unwrap();
    assert_eq!(parsed, anchor);
    let moved = rail_ledger::JournalAnchor {
        seq: 2,
        hash: entries[1].hash,
        ..anchor
    };
    assert!(matches!(
        l.verify_journal_against(&moved, &key).await,
        Err(LedgerError::Anchor(rail_ledger::AnchorError::BadMac))
    ));
    assert!(matches!(
        l.verify_journal_against(&anchor, &[0x5b; 32]).await,
        Err(LedgerError::Anchor(rail_ledger::AnchorError::BadMac))
    ));

    // A journal cut back to before the anchor is reported too.
    f.raw_exec("DELETE FROM ledger_transfers WHERE seq >= 4")
        .await;
    let r = l.verify_journal_against(&anchor, &key).await.unwrap();
    assert!(
        r.problems
            .iter()
            .any(|p| p.what.contains("before the anchored entry 5")),
        "{r:#?}"
    );
}

macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if let Some(f) = super::fixture(super::Backend::Sqlite).await { super::$name(f).await }
            })*
        }
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                if let Some(f) = super::fixture(super::Backend::Postgres).await {
                    let schema = f.pg.clone();
                    super::$name(f).await;
                    if let Some((url, schema)) = schema {
                        super::drop_schema(&url, &schema).await;
                    }
                }
            })*
        }
    };
}

on_both!(
    transfers_and_idempotency,
    two_phase,
    tampering_is_detected,
    concurrency_conserves_money,
    caches_never_overwrite_another_process,
    expiry_sees_other_processes_holds,
    expiry_rechecks_the_holds_own_time,
    journal_rule_post_above_hold,
    journal_rule_one_resolution_per_hold,
    journal_rule_no_overdraft,
    journal_rule_expiry_after_the_holds_time,
    anchored_head_detects_a_consistent_rewrite,
);

/// Processes sharing one PostgreSQL ledger whose clocks disagree (here two hours each way):
/// a hold is created and expired by one time source, the database's clock, never by whichever
/// process happens to stamp or to sweep. (Before, a process whose clock ran ahead released
/// other processes' live holds, and one whose clock ran behind kept lapsed holds locked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_hold_expiry_follows_one_clock() {
    let Some(f) = fixture(Backend::Postgres).await else {
        return;
    };
    let (url, schema) = f.pg.clone().unwrap();
    let real = SystemClock.now();
    let host = |offset_ms: i64| -> SharedClock {
        Arc::new(ManualClock::at(Timestamp(real.0 + offset_ms)))
    };
    let two_hours = 2 * 3_600_000;
    let open = |offset_ms: i64| {
        let (url, schema, clock) = (url.clone(), schema.clone(), host(offset_ms));
        async move {
            Ledger::postgres_with_host_clock(&url, Some(&schema), clock)
                .await
                .unwrap()
        }
    };
    let a = open(0).await;
    let ahead = open(two_hours).await;
    let behind = open(-two_hours).await;
    let (_, x, y, _) = parties(&a, 1_000).await;
    let hold = |l: Ledger, amount: u64, timeout_ms: u64| async move {
        let id = TransferId::random();
        let t = entry(&l, pending(id, x, y, amount, 0, timeout_ms)).await;
        (id, t.expires_at().unwrap())
    };

    // A 60 s hold; the process two hours ahead sweeps at once, then captures it.
    let (h1, _) = hold(a.clone(), 100, 60_000).await;
    ahead.expire_pending().await.unwrap();
    assert_eq!(
        status(&a, h1).await,
        Some(TransferStatus::Pending),
        "a live hold released by a process whose clock runs ahead"
    );
    ahead.transfer(post(h1, 100)).await.unwrap();

    // A 300 ms hold made by the process ahead: once it lapsed by the database's clock, the
    // process two hours behind releases it.
    let (h2, due) = hold(ahead.clone(), 50, 300).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while behind.now().await.unwrap() < due && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    behind.expire_pending().await.unwrap();
    assert_eq!(
        status(&a, h2).await,
        Some(TransferStatus::Expired),
        "a lapsed hold kept locked by a process whose clock runs behind"
    );
    assert_eq!(stored(&a, x).await.available(), 900);

    // All three read the same time, whatever their own clocks say.
    let (ta, tb, tc) = (
        a.now().await.unwrap(),
        ahead.now().await.unwrap(),
        behind.now().await.unwrap(),
    );
    assert!(
        (tb.0 - ta.0).abs() < 1_000 && (tc.0 - ta.0).abs() < 1_000,
        "{ta} {tb} {tc}"
    );
    assert_intact(&a).await;
    drop_schema(&url, &schema).await;
}

/// A ledger file written the way the last release wrote it (sqlx, its schema and settings: WAL,
/// 1 KiB pages; two accounts in it) opens with the SQLite writer thread as it is: its accounts
/// are read back, a transfer lands on them, and the journal verifies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_ledger_written_by_the_last_release_opens_as_it_is() {
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
    let dir = tempfile::tempdir().unwrap();
    let (bank, alice) = (AccountId::random(), AccountId::random());
    {
        let opts = SqliteConnectOptions::new()
            .filename(dir.path().join("ledger.db"))
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .page_size(1024);
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(opts)
            .await
            .unwrap();
        for sql in [
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
        ] {
            sqlx::query(sql).execute(&pool).await.unwrap();
        }
        for (id, no_overdraft) in [(bank, false), (alice, true)] {
            sqlx::query("INSERT INTO ledger_accounts VALUES (?1, 'USD', 2, ?2, 0, 0, 0, 0, 1)")
                .bind(id.to_bytes().to_vec())
                .bind(no_overdraft)
                .execute(&pool)
                .await
                .unwrap();
        }
        pool.close().await;
    }
    let l = Ledger::sqlite(&sqlite_url(&dir)).await.unwrap();
    assert!(stored(&l, alice).await.no_overdraft);
    entry(&l, single(bank, alice, 250)).await;
    assert_eq!(stored(&l, alice).await.credits_posted, 250);
    assert_intact(&l).await;
}
