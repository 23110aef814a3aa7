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
//! Per request: the receiver's one route table decides; a free route is forwarded untouched; a
//! priced one answers 402 (a signed Quote, merged with the x402 challenge where an x402-style
//! rail is configured) until paid, then is forwarded once and answered with
//! `Stipendex-Receipt` (or `PAYMENT-RESPONSE`); the answer is kept for a lost-answer replay.
//!
//! Delivery is at most once per Proof: if an instance stops after forwarding and before the
//! answer is kept, the same Proof again is forwarded again only for an idempotent method
//! (`GET`, `HEAD`, `PUT`, `DELETE`); any other gets `409 outcome_unknown` (a checkout's hold
//! stays until its expiry voids it). A paid request is not forwarded — nor its payment taken,
//! whatever the way to pay — while the upstream cannot be reached (the receiver's one guard,
//! [`UpstreamReady`]: 503, send the same payment again later); a forward that reaches no
//! upstream (the connection refused) is kept as nobody's answer and charges nothing
//! ([`stipendex::http::Undelivered`]).

pub(crate) mod config;
mod forward;
mod mcp;
mod ops;
mod resolve;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rail_core::KeyStore;
use serde_json::json;
use stipendex::Registry;
use stipendex::http::Binding;
use stipendex::receiver::{Price, Receiver};
use x402_transport::paywall::Paywall;
use x402_transport::{Accepts, Scheme, SettleWhen};

use crate::{CliError, msg};
use config::{Config, Upstream};

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

/// The gateway's answer to the receiver's one guard ([`Receiver::guard`], asked before any
/// payment of any kind is taken): its upstream takes connections (an HTTP API, an MCP URL) and
/// its MCP session is open (a command).
pub(crate) struct UpstreamReady {
    health: forward::Health,
    session: std::sync::OnceLock<Arc<mcp::Session>>,
    /// What the rails depend on (an x402 facilitator), for `/readyz` only.
    dependencies: stipendex::registry::Probes,
}

impl UpstreamReady {
    pub(crate) fn new(upstream: &Upstream) -> Self {
        UpstreamReady {
            health: forward::Health::new(upstream),
            session: std::sync::OnceLock::new(),
            dependencies: stipendex::registry::Probes::default(),
        }
    }
}

#[async_trait::async_trait]
impl stipendex::receiver::Ready for UpstreamReady {
    async fn ready(&self) -> Result<(), String> {
        if self.session.get().is_some_and(|m| m.closed()) {
            return Err("the MCP server behind this gateway is gone".into());
        }
        if self.health.up().await {
            Ok(())
        } else {
            Err("the service behind this gateway cannot be reached".into())
        }
    }
}

/// What every request's handlers share.
pub(crate) struct Shared {
    config: Config,
    receiver: Receiver,
    store: Option<Arc<dyn KeyStore>>,
    forward: Option<forward::Forward>,
    session: Option<Arc<mcp::Session>>,
    ready: Arc<UpstreamReady>,
    metrics: ops::Metrics,
    schemes: Vec<Arc<dyn Scheme>>,
}

/// The x402 schemes of the configured rails that receive, each with the asset it is paid in.
fn schemes_of(registry: &Registry) -> Vec<(Arc<dyn Scheme>, rail_core::Asset)> {
    registry
        .rails()
        .filter_map(|e| {
            let scheme = e.scheme_receiver.clone()?;
            let asset = e.capabilities()?.assets.first()?.clone();
            Some((scheme, asset))
        })
        .collect()
}

