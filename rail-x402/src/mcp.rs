//! x402 over MCP (`specs/transports-v2/mcp.md`) priced in one EVM token: the shared MCP
//! adapter ([`x402_transport::mcp`]) with one [`ExactEvm`] scheme ([`ExactEvm::mcp_paywall`]),
//! to put in front of the tools of any rmcp server (`ServerHandler::call_tool`), and the client
//! side's helpers ([`payment_required_of`], [`payment_meta`]). Every rule is the adapter's:
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
//! - Each authorization is served once (also across instances sharing a [`rail_core::KeyStore`], and
//!   across the HTTP paywall on the same store).
//!
//! ```no_run
//! # async fn demo(
//! #     paywall: x402_transport::mcp::McpPaywall,
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

use rmcp::model::{CallToolResult, ContentBlock, MetaObject, RequestMetaObject};
use serde_json::Value;

use crate::scheme::ExactEvm;
use crate::wire::{PaymentPayload, PaymentRequired};

pub use x402_transport::mcp::{payment_required_result, unavailable_result};
pub use x402_transport::wire::{PAYMENT_META, PAYMENT_RESPONSE_META};

impl ExactEvm {
    /// The shared MCP adapter ([`x402_transport::mcp::McpPaywall`]) with `tools` —
    /// `(name, amount in atomic units, description)` — paid in this scheme alone; give it a
    /// store ([`x402_transport::mcp::McpPaywall::with_store`]) to share served payments with
    /// other instances and the HTTP paywall.
    ///
    /// # Errors
    /// [`x402_transport::Error::Price`] for a tool priced at what this scheme cannot ask.
    pub fn mcp_paywall(
        &self,
        tools: &[(&str, u128, &str)],
    ) -> Result<x402_transport::mcp::McpPaywall, x402_transport::Error> {
        tools.iter().try_fold(
            x402_transport::mcp::McpPaywall::new(),
            |p, (name, amount, description)| Ok(p.tool(name, description, self.accepts(*amount)?)),
        )
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
