//! The receiver's side of the MCP binding: [`PaidServer`], a gate around any rmcp
//! `ServerHandler`.

use std::borrow::Cow;
use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;

use rail_core::Money;
#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CancelTaskParams,
    CancelledNotificationParam, CompleteRequestParams, CompleteResult, ContentBlock,
    CustomNotification, CustomRequest, CustomResult, DiscoverResult, ErrorCode,
    GetPromptRequestParams, GetPromptResponse, GetPromptResult, GetSkillRequestParams,
    GetSkillResult, GetTaskParams, GetTaskResult, InitializeRequestParams, InitializeResult,
    JsonObject, ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult,
    ListSkillsResult, ListToolsResult, MetaObject, PaginatedRequestParams,
    ProgressNotificationParam, ProtocolVersion, ReadResourceDirectoryRequestParams,
    ReadResourceDirectoryResult, ReadResourceRequestParams, ReadResourceResponse,
    ReadResourceResult, ServerCapabilities, ServerConfig, SubscribeRequestParams,
    SubscriptionFilter, Tool, UnsubscribeRequestParams, UpdateTaskParams,
};
use rmcp::service::{
    MaybeSendFuture, NotificationContext, RequestContext, RoleServer, SubscriptionContext,
};
use rmcp::{ErrorData, ServerHandler};
use serde_json::{Value, json};
use x402_transport::mcp::{McpPaywall, PricedTool, payment_required_result};

use super::{
    PAYMENT, PAYMENT_REQUIRED, PAYMENT_REQUIRED_MESSAGE, PAYMENTS, PRICING, RECEIPT, TAB, TAB_CALL,
    TAB_CLOSE, VOUCHER,
};
use crate::Error;
use crate::envelope::{Digest, Quote, Signed, Tab};
use crate::receiver::{
    Answer, OUTCOME_UNKNOWN, Outcome as GateOutcome, PricedCapability, Ran, Receiver, Request,
    Seal, Served, Tender, Work, X402Payment,
};

tokio::task_local! {
    /// The final amount a paid checkout tool named (see [`final_amount`]).
    static FINAL: RefCell<Option<Money>>;
}

/// Called by a priced checkout tool (resource, prompt) while it runs under a [`PaidServer`]:
/// the gate captures `amount` of the hold (never above the Quote or the Confirmation) instead
/// of the estimate. Returns `false` outside a paid call (nothing to capture). It must be called
/// from the task the handler runs in (not from a task it spawned).
pub fn final_amount(amount: Money) -> bool {
    FINAL.try_with(|c| *c.borrow_mut() = Some(amount)).is_ok()
}

/// The status under which a paid call's result is kept for a repeat of its Proof.
const KEPT_RESULT: u16 = 200;
/// The status under which a paid call's JSON-RPC error is kept.
const KEPT_ERROR: u16 = 500;

/// How often the tab keeper writes tabs' answers and closes the tabs whose end has come.
const TAB_KEEPER_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// An rmcp `ServerHandler` behind the Stipendex MCP gate. Every method is the inner
/// handler's, except:
/// - `initialize` (and `get_info`) add `capabilities.experimental["stipendex/payments"]`;
/// - `tools/list`, `resources/list` (and a directory's listing), `prompts/list` and
///   `resources/templates/list` add `_meta["stipendex/pricing"]` to what is priced (a
///   template: when its resources are);
/// - `tools/call`, `resources/read` and `prompts/get` of what the receiver prices are
///   quoted, paid and receipted (module docs of [`crate::mcp`]).
///
/// Serve it like any handler: over stdio (`rmcp::ServiceExt::serve`) or Streamable HTTP
/// ([`x402_transport::mcp::streamable_http`], which makes one per request: keep `H` cheap to
/// clone).
pub struct PaidServer<H> {
    inner: H,
    gate: Arc<GateState>,
}

impl<H: Clone> Clone for PaidServer<H> {
    fn clone(&self) -> Self {
        PaidServer {
            inner: self.inner.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<H> std::fmt::Debug for PaidServer<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaidServer")
            .field("receiver", &self.gate.receiver)
            .field("x402", &self.gate.x402.is_some())
            .finish_non_exhaustive()
    }
}

struct GateState {
    receiver: Receiver,
    x402: Option<McpPaywall>,
    observe: Option<Observer>,
    /// The peers whose `X-Forwarded-For` tells the client (Streamable HTTP).
    #[cfg(feature = "mcp-http")]
    trusted: crate::http::TrustedProxies,
}

/// Told what the gate did with each priced call.
type Observer = Arc<dyn Fn(&GateOutcome) + Send + Sync>;

impl GateState {
    fn saw(&self, o: &GateOutcome) {
        if let Some(f) = &self.observe {
            f(o);
        }
    }
}

impl<H: ServerHandler> PaidServer<H> {
    /// `inner` behind `receiver`'s prices. The receiver names its public origins: the
    /// Streamable HTTP origin(s) it is reached at, or for a stdio server the identity hosts
    /// configure for it. Its Quotes name the one the call came in at (the first for stdio).
    ///
    /// # Errors
    /// [`Error::Config`] if the receiver has no origin.
    pub fn new(inner: H, receiver: Receiver) -> Result<Self, Error> {
        if receiver.origins().is_empty() {
            return Err(Error::Config(format!(
                "receiver {} has no public origin: name the MCP server's identity with Receiver::builder(…).origin(\"https://host[:port]\") (its Streamable HTTP origin, or the identity hosts configure for its stdio command)",
                receiver.party().id
            )));
        }
        // Tabs left open are closed (captured) when their end comes, as over HTTP: without the
        // keeper a payer who never closes its tab is served until its hold lapses, uncaptured.
        // Started here when a runtime runs, else on the first tab call.
        receiver.spawn_tab_keeper(TAB_KEEPER_EVERY);
        Ok(PaidServer {
            inner,
            gate: Arc::new(GateState {
                receiver,
                x402: None,
                observe: None,
                #[cfg(feature = "mcp-http")]
                trusted: crate::http::TrustedProxies::default(),
            }),
        })
    }

