//! Reading and making outcomes: the answers a facilitator builds (refused, failed, settled,
//! already settled), and what a settle answer means for whoever serves the paid content
//! ([`settled_transaction`], [`as_settled`], [`SettleOutcome`], [`settle_for_serving`]).

use std::sync::Arc;

use alloy_primitives::B256;

use super::{FacilitatorError, X402Facilitator};
use crate::verify::reasons;
use crate::wire::{PaymentPayload, PaymentRequirements, SettleResponse, VerifyResponse};

pub(super) fn invalid(payload: &PaymentPayload, reason: &str, message: String) -> VerifyResponse {
    VerifyResponse {
        is_valid: false,
        invalid_reason: Some(reason.to_owned()),
        invalid_message: Some(message),
        payer: Some(payload.payload.authorization.from.to_string()),
    }
}

pub(super) fn failed(
    payload: &PaymentPayload,
    reason: &str,
    message: String,
    tx: Option<B256>,
) -> SettleResponse {
    SettleResponse {
        success: false,
        error_reason: Some(reason.to_owned()),
        error_message: Some(message),
        transaction: tx.map(|t| t.to_string()).unwrap_or_default(),
        network: payload.accepted.network.clone(),
        payer: Some(payload.payload.authorization.from.to_string()),
    }
}

pub(super) fn settled(payload: &PaymentPayload, tx: B256) -> SettleResponse {
    SettleResponse {
        success: true,
        error_reason: None,
        error_message: None,
        transaction: tx.to_string(),
        network: payload.accepted.network.clone(),
        payer: Some(payload.payload.authorization.from.to_string()),
    }
}

/// A second settle of an authorization that is already settled is **not** a success: a
/// resource server that trusts `/settle` alone must not serve one payment twice (the
/// reference facilitator answers `invalid_exact_evm_nonce_already_used` too). The answer
/// names the transaction that settled it, so a caller that lost the first answer and keeps its
/// own served-once record can recover ([`settled_transaction`]).
pub(super) fn already_settled(mut answer: SettleResponse) -> SettleResponse {
    if answer.success {
        answer.success = false;
        answer.error_reason = Some(reasons::NONCE_ALREADY_USED.to_owned());
        answer.error_message = Some(format!("already settled by {}", answer.transaction));
    }
    answer
}

/// The transaction that settled a payment, from a settle answer: a success, or an
/// "already settled" refusal that names its transaction ([`LocalFacilitator`] does; the
/// reference facilitator answers a replay with no transaction). Use the second form only
/// behind a served-once record of your own, as the paywalls of this crate do: it is how a
/// payment whose first answer was lost (a crash between settling and serving) is served once.
///
/// [`LocalFacilitator`]: super::LocalFacilitator
#[must_use]
pub fn settled_transaction(answer: &SettleResponse) -> Option<&str> {
    if answer.success && !answer.transaction.is_empty() {
        return Some(&answer.transaction);
    }
    let recovered = answer.error_reason.as_deref() == Some(reasons::NONCE_ALREADY_USED)
        && answer.transaction.starts_with("0x")
        && answer.transaction.len() == 66;
    recovered.then_some(answer.transaction.as_str())
}

/// `answer` as the success it stands for, when [`settled_transaction`] finds one.
#[must_use]
pub fn as_settled(answer: &SettleResponse) -> Option<SettleResponse> {
    settled_transaction(answer).map(|tx| SettleResponse {
        success: true,
        error_reason: None,
        error_message: None,
        transaction: tx.to_owned(),
        network: answer.network.clone(),
        payer: answer.payer.clone(),
    })
}

/// `facilitator.settle(..)` on its own task: a caller that goes away (an HTTP client that
/// disconnected, a timed-out request whose future is dropped) cannot cut a settlement short
/// between broadcasting and recording it. The answer is awaited as usual.
///
/// # Errors
/// The settlement's, or [`FacilitatorError::Unavailable`] if its task died.
pub async fn settle_detached(
    facilitator: &Arc<dyn X402Facilitator>,
    payload: &PaymentPayload,
    requirements: &PaymentRequirements,
) -> Result<SettleResponse, FacilitatorError> {
    let (f, p, r) = (facilitator.clone(), payload.clone(), requirements.clone());
    tokio::spawn(async move { f.settle(&p, &r).await })
        .await
        .map_err(|e| FacilitatorError::Unavailable(format!("settlement task: {e}")))?
}

/// What a settle call means for whoever serves the paid content.
#[derive(Debug)]
pub enum SettleOutcome {
    /// Paid: settled now, or earlier by a settlement whose answer was lost (serve it only
    /// under your own served-once record; see [`settled_transaction`]). Always `success: true`.
    Settled(SettleResponse),
    /// Refused: nothing moved; the reason is [`SettleOutcome::reason`].
    Refused(SettleResponse),
    /// Nobody knows yet (no answer, or broadcast but not mined): serve nothing, and let the
    /// payer present the same payment again.
    Unknown(String),
}

impl SettleOutcome {
    /// The refusal's reason code (`invalid_exact_evm_transaction_failed` if none was given).
    #[must_use]
    pub fn reason(refused: &SettleResponse) -> &str {
        refused
            .error_reason
            .as_deref()
            .unwrap_or(reasons::TRANSACTION_FAILED)
    }
}

/// Settles through `facilitator` ([`settle_detached`]) and reads the answer for serving:
/// the one place that decides what "paid", "refused" and "unknown" are.
pub async fn settle_for_serving(
    facilitator: &Arc<dyn X402Facilitator>,
    payload: &PaymentPayload,
    requirements: &PaymentRequirements,
) -> SettleOutcome {
    match settle_detached(facilitator, payload, requirements).await {
        Ok(s) => match as_settled(&s) {
            Some(paid) => SettleOutcome::Settled(paid),
            None if s.error_reason.as_deref() == Some(reasons::SETTLEMENT_PENDING) => {
                SettleOutcome::Unknown("settlement pending".into())
            }
            None => {
                tracing::info!(
                    reason = SettleOutcome::reason(&s),
                    "x402: settlement refused"
                );
                SettleOutcome::Refused(s)
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "x402: settlement outcome unknown");
            SettleOutcome::Unknown(e.to_string())
        }
    }
}
