//! The `conformance` runner: `list`, `run`, `bench` and `localnet up`.
//!
//! `run --tier localnet|all` starts the workspace's localnets that the environment does not
//! name (see [`conformance_runner::localnet`]), runs the suite against them and stops them. The
//! harnesses, `cargo test` and every other tool find a localnet through environment variables,
//! and a process cannot set its own environment safely once threads run (`std::env::set_var`
//! is `unsafe`; the workspace forbids unsafe code). So the runner keeps the localnets and runs
//! the suite in a child process of its own binary, `conformance run … --no-localnets`, with the
//! localnets' variables set on that child's environment: the child sees exactly what a shell
//! that sourced `conformance localnet up --env-out FILE` would see. The parent stops the
//! localnets when the child ends, fails, or on Ctrl-C / SIGTERM / SIGHUP.

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use conformance::report::{self, Outcome, ResultRow};
use conformance::{Tier, behaviours};
use conformance_runner::localnet::{Kind, Localnets, Options, Signals};
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
        /// Start no localnet: use only those the environment names (the localnet tier of a rail
        /// without one is skipped, or failed in CI).
        #[arg(long)]
        no_localnets: bool,
        /// The repository's root, for scripts/x402 (default: the checkout this binary was
        /// built from).
        #[arg(long, value_name = "DIR")]
        repo: Option<PathBuf>,
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
        /// Also run pgledger's SQL from this checkout (github.com/pgr0ss/pgledger at c18c7d2)
        /// under the same transfer load, right after ours (PostgreSQL only).
        #[arg(long, value_name = "DIR")]
        versus_pgledger: Option<PathBuf>,
    },
    /// The `stipendex demo` scenario over a rail's localnet (start them first with
    /// `conformance localnet up`).
    Demo {
        /// The rail: ledger, account, exact-algo, stripe, ln-nwc or x402.
        #[arg(long)]
        rail: String,
        /// Keep the demo's files (keys, mandate, chains, databases) here; default: a new
        /// temporary directory, kept and printed.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The human's answer to confirmations.
        #[arg(long, value_enum, default_value = "yes")]
        confirm: Confirm,
    },
    /// The workspace's localnets, for other tools.
    Localnet {
        #[command(subcommand)]
        cmd: LocalnetCmd,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Confirm {
    Yes,
    No,
}

#[derive(Subcommand)]
enum LocalnetCmd {
    /// Start the localnets the environment does not name (algod-devnet, stripe-emulator,
    /// nwc-devnet, anvil + FiatTokenV2_2), print their variables as `export` lines and keep them
    /// running until Ctrl-C, SIGTERM or SIGHUP.
    Up {
        /// Also write the `export` lines to FILE (once all are up; removed when they stop).
        #[arg(long, value_name = "FILE")]
        env_out: Option<PathBuf>,
        /// The repository's root, for scripts/x402 (default: the checkout this binary was
        /// built from).
        #[arg(long, value_name = "DIR")]
        repo: Option<PathBuf>,
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
    if !follow_parent() {
        eprintln!("the conformance runner that started this suite is gone; not running it");
        return ExitCode::FAILURE;
    }
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
            no_localnets,
            repo,
        } => {
            if let Err(why) = check_names(&rails, &behaviours) {
                eprintln!("{why}");
                return ExitCode::FAILURE;
            }
            let kinds = if no_localnets || matches!(tier, TierArg::Mock) {
                Vec::new()
            } else {
                wanted_localnets(&rails)
            };
            if kinds.is_empty() {
                rt.block_on(run(rails, tier, behaviours, json, junit))
            } else {
                let opts = Options {
                    kinds,
                    repo: repo.unwrap_or_else(conformance_runner::localnet::default_repo),
                };
                rt.block_on(run_with_localnets(&opts))
            }
        }
        Cmd::Demo { rail, dir, confirm } => {
            match rt.block_on(conformance_runner::demo::run(
                &rail,
                dir,
                confirm == Confirm::Yes,
            )) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("conformance demo: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Localnet {
            cmd: LocalnetCmd::Up { env_out, repo },
        } => {
            let opts = Options {
                kinds: Kind::ALL.to_vec(),
                repo: repo.unwrap_or_else(conformance_runner::localnet::default_repo),
            };
            rt.block_on(localnet_up(&opts, env_out.as_deref()))
        }
        Cmd::Bench {
            rail,
            backend,
            accounts,
            clients,
            seconds,
            batch,
            versus_pgledger,
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
                versus_pgledger,
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
    let rail = behaviours::all()
        .into_iter()
        .map(|b| (b.name, b.needs, b.about));
    let ours = stipendex_conformance::all()
        .into_iter()
        .map(|b| (b.name, b.needs, b.about));
    for (name, needs, about) in rail.chain(ours) {
        println!("  {:<38} {:<15} {about}", name, format!("{needs:?}"));
    }
}

/// Every rail and behaviour named exists; otherwise a sentence saying which does not.
fn check_names(only_rails: &[String], only: &[String]) -> Result<(), String> {
    for r in only_rails {
        if rails::find(r).is_none() {
            return Err(format!("unknown rail {r:?}; `conformance list` shows them"));
        }
    }
    let known: Vec<&str> = stipendex_conformance::names()
        .iter()
        .map(|(name, _)| *name)
        .collect();
    for b in only {
        if !known.contains(&b.as_str()) {
            return Err(format!(
                "unknown behaviour {b:?}; `conformance list` shows them"
            ));
        }
    }
    Ok(())
}

/// The localnets the selected rails (all when none is named) need and the environment does not
/// name.
fn wanted_localnets(only_rails: &[String]) -> Vec<Kind> {
    let mut kinds: Vec<Kind> = rails::all()
        .iter()
        .filter(|e| only_rails.is_empty() || only_rails.iter().any(|r| r == e.name))
        .filter_map(|e| Kind::for_rail(e.name))
        .filter(|k| !k.named_by_env())
        .collect();
    kinds.dedup();
    kinds
}

/// Starts `opts.kinds`, runs this very command again as a child with `--no-localnets` and the
/// localnets' variables in its environment (see the module's documentation for why), and stops
/// them when it ends or on a signal. The exit status is the child's.
async fn run_with_localnets(opts: &Options) -> ExitCode {
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot take over Ctrl-C ({e}), so no localnet was started");
            return ExitCode::FAILURE;
        }
    };
    let nets = tokio::select! {
        nets = Localnets::start(opts) => nets,
        sig = signals.recv() => {
            eprintln!("localnet: {sig} while starting; stopped");
            return signal_exit(sig);
        }
    };
    eprint!("{}", nets.summary());
    let code = match std::env::current_exe() {
        Err(e) => {
            eprintln!("cannot find this program's own path to run the suite ({e})");
            ExitCode::FAILURE
        }
        Ok(exe) => {
            let child = tokio::process::Command::new(exe)
                .args(std::env::args_os().skip(1))
                .arg("--no-localnets")
                .envs(nets.vars().iter().map(|(k, v)| (k, v)))
                .env(PARENT_VAR, std::process::id().to_string())
                .kill_on_drop(true)
                .spawn();
            match child {
                Err(e) => {
                    eprintln!("cannot run the suite in a child process ({e})");
                    ExitCode::FAILURE
                }
                Ok(mut child) => tokio::select! {
                    status = child.wait() => match status {
                        Ok(s) => exit_code(s),
                        Err(e) => {
                            eprintln!("lost the suite's child process ({e})");
                            ExitCode::FAILURE
                        }
                    },
                    sig = signals.recv() => {
                        eprintln!("localnet: {sig}: stopping the suite and the localnets");
                        let _ = child.start_kill();
                        let _ = child.wait().await;
                        signal_exit(sig)
                    }
                },
            }
        }
    };
    nets.stop().await;
    code
}

/// The exit status for a run ended by `sig` (as a shell reports a process killed by it).
fn signal_exit(sig: &str) -> ExitCode {
    ExitCode::from(match sig {
        "SIGHUP" => 129,
        "SIGTERM" => 143,
        _ => 130,
    })
}

/// Names the runner whose suite child this process is (set by [`run_with_localnets`]).
const PARENT_VAR: &str = "STIPENDEX_CONFORMANCE_PARENT";

/// In the suite's child process: asks the kernel for SIGTERM when the runner dies (even by
/// SIGKILL, when it cannot stop its child itself), so the suite never runs on against stopped
/// localnets. The runner spawns the child from its main thread, the one the kernel watches.
/// False when the runner is already gone.
fn follow_parent() -> bool {
    let Some(want) = std::env::var_os(PARENT_VAR) else {
        return true;
    };
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM));
    let ppid = rustix::process::getppid().map(|p| p.as_raw_nonzero().get().to_string());
    ppid.is_some_and(|p| std::ffi::OsStr::new(&p) == want)
}

