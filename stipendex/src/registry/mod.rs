//! The run-time registry: rails created from a TOML configuration plus the environment,
//! handed out by name.
//!
//! ```toml
//! [store]                         # single-use records: verified offers, paid operations
//! url = "sqlite://stipendex.db"   # or "postgres://…" (or url_env = "VAR"), or "memory" (tests)
//!
//! [rails.house]                   # a rail instance named "house"
//! kind = "ledger"                 # ledger | account | x402 | exact-algo | exact-avm | stripe | ln-nwc
//! # … the kind's own fields (see below)
//! ```
//!
//! A relative `sqlite://` path (the `[store]`'s, a ledger's) is read beside the file that
//! names it ([`Registry::from_file`]), never from the directory the command runs in: a wallet's
//! limits and revocations follow its configuration wherever it is started.
//!
//! Secrets never sit in the file: a field that would hold one is named `…_env` and names the
//! environment variable that holds it (`payer_key_env = "X402_PAYER_KEY"`); writing the secret
//! itself (`payer_key = …`) is refused. Each rail has a payer side (a wallet pays from it) and
//! a receiver side (a service is paid into it); configure either or both.
//!
//! | kind | payer side | receiver side | other fields |
//! |---|---|---|---|
//! | `ledger` | `payer_account` | `payee_account` | `url` (`sqlite://…` or `postgres://…`), `schema`, `asset` (`USD`) |
//! | `account` | `payer_account`, `payer_key_env` | `payee_account`, `payee_key_env` | `url` (or `urls`: the facilitator's instances), `network`, `asset` (`USD`) |
//! | `x402` | `payer_key_env`, `max_amount`, `rpc_url` | `pay_to`, `facilitator_url` | `network`, `token`, `token_name`, `token_version` |
//! | `exact-algo` | `payer_key_env`, `max_amount`, `networks` | `pay_to` | `algod_url`, `algod_token_env` |
//! | `exact-avm` | `payer_key_env`, `max_amount` (USDC) | `pay_to`, `fee_payer_key_env` or `facilitator_url`, `spelling` | `algod_url`, `algod_token_env`, `asset` (USDC's id by default) |
//! | `stripe` | `payment_method`, `max_amount` | `secret_key_env`, `publishable_key`, `payee` | `api_base`, `currency` (`usd`) |
//! | `ln-nwc` | `payer_uri_env`, `max_amount`, `network` | `payee_uri_env`, `seed_env` | |
//!
//! Examples, one per rail:
//!
//! ```toml
//! [rails.house]
//! kind = "ledger"
//! url = "sqlite://ledger.db"
//! asset = "USD"
//! payer_account = "0000000000000000000000000000a11c"   # this wallet pays from it
//! payee_account = "00000000000000000000000000000b0b"   # this service is paid into it
//!
//! [rails.hosted]
//! kind = "account"
//! url = "https://facilitator.example"  # a hosted Stipendex facilitator
//! network = "facilitator.example"      # its network name
//! payee_account = "00000000000000000000000000000b0b"
//! payee_key_env = "STIPENDEX_ACCOUNT_KEY"  # 32-byte hex Ed25519 seed
//!
//! [rails.base-sepolia]
//! kind = "x402"
//! network = "eip155:84532"
//! token = "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
//! token_name = "USDC"
//! token_version = "2"
//! payer_key_env = "X402_PAYER_KEY"     # 32-byte hex secp256k1 key
//! max_amount = "1.00"                  # USDC per payment
//! rpc_url = "https://sepolia.base.org" # balance checks before signing
//! pay_to = "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
//! facilitator_url = "https://x402.org/facilitator"
//!
//! [rails.algo]
//! kind = "exact-algo"
//! algod_url = "http://127.0.0.1:4001"
//! algod_token_env = "ALGOD_TOKEN"
//! payer_key_env = "ALGO_PAYER_KEY"     # 32-byte hex Ed25519 seed
//! max_amount = "0.5"                   # ALGO per payment
//! pay_to = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAY5HFKQ"
//!
//! [rails.usdc-algorand]
//! kind = "exact-avm"                   # x402's own exact on Algorand: USDC (ASA 10458941 on testnet)
//! algod_url = "https://testnet-api.algonode.cloud"
//! payer_key_env = "AVM_PAYER_KEY"      # 32-byte hex Ed25519 seed
//! max_amount = "1.00"                  # USDC per payment
//! pay_to = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAY5HFKQ"
//! fee_payer_key_env = "AVM_FEE_PAYER_KEY"  # this process pays the group's fees (or facilitator_url)
//!
//! [rails.card]
//! kind = "stripe"
//! api_base = "https://api.stripe.com"
//! currency = "usd"
//! payment_method = "pm_card_visa"      # payer side
//! max_amount = "20.00"
//! secret_key_env = "STRIPE_SECRET_KEY" # receiver side
//! publishable_key = "pk_test_…"
//! payee = "shop-1"
//!
//! [rails.lightning]
//! kind = "ln-nwc"
//! network = "regtest"                  # bitcoin | testnet | signet | regtest
//! payer_uri_env = "NWC_PAYER_URI"      # nostr+walletconnect://… of the paying wallet
//! max_amount = "0.0001"                # BTC per payment
//! payee_uri_env = "NWC_PAYEE_URI"      # receiver side: the receiving wallet
//! seed_env = "NWC_RECEIVER_SEED"       # 32-byte hex: derives offer ids
//! ```
//!
//! Payers come wrapped in [`rail_core::payer::Idempotent`] on the configured store: the same
//! operation id pays once, across restarts.

