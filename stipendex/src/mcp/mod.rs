//! The MCP binding: Stipendex over the Model Context Protocol, on rmcp (the gate with feature
//! `mcp`, the paying client and the proxy with `mcp-client`; the wire's keys and the request
//! and result digests are always built — ContextVM's Stipendex payment method shares them).
//!
//! ```text
//! initialize                 -> capabilities.experimental["stipendex/payments"] = {"version": "0.1"}
//! tools/list                 -> each priced tool: _meta["stipendex/pricing"] = {model, estimate}   (a hint)
//! tools/call search {…}      -> error -32402 "Payment required", data: {"quote": {"stipendex": "quote/0.1", "jws": …}}
//!   _meta["stipendex/payments"] = {"version": "0.1"}            (a client that speaks Stipendex)
//! tools/call search {…}      -> result, _meta["stipendex/receipt"] = {"stipendex": "receipt/0.1", "jws": …}
//!   _meta["stipendex/payment"] = {"stipendex": "proof/0.1", "jws": …}
//!
//! (a tab: -32402's data also holds "tab": {"stipendex": "tab/0.1", "jws": …})
//! tools/call search {…}      -> result, _meta["stipendex/tab-call"] = {"voucher": …, "result": …}
//!   _meta["stipendex/voucher"] = {"stipendex": "voucher/0.1", "jws": …}
//!   _meta["stipendex/tab"] = {"stipendex": "proof/0.1", "jws": …}   (the first call: opens the tab)
//! stipendex/tab-close {"close": {"stipendex": "tab-close/0.1", "jws": …}}
//!                            -> {"receipt": {"stipendex": "tab-receipt/0.1", "jws": …}}
//! ```
//!
//! - [`PaidServer`] (server): wraps any rmcp `ServerHandler` and gates `tools/call`,
//!   `resources/read` and `prompts/get` through a [`crate::receiver::Receiver`]'s one route
//!   table ([`crate::receiver::Receiver::decide`]). A client that does not say it speaks
//!   Stipendex gets x402's MCP convention (`isError` + `structuredContent.accepts`) where the
//!   tool is also priced in x402 schemes, and the `-32402` error otherwise.
//! - The wire keys and codes are the constants of this module; nothing else spells them.
//!
//! What each client gets, the request digest, the result digest of the Receipt and the
//! lost-answer rule are in `docs/stipendex-profile.md` §6b.

use rail_core::Money;
use serde_json::{Map, Value};

use crate::envelope::Digest;
use crate::receiver::Request;

#[cfg(feature = "mcp-client")]
pub mod client;
#[cfg(feature = "mcp")]
mod elicit;
#[cfg(feature = "mcp-client")]
pub mod proxy;
#[cfg(feature = "mcp")]
mod server;

#[cfg(feature = "mcp")]
pub use elicit::{ANSWER_WITHIN, Elicit};
#[cfg(feature = "mcp")]
pub use server::{PaidServer, final_amount};
/// An MCP endpoint over Streamable HTTP for a [`PaidServer`] (stateless, JSON answers; a
/// cross-origin browser request is refused), the one x402's MCP adapter serves.
#[cfg(feature = "mcp-http")]
pub use x402_transport::mcp::streamable_http;

