//! The rail-core traits for x402: [`X402RailPayer`] is a [`Payer`], [`X402Receiver`] a
//! [`RailReceiver`].
//!
//! An [`Offer`]'s id is the EIP-3009 nonce the payer must sign (32 bytes, hex): the payment is
//! bound to its offer by the signature itself, and single use on chain. Its `details` are the
//! [`PaymentRequirements`]. A [`Payment`]'s proof is `{"header": <PAYMENT-SIGNATURE value>}`.
//! Money moves when the receiver verifies (the facilitator settles): capture = settle. The rail
//! declares no hold and no refund: an EIP-3009 signature is not a hold (it cannot be partially
//! captured or voided by the receiver), and the receiver holds no key of the payer's.

use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::{Address, B256, U256};
use async_trait::async_trait;
use rail_core::keys::KeyStore;
use rail_core::{
    Asset, Binding, Capabilities, Charge, Finality, Money, Offer, OpId, Payer, Payment,
    PaymentMode, PaymentState, Rail, RailError, RailId, RailReason, RailReceiver, RailResult,
    SharedClock, Verified, glue,
};
use serde::{Deserialize, Serialize};

use crate::facilitator::{SettleOutcome, X402Facilitator, settle_for_serving};
use crate::payer::X402Payer;
use crate::scheme::{DEFAULT_MAX_TIMEOUT_SECONDS, served_key};
// Defined in scheme.rs, whose `SchemePayer::rail` reads it too (scheme.rs never imports this
// file); re-exported here at its path.
pub use crate::scheme::RAIL;
use crate::token::Token;
use crate::verify::{find_matching_requirements, precheck, reasons, unix_secs};
use crate::wire::{
    Extra, PaymentPayload, PaymentRequired, PaymentRequirements, ResourceInfo, SCHEME_EXACT, V2,
};
use x402_transport::ServedOnce;
use x402_transport::served::{SERVED_RETENTION, Taken, release};

/// A payment's proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct X402Proof {
    /// The `PAYMENT-SIGNATURE` header value.
    pub header: String,
}

fn capabilities() -> Capabilities {
    // `pay` signs an EIP-3009 authorisation; the receiver's facilitator settles it and waits
    // for the transaction's receipt (status 1): final once confirmed in a block (on L2s, once
    // the batch posts).
    Capabilities::sign_only(Finality::Confirmed, vec![Asset::usdc()])
}

/// The most one offer may ask for: 10^12 USDC (10^18 atomic units), above any stablecoin's
/// supply; larger amounts are input errors, not prices.
pub const MAX_ATOMIC: u128 = 1_000_000_000_000_000_000;

fn atomic(m: &Money) -> RailResult<U256> {
    if m.asset() != &Asset::usdc() {
        return Err(RailError::InvalidInput(format!(
            "asset {} is not carried by x402 here (USDC only)",
            m.asset()
        )));
    }
    if m.minor_units() > MAX_ATOMIC {
        return Err(RailError::InvalidInput(format!(
            "{m} is more than any token supply"
        )));
    }
    Ok(U256::from(m.minor_units()))
}

/// Where the payer reads its token balance before signing (a wallet never signs an
/// authorization it cannot cover).
#[async_trait]
pub trait TokenBalance: Send + Sync + std::fmt::Debug {
    /// `who`'s balance of `token`.
    async fn token_balance(&self, token: Address, who: Address) -> Result<U256, String>;
}

#[async_trait]
impl TokenBalance for crate::rpc::RpcClient {
    async fn token_balance(&self, token: Address, who: Address) -> Result<U256, String> {
        use crate::verify::ChainView;
        self.balance_of(token, who).await.map_err(|e| e.to_string())
    }
}

/// A refusal reason (`invalid_exact_evm_*`) as a typed rail error.
fn refusal(reason: &str, message: String) -> RailError {
    let detail = if message.is_empty() {
        reason.to_owned()
    } else {
        format!("{reason}: {message}")
    };
    match reason {
        reasons::INVALID_SIGNATURE => RailError::BadSignature(detail),
        reasons::INSUFFICIENT_BALANCE => RailError::InsufficientFunds(detail),
        reasons::NONCE_ALREADY_USED => RailError::Replayed { key: detail },
        reasons::NETWORK_MISMATCH | reasons::INVALID_NETWORK => RailError::WrongNetwork {
            expected: String::new(),
            actual: detail,
        },
        reasons::INVALID_PAYLOAD => RailError::MalformedPayment(detail),
        _ => RailError::Declined(RailReason::new(reason, message)),
    }
}

/// The paying side: an [`X402Payer`] as a rail payer (wrap it in
/// [`rail_core::payer::Idempotent`] for one payment per operation id).
#[derive(Debug)]
pub struct X402RailPayer {
    payer: X402Payer,
    clock: SharedClock,
    balances: Arc<dyn TokenBalance>,
    /// One payment at a time: the balance check and the signature are one step, and a
    /// concurrent retry of the same operation waits for the first instead of failing.
    lock: tokio::sync::Mutex<()>,
}