#[cfg(feature = "account")]
mod account;
pub(crate) mod config;
mod dependency;
pub use dependency::*;
#[cfg(all(feature = "paywall", feature = "http"))]
mod discovery;
#[cfg(feature = "exact-algo")]
mod exact_algo;
#[cfg(feature = "exact-avm")]
mod exact_avm;
#[cfg(feature = "ledger")]
mod ledger;
#[cfg(feature = "ln-nwc")]
mod ln_nwc;
#[cfg(feature = "stripe")]
mod stripe;
#[cfg(feature = "x402")]
mod x402;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rail_core::{
    Capabilities, KeyStore, Offer, PayerHandle, RailHandle, ReceiverHandle, SharedClock,
    SystemClock,
};

pub use config::{Env, ProcessEnv, located};
#[cfg(all(feature = "paywall", feature = "http"))]
pub use discovery::{Discovery, Service, Tool};

use crate::Error;

/// The rail kinds this crate knows, and the cargo feature that carries each.
pub const KINDS: &[(&str, &str)] = &[
    ("ledger", "ledger"),
    ("account", "account"),
    ("x402", "x402"),
    ("exact-algo", "exact-algo"),
    ("exact-avm", "exact-avm"),
    ("stripe", "stripe"),
    ("ln-nwc", "ln-nwc"),
];

/// One configured rail.
#[derive(Clone)]
pub struct Entry {
    /// Its name in the configuration.
    pub name: String,
    /// Its kind (`ledger`, `x402`, …).
    pub kind: &'static str,
    /// The paying side, if configured.
    pub payer: Option<PayerHandle>,
    /// The receiving side, if configured.
    pub receiver: Option<ReceiverHandle>,
    /// The payer of unsigned x402 challenges, for a paying rail that is an x402 scheme
    /// (`x402`, `exact-algo`); [`crate::wallet::Builder::registry`] adds it to the wallet.
    #[cfg(feature = "challenges")]
    pub scheme_payer: Option<Arc<dyn x402_transport::client::SchemePayer>>,
    /// The receiving side as an x402 scheme (`x402`, `exact-algo` with a receiving side), for
    /// a paywall that also takes plain x402 payments beside the Stipendex Quote (the gateway).
    #[cfg(feature = "challenges")]
    pub scheme_receiver: Option<Arc<dyn x402_transport::Scheme>>,
    /// The rail's own discovery documents, if it publishes any (exact-algo: `/llms.txt`,
    /// `/.well-known/exact-algo.json`), for a binding that fronts a service (the gateway).
    #[cfg(all(feature = "paywall", feature = "http"))]
    pub discovery: Option<Arc<dyn Discovery>>,
}

