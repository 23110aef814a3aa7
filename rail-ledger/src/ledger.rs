//! [`Ledger`]: the handle applications use. Requests from every task are gathered by one
//! batching task and applied many per database commit (group commit), which is what makes
//! durable commits fast; each request still gets its own answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use rail_core::{SharedClock, SystemClock};
use tokio::sync::{mpsc, oneshot};

use std::collections::{HashMap, VecDeque};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesOrdered;
use rail_core::Timestamp;

use crate::anchor::JournalAnchor;
use crate::engine::{self, Changes, Command, Outcome, Snapshot};
use crate::error::LedgerError;
#[cfg(feature = "postgres")]
use crate::store::postgres::PgBackend;
#[cfg(feature = "sqlite")]
use crate::store::sqlite::SqliteBackend;
use crate::store::{Backend, BatchTime, ClockCheck, FastOutcome, FastWrite};
use crate::types::{
    Account, AccountCreated, AccountId, Created, NewAccount, Transfer, TransferError, TransferId,
    TransferRequest, TransferStatus,
};
use crate::verify::VerifyReport;

/// Most requests applied in one database transaction.
pub const MAX_BATCH: usize = 4096;

/// A batch smaller than this waits up to [`LINGER_YIELDS`] scheduler yields for more requests.
const LINGER_BELOW: usize = 64;
const LINGER_YIELDS: u32 = 4;

/// How far an optimistic batch's timestamp may be from the database's clock when its write
/// runs (PostgreSQL on the database's time): further, and the batch is redone on the locked
/// path, which reads the database's clock under the head lock.
pub const FAST_CLOCK_TOLERANCE: Duration = Duration::from_millis(250);

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// The ledger's one source of time: every entry's timestamp and every hold-expiry decision.
#[derive(Clone, Debug)]
enum TimeSource {
    /// This clock: SQLite's (the host's clock, or one injected), or a clock injected to
    /// override PostgreSQL's (tests, time travel).
    Clock(SharedClock),
    /// The database's clock (PostgreSQL `clock_timestamp()`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Database(Arc<DbClock>),
}

impl TimeSource {
    /// The time a locked batch runs at.
    fn locked(&self) -> BatchTime {
        match self {
            TimeSource::Clock(c) => BatchTime::At(c.now()),
            TimeSource::Database(_) => BatchTime::Database,
        }
    }

    /// The time an optimistic batch is stamped with, and the check its write must pass.
    fn optimistic(&self) -> (Timestamp, Option<ClockCheck>) {
        match self {
            TimeSource::Clock(c) => (c.now(), None),
            TimeSource::Database(d) => {
                let now = d.estimate();
                (
                    now,
                    Some(ClockCheck {
                        stamped: now,
                        tolerance_ms: ms(FAST_CLOCK_TOLERANCE),
                    }),
                )
            }
        }
    }
}

/// The database's clock between readings: the last reading carried forward by this process's
/// monotonic clock (never by its wall clock, which may be off or stepped). Every optimistic
/// write returns a fresh reading.
#[derive(Debug)]
struct DbClock {
    origin: Instant,
    /// The database's time at `origin`, in milliseconds since the epoch.
    at_origin: AtomicI64,
}

impl DbClock {
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn new(reading: Timestamp, at: Instant) -> Self {
        let c = DbClock {
            origin: at,
            at_origin: AtomicI64::new(reading.0),
        };
        c.observe(reading, at);
        c
    }

    fn estimate(&self) -> Timestamp {
        Timestamp(
            self.at_origin
                .load(Ordering::Relaxed)
                .saturating_add(ms(self.origin.elapsed())),
        )
    }

    fn observe(&self, reading: Timestamp, at: Instant) {
        let since = ms(at.saturating_duration_since(self.origin));
        self.at_origin
            .store(reading.0.saturating_sub(since), Ordering::Relaxed);
    }
}

struct Job {
    cmds: Vec<Command>,
    reply: oneshot::Sender<Result<Vec<Outcome>, LedgerError>>,
}