/// `initialize`'s `capabilities.experimental` key (server and client), and the per-call
/// `params._meta` key by which a client says it speaks Stipendex.
pub const PAYMENTS: &str = "stipendex/payments";
/// A priced tool's (resource's, prompt's) `_meta` key in a list: `{model, estimate}`, a hint.
pub const PRICING: &str = "stipendex/pricing";
/// The retry's `params._meta` key: the Proof.
pub const PAYMENT: &str = "stipendex/payment";
/// The paid result's `_meta` key: the Receipt.
pub const RECEIPT: &str = "stipendex/receipt";
/// A call inside a tab: `params._meta` key of the voucher (`{"stipendex": "voucher/0.1", "jws"}`).
pub const VOUCHER: &str = "stipendex/voucher";
/// With a tab's first call: `params._meta` key of the hold Proof that opens the tab.
pub const TAB: &str = "stipendex/tab";
/// A result paid inside a tab: `_meta` key of `{"voucher": <digest>, "result": <digest>}`
/// (the result's digest as a Receipt's: [`result_digest`]).
pub const TAB_CALL: &str = "stipendex/tab-call";
/// The request that closes a tab: `params` `{"close": {"stipendex": "tab-close/0.1", "jws"}}`,
/// answered `{"receipt": {"stipendex": "tab-receipt/0.1", "jws"}}`.
pub const TAB_CLOSE: &str = "stipendex/tab-close";
/// Every `params._meta` key that presents a payment, of every way to pay over MCP: a Proof, a
/// voucher, a tab's opening, an x402 payload. The gate's guard
/// ([`crate::receiver::Receiver::guard`]) runs for a priced call that carries any of them, and
/// a gateway never forwards them.
#[cfg(feature = "mcp")]
pub const PAYMENT_KEYS: &[&str] = &[PAYMENT, VOUCHER, TAB, x402_transport::wire::PAYMENT_META];

/// The `params._meta` key of the wallet's own dialogs (its payment confirmation, by MCP
/// elicitation), valued [`WALLET`]: `_meta["stipendex/origin"] = "wallet"`. Only the wallet
/// sets it: the proxy removes every `stipendex/` key from what it forwards of the server's, so
/// a host talking to the proxy can tell the wallet's dialog from the server's by it (and by
/// [`WALLET_PREFIX`], which its user sees).
pub const ORIGIN: &str = "stipendex/origin";
/// The value of [`ORIGIN`] on the wallet's dialogs.
pub const WALLET: &str = "wallet";
/// The start of the message of every wallet dialog (`[Stipendex wallet] Confirm the payment:
/// …`); a dialog of the server behind the proxy that reads like it is refused.
pub const WALLET_PREFIX: &str = "[Stipendex wallet]";

/// The `error.data` member (and `_meta` key of a waived result) by which a gate says paid work
/// never reached the service behind it: `{"stipendex/undelivered": true}`. A gateway's
/// forwarder sets it when nothing was sent upstream; the gate then keeps nothing and charges
/// nothing.
pub const UNDELIVERED: &str = "stipendex/undelivered";

/// A JSON-RPC error for paid work that never reached the service behind the gate (nothing was
/// sent): what a forwarding handler returns so that the gate charges nothing ([`UNDELIVERED`]).
#[cfg(feature = "mcp")]
#[must_use]
pub fn undelivered(message: impl Into<std::borrow::Cow<'static, str>>) -> rmcp::ErrorData {
    rmcp::ErrorData::internal_error(
        message,
        Some(serde_json::json!({"error": "upstream_unavailable", UNDELIVERED: true})),
    )
}

/// Whether `e` says its work never reached the service ([`undelivered`]).
#[cfg(feature = "mcp")]
#[must_use]
pub fn is_undelivered(e: &rmcp::ErrorData) -> bool {
    e.data
        .as_ref()
        .and_then(|d| d.get(UNDELIVERED))
        .and_then(Value::as_bool)
        == Some(true)
}

/// `{"voucher": <digest>, "uncounted": true}` under [`TAB_CALL`]: the voucher was not counted
/// (the price hook refused or waived the call, or it never reached the service); the wallet
/// gives its lane back. In an error's `data`, or a waived result's `_meta`.
#[must_use]
pub fn uncounted(voucher: &Digest) -> Value {
    serde_json::json!({"voucher": voucher.as_str(), "uncounted": true})
}

/// The voucher a server said it did not count, from an error's `data` or a result's `_meta`.
#[must_use]
pub fn uncounted_in(v: Option<&Value>) -> Option<Digest> {
    let t = v?.get(TAB_CALL)?;
    if t.get("uncounted").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    serde_json::from_value(t.get("voucher")?.clone()).ok()
}