impl Entry {
    /// What the rail claims it can do (from whichever side is configured).
    #[must_use]
    pub fn capabilities(&self) -> Option<Capabilities> {
        match (&self.payer, &self.receiver) {
            (_, Some(r)) => Some(r.receiver.capabilities()),
            (Some(p), None) => Some(p.payer.capabilities()),
            (None, None) => None,
        }
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("payer", &self.payer.is_some())
            .field("receiver", &self.receiver.is_some())
            .finish()
    }
}

/// What a rail's builder gets: its name, its section, the environment, the shared store and
/// the clock (each rail uses what it needs; a build with no rail uses none).
#[allow(dead_code)]
pub(crate) struct Ctx<'a> {
    pub(crate) name: &'a str,
    pub(crate) table: &'a toml::Table,
    pub(crate) env: &'a dyn Env,
    store: Option<Arc<dyn KeyStore>>,
    pub(crate) clock: SharedClock,
    /// The directory of the configuration file: relative paths are read beside it.
    pub(crate) base: Option<&'a Path>,
}

#[allow(dead_code)]
impl Ctx<'_> {
    /// The shared store of single-use records, for a side that keeps some (every payer, and
    /// receivers that verify locally); a configuration without `[store]` is refused here,
    /// naming the rail that needs one.
    pub(crate) fn store(&self) -> Result<Arc<dyn KeyStore>, Error> {
        self.store.clone().ok_or_else(|| {
            Error::Config(format!(
                "rails.{}: this rail keeps single-use records: add a [store] (url = \"sqlite://stipendex.db\", a postgres:// URL, or \"memory\" for tests)",
                self.name
            ))
        })
    }

    /// A rail error while starting this rail.
    pub(crate) fn rail_err(&self, source: rail_core::RailError) -> Error {
        Error::Rail {
            name: self.name.to_owned(),
            source,
        }
    }

    /// `what` (a service the rail reaches: `algod`, a facilitator) unavailable with `e`, as
    /// this rail's error.
    pub(crate) fn unavailable(&self, what: &str, e: impl std::fmt::Display) -> Error {
        self.rail_err(rail_core::RailError::Unavailable(
            rail_core::RailReason::new(what, e.to_string()),
        ))
    }

    /// The secret in the environment variable `var`, if the section names one.
    pub(crate) fn secret_in(&self, var: Option<&str>) -> Result<Option<String>, Error> {
        var.map(|var| config::secret(self.env, self.name, var))
            .transpose()
    }

    /// A payer's `max_amount` (`text`), in `asset`: a payer needs one.
    pub(crate) fn max_amount(
        &self,
        text: Option<&str>,
        asset: &rail_core::Asset,
    ) -> Result<rail_core::Money, Error> {
        let text = text.ok_or_else(|| {
            Error::Config(format!("rails.{}: a payer needs `max_amount`", self.name))
        })?;
        config::money(self.name, "max_amount", asset, text)
    }

    /// As [`Ctx::max_amount`], in minor units (at most `u64::MAX`).
    pub(crate) fn max_minor_units(
        &self,
        text: Option<&str>,
        asset: &rail_core::Asset,
    ) -> Result<u64, Error> {
        let max = self.max_amount(text, asset)?;
        u64::try_from(max.minor_units())
            .map_err(|_| Error::Config(format!("rails.{}.max_amount: too large", self.name)))
    }
}

/// The rails of one configuration, by name.
#[derive(Debug, Default)]
pub struct Registry {
    rails: BTreeMap<String, Entry>,
    store: Option<Arc<dyn KeyStore>>,
    store_file: Option<PathBuf>,
    #[cfg(feature = "postgres")]
    store_pool: Option<sqlx::PgPool>,
}