    /// Also offers the x402 schemes `paywall` prices to clients that do not say they speak
    /// Stipendex (x402's MCP convention: `isError` + `structuredContent.accepts`, paid with
    /// `_meta["x402/payment"]`). Every paywall tool must be priced on the receiver under the
    /// same name: the receiver decides alone what is priced. An x402 payment at the list price
    /// is served by the receiver's engine under its one served-once record (decision 0038: the
    /// same payment again gets the kept result); the paywall gives the tools, their schemes and
    /// when they settle.
    ///
    /// # Errors
    /// [`Error::Config`] if a paywall tool has no `tools/call` price of the same pattern.
    pub fn with_x402(mut self, paywall: McpPaywall) -> Result<Self, Error> {
        for t in paywall.tools() {
            if !self
                .gate
                .receiver
                .capabilities()
                .iter()
                .any(|c| c.method() == "tools/call" && c.name() == t.name)
            {
                return Err(Error::Config(format!(
                    "the x402 tool {} has no Stipendex price of the same name: price it on the receiver too (PricedCapability::fixed(\"tools/call\", \"{}\", …))",
                    t.name, t.name
                )));
            }
        }
        self.gate = Arc::new(GateState {
            receiver: self.gate.receiver.clone(),
            x402: Some(paywall),
            observe: self.gate.observe.clone(),
            #[cfg(feature = "mcp-http")]
            trusted: self.gate.trusted.clone(),
        });
        Ok(self)
    }

    /// Calls `f` with what the gate did with each priced call (quoted, refused, paid, replayed,
    /// rejected): for logs and metrics. Keep it cheap; it runs on the call's path.
    #[must_use]
    pub fn on_outcome(mut self, f: impl Fn(&GateOutcome) + Send + Sync + 'static) -> Self {
        self.gate = Arc::new(GateState {
            receiver: self.gate.receiver.clone(),
            x402: self.gate.x402.clone(),
            observe: Some(Arc::new(f)),
            #[cfg(feature = "mcp-http")]
            trusted: self.gate.trusted.clone(),
        });
        self
    }

    /// Over Streamable HTTP, believes `X-Forwarded-For` from these peers only: behind such a
    /// proxy a caller is told apart (for the per-client limits) by the address the proxy
    /// vouches for, as the HTTP binding does ([`crate::http::client_key`]: IPv6 by its /64).
    #[cfg(feature = "mcp-http")]
    #[must_use]
    pub fn trusted_proxies(mut self, trusted: crate::http::TrustedProxies) -> Self {
        self.gate = Arc::new(GateState {
            receiver: self.gate.receiver.clone(),
            x402: self.gate.x402.clone(),
            observe: self.gate.observe.clone(),
            trusted,
        });
        self
    }

    /// The receiver.
    #[must_use]
    pub fn receiver(&self) -> &Receiver {
        &self.gate.receiver
    }

    /// The inner handler.
    #[must_use]
    pub fn inner(&self) -> &H {
        &self.inner
    }
}

/// Adds `experimental["stipendex/payments"] = {"version": "0.1"}`.
fn declare(caps: &mut ServerCapabilities) {
    caps.experimental
        .get_or_insert_with(Default::default)
        .insert(PAYMENTS.to_owned(), super::payments_marker());
}

/// Whether the caller says it speaks Stipendex: per call in `_meta`, or at `initialize` (in a
/// session, or in the request's own client capabilities).
fn speaks_stipendex(context: &RequestContext<RoleServer>) -> bool {
    context.meta.0.0.get(PAYMENTS).is_some_and(Value::is_object)
        || context
            .client_capabilities()
            .and_then(|c| c.experimental)
            .is_some_and(|e| e.contains_key(PAYMENTS))
}

/// The Proof in `_meta["stipendex/payment"]`: `None` if absent; the compact JWS of the
/// `{"stipendex", "jws"}` object (or of a bare string); an error for anything else.
fn proof_in(meta: &JsonObject) -> Option<Result<String, String>> {
    signed_in(meta, PAYMENT, "proof/0.1")
}

/// The signed object of kind `kind` in `_meta[key]`, as [`proof_in`] reads the Proof.
fn signed_in(meta: &JsonObject, key: &str, kind: &str) -> Option<Result<String, String>> {
    match meta.get(key) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(Ok(s.clone())),
        Some(Value::Object(o)) => Some(match o.get("jws") {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(format!(
                "_meta[\"{key}\"] has no `jws`: send {{\"stipendex\": \"{kind}\", \"jws\": …}}"
            )),
        }),
        Some(_) => Some(Err(format!(
            "_meta[\"{key}\"] is neither a signed object nor a compact JWS"
        ))),
    }
}

