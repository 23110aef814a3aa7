//! The resource-server side of x402 over HTTP: an axum layer that prices routes, answers 402,
//! and serves a paid request only after its payment settled.
//!
//! ```text
//! GET /weather                          -> 402, body = PaymentRequired, PAYMENT-REQUIRED = base64(body)
//! GET /weather  PAYMENT-SIGNATURE: ...  -> settle, then 200 + PAYMENT-RESPONSE (+ Cache-Control: private, no-store)
//! ```
//!
//! Rules, each covered by a test:
//! - The payment must match the route's own requirements exactly (scheme, network, amount,
//!   asset, payTo, `maxTimeoutSeconds`, EIP-712 domain): a payment for a cheap route never
//!   unlocks a dear one. A mismatch is a 402 with `error: "No matching payment requirements"`,
//!   as the reference server says it.
//! - [`SettleWhen::Before`] (default) settles before the handler runs. [`SettleWhen::After`]
//!   verifies, runs the handler, and settles only if it succeeded; a handler failure (non-2xx)
//!   is not charged, and a failed settlement withholds the handler's output.
//! - Each authorization (`token`, `from`, `nonce`) is served at most once, also across server
//!   instances sharing a [`KeyStore`] (PostgreSQL): a replay gets a 402 with
//!   `invalid_exact_evm_nonce_already_used`. A crash after settling never settles twice: the
//!   facilitator's [`SettlementBook`](crate::facilitator::SettlementBook) answers the recorded
//!   transaction, and the payment can be presented again to be served.
//! - `HEAD` is never charged (402 headers, no body); `OPTIONS` passes.
//! - A malformed header is a 402 with the reason (`invalid_payload`), never a 5xx. A settlement
//!   whose outcome is unknown (facilitator down, timeout, 5xx) is a 503 with `Retry-After`:
//!   retry the **same** payment.
//!
//! A paid route in a few lines (a [`RemoteFacilitator`](crate::facilitator::RemoteFacilitator)
//! at `X402_FACILITATOR_URL`, or a [`LocalFacilitator`](crate::facilitator::LocalFacilitator)):
//!
//! ```no_run
//! # async fn demo(facilitator: std::sync::Arc<dyn rail_x402::facilitator::Facilitator>) {
//! use axum::{Router, routing::get};
//! use rail_x402::http::{Paywall, Token};
//!
//! let usdc = Token::new("eip155:84532", "0x036CbD53842c5426634e7929541eC2318f3dCF7e".parse().unwrap(), "USDC", "2");
//! let paywall = Paywall::new(facilitator, usdc, "0x209693Bc6afc0C5328bA36FaF03C514EF312287C".parse().unwrap())
//!     .route("/weather", 1_000, "Today's weather"); // 0.001 USDC
//! let app: Router = paywall.apply(Router::new().route("/weather", get(|| async { "sunny" })));
//! # }
//! ```

use std::fmt;
use std::sync::Arc;

use alloy_primitives::{Address, U256};
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rail_core::keys::{KeyStore, Reservation};
use rail_core::route::RoutePattern;
use rail_core::{MemoryKeyStore, RailError, ReplayGuard, SharedClock, SystemClock};
use serde_json::json;

use crate::facilitator::{Facilitator, SettleOutcome, settle_for_serving};
use crate::fields::Uint256Decimal;
use crate::verify::{find_matching_requirements, precheck, reasons, unix_secs};
use crate::wire::{
    Extra, PaymentPayload, PaymentRequired, PaymentRequirements, ResourceInfo, SCHEME_EXACT,
    SettleResponse, V2,
};

/// `PAYMENT-REQUIRED` (lower case, as HTTP/2 sends it).
pub const PAYMENT_REQUIRED: HeaderName = HeaderName::from_static("payment-required");
/// `PAYMENT-SIGNATURE`.
pub const PAYMENT_SIGNATURE: HeaderName = HeaderName::from_static("payment-signature");
/// `PAYMENT-RESPONSE`.
pub const PAYMENT_RESPONSE: HeaderName = HeaderName::from_static("payment-response");
use crate::served::{RUNNING, in_flight, mark_paid, release, served_key};
pub use crate::served::{SERVE_WINDOW, SERVED_RETENTION};
pub use crate::token::Token;
pub use crate::wire::PAYMENT_REQUIRED_ERROR;

