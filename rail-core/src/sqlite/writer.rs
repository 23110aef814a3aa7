//! The writer thread of a [`super::SqliteDb`]: batches, savepoints, the commit, and the
//! `fsync` that makes a batch's durable writes durable.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc;

use rusqlite::Connection;

use super::{Commit, Deliver, Job, Queued, Shared, lock};

/// At most this many writes share one commit (the rest wait for the next).
const MAX_BATCH: usize = 512;

/// The files the writer makes durable: the WAL, and the main file when there is no WAL. The WAL
/// is opened once and kept (SQLite removes it only when the last connection to the file closes,
/// and the writer's stays open): a write-back error is then reported to this handle even when
/// another (SQLite's own checkpoint) saw it first.
pub(super) struct Files {
    wal: PathBuf,
    main: PathBuf,
    wal_file: Option<std::fs::File>,
}

impl Files {
    /// The WAL at `wal` of the main file `main`, not opened yet.
    pub(super) fn new(wal: PathBuf, main: PathBuf) -> Self {
        Files {
            wal,
            main,
            wal_file: None,
        }
    }
}

/// Why a batch could not be made durable.
enum Unsynced {
    /// The WAL could not be opened (too many open files): nothing is known lost; the batch's
    /// durable writes are refused and the next batch tries again.
    Open(std::io::Error),
    /// `fsync` failed: pages may be lost for good.
    Sync(std::io::Error),
}

/// The writer thread: takes what is queued (at least one write, waiting for it), runs each in a
/// savepoint of one transaction, commits, answers each (a durable write once the batch is
/// `fsync`ed). Ends when every sender is gone.
pub(super) fn write_loop(
    c: &Connection,
    jobs: &mpsc::Receiver<Queued>,
    shared: &Shared,
    files: &mut Files,
) {
    let mut batch: Vec<Queued> = Vec::new();
    while let Ok(first) = jobs.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match jobs.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        if let Some(why) = shared.stopped() {
            refuse(batch.drain(..).map(|q| q.job), &why);
            continue;
        }
        run_batch(c, &mut batch, shared, files);
    }
}

/// `fsync`s the file so that every commit up to `seq` is durable; a failed `fsync` stops the
/// store. A batch that could not be made durable stays committed: its durable writes are
/// answered with an error, an outcome unknown to their callers (as a lost acknowledgement).
fn make_durable(files: &mut Files, shared: &Shared, seq: u64) -> Result<(), String> {
    match fsync(files, shared) {
        Ok(()) => {
            shared.syncs.fetch_add(1, Ordering::Relaxed);
            shared.durable.fetch_max(seq, Ordering::AcqRel);
            Ok(())
        }
        Err(Unsynced::Open(e)) => {
            tracing::warn!(error = %e, path = %files.wal.display(), "SQLite writer: cannot open the WAL to make a batch durable");
            Err(format!(
                "cannot open {} to make the write durable ({e}); it was committed and may not survive a power loss: try again",
                files.wal.display()
            ))
        }
        Err(Unsynced::Sync(e)) => {
            let why = format!(
                "cannot make {} durable ({e}); its store has stopped in this process: check the disk, then restart",
                files.main.display()
            );
            tracing::error!(error = %e, path = %files.main.display(), "SQLite writer: fsync failed; the store stops");
            *lock(&shared.stopped) = Some(why.clone());
            Err(why)
        }
    }
}

/// `fsync`s the WAL (every commit in WAL mode is in it), or the main file when there is no WAL
/// yet (nothing was committed to one). The first time the WAL is opened, its directory is
/// synced too: the WAL's own entry in it must survive a power loss.
fn fsync(files: &mut Files, shared: &Shared) -> Result<(), Unsynced> {
    #[cfg(test)]
    if shared.fail_sync.swap(false, Ordering::AcqRel) {
        return Err(Unsynced::Sync(std::io::Error::other(
            "an injected fsync failure",
        )));
    }
    #[cfg(not(test))]
    let _ = shared;
    let wal = match &mut files.wal_file {
        Some(f) => f,
        None => match std::fs::File::open(&files.wal) {
            Ok(f) => {
                if let Some(dir) = files.wal.parent()
                    && let Err(e) = std::fs::File::open(dir).and_then(|d| d.sync_all())
                {
                    tracing::warn!(error = %e, dir = %dir.display(), "SQLite writer: cannot sync the WAL's directory");
                }
                files.wal_file.insert(f)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let main = std::fs::File::open(&files.main).map_err(Unsynced::Open)?;
                return main.sync_data().map_err(Unsynced::Sync);
            }
            Err(e) => return Err(Unsynced::Open(e)),
        },
    };
    wal.sync_data().map_err(Unsynced::Sync)
}

/// The savepoint around each write (a name no store's own statements use).
const SAVEPOINT: &str = "SAVEPOINT sqlitedb_write";
const RELEASE: &str = "RELEASE sqlitedb_write";
const ROLLBACK_TO: &str = "ROLLBACK TO sqlitedb_write";

