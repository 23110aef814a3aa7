//! The HTTP upstream: a reverse proxy. Method, query, headers and body go to the upstream as
//! they came (bodies streamed both ways, server-sent events included), the path in its one
//! canonical encoding (the segments the binding decided on), minus what is the gateway's
//! business:
//! - hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and what it names, `Keep-Alive`,
//!   `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`) both ways;
//! - payments ([`crate::http::PAYMENT_HEADERS`]: `Stipendex-Payment`, a tab's
//!   `Stipendex-Voucher` and `Stipendex-Tab`, `PAYMENT-SIGNATURE`, `X-PAYMENT`) never reach the
//!   upstream, and receipts or challenges the upstream writes
//!   ([`crate::http::PAYMENT_RESPONSE_HEADERS`]) never reach the client: only the gateway
//!   speaks for payments;
//! - `X-Forwarded-For`, `-Proto`, `-Host` and `Forwarded` from the client are dropped unless the
//!   peer is a trusted proxy, then set from the connection;
//! - the shared-secret header is set (a client's own is dropped), so the origin can refuse
//!   anything that did not come through the gateway;
//! - the final-amount header is read from the upstream's response only (a client's is dropped),
//!   for a checkout route, and never shown to the client.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::http::{Checkout, FinalAmount};
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt as _;
use rail_core::Money;
use serde_json::json;

use super::Shared;

