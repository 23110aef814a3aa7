//! `conformance bench ledger`: a closed-loop load on the ledger, printing transfers/s,
//! hold+capture pairs/s, p50 and p99 latency.
//!
//! `clients` tasks each keep one request in flight (a request carries `batch` transfers, 1 by
//! default, as a payment API would); the ledger's batcher gathers whatever is in flight into one
//! commit. Durable commits throughout (PostgreSQL's `synchronous_commit` as the server has it,
//! SQLite WAL with `synchronous = FULL`).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rail_core::Asset;
use rail_ledger::{
    AccountId, Ledger, LedgerError, NewAccount, TransferError, TransferId, TransferRequest,
};
use stipendex_app::measure::Ms;

use crate::bench_common::gather;
pub use crate::bench_common::{BenchConfig, Phase};

/// Opens the ledger a benchmark runs against.
///
/// # Errors
/// When the backend is unknown or unreachable.
pub async fn open(backend: &str, dir: &std::path::Path) -> Result<Ledger, String> {
    match backend {
        "sqlite" => Ledger::sqlite(&format!("sqlite://{}/bench.db", dir.display()))
            .await
            .map_err(|e| e.to_string()),
        "postgres" => {
            let schema = format!("bench_{:016x}", rand::random::<u64>());
            Ledger::postgres(&test_kit::localnet::postgres_url(), Some(&schema))
                .await
                .map_err(|e| e.to_string())
        }
        other => Err(format!("unknown backend {other:?} (sqlite or postgres)")),
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Transfers,
    HoldCapture,
}

async fn phase(
    ledger: &Ledger,
    accounts: &Arc<Vec<AccountId>>,
    cfg: &BenchConfig,
    kind: Kind,
) -> Phase {
    let deadline = Instant::now() + Duration::from_secs(cfg.seconds);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..cfg.clients {
        let ledger = ledger.clone();
        let accounts = accounts.clone();
        let batch = cfg.batch.max(1);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let (mut ops, mut refused) = (0u64, 0u64);
            let mut n = c.wrapping_mul(7919);
            // Indices are reduced modulo the length: always in range.
            #[allow(clippy::indexing_slicing)]
            let pick = |n: &mut usize| {
                let (d, c, amount) = crate::bench_common::pick(n, accounts.len());
                (accounts[d], accounts[c], amount)
            };
            while Instant::now() < deadline {
                let t0 = Instant::now();
                match kind {
                    Kind::Transfers => {
                        let reqs: Vec<TransferRequest> = (0..batch)
                            .map(|_| {
                                let (debit, credit, amount) = pick(&mut n);
                                TransferRequest::Single {
                                    id: TransferId::random(),
                                    debit,
                                    credit,
                                    amount,
                                    user_data: 0,
                                }
                            })
                            .collect();
                        match ledger.transfers(reqs).await {
                            Ok(rs) => {
                                for r in rs {
                                    if r.is_ok() { ops += 1 } else { refused += 1 }
                                }
                            }
                            Err(_) => refused += batch as u64,
                        }
                    }
                    Kind::HoldCapture => {
                        let holds: Vec<(TransferId, TransferRequest)> = (0..batch)
                            .map(|_| {
                                let (debit, credit, amount) = pick(&mut n);
                                let id = TransferId::random();
                                (
                                    id,
                                    TransferRequest::Pending {
                                        id,
                                        debit,
                                        credit,
                                        amount,
                                        user_data: 0,
                                        timeout_ms: 60_000,
                                    },
                                )
                            })
                            .collect();
                        let ids: Vec<TransferId> = holds.iter().map(|(id, _)| *id).collect();
                        let Ok(rs) = ledger
                            .transfers(holds.into_iter().map(|(_, r)| r).collect())
                            .await
                        else {
                            refused += batch as u64;
                            continue;
                        };
                        let posts: Vec<TransferRequest> = ids
                            .iter()
                            .zip(rs)
                            .filter_map(|(id, r)| {
                                let t = r.ok()?;
                                Some(TransferRequest::Post {
                                    id: TransferId::random(),
                                    pending_id: *id,
                                    amount: t.transfer().amount,
                                })
                            })
                            .collect();
                        refused += (batch - posts.len()) as u64;
                        match ledger.transfers(posts).await {
                            Ok(rs) => ops += rs.iter().filter(|r| r.is_ok()).count() as u64,
                            Err(_) => refused += batch as u64,
                        }
                    }
                }
                lat.push(u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            (ops, refused, lat)
        }));
    }
    gather(tasks, start).await
}

