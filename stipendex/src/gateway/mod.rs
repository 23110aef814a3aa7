//! A paid front for an existing HTTP API or MCP server (feature `gateway`): the receiver's HTTP
//! binding (or its MCP gate) around a forwarding handler, so a service that knows nothing of
//! payments is priced, paid, forwarded once and receipted. `stipendex gateway` is this module
//! behind one TOML file; a Rust program embeds it with [`Gateway::assemble`].
//!
//! Per request: the receiver's one route table decides; a free route is forwarded untouched; a
//! priced one answers 402 (a signed Quote, merged with the x402 challenge where an x402-style
//! rail receives the price's asset) until paid, then is forwarded once and answered with
//! `Stipendex-Receipt` (or `PAYMENT-RESPONSE`); the answer is kept for a lost-answer replay.
//!
//! Delivery is at most once per payment: if an instance stops after forwarding and before the
//! answer is kept, the same payment again is forwarded again only for an idempotent method
//! (`GET`, `HEAD`, `PUT`, `DELETE`); any other gets `409 outcome_unknown` (a checkout's hold
//! stays until its expiry voids it). A paid request is not forwarded — nor its payment taken,
//! whatever the way to pay — while the upstream cannot be reached (the receiver's one guard,
//! [`UpstreamReady`]: 503, send the same payment again later); a forward that reaches no
//! upstream (the connection refused) is kept as nobody's answer and charges nothing
//! ([`crate::http::Undelivered`]).
//!
//! | file | what |
//! | --- | --- |
//! | `mod.rs` | [`Settings`], [`Upstream`], [`Parts`], [`Gateway::assemble`]: the router |
//! | `forward.rs` | the HTTP upstream: a reverse proxy (hop-by-hop and payment headers stripped, bodies streamed) |
//! | `mcp.rs` | the MCP upstream: one session (stdio or Streamable HTTP) behind the MCP gate |
//! | `ops.rs` | `/healthz`, `/readyz`, `/metrics` (their own listener), `/.well-known/agent.json`, the access log |
//! | `resolve.rs` | [`RemotePrice`]: dynamic prices from an HTTP endpoint |
//!
//! ```no_run
//! # async fn demo(receiver: stipendex::receiver::Receiver) -> Result<(), stipendex::Error> {
//! use stipendex::gateway::{Gateway, Parts, Settings, Upstream};
//!
//! let upstream = Upstream::Http("http://127.0.0.1:8080".parse().map_err(|_| {
//!     stipendex::Error::Gateway("not a URL".into())
//! })?);
//! let gateway = Gateway::assemble(Settings::new(upstream), Parts::new(receiver)).await?;
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8402").await
//!     .map_err(|e| stipendex::Error::Gateway(e.to_string()))?;
//! axum::serve(
//!     listener,
//!     gateway.router().into_make_service_with_connect_info::<std::net::SocketAddr>(),
//! )
//! .await
//! .map_err(|e| stipendex::Error::Gateway(e.to_string()))?;
//! # Ok(())
//! # }
//! ```

mod forward;
mod mcp;
mod ops;
mod resolve;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rail_core::KeyStore;
use serde::Deserialize;
use serde_json::json;
use x402_transport::paywall::Paywall;
use x402_transport::{Accepts, Scheme, SettleWhen};

use crate::Error;
use crate::http::{Binding, IpNet};
use crate::receiver::{Price, PricedCapability, Receiver};

pub use resolve::RemotePrice;

/// The header an upstream names a checkout's final amount in (a decimal in the route's asset),
/// by default.
pub const FINAL_AMOUNT: &str = "x-stipendex-final-amount";

/// Where the paid requests go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// An HTTP API: requests are reverse-proxied to this base URL.
    Http(url::Url),
    /// An MCP server over Streamable HTTP.
    McpUrl(String),
    /// An MCP server started as a child process (program and arguments), spoken to over stdio.
    McpCommand(Vec<String>),
}

impl Upstream {
    /// Whether it is an MCP server (priced by tool, resource, prompt).
    #[must_use]
    pub fn is_mcp(&self) -> bool {
        !matches!(self, Upstream::Http(_))
    }
}

/// What to do when the price endpoint ([`RemotePrice`]) does not answer in time or answers
/// nonsense.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// Refuse the request (nothing charged, nothing forwarded).
    Reject,
    /// Quote the list price of the capability.
    ListPrice,
}