/// The host the call came in at (Streamable HTTP) and the caller's address, where the
/// transport knows them.
fn connection(
    context: &RequestContext<RoleServer>,
    #[cfg(feature = "mcp-http")] trusted: &crate::http::TrustedProxies,
) -> (Option<String>, Option<String>) {
    #[cfg(feature = "mcp-http")]
    {
        if let Some(parts) = context.extensions.get::<axum::http::request::Parts>() {
            let host = parts
                .headers
                .get(axum::http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned);
            let peer = parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map(|c| c.0.ip());
            let client = crate::http::client_key(peer, &parts.headers, trusted);
            return (host, client);
        }
    }
    let _ = context;
    (None, None)
}

/// A JSON-RPC error with `data`.
fn rpc_error(code: i32, message: impl Into<Cow<'static, str>>, data: Value) -> ErrorData {
    ErrorData::new(ErrorCode(code), message, Some(data))
}

/// The -32402 error: `data.quote` (and `data.tab`, a tab offered beside it), and why the last
/// payment was refused.
fn payment_required(
    quote: &Signed<Quote>,
    tab: Option<&Signed<Tab>>,
    refusal: Option<(String, String)>,
) -> ErrorData {
    let mut data = json!({"quote": quote});
    if let Some(o) = data.as_object_mut() {
        if let Some(t) = tab {
            o.insert("tab".into(), json!(t));
        }
        if let Some((code, message)) = refusal {
            o.insert("error".into(), Value::String(code));
            o.insert("message".into(), Value::String(message));
        }
    }
    rpc_error(PAYMENT_REQUIRED, PAYMENT_REQUIRED_MESSAGE, data)
}

/// No Quote can be made now (a rail down, too many costly quotes): retry later.
fn cannot_quote(e: &Error) -> ErrorData {
    let mut data = json!({"error": e.code(), "message": e.to_string(), "retryable": true});
    if let (Error::RateLimited { retry_after, .. }, Some(o)) = (e, data.as_object_mut()) {
        o.insert("retryAfterSeconds".into(), json!(retry_after));
    } else {
        tracing::error!(error = %e, "stipendex/mcp: cannot quote");
    }
    rpc_error(
        ErrorCode::INTERNAL_ERROR.0,
        format!("cannot quote now: {e}"),
        data,
    )
}

/// The payment's outcome is not known yet: send the same Proof again.
fn retry_same(e: &rail_core::RailError) -> ErrorData {
    rpc_error(
        ErrorCode::INTERNAL_ERROR.0,
        format!("{e}: send the same {PAYMENT} again"),
        json!({"error": e.code(), "retryable": true, "retryAfterSeconds": x402_transport::wire::RETRY_AFTER_SECS}),
    )
}

/// A request `resolve_price` rejected: nothing charged, nothing run.
fn rejected(message: &str) -> ErrorData {
    rpc_error(
        ErrorCode::INVALID_REQUEST.0,
        format!("rejected: {message}"),
        json!({"error": "rejected", "message": message}),
    )
}

/// What a gated method's response is, to the gate.
trait Outcome: Sized {
    /// The completed result as JSON and whether it is a failure (a tool's `isError`); the
    /// response itself when it is not a completed result (input required, a task).
    fn completed(self) -> Result<(Value, bool), Self>;
    /// The completed result from its JSON.
    fn from_json(v: Value) -> Result<Self, serde_json::Error>;
}

fn completed<T: serde::Serialize>(r: &T, failed: bool) -> Option<(Value, bool)> {
    serde_json::to_value(r).ok().map(|v| (v, failed))
}

impl Outcome for CallToolResponse {
    fn completed(self) -> Result<(Value, bool), Self> {
        match self {
            CallToolResponse::Complete(r) => {
                let failed = r.is_error == Some(true);
                completed(&r, failed).ok_or(CallToolResponse::Complete(r))
            }
            other => Err(other),
        }
    }
    fn from_json(v: Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value::<CallToolResult>(v).map(CallToolResponse::Complete)
    }
}

impl Outcome for ReadResourceResponse {
    fn completed(self) -> Result<(Value, bool), Self> {
        match self {
            ReadResourceResponse::Complete(r) => {
                completed(&r, false).ok_or(ReadResourceResponse::Complete(r))
            }
            other => Err(other),
        }
    }
    fn from_json(v: Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value::<ReadResourceResult>(v).map(ReadResourceResponse::Complete)
    }
}

