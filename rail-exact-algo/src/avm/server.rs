//! The AVM scheme's facilitator over HTTP: `GET /supported`, `POST /verify`, `POST /settle`,
//! as x402's resource servers call a facilitator (x402-avm's `HTTPFacilitatorClient`, this
//! crate's [`super::remote::RemoteFacilitator`]; research §7.1).
//!
//! - `/verify` and `/settle` answer **200** for a payment that is refused (`isValid: false`,
//!   `success: false` with the code), as the SDK's client requires; a settle answer always
//!   carries `transaction` and `network`.
//! - An unknown outcome (algod or the settlement store did not answer) is a **503** with a
//!   settle-shaped body (`errorReason: "facilitator_unavailable"`): the same payment presented
//!   again settles at most once.
//! - Bodies over 64 KiB are refused (413) before they are read; malformed JSON is a 400 naming
//!   what is wrong; nothing is logged of a payment but its payer and transaction id.
//! - `/supported` lists the network in both spellings (the whole genesis hash for x402-avm,
//!   the 32-character CAIP-2 form for `@x402/avm`), with `extra.feePayer` when this facilitator
//!   pays fees.

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::facilitator::{AvmError, AvmFacilitator};
use super::wire::{FacilitatorRequest, Kind, SettleResponse, Spelling, Supported, VerifyResponse};

/// The largest request body read.
pub const MAX_BODY: usize = 64 * 1024;

/// The facilitator's routes.
pub fn router(f: AvmFacilitator) -> Router {
    Router::new()
        .route("/supported", get(supported))
        .route("/verify", post(verify))
        .route("/settle", post(settle))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(f)
}

/// `/supported`'s answer for `f`.
#[must_use]
pub fn supported_of(f: &AvmFacilitator) -> Supported {
    let extra = f.fee_payer().map(|a| json!({"feePayer": a.to_string()}));
    let kinds = [Spelling::GenesisHash, Spelling::Caip2]
        .into_iter()
        .map(|s| Kind {
            x402_version: 2,
            scheme: "exact".into(),
            network: s.network(&f.genesis_hash()),
            extra: extra.clone(),
        })
        .collect();
    let mut signers = serde_json::Map::new();
    if let Some(a) = f.fee_payer() {
        signers.insert("algorand:*".into(), json!([a.to_string()]));
    }
    Supported {
        kinds,
        extensions: Vec::new(),
        signers,
    }
}

async fn supported(State(f): State<AvmFacilitator>) -> Response {
    axum::Json(supported_of(&f)).into_response()
}

fn parse(body: &[u8]) -> Result<FacilitatorRequest, String> {
    serde_json::from_slice(body).map_err(|e| format!("the body is not a facilitator request: {e}"))
}

fn bad_request(message: &str) -> Response {
    (
        StatusCode::BAD_REQUEST,
        axum::Json(json!({"error": message})),
    )
        .into_response()
}

async fn verify(State(f): State<AvmFacilitator>, body: axum::body::Bytes) -> Response {
    let req = match parse(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&e),
    };
    let invalid = |code: &str, message: String, payer: Option<String>| {
        axum::Json(VerifyResponse {
            is_valid: false,
            invalid_reason: Some(code.to_owned()),
            invalid_message: Some(message),
            payer,
        })
        .into_response()
    };
    let p = match f.check(&req.payment_payload, &req.payment_requirements) {
        Ok(p) => p,
        Err(v) => return invalid(v.code, v.detail, None),
    };
    let payer = Some(p.payer.to_string());
    match f.verify(&p).await {
        Ok(true) => axum::Json(VerifyResponse {
            is_valid: true,
            invalid_reason: None,
            invalid_message: None,
            payer,
        })
        .into_response(),
        Ok(false) => invalid(
            super::wire::code::ALREADY_SETTLED,
            "the group is already on chain".into(),
            payer,
        ),
        Err(AvmError::Refused { code, detail }) => invalid(code, detail, payer),
        Err(AvmError::Unknown(detail)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"isValid": false, "invalidReason": "facilitator_unavailable", "invalidMessage": detail})),
        )
            .into_response(),
    }
}

async fn settle(State(f): State<AvmFacilitator>, body: axum::body::Bytes) -> Response {
    let req = match parse(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(&e),
    };
    let network = req.payment_payload.accepted.network.clone();
    let failed = |status: StatusCode, code: &str, message: String, payer: Option<String>| {
        (
            status,
            axum::Json(SettleResponse {
                success: false,
                error_reason: Some(code.to_owned()),
                error_message: Some(message),
                payer,
                transaction: String::new(),
                network: network.clone(),
            }),
        )
            .into_response()
    };
    let p = match f.check(&req.payment_payload, &req.payment_requirements) {
        Ok(p) => p,
        Err(v) => return failed(StatusCode::OK, v.code, v.detail, None),
    };
    let payer = Some(p.payer.to_string());
    match f.settle(&p, &req.payment_requirements.network).await {
        Ok(s) => {
            tracing::info!(payer = %s.payer, txid = %s.txid, "exact-avm: settled");
            axum::Json(SettleResponse {
                success: true,
                error_reason: None,
                error_message: None,
                payer: Some(s.payer),
                transaction: s.txid,
                network: network.clone(),
            })
            .into_response()
        }
        Err(AvmError::Refused { code, detail }) => failed(StatusCode::OK, code, detail, payer),
        Err(AvmError::Unknown(detail)) => failed(
            StatusCode::SERVICE_UNAVAILABLE,
            "facilitator_unavailable",
            detail,
            payer,
        ),
    }
}
