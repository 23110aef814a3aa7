//! The facilitator API of [`LocalFacilitator`]: verify, the settle flow (the write-ahead
//! record, the broadcast, the receipt and what it means, recovering a dead settler's
//! transaction, an expired authorization) and supported. It sits above the rest of the local
//! facilitator: its state and checks (`local`), the nonce sequence and broadcast (`nonce`),
//! and following a transaction (`follow`).

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;

use super::book::{Entry, Sent, X402SettlementBook};
use super::follow::Recovered;
use super::local::LocalFacilitator;
use super::nonce::Broadcast;
use super::outcome::{already_settled, failed};
use super::{FacilitatorError, SupportedKind, SupportedResponse, X402Facilitator, rpc_down};
use crate::verify::{ChainView, VerifyError, reasons};
use crate::wire::{
    PaymentPayload, PaymentRequirements, SCHEME_EXACT, SettleResponse, VerifyResponse,
};

#[async_trait]
impl X402Facilitator for LocalFacilitator {
    async fn verify(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<VerifyResponse, FacilitatorError> {
        Ok(match self.check(payload, requirements, true).await? {
            Ok(ok) => VerifyResponse {
                is_valid: true,
                invalid_reason: None,
                invalid_message: None,
                payer: Some(ok.payer.to_string()),
            },
            Err(refused) => refused,
        })
    }

    async fn settle(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<SettleResponse, FacilitatorError> {
        // Offline checks first: nothing unsigned or mismatched reaches the book.
        let offline = match self.offline(payload, requirements).await? {
            Ok(ok) => ok,
            Err(VerifyError::ValidBeforeExpired { valid_before, .. }) => {
                // Expired now; but a settlement sent before it expired decides its fate.
                return self.expired(payload, requirements, valid_before).await;
            }
            Err(e) => return Ok(failed(payload, e.reason(), e.to_string(), None)),
        };
        let a = &offline.authorization;
        let key = X402SettlementBook::key(
            self.chain_id,
            offline.domain.verifying_contract,
            a.from,
            a.nonce,
        );
        let reservation = match self.book.open(&key).await? {
            Entry::Fresh(r) => r,
            Entry::Settled(tx) | Entry::Submitted(tx) => {
                return self
                    .follow(payload, &offline, tx)
                    .await
                    .map(already_settled);
            }
            Entry::Recover(settling, tx, sent) => {
                // The settler that wrote this transaction ahead is gone: follow it (sending it
                // again if the node lost it), and keep the record until the chain has decided.
                let found = settling
                    .keep_alive(self.recover(payload, &offline, tx, &sent))
                    .await;
                let (ended, answer) = match found {
                    Ok(Recovered::Answer(a)) if a.success => (
                        settling.settled(&format!("{tx:#x}"), Sent::default()).await,
                        Ok(a),
                    ),
                    // Mined and refused: this transaction moved nothing.
                    Ok(Recovered::Answer(a)) => (settling.failed().await, Ok(a)),
                    // Can never be mined: the record goes, the next settle starts afresh.
                    Ok(Recovered::NeverMined) => (
                        settling.failed().await,
                        Err(FacilitatorError::InProgress {
                            retry_after: Duration::ZERO,
                        }),
                    ),
                    Err(e) => (settling.unknown().await, Err(e)),
                };
                if let Err(e) = ended {
                    tracing::warn!(tx = %tx, error = %e, "x402: could not record a recovered settlement");
                }
                return answer.map(already_settled);
            }
            Entry::Busy => {
                return Err(FacilitatorError::InProgress {
                    retry_after: Duration::from_secs(1),
                });
            }
        };
        // As the reference settles (`simulateInSettle: false`): signature, window, balance and
        // nonce are checked again, the transaction itself is the simulation (a revert is
        // judged, and followed if someone else used the authorization).
        let ok = match self.check(payload, requirements, false).await {
            Ok(Ok(ok)) => ok,
            Ok(Err(refused)) => {
                let _ = reservation.failed().await;
                let reason = refused
                    .invalid_reason
                    .unwrap_or_else(|| reasons::TRANSACTION_FAILED.into());
                // A used nonce: perhaps by an earlier settler of ours whose record lapsed.
                if reason == reasons::NONCE_ALREADY_USED
                    && let Some(tx) = self
                        .rpc
                        .authorization_used_tx(
                            offline.domain.verifying_contract,
                            a.from,
                            a.nonce,
                            self.config.log_lookback_blocks,
                        )
                        .await
                        .map_err(|e| rpc_down(&e))?
                {
                    return self
                        .follow_other(payload, &offline, tx)
                        .await
                        .map(already_settled);
                }
                return Ok(failed(
                    payload,
                    &reason,
                    refused.invalid_message.unwrap_or_default(),
                    None,
                ));
            }
            Err(e) => {
                let _ = reservation.failed().await;
                return Err(e);
            }
        };
        let hash = match self.broadcast(&ok, &reservation).await {
            Broadcast::Sent(hash) => hash,
            Broadcast::Refused(refusal) => {
                let _ = reservation.failed().await;
                return Ok(failed(payload, reasons::TRANSACTION_FAILED, refusal, None));
            }
            Broadcast::NotSent(e) => {
                let _ = reservation.failed().await;
                return Err(e);
            }
            // Unknown: the write-ahead record stays; a retry follows the recorded hash.
            Broadcast::Unknown(e) => {
                let _ = reservation.unknown().await;
                return Err(e);
            }
        };
        tracing::info!(tx = %hash, payer = %ok.payer, "settlement broadcast");
        let receipt = match reservation.keep_alive(self.wait(hash)).await {
            Ok(r) => r,
            Err(e) => {
                // Broadcast, not mined in time: unknown, not a failure (the reference's
                // `settlement_pending`). The record stays; a retry follows this transaction.
                // The transaction may be stuck: the next settle re-reads the account nonce.
                tracing::warn!(tx = %hash, error = %e, "no receipt yet");
                {
                    let mut state = self.nonce.lock().await;
                    state.next = None;
                    state.fees = None;
                }
                let _ = reservation.unknown().await;
                return Err(FacilitatorError::InProgress {
                    retry_after: Duration::from_secs(5),
                });
            }
        };
        let answer = self.judge(payload, &ok, &receipt).await;
        if answer.success {
            if let Err(e) = reservation
                .settled(&format!("{hash:#x}"), Sent::default())
                .await
            {
                // Settled on chain: the answer stands; a later settle recovers the record.
                tracing::error!(tx = %hash, error = %e, "x402: settled, but could not record it");
            }
            return Ok(answer);
        }
        if !receipt.success {
            // Reverted. Perhaps because the authorization was used by another transaction
            // (someone submitted it from the mempool first): then the money moved, to payTo.
            let a = &ok.authorization;
            let token = ok.domain.verifying_contract;
            let used = self
                .rpc
                .authorization_state(token, a.from, a.nonce)
                .await
                .map_err(|e| rpc_down(&e))?;
            if used {
                let other = self
                    .rpc
                    .authorization_used_tx(token, a.from, a.nonce, self.config.log_lookback_blocks)
                    .await
                    .map_err(|e| rpc_down(&e))?;
                let _ = reservation.failed().await;
                return match other {
                    Some(tx) => self
                        .follow_other(payload, &ok, tx)
                        .await
                        .map(already_settled),
                    None => Ok(failed(
                        payload,
                        reasons::NONCE_ALREADY_USED,
                        "the authorization was used or cancelled by another transaction".into(),
                        None,
                    )),
                };
            }
            // Reverted and unused: the payer may present it again.
            let _ = reservation.failed().await;
        }
        // A success without the Transfer log keeps its record: it is never sent again.
        Ok(answer)
    }

    async fn supported(&self) -> Result<SupportedResponse, FacilitatorError> {
        Ok(SupportedResponse {
            kinds: vec![SupportedKind {
                x402_version: 2,
                scheme: SCHEME_EXACT.into(),
                network: self.network.clone(),
                extra: None,
            }],
            extensions: vec![],
            signers: BTreeMap::from([(
                "eip155:*".to_owned(),
                vec![self.address().to_checksum(None)],
            )]),
        })
    }
}