impl Outcome for GetPromptResponse {
    fn completed(self) -> Result<(Value, bool), Self> {
        match self {
            GetPromptResponse::Complete(r) => {
                completed(&r, false).ok_or(GetPromptResponse::Complete(r))
            }
            other => Err(other),
        }
    }
    fn from_json(v: Value) -> Result<Self, serde_json::Error> {
        serde_json::from_value::<GetPromptResult>(v).map(GetPromptResponse::Complete)
    }
}

/// The kept answer of a Proof presented again.
fn replay<R: Outcome>(answer: &Answer) -> Result<R, ErrorData> {
    let bad = |e: serde_json::Error| {
        ErrorData::internal_error(format!("the kept answer cannot be read: {e}"), None)
    };
    let v: Value = serde_json::from_slice(&answer.body).map_err(bad)?;
    if answer.status == KEPT_ERROR {
        return Err(serde_json::from_value::<ErrorData>(v).map_err(bad)?);
    }
    R::from_json(v).map_err(bad)
}

impl GateState {
    /// The Stipendex request of a call.
    fn request(
        &self,
        context: &RequestContext<RoleServer>,
        method: &str,
        name: &str,
        arguments: Option<&JsonObject>,
    ) -> Request {
        let (host, client) = connection(
            context,
            #[cfg(feature = "mcp-http")]
            &self.trusted,
        );
        let origin = self.receiver.origin_for(host.as_deref());
        let mut r = super::request(origin, method, name, arguments);
        r.client = client;
        r
    }

    /// A gated call: every step is the engine's ([`Receiver::serve`]); the gate reads what
    /// `_meta` presents to pay and encodes the engine's answer.
    async fn call<R, F>(
        &self,
        cap: &PricedCapability,
        sreq: &Request,
        context: &RequestContext<RoleServer>,
        run: F,
    ) -> Result<R, ErrorData>
    where
        R: Outcome + Send,
        F: Future<Output = Result<R, ErrorData>> + Send,
    {
        let payment = payment_in(&context.meta.0.0);
        let voucher = matches!(payment, Tender::Voucher { .. });
        let work = McpWork::new(run);
        let served = self.serve(cap, sreq, payment, work).await;
        self.respond(served, voucher)
    }

    /// The engine on a call: every step is [`Receiver::serve`]'s.
    async fn serve<R, F>(
        &self,
        cap: &PricedCapability,
        sreq: &Request,
        payment: Tender,
        work: McpWork<R, F>,
    ) -> Served<McpOut<R>>
    where
        R: Outcome + Send,
        F: Future<Output = Result<R, ErrorData>> + Send,
    {
        if matches!(payment, Tender::Voucher { .. }) {
            // The keeper, if the server was made outside a runtime (a no-op once started).
            self.receiver.spawn_tab_keeper(TAB_KEEPER_EVERY);
        }
        self.receiver.serve(cap, sreq, payment, work).await
    }

    /// The engine's answer as the call's result or JSON-RPC error.
    fn respond<R: Outcome>(
        &self,
        served: Served<McpOut<R>>,
        voucher: bool,
    ) -> Result<R, ErrorData> {
        let uncounted_in = |mut e: ErrorData, uncounted: Option<Digest>| {
            if let (Some(v), Some(Value::Object(o))) = (uncounted, e.data.as_mut()) {
                o.insert(TAB_CALL.into(), super::uncounted(&v));
            }
            e
        };
        match served {
            Served::Free { out, .. } => out.into_result(),
            Served::Ran { out, outcome } => {
                if let Some(o) = &outcome {
                    self.saw(o);
                }
                out.into_result()
            }
            Served::Quote {
                quote,
                tab,
                refusal,
                ..
            } => {
                self.saw(&GateOutcome::Quoted {
                    refusal: refusal.as_ref().map(|(code, _)| code.clone()),
                });
                Err(payment_required(&quote, tab.as_deref(), refusal))
            }
            Served::Rejected { message, uncounted } => {
                self.saw(&GateOutcome::Rejected);
                Err(uncounted_in(rejected(&message), uncounted))
            }
            Served::NotPriced => Err(rpc_error(
                ErrorCode::INVALID_REQUEST.0,
                format!("this call needs no payment now: send it without _meta[\"{PAYMENT}\"]"),
                json!({"error": "not_priced"}),
            )),
            Served::CannotQuote(e) => Err(cannot_quote(&e)),
            Served::Replayed { answer, .. } => {
                self.saw(&GateOutcome::Replayed);
                replay(&answer)
            }
            // Answered and receipted once, its kept answer since let go: not run again, nothing
            // more charged, and said so (never a fresh Quote for a call already paid).
            Served::Gone(g) => {
                let mut data = json!({
                    "error": crate::receiver::ANSWER_GONE,
                    "message": g.message,
                    "quote": g.quote,
                });
                if let (Some(obj), Some(r)) = (data.as_object_mut(), &g.receipt) {
                    obj.insert("receipt".into(), Value::from(r.as_str()));
                }
                Err(rpc_error(
                    ErrorCode::INVALID_REQUEST.0,
                    format!(
                        "{}: the call was answered once and is not run again",
                        g.message
                    ),
                    data,
                ))
            }
            Served::OutcomeUnknown { answer, .. } => replay(&answer),
            // The one guard: while the work cannot be done, nothing is taken and the caller is
            // told to send the same payment again (a voucher is not counted).
            Served::Retry {
                error,
                unavailable: true,
                uncounted,
            } => Err(uncounted_in(not_now(&error), uncounted)),
            Served::Retry { error, .. } => Err(match error {
                Error::Payment(r) => retry_same(&r),
                Error::Storage(s) => retry_same(&rail_core::RailError::Storage(s)),
                e => retry_same(&rail_core::RailError::Storage(e.to_string())),
            }),
            Served::Undelivered { why, uncounted } => {
                let message = if voucher {
                    format!("{why}: send the same {VOUCHER} again")
                } else {
                    format!("{why}: nothing was kept; send the same {PAYMENT} again")
                };
                Err(uncounted_in(
                    rpc_error(
                        ErrorCode::INTERNAL_ERROR.0,
                        message,
                        json!({"error": "upstream_unavailable", "retryable": true, "retryAfterSeconds": x402_transport::wire::RETRY_AFTER_SECS}),
                    ),
                    uncounted,
                ))
            }
            Served::Undeliverable { why, uncounted, .. } => Err(uncounted_in(
                rpc_error(
                    ErrorCode::INTERNAL_ERROR.0,
                    format!("{why}: the answer cannot be delivered"),
                    json!({"error": "answer_undeliverable"}),
                ),
                uncounted,
            )),
            Served::Unsettled(e) => Err(rpc_error(
                ErrorCode::INTERNAL_ERROR.0,
                format!("the call ran but its payment could not be settled: {e}"),
                json!({"error": e.code()}),
            )),
            #[allow(unreachable_patterns)]
            _ => Err(ErrorData::internal_error("unexpected answer", None)),
        }
    }
}

