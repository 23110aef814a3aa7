//! The payer: answers a 402 challenge by signing one native payment, within a spending policy.
//!
//! What it signs is exactly the minimal client's transaction (`docs/exact-algo.md` §6): a `pay`
//! from this account to `payTo` of `maxAmountRequired`, note = `extra.paymentId`, a flat fee of the
//! network minimum (never above 2,000 µALGO), validity from algod's suggested parameters. Before
//! signing it checks that algod is on the challenge's network (a payment is never signed for a
//! chain the payer did not choose), that the amount is within policy and that the account can
//! afford it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use rail_core::keys::{Claim, KeyStore, ReplayGuard, fingerprint};
use rail_core::{RailError, RailReason, SharedClock};

use crate::address::Address;
use crate::algod::{AlgodClient, AlgodError};
use crate::rules::{MAX_FEE, MAX_WINDOW, MIN_BALANCE};
use crate::txn::{PayTxn, SignedPay};
use crate::wire::{
    self, Accept, Envelope, Payload, PaymentRequired, network_id, normalize_network, same_network,
};

/// What the payer may spend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Networks (`algorand:…`) the payer pays on; empty = only the network its algod is on.
    /// Either spelling names a network: the CAIP-2 reference or the whole genesis hash
    /// ([`wire::normalize_network`]), here and in a challenge's `network`.
    pub networks: Vec<String>,
    /// The most one payment may be, µALGO.
    pub max_amount: u64,
    /// The most one payment may cost in fees, µALGO (capped at 2,000, `docs/exact-algo.md`
    /// §3.8).
    pub max_fee: u64,
}

impl Policy {
    /// Whether `network` (either spelling) is one of [`Policy::networks`] (either spelling).
    /// An empty list allows none by itself: the payer then checks against its algod's network.
    #[must_use]
    pub fn allows(&self, network: &str) -> bool {
        self.networks.iter().any(|n| same_network(n, network))
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            networks: Vec::new(),
            max_amount: 1_000_000,
            max_fee: MAX_FEE,
        }
    }
}

/// Why the payer will not pay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PayError {
    /// No `accepts[]` entry is exact-algo on an allowed network within the policy.
    #[error("no acceptable payment option: {0}")]
    NoAcceptable(String),
    /// algod is on another network than the challenge names.
    #[error("algod is on {actual}, the challenge asks for {expected}")]
    WrongNetwork {
        /// The challenge's network.
        expected: String,
        /// algod's.
        actual: String,
    },
    /// The account cannot afford the payment (with its fee and minimum balance).
    #[error("insufficient funds: {needed} µALGO needed, {available} spendable")]
    InsufficientFunds {
        /// Amount plus fee.
        needed: u64,
        /// Balance above the minimum balance.
        available: u64,
    },
    /// algod failed.
    #[error(transparent)]
    Algod(#[from] AlgodError),
    /// This paymentId is being signed right now by another call: retry the same request.
    #[error("paymentId {0} is being signed by another call; retry")]
    InProgress(String),
    /// The record of signed payments failed (nothing was signed or handed out).
    #[error("signed-payments store: {0}")]
    Store(String),
}

impl PayError {
    /// As a rail-core error.
    #[must_use]
    pub fn to_rail_error(&self) -> RailError {
        match self {
            PayError::NoAcceptable(m) => RailError::InvalidInput(m.clone()),
            PayError::WrongNetwork { expected, actual } => RailError::WrongNetwork {
                expected: expected.clone(),
                actual: actual.clone(),
            },
            PayError::InsufficientFunds { .. } => RailError::InsufficientFunds(self.to_string()),
            PayError::Algod(e) if e.is_retryable() => {
                RailError::Unavailable(RailReason::new("algod", e.to_string()))
            }
            PayError::Algod(e) => RailError::Rail {
                reason: RailReason::new("algod", e.to_string()),
                retryable: false,
            },
            PayError::InProgress(pid) => RailError::InProgress {
                op_id: format!("signing paymentId {pid}"),
            },
            PayError::Store(m) => RailError::Storage(m.clone()),
        }
    }
}

/// A signed payment, ready to send.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SignedPayment {
    /// The `PAYMENT-SIGNATURE` header value (also `_meta["x402/payment"]` on MCP).
    pub header: String,
    /// The transaction id.
    pub txid: String,
    /// The option that was paid.
    pub accept: Accept,
}

/// A payer holding one Algorand key.
#[derive(Clone)]
pub struct ExactAlgoPayer {
    key: Arc<SigningKey>,
    address: Address,
    pub(crate) algod: AlgodClient,
    pub(crate) policy: Policy,
    pub(crate) clock: SharedClock,
    pub(crate) lock: Arc<tokio::sync::Mutex<()>>,
    /// Every signed payment, written before it is handed out: one transaction per paymentId.
    signed: ReplayGuard,
}

/// How long a signed payment is remembered: far longer than its validity window (1000
/// rounds, under an hour), so no second transaction for the paymentId can ever be valid beside it.
pub const SIGNED_RETENTION: Duration = Duration::from_secs(24 * 3600);

