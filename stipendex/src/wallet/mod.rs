//! The agent wallet: the only point of payment decision (I1).
//!
//! The agent's one operation is [`Wallet::pay`]`(quote)`. The wallet checks, in order:
//! 1. **the receiver is allowlisted** in the mandate (id *and* pinned key; default deny). A
//!    denial is escalated to the human through the [`Confirmer`] and refused — never a soft
//!    pass (I4);
//! 2. **the mandate** is valid now and not revoked (a [`crate::envelope::Revocation`] in the
//!    wallet's store is honoured at once), and the Quote has not expired;
//! 3. **the limits**: per call, per period, total, per receiver, counted durably in the
//!    wallet's store (so they hold across restarts and under concurrent calls);
//! 4. **the human-in-the-loop threshold**: above `confirm_above`, and for every checkout, the
//!    [`Confirmer`] is asked and its answer recorded as a signed [`Confirmation`];
//! 5. **a rail** the Quote accepts (in the receiver's order), the mandate allows and the wallet
//!    has; it pays (service) or holds (checkout) and returns a signed [`Proof`].
//!
//! A Quote is paid once: paying it again returns the first Proof and charges nothing (I2).
//! Every object of a payment goes to the wallet's [`Journal`] (I5).
//!
//! **No payment without its chain.** Before the rail is asked, the payment is written to the
//! journal as [`Pending`] (its Quote, Confirmation, rail and operation id); a journal that
//! cannot take it pays nothing. A payment whose outcome is unknown, or that the rail holds for
//! review, stays pending and counted: [`Wallet::pending`] lists them, [`Wallet::resume`] asks
//! the rail again under the same operation id and signs the Proof once (paying the same Quote
//! again does the same), and the HTTP client resumes a pending payment for the request it
//! sends rather than paying a fresh Quote. The Proof is stored before its chain is journaled,
//! and a journal keeps one copy of an object, so a crash between the two journals the chain
//! once.

#[cfg(feature = "challenges")]
mod challenge;
mod confirm;
mod demand;
mod journal;
mod offer;
mod revocation;
mod spend;
mod tab;
mod unsigned;

use std::sync::Arc;

