//! `algod-devnet`: an algod-REST-compatible devnet for tests and local development.
//!
//! ```text
//! algod-devnet --listen 127.0.0.1:4001 --token devtoken \
//!     --account ADDRESS=10000000 --faucet-seed <base64 32 bytes>
//! # posing as Algorand testnet (the x402-avm SDK knows only testnet and mainnet):
//! algod-devnet --genesis-id testnet-v1.0 --genesis-hash SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI= \
//!     --usdc-creator ISSUER --usdc PAYER=5000000
//! ```
//! Prints the network, the genesis hash and every funded account on start.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use algod_devnet::{AssetConfig, Devnet, DevnetConfig, TESTNET_USDC};
use clap::Parser;
use data_encoding::BASE64;
use rail_exact_algo::address::Address;

#[derive(Parser, Debug)]
#[command(about = "An algod-REST-compatible Algorand devnet (in memory)")]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:4001")]
    listen: SocketAddr,
    /// API token required in X-Algo-API-Token (none: open).
    #[arg(long, env = "ALGOD_TOKEN")]
    token: Option<String>,
    /// A funded account, ADDRESS=MICROALGOS (repeatable).
    #[arg(long = "account", value_parser = parse_account)]
    accounts: Vec<(Address, u64)>,
    /// Fund the account of this Ed25519 seed (base64, 32 bytes) with 10^15 µALGO: a faucet
    /// whose key tests hold.
    #[arg(long, env = "ALGOD_FAUCET_SEED")]
    faucet_seed: Option<String>,
    /// Genesis id.
    #[arg(long, default_value = "stipendex-devnet-v1")]
    genesis_id: String,
    /// Genesis hash (base64, 32 bytes); default: SHA-512/256 of the genesis id. Testnet's is
    /// `SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=`.
    #[arg(long)]
    genesis_hash: Option<String>,
    /// Create testnet's USDC (ASA 10458941, 6 decimals), its whole supply held by this address
    /// (fund it with `--account` for its minimum balance).
    #[arg(long)]
    usdc_creator: Option<Address>,
    /// Opt ADDRESS in to USDC and give it AMOUNT base units from the creator (repeatable;
    /// needs `--usdc-creator`).
    #[arg(long = "usdc", value_parser = parse_account)]
    usdc: Vec<(Address, u64)>,
    /// Produce an empty block this often, in milliseconds (default: only on transactions).
    #[arg(long)]
    block_ms: Option<u64>,
}

fn parse_account(s: &str) -> Result<(Address, u64), String> {
    let (a, n) = s
        .split_once('=')
        .ok_or_else(|| "expected ADDRESS=MICROALGOS".to_owned())?;
    let a: Address = a.parse().map_err(|e| format!("{e}"))?;
    let n: u64 = n.parse().map_err(|e| format!("microalgos: {e}"))?;
    Ok((a, n))
}

/// `--genesis-hash`: 32 bytes of standard base64.
fn parse_genesis_hash(s: &str) -> Result<[u8; 32], String> {
    BASE64
        .decode(s.trim().as_bytes())
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| {
            format!(
                "--genesis-hash {s:?} is not 32 bytes of base64 (testnet's is SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=)"
            )
        })
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("algod-devnet: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let genesis_hash = match &args.genesis_hash {
        Some(h) => parse_genesis_hash(h)?,
        None => sha2_of(&args.genesis_id),
    };
    let mut cfg = DevnetConfig {
        genesis_id: args.genesis_id.clone(),
        genesis_hash,
        token: args.token.clone(),
        accounts: args.accounts.clone(),
        block_time: args.block_ms.map(Duration::from_millis),
        ..DevnetConfig::default()
    };
    if let Some(seed) = &args.faucet_seed {
        let bytes: [u8; 32] = BASE64
            .decode(seed.as_bytes())
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or("--faucet-seed must be 32 bytes of base64")?;
        let key = ed25519_dalek::SigningKey::from_bytes(&bytes);
        cfg.accounts.push((
            Address(key.verifying_key().to_bytes()),
            1_000_000_000_000_000,
        ));
    }
    if let Some(creator) = args.usdc_creator {
        cfg.assets.push(AssetConfig::usdc(creator));
    } else if !args.usdc.is_empty() {
        return Err("--usdc needs --usdc-creator (who holds USDC's supply)".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let running = Devnet::spawn(cfg.clone(), args.listen).await?;
        let d: &Devnet = &running.devnet;
        let mut out = std::io::stdout().lock();
        use std::io::Write;
        writeln!(out, "algod-devnet listening on {}", running.url)?;
        writeln!(out, "network      {}", d.network())?;
        writeln!(out, "genesis-id   {}", d.genesis_id())?;
        writeln!(out, "genesis-hash {}", BASE64.encode(&d.genesis_hash()))?;
        for (a, n) in &cfg.accounts {
            writeln!(out, "account      {a} {n} µALGO")?;
        }
        for (a, n) in &args.usdc {
            d.opt_in(*a, TESTNET_USDC)?;
            d.fund_asset(*a, TESTNET_USDC, *n)?;
            writeln!(out, "usdc         {a} {n} (ASA {TESTNET_USDC})")?;
        }
        out.flush()?;
        drop(out);
        tokio::signal::ctrl_c().await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}

fn sha2_of(s: &str) -> [u8; 32] {
    use sha2::{Digest, Sha512_256};
    Sha512_256::digest(s.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_genesis_hash_is_32_bytes_of_base64_and_a_bad_one_is_named() {
        let testnet = parse_genesis_hash("SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=");
        assert_eq!(
            testnet.map(|h| BASE64.encode(&h)).as_deref(),
            Ok("SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=")
        );
        let short = parse_genesis_hash("SGO1GKSz").unwrap_err();
        assert!(short.starts_with("--genesis-hash \"SGO1GKSz\" is not 32 bytes of base64"));
        assert!(parse_genesis_hash("not base64!").is_err());
    }
}
