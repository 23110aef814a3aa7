//! The key-store suite against real SQLite and PostgreSQL, and the cross-process guarantee:
//! two processes sharing one PostgreSQL never both win a key.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    missing_docs
)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rail_core::clock::{ManualClock, SystemClock, Timestamp};
use rail_core::keys::sql::{PgKeyStore, SqliteKeyStore};
use rail_core::keys::{Claim, KeyStore, ReplayGuard, suite};

async fn pg() -> Option<sqlx::PgPool> {
    let url = test_kit::localnet::postgres_url();
    match tokio::time::timeout(
        Duration::from_secs(5),
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(&url),
    )
    .await
    {
        Ok(Ok(p)) => Some(p),
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_passes_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(Timestamp(1_000_000));
    let store: Arc<dyn KeyStore> = Arc::new(
        SqliteKeyStore::open(&dir.path().join("keys.db"))
            .await
            .unwrap()
            .with_clock(Arc::new(clock.clone())),
    );
    suite::run_all(store, clock).await;
}

/// A deferred handle on the SQLite store (writes answered once committed, durable at its sync)
/// keeps every guarantee of the suite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_deferred_handle_passes_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at(Timestamp(1_000_000));
    let store = SqliteKeyStore::open(&dir.path().join("keys.db"))
        .await
        .unwrap()
        .with_clock(Arc::new(clock.clone()));
    let quick = store.deferred().expect("SQLite defers");
    suite::run_all(quick.clone(), clock).await;
    quick.sync().await.unwrap();
    assert!(store.db().stats().syncs > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_passes_the_suite() {
    let Some(pool) = pg().await else { return };
    let clock = ManualClock::at(Timestamp(1_000_000));
    let store: Arc<dyn KeyStore> = Arc::new(
        PgKeyStore::new(pool)
            .await
            .unwrap()
            .with_clock(Arc::new(clock.clone())),
    );
    suite::run_all(store, clock).await;
}

/// The production PostgreSQL store judges every lease and retention by the database's clock:
/// the times it writes are the server's, whatever the host's clock says. (Before, each caller's
/// clock was used, and a host whose clock ran ahead lapsed other hosts' live reservations.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_uses_the_database_clock() {
    let Some(pool) = pg().await else { return };
    let store = Arc::new(PgKeyStore::new(pool.clone()).await.unwrap());
    let ns = format!("dbclock-{:016x}", rand::random::<u64>());
    let guard = ReplayGuard::new(store.clone(), ns.clone());
    let Claim::Fresh(r) = guard.claim("k", Duration::from_secs(60)).await.unwrap() else {
        panic!("fresh")
    };
    let db_now: i64 =
        sqlx::query_scalar("SELECT floor(extract(epoch from clock_timestamp()) * 1000)::bigint")
            .fetch_one(&pool)
            .await
            .unwrap();
    let lease_until: i64 =
        sqlx::query_scalar("SELECT lease_until FROM rail_keys WHERE ns = $1 AND key = 'k'")
            .bind(&ns)
            .fetch_one(&pool)
            .await
            .unwrap();
    let d = lease_until - (db_now + 60_000);
    assert!(
        d.abs() < 2_000,
        "lease anchored on the database clock (off by {d} ms)"
    );
    let seen = guard.seen("k").await.unwrap().unwrap();
    assert!(
        (seen.now.millis() - db_now).abs() < 2_000,
        "reads report the database's now"
    );
    // Another host whose clock runs an hour ahead — injected here to show the old behaviour —
    // would have judged the lease lapsed; with the database's clock a second host sees it held.
    let ahead = ManualClock::at(Timestamp(db_now + 3_600_000));
    let skewed = ReplayGuard::new(
        Arc::new(
            PgKeyStore::new(pool.clone())
                .await
                .unwrap()
                .with_clock(Arc::new(ahead)),
        ),
        ns.clone(),
    );
    assert!(
        matches!(
            skewed.claim("k", Duration::from_secs(60)).await.unwrap(),
            Claim::Recover { .. }
        ),
        "an injected clock overrides the database's"
    );
    let other_host = ReplayGuard::new(store, ns);
    assert!(matches!(
        other_host
            .claim("k", Duration::from_secs(60))
            .await
            .unwrap(),
        Claim::Busy { .. }
    ));
    drop(r);
}

/// Sleeps until the wall-clock instant (Unix ms) the parent put in `var`, so that the child
/// processes of one test start at once.
async fn start_together(var: &str) {
    let start: i64 = std::env::var(var).unwrap().parse().unwrap();
    let wait = start - rail_core::Clock::now(&SystemClock).millis();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())).await;
    }
}

