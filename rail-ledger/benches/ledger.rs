//! Criterion benchmarks of the ledger: single transfers, batched transfers, hold + post pairs
//! and journal verification, on SQLite (always) and PostgreSQL (when reachable at
//! `STIPENDEX_PG_URL` or 127.0.0.1:5432). Durable commits throughout.

#![allow(
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing
)]

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use rail_core::Asset;
use rail_ledger::{AccountId, Ledger, NewAccount, TransferId, TransferRequest};
use tokio::runtime::Runtime;

struct Setup {
    ledger: Ledger,
    accounts: Vec<AccountId>,
    _dir: tempfile::TempDir,
}

fn setup(rt: &Runtime, backend: &str) -> Option<Setup> {
    rt.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let ledger = match backend {
            "sqlite" => Ledger::sqlite(&format!("sqlite://{}/b.db", dir.path().display()))
                .await
                .ok()?,
            _ => {
                let schema = format!("bench_{:016x}", rand::random::<u64>());
                Ledger::postgres(&test_kit::localnet::postgres_url(), Some(&schema))
                    .await
                    .ok()?
            }
        };
        let bank = AccountId::random();
        let accounts: Vec<AccountId> = (0..50).map(|_| AccountId::random()).collect();
        let mut news = vec![NewAccount {
            id: bank,
            asset: Asset::usd(),
            no_overdraft: false,
        }];
        news.extend(accounts.iter().map(|id| NewAccount {
            id: *id,
            asset: Asset::usd(),
            no_overdraft: true,
        }));
        ledger.create_accounts(news).await.unwrap();
        let fund = accounts
            .iter()
            .map(|a| TransferRequest::Single {
                id: TransferId::random(),
                debit: bank,
                credit: *a,
                amount: 1 << 40,
                user_data: 0,
            })
            .collect();
        ledger.transfers(fund).await.unwrap();
        Some(Setup {
            ledger,
            accounts,
            _dir: dir,
        })
    })
}

fn transfers(s: &Setup, n: usize, salt: usize) -> Vec<TransferRequest> {
    (0..n)
        .map(|i| {
            let k = i.wrapping_mul(31).wrapping_add(salt) % s.accounts.len();
            let d = s.accounts[k];
            let c = s.accounts[(k + 1 + i % 7) % s.accounts.len()];
            TransferRequest::Single {
                id: TransferId::random(),
                debit: d,
                credit: c,
                amount: 1 + (i as u64 % 100),
                user_data: 0,
            }
        })
        .collect()
}

fn bench_backend(c: &mut Criterion, rt: &Runtime, backend: &str) {
    let Some(s) = setup(rt, backend) else {
        eprintln!("SKIPPED: {backend} benchmarks (database unreachable)");
        return;
    };
    let mut g = c.benchmark_group(format!("ledger/{backend}"));
    g.sample_size(20);
    g.throughput(Throughput::Elements(1));
    g.bench_function("transfer (1 per commit)", |b| {
        b.to_async(rt).iter_batched(
            || transfers(&s, 1, rand::random::<u32>() as usize),
            |t| s.ledger.transfers(t),
            BatchSize::SmallInput,
        );
    });
    for n in [100usize, 1000] {
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("transfers ({n} per commit)"), |b| {
            b.to_async(rt).iter_batched(
                || transfers(&s, n, rand::random::<u32>() as usize),
                |t| s.ledger.transfers(t),
                BatchSize::SmallInput,
            );
        });
    }
    g.throughput(Throughput::Elements(1));
    g.bench_function("hold + post pair", |b| {
        b.to_async(rt).iter(|| async {
            let id = TransferId::random();
            let (d, cr) = (s.accounts[0], s.accounts[1]);
            s.ledger
                .transfer(TransferRequest::Pending {
                    id,
                    debit: d,
                    credit: cr,
                    amount: 10,
                    user_data: 0,
                    timeout_ms: 60_000,
                })
                .await
                .unwrap();
            s.ledger
                .transfer(TransferRequest::Post {
                    id: TransferId::random(),
                    pending_id: id,
                    amount: 7,
                })
                .await
                .unwrap();
        });
    });
    g.finish();
    let entries = rt.block_on(s.ledger.verify_journal()).unwrap().entries;
    let mut g = c.benchmark_group(format!("ledger/{backend}/verify"));
    g.sample_size(10);
    g.throughput(Throughput::Elements(entries));
    g.bench_function(format!("verify_journal ({entries} entries)"), |b| {
        b.to_async(rt).iter(|| s.ledger.verify_journal());
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let rt = Runtime::new().unwrap();
    bench_backend(c, &rt, "sqlite");
    bench_backend(c, &rt, "postgres");
}

criterion_group!(ledger, benches);
criterion_main!(ledger);
