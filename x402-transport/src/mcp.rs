//! x402 over MCP (x402's `transports-v2/mcp.md`, and `docs/exact-algo.md` §5) for any rmcp
//! server, whatever the scheme: put [`McpPaywall::call`] in front of the tools of a
//! `ServerHandler::call_tool`.
//!
//! - An unpaid call to a priced tool gets a tool result with `isError: true`, the payment
//!   requirement in `structuredContent` (the 402 body: `x402Version`, `error`, `accepts`, plus
//!   each scheme's hints, such as exact-algo's `how_to_pay`), and
//!   `{"x402/error":{"code":402, "message", "data"}}` as `content[0].text`.
//! - The payment comes in `params._meta["x402/payment"]`: the envelope as a JSON object, or its
//!   base64 (the `PAYMENT-SIGNATURE` value). It is checked by the scheme it names and served at
//!   most once ([`ServedOnce`], shared with the HTTP paywall and the rails' receivers).
//! - [`SettleWhen::After`] (default): verified, the tool runs, and a tool error (`isError`) is
//!   not charged; otherwise the payment settles and only then is the output returned.
//!   [`SettleWhen::Before`] (and [`SettleWhen::AfterIfSafe`]: a tool call is not safe):
//!   settled first, then the tool runs (a failed tool releases the payment, which can be
//!   presented again without a second charge).
//! - A paid result carries the settlement in `result._meta["x402/payment-response"]`, and the
//!   scheme's receipt (exact-algo's) in `structuredContent.receipt`.
//! - A refusal is a payment-required result with a fresh challenge whose `error` is the
//!   scheme's code (a failed settlement: `Payment settlement failed: <reason>`, with the
//!   settlement in `structuredContent["x402/payment-response"]`); an unknown outcome is a tool
//!   error with code 503: send the **same** payment again.

use std::future::Future;
use std::sync::Arc;

use rail_core::{SharedClock, SystemClock};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock, JsonObject};
use serde_json::{Value, json};

use crate::scheme::{Accepts, Failure, Presented, Refusal, Settled};
use crate::served::ServedOnce;
use crate::settle::{SettleWhen, challenge, choose, price, take};
use crate::wire;

/// One priced tool.
#[derive(Clone, Debug)]
pub struct PricedTool {
    /// The tool's name.
    pub name: String,
    /// What it does (the challenge's description).
    pub description: String,
    /// The ways to pay it.
    pub accepts: Accepts,
}

/// Priced tools, the served-once record and the clock. Cheap to clone.
#[derive(Clone, Debug)]
pub struct McpPaywall {
    tools: Arc<Vec<PricedTool>>,
    served: ServedOnce,
    clock: SharedClock,
    settle_when: SettleWhen,
}

impl Default for McpPaywall {
    fn default() -> Self {
        McpPaywall::new()
    }
}

fn text(v: &Value) -> ContentBlock {
    ContentBlock::text(v.to_string())
}

impl McpPaywall {
    /// No priced tools yet; served payments in memory; settle after the tool.
    #[must_use]
    pub fn new() -> Self {
        McpPaywall {
            tools: Arc::new(Vec::new()),
            served: ServedOnce::default(),
            clock: Arc::new(SystemClock),
            settle_when: SettleWhen::After,
        }
    }

    crate::settle::surface_builders!(
        "When to settle (default [`SettleWhen::After`]: no charge for a failed tool)."
    );

    /// Prices the tool `name`, payable in each of `accepts`.
    #[must_use]
    pub fn tool(mut self, name: &str, description: &str, accepts: Accepts) -> Self {
        Arc::make_mut(&mut self.tools).push(PricedTool {
            name: name.to_owned(),
            description: description.to_owned(),
            accepts,
        });
        self
    }

    /// Every priced tool.
    #[must_use]
    pub fn tools(&self) -> &[PricedTool] {
        &self.tools
    }

    /// The priced tool `name`, `None` if it is free.
    #[must_use]
    pub fn priced(&self, name: &str) -> Option<&PricedTool> {
        self.tools
            .iter()
            .find(|t| t.name == name && !t.accepts.is_empty())
    }