impl Registry {
    /// Builds the registry from the TOML file at `path`, reading secrets from the process
    /// environment.
    ///
    /// # Errors
    /// [`Error`]: the file, a field, a missing feature or secret, a rail that cannot start.
    ///
    /// A relative `sqlite://` path in it is read beside the file (not from the working
    /// directory).
    pub async fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            path: path.display().to_string(),
            source,
        })?;
        let base = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        Self::build(
            &text,
            &ProcessEnv,
            Arc::new(SystemClock),
            Some((path, base)),
        )
        .await
    }

    /// Builds the registry from TOML text, reading secrets from `env`.
    ///
    /// # Errors
    /// As [`Registry::from_file`].
    pub async fn from_toml(text: &str, env: &dyn Env) -> Result<Self, Error> {
        Self::from_toml_with_clock(text, env, Arc::new(SystemClock)).await
    }

    /// As [`Registry::from_toml`], with an injected clock shared by every rail.
    ///
    /// # Errors
    /// As [`Registry::from_file`].
    pub async fn from_toml_with_clock(
        text: &str,
        env: &dyn Env,
        clock: SharedClock,
    ) -> Result<Self, Error> {
        Self::build(text, env, clock, None).await
    }

    /// The registry of `text` (read from the file `file.0`, if it was), its relative paths
    /// read beside the directory `file.1` (else the working directory).
    async fn build(
        text: &str,
        env: &dyn Env,
        clock: SharedClock,
        file: Option<(&Path, &Path)>,
    ) -> Result<Self, Error> {
        let base = file.map(|(_, base)| base);
        let file: config::File = toml::from_str(text).map_err(|e| {
            Error::Config(toml_error_in(
                file.map(|(path, _)| path.display().to_string()).as_deref(),
                text,
                &e,
            ))
        })?;
        // Every kind is checked before anything is opened: a build without a rail's feature
        // fails at once, naming the feature.
        let mut kinds = Vec::new();
        for (name, table) in &file.rails {
            kinds.push(kind_of(name, table)?);
        }
        let opened = open_store(file.store.as_ref(), env, base).await?;
        let store = opened.store;
        let mut rails = BTreeMap::new();
        for ((name, table), kind) in file.rails.iter().zip(kinds) {
            let ctx = Ctx {
                name,
                table,
                env,
                store: store.clone(),
                clock: clock.clone(),
                base,
            };
            let sides = build(kind, &ctx).await?;
            let (payer, receiver) = (sides.payer, sides.receiver);
            if payer.is_none() && receiver.is_none() {
                return Err(Error::Config(format!(
                    "rails.{name}: neither a payer nor a receiver side is configured"
                )));
            }
            tracing::info!(rail = %name, kind, payer = payer.is_some(), receiver = receiver.is_some(), "rail ready");
            rails.insert(
                name.clone(),
                Entry {
                    name: name.clone(),
                    kind,
                    payer,
                    receiver,
                    #[cfg(feature = "challenges")]
                    scheme_payer: sides.scheme,
                    #[cfg(feature = "challenges")]
                    scheme_receiver: sides.scheme_receiver,
                    #[cfg(all(feature = "paywall", feature = "http"))]
                    discovery: sides.discovery,
                },
            );
        }
        Ok(Registry {
            rails,
            store,
            store_file: opened.file,
            #[cfg(feature = "postgres")]
            store_pool: opened.pool,
        })
    }

    /// The `[store]`, opened once and shared by every rail that keeps records (and by a wallet
    /// or receiver built on this registry), if the file has one.
    #[must_use]
    pub fn store(&self) -> Option<&Arc<dyn KeyStore>> {
        self.store.as_ref()
    }

    /// The file of the `[store]` when it is a SQLite one (`sqlite://PATH`, a relative path
    /// read beside the configuration): other tables of the process's own (a wallet's journal)
    /// can live in it and share its commits.
    pub fn store_file(&self) -> Option<&Path> {
        self.store_file.as_deref()
    }

    /// The connection pool of the `[store]` when it is a PostgreSQL one: other tables of the
    /// process's own (a wallet's journal, [`crate::wallet::PgJournal`]) can live in its
    /// database.
    #[cfg(feature = "postgres")]
    #[must_use]
    pub fn store_pool(&self) -> Option<&sqlx::PgPool> {
        self.store_pool.as_ref()
    }

    /// Every configured rail, by name.
    pub fn rails(&self) -> impl Iterator<Item = &Entry> {
        self.rails.values()
    }

    /// The rail named `name`.
    ///
    /// # Errors
    /// [`Error::NoSuchRail`].
    pub fn get(&self, name: &str) -> Result<&Entry, Error> {
        self.rails
            .get(name)
            .ok_or_else(|| Error::NoSuchRail(name.to_owned()))
    }

    /// The paying side of `name`.
    ///
    /// # Errors
    /// [`Error::NoSuchRail`], [`Error::NoSide`].
    pub fn payer(&self, name: &str) -> Result<&PayerHandle, Error> {
        self.get(name)?.payer.as_ref().ok_or_else(|| Error::NoSide {
            name: name.to_owned(),
            side: "payer",
        })
    }

    /// The receiving side of `name`.
    ///
    /// # Errors
    /// [`Error::NoSuchRail`], [`Error::NoSide`].
    pub fn receiver(&self, name: &str) -> Result<&ReceiverHandle, Error> {
        self.get(name)?
            .receiver
            .as_ref()
            .ok_or_else(|| Error::NoSide {
                name: name.to_owned(),
                side: "receiver",
            })
    }

    /// Both sides of `name` as one [`RailHandle`] (a rail configured to pay and be paid).
    ///
    /// # Errors
    /// [`Error::NoSuchRail`], [`Error::NoSide`].
    pub fn handle(&self, name: &str) -> Result<RailHandle, Error> {
        Ok(RailHandle::from_parts(
            self.payer(name)?.clone(),
            self.receiver(name)?.clone(),
        ))
    }

    /// The names of the rails whose payer could pay `offer` ([`rail_core::Payer::accepts`]:
    /// its rail, asset, network and the payer's own limit; a hold offer needs a rail that
    /// holds), in name order.
    #[must_use]
    pub fn can_pay(&self, offer: &Offer) -> Vec<&str> {
        self.rails
            .values()
            .filter(|e| {
                e.payer.as_ref().is_some_and(|p| {
                    let side_ok = match offer.mode {
                        rail_core::PaymentMode::Capture => true,
                        rail_core::PaymentMode::Hold => p.hold_payer.is_some(),
                    };
                    side_ok && p.payer.accepts(offer).is_ok()
                })
            })
            .map(|e| e.name.as_str())
            .collect()
    }
}

