//! `stipendex gateway`: a paid front for an existing HTTP API (or MCP server) with no code —
//! prices and rails in one TOML file.
//!
//! ```toml
//! [store]
//! url = "sqlite://gateway.db"        # a postgres:// URL (url_env) for several instances
//!
//! [rails.house]                       # any rail of the registry; its receiving side is used
//! kind = "ledger"
//! url = "sqlite://ledger.db"
//! asset = "USD"
//! payee_account = "…"
//!
//! [receiver]
//! id = "weather-co"
//! key_env = "STIPENDEX_RECEIVER_KEY"  # or key_file; never the key itself
//! origins = ["https://api.example"]   # where clients reach the gateway: Quotes are bound to it
//!
//! [gateway]
//! listen = "127.0.0.1:8402"
//! ops_listen = "127.0.0.1:9402"      # /healthz, /readyz, /metrics: never on `listen`
//! trusted_proxies = ["10.0.0.0/8"]    # peers whose X-Forwarded-* are kept
//! upstream_timeout_secs = 30
//! max_body_bytes = 10485760
//! path_matching = "lenient"           # or "strict" for an upstream that routes exactly
//! # resolve_url = "http://127.0.0.1:9000/price"   # dynamic prices: quote / reject / waive
//!
//! [upstream]
//! url = "http://127.0.0.1:8080"       # the API, which knows nothing of payments
//! secret_header = "X-Gateway-Secret"  # optional: the origin refuses requests without it
//! secret_env = "GATEWAY_SECRET"
//!
//! [[price]]
//! kind = "route"
//! method = "GET"
//! pattern = "/api/forecast/{city}"
//! amount = "0.05"
//! asset = "USD"
//! ```
//!
//! What it does per request — the receiver's one route table, 402 until paid, forwarded once,
//! receipted, delivery at most once — is the facade's [`stipendex::gateway`] (feature
//! `gateway`); this command is its TOML file, its listeners and its stop.

pub(crate) mod config;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use stipendex::Registry;
use stipendex::gateway::{Gateway, Parts, RemotePrice, UpstreamReady};
use stipendex::receiver::Receiver;

use crate::{CliError, msg};
use config::Config;

/// `stipendex gateway`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The gateway's configuration: the registry's TOML, `[receiver]`, `[gateway]`,
    /// `[upstream]` and `[[price]]`.
    #[arg(long)]
    config: PathBuf,
    /// Listen here instead of `[gateway] listen` (`127.0.0.1:0` picks a free port).
    #[arg(long)]
    listen: Option<SocketAddr>,
}

/// Builds the receiver and the registry's rails, then the gateway of the configuration.
async fn build(config: Config) -> Result<Gateway, CliError> {
    let registry = Registry::from_file(&config.path).await?;
    // A price in an asset no receiving rail carries could never be paid.
    crate::checks::prices_payable(
        &config.path,
        &crate::checks::receiving_assets(&registry),
        &config.prices,
    )?;
    let ready = Arc::new(
        UpstreamReady::new(&config.upstream)
            .with_dependencies(stipendex::registry::dependencies_of_file(&config.path)?),
    );
    let mut b = Receiver::builder(&config.receiver_id, config.receiver_key.clone())
        .registry(&registry)
        .claim_lease(config.claim_lease)
        .path_matching(config.path_matching)
        .ready(ready.clone());
    if let Some(s) = registry.store() {
        b = b.store(s.clone());
    }
    if let Some(ttl) = config.quote_ttl {
        b = b.quote_ttl(ttl);
    }
    if let Some(t) = &config.tabs {
        b = b.tabs(t.clone());
    }
    for o in &config.origins {
        b = b.origin(o);
    }
    for p in &config.prices {
        b = b.price(p.clone());
    }
    if let Some(r) = &config.resolve {
        b = b.resolve_price(Arc::new(RemotePrice::new(r)?));
    }
    let parts = Parts::from_registry(b.build()?, &registry).ready(ready);
    let gateway = Gateway::assemble(config.settings(), parts).await?;
    // A priced tool the upstream does not list is never asked for (or is misspelt).
    if let Some(tools) = gateway.upstream_tools().await
        && let Some(w) = crate::checks::unlisted_warning(&config.prices, &tools)
    {
        warn(&w);
    }
    Ok(gateway)
}

