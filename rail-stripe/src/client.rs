//! The HTTP transport under async-stripe: request building and typed responses come from
//! async-stripe (`=1.0.0-rc.10`, split crates); sending is ours, so that
//!
//! - every mutating call carries an `Idempotency-Key` (the rail derives it from the operation
//!   id) and a retry (429, 5xx, `Stripe-Should-Retry: true`, network errors, timeouts) resends the
//!   same key, with exponential backoff; `Stripe-Should-Retry: false` stops at once;
//! - Stripe's `Request-Id` is kept in every error;
//! - one rustls provider (ring) serves the whole workspace.
//!
//! async-stripe's own client retries only without a key or sends a key without retrying, and
//! does not expose `Request-Id` or `Stripe-Should-Retry`; hence this transport (it implements
//! `stripe_client_core::StripeClient`, the crate's documented extension point).

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use rail_core::{RailError, RailReason};
use serde::Deserialize;
use stripe_client_core::{CustomizedStripeRequest, StripeClient, StripeClientErr, StripeMethod};

/// A Stripe API error, as Stripe reported it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// `Request-Id` (quote it to Stripe support).
    pub request_id: Option<String>,
    /// `error.type`: `card_error`, `invalid_request_error`, `idempotency_error`, `api_error`.
    pub kind: String,
    /// `error.code` (`card_declined`, `amount_too_large`, `resource_missing`, …).
    pub code: Option<String>,
    /// `error.decline_code` (`insufficient_funds`, `generic_decline`, …).
    pub decline_code: Option<String>,
    /// `error.param`.
    pub param: Option<String>,
    /// `error.message`.
    pub message: String,
}

/// Why a Stripe call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StripeFailure {
    /// Stripe answered with an error.
    #[error("stripe {}: {} ({}{}{}){}", .0.status, .0.message, .0.kind,
        .0.code.as_deref().map(|c| format!(", {c}")).unwrap_or_default(),
        .0.decline_code.as_deref().map(|c| format!(", {c}")).unwrap_or_default(),
        .0.request_id.as_deref().map(|r| format!(" [{r}]")).unwrap_or_default())]
    Api(Box<ApiError>),
    /// Stripe could not be reached, or the connection broke (after retries).
    #[error("stripe unreachable: {0}")]
    Transport(String),
    /// Stripe answered something that is not the documented shape.
    #[error("unexpected stripe answer: {0}")]
    Decode(String),
}

impl StripeClientErr for StripeFailure {
    fn deserialize_err(msg: impl fmt::Display) -> Self {
        StripeFailure::Decode(msg.to_string())
    }
}

impl StripeFailure {
    /// The error's Stripe code, if any.
    #[must_use]
    pub fn code(&self) -> Option<&str> {
        match self {
            StripeFailure::Api(e) => e.code.as_deref(),
            _ => None,
        }
    }

    /// As a rail-core error: declines, conflicts, states and limits keep Stripe's words (and
    /// request id) in the [`RailReason`].
    #[must_use]
    pub fn to_rail_error(&self) -> RailError {
        let e = match self {
            StripeFailure::Api(e) => e,
            StripeFailure::Transport(m) => {
                return RailError::Unavailable(RailReason::new("stripe_unreachable", m.clone()));
            }
            StripeFailure::Decode(m) => {
                return RailError::Rail {
                    reason: RailReason::new("stripe_unexpected_answer", m.clone()),
                    retryable: false,
                };
            }
        };
        let message = match &e.request_id {
            Some(r) => format!("{} [{r}]", e.message),
            None => e.message.clone(),
        };
        let code = e
            .decline_code
            .clone()
            .or_else(|| e.code.clone())
            .unwrap_or_else(|| e.kind.clone());
        let reason = RailReason::new(code.clone(), message.clone());
        match (
            e.kind.as_str(),
            e.code.as_deref(),
            e.decline_code.as_deref(),
        ) {
            (_, _, Some("insufficient_funds")) => RailError::InsufficientFunds(message),
            ("card_error", _, _) => RailError::Declined(reason),
            ("idempotency_error", _, _) => RailError::IdempotencyConflict { op_id: message },
            (_, Some("resource_missing"), _) => RailError::NotFound(message),
            (_, Some("payment_intent_unexpected_state" | "charge_not_refundable"), _) => {
                RailError::InvalidState {
                    op: "stripe",
                    state: message,
                }
            }
            (_, Some("amount_too_large" | "charge_already_refunded"), _) => RailError::Rail {
                reason,
                retryable: false,
            },
            (
                _,
                Some("amount_too_small" | "parameter_invalid_integer" | "parameter_missing"),
                _,
            ) => RailError::InvalidInput(message),
            _ if e.status == 429 || e.status >= 500 => RailError::Unavailable(reason),
            _ => RailError::Rail {
                reason,
                retryable: false,
            },
        }
    }
}

#[derive(Deserialize)]
struct ErrorBody {
    error: ErrorInner,
}

#[derive(Deserialize)]
struct ErrorInner {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    decline_code: Option<String>,
    #[serde(default)]
    param: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// A Stripe endpoint and a key. `Debug` never shows the key.
#[derive(Clone)]
pub struct StripeHttp {
    http: reqwest::Client,
    base: String,
    key: String,
    retries: u32,
    backoff: Duration,
    timeout: Duration,
}

impl fmt::Debug for StripeHttp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = self.key.split('_').take(2).collect::<Vec<_>>().join("_");
        f.debug_struct("StripeHttp")
            .field("base", &self.base)
            .field("key", &format!("{kind}_…"))
            .field("retries", &self.retries)
            .finish_non_exhaustive()
    }
}

/// `https://api.stripe.com`.
pub const STRIPE_API: &str = "https://api.stripe.com";

