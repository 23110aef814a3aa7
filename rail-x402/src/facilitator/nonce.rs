//! The settling key's account nonce: one sequence shared by concurrent settles (its state,
//! [`NonceState`], is a field of [`LocalFacilitator`], beside it in `local`), and the broadcast
//! that signs, writes ahead and sends a settling transaction under its lock.

use std::time::Instant;

use alloy_primitives::{B256, U256};

use super::book::{Sent, Settling};
use super::local::{LocalFacilitator, NonceState};
use super::{FacilitatorError, rpc_down};
use crate::evm::{Eip1559Tx, transfer_with_authorization_calldata};
use crate::rpc::RpcError;
use crate::verify::OfflineVerified;

/// What became of a settling transaction.
pub(super) enum Broadcast {
    /// In the node's pool (or already mined).
    Sent(B256),
    /// Refused before entering the pool: nothing can move.
    Refused(String),
    /// Not sent, and nothing written ahead (the record can be freed).
    NotSent(FacilitatorError),
    /// Written ahead, perhaps sent: the outcome is unknown (the record stays).
    Unknown(FacilitatorError),
}

/// `eth_sendRawTransaction` errors that mean the node refused the transaction before it
/// entered the pool (geth's `txpool` / `core` error strings; anvil uses the same).
fn refused_before_pool(message: &str) -> bool {
    const REFUSALS: &[&str] = &[
        "insufficient funds",
        "intrinsic gas too low",
        "gas too low",
        "fee cap less than block base fee",
        "max fee per gas less than block base fee",
        "exceeds block gas limit",
        "invalid sender",
        "transaction underpriced",
        "tip higher than fee cap",
        "max priority fee per gas higher than max fee per gas",
        "oversized data",
        "invalid chain id",
    ];
    let m = message.to_ascii_lowercase();
    !m.contains("replacement") && REFUSALS.iter().any(|r| m.contains(r))
}

impl LocalFacilitator {
    async fn fees(&self, state: &mut NonceState) -> Result<(u128, u128), RpcError> {
        if let Some((max, tip, at)) = state.fees
            && at.elapsed() < self.config.fee_ttl
        {
            return Ok((max, tip));
        }
        let (base, tip) = self.rpc.fees().await?;
        let max = base.saturating_mul(2).saturating_add(tip);
        state.fees = Some((max, tip, Instant::now()));
        Ok((max, tip))
    }

    /// Signs the settling transaction with the next account nonce, records it ahead in the
    /// book, and broadcasts it, all under the nonce lock.
    pub(super) async fn broadcast(
        &self,
        ok: &OfflineVerified,
        reservation: &Settling,
    ) -> Broadcast {
        let input = transfer_with_authorization_calldata(&ok.authorization, &ok.signature);
        let mut state = self.nonce.lock().await;
        for _attempt in 0..3 {
            let nonce = match state.next {
                Some(n) => n,
                None => match self.rpc.transaction_count(self.address(), "pending").await {
                    Ok(n) => n,
                    Err(e) => return Broadcast::NotSent(rpc_down(&e)),
                },
            };
            let (max_fee, tip) = match self.fees(&mut state).await {
                Ok(f) => f,
                Err(e) => return Broadcast::NotSent(rpc_down(&e)),
            };
            let tx = Eip1559Tx {
                chain_id: self.chain_id,
                nonce,
                max_priority_fee_per_gas: tip,
                max_fee_per_gas: max_fee,
                gas_limit: self.config.gas_limit,
                to: ok.domain.verifying_contract,
                value: U256::ZERO,
                input: input.clone(),
            };
            let signed = match tx.sign(&self.signer) {
                Ok(s) => s,
                Err(e) => {
                    return Broadcast::NotSent(FacilitatorError::Unavailable(format!(
                        "signing: {e}"
                    )));
                }
            };
            // Write-ahead: once this is stored, no settler sends another transaction for
            // this authorization.
            if let Err(e) = reservation
                .submitting(
                    &format!("{:#x}", signed.hash),
                    Sent {
                        raw: hex::encode(&signed.raw),
                        nonce,
                    },
                )
                .await
            {
                return Broadcast::NotSent(FacilitatorError::Store(e.to_string()));
            }
            match self.rpc.send_raw_transaction(&signed.raw).await {
                Ok(_) => {
                    state.next = Some(nonce + 1);
                    return Broadcast::Sent(signed.hash);
                }
                // This very transaction is in the pool already: it was sent.
                Err(RpcError::Rpc { message, .. }) if message.contains("already known") => {
                    state.next = Some(nonce + 1);
                    return Broadcast::Sent(signed.hash);
                }
                Err(RpcError::Rpc { message, .. })
                    if message.contains("nonce too low")
                        || message.contains("nonce too high")
                        || message.contains("replacement transaction underpriced") =>
                {
                    // Another transaction holds this account nonce (another process with the
                    // same key): this one was not taken; resynchronise and sign again.
                    tracing::warn!(%message, nonce, "settling nonce out of step; resyncing");
                    state.next = None;
                }
                Err(RpcError::Rpc { message, .. }) if refused_before_pool(&message) => {
                    // Refused before the pool: the nonce was not consumed, nothing moved.
                    state.next = Some(nonce);
                    state.fees = None;
                    return Broadcast::Refused(message);
                }
                Err(e) => {
                    // Unknown whether the node took it (a transport error, or an error a
                    // provider may give after forwarding): the record stays; the next settle
                    // asks the node for the account nonce.
                    state.next = None;
                    return Broadcast::Unknown(rpc_down(&e));
                }
            }
        }
        Broadcast::Refused("could not find a free account nonce after 3 attempts".into())
    }
}
