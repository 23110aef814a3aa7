//! The HTTP paywall (x402 v2 over HTTP, and v1 where a scheme speaks it): an axum middleware
//! that prices routes in one or several schemes, answers 402, and serves a paid request only
//! after its payment settled.
//!
//! ```text
//! GET /weather                          -> 402, body = PaymentRequired, PAYMENT-REQUIRED = base64(body)
//! GET /weather  PAYMENT-SIGNATURE: ...  -> settle, then 200 + PAYMENT-RESPONSE (+ Cache-Control: private, no-store)
//! ```
//!
//! Rules, the same for every scheme:
//! - A route may accept several schemes; the 402 lists one `accepts[]` entry per scheme, in
//!   the route's order, and a payment is checked by the scheme it names.
//! - [`SettleWhen::Before`] (default) settles before the handler runs; [`SettleWhen::After`]
//!   verifies, runs the handler and settles only if it delivered (a 2xx or a 3xx; anything else
//!   is not charged, and a failed settlement withholds the handler's output);
//!   [`SettleWhen::AfterIfSafe`] settles after for `GET`, `HEAD`, `OPTIONS` and `TRACE` and
//!   before for every other method (work with effects is never done unpaid).
//! - Each payment is served at most once ([`ServedOnce`]), also across instances sharing a
//!   store: a replay gets a 402 with the scheme's "already used" code. A handler failure after
//!   settling releases the record: the same payment may be presented again (no second charge).
//! - `HEAD` is never charged (402 headers, no body); `OPTIONS` passes.
//! - Nothing a payer sends causes a 5xx by itself: a refusal is a 402 with a fresh challenge
//!   whose `error` is the scheme's code (and `reason` a finer one); an unknown outcome is a 503
//!   with `Retry-After`: send the **same** payment again.
//! - With a scheme that speaks x402 v1 on the route, the 402's JSON body is v1's (v1 clients
//!   read the body; v2 clients read `PAYMENT-REQUIRED`, which stays v2 and lists every
//!   scheme), and `X-PAYMENT` is accepted and answered with `X-PAYMENT-RESPONSE`. A
//!   `PAYMENT-SIGNATURE` always wins: a v2 exchange is never downgraded.

use std::fmt;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rail_core::route::{RoutePattern, decoded_segments, most_specific};
use rail_core::{SharedClock, SystemClock};
use serde_json::{Value, json};

use crate::scheme::{Accepts, Failure, Presented, Refusal, Settled};
use crate::served::ServedOnce;
use crate::settle::{SettleWhen, challenge, choose, price, response_header, take};
use crate::wire::{self, PaymentRequired, PaymentRequiredV1, RETRY_AFTER_SECS};

/// Decides, from the request path's percent-decoded segments (`/api/posts/%31` →
/// `["", "api", "posts", "1"]`), whether a matching request is priced at all. It must answer
/// `false` only when the handler would serve nothing billable (a post that does not exist), so
/// that nobody pays for a 404.
pub type RouteGuard = Arc<dyn Fn(&[String]) -> bool + Send + Sync>;

/// One priced route.
#[derive(Clone)]
pub struct PricedRoute {
    pattern: RoutePattern,
    description: String,
    accepts: Accepts,
    guard: Option<RouteGuard>,
}

impl fmt::Debug for PricedRoute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PricedRoute")
            .field("pattern", &self.pattern.as_str())
            .field("description", &self.description)
            .field("accepts", &self.accepts)
            .finish_non_exhaustive()
    }
}

impl PricedRoute {
    /// The path pattern (`/api/posts/{id}`).
    #[must_use]
    pub fn pattern(&self) -> &str {
        self.pattern.as_str()
    }

    /// What it sells.
    #[must_use]
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The ways to pay it.
    #[must_use]
    pub fn accepts(&self) -> &Accepts {
        &self.accepts
    }

    /// Whether the route prices a request for `path`: its guard (if any) accepts the path's
    /// decoded segments and it accepts at least one scheme.
    #[must_use]
    pub fn applies(&self, path: &str) -> bool {
        !self.accepts.is_empty()
            && self
                .guard
                .as_ref()
                .is_none_or(|g| g(&decoded_segments(path)))
    }

    fn speaks_v1(&self) -> bool {
        self.accepts
            .as_slice()
            .iter()
            .any(|a| a.scheme.info().v1_network.is_some())
    }
}

/// Priced routes, the served-once record and the clock. Cheap to clone.
///
/// Routes are patterns of the one syntax of `rail_core::route` (`/api/posts/{id}`,
/// `/files/{*path}`, `/api/*`), matched on the percent-decoded request path of the router the
/// layer is applied to (apply it to the top-level router), so no spelling of a priced path
/// escapes its price. The most specific matching route wins (the first declared among equals).
#[derive(Clone)]
pub struct Paywall {
    routes: Arc<Vec<PricedRoute>>,
    served: ServedOnce,
    clock: SharedClock,
    settle_when: SettleWhen,
}

