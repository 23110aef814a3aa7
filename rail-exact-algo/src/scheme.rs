//! exact-algo as an [`x402_transport::Scheme`]: the native-ALGO payment of `docs/exact-algo.md`
//! in x402's envelope, served by the shared paywall and MCP adapter. The wire is that document's
//! (§2, §5): the 402 body has no `resource` object, the envelope names `scheme` and `network` at
//! its top, `payload.txn` carries the signed transaction, and every refusal's `error` is one of
//! the six codes (§4.1).
//!
//! ```no_run
//! # async fn demo(receiver: rail_exact_algo::ExactAlgoReceiver) -> Result<(), x402_transport::Error> {
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use rail_exact_algo::ExactAlgo;
//! use x402_transport::{Accepts, paywall::Paywall};
//!
//! let algo = Arc::new(ExactAlgo::new(receiver));
//! let paywall = Paywall::new().route("/api/posts/{id}", "read post body", Accepts::one(algo, 1_000)?);
//! let app: Router = paywall.apply(Router::new().route("/api/posts/{id}", get(|| async { "the body" })));
//! # let _ = app; Ok(()) }
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use rail_core::Timestamp;
use serde_json::{Value, json};
use x402_transport::{
    Busy, Failure, Presented, Price as TransportPrice, Refusal as WireRefusal, Scheme, SchemeInfo,
    Settled, Verified,
};

use crate::payer::{ExactAlgoPayer, PayError};
use crate::receiver::{ExactAlgoReceiver, Price, Refusal};
use crate::txn::SignedPay;
use crate::wire::{self, PAYMENT_ID_ALREADY_USED, PaymentResponse, SETTLEMENT_FAILED};

/// The label of this scheme among the transport's schemes.
pub const LABEL: &str = "exact-algo";
/// The `error` of a challenge for a request that carried no payment (`docs/exact-algo.md` §2.1).
pub const PAYMENT_REQUIRED_ERROR: &str = "payment required";
/// The free MCP tool describing the scheme (`docs/exact-algo.md` §5).
pub const PAYMENT_INSTRUCTIONS: &str = "payment_instructions";

/// exact-algo (`docs/exact-algo.md`), settled by one receiver.
#[derive(Clone, Debug)]
pub struct ExactAlgo {
    info: SchemeInfo,
    receiver: ExactAlgoReceiver,
}

/// A payment this scheme checked: the decoded, signature-checked transaction.
#[derive(Clone, Debug)]
pub struct AlgoPayment {
    /// The signed payment.
    pub signed: SignedPay,
}

impl ExactAlgo {
    /// The scheme for `receiver`'s network and address.
    #[must_use]
    pub fn new(receiver: ExactAlgoReceiver) -> Self {
        ExactAlgo {
            info: SchemeInfo {
                scheme: "exact".into(),
                network: receiver.network().to_owned(),
                label: LABEL.into(),
                v1_network: None,
            },
            receiver,
        }
    }

    /// The receiver.
    #[must_use]
    pub fn receiver(&self) -> &ExactAlgoReceiver {
        &self.receiver
    }

    fn price(price: &TransportPrice) -> Result<Price, Failure> {
        Ok(Price {
            resource: price.resource.clone(),
            description: price.description.clone(),
            amount: u64::try_from(price.amount).map_err(|_| {
                Failure::internal(format!(
                    "{} µALGO is more than any account holds",
                    price.amount
                ))
            })?,
        })
    }
}

/// A receiver's refusal as the transport answers it: its code (`docs/exact-algo.md` §4.1) as
/// `error`.
#[must_use]
pub fn failure(r: &Refusal) -> Failure {
    let reason = r.reason().map(str::to_owned);
    if r.is_retryable() {
        Failure::Unknown {
            error: r.code().to_owned(),
            reason,
            detail: r.to_string(),
        }
    } else {
        Failure::Refused(WireRefusal::new(r.code(), r.to_string()).with_reason(reason))
    }
}

/// A refusal with `settlement failed` and a finer `reason` (`docs/exact-algo.md` §4.2).
fn settlement_failed(reason: &str, detail: impl Into<String>) -> WireRefusal {
    WireRefusal::new(SETTLEMENT_FAILED, detail).with_reason(Some(reason.to_owned()))
}

/// An unknown outcome with `settlement failed` and a finer `reason` (`docs/exact-algo.md` §4.2).
fn unknown(reason: &str, detail: impl Into<String>) -> Failure {
    Failure::Unknown {
        error: SETTLEMENT_FAILED.into(),
        reason: Some(reason.to_owned()),
        detail: detail.into(),
    }
}

