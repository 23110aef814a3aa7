//! x402 over MCP (`specs/transports-v2/mcp.md`): a small adapter to put in front of the tools
//! of any rmcp server (`ServerHandler::call_tool`).
//!
//! - An unpaid call to a priced tool gets a tool result with `isError: true`, the
//!   `PaymentRequired` in `structuredContent`, and `{"x402/error":{"code":402, "message",
//!   "data": PaymentRequired}}` as `content[0].text`.
//! - The payment comes in `params._meta["x402/payment"]` (a `PaymentPayload` object). It is
//!   decoded strictly, must match the tool's requirements, and is verified by the
//!   facilitator **before** the tool runs.
//! - The tool runs; a tool error (`isError: true`) is not charged. Otherwise the payment is
//!   settled, and only then is the tool's output returned, with the `SettleResponse` in
//!   `result._meta["x402/payment-response"]`. A failed or unknown settlement withholds the
//!   output: the result is the payment-required error with the failure in
//!   `structuredContent["x402/payment-response"]`.
//! - Each authorization is served once (also across instances sharing a [`KeyStore`]).
//!
//! ```no_run
//! # async fn demo(
//! #     paywall: rail_x402::mcp::McpPaywall,
//! #     request: rmcp::model::CallToolRequestParams,
//! #     context: rmcp::service::RequestContext<rmcp::service::RoleServer>,
//! # ) {
//! use rmcp::model::{CallToolResult, ContentBlock};
//! // inside ServerHandler::call_tool(&self, request, context):
//! let result = paywall
//!     .call(&request.name, Some(&context.meta.0.0), || async {
//!         CallToolResult::success(vec![ContentBlock::text("analysis…")])
//!     })
//!     .await;
//! # }
//! ```

use std::future::Future;
use std::sync::Arc;

use alloy_primitives::{Address, U256};
use rail_core::keys::KeyStore;
use rail_core::{MemoryKeyStore, RailError, ReplayGuard, SharedClock, SystemClock};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, JsonObject, MetaObject, RequestMetaObject,
};
use serde_json::{Value, json};

use crate::facilitator::{Facilitator, SettleOutcome, settle_for_serving};
use crate::fields::Uint256Decimal;
use crate::served::{
    RUNNING, SERVE_WINDOW, SERVED_RETENTION, in_flight, mark_paid, release, served_key,
};
use crate::token::Token;
use crate::verify::{find_matching_requirements, precheck, reasons, unix_secs};
use crate::wire::PAYMENT_REQUIRED_ERROR;
use crate::wire::{
    Extra, PaymentPayload, PaymentRequired, PaymentRequirements, ResourceInfo, SCHEME_EXACT,
    SettleResponse, V2,
};

/// `params._meta` key of the payment.
pub const PAYMENT_META: &str = "x402/payment";
/// `result._meta` key of the settlement.
pub const PAYMENT_RESPONSE_META: &str = "x402/payment-response";

#[derive(Clone, Debug)]
struct PricedTool {
    name: String,
    amount: U256,
    description: String,
}

/// Priced tools and the facilitator that settles them. Cheap to clone.
#[derive(Clone, Debug)]
pub struct McpPaywall {
    facilitator: Arc<dyn Facilitator>,
    token: Token,
    pay_to: Address,
    max_timeout_seconds: u64,
    tools: Arc<Vec<PricedTool>>,
    served: ReplayGuard,
    clock: SharedClock,
}

impl McpPaywall {
    /// Tools paid to `pay_to` in `token`, settled by `facilitator`; served payments in memory.
    #[must_use]
    pub fn new(facilitator: Arc<dyn Facilitator>, token: Token, pay_to: Address) -> Self {
        Self {
            facilitator,
            token,
            pay_to,
            max_timeout_seconds: 60,
            tools: Arc::new(Vec::new()),
            served: ReplayGuard::new(Arc::new(MemoryKeyStore::default()), "x402/served"),
            clock: Arc::new(SystemClock),
        }
    }

