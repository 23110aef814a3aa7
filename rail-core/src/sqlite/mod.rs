//! One SQLite database file as a process's store: a writer on a thread of its own that commits
//! whatever is queued as one transaction and makes it durable when a write asks it to, and reads
//! on the caller's thread.
//!
//! Every write is a closure run on the writer's connection inside a savepoint of the current
//! batch (a write alone in its batch runs without one: the transaction is its savepoint); the
//! batch is one `BEGIN IMMEDIATE … COMMIT`. A failed commit answers every write of the batch
//! with the error and keeps none (SQLite rolled the whole transaction back). A write that fails
//! on its own is rolled back to its savepoint (alone, with its transaction, and nothing is
//! committed) and answered with its error; the batch's other writes go on.
//!
//! **Durability.** The writer commits without waiting for the disk (WAL, `synchronous =
//! NORMAL`: a commit is in the file, kept if the process crashes, and consistent after a power
//! loss, but not yet durable), then `fsync`s the WAL only when the batch holds a write that must
//! be durable. Commits become durable in order, so a write made durable covers every write of
//! the file committed before it:
//! - [`SqliteDb::write`] is answered once its commit is durable (what `synchronous = FULL`
//!   gives);
//! - [`SqliteDb::write_deferred`] is answered once committed, with its [`Commit`]; a power loss
//!   may undo it until [`SqliteDb::sync_to`] (or any later durable write of the file) has
//!   returned. Use it for a write that nothing outside the file acts on before a durable write
//!   or a sync: a claim taken before a record that must be on disk before money moves.
//!
//! A failed `fsync` cannot be retried (the kernel may have dropped the pages it could not
//! write), so it stops the file's store in this process: every write and sync after it is
//! refused, until the process opens the file again after a restart (as PostgreSQL stops on a
//! failed `fsync`). The batch it was for stays committed (readers see it, a restart finds it):
//! its durable writes are answered with an error, an outcome unknown to their callers, as a
//! lost acknowledgement is. Unlike under `synchronous = FULL`, a durable write is visible to
//! readers between its commit and its `fsync`.
//!
//! Why a thread of its own: sqlx runs each SQLite connection on a worker thread and every
//! statement is a message to it and a wake-up back (an inter-processor interrupt on a VM).
//! Here a write is one message to the writer and one wake-up back, however many statements it
//! runs, and a batch is whatever arrived while the previous one was being committed (no
//! timer). Reads take a connection of a small pool and run where they are called: SQLite in
//! WAL mode never makes a reader wait for the writer, and a read of a few rows takes
//! microseconds.
//!
//! A thread of the file's own copies the WAL back into the database file (a passive checkpoint
//! every quarter second after new commits), so commits do not pay for checkpoints
//! (`checkpoint.rs`); SQLite's own remains as a backstop at a larger interval.
//!
//! Several processes of one host may open one file: SQLite's own lock serialises their
//! writers (`BEGIN IMMEDIATE` waits up to the busy timeout).
//!
//! ```no_run
//! # async fn demo() -> rail_core::RailResult<()> {
//! let db = rail_core::sqlite::SqliteDb::open(std::path::Path::new("store.db"))?;
//! db.write(|c| {
//!     c.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v INTEGER)", [])?;
//!     c.execute("INSERT OR REPLACE INTO t VALUES ('a', 1)", [])
//! })
//! .await?;
//! let v: i64 = db.read(|c| c.query_row("SELECT v FROM t WHERE k = 'a'", [], |r| r.get(0)))?;
//! assert_eq!(v, 1);
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use crate::error::{RailError, RailResult};

/// How long a statement waits for another process's lock on the file.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a read waits for the file (it runs on the caller's thread).
const READ_BUSY_TIMEOUT: Duration = Duration::from_secs(1);
/// Read connections kept open between reads.
const IDLE_READERS: usize = 4;
/// Statements kept prepared per connection.
const STATEMENT_CACHE: usize = 64;
/// SQLite's own checkpoint, a backstop for the background one ([`checkpoint`]): the WAL's size
/// in pages past which a commit copies it back itself (64 MiB in 4 KiB pages), unless a store's
/// tuning sets its own.
const AUTOCHECKPOINT: &str = "16384";

