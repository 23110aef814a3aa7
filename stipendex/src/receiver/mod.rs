//! The receiver: priced capabilities, signed Quotes, Proofs verified through their rail,
//! signed Receipts — and never an unpaid forward.
//!
//! A transport binding (HTTP, MCP, the gateway) decides once ([`Receiver::decide`]) and calls
//! the engine, [`Receiver::serve`], which runs every step below in one order and answers
//! [`Served`] for the binding to encode (module `serve`). The steps, for a binding that drives
//! them itself:
//! 1. [`Receiver::gate`]: free (not priced), waived, rejected (no charge, not forwarded), or a
//!    signed Quote to send back (402 / -32402);
//! 2. on the retry, [`Receiver::admit`] (or [`Receiver::accept`]) with the Proof: the Quote
//!    must be this receiver's own (its signature verified), unexpired — or expired less than
//!    [`rail_core::LATE_PROOF_GRACE`] ago and paid while it was live — and for this very
//!    request; the Proof is claimed once in the receiver's store, the payment verified on its
//!    rail, which consumes it (another Proof is [`Error::QuoteUsed`], the same Proof again
//!    gets its kept answer); only then may the request run;
//! 3. after the work, [`Receiver::receipt`] (service) or [`Receiver::capture`] (checkout:
//!    capture the final amount, never above the Quote or the Confirmation) for the signed
//!    Receipt — or [`Receiver::release`] if the work failed (a hold is voided).

mod answer_record;
mod answers;
mod binding;
mod keep;
mod limit;
pub mod price_file;
mod pricing;
mod serve;
mod tab;
#[cfg(feature = "challenges")]
mod x402;

use std::sync::Arc;
use std::time::Duration;

use rail_core::clock::rfc3339;
use rail_core::keys::Lease;
pub use rail_core::route::PathMatching;
use rail_core::{
    Captured, Charge, KeyStore, MemoryKeyStore, Money, OpId, PaymentMode, RailError,
    ReceiverHandle, SharedClock, SystemClock, Verified,
};
use serde::{Deserialize, Serialize};

pub use answers::{ANSWER_GONE, ANSWER_MARGIN, Answer, CLAIM_MARGIN, Gone, MAX_KEPT_ANSWER};
pub use binding::{Ran, Seal, Served, Tender, Work, X402Seal};
#[cfg(feature = "challenges")]
pub use binding::{X402Failure, X402Payment};
pub use keep::{DEFAULT_KEEP_BYTES, DEFAULT_KEEP_ENTRIES, KeepBounds};
pub use limit::DEFAULT_COSTLY_QUOTES;
pub(crate) use pricing::matching;
#[cfg(feature = "http")]
pub(crate) use pricing::query_params;
pub use pricing::{Decision, ListPrice, Price, PricedCapability, Request, ResolvePrice};
pub use tab::{Opened, Serving, TabCall, TabTerms};
#[cfg(feature = "challenges")]
pub use x402::X402_CLAIM_WINDOW;

use crate::Error;
use crate::envelope::{
    Capability, Confirmation, Digest, Party, Profile, Proof, PublicKey, Quote, RailOffer, Receipt,
    SecretKey, Signed, Tag, new_id,
};

/// One of the receiver's rails: a name (the registry's) and its receiving side.
#[derive(Clone)]
struct ReceiverRail {
    name: String,
    handle: ReceiverHandle,
}

/// What [`Receiver::gate`] decided for a request.
#[derive(Clone, Debug)]
pub enum Gate {
    /// Not priced: let it through.
    Free,
    /// Priced, and the hook waived payment: let it through.
    Waived,
    /// Priced, and the hook refused it: answer with the message, charge nothing, forward nothing.
    Rejected(String),
    /// Priced: answer with this Quote.
    Quote(Box<Signed<Quote>>),
}

/// A Proof the receiver accepted: the payment is verified (and, for a capture, settled).
#[derive(Clone, Debug)]
pub struct Accepted {
    /// The Proof.
    pub proof: Signed<Proof>,
    /// The Quote it pays.
    pub quote: Signed<Quote>,
    /// The human's Confirmation it carries, if any.
    pub confirmation: Option<Signed<Confirmation>>,
    /// The rail's verdict.
    pub verified: Verified,
    /// The receiver's rail (its name) that verified it.
    pub rail: String,
}

/// What [`Receiver::admit`] found for a Proof.
#[derive(Debug)]
pub enum Admitted {
    /// A new Proof, its payment verified: run the request, then [`Receiver::answered`].
    Run(Box<Paying>),
    /// This Proof was answered before, for this request: the same answer again.
    Answered {
        /// The Quote's id.
        quote: String,
        /// The kept answer.
        answer: Box<Answer>,
    },
}

/// What [`Receiver::present`] found for a Proof: as [`Receiver::admit`], or a repeat whose
/// kept answer is gone.
#[derive(Debug)]
pub enum Presented {
    /// A new Proof to run, or a repeat with its kept answer.
    Admitted(Admitted),
    /// A repeat of a Proof that was answered and receipted, whose answer is not kept any more:
    /// not run again, nothing more charged.
    Gone(Box<Gone>),
}

/// A Proof being served: its accepted payment, and its claim on the Quote (no other
/// presentation runs meanwhile). Hand it to [`Receiver::answered`] once the request is
/// answered; dropped, the claim lapses and the next presentation of the Proof recovers.
#[derive(Debug)]
#[must_use = "hand it to Receiver::answered"]
pub struct Paying {
    /// The accepted payment.
    pub accepted: Accepted,
    lease: Lease,
    request: String,
}

impl Paying {
    /// Runs `work` (the request) while keeping the claim alive.
    pub async fn keep_alive<F: std::future::Future>(&self, work: F) -> F::Output {
        self.lease.keep_alive(work).await
    }
}

/// What a binding did with a priced request, for the layers around it (logs, metrics): over
/// HTTP in the response's extensions (never sent to the client), over MCP to
/// `PaidServer::on_outcome`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// A 402 with a fresh Quote; `refusal` names why the payment presented was refused
    /// (the error code of the body), if one was.
    Quoted {
        /// The refusal's code.
        refusal: Option<String>,
    },
    /// Paid and answered: over which rail, how much.
    Paid {
        /// The receiver's rail (its registry name).
        rail: String,
        /// What the rail verified.
        amount: Money,
    },
    /// The kept answer of a Proof presented again.
    Replayed,
    /// A Proof presented again whose kept answer is gone ([`Gone`]).
    AnswerGone,
    /// The pricing hook refused the request.
    Rejected,
    /// A call paid by a voucher inside a tab (its kept answer when `replayed`).
    TabCall {
        /// The call's price.
        amount: Money,
        /// The same voucher again: its kept answer.
        replayed: bool,
    },
}