/// [`Scheme::check_amount`] of an Algorand amount: not zero, and within a u64 (else
/// `too_large()` says why).
pub(crate) fn check_u64_amount(
    amount: u128,
    too_large: impl FnOnce() -> String,
) -> Result<(), String> {
    if amount == 0 {
        return Err("a price of zero is not a payment".into());
    }
    u64::try_from(amount).map(|_| ()).map_err(|_| too_large())
}

/// `value` as an `accepts[]` entry; one that does not serialize is an internal error.
pub(crate) fn entry_of<T: serde::Serialize>(
    value: &T,
) -> Result<x402_transport::wire::Entry, Failure> {
    x402_transport::wire::entry(value).map_err(|e| Failure::internal(e.to_string()))
}

/// `value` as JSON (an answer the transport hands on); one that does not serialize is an
/// internal error.
pub(crate) fn json_of<T: serde::Serialize>(value: &T) -> Result<Value, Failure> {
    serde_json::to_value(value).map_err(|e| Failure::internal(e.to_string()))
}

/// The receipt an MCP tool result carries in `structuredContent.receipt` (`docs/exact-algo.md`
/// §2.4, §5).
#[must_use]
pub fn mcp_receipt(r: &PaymentResponse) -> Value {
    json!({
        "success": r.success,
        "transaction": r.transaction,
        "confirmedRound": r.confirmed_round,
        "payer": r.payer,
        "amount": r.amount,
    })
}

#[async_trait]
impl Scheme for ExactAlgo {
    fn info(&self) -> &SchemeInfo {
        &self.info
    }

    fn is_network(&self, network: &str) -> bool {
        wire::same_network(network, &self.info.network)
    }

    fn check_amount(&self, amount: u128) -> Result<(), String> {
        check_u64_amount(amount, || {
            format!("{amount} µALGO does not fit an Algorand amount (u64)")
        })
    }

    fn claims(&self, envelope: &Value) -> bool {
        envelope.get("accepted").is_none()
            && envelope.get("scheme").and_then(Value::as_str) == Some("exact")
            && envelope
                .get("network")
                .and_then(Value::as_str)
                .is_some_and(|n| self.is_network(n))
            && envelope.pointer("/payload/txn").is_some()
    }

    async fn requirements(
        &self,
        price: &TransportPrice,
    ) -> Result<x402_transport::wire::Entry, Failure> {
        let accept = self
            .receiver
            .challenge(&Self::price(price)?)
            .await
            .map_err(|e| unknown("storage error", e.to_string()))?;
        entry_of(&accept)
    }

    async fn check(
        &self,
        presented: &Presented,
        _price: &TransportPrice,
        _now: Timestamp,
    ) -> Result<Verified, Failure> {
        let header = match presented {
            Presented::Header(h) => h.clone(),
            // Tolerated over MCP: the envelope as a JSON object instead of its base64.
            Presented::Object(v) => wire::header(v).map_err(|e| {
                Failure::Refused(settlement_failed("malformed payment", e.to_string()))
            })?,
            Presented::V1Header(_) => {
                return Err(Failure::Refused(settlement_failed(
                    "malformed payment",
                    "exact-algo has no x402 v1 form",
                )));
            }
        };
        let (_, signed) = wire::decode_payment_header(&header, self.receiver.network())
            .map_err(|e| failure(&Refusal::Malformed(e)))?;
        // The signature first: nothing in the payload is believed before it verifies.
        signed
            .verify_signature()
            .map_err(|_| failure(&Refusal::Rule(crate::rules::Violation::BadSignature)))?;
        Ok(Verified {
            key: self.receiver.served_key(&signed),
            payer: Some(signed.txn.sender.to_string()),
            payment: Arc::new(AlgoPayment { signed }),
        })
    }

    /// Settle-after: a simulation of the signed payment where algod offers one (a 404 leaves the
    /// verdict to settlement, as before); the rules and paymentId of `docs/exact-algo.md` §3 are
    /// still checked when settling.
    async fn verify(
        &self,
        payment: &Verified,
        _price: &TransportPrice,
    ) -> Result<x402_transport::Verdict, Failure> {
        use crate::txn::{Member, SignedTxn, Transaction};
        let p = payment.payment::<AlgoPayment>()?;
        let member = Member::Signed(SignedTxn {
            txn: Transaction::Pay(p.signed.txn.clone()),
            sig: p.signed.sig,
            auth: p.signed.auth,
        });
        match self.receiver.algod().simulate(&[member], false).await {
            Ok(None) | Err(crate::algod::AlgodError::Http { status: 404, .. }) => {
                Ok(x402_transport::Verdict::Valid)
            }
            Ok(Some((_, m))) if m.contains("transaction already in ledger") => {
                Ok(x402_transport::Verdict::MaybeSettled)
            }
            Ok(Some((_, m))) => Err(Failure::Refused(settlement_failed("simulation failed", m))),
            Err(e) if e.is_retryable() => Err(unknown("algod unavailable", e.to_string())),
            Err(e) => Err(Failure::Refused(settlement_failed(
                "simulation failed",
                e.message(),
            ))),
        }
    }

