//! [`Ledger`]: the handle applications use. Requests from every task are gathered by one
//! batching task and applied many per database commit (group commit), which is what makes
//! durable commits fast; each request still gets its own answer.

use std::sync::Arc;

use rail_core::{SharedClock, SystemClock};
use tokio::sync::{mpsc, oneshot};

use crate::engine::{Command, Outcome, VerifyReport};
use crate::error::LedgerError;
use crate::store::{Backend, postgres::PgBackend, sqlite::SqliteBackend};
use crate::types::{
    Account, AccountCreated, AccountId, Created, NewAccount, Transfer, TransferError, TransferId,
    TransferRequest, TransferStatus,
};

/// Most requests applied in one database transaction.
pub const MAX_BATCH: usize = 4096;

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
#[derive(Clone)]
pub struct Ledger {
    backend: Arc<dyn Backend>,
    tx: mpsc::Sender<Job>,
    clock: SharedClock,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("backend", &self.backend.name())
            .finish()
    }
}

impl Ledger {
    /// Opens (or creates) a SQLite ledger at `url` (`sqlite://path/to/file.db`), WAL mode,
    /// durable commits.
    ///
    /// # Errors
    /// [`LedgerError::Storage`] if the database cannot be opened.
    pub async fn sqlite(url: &str) -> Result<Self, LedgerError> {
        Self::sqlite_with_clock(url, Arc::new(SystemClock)).await
    }

    /// As [`Ledger::sqlite`], with an injected clock (timestamps and hold expiry).
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn sqlite_with_clock(url: &str, clock: SharedClock) -> Result<Self, LedgerError> {
        let b = SqliteBackend::open(url).await?;
        Ok(Self::start(Arc::new(b), clock))
    }

    /// Connects to a PostgreSQL ledger. `schema` (created if missing) keeps this ledger apart
    /// from others in the same database; `None` uses the connection's default search path.
    ///
    /// # Errors
    /// [`LedgerError::Storage`] if the database cannot be reached.
    pub async fn postgres(url: &str, schema: Option<&str>) -> Result<Self, LedgerError> {
        Self::postgres_with_clock(url, schema, Arc::new(SystemClock)).await
    }

    /// As [`Ledger::postgres`], with an injected clock.
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn postgres_with_clock(
        url: &str,
        schema: Option<&str>,
        clock: SharedClock,
    ) -> Result<Self, LedgerError> {
        let b = PgBackend::open(url, schema).await?;
        Ok(Self::start(Arc::new(b), clock))
    }

    fn start(backend: Arc<dyn Backend>, clock: SharedClock) -> Self {
        let (tx, rx) = mpsc::channel::<Job>(MAX_BATCH);
        tokio::spawn(run_batcher(backend.clone(), clock.clone(), rx));
        Ledger { backend, tx, clock }
    }

    /// The backend's name (`sqlite` or `postgres`).
    #[must_use]
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The ledger's clock.
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
    /// [`LedgerError::Storage`] when the batch could not be written (nothing was).
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
    /// [`LedgerError::Storage`] when the batch could not be written (nothing was).
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

    /// Releases every pending transfer whose timeout has passed (also done at the start of
    /// every batch, up to 256 at a time).
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

    /// A transfer and, for holds and postings, its status.
    ///
    /// # Errors
    /// [`LedgerError::Storage`].
    pub async fn lookup_transfer(
        &self,
        id: TransferId,
    ) -> Result<Option<(Transfer, Option<TransferStatus>)>, LedgerError> {
        self.backend.transfer(id).await
    }

    /// Replays the whole journal: checks the hash chain, entry numbering, that every entry's
    /// balances continue its accounts' history, and that stored balances and statuses are what
    /// the journal says.
    ///
    /// # Errors
    /// [`LedgerError::Storage`] or [`LedgerError::Corrupt`] (undecodable rows).
    pub async fn verify_journal(&self) -> Result<VerifyReport, LedgerError> {
        self.backend.verify().await
    }
}

fn first<T>(v: Vec<Result<T, TransferError>>) -> Result<T, LedgerError> {
    v.into_iter()
        .next()
        .ok_or_else(|| LedgerError::Storage("empty answer".into()))?
        .map_err(LedgerError::Refused)
}

async fn run_batcher(backend: Arc<dyn Backend>, clock: SharedClock, mut rx: mpsc::Receiver<Job>) {
    while let Some(job) = rx.recv().await {
        let mut jobs = vec![job];
        let mut n = jobs.iter().map(|j| j.cmds.len()).sum::<usize>();
        while n < MAX_BATCH {
            match rx.try_recv() {
                Ok(j) => {
                    n += j.cmds.len();
                    jobs.push(j);
                }
                Err(_) => break,
            }
        }
        let cmds: Vec<Command> = jobs.iter().flat_map(|j| j.cmds.iter().cloned()).collect();
        let result = backend.execute(&cmds, clock.now()).await;
        match result {
            Ok(outcomes) => {
                let mut it = outcomes.into_iter();
                for j in jobs {
                    let mine: Vec<Outcome> = it.by_ref().take(j.cmds.len()).collect();
                    let _ = j.reply.send(Ok(mine));
                }
            }
            Err(e) => {
                tracing::warn!(backend = backend.name(), error = %e, requests = n, "ledger batch failed; rolled back");
                for j in jobs {
                    let _ = j.reply.send(Err(e.clone()));
                }
            }
        }
    }
}