/// The guard refused ([`Receiver::guard`]): the work cannot be done now; nothing was taken.
fn not_now(error: &Error) -> ErrorData {
    rpc_error(
        ErrorCode::INTERNAL_ERROR.0,
        format!("{error}: nothing was charged; send the same payment again later"),
        json!({
            "error": error.code(),
            "message": error.to_string(),
            "retryable": true,
            "retryAfterSeconds": x402_transport::wire::RETRY_AFTER_SECS,
        }),
    )
}

/// What `_meta` presents to pay: a voucher (with the tab's opening), a Proof, nothing, or a
/// payment that cannot be read.
fn payment_in(meta: &JsonObject) -> Tender {
    match signed_in(meta, VOUCHER, "voucher/0.1") {
        None => {}
        Some(Err(why)) => return Tender::Malformed(why),
        Some(Ok(_)) if meta.contains_key(PAYMENT) => {
            return Tender::Malformed("a call is paid by a Proof or a voucher, not both".into());
        }
        Some(Ok(voucher)) => {
            return match signed_in(meta, TAB, "proof/0.1").transpose() {
                Ok(open) => Tender::Voucher { voucher, open },
                Err(why) => Tender::Malformed(why),
            };
        }
    }
    match proof_in(meta) {
        None => Tender::None,
        Some(Ok(jws)) => Tender::Proof(jws),
        Some(Err(why)) => Tender::Malformed(why),
    }
}

/// A gated call's answer on its way through the engine: the handler's response, or its
/// completed result as JSON (sealed with a Receipt or a tab call's digests).
enum McpOut<R> {
    Done(Result<R, ErrorData>),
    Value(Value),
}

impl<R: Outcome> McpOut<R> {
    fn into_result(self) -> Result<R, ErrorData> {
        match self {
            McpOut::Done(r) => r,
            McpOut::Value(v) => R::from_json(v).map_err(|e| internal(&e)),
        }
    }
}

/// The x402 payment a call of `tool` (priced by `paywall`) presents in its `_meta`, read for
/// the engine: `None` when it presents none.
fn x402_payment(paywall: &McpPaywall, tool: &PricedTool, meta: &JsonObject) -> Option<X402Payment> {
    let url = format!("mcp://tool/{}", tool.name);
    X402Payment::read(
        tool.accepts.as_slice(),
        x402_transport::mcp::presented(tool, Some(meta)),
        (&tool.name, &url, &tool.description),
        paywall.settle_when().for_method(None),
        paywall.clock().now(),
    )
}

/// The handler's call behind the gate.
struct McpWork<R, F> {
    run: Option<F>,
    _out: std::marker::PhantomData<fn() -> R>,
}

impl<R, F> McpWork<R, F>
where
    F: Future<Output = Result<R, ErrorData>> + Send,
{
    fn new(run: F) -> Self {
        McpWork {
            run: Some(run),
            _out: std::marker::PhantomData,
        }
    }

    async fn run(&mut self) -> Result<R, ErrorData> {
        match self.run.take() {
            Some(f) => f.await,
            None => Err(ErrorData::internal_error("the call was already run", None)),
        }
    }
}

