//! The x402 facilitator protocol, written once for every scheme (EVM's `exact`, Algorand's
//! `exact` on AVM): its messages — the body of `POST /verify` and `POST /settle`
//! ([`FacilitatorRequest`]), the answers of `/verify` ([`VerifyResponse`]), `/settle`
//! ([`SettleResponse`]) and `GET /supported` ([`Supported`]) — the small trait a scheme's
//! facilitator implements ([`Facilitator`]), its HTTP routes ([`router`], feature `paywall`)
//! and the client of a facilitator at a URL ([`Remote`]). A scheme plugs in its own payload and
//! requirements types.
//!
//! On the wire (the x402 v2 facilitator API, as `@x402/core`'s `HTTPFacilitatorClient` and the
//! Python SDK's read it): a refused payment is a **200** with `isValid: false` or
//! `success: false` and the reason; a body that cannot be read is a **400** of the same shape
//! with `invalid_payload`; an outcome nobody knows yet is a **503** with `Retry-After` and
//! `{"error": "facilitator_unavailable", "message": …}` — no `isValid` or `success`, so no
//! client mistakes it for an answer (`@x402/core` reads a non-2xx body carrying `success` as a
//! settlement's refusal).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

mod remote;
#[cfg(feature = "paywall")]
mod server;

pub use remote::{MAX_ANSWER, Remote, RemoteError};
#[cfg(feature = "paywall")]
pub use server::{MAX_BODY, router};

/// The reason code of an answer nobody knows yet (a 503).
pub const UNAVAILABLE: &str = "facilitator_unavailable";
/// The reason code of a request body that cannot be read (a 400).
pub const INVALID_PAYLOAD: &str = "invalid_payload";

/// `POST /verify` and `POST /settle` bodies: the payment and what the receiver requires, of
/// the scheme's own types (`P`, `R`; borrowed ones serialize the same). `V` is how the
/// version is read: `u8` requires it, `Option<u8>` lets it be absent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FacilitatorRequest<P, R, V = u8> {
    /// The payload's version (2).
    pub x402_version: V,
    /// The payment.
    pub payment_payload: P,
    /// What the receiver requires.
    pub payment_requirements: R,
}

/// The answer of `POST /verify` (`VerifyResponse`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyResponse {
    /// Whether the payment is valid.
    pub is_valid: bool,
    /// Why not: a reason code (e.g. `invalid_exact_evm_signature`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_reason: Option<String>,
    /// Why not: free-text detail (reference SDK field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_message: Option<String>,
    /// Who pays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payer: Option<String>,
}

/// The answer of `POST /settle` (`SettleResponse`; also the `PAYMENT-RESPONSE` JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettleResponse {
    /// Whether settlement succeeded.
    pub success: bool,
    /// Reason code when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    /// Free-text detail when it did not (reference SDK field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_message: Option<String>,
    /// The settling transaction, `""` when settlement failed (the specification's own failure
    /// example omits it).
    #[serde(default)]
    pub transaction: String,
    /// The network, as the payment named it.
    pub network: String,
    /// Who paid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payer: Option<String>,
}

impl SettleResponse {
    /// The `PAYMENT-RESPONSE` header value.
    ///
    /// # Errors
    /// [`crate::wire::HeaderError::Encode`] if serialization fails.
    pub fn to_header(&self) -> Result<String, crate::wire::HeaderError> {
        crate::wire::encode_header(self)
    }

    /// Reads a `PAYMENT-RESPONSE` header value.
    ///
    /// # Errors
    /// Any [`crate::wire::HeaderError`].
    pub fn from_header(header: &str) -> Result<Self, crate::wire::HeaderError> {
        crate::wire::decode_header(header, None)
    }
}

/// One `(x402Version, scheme, network)` a facilitator settles.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SupportedKind {
    /// The protocol version (2).
    pub x402_version: u8,
    /// The scheme (`exact`).
    pub scheme: String,
    /// The network (CAIP-2, or a scheme's own spelling).
    pub network: String,
    /// The scheme's extra (`{"feePayer": …}` on Algorand when the facilitator pays fees).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Value>,
}

/// The answer of `GET /supported` (`@x402/core` `SupportedResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Supported {
    /// What is settled.
    pub kinds: Vec<SupportedKind>,
    /// Extension names.
    #[serde(default)]
    pub extensions: Vec<String>,
    /// Settling addresses per network family (`"eip155:*"`, `"algorand:*"`).
    #[serde(default)]
    pub signers: BTreeMap<String, Vec<String>>,
}

/// No answer a facilitator can give now: the outcome is unknown (a settlement may yet happen;
/// present the same payment again). Served as a 503 with `Retry-After`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Unavailable {
    /// Why, in one sentence.
    pub message: String,
    /// When to ask again.
    pub retry_after: Duration,
}

impl Unavailable {
    /// Unavailable for `message`, to be asked again in 2 s.
    #[must_use]
    pub fn new(message: impl Into<String>) -> Self {
        Unavailable {
            message: message.into(),
            retry_after: Duration::from_secs(2),
        }
    }
}

/// A scheme's facilitator: what the protocol's routes ([`router`]) serve. A refused payment is
/// an answer (`Ok` with `isValid`/`success` false and the reason); `Err` is an outcome nobody
/// knows yet.
#[async_trait]
pub trait Facilitator: Send + Sync + 'static {
    /// The scheme's payment payload (`paymentPayload`).
    type Payload: DeserializeOwned + Send + Sync + 'static;
    /// The scheme's requirements (`paymentRequirements`).
    type Requirements: DeserializeOwned + Send + Sync + 'static;
    /// Whether a request without `x402Version` is refused (a 400); when `false` it is read as
    /// version 2 (the x402-avm SDK's client may leave it out).
    const VERSION_REQUIRED: bool = true;

    /// Checks a payment; moves nothing.
    ///
    /// # Errors
    /// [`Unavailable`].
    async fn verify(
        &self,
        payload: &Self::Payload,
        requirements: &Self::Requirements,
    ) -> Result<VerifyResponse, Unavailable>;

    /// Verifies again and settles. Settling the same payment twice answers the first
    /// settlement (never a second one). The routes run it detached from the request: a client
    /// that goes away does not cut a settlement short.
    ///
    /// # Errors
    /// [`Unavailable`]: the outcome is unknown.
    async fn settle(
        &self,
        payload: &Self::Payload,
        requirements: &Self::Requirements,
    ) -> Result<SettleResponse, Unavailable>;

    /// What this facilitator settles.
    ///
    /// # Errors
    /// [`Unavailable`].
    async fn supported(&self) -> Result<Supported, Unavailable>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_read_as_an_option_may_be_absent_a_required_one_may_not() {
        let body = r#"{"paymentPayload":1,"paymentRequirements":2}"#;
        let r: FacilitatorRequest<u8, u8, Option<u8>> = serde_json::from_str(body).unwrap();
        assert_eq!(r.x402_version, None);
        assert!(serde_json::from_str::<FacilitatorRequest<u8, u8>>(body).is_err());
        let r = FacilitatorRequest {
            x402_version: 2u8,
            payment_payload: &1u8,
            payment_requirements: &2u8,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"x402Version":2,"paymentPayload":1,"paymentRequirements":2}"#
        );
    }
}