/// The kind of `[rails.<name>]`, if this build carries it.
fn kind_of(name: &str, table: &toml::Table) -> Result<&'static str, Error> {
    kind_in(name, table, compiled)
}

fn kind_in(
    name: &str,
    table: &toml::Table,
    compiled: fn(&str) -> bool,
) -> Result<&'static str, Error> {
    let kind = table
        .get("kind")
        .and_then(toml::Value::as_str)
        .ok_or_else(|| Error::Config(format!("rails.{name}: missing `kind`")))?;
    let Some(&(known, feature)) = KINDS.iter().find(|(k, _)| *k == kind) else {
        return Err(Error::UnknownKind {
            name: name.to_owned(),
            kind: kind.to_owned(),
        });
    };
    if compiled(known) {
        Ok(known)
    } else {
        Err(Error::NotCompiled {
            name: name.to_owned(),
            kind: kind.to_owned(),
            feature,
        })
    }
}

/// The rail kinds this build carries (by its cargo features), in the order of [`KINDS`]:
/// what a configuration's `kind` may name here.
///
/// ```
/// // The default build carries the ledger rail.
/// assert!(stipendex::registry::compiled_kinds().contains(&"ledger"));
/// ```
#[must_use]
pub fn compiled_kinds() -> Vec<&'static str> {
    KINDS
        .iter()
        .map(|&(kind, _)| kind)
        .filter(|kind| compiled(kind))
        .collect()
}

/// A TOML error of the file at `path`, whose text is `text`, as one line a person can act on:
/// the file, the line and column the error starts at, and what is wrong —
/// `rails.toml line 4, column 7: invalid type: string "x", expected u64`. (The error's own
/// `Display` spans several lines with a snippet of the file, which a one-line message or a
/// log record cannot carry.) An error without a position names the file and what is wrong.
#[must_use]
pub fn toml_error(path: &Path, text: &str, e: &toml::de::Error) -> String {
    toml_error_in(Some(&path.display().to_string()), text, e)
}

/// [`toml_error`] for a text that came from `file` (or from no file: the position alone).
pub(crate) fn toml_error_in(file: Option<&str>, text: &str, e: &toml::de::Error) -> String {
    let what = one_line(e.message());
    match (e.span().map(|s| line_column(text, s.start)), file) {
        (Some((line, column)), Some(f)) => format!("{f} line {line}, column {column}: {what}"),
        (Some((line, column)), None) => format!("line {line}, column {column}: {what}"),
        (None, Some(f)) => format!("{f}: {what}"),
        (None, None) => what,
    }
}