/// The dynamic-price endpoint ([`RemotePrice`]).
#[derive(Clone, Debug)]
pub struct Resolve {
    /// Where it is asked (`POST`).
    pub url: url::Url,
    /// How long it is waited for.
    pub timeout: Duration,
    /// What a failure means.
    pub on_failure: OnFailure,
}

/// How the gateway forwards: plain data (`stipendex gateway` reads it from its TOML file).
/// What is priced, and where clients reach the gateway, are the receiver's.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Settings {
    /// Where the paid requests go.
    pub upstream: Upstream,
    /// A shared secret header set on every forwarded request (a client's own is dropped), so
    /// the origin can refuse anything that did not come through the gateway.
    pub secret: Option<(HeaderName, HeaderValue)>,
    /// The header an HTTP upstream names a checkout's final amount in (default
    /// [`FINAL_AMOUNT`]).
    pub final_amount: HeaderName,
    /// How long the upstream is waited for (default 30 s).
    pub timeout: Duration,
    /// The largest request or answer body forwarded (default 10 MiB).
    pub max_body: usize,
    /// Peers whose `X-Forwarded-*` are kept, and whose vouched-for client is the one the
    /// per-client limits count.
    pub trusted: Vec<IpNet>,
    /// Where an MCP upstream is served (default `/mcp`).
    pub mcp_path: String,
}

impl Settings {
    /// Forwarding to `upstream`, every other setting at its default.
    #[must_use]
    pub fn new(upstream: Upstream) -> Self {
        Settings {
            upstream,
            secret: None,
            final_amount: HeaderName::from_static(FINAL_AMOUNT),
            timeout: Duration::from_secs(30),
            max_body: 10 * 1024 * 1024,
            trusted: Vec::new(),
            mcp_path: "/mcp".into(),
        }
    }

    /// Whether the peer `ip` is a trusted proxy (its `X-Forwarded-*` are kept).
    #[must_use]
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.iter().any(|n| n.contains(ip))
    }

    fn trusted_proxies(&self) -> crate::http::TrustedProxies {
        let trusted = self.trusted.clone();
        crate::http::TrustedProxies::matching(move |ip| trusted.iter().any(|n| n.contains(ip)))
    }
}

/// The gateway's answer to the receiver's one guard ([`Receiver::guard`], asked before any
/// payment of any kind is taken): its upstream takes connections (an HTTP API, an MCP URL) and
/// its MCP session is open (a command). Give it to the receiver's builder
/// (`Receiver::builder(…).ready(…)`) and to [`Parts::ready`].
pub struct UpstreamReady {
    health: forward::Health,
    session: std::sync::OnceLock<Arc<mcp::Session>>,
    /// What the rails depend on (an x402 facilitator), for `/readyz` only.
    dependencies: crate::registry::Probes,
}

impl UpstreamReady {
    /// The guard of a gateway forwarding to `upstream`.
    #[must_use]
    pub fn new(upstream: &Upstream) -> Self {
        UpstreamReady {
            health: forward::Health::new(upstream),
            session: std::sync::OnceLock::new(),
            dependencies: crate::registry::Probes::default(),
        }
    }
}

#[async_trait::async_trait]
impl crate::receiver::Ready for UpstreamReady {
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
    config: Settings,
    receiver: Receiver,
    store: Option<Arc<dyn KeyStore>>,
    forward: Option<forward::Forward>,
    session: Option<Arc<mcp::Session>>,
    ready: Arc<UpstreamReady>,
    metrics: ops::Metrics,
    schemes: Vec<Arc<dyn Scheme>>,
}

/// The x402 schemes of `registry`'s rails that receive, each with the asset it is paid in.
#[must_use]
pub fn schemes_of(registry: &crate::Registry) -> Vec<(Arc<dyn Scheme>, rail_core::Asset)> {
    registry
        .rails()
        .filter_map(|e| {
            let scheme = e.scheme_receiver.clone()?;
            let asset = e.capabilities()?.assets.first()?.clone();
            Some((scheme, asset))
        })
        .collect()
}

