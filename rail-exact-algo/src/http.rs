//! The discovery documents of `docs/exact-algo.md` §7: `/llms.txt` and
//! `/.well-known/exact-algo.json`, with the rules and error codes of the scheme. The paid routes
//! themselves are served by the shared x402 paywall ([`x402_transport::paywall`]) with the
//! [`crate::ExactAlgo`] scheme:
//!
//! ```text
//! GET /api/posts/1                          -> 402 + PaymentRequired (body and PAYMENT-REQUIRED)
//! GET /api/posts/1  PAYMENT-SIGNATURE: ...  -> settle, then 200 + PAYMENT-RESPONSE
//! ```
//!
//! The payment is settled **before** the handler runs; a refused payment is answered with a 402
//! carrying a fresh challenge whose `error` is one of the six codes of `docs/exact-algo.md` §4.1
//! ([`crate::receiver::Refusal::code`]) and whose `reason`, when present, is the finer code
//! ([`crate::receiver::Refusal::reason`]); a settlement whose outcome is unknown (algod
//! unreachable) is a 503 with `Retry-After` (`error` `settlement failed`, `reason` `algod
//! unavailable`), and the same payment may be sent again. Nothing a payer sends can cause a 5xx by
//! itself.

use std::sync::Arc;

use axum::Router;
use axum::http::header;
use axum::routing::get;
use serde_json::{Value, json};
use x402_transport::paywall::Paywall;

use crate::receiver::{ExactAlgoReceiver, Price};
use crate::rules::{MAX_FEE, MAX_WINDOW};
use crate::wire::{
    ErrorCode, PAYMENT_ID_ALREADY_USED, RECEIVER_MISMATCH, SEED_ERRORS, SETTLEMENT_FAILED,
    TRANSACTION_EXPIRED, UNDERPAID, UNKNOWN_OR_EXPIRED_PAYMENT_ID,
};

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

/// One rule of `docs/exact-algo.md` §3: what, why, and the error codes a payment breaking it is
/// refused with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RuleDoc {
    /// The rule.
    pub rule: &'static str,
    /// Why.
    pub why: &'static str,
    /// The codes a payment breaking it is refused with: the six-code `error` (§4.1), and the
    /// finer `reason` beside it where there is one.
    pub errors: &'static [ErrorCode],
}

/// A finer case sent under `settlement failed` (`docs/exact-algo.md` §4.2).
const fn failed(reason: &'static str) -> ErrorCode {
    ErrorCode::finer(SETTLEMENT_FAILED, reason)
}

/// The transaction rules (`docs/exact-algo.md` §3, with the encoding and signature checks), in
/// order.
pub const RULES: &[RuleDoc] = &[
    RuleDoc {
        rule: "type = pay, a single transaction (no group), single signature",
        why: "nothing else can be slipped into a group",
        errors: &[
            failed("wrong transaction type"),
            failed("group not allowed"),
            failed("multisig not accepted"),
            failed("logicsig not accepted"),
        ],
    },
    RuleDoc {
        rule: "receiver = accepts[].payTo",
        why: "pay only the advertised address",
        errors: &[ErrorCode::seed(RECEIVER_MISMATCH)],
    },
    RuleDoc {
        rule: "amount >= maxAmountRequired",
        why: "blocks underpayment",
        errors: &[ErrorCode::seed(UNDERPAID)],
    },
    RuleDoc {
        rule: "note = extra.paymentId (ASCII)",
        why: "binds the payment to the request; blocks reuse",
        errors: &[
            ErrorCode::finer(UNKNOWN_OR_EXPIRED_PAYMENT_ID, "note mismatch"),
            ErrorCode::seed(UNKNOWN_OR_EXPIRED_PAYMENT_ID),
            ErrorCode::seed(PAYMENT_ID_ALREADY_USED),
        ],
    },
    RuleDoc {
        rule: "extra.minFeeMicroAlgo <= fee <= 2,000 microALGO",
        why: "the payer is never forced into an excessive fee",
        errors: &[failed("fee too high"), failed("fee too low")],
    },
    RuleDoc {
        rule: "rekey_to and close_remainder_to empty",
        why: "blocks account takeover and balance sweep",
        errors: &[failed("rekey not allowed"), failed("close-to not allowed")],
    },
    RuleDoc {
        rule: "inside its valid rounds (at most 1,000), genesis hash matches",
        why: "blocks expired transactions and cross-network replay",
        errors: &[
            ErrorCode::seed(TRANSACTION_EXPIRED),
            ErrorCode::finer(TRANSACTION_EXPIRED, "transaction not yet valid"),
            ErrorCode::finer(TRANSACTION_EXPIRED, "validity window too long"),
            failed("wrong network"),
        ],
    },
    RuleDoc {
        rule: "signed by the sender (or the address it was rekeyed to, named in sgnr)",
        why: "checked before anything in the payload is believed",
        errors: &[failed("bad signature"), failed("unauthorized signer")],
    },
    RuleDoc {
        rule: "payload.txn is canonical msgpack of a signed native payment, no unknown fields",
        why: "what is checked is exactly what is submitted",
        errors: &[
            failed("non-canonical encoding"),
            failed("malformed payment"),
        ],
    },
];

