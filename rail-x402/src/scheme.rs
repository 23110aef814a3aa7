//! `exact` on EVM (EIP-3009) as an [`x402_transport::Scheme`]: what the shared transport's
//! paywall, MCP adapter and client need from this rail. The wire is x402 v2's (and v1's, opt in),
//! byte-compatible with the reference SDK; the payment is settled by a [`X402Facilitator`].
//!
//! ```no_run
//! # async fn demo(facilitator: std::sync::Arc<dyn rail_x402::facilitator::X402Facilitator>)
//! #     -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use axum::{Router, routing::get};
//! use rail_x402::{ExactEvm, Token};
//! use x402_transport::{Accepts, paywall::Paywall};
//!
//! let usdc = Token::new("eip155:84532", "0x036CbD53842c5426634e7929541eC2318f3dCF7e".parse()?, "USDC", "2");
//! let evm = Arc::new(ExactEvm::new(facilitator, usdc, "0x209693Bc6afc0C5328bA36FaF03C514EF312287C".parse()?));
//! let paywall = Paywall::new().route("/weather", "Today's weather", Accepts::one(evm, 1_000)?);
//! let app: Router = paywall.apply(Router::new().route("/weather", get(|| async { "sunny" })));
//! # let _ = app; Ok(()) }
//! ```

use std::sync::Arc;

use alloy_primitives::{Address, U256};
use async_trait::async_trait;
use rail_core::Timestamp;
use serde_json::Value;
use serde_json::value::RawValue;
use x402_transport::wire::Entry;
use x402_transport::{
    Failure, Presented, Price, Refusal, Scheme, SchemeInfo, Settled, Verdict, Verified,
};

use crate::facilitator::{SettleOutcome, X402Facilitator, settle_for_serving};
use crate::payer::X402Payer;
use crate::token::Token;
use crate::v1::{PaymentPayloadV1, PaymentRequirementsV1, SettleResponseV1};
use crate::verify::{find_matching_requirements, precheck, reasons, unix_secs};
use crate::wire::{
    Extra, PaymentPayload, PaymentRequired, PaymentRequirements, SCHEME_EXACT, SettleResponse, V2,
};

/// The label of this scheme among the transport's schemes.
pub const LABEL: &str = "exact-evm";

/// The rail's name (rail-core's [`rail_core::RailId`] of [`crate::rail`]; re-exported there).
pub const RAIL: &str = "x402";

/// The `maxTimeoutSeconds` a receiver publishes unless told otherwise: in the x402 challenge
/// ([`ExactEvm`]) and in the requirements of a Quote's x402 offer
/// ([`crate::rail::X402Receiver`]) alike, so one gateway never publishes two windows for one
/// payment (the reference SDK's default, too).
pub const DEFAULT_MAX_TIMEOUT_SECONDS: u64 = 60;

/// `exact` on one EVM network, in one EIP-3009 token, paid to one address.
#[derive(Clone, Debug)]
pub struct ExactEvm {
    info: SchemeInfo,
    facilitator: Arc<dyn X402Facilitator>,
    token: Token,
    pay_to: Address,
    max_timeout_seconds: u64,
}

/// A payment this scheme checked: the payload (a v1 one as its v2 equivalent) and the
/// requirements it was checked against.
#[derive(Clone, Debug)]
pub struct EvmPayment {
    /// The payload.
    pub payload: PaymentPayload,
    /// The requirements.
    pub requirements: PaymentRequirements,
}

/// The served-once key of a payment: `(network, token, from, nonce)` (as before the transport
/// was shared, so records already written keep their meaning).
#[must_use]
pub fn served_key(p: &PaymentPayload) -> String {
    let a = &p.payload.authorization;
    format!(
        "{}:{}:{}:{}",
        p.accepted.network,
        p.accepted.asset.to_ascii_lowercase(),
        a.from.address(),
        a.nonce
    )
}

fn refuse(reason: &str, detail: impl Into<String>) -> Failure {
    Failure::Refused(Refusal::new(reason, detail))
}