/// A start-up warning, one line on standard error (the logs may be JSON, or filtered out).
#[allow(clippy::print_stderr)]
fn warn(what: &str) {
    eprintln!("stipendex gateway: warning: {what}");
}

/// Resolves when the process is asked to stop (Ctrl-C, SIGTERM).
async fn stop_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}

/// Binds `[gateway] ops_listen` and serves the operations there ([`Gateway::operations`])
/// until `stopping` turns true; says where on standard output.
async fn serve_operations(
    at: SocketAddr,
    operations: axum::Router,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, CliError> {
    let listener = tokio::net::TcpListener::bind(at).await.map_err(|e| {
        msg(format!(
            "cannot listen on [gateway] ops_listen = \"{at}\": {e}; free the port or choose another"
        ))
    })?;
    let addr = listener
        .local_addr()
        .map_err(|e| msg(format!("cannot listen on {at}: {e}")))?;
    #[allow(clippy::print_stdout)]
    {
        println!("Operations on http://{addr} (/healthz, /readyz, /metrics)");
    }
    let serve = axum::serve(listener, operations).with_graceful_shutdown(async move {
        let _ = stopping.wait_for(|s| *s).await;
    });
    Ok(tokio::spawn(async move {
        if let Err(e) = serve.await {
            tracing::error!(error = %e, "the operations listener stopped");
        }
    }))
}

/// Runs `stipendex gateway` until it is asked to stop; in-flight requests (paid ones
/// included) finish first, for at most `[gateway] shutdown_grace_secs`.
pub(crate) async fn run(a: Args) -> Result<ExitCode, CliError> {
    let config = Config::read(&a.config, a.listen)?;
    let listen = config.listen;
    let ops_listen = config.ops_listen;
    let grace = config.shutdown_grace;
    // Behind a trusted proxy, clients reach the gateway at the proxy's origin, not here.
    let behind_proxy = !config.trusted.is_empty();
    let origins = config.origins.clone();
    let gateway = build(config).await?;
    // Records kept after payment (claims, kept answers, settled marks) expire; the store is
    // swept of them while the gateway runs.
    let _purge = gateway
        .store()
        .cloned()
        .map(crate::upkeep::purge_expired_every_minute);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| msg(format!("cannot listen on {listen}: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| msg(format!("cannot listen on {listen}: {e}")))?;
    if !behind_proxy && let Some(w) = crate::checks::listen_warning(addr, &origins) {
        warn(&w);
    }
    let (stopping_tx, mut stopping_rx) = tokio::sync::watch::channel(false);
    // Operations on their own listener, bound before the public one is announced.
    let _operations = match ops_listen {
        Some(at) => Some(serve_operations(at, gateway.operations(), stopping_rx.clone()).await?),
        None => {
            tracing::info!(
                "no [gateway] ops_listen: /healthz, /readyz and /metrics are not served"
            );
            None
        }
    };
    #[allow(clippy::print_stdout)]
    {
        println!("Listening on http://{addr}");
    }
    let serve = axum::serve(
        listener,
        gateway
            .router()
            .into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        stop_signal().await;
        tracing::info!("stopping: finishing the requests in flight");
        let _ = stopping_tx.send(true);
    });
    let deadline = async move {
        let _ = stopping_rx.wait_for(|s| *s).await;
        tokio::time::sleep(grace).await;
    };
    tokio::select! {
        r = serve => r.map_err(|e| msg(format!("the gateway stopped: {e}")))?,
        () = deadline => {
            tracing::warn!(grace_secs = grace.as_secs(), "requests still in flight after the grace period: stopping anyway");
        }
    }
    Ok(ExitCode::SUCCESS)
}
