//! `x402`: the rail's command-line tools.
//!
//! ```text
//! x402 facilitator --rpc-url URL [--listen 127.0.0.1:4021] [--pg-url postgres://…]
//!     key from X402_FACILITATOR_KEY
//! x402 serve --facilitator-url URL | --rpc-url URL (local facilitator, X402_FACILITATOR_KEY)
//!     --token ADDR --network eip155:N --pay-to ADDR [--price 1000] [--listen …] [--settle after]
//! x402 pay URL --token ADDR --network eip155:N [--max 10000]      key from X402_PAYER_KEY
//! x402 load --url URL [--paid] [--concurrency 8] [--seconds 10]   key from X402_PAYER_KEY
//! ```
//! Servers print `Listening on http://ADDR` on stdout and log to stderr. Keys are read from
//! the environment only and never logged.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_primitives::{Address, U256};
use axum::Router;
use axum::routing::get;
use clap::{Parser, Subcommand};
use rail_core::keys::KeyStore;
use rail_x402::client::{EvmFetched, client};
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{
    LocalFacilitator, RemoteFacilitator, X402Facilitator, X402SettlementBook,
};
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::rpc::RpcClient;
use rail_x402::{ExactEvm, SettleWhen, Token};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser)]
#[command(about = "x402 v2 exact (EIP-3009) tools: facilitator, paid server, payer, load")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve the facilitator API (/verify, /settle, /supported, /health).
    Facilitator {
        /// JSON-RPC endpoint of the chain.
        #[arg(long, env = "X402_RPC_URL")]
        rpc_url: String,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:4021")]
        listen: SocketAddr,
        /// Keep settlement records in PostgreSQL (shared by instances).
        #[arg(long, env = "X402_PG_URL", hide_env_values = true)]
        pg_url: Option<String>,
    },
    /// Serve an example paid API: GET /weather (paid), GET /health (free).
    Serve {
        /// A remote facilitator (else a local one on --rpc-url).
        #[arg(long, env = "X402_FACILITATOR_URL")]
        facilitator_url: Option<String>,
        /// JSON-RPC endpoint for a local facilitator.
        #[arg(long, env = "X402_RPC_URL")]
        rpc_url: Option<String>,
        /// Token contract.
        #[arg(long, env = "X402_TOKEN")]
        token: Address,
        /// CAIP-2 network.
        #[arg(long, env = "X402_NETWORK")]
        network: String,
        /// EIP-712 domain name of the token.
        #[arg(long, default_value = "USD Coin")]
        token_name: String,
        /// EIP-712 domain version of the token.
        #[arg(long, default_value = "2")]
        token_version: String,
        /// Recipient.
        #[arg(long, env = "X402_PAY_TO")]
        pay_to: Address,
        /// Price of /weather in atomic units.
        #[arg(long, default_value_t = 1000)]
        price: u64,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8402")]
        listen: SocketAddr,
        /// Settle `before` (default) or `after` the handler.
        #[arg(long, default_value = "before")]
        settle: String,
        /// Keep served payments and settlement records in PostgreSQL.
        #[arg(long, env = "X402_PG_URL", hide_env_values = true)]
        pg_url: Option<String>,
    },
    /// Fetch a URL, paying its 402 (prints one JSON line).
    Pay {
        /// The URL.
        url: String,
        /// Token to pay in.
        #[arg(long, env = "X402_TOKEN")]
        token: Address,
        /// CAIP-2 network.
        #[arg(long, env = "X402_NETWORK")]
        network: String,
        /// Most to pay, atomic units.
        #[arg(long, default_value_t = 10_000)]
        max: u64,
    },
    /// Measure a server: unpaid 402s/s, or paid requests/s (--paid), with p50/p99.
    Load {
        /// The paid URL.
        #[arg(long)]
        url: String,
        /// Pay (each request a new payment) instead of counting 402s.
        #[arg(long)]
        paid: bool,
        /// Concurrent requests.
        #[arg(long, default_value_t = 8)]
        concurrency: usize,
        /// Duration in seconds (unpaid) — paid runs do `--requests`.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// Paid requests in all.
        #[arg(long, default_value_t = 400)]
        requests: usize,
        /// Token (paid runs).
        #[arg(long, env = "X402_TOKEN")]
        token: Option<Address>,
        /// CAIP-2 network (paid runs).
        #[arg(long, env = "X402_NETWORK")]
        network: Option<String>,
    },
}