/// Whether the work behind a receiver can be done now: asked by [`Receiver::guard`] before any
/// payment is taken, whatever the way to pay (a Proof, a voucher, a tab opening, an x402
/// payload). A gateway's is "its upstream takes connections".
///
/// Contract: answer fast (it runs on every paid request) and without side effects; `Err(why)`
/// only when the work certainly cannot be done now (`why` is shown to the payer). A `true`
/// answer is no promise: work that then never reaches the service says so
/// ([`Receiver::undelivered`], [`Receiver::tab_undelivered`]).
#[async_trait::async_trait]
pub trait Ready: Send + Sync {
    /// `Ok` if the work can be done now, else why not.
    async fn ready(&self) -> Result<(), String>;
}

/// Whether a paid request reaches its work for the first time ([`Receiver::deliver`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The first time: run it.
    First,
    /// An earlier presentation of the same Proof handed the request to its work and its answer
    /// was never kept: the work may have run.
    Again,
}

/// Whether running `method` twice has the effect of running it once, so that a paid request
/// whose answer was lost with an instance may run again: HTTP's idempotent methods (RFC 9110
/// §9.2.2: `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`) and MCP's reads
/// (`resources/read`, `prompts/get`). A tool call (`tools/call`) or a `POST` is not.
#[must_use]
pub fn idempotent(method: &str) -> bool {
    matches!(
        method,
        "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE" | "resources/read" | "prompts/get"
    )
}

/// How many of its latest Quotes a receiver remembers having signed (about 100 bytes each): a Proof
/// paying one of them is checked without verifying the Quote's signature again. One paid past
/// this many newer Quotes is verified, as one signed by another instance is.
const QUOTES_REMEMBERED: usize = 4_096;

/// The message of the answer given when a non-idempotent paid request comes back after the
/// instance that handed it to its work stopped ([`Delivery::Again`]).
pub const OUTCOME_UNKNOWN: &str = "this payment's request was handed to the service once and its answer was lost when the instance serving it stopped; it is not idempotent, so it is not run a second time: ask the service whether it was done";

/// The receiver's self-description, served at `GET /.well-known/stipendex.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Descriptor {
    /// `receiver/0.1`.
    pub stipendex: Tag,
    /// The receiver's id.
    pub id: String,
    /// The key its Quotes and Receipts are signed with.
    pub key: PublicKey,
    /// The rail kinds it accepts.
    pub rails: Vec<String>,
    /// The profiles it quotes: `service` where a capability has a fixed price, `checkout`
    /// where one is priced by estimate (on a rail that can hold).
    pub profiles: Vec<Profile>,
    /// The public origins it is reached at (for a mandate to pin).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<String>,
    /// A trust registry vouching for it (none in this profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trust_registry: Option<String>,
}

/// A Stipendex receiver. Cheap to clone.
#[derive(Clone)]
pub struct Receiver(Arc<Inner>);

struct Inner {
    party: Party,
    origins: Vec<String>,
    key: SecretKey,
    rails: Vec<ReceiverRail>,
    capabilities: Vec<PricedCapability>,
    resolve: Arc<dyn ResolvePrice>,
    ttl: Duration,
    clock: SharedClock,
    answers: answers::Answers,
    /// The Quotes this receiver signed lately: a Proof's Quote among them is not verified again.
    quotes_signed: crate::envelope::Vouched,
    /// The x402 payments' served-once mark, in the same store as the rails' (theirs is the
    /// same namespace): one payment is served once across the x402 rail's Proofs, a plain x402
    /// paywall and this receiver's x402 path (decision 0038).
    #[cfg(feature = "challenges")]
    served: x402_transport::ServedOnce,
    costly: limit::Limiter,
    claim_lease: Duration,
    tab_terms: Option<TabTerms>,
    tabs: tab::Records,
    keeper: std::sync::atomic::AtomicBool,
    path_matching: PathMatching,
    ready: Option<Arc<dyn Ready>>,
}

impl std::fmt::Debug for Receiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("id", &self.0.party.id)
            .field("key", &self.0.party.key)
            .finish_non_exhaustive()
    }
}

/// Builds a [`Receiver`].
pub struct Builder {
    id: String,
    origins: Vec<String>,
    key: SecretKey,
    rails: Vec<ReceiverRail>,
    capabilities: Vec<PricedCapability>,
    resolve: Arc<dyn ResolvePrice>,
    ttl: Duration,
    clock: SharedClock,
    store: Option<Arc<dyn KeyStore>>,
    costly: (u32, Duration),
    claim_lease: Duration,
    tabs: Option<TabTerms>,
    path_matching: PathMatching,
    ready: Option<Arc<dyn Ready>>,
    keep: KeepBounds,
}

impl Builder {
    /// The check [`Receiver::guard`] makes before any payment is taken (default: none, the
    /// work is always there).
    #[must_use]
    pub fn ready(mut self, ready: Arc<dyn Ready>) -> Self {
        self.ready = Some(ready);
        self
    }

    /// How an HTTP path is matched against the priced patterns (default
    /// [`PathMatching::Lenient`]: without regard to case, and modulo one trailing slash, so a
    /// spelling a lenient service serves as a priced route is priced as that route;
    /// [`PathMatching::Strict`] for a service known to route exactly). Tool names and
    /// resource URIs are always matched exactly.
    #[must_use]
    pub fn path_matching(mut self, mode: PathMatching) -> Self {
        self.path_matching = mode;
        self
    }

    /// Accepts payment over a rail (`name` as in the registry), in order of preference.
    #[must_use]
    pub fn rail(mut self, name: impl Into<String>, handle: ReceiverHandle) -> Self {
        self.rails.push(ReceiverRail {
            name: name.into(),
            handle,
        });
        self
    }

    /// Accepts every configured receiving side of `registry`, in name order, and keeps its
    /// records in the registry's `[store]` (if it has one and no [`Builder::store`] was given).
    #[must_use]
    pub fn registry(mut self, registry: &crate::Registry) -> Self {
        for e in registry.rails() {
            if let Some(r) = &e.receiver {
                self = self.rail(e.name.clone(), r.clone());
            }
        }
        if self.store.is_none() {
            self.store = registry.store().cloned();
        }
        self
    }

