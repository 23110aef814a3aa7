//! The seed's discovery documents (§7): `/llms.txt` and `/.well-known/exact-algo.json`, with the
//! rules and error codes of the scheme. The paid routes themselves are served by the shared
//! x402 paywall ([`x402_transport::paywall`]) with the [`crate::ExactAlgo`] scheme:
//!
//! ```text
//! GET /api/posts/1                          -> 402 + PaymentRequired (body and PAYMENT-REQUIRED)
//! GET /api/posts/1  PAYMENT-SIGNATURE: ...  -> settle, then 200 + PAYMENT-RESPONSE
//! ```
//!
//! The payment is settled **before** the handler runs; a refused payment is answered with a
//! 402 carrying a fresh challenge whose `error` is the refusal's code
//! ([`crate::receiver::Refusal::code`]); a settlement whose outcome is unknown (algod
//! unreachable) is a 503 with `Retry-After`, and the same payment may be sent again. Nothing a
//! payer sends can cause a 5xx by itself.

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::routing::get;
use serde_json::{Value, json};
use x402_transport::paywall::Paywall;

use crate::receiver::{ExactAlgoReceiver, Price};
use crate::rules::{MAX_FEE, MAX_WINDOW};

/// The `error` of a challenge for a request that carried no payment.
pub const PAYMENT_REQUIRED_ERROR: &str = crate::scheme::PAYMENT_REQUIRED_ERROR;
/// `Retry-After` of a 503 (seconds).
pub const RETRY_AFTER_SECS: u64 = x402_transport::wire::RETRY_AFTER_SECS;

/// The exact-algo prices of `paywall`'s routes, with each route's pattern as the resource (for
/// the discovery documents).
#[must_use]
pub fn prices(paywall: &Paywall) -> Vec<Price> {
    paywall
        .routes()
        .iter()
        .filter_map(|r| {
            let a = r
                .accepts()
                .as_slice()
                .iter()
                .find(|a| a.scheme.info().label == crate::scheme::LABEL)?;
            Some(Price {
                resource: r.pattern().to_owned(),
                description: r.description().to_owned(),
                amount: u64::try_from(a.amount).ok()?,
            })
        })
        .collect()
}

/// How a service describes itself in its discovery documents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceInfo {
    /// The service's name.
    pub name: String,
    /// One paragraph: what it does.
    pub summary: String,
    /// Where the human documentation is, if anywhere.
    pub docs_url: Option<String>,
    /// The MCP endpoint path (`/mcp`), if the service has one.
    pub mcp_endpoint: Option<String>,
}

/// One rule of seed §3: what, why, and the error codes that break it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleDoc {
    /// The rule.
    pub rule: &'static str,
    /// Why.
    pub why: &'static str,
    /// The `error` codes a payment breaking it is refused with.
    pub errors: &'static [&'static str],
}

/// The transaction rules (seed §3, plus the encoding and signature checks), in order.
pub const RULES: &[RuleDoc] = &[
    RuleDoc {
        rule: "type = pay, a single transaction (no group), single signature",
        why: "nothing else can be slipped into a group",
        errors: &[
            "wrong transaction type",
            "group not allowed",
            "multisig not accepted",
            "logicsig not accepted",
        ],
    },
    RuleDoc {
        rule: "receiver = accepts[].payTo",
        why: "pay only the advertised address",
        errors: &["receiver mismatch"],
    },
    RuleDoc {
        rule: "amount >= maxAmountRequired",
        why: "blocks underpayment",
        errors: &["underpaid"],
    },
    RuleDoc {
        rule: "note = extra.paymentId (ASCII)",
        why: "binds the payment to the request; blocks reuse",
        errors: &[
            "note mismatch",
            "unknown or expired paymentId",
            "paymentId already used",
        ],
    },
    RuleDoc {
        rule: "extra.minFeeMicroAlgo <= fee <= 2,000 microALGO",
        why: "the payer is never forced into an excessive fee",
        errors: &["fee too high", "fee too low"],
    },
    RuleDoc {
        rule: "rekey_to and close_remainder_to empty",
        why: "blocks account takeover and balance sweep",
        errors: &["rekey not allowed", "close-to not allowed"],
    },
    RuleDoc {
        rule: "inside its valid rounds (at most 1,000), genesis hash matches",
        why: "blocks expired transactions and cross-network replay",
        errors: &[
            "transaction expired",
            "transaction not yet valid",
            "validity window too long",
            "wrong network",
        ],
    },
    RuleDoc {
        rule: "signed by the sender (or the address it was rekeyed to, named in sgnr)",
        why: "checked before anything in the payload is believed",
        errors: &["bad signature", "unauthorized signer"],
    },
    RuleDoc {
        rule: "payload.txn is canonical msgpack of a signed native payment, no unknown fields",
        why: "what is checked is exactly what is submitted",
        errors: &["non-canonical encoding", "malformed payment"],
    },
];

