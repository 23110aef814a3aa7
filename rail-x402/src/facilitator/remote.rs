//! [`RemoteFacilitator`]: a facilitator server reached over HTTP.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::HeaderValue;
use x402_transport::facilitator::{Remote, RemoteError};

use super::auth::FacilitatorAuth;
use super::{FacilitatorError, SupportedResponse, X402Facilitator};
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
    remote: Remote,
    auth: Option<Arc<dyn FacilitatorAuth>>,
}

impl std::fmt::Debug for RemoteFacilitator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteFacilitator")
            .field("base", &crate::rpc::redact_url(self.remote.base()))
            .field("auth", &self.auth)
            .finish_non_exhaustive()
    }
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
        let http = crate::rpc::http_client(timeout)
            .map_err(|e| FacilitatorError::Unavailable(e.to_string()))?;
        Ok(Self {
            remote: Remote::new(http, base),
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
        shown(self.remote.base())
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

    /// The `Authorization` for `method` on `path`, if this facilitator has credentials.
    fn authorization(
        &self,
        method: &str,
        path: &str,
    ) -> Result<Option<HeaderValue>, FacilitatorError> {
        let Some(auth) = &self.auth else {
            return Ok(None);
        };
        let value = auth
            .authorization(method, &self.remote.url_of(path))
            .map_err(|e| FacilitatorError::Unauthorized(e.to_string()))?;
        HeaderValue::from_str(&value).map(Some).map_err(|_| {
            FacilitatorError::Unauthorized(format!(
                "the credentials for the facilitator at {} cannot be sent in a header: {}",
                self.url(),
                auth.hint()
            ))
        })
    }

    /// The transport's failure as this crate's: a refusal of credentials is
    /// [`FacilitatorError::Unauthorized`] (one sentence); anything else is an unknown outcome.
    fn failure(&self, e: RemoteError) -> FacilitatorError {
        match e {
            RemoteError::Refused(status) => FacilitatorError::Unauthorized(self.refusal(status)),
            e => FacilitatorError::Unavailable(e.to_string()),
        }
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
}

#[async_trait]
impl X402Facilitator for RemoteFacilitator {
    async fn verify(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<VerifyResponse, FacilitatorError> {
        let auth = self.authorization("POST", "verify")?;
        self.remote
            .verify(payload, requirements, auth)
            .await
            .map_err(|e| self.failure(e))
    }

    async fn settle(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<SettleResponse, FacilitatorError> {
        let auth = self.authorization("POST", "settle")?;
        self.remote
            .settle(payload, requirements, auth)
            .await
            .map_err(|e| self.failure(e))
    }

    async fn supported(&self) -> Result<SupportedResponse, FacilitatorError> {
        let auth = self.authorization("GET", "supported")?;
        self.remote
            .supported(auth)
            .await
            .map_err(|e| self.failure(e))
    }
}