impl fmt::Debug for Paywall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Paywall")
            .field("routes", &self.routes)
            .field("settle_when", &self.settle_when)
            .finish_non_exhaustive()
    }
}

impl Default for Paywall {
    fn default() -> Self {
        Paywall::new()
    }
}

impl Paywall {
    /// A paywall with no priced routes, remembering served payments in memory (use
    /// [`Paywall::with_store`] to share them between instances).
    #[must_use]
    pub fn new() -> Self {
        Paywall {
            routes: Arc::new(Vec::new()),
            served: ServedOnce::default(),
            clock: Arc::new(SystemClock),
            settle_when: SettleWhen::Before,
        }
    }

    crate::settle::surface_builders!("When to settle (default [`SettleWhen::Before`]).");

    /// Prices the path pattern `pattern`, payable in each of `accepts`.
    #[must_use]
    pub fn route(self, pattern: &str, description: &str, accepts: Accepts) -> Self {
        self.push(pattern, description, accepts, None)
    }

    /// As [`Paywall::route`], priced only when `guard` accepts the decoded path segments (see
    /// [`RouteGuard`]).
    #[must_use]
    pub fn route_when(
        self,
        pattern: &str,
        description: &str,
        accepts: Accepts,
        guard: RouteGuard,
    ) -> Self {
        self.push(pattern, description, accepts, Some(guard))
    }

    fn push(
        mut self,
        pattern: &str,
        description: &str,
        accepts: Accepts,
        guard: Option<RouteGuard>,
    ) -> Self {
        Arc::make_mut(&mut self.routes).push(PricedRoute {
            pattern: RoutePattern::parse(pattern),
            description: description.to_owned(),
            accepts,
            guard,
        });
        self
    }

    /// Every priced route, in order.
    #[must_use]
    pub fn routes(&self) -> &[PricedRoute] {
        &self.routes
    }

    /// The served-once record.
    #[must_use]
    pub fn served(&self) -> &ServedOnce {
        &self.served
    }

    /// The route pricing a request for `path`, `None` if it is free.
    #[must_use]
    pub fn route_for(&self, path: &str) -> Option<&PricedRoute> {
        let decoded = decoded_segments(path);
        most_specific(self.routes.iter().map(|r| (&r.pattern, r)), &decoded)
            .filter(|r| r.guard.as_ref().is_none_or(|g| g(&decoded)))
            .filter(|r| !r.accepts.is_empty())
    }

    /// The route declared with exactly `pattern` (as written), whatever it matches.
    #[must_use]
    pub fn route_named(&self, pattern: &str) -> Option<&PricedRoute> {
        self.routes.iter().find(|r| r.pattern.as_str() == pattern)
    }

    /// Puts the paywall in front of every route of `router` (apply it to the top-level
    /// router: prices are matched on the full request path).
    pub fn apply<S: Clone + Send + Sync + 'static>(&self, router: Router<S>) -> Router<S> {
        router.layer(axum::middleware::from_fn_with_state(
            self.clone(),
            paywall_middleware,
        ))
    }

    /// The 402 body (v2) for a request of `path` (`url` its full URL) on `route`, with a fresh
    /// challenge from each scheme, `error` set to `refusal`'s code or the unpaid text.
    ///
    /// # Errors
    /// [`Failure::Unknown`] if a scheme cannot issue its challenge now.
    pub async fn payment_required(
        &self,
        route: &PricedRoute,
        path: &str,
        url: &str,
        refusal: Option<&Refusal>,
    ) -> Result<(PaymentRequired, Option<PaymentRequiredV1>), Failure> {
        let c = challenge(
            route.accepts.as_slice(),
            path,
            url,
            &route.description,
            refusal,
        )
        .await?;
        let v1 = route.speaks_v1().then(|| PaymentRequiredV1 {
            x402_version: wire::V1::default(),
            error: c.required.error.clone(),
            accepts: c.v1,
        });
        Ok((c.required, v1))
    }
}

fn set(h: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(HeaderName::from_static(name), v);
    }
}