/// A double-entry ledger on SQLite or PostgreSQL. Cheap to clone; clones share one batcher.
///
/// ```
/// # async fn demo() -> Result<(), rail_ledger::LedgerError> {
/// use rail_ledger::{Ledger, NewAccount, AccountId, TransferId, TransferRequest};
/// use rail_core::Asset;
/// let dir = tempfile::tempdir().unwrap();
/// let ledger = Ledger::sqlite(&format!("sqlite://{}/ledger.db", dir.path().display())).await?;
/// let (bank, alice) = (AccountId::random(), AccountId::random());
/// ledger.create_account(NewAccount { id: bank, asset: Asset::usd(), no_overdraft: false }).await?;
/// ledger.create_account(NewAccount { id: alice, asset: Asset::usd(), no_overdraft: true }).await?;
/// let t = TransferRequest::Single { id: TransferId::random(), debit: bank, credit: alice, amount: 500, user_data: 0 };
/// ledger.transfer(t.clone()).await?;
/// ledger.transfer(t).await?;                      // same id, same fields: applied once
/// assert_eq!(ledger.account(alice).await?.unwrap().posted_balance(), 500);
/// assert!(ledger.verify_journal().await?.is_intact());
/// # Ok(()) }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
///
/// # Time
/// One source of time stamps every entry and decides every hold's expiry:
/// - **SQLite**: the host's clock (the clock given to [`Ledger::sqlite_with_clock`], else the
///   system clock). Every process on one file runs on that one host.
/// - **PostgreSQL**: the database server's clock (`clock_timestamp()`), whatever the clocks of
///   the processes sharing it say. Locked batches read it under the journal-head lock;
///   optimistic batches carry the last reading forward and their compare-and-set refuses a
///   timestamp more than [`FAST_CLOCK_TOLERANCE`] from it (the batch is then redone locked).
/// - **PostgreSQL with an injected clock** ([`Ledger::postgres_with_clock`]): that clock
///   overrides the database's (tests, time travel); every handle on the schema must share it.
///
/// [`Ledger::now`] reads the ledger's time; [`Ledger::clock`] is the host's clock, for what is
/// not the ledger's (offers, replay guards).
#[derive(Clone)]
pub struct Ledger {
    backend: Arc<dyn Backend>,
    tx: mpsc::Sender<Job>,
    clock: SharedClock,
    time: TimeSource,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("backend", &self.backend.name())
            .finish()
    }
}

impl Ledger {
    #[cfg(feature = "sqlite")]
    /// Opens (or creates) a SQLite ledger at `url` (`sqlite://path/to/file.db`), WAL mode,
    /// durable commits.
    ///
    /// # Errors
    /// [`LedgerError::Storage`] if the database cannot be opened.
    pub async fn sqlite(url: &str) -> Result<Self, LedgerError> {
        Self::sqlite_with_clock(url, Arc::new(SystemClock)).await
    }

    #[cfg(feature = "sqlite")]
    /// As [`Ledger::sqlite`], with an injected clock (timestamps and hold expiry).
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn sqlite_with_clock(url: &str, clock: SharedClock) -> Result<Self, LedgerError> {
        let b = SqliteBackend::open(url).await?;
        Ok(Self::start(
            Arc::new(b),
            clock.clone(),
            TimeSource::Clock(clock),
        ))
    }

    #[cfg(feature = "postgres")]
    /// Connects to a PostgreSQL ledger, on the database's clock. `schema` (created if
    /// missing) keeps this ledger apart from others in the same database; `None` uses the
    /// connection's default search path.
    ///
    /// # Errors
    /// [`LedgerError::Storage`] if the database cannot be reached.
    pub async fn postgres(url: &str, schema: Option<&str>) -> Result<Self, LedgerError> {
        Self::postgres_with_host_clock(url, schema, Arc::new(SystemClock)).await
    }