    /// How many Quotes with costly offers (rails whose offers are objects elsewhere: Stripe,
    /// Lightning; `offers_cost`) one client gets per window (default
    /// [`DEFAULT_COSTLY_QUOTES`]: 60 a minute). Past it, those rails drop out of the client's
    /// Quotes; with no other rail the request is `rate_limited` (429 over HTTP). With a
    /// [`Builder::store`] (or a registry's), the count is kept in that store, so every instance
    /// sharing it counts against one limit; without one, each instance counts alone, in a
    /// table of at most 10,000 clients.
    #[must_use]
    pub fn costly_quotes_per_client(mut self, max: u32, per: Duration) -> Self {
        self.costly = (max, per);
        self
    }

    /// The store of used Proofs and their kept answers: shared by every instance of the
    /// receiver (PostgreSQL, or SQLite for one), so a Proof is used once across them and any
    /// of them answers its repeat. Default: memory (one instance; nothing survives a restart).
    #[must_use]
    pub fn store(mut self, store: Arc<dyn KeyStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// A public origin the receiver is reached at (`https://search.example`), in order: the
    /// first is the default. Over HTTP a Quote names the configured origin the request's
    /// `Host` designates (the first when it designates none), never the `Host` itself; wallets
    /// pay only at the origins their mandate pins.
    #[must_use]
    pub fn origin(mut self, origin: impl Into<String>) -> Self {
        self.origins.push(origin.into());
        self
    }

    /// Prices a capability.
    #[must_use]
    pub fn price(mut self, capability: PricedCapability) -> Self {
        self.capabilities.push(capability);
        self
    }

    /// The pricing hook. Default: [`ListPrice`].
    #[must_use]
    pub fn resolve_price(mut self, hook: Arc<dyn ResolvePrice>) -> Self {
        self.resolve = hook;
        self
    }

    /// How long a Quote stays payable. Default: 120 s.
    #[must_use]
    pub fn quote_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// How long a Proof being served stays claimed by its instance without a renewal
    /// (default 60 s; renewed every third of it while the work runs). When an instance stops
    /// mid-request, the same Proof presented elsewhere is `in_progress` (retryable) for at most
    /// this long, then recovered ([`Receiver::deliver`] says whether the work had started).
    #[must_use]
    pub fn claim_lease(mut self, lease: Duration) -> Self {
        self.claim_lease = lease.max(Duration::from_secs(1));
        self
    }

    /// The clock (tests). Default: the system clock.
    #[must_use]
    pub fn clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Offers tab sessions on these terms beside the Quotes of the capabilities priced at a
    /// fixed price in the cap's asset (`docs/stipendex-profile.md` §4b). Needs a rail that
    /// holds and captures part of a hold.
    #[must_use]
    pub fn tabs(mut self, terms: TabTerms) -> Self {
        self.tabs = Some(terms);
        self
    }

    /// The receiver.
    ///
    /// # Errors
    /// [`Error::Config`] without a rail, with an origin that is not `scheme://host[:port]`, or
    /// with a checkout-priced capability and no rail that can hold.
    pub fn build(self) -> Result<Receiver, Error> {
        let mut origins = Vec::new();
        for o in &self.origins {
            let o = crate::origin::parse(o)
                .map_err(|e| Error::Config(format!("receiver {}: {e}", self.id)))?;
            if !origins.contains(&o) {
                origins.push(o);
            }
        }
        if self.rails.is_empty() {
            return Err(Error::Config(format!(
                "receiver {} has no rail to be paid over",
                self.id
            )));
        }
        let can_hold = self.rails.iter().any(checkout_capable);
        if let Some(c) = self
            .capabilities
            .iter()
            .find(|c| matches!(c.price, Price::Estimate { .. }))
            && !can_hold
        {
            return Err(Error::Config(format!(
                "{} {} is priced by estimate (checkout profile), which needs a rail that can hold and capture part of a hold; none of this receiver's rails can",
                c.method(),
                c.name()
            )));
        }
        if let Some(t) = &self.tabs {
            if t.lanes == 0 || t.lanes > crate::envelope::MAX_LANES {
                return Err(Error::Config(format!(
                    "receiver {}: a tab has 1 to {} lanes, not {}",
                    self.id,
                    crate::envelope::MAX_LANES,
                    t.lanes
                )));
            }
            if t.cap.amount().is_zero() || t.ttl.is_zero() {
                return Err(Error::Config(format!(
                    "receiver {}: a tab needs a cap above zero and a TTL",
                    self.id
                )));
            }
            if !self.rails.iter().any(|r| {
                checkout_capable(r) && r.handle.receiver.capabilities().check_asset(&t.cap).is_ok()
            }) {
                return Err(Error::Config(format!(
                    "receiver {} offers tabs in {}, which needs a rail that holds {} and captures part of a hold; none of its rails can (Lightning hold invoices settle in full only, x402 and exact-algo cannot hold)",
                    self.id,
                    t.cap.asset(),
                    t.cap.asset()
                )));
            }
        }
        // A store given to the receiver is the one its instances share: the costly-quote limit
        // is counted there, once for the fleet; without one, in this instance's memory.
        let costly = match &self.store {
            Some(shared) => limit::Limiter::new(self.costly.0, self.costly.1)
                .shared(shared.clone(), &answers::who(&self.id)),
            None => limit::Limiter::new(self.costly.0, self.costly.1),
        };
        let store = self
            .store
            .unwrap_or_else(|| Arc::new(MemoryKeyStore::with_clock(self.clock.clone())));
        let keep = keep::Keep::new(store.clone(), &self.id, self.keep, self.clock.clone());
        Ok(Receiver(Arc::new(Inner {
            tabs: tab::Records::new(store.clone(), &self.id, keep.clone()),
            keeper: std::sync::atomic::AtomicBool::new(false),
            tab_terms: self.tabs,
            path_matching: self.path_matching,
            ready: self.ready,
            claim_lease: self.claim_lease,
            #[cfg(feature = "challenges")]
            served: x402_transport::ServedOnce::new(store.clone()),
            answers: answers::Answers::new(store, &self.id, self.ttl, self.claim_lease, keep),
            quotes_signed: crate::envelope::Vouched::new(QUOTES_REMEMBERED),
            costly,
            party: Party {
                id: self.id,
                key: self.key.public(),
            },
            key: self.key,
            origins,
            rails: self.rails,
            capabilities: self.capabilities,
            resolve: self.resolve,
            ttl: self.ttl,
            clock: self.clock,
        })))
    }
}

/// A rail can serve the checkout profile: it holds, and captures part of a hold (the final
/// amount is known only after the work; Lightning's hold invoices settle in full only).
fn checkout_capable(r: &ReceiverRail) -> bool {
    let caps = r.handle.receiver.capabilities();
    r.handle.hold_receiver.is_some() && caps.hold && caps.partial_capture
}

fn now_secs(clock: &SharedClock) -> u64 {
    u64::try_from(clock.now().unix_seconds()).unwrap_or(0)
}

impl Receiver {
    /// A builder for the receiver `id`, signing with `key`.
    #[must_use]
    pub fn builder(id: impl Into<String>, key: SecretKey) -> Builder {
        Builder {
            id: id.into(),
            origins: Vec::new(),
            key,
            rails: Vec::new(),
            capabilities: Vec::new(),
            resolve: Arc::new(ListPrice),
            ttl: Duration::from_secs(120),
            claim_lease: Duration::from_secs(60),
            clock: Arc::new(SystemClock),
            store: None,
            costly: DEFAULT_COSTLY_QUOTES,
            tabs: None,
            path_matching: PathMatching::default(),
            ready: None,
            keep: KeepBounds::default(),
        }
    }

