//! x402's `exact` on Algorand as an [`x402_transport::Scheme`]: the shared paywall, MCP adapter and
//! client carry it beside `exact` on EVM and exact-algo (`docs/exact-algo.md` §9). It is told apart
//! from exact-algo (same `scheme` and `network`) by its shape: `accepted` and
//! `payload.paymentGroup`.
//!
//! ```no_run
//! # async fn demo(facilitator: rail_exact_algo::avm::AvmFacilitator, merchant: rail_exact_algo::Address) -> Result<(), x402_transport::Error> {
//! use std::sync::Arc;
//! use rail_exact_algo::avm::ExactAvm;
//! use x402_transport::{Accepts, paywall::Paywall};
//!
//! // 0.01 USDC (10 000 base units of ASA 10458941 on testnet).
//! let usdc = Arc::new(ExactAvm::usdc(facilitator, merchant));
//! let paywall = Paywall::new().route("/report", "the report", Accepts::one(usdc, 10_000)?);
//! # let _ = paywall; Ok(()) }
//! ```

use std::sync::Arc;

use async_trait::async_trait;
use rail_core::Timestamp;
use serde_json::Value;
use x402_transport::{
    Failure, Presented, Price, Refusal, Scheme, SchemeInfo, Settled, Verdict, Verified,
};

use super::facilitator::{AvmError, AvmFacilitator};
use super::remote::RemoteFacilitator;
use super::verify::AvmPayment;
use super::wire::{
    Envelope, Extra, Requirements, SCHEME, SettleResponse, Spelling, USDC_DECIMALS, USDC_MAINNET,
    USDC_TESTNET, code, same,
};
use crate::address::Address;

/// The label of this scheme among the transport's schemes.
pub const LABEL: &str = "exact-avm";

/// The rail's name (rail-core's [`rail_core::RailId`] of [`super::rail`]; re-exported there).
pub const RAIL: &str = "exact-avm";

/// How long a payer has to pay (`maxTimeoutSeconds`, the SDK's default).
pub const MAX_TIMEOUT_SECONDS: u64 = 300;

/// The AVM scheme for one payee and one asset, settled by a facilitator.
#[derive(Clone, Debug)]
pub struct ExactAvm {
    info: SchemeInfo,
    facilitator: AvmFacilitator,
    pay_to: Address,
    asset: u64,
    decimals: u32,
    name: Option<String>,
    spelling: Spelling,
    remote: Option<RemoteFacilitator>,
}

/// A payment this scheme checked.
#[derive(Clone, Debug)]
pub struct AvmChecked {
    /// The envelope as presented.
    pub envelope: Envelope,
    /// The checked group.
    pub payment: AvmPayment,
    /// The envelope's JSON as presented (what a remote facilitator is sent).
    pub raw: Value,
    /// The entry it was checked against.
    pub requirements: Requirements,
}

fn refused(code: &str, detail: impl Into<String>) -> Failure {
    Failure::Refused(Refusal::new(code, detail))
}

fn failure(e: AvmError) -> Failure {
    match e {
        AvmError::Refused { code, detail } => refused(code, detail),
        AvmError::Unknown(detail) => Failure::Unknown {
            error: "facilitator_unavailable".into(),
            reason: None,
            detail,
        },
    }
}

impl ExactAvm {
    /// `asset` (an ASA of `decimals`) paid to `pay_to`, settled by `facilitator`; the network
    /// spelled with the whole genesis hash, as x402-avm spells it.
    #[must_use]
    pub fn new(facilitator: AvmFacilitator, pay_to: Address, asset: u64, decimals: u32) -> Self {
        ExactAvm {
            info: SchemeInfo {
                scheme: SCHEME.into(),
                network: Spelling::GenesisHash.network(&facilitator.genesis_hash()),
                label: LABEL.into(),
                v1_network: None,
            },
            facilitator,
            pay_to,
            asset,
            decimals,
            name: None,
            spelling: Spelling::GenesisHash,
            remote: None,
        }
    }

