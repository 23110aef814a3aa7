//! [`LocalFacilitator`]: verifies against the chain through JSON-RPC and settles from its
//! own key; its [`SettleConfig`], its state and its checks. The facilitator API built on them
//! (verify, the settle flow, supported) is in `settle`; the nonce sequence and broadcast are in
//! `nonce`, following a settling transaction to its outcome in `follow` — all three above this
//! file, which imports none of them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_primitives::Address;
use alloy_sol_types::SolCall;
use tokio::sync::Mutex;

use super::book::X402SettlementBook;
use super::outcome::invalid;
use super::{FacilitatorError, rpc_down};
use crate::evm::{ERC1271_MAGIC, IERC1271, LocalSigner, transfer_with_authorization_calldata};
use crate::rpc::{RpcClient, RpcError};
use crate::verify::{
    ChainView, OfflineVerified, PayerSignature, SignerKind, VerifyError, reasons, unix_secs,
    verify_exact_evm, verify_exact_evm_as,
};
use crate::wire::{PaymentPayload, PaymentRequirements, VerifyResponse};

/// Settling configuration.
#[derive(Clone, Debug)]
pub struct SettleConfig {
    /// Gas limit for `transferWithAuthorization` (FiatTokenV2_2 uses about 60–90k).
    pub gas_limit: u64,
    /// First receipt poll delay; doubles up to 1 s.
    pub first_poll: Duration,
    /// Give up waiting for a receipt after this (the outcome is then unknown).
    pub receipt_timeout: Duration,
    /// How long fee figures are reused.
    pub fee_ttl: Duration,
    /// Blocks a settlement's receipt must have (its own included) before it counts: 1 (the
    /// default, what the reference waits for) on instant-finality chains and anvil; more on
    /// chains that reorganise. Within `receipt_timeout`, else the outcome is unknown.
    pub confirmations: u64,
    /// How far back `AuthorizationUsed` logs are searched (hosted providers cap `eth_getLogs`
    /// ranges; an authorization lives at most about an hour, so 10,000 blocks cover chains
    /// down to 0.4 s blocks).
    pub log_lookback_blocks: u64,
}

impl Default for SettleConfig {
    fn default() -> Self {
        Self {
            gas_limit: 150_000,
            first_poll: Duration::from_millis(5),
            receipt_timeout: Duration::from_secs(60),
            fee_ttl: Duration::from_secs(2),
            log_lookback_blocks: 10_000,
            confirmations: 1,
        }
    }
}

/// The most tokens a [`LocalFacilitator`] remembers as deployed.
const KNOWN_TOKENS: usize = 64;

/// Tokens found deployed, at most [`KNOWN_TOKENS`]: the first ones found are kept, later ones
/// asked about each time. Behind the facilitator API ([`crate::server`]) the requirements,
/// and so the token, are the caller's: without a bound anyone could make the set hold every
/// contract on the chain. A receiver's own facilitator asks about its one token first.
#[derive(Debug, Default)]
struct KnownTokens(std::sync::Mutex<std::collections::HashSet<Address>>);

impl KnownTokens {
    fn contains(&self, token: &Address) -> bool {
        self.0.lock().is_ok_and(|d| d.contains(token))
    }