    /// The receiver's id and key.
    #[must_use]
    pub fn party(&self) -> &Party {
        &self.0.party
    }

    /// Its priced capabilities, in the order declared.
    #[must_use]
    pub fn capabilities(&self) -> &[PricedCapability] {
        &self.0.capabilities
    }

    /// The methods priced for `name` (whatever the method asked), for an `OPTIONS` answer.
    #[must_use]
    pub fn methods_priced(&self, name: &str) -> Vec<&str> {
        pricing::methods_matching(&self.0.capabilities, name, self.0.path_matching)
    }

    /// The public origins it is reached at (normalised), the default first.
    #[must_use]
    pub fn origins(&self) -> &[String] {
        &self.0.origins
    }

    /// The configured origin a request with `Host: host` was served at: the one `host` names,
    /// else the default (the first); `None` if the receiver has no origin.
    #[must_use]
    pub fn origin_for(&self, host: Option<&str>) -> Option<&str> {
        let o = &self.0.origins;
        // The usual `Host` spells the origin's authority exactly: no URL parse per request.
        let exact = |h: &str| {
            o.iter().find(|o| {
                o.split_once("://")
                    .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(h))
            })
        };
        host.and_then(|h| exact(h).or_else(|| o.iter().find(|o| crate::origin::host_matches(o, h))))
            .or_else(|| o.first())
            .map(String::as_str)
    }

    /// The self-description served at `/.well-known/stipendex.json`.
    #[must_use]
    pub fn descriptor(&self) -> Descriptor {
        let mut rails: Vec<String> = Vec::new();
        for r in &self.0.rails {
            let kind = r.handle.receiver.id().as_str().to_owned();
            if !rails.contains(&kind) {
                rails.push(kind);
            }
        }
        // A profile is listed where a priced capability quotes it: a receiver whose rails
        // could hold, and that prices nothing by estimate, offers no checkout (and a checkout
        // price needs a rail that holds: `Builder::build` refuses one without).
        let quotes = |fixed: bool| {
            self.0
                .capabilities
                .iter()
                .any(|c| matches!(c.price, Price::Fixed(_)) == fixed)
        };
        let mut profiles = Vec::new();
        if quotes(true) {
            profiles.push(Profile::Service);
        }
        if quotes(false) && self.0.rails.iter().any(checkout_capable) {
            profiles.push(Profile::Checkout);
        }
        Descriptor {
            stipendex: Tag::current("receiver"),
            id: self.0.party.id.clone(),
            key: self.0.party.key,
            rails,
            profiles,
            origins: self.0.origins.clone(),
            trust_registry: None,
        }
    }

    /// The one pricing decision for `req`: the priced capability it falls under (the most
    /// specific match of its method on its percent-decoded name, an HTTP path under the
    /// receiver's [`PathMatching`]; `HEAD` as `GET`), or `None` if it is free. The Quote, the x402 challenge of the HTTP binding and every other gate
    /// ask this, and nothing else.
    #[must_use]
    pub fn decide(&self, req: &Request) -> Option<&PricedCapability> {
        // One event per decision (target `stipendex::decide`, level trace): what the bindings'
        // tests count to show a request is decided once.
        tracing::trace!(target: "stipendex::decide", method = %req.method, name = %req.name);
        pricing::matching_as(&self.0.capabilities, req, self.0.path_matching)
    }

    /// [`Receiver::decide`] as the position of the capability in [`Receiver::capabilities`]:
    /// for a binding that decides in one place and serves in another (ContextVM's transport
    /// holds a priced request; its payments admit it later, by this position).
    #[must_use]
    pub fn decide_position(&self, req: &Request) -> Option<usize> {
        let cap = self.decide(req)?;
        self.0
            .capabilities
            .iter()
            .position(|c| std::ptr::eq(c, cap))
    }

    /// The one guard every way to pay passes before anything is taken — a Proof, a voucher, a
    /// tab's opening, an x402 payload, a CEP-8 payment — called once by each binding as soon
    /// as a priced request presents a payment: `Err` while the work cannot be done
    /// ([`Builder::ready`]), and then nothing is claimed, verified, counted or settled.
    ///
    /// # Errors
    /// [`Error::Unavailable`] (the binding answers it retryable: 503 over HTTP).
    pub async fn guard(&self) -> Result<(), Error> {
        match &self.0.ready {
            None => Ok(()),
            Some(r) => r.ready().await.map_err(Error::Unavailable),
        }
    }

    /// Decides what `req` needs: nothing, or a signed Quote (or the hook's waiver or refusal).
    ///
    /// # Errors
    /// [`Error::Payment`] if a rail cannot make an offer; [`Error::NoRail`] if no rail carries
    /// the price's asset (or can hold, for an estimate).
    pub async fn gate(&self, req: &Request) -> Result<Gate, Error> {
        match self.decide(req) {
            None => Ok(Gate::Free),
            Some(cap) => self.gate_on(cap, req).await,
        }
    }

    /// The price hook's decision for `req`, which falls under `cap` ([`Receiver::decide`]),
    /// with no Quote made: for a binding whose payment request is not a Quote (ContextVM's
    /// CEP-8 processors make a Lightning invoice of the price).
    pub async fn resolve(&self, cap: &PricedCapability, req: &Request) -> Decision {
        self.0.resolve.resolve(cap, req).await
    }

    /// [`Receiver::gate`] for a request already decided to fall under `cap` (a binding that
    /// decided once, with [`Receiver::decide`]): the hook's waiver or refusal, or a Quote.
    ///
    /// # Errors
    /// As [`Receiver::gate`].
    pub async fn gate_on(&self, cap: &PricedCapability, req: &Request) -> Result<Gate, Error> {
        self.gate_decided(cap, req, None).await
    }