/// One error code: what it means, what the payer does, the HTTP status it comes with, and
/// whether the seed (§4) names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorDoc {
    /// The `error` string.
    pub code: &'static str,
    /// What it means.
    pub meaning: &'static str,
    /// What the payer does.
    pub action: &'static str,
    /// The HTTP status (402, or 503 for a retryable failure).
    pub status: u16,
    /// Whether the seed's table names it.
    pub seed: bool,
}

const fn err(
    code: &'static str,
    meaning: &'static str,
    action: &'static str,
    status: u16,
    seed: bool,
) -> ErrorDoc {
    ErrorDoc {
        code,
        meaning,
        action,
        status,
        seed,
    }
}

const FRESH: &str = "request a fresh 402 and pay again";

/// Every `error` a payer can meet: the seed's table (§4), then this implementation's finer
/// codes ([`crate::receiver::Refusal::code`], [`crate::rules::Violation::code`]).
pub const ERRORS: &[ErrorDoc] = &[
    err(
        "underpaid",
        "amount too small",
        "re-read the 402 body and pay again",
        402,
        true,
    ),
    err(
        "receiver mismatch",
        "wrong receiver",
        "use payTo exactly",
        402,
        true,
    ),
    err(
        "unknown or expired paymentId",
        "no such challenge (for this resource), or it expired",
        "request a fresh 402",
        402,
        true,
    ),
    err(
        "paymentId already used",
        "single-use violated",
        "request a fresh 402",
        402,
        true,
    ),
    err(
        "settlement in progress",
        "this very payment is being settled (your earlier attempt, or a duplicate)",
        "wait Retry-After and send the same PAYMENT-SIGNATURE again; do not pay again",
        503,
        false,
    ),
    err(
        "transaction expired",
        "last_valid_round passed",
        "sign again",
        402,
        true,
    ),
    err(
        "settlement failed",
        "the network rejected it (signature, balance); with 503 and Retry-After: algod could not be reached and the outcome is unknown",
        "402: check the wallet and retry with a fresh 402; 503: send the same payment again after Retry-After",
        402,
        true,
    ),
    err(
        PAYMENT_REQUIRED_ERROR,
        "no payment was attached",
        "pay the challenge in accepts[0] and retry with the payment",
        402,
        false,
    ),
    err(
        "malformed payment",
        "the header is not base64 of the envelope JSON, or has unknown fields, another x402Version or scheme, or payload.txn is not a signed native payment",
        FRESH,
        402,
        false,
    ),
    err(
        "non-canonical encoding",
        "payload.txn is not the canonical msgpack encoding",
        "encode with an Algorand SDK",
        402,
        false,
    ),
    err(
        "wrong transaction type",
        "not a pay transaction",
        "send a native ALGO payment",
        402,
        false,
    ),
    err(
        "multisig not accepted",
        "a multisig signature",
        "sign with a single key",
        402,
        false,
    ),
    err(
        "logicsig not accepted",
        "a logic signature",
        "sign with a single key",
        402,
        false,
    ),
    err(
        "bad signature",
        "the signature does not verify",
        "sign with the sender's key",
        402,
        false,
    ),
    err(
        "unauthorized signer",
        "sgnr is not the account's auth address",
        "sign with the key the account is rekeyed to",
        402,
        false,
    ),
    err(
        "wrong network",
        "another network or genesis hash",
        "pay on the network in accepts[].network",
        402,
        false,
    ),
    err(
        "group not allowed",
        "the transaction is part of a group",
        "send one ungrouped transaction",
        402,
        false,
    ),
    err(
        "note mismatch",
        "the note is not exactly extra.paymentId",
        FRESH,
        402,
        false,
    ),
    err(
        "fee too high",
        "fee above 2,000 microALGO",
        "use a flat fee of extra.minFeeMicroAlgo",
        402,
        false,
    ),
    err(
        "fee too low",
        "fee below the network minimum",
        "use a flat fee of extra.minFeeMicroAlgo",
        402,
        false,
    ),
    err(
        "rekey not allowed",
        "rekey_to is set",
        "leave rekey_to empty",
        402,
        false,
    ),
    err(
        "close-to not allowed",
        "close_remainder_to is set",
        "leave close_remainder_to empty",
        402,
        false,
    ),
    err(
        "transaction not yet valid",
        "first_valid_round is ahead of the chain",
        "sign again with current suggested params",
        402,
        false,
    ),
    err(
        "validity window too long",
        "last_valid - first_valid is negative or above 1,000 rounds",
        "sign again with current suggested params",
        402,
        false,
    ),
    err(
        "storage error",
        "the receiver's paymentId store failed",
        "send the same payment again after Retry-After",
        503,
        false,
    ),
];