impl<R, F> Work for McpWork<R, F>
where
    R: Outcome + Send,
    F: Future<Output = Result<R, ErrorData>> + Send,
{
    type Out = McpOut<R>;

    async fn run_free(&mut self) -> McpOut<R> {
        McpOut::Done(self.run().await)
    }

    async fn run_paid(&mut self) -> Ran<McpOut<R>> {
        let (out, final_amount) = FINAL
            .scope(RefCell::new(None), async {
                let out = self.run().await;
                (out, FINAL.with(RefCell::take))
            })
            .await;
        match out {
            Err(e) if super::is_undelivered(&e) => Ran::Undelivered(e.message.to_string()),
            // A failure: kept as the answer (a hold voided); a call inside a tab stays paid.
            Err(e) => {
                let v = serde_json::to_value(&e).unwrap_or(Value::Null);
                Ran::Answered {
                    result: super::result_digest(&v),
                    out: McpOut::Done(Err(e)),
                    ok: false,
                    final_amount,
                }
            }
            Ok(r) => match r.completed() {
                // Input required, a task: not a result to bind.
                Err(r) => Ran::Unbound(McpOut::Done(Ok(r))),
                Ok((v, failed)) => Ran::Answered {
                    result: super::result_digest(&v),
                    out: McpOut::Value(v),
                    ok: !failed,
                    final_amount,
                },
            },
        }
    }

    fn seal(&mut self, out: &mut McpOut<R>, seal: Seal<'_>) -> Option<Answer> {
        let keep = Answer::json;
        if let Seal::Uncounted(voucher) = seal {
            // Run free inside a tab: the result says the voucher was not counted.
            let done = std::mem::replace(out, McpOut::Value(Value::Null));
            *out = match done {
                McpOut::Done(Ok(r)) => match r.completed() {
                    Ok((mut v, _)) => {
                        super::set_meta(&mut v, TAB_CALL, super::uncounted(voucher));
                        McpOut::Value(v)
                    }
                    Err(r) => McpOut::Done(Ok(r)),
                },
                other => other,
            };
            return None;
        }
        if let Seal::X402(settled) = seal {
            // x402's convention: every answer a tool result (a failure `isError`), the
            // settlement in `_meta["x402/payment-response"]` and the scheme's receipt in
            // `structuredContent.receipt`.
            let mut v = match std::mem::replace(out, McpOut::Value(Value::Null)) {
                McpOut::Value(v) => v,
                McpOut::Done(done) => {
                    let message = match done {
                        Ok(_) => "a paid tool must complete in one round".to_owned(),
                        Err(e) => e.message.to_string(),
                    };
                    serde_json::to_value(CallToolResult::error(vec![ContentBlock::text(message)]))
                        .unwrap_or(Value::Null)
                }
            };
            if let Some(x) = settled {
                x402_transport::mcp::with_receipt_json(&mut v, &x.response, x.receipt.as_ref());
            }
            let kept = settled.map(|_| keep(KEPT_RESULT, &v, None));
            *out = McpOut::Value(v);
            return kept;
        }
        match out {
            McpOut::Done(Err(e)) => serde_json::to_value(&*e)
                .ok()
                .map(|v| keep(KEPT_ERROR, &v, None)),
            McpOut::Done(Ok(_)) => None,
            McpOut::Value(v) => match seal {
                Seal::Receipt(r) => {
                    super::set_meta(v, RECEIPT, json!(r));
                    Some(keep(KEPT_RESULT, v, Some(r.jws().to_owned())))
                }
                Seal::TabCall { voucher, result } => {
                    super::set_meta(
                        v,
                        TAB_CALL,
                        json!({"voucher": voucher.as_str(), "result": result.as_str()}),
                    );
                    Some(keep(KEPT_RESULT, v, None))
                }
                Seal::Failed | Seal::Uncounted(_) | Seal::X402(_) => {
                    Some(keep(KEPT_RESULT, v, None))
                }
            },
        }
    }

    fn outcome_unknown() -> (Answer, Digest) {
        let e = rpc_error(
            ErrorCode::INTERNAL_ERROR.0,
            OUTCOME_UNKNOWN,
            json!({"error": "outcome_unknown"}),
        );
        let v = serde_json::to_value(&e).unwrap_or(Value::Null);
        (Answer::json(KEPT_ERROR, &v, None), super::result_digest(&v))
    }
}

impl GateState {
    /// `stipendex/tab-close`: the wallet's signed close request; the closing Receipt.
    async fn close_tab(&self, params: Option<&Value>) -> Result<CustomResult, ErrorData> {
        let jws = params
            .and_then(|p| p.get("close"))
            .and_then(|c| c.get("jws").or(Some(c)))
            .and_then(Value::as_str)
            .ok_or_else(|| {
                ErrorData::invalid_params(
                    "send {\"close\": {\"stipendex\": \"tab-close/0.1\", \"jws\": …}}",
                    None,
                )
            })?;
        match self.receiver.close_tab(jws).await {
            Ok(receipt) => Ok(CustomResult::new(json!({"receipt": receipt}))),
            Err(e) => {
                let retry = matches!(&e, Error::Storage(_))
                    || matches!(&e, Error::Payment(r) if r.is_retryable());
                Err(rpc_error(
                    if retry {
                        ErrorCode::INTERNAL_ERROR.0
                    } else {
                        ErrorCode::INVALID_PARAMS.0
                    },
                    e.to_string(),
                    json!({"error": e.code(), "retryable": retry}),
                ))
            }
        }
    }
}

