//! [`RemoteFacilitator`]: a facilitator server reached over HTTP.

use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;

use super::{FacilitatorError, FacilitatorRequest, SupportedResponse, X402Facilitator};
use crate::wire::{PaymentPayload, PaymentRequirements, SettleResponse, VerifyResponse};

/// A facilitator server reached over HTTP (`X402_FACILITATOR_URL`).
///
/// Every answer that is not a well-formed 200 JSON body of the right shape is
/// [`FacilitatorError::Unavailable`]: a timeout, an HTML 502, a 503 (even with a
/// `success:true` body), a truncated body. A 200 with `success:false` is a failed settlement.
#[derive(Clone)]
pub struct RemoteFacilitator {
    http: reqwest::Client,
    base: String,
}

impl std::fmt::Debug for RemoteFacilitator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteFacilitator")
            .field("base", &crate::rpc::redact_url(&self.base))
            .finish_non_exhaustive()
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
        })
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

    async fn send<T: for<'de> Deserialize<'de>>(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T, FacilitatorError> {
        let resp = req
            .send()
            .await
            .map_err(|e| FacilitatorError::Unavailable(format!("{what}: {}", e.without_url())))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| FacilitatorError::Unavailable(format!("{what}: {}", e.without_url())))?;
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
        let req = self
            .http
            .post(format!("{}/verify", self.base))
            .json(&Self::body(payload, requirements));
        self.send(req, "verify").await
    }

    async fn settle(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<SettleResponse, FacilitatorError> {
        let req = self
            .http
            .post(format!("{}/settle", self.base))
            .json(&Self::body(payload, requirements));
        let answer: SettleResponse = self.send(req, "settle").await?;
        if answer.success && answer.transaction.is_empty() {
            return Err(FacilitatorError::Unavailable(
                "settle: success without a transaction".into(),
            ));
        }
        Ok(answer)
    }

    async fn supported(&self) -> Result<SupportedResponse, FacilitatorError> {
        let req = self.http.get(format!("{}/supported", self.base));
        self.send(req, "supported").await
    }
}