fn amount_str(n: u64) -> String {
    n.to_string()
}

/// The client procedure of seed §6, step by step.
pub const CLIENT_PROCEDURE: &[&str] = &[
    "Request the resource (or call the tool) without payment: HTTP answers 402 with the PaymentRequired JSON as body and, base64, in PAYMENT-REQUIRED; MCP answers a tool result with isError = true and the PaymentRequired in structuredContent.",
    "Take the entry of accepts[] with scheme \"exact\", asset \"ALGO\" and your network: payTo, maxAmountRequired (microALGO, decimal string), extra.paymentId (32 hex, single use), extra.minFeeMicroAlgo. Nothing else is needed; no price or address is hard-coded.",
    "Get suggested params from algod (GET /v2/transactions/params); use a flat fee of max(min-fee, extra.minFeeMicroAlgo), never above 2,000 microALGO.",
    "Build one pay transaction: sender = you, receiver = payTo, amount = maxAmountRequired, note = the ASCII bytes of extra.paymentId, first/last valid from the suggested params (at most 1,000 rounds), no group, no rekey_to, no close_remainder_to.",
    "Sign it with a single key; payload.txn = base64 of the signed transaction's msgpack.",
    "Envelope = {\"x402Version\": 2, \"scheme\": \"exact\", \"network\": accepts[].network, \"payload\": {\"txn\": ...}}; send base64 of its JSON as the PAYMENT-SIGNATURE header (HTTP) or as params._meta[\"x402/payment\"] (MCP tools/call), repeating the same request.",
    "Success: HTTP 200 with PAYMENT-RESPONSE (base64 JSON receipt: success, transaction, network, payer, amount, confirmedRound); MCP structuredContent.receipt and _meta[\"x402/payment-response\"].",
    "402 with another error: see errors (a fresh challenge comes with it). 503 with Retry-After: send the same payment again; it settles at most once.",
];