    /// [`Receiver::gate_on`] with the hook's decision for `req` when it was already asked
    /// (`decided`), so that it is asked once per request.
    pub(crate) async fn gate_decided(
        &self,
        cap: &PricedCapability,
        req: &Request,
        decided: Option<Decision>,
    ) -> Result<Gate, Error> {
        let decision = match decided {
            Some(d) => d,
            None => self.0.resolve.resolve(cap, req).await,
        };
        match decision {
            Decision::Waive => Ok(Gate::Waived),
            Decision::Reject { message } => Ok(Gate::Rejected(message)),
            Decision::Quote {
                price, description, ..
            } => {
                let description = description.or_else(|| cap.description.clone());
                self.quote(req, &price, description)
                    .await
                    .map(|q| Gate::Quote(Box::new(q)))
            }
        }
    }

    /// A signed Quote for `req` at `price`, with an offer from every rail that can take it; a
    /// rail whose offer fails drops out (logged), and only when every rail fails is the
    /// failure returned.
    ///
    /// # Errors
    /// As [`Receiver::gate`].
    pub async fn quote(
        &self,
        req: &Request,
        price: &Price,
        description: Option<String>,
    ) -> Result<Signed<Quote>, Error> {
        let me = &self.0;
        let max = price.max()?;
        let (profile, mode) = match price {
            Price::Fixed(_) => (Profile::Service, PaymentMode::Capture),
            Price::Estimate { .. } => (Profile::Checkout, PaymentMode::Hold),
        };
        let id = new_id("q_");
        let mut charge = match mode {
            PaymentMode::Capture => Charge::capture(max.clone(), me.ttl),
            PaymentMode::Hold => Charge::hold(max.clone(), me.ttl),
        };
        charge.description = description.clone().unwrap_or_default();
        charge.reference = Some(id.clone());
        let rails = self.rail_offers(req, &charge).await?;
        let now = now_secs(&me.clock);
        let (amount, estimate, tolerance) = match price {
            Price::Fixed(m) => (Some(m.amount()), None, None),
            Price::Estimate {
                estimate,
                tolerance,
            } => (None, Some(estimate.amount()), Some(*tolerance)),
        };
        let quote = Quote {
            stipendex: Tag::current("quote"),
            id,
            receiver: me.party.clone(),
            iat: now,
            exp: now.saturating_add(me.ttl.as_secs().max(1)),
            profile,
            asset: max.asset().clone(),
            amount,
            estimate,
            tolerance,
            capability: Some(Capability {
                method: req.method.clone(),
                name: req.name.clone(),
            }),
            request: Some(req.digest()),
            resource: req.resource(),
            description,
            rails,
        };
        let signed = Signed::sign(quote, &me.key)?;
        me.quotes_signed.vouch(&signed);
        Ok(signed)
    }

    /// Accepts the Proof `proof` (compact JWS) for `req`: verifies it, checks that it pays this
    /// receiver's own unexpired Quote for this very request, and verifies the payment on its
    /// rail (which consumes it). Only after this may the request run.
    ///
    /// # Errors
    /// [`Error::Malformed`], [`Error::BadSignature`], [`Error::UnsupportedVersion`] (the
    /// Proof or its Quote); [`Error::Untrusted`] (a Quote this receiver did not sign);
    /// [`Error::Mismatch`] (another request); [`Error::Expired`]; [`Error::NotConfirmed`] (a
    /// checkout without the human's Confirmation); [`Error::QuoteUsed`] (a replay);
    /// [`Error::NoRail`]; [`Error::Payment`] (the rail refused the payment).
    pub async fn accept(&self, req: &Request, proof: &str) -> Result<Accepted, Error> {
        match self.admit(req, proof).await? {
            Admitted::Run(paying) => {
                let accepted = paying.accepted.clone();
                self.answered(*paying, None).await?;
                Ok(accepted)
            }
            Admitted::Answered { quote, .. } => Err(Error::QuoteUsed(quote)),
        }
    }

    /// Counts one costly offer (an invoice, a PaymentIntent) made outside a Quote for `client`
    /// (a ContextVM payment request, keyed by the client's Nostr key) against the same
    /// per-client limit as Quotes with costly offers, shared by the fleet through the store.
    ///
    /// # Errors
    /// [`Error::RateLimited`] past the limit, with when to retry.
    pub async fn admit_costly(&self, client: &str) -> Result<(), Error> {
        let me = &self.0;
        me.costly
            .admit(Some(client), me.clock.now().millis())
            .await
            .map_err(|wait_ms| {
                let retry_after = u64::try_from(wait_ms.saturating_add(999) / 1000).unwrap_or(60);
                Error::RateLimited {
                    why: format!(
                        "too many costly offers for this client now; retry in {retry_after} s"
                    ),
                    retry_after,
                }
            })
    }

    /// An offer of `charge` from every rail that can take it (its asset; in hold mode, a rail
    /// that holds and captures part of a hold), in the receiver's order; a rail whose offer
    /// fails drops out (logged), and only when every rail fails is the failure returned. Rails
    /// whose offers cost (`offers_cost`) are counted once per call against the client's limit.
    async fn rail_offers(&self, req: &Request, charge: &Charge) -> Result<Vec<RailOffer>, Error> {
        let me = &self.0;
        let (max, mode) = (&charge.amount, charge.mode);
        let mut rails = Vec::new();
        let mut failed = None;
        // Counted once per Quote, when a costly rail is about to offer.
        let mut costly: Option<Result<(), i64>> = None;
        for r in &me.rails {
            let caps = r.handle.receiver.capabilities();
            if caps.check_asset(max).is_err() || (mode == PaymentMode::Hold && !checkout_capable(r))
            {
                continue;
            }
            if r.handle.receiver.offers_cost() {
                if costly.is_none() {
                    costly = Some(
                        me.costly
                            .admit(req.client.as_deref(), me.clock.now().millis())
                            .await,
                    );
                }
                if matches!(costly, Some(Err(_))) {
                    tracing::debug!(rail = %r.name, client = ?req.client, "costly offers rate-limited for this client; quoting without the rail");
                    continue;
                }
            }
            // A rail that cannot make an offer now drops out of this Quote; the others stand.
            match r.handle.receiver.offer(charge).await {
                Ok(offer) => rails.push(RailOffer {
                    rail: offer.rail.as_str().to_owned(),
                    offer,
                }),
                Err(e) => {
                    tracing::warn!(rail = %r.name, error = %e, "a rail cannot offer now; quoting without it");
                    failed = Some(e);
                }
            }
        }
        if rails.is_empty()
            && let Some(Err(wait_ms)) = costly
        {
            let retry_after = u64::try_from(wait_ms.saturating_add(999) / 1000).unwrap_or(60);
            return Err(Error::RateLimited {
                why: format!(
                    "too many quotes with costly offers for this client now; retry in {retry_after} s"
                ),
                retry_after,
            });
        }
        if rails.is_empty()
            && let Some(e) = failed
        {
            return Err(Error::Payment(e));
        }
        if rails.is_empty() {
            return Err(Error::NoRail(format!(
                "no rail of receiver {} carries {}{}",
                me.party.id,
                max.asset(),
                if mode == PaymentMode::Hold {
                    " and can hold and capture part of a hold"
                } else {
                    ""
                }
            )));
        }
        Ok(rails)
    }

