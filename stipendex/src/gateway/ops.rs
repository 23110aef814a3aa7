//! Operations — `/healthz`, `/readyz`, Prometheus metrics (`/metrics`) — served on their own
//! address (`[gateway] ops_listen`), never on the public one; the public
//! `/.well-known/agent.json`, and one JSON log line per public request.
//!
//! Who may read the operations is decided by where they are served, not by the TCP peer: a
//! reverse proxy on the same host reaches the public listener from loopback, so a peer check
//! there would serve the metrics to the whole Internet.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::http::Outcome;
use crate::registry::{Dependency, Probes};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

use super::Shared;

/// The upstream latency histogram's bounds, in microseconds (integers: no float arithmetic).
const BUCKETS: &[u128] = &[
    1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000,
    5_000_000, 10_000_000,
];

/// Microseconds written as seconds (`2500` → `0.002500`).
fn seconds(micros: u128) -> String {
    format!("{}.{:06}", micros / 1_000_000, micros % 1_000_000)
}

/// Counters and the upstream latency histogram.
#[derive(Default)]
pub(crate) struct Metrics {
    counters: Mutex<BTreeMap<Cow<'static, str>, u64>>,
    /// Requests by outcome and status: the per-request counter, kept without an allocation.
    requests: Mutex<HashMap<(&'static str, u16), u64>>,
    latency: Mutex<Histogram>,
}

#[derive(Default)]
struct Histogram {
    counts: Vec<u64>,
    sum_micros: u128,
    total: u64,
}

/// A label value as Prometheus' text format writes it.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metrics {
    fn count(&self, series: impl Into<Cow<'static, str>>) {
        if let Ok(mut c) = self.counters.lock() {
            *c.entry(series.into()).or_default() += 1;
        }
    }

    fn request(&self, outcome: &'static str, status: u16) {
        if let Ok(mut r) = self.requests.lock() {
            *r.entry((outcome, status)).or_default() += 1;
        }
    }

    /// What a gate did with a priced request: the quote, refusal and payment counters.
    pub(crate) fn observe(&self, o: &Outcome) {
        match o {
            Outcome::Quoted { refusal } => {
                self.count("stipendex_gateway_quotes_total");
                if let Some(r) = refusal {
                    self.count(format!(
                        "stipendex_gateway_refusals_total{{reason=\"{}\"}}",
                        label(r)
                    ));
                }
            }
            Outcome::Paid { rail, .. } => self.count(format!(
                "stipendex_gateway_payments_total{{rail=\"{}\",outcome=\"accepted\"}}",
                label(rail)
            )),
            Outcome::Replayed => {
                self.count("stipendex_gateway_payments_total{rail=\"-\",outcome=\"replayed\"}");
            }
            Outcome::AnswerGone => {
                self.count("stipendex_gateway_payments_total{rail=\"-\",outcome=\"answer_gone\"}");
            }
            Outcome::Rejected => self.count("stipendex_gateway_rejected_total"),
            _ => {}
        }
    }

    /// One answer of the upstream (or its absence), `outcome` = answered | timeout | error.
    pub(crate) fn upstream(&self, took: Duration, outcome: &'static str) {
        self.count(match outcome {
            "answered" => "stipendex_gateway_upstream_requests_total{outcome=\"answered\"}",
            "timeout" => "stipendex_gateway_upstream_requests_total{outcome=\"timeout\"}",
            _ => "stipendex_gateway_upstream_requests_total{outcome=\"error\"}",
        });
        if let Ok(mut h) = self.latency.lock() {
            if h.counts.is_empty() {
                h.counts = vec![0; BUCKETS.len()];
            }
            let micros = took.as_micros();
            for (i, b) in BUCKETS.iter().enumerate() {
                if micros <= *b
                    && let Some(c) = h.counts.get_mut(i)
                {
                    *c += 1;
                }
            }
            h.sum_micros += took.as_micros();
            h.total += 1;
        }
    }

