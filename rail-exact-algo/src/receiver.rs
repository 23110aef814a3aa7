//! The receiver: makes challenges, verifies payments strictly and settles them through algod.
//!
//! [`ExactAlgoReceiver::settle`] is the whole flow of `docs/exact-algo.md` (§1, §3, §8) for one
//! `PAYMENT-SIGNATURE`:
//!
//! 1. decode strictly (base64 → JSON without unknown fields → version, scheme, network →
//!    base64 → canonical msgpack of a single-signature native payment);
//! 2. check the Ed25519 signature before anything else looks at the payload;
//! 3. the note must be a paymentId issued for this resource, amount and payee, still live;
//! 4. every rule of `docs/exact-algo.md` §3 ([`crate::rules::check`]) against algod's current round
//!    (and the sender's `auth-addr` when the payment carries `sgnr`);
//! 5. take the paymentId (write-ahead of the txid; one settlement per paymentId across every
//!    receiver sharing the store);
//! 6. `POST /v2/transactions`, wait for confirmation; a refusal releases the paymentId and is
//!    answered `settlement failed` with algod's message;
//! 7. answer with a receipt exactly once per paymentId.
//!
//! Any refusal is a [`Refusal`]. Its [`Refusal::code`] is always one of the six error codes of
//! `docs/exact-algo.md` §4.1, and [`Refusal::reason`] the finer stable code where there is one
//! (`fee too high` under `settlement failed`); the HTTP and MCP surfaces answer it with a fresh
//! challenge carrying both (`error`, `reason`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rail_core::keys::KeyStore;
use rail_core::{RailError, RailReason, SharedClock};

use crate::address::Address;
use crate::algod::{AlgodClient, AlgodError};
use crate::payment_id::{self, Begin, LifecycleError, PaymentIds};
use crate::rules::{self, ChainView, Requirement, Violation};
use crate::txn::{SignedPay, TxnError};
use crate::wire::{
    self, Accept, ErrorCode, Extra, PaymentRequired, PaymentResponse, SETTLEMENT_FAILED, WireError,
    network_id,
};
use x402_transport::ServedOnce;
use x402_transport::served::{self, Taken};

/// What one paid resource costs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Price {
    /// The resource (`/api/posts/1`, or an MCP tool name).
    pub resource: String,
    /// For humans and agents.
    pub description: String,
    /// µALGO.
    pub amount: u64,
}

/// A settled payment, as the receiver records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settlement {
    /// The transaction id.
    pub txid: String,
    /// The paying account.
    pub payer: Address,
    /// µALGO received.
    pub amount: u64,
    /// µALGO the payer paid in fees.
    pub fee: u64,
    /// The round it was confirmed in.
    pub confirmed_round: u64,
    /// The paymentId it settled.
    pub payment_id: String,
    /// The resource it paid for.
    pub resource: String,
}