/// One error a payer can meet (`docs/exact-algo.md` §4): the six-code `error` and the finer
/// `reason` sent beside it, what it means, what the payer does, and the HTTP status it comes
/// with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorDoc {
    /// `error` (one of the six codes of §4.1, or `payment required`) and `reason` (the
    /// finer code, `None` for the rows of §4.1 itself).
    pub code: ErrorCode,
    /// What it means.
    pub meaning: &'static str,
    /// What the payer does.
    pub action: &'static str,
    /// The HTTP status (402, or 503 for a retryable failure).
    pub status: u16,
}

impl ErrorDoc {
    /// Whether this is a row of the table of `docs/exact-algo.md` §4.1: one of the six codes
    /// with no finer reason.
    #[must_use]
    pub fn is_seed_row(&self) -> bool {
        self.code.reason.is_none() && SEED_ERRORS.contains(&self.code.error)
    }
}

const fn err(
    code: ErrorCode,
    meaning: &'static str,
    action: &'static str,
    status: u16,
) -> ErrorDoc {
    ErrorDoc {
        code,
        meaning,
        action,
        status,
    }
}

const FRESH: &str = "request a fresh 402 and pay again";
const SAME_AGAIN: &str =
    "wait Retry-After and send the same PAYMENT-SIGNATURE again; do not pay again";

