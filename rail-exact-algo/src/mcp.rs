//! The MCP surface of the seed (§5): Streamable HTTP (`POST /mcp`, JSON-RPC 2.0) with paid
//! tools.
//!
//! An agent needs no knowledge of the HTTP envelope: it calls a tool; a paid tool answers an
//! unpaid call with a tool result whose `isError` is true and whose `structuredContent` is the
//! payment requirement (`x402Version`, `accepts`, `error`, `how_to_pay`); the agent retries the
//! same call with `params._meta["x402/payment"]` = the base64 envelope (the same value as the
//! HTTP `PAYMENT-SIGNATURE` header). The payment is settled before the tool runs; the result
//! carries `structuredContent.receipt` and `_meta["x402/payment-response"]`. A refused payment
//! is answered with a fresh challenge whose `error` is the refusal's code.
//!
//! Implemented methods: `initialize`, `ping`, `tools/list`, `tools/call`; notifications (such
//! as `notifications/initialized`) are acknowledged with 202 and no body. The server is
//! stateless (no `Mcp-Session-Id`) and offers no SSE stream (`GET /mcp` is 405).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};

use crate::http::{CLIENT_PROCEDURE, PAYMENT_REQUIRED_ERROR, RETRY_AFTER_SECS, scheme_document};
use x402_transport::settle;
use x402_transport::{Accept, Failure, Presented, Price as TransportPrice};

use crate::receiver::{ExactAlgoReceiver, Price};
use crate::scheme::ExactAlgo;
use crate::wire::{self, PaymentResponse};

/// The MCP protocol version this server speaks.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// `params._meta` key of the payment (base64 envelope).
pub const PAYMENT_META: &str = "x402/payment";
/// `result._meta` key of the receipt ([`PaymentResponse`]).
pub const PAYMENT_RESPONSE_META: &str = "x402/payment-response";
/// The built-in free tool describing the scheme.
pub const PAYMENT_INSTRUCTIONS: &str = "payment_instructions";

/// JSON-RPC: invalid JSON.
pub const PARSE_ERROR: i64 = -32700;
/// JSON-RPC: not a valid request object.
pub const INVALID_REQUEST: i64 = -32600;
/// JSON-RPC: no such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// JSON-RPC: invalid parameters (also an unknown tool).
pub const INVALID_PARAMS: i64 = -32602;

/// What a tool handler returns: its output (an object becomes `structuredContent`), or an
/// error message for the agent.
pub type ToolFuture = Pin<Box<dyn Future<Output = Result<Value, String>> + Send>>;
/// A tool handler: called with the call's `arguments` (an object).
pub type ToolHandler = Arc<dyn Fn(Value) -> ToolFuture + Send + Sync>;
/// A cheap check of the arguments run before any payment is asked for or settled, so that
/// nobody pays for a call that cannot succeed (say, a post that does not exist).
pub type ToolCheck = Arc<dyn Fn(&Value) -> Result<(), String> + Send + Sync>;

/// One tool.
#[derive(Clone)]
pub struct Tool {
    /// The tool's name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// The JSON schema of its arguments.
    pub input_schema: Value,
    /// Its price (`None`: free). The price's resource is the tool's name.
    pub price: Option<Price>,
    handler: ToolHandler,
    check: Option<ToolCheck>,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("price", &self.price)
            .finish_non_exhaustive()
    }
}

impl Tool {
    /// A free tool.
    pub fn new<F, Fut>(name: &str, description: &str, input_schema: Value, handler: F) -> Self
    where
        F: Fn(Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, String>> + Send + 'static,
    {
        Tool {
            name: name.to_owned(),
            description: description.to_owned(),
            input_schema,
            price: None,
            handler: Arc::new(move |v| Box::pin(handler(v))),
            check: None,
        }
    }

    /// Prices the tool at `amount` µALGO (resource: the tool's name; description: the tool's).
    #[must_use]
    pub fn priced(mut self, amount: u64) -> Self {
        self.price = Some(Price {
            resource: self.name.clone(),
            description: self.description.clone(),
            amount,
        });
        self
    }

    /// Checks the arguments with `check` before asking for or settling a payment.
    #[must_use]
    pub fn with_check<F>(mut self, check: F) -> Self
    where
        F: Fn(&Value) -> Result<(), String> + Send + Sync + 'static,
    {
        self.check = Some(Arc::new(check));
        self
    }

    fn describe(&self, network: &str) -> Value {
        let mut t = json!({
            "name": self.name,
            "description": self.description,
            "inputSchema": self.input_schema,
        });
        if let (Some(p), Some(obj)) = (&self.price, t.as_object_mut()) {
            obj.insert(
                "_meta".into(),
                json!({"x402/price": {"scheme": "exact-algo", "network": network,
                       "asset": "ALGO", "maxAmountRequired": p.amount.to_string(),
                       "unit": "microALGO"}}),
            );
        }
        t
    }

    /// The `required` properties of the schema that `args` lacks, as an error.
    fn check_required(&self, args: &Value) -> Result<(), String> {
        let missing: Vec<&str> = self
            .input_schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .filter(|k| args.get(k).is_none())
                    .collect()
            })
            .unwrap_or_default();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("missing argument(s): {}", missing.join(", ")))
        }
    }
}