/// `Retry-After` of a 503, seconds.
pub const RETRY_AFTER_SECS: u64 = 2;
/// When the payment settles relative to the handler.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SettleWhen {
    /// Settle, then run the handler (the content never exists unpaid).
    #[default]
    Before,
    /// Verify, run the handler, settle only if it succeeded (no charge for a failed handler).
    After,
}

#[derive(Clone, Debug)]
struct PricedRoute {
    pattern: RoutePattern,
    amount: U256,
    description: String,
}

/// Priced routes and the facilitator that settles them. Cheap to clone.
#[derive(Clone)]
pub struct Paywall {
    facilitator: Arc<dyn Facilitator>,
    token: Token,
    pay_to: Address,
    max_timeout_seconds: u64,
    settle_when: SettleWhen,
    routes: Arc<Vec<PricedRoute>>,
    served: ReplayGuard,
    v1_network: Option<String>,
    clock: SharedClock,
}

impl fmt::Debug for Paywall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Paywall")
            .field("facilitator", &self.facilitator)
            .field("token", &self.token)
            .field("pay_to", &self.pay_to)
            .field(
                "routes",
                &self
                    .routes
                    .iter()
                    .map(|r| r.pattern.as_str())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Paywall {
    /// A paywall paying `pay_to` in `token`, settling through `facilitator`, remembering
    /// served payments in memory (use [`Paywall::with_store`] to share them).
    #[must_use]
    pub fn new(facilitator: Arc<dyn Facilitator>, token: Token, pay_to: Address) -> Self {
        Self {
            facilitator,
            token,
            pay_to,
            max_timeout_seconds: 60,
            settle_when: SettleWhen::Before,
            routes: Arc::new(Vec::new()),
            served: ReplayGuard::new(Arc::new(MemoryKeyStore::default()), "x402/served"),
            v1_network: None,
            clock: Arc::new(SystemClock),
        }
    }

    /// Judges payments' validity windows by `clock` instead of the host's clock.
    #[must_use]
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Also accepts x402 **v1** clients: the 402's JSON body becomes the v1
    /// `PaymentRequiredV1` (v1 clients read the body; v2 clients read `PAYMENT-REQUIRED`,
    /// which stays v2), and an `X-PAYMENT` payment is accepted and answered with
    /// `X-PAYMENT-RESPONSE`. `name` is the v1 network name of the token's chain; `None` takes
    /// it from [`crate::v1::EVM_NETWORKS`]. A v2 payment (`PAYMENT-SIGNATURE`) always wins:
    /// a v2 exchange is never downgraded.
    ///
    /// # Errors
    /// A message when the chain has no v1 name.
    pub fn accept_v1(mut self, name: Option<&str>) -> Result<Self, String> {
        let chain = crate::verify::eip155_chain_id(&self.token.network)
            .ok_or_else(|| format!("{} is not eip155", self.token.network))?;
        let name = match name {
            Some(n) => n.to_owned(),
            None => crate::v1::EVM_NETWORKS
                .iter()
                .find(|(_, id)| *id == chain)
                .map(|(n, _)| (*n).to_owned())
                .ok_or_else(|| format!("chain {chain} has no v1 network name; give one"))?,
        };
        self.v1_network = Some(name);
        Ok(self)
    }

    /// Served payments kept in `store` (PostgreSQL for several instances).
    #[must_use]
    pub fn with_store(mut self, store: Arc<dyn KeyStore>) -> Self {
        self.served = ReplayGuard::new(store, "x402/served");
        self
    }

    /// When to settle (default [`SettleWhen::Before`]).
    #[must_use]
    pub const fn settle(mut self, when: SettleWhen) -> Self {
        self.settle_when = when;
        self
    }

    /// `maxTimeoutSeconds` of every route (default 60).
    #[must_use]
    pub const fn max_timeout_seconds(mut self, secs: u64) -> Self {
        self.max_timeout_seconds = secs;
        self
    }

    /// Prices `pattern` (axum-style, matched on the percent-decoded path) at `amount` atomic
    /// units of the token. The first matching route wins.
    #[must_use]
    pub fn route(
        mut self,
        pattern: &str,
        amount: impl Into<Uint256Decimal>,
        description: &str,
    ) -> Self {
        Arc::make_mut(&mut self.routes).push(PricedRoute {
            pattern: RoutePattern::parse(pattern),
            amount: amount.into().value(),
            description: description.to_owned(),
        });
        self
    }

    /// The facilitator.
    #[must_use]
    pub fn facilitator(&self) -> &Arc<dyn Facilitator> {
        &self.facilitator
    }

    /// The requirements and description of a request path, `None` if it is free.
    #[must_use]
    pub fn requirements_for(&self, path: &str) -> Option<(PaymentRequirements, String)> {
        let route = self.routes.iter().find(|r| r.pattern.matches_path(path))?;
        Some((
            PaymentRequirements {
                scheme: SCHEME_EXACT.into(),
                network: self.token.network.clone(),
                amount: route.amount.into(),
                asset: self.token.address.to_checksum(None),
                pay_to: self.pay_to.to_checksum(None),
                max_timeout_seconds: self.max_timeout_seconds,
                extra: Some(Extra::eip712(&self.token.name, &self.token.version)),
            },
            route.description.clone(),
        ))
    }

    /// Puts the paywall in front of every route of `router` (apply it to the top-level
    /// router: prices are matched on the full request path).
    pub fn apply<S: Clone + Send + Sync + 'static>(&self, router: Router<S>) -> Router<S> {
        router.layer(axum::middleware::from_fn_with_state(
            self.clone(),
            paywall_middleware,
        ))
    }
}