/// Why a payment was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The header is not a well-formed payment for this network.
    #[error(transparent)]
    Malformed(#[from] WireError),
    /// The paymentId is unknown, lapsed, or used.
    #[error(transparent)]
    PaymentId(#[from] LifecycleError),
    /// A rule of `docs/exact-algo.md` §3 is broken.
    #[error(transparent)]
    Rule(#[from] Violation),
    /// algod refused the transaction (`settlement failed`), with its message.
    #[error("settlement failed: {0}")]
    SettlementFailed(String),
    /// algod could not be reached or did not answer in time; nothing was charged for certain,
    /// and a retry of the same payment is safe.
    #[error("settlement failed: {0}")]
    Unavailable(AlgodError),
}

impl Refusal {
    /// How the refusal goes on the wire (`docs/exact-algo.md` §4): `error` is always one of
    /// the six codes ([`crate::wire::SEED_ERRORS`]), so a client written to
    /// `docs/exact-algo.md` recognises every refusal and knows what to do; `reason` is the
    /// finer stable code where none of the six is its own. Each finer case goes under the
    /// code whose remedy fits:
    ///
    /// | reason | error |
    /// |---|---|
    /// | `malformed payment`, `non-canonical encoding`, `wrong transaction type`, `multisig not accepted`, `logicsig not accepted`, `wrong network` (the envelope's) | `settlement failed` (check the wallet and retry) |
    /// | a rule's reason | see [`Violation::error_code`] |
    /// | `settlement in progress`, `storage error` | `settlement failed`, answered retryable (503) |
    /// | `algod unavailable` | `settlement failed`, answered retryable (503): the outcome is unknown, send the same payment again |
    /// | — | `unknown or expired paymentId`, `paymentId already used`, `settlement failed` (algod refused it) |
    #[must_use]
    pub fn error_code(&self) -> ErrorCode {
        let failed = |reason| ErrorCode::finer(SETTLEMENT_FAILED, reason);
        match self {
            Refusal::Malformed(WireError::Network(_)) => failed("wrong network"),
            Refusal::Malformed(WireError::Txn(TxnError::BadSignature)) => failed("bad signature"),
            Refusal::Malformed(WireError::Txn(TxnError::WrongType(_))) => {
                failed("wrong transaction type")
            }
            Refusal::Malformed(WireError::Txn(TxnError::Multisig)) => {
                failed("multisig not accepted")
            }
            Refusal::Malformed(WireError::Txn(TxnError::LogicSig)) => {
                failed("logicsig not accepted")
            }
            Refusal::Malformed(WireError::Txn(TxnError::NonCanonical)) => {
                failed("non-canonical encoding")
            }
            Refusal::Malformed(_) => failed("malformed payment"),
            Refusal::PaymentId(e) => e.error_code(),
            Refusal::Rule(v) => v.error_code(),
            Refusal::SettlementFailed(_) => ErrorCode::seed(SETTLEMENT_FAILED),
            Refusal::Unavailable(_) => failed("algod unavailable"),
        }
    }

    /// Whether the same payment may succeed if sent again (algod was unreachable).
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Refusal::Unavailable(_) | Refusal::PaymentId(LifecycleError::InProgress { .. })
        ) || matches!(self, Refusal::PaymentId(LifecycleError::Store(e)) if e.is_retryable())
    }

    /// The refusal as a rail-core error; the rail's reason code is the finest code there is
    /// ([`Refusal::reason`], else [`Refusal::code`]).
    #[must_use]
    pub fn to_rail_error(&self) -> RailError {
        let reason = RailReason::new(self.error_code().most_specific(), self.to_string());
        match self {
            Refusal::Malformed(WireError::Network(actual)) => RailError::WrongNetwork {
                expected: "this receiver's network".into(),
                actual: actual.clone(),
            },
            Refusal::Malformed(WireError::Txn(TxnError::BadSignature))
            | Refusal::Rule(Violation::BadSignature | Violation::UnauthorizedSigner { .. }) => {
                RailError::BadSignature(self.to_string())
            }
            Refusal::Malformed(_) => RailError::MalformedPayment(self.to_string()),
            // For a verifier, a payment another instance is settling right now is consumed:
            // a replay. (HTTP and MCP answer it as retryable instead: see `is_retryable`.)
            Refusal::PaymentId(LifecycleError::AlreadyUsed | LifecycleError::InProgress { .. }) => {
                RailError::Replayed {
                    key: "paymentId".into(),
                }
            }
            Refusal::PaymentId(LifecycleError::Store(e)) => RailError::Storage(e.to_string()),
            Refusal::Rule(Violation::WrongNetwork) => RailError::WrongNetwork {
                expected: "this receiver's genesis hash".into(),
                actual: "another genesis hash".into(),
            },
            Refusal::Rule(Violation::ReceiverMismatch { expected, actual }) => {
                RailError::mismatch(rail_core::Binding::Payee, expected, actual)
            }
            Refusal::Rule(Violation::Underpaid { required, actual }) => {
                RailError::mismatch(rail_core::Binding::Amount, required, actual)
            }
            Refusal::Rule(Violation::NoteMismatch) | Refusal::PaymentId(_) => RailError::mismatch(
                rail_core::Binding::Offer,
                "the offer's paymentId",
                "another",
            ),
            Refusal::Rule(_) => RailError::Declined(reason),
            Refusal::SettlementFailed(_) => RailError::Rail {
                reason,
                retryable: false,
            },
            Refusal::Unavailable(_) => RailError::Unavailable(reason),
        }
    }
}

