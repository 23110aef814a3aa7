//! The `conformance` runner: `list`, `run` and `bench`.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use conformance::report::{self, Outcome, ResultRow};
use conformance::{Tier, behaviours};
use conformance_runner::rails;
use indicatif::{ProgressBar, ProgressStyle};

#[derive(Parser)]
#[command(
    name = "conformance",
    about = "Run the Stipendex rails behaviour suite",
    version
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum TierArg {
    Mock,
    Localnet,
    All,
}

#[derive(Subcommand)]
enum Cmd {
    /// List the rails, their tiers and the behaviours.
    List,
    /// Run behaviours and print the matrix (exit status 1 on any failure).
    Run {
        /// Rails to run (repeatable); all by default.
        #[arg(long = "rail")]
        rails: Vec<String>,
        /// Which tier: mock (in-process), localnet (real servers) or all.
        #[arg(long, value_enum, default_value = "mock")]
        tier: TierArg,
        /// Only these behaviours (repeatable).
        #[arg(long = "behaviour")]
        behaviours: Vec<String>,
        /// Write the JSON report here.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Write a JUnit XML report here.
        #[arg(long)]
        junit: Option<std::path::PathBuf>,
    },
    /// Load-test a rail's backend.
    Bench {
        /// The rail (only `ledger` so far).
        rail: String,
        /// `sqlite` or `postgres`.
        #[arg(long, default_value = "sqlite")]
        backend: String,
        /// Accounts the load moves money between.
        #[arg(long, default_value_t = 50)]
        accounts: usize,
        /// Concurrent clients, one request in flight each.
        #[arg(long, default_value_t = 20)]
        clients: usize,
        /// Seconds per phase (transfers, then hold+capture).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Transfers per client request.
        #[arg(long, default_value_t = 1)]
        batch: usize,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        // nostr's relay pool logs every connection a torn-down harness closes as an error.
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                "error,nostr_relay_pool=off,nostr_sdk=off,nostr_relay_builder=off".into()
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cli.cmd {
        Cmd::List => {
            list();
            ExitCode::SUCCESS
        }
        Cmd::Run {
            rails,
            tier,
            behaviours,
            json,
            junit,
        } => rt.block_on(run(rails, tier, behaviours, json, junit)),
        Cmd::Bench {
            rail,
            backend,
            accounts,
            clients,
            seconds,
            batch,
        } => {
            if rail != "ledger" {
                eprintln!("no benchmark for rail {rail:?} (only ledger)");
                return ExitCode::FAILURE;
            }
            let cfg = conformance_runner::bench::BenchConfig {
                backend,
                accounts,
                clients,
                seconds,
                batch,
            };
            match rt.block_on(conformance_runner::bench::run(&cfg)) {
                Ok(out) => {
                    print!("{out}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("bench failed: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn list() {
    println!("rails:");
    for r in rails::all() {
        for (tier, what) in r.tiers {
            println!("  {:<10} {:<9} {what}", r.name, tier.as_str());
        }
    }
    println!("\nbehaviours:");
    for b in behaviours::all() {
        println!(
            "  {:<38} {:<15} {}",
            b.name,
            format!("{:?}", b.needs),
            b.about
        );
    }
}

async fn run(
    only_rails: Vec<String>,
    tier: TierArg,
    only: Vec<String>,
    json: Option<std::path::PathBuf>,
    junit: Option<std::path::PathBuf>,
) -> ExitCode {
    let entries: Vec<_> = rails::all()
        .into_iter()
        .filter(|e| only_rails.is_empty() || only_rails.iter().any(|r| r == e.name))
        .collect();
    for r in &only_rails {
        if rails::find(r).is_none() {
            eprintln!("unknown rail {r:?}; `conformance list` shows them");
            return ExitCode::FAILURE;
        }
    }
    let known: Vec<&str> = behaviours::all().iter().map(|b| b.name).collect();
    for b in &only {
        if !known.contains(&b.as_str()) {
            eprintln!("unknown behaviour {b:?}; `conformance list` shows them");
            return ExitCode::FAILURE;
        }
    }
    let tiers = match tier {
        TierArg::Mock => vec![Tier::Mock],
        TierArg::Localnet => vec![Tier::Localnet],
        TierArg::All => vec![Tier::Mock, Tier::Localnet],
    };
    let per = if only.is_empty() {
        known.len()
    } else {
        only.len()
    };
    let total = u64::try_from(entries.len() * tiers.len() * per).unwrap_or(0);
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("{bar:40.cyan/blue} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut rows: Vec<ResultRow> = Vec::new();
    for e in &entries {
        for t in &tiers {
            let mut progress = |r: &ResultRow| {
                bar.inc(1);
                bar.set_message(format!("{}/{} {}", r.rail, r.tier, r.behaviour));
                if r.outcome == Outcome::Fail {
                    bar.println(format!(
                        "FAIL {}/{} {}: {}",
                        r.rail, r.tier, r.behaviour, r.detail
                    ));
                }
            };
            rows.extend(report::run_rail_tier(e, *t, &only, &mut progress).await);
        }
    }
    bar.finish_and_clear();
    print!("{}", report::matrix(&rows));
    if let Some(p) = json {
        match report::json(&rows) {
            Ok(s) => {
                if let Err(e) = std::fs::write(&p, s) {
                    eprintln!("cannot write {}: {e}", p.display());
                    return ExitCode::FAILURE;
                }
            }
            Err(e) => {
                eprintln!("cannot encode the JSON report: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if let Some(p) = junit
        && let Err(e) = std::fs::write(&p, report::junit(&rows))
    {
        eprintln!("cannot write {}: {e}", p.display());
        return ExitCode::FAILURE;
    }
    let (_, failed, _) = report::counts(&rows);
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
