//! Facilitators: who checks a payment against the chain and settles it.
//!
//! [`Facilitator`] is the x402 facilitator API (`POST /verify`, `POST /settle`,
//! `GET /supported`) as a trait, with two implementations:
//! - [`LocalFacilitator`] verifies on chain through JSON-RPC and settles by sending
//!   `transferWithAuthorization` from its own key, with one nonce sequence shared by concurrent
//!   settles and a write-ahead settlement record per authorization ([`SettlementBook`]).
//! - [`RemoteFacilitator`] calls a facilitator server over HTTP (ours,
//!   [`crate::server`], or the reference one).
//!
//! Outcomes are three-valued: a [`SettleResponse`] with `success: true` (money moved, the
//! transaction is known), one with `success: false` (nothing moved: the payer may try again),
//! or a [`FacilitatorError`] (no usable answer: the outcome is **unknown**, nothing may be
//! served, and the same payment must be retried, never a new one).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use alloy_primitives::{Address, B256, U256};
use alloy_sol_types::SolCall;
use async_trait::async_trait;
use rail_core::RailError;
use rail_core::keys::KeyStore;
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use crate::evm::{
    ERC1271_MAGIC, Eip1559Tx, IERC1271, LocalSigner, transfer_with_authorization_calldata,
};
use crate::rpc::{Receipt, RpcClient, RpcError};
use crate::verify::{
    ChainView, OfflineVerified, PayerSignature, SignerKind, VerifyError, reasons, unix_secs,
    verify_exact_evm, verify_exact_evm_as,
};
use crate::wire::{
    PaymentPayload, PaymentRequirements, SCHEME_EXACT, SettleResponse, VerifyResponse,
};

/// One `(x402Version, scheme, network)` a facilitator handles.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SupportedKind {
    /// Protocol version (2).
    pub x402_version: u8,
    /// `exact`.
    pub scheme: String,
    /// CAIP-2 network.
    pub network: String,
}

/// `GET /supported` (`@x402/core` `SupportedResponse`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SupportedResponse {
    /// What is handled.
    pub kinds: Vec<SupportedKind>,
    /// Extension names (none here).
    #[serde(default)]
    pub extensions: Vec<String>,
    /// Settling addresses per CAIP-2 family (`"eip155:*"`).
    #[serde(default)]
    pub signers: BTreeMap<String, Vec<String>>,
}

/// The body of `POST /verify` and `POST /settle`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FacilitatorRequest {
    /// 2.
    pub x402_version: u8,
    /// What the payer sent.
    pub payment_payload: PaymentPayload,
    /// What the resource server requires.
    pub payment_requirements: PaymentRequirements,
}

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
}

