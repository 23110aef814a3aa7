//! Following a settling transaction to its outcome: its receipt at the configured depth and
//! what it means, a recorded transaction of a settler that died, and an expired authorization
//! that was perhaps settled before it expired.

use std::time::{Duration, Instant};

use alloy_primitives::{B256, U256};

use super::book::{Sent, X402SettlementBook};
use super::local::LocalFacilitator;
use super::outcome::{already_settled, failed, settled};
use super::{FacilitatorError, rpc_down};
use crate::evm::transfer_with_authorization_calldata;
use crate::rpc::{Receipt, RpcError};
use crate::verify::{OfflineVerified, reasons};
use crate::wire::{PaymentPayload, PaymentRequirements, SettleResponse};

/// What following a dead settler's transaction found.
pub(super) enum Recovered {
    /// The chain decided: this is the answer.
    Answer(SettleResponse),
    /// Not mined, and its nonce was used by another transaction: it never will be, and the
    /// authorization is unused — nothing moved.
    NeverMined,
}

impl LocalFacilitator {
    /// The receipt of `hash` once its block is [`SettleConfig::confirmations`] deep, read
    /// again at that depth so a reorg that dropped or moved the transaction is seen.
    ///
    /// [`SettleConfig::confirmations`]: super::SettleConfig::confirmations
    pub(super) async fn wait(&self, hash: B256) -> Result<Receipt, RpcError> {
        let deadline = Instant::now() + self.config.receipt_timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let r = self
                .rpc
                .wait_receipt(hash, self.config.first_poll, left)
                .await?;
            if self.deep_enough(&r).await? {
                return Ok(r);
            }
            if Instant::now() >= deadline {
                return Err(RpcError::Transport(format!(
                    "{hash} not {} blocks deep in time",
                    self.config.confirmations
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Whether `r`'s block has `confirmations` blocks on top of it, counting its own.
    async fn deep_enough(&self, r: &Receipt) -> Result<bool, RpcError> {
        if self.config.confirmations <= 1 {
            return Ok(true);
        }
        let latest = self.rpc.block_number().await?;
        Ok(latest.saturating_sub(r.block_number) + 1 >= self.config.confirmations)
    }

    /// Why a mined transaction reverted: out of gas, or the revert reason of the same call
    /// replayed on the state before its block.
    async fn why_reverted(&self, ok: &OfflineVerified, r: &Receipt) -> String {
        if r.gas_used >= self.config.gas_limit {
            return format!(
                "transaction reverted: out of gas ({} of {})",
                r.gas_used, self.config.gas_limit
            );
        }
        let input = transfer_with_authorization_calldata(&ok.authorization, &ok.signature);
        match self
            .rpc
            .call_at(
                self.address(),
                ok.domain.verifying_contract,
                &input,
                r.block_number.saturating_sub(1),
            )
            .await
        {
            Err(RpcError::Reverted { reason }) => format!("transaction reverted: {reason}"),
            _ => "transaction reverted".into(),
        }
    }

    /// What a receipt means for the authorization: success only with the token's
    /// `Transfer(from, to, value)` log in it; a revert carries its reason.
    pub(super) async fn judge(
        &self,
        payload: &PaymentPayload,
        ok: &OfflineVerified,
        r: &Receipt,
    ) -> SettleResponse {
        if !r.success {
            return failed(
                payload,
                reasons::TRANSACTION_FAILED,
                self.why_reverted(ok, r).await,
                Some(r.transaction_hash),
            );
        }
        let a = &ok.authorization;
        if !r.has_transfer(ok.domain.verifying_contract, a.from, a.to, a.value) {
            return failed(
                payload,
                reasons::TRANSFER_EVENT_MISMATCH,
                "receipt lacks the Transfer log".into(),
                Some(r.transaction_hash),
            );
        }
        settled(payload, r.transaction_hash)
    }

    /// An authorization that expired: if this facilitator recorded a settlement of it (the
    /// answer was lost, or the receipt came late), that transaction decides; else it is
    /// refused as expired.
    pub(super) async fn expired(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
        valid_before: U256,
    ) -> Result<SettleResponse, FacilitatorError> {
        let expired = || {
            failed(
                payload,
                reasons::VALID_BEFORE_EXPIRED,
                "the authorization expired".into(),
                None,
            )
        };
        // Every other check, as of just inside its window.
        let then = u64::try_from(valid_before)
            .unwrap_or(u64::MAX)
            .saturating_sub(crate::verify::VALID_BEFORE_GRACE_SECONDS);
        let Ok(ok) = self.offline_at(payload, requirements, then).await? else {
            return Ok(expired());
        };
        let a = &ok.authorization;
        let key =
            X402SettlementBook::key(self.chain_id, ok.domain.verifying_contract, a.from, a.nonce);
        match self.book.recorded(&key).await? {
            Some(tx) => match self.follow(payload, &ok, tx).await {
                // Not mined by now, and the authorization has expired: it can never execute
                // (FiatToken checks validBefore when it runs), so nothing moved.
                Err(FacilitatorError::InProgress { .. }) => Ok(expired()),
                other => other.map(already_settled),
            },
            None => Ok(expired()),
        }
    }

    /// Follows a dead settler's written-ahead transaction: its receipt decides; not mined and
    /// its nonce taken by another transaction, it never will be; otherwise the very same
    /// transaction is sent again (the settler may have died before broadcasting it, or the node
    /// dropped it) and the outcome is still open.
    pub(super) async fn recover(
        &self,
        payload: &PaymentPayload,
        ok: &OfflineVerified,
        tx: B256,
        sent: &Sent,
    ) -> Result<Recovered, FacilitatorError> {
        match self.follow(payload, ok, tx).await {
            Err(FacilitatorError::InProgress { .. }) => {}
            other => return other.map(Recovered::Answer),
        }
        let mined = self
            .rpc
            .transaction_count(self.signer.address(), "latest")
            .await
            .map_err(|e| rpc_down(&e))?;
        if mined > sent.nonce {
            tracing::warn!(tx = %tx, nonce = sent.nonce, "x402: a written-ahead transaction lost its nonce to another and can never be mined");
            return Ok(Recovered::NeverMined);
        }
        if let Ok(raw) = hex::decode(&sent.raw) {
            match self.rpc.send_raw_transaction(&raw.into()).await {
                Ok(_) => tracing::info!(tx = %tx, "x402: re-sent a dead settler's transaction"),
                Err(e) => {
                    tracing::info!(tx = %tx, error = %e, "x402: re-sending a dead settler's transaction");
                }
            }
        }
        Err(FacilitatorError::InProgress {
            retry_after: Duration::from_secs(2),
        })
    }

    /// A recorded transaction: its receipt decides; none yet means in progress.
    pub(super) async fn follow(
        &self,
        payload: &PaymentPayload,
        ok: &OfflineVerified,
        hash: B256,
    ) -> Result<SettleResponse, FacilitatorError> {
        match self.rpc.receipt(hash).await.map_err(|e| rpc_down(&e))? {
            Some(r) => Ok(self.judge(payload, ok, &r).await),
            None => {
                // Not mined. Maybe never sent (crash between write-ahead and broadcast): if
                // the authorization was used by another transaction, that one paid.
                let a = &ok.authorization;
                if let Some(tx) = self
                    .rpc
                    .authorization_used_tx(
                        ok.domain.verifying_contract,
                        a.from,
                        a.nonce,
                        self.config.log_lookback_blocks,
                    )
                    .await
                    .map_err(|e| rpc_down(&e))?
                {
                    return self.follow_other(payload, ok, tx).await;
                }
                Err(FacilitatorError::InProgress {
                    retry_after: Duration::from_secs(2),
                })
            }
        }
    }

    pub(super) async fn follow_other(
        &self,
        payload: &PaymentPayload,
        ok: &OfflineVerified,
        tx: B256,
    ) -> Result<SettleResponse, FacilitatorError> {
        match self.rpc.receipt(tx).await.map_err(|e| rpc_down(&e))? {
            Some(r) => Ok(self.judge(payload, ok, &r).await),
            None => Err(FacilitatorError::InProgress {
                retry_after: Duration::from_secs(2),
            }),
        }
    }
}