/// The 402 for `pr` (the body is `v1` when given, else `pr`; `PAYMENT-REQUIRED` is always
/// base64 of `pr`'s JSON; no body for `HEAD`), with a failed settlement's JSON in
/// `response_header` when there is one.
#[must_use]
pub fn payment_required_response(
    pr: &PaymentRequired,
    v1: Option<&PaymentRequiredV1>,
    head: bool,
    response_header: Option<(&'static str, &Value)>,
) -> Response {
    let body = match v1 {
        Some(v1) => serde_json::to_vec(v1),
        None => serde_json::to_vec(pr),
    };
    let (Ok(body), Ok(encoded)) = (body, pr.to_header()) else {
        return internal("cannot encode the 402");
    };
    let mut h = HeaderMap::new();
    set(&mut h, wire::PAYMENT_REQUIRED, &encoded);
    if let Some((name, value)) = response_header
        && let Ok(v) = wire::encode_base64_json(value)
    {
        set(&mut h, name, &v);
    }
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let body = if head {
        Body::empty()
    } else {
        Body::from(body)
    };
    (StatusCode::PAYMENT_REQUIRED, h, body).into_response()
}

/// A 503 with `Retry-After`: the outcome is unknown, send the same payment again.
#[must_use]
pub fn unavailable_response(error: &str, reason: Option<&str>, detail: &str) -> Response {
    let mut h = HeaderMap::new();
    h.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let mut body = json!({
        "error": error,
        "retryable": true,
        "retryAfterSeconds": RETRY_AFTER_SECS,
        "detail": detail,
    });
    if let (Some(r), Some(o)) = (reason, body.as_object_mut()) {
        o.insert("reason".into(), Value::String(r.to_owned()));
    }
    (StatusCode::SERVICE_UNAVAILABLE, h, axum::Json(body)).into_response()
}

fn internal(what: &str) -> Response {
    tracing::error!(what, "x402: cannot build a response");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        axum::Json(json!({"error": "internal error"})),
    )
        .into_response()
}

/// The request's URL as the payer sees it (behind a TLS-terminating proxy the scheme is the
/// proxy's, from `X-Forwarded-Proto`).
#[must_use]
pub fn resource_url(req: &Request) -> String {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
    };
    let scheme = header("x-forwarded-proto")
        .filter(|p| p == "https" || p == "http")
        .unwrap_or_else(|| "http".into());
    let host = header("host").unwrap_or_else(|| "localhost".into());
    let path_and_query = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), ToString::to_string);
    format!("{scheme}://{host}{path_and_query}")
}

/// The one value of header `name`: `Some(Err(()))` when it is sent twice or is not visible
/// ASCII.
fn one_header(h: &HeaderMap, name: &'static str) -> Option<Result<String, ()>> {
    let mut all = h.get_all(name).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return Some(Err(()));
    }
    Some(first.to_str().map(str::to_owned).map_err(|_| ()))
}

struct Ctx<'a> {
    paywall: &'a Paywall,
    route: &'a PricedRoute,
    path: String,
    url: String,
}

impl Ctx<'_> {
    async fn challenge(
        &self,
        refusal: Option<&Refusal>,
        head: bool,
        presented: Option<&Presented>,
        scheme: Option<&dyn crate::Scheme>,
    ) -> Response {
        match self
            .paywall
            .payment_required(self.route, &self.path, &self.url, refusal)
            .await
        {
            Ok((pr, v1)) => {
                let v1_payment = presented.is_some_and(Presented::is_v1);
                let response =
                    refusal
                        .and_then(|r| r.response.as_ref())
                        .map(|v| match (v1_payment, scheme) {
                            (true, Some(s)) => (wire::X_PAYMENT_RESPONSE, s.v1_response(v)),
                            _ => (wire::PAYMENT_RESPONSE, v.clone()),
                        });
                payment_required_response(
                    &pr,
                    v1.as_ref(),
                    head,
                    response.as_ref().map(|(n, v)| (*n, v)),
                )
            }
            Err(f) => {
                tracing::warn!(path = %self.path, failure = %f, "x402: cannot issue a challenge");
                self.failure(f, None, None).await
            }
        }
    }

    async fn failure(
        &self,
        f: Failure,
        presented: Option<&Presented>,
        scheme: Option<&dyn crate::Scheme>,
    ) -> Response {
        match f {
            Failure::Refused(r) => {
                tracing::info!(path = %self.path, error = %r.error, reason = ?r.reason, detail = %r.detail, "x402: payment refused");
                Box::pin(self.challenge(Some(&r), false, presented, scheme)).await
            }
            Failure::Unknown {
                error,
                reason,
                detail,
            } => {
                tracing::warn!(path = %self.path, error = %error, detail = %detail, "x402: payment outcome unknown");
                unavailable_response(&error, reason.as_deref(), &detail)
            }
        }
    }
}

fn paid(
    mut resp: Response,
    settled: &Settled,
    presented: &Presented,
    scheme: &dyn crate::Scheme,
) -> Response {
    let (name, value) = response_header(settled, presented, scheme);
    match wire::encode_base64_json(&value) {
        Ok(v) => set(resp.headers_mut(), name, &v),
        Err(e) => {
            tracing::error!(tx = %settled.transaction, error = %e, "x402: cannot encode the receipt header");
        }
    }
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    resp
}

