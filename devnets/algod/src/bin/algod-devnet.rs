//! `algod-devnet`: an algod-REST-compatible devnet for tests and local development.
//!
//! ```text
//! algod-devnet --listen 127.0.0.1:4001 --token devtoken \
//!     --account ADDRESS=10000000 --faucet-seed <base64 32 bytes>
//! ```
//! Prints the network, the genesis hash and every funded account on start.

use std::net::SocketAddr;
use std::time::Duration;

use algod_devnet::{Devnet, DevnetConfig};
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

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut cfg = DevnetConfig {
        genesis_id: args.genesis_id.clone(),
        genesis_hash: sha2_of(&args.genesis_id),
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
