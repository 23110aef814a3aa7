//! What rail-core's payer layers cost per payment, over each key store: a payer that does
//! nothing, bare and wrapped (`Idempotent`, `SpendLimit<Idempotent>`), sequentially.
//!
//! `cargo run --release -p rail-core --features sqlite,postgres --example layer_cost`
//! (PostgreSQL at `STIPENDEX_PG_URL`, default `postgres://postgres@127.0.0.1:5432/test`).

#![allow(clippy::unwrap_used, clippy::print_stdout, missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rail_core::payer::{Budget, BudgetLimits, FindPayment, Idempotent, SpendLimit};
use rail_core::{
    Asset, Capabilities, Finality, KeyStore, MemoryKeyStore, Money, Offer, OpId, Payer, Payment,
    PaymentMode, Rail, RailId, RailResult, Timestamp,
};

struct Nothing;

impl Rail for Nothing {
    fn id(&self) -> RailId {
        RailId::new("nothing")
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::pay_only(Finality::Immediate, vec![Asset::usd()])
    }
}

#[async_trait]
impl Payer for Nothing {
    async fn pay(&self, _op: &OpId, offer: &Offer) -> RailResult<Payment> {
        Ok(Payment {
            rail: RailId::new("nothing"),
            offer_id: offer.id.clone(),
            mode: PaymentMode::Capture,
            payer: "me".into(),
            amount: offer.amount.clone(),
            proof: serde_json::Value::Null,
        })
    }
}

#[async_trait]
impl FindPayment for Nothing {
    async fn find_payment(
        &self,
        _: &OpId,
        _: &Offer,
        _: PaymentMode,
    ) -> RailResult<Option<Payment>> {
        Ok(None)
    }
}

fn offer() -> Offer {
    Offer {
        rail: RailId::new("nothing"),
        id: format!("q_{}", rand::random::<u64>()),
        amount: Money::parse(Asset::usd(), "0.01").unwrap(),
        payee: "shop".into(),
        mode: PaymentMode::Capture,
        expires_at: Timestamp(i64::MAX),
        details: serde_json::Value::Null,
    }
}

async fn time(name: &str, store: &str, n: u32, payer: &dyn Payer) {
    let started = Instant::now();
    for _ in 0..n {
        payer.pay(&OpId::random(), &offer()).await.unwrap();
    }
    let ns = (started.elapsed() / n).as_nanos();
    println!(
        "{store:<10} {name:<28} {:>6}.{} µs/payment",
        ns / 1000,
        (ns % 1000) / 100
    );
}

async fn run(label: &str, store: Arc<dyn KeyStore>, n: u32) {
    time("bare payer", label, n, &Nothing).await;
    time(
        "Idempotent",
        label,
        n,
        &Idempotent::new(Nothing, store.clone()),
    )
    .await;
    let limits = BudgetLimits {
        per_payment: None,
        per_period: Some((
            Duration::from_secs(24 * 3600),
            Money::parse(Asset::usd(), "1000000").unwrap(),
        )),
        total: None,
    };
    let scope = format!("bench-{}", rand::random::<u64>());
    let budget = Budget::new(store.clone(), scope, limits).unwrap();
    let layered = SpendLimit::new(Idempotent::new(Nothing, store), budget);
    time("SpendLimit<Idempotent>", label, n, &layered).await;
}

#[tokio::main]
async fn main() {
    run("memory", Arc::new(MemoryKeyStore::default()), 20_000).await;
    let dir = tempfile::tempdir().unwrap();
    let sqlite = rail_core::keys::sql::SqliteKeyStore::open(&dir.path().join("k.db"))
        .await
        .unwrap();
    run("sqlite", Arc::new(sqlite), 500).await;
    let url = test_kit::localnet::postgres_url();
    match sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
    {
        Ok(pool) => {
            let pg = rail_core::keys::sql::PgKeyStore::new(pool).await.unwrap();
            run("postgres", Arc::new(pg), 2_000).await;
        }
        Err(e) => println!("postgres   skipped: {e}"),
    }
}