impl StripeHttp {
    /// A client of `base` (`https://api.stripe.com`, or an emulator) with `key`.
    ///
    /// # Errors
    /// [`StripeFailure::Transport`] if the HTTP client cannot be built.
    pub fn new(base: &str, key: impl Into<String>) -> Result<Self, StripeFailure> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| StripeFailure::Transport(e.to_string()))?;
        Ok(StripeHttp {
            http,
            base: base.trim_end_matches('/').to_owned(),
            key: key.into(),
            retries: 3,
            backoff: Duration::from_millis(200),
            timeout: Duration::from_secs(30),
        })
    }

    /// The same endpoint and connection pool with another key (a payer confirming with each
    /// merchant's publishable key reuses its connections).
    #[must_use]
    pub fn with_key(&self, key: impl Into<String>) -> Self {
        StripeHttp {
            key: key.into(),
            ..self.clone()
        }
    }

    /// Retries after the first attempt (default 3) and the first backoff (default 200 ms,
    /// doubling).
    #[must_use]
    pub fn with_retries(mut self, retries: u32, backoff: Duration) -> Self {
        self.retries = retries;
        self.backoff = backoff;
        self
    }

    /// The per-attempt timeout (default 30 s).
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The key's kind: `sk_test`, `pk_live`, `rk_test`, …
    #[must_use]
    pub fn key_kind(&self) -> String {
        self.key.split('_').take(2).collect::<Vec<_>>().join("_")
    }

    /// Whether the key is a test-mode key (livemode false).
    #[must_use]
    pub fn is_test_mode(&self) -> bool {
        self.key.contains("_test_")
    }
}

impl StripeClient for StripeHttp {
    type Err = StripeFailure;

    async fn execute(&self, req: CustomizedStripeRequest) -> Result<Bytes, StripeFailure> {
        let (rb, cfg) = req.into_pieces();
        let key = cfg
            .request_strategy
            .as_ref()
            .and_then(stripe_client_core::RequestStrategy::get_key)
            .map(stripe_client_core::IdempotencyKey::into_inner);
        let timeout = cfg.timeout.unwrap_or(self.timeout);
        let mut url = format!("{}/v1{}", self.base, rb.path);
        if let Some(q) = rb.query.as_deref().filter(|q| !q.is_empty()) {
            url.push('?');
            url.push_str(q);
        }
        let method = match rb.method {
            StripeMethod::Get => reqwest::Method::GET,
            StripeMethod::Post => reqwest::Method::POST,
            StripeMethod::Delete => reqwest::Method::DELETE,
        };
        // Only requests that cannot act twice are retried: reads, and writes with a key.
        let safe = method == reqwest::Method::GET || key.is_some();
        let mut delay = self.backoff;
        let mut attempt = 0u32;
        loop {
            let mut r = self
                .http
                .request(method.clone(), &url)
                .bearer_auth(&self.key)
                .timeout(timeout)
                .header("Stripe-Version", stripe_shared::version::VERSION.as_str());
            if let Some(k) = &key {
                r = r.header("Idempotency-Key", k);
            }
            if method != reqwest::Method::GET {
                r = r
                    .header("Content-Type", "application/x-www-form-urlencoded")
                    .body(rb.body.clone().unwrap_or_default());
            }
            let retry = attempt < self.retries && safe;
            let resp = match r.send().await {
                Ok(resp) => resp,
                Err(e) if retry => {
                    tracing::warn!(attempt, error = %e.without_url(), "stripe: network error, retrying with the same idempotency key");
                    tokio::time::sleep(delay).await;
                    delay = delay.saturating_mul(2);
                    attempt += 1;
                    continue;
                }
                Err(e) => return Err(StripeFailure::Transport(e.without_url().to_string())),
            };
            let status = resp.status().as_u16();
            let header = |n: &str| {
                resp.headers()
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let request_id = header("request-id");
            let should_retry = match header("stripe-should-retry").as_deref() {
                Some("true") => true,
                Some("false") => false,
                _ => matches!(status, 409 | 429 | 500..=504),
            };
            let body = match resp.bytes().await {
                Ok(b) => b,
                Err(e) if retry => {
                    tracing::warn!(attempt, error = %e.without_url(), "stripe: body lost, retrying with the same idempotency key");
                    tokio::time::sleep(delay).await;
                    delay = delay.saturating_mul(2);
                    attempt += 1;
                    continue;
                }
                Err(e) => return Err(StripeFailure::Transport(e.without_url().to_string())),
            };
            if (200..300).contains(&status) {
                return Ok(body);
            }
            if should_retry && retry {
                tracing::warn!(
                    attempt,
                    status,
                    request_id = request_id.as_deref().unwrap_or(""),
                    "stripe: retrying with the same idempotency key"
                );
                tokio::time::sleep(delay).await;
                delay = delay.saturating_mul(2);
                attempt += 1;
                continue;
            }
            return Err(match serde_json::from_slice::<ErrorBody>(&body) {
                Ok(b) => StripeFailure::Api(Box::new(ApiError {
                    status,
                    request_id,
                    kind: b.error.kind,
                    code: b.error.code,
                    decline_code: b.error.decline_code,
                    param: b.error.param,
                    message: b.error.message.unwrap_or_default(),
                })),
                Err(_) => StripeFailure::Api(Box::new(ApiError {
                    status,
                    request_id,
                    kind: "api_error".into(),
                    code: None,
                    decline_code: None,
                    param: None,
                    message: format!(
                        "HTTP {status} with a body that is not a Stripe error: {}",
                        String::from_utf8_lossy(
                            body.get(..body.len().min(200)).unwrap_or_default()
                        )
                    ),
                })),
            });
        }
    }
}