    /// Verifies and settles through `remote` (this crate's facilitator server elsewhere, or one
    /// built with the x402-avm SDK) instead of `facilitator`, which then only checks groups —
    /// against the fee payer `remote` advertises for this network.
    ///
    /// # Errors
    /// [`AvmError::Unknown`] if `remote`'s `/supported` cannot be read or lacks this network.
    pub async fn settled_by(mut self, remote: RemoteFacilitator) -> Result<Self, AvmError> {
        let fee_payer = remote.fee_payer(&self.info.network).await?;
        self.facilitator = self.facilitator.checking_for(fee_payer);
        self.remote = Some(remote);
        Ok(self)
    }

    /// USDC to `pay_to`: testnet's or mainnet's ASA by the chain's genesis id (any other chain
    /// — a devnet — uses testnet's id, as [`algod_devnet`'s testnet pose] does).
    ///
    /// [`algod_devnet`'s testnet pose]: https://docs.rs/algod-devnet
    #[must_use]
    pub fn usdc(facilitator: AvmFacilitator, pay_to: Address) -> Self {
        let id = if facilitator.genesis_id() == "mainnet-v1.0" {
            USDC_MAINNET
        } else {
            USDC_TESTNET
        };
        ExactAvm::new(facilitator, pay_to, id, USDC_DECIMALS).with_name("USDC")
    }

    /// Names the asset in `extra.name`.
    #[must_use]
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = Some(name.to_owned());
        self
    }

    /// Spells the network of the entries this scheme writes as `spelling` (both are read).
    #[must_use]
    pub fn with_spelling(mut self, spelling: Spelling) -> Self {
        self.spelling = spelling;
        self.info.network = spelling.network(&self.facilitator.genesis_hash());
        self
    }

    /// The facilitator.
    #[must_use]
    pub fn facilitator(&self) -> &AvmFacilitator {
        &self.facilitator
    }

    /// The asset (ASA id).
    #[must_use]
    pub fn asset(&self) -> u64 {
        self.asset
    }

    /// The entry for `amount` base units.
    #[must_use]
    pub fn requirements_for(&self, amount: u64) -> Requirements {
        Requirements {
            scheme: SCHEME.into(),
            network: self.info.network.clone(),
            asset: self.asset.to_string(),
            amount: amount.to_string(),
            pay_to: self.pay_to.to_string(),
            max_timeout_seconds: MAX_TIMEOUT_SECONDS,
            extra: Extra {
                decimals: Some(self.decimals),
                fee_payer: self.facilitator.fee_payer().map(|a| a.to_string()),
                genesis_hash: Some(data_encoding::BASE64.encode(&self.facilitator.genesis_hash())),
                genesis_id: Some(self.facilitator.genesis_id().to_owned()),
                name: self.name.clone(),
            },
        }
    }

    fn amount(price: &Price) -> Result<u64, Failure> {
        u64::try_from(price.amount).map_err(|_| {
            Failure::internal(format!(
                "{} base units do not fit an Algorand amount",
                price.amount
            ))
        })
    }

    fn envelope(presented: &Presented) -> Result<(Envelope, Value), Failure> {
        let bad = |e: String| refused(code::INVALID_PAYLOAD, e);
        let raw: Value = match presented {
            Presented::Header(h) => x402_transport::wire::decode_base64_json(h)
                .map_err(|e| bad(format!("the payment header: {e}")))?,
            Presented::Object(v) => v.clone(),
            Presented::V1Header(_) => return Err(bad("this scheme has no x402 v1 form".into())),
        };
        let envelope =
            serde_json::from_value(raw.clone()).map_err(|e| bad(format!("the payment: {e}")))?;
        Ok((envelope, raw))
    }
}

#[async_trait]
impl Scheme for ExactAvm {
    fn info(&self) -> &SchemeInfo {
        &self.info
    }

    fn is_network(&self, network: &str) -> bool {
        same(network, &self.info.network)
    }

    fn check_amount(&self, amount: u128) -> Result<(), String> {
        crate::scheme::check_u64_amount(amount, || {
            format!("{amount} base units do not fit an Algorand amount (u64)")
        })
    }

    fn claims(&self, envelope: &Value) -> bool {
        envelope.pointer("/accepted/scheme").and_then(Value::as_str) == Some(SCHEME)
            && envelope
                .pointer("/accepted/network")
                .and_then(Value::as_str)
                .is_some_and(|n| self.is_network(n))
            && envelope.pointer("/payload/paymentGroup").is_some()
    }