fn unknown(detail: impl Into<String>) -> Failure {
    Failure::Unknown {
        error: reasons::FACILITATOR_UNAVAILABLE.into(),
        reason: None,
        detail: detail.into(),
    }
}

impl ExactEvm {
    /// Payments to `pay_to` in `token`, settled by `facilitator`; `maxTimeoutSeconds`
    /// [`DEFAULT_MAX_TIMEOUT_SECONDS`].
    #[must_use]
    pub fn new(facilitator: Arc<dyn X402Facilitator>, token: Token, pay_to: Address) -> Self {
        ExactEvm {
            info: SchemeInfo {
                scheme: SCHEME_EXACT.into(),
                network: token.network.clone(),
                label: LABEL.into(),
                v1_network: None,
            },
            facilitator,
            token,
            pay_to,
            max_timeout_seconds: DEFAULT_MAX_TIMEOUT_SECONDS,
        }
    }

    /// `maxTimeoutSeconds` of every challenge (default [`DEFAULT_MAX_TIMEOUT_SECONDS`]).
    #[must_use]
    pub const fn max_timeout_seconds(mut self, secs: u64) -> Self {
        self.max_timeout_seconds = secs;
        self
    }

    /// Also speaks x402 **v1** (`X-PAYMENT`, the v1 402 body, `X-PAYMENT-RESPONSE`). `name` is
    /// the v1 network name of the token's chain; `None` takes it from
    /// [`crate::v1::EVM_NETWORKS`].
    ///
    /// # Errors
    /// A message when the chain has no v1 name.
    pub fn accept_v1(mut self, name: Option<&str>) -> Result<Self, String> {
        let chain = crate::verify::eip155_chain_id(&self.token.network)
            .ok_or_else(|| format!("{} is not eip155", self.token.network))?;
        let name = match name {
            Some(n) => n.to_owned(),
            None => crate::v1::EVM_NETWORKS
                .iter()
                .find(|(_, id)| *id == chain)
                .map(|(n, _)| (*n).to_owned())
                .ok_or_else(|| format!("chain {chain} has no v1 network name; give one"))?,
        };
        self.info.v1_network = Some(name);
        Ok(self)
    }

    /// The token.
    #[must_use]
    pub fn token(&self) -> &Token {
        &self.token
    }

    /// The recipient.
    #[must_use]
    pub const fn pay_to(&self) -> Address {
        self.pay_to
    }

    /// The facilitator.
    #[must_use]
    pub fn facilitator(&self) -> &Arc<dyn X402Facilitator> {
        &self.facilitator
    }

    /// This scheme alone as the ways to pay a route or a tool, at `amount` atomic units
    /// (checked as the transport checks every price: [`x402_transport::Accepts::one`]).
    ///
    /// # Errors
    /// [`x402_transport::Error::Price`] for a price this scheme cannot ask (zero).
    pub fn accepts(&self, amount: u128) -> Result<x402_transport::Accepts, x402_transport::Error> {
        x402_transport::Accepts::one(Arc::new(self.clone()), amount)
    }

    /// The shared paywall ([`x402_transport::paywall::Paywall`]) with `routes` —
    /// `(pattern, amount in atomic units, description)`, matched on the percent-decoded path,
    /// the first match winning — paid in this scheme alone, settling before the handler; give
    /// it a store, a clock or [`x402_transport::SettleWhen::After`] with its own builders.
    ///
    /// # Errors
    /// [`x402_transport::Error::Price`] for a route priced at what this scheme cannot ask.
    #[cfg(feature = "paywall")]
    pub fn paywall(
        &self,
        routes: &[(&str, u128, &str)],
    ) -> Result<x402_transport::paywall::Paywall, x402_transport::Error> {
        routes.iter().try_fold(
            x402_transport::paywall::Paywall::new(),
            |p, (pattern, amount, description)| {
                Ok(p.route(pattern, description, self.accepts(*amount)?))
            },
        )
    }