    /// The text exposition.
    fn render(&self) -> String {
        let mut out = String::new();
        out.push_str("# TYPE stipendex_gateway_requests_total counter\n");
        out.push_str("# TYPE stipendex_gateway_quotes_total counter\n");
        out.push_str("# TYPE stipendex_gateway_payments_total counter\n");
        out.push_str("# TYPE stipendex_gateway_refusals_total counter\n");
        out.push_str("# TYPE stipendex_gateway_upstream_requests_total counter\n");
        if let Ok(r) = self.requests.lock() {
            let mut rows: Vec<_> = r.iter().collect();
            rows.sort_unstable();
            for ((outcome, status), n) in rows {
                out.push_str(&format!(
                    "stipendex_gateway_requests_total{{outcome=\"{outcome}\",status=\"{status}\"}} {n}\n"
                ));
            }
        }
        if let Ok(c) = self.counters.lock() {
            for (series, n) in c.iter() {
                out.push_str(&format!("{series} {n}\n"));
            }
        }
        out.push_str("# TYPE stipendex_gateway_upstream_seconds histogram\n");
        if let Ok(h) = self.latency.lock() {
            for (i, b) in BUCKETS.iter().enumerate() {
                let n = h.counts.get(i).copied().unwrap_or(0);
                out.push_str(&format!(
                    "stipendex_gateway_upstream_seconds_bucket{{le=\"{}\"}} {n}\n",
                    seconds(*b)
                ));
            }
            out.push_str(&format!(
                "stipendex_gateway_upstream_seconds_bucket{{le=\"+Inf\"}} {}\n",
                h.total
            ));
            out.push_str(&format!(
                "stipendex_gateway_upstream_seconds_sum {}\n",
                seconds(h.sum_micros)
            ));
            out.push_str(&format!(
                "stipendex_gateway_upstream_seconds_count {}\n",
                h.total
            ));
        }
        out
    }
}

/// `GET /healthz`: the process serves.
pub(crate) async fn healthz() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

impl super::UpstreamReady {
    /// Also reports `dependencies` (what the rails need: an x402 facilitator) on `/readyz`,
    /// each probed at most once per [`Probes::PERIOD`] however often `/readyz` is asked.
    #[must_use]
    pub fn with_dependencies(mut self, dependencies: Vec<Arc<dyn Dependency>>) -> Self {
        self.dependencies = Probes::new(dependencies);
        self
    }
}

/// `GET /readyz`: the store answers, the upstream is reachable and so is every service the
/// rails depend on (an x402 facilitator, probed with `GET {facilitator_url}/supported` at most
/// every 5 s); otherwise 503, naming each that is not (`facilitator <url> unreachable: …`).
pub(crate) async fn readyz(State(s): State<Arc<Shared>>) -> Response {
    let mut failing: Vec<String> = Vec::new();
    if let Some(store) = &s.store
        && let Err(e) = store.get("stipendex/gateway/ready", "probe").await
    {
        tracing::warn!(error = %e, "readyz: the store does not answer");
        failing.push("store".into());
    }
    let up = match &s.session {
        Some(m) if m.closed() => false,
        // A stdio upstream lives as long as its session; a URL one is checked as an HTTP
        // upstream is.
        Some(_) if matches!(s.config.upstream, super::Upstream::McpCommand(_)) => true,
        _ => s.ready.health.up().await,
    };
    if !up {
        failing.push("upstream".into());
    }
    failing.extend(s.ready.dependencies.failing().await);
    if failing.is_empty() {
        axum::Json(json!({"status": "ready"})).into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "not_ready", "failing": failing})),
        )
            .into_response()
    }
}

/// `GET /metrics`: Prometheus' text format (the counters say who pays for what: served on the
/// operations address only, see [`router`]).
pub(crate) async fn metrics(State(s): State<Arc<Shared>>) -> Response {
    let mut r = s.metrics.render().into_response();
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4"),
    );
    r
}

/// The operations listener's routes (`[gateway] ops_listen`): `/healthz`, `/readyz` and
/// `/metrics`, and nothing else — every other path is 404, so the operations address is never
/// a second way into the API. Its requests are not logged nor counted as the public's.
pub(crate) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { (StatusCode::NOT_FOUND, "not an operations endpoint\n") })
        .with_state(shared)
}