/// The 1-based line and column (in characters) of byte `at` of `text`.
pub(crate) fn line_column(text: &str, at: usize) -> (usize, usize) {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit('\n')
        .next()
        .map_or(0, |l| l.trim_end_matches('\r').chars().count())
        + 1;
    (line, column)
}

/// `s` on one line: its lines, trimmed, joined by a space.
pub(crate) fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether this build carries `kind`.
#[must_use]
#[allow(clippy::match_like_matches_macro)] // one line per feature reads better
pub fn compiled(kind: &str) -> bool {
    match kind {
        "ledger" => cfg!(feature = "ledger"),
        "account" => cfg!(feature = "account"),
        "x402" => cfg!(feature = "x402"),
        "exact-algo" => cfg!(feature = "exact-algo"),
        "exact-avm" => cfg!(feature = "exact-avm"),
        "stripe" => cfg!(feature = "stripe"),
        "ln-nwc" => cfg!(feature = "ln-nwc"),
        _ => false,
    }
}

/// What a rail's section builds: its paying and receiving sides and, for a rail that is also an
/// x402 scheme (feature `challenges`), the payer of unsigned challenges a wallet adds.
pub(crate) struct Sides {
    payer: Option<PayerHandle>,
    receiver: Option<ReceiverHandle>,
    #[cfg(feature = "challenges")]
    scheme: Option<Arc<dyn x402_transport::client::SchemePayer>>,
    #[cfg(feature = "challenges")]
    scheme_receiver: Option<Arc<dyn x402_transport::Scheme>>,
    #[cfg(all(feature = "paywall", feature = "http"))]
    discovery: Option<Arc<dyn Discovery>>,
}

#[cfg(feature = "challenges")]
#[allow(dead_code)] // with no x402-style rail compiled in, no builder sets them
impl Sides {
    /// These sides, with the x402-style scheme payer and receiver the rail's builder made.
    fn with_schemes(
        self,
        scheme: Option<Arc<dyn x402_transport::client::SchemePayer>>,
        scheme_receiver: Option<Arc<dyn x402_transport::Scheme>>,
    ) -> Self {
        Sides {
            scheme,
            scheme_receiver,
            ..self
        }
    }
}

impl From<(Option<PayerHandle>, Option<ReceiverHandle>)> for Sides {
    fn from((payer, receiver): (Option<PayerHandle>, Option<ReceiverHandle>)) -> Self {
        Sides {
            payer,
            receiver,
            #[cfg(feature = "challenges")]
            scheme: None,
            #[cfg(feature = "challenges")]
            scheme_receiver: None,
            #[cfg(all(feature = "paywall", feature = "http"))]
            discovery: None,
        }
    }
}

#[allow(clippy::unused_async)] // with no rail compiled in there is nothing to await
async fn build(kind: &str, ctx: &Ctx<'_>) -> Result<Sides, Error> {
    match kind {
        #[cfg(feature = "ledger")]
        "ledger" => ledger::build(ctx).await,
        #[cfg(feature = "account")]
        "account" => account::build(ctx).await,
        #[cfg(feature = "x402")]
        "x402" => x402::build(ctx).await,
        #[cfg(feature = "exact-algo")]
        "exact-algo" => exact_algo::build(ctx).await,
        #[cfg(feature = "exact-avm")]
        "exact-avm" => exact_avm::build(ctx).await,
        #[cfg(feature = "stripe")]
        "stripe" => stripe::build(ctx).await,
        #[cfg(feature = "ln-nwc")]
        "ln-nwc" => ln_nwc::build(ctx).await,
        other => Err(Error::UnknownKind {
            name: ctx.name.to_owned(),
            kind: other.to_owned(),
        }),
    }
}