    #[cfg(feature = "postgres")]
    /// As [`Ledger::postgres`] (the ledger's time is the database's), with `host` as this
    /// process's own clock ([`Ledger::clock`]: what the rail stamps offers with).
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn postgres_with_host_clock(
        url: &str,
        schema: Option<&str>,
        host: SharedClock,
    ) -> Result<Self, LedgerError> {
        let b = PgBackend::open(url, schema).await?;
        let before = Instant::now();
        let reading = b.db_now().await?;
        let after = Instant::now();
        let mid = before + after.saturating_duration_since(before) / 2;
        let time = TimeSource::Database(Arc::new(DbClock::new(reading, mid)));
        Ok(Self::start(Arc::new(b), host, time))
    }

    #[cfg(feature = "postgres")]
    /// As [`Ledger::postgres`], with an injected clock that overrides the database's (tests,
    /// time travel): entries are stamped and holds expire by `clock`. Every handle on the
    /// schema must share it (clones of one `ManualClock` do); handles on one schema with
    /// different clocks would each judge holds by their own.
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn postgres_with_clock(
        url: &str,
        schema: Option<&str>,
        clock: SharedClock,
    ) -> Result<Self, LedgerError> {
        let b = PgBackend::open(url, schema).await?;
        Ok(Self::start(
            Arc::new(b),
            clock.clone(),
            TimeSource::Clock(clock),
        ))
    }

    fn start(backend: Arc<dyn Backend>, clock: SharedClock, time: TimeSource) -> Self {
        let (tx, rx) = mpsc::channel::<Job>(MAX_BATCH);
        tokio::spawn(run_batcher(backend.clone(), time.clone(), rx));
        Ledger {
            backend,
            tx,
            clock,
            time,
        }
    }

    /// The ledger's time: what entries are stamped with and holds expire by (see the type's
    /// documentation). On PostgreSQL without an injected clock this reads the database's clock.
    ///
    /// # Errors
    /// [`LedgerError::Storage`] when the database cannot be read.
    pub async fn now(&self) -> Result<Timestamp, LedgerError> {
        match &self.time {
            TimeSource::Clock(c) => Ok(c.now()),
            TimeSource::Database(_) => self.backend.db_now().await,
        }
    }