fn set(h: &mut HeaderMap, name: HeaderName, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        h.insert(name, v);
    }
}

/// The 402 for `pr` (body = its JSON, `PAYMENT-REQUIRED` = base64 of the same bytes; no body
/// for `HEAD`), with the failed settlement in `PAYMENT-RESPONSE` when there is one.
#[must_use]
pub fn payment_required_response(
    pr: &PaymentRequired,
    head: bool,
    settle: Option<&SettleResponse>,
) -> Response {
    payment_required_response_with(pr, None, head, settle)
}

/// The v1 402 body for `pr` on v1 network `name` (`maxAmountRequired`, inline resource).
#[must_use]
pub fn v1_body(pr: &PaymentRequired, name: &str) -> crate::v1::PaymentRequiredV1 {
    crate::v1::PaymentRequiredV1 {
        x402_version: crate::v1::V1::default(),
        error: pr.error.clone(),
        accepts: pr
            .accepts
            .iter()
            .map(|r| crate::v1::PaymentRequirementsV1 {
                scheme: r.scheme.clone(),
                network: name.to_owned(),
                max_amount_required: r.amount,
                resource: pr.resource.url.clone(),
                description: pr.resource.description.clone().unwrap_or_default(),
                mime_type: pr.resource.mime_type.clone(),
                output_schema: None,
                pay_to: r.pay_to.clone(),
                max_timeout_seconds: r.max_timeout_seconds,
                asset: r.asset.clone(),
                extra: r.extra.clone(),
            })
            .collect(),
    }
}

fn payment_required_response_with(
    pr: &PaymentRequired,
    v1: Option<&str>,
    head: bool,
    settle: Option<&SettleResponse>,
) -> Response {
    let body = match v1 {
        Some(name) => serde_json::to_vec(&v1_body(pr, name)),
        None => serde_json::to_vec(pr),
    };
    let (Ok(body), Ok(encoded)) = (body, pr.to_header()) else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode the 402").into_response();
    };
    let mut h = HeaderMap::new();
    set(&mut h, PAYMENT_REQUIRED, &encoded);
    if let Some(s) = settle.and_then(|s| s.to_header().ok()) {
        set(&mut h, PAYMENT_RESPONSE, &s);
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

/// A 503 with `Retry-After`: the outcome is unknown, retry the same payment.
#[must_use]
pub fn unavailable_response(detail: &str) -> Response {
    let mut h = HeaderMap::new();
    h.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let body = json!({
        "error": reasons::FACILITATOR_UNAVAILABLE,
        "retryable": true,
        "retryAfterSeconds": RETRY_AFTER_SECS,
        "detail": detail,
    });
    (StatusCode::SERVICE_UNAVAILABLE, h, axum::Json(body)).into_response()
}

fn resource_url(req: &Request) -> String {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
    };
    // Behind a TLS-terminating proxy the scheme is the proxy's (`X-Forwarded-Proto`).
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

/// `X-PAYMENT` (v1).
pub const X_PAYMENT: HeaderName = HeaderName::from_static("x-payment");
/// `X-PAYMENT-RESPONSE` (v1).
pub const X_PAYMENT_RESPONSE: HeaderName = HeaderName::from_static("x-payment-response");

fn payment_header(h: &HeaderMap, name: &HeaderName) -> Option<Result<String, ()>> {
    let mut all = h.get_all(name).iter();
    let first = all.next()?;
    if all.next().is_some() {
        return Some(Err(()));
    }
    Some(first.to_str().map(str::to_owned).map_err(|_| ()))
}

fn paid(mut resp: Response, settle: &SettleResponse, v1: Option<&str>) -> Response {
    match v1 {
        Some(name) => {
            let s = crate::v1::SettleResponseV1 {
                success: settle.success,
                error_reason: settle.error_reason.clone(),
                transaction: settle.transaction.clone(),
                network: name.to_owned(),
                payer: settle.payer.clone(),
            };
            if let Ok(s) = s.to_header() {
                set(resp.headers_mut(), X_PAYMENT_RESPONSE, &s);
            }
        }
        None => {
            if let Ok(s) = settle.to_header() {
                set(resp.headers_mut(), PAYMENT_RESPONSE, &s);
            }
        }
    }
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    resp
}

struct Ctx<'a> {
    paywall: &'a Paywall,
    required: PaymentRequired,
    requirements: PaymentRequirements,
}