/// `GET /.well-known/agent.json`: the service's registration — its web and MCP endpoints, the
/// payments it takes and its trust model (`docs/exact-algo.md` §7).
pub(crate) fn agent_json(s: &Shared) -> Value {
    let origin = s.receiver.origins().first().cloned().unwrap_or_default();
    let d = s.receiver.descriptor();
    let schemes: Vec<Value> = s
        .schemes
        .iter()
        .map(|sc| {
            let i = sc.info();
            json!({"scheme": i.scheme, "network": i.network, "label": i.label})
        })
        .collect();
    let mut endpoints = serde_json::Map::new();
    if s.config.upstream.is_mcp() {
        endpoints.insert(
            "mcp".into(),
            json!(format!("{origin}{}", s.config.mcp_path)),
        );
    } else {
        endpoints.insert("web".into(), json!(origin));
    }
    json!({
        "name": d.id,
        "endpoints": endpoints,
        "payments": {
            "stipendex": {
                "version": "0.1",
                "descriptor": crate::http::WELL_KNOWN,
                "rails": d.rails,
                "profiles": d.profiles,
                "bindings": if s.config.upstream.is_mcp() { json!(["mcp"]) } else { json!(["http"]) },
            },
            "x402": {
                "supported": !schemes.is_empty(),
                "version": 2,
                "schemes": schemes,
            },
        },
        "trust": {
            "model": "Quotes and Receipts are JWS signed with the receiver's Ed25519 key; payments are verified on their rail before a request is forwarded",
            "key": d.key,
            "origins": d.origins,
            "registry": d.trust_registry,
        },
    })
}

/// One log line per priced MCP call, with what the gate did and the amount paid (the HTTP
/// access line of an MCP request says `POST /mcp` only).
pub(crate) fn log_mcp_outcome(o: &Outcome) {
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

/// One JSON log line per request (method, path without its query, status, what was paid and
/// over which rail, the time taken) and the request counters. Never a header: keys and payment
/// payloads stay out of the logs.
pub(crate) async fn access(State(s): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let paid_x402 =
        req.headers().contains_key("payment-signature") || req.headers().contains_key("x-payment");
    let resp = next.run(req).await;
    let status = resp.status().as_u16();
    let seen = resp.extensions().get::<Outcome>();
    if let Some(o) = seen {
        s.metrics.observe(o);
    }
    let (outcome, rail, amount) = match seen {
        Some(Outcome::Quoted { refusal: None }) => ("quoted", None, None),
        Some(Outcome::Quoted { refusal: Some(_) }) => ("refused", None, None),
        Some(Outcome::Paid { rail, amount }) => (
            "paid",
            Some(rail.clone()),
            Some(format!("{} {}", amount.amount(), amount.asset().code())),
        ),
        Some(Outcome::Replayed) => ("replayed", None, None),
        Some(Outcome::AnswerGone) => ("answer_gone", None, None),
        Some(Outcome::Rejected) => ("rejected", None, None),
        Some(_) => ("other", None, None),
        // The x402 paywall's own answers (a plain x402 payment, settled or refused).
        None if resp.headers().contains_key("payment-response") => {
            s.metrics.count(
                "stipendex_gateway_payments_total{rail=\"x402\",outcome=\"accepted\"}".to_owned(),
            );
            ("paid", Some("x402".to_owned()), None)
        }
        None if status == 402 && paid_x402 => {
            s.metrics
                .count("stipendex_gateway_refusals_total{reason=\"x402\"}");
            ("refused", Some("x402".to_owned()), None)
        }
        None if status == 402 => ("quoted", None, None),
        None => ("forwarded", None, None),
    };
    s.metrics.request(outcome, status);
    tracing::info!(
        target: "stipendex::gateway",
        method = %method,
        path = %path,
        status,
        outcome,
        rail = rail.as_deref().unwrap_or(""),
        amount = amount.as_deref().unwrap_or(""),
        micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
        "request"
    );
    resp
}