    /// The backend's name (`sqlite` or `postgres`).
    #[must_use]
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// This host's clock (what the rail stamps and checks offers with). Entries and holds go
    /// by [`Ledger::now`], which is this same clock except on PostgreSQL without an injected
    /// clock (there it is the database's).
    #[must_use]
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    async fn submit(&self, cmds: Vec<Command>) -> Result<Vec<Outcome>, LedgerError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job { cmds, reply })
            .await
            .map_err(|_| LedgerError::Closed)?;
        rx.await.map_err(|_| LedgerError::Closed)?
    }

    /// Creates accounts; each gets its own outcome.
    ///
    /// # Errors
    /// [`LedgerError::Storage`] when the batch failed (if the failure was at commit, it may
    /// have been written: retry with the same ids, which is always safe).
    pub async fn create_accounts(
        &self,
        accounts: Vec<NewAccount>,
    ) -> Result<Vec<Result<AccountCreated, TransferError>>, LedgerError> {
        let out = self
            .submit(accounts.into_iter().map(Command::CreateAccount).collect())
            .await?;
        Ok(out
            .into_iter()
            .map(|o| match o {
                Outcome::Account(r) => r,
                Outcome::Transfer(_) => Err(TransferError::IdMustNotBeZero),
            })
            .collect())
    }

    /// Creates one account (idempotent by id).
    ///
    /// # Errors
    /// [`LedgerError::Refused`] or [`LedgerError::Storage`].
    pub async fn create_account(&self, account: NewAccount) -> Result<AccountCreated, LedgerError> {
        first(self.create_accounts(vec![account]).await?)
    }

    /// Applies transfer requests in order; each gets its own outcome.
    ///
    /// # Errors
    /// [`LedgerError::Storage`] when the batch failed (if the failure was at commit, it may
    /// have been written: retry with the same ids, which is always safe).
    pub async fn transfers(
        &self,
        requests: Vec<TransferRequest>,
    ) -> Result<Vec<Result<Created, TransferError>>, LedgerError> {
        let out = self
            .submit(requests.into_iter().map(Command::Transfer).collect())
            .await?;
        Ok(out
            .into_iter()
            .map(|o| match o {
                Outcome::Transfer(r) => r,
                Outcome::Account(_) => Err(TransferError::IdMustNotBeZero),
            })
            .collect())
    }

    /// Applies one transfer request.
    ///
    /// # Errors
    /// [`LedgerError::Refused`] (nothing written) or [`LedgerError::Storage`].
    pub async fn transfer(&self, request: TransferRequest) -> Result<Created, LedgerError> {
        first(self.transfers(vec![request]).await?)
    }

    /// Releases pending transfers whose timeout has passed, up to 256 per call (the oldest
    /// first). Locked batches do the same before their own requests, and the batcher takes
    /// the locked path as soon as a hold it knows of is due.
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn expire_pending(&self) -> Result<(), LedgerError> {
        self.submit(Vec::new()).await.map(drop)
    }

    /// An account, if it exists.
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn account(&self, id: AccountId) -> Result<Option<Account>, LedgerError> {
        self.backend.account(id).await
    }

    /// The last `limit` journal entries that debit or credit `account`, newest first: what
    /// `stipendex ledger account history` prints.
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn history(
        &self,
        account: AccountId,
        limit: u32,
    ) -> Result<Vec<Transfer>, LedgerError> {
        self.backend.history(account, limit).await
    }

    /// A transfer and, for holds and postings, its status.
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn lookup_transfer(
        &self,
        id: TransferId,
    ) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError> {
        Ok(self.backend.transfer(id).await?.map(|(t, st)| {
            // A posting transfer without a status row has nothing reversed.
            let st = st.or_else(|| {
                t.kind
                    .is_posting()
                    .then_some(TransferStatus::Settled { reversed: 0 })
            });
            (t, st)
        }))
    }

    /// Replays the whole journal: checks the hash chain, entry numbering, that every entry's
    /// balances continue its accounts' history, and that stored balances and statuses are what
    /// the journal says.
    ///
    /// # Errors
    /// [`LedgerError::Storage`] or [`LedgerError::Corrupt`] (undecodable rows).
    pub async fn verify_journal(&self) -> Result<VerifyReport, LedgerError> {
        self.backend.verify(None).await
    }

    /// The journal head (last entry and its hash) as a [`JournalAnchor`] authenticated with
    /// `key` (HMAC-SHA256; at least 16 bytes, 32 random bytes recommended), to be kept outside
    /// the database. It vouches for the journal as it is now: take it after a clean
    /// [`Ledger::verify_journal`], and regularly.
    ///
    /// # Errors
    /// [`LedgerError::Anchor`] for a short key, [`LedgerError::Storage`].
    pub async fn anchor(&self, key: &[u8]) -> Result<JournalAnchor, LedgerError> {
        let (seq, hash) = self.backend.head().await?;
        Ok(JournalAnchor::new(seq, hash, key)?)
    }

    /// [`Ledger::verify_journal`], plus: the entry at the anchor's `seq` must still hash to
    /// the anchored hash. A rewrite of that entry or of any before it is reported even when
    /// whoever rewrote it recomputed the whole hash chain after it (which plain verification
    /// cannot tell from the original), as is a journal that no longer reaches the anchor.
    ///
    /// # Errors
    /// [`LedgerError::Anchor`] when the anchor's MAC does not verify with `key` (nothing is
    /// read then), [`LedgerError::Storage`], [`LedgerError::Corrupt`].
    pub async fn verify_journal_against(
        &self,
        anchor: &JournalAnchor,
        key: &[u8],
    ) -> Result<VerifyReport, LedgerError> {
        anchor.check(key)?;
        self.backend.verify(Some((anchor.seq, anchor.hash))).await
    }
}

