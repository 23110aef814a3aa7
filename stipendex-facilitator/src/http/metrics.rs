//! Counters and latencies per instance, in the Prometheus text format (`GET /metrics`), and
//! one structured access log line per request (never a key, a signature or a body).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::{App, Caller, Code};

/// Latency bucket bounds, in microseconds.
const BUCKETS_US: [u64; 12] = [
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000,
];

#[derive(Default)]
struct Histogram {
    buckets: [u64; BUCKETS_US.len()],
    count: u64,
    sum_us: u128,
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, &'static str, u16), u64>,
    refusals: BTreeMap<String, u64>,
    latency: BTreeMap<&'static str, Histogram>,
}

/// One instance's counters.
pub struct Metrics {
    instance: String,
    inner: Mutex<Inner>,
}

impl Metrics {
    /// Empty counters for `instance`.
    #[must_use]
    pub fn new(instance: &str) -> Self {
        Metrics {
            instance: instance.to_owned(),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Counts one answered request.
    pub fn record(
        &self,
        method: &str,
        route: &'static str,
        status: u16,
        code: Option<&str>,
        us: u64,
    ) {
        let Ok(mut m) = self.inner.lock() else { return };
        *m.requests
            .entry((method.to_owned(), route, status))
            .or_default() += 1;
        if let Some(c) = code {
            *m.refusals.entry(c.to_owned()).or_default() += 1;
        }
        let h = m.latency.entry(route).or_default();
        h.count += 1;
        h.sum_us += u128::from(us);
        for (b, bound) in h.buckets.iter_mut().zip(BUCKETS_US) {
            if us <= bound {
                *b += 1;
            }
        }
    }

    /// The Prometheus text.
    #[must_use]
    pub fn text(&self) -> String {
        let mut out = String::new();
        let Ok(m) = self.inner.lock() else { return out };
        let inst = escape(&self.instance);
        let _ = writeln!(
            out,
            "# HELP stipendex_facilitator_requests_total Requests answered, by route and status."
        );
        let _ = writeln!(out, "# TYPE stipendex_facilitator_requests_total counter");
        for ((method, route, status), n) in &m.requests {
            let _ = writeln!(
                out,
                "stipendex_facilitator_requests_total{{instance=\"{inst}\",method=\"{}\",route=\"{route}\",status=\"{status}\"}} {n}",
                escape(method)
            );
        }
        let _ = writeln!(
            out,
            "# HELP stipendex_facilitator_refusals_total Requests refused, by error code."
        );
        let _ = writeln!(out, "# TYPE stipendex_facilitator_refusals_total counter");
        for (code, n) in &m.refusals {
            let _ = writeln!(
                out,
                "stipendex_facilitator_refusals_total{{instance=\"{inst}\",code=\"{}\"}} {n}",
                escape(code)
            );
        }
        let _ = writeln!(
            out,
            "# HELP stipendex_facilitator_request_duration_seconds Time to answer, by route."
        );
        let _ = writeln!(
            out,
            "# TYPE stipendex_facilitator_request_duration_seconds histogram"
        );
        for (route, h) in &m.latency {
            for (n, bound) in h.buckets.iter().zip(BUCKETS_US) {
                let _ = writeln!(
                    out,
                    "stipendex_facilitator_request_duration_seconds_bucket{{instance=\"{inst}\",route=\"{route}\",le=\"{}\"}} {n}",
                    seconds(u128::from(bound))
                );
            }
            let _ = writeln!(
                out,
                "stipendex_facilitator_request_duration_seconds_bucket{{instance=\"{inst}\",route=\"{route}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "stipendex_facilitator_request_duration_seconds_sum{{instance=\"{inst}\",route=\"{route}\"}} {}",
                seconds(h.sum_us)
            );
            let _ = writeln!(
                out,
                "stipendex_facilitator_request_duration_seconds_count{{instance=\"{inst}\",route=\"{route}\"}} {}",
                h.count
            );
        }
        out
    }
}

/// Microseconds as decimal seconds, exactly (no float).
fn seconds(us: u128) -> String {
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The route a path was answered by, its ids replaced (`/v1/payments/{id}/redeem`): the
/// label stays bounded whatever the callers send.
pub(crate) fn route_of(path: &str) -> &'static str {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    match parts.as_slice() {
        ["", "v1", "health"] => "/v1/health",
        ["", "metrics"] => "/metrics",
        ["", "v1", "account"] => "/v1/account",
        ["", "v1", "payments"] => "/v1/payments",
        ["", "v1", "payments", _] => "/v1/payments/{id}",
        ["", "v1", "payments", _, "redeem"] => "/v1/payments/{id}/redeem",
        ["", "v1", "payments", _, "capture"] => "/v1/payments/{id}/capture",
        ["", "v1", "payments", _, "void"] => "/v1/payments/{id}/void",
        ["", "v1", "payments", _, "refund"] => "/v1/payments/{id}/refund",
        _ => "other",
    }
}

pub(super) async fn observe(State(app): State<App>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    // A bounded label: any other method (an unsigned caller may send any) is `other`.
    let method = match req.method().as_str() {
        m @ ("GET" | "POST" | "HEAD" | "PUT" | "DELETE" | "OPTIONS" | "PATCH") => m,
        _ => "other",
    }
    .to_owned();
    let route = route_of(req.uri().path());
    let resp = next.run(req).await;
    let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
    let status = resp.status().as_u16();
    let code = resp.extensions().get::<Code>().map(|c| c.0.as_str());
    let account = resp.extensions().get::<Caller>().map(|c| c.id.to_string());
    app.metrics.record(&method, route, status, code, us);
    tracing::info!(
        target: "stipendex_facilitator::access",
        instance = %app.fac.config().instance,
        method = %method,
        route,
        status,
        code = code.unwrap_or(""),
        account = account.as_deref().unwrap_or(""),
        us,
        "request"
    );
    resp
}

pub(super) async fn render(State(app): State<App>) -> Response {
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        app.metrics.text(),
    )
        .into_response()
}
