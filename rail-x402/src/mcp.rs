//! x402 over MCP (`specs/transports-v2/mcp.md`) priced in one EVM token: the shared MCP
//! adapter ([`x402_transport::mcp`]) with one [`ExactEvm`] scheme, to put in front of the tools
//! of any rmcp server (`ServerHandler::call_tool`). Every rule is the adapter's:
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
//! - Each authorization is served once (also across instances sharing a [`KeyStore`], and
//!   across the HTTP paywall on the same store).
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
use rail_core::{SharedClock, SystemClock};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ContentBlock, JsonObject, MetaObject, RequestMetaObject,
};
use serde_json::Value;
use x402_transport::Accepts;

use crate::facilitator::X402Facilitator;
use crate::scheme::ExactEvm;
use crate::token::Token;
use crate::wire::{PAYMENT_REQUIRED_ERROR, PaymentPayload, PaymentRequired, ResourceInfo, V2};

pub use x402_transport::mcp::{payment_required_result, unavailable_result};
pub use x402_transport::wire::{PAYMENT_META, PAYMENT_RESPONSE_META};

/// Tools priced in one token, settled by one facilitator. Cheap to clone.
#[derive(Clone, Debug)]
pub struct McpPaywall {
    scheme: ExactEvm,
    tools: Vec<(String, u128, String)>,
    store: Option<Arc<dyn KeyStore>>,
    clock: SharedClock,
    inner: x402_transport::mcp::McpPaywall,
}

impl McpPaywall {
    /// Tools paid to `pay_to` in `token`, settled by `facilitator`; served payments in memory.
    #[must_use]
    pub fn new(facilitator: Arc<dyn X402Facilitator>, token: Token, pay_to: Address) -> Self {
        McpPaywall {
            scheme: ExactEvm::new(facilitator, token, pay_to),
            tools: Vec::new(),
            store: None,
            clock: Arc::new(SystemClock),
            inner: x402_transport::mcp::McpPaywall::new(),
        }
        .rebuilt()
    }

    fn rebuilt(mut self) -> Self {
        let scheme: Arc<dyn x402_transport::Scheme> = Arc::new(self.scheme.clone());
        let mut inner = x402_transport::mcp::McpPaywall::new().with_clock(self.clock.clone());
        if let Some(store) = &self.store {
            inner = inner.with_store(store.clone());
        }
        for (name, amount, description) in &self.tools {
            inner = inner.tool(
                name,
                description,
                Accepts::default().or_priced(scheme.clone(), *amount),
            );
        }
        self.inner = inner;
        self
    }

    /// Judges payments' validity windows by `clock` instead of the host's clock.
    #[must_use]
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self.rebuilt()
    }

    /// Served payments in `store` (PostgreSQL for several instances; the same record as the
    /// HTTP paywall, so one payment is served once across both).
    #[must_use]
    pub fn with_store(mut self, store: Arc<dyn KeyStore>) -> Self {
        self.store = Some(store);
        self.rebuilt()
    }

    /// Prices the tool `name` at `amount` atomic units.
    ///
    /// # Panics
    /// If `amount` is zero (a configuration error, reported where the tool is priced).
    #[must_use]
    pub fn tool(mut self, name: &str, amount: impl Into<u128>, description: &str) -> Self {
        let amount = amount.into();
        assert!(
            amount > 0,
            "x402 MCP paywall: the tool {name} is priced at zero"
        );
        self.tools
            .push((name.to_owned(), amount, description.to_owned()));
        self.rebuilt()
    }

    /// The shared adapter these tools make.
    #[must_use]
    pub fn transport(&self) -> &x402_transport::mcp::McpPaywall {
        &self.inner
    }

    /// The `PaymentRequired` of a priced tool (`None` if it is free).
    #[must_use]
    pub fn payment_required(&self, tool: &str) -> Option<PaymentRequired> {
        let (name, amount, description) = self.tools.iter().find(|(n, _, _)| n == tool)?;
        let mut resource = ResourceInfo::new(format!("mcp://tool/{name}"));
        resource.description = Some(description.clone());
        Some(PaymentRequired {
            x402_version: V2::default(),
            error: Some(PAYMENT_REQUIRED_ERROR.into()),
            reason: None,
            resource: Some(resource),
            accepts: vec![self.scheme.requirements_for(U256::from(*amount))],
            extensions: None,
        })
    }

    /// [`McpPaywall::call`] with the `_meta` carried in the parameters themselves.
    pub async fn call_params<F, Fut>(
        &self,
        params: &CallToolRequestParams,
        run: F,
    ) -> CallToolResult
    where
        F: FnOnce() -> Fut + Send,
        Fut: Future<Output = CallToolResult> + Send,
    {
        self.inner.call_params(params, run).await
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
        self.inner.call(tool, meta, run).await
    }
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