use rail_core::clock::rfc3339;
use rail_core::keys::{Begin, Claim, Idempotency, ReplayGuard, Write, fingerprint};
use rail_core::{
    Amount, KeyStore, MemoryKeyStore, OpId, PayerHandle, PaymentMode, RailError, SharedClock,
    SystemClock,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

#[cfg(feature = "challenges")]
pub use challenge::{ChallengePaid, Source};
#[cfg(feature = "mcp-client")]
pub(crate) use confirm::bounded;
pub use confirm::{
    Answer, Ask, Callback, Confirmer, DESCRIPTION_MAX, Denial, RECEIVER_MAX, Refuse, Terminal, Why,
    printable,
};
pub use demand::{Demand, Reply, Settlement, VoucherReply};
#[cfg(feature = "postgres")]
pub use journal::PgJournal;
#[cfg(feature = "sqlite")]
pub use journal::SqliteJournal;
pub use journal::{DirJournal, Journal, MemoryJournal, NoJournal, Pending, Then, chain_name};
pub use offer::OfferPaid;
pub use revocation::{Revocations, revoke};
pub use tab::{OpenTabs, TabHold, TabVoucher};
/// An x402 payment requirement as it came (the x402 client's, read by `read_402`).
#[cfg(feature = "challenges")]
pub use x402_transport::client::Required;

use crate::Error;
use crate::envelope::{
    Allow, Confirmation, Mandate, Profile, Proof, PublicKey, Quote, Receipt, Resource, SecretKey,
    Signed, Tag, new_id,
};

/// A payment the wallet made: the Proof to hand to the receiver, and the Confirmation if a
/// human confirmed.
#[derive(Clone, Debug)]
pub struct Paid {
    /// The Proof.
    pub proof: Signed<Proof>,
    /// The human's Confirmation, if one was needed.
    pub confirmation: Option<Signed<Confirmation>>,
    /// The wallet's rail (its name) that paid.
    pub rail: String,
    /// Whether this call paid (`false`: the Quote was paid before and this is its Proof again).
    pub fresh: bool,
}

/// What the wallet stores per paid Quote, so a repeat returns the same Proof.
#[derive(Serialize, Deserialize)]
struct PaidRecord {
    proof: String,
    confirmation: Option<String>,
    rail: String,
}

impl PaidRecord {
    /// The record of `proof`, confirmed by `confirmation`, paid over the wallet's `rail`.
    fn new(proof: &Signed<Proof>, confirmation: Option<&Signed<Confirmation>>, rail: &str) -> Self {
        PaidRecord {
            proof: proof.jws().to_owned(),
            confirmation: confirmation.map(|c| c.jws().to_owned()),
            rail: rail.to_owned(),
        }
    }
}

/// One of the wallet's rails: a name (the registry's) and its paying side.
#[derive(Clone)]
struct WalletRail {
    name: String,
    handle: PayerHandle,
}

/// The agent wallet. Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct Wallet(Arc<Inner>);

struct Inner {
    key: SecretKey,
    mandate: Signed<Mandate>,
    rails: Vec<WalletRail>,
    store: Arc<dyn KeyStore>,
    ops: Idempotency,
    revocations: Revocations,
    confirmer: Arc<dyn Confirmer>,
    journal: Arc<dyn Journal>,
    /// The journal's durable writes join the store's commits (one SQLite file): they make the
    /// store's deferred writes made before them durable.
    journal_in_store: bool,
    clock: SharedClock,
    min_quote_life: u64,
    #[cfg(feature = "challenges")]
    scheme_payers: Vec<Arc<dyn x402_transport::client::SchemePayer>>,
    /// The paid payments a call of this process is presenting now (chain → since when): an
    /// identical request waits for them rather than presenting the same Proof beside.
    presenting: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
}

/// How old a pending payment never marked unknown must be for the HTTP client to treat it as
/// abandoned (its process died mid-payment) and resume it rather than pay afresh.
pub const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(300);

/// How long a call waits for another call paying the same request before it gives up (it
/// never pays beside it): a payment's attempt lasts at most this long before its outcome is
/// unknown.
pub const WAIT_FOR_SAME_REQUEST: std::time::Duration = std::time::Duration::from_secs(90);

/// The chain of the Quote `paid` paid (`None` for a challenge's payment).
fn paid_chain(paid: &Paid) -> Option<String> {
    let q = Signed::<Quote>::parse(paid.proof.object().quote_jws.as_ref()?).ok()?;
    Some(chain_name(&q.object().receiver.id, &q.object().id))
}

/// How long a payment taken over from a process that ended waits for its rail operation to be
/// let go: the rail layer's lease (`rail_core::payer::Idempotent`, 6 s) and a margin.
const TAKEOVER_WAIT: std::time::Duration = std::time::Duration::from_secs(8);

/// The lease of a request's claim ([`Wallet::pay_sent`]), renewed while its payment is made:
/// a process that ended holding it delays an identical request this long at most.
const REQUEST_CLAIM_LEASE: std::time::Duration = std::time::Duration::from_secs(5);

/// The claim key of a request: its receiver, its request digest and the resource it was sent
/// to.
fn request_key(quote: &Signed<Quote>, sent: &Resource) -> String {
    let q = quote.object();
    let mut h = Sha256::new();
    for part in [
        q.receiver.id.as_str(),
        &q.receiver.key.to_string(),
        &serde_json::to_string(&q.request).unwrap_or_default(),
        &serde_json::to_string(sent).unwrap_or_default(),
    ] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    format!("r_{}", hex::encode(h.finalize()))
}

/// Lets a request's claim go (a failure only delays an identical request until it lapses).
async fn release(claim: rail_core::keys::Reservation) {
    if let Err(e) = claim.release().await {
        tracing::warn!(error = %e, "could not release a request's claim; it lapses by itself");
    }
}

/// How long a call of this process is taken to be presenting a paid payment's Proof, at most:
/// past it (the call gave up without saying so), an identical request uses that Proof.
const PRESENT_FOR: std::time::Duration = std::time::Duration::from_secs(120);

/// What [`Wallet::pay_sent`] found for the same request.
enum SameRequest {
    /// No payment journaled for it.
    None,
    /// One no call is making now: resume it (or present its Proof).
    Idle(Pending),
    /// One another live call is making now: wait for it.
    Busy(Pending),
}

/// The least time a Quote must have left for the wallet to pay it, by default: enough to pay
/// and present the Proof before the receiver sees the Quote expire.
pub const MIN_QUOTE_LIFE: std::time::Duration = std::time::Duration::from_secs(5);

impl std::fmt::Debug for Wallet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wallet")
            .field("key", &self.0.key.public())
            .field("mandate", &self.0.mandate.object().id)
            .field(
                "rails",
                &self.0.rails.iter().map(|r| &r.name).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Builds a [`Wallet`].
pub struct Builder {
    key: SecretKey,
    mandate: Signed<Mandate>,
    principal: Option<PublicKey>,
    rails: Vec<WalletRail>,
    store: Option<Arc<dyn KeyStore>>,
    confirmer: Arc<dyn Confirmer>,
    journal: Arc<dyn Journal>,
    clock: SharedClock,
    min_quote_life: std::time::Duration,
    #[cfg(feature = "challenges")]
    scheme_payers: Vec<Arc<dyn x402_transport::client::SchemePayer>>,
}

impl Builder {
    /// The least time a Quote must have left to be paid (default [`MIN_QUOTE_LIFE`]): a Quote
    /// closer to its expiry is refused as expired, before anything moves, rather than paid
    /// and then refused by the receiver.
    #[must_use]
    pub fn min_quote_life(mut self, life: std::time::Duration) -> Self {
        self.min_quote_life = life;
        self
    }

    /// Adds a payer of unsigned x402 challenges (an x402 `exact` EVM payer, an exact-algo
    /// payer), in order of preference (feature `challenges`).
    #[cfg(feature = "challenges")]
    #[must_use]
    pub fn scheme_payer(mut self, payer: Arc<dyn x402_transport::client::SchemePayer>) -> Self {
        self.scheme_payers.push(payer);
        self
    }

    /// Adds a rail the wallet may pay over (`name` as in the registry). Payers should be
    /// idempotent per operation id (the registry's are), so a payment retried after a crash
    /// is not paid twice.
    #[must_use]
    pub fn rail(mut self, name: impl Into<String>, payer: PayerHandle) -> Self {
        self.rails.push(WalletRail {
            name: name.into(),
            handle: payer,
        });
        self
    }

    /// Adds every configured payer of `registry`, in name order — and, with the feature
    /// `challenges`, the scheme payers of its x402-style rails (`x402`, `exact-algo`), so the
    /// wallet pays their unsigned challenges too.
    #[must_use]
    pub fn registry(mut self, registry: &crate::Registry) -> Self {
        for e in registry.rails() {
            if let Some(p) = &e.payer {
                self = self.rail(e.name.clone(), p.clone());
            }
            #[cfg(feature = "challenges")]
            if let Some(s) = &e.scheme_payer {
                self = self.scheme_payer(s.clone());
            }
        }
        self
    }

    /// The store of spend counters, paid Quotes and revocations (SQLite for one wallet,
    /// PostgreSQL for a fleet sharing one mandate). Default: memory (nothing survives a restart).
    #[must_use]
    pub fn store(mut self, store: Arc<dyn KeyStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Who confirms payments above the threshold and hears of denials. Default: [`Refuse`].
    #[must_use]
    pub fn confirmer(mut self, confirmer: Arc<dyn Confirmer>) -> Self {
        self.confirmer = confirmer;
        self
    }

    /// Where the audit chains go. Default: [`NoJournal`].
    #[must_use]
    pub fn journal(mut self, journal: Arc<dyn Journal>) -> Self {
        self.journal = journal;
        self
    }

    /// The clock (tests). Default: the system clock.
    #[must_use]
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Refuses a mandate not signed by `principal` (the trust anchor).
    #[must_use]
    pub fn principal(mut self, principal: PublicKey) -> Self {
        self.principal = Some(principal);
        self
    }

    /// The wallet.
    ///
    /// # Errors
    /// [`Error::Untrusted`] if the mandate names another wallet key, or is not signed by the
    /// pinned principal.
    pub fn build(self) -> Result<Wallet, Error> {
        let m = self.mandate.object();
        if m.wallet != self.key.public() {
            return Err(Error::Untrusted(format!(
                "mandate {} is for wallet key {}, not this wallet's {}",
                m.id,
                m.wallet,
                self.key.public()
            )));
        }
        if let Some(p) = self.principal
            && p != m.principal.key
        {
            return Err(Error::Untrusted(format!(
                "mandate {} is signed by {}, not the trusted principal {p}",
                m.id, m.principal.key
            )));
        }
        let store = self
            .store
            .unwrap_or_else(|| Arc::new(MemoryKeyStore::with_clock(self.clock.clone())));
        let journal_in_store = matches!(
            (self.journal.file(), store.file()),
            (Some(j), Some(s)) if j == s
        );
        Ok(Wallet(Arc::new(Inner {
            journal_in_store,
            ops: Idempotency::new(store.clone(), ops_ns(&self.mandate)),
            revocations: Revocations::new(store.clone()),
            key: self.key,
            mandate: self.mandate,
            rails: self.rails,
            store,
            confirmer: self.confirmer,
            journal: self.journal,
            clock: self.clock,
            min_quote_life: self.min_quote_life.as_secs(),
            #[cfg(feature = "challenges")]
            scheme_payers: self.scheme_payers,
            presenting: std::sync::Mutex::default(),
        })))
    }
}

/// The namespace of the wallet's operations (paid Quotes and tabs) under `mandate`.
fn ops_ns(mandate: &Signed<Mandate>) -> String {
    format!("stipendex/{}/paid", mandate.object().id)
}

/// What claiming a Quote's operation found.
enum Started {
    /// Paid before: its Proof.
    Done(Box<Paid>),
    /// The right to pay it (or to finish its pending payment).
    Lease(rail_core::keys::Lease),
}

/// One paid call's records in the wallet's store: its operation's claim and result, and its
/// limits' counts, through a deferred handle where the store has one
/// ([`KeyStore::deferred`]). None of them moves money or leaves the wallet by itself: they are
/// made durable before the rail is asked ([`CallRecords::sync`], at no cost when the pending
/// payment's journal record in the same store already covered them) and before a Proof is
/// returned. A store without deferred writes makes each durable as it is answered.
struct CallRecords {
    store: Arc<dyn KeyStore>,
    ops: Idempotency,
    /// The journal's durable writes join the store's commits (one SQLite file).
    journal_in_store: bool,
}

impl CallRecords {
    /// Makes this call's records durable before an effect outside the wallet (the rail asked,
    /// a Proof or voucher returned).
    async fn sync(&self) -> Result<(), Error> {
        self.store
            .sync()
            .await
            .map_err(|e| Error::Storage(format!("cannot make the payment's records durable: {e}")))
    }

    /// Makes this call's records durable before the journal records what depends on them (a
    /// chain ended, a voucher): nothing to do when the journal shares the store's file, whose
    /// next durable write covers them; else [`CallRecords::sync`]. A journal ahead of the store
    /// would, after a power loss, say "done" over records the store forgot.
    async fn sync_for_journal(&self) -> Result<(), Error> {
        if self.journal_in_store {
            Ok(())
        } else {
            self.sync().await
        }
    }
}

/// What a fresh payment needs, found before anything is counted ([`Wallet::prepare`]).
struct Fresh<'a> {
    /// The most the Quote can cost.
    max: rail_core::Money,
    /// The mandate's limits in its asset.
    limits: &'a crate::envelope::Limits,
    /// The rail chosen, and its offer in the Quote.
    rail: &'a WalletRail,
    offer: &'a rail_core::Offer,
    /// The limits' durable counters.
    budgets: spend::Budgets,
}

/// A fresh payment's needs ([`Wallet::prepare`]) and its count made beside the operation's
/// claim; or why the Quote cannot be paid afresh.
type Counting<'a> = Result<(Fresh<'a>, Result<spend::Counted, Error>), Error>;

/// Gives back a count made beside a claim that found the Quote paid or pending already (or
/// failed): that payment was counted by its first attempt.
async fn give_back(counting: Counting<'_>) {
    if let Ok((_, Ok(c))) = counting {
        c.release().await;
    }
}

/// Counts `max` for `op`, waiting out (briefly) another call of the same Quote that counted it
/// beside a claim it lost and is giving it back.
async fn reserve_settled(
    budgets: &spend::Budgets,
    op: &OpId,
    receiver: &str,
    max: &rail_core::Money,
) -> Result<spend::Counted, Error> {
    let mut tries = 0;
    loop {
        match budgets.reserve(op, receiver, max).await {
            Err(Error::Payment(RailError::InProgress { .. })) if tries < 50 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
            }
            out => return out,
        }
    }
}