/// The x402 offers of every fixed-price entry of `config` that `keep` selects — each scheme of
/// a rail receiving the entry's asset — as (pattern, description, ways to pay). A checkout
/// holds and captures: x402's `exact` cannot, so it has none.
fn x402_offers(
    config: &Config,
    schemes: &[(Arc<dyn Scheme>, rail_core::Asset)],
    keep: impl Fn(&stipendex::receiver::PricedCapability) -> bool,
) -> Result<Vec<(String, String, Accepts)>, CliError> {
    let mut out = Vec::new();
    for cap in config.prices.iter().filter(|c| keep(c)) {
        let Price::Fixed(money) = &cap.price else {
            continue;
        };
        let mut accepts: Option<Accepts> = None;
        for (scheme, _) in schemes.iter().filter(|(_, a)| a == money.asset()) {
            let refused = |e: x402_transport::Error| {
                msg(format!(
                    "[[price]] {}: the x402 scheme {} cannot ask {} {}: {e}",
                    cap.name(),
                    scheme.info().label,
                    money.amount(),
                    money.asset().code()
                ))
            };
            accepts = Some(match accepts {
                None => Accepts::one(scheme.clone(), money.minor_units()).map_err(refused)?,
                Some(a) => a.or(scheme.clone(), money.minor_units()).map_err(refused)?,
            });
        }
        if let Some(a) = accepts {
            let description = cap
                .description
                .clone()
                .unwrap_or_else(|| cap.name().to_owned());
            out.push((cap.name().to_owned(), description, a));
        }
    }
    Ok(out)
}

/// The HTTP paywall beside the Quotes (settling after the upstream answered for a safe method,
/// before forwarding any other), if any route has an x402 offer. Its payments are served by
/// the receiver, under the receiver's record in the gateway's store (decision 0038).
fn paywall(
    config: &Config,
    schemes: &[(Arc<dyn Scheme>, rail_core::Asset)],
) -> Result<Option<Paywall>, CliError> {
    let offers = x402_offers(config, schemes, |_| true)?;
    if offers.is_empty() {
        return Ok(None);
    }
    // Settled after the upstream answered for a safe method (nothing changed if settlement
    // then fails), before it is forwarded for any other: a POST's work is never done unpaid.
    let mut p = Paywall::new().settle(SettleWhen::AfterIfSafe);
    for (pattern, description, accepts) in offers {
        p = p.route(&pattern, &description, accepts);
    }
    Ok(Some(p))
}

/// The service as the rails' discovery documents describe it: its name, what it sells, its MCP
/// endpoint and its tools' fixed prices.
fn service_of(config: &Config) -> stipendex::registry::Service {
    let tools = config
        .prices
        .iter()
        .filter(|c| c.method() == "tools/call")
        .filter_map(|c| match &c.price {
            Price::Fixed(m) => Some(stipendex::registry::Tool {
                name: c.name().to_owned(),
                description: c.description.clone().unwrap_or_else(|| c.name().to_owned()),
                price: m.clone(),
            }),
            _ => None,
        })
        .collect();
    stipendex::registry::Service {
        name: config.receiver_id.clone(),
        summary: format!(
            "{} sells its {} per request through a Stipendex gateway: a signed Quote (Stipendex) or an x402 challenge on every priced request.",
            config.receiver_id,
            if config.upstream.is_mcp() {
                "MCP tools"
            } else {
                "HTTP API"
            }
        ),
        docs_url: None,
        mcp_endpoint: config.upstream.is_mcp().then(|| config.mcp_path.clone()),
        tools,
    }
}

fn store_of(s: &Shared) -> Option<&Arc<dyn KeyStore>> {
    s.store.as_ref()
}

/// The MCP paywall beside the Quotes (x402's `isError` convention), if any tool has an x402
/// offer. Its payments are served by the receiver, as over HTTP.
fn mcp_paywall(
    config: &Config,
    schemes: &[(Arc<dyn Scheme>, rail_core::Asset)],
) -> Result<Option<x402_transport::mcp::McpPaywall>, CliError> {
    let offers = x402_offers(config, schemes, |c| c.method() == "tools/call")?;
    if offers.is_empty() {
        return Ok(None);
    }
    // A tool call has effects: settled before it is forwarded.
    let mut p = x402_transport::mcp::McpPaywall::new().settle(SettleWhen::Before);
    for (name, description, accepts) in offers {
        p = p.tool(&name, &description, accepts);
    }
    Ok(Some(p))
}

