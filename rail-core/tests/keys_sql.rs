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
use rail_core::keys::{KeyStore, ReplayGuard, suite};
use rail_core::keys_sql::{PgKeyStore, SqliteKeyStore};

async fn pg() -> Option<sqlx::PgPool> {
    let url = rail_core::localnet::postgres_url();
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
            rail_core::localnet::missing("PostgreSQL", &e.to_string());
            None
        }
        Err(_) => {
            rail_core::localnet::missing("PostgreSQL", "connection timed out");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_passes_the_suite() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn KeyStore> = Arc::new(
        SqliteKeyStore::open(&dir.path().join("keys.db"))
            .await
            .unwrap(),
    );
    suite::run_all(store, ManualClock::at(Timestamp(1_000_000))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_passes_the_suite() {
    let Some(pool) = pg().await else { return };
    let store: Arc<dyn KeyStore> = Arc::new(PgKeyStore::new(pool).await.unwrap());
    suite::run_all(store, ManualClock::at(Timestamp(1_000_000))).await;
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
        .connect(&rail_core::localnet::postgres_url())
        .await
        .unwrap();
    let store: Arc<dyn KeyStore> = Arc::new(PgKeyStore::new(pool).await.unwrap());
    let guard = ReplayGuard::new(store, Arc::new(SystemClock), ns);
    // Both children start racing at the same wall-clock instant.
    let start: i64 = std::env::var("STIPENDEX_RACE_START")
        .unwrap()
        .parse()
        .unwrap();
    let wait = start - rail_core::Clock::now(&SystemClock).millis();
    if wait > 0 {
        tokio::time::sleep(Duration::from_millis(wait.unsigned_abs())).await;
    }
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