/// The machine-readable scheme document (`/.well-known/exact-algo.json`, and the body of the
/// MCP `payment_instructions` tool): scheme, network, asset, envelope keys, headers, the rules
/// with their error codes, every error code, and the prices of `routes` (HTTP, resource = the
/// path pattern) and `tools` (MCP, resource = the tool name).
#[must_use]
pub fn scheme_document(
    receiver: &ExactAlgoReceiver,
    routes: &[Price],
    tools: &[Price],
    mcp_endpoint: Option<&str>,
) -> Value {
    let rules: Vec<Value> = RULES
        .iter()
        .map(|r| json!({"rule": r.rule, "why": r.why, "errors": r.errors}))
        .collect();
    let errors: Vec<Value> = ERRORS
        .iter()
        .map(|e| {
            json!({"error": e.code, "meaning": e.meaning, "action": e.action,
                   "status": e.status, "seed": e.seed})
        })
        .collect();
    let http: Vec<Value> = routes
        .iter()
        .map(|p| {
            json!({"resource": p.resource, "description": p.description,
                   "maxAmountRequired": amount_str(p.amount), "asset": "ALGO", "unit": "microALGO"})
        })
        .collect();
    let mcp: Vec<Value> = tools
        .iter()
        .map(|p| {
            json!({"tool": p.resource, "description": p.description,
                   "maxAmountRequired": amount_str(p.amount), "asset": "ALGO", "unit": "microALGO"})
        })
        .collect();
    json!({
        "name": "exact-algo",
        "x402Standard": false,
        "notice": "Not the x402 standard: the x402 HTTP envelope, settled in native ALGO. asset is \"ALGO\", not an ASA id, so standard x402 clients are not compatible. The wallet needs only ALGO: no ASA opt-in, no USDC, no x402 SDK.",
        "x402Version": 2,
        "scheme": "exact",
        "network": receiver.network(),
        "asset": "ALGO",
        "unit": "microALGO",
        "payTo": receiver.pay_to().to_string(),
        "minFeeMicroAlgo": receiver.min_fee(),
        "maxFeeMicroAlgo": MAX_FEE,
        "maxValidityRounds": MAX_WINDOW,
        "maxTimeoutSeconds": receiver.max_timeout().as_secs(),
        "headers": {
            "challenge": "PAYMENT-REQUIRED",
            "payment": "PAYMENT-SIGNATURE",
            "receipt": "PAYMENT-RESPONSE",
        },
        "envelope": {
            "keys": ["x402Version", "scheme", "network", "payload.txn"],
            "x402Version": 2,
            "scheme": "exact",
            "network": receiver.network(),
            "payload.txn": "base64 of the msgpack of the signed native pay transaction; its note is extra.paymentId",
            "encoding": "base64 of the envelope's JSON",
        },
        "challenge": {
            "body": "PaymentRequired {x402Version, error, accepts[]}",
            "accepts": ["scheme", "network", "asset", "maxAmountRequired", "resource",
                        "description", "payTo", "maxTimeoutSeconds",
                        "extra.paymentId", "extra.minFeeMicroAlgo"],
            "paymentId": "32 hex digits, single use, bound to the resource, amount and payTo",
        },
        "receipt": ["success", "transaction", "network", "payer", "amount", "confirmedRound"],
        "rules": rules,
        "errors": errors,
        "prices": {"http": http, "mcp": mcp},
        "mcp": {
            "endpoint": mcp_endpoint,
            "transport": "Streamable HTTP, JSON-RPC 2.0",
            "paymentMeta": "x402/payment",
            "receiptMeta": "x402/payment-response",
        },
    })
}

