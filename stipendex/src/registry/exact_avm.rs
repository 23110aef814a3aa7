//! `kind = "exact-avm"`: x402's own `exact` on Algorand, paid in USDC (an ASA).

#[cfg(feature = "challenges")]
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use rail_core::payer::Idempotent;
use rail_core::{Asset, PayerHandle, ReceiverHandle};
use rail_exact_algo::avm::wire::{USDC_MAINNET, USDC_TESTNET};
use rail_exact_algo::avm::{
    AvmFacilitator, AvmPayer, AvmPolicy, AvmReceiver, ExactAvm, FeePayer, RemoteFacilitator,
    Spelling,
};
use rail_exact_algo::{Address, AlgodClient};
use serde::Deserialize;
use x402_transport::served::ServedOnce;

use super::config::{key32, parse, section};
use super::{Ctx, Sides};
use crate::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    /// algod's REST endpoint.
    algod_url: String,
    /// The environment variable holding algod's API token, if it needs one.
    algod_token_env: Option<String>,
    /// The ASA paid in (default: USDC, testnet's or mainnet's id by algod's genesis id).
    asset: Option<u64>,
    /// Payer: the environment variable holding the 32-byte hex Ed25519 seed.
    payer_key_env: Option<String>,
    /// Payer: the most one payment may be, in USDC (`"0.50"`).
    max_amount: Option<String>,
    /// Receiver: the address paid.
    pay_to: Option<String>,
    /// Receiver: the environment variable holding the fee payer's 32-byte hex seed (this
    /// process is the facilitator and pays the group's fees).
    fee_payer_key_env: Option<String>,
    /// Receiver: a facilitator that settles instead (this crate's, or one built with the
    /// x402-avm SDK); its advertised fee payer is used.
    facilitator_url: Option<String>,
    /// Receiver: how entries spell the network: `genesis-hash` (x402-avm; default) or `caip2`.
    spelling: Option<String>,
}

pub(super) async fn build(ctx: &Ctx<'_>) -> Result<Sides, Error> {
    let s: Section = section(ctx.name, ctx.table)?;
    let token = ctx.secret_in(s.algod_token_env.as_deref())?;
    let algod = AlgodClient::new(&s.algod_url, token).map_err(|e| ctx.unavailable("algod", e))?;
    let params = algod
        .params()
        .await
        .map_err(|e| ctx.unavailable("algod", e))?;
    let asset = s.asset.unwrap_or(if params.genesis_id == "mainnet-v1.0" {
        USDC_MAINNET
    } else {
        USDC_TESTNET
    });
    #[cfg(feature = "challenges")]
    let mut scheme: Option<Arc<dyn x402_transport::client::SchemePayer>> = None;
    let payer = match &s.payer_key_env {
        Some(var) => {
            let key = SigningKey::from_bytes(&key32(ctx.env, ctx.name, var)?);
            let max = ctx.max_minor_units(s.max_amount.as_deref(), &Asset::usdc())?;
            let policy = AvmPolicy {
                max_amounts: [(asset, max)].into_iter().collect(),
                max_fee: 2_000,
            };
            let payer = AvmPayer::connect(key, algod.clone(), policy)
                .await
                .map_err(|e| ctx.unavailable("algod", e))?
                .with_clock(ctx.clock.clone());
            #[cfg(feature = "challenges")]
            {
                scheme = Some(Arc::new(payer.clone()));
            }
            Some(PayerHandle::pay_only(Idempotent::new(payer, ctx.store()?)))
        }
        None => None,
    };
    #[cfg(feature = "challenges")]
    let mut scheme_receiver: Option<Arc<dyn x402_transport::Scheme>> = None;
    let receiver = match &s.pay_to {
        Some(pay_to) => {
            let pay_to: Address = parse(ctx.name, "pay_to", pay_to)?;
            let fee_payer = match &s.fee_payer_key_env {
                Some(var) => Some(FeePayer::new(SigningKey::from_bytes(&key32(
                    ctx.env, ctx.name, var,
                )?))),
                None => None,
            };
            if fee_payer.is_some() && s.facilitator_url.is_some() {
                return Err(Error::Config(format!(
                    "rails.{}: `fee_payer_key_env` and `facilitator_url` are two facilitators; name one",
                    ctx.name
                )));
            }
            let f = AvmFacilitator::connect(algod, fee_payer, ctx.store()?)
                .await
                .map_err(|e| ctx.unavailable("algod", e))?;
            let spelling = match s.spelling.as_deref() {
                None | Some("genesis-hash") => Spelling::GenesisHash,
                Some("caip2") => Spelling::Caip2,
                Some(other) => {
                    return Err(Error::Config(format!(
                        "rails.{}.spelling: {other:?} is neither \"genesis-hash\" nor \"caip2\"",
                        ctx.name
                    )));
                }
            };
            let mut sch = ExactAvm::new(f, pay_to, asset, 6).with_spelling(spelling);
            if asset == USDC_TESTNET || asset == USDC_MAINNET {
                sch = sch.with_name("USDC");
            }
            if let Some(url) = &s.facilitator_url {
                let remote = RemoteFacilitator::new(url, Duration::from_secs(30))
                    .map_err(|e| ctx.unavailable("facilitator", e))?;
                sch = sch
                    .settled_by(remote)
                    .await
                    .map_err(|e| ctx.unavailable("facilitator", e))?;
            }
            #[cfg(feature = "challenges")]
            {
                scheme_receiver = Some(Arc::new(sch.clone()));
            }
            let r = AvmReceiver::new(sch, ServedOnce::new(ctx.store()?), ctx.clock.clone());
            Some(ReceiverHandle::pay_only(r))
        }
        None => None,
    };
    let sides: Sides = (payer, receiver).into();
    #[cfg(feature = "challenges")]
    let sides = sides.with_schemes(scheme, scheme_receiver);
    Ok(sides)
}
