//! A remote facilitator of the AVM scheme over x402's facilitator HTTP API (`GET /supported`,
//! `POST /verify`, `POST /settle`; research `docs/research/x402-avm-2.0.2.md` §7.1): this
//! crate's [`super::server`], or one built with the x402-avm SDK.
//!
//! The client is the transport's ([`x402_transport::facilitator::Remote`], the same for every
//! scheme): an answer that is not a 200 (or a 400 of the same shape), or not the documented
//! shape, is an unknown outcome for a settlement (present the same payment again; it settles
//! once), never a refusal.

use std::time::Duration;

use serde_json::Value;
use x402_transport::facilitator::Remote;

use super::facilitator::AvmError;
use super::wire::{Requirements, SettleResponse, Supported, VerifyResponse};
use crate::address::Address;

/// A facilitator at a URL: the transport's client ([`Remote`]) with this scheme's types.
#[derive(Clone, Debug)]
pub struct RemoteFacilitator {
    remote: Remote,
}

/// Every failure to get an answer is an unknown outcome for a settlement.
#[allow(clippy::needless_pass_by_value)] // a `map_err` argument
fn unknown(e: x402_transport::facilitator::RemoteError) -> AvmError {
    AvmError::Unknown(format!("the facilitator did not answer: {e}"))
}

impl RemoteFacilitator {
    /// The facilitator at `url` (its routes are `url` + `/supported`, `/verify`, `/settle`).
    ///
    /// # Errors
    /// A sentence if the HTTP client cannot be built.
    pub fn new(url: &str, timeout: Duration) -> Result<Self, String> {
        let http = crate::algod::http_client(timeout).map_err(|e| e.to_string())?;
        Ok(RemoteFacilitator {
            remote: Remote::new(http, url),
        })
    }

    /// Its URL.
    #[must_use]
    pub fn url(&self) -> &str {
        self.remote.base()
    }

    /// `GET /supported`.
    ///
    /// # Errors
    /// [`AvmError::Unknown`].
    pub async fn supported(&self) -> Result<Supported, AvmError> {
        self.remote.supported(None).await.map_err(unknown)
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
                self.url()
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
        self.remote
            .verify(envelope, req, None)
            .await
            .map_err(unknown)
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
        self.remote
            .settle(envelope, req, None)
            .await
            .map_err(unknown)
    }
}