/// Pays (service) or holds (checkout) `offer` over `rail` under `op`.
async fn ask_rail(
    rail: &WalletRail,
    op: &OpId,
    offer: &rail_core::Offer,
    profile: Profile,
) -> Result<rail_core::Payment, RailError> {
    match profile {
        Profile::Service => rail.handle.payer.pay(op, offer).await,
        Profile::Checkout => match &rail.handle.hold_payer {
            Some(h) => h.hold(op, offer).await,
            None => Err(RailError::InvalidInput("the rail cannot hold".into())),
        },
    }
}

fn now_secs(clock: &SharedClock) -> u64 {
    u64::try_from(clock.now().unix_seconds()).unwrap_or(0)
}

/// The wallet's operation id for a Quote: one per (receiver, quote id), whatever the caller.
fn op_for(receiver: &str, quote_id: &str) -> Result<OpId, Error> {
    let h = Sha256::digest(format!("{receiver}\n{quote_id}").as_bytes());
    OpId::new(format!(
        "stx-{}",
        hex::encode(h.get(..16).unwrap_or_default())
    ))
    .map_err(Error::Payment)
}

/// Step 1 of a payment: whether the mandate lets the wallet pay `q` (for the request `sent`,
/// over HTTP); the reason otherwise.
fn admit(mandate: &Mandate, q: &Quote, sent: Option<&Resource>) -> Result<(), String> {
    let entries: Vec<&Vec<String>> = mandate
        .allow
        .iter()
        .filter_map(|a| match a {
            Allow::Receiver { id, key, origins }
                if id == &q.receiver.id && key == &q.receiver.key =>
            {
                Some(origins)
            }
            _ => None,
        })
        .collect();
    if entries.is_empty() {
        let known_id = mandate
            .allow
            .iter()
            .any(|a| matches!(a, Allow::Receiver { id, .. } if id == &q.receiver.id));
        return Err(if known_id {
            format!(
                "receiver {} signed with key {}, not the key the mandate pins",
                q.receiver.id, q.receiver.key
            )
        } else {
            format!(
                "receiver {} is not in mandate {}'s allowlist",
                q.receiver.id, mandate.id
            )
        });
    }
    let Some(sent) = sent else {
        return Ok(());
    };
    let origins: Vec<&String> = entries.into_iter().flatten().collect();
    if origins.is_empty() {
        return Err(format!(
            "mandate {}'s entry for receiver {} names no origin, so it is not payable over HTTP: pin the origins it is reached at (`stipendex mandate new --allow-receiver {}=KEY --origin {}=https://HOST`)",
            mandate.id, q.receiver.id, q.receiver.id, q.receiver.id
        ));
    }
    if !origins.iter().any(|o| **o == sent.origin) {
        return Err(format!(
            "receiver {} is not allowlisted at {}: mandate {} pins it at {}",
            q.receiver.id,
            sent.origin,
            mandate.id,
            origins
                .iter()
                .map(|o| o.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    match &q.resource {
        None => Err(format!(
            "quote {} of {} names no resource: over HTTP this wallet pays only a quote issued for the request it sent",
            q.id, q.receiver.id
        )),
        // The same receiver reached at an origin it does not know it is reached at (behind a
        // proxy, on a local port): it names its configured origin. Said as the fix it needs.
        Some(r) if r.origin != sent.origin => Err(format!(
            "quote {} of {} names origin {}, but the request went to {}: if {} is this receiver, add \"{}\" to [receiver] origins",
            q.id, q.receiver.id, r.origin, sent.origin, sent.origin, sent.origin
        )),
        Some(r) if r != sent => Err(format!(
            "quote {} was issued for {}, not for {}, the request sent: a quote relayed from another request is not paid",
            q.id,
            describe(r),
            describe(sent)
        )),
        Some(_) => Ok(()),
    }
}

/// `GET https://host/path?query`.
fn describe(r: &Resource) -> String {
    match &r.query {
        Some(q) => format!("{} {}{}?{q}", r.method, r.origin, r.path),
        None => format!("{} {}{}", r.method, r.origin, r.path),
    }
}

// The steps every way to pay shares (a Quote, a tab, an x402 challenge, a ContextVM offer),
// each written once.

/// Step 1's refusal: the denial escalated to `confirmer` (who asked to be paid, what for, how
/// much, and `why`), and the error it is.
async fn deny(
    confirmer: &dyn Confirmer,
    receiver: String,
    description: Option<String>,
    amount: Option<rail_core::Money>,
    why: String,
) -> Error {
    let denial = Denial {
        receiver,
        description,
        amount,
        why,
    };
    confirmer.escalate(&denial).await;
    Error::Denied(denial.why)
}

/// Whether `mandate` lets the wallet pay over the rail of kind `rail` (no `rails`: any).
fn rail_allowed(mandate: &Mandate, rail: &str) -> bool {
    mandate
        .rails
        .as_ref()
        .is_none_or(|allowed| allowed.iter().any(|r| r == rail))
}

/// `mandate`'s limits in `asset`; none is a refusal.
fn limits_in<'a>(
    mandate: &'a Mandate,
    asset: &rail_core::Asset,
) -> Result<&'a crate::envelope::Limits, Error> {
    mandate.limits_for(asset).ok_or_else(|| {
        Error::LimitExceeded(format!(
            "mandate {} allows no spending in {}",
            mandate.id, asset
        ))
    })
}

/// Whether paying `amount` under `limits` needs the human's Confirmation.
fn above_threshold(limits: &crate::envelope::Limits, amount: &rail_core::Money) -> bool {
    limits.confirm_above.is_some_and(|t| amount.amount() > t)
}

/// Whether a payment that failed with `e` may have happened: its outcome is unknown, so its
/// operation is handed over (and its count kept) rather than abandoned.
fn outcome_unknown(e: &Error) -> bool {
    matches!(e, Error::Payment(r) if r.is_retryable()) || matches!(e, Error::Storage(_))
}

/// What a Proof pays for.
enum PaidFor<'a> {
    /// A signed Quote.
    Quote(&'a Signed<Quote>),
    /// A tab's cap, held.
    Tab(&'a Signed<crate::envelope::Tab>),
    /// An unsigned challenge, as the wallet saw it.
    Challenge(crate::envelope::Challenge),
}

impl Wallet {
    /// The wallet's clock, in Unix seconds.
    #[must_use]
    pub fn now(&self) -> u64 {
        now_secs(&self.0.clock)
    }

    /// A builder: the wallet's key and the mandate it spends under.
    #[must_use]
    pub fn builder(key: SecretKey, mandate: Signed<Mandate>) -> Builder {
        Builder {
            key,
            mandate,
            principal: None,
            rails: Vec::new(),
            store: None,
            confirmer: Arc::new(Refuse),
            journal: Arc::new(NoJournal::default()),
            clock: Arc::new(SystemClock),
            min_quote_life: MIN_QUOTE_LIFE,
            #[cfg(feature = "challenges")]
            scheme_payers: Vec::new(),
        }
    }

    /// The mandate.
    #[must_use]
    pub fn mandate(&self) -> &Signed<Mandate> {
        &self.0.mandate
    }

    /// The wallet's public key.
    #[must_use]
    pub fn key(&self) -> PublicKey {
        self.0.key.public()
    }

    /// The confirmer the wallet asks when a call names none ([`Wallet::pay_with`]).
    #[must_use]
    pub fn confirmer(&self) -> &dyn Confirmer {
        self.0.confirmer.as_ref()
    }

    /// The store (spend counters, paid Quotes, revocations).
    #[must_use]
    pub fn store(&self) -> &Arc<dyn KeyStore> {
        &self.0.store
    }

    /// Checks that the wallet's spend records (its store) and its audit journal belong
    /// together before it pays anything: a store that has never seen the mandate while the
    /// journal holds its chains (the limits would start from zero — a store opened elsewhere,
    /// or emptied), or a journal without its chains while the store counted its payments (the
    /// journal moved or emptied), is refused. Otherwise both are marked with the mandate. A
    /// journal that keeps nothing across processes is not compared. What `stipendex` runs at
    /// start.
    ///
    /// # Errors
    /// [`Error::RecordsApart`] naming which is missing; [`Error::Storage`].
    pub async fn check_records(&self) -> Result<(), Error> {
        let me = &self.0;
        let id = &me.mandate.object().id;
        let ns = format!("stipendex/{id}/records");
        let stored = me
            .store
            .get(&ns, "mandate")
            .await
            .map_err(|e| Error::Storage(e.to_string()))?
            .is_some();
        let journaled = me.journal.has_mandate(&me.mandate).await?;
        match (stored, journaled) {
            (false, Some(true)) => Err(Error::RecordsApart(format!(
                "the wallet's store has no record of mandate {id}, whose payments are in its journal: its limits would be counted again from zero; point [store] at the store those payments were counted in"
            ))),
            (true, Some(false)) => Err(Error::RecordsApart(format!(
                "the wallet's journal has no chain of mandate {id}, whose payments its store counted: the journal was moved or emptied; point [wallet] journal at it"
            ))),
            _ => {
                if !stored {
                    let mut w = Write::finished(rand::random(), "mandate", None);
                    w.value = Some(me.mandate.digest().as_str().to_owned());
                    me.store
                        .insert_if_absent(&ns, "mandate", &w)
                        .await
                        .map_err(|e| Error::Storage(e.to_string()))?;
                }
                if journaled == Some(false) {
                    me.journal.mark_mandate(&me.mandate).await?;
                }
                Ok(())
            }
        }
    }

    /// Pays `quote` under the mandate, or refuses with a typed error that changed nothing.
    ///
    /// # Errors
    /// [`Error::Denied`] (not allowlisted; escalated), [`Error::Revoked`],
    /// [`Error::Expired`] (mandate or Quote), [`Error::LimitExceeded`],
    /// [`Error::NotConfirmed`], [`Error::NoRail`], [`Error::Payment`] (the rail refused;
    /// nothing counted unless the outcome is unknown), [`Error::QuoteUsed`] (another Quote
    /// with the same id from the same receiver was paid), [`Error::Storage`].
    pub async fn pay(&self, quote: &Signed<Quote>) -> Result<Paid, Error> {
        self.pay_at(quote, None, self.0.confirmer.as_ref()).await
    }

    /// As [`Wallet::pay`], with `confirmer` — not the wallet's own — asked to confirm this
    /// payment and told of its denial: a host asks the user of *this* call through the call's
    /// own channel (MCP elicitation). The answer is signed as the Confirmation all the same.
    ///
    /// # Errors
    /// As [`Wallet::pay`].
    pub async fn pay_with(
        &self,
        quote: &Signed<Quote>,
        confirmer: &dyn Confirmer,
    ) -> Result<Paid, Error> {
        self.pay_at(quote, None, confirmer).await
    }

    /// [`Wallet::pay_for`] with `confirmer` for this payment (see [`Wallet::pay_with`]).
    ///
    /// # Errors
    /// As [`Wallet::pay`].
    pub async fn pay_for_with(
        &self,
        quote: &Signed<Quote>,
        sent: &Resource,
        confirmer: &dyn Confirmer,
    ) -> Result<Paid, Error> {
        self.pay_at(quote, Some(sent), confirmer).await
    }

    /// Pays `quote`, which came back for the request `sent` (the HTTP client's request: where
    /// it went, its method, path and query), under the mandate: as [`Wallet::pay`], and first
    /// the origin binding — the mandate's entry for the receiver pins `sent.origin`, and the
    /// Quote names exactly `sent` as its resource. A Quote relayed from another request or
    /// origin, a Quote naming no resource, and a receiver entry without origins are denied
    /// (and escalated).
    ///
    /// # Errors
    /// As [`Wallet::pay`].
    pub async fn pay_for(&self, quote: &Signed<Quote>, sent: &Resource) -> Result<Paid, Error> {
        self.pay_at(quote, Some(sent), self.0.confirmer.as_ref())
            .await
    }

    /// What a transport's client calls with the Quote its request `sent` got back: the pending
    /// payment for this same request, if one is left (its outcome unknown, or held for review:
    /// [`Wallet::pending_for`]), is finished and its Proof presented — a fresh Quote for a
    /// request already paid is never paid again; otherwise `quote` is paid
    /// ([`Wallet::pay_for_with`]). A pending payment another call is making now (`in_progress`)
    /// or that just finished (`not_pending`) is that call's: this request pays its own Quote.
    ///
    /// # Errors
    /// As [`Wallet::pay`] and [`Wallet::resume`].
    ///
    /// Paid before for this request and not answered yet (its answer lost: `stipendex wallet
    /// resume`, or a call that stopped), that payment's Proof is returned, to be presented
    /// again. A payment for this request that another call is making now is waited for (at
    /// most [`WAIT_FOR_SAME_REQUEST`]) and then used — never paid beside; one left by a process
    /// that has ended is taken over at once.
    pub async fn pay_sent(
        &self,
        quote: &Signed<Quote>,
        sent: &Resource,
        confirmer: &dyn Confirmer,
    ) -> Result<Paid, Error> {
        let deadline = tokio::time::Instant::now() + WAIT_FOR_SAME_REQUEST;
        let busy = |what: &str| {
            Error::Payment(RailError::InProgress {
                op_id: format!(
                    "{what}: another call is paying this same request; ask again when it has finished"
                ),
            })
        };
        // The request's claim, held from the look for an earlier payment until this call's own
        // payment is journaled: two identical calls (in this process or another sharing the
        // store) never both find nothing and both pay.
        let key = request_key(quote, sent);
        // On a deferred handle: the claim keeps live calls apart; after a power loss none is
        // live, and the journal's pending record (durable before the rail is asked) decides.
        let claims = ReplayGuard::new(
            rail_core::keys::deferred(&self.0.store),
            format!("stipendex/{}/requests", self.0.mandate.object().id),
        );
        let holder = self.0.journal.holder();
        loop {
            let waited = || async {
                if tokio::time::Instant::now() >= deadline {
                    return Err(busy(&key));
                }
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                Ok(())
            };
            // The claim names this process (its journal's holder): one held by a call whose
            // process has ended (its holder lock is free) is taken over at once, as its
            // payment is — judged on the record the takeover replaces, in one claim.
            let claimed = match &holder {
                Some(me) => {
                    let journal = &self.0.journal;
                    let gone = |h: &str| !journal.holder_alive(h);
                    claims
                        .claim_named(&key, REQUEST_CLAIM_LEASE, me, &gone)
                        .await
                }
                None => claims.claim(&key, REQUEST_CLAIM_LEASE).await,
            }
            .map_err(Error::Payment)?;
            let claim = match claimed {
                Claim::Fresh(r) | Claim::Recover { reservation: r, .. } => r,
                Claim::Busy { .. } => {
                    waited().await?;
                    continue;
                }
                Claim::Finished(_) | Claim::Conflict(_) => {
                    return Err(Error::Storage(format!(
                        "request claim {key} is in an unexpected state"
                    )));
                }
            };
            let found = self.same_request(quote, sent).await;
            match found {
                Ok(SameRequest::None) => {
                    let paid = claim
                        .keep_alive(Box::pin(self.pay_at(quote, Some(sent), confirmer)))
                        .await;
                    // The payment is journaled (pending with its Proof, presented by this
                    // call) or refused: the claim has done its work. With a journal that names
                    // this process, let it go beside the request rather than before it (a
                    // commit less to wait for): lost with the process, it is taken over at once
                    // by the next. Without, a lost release would hold an identical request of
                    // another process for the claim's lease: awaited.
                    if holder.is_some() {
                        tokio::spawn(release(claim));
                    } else {
                        release(claim).await;
                    }
                    return paid;
                }
                Ok(SameRequest::Idle(p)) => {
                    release(claim).await;
                    match Box::pin(self.resume(&p.chain)).await {
                        Ok(paid) => {
                            self.set_presenting(&p.chain, true);
                            return Ok(paid);
                        }
                        // The payment's rail operation is still held (by a call of a process
                        // that ended, until its short lease lapses, or by a live one): waited
                        // for, never paid beside.
                        Err(e) if e.code() == "in_progress" => waited().await?,
                        // Finished meanwhile by the call that made it: this request is new.
                        Err(e) if e.code() == "not_pending" => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(SameRequest::Busy(p)) => {
                    release(claim).await;
                    if tokio::time::Instant::now() >= deadline {
                        return Err(busy(&p.chain));
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => {
                    release(claim).await;
                    return Err(e);
                }
            }
        }
    }

    /// The payment for the same request as `quote` (same receiver, resource `sent`, request
    /// digest), if one is journaled: idle (its outcome unknown, paid and not answered, or left
    /// by a process that has ended) or being made now by a live call.
    async fn same_request(
        &self,
        quote: &Signed<Quote>,
        sent: &Resource,
    ) -> Result<SameRequest, Error> {
        let q = quote.object();
        let now = now_secs(&self.0.clock);
        for p in self
            .0
            .journal
            .pending_for_request(sent, q.request.as_ref())
            .await?
        {
            // This wallet's own record of a Quote it verified before paying it: read without
            // checking its signature again (decision 0042), since every paid request looks
            // through the payments pending for its request (identical requests in flight
            // would otherwise cost one verification each). `resume` verifies the one it takes:
            // a record whose signature was altered on disk is matched here and refused there
            // (`bad_signature`), never passed by and paid beside.
            let Ok(old) = Signed::<Quote>::reread_vouched(&p.quote) else {
                continue;
            };
            let o = old.object();
            if o.receiver != q.receiver || o.request != q.request || o.resource != q.resource {
                continue;
            }
            // A Proof past the grace a receiver honours it for is no use: forgotten — once its
            // Quote's signature checks, so a record altered on disk (its `exp` moved back) is
            // not what ends a paid payment's record.
            if p.proof.is_some()
                && now >= o.exp.saturating_add(rail_core::LATE_PROOF_GRACE.as_secs())
            {
                if Signed::<Quote>::parse(&p.quote).is_ok() {
                    self.0.journal.end(&p.chain).await?;
                }
                continue;
            }
            let gone = p
                .holder
                .as_deref()
                .is_some_and(|h| !self.0.journal.holder_alive(h));
            let idle = match &p.proof {
                // Paid: idle unless a call of this process is presenting it now.
                Some(_) => !self.is_presenting(&p.chain),
                None => {
                    p.unknown || gone || now.saturating_sub(p.since) > ABANDONED_AFTER.as_secs()
                }
            };
            return Ok(if idle {
                SameRequest::Idle(p)
            } else {
                SameRequest::Busy(p)
            });
        }
        Ok(SameRequest::None)
    }

    async fn pay_at(
        &self,
        quote: &Signed<Quote>,
        sent: Option<&Resource>,
        confirmer: &dyn Confirmer,
    ) -> Result<Paid, Error> {
        let q = quote.object();
        let me = &self.0;
        let mandate = me.mandate.object();
        let now = now_secs(&me.clock);

        // 1. The allowlist (I4): id and pinned key, and over HTTP the origin and the request;
        //    anything else is denied and escalated.
        if let Err(why) = admit(mandate, q, sent) {
            let (receiver, description) = (q.receiver.id.clone(), q.description.clone());
            return Err(deny(confirmer, receiver, description, Some(q.max()?), why).await);
        }

        // 2. The mandate's validity and revocation.
        self.check_mandate(now).await?;

        // A Quote already paid: its Proof again, nothing charged (I2). A Quote whose payment
        // is pending (its outcome unknown, or held for review): the rail is asked again.
        let op = op_for(&q.receiver.id, &q.id)?;
        let chain = chain_name(&q.receiver.id, &q.id);
        let rec = self.call_records();
        // The limits are counted beside the operation's claim, so the two records share a
        // commit of the store: a Quote that turns out to be paid or pending already gives its
        // count back (its payment was counted by its first attempt).
        let (started, counting): (_, Counting<'_>) = match self.prepare(&rec, q, now) {
            Ok(f) => {
                let (s, c) = tokio::join!(
                    self.begin(&rec, quote, &op),
                    f.budgets.reserve(&op, &q.receiver.id, &f.max)
                );
                (s, Ok((f, c)))
            }
            Err(e) => (self.begin(&rec, quote, &op).await, Err(e)),
        };
        let lease = match started {
            Ok(Started::Lease(l)) => l,
            Ok(Started::Done(paid)) => {
                give_back(counting).await;
                return Ok(*paid);
            }
            Err(e) => {
                give_back(counting).await;
                return Err(e);
            }
        };
        let pending = match me.journal.pending_of(&chain).await {
            Ok(p) => p,
            Err(e) => {
                give_back(counting).await;
                rec.ops.hand_over(lease).await.ok();
                return Err(e);
            }
        };
        let out = lease
            .keep_alive(Box::pin(async {
                match &pending {
                    Some(p) => {
                        give_back(counting).await;
                        self.settle(&rec, quote, p).await.map(|paid| (paid, None))
                    }
                    None => {
                        self.pay_fresh(&rec, quote, &op, now, sent, confirmer, counting)
                            .await
                    }
                }
            }))
            .await;
        self.conclude(&rec, quote, lease, out).await
    }

    /// The payments this wallet started and has not finished (outcome unknown, or held for
    /// review at the rail), oldest first: counted against the limits, without a Proof yet.
    /// [`Wallet::resume`] finishes one.
    ///
    /// # Errors
    /// [`Error::Storage`] (the journal).
    pub async fn pending(&self) -> Result<Vec<Pending>, Error> {
        Ok(self
            .0
            .journal
            .pending()
            .await?
            .into_iter()
            .filter(|p| p.proof.is_none())
            .collect())
    }

    /// The payments made for a request whose answer has not come back (their Proof signed,
    /// kept with it): the same request asked again presents that Proof rather than paying.
    ///
    /// # Errors
    /// [`Error::Storage`] (the journal).
    pub async fn unanswered(&self) -> Result<Vec<Pending>, Error> {
        Ok(self
            .0
            .journal
            .pending()
            .await?
            .into_iter()
            .filter(|p| p.proof.is_some())
            .collect())
    }

    /// The pending payment of a Quote for the same request as `quote` (same receiver, same
    /// resource `sent`, same request digest) that no call is paying now (its outcome unknown,
    /// or abandoned for [`ABANDONED_AFTER`]): the HTTP client resumes it rather than paying
    /// `quote`, a fresh Quote for a request already paid.
    ///
    /// # Errors
    /// [`Error::Storage`] (the journal).
    pub async fn pending_for(
        &self,
        quote: &Signed<Quote>,
        sent: &Resource,
    ) -> Result<Option<Pending>, Error> {
        Ok(match self.same_request(quote, sent).await? {
            SameRequest::Idle(p) => Some(p),
            SameRequest::Busy(_) | SameRequest::None => None,
        })
    }

    /// Finishes the pending payment of chain `chain` (from [`Wallet::pending`]): asks its rail
    /// again under the same operation id — the rail answers the payment made, the review's
    /// decision, or a refusal of an offer expired before any payment — then signs its Proof
    /// once and journals the chain. Nothing is paid twice: a payment resumed again returns its
    /// first Proof. A declined payment is given back to the limits.
    ///
    /// # Errors
    /// [`Error::NotPending`]; [`Error::Payment`] (still pending: try later; or refused);
    /// [`Error::NoRail`] (the rail it was paid over is no longer configured);
    /// [`Error::Storage`].
    pub async fn resume(&self, chain: &str) -> Result<Paid, Error> {
        let me = &self.0;
        let Some(p) = me.journal.pending_of(chain).await? else {
            return Err(Error::NotPending(chain.to_owned()));
        };
        let quote = Signed::<Quote>::parse(&p.quote)?;
        let op = OpId::new(p.op.clone()).map_err(Error::Payment)?;
        // A payment whose process has ended is taken over at once, not after its lease.
        let gone = p
            .holder
            .as_deref()
            .is_some_and(|h| !me.journal.holder_alive(h));
        let rec = self.call_records();
        let lease = match self.begin_over(&rec, &quote, &op, gone).await? {
            Started::Done(paid) => return Ok(*paid),
            Started::Lease(l) => l,
        };
        // Taken over from a process that ended: its rail operation may still be held for the
        // rail layer's short lease (renewed only while a process lives), so "in progress" is
        // waited out for that long, not reported as another call's.
        let settle = async {
            let until = tokio::time::Instant::now() + TAKEOVER_WAIT;
            loop {
                match Box::pin(self.settle(&rec, &quote, &p)).await {
                    Err(Error::Payment(RailError::InProgress { .. }))
                        if gone && tokio::time::Instant::now() < until =>
                    {
                        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                    }
                    other => return other,
                }
            }
        };
        let out = lease
            .keep_alive(Box::pin(settle))
            .await
            .map(|paid| (paid, None));
        self.conclude(&rec, &quote, lease, out).await
    }

    /// This call's records ([`CallRecords`]): on a deferred handle of the wallet's store where
    /// it has one.
    fn call_records(&self) -> CallRecords {
        let me = &self.0;
        let store = rail_core::keys::deferred(&me.store);
        CallRecords {
            ops: Idempotency::new(store.clone(), ops_ns(&me.mandate)),
            store,
            journal_in_store: me.journal_in_store,
        }
    }

    /// Claims `op` for `quote`: its first Proof if it was paid (the chain finished if a crash
    /// left it pending), or the lease to pay it.
    async fn begin(
        &self,
        rec: &CallRecords,
        quote: &Signed<Quote>,
        op: &OpId,
    ) -> Result<Started, Error> {
        self.begin_over(rec, quote, op, false).await
    }

    /// As [`Wallet::begin`]; with `holder_gone`, an attempt whose process has ended is taken
    /// over before its lease lapses.
    async fn begin_over(
        &self,
        rec: &CallRecords,
        quote: &Signed<Quote>,
        op: &OpId,
        holder_gone: bool,
    ) -> Result<Started, Error> {
        let me = &self.0;
        let fp = fingerprint(quote.digest().as_str()).map_err(Error::Payment)?;
        match rec.ops.begin_over::<PaidRecord>(op, &fp, holder_gone).await {
            Ok(Begin::Replay(record)) => {
                // Paid by another call, which may not have made its records durable yet: this
                // call's claim attempt committed after them, so its sync covers them.
                rec.sync().await?;
                let paid = self.replayed(record)?;
                let chain = chain_name(&quote.object().receiver.id, &quote.object().id);
                // Stored, but a crash may have come before its chain was journaled.
                if matches!(me.journal.pending_of(&chain).await, Ok(Some(_))) {
                    self.close_chain(quote, &paid).await;
                }
                Ok(Started::Done(Box::new(paid)))
            }
            Ok(Begin::Fresh(l) | Begin::Recover(l)) => Ok(Started::Lease(l)),
            Err(RailError::IdempotencyConflict { .. }) => {
                Err(Error::QuoteUsed(quote.object().id.clone()))
            }
            Err(RailError::Storage(s)) => Err(Error::Storage(s)),
            Err(e) => Err(Error::Payment(e)),
        }
    }

    /// Ends a payment's lease: a Proof is stored (beside its count kept, in one commit of the
    /// store), then its chain journaled and the payment no longer pending; a certain refusal
    /// ends the pending payment; an unknown outcome leaves it pending (and counted) for
    /// [`Wallet::resume`].
    async fn conclude(
        &self,
        rec: &CallRecords,
        quote: &Signed<Quote>,
        lease: rail_core::keys::Lease,
        out: Result<(Paid, Option<spend::Counted>), Error>,
    ) -> Result<Paid, Error> {
        let me = &self.0;
        let q = quote.object();
        match out {
            Ok((paid, counted)) => {
                let record = PaidRecord::new(&paid.proof, paid.confirmation.as_ref(), &paid.rail);
                // The count kept and the Proof stored are independent records (a count whose
                // keeping is lost lapses into being counted again: over, never under), so
                // they share a commit. Stored first, journaled after: a crash between the two
                // finds the Proof stored and journals the same chain once.
                let keep = async {
                    if let Some(c) = counted {
                        c.keep().await;
                    }
                };
                let ((), stored) = tokio::join!(keep, rec.ops.finish(lease, &record));
                // The Proof's record is durable before the journal says the payment is done.
                let stored = match stored {
                    Ok(()) => rec.sync_for_journal().await,
                    Err(e) => Err(Error::Storage(e.to_string())),
                };
                match stored {
                    Ok(()) => self.close_chain(quote, &paid).await,
                    Err(e) => {
                        tracing::error!(quote = %q.id, error = %e, "paid, but the Proof could not be stored; the payment stays pending");
                    }
                }
                // Durable before the Proof leaves (covered already when the chain was journaled
                // in the same store). Paid either way: the Proof is returned.
                if let Err(e) = rec.sync().await {
                    tracing::error!(quote = %q.id, error = %e, "paid, but its records may not survive a power loss");
                }
                Ok(paid)
            }
            Err(e) => {
                let unknown = outcome_unknown(&e);
                let ended = if unknown {
                    rec.ops.hand_over(lease).await
                } else {
                    let chain = chain_name(&q.receiver.id, &q.id);
                    if let Err(j) = me.journal.end(&chain).await {
                        tracing::warn!(chain = %chain, error = %j, "could not end a refused payment in the journal");
                    }
                    rec.ops.abandon(lease).await
                };
                if let Err(s) = ended {
                    tracing::warn!(quote = %q.id, error = %s, "could not end a payment's lease; it lapses by itself");
                }
                if unknown {
                    tracing::warn!(quote = %q.id, error = %e, "payment pending: its outcome is not known yet; `resume` finishes it");
                    self.mark_unknown(&chain_name(&q.receiver.id, &q.id)).await;
                }
                Err(e)
            }
        }
    }

    /// Marks the pending payment of `chain` as having an unknown outcome (no call pays it
    /// now): the HTTP client resumes such a payment for the same request.
    async fn mark_unknown(&self, chain: &str) {
        let journal = &self.0.journal;
        if let Ok(Some(mut p)) = journal.pending_of(chain).await
            && !p.unknown
        {
            p.unknown = true;
            if let Err(e) = journal.begin(&p).await {
                tracing::warn!(chain = %chain, error = %e, "could not mark a pending payment unknown");
            }
        }
    }

    /// Journals the chain of a paid Quote (once: a journal keeps one copy of an object), then
    /// ends its pending payment.
    async fn close_chain(&self, quote: &Signed<Quote>, paid: &Paid) {
        let me = &self.0;
        let q = quote.object();
        let chain = chain_name(&q.receiver.id, &q.id);
        let objects =
            self.chain_objects(paid.confirmation.as_ref(), &[quote.jws(), paid.proof.jws()]);
        // Paid for a request sent over a transport: kept with its Proof until the request's
        // answer comes back, so that the same request asked again presents this Proof.
        let presenting = match me.journal.pending_of(&chain).await {
            Ok(Some(mut p)) if p.resource.is_some() => {
                p.proof = Some(paid.proof.jws().to_owned());
                p.unknown = true;
                p.holder = None;
                Some(p)
            }
            _ => None,
        };
        let then = presenting.as_ref().map_or(Then::End, Then::Pending);
        // Presenting before its record says so: no other call takes the Proof up meanwhile.
        if presenting.is_some() {
            self.set_presenting(&chain, true);
        }
        // The chain's objects and the pending payment's new state: one step where the journal
        // can (one commit in a store), in that order where it cannot.
        if let Err(e) = me.journal.record_then(&chain, &objects, then).await {
            if presenting.is_some() {
                self.set_presenting(&chain, false);
            }
            tracing::error!(chain = %chain, error = %e, "could not journal a paid payment; it stays pending");
            return;
        }
        tracing::info!(quote = %q.id, receiver = %q.receiver.id, rail = %paid.rail, "paid");
    }

    /// Marks chain `chain` as being presented by a call of this process (or not).
    fn set_presenting(&self, chain: &str, on: bool) {
        if let Ok(mut m) = self.0.presenting.lock() {
            if on {
                m.insert(chain.to_owned(), std::time::Instant::now());
            } else {
                m.remove(chain);
            }
        }
    }

    /// Whether a call of this process is presenting chain `chain` now.
    fn is_presenting(&self, chain: &str) -> bool {
        self.0
            .presenting
            .lock()
            .ok()
            .and_then(|m| m.get(chain).copied())
            .is_some_and(|since| since.elapsed() < PRESENT_FOR)
    }

    /// The call presenting `paid` got no answer it could keep (a transport failure, a server
    /// error, a retry): the payment stays kept with its Proof, and the same request asked
    /// again — by this call or another — presents it at once.
    pub fn unanswered_now(&self, paid: &Paid) {
        if let Some(chain) = paid_chain(paid) {
            self.set_presenting(&chain, false);
        }
    }

    /// The request `paid` paid for got its answer (one that is not a retry: a Receipt, or a
    /// refusal of the Proof, or an answer without a Receipt): the payment is no longer kept for
    /// a repeat of the request. Checking a Receipt does this by itself.
    ///
    /// # Errors
    /// [`Error::Storage`] (the journal): the next request for the same resource presents the
    /// same Proof again, which the receiver answers with its kept answer or refuses.
    pub async fn answered(&self, paid: &Paid) -> Result<(), Error> {
        let Some(chain) = paid_chain(paid) else {
            return Ok(());
        };
        self.set_presenting(&chain, false);
        match self.0.journal.pending_of(&chain).await? {
            Some(p) if p.proof.as_deref() == Some(paid.proof.jws()) => {
                self.0.journal.end(&chain).await
            }
            _ => Ok(()),
        }
    }

    fn replayed(&self, rec: PaidRecord) -> Result<Paid, Error> {
        Ok(Paid {
            proof: Signed::parse(&rec.proof)?,
            confirmation: rec.confirmation.as_deref().map(Signed::parse).transpose()?,
            rail: rec.rail,
            fresh: false,
        })
    }

    async fn check_mandate(&self, now: u64) -> Result<(), Error> {
        let m = self.0.mandate.object();
        if now < m.nbf {
            return Err(Error::NotYetValid {
                what: "mandate",
                id: m.id.clone(),
                why: format!(
                    "it is valid from {}, and it is {} on this machine: wait until then, or check this machine's clock",
                    rfc3339(m.nbf),
                    rfc3339(now)
                ),
            });
        }
        if now >= m.exp {
            return Err(Error::Expired {
                what: "mandate",
                id: m.id.clone(),
                why: format!(
                    "it expired at {}, and it is {}: ask the principal for a new mandate",
                    rfc3339(m.exp),
                    rfc3339(now)
                ),
            });
        }
        if self.0.revocations.is_revoked(&m.id).await? {
            return Err(Error::Revoked(m.id.clone()));
        }
        Ok(())
    }

    /// What a fresh payment of `q` needs before anything is counted: the Quote still payable
    /// for long enough, the mandate's limits in its asset, the rail and its offer. Pure checks.
    fn prepare<'a>(
        &'a self,
        rec: &CallRecords,
        q: &'a Quote,
        now: u64,
    ) -> Result<Fresh<'a>, Error> {
        let me = &self.0;
        let mandate = me.mandate.object();
        if now >= q.exp {
            return Err(Error::Expired {
                what: "quote",
                id: q.id.clone(),
                why: format!(
                    "it expired at {}, and it is {}: ask for a fresh quote (send the request again)",
                    rfc3339(q.exp),
                    rfc3339(now)
                ),
            });
        }
        if now.saturating_add(me.min_quote_life) >= q.exp {
            return Err(Error::Expired {
                what: "quote",
                id: q.id.clone(),
                why: format!(
                    "it expires at {}, and it is {}: less than the {} s the wallet keeps to pay and present it; ask for a fresh quote",
                    rfc3339(q.exp),
                    rfc3339(now),
                    me.min_quote_life
                ),
            });
        }
        let max = q.max()?;
        let limits = limits_in(mandate, max.asset())?;
        // Choose the rail before counting: a Quote no rail can pay counts nothing.
        let (rail, offer) = self.choose(q)?;
        // The counters on the store itself (combined across this process's calls: one write
        // for many), the call's markers on its deferred handle.
        let budgets = self.budgets(limits)?.with_markers(rec.store.clone());
        Ok(Fresh {
            max,
            limits,
            rail,
            offer,
            budgets,
        })
    }

    /// Steps 3–5 for a Quote not paid before: `counting` is what [`Wallet::prepare`] found and
    /// the limits counted beside the operation's claim.
    #[allow(clippy::too_many_arguments)]
    async fn pay_fresh(
        &self,
        rec: &CallRecords,
        quote: &Signed<Quote>,
        op: &OpId,
        now: u64,
        sent: Option<&Resource>,
        confirmer: &dyn Confirmer,
        counting: Counting<'_>,
    ) -> Result<(Paid, Option<spend::Counted>), Error> {
        let me = &self.0;
        let q = quote.object();
        let (
            Fresh {
                max,
                limits,
                rail,
                offer,
                budgets,
            },
            counted,
        ) = counting?;

        // 3. Limits, counted durably (a retry of this Quote is counted once).
        let counted = match counted {
            Ok(c) => c,
            // Another call counting this Quote at the same moment (it lost the claim, and
            // gives its count back at once): counted once it has.
            Err(Error::Payment(RailError::InProgress { .. })) => {
                reserve_settled(&budgets, op, &q.receiver.id, &max).await?
            }
            Err(e) => return Err(e),
        };

        // 4. Human in the loop.
        let why = match q.profile {
            Profile::Checkout => Some(Why::Checkout),
            Profile::Service => limits
                .confirm_above
                .filter(|t| max.amount() > *t)
                .map(|_| Why::AboveThreshold),
        };
        let confirmation = match why {
            None => Ok(None),
            Some(why) => self
                .confirm(quote, why, &budgets, now, confirmer)
                .await
                .map(Some),
        };
        let (confirmation, counted) = counted.unless_err(confirmation).await?;

        // No payment without its chain: the payment is pending in the journal before the
        // rail is asked, so an unknown outcome or a review can be resumed.
        let pending = Pending {
            chain: chain_name(&q.receiver.id, &q.id),
            quote: quote.jws().to_owned(),
            confirmation: confirmation.as_ref().map(|c| c.jws().to_owned()),
            rail: rail.name.clone(),
            op: op.as_str().to_owned(),
            since: now,
            resource: sent.cloned(),
            request: q.request.clone(),
            unknown: false,
            proof: None,
            holder: me.journal.holder(),
        };
        // The claim and the counts, on a deferred handle, are durable before money moves: at
        // no cost when the journal's record in the same store was.
        let begun = match me.journal.begin(&pending).await {
            Ok(()) => rec.sync().await,
            Err(e) => Err(e),
        };
        if let Err(e) = begun {
            counted.release().await;
            return Err(e);
        }

        // 5. Pay or hold. The count is kept beside the Proof's record ([`Wallet::conclude`]).
        let payment = match ask_rail(rail, op, offer, q.profile).await {
            Ok(p) => p,
            Err(e) => {
                counted.after_rail_error(&e).await;
                return Err(Error::Payment(e));
            }
        };
        match self.sign_proof(quote, confirmation, payment, rail, now) {
            Ok(paid) => Ok((paid, Some(counted))),
            Err(e) => {
                counted.keep().await;
                Err(e)
            }
        }
    }

    /// Finishes pending payment `p` of `quote`: the rail asked again under its operation id.
    async fn settle(
        &self,
        rec: &CallRecords,
        quote: &Signed<Quote>,
        p: &Pending,
    ) -> Result<Paid, Error> {
        let me = &self.0;
        let q = quote.object();
        let rail = me.rails.iter().find(|r| r.name == p.rail).ok_or_else(|| {
            Error::NoRail(format!(
                "payment {} is pending over rail {}, which this wallet no longer has",
                p.chain, p.rail
            ))
        })?;
        let offer = q.offer(rail.handle.payer.id().as_str()).ok_or_else(|| {
            Error::NoRail(format!("quote {} has no offer for rail {}", q.id, p.rail))
        })?;
        let confirmation = p
            .confirmation
            .as_deref()
            .map(Signed::<Confirmation>::parse)
            .transpose()?;
        let op = OpId::new(p.op.clone()).map_err(Error::Payment)?;
        rec.sync().await?;
        match ask_rail(rail, &op, offer, q.profile).await {
            Ok(payment) => self.sign_proof(quote, confirmation, payment, rail, p.since),
            Err(e) => {
                if !e.is_retryable() {
                    // Refused for certain (a review declined, an offer expired unpaid): the
                    // amount counted at the start is given back.
                    self.give_back(q, &op).await;
                }
                Err(Error::Payment(e))
            }
        }
    }

    /// Gives back what was counted for `op` paying `q` (counting again is a no-op per `op`).
    async fn give_back(&self, q: &Quote, op: &OpId) {
        let me = &self.0;
        let mandate = me.mandate.object();
        let Ok(max) = q.max() else { return };
        let Some(limits) = mandate.limits_for(max.asset()) else {
            return;
        };
        let counted = match self.budgets(limits) {
            Ok(b) => b.reserve(op, &q.receiver.id, &max).await,
            Err(e) => Err(e),
        };
        match counted {
            Ok(c) => c.release().await,
            Err(e) => {
                tracing::warn!(quote = %q.id, error = %e, "could not give a refused payment back to the limits");
            }
        }
    }

    /// The signed Proof of `payment` for `quote`, made at `iat`.
    fn sign_proof(
        &self,
        quote: &Signed<Quote>,
        confirmation: Option<Signed<Confirmation>>,
        payment: rail_core::Payment,
        rail: &WalletRail,
        iat: u64,
    ) -> Result<Paid, Error> {
        let paid_over = payment.rail.as_str().to_owned();
        let proof = self.proof_of(
            PaidFor::Quote(quote),
            confirmation.as_ref(),
            payment,
            paid_over,
            iat,
        )?;
        Ok(Paid {
            proof,
            confirmation,
            rail: rail.name.clone(),
            fresh: true,
        })
    }

    /// The signed Proof of `payment` for `what`, with the human's `confirmation`, over `rail`
    /// (the rail the Proof names), made at `iat`.
    fn proof_of(
        &self,
        what: PaidFor<'_>,
        confirmation: Option<&Signed<Confirmation>>,
        payment: rail_core::Payment,
        rail: String,
        iat: u64,
    ) -> Result<Signed<Proof>, Error> {
        let me = &self.0;
        let (mut quote, mut quote_jws, mut tab, mut tab_jws, mut challenge) =
            (None, None, None, None, None);
        match what {
            PaidFor::Quote(q) => {
                quote = Some(q.digest().clone());
                quote_jws = Some(q.jws().to_owned());
            }
            PaidFor::Tab(t) => {
                tab = Some(t.digest().clone());
                tab_jws = Some(t.jws().to_owned());
            }
            PaidFor::Challenge(c) => challenge = Some(c),
        }
        let proof = Proof {
            stipendex: Tag::current("proof"),
            id: new_id("p_"),
            wallet: me.key.public(),
            mandate: me.mandate.digest().clone(),
            quote,
            quote_jws,
            tab,
            tab_jws,
            challenge,
            confirmation: confirmation.map(|c| c.digest().clone()),
            confirmation_jws: confirmation.map(|c| c.jws().to_owned()),
            iat,
            mode: payment.mode,
            rail,
            asset: payment.amount.asset().clone(),
            amount: payment.amount.amount(),
            payment,
        };
        Signed::sign(proof, &me.key)
    }

    /// The limits' durable counters in the mandate's `limits` (one asset's).
    fn budgets(&self, limits: &crate::envelope::Limits) -> Result<spend::Budgets, Error> {
        let me = &self.0;
        spend::Budgets::new(me.store.clone(), &me.mandate.object().id, limits)
    }

    /// A payment's chain as journaled: the mandate, the human's `confirmation` if one was
    /// needed, then `rest` (what was paid, and its Proof).
    fn chain_objects<'a>(
        &'a self,
        confirmation: Option<&'a Signed<Confirmation>>,
        rest: &[&'a str],
    ) -> Vec<&'a str> {
        let mut objects = vec![self.0.mandate.jws()];
        if let Some(c) = confirmation {
            objects.push(c.jws());
        }
        objects.extend_from_slice(rest);
        objects
    }

    /// Journals `objects` in `chain`, in order, in one step where the journal can; a failure
    /// is logged (`what`: whose objects).
    async fn journal_all(&self, chain: &str, objects: Vec<&str>, what: &str) {
        if let Err(e) = self
            .0
            .journal
            .record_then(chain, &objects, Then::Keep)
            .await
        {
            tracing::error!(chain = %chain, error = %e, "could not journal a {what}'s objects");
        }
    }

    /// The first rail, in the receiver's order, that the mandate allows and the wallet has.
    fn choose<'a>(&'a self, q: &'a Quote) -> Result<(&'a WalletRail, &'a rail_core::Offer), Error> {
        let mandate = self.0.mandate.object();
        let mut why = Vec::new();
        for r in &q.rails {
            if !rail_allowed(mandate, &r.rail) {
                why.push(format!("{}: not allowed by the mandate", r.rail));
                continue;
            }
            let mut found = false;
            for w in &self.0.rails {
                if w.handle.payer.id().as_str() != r.rail {
                    continue;
                }
                found = true;
                if r.offer.mode == PaymentMode::Hold && w.handle.hold_payer.is_none() {
                    why.push(format!("{} ({}): cannot hold", w.name, r.rail));
                    continue;
                }
                match w.handle.payer.accepts(&r.offer) {
                    Ok(()) => return Ok((w, &r.offer)),
                    Err(e) => why.push(format!("{} ({}): {e}", w.name, r.rail)),
                }
            }
            if !found {
                why.push(format!("{}: the wallet has no such rail", r.rail));
            }
        }
        Err(Error::NoRail(format!("quote {}: {}", q.id, why.join("; "))))
    }

    async fn confirm(
        &self,
        quote: &Signed<Quote>,
        why: Why,
        budgets: &spend::Budgets,
        now: u64,
        confirmer: &dyn Confirmer,
    ) -> Result<Signed<Confirmation>, Error> {
        let q = quote.object();
        let (left_in_period, left_in_total) = budgets.left().await;
        let ask = Ask {
            why,
            receiver: q.receiver.id.clone(),
            description: q.description.clone(),
            total: q.price()?,
            tolerance: q.tolerance.unwrap_or(Amount::ZERO),
            left_in_period,
            left_in_total,
        };
        self.ask_human(&ask, quote.digest().clone(), &q.id, now, confirmer)
            .await
    }

    /// Asks the confirmer; a yes becomes a signed Confirmation of `ask`'s total and tolerance,
    /// bound to `bound` (a Quote's digest, or a challenge's) and `quote_id`.
    async fn ask_human(
        &self,
        ask: &Ask,
        bound: crate::envelope::Digest,
        quote_id: &str,
        now: u64,
        confirmer: &dyn Confirmer,
    ) -> Result<Signed<Confirmation>, Error> {
        let me = &self.0;
        match confirmer.confirm(ask).await {
            Answer::No { why } => Err(Error::NotConfirmed(format!("{}: {why}", ask.summary()))),
            Answer::Yes { by } => Signed::sign(
                Confirmation {
                    stipendex: Tag::current("confirmation"),
                    id: new_id("c_"),
                    wallet: me.key.public(),
                    mandate: me.mandate.digest().clone(),
                    quote: bound,
                    quote_id: quote_id.to_owned(),
                    receiver: ask.receiver.clone(),
                    asset: ask.total.asset().clone(),
                    total: ask.total.amount(),
                    tolerance: ask.tolerance,
                    iat: now,
                    by,
                },
                &me.key,
            ),
        }
    }

    /// Checks the receiver's Receipt for `paid` (signed by the Quote's receiver key, binding
    /// this Proof, never above the Quote or the Confirmation) and journals it.
    ///
    /// # Errors
    /// [`Error::Malformed`], [`Error::BadSignature`], [`Error::Untrusted`],
    /// [`Error::Mismatch`], [`Error::CaptureAbove`].
    pub async fn receipt(&self, paid: &Paid, receipt: &str) -> Result<Signed<Receipt>, Error> {
        self.check_receipt(paid, receipt, None).await
    }

    /// [`Wallet::receipt`] for a Receipt that came with `delivered`, the bytes received: its
    /// `result` must be their digest, or it is [`Error::Mismatch`] and is not journaled.
    ///
    /// # Errors
    /// As [`Wallet::receipt`].
    pub async fn receipt_for(
        &self,
        paid: &Paid,
        receipt: &str,
        delivered: &[u8],
    ) -> Result<Signed<Receipt>, Error> {
        let digest = crate::envelope::Digest::of(delivered);
        self.check_receipt(paid, receipt, Some((&digest, delivered.len() as u64)))
            .await
    }

    /// [`Wallet::receipt_for`] for a body of `len` bytes whose digest is `delivered` (hashed as
    /// it streamed by, too large to hold).
    ///
    /// # Errors
    /// As [`Wallet::receipt_for`].
    pub async fn receipt_for_digest(
        &self,
        paid: &Paid,
        receipt: &str,
        delivered: &crate::envelope::Digest,
        len: u64,
    ) -> Result<Signed<Receipt>, Error> {
        self.check_receipt(paid, receipt, Some((delivered, len)))
            .await
    }

    async fn check_receipt(
        &self,
        paid: &Paid,
        receipt: &str,
        delivered: Option<(&crate::envelope::Digest, u64)>,
    ) -> Result<Signed<Receipt>, Error> {
        let receipt = Signed::<Receipt>::parse(receipt)?;
        let Some(quote_jws) = &paid.proof.object().quote_jws else {
            return Err(Error::Mismatch(
                "an x402 challenge has no Stipendex receipt".into(),
            ));
        };
        // A Proof this wallet signed carries a Quote it verified before signing (it signs only
        // a verified Quote): read it again without checking its signature a second time.
        let quote = if paid.proof.object().wallet == self.0.key.public() {
            Signed::<Quote>::reread_vouched(quote_jws)?
        } else {
            Signed::<Quote>::parse(quote_jws)?
        };
        crate::chain::check_receipt(
            quote.object(),
            &paid.proof,
            paid.confirmation.as_ref().map(Signed::object),
            &receipt,
        )?;
        if let Some((digest, len)) = delivered {
            let r = receipt.object();
            if r.result.as_ref() != Some(digest) {
                return Err(Error::Mismatch(format!(
                    "receipt {} does not bind the {len} bytes received (its result digest is {})",
                    r.id,
                    r.result.as_ref().map_or("absent", |d| d.as_str())
                )));
            }
        }
        let chain = chain_name(&quote.object().receiver.id, &quote.object().id);
        // The Receipt closes the chain and answers the request: one step where the journal can.
        self.set_presenting(&chain, false);
        let journal = &self.0.journal;
        if let Err(e) = journal
            .record_then(&chain, &[receipt.jws()], Then::EndIfProof(paid.proof.jws()))
            .await
        {
            // The Receipt must be journaled; the payment's end may wait (an identical request,
            // or `resume`, ends it), as before the two were one step.
            journal.record(&chain, receipt.jws()).await?;
            tracing::warn!(chain = %chain, error = %e, "could not mark a receipted payment answered");
        }
        Ok(receipt)
    }
}