/// The x402 facilitator API.
#[async_trait]
pub trait Facilitator: Send + Sync + std::fmt::Debug {
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

fn invalid(payload: &PaymentPayload, reason: &str, message: String) -> VerifyResponse {
    VerifyResponse {
        is_valid: false,
        invalid_reason: Some(reason.to_owned()),
        invalid_message: Some(message),
        payer: Some(payload.payload.authorization.from.to_string()),
    }
}

fn failed(
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

fn settled(payload: &PaymentPayload, tx: B256) -> SettleResponse {
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
fn already_settled(mut answer: SettleResponse) -> SettleResponse {
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
    facilitator: &Arc<dyn Facilitator>,
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
    facilitator: &Arc<dyn Facilitator>,
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

fn rpc_down(e: &RpcError) -> FacilitatorError {
    FacilitatorError::Unavailable(e.to_string())
}

/// A settler's lease on an authorization (renewed while it sends and waits for the receipt).
pub const SETTLE_LEASE: Duration = Duration::from_secs(90);
/// How long a settled authorization is remembered: longer than any validity window we accept.
pub const SETTLED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The write-ahead settlement record, one per `(chain, token, authorizer, nonce)`, on
/// rail-core's typed [`rail_core::SettlementBook`] (so settlers sharing PostgreSQL agree): the
/// signed transaction (its hash and raw bytes) is written **before** it is broadcast, and the
/// record is settled after its receipt. A settler that finds a record never broadcasts a second
/// transaction for the same authorization: it follows the recorded one. A record in flight
/// never lapses by time: a settler that died is recovered by the next one, which follows what
/// it wrote ahead.
#[derive(Clone, Debug)]
pub struct SettlementBook {
    book: rail_core::SettlementBook<Sent>,
}

/// What a settler wrote ahead: the signed transaction and its account nonce, so a recoverer
/// can send the very same transaction again, or know it can never be mined.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Sent {
    /// The raw signed transaction, hex.
    raw: String,
    /// Its nonce on the settling account.
    nonce: u64,
}

/// A settlement held by this settler.
type Settling = rail_core::keys::Settling<Sent>;

/// What following a dead settler's transaction found.
enum Recovered {
    /// The chain decided: this is the answer.
    Answer(SettleResponse),
    /// Not mined, and its nonce was used by another transaction: it never will be, and the
    /// authorization is unused — nothing moved.
    NeverMined,
}

/// What the book says about an authorization.
#[derive(Debug)]
enum Entry {
    /// Nobody is on it: this caller owns it (write the tx ahead, then send).
    Fresh(Settling),
    /// A transaction was written ahead (maybe sent, maybe not) by a live settler.
    Submitted(B256),
    /// A settler died after writing this transaction ahead; this caller follows it.
    Recover(Settling, B256, Sent),
    /// Settled by this transaction.
    Settled(B256),
    /// Held, no transaction written yet (a settler is verifying).
    Busy,
}

fn tx_hash(rail_id: &str) -> Result<B256, FacilitatorError> {
    rail_id
        .parse()
        .map_err(|_| FacilitatorError::Store(format!("settlement record names {rail_id:?}")))
}

fn store_err(e: &RailError) -> FacilitatorError {
    FacilitatorError::Store(e.to_string())
}

impl SettlementBook {
    /// A book in `store`.
    pub fn new(store: Arc<dyn KeyStore>) -> Self {
        Self {
            book: rail_core::SettlementBook::new(store, "x402/settlement", SETTLED_RETENTION)
                .with_lease(SETTLE_LEASE),
        }
    }

    fn key(chain_id: u64, token: Address, from: Address, nonce: B256) -> String {
        format!("{chain_id}:{token:#x}:{from:#x}:{nonce:#x}")
    }

    async fn open(&self, key: &str) -> Result<Entry, FacilitatorError> {
        use rail_core::keys::Opened;
        Ok(
            match self.book.open(key).await.map_err(|e| store_err(&e))? {
                Opened::Fresh(s) | Opened::Recover(s, None) => Entry::Fresh(s),
                Opened::Recover(s, Some(previous)) => {
                    Entry::Recover(s, tx_hash(&previous.rail_id)?, previous.sent)
                }
                Opened::InFlight {
                    settlement: Some(s),
                    ..
                } => Entry::Submitted(tx_hash(&s.rail_id)?),
                Opened::Settled(s) => Entry::Settled(tx_hash(&s.rail_id)?),
                // Nothing written ahead yet by a live settler (a conflict is not produced: this
                // book opens without a fingerprint).
                Opened::InFlight {
                    settlement: None, ..
                }
                | Opened::Conflict => Entry::Busy,
            },
        )
    }

    /// The transaction recorded for `key` (written ahead or settled), if any.
    async fn recorded(&self, key: &str) -> Result<Option<B256>, FacilitatorError> {
        match self.book.get(key).await.map_err(|e| store_err(&e))? {
            Some(s) => tx_hash(&s.rail_id).map(Some),
            None => Ok(None),
        }
    }
}

/// What became of a settling transaction.
enum Broadcast {
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

/// The next account nonce of the settling key, shared by concurrent settles: a transaction
/// is signed and broadcast under the lock, so nonces are handed out without gaps or reuse.
#[derive(Debug, Default)]
struct NonceState {
    next: Option<u64>,
    fees: Option<(u128, u128, Instant)>,
}

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

/// A facilitator that verifies and settles itself, through one JSON-RPC endpoint.
#[derive(Debug)]
pub struct LocalFacilitator {
    rpc: RpcClient,
    signer: LocalSigner,
    chain_id: u64,
    network: String,
    book: SettlementBook,
    nonce: Mutex<NonceState>,
    deployed: std::sync::Mutex<std::collections::HashSet<Address>>,
    config: SettleConfig,
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
        book: SettlementBook,
    ) -> Result<Self, FacilitatorError> {
        let chain_id = rpc.chain_id().await.map_err(|e| rpc_down(&e))?;
        Ok(Self {
            rpc,
            signer,
            chain_id,
            network: format!("eip155:{chain_id}"),
            book,
            nonce: Mutex::new(NonceState::default()),
            deployed: std::sync::Mutex::new(std::collections::HashSet::new()),
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
    async fn offline(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<Result<OfflineVerified, VerifyError>, FacilitatorError> {
        self.offline_at(payload, requirements, unix_secs(self.clock.now()))
            .await
    }

    async fn offline_at(
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
    async fn check(
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
        // A deployed token stays deployed: asked once per token.
        let known = self
            .deployed
            .lock()
            .map(|d| d.contains(&token))
            .unwrap_or(false);
        if !known {
            let code = self.rpc.code(token).await.map_err(|e| rpc_down(&e))?;
            if code.is_empty() {
                return Ok(Err(invalid(
                    payload,
                    reasons::ASSET_NOT_DEPLOYED,
                    format!("no contract at {token}"),
                )));
            }
            if let Ok(mut d) = self.deployed.lock() {
                d.insert(token);
            }
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
    async fn broadcast(&self, ok: &OfflineVerified, reservation: &Settling) -> Broadcast {
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

    /// The receipt of `hash` once its block is [`SettleConfig::confirmations`] deep, read
    /// again at that depth so a reorg that dropped or moved the transaction is seen.
    async fn wait(&self, hash: B256) -> Result<Receipt, RpcError> {
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
    async fn judge(
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
    async fn expired(
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
        let key = SettlementBook::key(self.chain_id, ok.domain.verifying_contract, a.from, a.nonce);
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
    async fn recover(
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
    async fn follow(
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

    async fn follow_other(
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

#[async_trait]
impl Facilitator for LocalFacilitator {
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
        let key = SettlementBook::key(
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
            }],
            extensions: vec![],
            signers: BTreeMap::from([(
                "eip155:*".to_owned(),
                vec![self.address().to_checksum(None)],
            )]),
        })
    }
}

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
impl Facilitator for RemoteFacilitator {
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