/// An MCP server with free and paid tools and the built-in `payment_instructions`.
#[derive(Clone)]
pub struct McpServer {
    receiver: ExactAlgoReceiver,
    name: String,
    version: String,
    instructions: Option<String>,
    tools: Vec<Tool>,
    document: Option<Value>,
}

impl fmt::Debug for McpServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McpServer")
            .field("name", &self.name)
            .field("version", &self.version)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

fn text_result(structured: &Value, is_error: bool) -> Value {
    json!({
        "content": [{"type": "text", "text": structured.to_string()}],
        "structuredContent": structured,
        "isError": is_error,
    })
}

fn rpc_result(id: &Value, result: &Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

fn rpc_error(id: &Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

fn receipt(r: &PaymentResponse) -> Value {
    json!({
        "success": r.success,
        "transaction": r.transaction,
        "confirmedRound": r.confirmed_round,
        "payer": r.payer,
        "amount": r.amount,
    })
}

impl McpServer {
    /// A server named `name`/`version` (its `serverInfo`), settling through `receiver`.
    #[must_use]
    pub fn new(receiver: ExactAlgoReceiver, name: &str, version: &str) -> Self {
        McpServer {
            receiver,
            name: name.to_owned(),
            version: version.to_owned(),
            instructions: None,
            tools: Vec::new(),
            document: None,
        }
    }

    /// Adds a tool (a tool named `payment_instructions` replaces the built-in one).
    #[must_use]
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.retain(|t| t.name != tool.name);
        self.tools.push(tool);
        self
    }

    /// The `instructions` of the `initialize` result.
    #[must_use]
    pub fn with_instructions(mut self, instructions: &str) -> Self {
        self.instructions = Some(instructions.to_owned());
        self
    }

    /// The scheme document `payment_instructions` returns (with the client procedure added),
    /// e.g. [`crate::http::scheme_document`] with the HTTP prices too. Default: the document
    /// with this server's tool prices only.
    #[must_use]
    pub fn with_scheme_document(mut self, document: Value) -> Self {
        self.document = Some(document);
        self
    }

    /// The prices of the paid tools.
    #[must_use]
    pub fn prices(&self) -> Vec<Price> {
        self.tools.iter().filter_map(|t| t.price.clone()).collect()
    }

    /// `POST /mcp` (and 405 for `GET`/`DELETE /mcp`).
    pub fn router(self) -> Router {
        Router::new()
            .route(
                "/mcp",
                post(mcp_handler)
                    .get(method_not_allowed)
                    .delete(method_not_allowed),
            )
            .with_state(Arc::new(self))
    }

    fn instructions_document(&self) -> Value {
        let mut doc = self
            .document
            .clone()
            .unwrap_or_else(|| scheme_document(&self.receiver, &[], &self.prices(), Some("/mcp")));
        if let Some(obj) = doc.as_object_mut() {
            obj.insert("client_procedure".into(), json!(CLIENT_PROCEDURE));
        }
        doc
    }

    fn builtin_instructions(&self) -> Option<Tool> {
        if self.tools.iter().any(|t| t.name == PAYMENT_INSTRUCTIONS) {
            return None;
        }
        let doc = self.instructions_document();
        Some(Tool::new(
            PAYMENT_INSTRUCTIONS,
            "The exact-algo payment scheme in machine-readable form: envelope, transaction rules, error codes, prices and the client procedure. Free.",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
            move |_| {
                let doc = doc.clone();
                async move { Ok(doc) }
            },
        ))
    }

    fn find(&self, name: &str) -> Option<Tool> {
        self.tools
            .iter()
            .find(|t| t.name == name)
            .cloned()
            .or_else(|| {
                (name == PAYMENT_INSTRUCTIONS)
                    .then(|| self.builtin_instructions())
                    .flatten()
            })
    }

    /// Handles one JSON-RPC message; `None` for a notification or a response (no answer).
    pub async fn handle(&self, msg: &Value) -> Option<Value> {
        let Some(obj) = msg.as_object() else {
            return Some(rpc_error(
                &Value::Null,
                INVALID_REQUEST,
                "expected one JSON-RPC request object (batches are not supported)",
            ));
        };
        let id = obj.get("id").cloned();
        let Some(method) = obj.get("method").and_then(Value::as_str) else {
            // A response from the client (result or error), or garbage.
            if id.is_some() && (obj.contains_key("result") || obj.contains_key("error")) {
                return None;
            }
            return Some(rpc_error(
                &id.unwrap_or(Value::Null),
                INVALID_REQUEST,
                "missing method",
            ));
        };
        let Some(id) = id else {
            tracing::debug!(method, "mcp: notification");
            return None;
        };
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0")
            || !(id.is_string() || id.is_number())
        {
            return Some(rpc_error(
                &Value::Null,
                INVALID_REQUEST,
                "jsonrpc must be \"2.0\" and id a string or a number",
            ));
        }
        let params = obj.get("params").cloned().unwrap_or(Value::Null);
        Some(match method {
            "initialize" => rpc_result(&id, &self.initialize()),
            "ping" => rpc_result(&id, &json!({})),
            "tools/list" => rpc_result(&id, &self.list()),
            "tools/call" => match self.call(&params).await {
                Ok(r) => rpc_result(&id, &r),
                Err(m) => rpc_error(&id, INVALID_PARAMS, &m),
            },
            _ => rpc_error(
                &id,
                METHOD_NOT_FOUND,
                &format!("method not found: {method}"),
            ),
        })
    }

    fn initialize(&self) -> Value {
        let mut r = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": self.name, "version": self.version},
        });
        let instructions = self.instructions.clone().unwrap_or_else(|| {
            "Paid tools answer an unpaid call with isError and the payment requirement in \
             structuredContent; pay it in native ALGO (exact-algo) and retry the same call with \
             params._meta[\"x402/payment\"]. Call payment_instructions for the scheme."
                .to_owned()
        });
        if let Some(o) = r.as_object_mut() {
            o.insert("instructions".into(), Value::String(instructions));
        }
        r
    }

    fn list(&self) -> Value {
        let net = self.receiver.network();
        let mut tools: Vec<Value> = self.tools.iter().map(|t| t.describe(net)).collect();
        if let Some(b) = self.builtin_instructions() {
            tools.insert(0, b.describe(net));
        }
        json!({"tools": tools})
    }

    /// `tools/call`: `Err` is a JSON-RPC invalid-params error (unknown tool, bad params).
    async fn call(&self, params: &Value) -> Result<Value, String> {
        let name = params
            .get("name")
            .and_then(Value::as_str)
            .ok_or("params.name must be a string")?;
        let tool = self
            .find(name)
            .ok_or_else(|| format!("unknown tool: {name}"))?;
        let args = match params.get("arguments") {
            None | Some(Value::Null) => Value::Object(Map::new()),
            Some(a @ Value::Object(_)) => a.clone(),
            Some(_) => return Err("params.arguments must be an object".into()),
        };
        if let Err(e) = tool
            .check_required(&args)
            .and_then(|()| tool.check.as_ref().map_or(Ok(()), |c| c(&args)))
        {
            return Ok(text_result(&json!({"error": e}), true));
        }
        let Some(price) = &tool.price else {
            return Ok(run(&tool, args, None).await);
        };
        let payment = match params.get("_meta").and_then(|m| m.get(PAYMENT_META)) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            // Tolerated: the envelope as a JSON object instead of its base64.
            Some(v @ Value::Object(_)) => wire::header(v).ok(),
            Some(_) => Some(String::new()),
        };
        let Some(payment) = payment else {
            return Ok(self
                .challenge(price, PAYMENT_REQUIRED_ERROR, None, None)
                .await);
        };
        let accept = Accept {
            scheme: Arc::new(ExactAlgo::new(self.receiver.clone())),
            amount: u128::from(price.amount),
        };
        let tprice = TransportPrice {
            resource: price.resource.clone(),
            url: format!("mcp://tool/{}", tool.name),
            description: price.description.clone(),
            amount: u128::from(price.amount),
        };
        let taken = settle::take(
            &accept,
            tprice,
            &Presented::Header(payment),
            self.receiver.served(),
            self.receiver.clock().now(),
        )
        .await;
        let paid = match taken {
            Ok(t) => t.settle().await,
            Err(f) => Err(f),
        };
        let outcome = match paid {
            Ok(paid) => {
                let receipt: Option<PaymentResponse> =
                    serde_json::from_value(paid.settled.response.clone()).ok();
                let name = tool.name.clone();
                paid.run(
                    || run(&tool, args, receipt),
                    |r: &Value| r.get("isError").and_then(Value::as_bool) != Some(true),
                )
                .await
                .map(|(r, _)| r)
                .inspect_err(|_| tracing::warn!(tool = %name, "mcp: paid, but another call holds the payment"))
            }
            Err(f) => Err(f),
        };
        match outcome {
            Ok(result) => Ok(result),
            Err(Failure::Unknown {
                error,
                reason,
                detail,
            }) => {
                tracing::warn!(tool = %tool.name, error = %error, detail = %detail, "mcp: settlement outcome unknown");
                Ok(text_result(
                    &json!({"error": error, "reason": reason, "retryable": true,
                            "retryAfterSeconds": RETRY_AFTER_SECS, "detail": detail}),
                    true,
                ))
            }
            Err(Failure::Refused(r)) => {
                tracing::info!(tool = %tool.name, code = %r.error, detail = %r.detail, "mcp: payment refused");
                Ok(self
                    .challenge(price, &r.error, r.reason.as_deref(), Some(&r.detail))
                    .await)
            }
        }
    }

    async fn challenge(
        &self,
        price: &Price,
        error: &str,
        reason: Option<&str>,
        detail: Option<&str>,
    ) -> Value {
        match self.receiver.payment_required(price, error).await {
            Ok(pr) => {
                let mut v = serde_json::to_value(&pr).unwrap_or_else(|_| json!({}));
                if let Some(o) = v.as_object_mut() {
                    o.insert(
                        "how_to_pay".into(),
                        json!({"tool": PAYMENT_INSTRUCTIONS, "scheme": "exact-algo"}),
                    );
                    if let Some(r) = reason {
                        o.insert("reason".into(), Value::String(r.to_owned()));
                    }
                    if let Some(d) = detail {
                        o.insert("detail".into(), Value::String(d.to_owned()));
                    }
                }
                text_result(&v, true)
            }
            Err(e) => {
                tracing::warn!(tool = %price.resource, error = %e, "mcp: cannot issue a challenge");
                text_result(
                    &json!({"error": "settlement failed", "reason": "storage error", "retryable": true,
                            "retryAfterSeconds": RETRY_AFTER_SECS, "detail": e.to_string()}),
                    true,
                )
            }
        }
    }
}

