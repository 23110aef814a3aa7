//! A remote facilitator of the AVM scheme over x402's facilitator HTTP API (`GET /supported`,
//! `POST /verify`, `POST /settle`; research `docs/research/x402-avm-2.0.2.md` §7.1): this
//! crate's [`super::server`], or one built with the x402-avm SDK.
//!
//! An answer that is not 200, or not the documented shape, is an unknown outcome for a
//! settlement (present the same payment again; it settles once), never a refusal.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;
use x402_transport::facilitator::FacilitatorRequest;

use super::facilitator::AvmError;
use super::wire::{Requirements, SettleResponse, Supported, VerifyResponse};
use crate::address::Address;

/// The most of a facilitator's answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// A facilitator at a URL.
#[derive(Clone, Debug)]
pub struct RemoteFacilitator {
    http: reqwest::Client,
    url: String,
}

impl RemoteFacilitator {
    /// The facilitator at `url` (its routes are `url` + `/supported`, `/verify`, `/settle`).
    ///
    /// # Errors
    /// A sentence if the HTTP client cannot be built.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let http = crate::algod::http_client(timeout).map_err(|e| e.to_string())?;
        Ok(RemoteFacilitator {
            http,
            url: url.trim_end_matches('/').to_owned(),
        })
    }

    /// Its URL.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    async fn read<T: DeserializeOwned>(resp: reqwest::Response) -> Result<T, AvmError> {
        let status = resp.status();
        if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
            return Err(AvmError::Unknown(
                "the facilitator's answer is too long".into(),
            ));
        }
        let body = resp
            .bytes()
            .await
            .map_err(|e| AvmError::Unknown(format!("the facilitator's answer: {e}")))?;
        if body.len() > MAX_ANSWER {
            return Err(AvmError::Unknown(
                "the facilitator's answer is too long".into(),
            ));
        }
        if !status.is_success() {
            return Err(AvmError::Unknown(format!(
                "the facilitator answered {status}: {}",
                String::from_utf8_lossy(&body)
                    .chars()
                    .take(200)
                    .collect::<String>()
            )));
        }
        serde_json::from_slice(&body).map_err(|e| {
            AvmError::Unknown(format!("the facilitator's answer is not its shape: {e}"))
        })
    }

    async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        envelope: &Value,
        req: &Requirements,
    ) -> Result<T, AvmError> {
        Self::send(
            self.http
                .post(format!("{}{path}", self.url))
                .json(&FacilitatorRequest {
                    x402_version: 2u8,
                    payment_payload: envelope,
                    payment_requirements: req,
                }),
        )
        .await
    }

    /// Sends `request` and reads the answer.
    async fn send<T: DeserializeOwned>(request: reqwest::RequestBuilder) -> Result<T, AvmError> {
        let resp = request.send().await.map_err(|e| {
            AvmError::Unknown(format!(
                "the facilitator did not answer: {}",
                e.without_url()
            ))
        })?;
        Self::read(resp).await
    }

    /// `GET /supported`.
    ///
    /// # Errors
    /// [`AvmError::Unknown`].
    pub async fn supported(&self) -> Result<Supported, AvmError> {
        Self::send(self.http.get(format!("{}/supported", self.url))).await
    }

    /// The fee payer it advertises for `network` (either spelling), if any.
    ///
    /// # Errors
    /// [`AvmError::Unknown`]; a fee payer that is not an address.
    pub async fn fee_payer(&self, network: &str) -> Result<Option<Address>, AvmError> {
        let s = self.supported().await?;
        let kind = s.kinds.iter().find(|k| {
            k.x402_version == 2 && k.scheme == "exact" && super::wire::same(&k.network, network)
        });
        let Some(kind) = kind else {
            return Err(AvmError::Unknown(format!(
                "the facilitator at {} does not settle exact on {network}",
                self.url
            )));
        };
        match kind
            .extra
            .as_ref()
            .and_then(|e| e.get("feePayer"))
            .and_then(Value::as_str)
        {
            None => Ok(None),
            Some(a) => a.parse().map(Some).map_err(|_| {
                AvmError::Unknown(format!(
                    "the facilitator's feePayer {a:?} is not an address"
                ))
            }),
        }
    }

    /// `POST /verify`.
    ///
    /// # Errors
    /// [`AvmError::Unknown`].
    pub async fn verify(
        &self,
        envelope: &Value,
        req: &Requirements,
    ) -> Result<VerifyResponse, AvmError> {
        self.post("/verify", envelope, req).await
    }

    /// `POST /settle`.
    ///
    /// # Errors
    /// [`AvmError::Unknown`].
    pub async fn settle(
        &self,
        envelope: &Value,
        req: &Requirements,
    ) -> Result<SettleResponse, AvmError> {
        self.post("/settle", envelope, req).await
    }
}
