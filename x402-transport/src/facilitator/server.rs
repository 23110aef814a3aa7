//! The facilitator's HTTP routes over any [`Facilitator`]: `POST /verify`, `POST /settle`,
//! `GET /supported`, `GET /health` (the wire is in the module's documentation).
//!
//! Bodies over [`MAX_BODY`] are refused (413) before they are read; a body that is not a
//! facilitator request of version 2 is a 400 naming what is wrong; a settlement runs in a task
//! of its own, so a client that goes away does not cut it short; nothing of a payment is
//! logged here.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

use super::{
    Facilitator, FacilitatorRequest, INVALID_PAYLOAD, SettleResponse, UNAVAILABLE, Unavailable,
    VerifyResponse,
};

/// The largest request body read.
pub const MAX_BODY: usize = 64 * 1024;

/// The facilitator routes over `facilitator`.
pub fn router<F: Facilitator + ?Sized>(facilitator: Arc<F>) -> Router {
    Router::new()
        .route("/verify", post(verify::<F>))
        .route("/settle", post(settle::<F>))
        .route("/supported", get(supported::<F>))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(facilitator)
}

type Request<F> =
    FacilitatorRequest<<F as Facilitator>::Payload, <F as Facilitator>::Requirements, Option<u8>>;

fn decode<F: Facilitator + ?Sized>(body: &[u8]) -> Result<Request<F>, String> {
    let req: Request<F> = serde_json::from_slice(body)
        .map_err(|e| format!("the body is not a facilitator request: {e}"))?;
    match req.x402_version {
        Some(2) => Ok(req),
        Some(v) => Err(format!("x402Version {v} is not 2")),
        None if F::VERSION_REQUIRED => Err("the body has no x402Version".into()),
        None => Ok(req),
    }
}

fn unavailable(e: &Unavailable) -> Response {
    let mut r = (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": UNAVAILABLE, "message": e.message})),
    )
        .into_response();
    let retry = e.retry_after.as_secs().max(1);
    if let Ok(v) = HeaderValue::from_str(&retry.to_string()) {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

async fn verify<F: Facilitator + ?Sized>(State(f): State<Arc<F>>, body: Bytes) -> Response {
    let req = match decode::<F>(&body) {
        Ok(r) => r,
        Err(e) => {
            let answer = VerifyResponse {
                is_valid: false,
                invalid_reason: Some(INVALID_PAYLOAD.into()),
                invalid_message: Some(e),
                payer: None,
            };
            return (StatusCode::BAD_REQUEST, Json(answer)).into_response();
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

async fn settle<F: Facilitator + ?Sized>(State(f): State<Arc<F>>, body: Bytes) -> Response {
    let req = match decode::<F>(&body) {
        Ok(r) => r,
        Err(e) => {
            let answer = SettleResponse {
                success: false,
                error_reason: Some(INVALID_PAYLOAD.into()),
                error_message: Some(e),
                transaction: String::new(),
                network: String::new(),
                payer: None,
            };
            return (StatusCode::BAD_REQUEST, Json(answer)).into_response();
        }
    };
    let settled = tokio::spawn(async move {
        f.settle(&req.payment_payload, &req.payment_requirements)
            .await
    })
    .await
    .unwrap_or_else(|e| Err(Unavailable::new(format!("settlement task: {e}"))));
    match settled {
        Ok(s) => Json(s).into_response(),
        Err(e) => unavailable(&e),
    }
}

async fn supported<F: Facilitator + ?Sized>(State(f): State<Arc<F>>) -> Response {
    match f.supported().await {
        Ok(s) => Json(s).into_response(),
        Err(e) => unavailable(&e),
    }
}