impl X402RailPayer {
    /// Pays with `payer`, reading its balance from `balances`.
    pub fn new(payer: X402Payer, balances: Arc<dyn TokenBalance>, clock: SharedClock) -> Self {
        Self {
            payer,
            clock,
            balances,
            lock: tokio::sync::Mutex::new(()),
        }
    }
}

impl Rail for X402RailPayer {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities()
    }
}

#[async_trait]
impl Payer for X402RailPayer {
    /// The offer is x402 `exact`, in a token on a network this payer's policy allows, for no
    /// more than its policy's limit.
    fn accepts(&self, offer: &Offer) -> RailResult<()> {
        offer.check_pay_only(RAIL)?;
        let requirements: PaymentRequirements = offer.details_as()?;
        match self.payer.policy().refusal(&requirements) {
            Some(why) => Err(RailError::InvalidInput(why)),
            None => Ok(()),
        }
    }

    async fn pay(&self, _op: &OpId, offer: &Offer) -> RailResult<Payment> {
        offer.check_pay_only(RAIL)?;
        let requirements: PaymentRequirements = offer.details_as()?;
        let amount = atomic(&offer.amount)?;
        if requirements.amount.value() != amount {
            return Err(RailError::mismatch(
                Binding::Amount,
                &offer.amount,
                requirements.amount,
            ));
        }
        let pay_to: Address = offer
            .payee
            .parse()
            .map_err(|e| RailError::InvalidInput(format!("payee: {e}")))?;
        if requirements.pay_to.parse::<Address>().ok() != Some(pay_to) {
            return Err(RailError::mismatch(
                Binding::Payee,
                &offer.payee,
                &requirements.pay_to,
            ));
        }
        let nonce: B256 = offer
            .id
            .parse()
            .map_err(|_| RailError::InvalidInput("offer id is not a 32-byte nonce".into()))?;
        let _one_at_a_time = self.lock.lock().await;
        offer.check_live(self.clock.now())?;
        let token: Address = requirements
            .asset
            .parse()
            .map_err(|e| RailError::InvalidInput(format!("asset: {e}")))?;
        let balance = self
            .balances
            .token_balance(token, self.payer.address())
            .await
            .map_err(|e| RailError::Unavailable(RailReason::new("x402 chain", e)))?;
        if balance < amount {
            return Err(RailError::InsufficientFunds(format!(
                "balance {balance} < {amount}"
            )));
        }
        let required = PaymentRequired {
            x402_version: V2::default(),
            error: None,
            reason: None,
            resource: Some(ResourceInfo::new(format!("stipendex:offer:{}", offer.id))),
            accepts: vec![requirements.clone()],
            extensions: None,
        };
        let signed = self
            .payer
            .sign(&required, &requirements, unix_secs(self.clock.now()), nonce)
            .map_err(|e| RailError::InvalidInput(e.to_string()))?;
        let header = signed
            .to_header()
            .map_err(|e| RailError::InvalidInput(e.to_string()))?;
        glue::payment(
            RAIL,
            offer,
            PaymentMode::Capture,
            self.payer.address().to_checksum(None),
            &X402Proof { header },
        )
    }
}

/// Signing moves no money (the receiver settles, once per EIP-3009 nonce, and the nonce is the
/// offer's id): a recovering attempt may sign again, both signatures carry the same nonce and at
/// most one can ever be settled.
impl glue::NothingToFind for X402RailPayer {}

/// The receiving side: offers priced in the token, payments settled by a facilitator, each
/// served once (across instances sharing the store).
#[derive(Clone, Debug)]
pub struct X402Receiver {
    facilitator: Arc<dyn X402Facilitator>,
    token: Token,
    pay_to: Address,
    /// The longest an offer lives (its charge's ttl, at most this).
    max_timeout: Duration,
    /// The offers' `maxTimeoutSeconds`: the payer's authorization window.
    max_timeout_seconds: u64,
    served: ServedOnce,
    clock: SharedClock,
}

impl X402Receiver {
    /// A receiver paid to `pay_to` in `token`, settling through `facilitator`, remembering
    /// served payments in `store`. Its offers' requirements say `maxTimeoutSeconds`
    /// [`DEFAULT_MAX_TIMEOUT_SECONDS`], as [`crate::ExactEvm`]'s challenges do.
    pub fn new(
        facilitator: Arc<dyn X402Facilitator>,
        token: Token,
        pay_to: Address,
        store: Arc<dyn KeyStore>,
        clock: SharedClock,
    ) -> Self {
        Self {
            facilitator,
            token,
            pay_to,
            max_timeout: Duration::from_secs(300),
            max_timeout_seconds: DEFAULT_MAX_TIMEOUT_SECONDS,
            served: ServedOnce::new(store),
            clock,
        }
    }