/// Runs `batch` as one transaction, counted once committed (before any write of it is
/// answered: a caller that saw its write answered sees it counted). A deferred write is
/// answered at once; when the batch holds a durable one, the WAL is `fsync`ed, then those are
/// answered.
fn run_batch(c: &Connection, batch: &mut Vec<Queued>, shared: &Shared, files: &mut Files) {
    let n = batch.len() as u64;
    // A transaction left open (a rollback that failed) would make BEGIN fail for good.
    if !c.is_autocommit()
        && let Err(e) = exec(c, "ROLLBACK")
    {
        tracing::warn!(error = %e, "SQLite writer: cannot end a transaction left open");
    }
    if let Err(e) = exec(c, "BEGIN IMMEDIATE") {
        tracing::warn!(error = %e, "SQLite writer: cannot begin a transaction");
        refuse(batch.drain(..).map(|q| q.job), &e.to_string());
        return;
    }
    let mut delivers: Vec<(bool, Deliver)> = Vec::with_capacity(batch.len());
    // A write alone in its batch needs no savepoint: the transaction is one (a failure rolls
    // it back whole). Two statements and the savepoint's copies of the pages it changes less,
    // on the batches a lightly loaded store makes.
    let alone = batch.len() == 1;
    let mut jobs = batch.drain(..);
    while let Some(Queued {
        job,
        durable,
        one_statement,
    }) = jobs.next()
    {
        // One statement needs no savepoint either: SQLite backs it out by itself when it fails.
        let bare = alone || one_statement;
        if !bare && let Err(e) = exec(c, SAVEPOINT) {
            refuse(std::iter::once(job), &e.to_string());
            abandon_all(c, delivers, jobs, &e);
            return;
        }
        // A write that panics is a failed write: its savepoint is rolled back (a write of one
        // statement has none: its batch is), its caller answered (its answer channel
        // dropped), and the writer goes on.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(Some(c))));
        let (ok, deliver) = match ran {
            Ok((ok, deliver)) => (ok, Some(deliver)),
            Err(_) => {
                tracing::error!("SQLite writer: a write panicked; it is undone");
                (false, None)
            }
        };
        if alone && !ok {
            // Undone with its transaction; its caller gets the write's own error (or, after a
            // panic, its answer channel dropped). Nothing is committed.
            end_transaction(c);
            if let Some(d) = deliver {
                d(Err("the write failed and was undone"));
            }
            return;
        }
        if bare {
            let Some(d) = deliver else {
                // A write of one statement panicked, maybe after its statement ran: without a
                // savepoint of its own it cannot be undone alone, so the batch is.
                let e = panicked_without_a_savepoint();
                abandon_all(c, delivers, jobs, &e);
                return;
            };
            delivers.push((durable, d));
            // Its failure may have ended the transaction (a full disk, an I/O error).
            if c.is_autocommit() {
                let e = ended_under_a_write();
                abandon_all(c, delivers, jobs, &e);
                return;
            }
            continue;
        }
        let end = if ok {
            exec(c, RELEASE)
        } else {
            exec(c, ROLLBACK_TO).and_then(|()| exec(c, RELEASE))
        };
        if let Some(d) = deliver {
            delivers.push((durable, d));
        }
        // The transaction is gone (SQLite rolled it back: a full disk, an I/O error), or the
        // savepoint could not be ended (the write ended the transaction itself): nothing of
        // the batch can be vouched for. Refuse all of it and start again.
        let lost = c.is_autocommit();
        if let Err(e) = end {
            abandon_all(c, delivers, jobs, &e);
            return;
        }
        if lost {
            let e = ended_under_a_write();
            abandon_all(c, delivers, jobs, &e);
            return;
        }
    }
    drop(jobs);
    match exec(c, "COMMIT") {
        Ok(()) => {
            shared.writes.fetch_add(n, Ordering::Relaxed);
            shared.commits.fetch_add(1, Ordering::Relaxed);
            let seq = shared.committed.fetch_add(1, Ordering::AcqRel) + 1;
            let mut durable = Vec::new();
            for (wait, d) in delivers {
                if wait {
                    durable.push(d);
                } else {
                    d(Ok(Commit(seq)));
                }
            }
            if !durable.is_empty() {
                let answer = make_durable(files, shared, seq);
                for d in durable {
                    match &answer {
                        Ok(()) => d(Ok(Commit(seq))),
                        Err(why) => d(Err(why)),
                    }
                }
            }
        }
        Err(e) => {
            // SQLite may keep the transaction open after a failed COMMIT (a deferred
            // constraint, a busy file): roll it back so none of the batch stays.
            end_transaction(c);
            let why = e.to_string();
            for (_, d) in delivers {
                d(Err(&why));
            }
        }
    }
}

/// The error of a batch one of whose writes without a savepoint panicked.
fn panicked_without_a_savepoint() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
        Some("a write of the batch panicked and the batch was undone".into()),
    )
}

/// The error of a batch whose transaction SQLite ended under one of its writes.
fn ended_under_a_write() -> rusqlite::Error {
    rusqlite::Error::SqliteFailure(
        rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
        Some("the batch's transaction ended under a write".into()),
    )
}

/// Answers every write of `jobs` with `why` without running it.
fn refuse(jobs: impl Iterator<Item = Job>, why: &str) {
    for job in jobs {
        let (_, deliver) = job(None);
        deliver(Err(why));
    }
}

/// Rolls the batch back and answers the writes that ran (`delivers`) and those that did not
/// (`rest`) with `e`.
fn abandon_all(
    c: &Connection,
    delivers: Vec<(bool, Deliver)>,
    rest: impl Iterator<Item = Queued>,
    e: &rusqlite::Error,
) {
    tracing::warn!(error = %e, "SQLite writer: a batch was abandoned and rolled back");
    end_transaction(c);
    let why = e.to_string();
    for (_, d) in delivers {
        d(Err(&why));
    }
    refuse(rest.map(|q| q.job), &why);
}

/// Rolls back whatever transaction is open.
fn end_transaction(c: &Connection) {
    if !c.is_autocommit()
        && let Err(r) = exec(c, "ROLLBACK")
    {
        tracing::warn!(error = %r, "SQLite writer: rollback");
    }
}

/// Runs one statement without parameters, prepared once per connection.
fn exec(c: &Connection, sql: &str) -> rusqlite::Result<()> {
    c.prepare_cached(sql)?.execute([]).map(|_| ())
}