    /// Admits the Proof `proof` (compact JWS) for `req`, keeping its answer: as
    /// [`Receiver::accept`] for a new Proof ([`Admitted::Run`]: run the request, then
    /// [`Receiver::answered`] with its answer); the same Proof presented again for the same
    /// request after it was answered (its answer was lost on the way) is
    /// [`Admitted::Answered`] with the kept answer — not a second run, not a second charge.
    ///
    /// Call [`Receiver::deliver`] before the work runs: besides telling a first delivery from
    /// a repeat, its mark is the durable write that makes the presentation's claim and the
    /// rail's verdict durable (they are written through a deferred handle where the store has
    /// one; decision 0041).
    ///
    /// # Errors
    /// As [`Receiver::accept`]; [`Error::QuoteUsed`] also for a repeat whose answer is no
    /// longer kept ([`Receiver::present`] says so: [`Presented::Gone`]);
    /// [`Error::Payment`] with [`RailError::InProgress`] (retryable) while the first
    /// presentation still runs.
    pub async fn admit(&self, req: &Request, proof: &str) -> Result<Admitted, Error> {
        match self.present(req, proof).await? {
            Presented::Admitted(a) => Ok(a),
            Presented::Gone(g) => Err(Error::QuoteUsed(g.quote)),
        }
    }

    /// [`Receiver::admit`], telling a repeat whose kept answer is gone ([`Presented::Gone`]:
    /// too large to keep, dropped for the instance's bound on kept answers, or past the
    /// Quote's life and [`ANSWER_MARGIN`]) from a Quote used by another Proof.
    ///
    /// # Errors
    /// As [`Receiver::admit`].
    pub async fn present(&self, req: &Request, proof: &str) -> Result<Presented, Error> {
        let me = &self.0;
        let proof = Signed::<Proof>::parse(proof)?;
        let p = proof.object();
        let Some(quote_jws) = &p.quote_jws else {
            return Err(Error::Mismatch(
                "the proof pays an x402 challenge, not a Stipendex quote".into(),
            ));
        };
        // This receiver's own Quote, signed moments ago: not verified a second time.
        let quote = me.quotes_signed.parse::<Quote>(quote_jws)?;
        let q = quote.object();
        if q.receiver != me.party {
            return Err(Error::Untrusted(format!(
                "the proof pays a quote of {} ({}), not of this receiver",
                q.receiver.id, q.receiver.key
            )));
        }
        if q.request.as_ref().is_some_and(|d| d != &req.digest()) {
            return Err(Error::Mismatch(format!(
                "quote {} was for another request than {} {}",
                q.id, req.method, req.name
            )));
        }
        // An expired Quote's Proof is still taken to the rail within the grace: a payment
        // made while the Quote was live (its answer lost, or held for review) is honoured —
        // its money moved in time; the rail says when it was made (`verify_as`). A rail that
        // moves the money at verification refuses it: nothing moved.
        let now = now_secs(&me.clock);
        if now >= q.exp.saturating_add(rail_core::LATE_PROOF_GRACE.as_secs()) {
            return Err(Error::Expired {
                what: "quote",
                id: q.id.clone(),
                why: format!(
                    "it expired at {}, and it is {}: past the {} s a payment made in time is honoured; ask for a fresh quote",
                    rfc3339(q.exp),
                    rfc3339(now),
                    rail_core::LATE_PROOF_GRACE.as_secs()
                ),
            });
        }
        let confirmation = match &p.confirmation_jws {
            Some(jws) => {
                let c = Signed::<Confirmation>::parse(jws)?;
                let co = c.object();
                if co.wallet != p.wallet || &co.quote != quote.digest() || co.mandate != p.mandate {
                    return Err(Error::Mismatch(
                        "the confirmation is not the proof's wallet's, under its mandate, for this quote".into(),
                    ));
                }
                Some(c)
            }
            None => None,
        };
        if q.profile == Profile::Checkout {
            // Everything that would make the capture fail after the work is refused now.
            let Some(c) = &confirmation else {
                return Err(Error::NotConfirmed(format!(
                    "quote {} is a checkout: its proof must carry the human's confirmation",
                    q.id
                )));
            };
            let (consented, max) = (c.object().max()?, q.max()?);
            if consented.asset() != max.asset() || consented.amount() < max.amount() {
                return Err(Error::NotConfirmed(format!(
                    "the confirmation consents to {} {}, below quote {}'s {} {}: the human must confirm the quote's maximum",
                    consented.amount(),
                    consented.asset(),
                    q.id,
                    max.amount(),
                    max.asset()
                )));
            }
        }
        let Some(offer) = q.offer(&p.rail) else {
            return Err(Error::NoRail(format!(
                "the proof pays over {}, which quote {} does not accept",
                p.rail, q.id
            )));
        };
        let Some(rail) = me
            .rails
            .iter()
            .find(|r| r.handle.receiver.id().as_str() == p.rail)
        else {
            return Err(Error::NoRail(format!(
                "this receiver has no {} rail",
                p.rail
            )));
        };
        if q.profile == Profile::Checkout && !checkout_capable(rail) {
            return Err(Error::NoRail(format!(
                "quote {} is a checkout and this receiver's {} rail cannot hold and capture part of a hold",
                q.id, p.rail
            )));
        }
        let request = req.digest();
        // Refused by itself from the Quote's expiry plus the grace (above): a claim left in
        // flight is forgotten after that.
        let refused_in = Duration::from_secs(
            q.exp
                .saturating_add(rail_core::LATE_PROOF_GRACE.as_secs())
                .saturating_sub(now),
        );
        let (lease, recovered) = match me
            .answers
            .claim(&q.id, proof.digest().as_str(), request.as_str(), refused_in)
            .await?
        {
            answers::Use::Run { lease, recovered } => (lease, recovered),
            answers::Use::Answered(answer) => {
                tracing::info!(quote = %q.id, "the same proof again: its kept answer");
                return Ok(Presented::Admitted(Admitted::Answered {
                    quote: q.id.clone(),
                    answer,
                }));
            }
            answers::Use::Gone(gone) => {
                tracing::info!(quote = %q.id, "the same proof again: its answer is no longer kept (answer_gone)");
                return Ok(Presented::Gone(gone));
            }
            answers::Use::Used => return Err(Error::QuoteUsed(q.id.clone())),
        };
        // A claim recovered from a stopped presentation whose rail had answered: that verdict,
        // not the rail again (which would call its own consumed payment a replay).
        let kept = if recovered {
            match me
                .answers
                .recorded_verification(&q.id, proof.digest().as_str())
                .await
            {
                Ok(v) => v,
                Err(e) => {
                    me.answers.fail(lease, true).await;
                    return Err(e);
                }
            }
        } else {
            None
        };
        let verified = match kept {
            Some(v) => v,
            None => {
                // The rail's operation is this Proof's: a rail that keeps operations answers
                // a recovered verification the same, not `replayed`.
                let op = answers::verify_op(proof.digest().as_str())?;
                match lease
                    .keep_alive(rail.handle.receiver.verify_as(&op, offer, &p.payment))
                    .await
                {
                    Ok(v) => {
                        me.answers
                            .record_verification(&lease, &q.id, proof.digest().as_str(), &v)
                            .await;
                        v
                    }
                    Err(e) => {
                        me.answers.fail(lease, e.is_retryable()).await;
                        return Err(match e {
                            RailError::Replayed { .. } => Error::QuoteUsed(q.id.clone()),
                            RailError::OfferExpired {
                                offer_id,
                                expired_at,
                            } => Error::Expired {
                                what: "quote",
                                id: q.id.clone(),
                                why: format!(
                                    "it expired at {}, and it is {}; its payment was not made in time (offer {offer_id} expired at {}): ask for a fresh quote",
                                    rfc3339(q.exp),
                                    rfc3339(now),
                                    expired_at.rfc3339()
                                ),
                            },
                            e => Error::Payment(e),
                        });
                    }
                }
            }
        };
        tracing::info!(quote = %q.id, rail = %rail.name, amount = %verified.amount.amount(), "payment accepted");
        let rail = rail.name.clone();
        Ok(Presented::Admitted(Admitted::Run(Box::new(Paying {
            accepted: Accepted {
                rail,
                proof,
                quote,
                confirmation,
                verified,
            },
            lease,
            request: request.as_str().to_owned(),
        }))))
    }

