//! `kind = "exact-algo"`: native ALGO in an x402-style envelope.

use ed25519_dalek::SigningKey;
use rail_core::payer::Idempotent;
use rail_core::{Asset, PayerHandle, ReceiverHandle};
use rail_exact_algo::wire::normalize_network;
use rail_exact_algo::{Address, AlgodClient, ExactAlgoPayer, ExactAlgoReceiver, Policy};
use serde::Deserialize;

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
    /// Payer: the environment variable holding the 32-byte hex Ed25519 seed.
    payer_key_env: Option<String>,
    /// Payer: the most one payment may be, in ALGO (`"0.5"`).
    max_amount: Option<String>,
    /// Payer: the networks it pays on, each `algorand:` + the CAIP-2 reference (the first 32
    /// characters of the base64url genesis hash) or + the whole genesis hash (base64 or
    /// base64url); none = algod's own.
    #[serde(default)]
    networks: Vec<String>,
    /// Receiver: the address paid.
    pay_to: Option<String>,
}

pub(super) async fn build(ctx: &Ctx<'_>) -> Result<Sides, Error> {
    let s: Section = section(ctx.name, ctx.table)?;
    let token = ctx.secret_in(s.algod_token_env.as_deref())?;
    let algod = AlgodClient::new(&s.algod_url, token).map_err(|e| ctx.unavailable("algod", e))?;
    #[cfg(feature = "challenges")]
    let mut scheme: Option<std::sync::Arc<dyn x402_transport::client::SchemePayer>> = None;
    let payer = match &s.payer_key_env {
        Some(var) => {
            let key = SigningKey::from_bytes(&key32(ctx.env, ctx.name, var)?);
            let max_amount = ctx.max_minor_units(s.max_amount.as_deref(), &Asset::algo())?;
            // Each network read in either spelling, kept in the CAIP-2 form; a network that is
            // not an Algorand one could never match an offer, and is refused here.
            let networks = s
                .networks
                .iter()
                .map(|n| {
                    normalize_network(n).ok_or_else(|| {
                        Error::Config(format!(
                            "rails.{}.networks: {n:?} is not an Algorand network (algorand: + the genesis hash, or its first 32 characters in base64url)",
                            ctx.name
                        ))
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let policy = Policy {
                networks,
                max_amount,
                ..Policy::default()
            };
            let payer =
                ExactAlgoPayer::new(key, algod.clone(), policy, ctx.store()?, ctx.clock.clone());
            #[cfg(feature = "challenges")]
            {
                // The client payer reads the network's genesis from algod once.
                let client = payer
                    .clone()
                    .for_client()
                    .await
                    .map_err(|e| ctx.unavailable("algod", e))?;
                scheme = Some(std::sync::Arc::new(client));
            }
            Some(PayerHandle::pay_only(Idempotent::new(payer, ctx.store()?)))
        }
        None => None,
    };
    #[cfg(feature = "challenges")]
    let mut scheme_receiver: Option<std::sync::Arc<dyn x402_transport::Scheme>> = None;
    let mut kept: Option<ExactAlgoReceiver> = None;
    let receiver = match &s.pay_to {
        Some(pay_to) => {
            let pay_to: Address = parse(ctx.name, "pay_to", pay_to)?;
            let r = ExactAlgoReceiver::connect(algod, pay_to, ctx.store()?, ctx.clock.clone())
                .await
                .map_err(|e| ctx.rail_err(e))?;
            #[cfg(feature = "challenges")]
            {
                scheme_receiver = Some(std::sync::Arc::new(
                    rail_exact_algo::scheme::ExactAlgo::new(r.clone()),
                ));
            }
            kept = Some(r.clone());
            Some(ReceiverHandle::pay_only(r))
        }
        None => None,
    };
    let sides: Sides = (payer, receiver).into();
    // The scheme's discovery documents (`docs/exact-algo.md` §7), served by a binding that
    // fronts a service.
    #[cfg(all(feature = "paywall", feature = "http"))]
    let sides = Sides {
        discovery: kept.map(|r| {
            std::sync::Arc::new(super::discovery::ExactAlgoDiscovery(r))
                as std::sync::Arc<dyn super::Discovery>
        }),
        ..sides
    };
    #[cfg(not(all(feature = "paywall", feature = "http")))]
    let _ = kept;
    #[cfg(feature = "challenges")]
    let sides = sides.with_schemes(scheme, scheme_receiver);
    Ok(sides)
}
