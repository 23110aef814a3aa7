//! `kind = "x402"`: x402 v2 `exact` on EVM (EIP-3009).
//!
//! A receiver's facilitator may require credentials (`facilitator_auth`):
//! - `"cdp"`: a Coinbase Developer Platform API key, its id in the environment variable named by
//!   `cdp_key_id_env` (default `CDP_API_KEY_ID`) and its secret in the one named by
//!   `cdp_key_secret_env` (default `CDP_API_KEY_SECRET`): a fresh JWT per request
//!   ([`rail_x402::facilitator::CdpAuth`]);
//! - `"bearer"`: a fixed token in the environment variable named by `facilitator_token_env`.
//!
//! Each is refused without `facilitator_url`, and so is a variable that is missing or unusable.

use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::{Address, U256};
use async_trait::async_trait;
use rail_core::payer::Idempotent;
use rail_core::{Asset, PayerHandle, RailError, RailReason, ReceiverHandle};
use rail_x402::Token;
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{
    AuthError, Bearer, CdpAuth, FacilitatorAuth, RemoteFacilitator, X402Facilitator,
};
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::rail::{X402RailPayer, X402Receiver};
use rail_x402::rpc::RpcClient;
use serde::Deserialize;

use super::config::{Env, parse, secret, section};
use super::dependency::Dependency;
use super::{Ctx, Sides};
use crate::Error;

/// How long one facilitator call may take.
const FACILITATOR_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a readiness probe of the facilitator may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// The default variables of a CDP API key (the names Coinbase's SDKs read).
const CDP_KEY_ID_ENV: &str = "CDP_API_KEY_ID";
const CDP_KEY_SECRET_ENV: &str = "CDP_API_KEY_SECRET";

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
    /// Receiver: the facilitator's credentials, `"cdp"` or `"bearer"` (none by default).
    facilitator_auth: Option<String>,
    /// With `facilitator_auth = "cdp"`: the variable holding the API key's id.
    cdp_key_id_env: Option<String>,
    /// With `facilitator_auth = "cdp"`: the variable holding the API key's secret.
    cdp_key_secret_env: Option<String>,
    /// With `facilitator_auth = "bearer"`: the variable holding the token.
    facilitator_token_env: Option<String>,
}

/// The credentials `s` configures for its facilitator, read from `env` (none without
/// `facilitator_auth`); every refusal is one sentence naming the key or variable to fix.
fn facilitator_auth(
    name: &str,
    s: &Section,
    env: &dyn Env,
) -> Result<Option<Arc<dyn FacilitatorAuth>>, Error> {
    let given: Vec<&str> = [
        ("facilitator_auth", s.facilitator_auth.is_some()),
        ("cdp_key_id_env", s.cdp_key_id_env.is_some()),
        ("cdp_key_secret_env", s.cdp_key_secret_env.is_some()),
        ("facilitator_token_env", s.facilitator_token_env.is_some()),
    ]
    .into_iter()
    .filter_map(|(key, set)| set.then_some(key))
    .collect();
    if given.is_empty() {
        return Ok(None);
    }
    if s.facilitator_url.is_none() {
        return Err(Error::Config(format!(
            "rails.{name}: {} {} a facilitator's credentials, but there is no `facilitator_url`: add the facilitator's URL (and `pay_to`), or remove {}",
            given.join(", "),
            if given.len() == 1 {
                "configures"
            } else {
                "configure"
            },
            if given.len() == 1 { "it" } else { "them" }
        )));
    }
    let misplaced = |key: &str, kind: &str| {
        Error::Config(format!(
            "rails.{name}.{key} applies to facilitator_auth = \"{kind}\" only: remove it, or set facilitator_auth = \"{kind}\""
        ))
    };
    match s.facilitator_auth.as_deref() {
        Some("cdp") => {
            if s.facilitator_token_env.is_some() {
                return Err(misplaced("facilitator_token_env", "bearer"));
            }
            let id_var = s.cdp_key_id_env.as_deref().unwrap_or(CDP_KEY_ID_ENV);
            let secret_var = s
                .cdp_key_secret_env
                .as_deref()
                .unwrap_or(CDP_KEY_SECRET_ENV);
            let id = secret(env, name, id_var)?;
            let key = zeroize::Zeroizing::new(secret(env, name, secret_var)?);
            let auth = CdpAuth::named(&id, &key, id_var, secret_var)
                .map_err(|e| auth_error(name, &e))?
                .with_hint(format!(
                    "check the API key named by cdp_key_id_env/cdp_key_secret_env ({id_var}/{secret_var})"
                ));
            tracing::info!(rail = %name, key_id = auth.key_id(), alg = auth.algorithm(), "x402: the facilitator is called with a CDP API key");
            Ok(Some(Arc::new(auth)))
        }
        Some("bearer") => {
            for key in ["cdp_key_id_env", "cdp_key_secret_env"] {
                if given.contains(&key) {
                    return Err(misplaced(key, "cdp"));
                }
            }
            let var = s.facilitator_token_env.as_deref().ok_or_else(|| {
                Error::Config(format!(
                    "rails.{name}: facilitator_auth = \"bearer\" needs `facilitator_token_env`, the environment variable that holds the token"
                ))
            })?;
            let token = zeroize::Zeroizing::new(secret(env, name, var)?);
            let auth = Bearer::new(&token, var)
                .map_err(|e| auth_error(name, &e))?
                .with_hint(format!(
                    "check the token named by facilitator_token_env ({var})"
                ));
            Ok(Some(Arc::new(auth)))
        }
        Some(other) => Err(Error::Config(format!(
            "rails.{name}.facilitator_auth: {other:?} is not one of \"cdp\" (a Coinbase Developer Platform API key) or \"bearer\" (a fixed token)"
        ))),
        None => Err(Error::Config(format!(
            "rails.{name}: {} needs facilitator_auth = \"cdp\" or \"bearer\"",
            given.join(", ")
        ))),
    }
}

