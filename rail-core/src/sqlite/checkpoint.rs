//! The background checkpointer of a [`super::SqliteDb`]: copies the WAL back into the database
//! file off the commit path.
//!
//! SQLite's own checkpoint runs inside the commit that takes the WAL past
//! `wal_autocheckpoint` pages: on the writer's thread, in the commit's latency, and (at the
//! default 1,000 pages) often enough that pages written many times between two checkpoints are
//! copied many times. Here a thread of the file's own, on a connection of its own, runs a
//! passive checkpoint ([`INTERVAL`] apart, only after the writer committed): it never blocks the
//! writer or a reader, and SQLite's own checkpoint stays as the backstop at a larger interval
//! ([`super::AUTOCHECKPOINT`]). A checkpoint still `fsync`s the WAL before it copies and the
//! database file after, so a frame it copied is never lost.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::Inner;

/// How often the checkpointer looks for new commits to copy back.
pub(super) const INTERVAL: Duration = Duration::from_millis(250);

/// Runs passive checkpoints of the file of `of` until its last [`super::SqliteDb`] is dropped
/// (which unparks this thread, so it closes its connection at once rather than an interval
/// later), each after the writer has committed since the last complete one. A failure is logged
/// and retried at the next interval; SQLite's own checkpoint remains.
pub(super) fn run(of: &Weak<Inner>) {
    // The last commit of the file, while a `SqliteDb` of it remains.
    let committed = || {
        of.upgrade()
            .map(|inner| inner.shared.committed.load(Ordering::Acquire))
    };
    let Some(path) = of.upgrade().map(|inner| inner.path.clone()) else {
        return;
    };
    let path = path.as_path();
    // The file exists (its writer created it): never create one where it was removed.
    let c = match Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    ) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "SQLite checkpointer: cannot open the file; SQLite's own checkpoints remain");
            return;
        }
    };
    // A checkpoint syncs the WAL before it copies and the database file after, at NORMAL as at
    // FULL: said here rather than left to the library's compiled-in default.
    if let Err(e) = c
        .busy_timeout(Duration::from_millis(100))
        .and_then(|()| c.pragma_update(None, "synchronous", "NORMAL"))
    {
        tracing::debug!(error = %e, "SQLite checkpointer: connection settings");
    }
    let mut done = 0;
    loop {
        std::thread::park_timeout(INTERVAL);
        let Some(committed) = committed() else {
            return;
        };
        if committed == done {
            continue;
        }
        // (busy, frames in the WAL, frames copied back): done only when all were copied.
        match c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        }) {
            Ok((0, log, copied)) if log == copied => done = committed,
            Ok(_) => {}
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy => {}
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "SQLite checkpointer: a checkpoint failed; the WAL keeps the commits and the next checkpoint retries");
            }
        }
    }
}