    fn remember(&self, token: Address) {
        if let Ok(mut d) = self.0.lock()
            && d.len() < KNOWN_TOKENS
        {
            d.insert(token);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().map_or(0, |d| d.len())
    }
}

/// The next account nonce of the settling key, shared by concurrent settles: a transaction
/// is signed and broadcast under the lock, so nonces are handed out without gaps or reuse.
#[derive(Debug, Default)]
pub(super) struct NonceState {
    pub(super) next: Option<u64>,
    pub(super) fees: Option<(u128, u128, Instant)>,
}

/// A facilitator that verifies and settles itself, through one JSON-RPC endpoint.
#[derive(Debug)]
pub struct LocalFacilitator {
    pub(super) rpc: RpcClient,
    pub(super) signer: LocalSigner,
    pub(super) chain_id: u64,
    pub(super) network: String,
    pub(super) book: X402SettlementBook,
    pub(super) nonce: Mutex<NonceState>,
    deployed: KnownTokens,
    pub(super) config: SettleConfig,
    /// What validity windows are judged by (the host's clock unless one is injected).
    clock: rail_core::SharedClock,
}

impl LocalFacilitator {
    /// A facilitator on the chain behind `rpc` (its chain id is asked once), settling from
    /// `signer`, recording settlements in `book`.
    ///
    /// # Errors
    /// [`FacilitatorError::Unavailable`] if the node does not answer `eth_chainId`.
    pub async fn connect(
        rpc: RpcClient,
        signer: LocalSigner,
        book: X402SettlementBook,
    ) -> Result<Self, FacilitatorError> {
        let chain_id = rpc.chain_id().await.map_err(|e| rpc_down(&e))?;
        Ok(Self {
            rpc,
            signer,
            chain_id,
            network: format!("eip155:{chain_id}"),
            book,
            nonce: Mutex::new(NonceState::default()),
            deployed: KnownTokens::default(),
            config: SettleConfig::default(),
            clock: Arc::new(rail_core::SystemClock),
        })
    }