fn internal(e: &serde_json::Error) -> ErrorData {
    ErrorData::internal_error(format!("the result cannot be re-read: {e}"), None)
}

impl<H: ServerHandler> PaidServer<H> {
    /// The x402 paywall of tool `name`, if it is priced there.
    fn x402_for(&self, name: &str) -> Option<&McpPaywall> {
        self.gate.x402.as_ref().filter(|p| p.priced(name).is_some())
    }

    /// An unpaid call of a tool also priced in x402, from a client that does not say it speaks
    /// Stipendex: x402's payment-required result, with the Quote beside `accepts`.
    async fn x402_challenge(
        &self,
        paywall: &McpPaywall,
        name: &str,
        quote: &Signed<Quote>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = paywall.priced(name) else {
            return Err(payment_required(quote, None, None));
        };
        match paywall.payment_required(tool, None).await {
            Ok(mut structured) => {
                let error = structured
                    .get("error")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                if let Some(o) = structured.as_object_mut() {
                    o.insert("quote".into(), json!(quote));
                }
                Ok(payment_required_result(&structured, &error).into())
            }
            Err(f) => {
                tracing::warn!(tool = %name, failure = %f, "stipendex/mcp: the x402 schemes cannot issue a challenge now; quoting Stipendex only");
                Err(payment_required(quote, None, None))
            }
        }
    }
}

impl<H: ServerHandler> ServerHandler for PaidServer<H> {
    fn get_info(&self) -> ServerConfig {
        let mut info = self.inner.get_info();
        declare(&mut info.capabilities);
        info
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        let mut r = self.inner.initialize(request, context).await?;
        declare(&mut r.capabilities);
        Ok(r)
    }

    fn negotiate_initialize(
        &self,
        request: &InitializeRequestParams,
    ) -> Result<InitializeResult, ErrorData> {
        let mut r = self.inner.negotiate_initialize(request)?;
        declare(&mut r.capabilities);
        Ok(r)
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut r = self.inner.list_tools(request, context).await?;
        for t in &mut r.tools {
            self.hint(&mut t.meta, "tools/call", &t.name);
        }
        Ok(r)
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.inner.get_tool(name)
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let mut r = self.inner.list_resources(request, context).await?;
        for res in &mut r.resources {
            self.hint(&mut res.meta, "resources/read", &res.uri);
        }
        Ok(r)
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let mut r = self.inner.list_prompts(request, context).await?;
        for p in &mut r.prompts {
            self.hint(&mut p.meta, "prompts/get", &p.name);
        }
        Ok(r)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let probe = Request::new("tools/call", request.name.as_ref());
        let Some(cap) = self.gate.receiver.decide(&probe) else {
            return self.inner.call_tool(request, context).await;
        };
        let name = request.name.to_string();
        let sreq = self
            .gate
            .request(&context, "tools/call", &name, request.arguments.as_ref());
        let x402 = self.x402_for(&name);
        let meta = &context.meta.0.0;
        let mut payment = payment_in(meta);
        let voucher = matches!(payment, Tender::Voucher { .. });
        // An x402 payment on a tool x402 also prices: the engine asks the hook once, and serves
        // the payment only at the list price the hook kept (else it is set aside).
        let priced = x402.and_then(|p| Some((p, p.priced(&name)?)));
        if let Some(pay) = priced.and_then(|(p, tool)| x402_payment(p, tool, meta)) {
            payment = Tender::X402 {
                payment: Box::new(pay),
                beside: Box::new(payment),
            };
        }
        // A client that does not speak Stipendex, unpaid: x402's convention (the Quote beside
        // `accepts`) when the Quote is at the list price the x402 route is built at.
        let x402_convention =
            x402.is_some() && !speaks_stipendex(&context) && proof_in(meta).is_none();
        let work = McpWork::new(self.inner.call_tool(request, context));
        let served = self.gate.serve(cap, &sreq, payment, work).await;
        match (served, priced) {
            (Served::X402Failed(f), Some((paywall, tool))) => {
                Ok(paywall.failure(tool, f.failure).await.into())
            }
            (
                Served::Quote {
                    quote,
                    list_price: true,
                    ..
                },
                Some((paywall, _)),
            ) if x402_convention => {
                self.gate.saw(&GateOutcome::Quoted { refusal: None });
                self.x402_challenge(paywall, &name, &quote).await
            }
            (served, _) => self.gate.respond(served, voucher),
        }
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let probe = Request::new("resources/read", request.uri.as_str());
        let Some(cap) = self.gate.receiver.decide(&probe) else {
            return self.inner.read_resource(request, context).await;
        };
        let sreq = self
            .gate
            .request(&context, "resources/read", &request.uri, None);
        let run = self.inner.read_resource(request, context.clone());
        self.gate.call(cap, &sreq, &context, run).await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let probe = Request::new("prompts/get", request.name.as_str());
        let Some(cap) = self.gate.receiver.decide(&probe) else {
            return self.inner.get_prompt(request, context).await;
        };
        let args = request.arguments.clone();
        let sreq = self
            .gate
            .request(&context, "prompts/get", &request.name, args.as_ref());
        let run = self.inner.get_prompt(request, context.clone());
        self.gate.call(cap, &sreq, &context, run).await
    }

