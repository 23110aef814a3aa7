//! `stipendex`: the end-to-end demo, the audit-chain verifier, mandates and keys.
//!
//! ```text
//! stipendex demo [--rail NAME] [--dir DIR] [--confirm yes|no]
//! stipendex verify-chain --principal-pubkey KEY | --unanchored [--revocation FILE]… FILE…
//! stipendex fetch [--config wallet.toml] [-X METHOD] [-H 'Name: value'] [-d DATA] URL
//! stipendex serve-mcp --config shop.toml [--listen ADDR]
//! stipendex gateway --config gateway.toml [--listen ADDR]
//! stipendex proxy [--config wallet.toml] [--server ORIGIN] (--url URL | -- COMMAND…)
//! stipendex wallet pending [--config wallet.toml]
//! stipendex wallet resume [--config wallet.toml] CHAIN
//! stipendex init DIR --upstream URL [--listen ADDR] [--principal-key FILE]
//! stipendex ledger account new|fund|balance|history (--config FILE | --ledger URL) [--account ID]
//! stipendex key new --out FILE
//! stipendex mandate new --principal-key FILE --wallet-pubkey KEY [limits, allowlist…] --out FILE [--force]
//! stipendex mandate sign --key FILE MANDATE.json --out MANDATE.jws [--force]
//! stipendex mandate show MANDATE.jws
//! stipendex mandate revoke --key FILE MANDATE.jws [--store sqlite://wallet.db] [--out FILE] [--force]
//! stipendex facilitator serve|account|review …   (see `facilitator`)
//! ```
//!
//! Every failure is one sentence on standard error and a non-zero exit.
//!
//! The binary is [`main`]: commands and one config loader. What the test runner shares with it
//! (the demo's scenario, the benches' measures, chain verification, the files the commands
//! write) is `stipendex-app`, so that the runner does not depend on this crate.

mod bench;
mod bench_common;
mod bench_gateway;
mod bench_mcp;
mod bench_tab;
mod checks;
#[cfg(test)]
mod config_reference;
mod demo;
mod facilitator;
mod fetch;
mod gateway;
mod init;
mod ledger;
mod mandate;
mod proxy;
mod serve_mcp;
mod upkeep;
mod wallet;
mod wallet_config;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use stipendex_app::{Error as CliError, msg};
// The modules the commands share with the test runner, under their old names.
use stipendex_app::{files, measure, verify};