/// A child's exit status as ours: its code, or 128 + the signal that ended it.
fn exit_code(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(0), _) => ExitCode::SUCCESS,
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(sig)) => ExitCode::from(u8::try_from(128 + sig).unwrap_or(1)),
        (None, None) => ExitCode::FAILURE,
    }
}

/// `conformance localnet up`: starts what the environment does not name, prints the `export`
/// lines (and writes them to `env_out`), then keeps the localnets until a signal.
async fn localnet_up(opts: &Options, env_out: Option<&std::path::Path>) -> ExitCode {
    let mut signals = match Signals::new() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot take over Ctrl-C and SIGTERM ({e}), so no localnet was started");
            return ExitCode::FAILURE;
        }
    };
    let mut nets = tokio::select! {
        nets = Localnets::start(opts) => nets,
        sig = signals.recv() => {
            eprintln!("localnet: {sig} while starting; stopped");
            return signal_exit(sig);
        }
    };
    eprint!("{}", nets.summary());
    if !nets.failures().is_empty() && test_kit::localnet::in_ci() {
        eprintln!("localnet: in CI every localnet must start; stopping the others");
        nets.stop().await;
        return ExitCode::FAILURE;
    }
    let text = nets.env_text();
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        // A closed stdout (nobody reads it) is no failure: the env file, if any, still serves.
        let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    }
    if let Some(path) = env_out
        && let Err(e) = write_env_file(path, &text)
    {
        eprintln!(
            "cannot write {} ({e}); stopping the localnets",
            path.display()
        );
        nets.stop().await;
        return ExitCode::FAILURE;
    }
    eprintln!("localnet: up; Ctrl-C or SIGTERM stops them");
    let code = tokio::select! {
        sig = signals.recv() => {
            eprintln!("localnet: {sig}: stopping");
            ExitCode::SUCCESS
        }
        kind = nets.exited() => {
            eprintln!("localnet: {kind} exited on its own; stopping the others");
            ExitCode::FAILURE
        }
    };
    nets.stop().await;
    if let Some(path) = env_out {
        let _ = std::fs::remove_file(path);
    }
    code
}

/// Writes the env file whole or not at all (a script waiting for it never reads half of it).
fn write_env_file(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let header = format!(
        "# written by `conformance localnet up` (pid {}); removed when it stops\n",
        std::process::id()
    );
    std::fs::write(&tmp, format!("{header}{text}"))?;
    std::fs::rename(&tmp, path)
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
    let known: Vec<&str> = stipendex_conformance::names()
        .iter()
        .map(|(name, _)| *name)
        .collect();
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
            rows.extend(stipendex_conformance::run_rail_tier(e, *t, &only, &mut progress).await);
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