    async fn requirements(&self, price: &Price) -> Result<x402_transport::wire::Entry, Failure> {
        crate::scheme::entry_of(&self.requirements_for(Self::amount(price)?))
    }

    async fn check(
        &self,
        presented: &Presented,
        price: &Price,
        _now: Timestamp,
    ) -> Result<Verified, Failure> {
        let required = self.requirements_for(Self::amount(price)?);
        let (envelope, raw) = Self::envelope(presented)?;
        // The entry the payer chose must be this one (as x402's resource server compares
        // them: scheme, network, asset, amount, payTo).
        let a = &envelope.accepted;
        if a.scheme != required.scheme
            || !same(&a.network, &required.network)
            || a.asset != required.asset
            || a.amount != required.amount
            || a.pay_to != required.pay_to
        {
            return Err(refused(
                "No matching payment requirements",
                format!(
                    "the payment is for {} of ASA {} to {}",
                    a.amount, a.asset, a.pay_to
                ),
            ));
        }
        // Signatures first, then every rule that needs no chain.
        let payment = self
            .facilitator
            .check(&envelope, &required)
            .map_err(|v| refused(v.code, v.detail))?;
        Ok(Verified {
            key: payment.key(&self.info.network),
            payer: Some(payment.payer.to_string()),
            payment: Arc::new(AvmChecked {
                envelope,
                payment,
                raw,
                requirements: required,
            }),
        })
    }

    async fn verify(&self, payment: &Verified, _price: &Price) -> Result<Verdict, Failure> {
        let p = payment.payment::<AvmChecked>()?;
        if let Some(remote) = &self.remote {
            let v = remote
                .verify(&p.raw, &p.requirements)
                .await
                .map_err(failure)?;
            return match (v.is_valid, v.invalid_reason, v.invalid_message) {
                (true, ..) => Ok(Verdict::Valid),
                // On chain already: perhaps this payer's earlier request, whose answer was lost.
                (false, Some(r), _) if r == code::ALREADY_SETTLED => Ok(Verdict::MaybeSettled),
                (false, _, Some(m)) if m.contains("transaction already in ledger") => {
                    Ok(Verdict::MaybeSettled)
                }
                (false, r, m) => Err(refused(
                    r.as_deref().unwrap_or(code::INVALID_PAYLOAD),
                    m.unwrap_or_default(),
                )),
            };
        }
        match self.facilitator.verify(&p.payment).await.map_err(failure)? {
            true => Ok(Verdict::Valid),
            false => Ok(Verdict::MaybeSettled),
        }
    }

    async fn settle(&self, payment: &Verified, _price: &Price) -> Result<Settled, Failure> {
        let p = payment.payment::<AvmChecked>()?;
        if let Some(remote) = &self.remote {
            let r = remote
                .settle(&p.raw, &p.requirements)
                .await
                .map_err(failure)?;
            if !r.success {
                return Err(refused(
                    r.error_reason
                        .as_deref()
                        .unwrap_or(code::TRANSACTION_FAILED),
                    r.error_message.clone().unwrap_or_default(),
                ));
            }
            return Ok(Settled {
                transaction: r.transaction.clone(),
                response: crate::scheme::json_of(&r)?,
                receipt: None,
            });
        }
        let s = self
            .facilitator
            .settle(&p.payment, &self.info.network)
            .await
            .map_err(failure)?;
        let response = SettleResponse {
            success: true,
            error_reason: None,
            error_message: None,
            payer: Some(s.payer),
            transaction: s.txid.clone(),
            network: p.envelope.accepted.network.clone(),
        };
        Ok(Settled {
            transaction: s.txid,
            response: crate::scheme::json_of(&response)?,
            receipt: None,
        })
    }

    fn replayed(&self) -> Refusal {
        Refusal::new(
            code::ALREADY_SETTLED,
            "this payment group was already served",
        )
    }

    fn malformed(&self, detail: &str) -> Refusal {
        Refusal::new(code::INVALID_PAYLOAD, detail)
    }
}
