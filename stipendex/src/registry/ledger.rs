//! `kind = "ledger"`: the embedded double-entry ledger.

use rail_core::payer::Idempotent;
use rail_core::{Asset, PayerHandle, ReceiverHandle, ReplayGuard};
use rail_ledger::{AccountId, Ledger, LedgerPayer, LedgerReceiver};
use serde::Deserialize;

use super::config::{parse, section};
use super::{Ctx, Sides};
use crate::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    /// `sqlite://path` or `postgres://…`.
    url: Option<String>,
    /// The environment variable holding a PostgreSQL URL with a password.
    url_env: Option<String>,
    /// PostgreSQL schema (created if missing).
    schema: Option<String>,
    /// Asset code (`USD`, `USDC`, `ALGO`, `BTC`) of the accounts.
    #[serde(default = "usd")]
    asset: String,
    /// The account this wallet pays from (32 lowercase hex digits).
    payer_account: Option<String>,
    /// The account this receiver is paid into.
    payee_account: Option<String>,
}

fn usd() -> String {
    "USD".into()
}

fn asset(name: &str, code: &str) -> Result<Asset, Error> {
    match code {
        "USD" => Ok(Asset::usd()),
        "USDC" => Ok(Asset::usdc()),
        "ALGO" => Ok(Asset::algo()),
        "BTC" => Ok(Asset::btc()),
        other => Err(Error::Config(format!(
            "rails.{name}.asset: {other:?} is not one of USD, USDC, ALGO, BTC"
        ))),
    }
}

pub(super) async fn build(ctx: &Ctx<'_>) -> Result<Sides, Error> {
    let s: Section = section(ctx.name, ctx.table)?;
    let asset = asset(ctx.name, &s.asset)?;
    let url = match (&s.url, &s.url_env) {
        (Some(u), None) => u.clone(),
        (None, Some(var)) => super::config::secret(ctx.env, ctx.name, var)?,
        _ => {
            return Err(Error::Config(format!(
                "rails.{}: give exactly one of `url` and `url_env`",
                ctx.name
            )));
        }
    };
    let ledger = open(ctx, &url, s.schema.as_deref()).await?;
    let payer = match &s.payer_account {
        Some(id) => {
            let account: AccountId = parse(ctx.name, "payer_account", id)?;
            Some(PayerHandle::with_holds(Idempotent::new(
                LedgerPayer::new(ledger.clone(), account, asset.clone()),
                ctx.store.clone(),
            )))
        }
        None => None,
    };
    let receiver = match &s.payee_account {
        Some(id) => {
            let account: AccountId = parse(ctx.name, "payee_account", id)?;
            let guard = ReplayGuard::new(ctx.store.clone(), format!("ledger/{}/offers", ctx.name));
            Some(ReceiverHandle::full(LedgerReceiver::new(
                ledger, account, asset, guard,
            )))
        }
        None => None,
    };
    Ok((payer, receiver))
}

async fn open(ctx: &Ctx<'_>, url: &str, schema: Option<&str>) -> Result<Ledger, Error> {
    let err = |e: rail_ledger::LedgerError| ctx.rail_err(e.into());
    if url.starts_with("sqlite://") {
        #[cfg(feature = "sqlite")]
        return Ledger::sqlite_with_clock(url, ctx.clock.clone())
            .await
            .map_err(err);
        #[cfg(not(feature = "sqlite"))]
        return Err(Error::Config(format!(
            "rails.{}: a sqlite:// ledger needs the cargo feature `sqlite` of stipendex",
            ctx.name
        )));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        #[cfg(feature = "postgres")]
        return Ledger::postgres(url, schema).await.map_err(err);
        #[cfg(not(feature = "postgres"))]
        return Err(Error::Config(format!(
            "rails.{}: a postgres:// ledger needs the cargo feature `postgres` of stipendex",
            ctx.name
        )));
    }
    let _ = (schema, err);
    Err(Error::Config(format!(
        "rails.{}.url: use sqlite://PATH or postgres://…",
        ctx.name
    )))
}