/// Runs the tool; with a receipt when it was paid for.
async fn run(tool: &Tool, args: Value, paid: Option<PaymentResponse>) -> Value {
    let out = (tool.handler)(args).await;
    let (mut structured, is_error) = match out {
        Ok(Value::Object(o)) => (o, false),
        Ok(other) => {
            let mut o = Map::new();
            o.insert("result".into(), other);
            (o, false)
        }
        Err(e) => {
            let mut o = Map::new();
            o.insert("error".into(), Value::String(e));
            (o, true)
        }
    };
    let Some(r) = paid else {
        return text_result(&Value::Object(structured), is_error);
    };
    if is_error {
        tracing::warn!(tool = %tool.name, txid = %r.transaction, "mcp: settled, but the tool failed");
    }
    structured.insert("receipt".into(), receipt(&r));
    let mut result = text_result(&Value::Object(structured), is_error);
    if let Some(o) = result.as_object_mut() {
        o.insert(
            "_meta".into(),
            json!({PAYMENT_RESPONSE_META: serde_json::to_value(&r).unwrap_or(Value::Null)}),
        );
    }
    result
}

/// Whether a browser `Origin` may talk to this server (DNS-rebinding protection, as the MCP
/// transport requires): no `Origin`, or one whose authority is the request's `Host`.
fn origin_allowed(h: &HeaderMap) -> bool {
    let Some(origin) = h.get(header::ORIGIN) else {
        return true;
    };
    let (Ok(origin), Some(Ok(host))) = (origin.to_str(), h.get(header::HOST).map(|v| v.to_str()))
    else {
        return false;
    };
    origin
        .split_once("://")
        .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host))
}

async fn method_not_allowed() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        "this MCP server offers no SSE stream; POST JSON-RPC requests",
    )
        .into_response()
}

/// The axum handler for `POST /mcp` (state: the server).
pub async fn mcp_handler(
    State(server): State<Arc<McpServer>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !origin_allowed(&headers) {
        return (
            StatusCode::FORBIDDEN,
            axum::Json(rpc_error(
                &Value::Null,
                INVALID_REQUEST,
                "origin not allowed",
            )),
        )
            .into_response();
    }
    let msg: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(rpc_error(
                    &Value::Null,
                    PARSE_ERROR,
                    &format!("parse error: {e}"),
                )),
            )
                .into_response();
        }
    };
    match server.handle(&msg).await {
        Some(answer) => axum::Json(answer).into_response(),
        None => StatusCode::ACCEPTED.into_response(),
    }
}