    async fn settle(&self, payment: &Verified, price: &TransportPrice) -> Result<Settled, Failure> {
        let p = payment.payment::<AlgoPayment>()?;
        match self
            .receiver
            .settle_core(&p.signed, &Self::price(price)?, None)
            .await
        {
            Ok((response, _)) => Ok(Settled {
                transaction: response.transaction.clone(),
                receipt: Some(mcp_receipt(&response)),
                response: json_of(&response)?,
            }),
            Err(r) => Err(failure(&r)),
        }
    }

    fn replayed(&self) -> WireRefusal {
        WireRefusal::new(PAYMENT_ID_ALREADY_USED, "this payment was already served")
    }

    fn malformed(&self, detail: &str) -> WireRefusal {
        settlement_failed("malformed payment", detail)
    }

    fn unavailable(&self, why: Busy, detail: &str) -> Failure {
        match why {
            Busy::InFlight => unknown("settlement in progress", detail),
            Busy::Store => unknown("storage error", detail),
        }
    }

    fn mcp_hints(&self) -> Option<(String, Value)> {
        Some((
            "how_to_pay".into(),
            json!({"tool": PAYMENT_INSTRUCTIONS, "scheme": LABEL}),
        ))
    }

    fn required_error(&self) -> &str {
        PAYMENT_REQUIRED_ERROR
    }

    fn wants_resource(&self) -> bool {
        false
    }
}

/// The paying side: an [`ExactAlgoPayer`] as a payer of the shared client
/// ([`x402_transport::client::Client`]), with the network of its algod read once
/// ([`ExactAlgoPayer::for_client`]). It pays only exact-algo entries its policy allows.
#[derive(Clone, Debug)]
pub struct ClientPayer {
    payer: ExactAlgoPayer,
    network: String,
}

impl ExactAlgoPayer {
    /// This payer for the shared client: asks algod for its network once.
    ///
    /// # Errors
    /// [`PayError`] if algod cannot be reached.
    pub async fn for_client(self) -> Result<ClientPayer, PayError> {
        let params = self.algod.params().await?;
        Ok(ClientPayer {
            network: wire::network_id(&params.genesis_hash),
            payer: self,
        })
    }
}

impl ClientPayer {
    /// The payer.
    #[must_use]
    pub fn payer(&self) -> &ExactAlgoPayer {
        &self.payer
    }

    fn accept(entry: &Value) -> Result<wire::Accept, String> {
        serde_json::from_value(entry.clone()).map_err(|_| "not an exact-algo entry".to_owned())
    }
}

#[async_trait]
impl x402_transport::client::SchemePayer for ClientPayer {
    fn label(&self) -> &str {
        LABEL
    }

    fn rail(&self) -> &str {
        crate::rail::RAIL
    }

    fn refusal(&self, entry: &Value) -> Option<String> {
        match Self::accept(entry) {
            Ok(a) => self
                .payer
                .choose(std::slice::from_ref(&a), &self.network)
                .err()
                .map(|e| e.to_string()),
            Err(e) => Some(e),
        }
    }

    fn amount(&self, entry: &Value) -> Option<u128> {
        let a = Self::accept(entry).ok()?;
        a.max_amount_required.parse::<u64>().ok().map(u128::from)
    }

    /// Native ALGO, in microALGO.
    fn asset(&self, entry: &Value) -> Option<rail_core::Asset> {
        Self::accept(entry).ok().map(|_| rail_core::Asset::algo())
    }

    async fn pay(
        &self,
        required: &x402_transport::wire::PaymentRequired,
        entry: &Value,
    ) -> Result<Value, String> {
        let body = wire::PaymentRequired {
            x402_version: 2,
            error: required.error.clone().unwrap_or_default(),
            reason: None,
            accepts: vec![Self::accept(entry)?],
        };
        let signed = self
            .payer
            .pay_required(&body)
            .await
            .map_err(|e| e.to_string())?;
        x402_transport::wire::decode_base64_json(&signed.header).map_err(|e| e.to_string())
    }
}