    /// The `maxTimeoutSeconds` of its offers' requirements (default
    /// [`DEFAULT_MAX_TIMEOUT_SECONDS`]; give the same to an [`crate::ExactEvm`] beside it).
    #[must_use]
    pub const fn with_max_timeout_seconds(mut self, secs: u64) -> Self {
        self.max_timeout_seconds = secs;
        self
    }

    /// The `maxTimeoutSeconds` of its offers' requirements.
    #[must_use]
    pub const fn max_timeout_seconds(&self) -> u64 {
        self.max_timeout_seconds
    }

    /// The recipient.
    #[must_use]
    pub const fn pay_to(&self) -> Address {
        self.pay_to
    }
}

impl Rail for X402Receiver {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities()
    }
}

#[async_trait]
impl RailReceiver for X402Receiver {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        rail_core::types::check_capture_mode(RAIL, charge.mode)?;
        let amount = atomic(&charge.amount)?;
        if amount.is_zero() {
            return Err(RailError::InvalidInput("amount is zero".into()));
        }
        let ttl = charge.ttl.min(self.max_timeout).max(Duration::from_secs(1));
        let requirements = PaymentRequirements {
            scheme: SCHEME_EXACT.into(),
            network: self.token.network.clone(),
            amount: amount.into(),
            asset: self.token.address.to_checksum(None),
            pay_to: self.pay_to.to_checksum(None),
            max_timeout_seconds: self.max_timeout_seconds,
            extra: Some(Extra::eip712(&self.token.name, &self.token.version)),
        };
        // A capture offer: `check_capture_mode` refused anything else above.
        glue::offer(
            RAIL,
            B256::from(rand::random::<[u8; 32]>()).to_string(),
            charge,
            self.pay_to.to_checksum(None),
            self.clock.now().plus(ttl),
            &requirements,
        )
    }

    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        payment.check_envelope(offer)?;
        offer.check_live(self.clock.now())?;
        let proof: X402Proof = payment.proof_as()?;
        let requirements: PaymentRequirements = offer.details_as()?;
        if atomic(&offer.amount)? != requirements.amount.value() {
            return Err(RailError::mismatch(
                Binding::Amount,
                requirements.amount,
                &offer.amount,
            ));
        }
        if offer.payee.parse::<Address>().ok() != Some(self.pay_to) {
            return Err(RailError::mismatch(
                Binding::Payee,
                self.pay_to,
                &offer.payee,
            ));
        }
        let payload = PaymentPayload::from_header(&proof.header)
            .map_err(|e| RailError::MalformedPayment(e.to_string()))?;
        if payload.accepted.network != self.token.network {
            return Err(RailError::WrongNetwork {
                expected: self.token.network.clone(),
                actual: payload.accepted.network.clone(),
            });
        }
        if find_matching_requirements(std::slice::from_ref(&requirements), &payload).is_none() {
            return Err(RailError::mismatch(
                Binding::Offer,
                &requirements,
                &payload.accepted,
            ));
        }
        let auth = &payload.payload.authorization;
        if auth.nonce.to_string() != offer.id {
            return Err(RailError::mismatch(Binding::Offer, &offer.id, auth.nonce));
        }
        if auth.from.address().to_checksum(None) != payment.payer {
            return Err(RailError::mismatch(
                Binding::Payer,
                auth.from,
                &payment.payer,
            ));
        }
        // Final offline verdicts before anything is recorded.
        if let Err(e) = precheck(&payload, &requirements, unix_secs(self.clock.now())) {
            return Err(refusal(e.reason(), e.to_string()));
        }
        // The same served-once key as the HTTP paywall and MCP: one payment, served once.
        let serving = self
            .served
            .reserve(&served_key(&payload))
            .await
            .map_err(|e| match e {
                Taken::Used | Taken::InFlight => glue::served_already(&offer.id),
                Taken::Store(e) => e,
            })?;
        let settled = match serving
            .keep_alive(settle_for_serving(
                &self.facilitator,
                &payload,
                &requirements,
            ))
            .await
        {
            SettleOutcome::Settled(s) => s,
            SettleOutcome::Refused(s) => {
                release(serving).await;
                return Err(refusal(
                    SettleOutcome::reason(&s),
                    s.error_message.clone().unwrap_or_default(),
                ));
            }
            SettleOutcome::Unknown(detail) => {
                release(serving).await;
                return Err(glue::settlement_unknown(detail));
            }
        };
        serving.commit(Some(SERVED_RETENTION)).await?;
        Ok(glue::verified(
            RAIL,
            offer,
            settled.transaction,
            auth.from.address().to_checksum(None),
            offer.amount.clone(),
            PaymentState::Settled,
        ))
    }
}