/// The files this process has open, by canonical path: one writer per file, so every store in
/// a file shares its commits (and never waits on another writer of this process for the
/// file's lock).
static OPEN: std::sync::LazyLock<
    Mutex<std::collections::HashMap<PathBuf, std::sync::Weak<Inner>>>,
> = std::sync::LazyLock::new(|| Mutex::new(std::collections::HashMap::new()));

/// The write's outcome, delivered once its batch's commit is known (and, for a durable write,
/// on disk): the commit that holds it, or why the batch was not kept.
type Deliver = Box<dyn FnOnce(Result<Commit, &str>) + Send>;
/// A write: runs on the writer's connection inside its savepoint (`None`: it cannot run, the
/// batch's transaction did not begin), and says whether it succeeded.
type Job = Box<dyn FnOnce(Option<&Connection>) -> (bool, Deliver) + Send>;

/// A write waiting for the writer: answered once committed, or once durable.
struct Queued {
    job: Job,
    durable: bool,
    /// The write is one statement that changes the file (and nothing after it that can fail):
    /// SQLite undoes such a statement by itself when it fails, so it needs no savepoint.
    one_statement: bool,
}

/// One of this process's commits of a file, in the order the writer made them: everything
/// written in it is durable once [`SqliteDb::sync_to`] it has returned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Commit(u64);

/// A SQLite database file opened as a store: one writer thread, reads where they are called.
/// Cheap to clone; the writer thread ends when the last clone is dropped.
#[derive(Clone)]
pub struct SqliteDb {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    pragmas: Vec<(&'static str, &'static str)>,
    jobs: mpsc::Sender<Queued>,
    readers: Mutex<Vec<Connection>>,
    shared: Arc<Shared>,
    /// The file's checkpointer thread ([`checkpoint`]), woken when the last [`SqliteDb`] of the
    /// file is dropped so that it closes its connection at once.
    checkpointer: std::sync::OnceLock<std::thread::Thread>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = self.checkpointer.get() {
            t.unpark();
        }
    }
}

/// What the writer has done, and what its callers read of it.
#[derive(Debug, Default)]
struct Shared {
    /// The last commit made (0: none yet).
    committed: AtomicU64,
    /// Every commit up to this one is on disk.
    durable: AtomicU64,
    /// Why the file's store stopped (a failed `fsync`): every write and sync after it refused.
    stopped: Mutex<Option<String>>,
    writes: AtomicU64,
    commits: AtomicU64,
    syncs: AtomicU64,
    /// Tests: the next `fsync` fails.
    #[cfg(test)]
    fail_sync: std::sync::atomic::AtomicBool,
}

impl Shared {
    fn stopped(&self) -> Option<String> {
        lock(&self.stopped).clone()
    }
}

/// How much a file's writer has done since it started ([`SqliteDb::stats`]): a bench divides
/// the difference over a phase by the calls it made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Writes in committed batches (each a caller's `write`, one that failed on its own
    /// beside others included — a write that failed alone in its batch commits nothing and
    /// is not counted —, and each `sync_to` that had to wait for an `fsync`).
    pub writes: u64,
    /// Transactions committed.
    pub commits: u64,
    /// `fsync`s of the WAL, each making every commit before it durable.
    pub syncs: u64,
}

impl std::fmt::Debug for SqliteDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteDb")
            .field("path", &self.inner.path)
            .finish_non_exhaustive()
    }
}

fn storage(e: &rusqlite::Error) -> RailError {
    RailError::Storage(e.to_string())
}