    /// The payment requirement of `tool` (a fresh challenge from each scheme) as a tool
    /// result's `structuredContent`: the 402 body plus each scheme's hints.
    ///
    /// # Errors
    /// [`Failure::Unknown`] if a scheme cannot issue its challenge now.
    pub async fn payment_required(
        &self,
        tool: &PricedTool,
        refusal: Option<&Refusal>,
    ) -> Result<Value, Failure> {
        let url = format!("mcp://tool/{}", tool.name);
        let c = challenge(
            tool.accepts.as_slice(),
            &tool.name,
            &url,
            &tool.description,
            refusal,
        )
        .await?;
        let (pr, hints) = (c.required, c.hints);
        let mut v = serde_json::to_value(pr).unwrap_or(Value::Null);
        if let Some(o) = v.as_object_mut() {
            o.extend(hints);
        }
        Ok(v)
    }

    /// [`McpPaywall::call`] with the `_meta` carried in the parameters themselves (a request
    /// decoded from JSON by hand). Inside an rmcp server the request `_meta` arrives in
    /// `RequestContext::meta` instead: use [`McpPaywall::call`] with it.
    pub async fn call_params<F, Fut>(
        &self,
        params: &CallToolRequestParams,
        run: F,
    ) -> CallToolResult
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = CallToolResult> + Send,
    {
        let meta = params.meta.as_ref().map(|m| &m.0.0);
        self.call(&params.name, meta, run).await
    }

    /// Runs a call of `tool`, whose request `_meta` is `meta` (in an rmcp `ServerHandler`:
    /// `Some(&context.meta.0.0)`), through the paywall: `run` is called only for a free tool
    /// or a checked payment, and its output is returned only once the payment settled.
    pub async fn call<F, Fut>(
        &self,
        tool: &str,
        meta: Option<&JsonObject>,
        run: F,
    ) -> CallToolResult
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = CallToolResult> + Send,
    {
        let Some(priced) = self.priced(tool) else {
            return run().await;
        };
        let Some(first) = priced.accepts.as_slice().first() else {
            return run().await;
        };
        let presented = match presented(priced, meta) {
            None => return self.challenge(priced, None).await,
            Some(Ok(p)) => p,
            Some(Err(r)) => return self.failure(priced, Failure::Refused(r)).await,
        };
        let accept = choose(priced.accepts.as_slice(), &presented).unwrap_or(first);
        let url = format!("mcp://tool/{}", priced.name);
        let p = price(accept, &priced.name, &url, &priced.description);
        let taken = match take(accept, p, &presented, &self.served, self.clock.now()).await {
            Ok(t) => t,
            Err(f) => return self.failure(priced, f).await,
        };
        let ok = |r: &CallToolResult| r.is_error != Some(true);
        let outcome = match self.settle_when.for_method(None) {
            SettleWhen::After => taken.verify_run_settle(run, ok).await,
            _ => match taken.settle().await {
                Ok(paid) => paid.run(run, ok).await,
                Err(f) => Err(f),
            },
        };
        match outcome {
            Ok((result, Some(settled))) => with_receipt(result, &settled),
            // Settle-after: the tool failed, nothing was charged.
            Ok((result, None)) => result,
            Err(f) => self.failure(priced, f).await,
        }
    }

    async fn challenge(&self, tool: &PricedTool, refusal: Option<&Refusal>) -> CallToolResult {
        match self.payment_required(tool, refusal).await {
            Ok(mut structured) => {
                let mut error = refusal.map_or_else(
                    || {
                        structured
                            .get("error")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned()
                    },
                    |r| r.error.clone(),
                );
                if let (Some(r), Some(o)) = (refusal, structured.as_object_mut())
                    && let Some(response) = &r.response
                {
                    // A failed settlement (x402's MCP transport): said so, with its answer.
                    error = format!("Payment settlement failed: {}", r.error);
                    o.insert("error".into(), Value::String(error.clone()));
                    o.insert(wire::PAYMENT_RESPONSE_META.into(), response.clone());
                }
                payment_required_result(&structured, &error)
            }
            Err(f) => {
                tracing::warn!(tool = %tool.name, failure = %f, "x402/mcp: cannot issue a challenge");
                match f {
                    Failure::Unknown {
                        error,
                        reason,
                        detail,
                    } => unavailable_result(&error, reason.as_deref(), &detail),
                    Failure::Refused(r) => unavailable_result(&r.error, None, &r.detail),
                }
            }
        }
    }