    /// Hands the request admitted as `paying` to its work: [`Delivery::First`] the first time,
    /// [`Delivery::Again`] when an earlier presentation of the same Proof (here or at another
    /// instance sharing the store) already handed it over and stopped before its answer was
    /// kept. A binding runs the work again only for an idempotent request
    /// ([`idempotent`]); for any other it answers that the outcome is unknown (and keeps that
    /// answer), so the work runs at most once per Proof. Call it just before the work.
    ///
    /// # Errors
    /// [`Error::Storage`]: the store cannot say; do not run the work (the same Proof again
    /// recovers).
    pub async fn deliver(&self, paying: &Paying) -> Result<Delivery, Error> {
        let q = paying.accepted.quote.object();
        Ok(if self.0.answers.start(&q.id).await? {
            Delivery::First
        } else {
            tracing::warn!(quote = %q.id, "a paid request is presented again after an instance stopped before its answer");
            Delivery::Again
        })
    }

    /// The request admitted as `paying` was answered with `answer` (its status, body and
    /// Receipt; `None` to keep nothing): the answer is kept for a repeat of the same Proof,
    /// then the Proof is marked used.
    ///
    /// # Errors
    /// [`Error::Storage`] (the answer was still given; a repeat of the Proof recovers).
    pub async fn answered(&self, paying: Paying, answer: Option<&Answer>) -> Result<(), Error> {
        let me = &self.0;
        let q = paying.accepted.quote.object();
        let left = q.exp.saturating_sub(now_secs(&me.clock));
        let keep = Duration::from_secs(left).saturating_add(ANSWER_MARGIN);
        me.answers
            .keep(paying.lease, &q.id, &paying.request, answer, keep)
            .await
    }

    /// The request admitted as `paying` never reached its work (nothing was sent: a gateway's
    /// upstream refused the connection): nothing of it is kept, and its claim is released so
    /// that the same Proof again runs it as the first time — its rail's verdict is kept, so
    /// the payment is not asked for twice and not lost. A checkout's hold stays (the same Proof
    /// captures it, or it lapses).
    pub async fn undelivered(&self, paying: Paying) {
        let me = &self.0;
        let q = paying.accepted.quote.object();
        if let Err(e) = me.answers.unstart(&q.id).await {
            tracing::error!(quote = %q.id, error = %e, "could not clear an undelivered request's delivery mark; a repeat of its proof may be answered outcome_unknown");
        }
        tracing::info!(quote = %q.id, "a paid request never reached the service: its proof stays usable");
        me.answers.fail(paying.lease, true).await;
    }

    /// The Receipt of a service payment, after the work: the quoted amount, and the digest of
    /// `result` (the bytes delivered).
    ///
    /// # Errors
    /// [`Error::Mismatch`] for a checkout (use [`Receiver::capture`]).
    pub fn receipt(&self, accepted: &Accepted, result: &[u8]) -> Result<Signed<Receipt>, Error> {
        self.receipt_digest(accepted, Digest::of(result))
    }

    /// [`Receiver::receipt`] for a result whose digest is `result` (bytes hashed as they
    /// streamed by).
    ///
    /// # Errors
    /// As [`Receiver::receipt`].
    pub fn receipt_digest(
        &self,
        accepted: &Accepted,
        result: Digest,
    ) -> Result<Signed<Receipt>, Error> {
        if accepted.quote.object().profile != Profile::Service {
            return Err(Error::Mismatch(
                "a checkout is settled by capture, not by receipt".into(),
            ));
        }
        let amount = accepted.quote.object().max()?;
        self.sign_receipt(
            accepted,
            &amount,
            &accepted.verified.payment_ref,
            Some(result),
        )
    }