/// Hop-by-hop headers (RFC 9110 §7.6.1), never forwarded either way.
const HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Payment headers: the gateway's, never the upstream's (the binding's one list of each).
const PAYMENT_IN: &[&str] = crate::http::PAYMENT_HEADERS;
const PAYMENT_OUT: &[&str] = crate::http::PAYMENT_RESPONSE_HEADERS;
const FORWARDED: &[&str] = &[
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
];

/// The reverse proxy to one HTTP upstream: hyper's pooled client for `http://` (the common
/// case: an API on the same host or network; the fewest allocations per request), reqwest
/// (rustls) for `https://`.
pub(crate) struct Forward {
    client: Client,
    base: String,
}

enum Client {
    Plain(
        Box<
            hyper_util::client::legacy::Client<
                hyper_util::client::legacy::connect::HttpConnector,
                Body,
            >,
        >,
    ),
    Tls(reqwest::Client),
}

/// Why a forward got no answer.
enum Failed {
    /// The request body was larger than allowed.
    TooLarge,
    /// No connection could be made: not a byte of the request reached the upstream.
    NotConnected(String),
    /// The connection broke after the request was (perhaps) sent.
    Unreachable(String),
}

impl Forward {
    pub(crate) fn new(base: &url::Url) -> Result<Self, crate::Error> {
        let client = if base.scheme() == "http" {
            let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
            connector.set_nodelay(true);
            connector.set_connect_timeout(Some(Duration::from_secs(5)));
            Client::Plain(Box::new(
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .pool_max_idle_per_host(256)
                    .build(connector),
            ))
        } else {
            // The workspace's one TLS provider.
            let _ = rustls::crypto::ring::default_provider().install_default();
            Client::Tls(
                reqwest::Client::builder()
                    .redirect(reqwest::redirect::Policy::none())
                    .connect_timeout(Duration::from_secs(5))
                    .pool_max_idle_per_host(256)
                    .build()
                    .map_err(|e| {
                        crate::Error::Gateway(format!(
                            "cannot start the upstream's HTTP client: {e}"
                        ))
                    })?,
            )
        };
        Ok(Forward {
            client,
            base: base.as_str().trim_end_matches('/').to_owned(),
        })
    }

    /// Sends one request; the answer's status, headers and streaming body.
    async fn send(
        &self,
        method: Method,
        url: String,
        headers: HeaderMap,
        body: Option<Body>,
        too_large: &AtomicBool,
    ) -> Result<(StatusCode, HeaderMap, Body), Failed> {
        let failed = |e: String| {
            if too_large.load(Ordering::SeqCst) {
                Failed::TooLarge
            } else {
                Failed::Unreachable(e)
            }
        };
        match &self.client {
            Client::Plain(c) => {
                let mut req = axum::http::Request::new(body.unwrap_or_else(Body::empty));
                *req.method_mut() = method;
                *req.uri_mut() = url
                    .parse()
                    .map_err(|e: axum::http::uri::InvalidUri| Failed::Unreachable(e.to_string()))?;
                *req.headers_mut() = headers;
                let resp = c.request(req).await.map_err(|e| {
                    if e.is_connect() {
                        Failed::NotConnected(e.to_string())
                    } else {
                        failed(e.to_string())
                    }
                })?;
                let (parts, incoming) = resp.into_parts();
                Ok((parts.status, parts.headers, Body::new(incoming)))
            }
            Client::Tls(c) => {
                let mut r = c.request(method, &url).headers(headers);
                if let Some(b) = body {
                    r = r.body(reqwest::Body::wrap_stream(b.into_data_stream()));
                }
                let resp = r.send().await.map_err(|e| {
                    if e.is_connect() {
                        Failed::NotConnected(e.without_url().to_string())
                    } else {
                        failed(e.without_url().to_string())
                    }
                })?;
                let status = resp.status();
                let headers = resp.headers().clone();
                Ok((status, headers, Body::from_stream(resp.bytes_stream())))
            }
        }
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let mut r = (
        status,
        axum::Json(json!({"error": code, "message": message})),
    )
        .into_response();
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// The headers named by `Connection` (also hop-by-hop).
fn connection_listed(h: &HeaderMap) -> Vec<String> {
    h.get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The request headers the upstream gets.
fn outbound(s: &Shared, incoming: &HeaderMap, peer: Option<IpAddr>) -> HeaderMap {
    let listed = connection_listed(incoming);
    let trusted = peer.is_some_and(|p| s.config.trusts(p));
    let mut out = HeaderMap::with_capacity(incoming.len() + 4);
    for (name, value) in incoming {
        let n = name.as_str();
        if HOP.contains(&n)
            || listed.iter().any(|l| l == n)
            || PAYMENT_IN.contains(&n)
            || n == "host"
            || n == s.config.final_amount.as_str()
            || s.config.secret.as_ref().is_some_and(|(h, _)| h == name)
            || (!trusted && FORWARDED.contains(&n))
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    if let Some(ip) = peer {
        let chain = match out.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
            Some(prev) if trusted => format!("{prev}, {ip}"),
            _ => ip.to_string(),
        };
        if let Ok(v) = HeaderValue::from_str(&chain) {
            out.insert(HeaderName::from_static("x-forwarded-for"), v);
        }
    }
    if !out.contains_key("x-forwarded-proto") {
        out.insert(
            HeaderName::from_static("x-forwarded-proto"),
            HeaderValue::from_static("http"),
        );
    }
    if !out.contains_key("x-forwarded-host")
        && let Some(h) = incoming.get(header::HOST)
    {
        out.insert(HeaderName::from_static("x-forwarded-host"), h.clone());
    }
    if let Some((name, value)) = &s.config.secret {
        out.insert(name.clone(), value.clone());
    }
    out
}

/// The fallback handler: every request the gateway does not answer itself.
pub(crate) async fn forward(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let Some(fwd) = s.forward.as_ref() else {
        return error(StatusCode::NOT_FOUND, "not_found", "no such path here");
    };
    let peer = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    if let Some(len) = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        && len > s.config.max_body as u64
    {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            &format!(
                "the request body is larger than this gateway accepts ({} bytes)",
                s.config.max_body
            ),
        );
    }
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    // A checkout's asset, from the binding's one decision.
    let checkout = req.extensions().get::<Checkout>().map(|c| c.0.clone());
    // The path the binding decided on, in its one canonical encoding: an upstream that decodes
    // differently still sees the segments that were priced (the binding refused every path
    // that has no canonical form; this refuses them again for a router without it).
    let canonical = match rail_core::route::canonical_path(&path) {
        Ok(c) => c,
        Err(why) => {
            return error(
                StatusCode::BAD_REQUEST,
                "bad_request",
                &format!("{why}: request the resource by its canonical path"),
            );
        }
    };
    let url = match req.uri().query() {
        Some(q) => format!("{}{}?{q}", fwd.base, canonical.encoded()),
        None => format!("{}{}", fwd.base, canonical.encoded()),
    };
    let headers = outbound(&s, req.headers(), peer);
    let empty = axum::body::HttpBody::size_hint(req.body()).exact() == Some(0);
    let max = s.config.max_body;
    let too_large = Arc::new(AtomicBool::new(false));
    // A request without a body (most GETs) goes without one: a stream would be sent chunked.
    let body = (!empty).then(|| {
        let flag = too_large.clone();
        Body::from_stream(
            req.into_body()
                .into_data_stream()
                .scan(0usize, move |seen, chunk| {
                    let out = match chunk {
                        Ok(c) => {
                            *seen = seen.saturating_add(c.len());
                            if *seen > max {
                                flag.store(true, Ordering::SeqCst);
                                Err(std::io::Error::other("the request body is too large"))
                            } else {
                                Ok(c)
                            }
                        }
                        Err(e) => Err(std::io::Error::other(e)),
                    };
                    futures::future::ready(Some(out))
                }),
        )
    });
    let started = Instant::now();
    let sent = fwd.send(method.clone(), url, headers, body, &too_large);
    // The timeout covers the upstream's answer up to its headers: a stream (SSE) then flows
    // for as long as the upstream keeps it open.
    let (status, upstream_headers, upstream_body) =
        match tokio::time::timeout(s.config.timeout, sent).await {
            Err(_) => {
                s.metrics.upstream(started.elapsed(), "timeout");
                return error(
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_timeout",
                    "the service behind this gateway did not answer in time",
                );
            }
            Ok(Err(Failed::TooLarge)) => {
                s.metrics.upstream(started.elapsed(), "error");
                return error(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too_large",
                    &format!("the request body is larger than this gateway accepts ({max} bytes)"),
                );
            }
            Ok(Err(Failed::NotConnected(e))) => {
                s.metrics.upstream(started.elapsed(), "error");
                s.ready.health.failed();
                tracing::warn!(error = %e, "the upstream refuses connections");
                // Nothing reached the upstream: the binding keeps nothing and charges nothing.
                let mut r = error(
                    StatusCode::BAD_GATEWAY,
                    "upstream_unavailable",
                    "the service behind this gateway cannot be reached",
                );
                r.extensions_mut().insert(crate::http::Undelivered);
                return r;
            }
            Ok(Err(Failed::Unreachable(e))) => {
                s.metrics.upstream(started.elapsed(), "error");
                s.ready.health.failed();
                tracing::warn!(error = %e, "the upstream cannot be reached");
                return error(
                    StatusCode::BAD_GATEWAY,
                    "upstream_unavailable",
                    "the service behind this gateway cannot be reached",
                );
            }
            Ok(Ok(r)) => r,
        };
    s.ready.health.ok();
    s.metrics.upstream(started.elapsed(), "answered");
    let listed = connection_listed(&upstream_headers);
    let mut out = Response::new(Body::empty());
    *out.status_mut() = status;
    let mut final_amount = None;
    for (name, value) in &upstream_headers {
        let n = name.as_str();
        if n == s.config.final_amount.as_str() {
            final_amount = Some(value.clone());
            continue;
        }
        if HOP.contains(&n) || listed.iter().any(|l| l == n) || PAYMENT_OUT.contains(&n) {
            continue;
        }
        out.headers_mut().append(name.clone(), value.clone());
    }
    if let Some(v) = final_amount
        && let Some(asset) = &checkout
    {
        let parsed = v
            .to_str()
            .ok()
            .and_then(|t| Money::parse(asset.clone(), t.trim()).ok());
        match parsed {
            Some(m) => {
                out.extensions_mut().insert(FinalAmount(m));
            }
            None => {
                tracing::error!(
                    header = %s.config.final_amount,
                    "the upstream's final amount is not a decimal in {}: the hold is voided",
                    asset.code()
                );
                return error(
                    StatusCode::BAD_GATEWAY,
                    "bad_final_amount",
                    "the service behind this gateway named a final amount that is not a price: nothing was captured",
                );
            }
        }
    }
    *out.body_mut() = upstream_body;
    out
}

/// Whether the upstream answers: known from the last good forward or probe for a moment, else
/// a TCP connect — one at a time. A paid request is refused (nothing charged) while it does not.
///
/// However many paid requests come — an outsider's flood of bogus payments included — the
/// upstream sees at most one probe in flight, and none while a good forward or probe vouches
/// for it ([`FRESH`]): the requests that arrive while a probe is in flight take its answer. A
/// refused connection is not cached: the first request after the upstream is back finds it.
pub(crate) struct Health {
    addr: Option<(String, u16)>,
    /// Until when the upstream counts as up.
    up_until: std::sync::Mutex<Option<Instant>>,
    /// The last probe: when it ended, and what it found.
    probed: std::sync::Mutex<Option<(Instant, bool)>>,
    /// Held by the one probe in flight.
    probe: tokio::sync::Mutex<()>,
}

/// How long a forward or a probe that reached the upstream vouches for it.
const FRESH: Duration = Duration::from_secs(2);

impl Health {
    pub(crate) fn new(upstream: &super::Upstream) -> Self {
        let url = match upstream {
            super::Upstream::Http(u) => Some(u.clone()),
            super::Upstream::McpUrl(u) => url::Url::parse(u).ok(),
            super::Upstream::McpCommand(_) => None,
        };
        let addr = url.and_then(|u| {
            u.host_str()
                .map(|h| (h.to_owned(), u.port_or_known_default().unwrap_or(80)))
        });
        Health {
            addr,
            up_until: std::sync::Mutex::new(None),
            probed: std::sync::Mutex::new(None),
            probe: tokio::sync::Mutex::new(()),
        }
    }

    /// A forward reached the upstream.
    pub(crate) fn ok(&self) {
        if let Ok(mut u) = self.up_until.lock() {
            *u = Some(Instant::now() + FRESH);
        }
    }

    /// A forward found no upstream.
    pub(crate) fn failed(&self) {
        if let Ok(mut u) = self.up_until.lock() {
            *u = None;
        }
    }

    fn fresh(&self) -> bool {
        self.up_until
            .lock()
            .ok()
            .and_then(|u| *u)
            .is_some_and(|t| Instant::now() < t)
    }

    /// Whether the upstream is reachable now.
    pub(crate) async fn up(&self) -> bool {
        if self.fresh() {
            return true;
        }
        let Some((host, port)) = &self.addr else {
            return true;
        };
        let arrived = Instant::now();
        let _one = self.probe.lock().await;
        // A probe that ended while this request waited for it: its answer.
        let waited = self
            .probed
            .lock()
            .ok()
            .and_then(|p| *p)
            .filter(|(ended, _)| *ended > arrived);
        if let Some((_, up)) = waited {
            return up;
        }
        if self.fresh() {
            return true;
        }
        let connected = tokio::time::timeout(
            Duration::from_secs(1),
            tokio::net::TcpStream::connect((host.as_str(), *port)),
        )
        .await;
        let up = matches!(connected, Ok(Ok(_)));
        if up {
            self.ok();
        }
        if let Ok(mut p) = self.probed.lock() {
            *p = Some((Instant::now(), up));
        }
        up
    }
}
