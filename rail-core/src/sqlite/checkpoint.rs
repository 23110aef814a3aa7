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

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use rusqlite::Connection;

use super::Shared;

/// How often the checkpointer looks for new commits to copy back.
pub(super) const INTERVAL: Duration = Duration::from_millis(250);

/// Runs passive checkpoints of the file at `path` until `shared` (the file's writer state) is
/// gone, each after the writer has committed since the last. A failure is logged and retried at
/// the next interval; SQLite's own checkpoint remains.
pub(super) fn run(path: &PathBuf, shared: &Weak<Shared>) {
    let c = match Connection::open(path) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "SQLite checkpointer: cannot open the file; SQLite's own checkpoints remain");
            return;
        }
    };
    if let Err(e) = c.busy_timeout(Duration::from_millis(100)) {
        tracing::debug!(error = %e, "SQLite checkpointer: busy timeout");
    }
    let mut seen = 0;
    loop {
        std::thread::sleep(INTERVAL);
        let Some(shared): Option<Arc<Shared>> = shared.upgrade() else {
            return;
        };
        let committed = shared.committed.load(Ordering::Acquire);
        drop(shared);
        if committed == seen {
            continue;
        }
        seen = committed;
        match c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            Ok(()) => {}
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy => {}
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "SQLite checkpointer: a checkpoint failed; the WAL keeps the commits and the next checkpoint retries");
            }
        }
    }
}
