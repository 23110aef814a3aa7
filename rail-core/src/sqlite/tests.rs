//! The writer's behaviours: batches, failures, durability.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

async fn db() -> (tempfile::TempDir, SqliteDb) {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDb::open(&dir.path().join("t.db")).unwrap();
    db.write(|c| c.execute_batch("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER NOT NULL)"))
        .await
        .unwrap();
    (dir, db)
}

/// The writer still commits after what a test did to it.
async fn goes_on(db: &SqliteDb) {
    db.write(|c| c.execute("INSERT INTO t VALUES ('after', 1)", []))
        .await
        .unwrap();
}

fn count(db: &SqliteDb) -> i64 {
    db.read(|c| c.query_row("SELECT count(*) FROM t", [], |r| r.get(0)))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_writes_and_the_commits_they_shared() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteDb::open(&dir.path().join("s.db")).unwrap();
    db.write(|c| c.execute_batch("CREATE TABLE t (x INTEGER)"))
        .await
        .unwrap();
    let before = db.stats();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            db.write(move |c| c.execute("INSERT INTO t VALUES (?1)", [i]))
                .await
                .unwrap();
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let after = db.stats();
    assert_eq!(after.writes - before.writes, 64);
    let commits = after.commits - before.commits;
    assert!((1..=64).contains(&commits), "{commits}");
    // Every opener of the file shares the writer, and so its counts.
    assert_eq!(
        SqliteDb::open(&dir.path().join("s.db")).unwrap().stats(),
        after
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_write_is_seen_at_once_and_made_durable_by_a_sync() {
    let (_dir, db) = db().await;
    let ((), at) = db
        .write_deferred(|c| c.execute("INSERT INTO t VALUES ('d', 1)", []).map(|_| ()))
        .await
        .unwrap();
    // Committed: every reader sees it before it is on disk.
    assert_eq!(count(&db), 1);
    let before = db.stats().syncs;
    db.sync_to(at).await.unwrap();
    let after = db.stats().syncs;
    assert!(after - before <= 1, "{before} → {after}");
    // Durable now: syncing to it again costs nothing.
    db.sync_to(at).await.unwrap();
    db.sync().await.unwrap();
    assert_eq!(db.stats().syncs, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_write_covers_every_deferred_write_before_it() {
    let (_dir, db) = db().await;
    let mut commits = Vec::new();
    for i in 0..10 {
        let ((), at) = db
            .write_deferred(move |c| {
                c.execute("INSERT INTO t VALUES (?1, 1)", [format!("d{i}")])
                    .map(|_| ())
            })
            .await
            .unwrap();
        commits.push(at);
    }
    assert!(
        commits.windows(2).all(|w| w[0] < w[1]),
        "commits out of order"
    );
    db.write(|c| c.execute("INSERT INTO t VALUES ('durable', 1)", []))
        .await
        .unwrap();
    let syncs = db.stats().syncs;
    for at in commits {
        db.sync_to(at).await.unwrap();
    }
    assert_eq!(db.stats().syncs, syncs, "a covered commit was synced again");
    assert_eq!(count(&db), 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_stops_the_store_in_this_process() {
    let (_dir, db) = db().await;
    let ((), at) = db
        .write_deferred(|c| c.execute("INSERT INTO t VALUES ('d', 1)", []).map(|_| ()))
        .await
        .unwrap();
    db.inner.shared.fail_sync.store(true, Ordering::Release);
    let err = db.sync_to(at).await.unwrap_err().to_string();
    assert!(
        err.contains("cannot make") && err.contains("restart"),
        "{err}"
    );
    // Nothing after it is acknowledged: not a durable write, not a deferred one, not a sync.
    let durable = db.write(|c| c.execute("INSERT INTO t VALUES ('w', 1)", []));
    assert!(durable.await.is_err());
    let deferred = db.write_deferred(|c| c.execute("INSERT INTO t VALUES ('x', 1)", []));
    assert!(deferred.await.is_err());
    assert!(db.sync().await.is_err());
    assert_eq!(count(&db), 1, "a write after the failed fsync ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_undoes_only_itself() {
    let (_dir, db) = db().await;
    // Many writes at once so they share batches; every third one fails half-way (its first
    // row written, its second refused): that write keeps nothing, the others keep theirs.
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..300 {
        let db = db.clone();
        writes.spawn(async move {
            db.write(move |c| {
                c.execute("INSERT INTO t VALUES (?1, 1)", [format!("a{i}")])?;
                let v: Option<i64> = if i % 3 == 0 { None } else { Some(2) };
                c.execute(
                    "INSERT INTO t VALUES (?1, ?2)",
                    rusqlite::params![format!("b{i}"), v],
                )
            })
            .await
        });
    }
    let out = writes.join_all().await;
    let failed = out.iter().filter(|r| r.is_err()).count();
    assert_eq!(failed, 100);
    assert_eq!(
        count(&db),
        400,
        "two rows for each of the 200 writes that succeeded"
    );
    let half: i64 = db
        .read(|c| c.query_row("SELECT count(*) FROM t WHERE k = 'a0'", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(half, 0, "a failed write's first row was undone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_one_statement_write_without_a_savepoint_undoes_only_itself() {
    let (_dir, db) = db().await;
    // Writes of one statement each (`write_with`, one statement: no savepoint), many at once so they share
    // batches; every third one inserts two rows, the second refused: SQLite backs the whole
    // statement out, its first row too, and the batch's other writes are kept.
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..300 {
        let db = db.clone();
        writes.spawn(async move {
            let v: Option<i64> = if i % 3 == 0 { None } else { Some(2) };
            db.write_with(i % 2 == 0, true, move |c| {
                c.execute(
                    "INSERT INTO t VALUES (?1, 1), (?2, ?3)",
                    rusqlite::params![format!("a{i}"), format!("b{i}"), v],
                )
            })
            .await
        });
    }
    let out = writes.join_all().await;
    let failed = out.iter().filter(|r| r.is_err()).count();
    assert_eq!(failed, 100);
    assert!(
        out.iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| e.to_string().contains("NOT NULL")),
        "each failure is its statement's own"
    );
    assert_eq!(
        count(&db),
        400,
        "two rows for each of the 200 that succeeded"
    );
    let half: i64 = db
        .read(|c| c.query_row("SELECT count(*) FROM t WHERE k = 'a0'", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(half, 0, "a failed statement's first row was backed out");
    goes_on(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_statement_write_that_panics_after_its_statement_keeps_nothing() {
    let (_dir, db) = db().await;
    // One statement each, many at once (shared batches); one panics after its statement
    // ran. Its row is never kept, and every write answered Ok is.
    let mut writes = tokio::task::JoinSet::new();
    for i in 0..200 {
        let db = db.clone();
        writes.spawn(async move {
            let out = db
                .write_with(true, true, move |c| {
                    let n = c.execute("INSERT INTO t VALUES (?1, 1)", [format!("k{i}")])?;
                    assert!(i != 100, "a bug after the statement");
                    Ok(n)
                })
                .await;
            (i, out.is_ok())
        });
    }
    let out = writes.join_all().await;
    let kept = |k: String| -> bool {
        db.read(|c| {
            c.query_row("SELECT count(*) FROM t WHERE k = ?1", [k], |r| {
                r.get::<_, i64>(0)
            })
        })
        .unwrap()
            == 1
    };
    assert!(!kept("k100".into()), "the panicking write's row was kept");
    for (i, ok) in out {
        if ok {
            assert!(kept(format!("k{i}")), "write {i} was answered Ok and lost");
        }
    }
    goes_on(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_alone_in_its_batch_that_fails_or_panics_keeps_nothing() {
    let (_dir, db) = db().await;
    // One write at a time, so each is alone in its batch (no savepoint: its transaction is
    // one). A failure half-way keeps neither row and answers the write's own error.
    let failed = db
        .write(|c| {
            c.execute("INSERT INTO t VALUES ('first', 1)", [])?;
            c.execute("INSERT INTO t VALUES ('second', NULL)", [])
        })
        .await;
    let Err(RailError::Storage(why)) = failed else {
        panic!("a failed write was answered {failed:?}");
    };
    assert!(why.contains("NOT NULL"), "not the write's own error: {why}");
    assert_eq!(count(&db), 0, "a failed write's first row stayed");
    let before = db.stats().commits;
    let panics = db
        .write(|c| -> rusqlite::Result<usize> {
            c.execute("INSERT INTO t VALUES ('half', 1)", [])?;
            panic!("a bug inside a write");
        })
        .await;
    assert!(panics.is_err());
    assert_eq!(count(&db), 0, "a panicking write's row stayed");
    assert_eq!(db.stats().commits, before, "an undone write was committed");
    goes_on(&db).await;
    assert_eq!(count(&db), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_sees_every_answered_write_and_cannot_write() {
    let (_dir, db) = db().await;
    for i in 0..20 {
        db.write(move |c| {
            c.execute(
                "INSERT INTO t VALUES (?1, ?2)",
                rusqlite::params![format!("k{i}"), i],
            )
        })
        .await
        .unwrap();
        assert_eq!(count(&db), i + 1);
    }
    let refused = db.read(|c| c.execute("DELETE FROM t", []));
    assert!(refused.is_err(), "a read connection wrote");
    assert_eq!(count(&db), 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_fails_keeps_none_of_its_batch() {
    let (_dir, db) = db().await;
    // A deferred foreign key fails at COMMIT, for the whole batch.
    db.write(|c| {
        c.execute_batch(
            "CREATE TABLE p (k TEXT PRIMARY KEY);
             CREATE TABLE ch (k TEXT REFERENCES p (k) DEFERRABLE INITIALLY DEFERRED);",
        )
    })
    .await
    .unwrap();
    let poison = db.write(|c| c.execute("INSERT INTO ch VALUES ('missing')", []));
    let clean = db.write(|c| c.execute("INSERT INTO t VALUES ('clean', 1)", []));
    let (poison, clean) = tokio::join!(poison, clean);
    assert!(poison.is_err());
    if clean.is_err() {
        assert_eq!(count(&db), 0, "a refused write was kept");
    } else {
        assert_eq!(count(&db), 1);
    }
    // The writer goes on.
    goes_on(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_file_has_one_writer_in_a_process() {
    let (dir, a) = db().await;
    let b = SqliteDb::open(&dir.path().join("t.db")).unwrap();
    assert!(
        Arc::ptr_eq(&a.inner, &b.inner),
        "a second writer on one file"
    );
    b.write(|c| c.execute("INSERT INTO t VALUES ('b', 1)", []))
        .await
        .unwrap();
    assert_eq!(count(&a), 1);
    let other = SqliteDb::open(&dir.path().join("u.db")).unwrap();
    assert!(!Arc::ptr_eq(&a.inner, &other.inner));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_panics_is_undone_and_the_writer_goes_on() {
    let (_dir, db) = db().await;
    let panics = db.write(|c| -> rusqlite::Result<usize> {
        c.execute("INSERT INTO t VALUES ('half', 1)", [])?;
        panic!("a bug inside a write");
    });
    let clean = db.write(|c| c.execute("INSERT INTO t VALUES ('clean', 1)", []));
    let (panics, clean) = tokio::join!(panics, clean);
    assert!(panics.is_err());
    clean.unwrap();
    let kept: Vec<String> = db
        .read(|c| {
            let mut st = c.prepare("SELECT k FROM t ORDER BY k")?;
            let rows = st.query_map([], |r| r.get(0))?;
            rows.collect()
        })
        .unwrap();
    assert_eq!(
        kept,
        vec!["clean".to_owned()],
        "the panicking write's row stayed"
    );
    goes_on(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_ends_the_transaction_is_refused_with_its_batch() {
    let (_dir, db) = db().await;
    // Against the contract: a write that rolls the batch's transaction back itself. Nothing
    // after it may run outside a transaction, and nothing of the batch is acknowledged.
    let rogue = db.write(|c| c.execute_batch("ROLLBACK"));
    let other = db.write(|c| c.execute("INSERT INTO t VALUES ('x', 1)", []));
    let (rogue, other) = tokio::join!(rogue, other);
    assert!(rogue.is_err());
    assert_eq!(
        count(&db) == 1,
        other.is_ok(),
        "an answer disagrees with the file"
    );
    goes_on(&db).await;
}

#[tokio::test]
async fn commits_are_copied_back_into_the_database_file_off_the_commit_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.db");
    let db = SqliteDb::open(&path).unwrap();
    // ~200 pages: far below SQLite's own checkpoint interval, so only the background
    // checkpointer copies them back.
    db.write(|c| {
        c.execute_batch("CREATE TABLE b (x BLOB)")?;
        for _ in 0..200 {
            c.execute("INSERT INTO b VALUES (zeroblob(4000))", [])?;
        }
        Ok(())
    })
    .await
    .unwrap();
    let main_len = || std::fs::metadata(&path).unwrap().len();
    assert!(main_len() < 100 * 4096, "the commit itself checkpointed");
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while main_len() < 200 * 4000 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint copied the WAL back within 5 s (the file is {} bytes)",
            main_len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let n: i64 = db
        .read(|c| c.query_row("SELECT count(*) FROM b", [], |r| r.get(0)))
        .unwrap();
    assert_eq!(n, 200);
}