impl fmt::Debug for ExactAlgoPayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExactAlgoPayer")
            .field("address", &self.address)
            .field("key", &"<redacted>")
            .field("algod", &self.algod)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

/// What one payment is signed for: the challenge, its payee, amount and paymentId.
#[derive(Clone, Copy)]
struct Order<'a> {
    /// The challenge.
    accept: &'a Accept,
    /// Who is paid.
    pay_to: Address,
    /// µALGO.
    amount: u64,
    /// The paymentId (the note).
    pid: &'a str,
}

impl ExactAlgoPayer {
    /// A payer signing with `key` (a 32-byte Ed25519 seed), through `algod`, within `policy`.
    ///
    /// Every signed payment is written to `store` before it is handed out, and a second request
    /// for the same paymentId (a retry, a recovering attempt, the same 402 answered twice) gets
    /// the same transaction: a receiver can never be given two valid transactions for one
    /// paymentId. Share `store` between processes that use the same key.
    #[must_use]
    pub fn new(
        key: SigningKey,
        algod: AlgodClient,
        policy: Policy,
        store: Arc<dyn KeyStore>,
        clock: SharedClock,
    ) -> Self {
        let address = Address(key.verifying_key().to_bytes());
        ExactAlgoPayer {
            key: Arc::new(key),
            address,
            algod,
            policy,
            clock,
            lock: Arc::new(tokio::sync::Mutex::new(())),
            signed: ReplayGuard::new(store, "exact-algo/signed"),
        }
    }

    /// The policy this payer pays within.
    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The paying address.
    #[must_use]
    pub fn address(&self) -> Address {
        self.address
    }

