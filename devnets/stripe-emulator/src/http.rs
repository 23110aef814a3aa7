//! The emulator's HTTP surface: authentication by key, the routes, Stripe's form encoding,
//! response headers (`Request-Id`, `Idempotent-Replayed`, `Stripe-Should-Retry`) and webhook
//! delivery. What each call does is the state machine's ([`super::state`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value as Json, json};
use subtle::ConstantTimeEq;

use super::error::{ApiError, api_error, invalid};
use super::state::{StateInner, amount_param, fingerprint, random_id};
use super::{Emulator, EmulatorConfig, RunningEmulator};
use rail_stripe::webhook;

/// Which key authenticated the request (also the scope its idempotency keys are kept in).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Key {
    Secret,
    Publishable,
}

/// Stripe's form encoding, flattened: `metadata[k]=v` stays `metadata[k]`.
fn parse_form(body: &[u8]) -> BTreeMap<String, String> {
    form_urlencoded::parse(body)
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

impl Emulator {
    /// Which key the `Authorization: Bearer …` header presents, or Stripe's 401.
    fn authenticate(&self, headers: &HeaderMap) -> Result<Key, ApiError> {
        let given = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(key) = given else {
            return Err(api_error(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                None,
                "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY'). See https://stripe.com/docs/api#authentication for details, or we can help at https://support.stripe.com/.",
            ));
        };
        if bool::from(key.as_bytes().ct_eq(self.cfg.secret_key.as_bytes())) {
            return Ok(Key::Secret);
        }
        if bool::from(key.as_bytes().ct_eq(self.cfg.publishable_key.as_bytes())) {
            return Ok(Key::Publishable);
        }
        let tail: String = key
            .chars()
            .rev()
            .take(4)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        Err(api_error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("api_key_invalid"),
            &format!(
                "Invalid API Key provided: {}****{tail}",
                key.get(..8).unwrap_or("")
            ),
        ))
    }

    /// Runs one API call: authentication, idempotency, the operation, webhook delivery.
    async fn call(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        params: BTreeMap<String, String>,
        op: impl FnOnce(
            &Self,
            &mut StateInner,
            Key,
            &BTreeMap<String, String>,
        ) -> Result<Json, ApiError>,
    ) -> Response {
        let request_id = random_id("req");
        let key = match self.authenticate(headers) {
            Ok(k) => k,
            Err(e) => return respond(e.status, &e.body, &request_id, false),
        };
        let idem = (*method == Method::POST)
            .then(|| headers.get("idempotency-key").and_then(|v| v.to_str().ok()))
            .flatten();
        let fingerprint = fingerprint(method.as_str(), path, &params);
        let scope = format!("{key:?}");
        let (status, body, replayed) =
            self.idempotent(scope, idem, fingerprint, |e, s| op(e, s, key, &params));
        self.flush().await;
        respond(status, &body, &request_id, replayed)
    }

    /// The API as an axum router.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/v1/payment_intents", post(create_route))
            .route("/v1/payment_intents/{id}", get(retrieve_route))
            .route(
                "/v1/payment_intents/{id}/{action}",
                post(intent_action_route),
            )
            .route("/v1/refunds", post(refund_route))
            .route("/v1/refunds/{id}", get(get_refund_route))
            .route("/v1/charges/{id}", get(get_charge_route))
            .route("/v1/payment_methods/{id}", get(get_pm_route))
            .route("/_emulator/cards", post(admin_card_route))
            .route("/_emulator/balances", get(admin_balances_route))
            .with_state(self.clone())
    }

    /// Serves the API on `addr` (port 0 picks a free port) in the background.
    ///
    /// # Errors
    /// The bind error.
    pub async fn spawn(cfg: EmulatorConfig, addr: SocketAddr) -> std::io::Result<RunningEmulator> {
        let emulator = Emulator::new(cfg);
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let app = emulator.router();
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "stripe emulator stopped");
            }
        });
        Ok(RunningEmulator {
            url: format!("http://{local}"),
            emulator,
            task,
        })
    }

    /// Delivers pending webhook events, signed, in order.
    async fn flush(&self) {
        let Some((url, secret)) = self.cfg.webhook.clone() else {
            return;
        };
        let events = self.lock().take_outbox();
        for ev in events {
            let payload = ev.to_string();
            let header = webhook::sign(&payload, &secret, self.now());
            let r = self
                .http
                .post(&url)
                .header("Stripe-Signature", header)
                .header("Content-Type", "application/json")
                .body(payload)
                .send()
                .await;
            if let Err(e) = r {
                tracing::warn!(error = %e, "stripe emulator: webhook delivery failed");
            }
        }
    }
}

fn respond(status: StatusCode, body: &Json, request_id: &str, replayed: bool) -> Response {
    let mut r = (status, axum::Json(body.clone())).into_response();
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(request_id) {
        h.insert("request-id", v);
    }
    h.insert(
        "stripe-version",
        HeaderValue::from_static("2025-09-30.clover"),
    );
    if replayed {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if status == StatusCode::CONFLICT || status.is_server_error() {
        h.insert("stripe-should-retry", HeaderValue::from_static("true"));
    }
    r
}

/// Only a secret key may make this call.
fn secret_only(key: Key) -> Result<(), ApiError> {
    if key == Key::Secret {
        Ok(())
    } else {
        Err(api_error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("secret_key_required"),
            "This API call cannot be made with a publishable API key. Please use a secret API key. You can find a list of your API keys at https://dashboard.stripe.com/account/apikeys.",
        ))
    }
}