fn key(var: &str) -> Result<LocalSigner, BoxError> {
    let text = std::env::var(var).map_err(|_| format!("{var} is not set"))?;
    Ok(LocalSigner::from_hex(&text)?)
}

async fn store(pg_url: Option<&str>) -> Result<Arc<dyn KeyStore>, BoxError> {
    rail_core::keys::open(pg_url.unwrap_or("memory"), None)
        .await
        .map_err(|e| format!("cannot open the record store: {e}").into())
}

async fn local_facilitator(
    rpc_url: &str,
    store: Arc<dyn KeyStore>,
) -> Result<LocalFacilitator, BoxError> {
    let rpc = RpcClient::new(rpc_url)?;
    let book = X402SettlementBook::new(store);
    Ok(LocalFacilitator::connect(rpc, key("X402_FACILITATOR_KEY")?, book).await?)
}

async fn listen(listen: SocketAddr, app: Router) -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind(listen).await?;
    let local = listener.local_addr()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "Listening on http://{local}")?;
        out.flush()?;
    }
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = (sorted.len() - 1) * p / 100;
    sorted.get(i).copied().unwrap_or_default()
}

// Timing figures, not money: floats are fine here.
#[allow(clippy::float_arithmetic, clippy::cast_precision_loss)]
fn report(
    label: &str,
    ok: usize,
    errors: usize,
    elapsed: Duration,
    mut lat: Vec<Duration>,
) -> Result<(), BoxError> {
    lat.sort();
    let secs = elapsed.as_secs_f64();
    let rate = if secs > 0.0 { ok as f64 / secs } else { 0.0 };
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{{\"run\":\"{label}\",\"ok\":{ok},\"errors\":{errors},\"seconds\":{secs:.3},\"per_second\":{rate:.1},\"p50_ms\":{:.2},\"p99_ms\":{:.2}}}",
        percentile(&lat, 50).as_secs_f64() * 1000.0,
        percentile(&lat, 99).as_secs_f64() * 1000.0,
    )?;
    Ok(())
}

#[allow(clippy::too_many_lines)]
async fn run(cli: Cli) -> Result<(), BoxError> {
    match cli.cmd {
        Cmd::Facilitator {
            rpc_url,
            listen: addr,
            pg_url,
        } => {
            let f = local_facilitator(&rpc_url, store(pg_url.as_deref()).await?).await?;
            tracing::info!(network = %f.network(), settler = %f.address(), "x402 facilitator ready");
            listen(addr, rail_x402::server::router(Arc::new(f))).await
        }
        Cmd::Serve {
            facilitator_url,
            rpc_url,
            token,
            network,
            token_name,
            token_version,
            pay_to,
            price,
            listen: addr,
            settle,
            pg_url,
        } => {
            let store = store(pg_url.as_deref()).await?;
            let facilitator: Arc<dyn X402Facilitator> = match (facilitator_url, rpc_url) {
                (Some(url), _) => Arc::new(RemoteFacilitator::new(&url, Duration::from_secs(30))?),
                (None, Some(rpc)) => Arc::new(local_facilitator(&rpc, store.clone()).await?),
                (None, None) => return Err("give --facilitator-url or --rpc-url".into()),
            };
            let when = match settle.as_str() {
                "before" => SettleWhen::Before,
                "after" => SettleWhen::After,
                other => return Err(format!("--settle {other:?}: before or after").into()),
            };
            let paywall = ExactEvm::new(
                facilitator,
                Token::new(&network, token, &token_name, &token_version),
                pay_to,
            )
            .paywall(&[("/weather", price.into(), "Today's weather")])?
            .with_store(store)
            .settle(when);
            let app = paywall.apply(
                Router::new()
                    .route("/weather", get(|| async { axum::Json(serde_json::json!({"report": {"weather": "sunny", "temperature": 70}})) }))
                    .route("/health", get(|| async { "ok" })),
            );
            listen(addr, app).await
        }
        Cmd::Pay {
            url,
            token,
            network,
            max,
        } => {
            let payer = X402Payer::new(
                key("X402_PAYER_KEY")?,
                Policy::new(network, token, U256::from(max)),
            );
            let paid = EvmFetched::from(client(payer)?.get(&url).await?);
            let line = serde_json::json!({
                "status": paid.status.as_u16(),
                "body": String::from_utf8_lossy(&paid.body),
                "paymentResponse": paid.settlement,
            });
            writeln!(std::io::stdout().lock(), "{line}")?;
            if paid.status.is_success() {
                Ok(())
            } else {
                Err(format!("status {}", paid.status).into())
            }
        }
        Cmd::Load {
            url,
            paid,
            concurrency,
            seconds,
            requests,
            token,
            network,
        } => {
            if paid {
                let (Some(token), Some(network)) = (token, network) else {
                    return Err("--paid needs --token and --network".into());
                };
                let payer = X402Payer::new(
                    key("X402_PAYER_KEY")?,
                    Policy::new(network, token, U256::from(u64::MAX)),
                );
                let client = client(payer)?;
                let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let start = Instant::now();
                let mut tasks = Vec::new();
                for _ in 0..concurrency {
                    let (client, url, next) = (client.clone(), url.clone(), next.clone());
                    tasks.push(tokio::spawn(async move {
                        let (mut ok, mut err, mut lat) = (0usize, 0usize, Vec::new());
                        while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < requests {
                            let t = Instant::now();
                            match client.get(&url).await.map(EvmFetched::from) {
                                Ok(p) if p.status.is_success() && p.settlement.as_ref().is_some_and(|s| s.success) => {
                                    ok += 1;
                                    lat.push(t.elapsed());
                                }
                                Ok(p) => {
                                    err += 1;
                                    tracing::warn!(status = %p.status, body = %String::from_utf8_lossy(&p.body), "paid request failed");
                                }
                                Err(e) => {
                                    err += 1;
                                    tracing::warn!(error = %e, "paid request failed");
                                }
                            }
                        }
                        (ok, err, lat)
                    }));
                }
                let (mut ok, mut err, mut lat) = (0, 0, Vec::new());
                for t in tasks {
                    let (o, e, l) = t.await?;
                    ok += o;
                    err += e;
                    lat.extend(l);
                }
                report("paid", ok, err, start.elapsed(), lat)
            } else {
                let http = rail_x402::rpc::http_client(Duration::from_secs(10))?;
                let deadline = Instant::now() + Duration::from_secs(seconds);
                let start = Instant::now();
                let mut tasks = Vec::new();
                for _ in 0..concurrency {
                    let (http, url) = (http.clone(), url.clone());
                    tasks.push(tokio::spawn(async move {
                        let (mut ok, mut err, mut lat) = (0usize, 0usize, Vec::new());
                        while Instant::now() < deadline {
                            let t = Instant::now();
                            match http.get(&url).send().await {
                                Ok(r)
                                    if r.status() == reqwest::StatusCode::PAYMENT_REQUIRED
                                        && r.headers().contains_key("payment-required") =>
                                {
                                    let _ = r.bytes().await;
                                    ok += 1;
                                    lat.push(t.elapsed());
                                }
                                _ => err += 1,
                            }
                        }
                        (ok, err, lat)
                    }));
                }
                let (mut ok, mut err, mut lat) = (0, 0, Vec::new());
                for t in tasks {
                    let (o, e, l) = t.await?;
                    ok += o;
                    err += e;
                    lat.extend(l);
                }
                report("unpaid-402", ok, err, start.elapsed(), lat)
            }
        }
    }
}

fn main() -> Result<(), BoxError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run(cli))
}
