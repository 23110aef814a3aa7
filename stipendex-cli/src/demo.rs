//! `stipendex demo`: the end-to-end scenario ([`stipendex_app::demo`]) on the embedded ledger.

use std::path::PathBuf;
use std::process::ExitCode;

use stipendex_app::demo::{demo_dir, embedded_ledger, run_stage};

use crate::{CliError, msg};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The demo over a rail's localnet is the test runner's: `conformance demo --rail NAME`.
    #[arg(long, hide = true)]
    rail: Option<String>,
    /// Keep the demo's files (keys, mandate, chains, databases) here; default: a new
    /// temporary directory, kept and printed.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The human's answer to confirmations.
    #[arg(long, value_enum, default_value_t = Confirm::Yes)]
    confirm: Confirm,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Confirm {
    Yes,
    No,
}

/// `stipendex demo`: the scenario on the embedded ledger.
pub(crate) async fn run(args: Args) -> Result<ExitCode, CliError> {
    if let Some(rail) = &args.rail {
        return Err(msg(format!(
            "stipendex demo runs on the embedded ledger; the demo over the {rail} localnet is the test runner's: cargo run --bin conformance -- demo --rail {rail}"
        )));
    }
    let dir = demo_dir(args.dir)?;
    let stage = embedded_ledger(&dir, 10_000).await?;
    run_stage(stage, &dir, args.confirm == Confirm::Yes).await
}