/// Every error a payer can meet: the table of `docs/exact-algo.md` §4.1 as it stands, `payment
/// required`, then this implementation's finer reasons (§4.2,
/// [`crate::receiver::Refusal::reason`]), each with the six-code `error` it is sent under
/// ([`crate::receiver::Refusal::code`]).
pub const ERRORS: &[ErrorDoc] = &[
    err(
        ErrorCode::seed(UNDERPAID),
        "amount too small",
        "re-read the 402 body and pay again",
        402,
    ),
    err(
        ErrorCode::seed(RECEIVER_MISMATCH),
        "wrong receiver",
        "use payTo exactly",
        402,
    ),
    err(
        ErrorCode::seed(UNKNOWN_OR_EXPIRED_PAYMENT_ID),
        "no such challenge (for this resource), or it expired",
        "request a fresh 402",
        402,
    ),
    err(
        ErrorCode::seed(PAYMENT_ID_ALREADY_USED),
        "single-use violated",
        "request a fresh 402",
        402,
    ),
    err(
        ErrorCode::seed(TRANSACTION_EXPIRED),
        "last_valid_round passed",
        "sign again",
        402,
    ),
    err(
        ErrorCode::seed(SETTLEMENT_FAILED),
        "the network rejected it (signature, balance)",
        "check the wallet and retry with the fresh 402",
        402,
    ),
    err(
        ErrorCode::seed(PAYMENT_REQUIRED_ERROR),
        "no payment was attached",
        "pay the challenge in accepts[0] and retry with the payment",
        402,
    ),
    err(
        failed("malformed payment"),
        "the header is not base64 of the envelope JSON, or has unknown fields, another x402Version or scheme, or payload.txn is not a signed native payment",
        FRESH,
        402,
    ),
    err(
        failed("non-canonical encoding"),
        "payload.txn is not the canonical msgpack encoding",
        "encode with an Algorand SDK",
        402,
    ),
    err(
        failed("wrong transaction type"),
        "not a pay transaction",
        "send a native ALGO payment",
        402,
    ),
    err(
        failed("multisig not accepted"),
        "a multisig signature",
        "sign with a single key",
        402,
    ),
    err(
        failed("logicsig not accepted"),
        "a logic signature",
        "sign with a single key",
        402,
    ),
    err(
        failed("bad signature"),
        "the signature does not verify",
        "sign with the sender's key",
        402,
    ),
    err(
        failed("unauthorized signer"),
        "sgnr is not the account's auth address",
        "sign with the key the account is rekeyed to",
        402,
    ),
    err(
        failed("wrong network"),
        "another network or genesis hash",
        "pay on the network in accepts[].network",
        402,
    ),
    err(
        failed("group not allowed"),
        "the transaction is part of a group",
        "send one ungrouped transaction",
        402,
    ),
    err(
        failed("fee too high"),
        "fee above 2,000 microALGO",
        "use a flat fee of extra.minFeeMicroAlgo",
        402,
    ),
    err(
        failed("fee too low"),
        "fee below the network minimum",
        "use a flat fee of extra.minFeeMicroAlgo",
        402,
    ),
    err(
        failed("rekey not allowed"),
        "rekey_to is set",
        "leave rekey_to empty",
        402,
    ),
    err(
        failed("close-to not allowed"),
        "close_remainder_to is set",
        "leave close_remainder_to empty",
        402,
    ),
    err(
        ErrorCode::finer(TRANSACTION_EXPIRED, "transaction not yet valid"),
        "first_valid_round is ahead of the chain",
        "sign again with current suggested params",
        402,
    ),
    err(
        ErrorCode::finer(TRANSACTION_EXPIRED, "validity window too long"),
        "last_valid - first_valid is negative or above 1,000 rounds",
        "sign again with current suggested params",
        402,
    ),
    err(
        ErrorCode::finer(UNKNOWN_OR_EXPIRED_PAYMENT_ID, "note mismatch"),
        "the note is not exactly extra.paymentId",
        FRESH,
        402,
    ),
    err(
        failed("settlement in progress"),
        "this very payment is being settled (your earlier attempt, or a duplicate)",
        SAME_AGAIN,
        503,
    ),
    err(
        failed("algod unavailable"),
        "algod could not be reached or did not answer in time; the outcome is unknown",
        SAME_AGAIN,
        503,
    ),
    err(
        failed("storage error"),
        "the receiver's paymentId store failed",
        "retry the same request (with the same payment, if any) after Retry-After",
        503,
    ),
];

fn amount_str(n: u64) -> String {
    n.to_string()
}