impl Ctx<'_> {
    fn refuse(&self, error: &str, settle: Option<&SettleResponse>) -> Response {
        let mut pr = self.required.clone();
        pr.error = Some(error.to_owned());
        payment_required_response_with(&pr, self.paywall.v1_network.as_deref(), false, settle)
    }

    async fn settle(&self, p: &PaymentPayload) -> Result<SettleResponse, Response> {
        match settle_for_serving(&self.paywall.facilitator, p, &self.requirements).await {
            SettleOutcome::Settled(s) => Ok(s),
            SettleOutcome::Refused(s) => Err(self.refuse(SettleOutcome::reason(&s), Some(&s))),
            SettleOutcome::Unknown(detail) => Err(unavailable_response(&detail)),
        }
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
    let Some((requirements, description)) = paywall.requirements_for(req.uri().path()) else {
        return next.run(req).await;
    };
    let mut resource = ResourceInfo::new(resource_url(&req));
    resource.description = Some(description);
    let ctx = Ctx {
        paywall: &paywall,
        required: PaymentRequired {
            x402_version: V2::default(),
            error: Some(PAYMENT_REQUIRED_ERROR.into()),
            resource,
            accepts: vec![requirements.clone()],
            extensions: None,
        },
        requirements,
    };
    let v1_name = paywall.v1_network.as_deref();
    if req.method() == Method::HEAD {
        return payment_required_response_with(&ctx.required, v1_name, true, None);
    }
    // v2 first: a PAYMENT-SIGNATURE is read as v2 whatever else the request carries.
    let (header, v1) = match payment_header(req.headers(), &PAYMENT_SIGNATURE) {
        Some(h) => (Some(h), None),
        None => match v1_name {
            Some(name) => (payment_header(req.headers(), &X_PAYMENT), Some(name)),
            None => (None, None),
        },
    };
    let header = match header {
        None => return payment_required_response_with(&ctx.required, v1_name, false, None),
        Some(Err(())) => return ctx.refuse(reasons::INVALID_PAYLOAD, None),
        Some(Ok(h)) => h,
    };
    let payload = match v1 {
        None => match PaymentPayload::from_header(&header) {
            Ok(p) => p,
            Err(e) => {
                tracing::info!(error = %e, "x402: undecodable PAYMENT-SIGNATURE");
                return ctx.refuse(e.reason(), None);
            }
        },
        Some(name) => match crate::v1::PaymentPayloadV1::from_header(&header) {
            // A v1 payment names scheme and network only; it is checked as a payment for
            // this route's own requirements (the signature covers amount, payTo, token).
            Ok(p) if p.scheme == SCHEME_EXACT && p.network == name => PaymentPayload {
                x402_version: V2::default(),
                resource: None,
                accepted: ctx.requirements.clone(),
                payload: p.payload,
                extensions: None,
            },
            Ok(_) => return ctx.refuse(reasons::NO_MATCHING_REQUIREMENTS, None),
            Err(e) => {
                tracing::info!(error = %e, "x402: undecodable X-PAYMENT");
                return ctx.refuse(e.reason(), None);
            }
        },
    };
    if find_matching_requirements(&ctx.required.accepts, &payload).is_none() {
        return ctx.refuse(reasons::NO_MATCHING_REQUIREMENTS, None);
    }
    // Final offline verdicts (signature, window, amount, recipient) before anything is
    // recorded for this payment: a forged copy cannot hold a real payment's reservation.
    if let Err(e) = precheck(
        &payload,
        &ctx.requirements,
        unix_secs(ctx.paywall.clock.now()),
    ) {
        return ctx.refuse(e.reason(), None);
    }
    let key = served_key(&payload);
    let serving = match paywall.served.reserve(&key, SERVE_WINDOW).await {
        Ok(r) => r,
        Err(RailError::Replayed { .. }) => return ctx.already_taken(&key).await,
        Err(e) => return unavailable_response(&format!("store: {e}")),
    };
    // After mode, unless this payment was settled already (a lost answer): verify, run, settle.
    if paywall.settle_when == SettleWhen::After {
        match paywall
            .facilitator
            .verify(&payload, &ctx.requirements)
            .await
        {
            Ok(v) if v.is_valid => return ctx.settle_after(req, next, &payload, serving, v1).await,
            // Perhaps settled by an earlier request whose answer was lost: the settle path
            // below recognises it (and serves it once, under this reservation).
            Ok(v)
                if matches!(
                    v.invalid_reason.as_deref(),
                    Some(reasons::NONCE_ALREADY_USED | reasons::VALID_BEFORE_EXPIRED)
                ) => {}
            Ok(v) => {
                release(serving).await;
                let reason = v
                    .invalid_reason
                    .unwrap_or_else(|| reasons::INVALID_PAYLOAD.into());
                return ctx.refuse(&reason, None);
            }
            Err(e) => {
                release(serving).await;
                return unavailable_response(&e.to_string());
            }
        }
    }
    let settled = match serving.keep_alive(ctx.settle(&payload)).await {
        Ok(s) => s,
        Err(resp) => {
            release(serving).await;
            return resp;
        }
    };
    // Paid: recorded for good before the handler runs, so a copy of this payment presented
    // while the handler runs (however long) is refused, not served again.
    if !mark_paid(&serving, &settled).await {
        return unavailable_response(
            "this payment is being served by another request; retry the same payment",
        );
    }
    let resp = serving.keep_alive(next.run(req)).await;
    if resp.status().is_success() {
        if let Err(e) = serving.commit(Some(SERVED_RETENTION)).await {
            tracing::warn!(error = %e, "x402: served, but could not record it");
        }
    } else {
        // Paid, not served: the same payment may be presented again (the facilitator
        // answers its recorded transaction; no second charge).
        tracing::warn!(tx = %settled.transaction, status = resp.status().as_u16(), "x402: settled, but the handler failed");
        release(serving).await;
    }
    paid(resp, &settled, v1)
}

