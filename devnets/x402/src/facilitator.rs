//! An in-memory facilitator over an in-memory EIP-3009 token: for unit tests and the
//! conformance suite's mock tier (no chain, no node).
//!
//! It mirrors what FiatTokenV2_2's `transferWithAuthorization` enforces and what
//! [`LocalFacilitator`](rail_x402::facilitator::LocalFacilitator) answers: the offline checks
//! ([`verify_exact_evm`], real signatures), then balance (`invalid_exact_evm_insufficient_balance`)
//! and nonce (`invalid_exact_evm_nonce_already_used`), then an atomic debit/credit. Settling a
//! settled authorization again is refused (`invalid_exact_evm_nonce_already_used`) naming its
//! first transaction, as [`LocalFacilitator`](rail_x402::facilitator::LocalFacilitator) does.
//! Transaction hashes are `keccak256` of the authorization's signing hash.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use alloy_primitives::{Address, B256, U256, keccak256};
use async_trait::async_trait;

use rail_x402::facilitator::{FacilitatorError, SupportedKind, SupportedResponse, X402Facilitator};
use rail_x402::verify::{reasons, verify_exact_evm};
use rail_x402::wire::{PaymentPayload, PaymentRequirements, SettleResponse, VerifyResponse};

/// `(reason, message, transaction that already settled it)`.
type Refusal = (String, String, Option<B256>);

#[derive(Debug, Default)]
struct State {
    balances: HashMap<(Address, Address), U256>,
    /// `(token, authorizer, nonce)` → settling transaction.
    used: HashMap<(Address, Address, B256), B256>,
}

/// An in-memory token ledger with a facilitator API.
#[derive(Debug)]
pub struct DevnetFacilitator {
    network: String,
    state: Mutex<State>,
}

impl DevnetFacilitator {
    /// A facilitator for `network` (`eip155:<id>`) with no balances.
    #[must_use]
    pub fn new(network: &str) -> Self {
        Self {
            network: network.to_owned(),
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, State>, FacilitatorError> {
        self.state
            .lock()
            .map_err(|_| FacilitatorError::Unavailable("mock state poisoned".into()))
    }

    /// Credits `amount` of `token` to `who` (a mint).
    ///
    /// # Errors
    /// [`FacilitatorError::Unavailable`] if the state is poisoned.
    pub fn mint(&self, token: Address, who: Address, amount: U256) -> Result<(), FacilitatorError> {
        let mut s = self.lock()?;
        let b = s.balances.entry((token, who)).or_default();
        *b = b.saturating_add(amount);
        Ok(())
    }

    /// The balance of `who` in `token`.
    ///
    /// # Errors
    /// [`FacilitatorError::Unavailable`] if the state is poisoned.
    pub fn balance(&self, token: Address, who: Address) -> Result<U256, FacilitatorError> {
        Ok(self
            .lock()?
            .balances
            .get(&(token, who))
            .copied()
            .unwrap_or_default())
    }

    fn judge(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
        settle: bool,
    ) -> Result<Result<B256, Refusal>, FacilitatorError> {
        let now = rail_x402::verify::unix_now();
        let ok = match verify_exact_evm(payload, requirements, now) {
            Ok(ok) => ok,
            Err(e) => return Ok(Err((e.reason().to_owned(), e.to_string(), None))),
        };
        if requirements.network != self.network {
            return Ok(Err((
                reasons::INVALID_NETWORK.to_owned(),
                format!("this facilitator settles on {}", self.network),
                None,
            )));
        }
        let token = ok.domain.verifying_contract;
        let a = &ok.authorization;
        let mut s = self.lock()?;
        if let Some(tx) = s.used.get(&(token, a.from, a.nonce)) {
            // As LocalFacilitator: a second settle is refused, naming the first transaction.
            return Ok(Err((
                reasons::NONCE_ALREADY_USED.to_owned(),
                if settle {
                    format!("already settled by {tx}")
                } else {
                    "authorization is used".into()
                },
                Some(*tx),
            )));
        }
        let from_balance = s
            .balances
            .get(&(token, a.from))
            .copied()
            .unwrap_or_default();
        if from_balance < a.value {
            return Ok(Err((
                reasons::INSUFFICIENT_BALANCE.to_owned(),
                format!("balance {from_balance} < value {}", a.value),
                None,
            )));
        }
        let tx = keccak256(ok.signing_hash);
        if settle {
            s.balances.insert((token, a.from), from_balance - a.value);
            let to = s.balances.entry((token, a.to)).or_default();
            *to = to.saturating_add(a.value);
            s.used.insert((token, a.from, a.nonce), tx);
        }
        Ok(Ok(tx))
    }
}

#[async_trait]
impl X402Facilitator for DevnetFacilitator {
    async fn verify(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<VerifyResponse, FacilitatorError> {
        let payer = Some(payload.payload.authorization.from.to_string());
        Ok(match self.judge(payload, requirements, false)? {
            Ok(_) => VerifyResponse {
                is_valid: true,
                invalid_reason: None,
                invalid_message: None,
                payer,
            },
            Err((reason, message, _)) => VerifyResponse {
                is_valid: false,
                invalid_reason: Some(reason),
                invalid_message: Some(message),
                payer,
            },
        })
    }

    async fn settle(
        &self,
        payload: &PaymentPayload,
        requirements: &PaymentRequirements,
    ) -> Result<SettleResponse, FacilitatorError> {
        let payer = Some(payload.payload.authorization.from.to_string());
        let network = payload.accepted.network.clone();
        Ok(match self.judge(payload, requirements, true)? {
            Ok(tx) => SettleResponse {
                success: true,
                error_reason: None,
                error_message: None,
                transaction: tx.to_string(),
                network,
                payer,
            },
            Err((reason, message, tx)) => SettleResponse {
                success: false,
                error_reason: Some(reason),
                error_message: Some(message),
                transaction: tx.map(|t| t.to_string()).unwrap_or_default(),
                network,
                payer,
            },
        })
    }

    async fn supported(&self) -> Result<SupportedResponse, FacilitatorError> {
        Ok(SupportedResponse {
            kinds: vec![SupportedKind {
                x402_version: 2,
                scheme: "exact".into(),
                network: self.network.clone(),
                extra: None,
            }],
            extensions: vec![],
            signers: BTreeMap::new(),
        })
    }
}

#[async_trait]
impl rail_x402::rail::TokenBalance for DevnetFacilitator {
    async fn token_balance(&self, token: Address, who: Address) -> Result<U256, String> {
        self.balance(token, who).map_err(|e| e.to_string())
    }
}
