//! The signing check in front of every account route: the body is read (up to the
//! configured size), the signature checked, the nonce recorded; only then does a handler see
//! the request, with the [`Caller`].

use axum::body::{Body, to_bytes};
use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rail_account::api::WireError;
use rail_account::auth::{self, RequestParts, SignedRequest};
use rail_ledger::AccountId;

use super::{App, Refusal};

/// The account that signed the request, and its idempotency key.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The signing account.
    pub id: AccountId,
    /// The `Idempotency-Key` header, if sent.
    pub idempotency_key: Option<String>,
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        parts.extensions.get::<Caller>().cloned().ok_or_else(|| {
            Refusal(Box::new(WireError::new(
                "unauthenticated",
                "the request is not signed",
                false,
            )))
            .into_response()
        })
    }
}

pub(super) async fn signed(State(app): State<App>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let Ok(bytes) = to_bytes(body, app.fac.config().max_body).await else {
        let mut r = Refusal(Box::new(WireError::new(
            "invalid_input",
            format!(
                "the request body is above {} bytes, or was cut",
                app.fac.config().max_body
            ),
            false,
        )))
        .into_response();
        *r.status_mut() = axum::http::StatusCode::PAYLOAD_TOO_LARGE;
        return r;
    };
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok());
    let path_and_query = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path(), |p| p.as_str());
    let idempotency_key = header(auth::IDEMPOTENCY_KEY);
    let checked = match SignedRequest::read(header) {
        Ok(signed) => {
            app.fac
                .authenticate(
                    &signed,
                    &RequestParts {
                        network: &app.fac.config().network,
                        method: parts.method.as_str(),
                        path_and_query,
                        idempotency_key,
                        body: &bytes,
                    },
                )
                .await
        }
        Err(e) => Err(e),
    };
    let (caller, authenticated) = match checked {
        Ok(a) => (
            Caller {
                id: a.id,
                idempotency_key: idempotency_key.map(str::to_owned),
            },
            a,
        ),
        Err(e) => {
            tracing::debug!(code = e.code(), "request signature refused");
            return Refusal(Box::new(WireError::from_auth(&e))).into_response();
        }
    };
    let mut req = Request::from_parts(parts, Body::from(bytes));
    req.extensions_mut().insert(caller.clone());
    let mut resp = next.run(req).await;
    // Answered only once its nonce is durable (free after the request's own durable write).
    if let Err(e) = authenticated.durable().await {
        // The store's words (its file's path) stay in the log: the caller learns what to do.
        tracing::warn!(error = %e, "a request's nonce could not be made durable");
        let mut r = Refusal(Box::new(WireError::new(
            "unavailable",
            "the service cannot record the request durably now; try again with a new nonce and the same Idempotency-Key",
            true,
        )))
        .into_response();
        *r.status_mut() = axum::http::StatusCode::SERVICE_UNAVAILABLE;
        r.extensions_mut().insert(caller);
        return r;
    }
    resp.extensions_mut().insert(caller);
    resp
}