impl Ctx<'_> {
    /// Another request holds this payment: in flight → 503 (retry the same payment), used → 402.
    async fn already_taken(&self, key: &str) -> Response {
        match in_flight(&self.paywall.served, key).await {
            Ok(true) => {
                unavailable_response("this payment is being processed; retry the same payment")
            }
            Ok(false) => self.refuse(reasons::NONCE_ALREADY_USED, None),
            Err(e) => unavailable_response(&format!("store: {e}")),
        }
    }

    /// Verified: run the handler, settle only if it succeeded.
    async fn settle_after(
        &self,
        req: Request,
        next: Next,
        payload: &PaymentPayload,
        serving: Reservation,
        v1: Option<&str>,
    ) -> Response {
        // Held while the handler runs (the lease kept alive): no copy runs beside it.
        if let Err(e) = serving.advance(RUNNING, None).await {
            release(serving).await;
            return unavailable_response(&format!("store: {e}"));
        }
        let resp = serving.keep_alive(next.run(req)).await;
        if !resp.status().is_success() {
            // Not charged: nothing was served.
            release(serving).await;
            return resp;
        }
        match serving.keep_alive(self.settle(payload)).await {
            Ok(settled) => {
                // The content is this request's own (it ran under the record): served.
                let _ = mark_paid(&serving, &settled).await;
                if let Err(e) = serving.commit(Some(SERVED_RETENTION)).await {
                    tracing::warn!(error = %e, "x402: served, but could not record it");
                }
                paid(resp, &settled, v1)
            }
            Err(refused) => {
                // The handler's output is dropped: never serve unsettled content.
                release(serving).await;
                refused
            }
        }
    }
}
