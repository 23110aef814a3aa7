//! The dev-only wallet-and-mandate fixture of the Stipendex tests: one place that drafts a
//! mandate, fills its [`Limits`], allows receivers, signs it, and builds a [`Wallet`] with a
//! journal.
//!
//! This is a **test kit**: its helpers panic (with a message) where a test would fail
//! anyway — an amount that does not parse, a mandate that does not sign, a wallet that does
//! not build. It is never a dependency of a library or a product (`scripts/check-lean`).
//!
//! ```
//! use stipendex::Asset;
//! use stipendex::envelope::SecretKey;
//! use stipendex_test_kit as kit;
//!
//! let (principal, wallet_key, shop) =
//!     (SecretKey::generate(), SecretKey::generate(), SecretKey::generate());
//! // Valid from a minute ago for a day, "alice" its principal: 1.00 a call, 10.00 in all,
//! // receiver "shop" pinned at one origin.
//! let mandate = kit::mandate(&principal, wallet_key.public())
//!     .from(kit::now() - 60)
//!     .limits(kit::limits(Asset::usd(), "1.00", "10.00"))
//!     .allow(kit::receiver("shop", shop.public(), vec!["https://shop.example".into()]))
//!     .sign();
//! assert_eq!(mandate.object().principal.id, "alice");
//! assert_eq!(mandate.object().limits.len(), 1);
//!
//! let (wallet, _journal) = kit::journaled(stipendex::wallet::Wallet::builder(wallet_key, mandate));
//! # drop(wallet);
//! ```

use std::sync::Arc;

use stipendex::envelope::{Allow, Limits, Mandate, Party, PublicKey, SecretKey, Signed};
use stipendex::wallet::{Builder, MemoryJournal, Wallet};
use stipendex::{Amount, Asset};

/// How long a mandate of [`mandate`] is valid by default: a day, in seconds.
pub const DAY: u64 = 86_400;

/// Seconds since the Unix epoch, now (0 if the system clock is before the epoch).
#[must_use]
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A mandate of `principal` (its id `"alice"`) for the wallet key `wallet`, valid from
/// [`now`] for a [`DAY`], with no limits and nothing allowed yet: set them on the returned
/// [`MandateBuilder`], then [`sign`](MandateBuilder::sign) it (or
/// [`draft`](MandateBuilder::draft) it to sign it later).
pub fn mandate<'a>(principal: &SecretKey, wallet: PublicKey) -> MandateBuilder<'a> {
    MandateBuilder {
        principal: principal.clone(),
        principal_id: "alice".to_owned(),
        wallet,
        nbf: now(),
        valid_for: DAY,
        limits: Vec::new(),
        allow: Vec::new(),
        edits: Vec::new(),
    }
}

/// A mandate being built by [`mandate`]: drafted with [`Mandate::draft`] when it is
/// [`draft`](Self::draft)ed or [`sign`](Self::sign)ed.
#[must_use]
pub struct MandateBuilder<'a> {
    principal: SecretKey,
    principal_id: String,
    wallet: PublicKey,
    nbf: u64,
    valid_for: u64,
    limits: Vec<Limits>,
    allow: Vec<Allow>,
    edits: Vec<Edit<'a>>,
}

/// An edit of a drafted mandate ([`MandateBuilder::edit`]).
type Edit<'a> = Box<dyn FnOnce(&mut Mandate) + 'a>;

impl<'a> MandateBuilder<'a> {
    /// The principal's id in the mandate (default `"alice"`).
    pub fn id_of_principal(mut self, id: impl Into<String>) -> Self {
        self.principal_id = id.into();
        self
    }

    /// Valid (and issued) from `nbf`, seconds since the Unix epoch (default [`now`]).
    pub fn from(mut self, nbf: u64) -> Self {
        self.nbf = nbf;
        self
    }

    /// Valid for `secs` seconds from its start (default a [`DAY`]).
    pub fn valid_for(mut self, secs: u64) -> Self {
        self.valid_for = secs;
        self
    }

    /// Adds a [`Limits`] entry (after those added before).
    pub fn limits(mut self, limits: Limits) -> Self {
        self.limits.push(limits);
        self
    }

    /// Adds an allowlist entry (after those added before).
    pub fn allow(mut self, allow: Allow) -> Self {
        self.allow.push(allow);
        self
    }

    /// Adds allowlist entries, in order.
    pub fn allow_all(mut self, allow: impl IntoIterator<Item = Allow>) -> Self {
        self.allow.extend(allow);
        self
    }

    /// Edits the drafted mandate once its limits and allowlist are in, before it is signed
    /// (edits run in the order they were added).
    pub fn edit(mut self, edit: impl FnOnce(&mut Mandate) + 'a) -> Self {
        self.edits.push(Box::new(edit));
        self
    }

    /// The unsigned mandate: [`Mandate::draft`], then the limits, the allowlist entries and
    /// the edits.
    #[must_use]
    pub fn draft(self) -> Mandate {
        let mut m = Mandate::draft(
            Party {
                id: self.principal_id,
                key: self.principal.public(),
            },
            self.wallet,
            self.nbf,
            self.valid_for,
        );
        m.limits.extend(self.limits);
        m.allow.extend(self.allow);
        for edit in self.edits {
            edit(&mut m);
        }
        m
    }