/// Runs both phases and returns the printed report.
///
/// # Errors
/// When the ledger cannot be opened or set up.
pub async fn run(cfg: &BenchConfig) -> Result<String, String> {
    if cfg.accounts < 2 || cfg.clients == 0 {
        return Err("need at least 2 accounts and 1 client".into());
    }
    if cfg.versus_pgledger.is_some() && cfg.backend != "postgres" {
        return Err("--versus-pgledger compares on PostgreSQL: add --backend postgres".into());
    }
    // Read before anything runs: a wrong path is said at once.
    let pgledger = cfg
        .versus_pgledger
        .as_deref()
        .map(crate::pgledger::read_sql)
        .transpose()?;
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let ledger = open(&cfg.backend, dir.path()).await?;
    let bank = AccountId::random();
    let mut news = vec![NewAccount {
        id: bank,
        asset: Asset::usd(),
        no_overdraft: false,
    }];
    let accounts: Vec<AccountId> = (0..cfg.accounts).map(|_| AccountId::random()).collect();
    news.extend(accounts.iter().map(|id| NewAccount {
        id: *id,
        asset: Asset::usd(),
        no_overdraft: true,
    }));
    for r in ledger
        .create_accounts(news)
        .await
        .map_err(|e| e.to_string())?
    {
        r.map_err(|e: TransferError| e.to_string())?;
    }
    let funding: Vec<TransferRequest> = accounts
        .iter()
        .map(|a| TransferRequest::Single {
            id: TransferId::random(),
            debit: bank,
            credit: *a,
            amount: 1_000_000_000,
            user_data: 0,
        })
        .collect();
    ledger
        .transfers(funding)
        .await
        .map_err(|e: LedgerError| e.to_string())?;
    let accounts = Arc::new(accounts);
    let t = phase(&ledger, &accounts, cfg, Kind::Transfers).await;
    let versus = match &pgledger {
        Some(sql) => Some(crate::pgledger::transfers(sql, cfg).await?),
        None => None,
    };
    let h = phase(&ledger, &accounts, cfg, Kind::HoldCapture).await;
    let report = ledger.verify_journal().await.map_err(|e| e.to_string())?;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "ledger bench: backend={} accounts={} clients={} batch={} seconds={} (durable commits)",
        cfg.backend, cfg.accounts, cfg.clients, cfg.batch, cfg.seconds
    );
    let _ = writeln!(
        out,
        "transfers:         {:>8}/s  ({} ok, {} refused)  p50 {} ms  p99 {} ms",
        t.per_sec,
        t.ops,
        t.refused,
        Ms(t.p50_us),
        Ms(t.p99_us)
    );
    if let Some(v) = &versus {
        let _ = writeln!(
            out,
            "pgledger transfers:{:>8}/s  ({} ok, {} refused)  p50 {} ms  p99 {} ms  (ledger = {}.{}x pgledger)",
            v.per_sec,
            v.ops,
            v.refused,
            Ms(v.p50_us),
            Ms(v.p99_us),
            t.per_sec * 10 / v.per_sec.max(1) / 10,
            t.per_sec * 10 / v.per_sec.max(1) % 10,
        );
    }
    let _ = writeln!(
        out,
        "hold+capture pairs:{:>8}/s  ({} ok, {} refused)  p50 {} ms  p99 {} ms",
        h.per_sec,
        h.ops,
        h.refused,
        Ms(h.p50_us),
        Ms(h.p99_us)
    );
    let _ = writeln!(
        out,
        "journal: {} entries, {} accounts, {}",
        report.entries,
        report.accounts,
        if report.is_intact() {
            "intact".to_owned()
        } else {
            format!("{} PROBLEMS", report.problems.len())
        }
    );
    Ok(out)
}