    /// The 402 body of `resource` (a URL, or `mcp://tool/NAME`) at `amount` atomic units, as
    /// this scheme's paywall and MCP adapter write it for a request without payment.
    #[must_use]
    pub fn payment_required(
        &self,
        resource: &str,
        description: &str,
        amount: u128,
    ) -> PaymentRequired {
        let mut info = crate::wire::ResourceInfo::new(resource);
        info.description = Some(description.to_owned());
        PaymentRequired {
            x402_version: V2::default(),
            error: Some(crate::wire::PAYMENT_REQUIRED_ERROR.into()),
            reason: None,
            resource: Some(info),
            accepts: vec![self.requirements_for(U256::from(amount))],
            extensions: None,
        }
    }

    /// The requirements for `amount` atomic units.
    #[must_use]
    pub fn requirements_for(&self, amount: U256) -> PaymentRequirements {
        PaymentRequirements {
            scheme: SCHEME_EXACT.into(),
            network: self.token.network.clone(),
            amount: amount.into(),
            asset: self.token.address.to_checksum(None),
            pay_to: self.pay_to.to_checksum(None),
            max_timeout_seconds: self.max_timeout_seconds,
            extra: Some(Extra::eip712(&self.token.name, &self.token.version)),
        }
    }

    fn decode(
        &self,
        presented: &Presented,
        requirements: &PaymentRequirements,
    ) -> Result<PaymentPayload, Failure> {
        match presented {
            Presented::Header(h) => PaymentPayload::from_header(h).map_err(|e| {
                tracing::info!(error = %e, "x402: undecodable payment");
                refuse(e.reason(), e.to_string())
            }),
            Presented::Object(v) => serde_json::from_value(v.clone()).map_err(|e| {
                tracing::info!(error = %e, "x402: undecodable payment");
                refuse(reasons::INVALID_PAYLOAD, e.to_string())
            }),
            Presented::V1Header(h) => match PaymentPayloadV1::from_header(h) {
                // A v1 payment names scheme and network only; it is checked as a payment for
                // this route's own requirements (the signature covers amount, payTo, token).
                Ok(p)
                    if p.scheme == SCHEME_EXACT
                        && Some(&p.network) == self.info.v1_network.as_ref() =>
                {
                    Ok(PaymentPayload {
                        x402_version: V2::default(),
                        resource: None,
                        accepted: requirements.clone(),
                        payload: p.payload,
                        extensions: None,
                    })
                }
                Ok(p) => Err(refuse(
                    reasons::NO_MATCHING_REQUIREMENTS,
                    format!("v1 payment for {} on {}", p.scheme, p.network),
                )),
                Err(e) => {
                    tracing::info!(error = %e, "x402: undecodable X-PAYMENT");
                    Err(refuse(e.reason(), e.to_string()))
                }
            },
        }
    }
}

#[async_trait]
impl Scheme for ExactEvm {
    fn info(&self) -> &SchemeInfo {
        &self.info
    }

    fn claims(&self, envelope: &Value) -> bool {
        let v2 = envelope.get("accepted").is_some_and(|a| {
            a.get("scheme").and_then(Value::as_str) == Some(SCHEME_EXACT)
                && a.get("network").and_then(Value::as_str) == Some(self.token.network.as_str())
        });
        let v1 = envelope.get("x402Version").and_then(Value::as_u64) == Some(1)
            && envelope.get("scheme").and_then(Value::as_str) == Some(SCHEME_EXACT)
            && envelope.get("network").and_then(Value::as_str) == self.info.v1_network.as_deref();
        (v2 || v1) && envelope.pointer("/payload/authorization").is_some()
    }

    async fn requirements(&self, price: &Price) -> Result<Entry, Failure> {
        x402_transport::wire::entry(&self.requirements_for(U256::from(price.amount)))
            .map_err(|e| unknown(e.to_string()))
    }