    /// Picks the option to pay among `accepts` by policy: exact-algo (`scheme` `exact`, asset
    /// `ALGO`), an allowed network, an amount within the policy, a well-formed `payTo` and
    /// paymentId; the cheapest such option. Never the first one blindly.
    ///
    /// # Errors
    /// [`PayError::NoAcceptable`] listing why each option was passed over.
    pub fn choose<'a>(
        &self,
        accepts: &'a [Accept],
        algod_network: &str,
    ) -> Result<&'a Accept, PayError> {
        let mut why = Vec::new();
        let mut best: Option<(&Accept, u64)> = None;
        for a in accepts {
            let amount = a.max_amount_required.parse::<u64>().ok();
            let allowed = if self.policy.networks.is_empty() {
                same_network(&a.network, algod_network)
            } else {
                self.policy.allows(&a.network)
            };
            let reason = if a.scheme != "exact" || a.asset != "ALGO" {
                Some(format!("{}/{} is not exact-algo", a.scheme, a.asset))
            } else if !allowed {
                Some(format!("network {} is not allowed", a.network))
            } else if a.pay_to.parse::<Address>().is_err() {
                Some(format!("payTo {:?} is not an address", a.pay_to))
            } else if a.extra.payment_id.len() != 32
                || !a.extra.payment_id.bytes().all(|b| b.is_ascii_hexdigit())
            {
                Some("paymentId is not 32 hex digits".to_owned())
            } else {
                match amount {
                    None => Some(format!(
                        "maxAmountRequired {:?} is not an integer",
                        a.max_amount_required
                    )),
                    Some(n) if n > self.policy.max_amount => Some(format!(
                        "{n} µALGO is above the policy's {}",
                        self.policy.max_amount
                    )),
                    Some(_) => None,
                }
            };
            match (reason, amount) {
                (Some(r), _) => why.push(r),
                (None, Some(n)) => {
                    if best.is_none_or(|(_, b)| n < b) {
                        best = Some((a, n));
                    }
                }
                (None, None) => {}
            }
        }
        best.map(|(a, _)| a)
            .ok_or_else(|| PayError::NoAcceptable(why.join("; ")))
    }

    /// Answers a 402 body: chooses an option and signs a payment for it.
    ///
    /// # Errors
    /// [`PayError`].
    pub async fn pay_required(
        &self,
        required: &PaymentRequired,
    ) -> Result<SignedPayment, PayError> {
        let params = self.algod.params().await?;
        let net = network_id(&params.genesis_hash);
        let accept = self.choose(&required.accepts, &net)?.clone();
        let pay_to: Address = accept
            .pay_to
            .parse()
            .map_err(|e| PayError::NoAcceptable(format!("payTo: {e}")))?;
        let amount: u64 = accept
            .max_amount_required
            .parse()
            .map_err(|_| PayError::NoAcceptable("maxAmountRequired".into()))?;
        let pid = accept.extra.payment_id.clone();
        let order = Order {
            accept: &accept,
            pay_to,
            amount,
            pid: &pid,
        };
        self.sign_with(params, &order).await
    }

    /// Signs a payment of `amount` to `pay_to` with note `pid` for the challenge `accept`.
    pub(crate) async fn sign(
        &self,
        accept: &Accept,
        pay_to: Address,
        amount: u64,
        pid: &str,
    ) -> Result<SignedPayment, PayError> {
        let params = self.algod.params().await?;
        let order = Order {
            accept,
            pay_to,
            amount,
            pid,
        };
        self.sign_with(params, &order).await
    }

    /// As [`ExactAlgoPayer::sign`], with algod's suggested parameters already in hand (one
    /// `GET /v2/transactions/params` per payment, not two): the paymentId's recorded
    /// transaction if it was signed before, else a new one, recorded before it is returned.
    async fn sign_with(
        &self,
        params: crate::algod::SuggestedParams,
        order: &Order<'_>,
    ) -> Result<SignedPayment, PayError> {
        let (accept, pid) = (order.accept, order.pid);
        let store = |e: RailError| PayError::Store(e.to_string());
        let key = format!("{}:{pid}", order.pay_to);
        // What the paymentId was signed for: asking again for another amount or network is
        // refused, never signed a second time (the network in its CAIP-2 form: the same
        // challenge spelled the other way is the same payment).
        let network = normalize_network(&accept.network).unwrap_or_else(|| accept.network.clone());
        let fp = fingerprint(&(order.amount, network.as_str())).map_err(store)?;
        let reservation = match self
            .signed
            .claim_as(&key, Duration::from_secs(30), fp.to_vec())
            .await
            .map_err(store)?
        {
            Claim::Finished(rec) => {
                let v = rec.value.unwrap_or_default();
                return serde_json::from_str(&v)
                    .map_err(|e| PayError::Store(format!("signed payment {key}: {e}")));
            }
            Claim::Conflict(_) => {
                return Err(PayError::NoAcceptable(format!(
                    "paymentId {pid} was already signed for another amount or network"
                )));
            }
            Claim::Busy { .. } => return Err(PayError::InProgress(pid.to_owned())),
            // A signer that died before recording never handed its transaction out.
            Claim::Fresh(r) | Claim::Recover { reservation: r, .. } => r,
        };
        match self.sign_new(params, order).await {
            Ok(signed) => {
                let v = serde_json::to_string(&signed)
                    .map_err(|e| PayError::Store(format!("signed payment {key}: {e}")))?;
                // Recorded before it leaves: if the record cannot be written, the transaction
                // is dropped unseen.
                reservation
                    .finish_with("signed", Some(v), Some(SIGNED_RETENTION))
                    .await
                    .map_err(store)?;
                Ok(signed)
            }
            Err(e) => {
                if let Err(r) = reservation.release().await {
                    tracing::warn!(error = %r, "exact-algo: could not free a signing reservation");
                }
                Err(e)
            }
        }
    }

    /// Builds and signs a new transaction.
    async fn sign_new(
        &self,
        params: crate::algod::SuggestedParams,
        order: &Order<'_>,
    ) -> Result<SignedPayment, PayError> {
        let Order {
            accept,
            pay_to,
            amount,
            pid,
        } = *order;
        let net = network_id(&params.genesis_hash);
        if !same_network(&net, &accept.network) {
            return Err(PayError::WrongNetwork {
                expected: accept.network.clone(),
                actual: net,
            });
        }
        if amount > self.policy.max_amount {
            return Err(PayError::NoAcceptable(format!(
                "{amount} µALGO is above the policy's {}",
                self.policy.max_amount
            )));
        }
        let fee = params.min_fee.max(accept.extra.min_fee_micro_algo);
        if fee > self.policy.max_fee.min(MAX_FEE) {
            return Err(PayError::NoAcceptable(format!(
                "a fee of {fee} µALGO is above the policy's {}",
                self.policy.max_fee.min(MAX_FEE)
            )));
        }
        let account = self.algod.account(&self.address).await?;
        let available = account
            .amount
            .saturating_sub(account.min_balance.max(MIN_BALANCE));
        let needed = amount.saturating_add(fee);
        if needed > available {
            return Err(PayError::InsufficientFunds { needed, available });
        }
        let first_valid = params.last_round.max(1);
        let txn = PayTxn {
            sender: self.address,
            receiver: pay_to,
            amount,
            fee,
            first_valid,
            last_valid: first_valid.saturating_add(MAX_WINDOW),
            genesis_id: params.genesis_id,
            genesis_hash: params.genesis_hash,
            note: pid.as_bytes().to_vec(),
            close_to: None,
            rekey_to: None,
            group: None,
            lease: None,
        };
        if let Some(auth) = account.auth_addr.filter(|a| *a != self.address) {
            return Err(PayError::NoAcceptable(format!(
                "account {} is rekeyed to {auth}; this payer's key cannot sign for it",
                self.address
            )));
        }
        let signed: SignedPay = txn.sign(&self.key, None);
        let txid = signed.txn.id();
        // The challenge's own spelling goes back in the envelope, as the minimal client does
        // (`docs/exact-algo.md` §2.5, §6).
        let env = Envelope {
            x402_version: 2,
            scheme: "exact".into(),
            network: accept.network.clone(),
            payload: Payload {
                txn: data_encoding::BASE64.encode(&signed.encode()),
            },
        };
        let header =
            wire::header(&env).map_err(|e| PayError::NoAcceptable(format!("envelope: {e}")))?;
        tracing::info!(txid = %txid, amount, fee, pay_to = %pay_to, "exact-algo: signed a payment");
        Ok(SignedPayment {
            header,
            txid,
            accept: accept.clone(),
        })
    }
}