    /// The result of a call of `tool` whose payment did not settle: a refusal is a
    /// payment-required result with a fresh challenge naming it, an unknown outcome a tool error
    /// with code 503.
    pub async fn failure(&self, tool: &PricedTool, f: Failure) -> CallToolResult {
        match f {
            Failure::Refused(r) => {
                tracing::info!(tool = %tool.name, error = %r.error, reason = ?r.reason, detail = %r.detail, "x402/mcp: payment refused");
                self.challenge(tool, Some(&r)).await
            }
            Failure::Unknown {
                error,
                reason,
                detail,
            } => {
                tracing::warn!(tool = %tool.name, error = %error, detail = %detail, "x402/mcp: payment outcome unknown");
                unavailable_result(&error, reason.as_deref(), &detail)
            }
        }
    }
}

/// The payment a call of `tool` presents in its request `_meta`: `None` when it presents
/// none, a refusal when `_meta["x402/payment"]` is neither an object nor a string.
#[must_use]
pub fn presented(
    tool: &PricedTool,
    meta: Option<&JsonObject>,
) -> Option<Result<Presented, Refusal>> {
    match meta.and_then(|m| m.get(wire::PAYMENT_META)) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(Ok(Presented::Header(s.clone()))),
        Some(v @ Value::Object(_)) => Some(Ok(Presented::Object(v.clone()))),
        Some(_) => {
            let why = "_meta[\"x402/payment\"] is neither an object nor a string";
            Some(Err(tool.accepts.as_slice().first().map_or_else(
                || Refusal::new(wire::PAYMENT_REQUIRED_ERROR, why),
                |a| a.scheme.malformed(why),
            )))
        }
    }
}

/// [`with_receipt`] on a tool result already written as JSON (`result`): the settlement's
/// JSON `response` in `_meta["x402/payment-response"]`, and `receipt`, if any, in
/// `structuredContent.receipt` when that is an object.
pub fn with_receipt_json(result: &mut Value, response: &Value, receipt: Option<&Value>) {
    let Some(o) = result.as_object_mut() else {
        return;
    };
    if let Some(meta) = o
        .entry("_meta")
        .or_insert_with(|| Value::Object(serde_json::Map::new()))
        .as_object_mut()
    {
        meta.insert(wire::PAYMENT_RESPONSE_META.to_owned(), response.clone());
    }
    if let (Some(receipt), Some(Value::Object(sc))) = (receipt, o.get_mut("structuredContent")) {
        sc.insert("receipt".into(), receipt.clone());
    }
}

/// `result` with the settlement in `_meta["x402/payment-response"]` and the scheme's receipt,
/// if it has one, in `structuredContent.receipt`.
#[must_use]
pub fn with_receipt(mut result: CallToolResult, settled: &Settled) -> CallToolResult {
    let mut meta = result.meta.take().unwrap_or_default();
    meta.0.insert(
        wire::PAYMENT_RESPONSE_META.to_owned(),
        settled.response.clone(),
    );
    result.meta = Some(meta);
    if let (Some(receipt), Some(Value::Object(o))) =
        (&settled.receipt, &mut result.structured_content)
    {
        o.insert("receipt".into(), receipt.clone());
    }
    result
}

/// The payment-required tool result: `isError`, `structured` as `structuredContent`, and the
/// `x402/error` wrapper (code 402) as its text.
#[must_use]
pub fn payment_required_result(structured: &Value, error: &str) -> CallToolResult {
    let wrapper = json!({"x402/error": {"code": 402, "message": error, "data": structured}});
    let mut r = CallToolResult::error(vec![text(&wrapper)]);
    r.structured_content = Some(structured.clone());
    r
}