/// What `[rails.<name>]` depends on (nothing for a kind this build does not carry): the
/// per-kind dispatch of [`dependencies_of_toml`], here so that [`dependency`] names no rail kind.
fn dependencies_of_rail(
    name: &str,
    table: &toml::Table,
    env: &dyn Env,
) -> Result<Vec<Arc<dyn Dependency>>, Error> {
    #[cfg(feature = "x402")]
    if table.get("kind").and_then(toml::Value::as_str) == Some("x402") {
        return x402::dependencies(name, table, env);
    }
    let _ = (name, table, env);
    Ok(Vec::new())
}

/// The `[store]`, if the file has one (a receiver whose rail verifies at a facilitator needs
/// none), and its file when it is a SQLite one.
/// The `[store]` as it was opened: the key store, and where its other tables may live.
#[derive(Default)]
struct OpenedStore {
    store: Option<Arc<dyn KeyStore>>,
    file: Option<PathBuf>,
    #[cfg(feature = "postgres")]
    pool: Option<sqlx::PgPool>,
}

async fn open_store(
    section: Option<&config::StoreSection>,
    env: &dyn Env,
    base: Option<&Path>,
) -> Result<OpenedStore, Error> {
    let Some(section) = section else {
        return Ok(OpenedStore::default());
    };
    let url = config::located(
        config::url(env, "store", section.url.as_ref(), section.url_env.as_ref())?,
        base,
    );
    let store = config::storage("store", &url)?;
    if let Some(driver) = store.feature().filter(|_| !store.compiled()) {
        return Err(config::driver_missing("store", driver));
    }
    let failed = |source| Error::Rail {
        name: "store".into(),
        source,
    };
    // PostgreSQL: the key store on a pool the registry keeps, for the process's other tables.
    #[cfg(feature = "postgres")]
    if let rail_core::keys::StoreUrl::Postgres(url) = store {
        let pool = rail_core::keys::sql::postgres_pool(url, None)
            .await
            .map_err(failed)?;
        let keys = rail_core::keys::sql::PgKeyStore::new(pool.clone())
            .await
            .map_err(failed)?;
        return Ok(OpenedStore {
            store: Some(Arc::new(keys)),
            file: None,
            pool: Some(pool),
        });
    }
    let file = match store {
        rail_core::keys::StoreUrl::Sqlite(p) => Some(p.to_path_buf()),
        _ => None,
    };
    rail_core::keys::open_at(store, None)
        .await
        .map(|s| OpenedStore {
            store: Some(s),
            file,
            ..OpenedStore::default()
        })
        .map_err(failed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_toml_error_is_one_line_with_its_line_and_column() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct T {
            a: u64,
            b: u64,
        }
        let text = "# prices\na = 1\n\nb   = \"x\"\n";
        let e = toml::from_str::<T>(text).unwrap_err();
        assert!(
            e.to_string().contains('\n'),
            "toml's own Display spans lines"
        );
        let got = toml_error(Path::new("rails.toml"), text, &e);
        assert_eq!(
            got,
            "rails.toml line 4, column 7: invalid type: string \"x\", expected u64"
        );
        assert_eq!(
            toml_error_in(None, text, &e),
            "line 4, column 7: invalid type: string \"x\", expected u64"
        );
        // A syntax error, after characters of several bytes.
        let text = "a = 1\n# café ☕\nb = é\n";
        let e = toml::from_str::<T>(text).unwrap_err();
        let got = toml_error(Path::new("shop.toml"), text, &e);
        assert!(got.starts_with("shop.toml line 3, column 5: "), "{got}");
        assert!(!got.contains('\n') && !got.contains("\\u{a}"), "{got}");
    }

    #[test]
    fn lines_and_columns_count_characters_from_one() {
        assert_eq!(line_column("", 0), (1, 1));
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("ab\r\ncd", 4), (2, 1));
        assert_eq!(line_column("é=1", 2), (1, 2));
        assert_eq!(line_column("ab", 99), (1, 3));
    }

    #[test]
    fn a_rail_not_compiled_in_names_its_feature() {
        let table: toml::Table = toml::from_str("kind = \"ln-nwc\"").unwrap();
        let err = kind_in("lightning", &table, |_| false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rail `lightning` is of kind `ln-nwc`, which this build does not include: enable the cargo feature `ln-nwc` of stipendex"
        );
        assert_eq!(kind_in("lightning", &table, |_| true).unwrap(), "ln-nwc");
    }
}