/// The client procedure of `docs/exact-algo.md` §6, step by step.
pub const CLIENT_PROCEDURE: &[&str] = &[
    "Request the resource (or call the tool) without payment: HTTP answers 402 with the PaymentRequired JSON as body and, base64, in PAYMENT-REQUIRED; MCP answers a tool result with isError = true and the PaymentRequired in structuredContent.",
    "Take the entry of accepts[] with scheme \"exact\", asset \"ALGO\" and your network: payTo, maxAmountRequired (microALGO, decimal string), extra.paymentId (32 hex, single use), extra.minFeeMicroAlgo. Nothing else is needed; no price or address is hard-coded.",
    "Get suggested params from algod (GET /v2/transactions/params); use a flat fee of max(min-fee, extra.minFeeMicroAlgo), never above 2,000 microALGO.",
    "Build one pay transaction: sender = you, receiver = payTo, amount = maxAmountRequired, note = the ASCII bytes of extra.paymentId, first/last valid from the suggested params (at most 1,000 rounds), no group, no rekey_to, no close_remainder_to.",
    "Sign it with a single key; payload.txn = base64 of the signed transaction's msgpack.",
    "Envelope = {\"x402Version\": 2, \"scheme\": \"exact\", \"network\": accepts[].network, \"payload\": {\"txn\": ...}}; send base64 of its JSON as the PAYMENT-SIGNATURE header (HTTP) or as params._meta[\"x402/payment\"] (MCP tools/call), repeating the same request.",
    "Success: HTTP 200 with PAYMENT-RESPONSE (base64 JSON receipt: success, transaction, network, payer, amount, confirmedRound); MCP structuredContent.receipt and _meta[\"x402/payment-response\"].",
    "402 with another error: act on error as the seed's table says (errors; reason, when present, names the finer case); a fresh challenge comes with it. 503 with Retry-After: send the same payment again; it settles at most once.",
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
            let mut v = json!({"error": e.code.error, "meaning": e.meaning,
                               "action": e.action, "status": e.status, "seed": e.is_seed_row()});
            if let (Some(reason), Some(o)) = (e.code.reason, v.as_object_mut()) {
                o.insert("reason".into(), Value::String(reason.to_owned()));
            }
            v
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
        "seedErrors": SEED_ERRORS,
        "errorFields": {
            "error": "always one of the seed's six codes (seedErrors), or \"payment required\" when no payment was attached: act on it as the seed says",
            "reason": "present when this receiver knows more: a finer stable code (errors[].reason), sent beside error in the 402 body, the 503 body and MCP structuredContent",
        },
        "challenge": {
            "body": "PaymentRequired {x402Version, error, reason (optional), accepts[]}",
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
    let _ = writeln!(s, "\n## Errors (the 402 body's error, and reason)\n");
    let _ = writeln!(
        s,
        "error is always one of the seed's six codes ({}) or \"{PAYMENT_REQUIRED_ERROR}\"; act \
         on it as the seed says. reason, when present, is a finer stable code sent beside it.\n",
        SEED_ERRORS.join(", ")
    );
    for e in ERRORS {
        let status = if e.status == 402 {
            String::new()
        } else {
            format!(" (HTTP {})", e.status)
        };
        match e.code.reason {
            None => {
                let _ = writeln!(
                    s,
                    "- {}{status}: {}. {}.",
                    e.code.error, e.meaning, e.action
                );
            }
            Some(reason) => {
                let _ = writeln!(
                    s,
                    "- {} / reason {reason}{status}: {}. {}.",
                    e.code.error, e.meaning, e.action
                );
            }
        }
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

/// Whether `code` (an `error` with its `reason`) is documented in [`ERRORS`].
#[must_use]
pub fn is_documented(code: ErrorCode) -> bool {
    ERRORS.iter().any(|e| e.code == code)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::receiver::{Refusal, every_refusal};

    #[test]
    fn every_violation_code_is_documented_and_in_a_rule() {
        for r in every_refusal() {
            let Refusal::Rule(v) = r else { continue };
            let code = v.error_code();
            assert!(is_documented(code), "{code:?}");
            assert!(RULES.iter().any(|r| r.errors.contains(&code)), "{code:?}");
        }
    }

    #[test]
    fn every_refusal_code_is_documented() {
        for r in every_refusal() {
            let code = r.error_code();
            assert!(is_documented(code), "{r:?}: {code:?}");
            // The status documented is the status it is answered with.
            let doc = ERRORS.iter().find(|e| e.code == code).unwrap();
            let status = if r.is_retryable() { 503 } else { 402 };
            assert_eq!(doc.status, status, "{r:?}");
        }
        let seed: Vec<&str> = ERRORS
            .iter()
            .filter(|e| e.is_seed_row())
            .map(|e| e.code.error)
            .collect();
        assert_eq!(seed, SEED_ERRORS);
    }

    #[test]
    fn every_documented_error_is_sent_under_a_seed_code() {
        for e in ERRORS {
            assert!(
                SEED_ERRORS.contains(&e.code.error) || e.code.error == PAYMENT_REQUIRED_ERROR,
                "{e:?}"
            );
            if let Some(reason) = e.code.reason {
                assert!(!SEED_ERRORS.contains(&reason), "{e:?}");
                // One six-code `error` per finer reason.
                assert_eq!(
                    ERRORS
                        .iter()
                        .filter(|o| o.code.reason == Some(reason))
                        .count(),
                    1,
                    "{reason}"
                );
            }
        }
        for r in RULES {
            for c in r.errors {
                assert!(is_documented(*c), "{c:?}");
            }
        }
    }
}