/// A credential the environment holds but that cannot be used, as the registry's error.
fn auth_error(name: &str, e: &AuthError) -> Error {
    let bad = |var: &String, why: &str| Error::BadSecret {
        name: name.to_owned(),
        var: var.clone(),
        why: why.to_owned(),
    };
    match e {
        AuthError::BadSecret { var } => bad(
            var,
            "is neither a base64 Ed25519 key nor a PEM EC P-256 key",
        ),
        AuthError::MismatchedKey { var } => bad(
            var,
            "is a 64-byte Ed25519 key whose public half does not match its seed: copy the secret again from the CDP portal",
        ),
        AuthError::BadToken { var } => bad(
            var,
            "holds characters a header cannot carry: give the token alone, on one line",
        ),
        AuthError::Missing { var } => Error::MissingEnv {
            name: name.to_owned(),
            var: var.clone(),
        },
        other => Error::Config(format!("rails.{name}: {other}")),
    }
}

/// The facilitator at `url`, `timeout` per call, with `auth`'s credentials.
fn remote(
    url: &str,
    timeout: Duration,
    auth: Option<Arc<dyn FacilitatorAuth>>,
) -> Result<RemoteFacilitator, RailError> {
    let f = RemoteFacilitator::new(url, timeout)
        .map_err(|e| RailError::Unavailable(RailReason::new("x402 facilitator", e.to_string())))?;
    Ok(match auth {
        Some(a) => f.with_auth(a),
        None => f,
    })
}

/// A receiver's facilitator, probed for readiness with `GET {facilitator_url}/supported`
/// (with the rail's credentials, so refused credentials show too).
#[derive(Debug)]
struct FacilitatorProbe(RemoteFacilitator);

#[async_trait]
impl Dependency for FacilitatorProbe {
    fn name(&self) -> String {
        format!("facilitator {}", self.0.url())
    }

    async fn check(&self) -> Result<(), String> {
        self.0
            .supported()
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

/// What the receiving side of `[rails.<name>]` depends on: its facilitator.
pub(super) fn dependencies(
    name: &str,
    table: &toml::Table,
    env: &dyn Env,
) -> Result<Vec<Arc<dyn Dependency>>, Error> {
    let s: Section = section(name, table)?;
    let auth = facilitator_auth(name, &s, env)?;
    let (Some(_), Some(url)) = (&s.pay_to, &s.facilitator_url) else {
        return Ok(Vec::new());
    };
    let f = remote(url, PROBE_TIMEOUT, auth).map_err(|source| Error::Rail {
        name: name.to_owned(),
        source,
    })?;
    Ok(vec![Arc::new(FacilitatorProbe(f))])
}

pub(super) async fn build(ctx: &Ctx<'_>) -> Result<Sides, Error> {
    let s: Section = section(ctx.name, ctx.table)?;
    let token_address: Address = parse(ctx.name, "token", &s.token)?;
    let auth = facilitator_auth(ctx.name, &s, ctx.env)?;
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
            let max = ctx.max_amount(s.max_amount.as_deref(), &Asset::usdc())?;
            let policy = Policy::new(&s.network, token_address, U256::from(max.minor_units()));
            let rpc_url = s.rpc_url.as_deref().ok_or_else(|| {
                Error::Config(format!(
                    "rails.{}: a payer needs `rpc_url` (its balance is checked before signing)",
                    ctx.name
                ))
            })?;
            let rpc = RpcClient::new(rpc_url).map_err(|e| ctx.unavailable("x402 rpc", e))?;
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
                remote(url, FACILITATOR_TIMEOUT, auth).map_err(|e| ctx.rail_err(e))?;
            let token = Token::new(&s.network, token_address, &s.token_name, &s.token_version);
            let facilitator: Arc<dyn X402Facilitator> = Arc::new(facilitator);
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
    let sides = sides.with_schemes(scheme, scheme_receiver);
    Ok(sides)
}
