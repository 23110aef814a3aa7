//! The SQL key stores under concurrent load: `CLIENTS` tasks, each recording a key and then
//! finishing it (an insert, then a compare-and-set: the records a paid call writes) in a closed
//! loop for `SECONDS`; durable writes per second and each write's p50/p99. This measures the
//! group commit alone, without the layers above it.
//!
//! `cargo run --profile profiling -p rail-core --features sqlite,postgres --example
//! key_store_load -- [sqlite|postgres] [CLIENTS] [SECONDS]` (PostgreSQL at `STIPENDEX_PG_URL`,
//! default `postgres://postgres@127.0.0.1:5432/test`, in a fresh schema dropped at the end).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    clippy::cast_precision_loss,
    clippy::float_arithmetic,
    missing_docs
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use rail_core::KeyStore;
use rail_core::keys::Write;
use rail_core::keys::sql::{PgKeyStore, SqliteKeyStore, postgres_pool, sqlite_pool};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let backend = args.get(1).map_or("sqlite", String::as_str).to_owned();
    let clients: usize = args.get(2).map_or(64, |s| s.parse().expect("CLIENTS"));
    let seconds: u64 = args.get(3).map_or(5, |s| s.parse().expect("SECONDS"));
    let dir = tempfile::tempdir().unwrap();
    let url = std::env::var("STIPENDEX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
    let schema = format!("key_store_load_{:08x}", rand::random::<u32>());
    let store: Arc<dyn KeyStore> = match backend.as_str() {
        "sqlite" => Arc::new(
            SqliteKeyStore::new(sqlite_pool(&dir.path().join("keys.db")).await.unwrap())
                .await
                .unwrap(),
        ),
        "postgres" => {
            let admin = postgres_pool(&url, None).await.unwrap();
            sqlx::query(&format!("CREATE SCHEMA {schema}"))
                .execute(&admin)
                .await
                .unwrap();
            Arc::new(
                PgKeyStore::new(postgres_pool(&url, Some(&schema)).await.unwrap())
                    .await
                    .unwrap(),
            )
        }
        other => panic!("unknown backend {other}: sqlite or postgres"),
    };
    let until = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut n = 0u64;
            while Instant::now() < until {
                let key = format!("c{c}-{n}");
                n += 1;
                let token = rand::random::<i64>();
                let t = Instant::now();
                let held = Write::leased(token, "reserved", Duration::from_secs(30));
                assert!(
                    store
                        .insert_if_absent("load", &key, &held)
                        .await
                        .unwrap()
                        .is_none()
                );
                lat.push(t.elapsed());
                let t = Instant::now();
                let done = Write::finished(token, "done", Some(Duration::from_secs(3_600)));
                assert!(store.replace("load", &key, token, &done).await.unwrap());
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    lat.sort_unstable();
    let at = |q: usize| {
        lat.get(lat.len().saturating_sub(1) * q / 100)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    println!(
        "{backend}, {clients} clients, {seconds} s: {:.0} writes/s, p50 {:.2} ms, p99 {:.2} ms",
        lat.len() as f64 / seconds as f64,
        at(50),
        at(99)
    );
    if backend == "postgres" {
        let admin = postgres_pool(&url, None).await.unwrap();
        sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&admin)
            .await
            .unwrap();
    }
}