fn first<T>(v: Vec<Result<T, TransferError>>) -> Result<T, LedgerError> {
    v.into_iter()
        .next()
        .ok_or_else(|| LedgerError::Storage("empty answer".into()))?
        .map_err(LedgerError::Refused)
}

/// What the batcher knows of the ledger, as of the journal head it last wrote or read.
///
/// A batch whose every account and referenced hold is known is applied here and written with
/// one compare-and-set on the head ([`Backend::write_fast`]); if another process moved the head,
/// or a transfer id turns out to exist already, nothing is written and the batch is redone on
/// the slow path (load under the head lock). The cache is speculative while writes are in
/// flight: any failed write throws it away, and every batch after it is redone too.
#[derive(Default)]
struct Cache {
    valid: bool,
    head_seq: i64,
    head_hash: [u8; 32],
    accounts: HashMap<AccountId, Account>,
    transfers: HashMap<TransferId, Transfer>,
    statuses: HashMap<TransferId, TransferStatus>,
    /// Eviction order of cached transfers (open holds are kept until resolved).
    recent: VecDeque<TransferId>,
    /// The earliest expiry among open holds: from then on batches take the slow path.
    next_due: Option<Timestamp>,
}

const CACHE_TRANSFERS: usize = 1 << 16;
const CACHE_ACCOUNTS: usize = 1 << 17;

impl Cache {
    fn invalidate(&mut self) {
        *self = Cache::default();
    }

    /// The snapshot `cmds` need, if everything they touch is known and no hold is due.
    fn snapshot_for(&self, cmds: &[Command], now: Timestamp) -> Option<Snapshot> {
        if !self.valid || self.next_due.is_some_and(|d| now >= d) {
            return None;
        }
        let mut s = Snapshot {
            head_seq: self.head_seq,
            head_hash: self.head_hash,
            ..Snapshot::default()
        };
        let account = |s: &mut Snapshot, id: AccountId| -> Option<()> {
            s.accounts.insert(id, self.accounts.get(&id)?.clone());
            Some(())
        };
        for c in cmds {
            let Command::Transfer(t) = c else {
                return None;
            };
            if let Some((d, cr)) = t.accounts() {
                account(&mut s, d)?;
                account(&mut s, cr)?;
            }
            if let Some(r) = t.referenced() {
                let tr = self.transfers.get(&r)?;
                match self.statuses.get(&r) {
                    Some(st) => {
                        s.statuses.insert(r, *st);
                    }
                    // No row for a posting transfer: nothing of it reversed yet.
                    None if tr.kind.is_posting() => {}
                    None => return None,
                }
                account(&mut s, tr.debit)?;
                account(&mut s, tr.credit)?;
                s.transfers.insert(r, tr.clone());
            }
            if let Some(tr) = self.transfers.get(&t.id()) {
                s.transfers.insert(tr.id, tr.clone());
                if let Some(st) = self.statuses.get(&tr.id) {
                    s.statuses.insert(tr.id, *st);
                }
            }
        }
        Some(s)
    }

    /// Takes in what a batch saw and wrote.
    fn absorb(&mut self, snap: &Snapshot, ch: &Changes) {
        self.head_seq = snap.head_seq;
        self.head_hash = snap.head_hash;
        if self.accounts.len() > CACHE_ACCOUNTS {
            self.accounts.clear();
        }
        for (id, a) in &snap.accounts {
            self.accounts.insert(*id, a.clone());
        }
        for t in &ch.new_transfers {
            self.transfers.insert(t.id, t.clone());
            self.recent.push_back(t.id);
            if let Some(e) = t.expires_at() {
                self.next_due = Some(self.next_due.map_or(e, |d| d.min(e)));
            }
        }
        for (id, t) in &snap.transfers {
            if !self.transfers.contains_key(id) {
                self.transfers.insert(*id, t.clone());
                self.recent.push_back(*id);
            }
        }
        for (id, st) in &snap.statuses {
            self.statuses.insert(*id, *st);
        }
        for id in &ch.statuses {
            // A resolved hold becomes evictable.
            if self.statuses.get(id) != Some(&TransferStatus::Pending) {
                self.recent.push_back(*id);
            }
        }
        // Open holds are evicted too (a post or void of an evicted hold reloads it on the
        // locked path), so the cache stays bounded whatever callers leave open.
        while self.recent.len() > CACHE_TRANSFERS {
            let Some(id) = self.recent.pop_front() else {
                break;
            };
            self.transfers.remove(&id);
            self.statuses.remove(&id);
        }
    }
}