/// Refuses every MCP request while the session with the upstream is gone: nothing is paid
/// for a call that cannot be forwarded.
async fn mcp_guard(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    // A stdio upstream is gone when its session is; a URL one when it stops taking
    // connections (checked at most every 2 s while it answers).
    let gone = s.session.as_ref().is_some_and(|m| m.closed())
        || (matches!(s.config.upstream, Upstream::McpUrl(_)) && !s.ready.health.up().await);
    if gone {
        let mut r = (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({
                "error": "upstream_unavailable",
                "message": "the MCP server behind this gateway is gone: nothing was charged; try again later",
            })),
        )
            .into_response();
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("2"));
        return r;
    }
    next.run(req).await
}

/// What the gateway is built on besides its configuration: the receiver and what the
/// registry's rails offer.
pub(crate) struct Parts {
    pub(crate) receiver: Receiver,
    pub(crate) store: Option<Arc<dyn KeyStore>>,
    pub(crate) schemes: Vec<(Arc<dyn Scheme>, rail_core::Asset)>,
    /// The first rail's discovery documents, if any rail publishes them (exact-algo's).
    pub(crate) discovery: Option<Arc<dyn stipendex::registry::Discovery>>,
    /// The receiver's guard, if it was built with this gateway's ([`UpstreamReady`]).
    pub(crate) ready: Option<Arc<UpstreamReady>>,
}

/// Builds the receiver, the registry's rails and the router of the configuration.
async fn build(config: Config) -> Result<(Router, Arc<Shared>), CliError> {
    let registry = Registry::from_file(&config.path).await?;
    let store = registry.store().cloned();
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
    if let Some(s) = &store {
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
        b = b.resolve_price(Arc::new(resolve::Remote::new(r)?));
    }
    let parts = Parts {
        receiver: b.build()?,
        store,
        schemes: schemes_of(&registry),
        discovery: registry.rails().find_map(|e| e.discovery.clone()),
        ready: Some(ready),
    };
    assemble(config, parts).await
}

/// The router of `config` on `parts`.
pub(crate) async fn assemble(
    config: Config,
    parts: Parts,
) -> Result<(Router, Arc<Shared>), CliError> {
    let Parts {
        receiver,
        store,
        schemes,
        discovery,
        ready,
    } = parts;
    let ready = ready.unwrap_or_else(|| Arc::new(UpstreamReady::new(&config.upstream)));
    let (forward, session) = match &config.upstream {
        Upstream::Http(u) => (Some(forward::Forward::new(u)?), None),
        Upstream::McpUrl(_) | Upstream::McpCommand(_) => (
            None,
            Some(Arc::new(mcp::Session::connect(&config.upstream).await?)),
        ),
    };
    let http_paywall = if session.is_none() {
        paywall(&config, &schemes)?
    } else {
        None
    };
    let discovery = discovery.map(|d| d.router(&service_of(&config), http_paywall.as_ref()));
    if let Some(m) = &session {
        let _ = ready.session.set(m.clone());
        // A priced tool the upstream does not list is never asked for (or is misspelt).
        if let Some(tools) = m.tool_names().await
            && let Some(w) = crate::checks::unlisted_warning(&config.prices, &tools)
        {
            warn(&w);
        }
    }
    let shared = Arc::new(Shared {
        ready,
        config,
        receiver,
        store,
        forward,
        session,
        metrics: ops::Metrics::default(),
        schemes: schemes.iter().map(|(s, _)| s.clone()).collect(),
    });
    let agent = Arc::new(ops::agent_json(&shared));
    // Operations (`/healthz`, `/readyz`, `/metrics`) are not on the public listener: they are
    // served on `[gateway] ops_listen` ([`ops::router`]); there, any such path is the
    // upstream's like any other unpriced one.
    let public_routes = Router::new().route(
        "/.well-known/agent.json",
        get(move || {
            let a = agent.clone();
            async move { axum::Json((*a).clone()) }
        }),
    );
    let router = match &shared.session {
        None => {
            // Behind `[gateway] trusted_proxies`, a client is the address they vouch for (the
            // per-client limits count it), as the forward's `X-Forwarded-For` says.
            let trusted = shared.config.trusted.clone();
            let mut binding = Binding::new(shared.receiver.clone())?.trusted_proxies(
                stipendex::http::TrustedProxies::matching(move |ip| {
                    trusted.iter().any(|n| n.contains(ip))
                }),
            );
            if let Some(p) = http_paywall {
                binding = binding.with_x402(p)?;
            }
            binding.apply(public_routes.fallback(forward::forward))
        }
        Some(session) => {
            let observed = shared.clone();
            let mut server = stipendex::mcp::PaidServer::new(
                mcp::Forward(session.clone()),
                shared.receiver.clone(),
            )?
            .on_outcome(move |o| {
                observed.metrics.observe(o);
                log_mcp_outcome(o);
            })
            .trusted_proxies({
                // As for HTTP: a client behind `[gateway] trusted_proxies` is the address they
                // vouch for, for the per-client limits.
                let trusted = shared.config.trusted.clone();
                stipendex::http::TrustedProxies::matching(move |ip| {
                    trusted.iter().any(|n| n.contains(ip))
                })
            });
            if let Some(p) = mcp_paywall(&shared.config, &schemes)? {
                server = server.with_x402(p)?;
            }
            let descriptor = shared.receiver.descriptor();
            let endpoint =
                stipendex::mcp::streamable_http(
                    &shared.config.mcp_path,
                    move || Ok(server.clone()),
                )
                .layer(axum::middleware::from_fn_with_state(
                    shared.clone(),
                    mcp_guard,
                ));
            public_routes
                .route(
                    stipendex::http::WELL_KNOWN,
                    get(move || {
                        let d = descriptor.clone();
                        async move { axum::Json(d) }
                    }),
                )
                .fallback_service(endpoint)
        }
    };
    let router = match discovery {
        Some(d) => router.merge(d.with_state(())),
        None => router,
    };
    let router = router
        .layer(axum::middleware::from_fn_with_state(
            shared.clone(),
            ops::access,
        ))
        .with_state(shared.clone());
    Ok((router, shared))
}