crate::rules::code_and_reason!(
    Refusal,
    code: [
        " The `error` on the wire: one of the six codes of `docs/exact-algo.md` §4.1",
        " (`underpaid`, `receiver mismatch`, `unknown or expired paymentId`, `paymentId already",
        " used`, `transaction expired`, `settlement failed`), whatever the refusal. See",
        " [`Refusal::error_code`].",
    ],
    reason: [
        " The finer stable code sent as `reason` beside [`Refusal::code`] (`fee too high`,",
        " `bad signature`, …); `None` when the six-code `error` is the whole story.",
    ]
);

/// A callback told of every settlement (for bookkeeping, metrics, reconciliation).
pub type OnSettled = Arc<dyn Fn(&Settlement) + Send + Sync>;

/// The exact-algo receiver.
#[derive(Clone)]
pub struct ExactAlgoReceiver {
    algod: AlgodClient,
    pay_to: Address,
    genesis_hash: [u8; 32],
    network: String,
    min_fee: u64,
    max_timeout: Duration,
    settle_timeout: Duration,
    ids: PaymentIds,
    served: ServedOnce,
    clock: SharedClock,
    on_settled: Option<OnSettled>,
}

impl fmt::Debug for ExactAlgoReceiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ExactAlgoReceiver")
            .field("algod", &self.algod)
            .field("pay_to", &self.pay_to)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

impl ExactAlgoReceiver {
    /// A receiver paid into `pay_to`, asking algod for the network (genesis hash) and the
    /// minimum fee. `store` keeps paymentIds: share it (PostgreSQL) between instances.
    ///
    /// # Errors
    /// [`RailError::Unavailable`] when algod cannot be reached.
    pub async fn connect(
        algod: AlgodClient,
        pay_to: Address,
        store: Arc<dyn KeyStore>,
        clock: SharedClock,
    ) -> Result<Self, RailError> {
        let p = algod.params().await.map_err(|e| unavailable(&e))?;
        Ok(ExactAlgoReceiver {
            algod,
            pay_to,
            genesis_hash: p.genesis_hash,
            network: network_id(&p.genesis_hash),
            min_fee: p.min_fee,
            max_timeout: Duration::from_secs(120),
            settle_timeout: Duration::from_secs(60),
            ids: PaymentIds::new(store.clone()),
            served: ServedOnce::new(store),
            clock,
            on_settled: None,
        })
    }

    /// How long a challenge stays payable (`maxTimeoutSeconds`, default 120 s).
    #[must_use]
    pub fn with_max_timeout(mut self, d: Duration) -> Self {
        self.max_timeout = d;
        self
    }

    /// How long one settlement may take before a retry of the same transaction may be
    /// checked on chain by another instance (default 60 s).
    #[must_use]
    pub fn with_settle_timeout(mut self, d: Duration) -> Self {
        self.settle_timeout = d;
        self
    }

    /// Calls `f` after every settlement.
    #[must_use]
    pub fn on_settled(mut self, f: OnSettled) -> Self {
        self.on_settled = Some(f);
        self
    }

    /// The network (`algorand:…`).
    #[must_use]
    pub fn network(&self) -> &str {
        &self.network
    }

    /// The receiving address.
    #[must_use]
    pub fn pay_to(&self) -> Address {
        self.pay_to
    }

    /// The minimum fee.
    #[must_use]
    pub fn min_fee(&self) -> u64 {
        self.min_fee
    }

    /// `maxTimeoutSeconds`.
    #[must_use]
    pub fn max_timeout(&self) -> Duration {
        self.max_timeout
    }

    /// The clock.
    #[must_use]
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// The served-once record (in the receiver's store): give it to the paywall and the MCP
    /// adapter, so one payment is served once across every surface.
    #[must_use]
    pub fn served(&self) -> &ServedOnce {
        &self.served
    }

    /// The algod client.
    #[must_use]
    pub fn algod(&self) -> &AlgodClient {
        &self.algod
    }

    fn binding(&self, price: &Price) -> String {
        payment_id::binding(&price.resource, price.amount, &self.pay_to.to_string())
    }