/// The payment a request on `route` presents: `PAYMENT-SIGNATURE` (v2, whatever else the
/// request carries), else `X-PAYMENT` when a scheme of the route speaks v1; `None` when it
/// presents none, a refusal when the header is sent twice or is not visible ASCII.
#[must_use]
pub fn presented(route: &PricedRoute, h: &HeaderMap) -> Option<Result<Presented, Refusal>> {
    let header = match one_header(h, wire::PAYMENT_SIGNATURE) {
        Some(v) => v.map(Presented::Header),
        None if route.speaks_v1() => one_header(h, wire::X_PAYMENT)?.map(Presented::V1Header),
        None => return None,
    };
    Some(header.map_err(|()| {
        let first = route.accepts.as_slice().first();
        let why = "the payment header is sent twice or is not visible ASCII";
        first.map_or_else(
            || Refusal::new(wire::PAYMENT_REQUIRED_ERROR, why),
            |a| a.scheme.malformed(why),
        )
    }))
}

impl Paywall {
    /// The answer to a payment on `route` that did not settle (`path` the request's path,
    /// `url` its URL): a refusal is a 402 with a fresh challenge naming it (and a failed
    /// settlement's `PAYMENT-RESPONSE`, or v1's `X-PAYMENT-RESPONSE` for a v1 `presented`), an
    /// unknown outcome a 503 with `Retry-After`.
    pub async fn failure_response(
        &self,
        route: &PricedRoute,
        path: &str,
        url: &str,
        failure: Failure,
        presented: Option<&Presented>,
        scheme: Option<&dyn crate::Scheme>,
    ) -> Response {
        let ctx = Ctx {
            paywall: self,
            route,
            path: path.to_owned(),
            url: url.to_owned(),
        };
        ctx.failure(failure, presented, scheme).await
    }
}

/// The paywall middleware, for `axum::middleware::from_fn_with_state(paywall,
/// paywall_middleware)` (or use [`Paywall::apply`]).
pub async fn paywall_middleware(
    State(paywall): State<Paywall>,
    req: Request,
    next: Next,
) -> Response {
    if req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    // A path that could mean another path to the server behind (an encoded `/`, a `;`, `..`,
    // an invalid escape…) is refused before any decision: it could be priced under one
    // spelling and served under another.
    if let Err(why) = rail_core::route::canonical_path(req.uri().path()) {
        return (
            StatusCode::BAD_REQUEST,
            axum::Json(json!({"error": "bad_request", "message": format!("{why}: request the resource by its canonical path")})),
        )
            .into_response();
    }
    let Some(route) = paywall.route_for(req.uri().path()) else {
        return next.run(req).await;
    };
    serve(&paywall, route, req, next).await
}

/// The paywall's answer for a request on `route`, decided by the caller (the Stipendex HTTP
/// binding decides once, for both protocols): a 402, or the handler after the payment.
pub async fn serve(paywall: &Paywall, route: &PricedRoute, req: Request, next: Next) -> Response {
    let ctx = Ctx {
        paywall,
        route,
        path: req.uri().path().to_owned(),
        url: resource_url(&req),
    };
    if req.method() == Method::HEAD {
        // HEAD is never charged: it only shows what a GET would cost.
        return ctx.challenge(None, true, None, None).await;
    }
    let Some(presented) = presented(route, req.headers()) else {
        return ctx.challenge(None, false, None, None).await;
    };
    let Some(first) = route.accepts.as_slice().first() else {
        return next.run(req).await;
    };
    let presented = match presented {
        Ok(p) => p,
        Err(r) => return ctx.failure(Failure::Refused(r), None, None).await,
    };
    let accept = choose(route.accepts.as_slice(), &presented).unwrap_or(first);
    let scheme = accept.scheme.as_ref();
    let p = price(accept, &ctx.path, &ctx.url, &route.description);
    let taken = match take(accept, p, &presented, &paywall.served, paywall.clock.now()).await {
        Ok(t) => t,
        Err(f) => return ctx.failure(f, Some(&presented), Some(scheme)).await,
    };
    // A delivered answer: 2xx, or a 3xx (a redirect the work chose — a presigned download —
    // is what was paid for).
    let success = |r: &Response| r.status().is_success() || r.status().is_redirection();
    let outcome = match paywall.settle_when.for_method(Some(req.method().as_str())) {
        SettleWhen::After => taken.verify_run_settle(|| next.run(req), success).await,
        _ => match taken.settle().await {
            Ok(paid) => paid.run(|| next.run(req), success).await,
            Err(f) => Err(f),
        },
    };
    match outcome {
        Ok((resp, Some(settled))) => paid(resp, &settled, &presented, scheme),
        // Settle-after: the handler failed, nothing was charged.
        Ok((resp, None)) => resp,
        Err(f) => ctx.failure(f, Some(&presented), Some(scheme)).await,
    }
}
