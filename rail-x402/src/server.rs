//! The facilitator HTTP server: `POST /verify`, `POST /settle`, `GET /supported`, `GET /health`
//! over any [`X402Facilitator`] (the `x402-facilitator` binary serves a [`LocalFacilitator`]).
//!
//! Bodies are the x402 v2 facilitator API's (`{x402Version, paymentPayload,
//! paymentRequirements}` in, `VerifyResponse` / `SettleResponse` out). A body that does not
//! decode gets `400` with `{"isValid":false,"invalidReason":"invalid_payload", ...}` (or the
//! `SettleResponse` equivalent); a settlement whose outcome is unknown gets `503` with a
//! `Retry-After` and no `success` field, so no client can mistake it for an answer.
//!
//! [`LocalFacilitator`]: crate::facilitator::LocalFacilitator

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use crate::facilitator::{FacilitatorError, FacilitatorRequest, X402Facilitator, settle_detached};
use crate::verify::reasons;

/// The facilitator routes over `facilitator`.
pub fn router(facilitator: Arc<dyn X402Facilitator>) -> Router {
    Router::new()
        .route("/verify", post(verify))
        .route("/settle", post(settle))
        .route("/supported", get(supported))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .with_state(facilitator)
}

fn decode(body: &[u8]) -> Result<FacilitatorRequest, String> {
    let req: FacilitatorRequest = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    if req.x402_version != 2 {
        return Err(format!("x402Version {} is not 2", req.x402_version));
    }
    Ok(req)
}

fn unavailable(e: &FacilitatorError) -> Response {
    let retry = match e {
        FacilitatorError::InProgress { retry_after } => retry_after.as_secs().max(1),
        _ => 2,
    };
    let mut r = (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": reasons::FACILITATOR_UNAVAILABLE, "message": e.to_string()})),
    )
        .into_response();
    if let Ok(v) = HeaderValue::from_str(&retry.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

async fn verify(State(f): State<Arc<dyn X402Facilitator>>, body: Bytes) -> Response {
    let req = match decode(&body) {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"isValid": false, "invalidReason": reasons::INVALID_PAYLOAD, "invalidMessage": e})),
            )
                .into_response();
        }
    };
    match f
        .verify(&req.payment_payload, &req.payment_requirements)
        .await
    {
        Ok(v) => Json(v).into_response(),
        Err(e) => unavailable(&e),
    }
}

async fn settle(State(f): State<Arc<dyn X402Facilitator>>, body: Bytes) -> Response {
    let req = match decode(&body) {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"success": false, "errorReason": reasons::INVALID_PAYLOAD, "errorMessage": e, "transaction": "", "network": ""})),
            )
                .into_response();
        }
    };
    match settle_detached(&f, &req.payment_payload, &req.payment_requirements).await {
        Ok(s) => Json(s).into_response(),
        Err(e) => unavailable(&e),
    }
}

async fn supported(State(f): State<Arc<dyn X402Facilitator>>) -> Response {
    match f.supported().await {
        Ok(s) => Json(s).into_response(),
        Err(e) => unavailable(&e),
    }
}