    // Everything else is the inner handler's.

    fn ping(
        &self,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        self.inner.ping(context)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        self.inner.supported_protocol_versions()
    }

    async fn discover(
        &self,
        context: RequestContext<RoleServer>,
    ) -> Result<DiscoverResult, ErrorData> {
        let mut r = self.inner.discover(context).await?;
        declare(&mut r.capabilities);
        Ok(r)
    }

    fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CompleteResult, ErrorData>> + MaybeSendFuture + '_ {
        self.inner.complete(request, context)
    }

    #[allow(deprecated)]
    fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        self.inner.set_level(request, context)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let mut r = self.inner.list_resource_templates(request, context).await?;
        for t in &mut r.resource_templates {
            // Priced as the resources it makes are: a template names no resource itself.
            self.hint(&mut t.meta, "resources/read", &expanded(&t.uri_template));
        }
        Ok(r)
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        self.inner.accepted_subscription_filter(requested)
    }

    fn listen(
        &self,
        context: SubscriptionContext,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        self.inner.listen(context)
    }

    #[allow(deprecated)]
    fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        self.inner.subscribe(request, context)
    }

    #[allow(deprecated)]
    fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        self.inner.unsubscribe(request, context)
    }

    fn on_custom_request(
        &self,
        request: CustomRequest,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CustomResult, ErrorData>> + MaybeSendFuture + '_ {
        let gate = self.gate.clone();
        let inner = (request.method != TAB_CLOSE)
            .then(|| self.inner.on_custom_request(request.clone(), context));
        async move {
            match inner {
                Some(f) => f.await,
                None => gate.close_tab(request.params.as_ref()).await,
            }
        }
    }

    fn on_cancelled(
        &self,
        notification: CancelledNotificationParam,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_cancelled(notification, context)
    }

    fn on_progress(
        &self,
        notification: ProgressNotificationParam,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_progress(notification, context)
    }

    fn on_initialized(
        &self,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_initialized(context)
    }

    fn on_roots_list_changed(
        &self,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_roots_list_changed(context)
    }

    fn on_custom_notification(
        &self,
        notification: CustomNotification,
        context: NotificationContext<RoleServer>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.inner.on_custom_notification(notification, context)
    }

    fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<GetTaskResult, ErrorData>> + MaybeSendFuture + '_ {
        self.inner.get_task(request, context)
    }

    fn update_task(
        &self,
        request: UpdateTaskParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        self.inner.update_task(request, context)
    }

    fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<(), ErrorData>> + MaybeSendFuture + '_ {
        self.inner.cancel_task(request, context)
    }

    fn list_skills(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListSkillsResult, ErrorData>> + MaybeSendFuture + '_ {
        self.inner.list_skills(request, context)
    }

    fn get_skill(
        &self,
        request: GetSkillRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<GetSkillResult, ErrorData>> + MaybeSendFuture + '_ {
        self.inner.get_skill(request, context)
    }

    async fn read_resource_directory(
        &self,
        request: ReadResourceDirectoryRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceDirectoryResult, ErrorData> {
        // A directory's listing is a `resources/list` page: the same hints.
        let mut r = self.inner.read_resource_directory(request, context).await?;
        for res in &mut r.resources {
            self.hint(&mut res.meta, "resources/read", &res.uri);
        }
        Ok(r)
    }
}

/// A URI the RFC 6570 template `t` makes, each expression (`{path}`, `{+path}`, …) standing
/// for one plain segment: what the price patterns are matched against to tell whether the
/// template's resources are priced (`files://*` prices `files://{path}`).
fn expanded(t: &str) -> String {
    let mut out = String::with_capacity(t.len());
    let mut rest = t;
    while let Some((before, after)) = rest.split_once('{') {
        out.push_str(before);
        match after.split_once('}') {
            Some((_, tail)) => {
                out.push('x');
                rest = tail;
            }
            None => {
                // Not an expression: the text as it is.
                out.push('{');
                rest = after;
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

impl<H: ServerHandler> PaidServer<H> {
    /// Sets `_meta["stipendex/pricing"]` on a listed item the receiver prices under `method`.
    fn hint(&self, meta: &mut Option<MetaObject>, method: &str, name: &str) {
        if let Some(cap) = self.gate.receiver.decide(&Request::new(method, name)) {
            meta.get_or_insert_with(Default::default)
                .0
                .insert(PRICING.into(), super::pricing_hint(&cap.price));
        }
    }
}