    /// Judges payments' validity windows by `clock` instead of the host's clock.
    #[must_use]
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Served payments in `store` (PostgreSQL for several instances; the same namespace as
    /// the HTTP paywall, so one payment is served once across both).
    #[must_use]
    pub fn with_store(mut self, store: Arc<dyn KeyStore>) -> Self {
        self.served = ReplayGuard::new(store, "x402/served");
        self
    }

    /// Prices the tool `name` at `amount` atomic units.
    #[must_use]
    pub fn tool(
        mut self,
        name: &str,
        amount: impl Into<Uint256Decimal>,
        description: &str,
    ) -> Self {
        Arc::make_mut(&mut self.tools).push(PricedTool {
            name: name.to_owned(),
            amount: amount.into().value(),
            description: description.to_owned(),
        });
        self
    }

    /// The `PaymentRequired` of a priced tool (`None` if it is free).
    #[must_use]
    pub fn payment_required(&self, tool: &str) -> Option<PaymentRequired> {
        let t = self.tools.iter().find(|t| t.name == tool)?;
        let mut resource = ResourceInfo::new(format!("mcp://tool/{}", t.name));
        resource.description = Some(t.description.clone());
        Some(PaymentRequired {
            x402_version: V2::default(),
            error: Some(PAYMENT_REQUIRED_ERROR.into()),
            resource,
            accepts: vec![PaymentRequirements {
                scheme: SCHEME_EXACT.into(),
                network: self.token.network.clone(),
                amount: t.amount.into(),
                asset: self.token.address.to_checksum(None),
                pay_to: self.pay_to.to_checksum(None),
                max_timeout_seconds: self.max_timeout_seconds,
                extra: Some(Extra::eip712(&self.token.name, &self.token.version)),
            }],
            extensions: None,
        })
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
    /// or a verified payment, and its output is returned only once the payment settled.
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
        let Some(required) = self.payment_required(tool) else {
            return run().await;
        };
        let Some(requirements) = required.accepts.first().cloned() else {
            return run().await;
        };
        let refuse = |error: &str, settle: Option<&SettleResponse>| {
            payment_required_result(&required, error, settle)
        };
        let Some(raw) = meta.and_then(|m| m.get(PAYMENT_META)) else {
            return refuse(PAYMENT_REQUIRED_ERROR, None);
        };
        let payload: PaymentPayload = match serde_json::from_value(raw.clone()) {
            Ok(p) => p,
            Err(e) => {
                tracing::info!(error = %e, "x402/mcp: undecodable payment");
                return refuse(reasons::INVALID_PAYLOAD, None);
            }
        };
        if find_matching_requirements(std::slice::from_ref(&requirements), &payload).is_none() {
            return refuse(reasons::NO_MATCHING_REQUIREMENTS, None);
        }
        // Final offline verdicts before anything is recorded for this payment.
        if let Err(e) = precheck(&payload, &requirements, unix_secs(self.clock.now())) {
            return refuse(e.reason(), None);
        }
        let key = served_key(&payload);
        let serving = match self.served.reserve(&key, SERVE_WINDOW).await {
            Ok(r) => r,
            Err(RailError::Replayed { .. }) => {
                return match in_flight(&self.served, &key).await {
                    Ok(true) => unavailable_result("this payment is being processed"),
                    Ok(false) => refuse(reasons::NONCE_ALREADY_USED, None),
                    Err(e) => unavailable_result(&e.to_string()),
                };
            }
            Err(e) => return unavailable_result(&e.to_string()),
        };
        match self.facilitator.verify(&payload, &requirements).await {
            Ok(v) if v.is_valid => {}
            // Perhaps settled by an earlier call whose answer was lost: settle recognises it.
            Ok(v)
                if matches!(
                    v.invalid_reason.as_deref(),
                    Some(reasons::NONCE_ALREADY_USED | reasons::VALID_BEFORE_EXPIRED)
                ) =>
            {
                return self
                    .recover(&payload, &requirements, serving, run, &refuse)
                    .await;
            }
            Ok(v) => {
                release(serving).await;
                return refuse(
                    v.invalid_reason
                        .as_deref()
                        .unwrap_or(reasons::INVALID_PAYLOAD),
                    None,
                );
            }
            Err(e) => {
                release(serving).await;
                return unavailable_result(&e.to_string());
            }
        }
        // Held while the tool runs (the lease kept alive): no copy runs beside it.
        if let Err(e) = serving.advance(RUNNING, None).await {
            release(serving).await;
            return unavailable_result(&e.to_string());
        }
        let result = serving.keep_alive(run()).await;
        if result.is_error == Some(true) {
            // Not charged: the tool failed.
            release(serving).await;
            return result;
        }
        match serving
            .keep_alive(settle_for_serving(
                &self.facilitator,
                &payload,
                &requirements,
            ))
            .await
        {
            SettleOutcome::Settled(s) => {
                // The output is this call's own (the tool ran under the record): served.
                let _ = mark_paid(&serving, &s).await;
                if let Err(e) = serving.commit(Some(SERVED_RETENTION)).await {
                    tracing::warn!(error = %e, "x402/mcp: served, but could not record it");
                }
                with_receipt(result, &s)
            }
            SettleOutcome::Refused(s) => {
                release(serving).await;
                let reason = SettleOutcome::reason(&s);
                refuse(&format!("Payment settlement failed: {reason}"), Some(&s))
            }
            SettleOutcome::Unknown(detail) => {
                release(serving).await;
                unavailable_result(&detail)
            }
        }
    }

    /// A payment the chain shows as used: served (once, under `serving`) only if it was
    /// settled to this payee by an earlier call whose answer was lost.
    async fn recover<F, Fut>(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
        serving: rail_core::keys::Reservation,
        run: F,
        refuse: &(dyn Fn(&str, Option<&SettleResponse>) -> CallToolResult + Sync),
    ) -> CallToolResult
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = CallToolResult> + Send,
    {
        let settled = match serving
            .keep_alive(settle_for_serving(&self.facilitator, payload, requirements))
            .await
        {
            SettleOutcome::Settled(s) => s,
            SettleOutcome::Refused(s) => {
                release(serving).await;
                return refuse(SettleOutcome::reason(&s), None);
            }
            SettleOutcome::Unknown(detail) => {
                release(serving).await;
                return unavailable_result(&detail);
            }
        };
        if !mark_paid(&serving, &settled).await {
            return unavailable_result(
                "this payment is being served by another call; retry the same payment",
            );
        }
        let result = serving.keep_alive(run()).await;
        if result.is_error == Some(true) {
            release(serving).await;
            return result;
        }
        if let Err(e) = serving.commit(Some(SERVED_RETENTION)).await {
            tracing::warn!(error = %e, "x402/mcp: served, but could not record it");
        }
        with_receipt(result, &settled)
    }
}

fn with_receipt(mut result: CallToolResult, settled: &SettleResponse) -> CallToolResult {
    let mut meta = result.meta.take().unwrap_or_default();
    meta.0.insert(
        PAYMENT_RESPONSE_META.to_owned(),
        serde_json::to_value(settled).unwrap_or(Value::Null),
    );
    result.meta = Some(meta);
    result
}

/// The payment-required tool result (`isError`, `structuredContent`, `x402/error` text).
#[must_use]
pub fn payment_required_result(
    required: &PaymentRequired,
    error: &str,
    settle: Option<&SettleResponse>,
) -> CallToolResult {
    let mut pr = required.clone();
    pr.error = Some(error.to_owned());
    let mut structured = serde_json::to_value(&pr).unwrap_or(Value::Null);
    if let (Some(s), Some(obj)) = (settle, structured.as_object_mut()) {
        obj.insert(
            PAYMENT_RESPONSE_META.to_owned(),
            serde_json::to_value(s).unwrap_or(Value::Null),
        );
    }
    let wrapper = json!({"x402/error": {"code": 402, "message": error, "data": structured}});
    let mut r = CallToolResult::error(vec![ContentBlock::text(wrapper.to_string())]);
    r.structured_content = Some(structured);
    r
}

/// A tool error for an unknown outcome: retry the **same** payment.
#[must_use]
pub fn unavailable_result(detail: &str) -> CallToolResult {
    let body = json!({"x402/error": {
        "code": 503,
        "message": "payment outcome unknown; retry the same payment",
        "data": {"error": reasons::FACILITATOR_UNAVAILABLE, "detail": detail, "retryable": true},
    }});
    CallToolResult::error(vec![ContentBlock::text(body.to_string())])
}

/// The client side: the `PaymentRequired` of a tool result, looked for in the
/// specification's order (`structuredContent`, `structuredContent["x402/error"].data`,
/// `content[0].text`).
#[must_use]
pub fn payment_required_of(result: &CallToolResult) -> Option<PaymentRequired> {
    if result.is_error != Some(true) {
        return None;
    }
    let direct = |v: &Value| serde_json::from_value::<PaymentRequired>(v.clone()).ok();
    let wrapped = |v: &Value| {
        v.get("x402/error")
            .and_then(|e| e.get("data"))
            .and_then(direct)
    };
    if let Some(s) = &result.structured_content
        && let Some(pr) = direct(s).or_else(|| wrapped(s))
    {
        return Some(pr);
    }
    let text = match result.content.first()? {
        ContentBlock::Text(t) => t.text.clone(),
        _ => return None,
    };
    let v: Value = serde_json::from_str(&text).ok()?;
    direct(&v).or_else(|| wrapped(&v))
}

/// The client side: the request `_meta` carrying `payment`. With an rmcp client, send it
/// through `PeerRequestOptions::with_meta` (rmcp writes a request's `_meta` from its options
/// and extensions, not from `CallToolRequestParams::meta`).
#[must_use]
pub fn payment_meta(payment: &PaymentPayload) -> RequestMetaObject {
    let mut m = MetaObject::default();
    m.0.insert(
        PAYMENT_META.to_owned(),
        serde_json::to_value(payment).unwrap_or(Value::Null),
    );
    RequestMetaObject(m)
}