#[derive(Parser)]
#[command(
    name = "stipendex",
    version,
    about = "Stipendex: agents pay under a mandate, receivers quote and receipt, every payment is an auditable chain"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Runs a receiver and an agent wallet end to end: paid calls, a checkout, one denial, one
    /// limit refusal, one human confirmation; then verifies the saved audit chains.
    Demo(demo::Args),
    /// Verifies audit chains offline (each FILE holds one payment's objects, one compact JWS
    /// per line, or is a wallet's SQLite store holding its chains) and names the first broken
    /// link.
    VerifyChain {
        /// The principal's public key the mandates must be signed by (`ed25519:…`): the
        /// trust anchor.
        #[arg(
            long = "principal-pubkey",
            alias = "principal",
            value_name = "ed25519:KEY"
        )]
        principal: Option<String>,
        /// Check the chains without a trust anchor: they are then consistent with themselves
        /// only (anyone can forge such a chain), and each is reported `ok (unanchored)`.
        #[arg(long, conflicts_with = "principal")]
        unanchored: bool,
        /// The principal's revocations (files of compact JWS, from `stipendex mandate revoke`):
        /// a Proof made at or after its mandate's revocation breaks the chain.
        #[arg(long = "revocation")]
        revocations: Vec<PathBuf>,
        /// Chain files (`<dir>/chains/*.jws` of a wallet's journal folder), or a wallet's store
        /// (`journal = "store"`: its `wallet.db`, or its `postgres://` URL): every chain in it.
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Measures the HTTP binding over the ledger rail on embedded SQLite: unpaid 402s and paid
    /// requests per second (p50/p99), and the wallet's overhead above the bare rail call.
    Bench(bench::Args),
    /// The wallet's HTTP client (curl for agents): sends the request, pays a 402 under the
    /// mandate, writes the body to stdout and what was paid (or why not) to stderr.
    Fetch(fetch::Args),
    /// An example paid MCP server behind the Stipendex gate (stdio, or Streamable HTTP with
    /// --listen): a free tool, a fixed-price tool, a checkout tool, a priced resource.
    ServeMcp(serve_mcp::Args),
    /// A paid front for an existing HTTP API with no code: prices and rails in one TOML file,
    /// Stipendex Quotes and x402 challenges on the same routes; the upstream never sees an
    /// unpaid request.
    Gateway(gateway::Args),
    /// MCP proxy mode: a host that knows nothing of payments starts this as its MCP server;
    /// it forwards to the real server and pays what it asks for under the mandate.
    Proxy(proxy::Args),
    /// The wallet's pending payments: list them, finish one.
    #[command(subcommand)]
    Wallet(wallet::Command),
    /// Keys.
    #[command(subcommand)]
    Key(KeyCommand),
    /// Mandates: the principal's signed authority for a wallet.
    #[command(subcommand)]
    Mandate(Box<mandate::Command>),
    /// Writes a working local setup in a folder: keys, a signed mandate, wallet.toml,
    /// gateway.toml in front of your API, and a funded local ledger (a first paid call).
    Init(init::Args),
    /// The embedded ledger rail's accounts: new, fund, balance, history.
    #[command(subcommand)]
    Ledger(ledger::Command),
    /// The hosted facilitator (the `account` rail's server): serve it, open and fund
    /// accounts, decide the review queue.
    #[command(subcommand)]
    Facilitator(Box<facilitator::Command>),
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Writes a new Ed25519 secret key (64 hex digits, mode 0600) and prints its public key.
    New {
        /// Where to write it (refuses to overwrite).
        #[arg(long)]
        out: PathBuf,
    },
}

async fn run(cli: Cli) -> Result<ExitCode, CliError> {
    match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Fetch(args) => fetch::run(args).await,
        Command::ServeMcp(args) => Box::pin(serve_mcp::run(args)).await,
        Command::Proxy(args) => Box::pin(proxy::run(args)).await,
        Command::Gateway(args) => Box::pin(gateway::run(args)).await,
        Command::Wallet(c) => wallet::run(c).await,
        Command::Init(args) => init::run(args).await,
        Command::Ledger(c) => ledger::run(c).await,
        Command::VerifyChain {
            principal,
            unanchored,
            revocations,
            files,
        } => {
            if principal.is_none() && !unanchored {
                return Err(msg(
                    "verify-chain needs the trust anchor: give the principal's public key with --principal-pubkey ed25519:… (or --unanchored to check the chains against themselves only, which anyone can forge)",
                ));
            }
            verify::run(principal.as_deref(), &revocations, &files).await
        }
        Command::Key(KeyCommand::New { out }) => {
            let key = stipendex::envelope::SecretKey::generate();
            files::write_secret(&out, &key)?;
            #[allow(clippy::print_stdout)]
            {
                println!("{}", key.public());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Mandate(c) => mandate::run(*c).await,
        Command::Facilitator(c) => facilitator::run(*c).await,
    }
}

/// The `stipendex` command: parses the arguments, runs the command, prints a failure as one
/// sentence on standard error.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    // A serving facilitator logs every request (`info`); the other commands only errors.
    let serving = match &cli.command {
        Command::Facilitator(c) => c.serving(),
        Command::Gateway(_) => Some(true),
        _ => None,
    };
    // A serving command logs its requests (`info`); rmcp's own lines (a -32402 answer logged
    // as an error, with its data) stay out unless asked for.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(if serving.is_some() {
            "info,rmcp=error"
        } else {
            "error"
        })
    });
    // Colour only on a terminal, and never with NO_COLOR set.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(files::colour(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if serving == Some(true) {
        logs.json().flatten_event(true).init();
    } else {
        logs.init();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stipendex: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            // A refusal can quote what a server sent (a receiver's id): never a control code.
            eprintln!(
                "stipendex: {}",
                stipendex::wallet::printable(&e.to_string())
            );
            ExitCode::FAILURE
        }
    }
}
