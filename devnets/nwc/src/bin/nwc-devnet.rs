//! `nwc-devnet`: an NWC (NIP-47) wallet service over an in-process relay, backed by an
//! in-memory regtest Lightning network.
//!
//! ```text
//! nwc-devnet --listen 127.0.0.1:7777 --wallet alice=100000000 --wallet bob=0 --nip04-only bob
//! ```
//! prints `relay ws://127.0.0.1:7777`, then `wallet NAME nostr+walletconnect://…` per wallet on
//! stdout, and serves until Ctrl-C. Without `--wallet`, creates `alice` and `bob` with
//! 1,000,000,000 msat each. Logs go to stderr (`RUST_LOG`).

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use nwc_devnet::{Devnet, DevnetConfig, DevnetError, WalletSpec};

/// NWC devnet: relay + wallet service + in-memory Lightning network.
#[derive(Debug, Parser)]
#[command(name = "nwc-devnet", version, about)]
struct Args {
    /// Relay listen address (port 0 = any free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// A wallet and its opening balance in msat: NAME=MSAT (repeatable).
    #[arg(long = "wallet", value_name = "NAME=MSAT", value_parser = parse_wallet)]
    wallets: Vec<(String, u64)>,
    /// Make this wallet's connection NIP-04 only (repeatable).
    #[arg(long = "nip04-only", value_name = "NAME")]
    nip04_only: Vec<String>,
    /// Plain `LocalRelay::run` (no TCP_NODELAY accept loop; ~40 ms per hop).
    #[arg(long)]
    plain_relay: bool,
}

fn parse_wallet(s: &str) -> Result<(String, u64), String> {
    let (name, msat) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=MSAT, got {s:?}"))?;
    if name.is_empty() {
        return Err("empty wallet name".into());
    }
    let msat = msat
        .trim()
        .replace('_', "")
        .parse::<u64>()
        .map_err(|e| format!("bad msat amount {msat:?}: {e}"))?;
    Ok((name.to_owned(), msat))
}

async fn run(args: Args) -> Result<(), DevnetError> {
    let mut wallets = args.wallets;
    if wallets.is_empty() {
        wallets = vec![
            ("alice".to_owned(), 1_000_000_000),
            ("bob".to_owned(), 1_000_000_000),
        ];
    }
    for n in &args.nip04_only {
        if !wallets.iter().any(|(w, _)| w == n) {
            return Err(DevnetError::UnknownWallet(n.clone()));
        }
    }
    let devnet = Devnet::start(DevnetConfig {
        relay_ip: args.listen.ip(),
        relay_port: Some(args.listen.port()).filter(|p| *p != 0),
        nodelay: !args.plain_relay,
    })
    .await?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "relay {}", devnet.relay_url())?;
    for (name, msat) in wallets {
        let nip04_only = args.nip04_only.contains(&name);
        let w = devnet
            .create_wallet(WalletSpec {
                nip04_only,
                ..WalletSpec::new(name, msat)
            })
            .await?;
        tracing::info!(wallet = %w.name, node = %w.node_pubkey, nip04_only, "wallet ready");
        writeln!(out, "wallet {} {}", w.name, w.uri)?;
    }
    out.flush()?;
    drop(out);
    tokio::signal::ctrl_c().await?;
    devnet.shutdown().await;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("nwc-devnet: {e}");
            let _ = writeln!(std::io::stderr(), "nwc-devnet: {e}");
            ExitCode::FAILURE
        }
    }
}
