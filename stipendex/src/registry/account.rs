//! `kind = "account"`: accounts at a hosted Stipendex facilitator.

use rail_account::{AccountClient, AccountKey, AccountPayer, AccountReceiver};
use rail_core::payer::Idempotent;
use rail_core::{PayerHandle, ReceiverHandle};
use serde::Deserialize;

use super::config::{asset, key32, section};
use super::{Ctx, Sides};
use crate::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    /// The facilitator: one URL (or a load balancer's).
    url: Option<String>,
    /// Or its instances, tried in turn.
    urls: Option<Vec<String>>,
    /// The facilitator's network name (its offers carry it).
    network: String,
    /// Asset code of the accounts.
    #[serde(default = "usd")]
    asset: String,
    /// The account this wallet pays from (32 lowercase hex digits).
    payer_account: Option<String>,
    /// The environment variable holding its key (32-byte hex Ed25519 seed).
    payer_key_env: Option<String>,
    /// The account this receiver is paid into.
    payee_account: Option<String>,
    /// The environment variable holding its key.
    payee_key_env: Option<String>,
}

fn usd() -> String {
    "USD".into()
}

pub(super) async fn build(ctx: &Ctx<'_>) -> Result<Sides, Error> {
    let s: Section = section(ctx.name, ctx.table)?;
    let asset = asset(ctx.name, &s.asset)?;
    let urls = match (s.url, s.urls) {
        (Some(u), None) => vec![u],
        (None, Some(us)) if !us.is_empty() => us,
        _ => {
            return Err(Error::Config(format!(
                "rails.{}: give the facilitator as `url` or as `urls` (its instances), one of the two",
                ctx.name
            )));
        }
    };
    let client = |account: &str, var: &str| -> Result<AccountClient, Error> {
        let key = AccountKey::from_seed(&zeroize::Zeroizing::new(key32(ctx.env, ctx.name, var)?));
        AccountClient::new(urls.clone(), account, key, &s.network)
            .map(|c| c.with_clock(ctx.clock.clone()))
            .map_err(|e| Error::Config(format!("rails.{}: {e}", ctx.name)))
    };
    let side = |account: &Option<String>, var: &Option<String>, which: &str| match (account, var) {
        (Some(a), Some(v)) => Ok(Some((a.clone(), v.clone()))),
        (None, None) => Ok(None),
        _ => Err(Error::Config(format!(
            "rails.{}: `{which}_account` and `{which}_key_env` go together",
            ctx.name
        ))),
    };
    let payer = match side(&s.payer_account, &s.payer_key_env, "payer")? {
        Some((account, var)) => Some(PayerHandle::with_holds(Idempotent::new(
            AccountPayer::new(client(&account, &var)?, asset.clone()),
            ctx.store()?,
        ))),
        None => None,
    };
    let receiver = match side(&s.payee_account, &s.payee_key_env, "payee")? {
        Some((account, var)) => Some(ReceiverHandle::full(AccountReceiver::new(
            client(&account, &var)?,
            asset,
        ))),
        None => None,
    };
    Ok((payer, receiver).into())
}