    fn v1_requirements(&self, entry: &RawValue, price: &Price) -> Option<Entry> {
        let name = self.info.v1_network.as_ref()?;
        let r: PaymentRequirements = serde_json::from_str(entry.get()).ok()?;
        x402_transport::wire::entry(&PaymentRequirementsV1 {
            scheme: r.scheme,
            network: name.clone(),
            max_amount_required: r.amount,
            resource: price.url.clone(),
            description: price.description.clone(),
            mime_type: None,
            output_schema: None,
            pay_to: r.pay_to,
            max_timeout_seconds: r.max_timeout_seconds,
            asset: r.asset,
            extra: r.extra,
        })
        .ok()
    }

    async fn check(
        &self,
        presented: &Presented,
        price: &Price,
        now: Timestamp,
    ) -> Result<Verified, Failure> {
        let requirements = self.requirements_for(U256::from(price.amount));
        let payload = self.decode(presented, &requirements)?;
        if find_matching_requirements(std::slice::from_ref(&requirements), &payload).is_none() {
            return Err(refuse(
                reasons::NO_MATCHING_REQUIREMENTS,
                format!("the payment is for {}", payload.accepted),
            ));
        }
        // Final offline verdicts (signature, window, amount, recipient) before anything is
        // recorded for this payment: a forged copy cannot hold a real payment's record.
        if let Err(e) = precheck(&payload, &requirements, unix_secs(now)) {
            return Err(refuse(e.reason(), e.to_string()));
        }
        Ok(Verified {
            key: served_key(&payload),
            payer: Some(
                payload
                    .payload
                    .authorization
                    .from
                    .address()
                    .to_checksum(None),
            ),
            payment: Arc::new(EvmPayment {
                payload,
                requirements,
            }),
        })
    }

    async fn verify(&self, payment: &Verified, _price: &Price) -> Result<Verdict, Failure> {
        let p = payment.payment::<EvmPayment>()?;
        match self.facilitator.verify(&p.payload, &p.requirements).await {
            Ok(v) if v.is_valid => Ok(Verdict::Valid),
            // Perhaps settled by an earlier request whose answer was lost: settling recognises
            // it (and it is served once, under the transport's record).
            Ok(v)
                if matches!(
                    v.invalid_reason.as_deref(),
                    Some(reasons::NONCE_ALREADY_USED | reasons::VALID_BEFORE_EXPIRED)
                ) =>
            {
                Ok(Verdict::MaybeSettled)
            }
            Ok(v) => Err(refuse(
                v.invalid_reason
                    .as_deref()
                    .unwrap_or(reasons::INVALID_PAYLOAD),
                v.invalid_message.unwrap_or_default(),
            )),
            Err(e) => Err(unknown(e.to_string())),
        }
    }

    async fn settle(&self, payment: &Verified, _price: &Price) -> Result<Settled, Failure> {
        let p = payment.payment::<EvmPayment>()?;
        match settle_for_serving(&self.facilitator, &p.payload, &p.requirements).await {
            SettleOutcome::Settled(s) => Ok(Settled {
                transaction: s.transaction.clone(),
                response: serde_json::to_value(&s).map_err(|e| unknown(e.to_string()))?,
                receipt: None,
            }),
            SettleOutcome::Refused(s) => Err(Failure::Refused(Refusal {
                error: SettleOutcome::reason(&s).to_owned(),
                reason: None,
                detail: s.error_message.clone().unwrap_or_default(),
                response: serde_json::to_value(&s).ok(),
            })),
            SettleOutcome::Unknown(detail) => Err(unknown(detail)),
        }
    }

    fn replayed(&self) -> Refusal {
        Refusal::new(
            reasons::NONCE_ALREADY_USED,
            "this authorization was already used",
        )
    }

    fn malformed(&self, detail: &str) -> Refusal {
        Refusal::new(reasons::INVALID_PAYLOAD, detail)
    }

    fn v1_response(&self, response: &Value) -> Value {
        let (Some(name), Ok(s)) = (
            self.info.v1_network.as_ref(),
            serde_json::from_value::<SettleResponse>(response.clone()),
        ) else {
            return response.clone();
        };
        serde_json::to_value(SettleResponseV1 {
            success: s.success,
            error_reason: s.error_reason,
            transaction: s.transaction,
            network: name.clone(),
            payer: s.payer,
        })
        .unwrap_or_else(|_| response.clone())
    }
}

