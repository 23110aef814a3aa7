//! `exact-algo-receiver`: the example exact-algo receiver (`docs/exact-algo.md` §2, §5, §7, §10).
//!
//! ```text
//! exact-algo-receiver --algod-url http://127.0.0.1:4001 --algod-token devtoken \
//!     --pay-to ADDRESS [--price 1000] [--listen 127.0.0.1:8402] [--pg-url postgres://…]
//! ```
//! Serves `/llms.txt`, `/.well-known/exact-algo.json`, `GET /api/posts` (free),
//! `GET /api/posts/{id}` (paid) and `POST /mcp` (tools `board_index`, `payment_instructions`,
//! `post_read`). Prints the listen URL on stdout; logs to stderr. The algod token and the
//! PostgreSQL URL are never logged.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;

use algod_devnet::example::example_app;
use clap::Parser;
use rail_core::keys::KeyStore;
use rail_core::{SharedClock, SystemClock};
use rail_exact_algo::address::Address;
use rail_exact_algo::algod::AlgodClient;
use rail_exact_algo::receiver::ExactAlgoReceiver;

#[derive(Parser)]
#[command(about = "An example exact-algo receiver: a paid board over HTTP and MCP")]
struct Args {
    /// algod's REST endpoint.
    #[arg(long, env = "ALGOD_URL", default_value = "http://127.0.0.1:4001")]
    algod_url: String,
    /// algod's API token (X-Algo-API-Token).
    #[arg(long, env = "ALGOD_TOKEN", hide_env_values = true)]
    algod_token: Option<String>,
    /// The address payments go to (payTo).
    #[arg(long)]
    pay_to: Address,
    /// The price of one post body, in microALGO.
    #[arg(long, default_value_t = 1000)]
    price: u64,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8402")]
    listen: SocketAddr,
    /// Keep paymentIds in this PostgreSQL database (shared by several instances); default:
    /// in memory.
    #[arg(long, env = "EXACT_ALGO_PG_URL", hide_env_values = true)]
    pg_url: Option<String>,
}

async fn key_store(pg_url: Option<&str>) -> Result<Arc<dyn KeyStore>, Box<dyn std::error::Error>> {
    match pg_url {
        Some(_) => tracing::info!("paymentIds kept in PostgreSQL"),
        None => tracing::info!("paymentIds kept in memory (one instance only)"),
    }
    rail_core::keys::open(pg_url.unwrap_or("memory"), None)
        .await
        .map_err(|e| format!("cannot open the paymentId store: {e}").into())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let store = key_store(args.pg_url.as_deref()).await?;
        let algod = AlgodClient::new(&args.algod_url, args.algod_token.clone())?;
        let clock: SharedClock = Arc::new(SystemClock);
        let receiver = ExactAlgoReceiver::connect(algod, args.pay_to, store, clock).await?;
        tracing::info!(
            algod = %args.algod_url,
            network = %receiver.network(),
            pay_to = %receiver.pay_to(),
            price = args.price,
            "exact-algo receiver ready"
        );
        let app = example_app(&receiver, args.price);
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        let local = listener.local_addr()?;
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "exact-algo-receiver listening on http://{local}")?;
            out.flush()?;
        }
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok::<_, Box<dyn std::error::Error>>(())
    })
}