/// The `/llms.txt` summary for agents.
#[must_use]
pub fn llms_txt(
    info: &ServiceInfo,
    receiver: &ExactAlgoReceiver,
    routes: &[Price],
    tools: &[Price],
) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n\n> {}\n", info.name, info.summary);
    let _ = writeln!(
        s,
        "Paid resources are sold per request in native ALGO with \"exact-algo\": the x402 HTTP \
         envelope (402 + PAYMENT-REQUIRED, PAYMENT-SIGNATURE, PAYMENT-RESPONSE) settled by one \
         native Algorand payment. This is NOT the x402 standard: asset is \"ALGO\", not an ASA \
         id, so standard x402 clients are not compatible. The wallet needs only ALGO: no ASA \
         opt-in, no USDC, no x402 SDK.\n"
    );
    let _ = writeln!(s, "- network: {}", receiver.network());
    let _ = writeln!(s, "- pay to: {}", receiver.pay_to());
    let _ = writeln!(
        s,
        "- fee: {} to {MAX_FEE} microALGO (flat)\n",
        receiver.min_fee()
    );
    if !routes.is_empty() {
        let _ = writeln!(s, "## Paid HTTP resources\n");
        for p in routes {
            let _ = writeln!(
                s,
                "- {}: {} microALGO. {}",
                p.resource, p.amount, p.description
            );
        }
        let _ = writeln!(s);
    }
    if let Some(mcp) = &info.mcp_endpoint {
        let _ = writeln!(
            s,
            "## MCP\n\nStreamable HTTP, JSON-RPC 2.0: POST {mcp}. A paid tool answers an unpaid \
             call with isError and the payment requirement in structuredContent; retry the same \
             call with params._meta[\"x402/payment\"] = the base64 envelope. The free tool \
             payment_instructions returns the scheme in machine-readable form.\n"
        );
        for p in tools {
            let _ = writeln!(
                s,
                "- {}: {} microALGO. {}",
                p.resource, p.amount, p.description
            );
        }
        if !tools.is_empty() {
            let _ = writeln!(s);
        }
    }
    let _ = writeln!(s, "## How to pay\n");
    for (i, step) in CLIENT_PROCEDURE.iter().enumerate() {
        let _ = writeln!(s, "{}. {step}", i + 1);
    }
    let _ = writeln!(s, "\n## Errors (the 402 body's error)\n");
    for e in ERRORS {
        let _ = writeln!(s, "- {}: {}. {}.", e.code, e.meaning, e.action);
    }
    let _ = writeln!(s, "\n## Docs\n");
    let _ = writeln!(
        s,
        "- /.well-known/exact-algo.json: the scheme (envelope keys, rules, error codes, prices)"
    );
    if let Some(d) = &info.docs_url {
        let _ = writeln!(s, "- {d}");
    }
    s
}

/// `GET /llms.txt` and `GET /.well-known/exact-algo.json` for `routes` (HTTP prices, e.g.
/// [`prices`]) and `tools` (MCP prices).
pub fn discovery_router(
    info: &ServiceInfo,
    receiver: &ExactAlgoReceiver,
    routes: &[Price],
    tools: &[Price],
) -> Router {
    let doc = Arc::new(scheme_document(
        receiver,
        routes,
        tools,
        info.mcp_endpoint.as_deref(),
    ));
    let txt: Arc<str> = Arc::from(llms_txt(info, receiver, routes, tools));
    Router::new()
        .route(
            "/llms.txt",
            get(move || {
                let txt = txt.clone();
                async move {
                    (
                        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                        txt.to_string(),
                    )
                }
            }),
        )
        .route(
            "/.well-known/exact-algo.json",
            get(move || {
                let doc = doc.clone();
                async move { axum::Json(doc.as_ref().clone()) }
            }),
        )
}