    /// The mandate, signed by the principal.
    ///
    /// # Panics
    ///
    /// If it does not sign (it is not valid): a test helper.
    #[must_use]
    pub fn sign(self) -> Signed<Mandate> {
        let principal = self.principal.clone();
        sign(self.draft(), &principal)
    }
}

/// `mandate` signed by `principal`.
///
/// # Panics
///
/// If it does not sign (it is not valid, or `principal` is not its principal): a test helper.
#[must_use]
pub fn sign(mandate: Mandate, principal: &SecretKey) -> Signed<Mandate> {
    Signed::sign(mandate, principal).unwrap_or_else(|e| panic!("the mandate does not sign: {e}"))
}

/// An amount of a [`Limits`] entry, or none: `"5.00"`, an [`Amount`], or an `Option` of
/// either (`None`: no such limit).
pub trait IntoLimit {
    /// The amount, if any.
    ///
    /// # Panics
    ///
    /// If a string is not an amount: a test helper.
    fn into_limit(self) -> Option<Amount>;
}

impl IntoLimit for Amount {
    fn into_limit(self) -> Option<Amount> {
        Some(self)
    }
}

impl IntoLimit for &str {
    fn into_limit(self) -> Option<Amount> {
        Some(amount(self))
    }
}

impl<T: IntoLimit> IntoLimit for Option<T> {
    fn into_limit(self) -> Option<Amount> {
        self.and_then(IntoLimit::into_limit)
    }
}

/// `s` as an [`Amount`] (`"5.00"`).
///
/// # Panics
///
/// If `s` is not an amount: a test helper.
#[must_use]
pub fn amount(s: &str) -> Amount {
    s.parse()
        .unwrap_or_else(|e| panic!("{s:?} is not an amount: {e}"))
}

/// Limits in `asset`: `per_call` a payment and `total` in all (each an amount, or `None`),
/// every other limit absent. Set others with struct update syntax:
/// `Limits { confirm_above: Some(kit::amount("1.00")), ..kit::limits(asset, "5.00", "100.00") }`.
///
/// # Panics
///
/// If an amount given as a string does not parse: a test helper.
#[must_use]
pub fn limits(asset: Asset, per_call: impl IntoLimit, total: impl IntoLimit) -> Limits {
    Limits {
        asset,
        per_call: per_call.into_limit(),
        per_period: None,
        total: total.into_limit(),
        per_receiver: None,
        confirm_above: None,
        tab_cap: None,
        open_tabs: None,
    }
}

/// Allows the Stipendex receiver `id` of `key`, pinned at `origins` (none: anywhere).
#[must_use]
pub fn receiver(id: &str, key: PublicKey, origins: Vec<String>) -> Allow {
    Allow::Receiver {
        id: id.to_owned(),
        key,
        origins,
    }
}

/// Allows the ContextVM server `server` (its Nostr public key, hex).
#[must_use]
pub fn contextvm(server: &str) -> Allow {
    Allow::Contextvm {
        server: server.to_owned(),
    }
}

/// The wallet of `builder` with a fresh [`MemoryJournal`], and that journal.
///
/// # Panics
///
/// If the wallet does not build: a test helper.
#[must_use]
pub fn journaled(builder: Builder) -> (Wallet, Arc<MemoryJournal>) {
    let journal = Arc::new(MemoryJournal::default());
    let wallet = builder
        .journal(journal.clone())
        .build()
        .unwrap_or_else(|e| panic!("the wallet does not build: {e}"));
    (wallet, journal)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_drafts_what_it_was_given_in_order() {
        let (principal, wallet, receiver_key) = (
            SecretKey::generate(),
            SecretKey::generate(),
            SecretKey::generate(),
        );
        let m = mandate(&principal, wallet.public())
            .id_of_principal("principal")
            .from(1_000)
            .valid_for(60)
            .limits(limits(Asset::usd(), "1.00", None::<&str>))
            .allow(receiver("shop", receiver_key.public(), Vec::new()))
            .allow(contextvm("ab"))
            .edit(|m| m.description = Some("edited".into()))
            .draft();
        assert_eq!(m.principal.id, "principal");
        assert_eq!((m.iat, m.nbf, m.exp), (1_000, 1_000, 1_060));
        assert_eq!(
            m.limits,
            vec![Limits {
                per_call: Some(amount("1.00")),
                ..limits(Asset::usd(), None::<Amount>, None::<Amount>)
            }]
        );
        assert_eq!(m.allow.len(), 2);
        assert_eq!(m.description.as_deref(), Some("edited"));
    }

    #[test]
    fn a_signed_mandate_builds_a_journaled_wallet() {
        let (principal, wallet) = (SecretKey::generate(), SecretKey::generate());
        let signed = mandate(&principal, wallet.public())
            .limits(limits(Asset::usd(), "1.00", "10.00"))
            .sign();
        assert_eq!(signed.object().principal.key, principal.public());
        let (_wallet, _journal) = journaled(Wallet::builder(wallet, signed));
    }
}
