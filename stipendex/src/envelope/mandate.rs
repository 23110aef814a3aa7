//! The Mandate: the wallet's authority, signed by the principal.

use rail_core::{Amount, Asset, Money};
use serde::{Deserialize, Serialize};

use super::key::PublicKey;
use super::signed::{Identity, Object, Tag, money};
use crate::Error;

/// A party that signs: an id chosen by the party (`acme-search`, `alice@example.com`) and its key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Party {
    /// The party's id.
    pub id: String,
    /// The party's public key.
    pub key: PublicKey,
}

/// The wallet's authority: who may be paid, how much, until when, and when a human must
/// confirm. Signed by the principal; names the one wallet key that may spend under it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mandate {
    /// `mandate/0.1`.
    pub stipendex: Tag,
    /// `m_…`, unique per principal.
    pub id: String,
    /// The principal (the signer): the source of funds and authority.
    pub principal: Party,
    /// The wallet key that may spend under this mandate (it signs Proofs and Confirmations).
    pub wallet: PublicKey,
    /// Issued at (Unix seconds).
    pub iat: u64,
    /// Not valid before (Unix seconds).
    pub nbf: u64,
    /// Not valid at or after (Unix seconds).
    pub exp: u64,
    /// The limits, one entry per asset; a payment in an asset without an entry is refused.
    pub limits: Vec<Limits>,
    /// Whom the wallet may pay; everyone else is denied (default deny, I4).
    pub allow: Vec<Allow>,
    /// Rail kinds the wallet may pay over (`ledger`, `x402`, …); absent: any it has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rails: Option<Vec<String>>,
    /// What the mandate is for, in the principal's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// A spending period.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Period {
    /// Its length in seconds; periods are aligned on the Unix epoch (86400: a UTC day).
    pub seconds: u64,
    /// The most spent in one period.
    pub amount: Amount,
}

/// The limits of one asset. Every amount is a decimal string in `asset`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// The asset (`{"code": "USD", "scale": 2}`).
    pub asset: Asset,
    /// The most one payment may be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_call: Option<Amount>,
    /// The most spent per period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_period: Option<Period>,
    /// The most spent under the mandate, ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Amount>,
    /// The most spent with any one receiver (or origin), ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_receiver: Option<Amount>,
    /// Human in the loop: a payment above this needs a Confirmation (the checkout profile
    /// always does). Absent: no confirmation below the other limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirm_above: Option<Amount>,
    /// Tab sessions: the largest cap the wallet may hold for one tab. Absent: the wallet opens
    /// no tab in this asset (`docs/stipendex-profile.md` §4b).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tab_cap: Option<Amount>,
    /// Tab sessions: how many tabs may be open at once under the mandate in this asset
    /// (default 1 when `tab_cap` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_tabs: Option<u32>,
}

impl Limits {
    /// `amount` as money of this entry's asset.
    ///
    /// # Errors
    /// [`Error::Malformed`] if it is more precise than the asset.
    pub fn money(&self, amount: Amount) -> Result<Money, Error> {
        money(
            &self.asset,
            amount,
            format_args!("mandate limit {amount} {}", self.asset),
        )
    }
}

/// Whom a wallet may pay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Allow {
    /// A Stipendex receiver: its Quotes are signed by `key` and name `id`.
    Receiver {
        /// The receiver's id.
        id: String,
        /// The receiver's key (pinned: a Quote signed by another key is denied).
        key: PublicKey,
        /// The origins (`https://host[:port]`) the receiver may be reached at over HTTP. The
        /// HTTP client pays a Quote only at one of them, for the request it sent there; an
        /// entry without origins is not payable over HTTP.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        origins: Vec<String>,
    },
    /// A plain x402 server over HTTP: unsigned 402 challenges from `origin` paying `pay_to`.
    X402Http {
        /// `https://host[:port]` (scheme, host, port; no path).
        origin: String,
        /// The `payTo` its challenges must name.
        pay_to: String,
    },
    /// A plain x402 (or exact-algo) MCP server: unsigned `isError` challenges from `server`
    /// paying `pay_to`.
    X402Mcp {
        /// The server's identity, as the host knows it: the origin of its Streamable HTTP URL, or
        /// the origin configured for a stdio server — never the `serverInfo.name` it declares.
        server: String,
        /// The `payTo` its challenges must name.
        pay_to: String,
    },
    /// A ContextVM server (MCP over Nostr): its CEP-8 payment requests (a BOLT11 invoice for
    /// `bitcoin-lightning-bolt11`), paid over the wallet's rail for them. Pinned by the
    /// server's Nostr key: a request from another key is denied.
    Contextvm {
        /// The server's Nostr public key (64 hex characters).
        server: String,
    },
}

impl Object for Mandate {
    const KIND: &'static str = "mandate";
    const PREFIX: &'static str = "m_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.principal.key)
    }
    fn check(&self) -> Result<(), Error> {
        if self.exp <= self.nbf {
            return Err(Error::Malformed(
                "a mandate's exp must be after its nbf".into(),
            ));
        }
        let mut seen = Vec::new();
        for l in &self.limits {
            if seen.contains(&&l.asset) {
                return Err(Error::Malformed(format!(
                    "a mandate has two limit entries for {}",
                    l.asset
                )));
            }
            seen.push(&l.asset);
            for a in [
                l.per_call,
                l.total,
                l.per_receiver,
                l.confirm_above,
                l.tab_cap,
            ]
            .into_iter()
            .flatten()
            .chain(l.per_period.as_ref().map(|p| p.amount))
            {
                l.money(a)?;
            }
            if l.per_period.as_ref().is_some_and(|p| p.seconds == 0) {
                return Err(Error::Malformed("a mandate's period must be > 0 s".into()));
            }
        }
        for a in &self.allow {
            if let Allow::Receiver { id, origins, .. } = a {
                for o in origins {
                    if crate::origin::parse(o).ok().as_deref() != Some(o.as_str()) {
                        return Err(Error::Malformed(format!(
                            "the mandate's receiver {id} names origin {o:?}: write scheme://host[:port] in lower case, with no path or default port"
                        )));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Mandate {
    /// A mandate of `principal` for `wallet`, valid from `now` for `valid_for` seconds, with no
    /// limits and an empty allowlist (so it allows nothing yet): add [`Limits`] and [`Allow`]
    /// entries, then sign it with the principal's key.
    #[must_use]
    pub fn draft(principal: Party, wallet: PublicKey, now: u64, valid_for: u64) -> Self {
        Mandate {
            stipendex: Tag::current("mandate"),
            id: super::new_id("m_"),
            principal,
            wallet,
            iat: now,
            nbf: now,
            exp: now.saturating_add(valid_for),
            limits: Vec::new(),
            allow: Vec::new(),
            rails: None,
            description: None,
        }
    }

    /// The origins the allowlist pins `receiver` at (its id *and* key; an entry may pin none),
    /// or `None` if the receiver is not allowlisted.
    #[must_use]
    pub fn pinned(&self, receiver: &Party) -> Option<Vec<&String>> {
        let mut found = false;
        let mut origins = Vec::new();
        for a in &self.allow {
            if let Allow::Receiver {
                id,
                key,
                origins: o,
            } = a
                && id == &receiver.id
                && key == &receiver.key
            {
                found = true;
                origins.extend(o);
            }
        }
        found.then_some(origins)
    }

    /// The limits for `asset`, if the mandate allows spending it at all.
    #[must_use]
    pub fn limits_for(&self, asset: &Asset) -> Option<&Limits> {
        self.limits.iter().find(|l| &l.asset == asset)
    }
}