    /// A challenge (`accepts[]` entry) for `price`, with a fresh single-use paymentId.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn challenge(&self, price: &Price) -> Result<Accept, RailError> {
        let pid = self
            .ids
            .issue(self.max_timeout, &self.binding(price))
            .await
            .map_err(|e| Refusal::PaymentId(e).to_rail_error())?;
        Ok(Accept {
            scheme: "exact".into(),
            network: self.network.clone(),
            asset: "ALGO".into(),
            max_amount_required: price.amount.to_string(),
            resource: price.resource.clone(),
            description: price.description.clone(),
            pay_to: self.pay_to.to_string(),
            max_timeout_seconds: self.max_timeout.as_secs(),
            extra: Extra {
                payment_id: pid,
                min_fee_micro_algo: self.min_fee,
            },
        })
    }

    /// The 402 body for `price` with `error` (`payment required`, or why a payment was refused).
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn payment_required(
        &self,
        price: &Price,
        error: &str,
    ) -> Result<PaymentRequired, RailError> {
        Ok(PaymentRequired {
            x402_version: 2,
            error: error.to_owned(),
            reason: None,
            accepts: vec![self.challenge(price).await?],
        })
    }

    /// The 402 body answering `refusal`: a fresh challenge for `price`, with the refusal's
    /// code (`docs/exact-algo.md` §4.1) as `error` and its finer code, if any, as `reason`.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn refused(
        &self,
        price: &Price,
        refusal: &Refusal,
    ) -> Result<PaymentRequired, RailError> {
        let code = refusal.error_code();
        Ok(PaymentRequired {
            x402_version: 2,
            error: code.error.to_owned(),
            reason: code.reason.map(str::to_owned),
            accepts: vec![self.challenge(price).await?],
        })
    }

    /// Verifies and settles the `PAYMENT-SIGNATURE` header `header` for `price` (the whole flow of
    /// `docs/exact-algo.md`; see the module docs). `expect_pid`, when given, is the one paymentId
    /// this payment must carry (a rail-core offer names it).
    ///
    /// # Errors
    /// A [`Refusal`]; nothing was charged unless it is [`Refusal::Unavailable`] after a
    /// submission, in which case a retry of the same header settles it at most once.
    pub async fn settle(
        &self,
        header: &str,
        price: &Price,
        expect_pid: Option<&str>,
    ) -> Result<PaymentResponse, Refusal> {
        let (_, signed) = wire::decode_payment_header(header, &self.network)?;
        self.settle_signed(&signed, price, expect_pid).await
    }

    /// As [`ExactAlgoReceiver::settle`], for an already decoded payment: checked, settled
    /// and answered at most once per paymentId under the transport's served-once record
    /// ([`x402_transport::ServedOnce`], shared with the paywall and the MCP adapter).
    ///
    /// # Errors
    /// A [`Refusal`].
    pub async fn settle_signed(
        &self,
        signed: &SignedPay,
        price: &Price,
        expect_pid: Option<&str>,
    ) -> Result<PaymentResponse, Refusal> {
        signed
            .verify_signature()
            .map_err(|_| Refusal::Rule(Violation::BadSignature))?;
        let serving = match self.served.reserve(&self.served_key(signed)).await {
            Ok(r) => r,
            Err(Taken::Used) => return Err(LifecycleError::AlreadyUsed.into()),
            Err(Taken::InFlight) => {
                return Err(LifecycleError::InProgress {
                    retry_after: Duration::from_secs(1),
                }
                .into());
            }
            Err(Taken::Store(e)) => return Err(LifecycleError::Store(e).into()),
        };
        match serving
            .keep_alive(self.settle_core(signed, price, expect_pid))
            .await
        {
            Ok((response, _)) => {
                served::commit(serving).await;
                Ok(response)
            }
            Err(r) => {
                served::release(serving).await;
                Err(r)
            }
        }
    }

    /// The served-once key of a payment: the network and its paymentId (its note), or its
    /// transaction id when the note is no paymentId (such a payment is refused by
    /// [`ExactAlgoReceiver::settle_core`]).
    #[must_use]
    pub fn served_key(&self, signed: &SignedPay) -> String {
        match note_payment_id(signed) {
            Some(pid) => format!("{}:{pid}", self.network),
            None => format!("{}:txid:{}", self.network, signed.txn.id()),
        }
    }

    /// The flow of `docs/exact-algo.md` for a decoded payment (see the module docs), without the
    /// served-once record: verify, take the paymentId, submit, wait for confirmation. Settling the
    /// same transaction again answers its first settlement (checked on chain), never a second
    /// transfer; whoever calls it serves the answer at most once (the transport does).
    ///
    /// # Errors
    /// A [`Refusal`].
    pub async fn settle_core(
        &self,
        signed: &SignedPay,
        price: &Price,
        expect_pid: Option<&str>,
    ) -> Result<(PaymentResponse, Settlement), Refusal> {
        // The signature first: nothing in the payload is believed before it verifies.
        signed
            .verify_signature()
            .map_err(|_| Refusal::Rule(Violation::BadSignature))?;
        let pid = match expect_pid {
            Some(p) => Some(p.to_owned()),
            None => note_payment_id(signed),
        };
        let binding = self.binding(price);
        let req = Requirement {
            pay_to: self.pay_to,
            amount: price.amount,
            payment_id: pid.clone().unwrap_or_default(),
            min_fee: self.min_fee,
            genesis_hash: self.genesis_hash,
        };
        let round = self
            .algod
            .last_round()
            .await
            .map_err(Refusal::Unavailable)?;
        let auth_addr = match signed.auth {
            Some(_) => {
                self.algod
                    .account(&signed.txn.sender)
                    .await
                    .map_err(Refusal::Unavailable)?
                    .auth_addr
            }
            None => None,
        };
        let txid = signed.txn.id();
        // Every rule before any state is touched. Only the time-dependent ones may yield to a
        // resumed settlement (the transaction may have confirmed before it expired).
        let chain = ChainView { round, auth_addr };
        let ruled = rules::check(signed, &req, &chain);
        let Some(pid) = pid else {
            // The note is no paymentId at all: report the first other rule it breaks, if any.
            return Err(match ruled {
                Err(v) if v != Violation::NoteMismatch => v.into(),
                _ => LifecycleError::UnknownOrExpired.into(),
            });
        };
        if let Err(v) = &ruled
            && !matches!(v, Violation::Expired { .. } | Violation::NotYetValid { .. })
        {
            return Err(v.clone().into());
        }
        // A settler that crashed after submitting leaves its write-ahead record: the same
        // transaction presented again is checked on chain instead of being refused.
        match self
            .ids
            .begin(&pid, &binding, &txid, self.settle_timeout)
            .await
        {
            Ok(Begin::Resume(settling)) => {
                tracing::info!(txid = %txid, "resuming a settlement whose settler did not finish");
                // The chain may already have it (never resubmit what confirmed).
                let resume = async {
                    match self.algod.pending(&txid).await {
                        Ok(p) if p.confirmed_round.is_some() => {
                            Ok(p.confirmed_round.unwrap_or_default())
                        }
                        _ => self.submit(signed, &txid).await,
                    }
                };
                let round = match settling {
                    Some(s) => {
                        let round = s.keep_alive(resume).await;
                        match &round {
                            // Settled on chain: a failed record write is logged, the payer served.
                            Ok(_) => {
                                if let Err(e) = s.settled().await {
                                    tracing::error!(txid = %txid, error = %e, "settled, but could not record it");
                                }
                            }
                            // Not settled by this resume: the record stays (the transaction
                            // may have confirmed and been forgotten by algod's pool; a
                            // resubmission past its window is refused as dead). The paymentId
                            // is never freed for another transaction by a resume.
                            Err(_) => drop(s),
                        }
                        round?
                    }
                    None => resume.await?,
                };
                Ok(self.answer(signed, &txid, round, &pid, price))
            }
            Ok(Begin::Fresh(settling)) => {
                if let Err(v) = ruled {
                    settling.failed().await?;
                    return Err(v.into());
                }
                return match settling.keep_alive(self.submit(signed, &txid)).await {
                    Ok(round) => {
                        // Settled on chain: a failed record write is logged, the payer served
                        // (at most once: `serve_once`).
                        if let Err(e) = settling.settled().await {
                            tracing::error!(txid = %txid, error = %e, "settled, but could not record it");
                        }
                        Ok(self.answer(signed, &txid, round, &pid, price))
                    }
                    Err(Refusal::Unavailable(e)) => {
                        // Unknown outcome: keep the write-ahead record. A retry of this same
                        // payment resumes once the settle timeout passed; nothing else may use
                        // the paymentId.
                        tracing::warn!(txid = %txid, error = %e, "settlement outcome unknown");
                        drop(settling);
                        Err(Refusal::Unavailable(e))
                    }
                    Err(other) => {
                        settling.failed().await?;
                        Err(other)
                    }
                };
            }
            Err(LifecycleError::UnknownOrExpired) => {
                ruled?;
                Err(LifecycleError::UnknownOrExpired.into())
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Submits (or finds already submitted) and waits for confirmation.
    async fn submit(&self, signed: &SignedPay, txid: &str) -> Result<u64, Refusal> {
        match self.algod.submit(&signed.encode()).await {
            Ok(id) if id == txid => {}
            Ok(id) => {
                return Err(Refusal::SettlementFailed(format!(
                    "algod reported txid {id} for transaction {txid}"
                )));
            }
            Err(AlgodError::Http { message, .. })
                if message.contains(&format!("transaction already in ledger: {txid}")) => {}
            Err(e) if e.is_retryable() => return Err(Refusal::Unavailable(e)),
            Err(e) => return Err(Refusal::SettlementFailed(e.message())),
        }
        match self
            .algod
            .wait_for_confirmation(txid, signed.txn.last_valid)
            .await
        {
            Ok(r) => Ok(r),
            Err(e @ (AlgodError::PoolError { .. } | AlgodError::NotConfirmed { .. })) => {
                Err(Refusal::SettlementFailed(e.message()))
            }
            Err(e) => Err(Refusal::Unavailable(e)),
        }
    }

    fn answer(
        &self,
        signed: &SignedPay,
        txid: &str,
        confirmed_round: u64,
        pid: &str,
        price: &Price,
    ) -> (PaymentResponse, Settlement) {
        let s = Settlement {
            txid: txid.to_owned(),
            payer: signed.txn.sender,
            amount: signed.txn.amount,
            fee: signed.txn.fee,
            confirmed_round,
            payment_id: pid.to_owned(),
            resource: price.resource.clone(),
        };
        tracing::info!(txid, payer = %s.payer, amount = s.amount, round = confirmed_round, resource = %s.resource, "exact-algo: settled");
        if let Some(f) = &self.on_settled {
            f(&s);
        }
        let response = PaymentResponse {
            success: true,
            transaction: s.txid.clone(),
            network: self.network.clone(),
            payer: s.payer.to_string(),
            amount: s.amount.to_string(),
            confirmed_round,
        };
        (response, s)
    }
}

/// The paymentId a payment's note carries (32 hex digits), if it carries one.
fn note_payment_id(signed: &SignedPay) -> Option<String> {
    std::str::from_utf8(&signed.txn.note)
        .ok()
        .filter(|s| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned)
}

fn unavailable(e: &AlgodError) -> RailError {
    RailError::Unavailable(RailReason::new("algod", e.to_string()))
}

/// One refusal of every kind (each variant, each distinct code), for the tests that check
/// every refusal's wire code.
#[cfg(test)]
pub(crate) fn every_refusal() -> Vec<Refusal> {
    use crate::algod::AlgodError;
    use crate::msgpack::MsgpackError;

    let a = Address([7; 32]);
    let txn_errors = [
        TxnError::Msgpack(MsgpackError::Trailing(1)),
        TxnError::NotAMap("x"),
        TxnError::UnknownField("x".into()),
        TxnError::MissingField("x"),
        TxnError::FieldType("x"),
        TxnError::WrongType("axfer".into()),
        TxnError::Multisig,
        TxnError::LogicSig,
        TxnError::NonCanonical,
        TxnError::NoteTooLong,
        TxnError::BadSignature,
    ];
    let mut all: Vec<Refusal> = txn_errors
        .into_iter()
        .map(|e| Refusal::Malformed(WireError::Txn(e)))
        .collect();
    for w in [
        WireError::Header,
        WireError::Base64,
        WireError::Json("x".into()),
        WireError::Version(1),
        WireError::Scheme("upto".into()),
        WireError::Network("algorand:x".into()),
        WireError::TxnBase64,
    ] {
        all.push(Refusal::Malformed(w));
    }
    all.push(Refusal::PaymentId(LifecycleError::UnknownOrExpired));
    all.push(Refusal::PaymentId(LifecycleError::AlreadyUsed));
    all.push(Refusal::PaymentId(LifecycleError::InProgress {
        retry_after: Duration::from_secs(1),
    }));
    all.push(Refusal::PaymentId(LifecycleError::Store(
        RailError::Storage("down".into()),
    )));
    for v in [
        Violation::BadSignature,
        Violation::UnauthorizedSigner { signer: a },
        Violation::Grouped,
        Violation::ReceiverMismatch {
            expected: a,
            actual: a,
        },
        Violation::Underpaid {
            required: 2,
            actual: 1,
        },
        Violation::NoteMismatch,
        Violation::FeeTooHigh { fee: 3000 },
        Violation::FeeTooLow { fee: 1, min: 1000 },
        Violation::Rekey,
        Violation::CloseTo,
        Violation::WrongNetwork,
        Violation::Expired {
            last_valid: 1,
            round: 2,
        },
        Violation::NotYetValid {
            first_valid: 9,
            round: 2,
        },
        Violation::BadWindow {
            first_valid: 1,
            last_valid: 5000,
        },
    ] {
        // Exhaustive: a new violation breaks this list until it is added.
        match v {
            Violation::BadSignature
            | Violation::UnauthorizedSigner { .. }
            | Violation::Grouped
            | Violation::ReceiverMismatch { .. }
            | Violation::Underpaid { .. }
            | Violation::NoteMismatch
            | Violation::FeeTooHigh { .. }
            | Violation::FeeTooLow { .. }
            | Violation::Rekey
            | Violation::CloseTo
            | Violation::WrongNetwork
            | Violation::Expired { .. }
            | Violation::NotYetValid { .. }
            | Violation::BadWindow { .. } => all.push(Refusal::Rule(v)),
        }
    }
    all.push(Refusal::SettlementFailed("overspend".into()));
    all.push(Refusal::Unavailable(AlgodError::Transport("down".into())));
    for r in &all {
        // Exhaustive: a new kind of refusal breaks this list until it is added.
        match r {
            Refusal::Malformed(_)
            | Refusal::PaymentId(_)
            | Refusal::Rule(_)
            | Refusal::SettlementFailed(_)
            | Refusal::Unavailable(_) => {}
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::SEED_ERRORS;

    #[test]
    fn every_refusal_is_sent_under_one_of_the_six_seed_codes() {
        for r in every_refusal() {
            assert!(
                SEED_ERRORS.contains(&r.code()),
                "{r:?} is sent as {:?}",
                r.code()
            );
            // A reason is only sent when it says more than the six-code `error`.
            assert_ne!(r.reason(), Some(r.code()), "{r:?}");
            if let Some(reason) = r.reason() {
                assert!(!SEED_ERRORS.contains(&reason), "{r:?}: reason {reason:?}");
            }
        }
    }

    #[test]
    fn the_seed_cases_carry_no_reason() {
        let seed_cases = [
            Refusal::Rule(Violation::Underpaid {
                required: 2,
                actual: 1,
            }),
            Refusal::Rule(Violation::ReceiverMismatch {
                expected: Address([1; 32]),
                actual: Address([2; 32]),
            }),
            Refusal::PaymentId(LifecycleError::UnknownOrExpired),
            Refusal::PaymentId(LifecycleError::AlreadyUsed),
            Refusal::Rule(Violation::Expired {
                last_valid: 1,
                round: 2,
            }),
            Refusal::SettlementFailed("overspend".into()),
        ];
        let codes: Vec<_> = seed_cases.iter().map(Refusal::error_code).collect();
        assert_eq!(
            codes,
            SEED_ERRORS.map(ErrorCode::seed),
            "one case per seed code, in the seed's order"
        );
    }

    #[test]
    fn the_rail_error_kind_is_unchanged_and_its_reason_is_the_finest_code() {
        let r = Refusal::Rule(Violation::FeeTooHigh { fee: 3000 });
        match r.to_rail_error() {
            RailError::Declined(reason) => assert_eq!(reason.code, "fee too high"),
            other => panic!("{other:?}"),
        }
        let r = Refusal::Unavailable(AlgodError::Transport("down".into()));
        match r.to_rail_error() {
            RailError::Unavailable(reason) => assert_eq!(reason.code, "algod unavailable"),
            other => panic!("{other:?}"),
        }
        let r = Refusal::SettlementFailed("overspend".into());
        match r.to_rail_error() {
            RailError::Rail { reason, retryable } => {
                assert_eq!(
                    (reason.code.as_str(), retryable),
                    ("settlement failed", false)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Refusal::Rule(Violation::BadSignature).to_rail_error(),
            RailError::BadSignature(_)
        ));
        assert!(matches!(
            Refusal::Malformed(WireError::Network("algorand:x".into())).to_rail_error(),
            RailError::WrongNetwork { .. }
        ));
    }
}
