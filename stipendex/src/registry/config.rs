//! The configuration file's shape and the helpers every rail's section uses: typed fields,
//! secrets read from the environment only.

// Each helper is used by some rails: a build with fewer rails leaves some unused.
#![allow(dead_code)]

use std::collections::BTreeMap;

use rail_core::keys::StoreUrl;
use rail_core::{Asset, Money};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::Error;

/// Where the registry reads secrets: the process environment, or a map in tests.
pub trait Env: Send + Sync {
    /// The variable's value, if set.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

impl Env for BTreeMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

impl Env for std::collections::HashMap<String, String> {
    fn var(&self, name: &str) -> Option<String> {
        self.get(name).cloned()
    }
}

/// The whole file: one `[store]` and any number of `[rails.<name>]` — and, for the
/// `stipendex` command's wallet, a `[wallet]` section the registry does not read.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct File {
    pub(crate) store: Option<StoreSection>,
    #[allow(dead_code)]
    pub(crate) wallet: Option<toml::Table>,
    #[serde(default)]
    pub(crate) rails: BTreeMap<String, toml::Table>,
    /// A receiver's own section (`stipendex serve-mcp`, the gateway): not the registry's.
    #[allow(dead_code)]
    pub(crate) receiver: Option<toml::Table>,
    /// The pricing file's entries ([`crate::receiver::price_file`]): not the registry's.
    #[allow(dead_code)]
    pub(crate) price: Option<Vec<toml::Table>>,
    /// An MCP proxy's or server's upstream (`stipendex proxy`, the gateway): not the registry's.
    #[allow(dead_code)]
    pub(crate) upstream: Option<toml::Table>,
    /// The gateway's own section (`stipendex gateway`): not the registry's.
    #[allow(dead_code)]
    pub(crate) gateway: Option<toml::Table>,
}

/// `[store]`: where single-use records live (offers verified, operations paid, settlements).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StoreSection {
    /// `memory`, `sqlite://path`, `postgres://…` (or `postgres_url_env`).
    pub(crate) url: Option<String>,
    /// The environment variable holding a PostgreSQL URL with a password.
    pub(crate) url_env: Option<String>,
}

/// Field names that would put a secret in the file: refused with the name of the `_env`
/// field to use instead.
const SECRET_FIELDS: &[&str] = &[
    "payer_key",
    "key",
    "secret",
    "secret_key",
    "seed",
    "token",
    "algod_token",
    "uri",
    "payer_uri",
    "payee_uri",
    "password",
];

/// Decodes one rail's section as `T`, after refusing secrets written into the file.
pub(crate) fn section<T: DeserializeOwned>(name: &str, table: &toml::Table) -> Result<T, Error> {
    for field in SECRET_FIELDS {
        // `token` is also the x402 token contract's address, which is public.
        if *field == "token" && table.get("kind").and_then(toml::Value::as_str) == Some("x402") {
            continue;
        }
        if table.contains_key(*field) {
            return Err(Error::Config(format!(
                "rails.{name}.{field}: secrets are read from the environment only; write `{field}_env = \"VARIABLE\"` instead"
            )));
        }
    }
    let mut table = table.clone();
    table.remove("kind");
    T::deserialize(toml::Value::Table(table))
        .map_err(|e| Error::Config(format!("rails.{name}: {}", e.message())))
}

/// A secret from the environment variable `var`.
pub(crate) fn secret(env: &dyn Env, rail: &str, var: &str) -> Result<String, Error> {
    env.var(var)
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| Error::MissingEnv {
            name: rail.to_owned(),
            var: var.to_owned(),
        })
}

/// A URL given either in the file (`url`) or, when it holds a password, through an environment
/// variable (`url_env`): exactly one of the two. `what` names the section in messages.
pub(crate) fn url(
    env: &dyn Env,
    what: &str,
    url: Option<&String>,
    url_env: Option<&String>,
) -> Result<String, Error> {
    match (url, url_env) {
        (Some(u), None) => Ok(u.clone()),
        (None, Some(var)) => secret(env, what, var),
        _ => Err(Error::Config(format!(
            "{what}: give exactly one of `url` and `url_env`"
        ))),
    }
}

/// `url` with a relative `sqlite://` path read beside `base` (the configuration file's
/// directory); any other URL as it is.
pub fn located(url: String, base: Option<&std::path::Path>) -> String {
    match (url.strip_prefix("sqlite://"), base) {
        (Some(path), Some(base))
            if !path.is_empty() && std::path::Path::new(path).is_relative() =>
        {
            format!("sqlite://{}", base.join(path).display())
        }
        _ => url,
    }
}

/// The storage a URL names.
/// What `url` names (rail-core's one store URL syntax), or a message saying what is accepted.
pub(crate) fn storage<'a>(what: &str, url: &'a str) -> Result<StoreUrl<'a>, Error> {
    StoreUrl::parse(url)
        .ok_or_else(|| Error::Config(format!("{what}.url: use {}", rail_core::keys::STORE_URLS)))
}

/// The refusal of a store whose driver this build does not carry.
pub(crate) fn driver_missing(what: &str, feature: &str) -> Error {
    Error::Config(format!(
        "{what}: a {feature} store needs the cargo feature `{feature}` of stipendex"
    ))
}

/// A 32-byte key from `var`, as 64 hex digits (an optional `0x` prefix allowed).
pub(crate) fn key32(env: &dyn Env, rail: &str, var: &str) -> Result<[u8; 32], Error> {
    let value = secret(env, rail, var)?;
    let body = value.trim().trim_start_matches("0x");
    let mut out = [0u8; 32];
    hex::decode_to_slice(body, &mut out).map_err(|_| Error::BadSecret {
        name: rail.to_owned(),
        var: var.to_owned(),
        why: "is not a 32-byte hex key (64 hex digits)".into(),
    })?;
    Ok(out)
}

/// A decimal amount of `asset` from the configuration (`"1.00"`), exactly.
pub(crate) fn money(rail: &str, field: &str, asset: &Asset, text: &str) -> Result<Money, Error> {
    Money::parse(asset.clone(), text).map_err(|e| {
        Error::Config(format!(
            "rails.{rail}.{field}: {text:?} is not an amount of {asset}: {e}"
        ))
    })
}

/// A field that must parse as `T`.
pub(crate) fn parse<T: std::str::FromStr>(rail: &str, field: &str, text: &str) -> Result<T, Error>
where
    T::Err: std::fmt::Display,
{
    text.parse()
        .map_err(|e| Error::Config(format!("rails.{rail}.{field}: {text:?}: {e}")))
}

/// The asset a rail's `asset` field names (`USD`, `USDC`, `ALGO`, `BTC`).
pub(crate) fn asset(name: &str, code: &str) -> Result<Asset, Error> {
    Asset::by_code(code).ok_or_else(|| {
        Error::Config(format!(
            "rails.{name}.asset: {code:?} is not one of USD, USDC, ALGO, BTC"
        ))
    })
}