/// Adds column `column` (its SQL type `ty`) to `table` unless the table has it: how a store
/// brings a file an earlier release made up to its schema, run in the writer's transaction.
/// `table`, `column` and `ty` are written into the statement as they are, so they are
/// `&'static str`: the store's own constants, never input.
///
/// # Errors
/// SQLite's, when the table cannot be read or altered.
pub fn add_column_if_missing(
    c: &Connection,
    table: &'static str,
    column: &'static str,
    ty: &'static str,
) -> rusqlite::Result<()> {
    let has: bool = c.query_row(
        "SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2",
        [table, column],
        |r| r.get(0),
    )?;
    if !has {
        c.execute(&format!("ALTER TABLE {table} ADD COLUMN {column} {ty}"), [])?;
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Opens a connection to `path` with the store's settings: `pragmas` first, then WAL,
/// `synchronous = NORMAL` (a commit does not wait for the disk: the writer `fsync`s the WAL
/// for a durable write), foreign keys on, the busy timeout.
fn connect(path: &Path, pragmas: &[(&str, &str)]) -> rusqlite::Result<Connection> {
    let c = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )?;
    c.busy_timeout(BUSY_TIMEOUT)?;
    // First: a page size takes effect only before the file is set to WAL.
    for (name, value) in pragmas {
        c.pragma_update(None, name, value)?;
    }
    let mode: String = c.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CANTOPEN),
            Some(format!(
                "the file stays in journal mode {mode:?}, not WAL (a network or read-only filesystem?): put it on a local disk"
            )),
        ));
    }
    c.pragma_update(None, "synchronous", "NORMAL")?;
    if !pragmas
        .iter()
        .any(|(name, _)| *name == "wal_autocheckpoint")
    {
        c.pragma_update(None, "wal_autocheckpoint", AUTOCHECKPOINT)?;
    }
    c.pragma_update(None, "foreign_keys", "ON")?;
    c.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(c)
}

/// The writer this process already runs on a file, joined by an opener asking for `pragmas`
/// (the first opener's settings hold).
fn joined(inner: Arc<Inner>, pragmas: &[(&'static str, &'static str)]) -> SqliteDb {
    if inner.pragmas != pragmas {
        tracing::warn!(
            path = %inner.path.display(),
            "SQLite file opened again with other settings; the first opener's hold"
        );
    }
    SqliteDb { inner }
}

impl SqliteDb {
    /// Opens (or creates) the database file at `path` and starts its writer thread, or joins
    /// the writer this process already runs on that file (the first opener's settings hold).
    ///
    /// # Errors
    /// [`RailError::Storage`] if the file cannot be opened or set to WAL mode, or the thread
    /// cannot be started.
    pub fn open(path: &Path) -> RailResult<SqliteDb> {
        Self::open_tuned(path, &[])
    }