/// The version of the binding this build speaks (`{"version": "0.1"}`).
pub const VERSION: &str = "0.1";
/// The JSON-RPC error code of a payment required (`-32402`, `docs/stipendex-profile.md` §6b).
pub const PAYMENT_REQUIRED: i32 = -32402;
/// The JSON-RPC error message of [`PAYMENT_REQUIRED`].
pub const PAYMENT_REQUIRED_MESSAGE: &str = "Payment required";

/// `{"version": "0.1"}`: the value of [`PAYMENTS`].
#[must_use]
pub fn payments_marker() -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("version".into(), Value::String(VERSION.into()));
    m
}

/// The Stipendex request of an MCP call: `method` (`tools/call`, `resources/read`,
/// `prompts/get`), the tool or prompt name or the resource URI, and the arguments — an absent
/// `arguments` is the empty object, so a client that sends `{}` and one that sends nothing
/// ask for the same thing. Served at `origin` (the MCP server's identity: the origin of its
/// Streamable HTTP URL, or the identity configured for a stdio server).
#[must_use]
pub fn request(
    origin: Option<&str>,
    method: &str,
    name: &str,
    arguments: Option<&Map<String, Value>>,
) -> Request {
    let params = Value::Object(arguments.cloned().unwrap_or_default());
    let mut r = Request::new(method, name).with_params(params);
    r.origin = origin.map(str::to_owned);
    r
}

/// The bytes a Receipt's result digest covers for an MCP result: the result as JSON with
/// sorted keys, without its `_meta` (where the Receipt itself rides) and `resultType` (which
/// rmcp drops for peers of older protocol versions).
#[must_use]
pub fn canonical_result(result: &Value) -> Vec<u8> {
    let mut v = result.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("_meta");
        o.remove("resultType");
    }
    // serde_json's map is a BTreeMap here (no `preserve_order`): keys come out sorted.
    v.to_string().into_bytes()
}

/// The digest a Receipt binds for an MCP result: SHA-256 of [`canonical_result`].
#[must_use]
pub fn result_digest(result: &Value) -> Digest {
    Digest::of(&canonical_result(result))
}

/// `result._meta[key] = value` on a result object (`_meta` made if absent): how a Receipt or a
/// tab call's digests ride on an MCP result, over MCP and ContextVM.
pub fn set_meta(result: &mut Value, key: &str, value: Value) {
    if let Some(o) = result.as_object_mut() {
        let meta = o
            .entry("_meta")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if let Some(m) = meta.as_object_mut() {
            m.insert(key.into(), value);
        }
    }
}

/// The `_meta["stipendex/pricing"]` hint of a price: `{"model": "per_call", "estimate":
/// "0.005 USD"}` for a fixed amount, `{"model": "checkout", "estimate", "max"}` for an estimate.
#[must_use]
pub fn pricing_hint(price: &crate::receiver::Price) -> Value {
    let fmt = |m: &Money| format!("{} {}", m.amount(), m.asset());
    match price {
        crate::receiver::Price::Fixed(m) => {
            serde_json::json!({"model": "per_call", "estimate": fmt(m)})
        }
        crate::receiver::Price::Estimate { estimate, .. } => {
            let mut v = serde_json::json!({"model": "checkout", "estimate": fmt(estimate)});
            if let (Ok(max), Some(o)) = (price.max(), v.as_object_mut()) {
                o.insert("max".into(), Value::String(fmt(&max)));
            }
            v
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn absent_arguments_are_the_empty_object() {
        let empty = Map::new();
        assert_eq!(
            request(None, "tools/call", "t", None).digest(),
            request(None, "tools/call", "t", Some(&empty)).digest()
        );
    }

    #[test]
    fn the_result_digest_leaves_meta_and_result_type_out() {
        let a = json!({"content": [{"type": "text", "text": "x"}], "resultType": "complete"});
        let b =
            json!({"_meta": {"stipendex/receipt": {}}, "content": [{"text": "x", "type": "text"}]});
        assert_eq!(result_digest(&a), result_digest(&b));
        let c = json!({"content": [{"type": "text", "text": "y"}]});
        assert_ne!(result_digest(&a), result_digest(&c));
    }
}
