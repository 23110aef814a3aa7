//! `kind = "ln-nwc"`: Lightning over Nostr Wallet Connect (NIP-47).

use std::sync::Arc;

use lightning_invoice::Currency;
use rail_core::payer::Idempotent;
use rail_core::{Asset, PayerHandle, ReceiverHandle};
use rail_ln_nwc::client::{ClientOptions, NwcClient};
use rail_ln_nwc::nip47::ConnectionUri;
use rail_ln_nwc::rail::{NwcPayer, NwcReceiver};
use serde::Deserialize;

use super::config::{key32, money, secret, section};
use super::{Ctx, Sides};
use crate::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    /// Payer: `bitcoin`, `testnet`, `signet` or `regtest` (invoices of other networks are refused).
    #[serde(default = "bitcoin")]
    network: String,
    /// Payer: the environment variable holding the paying wallet's connection URI.
    payer_uri_env: Option<String>,
    /// Payer: the most one payment may be, in BTC (`"0.0001"`).
    max_amount: Option<String>,
    /// Receiver: the environment variable holding the receiving wallet's connection URI.
    payee_uri_env: Option<String>,
    /// Receiver: the environment variable holding a 32-byte hex seed (derives offer ids).
    seed_env: Option<String>,
}

fn bitcoin() -> String {
    "bitcoin".into()
}

async fn connect(ctx: &Ctx<'_>, var: &str) -> Result<Arc<NwcClient>, Error> {
    let text = secret(ctx.env, ctx.name, var)?;
    let uri: ConnectionUri = text.parse().map_err(|_| Error::BadSecret {
        name: ctx.name.to_owned(),
        var: var.to_owned(),
        why: "is not a nostr+walletconnect:// URI with a relay and a secret".into(),
    })?;
    let client = NwcClient::connect(&uri, ClientOptions::default())
        .await
        .map_err(|e| {
            ctx.rail_err(rail_core::RailError::Unavailable(
                rail_core::RailReason::new("nwc", e.to_string()),
            ))
        })?;
    Ok(Arc::new(client))
}

pub(super) async fn build(ctx: &Ctx<'_>) -> Result<Sides, Error> {
    let s: Section = section(ctx.name, ctx.table)?;
    let currency = match s.network.as_str() {
        "bitcoin" => Currency::Bitcoin,
        "testnet" => Currency::BitcoinTestnet,
        "signet" => Currency::Signet,
        "regtest" => Currency::Regtest,
        other => {
            return Err(Error::Config(format!(
                "rails.{}.network: {other:?} is not one of bitcoin, testnet, signet, regtest",
                ctx.name
            )));
        }
    };
    let payer = match &s.payer_uri_env {
        Some(var) => {
            let max = s.max_amount.as_deref().ok_or_else(|| {
                Error::Config(format!("rails.{}: a payer needs `max_amount`", ctx.name))
            })?;
            let max = money(ctx.name, "max_amount", &Asset::btc(), max)?;
            let client = connect(ctx, var).await?;
            let p = NwcPayer::new(client, currency, max, ctx.clock.clone());
            Some(PayerHandle::with_holds(Idempotent::new(p, ctx.store()?)))
        }
        None => None,
    };
    let receiver = match (&s.payee_uri_env, &s.seed_env) {
        (Some(var), Some(seed_var)) => {
            let seed = key32(ctx.env, ctx.name, seed_var)?;
            let client = connect(ctx, var).await?;
            let r = NwcReceiver::new(client, seed, ctx.store()?, ctx.clock.clone())
                .await
                .map_err(|e| ctx.rail_err(e))?;
            Some(ReceiverHandle::with_holds(r))
        }
        (None, None) => None,
        _ => {
            return Err(Error::Config(format!(
                "rails.{}: a receiver needs both `payee_uri_env` and `seed_env`",
                ctx.name
            )));
        }
    };
    Ok((payer, receiver).into())
}