/// An `accepts[]` entry as v2 `PaymentRequirements`: a v2 entry as it is, a v1 entry
/// (`maxAmountRequired`, a network name) with its network mapped to `eip155:<id>` through
/// [`crate::v1::EVM_NETWORKS`] — the form the payer's policy judges, for both versions.
fn as_requirements(entry: &Value) -> Result<PaymentRequirements, String> {
    if let Ok(r) = serde_json::from_value::<PaymentRequirements>(entry.clone()) {
        return Ok(r);
    }
    let r: PaymentRequirementsV1 = serde_json::from_value(entry.clone())
        .map_err(|_| "not an x402 exact entry (v2 or v1)".to_owned())?;
    let chain = crate::v1::network_chain_id(&r.network)
        .ok_or_else(|| format!("v1 network {:?} is unknown", r.network))?;
    Ok(PaymentRequirements {
        scheme: r.scheme,
        network: format!("eip155:{chain}"),
        amount: r.max_amount_required,
        asset: r.asset,
        pay_to: r.pay_to,
        max_timeout_seconds: r.max_timeout_seconds,
        extra: r.extra,
    })
}

/// The paying side: an [`X402Payer`] as a payer of the shared client
/// ([`x402_transport::client::Client`]). It pays the entries its [`crate::payer::Policy`]
/// allows: x402 v2 `PaymentRequirements`, and v1 entries (judged as their v2 equivalent, paid
/// as a v1 `X-PAYMENT`).
#[async_trait]
impl x402_transport::client::SchemePayer for X402Payer {
    fn label(&self) -> &str {
        LABEL
    }

    fn rail(&self) -> &str {
        RAIL
    }

    fn refusal(&self, entry: &Value) -> Option<String> {
        match as_requirements(entry) {
            Ok(r) => self.policy().refusal(&r),
            Err(why) => Some(why),
        }
    }

    fn amount(&self, entry: &Value) -> Option<u128> {
        let r = as_requirements(entry).ok()?;
        u128::try_from(r.amount.value()).ok()
    }

    /// USDC (6 decimals), the asset of the rail, for an entry the policy accepts (a token the
    /// policy names: an EIP-3009 USD coin).
    fn asset(&self, entry: &Value) -> Option<rail_core::Asset> {
        if x402_transport::client::SchemePayer::refusal(self, entry).is_some() {
            return None;
        }
        Some(rail_core::Asset::usdc())
    }

    async fn pay(
        &self,
        required: &x402_transport::wire::PaymentRequired,
        entry: &Value,
    ) -> Result<Value, String> {
        // The 402 as x402 v2 reads it, with the chosen entry as its only option.
        let mut v = serde_json::to_value(required).map_err(|e| e.to_string())?;
        if let Some(o) = v.as_object_mut() {
            o.remove("reason");
            o.insert("accepts".into(), Value::Array(vec![entry.clone()]));
        }
        let typed: PaymentRequired =
            serde_json::from_value(v).map_err(|e| format!("the 402 is not x402 v2: {e}"))?;
        let payment = X402Payer::pay(self, &typed).map_err(|e| e.to_string())?;
        serde_json::to_value(payment).map_err(|e| e.to_string())
    }

    async fn pay_v1(
        &self,
        required: &x402_transport::wire::PaymentRequiredV1,
    ) -> Option<Result<Value, String>> {
        let typed: crate::v1::PaymentRequiredV1 =
            match serde_json::to_value(required).and_then(serde_json::from_value) {
                Ok(t) => t,
                Err(e) => return Some(Err(format!("the 402 is not x402 v1: {e}"))),
            };
        Some(
            X402Payer::pay_v1(self, &typed)
                .map_err(|e| e.to_string())
                .and_then(|p| serde_json::to_value(p).map_err(|e| e.to_string())),
        )
    }
}