/// A tool error for an unknown outcome (code 503): send the **same** payment again.
#[must_use]
pub fn unavailable_result(error: &str, reason: Option<&str>, detail: &str) -> CallToolResult {
    let mut data = json!({
        "error": error,
        "detail": detail,
        "retryable": true,
        "retryAfterSeconds": wire::RETRY_AFTER_SECS,
    });
    if let (Some(r), Some(o)) = (reason, data.as_object_mut()) {
        o.insert("reason".into(), Value::String(r.to_owned()));
    }
    let body = json!({"x402/error": {
        "code": 503,
        "message": "payment outcome unknown; retry the same payment",
        "data": data,
    }});
    let mut r = CallToolResult::error(vec![text(&body)]);
    r.structured_content = Some(data);
    r
}

/// The client side: the payment requirement of a tool result as JSON, looked for in the
/// specification's order (`structuredContent`, `structuredContent["x402/error"].data`,
/// `content[0].text` and its `x402/error.data`). `None` unless `isError` and it has `accepts`.
#[must_use]
pub fn payment_required_of(result: &CallToolResult) -> Option<Value> {
    crate::wire::payment_required_in_tool_result(&serde_json::to_value(result).ok()?)
}

/// An MCP endpoint at `path` over Streamable HTTP for the rmcp server `factory` makes (one per
/// request): stateless (no `Mcp-Session-Id`; every request stands alone, as exact-algo's clients
/// (`docs/exact-algo.md` §5) and MCP's `2026-07-28` revision expect) and answering plain JSON (an
/// SSE stream only if the handler sends a notification first).
///
/// In front of rmcp's transport:
/// - a request from a browser page of another origin is refused (403): DNS-rebinding
///   protection that, unlike a fixed host list, works behind any host name;
/// - a `POST` without `Accept`, or with one that takes JSON (`*/*`, `application/json`), is
///   served as one that names both MCP media types: HTTP reads a missing `Accept` as "anything",
///   and the answer is JSON. exact-algo's minimal clients (`docs/exact-algo.md` §5, §6) send
///   notifications without `Accept`.
#[cfg(feature = "mcp-http")]
pub fn streamable_http<S, F>(path: &str, factory: F) -> axum::Router
where
    S: rmcp::ServerHandler + Send + 'static,
    F: Fn() -> Result<S, std::io::Error> + Send + Sync + 'static,
{
    use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};

    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts();
    let service =
        StreamableHttpService::new(factory, Arc::new(NeverSessionManager::default()), config);
    axum::Router::new()
        .route_service(path, service)
        .layer(axum::middleware::from_fn(guard))
}

/// Refuses a request whose `Origin` is not the request's own `Host`; reads a missing or
/// JSON-taking `Accept` of a `POST` as both MCP media types.
#[cfg(feature = "mcp-http")]
async fn guard(
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::{HeaderValue, Method, StatusCode, header};
    use axum::response::IntoResponse;

    if req.method() == Method::POST {
        let takes_json = req.headers().get(header::ACCEPT).is_none_or(|a| {
            a.to_str().is_ok_and(|a| {
                let a = a.to_ascii_lowercase();
                !a.contains("text/event-stream")
                    && (a.contains("application/json") || a.contains("*/*"))
            })
        });
        if takes_json {
            req.headers_mut().insert(
                header::ACCEPT,
                HeaderValue::from_static("application/json, text/event-stream"),
            );
        }
    }

    let h = req.headers();
    let allowed = match h.get(header::ORIGIN) {
        None => true,
        Some(origin) => match (origin.to_str(), h.get(header::HOST).map(|v| v.to_str())) {
            (Ok(origin), Some(Ok(host))) => origin
                .split_once("://")
                .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host)),
            _ => false,
        },
    };
    if allowed {
        return next.run(req).await;
    }
    (
        StatusCode::FORBIDDEN,
        axum::Json(json!({"jsonrpc": "2.0", "id": null,
                          "error": {"code": -32600, "message": "origin not allowed"}})),
    )
        .into_response()
}