/// The x402 offers of every fixed-price capability `keep` selects — each scheme receiving the
/// capability's asset — as (pattern, description, ways to pay). A checkout holds and captures:
/// x402's `exact` cannot, so it has none.
fn x402_offers(
    prices: &[PricedCapability],
    schemes: &[(Arc<dyn Scheme>, rail_core::Asset)],
    keep: impl Fn(&PricedCapability) -> bool,
) -> Result<Vec<(String, String, Accepts)>, Error> {
    let mut out = Vec::new();
    for cap in prices.iter().filter(|c| keep(c)) {
        let Price::Fixed(money) = &cap.price else {
            continue;
        };
        let mut accepts: Option<Accepts> = None;
        for (scheme, _) in schemes.iter().filter(|(_, a)| a == money.asset()) {
            let refused = |e: x402_transport::Error| {
                Error::Gateway(format!(
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
/// the receiver, under the receiver's record in its store (decision 0038).
fn paywall(
    prices: &[PricedCapability],
    schemes: &[(Arc<dyn Scheme>, rail_core::Asset)],
) -> Result<Option<Paywall>, Error> {
    let offers = x402_offers(prices, schemes, |_| true)?;
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

/// The MCP paywall beside the Quotes (x402's `isError` convention), if any tool has an x402
/// offer. Its payments are served by the receiver, as over HTTP.
fn mcp_paywall(
    prices: &[PricedCapability],
    schemes: &[(Arc<dyn Scheme>, rail_core::Asset)],
) -> Result<Option<x402_transport::mcp::McpPaywall>, Error> {
    let offers = x402_offers(prices, schemes, |c| c.method() == "tools/call")?;
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

/// The service as the rails' discovery documents describe it: its name, what it sells, its MCP
/// endpoint and its tools' fixed prices.
fn service_of(receiver: &Receiver, settings: &Settings) -> crate::registry::Service {
    let tools = receiver
        .capabilities()
        .iter()
        .filter(|c| c.method() == "tools/call")
        .filter_map(|c| match &c.price {
            Price::Fixed(m) => Some(crate::registry::Tool {
                name: c.name().to_owned(),
                description: c.description.clone().unwrap_or_else(|| c.name().to_owned()),
                price: m.clone(),
            }),
            _ => None,
        })
        .collect();
    let id = receiver.party().id.clone();
    crate::registry::Service {
        summary: format!(
            "{id} sells its {} per request through a Stipendex gateway: a signed Quote (Stipendex) or an x402 challenge on every priced request.",
            if settings.upstream.is_mcp() {
                "MCP tools"
            } else {
                "HTTP API"
            }
        ),
        name: id,
        docs_url: None,
        mcp_endpoint: settings
            .upstream
            .is_mcp()
            .then(|| settings.mcp_path.clone()),
        tools,
    }
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

/// What the gateway is built on besides its [`Settings`]: the receiver and what the rails
/// offer.
#[non_exhaustive]
pub struct Parts {
    /// The receiver: what is priced, where clients reach the gateway, the rails, the store.
    pub receiver: Receiver,
    /// The store swept and probed (`/readyz`): the receiver's.
    pub store: Option<Arc<dyn KeyStore>>,
    /// The x402 schemes offered beside the Quotes, each with the asset it is paid in
    /// ([`schemes_of`]).
    pub schemes: Vec<(Arc<dyn Scheme>, rail_core::Asset)>,
    /// A rail's discovery documents, if one publishes them (exact-algo's).
    pub discovery: Option<Arc<dyn crate::registry::Discovery>>,
    /// The receiver's guard, if it was built with this gateway's ([`UpstreamReady`]).
    pub ready: Option<Arc<UpstreamReady>>,
}

impl Parts {
    /// `receiver` alone: no x402 scheme, no discovery document, no store to probe, and the
    /// gateway's own guard (for `/readyz`; give the receiver an [`UpstreamReady`] for paid
    /// requests to be refused while the upstream is down).
    #[must_use]
    pub fn new(receiver: Receiver) -> Self {
        Parts {
            receiver,
            store: None,
            schemes: Vec::new(),
            discovery: None,
            ready: None,
        }
    }

    /// Everything `registry` offers: its store, its receiving x402 schemes, the first rail's
    /// discovery documents.
    #[must_use]
    pub fn from_registry(receiver: Receiver, registry: &crate::Registry) -> Self {
        Parts {
            receiver,
            store: registry.store().cloned(),
            schemes: schemes_of(registry),
            discovery: registry.rails().find_map(|e| e.discovery.clone()),
            ready: None,
        }
    }

    /// The receiver's guard, built with this gateway's [`UpstreamReady`].
    #[must_use]
    pub fn ready(mut self, ready: Arc<UpstreamReady>) -> Self {
        self.ready = Some(ready);
        self
    }
}

/// A gateway, assembled: its public router and its operations router.
pub struct Gateway {
    router: Router,
    shared: Arc<Shared>,
}

impl Gateway {
    /// Connects to the upstream (an MCP upstream's session is opened here) and builds the
    /// routes.
    ///
    /// # Errors
    /// [`Error::Gateway`] when the upstream's client cannot start, an MCP upstream cannot be
    /// reached or an x402 scheme cannot ask a price; the binding's [`Error::Config`].
    pub async fn assemble(settings: Settings, parts: Parts) -> Result<Gateway, Error> {
        let Parts {
            receiver,
            store,
            schemes,
            discovery,
            ready,
        } = parts;
        let ready = ready.unwrap_or_else(|| Arc::new(UpstreamReady::new(&settings.upstream)));
        let (forward, session) = match &settings.upstream {
            Upstream::Http(u) => (Some(forward::Forward::new(u)?), None),
            Upstream::McpUrl(_) | Upstream::McpCommand(_) => (
                None,
                Some(Arc::new(mcp::Session::connect(&settings.upstream).await?)),
            ),
        };
        let prices = receiver.capabilities().to_vec();
        let http_paywall = if session.is_none() {
            paywall(&prices, &schemes)?
        } else {
            None
        };
        let discovery =
            discovery.map(|d| d.router(&service_of(&receiver, &settings), http_paywall.as_ref()));
        if let Some(m) = &session {
            let _ = ready.session.set(m.clone());
        }
        let shared = Arc::new(Shared {
            ready,
            config: settings,
            receiver,
            store,
            forward,
            session,
            metrics: ops::Metrics::default(),
            schemes: schemes.iter().map(|(s, _)| s.clone()).collect(),
        });
        let agent = Arc::new(ops::agent_json(&shared));
        // Operations (`/healthz`, `/readyz`, `/metrics`) are not on the public router: they are
        // [`Gateway::operations`], for a listener of their own; on the public one, any such
        // path is the upstream's like any other unpriced one.
        let public_routes = Router::new().route(
            "/.well-known/agent.json",
            get(move || {
                let a = agent.clone();
                async move { axum::Json((*a).clone()) }
            }),
        );
        let router = match &shared.session {
            None => {
                // Behind trusted proxies, a client is the address they vouch for (the
                // per-client limits count it), as the forward's `X-Forwarded-For` says.
                let mut binding = Binding::new(shared.receiver.clone())?
                    .trusted_proxies(shared.config.trusted_proxies());
                if let Some(p) = http_paywall {
                    binding = binding.with_x402(p)?;
                }
                binding.apply(public_routes.fallback(forward::forward))
            }
            Some(session) => {
                let observed = shared.clone();
                let mut server = crate::mcp::PaidServer::new(
                    mcp::Forward(session.clone()),
                    shared.receiver.clone(),
                )?
                .on_outcome(move |o| {
                    observed.metrics.observe(o);
                    ops::log_mcp_outcome(o);
                })
                .trusted_proxies(shared.config.trusted_proxies());
                if let Some(p) = mcp_paywall(&prices, &schemes)? {
                    server = server.with_x402(p)?;
                }
                let descriptor = shared.receiver.descriptor();
                let endpoint =
                    crate::mcp::streamable_http(
                        &shared.config.mcp_path,
                        move || Ok(server.clone()),
                    )
                    .layer(axum::middleware::from_fn_with_state(
                        shared.clone(),
                        mcp_guard,
                    ));
                public_routes
                    .route(
                        crate::http::WELL_KNOWN,
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
        Ok(Gateway { router, shared })
    }

    /// The public routes: serve them with `into_make_service_with_connect_info::<SocketAddr>()`
    /// (the per-client limits and trusted proxies need the peer's address).
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    /// The operations' routes — `/healthz`, `/readyz`, `/metrics` and nothing else — for a
    /// listener of their own, never the public one (who may read them is decided by where they
    /// are served).
    pub fn operations(&self) -> Router {
        ops::router(self.shared.clone())
    }

    /// The store the gateway's records live in (to sweep expired ones), if any.
    #[must_use]
    pub fn store(&self) -> Option<&Arc<dyn KeyStore>> {
        self.shared.store.as_ref()
    }

    /// The names of the tools the MCP upstream lists (`None` for an HTTP upstream, or when it
    /// cannot say): a priced tool it does not list is never asked for.
    pub async fn upstream_tools(&self) -> Option<Vec<String>> {
        match &self.shared.session {
            Some(m) => m.tool_names().await,
            None => None,
        }
    }
}