/// Whether `code` is documented in [`ERRORS`].
#[must_use]
pub fn is_documented(code: &str) -> bool {
    ERRORS.iter().any(|e| e.code == code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::Address;
    use crate::algod::AlgodError;
    use crate::msgpack::MsgpackError;
    use crate::payment_id::LifecycleError;
    use crate::receiver::Refusal;
    use crate::rules::Violation;
    use crate::txn::TxnError;
    use crate::wire::WireError;

    #[test]
    fn every_violation_code_is_documented_and_in_a_rule() {
        let a = Address([7; 32]);
        let all = [
            Violation::BadSignature,
            Violation::UnauthorizedSigner { signer: a },
            Violation::Grouped,
            Violation::ReceiverMismatch {
                expected: a,
                actual: a,
            },
            Violation::Underpaid {
                required: 2,
                actual: 1,
            },
            Violation::NoteMismatch,
            Violation::FeeTooHigh { fee: 3000 },
            Violation::FeeTooLow { fee: 1, min: 1000 },
            Violation::Rekey,
            Violation::CloseTo,
            Violation::WrongNetwork,
            Violation::Expired {
                last_valid: 1,
                round: 2,
            },
            Violation::NotYetValid {
                first_valid: 9,
                round: 2,
            },
            Violation::BadWindow {
                first_valid: 1,
                last_valid: 5000,
            },
        ];
        for v in &all {
            // Exhaustive: a new violation breaks this test until it is documented.
            match v {
                Violation::BadSignature
                | Violation::UnauthorizedSigner { .. }
                | Violation::Grouped
                | Violation::ReceiverMismatch { .. }
                | Violation::Underpaid { .. }
                | Violation::NoteMismatch
                | Violation::FeeTooHigh { .. }
                | Violation::FeeTooLow { .. }
                | Violation::Rekey
                | Violation::CloseTo
                | Violation::WrongNetwork
                | Violation::Expired { .. }
                | Violation::NotYetValid { .. }
                | Violation::BadWindow { .. } => {}
            }
            assert!(is_documented(v.code()), "{}", v.code());
            assert!(
                RULES.iter().any(|r| r.errors.contains(&v.code())),
                "{}",
                v.code()
            );
        }
    }

    #[test]
    fn every_refusal_code_is_documented() {
        let txn_errors = [
            TxnError::Msgpack(MsgpackError::Trailing(1)),
            TxnError::NotAMap("x"),
            TxnError::UnknownField("x".into()),
            TxnError::MissingField("x"),
            TxnError::FieldType("x"),
            TxnError::WrongType("axfer".into()),
            TxnError::Multisig,
            TxnError::LogicSig,
            TxnError::NonCanonical,
            TxnError::NoteTooLong,
            TxnError::BadSignature,
        ];
        let mut refusals: Vec<Refusal> = txn_errors
            .into_iter()
            .map(|e| Refusal::Malformed(WireError::Txn(e)))
            .collect();
        for w in [
            WireError::Base64,
            WireError::Json("x".into()),
            WireError::Version(1),
            WireError::Scheme("upto".into()),
            WireError::Network("algorand:x".into()),
            WireError::TxnBase64,
        ] {
            refusals.push(Refusal::Malformed(w));
        }
        refusals.push(Refusal::PaymentId(LifecycleError::UnknownOrExpired));
        refusals.push(Refusal::PaymentId(LifecycleError::AlreadyUsed));
        refusals.push(Refusal::PaymentId(LifecycleError::InProgress {
            retry_after: std::time::Duration::from_secs(1),
        }));
        refusals.push(Refusal::PaymentId(LifecycleError::Store(
            rail_core::RailError::Storage("down".into()),
        )));
        refusals.push(Refusal::SettlementFailed("overspend".into()));
        refusals.push(Refusal::Unavailable(AlgodError::Transport("down".into())));
        refusals.push(Refusal::Rule(Violation::Grouped));
        for r in &refusals {
            match r {
                Refusal::Malformed(_)
                | Refusal::PaymentId(_)
                | Refusal::Rule(_)
                | Refusal::SettlementFailed(_)
                | Refusal::Unavailable(_) => {}
            }
            assert!(is_documented(r.code()), "{}", r.code());
        }
        let seed: Vec<&str> = ERRORS.iter().filter(|e| e.seed).map(|e| e.code).collect();
        assert_eq!(
            seed,
            [
                "underpaid",
                "receiver mismatch",
                "unknown or expired paymentId",
                "paymentId already used",
                "transaction expired",
                "settlement failed"
            ]
        );
    }
}
