//! `stipendex wallet pending | resume`: the payments the wallet started and has not finished.
//!
//! A payment whose outcome was unknown, or that its rail holds for review (`pending_review` at
//! the hosted facilitator), stays pending in the wallet's journal, counted against the limits,
//! without a Proof. `pending` lists them; `resume CHAIN` asks the rail again under the same
//! operation and signs the Proof once (the chain is journaled). `stipendex fetch` of the same
//! request resumes it too.

use std::path::PathBuf;
use std::process::ExitCode;

use stipendex::envelope::{Quote, Signed};
use stipendex::wallet::Pending;

use crate::{CliError, msg};

/// `stipendex wallet …`.
#[derive(clap::Subcommand)]
pub(crate) enum Command {
    /// Lists the payments started and not finished (outcome unknown, or held for review):
    /// counted against the limits, without a Proof yet.
    Pending {
        /// The wallet's configuration (as for `stipendex fetch`; its journal on).
        #[arg(long, default_value = "wallet.toml")]
        config: PathBuf,
    },
    /// Finishes a pending payment: asks its rail again under the same operation, signs its
    /// Proof once and journals the chain. Still pending, it says so and stays pending.
    Resume {
        /// The wallet's configuration (as for `stipendex fetch`; its journal on).
        #[arg(long, default_value = "wallet.toml")]
        config: PathBuf,
        /// The payment's chain, as `stipendex wallet pending` lists it.
        chain: String,
    },
}

/// Runs `stipendex wallet …`.
///
/// # Errors
/// A configuration that does not load, no such pending payment, or the rail's answer.
#[allow(clippy::print_stdout)]
pub(crate) async fn run(c: Command) -> Result<ExitCode, CliError> {
    match c {
        Command::Pending { config } => {
            let wallet = journaled(&config).await?;
            let pending = wallet.pending().await?;
            let unanswered = wallet.unanswered().await?;
            if pending.is_empty() && unanswered.is_empty() {
                println!("no pending payments");
            }
            for p in &pending {
                println!("{}", line(p));
            }
            for p in &unanswered {
                println!(
                    "{}  paid, its answer not received: asking the same request again presents its Proof",
                    line(p)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Resume { config, chain } => {
            let wallet = journaled(&config).await?;
            let paid = wallet.resume(&chain).await.map_err(|e| match e.code() {
                "in_progress" => msg(format!(
                    "payment {chain} is being made now by another call that is still running: it finishes it; resume it once that call has ended (a payment whose process has ended is taken over at once)"
                )),
                "pending_review" | "unavailable" => msg(format!(
                    "payment {chain} is still pending ({}): {e}; resume it again later",
                    e.code()
                )),
                _ => msg(format!("payment {chain} not finished ({}): {e}", e.code())),
            })?;
            let p = paid.proof.object();
            let unanswered = wallet.unanswered().await?.iter().any(|u| u.chain == chain);
            println!(
                "paid: {chain}, {} {} over {}, proof {}{}",
                p.amount,
                p.asset,
                paid.rail,
                p.id,
                if unanswered {
                    "; its answer not received yet: asking the same request again presents this Proof"
                } else {
                    ""
                }
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The wallet of `config`, which must keep a journal (pending payments live there).
async fn journaled(config: &std::path::Path) -> Result<stipendex::wallet::Wallet, CliError> {
    let loaded = crate::wallet_config::load(config).await?;
    if loaded.journal.is_none() {
        return Err(msg(format!(
            "{}: [wallet] journal = false, so no payment is kept pending across runs: remove it (the journal defaults to \"{}\")",
            config.display(),
            crate::wallet_config::DEFAULT_JOURNAL
        )));
    }
    Ok(loaded.wallet)
}

/// `CHAIN  RECEIVER  AMOUNT ASSET  rail NAME  since RFC3339  [METHOD URL]` (the time in UTC).
fn line(p: &Pending) -> String {
    let (receiver, amount) = match Signed::<Quote>::parse(&p.quote) {
        Ok(q) => {
            let o = q.object();
            let amount = o
                .max()
                .map(|m| format!("{} {}", m.amount(), m.asset()))
                .unwrap_or_else(|_| "?".into());
            (o.receiver.id.clone(), amount)
        }
        Err(_) => ("?".into(), "?".into()),
    };
    let request = p.resource.as_ref().map_or(String::new(), |r| {
        let query = r.query.as_ref().map_or(String::new(), |q| format!("?{q}"));
        format!("  {} {}{}{query}", r.method, r.origin, r.path)
    });
    format!(
        "{}  {}  {}  rail {}  since {}{request}",
        p.chain,
        stipendex::wallet::printable(&receiver),
        amount,
        p.rail,
        rail_core::clock::rfc3339(p.since)
    )
}
