//! Stripe's error answers (an HTTP status and an `{"error": {…}}` body), produced by the state
//! machine's operations and by the HTTP surface alike.

// `http::StatusCode`, the type axum uses too; taken through reqwest so that this module and
// the state machine do not depend on the server.
use reqwest::StatusCode;
use serde_json::{Value as Json, json};

/// A Stripe error answer.
#[derive(Clone, Debug)]
pub(super) struct ApiError {
    pub(super) status: StatusCode,
    pub(super) body: Json,
}

/// `{"error": {"type": kind, "message": …, "code": …, "doc_url": …}}` with `status`.
pub(super) fn api_error(
    status: StatusCode,
    kind: &str,
    code: Option<&str>,
    message: &str,
) -> ApiError {
    let mut e = json!({"type": kind, "message": message});
    if let (Some(c), Some(o)) = (code, e.as_object_mut()) {
        o.insert("code".into(), json!(c));
        o.insert(
            "doc_url".into(),
            json!(format!(
                "https://stripe.com/docs/error-codes/{}",
                c.replace('_', "-")
            )),
        );
    }
    ApiError {
        status,
        body: json!({ "error": e }),
    }
}

/// A 400 `invalid_request_error`, naming the offending parameter if any.
pub(super) fn invalid(code: Option<&str>, param: Option<&str>, message: &str) -> ApiError {
    let mut e = api_error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        code,
        message,
    );
    if let (Some(p), Some(o)) = (param, e.body.get_mut("error").and_then(Json::as_object_mut)) {
        o.insert("param".into(), json!(p));
    }
    e
}

/// A 404 `resource_missing` for the object `id` of `kind`.
pub(super) fn no_such(kind: &str, id: &str) -> ApiError {
    let mut e = api_error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        Some("resource_missing"),
        &format!("No such {kind}: '{id}'"),
    );
    if let Some(o) = e.body.get_mut("error").and_then(Json::as_object_mut) {
        o.insert("param".into(), json!("id"));
    }
    e
}

/// A 400 `payment_intent_unexpected_state`: `action` is not allowed from `status`.
pub(super) fn unexpected_state(what: &str, status: &str, allowed: &str, action: &str) -> ApiError {
    invalid(
        Some("payment_intent_unexpected_state"),
        None,
        &format!(
            "This PaymentIntent could not be {action} because it has a status of {status}. Only a {what} with one of the following statuses may be {action}: {allowed}."
        ),
    )
}
