//! `kind = "x402"`: x402 v2 `exact` on EVM (EIP-3009).

use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::{Address, U256};
use rail_core::payer::Idempotent;
use rail_core::{Asset, PayerHandle, RailError, RailReason, ReceiverHandle};
use rail_x402::Token;
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::RemoteFacilitator;
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::rail::{X402RailPayer, X402Receiver};
use rail_x402::rpc::RpcClient;
use serde::Deserialize;

use super::config::{money, parse, secret, section};
use super::{Ctx, Sides};
use crate::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    /// CAIP-2 network (`eip155:84532`).
    network: String,
    /// The EIP-3009 token contract.
    token: String,
    /// Its EIP-712 domain name (`USDC`, `USD Coin`).
    token_name: String,
    /// Its EIP-712 domain version (`2`).
    token_version: String,
    /// Payer: the environment variable holding the 32-byte hex secp256k1 key.
    payer_key_env: Option<String>,
    /// Payer: the most one payment may be, in USDC (`"1.00"`).
    max_amount: Option<String>,
    /// Payer: the JSON-RPC endpoint it reads its balance from before signing.
    rpc_url: Option<String>,
    /// Receiver: the address paid.
    pay_to: Option<String>,
    /// Receiver: the facilitator that verifies and settles.
    facilitator_url: Option<String>,
}

pub(super) async fn build(ctx: &Ctx<'_>) -> Result<Sides, Error> {
    let s: Section = section(ctx.name, ctx.table)?;
    let token_address: Address = parse(ctx.name, "token", &s.token)?;
    #[cfg(feature = "challenges")]
    let mut scheme: Option<Arc<dyn x402_transport::client::SchemePayer>> = None;
    let payer = match &s.payer_key_env {
        Some(var) => {
            let key = secret(ctx.env, ctx.name, var)?;
            let signer = LocalSigner::from_hex(&key).map_err(|e| Error::BadSecret {
                name: ctx.name.to_owned(),
                var: var.clone(),
                why: format!("is unusable: {e}"),
            })?;
            let max = s.max_amount.as_deref().ok_or_else(|| {
                Error::Config(format!("rails.{}: a payer needs `max_amount`", ctx.name))
            })?;
            let max = money(ctx.name, "max_amount", &Asset::usdc(), max)?;
            let policy = Policy::new(&s.network, token_address, U256::from(max.minor_units()));
            let rpc_url = s.rpc_url.as_deref().ok_or_else(|| {
                Error::Config(format!(
                    "rails.{}: a payer needs `rpc_url` (its balance is checked before signing)",
                    ctx.name
                ))
            })?;
            let rpc = RpcClient::new(rpc_url).map_err(|e| {
                ctx.rail_err(RailError::Unavailable(RailReason::new(
                    "x402 rpc",
                    e.to_string(),
                )))
            })?;
            let x402 = X402Payer::new(signer, policy);
            #[cfg(feature = "challenges")]
            {
                scheme = Some(Arc::new(x402.clone()));
            }
            let payer = X402RailPayer::new(x402, Arc::new(rpc), ctx.clock.clone());
            Some(PayerHandle::pay_only(Idempotent::new(payer, ctx.store()?)))
        }
        None => None,
    };
    #[cfg(feature = "challenges")]
    let mut scheme_receiver: Option<Arc<dyn x402_transport::Scheme>> = None;
    let receiver = match (&s.pay_to, &s.facilitator_url) {
        (Some(pay_to), Some(url)) => {
            let pay_to: Address = parse(ctx.name, "pay_to", pay_to)?;
            let facilitator =
                RemoteFacilitator::new(url, Duration::from_secs(30)).map_err(|e| {
                    ctx.rail_err(RailError::Unavailable(RailReason::new(
                        "x402 facilitator",
                        e.to_string(),
                    )))
                })?;
            let token = Token::new(&s.network, token_address, &s.token_name, &s.token_version);
            let facilitator = Arc::new(facilitator);
            #[cfg(feature = "challenges")]
            {
                scheme_receiver = Some(Arc::new(rail_x402::ExactEvm::new(
                    facilitator.clone(),
                    token.clone(),
                    pay_to,
                )));
            }
            let r = X402Receiver::new(facilitator, token, pay_to, ctx.store()?, ctx.clock.clone());
            Some(ReceiverHandle::pay_only(r))
        }
        (None, None) => None,
        _ => {
            return Err(Error::Config(format!(
                "rails.{}: a receiver needs both `pay_to` and `facilitator_url`",
                ctx.name
            )));
        }
    };
    let sides: Sides = (payer, receiver).into();
    #[cfg(feature = "challenges")]
    let sides = Sides {
        scheme,
        scheme_receiver,
        ..sides
    };
    Ok(sides)
}