const RACE_KEYS: usize = 300;

/// Run as a child process by `two_processes_never_both_win_a_key`: races for every key and
/// prints the ones it won. Does nothing when run directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn race_child() {
    let Ok(ns) = std::env::var("STIPENDEX_RACE_NS") else {
        return;
    };
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(8)
        .connect(&test_kit::localnet::postgres_url())
        .await
        .unwrap();
    let store: Arc<dyn KeyStore> = Arc::new(PgKeyStore::new(pool).await.unwrap());
    let guard = ReplayGuard::new(store, ns);
    // Both children start racing at the same wall-clock instant.
    start_together("STIPENDEX_RACE_START").await;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let g = guard.clone();
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for k in 0..RACE_KEYS {
                // Half the tasks go up the list, half down: every key is contested.
                let k = if t % 2 == 0 { k } else { RACE_KEYS - 1 - k };
                if g.insert_if_absent(&format!("key-{k}"), None).await.unwrap() {
                    won.push(k);
                }
            }
            won
        }));
    }
    for t in tasks {
        for k in t.await.unwrap() {
            println!("WON key-{k}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_never_both_win_a_key() {
    let Some(_) = pg().await else { return };
    let ns = format!("race-{:016x}", rand::random::<u64>());
    let exe = std::env::current_exe().unwrap();
    let start = (rail_core::Clock::now(&SystemClock).millis() + 3_000).to_string();
    let spawn = || {
        std::process::Command::new(&exe)
            .args([
                "race_child",
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("STIPENDEX_RACE_NS", &ns)
            .env("STIPENDEX_RACE_START", &start)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let won = |c: std::process::Child| -> Vec<String> {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if std::env::var("STIPENDEX_RACE_DEBUG").is_ok() {
            println!("child stdout: {}", String::from_utf8_lossy(&out.stdout));
        }
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .filter_map(|l| l.split("WON ").nth(1).map(|k| k.trim().to_owned()))
            .collect()
    };
    let (wa, wb) = (won(a), won(b));
    let mut all = HashSet::new();
    for k in wa.iter().chain(wb.iter()) {
        assert!(all.insert(k.clone()), "{k} was won twice");
    }
    assert_eq!(all.len(), RACE_KEYS, "every key is won exactly once");
    println!(
        "process A won {}, process B won {} of {RACE_KEYS} contested keys",
        wa.len(),
        wb.len()
    );
}

/// The one store opener: every URL kind opens a store that keeps its keys (and, for SQLite,
/// keeps them across openings of the file); a URL that names no store is refused with one
/// sentence that names the accepted forms and never echoes the URL (it may carry a password).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_opener_for_every_store_url() {
    use rail_core::keys::{StoreUrl, open};
    let claim_twice = |store: Arc<dyn KeyStore>| async move {
        let guard = ReplayGuard::new(store, "opener");
        let key = format!("k-{:016x}", rand::random::<u64>());
        let Claim::Fresh(r) = guard.claim(&key, Duration::from_secs(60)).await.unwrap() else {
            panic!("a fresh key was not fresh")
        };
        r.commit(None).await.unwrap();
        key
    };
    // memory
    claim_twice(open("memory", None).await.unwrap()).await;
    // sqlite: the key is still there when the file is opened again
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("k.db").display());
    let key = claim_twice(open(&url, None).await.unwrap()).await;
    let again = ReplayGuard::new(open(&url, None).await.unwrap(), "opener");
    assert!(matches!(
        again.claim(&key, Duration::from_secs(60)).await.unwrap(),
        Claim::Finished(_)
    ));
    // postgres
    let pg_url = test_kit::localnet::postgres_url();
    if pg().await.is_some() {
        claim_twice(open(&pg_url, None).await.unwrap()).await;
    }
    // refusals
    for bad in [
        "mysql://root:hunter2@db/x",
        "sqlite:relative.db",
        "",
        "memory ",
    ] {
        assert!(StoreUrl::parse(bad).is_none(), "{bad:?} parsed");
        let Err(e) = open(bad, None).await else {
            panic!("{bad:?} opened a store")
        };
        let e = e.to_string();
        assert!(e.contains("sqlite://PATH or postgres://"), "{e}");
        assert!(!e.contains("hunter2"), "the password was echoed: {e}");
    }
    assert_eq!(
        StoreUrl::parse("postgresql://u@h/db"),
        Some(StoreUrl::Postgres("postgresql://u@h/db"))
    );
}

/// Writes 400 fresh keys at once, one in sixteen of them poisoned: the database refuses a
/// poisoned record when the transaction holding it commits. The writes share group commits,
/// so a poisoned record fails its whole batch: every write is answered by what became of its
/// batch — acknowledged only if written, refused only if not — and the clean writes that
/// shared a failed batch are refused, never acknowledged.
async fn a_batch_whose_commit_fails_acknowledges_nothing(store: Arc<dyn KeyStore>) {
    use rail_core::keys::Write;
    let ns = format!("poison-{:016x}", rand::random::<u64>());
    let mut tasks = Vec::new();
    for i in 0..400 {
        let key = if i % 16 == 7 {
            format!("poison-{i}")
        } else {
            format!("clean-{i}")
        };
        let (store, ns) = (store.clone(), ns.clone());
        tasks.push(tokio::spawn(async move {
            let w = Write::leased(1, "held", Duration::from_secs(60));
            let r = store.insert_if_absent(&ns, &key, &w).await;
            (key, r)
        }));
    }
    let (mut refused_clean, mut written) = (0, 0);
    for t in tasks {
        let (key, r) = t.await.unwrap();
        let kept = store.get(&ns, &key).await.unwrap().is_some();
        match r {
            Ok(None) => {
                assert!(kept, "{key} was acknowledged but is not in the store");
                written += 1;
            }
            Ok(Some(_)) => panic!("{key} is fresh but was found taken"),
            Err(e) => {
                assert!(!kept, "{key} was refused ({e}) but is in the store");
                if key.starts_with("clean") {
                    refused_clean += 1;
                }
            }
        }
        assert!(
            !key.starts_with("poison") || !kept,
            "{key}: a poisoned record was committed"
        );
    }
    println!("{written} written; {refused_clean} clean writes refused with a poisoned batch");
    assert!(
        refused_clean > 0,
        "no clean write shared a batch with a poisoned one: the batched path was not exercised"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_batch_whose_commit_fails_acknowledges_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pool = rail_core::keys::sql::sqlite_pool(&dir.path().join("keys.db"))
        .await
        .unwrap();
    let store = SqliteKeyStore::new(pool.clone()).await.unwrap();
    // A deferred foreign key fails at COMMIT (sqlx turns foreign keys on for every connection).
    for sql in [
        "CREATE TABLE poison_parent (k TEXT PRIMARY KEY)",
        "CREATE TABLE poison_child (k TEXT REFERENCES poison_parent (k) DEFERRABLE INITIALLY DEFERRED)",
        "CREATE TRIGGER poison AFTER INSERT ON rail_keys WHEN NEW.key LIKE 'poison%'
         BEGIN INSERT INTO poison_child VALUES ('missing'); END",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    a_batch_whose_commit_fails_acknowledges_nothing(Arc::new(store)).await;
}

/// A new schema named `<prefix>_<random>`, and a pool of the workspace's settings in it.
async fn fresh_schema(admin: &sqlx::PgPool, prefix: &str) -> (String, sqlx::PgPool) {
    let schema = format!("{prefix}_{:016x}", rand::random::<u64>());
    sqlx::query(&format!("CREATE SCHEMA {schema}"))
        .execute(admin)
        .await
        .unwrap();
    let pool =
        rail_core::keys::sql::postgres_pool(&test_kit::localnet::postgres_url(), Some(&schema))
            .await
            .unwrap();
    (schema, pool)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_batch_whose_commit_fails_acknowledges_nothing() {
    let Some(admin) = pg().await else { return };
    let (schema, pool) = fresh_schema(&admin, "poison").await;
    let store = PgKeyStore::new(pool.clone()).await.unwrap();
    // A deferred constraint trigger fails at COMMIT.
    for sql in [
        "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            IF NEW.key LIKE 'poison%' THEN RAISE EXCEPTION 'poisoned record'; END IF;
            RETURN NULL; END $$",
        "CREATE CONSTRAINT TRIGGER poison AFTER INSERT OR UPDATE ON rail_keys
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION poison()",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    a_batch_whose_commit_fails_acknowledges_nothing(Arc::new(store)).await;
    pool.close().await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&admin)
        .await
        .unwrap();
}

/// Writes a key store file at `path` as releases before the rowid layout did (sqlx's
/// connection, a `WITHOUT ROWID` table): a record in flight (`wallet`/`op-1`), a finished one
/// (`wallet`/`op-2`) and `more` finished ones (`bulk`/`k-N`).
async fn write_as_earlier_releases(path: &std::path::Path, more: usize) {
    let pool = rail_core::keys::sql::sqlite_pool(path).await.unwrap();
    for sql in [
        "CREATE TABLE IF NOT EXISTS rail_keys (
            ns TEXT NOT NULL, key TEXT NOT NULL, token INTEGER NOT NULL,
            state TEXT NOT NULL, fingerprint BLOB NOT NULL, value TEXT,
            expires_at INTEGER, lease_until INTEGER, PRIMARY KEY (ns, key)) WITHOUT ROWID",
        "CREATE INDEX IF NOT EXISTS rail_keys_expiry ON rail_keys (expires_at)",
        "INSERT INTO rail_keys VALUES ('wallet', 'op-1', 7, 'reserved', x'0102', NULL, NULL,
             32503680000000)",
        "INSERT INTO rail_keys VALUES ('wallet', 'op-2', 8, 'committed', x'', '{\"paid\":1}',
             32503680000000, NULL)",
    ] {
        sqlx::query(sql).execute(&pool).await.unwrap();
    }
    for i in 0..more {
        sqlx::query(
            "INSERT INTO rail_keys VALUES ('bulk', $1, $2, 'done', x'', $3, 32503680000000, NULL)",
        )
        .bind(format!("k-{i}"))
        .bind(i64::try_from(i).unwrap())
        .bind("v".repeat(i % 3000))
        .execute(&pool)
        .await
        .unwrap();
    }
    pool.close().await;
}

/// One of two processes opening an earlier release's file at the same instant
/// (`two_processes_opening_an_earlier_releases_file_at_once_migrate_it_once`): reads every
/// record back, then wins a key of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_child() {
    let Ok(file) = std::env::var("STIPENDEX_MIGRATE_FILE") else {
        return;
    };
    start_together("STIPENDEX_MIGRATE_START").await;
    let store = SqliteKeyStore::open(std::path::Path::new(&file))
        .await
        .unwrap();
    for i in 0..MIGRATED {
        let seen = store.get("bulk", &format!("k-{i}")).await.unwrap().unwrap();
        assert_eq!(seen.record.token, i64::try_from(i).unwrap());
        assert_eq!(seen.record.value.unwrap().len(), i % 3000);
    }
    let me = std::env::var("STIPENDEX_MIGRATE_ME").unwrap();
    let w = rail_core::keys::Write::finished(1, "done", None);
    assert!(
        store
            .insert_if_absent("mine", &me, &w)
            .await
            .unwrap()
            .is_none()
    );
}

const MIGRATED: usize = 3_000;

/// Two processes open an earlier release's file at once: one migrates it, the other waits for
/// the file's write lock and finds it done. Neither fails, every record is read back by both,
/// and the file ends with one table of every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_opening_an_earlier_releases_file_at_once_migrate_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.db");
    write_as_earlier_releases(&path, MIGRATED).await;
    let exe = std::env::current_exe().unwrap();
    let start = (rail_core::Clock::now(&SystemClock).millis() + 1_500).to_string();
    let spawn = |me: &str| {
        std::process::Command::new(&exe)
            .args([
                "migrate_child",
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("STIPENDEX_MIGRATE_FILE", &path)
            .env("STIPENDEX_MIGRATE_START", &start)
            .env("STIPENDEX_MIGRATE_ME", me)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn("a"), spawn("b"));
    for c in [a, b] {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "a process failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let pool = rail_core::keys::sql::sqlite_pool(&path).await.unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name LIKE 'rail_keys%'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(tables, ["rail_keys"]);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM rail_keys")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, i64::try_from(MIGRATED + 4).unwrap());
    pool.close().await;
}

/// A key store file written the way earlier releases wrote it (sqlx's connection, a
/// `WITHOUT ROWID` table, a record in flight and one finished) opens migrated to the rowid
/// layout: its records read back exactly, its in-flight record still blocks a second claimer,
/// and opening it again changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_store_written_by_an_earlier_release_opens_migrated_to_the_rowid_layout() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.db");
    write_as_earlier_releases(&path, 0).await;
    let store = SqliteKeyStore::open(&path).await.unwrap();
    let held = store.get("wallet", "op-1").await.unwrap().unwrap();
    assert_eq!(
        (held.record.token, held.record.state.as_str()),
        (7, "reserved")
    );
    assert_eq!(held.record.fingerprint, vec![1, 2]);
    let done = store.get("wallet", "op-2").await.unwrap().unwrap();
    assert_eq!(done.record.value.as_deref(), Some("{\"paid\":1}"));
    let w = rail_core::keys::Write::leased(9, "reserved", Duration::from_secs(30));
    let seen = store.insert_if_absent("wallet", "op-1", &w).await.unwrap();
    assert_eq!(
        seen.map(|s| s.record.token),
        Some(7),
        "the old in-flight record was taken"
    );
    drop(store);
    let layout = || async {
        let pool = rail_core::keys::sql::sqlite_pool(&path).await.unwrap();
        let wr: bool = sqlx::query_scalar(
            "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = 'rail_keys'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        let mut objects: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM sqlite_schema WHERE tbl_name LIKE 'rail_keys%' ORDER BY name",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        objects.sort();
        pool.close().await;
        (wr, objects)
    };
    let want = (
        false,
        vec![
            "rail_keys".to_owned(),
            "rail_keys_expiry".to_owned(),
            "rail_keys_key".to_owned(),
        ],
    );
    assert_eq!(
        layout().await,
        want,
        "the table has rowids and its two indexes"
    );
    let again = SqliteKeyStore::open(&path).await.unwrap();
    assert_eq!(
        again
            .get("wallet", "op-2")
            .await
            .unwrap()
            .unwrap()
            .record
            .value
            .as_deref(),
        Some("{\"paid\":1}")
    );
    drop(again);
    assert_eq!(layout().await, want, "a second open changes nothing");
}

/// A key store's connection plans its statements once, when a new store's table is small: the
/// batch's join must still look each write's row up by its key once the table has grown (it
/// hashed the whole table for every batch before, two thirds of the database's time in the
/// paid bench). The batch's shape (an `UPDATE … FROM unnest(…)` on the primary key), prepared
/// on an empty table and run on 5,000 rows, uses the primary key's index.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_plan_made_on_an_empty_table_still_uses_the_key_index_when_it_grows() {
    let Some(admin) = pg().await else { return };
    let (schema, pool) = fresh_schema(&admin, "plans").await;
    let _store = PgKeyStore::new(pool.clone()).await.unwrap();
    let mut c = pool.acquire().await.unwrap();
    for (name, want) in [
        ("plan_cache_mode", "force_generic_plan"),
        ("enable_hashjoin", "off"),
        ("enable_mergejoin", "off"),
    ] {
        let got: String = sqlx::query_scalar(&format!("SHOW {name}"))
            .fetch_one(&mut *c)
            .await
            .unwrap();
        assert_eq!(got, want, "{name}");
    }
    sqlx::query(
        "PREPARE cas(text[], text[], int8[]) AS UPDATE rail_keys k SET token = t.expect + 1
        FROM unnest($1, $2, $3) AS t(ns, key, expect)
        WHERE k.ns = t.ns AND k.key = t.key AND k.token = t.expect RETURNING k.ns",
    )
    .execute(&mut *c)
    .await
    .unwrap();
    // Planned now, on the empty table (a generic plan, kept by the connection).
    sqlx::query("EXECUTE cas('{ns}', '{none}', '{0}')")
        .execute(&mut *c)
        .await
        .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {schema}.rail_keys (ns, key, token, state, fingerprint)
        SELECT 'ns', 'key' || i, i, 'reserved', '\\x00' FROM generate_series(1, 5000) i"
    ))
    .execute(&admin)
    .await
    .unwrap();
    let plan: Vec<String> = sqlx::query_scalar("EXPLAIN EXECUTE cas('{ns}', '{key7}', '{7}')")
        .fetch_all(&mut *c)
        .await
        .unwrap();
    let plan = plan.join("\n");
    assert!(plan.contains("Index Scan"), "{plan}");
    assert!(!plan.contains("Seq Scan on rail_keys"), "{plan}");
    drop(c);
    pool.close().await;
    sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&admin)
        .await
        .unwrap();
}
