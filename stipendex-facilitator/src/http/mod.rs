//! The HTTP surface: the [`rail_account::api`] routes over a [`Facilitator`], every route but
//! health and metrics behind request signing ([`auth`]), every request counted and logged
//! ([`metrics`]).

mod auth;
mod metrics;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::middleware::from_fn_with_state;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use rail_account::api::{self, ErrorBody, Health, PayAnswer, WireError};
use rail_core::OpId;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use auth::Caller;
pub use metrics::Metrics;

use crate::error::Error;
use crate::service::Facilitator;

/// What every handler shares.
#[derive(Clone)]
pub(crate) struct App {
    pub(crate) fac: Facilitator,
    pub(crate) metrics: Arc<Metrics>,
}

/// The facilitator's routes, with signing, metrics and access logs.
pub fn router(fac: Facilitator) -> Router {
    let metrics = Arc::new(Metrics::new(&fac.config().instance));
    let app = App { fac, metrics };
    let signed = Router::new()
        .route(api::ACCOUNT, get(account))
        .route(api::PAYMENTS, post(pay))
        .route("/v1/payments/{id}", get(payment))
        .route("/v1/payments/{id}/{action}", post(act))
        .layer(from_fn_with_state(app.clone(), auth::signed));
    Router::new()
        .route(api::HEALTH, get(health))
        .route(api::METRICS, get(metrics::render))
        .merge(signed)
        .fallback(not_found)
        .layer(from_fn_with_state(app.clone(), metrics::observe))
        .with_state(app)
}

/// The code of a refused request, for metrics and logs.
#[derive(Clone, Debug)]
pub(crate) struct Code(pub(crate) String);

/// An error answer: its HTTP status from its code, `{"error": …}`.
pub(crate) struct Refusal(pub(crate) Box<WireError>);

impl From<Error> for Refusal {
    fn from(e: Error) -> Self {
        Refusal(Box::new(e.wire()))
    }
}

impl From<rail_core::RailError> for Refusal {
    fn from(e: rail_core::RailError) -> Self {
        Refusal(Box::new(crate::error::rail_wire(&e)))
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(api::http_status(&self.0.code))
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let code = Code(self.0.code.clone());
        let mut resp = (status, axum::Json(ErrorBody { error: *self.0 })).into_response();
        resp.extensions_mut().insert(code);
        resp
    }
}

fn json<T: Serialize>(status: StatusCode, body: &T) -> Response {
    (status, axum::Json(body)).into_response()
}

fn body<T: DeserializeOwned>(bytes: &Bytes) -> Result<T, Refusal> {
    serde_json::from_slice(bytes)
        .map_err(|e| Error::BadRequest(format!("the request body is not valid: {e}")).into())
}

fn key(caller: &Caller) -> Result<OpId, Refusal> {
    let k = caller.idempotency_key.as_deref().ok_or_else(|| {
        Refusal::from(Error::BadRequest(
            "this call changes state: send an Idempotency-Key header".into(),
        ))
    })?;
    Ok(OpId::new(k)?)
}

async fn not_found() -> Refusal {
    Refusal(Box::new(WireError::new(
        "not_found",
        "no such route",
        false,
    )))
}

async fn health(State(app): State<App>) -> Response {
    let c = app.fac.config();
    let ok = app.fac.pool().ping().await.is_ok();
    let h = Health {
        status: if ok { "ok" } else { "unavailable" }.into(),
        network: c.network.clone(),
        instance: c.instance.clone(),
        backend: app.fac.pool().backend().into(),
        version: env!("CARGO_PKG_VERSION").into(),
    };
    json(
        if ok {
            StatusCode::OK
        } else {
            StatusCode::SERVICE_UNAVAILABLE
        },
        &h,
    )
}

async fn account(State(app): State<App>, caller: Caller) -> Result<Response, Refusal> {
    let view = app.fac.account_view(caller.id).await?;
    Ok(json(StatusCode::OK, &view))
}

async fn pay(State(app): State<App>, caller: Caller, bytes: Bytes) -> Result<Response, Refusal> {
    let op = key(&caller)?;
    let answer = app.fac.pay(caller.id, &op, body(&bytes)?).await?;
    let status = match answer {
        PayAnswer::Paid { .. } => StatusCode::CREATED,
        PayAnswer::PendingReview { .. } => StatusCode::ACCEPTED,
    };
    Ok(json(status, &answer))
}

async fn payment(
    State(app): State<App>,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, Refusal> {
    Ok(json(
        StatusCode::OK,
        &app.fac.payment_view(caller.id, &id).await?,
    ))
}

/// `POST /v1/payments/{id}/{action}`: the payee's operations on a payment, each under the
/// request's idempotency key.
async fn act(
    State(app): State<App>,
    caller: Caller,
    Path((id, action)): Path<(String, String)>,
    bytes: Bytes,
) -> Result<Response, Refusal> {
    let op = key(&caller)?;
    let (fac, who) = (&app.fac, caller.id);
    let answer = match action.as_str() {
        "redeem" => serde_json::to_value(fac.redeem(who, op.as_str(), &id, body(&bytes)?).await?),
        "capture" => serde_json::to_value(fac.capture(who, &op, &id, body(&bytes)?).await?),
        "void" => serde_json::to_value(fac.void(who, &op, &id, body(&bytes)?).await?),
        "refund" => serde_json::to_value(fac.refund(who, &op, &id, body(&bytes)?).await?),
        _ => return Err(not_found().await),
    };
    let answer = answer.map_err(|e| Refusal::from(rail_core::RailError::Storage(e.to_string())))?;
    Ok(json(StatusCode::OK, &answer))
}