/// A publishable key may act on an intent only with its client secret.
fn client_secret_ok(
    s: &StateInner,
    key: Key,
    id: &str,
    p: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    if key == Key::Secret {
        return Ok(());
    }
    let client_secret = s.client_secret(id)?;
    let given = p.get("client_secret").map(String::as_str).unwrap_or("");
    if bool::from(given.as_bytes().ct_eq(client_secret.as_bytes())) {
        Ok(())
    } else {
        Err(invalid(
            Some("payment_intent_invalid_parameter"),
            Some("client_secret"),
            "The client_secret provided does not match the client_secret associated with the PaymentIntent.",
        ))
    }
}

async fn create_route(State(e): State<Emulator>, headers: HeaderMap, body: Bytes) -> Response {
    let p = parse_form(&body);
    e.call(
        &Method::POST,
        "/v1/payment_intents",
        &headers,
        p,
        |e, s, key, p| {
            secret_only(key)?;
            e.create_intent(s, p)
        },
    )
    .await
}

async fn retrieve_route(
    State(e): State<Emulator>,
    Path(id): Path<String>,
    Query(q): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let path = format!("/v1/payment_intents/{id}");
    e.call(&Method::GET, &path, &headers, q, |e, s, key, p| {
        client_secret_ok(s, key, &id, p)?;
        // `expand[]=latest_charge`
        e.retrieve_intent(s, &id, p.values().any(|v| v == "latest_charge"))
    })
    .await
}

/// `POST /v1/payment_intents/{id}/{confirm|capture|cancel}`.
async fn intent_action_route(
    State(e): State<Emulator>,
    Path((id, action)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let p = parse_form(&body);
    let path = format!("/v1/payment_intents/{id}/{action}");
    e.call(&Method::POST, &path, &headers, p, |e, s, key, p| {
        match action.as_str() {
            // A publishable key may confirm with the intent's client secret.
            "confirm" => client_secret_ok(s, key, &id, p)?,
            _ => secret_only(key)?,
        }
        match action.as_str() {
            "confirm" => e.confirm(s, &id, p),
            "capture" => e.capture(s, &id, p),
            "cancel" => e.cancel(s, &id, p),
            other => Err(api_error(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                None,
                &format!("Unrecognized request URL (POST: /v1/payment_intents/{id}/{other})."),
            )),
        }
    })
    .await
}

async fn refund_route(State(e): State<Emulator>, headers: HeaderMap, body: Bytes) -> Response {
    let p = parse_form(&body);
    e.call(&Method::POST, "/v1/refunds", &headers, p, |e, s, key, p| {
        secret_only(key)?;
        e.refund(s, p)
    })
    .await
}

/// A `GET` of one object at `path`: no parameters.
async fn get_object(
    e: &Emulator,
    path: &str,
    headers: &HeaderMap,
    op: impl FnOnce(&Emulator, &mut StateInner, Key) -> Result<Json, ApiError>,
) -> Response {
    e.call(
        &Method::GET,
        path,
        headers,
        BTreeMap::new(),
        |e, s, key, _| op(e, s, key),
    )
    .await
}

async fn get_refund_route(
    State(e): State<Emulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    get_object(&e, &format!("/v1/refunds/{id}"), &headers, |_, s, key| {
        secret_only(key)?;
        Emulator::retrieve_refund(s, &id)
    })
    .await
}

async fn get_charge_route(
    State(e): State<Emulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    get_object(&e, &format!("/v1/charges/{id}"), &headers, |e, s, key| {
        secret_only(key)?;
        e.retrieve_charge(s, &id)
    })
    .await
}

async fn get_pm_route(
    State(e): State<Emulator>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    get_object(
        &e,
        &format!("/v1/payment_methods/{id}"),
        &headers,
        |e, s, _| e.retrieve_payment_method(s, &id),
    )
    .await
}

async fn admin_card_route(State(e): State<Emulator>, headers: HeaderMap, body: Bytes) -> Response {
    let p = parse_form(&body);
    e.call(
        &Method::POST,
        "/_emulator/cards",
        &headers,
        p,
        |_, s, key, p| {
            secret_only(key)?;
            let limit = amount_param(p, "limit")?.unwrap_or(u64::MAX);
            let id = s.add_card(limit);
            Ok(json!({"id": id, "limit": limit, "available": limit, "object": "emulator.card"}))
        },
    )
    .await
}

async fn admin_balances_route(
    State(e): State<Emulator>,
    Query(q): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    e.call(
        &Method::GET,
        "/_emulator/balances",
        &headers,
        q,
        |_, s, key, p| {
            secret_only(key)?;
            Ok(s.balances_json(p.get("card").map(String::as_str)))
        },
    )
    .await
}
