//! Facilitators: who checks a payment against the chain and settles it.
//!
//! [`X402Facilitator`] is the x402 facilitator API (`POST /verify`, `POST /settle`,
//! `GET /supported`) as a trait, with two implementations:
//! - [`LocalFacilitator`] verifies on chain through JSON-RPC and settles by sending
//!   `transferWithAuthorization` from its own key, with one nonce sequence shared by concurrent
//!   settles and a write-ahead settlement record per authorization ([`X402SettlementBook`]).
//! - [`RemoteFacilitator`] calls a facilitator server over HTTP (ours,
//!   [`crate::server`], or the reference one), with credentials ([`auth`]: a [`Bearer`] token,
//!   or a Coinbase Developer Platform API key, [`CdpAuth`]) where the facilitator requires them.
//!
//! Outcomes are three-valued: a [`SettleResponse`] with `success: true` (money moved, the
//! transaction is known), one with `success: false` (nothing moved: the payer may try again),
//! or a [`FacilitatorError`] (no usable answer: the outcome is **unknown**, nothing may be
//! served, and the same payment must be retried, never a new one).

use std::time::Duration;

use async_trait::async_trait;

use crate::rpc::RpcError;
use crate::wire::{PaymentPayload, PaymentRequirements, SettleResponse, VerifyResponse};

// One concern per file; everything public is re-exported below at its old path.
pub mod auth; // credentials for a facilitator that requires them (Bearer, CDP API keys)
mod book; // the write-ahead settlement record
mod follow; // LocalFacilitator: receipts, recovery, expired authorizations
mod local; // LocalFacilitator, SettleConfig: its state and checks
mod nonce; // LocalFacilitator: the nonce sequence and the broadcast
mod outcome; // building and reading answers, settle_for_serving
mod remote; // RemoteFacilitator (HTTP)
mod settle; // X402Facilitator for LocalFacilitator: verify, the settle flow, supported

pub use auth::{AuthError, Bearer, CdpAuth, FacilitatorAuth};
pub use book::{SETTLE_LEASE, SETTLED_RETENTION, X402SettlementBook};
pub use local::{LocalFacilitator, SettleConfig};
pub use outcome::{
    SettleOutcome, as_settled, settle_detached, settle_for_serving, settled_transaction,
};
pub use remote::RemoteFacilitator;

/// One `(x402Version, scheme, network)` a facilitator handles: the transport's.
pub use x402_transport::facilitator::SupportedKind;

/// `GET /supported` (`@x402/core` `SupportedResponse`): the transport's.
pub use x402_transport::facilitator::Supported as SupportedResponse;

/// The body of `POST /verify` and `POST /settle`, of this scheme's types: the transport's.
pub type FacilitatorRequest =
    x402_transport::facilitator::FacilitatorRequest<PaymentPayload, PaymentRequirements>;

/// No usable answer from a facilitator: the outcome is unknown.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum FacilitatorError {
    /// Not reached, timed out, or a 5xx / non-JSON / truncated answer.
    #[error("facilitator unavailable: {0}")]
    Unavailable(String),
    /// A settlement of this very authorization is in flight: retry the same payment later.
    #[error("settlement in progress; retry the same payment in {retry_after:?}")]
    InProgress {
        /// When to retry.
        retry_after: Duration,
    },
    /// The settlement store failed.
    #[error("settlement store: {0}")]
    Store(String),
    /// The facilitator refused our credentials (401, 403), wants some we do not have, or none
    /// could be made: nothing was verified or settled, and no retry helps until the operator
    /// fixes the configuration. The message is one sentence saying which credentials to check.
    #[error("{0}")]
    Unauthorized(String),
}

impl FacilitatorError {
    /// Whether the same call may succeed later as it is: every error but
    /// [`FacilitatorError::Unauthorized`] (which needs the operator first).
    #[must_use]
    pub const fn is_retryable(&self) -> bool {
        !matches!(self, FacilitatorError::Unauthorized(_))
    }
}

/// The x402 facilitator API.
#[async_trait]
pub trait X402Facilitator: Send + Sync + std::fmt::Debug {
    /// Checks a payment (signature, window, amount, balance, nonce, simulation); moves nothing.
    ///
    /// # Errors
    /// [`FacilitatorError`] if no answer could be had.
    async fn verify(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<VerifyResponse, FacilitatorError>;

    /// Verifies again, then settles on chain and waits for the receipt. Settling the same
    /// authorization twice answers the first settlement's transaction (never a second one).
    ///
    /// # Errors
    /// [`FacilitatorError`]: the outcome is unknown.
    async fn settle(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<SettleResponse, FacilitatorError>;

    /// What this facilitator handles.
    ///
    /// # Errors
    /// [`FacilitatorError`].
    async fn supported(&self) -> Result<SupportedResponse, FacilitatorError>;
}

impl From<&FacilitatorError> for x402_transport::facilitator::Unavailable {
    fn from(e: &FacilitatorError) -> Self {
        let mut u = x402_transport::facilitator::Unavailable::new(e.to_string());
        if let FacilitatorError::InProgress { retry_after } = e {
            u.retry_after = *retry_after;
        }
        u
    }
}

/// Any facilitator of this scheme, served by the transport's routes
/// ([`x402_transport::facilitator::router`]).
#[async_trait]
impl x402_transport::facilitator::Facilitator for dyn X402Facilitator {
    type Payload = PaymentPayload;
    type Requirements = PaymentRequirements;

    async fn verify(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<VerifyResponse, x402_transport::facilitator::Unavailable> {
        X402Facilitator::verify(self, payload, requirements)
            .await
            .map_err(|e| (&e).into())
    }

    async fn settle(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<SettleResponse, x402_transport::facilitator::Unavailable> {
        X402Facilitator::settle(self, payload, requirements)
            .await
            .map_err(|e| (&e).into())
    }

    async fn supported(
        &self,
    ) -> Result<SupportedResponse, x402_transport::facilitator::Unavailable> {
        X402Facilitator::supported(self)
            .await
            .map_err(|e| (&e).into())
    }
}

fn rpc_down(e: &RpcError) -> FacilitatorError {
    FacilitatorError::Unavailable(e.to_string())
}