/// A start-up warning, one line on standard error (the logs may be JSON, or filtered out).
#[allow(clippy::print_stderr)]
fn warn(what: &str) {
    eprintln!("stipendex gateway: warning: {what}");
}

/// One log line per priced MCP call, with what the gate did and the amount paid (the HTTP
/// access line of an MCP request says `POST /mcp` only).
fn log_mcp_outcome(o: &stipendex::http::Outcome) {
    use stipendex::http::Outcome;
    let (outcome, rail, amount) = match o {
        Outcome::Quoted { refusal: None } => ("quoted", None, None),
        Outcome::Quoted { refusal: Some(_) } => ("refused", None, None),
        Outcome::Paid { rail, amount } => ("paid", Some(rail.as_str()), Some(amount)),
        Outcome::Replayed => ("replayed", None, None),
        Outcome::Rejected => ("rejected", None, None),
        Outcome::TabCall {
            amount,
            replayed: false,
        } => ("tab_call", None, Some(amount)),
        Outcome::TabCall {
            amount,
            replayed: true,
        } => ("tab_replayed", None, Some(amount)),
        _ => ("other", None, None),
    };
    let refusal = match o {
        Outcome::Quoted { refusal: Some(r) } => r.as_str(),
        _ => "",
    };
    tracing::info!(
        target: "stipendex::gateway",
        binding = "mcp",
        outcome,
        rail = rail.unwrap_or(""),
        amount = amount.map_or_else(String::new, |m| format!("{} {}", m.amount(), m.asset().code())),
        refusal,
        "mcp call"
    );
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

/// Binds `[gateway] ops_listen` and serves the operations there ([`ops::router`]) until
/// `stopping` turns true; says where on standard output.
async fn serve_operations(
    at: SocketAddr,
    shared: Arc<Shared>,
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
    let serve = axum::serve(listener, ops::router(shared)).with_graceful_shutdown(async move {
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
    let (router, shared) = build(config).await?;
    // Records kept after payment (claims, kept answers, settled marks) expire; the store is
    // swept of them while the gateway runs.
    let _purge = store_of(&shared)
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
        Some(at) => Some(serve_operations(at, shared.clone(), stopping_rx.clone()).await?),
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
        router.into_make_service_with_connect_info::<SocketAddr>(),
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