    /// Judges validity windows by `clock` instead of the host's clock (tests, time travel;
    /// the chain still judges by its block time when the transfer is simulated and sent).
    #[must_use]
    pub fn with_clock(mut self, clock: rail_core::SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// With other settling parameters.
    #[must_use]
    pub fn with_config(mut self, config: SettleConfig) -> Self {
        self.config = config;
        self
    }

    /// The CAIP-2 network (`eip155:<chain id>`).
    #[must_use]
    pub fn network(&self) -> &str {
        &self.network
    }

    /// The settling address (pays gas).
    #[must_use]
    pub const fn address(&self) -> Address {
        self.signer.address()
    }

    /// The JSON-RPC client.
    #[must_use]
    pub const fn rpc(&self) -> &RpcClient {
        &self.rpc
    }

    /// The offline checks; a signature that does not recover `from` is read as a contract
    /// wallet's when `from` has code (its ERC-1271 check is then [`Self::check`]'s).
    pub(super) async fn offline(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<Result<OfflineVerified, VerifyError>, FacilitatorError> {
        self.offline_at(payload, requirements, unix_secs(self.clock.now()))
            .await
    }

    pub(super) async fn offline_at(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
        now: u64,
    ) -> Result<Result<OfflineVerified, VerifyError>, FacilitatorError> {
        match verify_exact_evm(payload, requirements, now) {
            Err(VerifyError::InvalidSignature(e)) => {
                let from = payload.payload.authorization.from.address();
                let code = self.rpc.code(from).await.map_err(|e| rpc_down(&e))?;
                if code.is_empty() {
                    return Ok(Err(VerifyError::InvalidSignature(e)));
                }
                Ok(verify_exact_evm_as(
                    payload,
                    requirements,
                    now,
                    SignerKind::Contract,
                ))
            }
            other => Ok(other),
        }
    }

    /// Offline checks, then the chain's: network served, asset deployed, balance, nonce
    /// unused, and a simulated `transferWithAuthorization` from the settling address.
    pub(super) async fn check(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
        simulate: bool,
    ) -> Result<Result<OfflineVerified, VerifyResponse>, FacilitatorError> {
        let ok = match self.offline(payload, requirements).await? {
            Ok(ok) => ok,
            Err(e) => return Ok(Err(invalid(payload, e.reason(), e.to_string()))),
        };
        if let PayerSignature::Contract(sig) = &ok.signature {
            // ERC-1271: the wallet itself says whether the signature is its own.
            let call = IERC1271::isValidSignatureCall {
                hash: ok.signing_hash,
                signature: sig.clone().into(),
            };
            let answer = self
                .rpc
                .call(None, ok.payer, &call.abi_encode().into())
                .await;
            let valid = match answer {
                Ok(out) => IERC1271::isValidSignatureCall::abi_decode_returns(&out)
                    .is_ok_and(|magic| magic.0 == ERC1271_MAGIC),
                // The wallet reverted: it does not accept the signature.
                Err(RpcError::Reverted { .. }) => false,
                // Anything else (rate limits, node errors) is not the payer's fault.
                Err(e) => return Err(rpc_down(&e)),
            };
            if !valid {
                return Ok(Err(invalid(
                    payload,
                    reasons::INVALID_SIGNATURE,
                    format!(
                        "contract wallet {} does not accept the signature (ERC-1271)",
                        ok.payer
                    ),
                )));
            }
        }
        if ok.domain.chain_id != self.chain_id {
            let e = VerifyError::UnsupportedNetwork(requirements.network.clone());
            return Ok(Err(invalid(
                payload,
                e.reason(),
                format!("this facilitator settles on {}", self.network),
            )));
        }
        let token = ok.domain.verifying_contract;
        let auth = &ok.authorization;
        // A deployed token stays deployed: asked once per token (of the first few).
        if !self.deployed.contains(&token) {
            let code = self.rpc.code(token).await.map_err(|e| rpc_down(&e))?;
            if code.is_empty() {
                return Ok(Err(invalid(
                    payload,
                    reasons::ASSET_NOT_DEPLOYED,
                    format!("no contract at {token}"),
                )));
            }
            self.deployed.remember(token);
        }
        let balance = match self.rpc.balance_of(token, auth.from).await {
            Ok(b) => b,
            Err(RpcError::Reverted { reason }) => {
                return Ok(Err(invalid(
                    payload,
                    reasons::EIP3009_NOT_SUPPORTED,
                    format!("{token} does not answer balanceOf: {reason}"),
                )));
            }
            Err(e) => return Err(rpc_down(&e)),
        };
        if balance < auth.value {
            return Ok(Err(invalid(
                payload,
                reasons::INSUFFICIENT_BALANCE,
                format!("balance {balance} < value {}", auth.value),
            )));
        }
        let used = match self
            .rpc
            .authorization_state(token, auth.from, auth.nonce)
            .await
        {
            Ok(u) => u,
            Err(RpcError::Reverted { reason } | RpcError::Decode(reason)) => {
                return Ok(Err(invalid(
                    payload,
                    reasons::EIP3009_NOT_SUPPORTED,
                    format!("{token} does not answer authorizationState: {reason}"),
                )));
            }
            Err(e) => return Err(rpc_down(&e)),
        };
        if used {
            return Ok(Err(invalid(
                payload,
                reasons::NONCE_ALREADY_USED,
                format!("nonce {} of {} is used", auth.nonce, auth.from),
            )));
        }
        if simulate {
            let input = transfer_with_authorization_calldata(auth, &ok.signature);
            match self.rpc.call(Some(self.address()), token, &input).await {
                Ok(_) => {}
                Err(RpcError::Reverted { reason }) => {
                    return Ok(Err(invalid(payload, reasons::SIMULATION_FAILED, reason)));
                }
                Err(e) => return Err(rpc_down(&e)),
            }
        }
        Ok(Ok(ok))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use alloy_primitives::{B256, U256};

    use super::*;
    use crate::eip3009::{TokenDomain, TransferWithAuthorization};
    use crate::facilitator::X402Facilitator;
    use crate::fields::{Bytes32Hex, HexBytes, Uint256Decimal};
    use crate::wire::{Eip3009Authorization, ExactEvmPayload, Extra, V2};

    const NOW: u64 = 1_900_000_000;

    /// A node for the offline-valid payments below: chain 31337, code at every address, a
    /// large balance, every nonce unused, every transfer simulated fine.
    async fn node() -> mockito::ServerGuard {
        let mut s = mockito::Server::new_async().await;
        let answer = |s: &mut mockito::ServerGuard, matches: &str, result: &str| {
            s.mock("POST", "/")
                .match_body(mockito::Matcher::Regex(matches.to_owned()))
                .with_body(format!(r#"{{"jsonrpc":"2.0","id":1,"result":"{result}"}}"#))
                .expect_at_least(0)
                .create();
        };
        let word = |v: u64| format!("0x{:064x}", v);
        answer(&mut s, r#""method":"eth_chainId""#, "0x7a69");
        answer(&mut s, r#""method":"eth_getCode""#, "0x6080");
        answer(&mut s, r#""input":"0x70a08231"#, &word(1_000_000_000));
        answer(&mut s, r#""input":"0xe94a0102"#, &word(0));
        answer(&mut s, r#""input":"0x(e3ee160e|cf092995)"#, "0x");
        s
    }

    /// A payment of 1000 to `pay_to` in token `asset`, signed by `payer`.
    fn payment(
        payer: &LocalSigner,
        asset: Address,
        pay_to: Address,
    ) -> (PaymentPayload, PaymentRequirements) {
        let requirements = PaymentRequirements {
            scheme: "exact".into(),
            network: "eip155:31337".into(),
            amount: 1000u64.into(),
            asset: asset.to_checksum(None),
            pay_to: pay_to.to_checksum(None),
            max_timeout_seconds: 60,
            extra: Some(Extra::eip712("USD Coin", "2")),
        };
        let message = TransferWithAuthorization {
            from: payer.address(),
            to: pay_to,
            value: U256::from(1000),
            validAfter: U256::ZERO,
            validBefore: U256::from(NOW + 60),
            nonce: B256::from(rand::random::<[u8; 32]>()),
        };
        let domain = TokenDomain {
            name: "USD Coin".into(),
            version: "2".into(),
            chain_id: 31_337,
            verifying_contract: asset,
        };
        let signature = payer
            .sign_hash(&message.signing_hash(&domain))
            .unwrap()
            .to_bytes();
        let payload = PaymentPayload {
            x402_version: V2::default(),
            resource: None,
            accepted: requirements.clone(),
            payload: ExactEvmPayload {
                signature: HexBytes::from(signature.to_vec()),
                authorization: Eip3009Authorization {
                    from: message.from.into(),
                    to: message.to.into(),
                    value: Uint256Decimal::from(message.value),
                    valid_after: Uint256Decimal::from(message.validAfter),
                    valid_before: Uint256Decimal::from(message.validBefore),
                    nonce: Bytes32Hex::from(message.nonce),
                },
            },
            extensions: None,
        };
        (payload, requirements)
    }

    /// Issue #47: behind the facilitator API the token is the caller's. 500 payments, each
    /// in a token of its own (a contract at every address), from throwaway keys: the tokens
    /// remembered as deployed stay at most [`KNOWN_TOKENS`], the first one (the honest payer's)
    /// among them, and the honest payer's payment still verifies.
    #[tokio::test]
    async fn tokens_of_unknown_callers_are_remembered_within_the_bound() {
        let node = node().await;
        let clock = Arc::new(rail_core::ManualClock::at(rail_core::Timestamp(
            i64::try_from(NOW).unwrap() * 1000,
        )));
        let f = LocalFacilitator::connect(
            RpcClient::new(&node.url()).unwrap(),
            LocalSigner::random(),
            X402SettlementBook::new(Arc::new(rail_core::MemoryKeyStore::default())),
        )
        .await
        .unwrap()
        .with_clock(clock);
        let (usdc, shop) = (Address::repeat_byte(0x11), Address::repeat_byte(0x22));
        let honest = LocalSigner::random();
        let (p, r) = payment(&honest, usdc, shop);
        assert!(f.verify(&p, &r).await.unwrap().is_valid);
        for i in 0..500u32 {
            let mut token = [0x33u8; 20];
            token[..4].copy_from_slice(&i.to_be_bytes());
            let (p, r) = payment(&LocalSigner::random(), Address::from(token), shop);
            assert!(f.verify(&p, &r).await.unwrap().is_valid);
            assert!(f.deployed.len() <= KNOWN_TOKENS);
        }
        assert_eq!(f.deployed.len(), KNOWN_TOKENS);
        assert!(f.deployed.contains(&usdc));
        let (p, r) = payment(&honest, usdc, shop);
        assert!(f.verify(&p, &r).await.unwrap().is_valid);
    }
}