    /// [`SqliteDb::open`], each connection also set with `pragmas` (name, value), after the
    /// store's own: a table's tuning (page size, cache, checkpoint interval).
    ///
    /// # Errors
    /// As [`SqliteDb::open`], and a pragma SQLite refuses.
    pub fn open_tuned(
        path: &Path,
        pragmas: &[(&'static str, &'static str)],
    ) -> RailResult<SqliteDb> {
        let pragmas: Vec<(&'static str, &'static str)> = pragmas.to_vec();
        // Open here already: join it without a connection of its own.
        if let Some(db) = Self::open_here(path) {
            return Ok(joined(db.inner, &pragmas));
        }
        let writer = connect(path, &pragmas).map_err(|e| {
            RailError::Storage(format!("cannot open the database {}: {e}", path.display()))
        })?;
        // The file exists now: one writer per file in this process, whoever opens it.
        let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_owned());
        let mut open = lock(&OPEN);
        open.retain(|_, w| w.strong_count() > 0);
        if let Some(inner) = open.get(&key).and_then(std::sync::Weak::upgrade) {
            return Ok(joined(inner, &pragmas));
        }
        // The WAL as SQLite names it (beside the main file, as SQLite resolved its name).
        let main = writer.path().map_or_else(|| key.clone(), PathBuf::from);
        let mut wal = main.clone().into_os_string();
        wal.push("-wal");
        let wal = PathBuf::from(wal);
        let (tx, rx) = mpsc::channel::<Queued>();
        let shared = Arc::new(Shared::default());
        let for_writer = shared.clone();
        let mut files = writer::Files::new(wal, main);
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || writer::write_loop(&writer, &rx, &for_writer, &mut files))
            .map_err(|e| RailError::Storage(format!("cannot start the SQLite writer: {e}")))?;
        let inner = Arc::new(Inner {
            path: key.clone(),
            pragmas,
            jobs: tx,
            readers: Mutex::new(Vec::new()),
            shared,
            checkpointer: std::sync::OnceLock::new(),
        });
        let of = Arc::downgrade(&inner);
        match std::thread::Builder::new()
            .name("sqlite-checkpoint".into())
            .spawn(move || checkpoint::run(&of))
        {
            Ok(t) => {
                let _ = inner.checkpointer.set(t.thread().clone());
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the SQLite checkpointer; SQLite's own checkpoints remain");
            }
        }
        open.insert(key, Arc::downgrade(&inner));
        Ok(SqliteDb { inner })
    }

    /// The writer this process runs on the file at `path`, if it has one (nothing is opened).
    #[must_use]
    pub fn open_here(path: &Path) -> Option<SqliteDb> {
        let key = std::fs::canonicalize(path).ok()?;
        lock(&OPEN)
            .get(&key)
            .and_then(std::sync::Weak::upgrade)
            .map(|inner| SqliteDb { inner })
    }

    /// What this file's writer has done since it started (every opener of the file in this
    /// process shares it).
    #[must_use]
    pub fn stats(&self) -> Stats {
        let s = &self.inner.shared;
        Stats {
            writes: s.writes.load(Ordering::Relaxed),
            commits: s.commits.load(Ordering::Relaxed),
            syncs: s.syncs.load(Ordering::Relaxed),
        }
    }

    /// The last commit this process made of the file.
    #[must_use]
    pub fn last_commit(&self) -> Commit {
        Commit(self.inner.shared.committed.load(Ordering::Acquire))
    }

    /// Every commit up to this one is durable.
    #[must_use]
    pub fn durable_through(&self) -> Commit {
        Commit(self.inner.shared.durable.load(Ordering::Acquire))
    }

    /// The file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Runs `f` on the writer's connection in the next batch and answers once that batch is
    /// committed and on disk. `f` runs inside a savepoint (alone in its batch, inside the
    /// batch's transaction itself): its error (or panic) undoes what it wrote and nothing else.
    /// Keep `f` short (it holds the file's write lock): no waiting on anything but the
    /// database. `f` must not end or begin transactions itself (`BEGIN`, `COMMIT`, `ROLLBACK`,
    /// `RELEASE` of a savepoint it did not make): the batch would be refused where that is
    /// seen (a transaction ended and not begun again), and what `f` wrote before is not
    /// vouched for either way.
    ///
    /// # Errors
    /// [`RailError::Storage`] with `f`'s error, or the batch's failed commit (then nothing `f`
    /// wrote was kept), or a failed `fsync` (then this process's store of the file has
    /// stopped), or when the writer has stopped.
    pub async fn write<T, F>(&self, f: F) -> RailResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.submit(true, false, move |c| f(c).map_err(|e| storage(&e)))
            .await
            .map(|(v, _)| v)
    }

    /// [`SqliteDb::write`] (`durable`) or [`SqliteDb::write_deferred`], as the caller's handle
    /// is; with `one_statement`, for a write that is one statement changing the file, whose
    /// error can only be that statement's: SQLite backs a failed statement out by itself
    /// (statement-level atomicity), so the writer runs it without a savepoint of its own — two
    /// statements less, and no copy of the pages it changes in the savepoint's journal. A key
    /// store's writes are such.
    pub(crate) async fn write_with<T, F>(
        &self,
        durable: bool,
        one_statement: bool,
        f: F,
    ) -> RailResult<(T, Commit)>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.submit(durable, one_statement, move |c| {
            f(c).map_err(|e| storage(&e))
        })
        .await
    }

    /// [`SqliteDb::write`] for a write with an error type of its own: `f`'s error is returned
    /// as it is (and undoes what `f` wrote); a failed commit or `fsync`, or a stopped writer,
    /// is an `E::from(`[`RailError::Storage`]`)`.
    ///
    /// # Errors
    /// `f`'s error, or the batch's failed commit or `fsync`, or a stopped writer.
    pub async fn write_as<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<RailError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        self.submit(true, false, f).await.map(|(v, _)| v)
    }

    /// [`SqliteDb::write`], answered once its batch is committed rather than on disk, with the
    /// [`Commit`] that holds it: every reader and every process sees it, a crash of this
    /// process keeps it, but a power loss (or a crash of the host) may undo it until
    /// [`SqliteDb::sync_to`] that commit, or any durable write of the file answered after it,
    /// has returned. Before anything outside the file acts on the write (money moved, an
    /// answer sent), make it durable.
    ///
    /// # Errors
    /// As [`SqliteDb::write`] (a failed `fsync` before this write stops it too).
    pub async fn write_deferred<T, F>(&self, f: F) -> RailResult<(T, Commit)>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    {
        self.submit(false, false, move |c| f(c).map_err(|e| storage(&e)))
            .await
    }

    /// Makes `commit`, and every commit of the file before it, durable: at once if it is, or
    /// with the writer's next batch and its `fsync`.
    ///
    /// # Errors
    /// [`RailError::Storage`] when an `fsync` failed (this process's store of the file has
    /// stopped).
    pub async fn sync_to(&self, commit: Commit) -> RailResult<()> {
        let s = &self.inner.shared;
        if let Some(why) = s.stopped() {
            return Err(RailError::Storage(why));
        }
        if s.durable.load(Ordering::Acquire) >= commit.0 {
            return Ok(());
        }
        // A durable write of nothing: its batch comes after `commit`, and its fsync covers it.
        self.submit(true, true, |_| Ok::<(), RailError>(()))
            .await
            .map(|((), _)| ())
    }

    /// Makes every commit of the file made so far durable ([`SqliteDb::sync_to`] the last).
    ///
    /// # Errors
    /// As [`SqliteDb::sync_to`].
    pub async fn sync(&self) -> RailResult<()> {
        let last = Commit(self.inner.shared.committed.load(Ordering::Acquire));
        self.sync_to(last).await
    }

    /// Queues `f` for the writer; answered once committed (and on disk if `durable`).
    /// `one_statement`: see [`SqliteDb::write_with`].
    async fn submit<T, E, F>(
        &self,
        durable: bool,
        one_statement: bool,
        f: F,
    ) -> Result<(T, Commit), E>
    where
        T: Send + 'static,
        E: From<RailError> + Send + 'static,
        F: FnOnce(&Connection) -> Result<T, E> + Send + 'static,
    {
        let stopped = || E::from(RailError::Storage("the SQLite writer has stopped".into()));
        let (tx, rx) = oneshot::channel::<Result<(T, Commit), E>>();
        let job: Job = Box::new(move |c: Option<&Connection>| {
            let out = c.map(f);
            let ok = matches!(out, Some(Ok(_)));
            let deliver: Deliver = Box::new(move |commit: Result<Commit, &str>| {
                let answer = match (out, commit) {
                    (Some(Ok(v)), Ok(at)) => Ok((v, at)),
                    (Some(Err(e)), _) => Err(e),
                    (_, Err(e)) => Err(E::from(RailError::Storage(e.to_owned()))),
                    (None, Ok(_)) => {
                        Err(E::from(RailError::Storage("the write did not run".into())))
                    }
                };
                let _ = tx.send(answer);
            });
            (ok, deliver)
        });
        self.inner
            .jobs
            .send(Queued {
                job,
                durable,
                one_statement,
            })
            .map_err(|_| stopped())?;
        rx.await.map_err(|_| {
            E::from(RailError::Storage(
                "the write did not finish (it failed inside the SQLite writer, and was undone)"
                    .into(),
            ))
        })?
    }

    /// Runs `f` on a read connection, on this thread. It sees every write answered before the
    /// call (a deferred one included). Writing through it fails (the connection is `query_only`).
    ///
    /// # Errors
    /// [`RailError::Storage`] with `f`'s error, or when no connection can be opened.
    pub fn read<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> RailResult<T> {
        let reader = lock(&self.inner.readers).pop();
        let c = match reader {
            Some(c) => c,
            None => {
                let c = connect(&self.inner.path, &self.inner.pragmas).map_err(|e| storage(&e))?;
                c.pragma_update(None, "query_only", true)
                    .map_err(|e| storage(&e))?;
                // A WAL reader rarely waits (recovery); when it does, it holds a runtime thread.
                c.busy_timeout(READ_BUSY_TIMEOUT).map_err(|e| storage(&e))?;
                c
            }
        };
        let out = f(&c).map_err(|e| storage(&e));
        // A connection left inside a transaction would answer later reads from an old
        // snapshot: it is closed, not kept.
        if c.is_autocommit() {
            let mut idle = lock(&self.inner.readers);
            if idle.len() < IDLE_READERS {
                idle.push(c);
            }
        }
        out
    }
}

mod checkpoint;
mod writer;

#[cfg(test)]
mod tests;