type Written = (
    Vec<Job>,
    Vec<Outcome>,
    Result<Option<FastOutcome>, LedgerError>,
    Instant,
);

/// Whether answers computed on the cache may stand (the write's compare-and-set then makes
/// them exact). A refusal is a statement about state the write does not check: refused ids
/// the cache does not know (an old transfer evicted from the cache must answer `Exists`, not a
/// refusal), and refusals in a batch that writes nothing (no compare-and-set at all), go to the
/// locked path.
fn fast_answers_hold(
    cache: &Cache,
    cmds: &[Command],
    outcomes: &[Outcome],
    changes: &Changes,
) -> bool {
    cmds.iter().zip(outcomes).all(|(c, o)| match (c, o) {
        // A stored transfer never changes: "exists with different fields" stays true.
        (
            Command::Transfer(t),
            Outcome::Transfer(Err(TransferError::ExistsWithDifferentFields)),
        ) => cache.transfers.contains_key(&t.id()),
        (Command::Transfer(t), Outcome::Transfer(Err(_))) => {
            !changes.is_empty() && cache.transfers.contains_key(&t.id())
        }
        _ => true,
    })
}

fn reply(jobs: Vec<Job>, result: Result<Vec<Outcome>, LedgerError>) {
    match result {
        Ok(outcomes) => {
            let mut it = outcomes.into_iter();
            for j in jobs {
                let mine: Vec<Outcome> = it.by_ref().take(j.cmds.len()).collect();
                let _ = j.reply.send(Ok(mine));
            }
        }
        Err(e) => {
            for j in jobs {
                let _ = j.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Runs `jobs` on the slow path (under the head lock), in chunks of at most [`MAX_BATCH`].
async fn slow_path(
    backend: &Arc<dyn Backend>,
    time: &TimeSource,
    cache: &mut Cache,
    jobs: Vec<Job>,
) {
    let mut chunk: Vec<Job> = Vec::new();
    let mut n = 0;
    let mut chunks = Vec::new();
    for j in jobs {
        if n + j.cmds.len() > MAX_BATCH && !chunk.is_empty() {
            chunks.push(std::mem::take(&mut chunk));
            n = 0;
        }
        n += j.cmds.len();
        chunk.push(j);
    }
    if !chunk.is_empty() {
        chunks.push(chunk);
    }
    for jobs in chunks {
        let cmds: Vec<Command> = jobs.iter().flat_map(|j| j.cmds.iter().cloned()).collect();
        match backend.execute(&cmds, time.locked()).await {
            Ok(ex) => {
                for id in &ex.changes.repaired {
                    tracing::warn!(backend = backend.name(), hold = %id, "the expiry index called a hold due that has not lapsed by its own entry: not released, index row rewritten");
                }
                // Anything cached from before another writer's entries is stale: keep only what
                // this batch loaded under the lock.
                if ex.loaded_head != (cache.head_seq, cache.head_hash) {
                    cache.invalidate();
                }
                cache.absorb(&ex.snap, &ex.changes);
                cache.next_due = ex.next_due;
                cache.valid = true;
                reply(jobs, Ok(ex.outcomes));
            }
            Err(e) => {
                cache.invalidate();
                tracing::warn!(backend = backend.name(), error = %e, requests = cmds.len(), "ledger batch failed; rolled back");
                reply(jobs, Err(e));
            }
        }
    }
}

async fn run_batcher(backend: Arc<dyn Backend>, time: TimeSource, mut rx: mpsc::Receiver<Job>) {
    let depth = backend.pipeline_depth().max(1);
    let mut cache = Cache::default();
    let mut inflight: FuturesOrdered<BoxFuture<'static, Written>> = FuturesOrdered::new();
    // Jobs waiting for the slow path; while any wait, nothing new is taken in.
    let mut blocked: Vec<Job> = Vec::new();
    // A write in flight failed: every later answer in flight rests on state that never was.
    let mut poisoned = false;
    let mut closed = false;
    loop {
        if !blocked.is_empty() && inflight.is_empty() {
            slow_path(&backend, &time, &mut cache, std::mem::take(&mut blocked)).await;
            continue;
        }
        if closed && inflight.is_empty() {
            return;
        }
        tokio::select! {
            biased;
            Some((jobs, outcomes, result, at)) = inflight.next(), if !inflight.is_empty() => {
                if let (Ok(Some(FastOutcome { db_now: Some(reading), .. })), TimeSource::Database(c)) = (&result, &time) {
                    c.observe(*reading, at);
                }
                match result.map(|o| o.map(|o| o.write)) {
                    // Committed writes are final whatever happened before them.
                    Ok(Some(FastWrite::Committed)) => reply(jobs, Ok(outcomes)),
                    // Answers computed on speculative state hold only if no write before failed.
                    Ok(None) if !poisoned => reply(jobs, Ok(outcomes)),
                    other => {
                        tracing::debug!(backend = backend.name(), outcome = ?other, "optimistic write not applied; redoing on the locked path");
                        poisoned = true;
                        cache.invalidate();
                        blocked.extend(jobs);
                    }
                }
                if inflight.is_empty() {
                    poisoned = false;
                }
            }
            job = rx.recv(), if !closed && blocked.is_empty() && inflight.len() < depth => {
                let Some(job) = job else {
                    closed = true;
                    continue;
                };
                let mut jobs = vec![job];
                let mut n = jobs.iter().map(|j| j.cmds.len()).sum::<usize>();
                // Gather what is queued; when little is, yield a few times so callers that were
                // just answered can submit again and share this commit (group commit without a
                // timer: a yield costs microseconds, a timer at least a millisecond).
                let mut yields = 0;
                while n < MAX_BATCH {
                    match rx.try_recv() {
                        Ok(j) => {
                            n += j.cmds.len();
                            jobs.push(j);
                        }
                        Err(_) if yields < LINGER_YIELDS && n < LINGER_BELOW => {
                            yields += 1;
                            tokio::task::yield_now().await;
                        }
                        Err(_) => break,
                    }
                }
                // An empty job is `expire_pending`: it must look at storage, not the cache.
                if jobs.iter().any(|j| j.cmds.is_empty()) {
                    blocked.extend(jobs);
                    continue;
                }
                let cmds: Vec<Command> = jobs.iter().flat_map(|j| j.cmds.iter().cloned()).collect();
                let (now, check) = time.optimistic();
                let Some(mut snap) = cache.snapshot_for(&cmds, now) else {
                    blocked.extend(jobs);
                    continue;
                };
                let expect = (snap.head_seq, snap.head_hash);
                let (outcomes, changes) = engine::apply_batch(&mut snap, &cmds, now);
                if !fast_answers_hold(&cache, &cmds, &outcomes, &changes) {
                    blocked.extend(jobs);
                    continue;
                }
                cache.absorb(&snap, &changes);
                let b = backend.clone();
                inflight.push_back(Box::pin(async move {
                    // A batch that changes nothing still waits its turn: its answers were
                    // computed on the state the writes before it leave.
                    let result = if changes.is_empty() {
                        Ok(None)
                    } else {
                        b.write_fast(expect, &snap, &changes, check).await.map(Some)
                    };
                    (jobs, outcomes, result, Instant::now())
                }));
            }
        }
    }
}
