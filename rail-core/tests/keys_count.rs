//! `KeyStore::count` across instances: two stores opened on one SQLite file, and two on one
//! PostgreSQL database (each its own pool, as two processes would hold), counting one key at
//! once, hand out every count once — 1 to n, none twice, none lost — so a limit counted there
//! holds for a fleet, not once per instance.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    missing_docs
)]

use std::sync::Arc;
use std::time::Duration;

use rail_core::keys::KeyStore;
use rail_core::keys::sql::{PgKeyStore, SqliteKeyStore};

const PER_INSTANCE: u64 = 40;

/// `PER_INSTANCE` concurrent counts of one key on each of `instances`: every count handed out.
async fn counts_of(instances: &[Arc<dyn KeyStore>], ns: &str) -> Vec<u64> {
    let mut tasks = Vec::new();
    for store in instances {
        for _ in 0..PER_INSTANCE {
            let (store, ns) = (store.clone(), ns.to_owned());
            tasks.push(tokio::spawn(async move {
                store
                    .count(&ns, "203.0.113.7", Duration::from_secs(60))
                    .await
                    .unwrap()
            }));
        }
    }
    let mut counts = Vec::new();
    for t in tasks {
        let tally = t.await.unwrap();
        assert!(tally.left <= Duration::from_secs(60) && tally.left > Duration::from_secs(50));
        counts.push(tally.count);
    }
    counts.sort_unstable();
    counts
}

fn every_count_once(instances: usize) -> Vec<u64> {
    (1..=PER_INSTANCE * u64::try_from(instances).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sqlite_instances_count_one_window() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys.db");
    let a: Arc<dyn KeyStore> = Arc::new(SqliteKeyStore::open(&path).await.unwrap());
    let b: Arc<dyn KeyStore> = Arc::new(SqliteKeyStore::open(&path).await.unwrap());
    let ns = "costly-sqlite";
    assert_eq!(counts_of(&[a, b.clone()], ns).await, every_count_once(2));
    // The counter is an ordinary record with a retention: the purge forgets it once its window
    // has ended (not before).
    assert_eq!(b.purge_expired().await.unwrap(), 0);
    assert!(b.get(ns, "203.0.113.7").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_postgres_instances_count_one_window() {
    let url = test_kit::localnet::postgres_url();
    let connect =
        || async { tokio::time::timeout(Duration::from_secs(5), PgKeyStore::connect(&url)).await };
    let (a, b) = match (connect().await, connect().await) {
        (Ok(Ok(a)), Ok(Ok(b))) => (a, b),
        (Ok(Err(e)), _) | (_, Ok(Err(e))) => {
            return test_kit::localnet::missing("PostgreSQL", &e.to_string());
        }
        _ => return test_kit::localnet::missing("PostgreSQL", "connection timed out"),
    };
    let ns = format!("costly-pg-{:016x}", rand::random::<u64>());
    let instances: [Arc<dyn KeyStore>; 2] = [Arc::new(a), Arc::new(b)];
    assert_eq!(counts_of(&instances, &ns).await, every_count_once(2));
}
