//! `kind = "ledger"`: the embedded double-entry ledger.

use rail_core::payer::Idempotent;
use rail_core::{PayerHandle, ReceiverHandle, ReplayGuard};
use rail_ledger::{AccountId, Ledger, LedgerPayer, LedgerReceiver};
use serde::Deserialize;

use rail_core::keys::StoreUrl;

use super::config::{asset, parse, section, storage, url};
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

pub(super) async fn build(ctx: &Ctx<'_>) -> Result<Sides, Error> {
    let s: Section = section(ctx.name, ctx.table)?;
    let asset = asset(ctx.name, &s.asset)?;
    let what = format!("rails.{}", ctx.name);
    let url = super::config::located(
        url(ctx.env, &what, s.url.as_ref(), s.url_env.as_ref())?,
        ctx.base,
    );
    let ledger = open(ctx, &what, &url, s.schema.as_deref()).await?;
    let payer = match &s.payer_account {
        Some(id) => {
            let account: AccountId = parse(ctx.name, "payer_account", id)?;
            Some(PayerHandle::with_holds(Idempotent::new(
                LedgerPayer::new(ledger.clone(), account, asset.clone()),
                ctx.store()?,
            )))
        }
        None => None,
    };
    let receiver = match &s.payee_account {
        Some(id) => {
            let account: AccountId = parse(ctx.name, "payee_account", id)?;
            let guard = ReplayGuard::new(ctx.store()?, format!("ledger/{}/offers", ctx.name));
            Some(ReceiverHandle::full(LedgerReceiver::new(
                ledger, account, asset, guard,
            )))
        }
        None => None,
    };
    Ok((payer, receiver).into())
}

/// The ledger at `url`, stamped by the registry's clock: SQLite's time is that clock;
/// PostgreSQL keeps the database's clock for entries and hold expiry, and uses the registry's
/// as the host clock offers are stamped with.
async fn open(ctx: &Ctx<'_>, what: &str, url: &str, schema: Option<&str>) -> Result<Ledger, Error> {
    #[allow(unused_variables)] // used by whichever backends are compiled in
    let err = |e: rail_ledger::LedgerError| ctx.rail_err(e.into());
    match storage(what, url)? {
        StoreUrl::Memory => Err(Error::Config(format!(
            "{what}.url: a ledger is kept in sqlite://PATH or postgres://…, not in memory"
        ))),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(_) => Ledger::sqlite_with_clock(url, ctx.clock.clone())
            .await
            .map_err(err),
        #[cfg(not(feature = "sqlite"))]
        StoreUrl::Sqlite(_) => Err(super::config::driver_missing(what, "sqlite")),
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(_) => Ledger::postgres_with_host_clock(url, schema, ctx.clock.clone())
            .await
            .map_err(err),
        #[cfg(not(feature = "postgres"))]
        StoreUrl::Postgres(_) => {
            let _ = schema;
            Err(super::config::driver_missing(what, "postgres"))
        }
    }
}