    /// Checkout: captures `final_amount` of the hold and signs the Receipt. The final amount is
    /// never above the Quote (estimate + tolerance) nor what the human confirmed (I3); the rest
    /// of the hold is released.
    ///
    /// # Errors
    /// [`Error::CaptureAbove`] (nothing captured); [`Error::NoRail`] if the rail cannot hold;
    /// [`Error::Payment`].
    pub async fn capture(
        &self,
        accepted: &Accepted,
        final_amount: &Money,
        result: &[u8],
    ) -> Result<(Captured, Signed<Receipt>), Error> {
        self.capture_digest(accepted, final_amount, Digest::of(result))
            .await
    }

    /// [`Receiver::capture`] for a result whose digest is `result`.
    ///
    /// # Errors
    /// As [`Receiver::capture`].
    pub async fn capture_digest(
        &self,
        accepted: &Accepted,
        final_amount: &Money,
        result: Digest,
    ) -> Result<(Captured, Signed<Receipt>), Error> {
        let q = accepted.quote.object();
        let mut ceilings = vec![("the quote", q.max()?)];
        if let Some(c) = &accepted.confirmation {
            ceilings.push(("the confirmation", c.object().max()?));
        }
        for (what, ceiling) in ceilings {
            if final_amount.asset() != ceiling.asset() || final_amount.amount() > ceiling.amount() {
                return Err(Error::CaptureAbove(format!(
                    "{} {} is above {what}'s {} {}",
                    final_amount.amount(),
                    final_amount.asset(),
                    ceiling.amount(),
                    ceiling.asset()
                )));
            }
        }
        let holds = self.hold_side(accepted)?;
        // The receiver's own id (its Quote's, paid once), never one the wallet chose.
        let op =
            OpId::new(format!("capture-{}", accepted.quote.object().id)).map_err(Error::Payment)?;
        let captured = holds
            .capture(&op, &accepted.verified, final_amount)
            .await
            .map_err(Error::Payment)?;
        let receipt =
            self.sign_receipt(accepted, final_amount, &captured.capture_ref, Some(result))?;
        Ok((captured, receipt))
    }

    /// After the work, whatever the profile: a service payment's Receipt ([`Receiver::receipt`]),
    /// or a checkout captured for `final_amount` — the estimate when the work named none —
    /// and its Receipt ([`Receiver::capture`]). What every binding calls once the work succeeded.
    ///
    /// # Errors
    /// As [`Receiver::receipt`] and [`Receiver::capture`].
    pub async fn settle(
        &self,
        accepted: &Accepted,
        final_amount: Option<Money>,
        result: &[u8],
    ) -> Result<Signed<Receipt>, Error> {
        self.settle_digest(accepted, final_amount, Digest::of(result))
            .await
    }

    /// [`Receiver::settle`] for a result whose digest is `result` (a body hashed as it was
    /// read, too large to hold in memory).
    ///
    /// # Errors
    /// As [`Receiver::settle`].
    pub async fn settle_digest(
        &self,
        accepted: &Accepted,
        final_amount: Option<Money>,
        result: Digest,
    ) -> Result<Signed<Receipt>, Error> {
        match accepted.quote.object().profile {
            Profile::Service => self.receipt_digest(accepted, result),
            Profile::Checkout => {
                let amount = match final_amount {
                    Some(m) => m,
                    None => accepted.quote.object().price()?,
                };
                self.capture_digest(accepted, &amount, result)
                    .await
                    .map(|(_, r)| r)
            }
        }
    }

    /// Gives the payment of `accepted` back, for work whose answer cannot be delivered: a
    /// hold is voided; a settled service payment is refunded in full where its rail refunds
    /// (under the receiver's own operation, `refund-<quote id>`, so a retry refunds once).
    /// `Ok(false)` when the rail cannot refund: the caller then leaves the Proof usable
    /// ([`Receiver::undelivered`]).
    ///
    /// # Errors
    /// [`Error::Payment`] (the rail refused or failed: nothing was given back).
    pub async fn give_back(&self, accepted: &Accepted) -> Result<bool, Error> {
        if matches!(
            accepted.verified.state,
            rail_core::PaymentState::Held { .. }
        ) {
            self.release(accepted).await?;
            return Ok(true);
        }
        let Some(refunds) = self
            .0
            .rails
            .iter()
            .find(|r| r.name == accepted.rail)
            .and_then(|r| r.handle.refunds.as_ref())
        else {
            return Ok(false);
        };
        let op =
            OpId::new(format!("refund-{}", accepted.quote.object().id)).map_err(Error::Payment)?;
        refunds
            .refund(
                &op,
                &accepted.verified.payment_ref,
                &accepted.verified.amount,
            )
            .await
            .map_err(Error::Payment)?;
        tracing::info!(quote = %accepted.quote.object().id, amount = %accepted.verified.amount, "an answer that could not be delivered: its payment was refunded");
        Ok(true)
    }

    /// The work failed after a checkout's hold: void it (a service payment is already settled;
    /// refunding it is the receiver's business, by its rail's refund).
    ///
    /// # Errors
    /// [`Error::Payment`].
    pub async fn release(&self, accepted: &Accepted) -> Result<(), Error> {
        if !matches!(
            accepted.verified.state,
            rail_core::PaymentState::Held { .. }
        ) {
            return Ok(());
        }
        let holds = self.hold_side(accepted)?;
        let op =
            OpId::new(format!("void-{}", accepted.quote.object().id)).map_err(Error::Payment)?;
        holds
            .void(&op, &accepted.verified)
            .await
            .map(|_| ())
            .map_err(Error::Payment)
    }

    fn hold_side(&self, accepted: &Accepted) -> Result<&Arc<dyn rail_core::HoldReceiver>, Error> {
        self.0
            .rails
            .iter()
            .find(|r| r.name == accepted.rail)
            .and_then(|r| r.handle.hold_receiver.as_ref())
            .ok_or_else(|| Error::NoRail(format!("rail {} cannot hold", accepted.rail)))
    }

    fn sign_receipt(
        &self,
        accepted: &Accepted,
        amount: &Money,
        reference: &str,
        result: Option<Digest>,
    ) -> Result<Signed<Receipt>, Error> {
        let me = &self.0;
        let receipt = Receipt {
            stipendex: Tag::current("receipt"),
            id: new_id("r_"),
            receiver: me.party.clone(),
            quote_id: accepted.quote.object().id.clone(),
            proof: accepted.proof.digest().clone(),
            iat: now_secs(&me.clock),
            asset: amount.asset().clone(),
            amount: amount.amount(),
            result,
            rail: accepted.proof.object().rail.clone(),
            reference: reference.to_owned(),
        };
        Signed::sign(receipt, &me.key)
    }
}
