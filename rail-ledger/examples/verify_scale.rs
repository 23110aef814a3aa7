//! Journal verification at scale: builds (or reuses) a large journal, then runs
//! `verify_journal` over it and prints entries verified per second and the peak resident memory
//! of the verification (`VmHWM`, reset just before it through `/proc/self/clear_refs`).
//!
//! A local measurement, not a test:
//!
//! ```text
//! cargo run --release -p rail-ledger --example verify_scale -- \
//!     --backend sqlite --db /var/tmp/journal-10m.db --entries 10000000
//! cargo run --release -p rail-ledger --example verify_scale -- \
//!     --backend postgres --schema verify_scale_10m --entries 10000000
//! ```
//!
//! The journal: `--accounts` accounts, transfers between them in requests of 4096 (one commit
//! each), and every `--hold-every`th request a hold, posted in the next request (so holds stay
//! in the verifier's state). An existing journal with enough entries is reused as it is
//! (`--verify-only` refuses to build). PostgreSQL: `STIPENDEX_PG_URL` or the local default.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::time::Instant;

use rail_core::Asset;
use rail_ledger::{AccountId, Ledger, NewAccount, TransferId, TransferRequest};

struct Args {
    backend: String,
    db: String,
    schema: String,
    entries: u64,
    accounts: usize,
    hold_every: u64,
    verify_only: bool,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        backend: "sqlite".into(),
        db: "/var/tmp/stipendex-verify-scale.db".into(),
        schema: "verify_scale".into(),
        entries: 1_000_000,
        accounts: 1_000,
        hold_every: 100,
        verify_only: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--backend" => a.backend = val()?,
            "--db" => a.db = val()?,
            "--schema" => a.schema = val()?,
            "--entries" => a.entries = val()?.parse().map_err(|e| format!("--entries: {e}"))?,
            "--accounts" => {
                a.accounts = val()?.parse().map_err(|e| format!("--accounts: {e}"))?;
            }
            "--hold-every" => {
                a.hold_every = val()?.parse().map_err(|e| format!("--hold-every: {e}"))?;
            }
            "--verify-only" => a.verify_only = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if a.accounts < 2 {
        return Err("--accounts must be at least 2".into());
    }
    Ok(a)
}

/// A `/proc/self/status` field in kB.
fn status_kb(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

const BATCH: usize = 4096;

async fn build(ledger: &Ledger, have: u64, args: &Args) -> Result<(), String> {
    let accounts: Vec<AccountId> = (0..args.accounts).map(|_| AccountId::random()).collect();
    let news = accounts
        .iter()
        .map(|id| NewAccount {
            id: *id,
            asset: Asset::usd(),
            no_overdraft: false,
        })
        .collect();
    for r in ledger
        .create_accounts(news)
        .await
        .map_err(|e| e.to_string())?
    {
        r.map_err(|e| e.to_string())?;
    }
    let started = Instant::now();
    let mut written = have;
    let mut open_holds: Vec<(TransferId, u64)> = Vec::new();
    let mut n: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut request = 0u64;
    while written < args.entries {
        request += 1;
        let mut reqs = Vec::with_capacity(BATCH);
        for (id, amount) in open_holds.drain(..) {
            reqs.push(TransferRequest::Post {
                id: TransferId::random(),
                pending_id: id,
                amount,
            });
        }
        let hold = args.hold_every > 0 && request.is_multiple_of(args.hold_every);
        while reqs.len() < BATCH {
            n = n
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let len = accounts.len() as u64;
            let d = (n >> 33) % len;
            let c = (d + 1 + (n >> 17) % (len - 1)) % len;
            let (Some(debit), Some(credit)) = (
                accounts.get(usize::try_from(d).unwrap_or(0)),
                accounts.get(usize::try_from(c).unwrap_or(0)),
            ) else {
                return Err("account index out of range".into());
            };
            let amount = 1 + (n >> 7) % 1000;
            let id = TransferId::random();
            if hold && reqs.len().is_multiple_of(8) {
                open_holds.push((id, amount));
                reqs.push(TransferRequest::Pending {
                    id,
                    debit: *debit,
                    credit: *credit,
                    amount,
                    user_data: 0,
                    timeout_ms: 86_400_000,
                });
            } else {
                reqs.push(TransferRequest::Single {
                    id,
                    debit: *debit,
                    credit: *credit,
                    amount,
                    user_data: 0,
                });
            }
        }
        for r in ledger.transfers(reqs).await.map_err(|e| e.to_string())? {
            r.map_err(|e| e.to_string())?;
        }
        written += BATCH as u64;
        if request.is_multiple_of(250) {
            let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            eprintln!(
                "built {written} entries ({}/s)",
                (written - have) * 1000 / ms.max(1)
            );
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = parse()?;
    let ledger = match args.backend.as_str() {
        "sqlite" => Ledger::sqlite(&format!("sqlite://{}", args.db)).await,
        "postgres" => {
            Ledger::postgres(&test_kit::localnet::postgres_url(), Some(&args.schema)).await
        }
        other => return Err(format!("unknown backend {other:?}")),
    }
    .map_err(|e| e.to_string())?;
    // How many entries there are: a verification of an empty or small journal is quick.
    let have = if args.verify_only {
        0
    } else {
        let t = Instant::now();
        let r = ledger.verify_journal().await.map_err(|e| e.to_string())?;
        eprintln!(
            "existing journal: {} entries ({} ms to count)",
            r.entries,
            t.elapsed().as_millis()
        );
        r.entries
    };
    if !args.verify_only && have < args.entries {
        build(&ledger, have, &args).await?;
    }
    // Measure the verification alone: reset the peak RSS, then verify.
    let rss_before = status_kb("VmRSS:");
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        eprintln!("cannot reset the peak RSS ({e}); VmHWM covers the build too");
    }
    // VmHWM counts file pages mapped in too (SQLite maps up to 256 MiB of its file); a
    // sampler keeps the peak of the anonymous part (heap: rows, verifier state) apart.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = (0u64, 0u64);
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak.0 = peak.0.max(status_kb("RssAnon:").unwrap_or(0));
                peak.1 = peak.1.max(status_kb("RssFile:").unwrap_or(0));
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            peak
        })
    };
    let anon_before = status_kb("RssAnon:");
    let started = Instant::now();
    let report = ledger.verify_journal().await.map_err(|e| e.to_string())?;
    let ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let peak = status_kb("VmHWM:");
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let (anon_peak, file_peak) = sampler.join().unwrap_or((0, 0));
    println!(
        "verify_journal ({}): {} entries, {} accounts in {ms} ms = {} entries/s; {}",
        args.backend,
        report.entries,
        report.accounts,
        report.entries * 1000 / ms.max(1),
        if report.is_intact() {
            "intact".to_owned()
        } else {
            format!("{} problems: {:?}", report.problems.len(), report.problems)
        }
    );
    println!(
        "memory: VmRSS before {} MiB, peak (VmHWM) during verification {} MiB; anonymous \
         (heap) {} MiB before, peak {} MiB; file-backed peak {} MiB (sampled every 20 ms)",
        rss_before.map_or(0, |k| k / 1024),
        peak.map_or(0, |k| k / 1024),
        anon_before.map_or(0, |k| k / 1024),
        anon_peak / 1024,
        file_peak / 1024
    );
    Ok(())
}
