//! [`RemoteFacilitator`]: a facilitator server reached over HTTP.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::Method;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde::Deserialize;

use super::auth::FacilitatorAuth;
use super::{FacilitatorError, FacilitatorRequest, SupportedResponse, X402Facilitator};
use crate::wire::{PaymentPayload, PaymentRequirements, SettleResponse, VerifyResponse};

/// A facilitator server reached over HTTP (`X402_FACILITATOR_URL`).
///
/// Every answer that is not a well-formed 200 JSON body of the right shape is
/// [`FacilitatorError::Unavailable`]: a timeout, an HTML 502, a 503 (even with a
/// `success:true` body), a truncated body. A 200 with `success:false` is a failed settlement.
/// A 401 or 403 is [`FacilitatorError::Unauthorized`]: the facilitator refused our credentials
/// (or wants some), nothing was verified or settled, and no retry helps until they are fixed.
///
/// With [`RemoteFacilitator::with_auth`], every call (`verify`, `settle`, `supported`) carries
/// an `Authorization` header made for that one request; the header is marked sensitive and is
/// never logged.
#[derive(Clone)]
pub struct RemoteFacilitator {
    http: reqwest::Client,
    base: String,
    auth: Option<Arc<dyn FacilitatorAuth>>,
}

impl std::fmt::Debug for RemoteFacilitator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteFacilitator")
            .field("base", &crate::rpc::redact_url(&self.base))
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
}

/// No answer to the call `what`: reqwest's error without its URL, and its innermost cause
/// (`supported: error sending request (Connection refused (os error 111))`).
fn unanswered(what: &str, e: reqwest::Error) -> FacilitatorError {
    let e = e.without_url();
    let mut cause = None;
    let mut next = std::error::Error::source(&e);
    while let Some(c) = next {
        cause = Some(c.to_string());
        next = c.source();
    }
    FacilitatorError::Unavailable(match cause {
        Some(c) => format!("{what}: {e} ({c})"),
        None => format!("{what}: {e}"),
    })
}

/// `url` as messages show it: without credentials, query or fragment (the path stays: a
/// facilitator's URL is written in configuration files, not kept as a secret).
fn shown(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_username("");
            let _ = u.set_password(None);
            u.set_query(None);
            u.set_fragment(None);
            u.as_str().trim_end_matches('/').to_owned()
        }
        Err(_) => crate::rpc::redact_url(url),
    }
}

impl RemoteFacilitator {
    /// A client for the facilitator at `base` (`http://127.0.0.1:4021`), `timeout` per call.
    ///
    /// # Errors
    /// [`FacilitatorError::Unavailable`] if the HTTP client cannot be built.
    pub fn new(base: &str, timeout: Duration) -> Result<Self, FacilitatorError> {
        Ok(Self {
            http: crate::rpc::http_client(timeout)
                .map_err(|e| FacilitatorError::Unavailable(e.to_string()))?,
            base: base.trim_end_matches('/').to_owned(),
            auth: None,
        })
    }

    /// Sends `auth`'s `Authorization` header with every call (`verify`, `settle`,
    /// `supported`), made afresh for each request's method and URL.
    #[must_use]
    pub fn with_auth(mut self, auth: Arc<dyn FacilitatorAuth>) -> Self {
        self.auth = Some(auth);
        self
    }

    /// The facilitator's base URL as messages show it (no credentials, no query).
    #[must_use]
    pub fn url(&self) -> String {
        shown(&self.base)
    }

    /// From `X402_FACILITATOR_URL`.
    ///
    /// # Errors
    /// [`FacilitatorError::Unavailable`] if the variable is not set.
    pub fn from_env(timeout: Duration) -> Result<Self, FacilitatorError> {
        let url = std::env::var("X402_FACILITATOR_URL")
            .map_err(|_| FacilitatorError::Unavailable("X402_FACILITATOR_URL is not set".into()))?;
        Self::new(&url, timeout)
    }

    /// `method` on `{base}/{path}` (with `body` as JSON, if any), with this facilitator's
    /// credentials, its answer decoded as `T`.
    async fn call<T: for<'de> Deserialize<'de>>(
        &self,
        method: Method,
        path: &str,
        body: Option<&FacilitatorRequest>,
    ) -> Result<T, FacilitatorError> {
        let url = format!("{}/{path}", self.base);
        let mut req = self.http.request(method.clone(), &url);
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(auth) = &self.auth {
            let value = auth
                .authorization(method.as_str(), &url)
                .map_err(|e| FacilitatorError::Unauthorized(e.to_string()))?;
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                FacilitatorError::Unauthorized(format!(
                    "the credentials for the facilitator at {} cannot be sent in a header: {}",
                    self.url(),
                    auth.hint()
                ))
            })?;
            value.set_sensitive(true);
            req = req.header(AUTHORIZATION, value);
        }
        self.send(req, path).await
    }

    async fn send<T: for<'de> Deserialize<'de>>(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T, FacilitatorError> {
        let resp = req.send().await.map_err(|e| unanswered(what, e))?;
        let status = resp.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Err(FacilitatorError::Unauthorized(self.refusal(status)));
        }
        let body = resp.bytes().await.map_err(|e| unanswered(what, e))?;
        // The reference facilitator answers a refused verify/settle with 200 (or 400 with the
        // same body, for an invalid request); anything else is not an answer.
        if !(status.is_success() || status == reqwest::StatusCode::BAD_REQUEST) {
            return Err(FacilitatorError::Unavailable(format!(
                "{what}: http {status}"
            )));
        }
        serde_json::from_slice(&body).map_err(|e| {
            FacilitatorError::Unavailable(format!(
                "{what}: http {status}, body not understood: {e}"
            ))
        })
    }

    /// The one sentence for a 401 or 403.
    fn refusal(&self, status: reqwest::StatusCode) -> String {
        let url = self.url();
        match &self.auth {
            Some(auth) => {
                tracing::warn!(facilitator = %url, %status, "the facilitator refused our credentials");
                format!(
                    "the facilitator at {url} refused our credentials ({status}): {}",
                    auth.hint()
                )
            }
            None => {
                tracing::warn!(facilitator = %url, %status, "the facilitator requires credentials");
                format!(
                    "the facilitator at {url} refused a request without credentials ({status}): configure its credentials (facilitator_auth = \"cdp\" or \"bearer\")"
                )
            }
        }
    }

    fn body(payload: &PaymentPayload, requirements: &PaymentRequirements) -> FacilitatorRequest {
        FacilitatorRequest {
            x402_version: 2,
            payment_payload: payload.clone(),
            payment_requirements: requirements.clone(),
        }
    }
}

#[async_trait]
impl X402Facilitator for RemoteFacilitator {
    async fn verify(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<VerifyResponse, FacilitatorError> {
        self.call(
            Method::POST,
            "verify",
            Some(&Self::body(payload, requirements)),
        )
        .await
    }

    async fn settle(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<SettleResponse, FacilitatorError> {
        let answer: SettleResponse = self
            .call(
                Method::POST,
                "settle",
                Some(&Self::body(payload, requirements)),
            )
            .await?;
        if answer.success && answer.transaction.is_empty() {
            return Err(FacilitatorError::Unavailable(
                "settle: success without a transaction".into(),
            ));
        }
        Ok(answer)
    }

    async fn supported(&self) -> Result<SupportedResponse, FacilitatorError> {
        self.call(Method::GET, "supported", None).await
    }
}
