//! The MCP surface of `docs/exact-algo.md` §5 on rmcp. An agent needs no knowledge of the HTTP
//! envelope: it calls a tool; a paid tool answers an unpaid call with `isError` and the payment
//! requirement in `structuredContent` (`x402Version`, `accepts`, `error`, `how_to_pay`); the agent
//! retries the same call with `params._meta["x402/payment"]` = the base64 envelope (the HTTP
//! `PAYMENT-SIGNATURE` value), and the result carries `structuredContent.receipt` and
//! `_meta["x402/payment-response"]`.
//!
//! Nothing here is an MCP server: a receiver writes an rmcp `ServerHandler`, prices its tools
//! with the shared adapter ([`x402_transport::mcp::McpPaywall`] with the [`crate::ExactAlgo`]
//! scheme), and serves it over Streamable HTTP with [`x402_transport::mcp::streamable_http`]
//! (stateless, JSON answers). This module adds what only exact-algo has: the free
//! `payment_instructions` tool (the scheme document) and the price annotation of a paid tool in
//! `tools/list`. [`crate::demo`] is a complete server.

use std::sync::Arc;

use rmcp::model::{CallToolResult, JsonObject, MetaObject, Tool};
use serde_json::{Value, json};

use crate::http::CLIENT_PROCEDURE;

pub use crate::scheme::PAYMENT_INSTRUCTIONS;
pub use x402_transport::wire::{PAYMENT_META, PAYMENT_RESPONSE_META};

/// A JSON schema object for a tool's `inputSchema` (`{}` if `schema` is not an object).
#[must_use]
pub fn schema(schema: Value) -> Arc<JsonObject> {
    Arc::new(match schema {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    })
}

/// `_meta` of a paid tool in `tools/list`: `{"x402/price": {scheme, network, asset,
/// maxAmountRequired, unit}}`.
#[must_use]
pub fn price_meta(network: &str, amount: u64) -> MetaObject {
    let mut m = MetaObject::default();
    m.0.insert(
        "x402/price".into(),
        json!({"scheme": crate::scheme::LABEL, "network": network, "asset": "ALGO",
               "maxAmountRequired": amount.to_string(), "unit": "microALGO"}),
    );
    m
}

/// The free `payment_instructions` tool, as `tools/list` shows it.
#[must_use]
pub fn payment_instructions_tool() -> Tool {
    Tool::new(
        PAYMENT_INSTRUCTIONS,
        "The exact-algo payment scheme in machine-readable form: envelope, transaction rules, error codes, prices and the client procedure. Free.",
        schema(json!({"type": "object", "properties": {}, "additionalProperties": false})),
    )
}

/// The answer of `payment_instructions`: `document` (the scheme document,
/// [`crate::http::scheme_document`]) with the client procedure (`docs/exact-algo.md` §6).
#[must_use]
pub fn payment_instructions(mut document: Value) -> CallToolResult {
    if let Some(o) = document.as_object_mut() {
        o.insert("client_procedure".into(), json!(CLIENT_PROCEDURE));
    }
    CallToolResult::structured(document)
}
