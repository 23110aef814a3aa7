//! CEP-8 on the server: [`ServerPayments`], the [`Middleware`] that holds each priced request
//! until its payment is seen, and the [`Processor`]s that make and check payment requests, one
//! per payment method identifier (PMI).
//!
//! What is priced, and at what price, is the Stipendex [`Receiver`]'s: its priced capabilities
//! (method + name, the one pattern syntax of every gate, explicit wildcards such as
//! `private://*`), [`Receiver::decide`] and its `resolve_price` hook ([`Receiver::resolve`]) —
//! the same decisions the HTTP binding and the MCP gate make, never a copy. The lifecycle is the
//! SDK 0.11.14's transparent one (`docs/research/contextvm-sdk-0.11.14.md` §3.4):
//!
//! 1. a request no capability prices goes straight to the MCP server;
//! 2. the processor is the first of the client's PMIs (its `pmi` tags, in its order) that a
//!    processor handles, else the first processor;
//! 3. the hook *rejects* → `payment_rejected` (with the list price) and no answer: no payment
//!    request is made, no processor is called; it *waives* → forwarded at once;
//! 4. it *quotes* → the processor makes a payment request → `payment_required` → the processor
//!    checks the payment (its own way: Lightning by the server's own wallet, never the payer's
//!    word) until the request's TTL → `payment_accepted` → forwarded, once. A payment not seen
//!    in time → `payment_rejected` ("not paid in time") and no answer.
//!
//! The same request event is admitted once: its id is the transport's de-duplication key, and a
//! payment is used once by the processor's single-use guard.
//!
//! What unpaid requests can make the server hold and make is bounded (issue 47; the reasoning
//! is in `payments/limits.rs`): at most [`ServerPayments::max_pending`] pending payments, at
//! most [`ServerPayments::max_pending_per_client`] unpaid ones per client key; payment requests
//! whose offers cost something (an invoice at the shop's wallet) at most
//! [`ServerPayments::payment_requests_per_client`] per client key — the receiver's costly-offer
//! limit, as HTTP Quotes are — and every payment request within
//! [`ServerPayments::payment_requests`] for the whole server. A client asking for the same
//! invocation again replaces its own unpaid payment; a full server withdraws the oldest unpaid
//! payment of the client with the most (never a paid one), telling that client
//! `payment_rejected`. A limit that refuses is answered `-32000` before any payment request is
//! made, with `data.retry_after` (seconds) for a rate.
//!
//! A withdrawn payment request is no longer *waited* for, but a payment already seen is still
//! accepted and served. Lightning cannot take back an ordinary invoice: a payer that pays one
//! after it was withdrawn (after `payment_rejected`) has paid for nothing. That is why the
//! server-wide rate keeps an unpaid payment for at least `(max_pending - burst) / rate` under
//! any flood (about 90 s by default), and the client with the most unpaid payments loses one
//! first.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use nostr::{Tag, TagKind};
use rail_core::Money;
use serde_json::{Map, Value, json};
use stipendex::receiver::{Decision, Price, PricedCapability, Receiver, Request};
use tokio::time::Instant;

use crate::Error;
pub use crate::payments::deadline::Deadline;
use crate::payments::limits::{RateLimited, Rates, Refused, Stage, Table};
use crate::payments::notify::{Notification, PaymentAccepted, PaymentRejected, PaymentRequired};
use crate::transport::server::{Admission, Held, Middleware, Notifier};

/// The JSON-RPC error code of a request the server cannot take a payment for (no processor for
/// the price, too many payments pending): `-32000`, as the SDK uses for payment errors.
pub const PAYMENT_ERROR: i64 = -32000;
/// Explicit gating: the invocation needs a payment (`error.data.payment_options`).
pub const PAYMENT_REQUIRED: i64 = -32042;
/// Explicit gating: a payment for the same invocation is being verified
/// (`error.data.retry_after`, seconds).
pub const PAYMENT_PENDING: i64 = -32043;
/// Explicit gating asked of a server that does not accept it (`-32602 Invalid params`, with
/// `data {requested, supported}`).
pub const UNSUPPORTED_INTERACTION: i64 = -32602;
/// CEP-8's default lifecycle: the request waits while the payment is made.
pub const TRANSPARENT: &str = "transparent";
/// CEP-8's opt-in lifecycle: a priced invocation is answered `-32042 Payment Required`, and a
/// repeat of the same invocation after payment runs.
pub const EXPLICIT_GATING: &str = "explicit_gating";
/// How long a client is told to wait before repeating a pending invocation (seconds).
const RETRY_AFTER: u64 = 2;

/// Which payment lifecycles a server accepts for a session (CEP-8 `payment_interaction`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Interaction {
    /// Transparent by default, explicit gating for a client that asks for it.
    #[default]
    Optional,
    /// Transparent only: a client asking for explicit gating gets `-32602` on its priced
    /// invocations (never a silent fallback).
    Transparent,
}

/// The default most unpaid payments one client key holds at once.
pub const DEFAULT_PENDING_PER_CLIENT: usize = 8;
/// The default rate of payment requests for the whole server: 100 at once, refilled over
/// 10 s (10 a second).
pub const DEFAULT_PAYMENT_REQUESTS: (u32, Duration) = (100, Duration::from_secs(10));

/// The canonical invocation identity of explicit gating: SHA-256 over the client's key and the
/// invocation's `{method, params}` as JSON with sorted keys, without `params._meta` (a retry's
/// progress token differs) and without the JSON-RPC id (CEP-8 "Explicit gating authorization
/// identity"). Server-side only: it never goes on the wire.
#[must_use]
pub fn invocation_identity(client: &nostr::PublicKey, message: &Value) -> [u8; 32] {
    use sha2::Digest as _;
    let mut params = message.get("params").cloned().unwrap_or(Value::Null);
    if let Some(p) = params.as_object_mut() {
        p.remove("_meta");
    }
    let method = message.get("method").cloned().unwrap_or(Value::Null);
    // serde_json's map is a BTreeMap here (no `preserve_order`): keys come out sorted.
    let canonical = json!({"method": method, "params": params}).to_string();
    let mut h = sha2::Sha256::new();
    h.update(client.to_bytes());
    h.update(canonical.as_bytes());
    h.finalize().into()
}

/// A payment request made for one request, and what the processor needs to check it.
#[derive(Clone, Debug, PartialEq)]
pub struct Pending {
    /// What goes to the client in `payment_required`.
    pub required: PaymentRequired,
    /// The processor's own record of it (an offer).
    pub state: Value,
}

/// Makes and checks the payment requests of one payment method.
#[async_trait]
pub trait Processor: Send + Sync + 'static {
    /// The payment method identifier (`bitcoin-lightning-bolt11`).
    fn pmi(&self) -> &str;

    /// The unit CEP-8 amounts of this method are in (`sats`), for the `cap` tags.
    fn unit(&self) -> &str;

    /// `price` in this method's unit, exactly.
    ///
    /// # Errors
    /// [`Error::Refused`] for an asset this method does not carry or an amount it cannot
    /// express exactly (never rounded).
    fn amount(&self, price: &Money) -> Result<u64, Error>;

    /// A payment request for `price` (the request `held`), payable for `ttl`.
    ///
    /// # Errors
    /// [`Error::Payment`] when it cannot be made.
    async fn require(
        &self,
        price: &Money,
        description: Option<&str>,
        ttl: Duration,
        held: &Held,
    ) -> Result<Pending, Error>;

    /// Whether each payment request is an object elsewhere that costs to make (an invoice at
    /// the shop's wallet): then it is counted against the client's costly-offer limit before it
    /// is made. `false` for a method whose requests are counted by the receiver itself (the
    /// `stipendex` method's Quotes). Default `true`.
    fn offers_cost(&self) -> bool {
        true
    }

    /// Waits until `pending` is paid (then returns the `_meta` of `payment_accepted`) or
    /// `deadline` is reached ([`Deadline::reached`]: its time, or the server withdrew the
    /// payment request). Only the *waiting* stops at a withdrawal: a payment already seen is
    /// checked and accepted. A payment is accepted once: a second check of the same payment is
    /// refused.
    ///
    /// # Errors
    /// [`Error::Payment`] when it is not paid in time or its evidence does not hold.
    async fn verify(
        &self,
        pending: &Pending,
        deadline: &Deadline,
    ) -> Result<Option<Map<String, Value>>, Error>;

    /// A notification from `client` about its request `request`: `true` if it is this
    /// method's settlement message (the Stipendex method's Proof) and was taken.
    fn delivered(
        &self,
        client: &nostr::PublicKey,
        request: nostr::EventId,
        message: &Value,
    ) -> bool {
        let _ = (client, request, message);
        false
    }

    /// The answer to a request this processor admitted, before it is sent: settle, and add
    /// what the client should keep (a Receipt).
    async fn answered(&self, request: nostr::EventId, message: &mut Value) {
        let _ = (request, message);
    }
}

/// CEP-8 payments for a ContextVM server (see the module's documentation).
pub struct ServerPayments {
    receiver: Receiver,
    processors: Vec<Arc<dyn Processor>>,
    ttl: Duration,
    max_pending: usize,
    per_client: usize,
    client_rate: (u32, Duration),
    server_rate: (u32, Duration),
    interaction: Interaction,
    /// The pending payments (unpaid, paid and being forwarded, explicit gating's
    /// authorizations): at most `max_pending`.
    table: Arc<Mutex<Table>>,
    rates: Rates,
}

impl std::fmt::Debug for ServerPayments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerPayments")
            .field("receiver", &self.receiver)
            .field(
                "processors",
                &self
                    .processors
                    .iter()
                    .map(|p| p.pmi().to_owned())
                    .collect::<Vec<_>>(),
            )
            .field("ttl", &self.ttl)
            .field("max_pending", &self.max_pending)
            .field("max_pending_per_client", &self.per_client)
            .field("payment_requests_per_client", &self.client_rate)
            .field("payment_requests", &self.server_rate)
            .finish_non_exhaustive()
    }
}

fn lock(table: &Mutex<Table>) -> MutexGuard<'_, Table> {
    table
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// One entry of the pending payments, held by its admission: it goes however the admission
/// ends, unless it became an explicit gating authorization.
struct Slot {
    table: Arc<Mutex<Table>>,
    seq: u64,
}

impl Slot {
    fn paid(&self) {
        lock(&self.table).paid(self.seq);
    }

    /// Paid: one run of `identity` by `client` until `until` — kept even if the slot was
    /// withdrawn meanwhile (a payment seen is never lost).
    fn grant(&self, client: nostr::PublicKey, identity: [u8; 32], until: Instant) {
        lock(&self.table).grant(self.seq, client, identity, until);
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.table).finish(self.seq);
    }
}

impl ServerPayments {
    /// Payments for what `receiver` prices, through `processors` (the first is the default).
    ///
    /// # Errors
    /// [`Error::Refused`] without a processor.
    pub fn new(receiver: Receiver, processors: Vec<Arc<dyn Processor>>) -> Result<Self, Error> {
        if processors.is_empty() {
            return Err(Error::Refused("CEP-8 payments need a processor".into()));
        }
        let mut p = ServerPayments {
            receiver,
            processors,
            ttl: Duration::from_secs(300),
            max_pending: 1000,
            per_client: DEFAULT_PENDING_PER_CLIENT,
            client_rate: stipendex::receiver::DEFAULT_COSTLY_QUOTES,
            server_rate: DEFAULT_PAYMENT_REQUESTS,
            interaction: Interaction::Optional,
            table: Arc::new(Mutex::new(Table::new(0, 0))),
            rates: Rates::new((1, Duration::ZERO), (1, Duration::ZERO)),
        };
        p.rebuild();
        Ok(p)
    }

    /// The table and the rates for the limits set (the builder's methods call it).
    fn rebuild(&mut self) {
        self.table = Arc::new(Mutex::new(Table::new(self.max_pending, self.per_client)));
        self.rates = Rates::new(self.client_rate, self.server_rate);
    }

    /// Which lifecycles a session may have (default [`Interaction::Optional`]).
    #[must_use]
    pub fn interaction(mut self, interaction: Interaction) -> Self {
        self.interaction = interaction;
        self
    }

    /// How long a payment request stays payable (default 300 s, the SDK's).
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The most pending payments at once, all clients together (default 1 000; at least 1).
    /// When full, a new payment request takes the slot of the oldest unpaid payment of the
    /// client with the most unpaid payments (that client is told `payment_rejected`); only when
    /// every slot holds a paid payment is a priced request answered with an error, before any
    /// payment request is made. With [`ServerPayments::payment_requests`] it sets how long an
    /// unpaid payment is kept under a flood: at least `(max_pending - burst) / rate`.
    #[must_use]
    pub fn max_pending(mut self, n: usize) -> Self {
        self.max_pending = n;
        self.rebuild();
        self
    }

    /// The most unpaid payments one client key holds at once (default
    /// [`DEFAULT_PENDING_PER_CLIENT`]; at least 1); beyond, its priced requests are answered
    /// with an error before any payment request is made. The same invocation asked again
    /// replaces the client's own unpaid payment for it instead.
    #[must_use]
    pub fn max_pending_per_client(mut self, n: usize) -> Self {
        self.per_client = n;
        self.rebuild();
        self
    }

    /// How many payment requests whose offers cost something (an invoice at the shop's wallet;
    /// [`Processor::offers_cost`]) one client key gets per window (default
    /// [`stipendex::receiver::DEFAULT_COSTLY_QUOTES`], the receiver's: 60 a minute). Set it to
    /// the receiver's own `costly_quotes_per_client`: this is that limit, for payment requests
    /// made without a Quote.
    #[must_use]
    pub fn payment_requests_per_client(mut self, max: u32, per: Duration) -> Self {
        self.client_rate = (max, per);
        self.rebuild();
        self
    }

    /// How many payment requests the whole server makes: up to `max` at once, refilled at
    /// `max` per `per` (default [`DEFAULT_PAYMENT_REQUESTS`]: 100 at once, 10 a second). New
    /// Nostr keys are free, so this — not the per-client limits — is what bounds the invoices
    /// a crowd of throwaway keys makes the shop's wallet create, and how fast it can turn the
    /// pending payments over.
    #[must_use]
    pub fn payment_requests(mut self, max: u32, per: Duration) -> Self {
        self.server_rate = (max, per);
        self.rebuild();
        self
    }

    /// How many pending payments the server holds (unpaid, paid and being forwarded, and
    /// explicit gating's authorizations not yet claimed).
    #[must_use]
    pub fn pending(&self) -> usize {
        lock(&self.table).len()
    }

    /// How many of them are `client`'s.
    #[must_use]
    pub fn pending_for(&self, client: &nostr::PublicKey) -> usize {
        lock(&self.table).len_of(client)
    }

    /// The receiver whose prices this applies.
    #[must_use]
    pub fn receiver(&self) -> &Receiver {
        &self.receiver
    }

    fn processor_for(&self, pmis: &[String]) -> Option<&Arc<dyn Processor>> {
        pmis.iter()
            .find_map(|p| self.processors.iter().find(|x| x.pmi() == p))
            .or_else(|| self.processors.first())
    }
}

impl ServerPayments {
    /// Explicit gating's answer to an unpaid invocation: `-32042` with the payment option,
    /// while a task verifies the payment and, once it holds, turns the slot into one paid
    /// authorization for this client and invocation (until the TTL).
    fn gate(
        &self,
        client: nostr::PublicKey,
        identity: [u8; 32],
        slot: Slot,
        processor: Arc<dyn Processor>,
        pending: Pending,
        deadline: Deadline,
    ) -> Admission {
        let option = pending.required.clone();
        // An unclaimed paid authorization is kept as long as a payment request lives.
        let keep = self.ttl;
        tokio::spawn(async move {
            match processor.verify(&pending, &deadline).await {
                Ok(_) => {
                    slot.grant(client, identity, Instant::now() + keep);
                }
                Err(e) => {
                    tracing::info!(error = %e, withdrawn = deadline.released(), "contextvm payments: explicit gating, not paid");
                }
            }
            drop(slot);
        });
        Admission::Answer(json!({
            "code": PAYMENT_REQUIRED,
            "message": "Payment Required",
            "data": {
                "instructions": "Pay one of the offered payment options, then repeat the same request with exactly the same method and params.",
                "payment_options": [option],
            },
        }))
    }
}

/// The answer to a request a limit refused, before any payment request was made.
fn refused(why: Refused) -> Admission {
    match why {
        Refused::ClientFull => error(
            "too many payments pending for this client: pay one or let one expire before asking for another",
        ),
        Refused::Full => error("too many payments pending; retry later"),
    }
}

/// The answer to a request a rate refused, with when to retry (`data.retry_after`, seconds).
fn rate_limited(why: RateLimited) -> Admission {
    let (whose, wait) = match why {
        RateLimited::Client(w) => (" from this client", w),
        RateLimited::Server(w) => ("", w),
    };
    let secs = wait
        .as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0));
    Admission::Answer(json!({
        "code": PAYMENT_ERROR,
        "message": format!("too many payment requests{whose} now; retry in {secs} s"),
        "data": {"retry_after": secs},
    }))
}

/// The Stipendex request an MCP request is (method, tool or prompt name or resource URI,
/// arguments — absent arguments are the empty object, as in the MCP binding), or `None` for a
/// method CEP-8 does not price.
#[must_use]
pub fn request_of(message: &Value) -> Option<Request> {
    let method = message.get("method").and_then(Value::as_str)?;
    let key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return None,
    };
    let name = message
        .pointer(&format!("/params/{key}"))
        .and_then(Value::as_str)?;
    let args = message
        .pointer("/params/arguments")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    Some(Request::new(method, name).with_params(Value::Object(args)))
}

/// The `cap` tag of a priced capability (`["cap", "tool:search", "10", "sats"]`), as the SDK
/// writes it (`docs/research/contextvm-sdk-0.11.14.md` §3.3); `None` for a method CEP-8 does
/// not name or a price the unit cannot express.
fn cap_tag(cap: &PricedCapability, p: &dyn Processor) -> Option<Tag> {
    let kind = match cap.method() {
        "tools/call" => "tool",
        "prompts/get" => "prompt",
        "resources/read" => "resource",
        _ => return None,
    };
    let price = match &cap.price {
        Price::Fixed(m) => p.amount(m).ok()?.to_string(),
        Price::Estimate { .. } => {
            let max = cap.price.max().ok()?;
            let Price::Estimate { estimate, .. } = &cap.price else {
                return None;
            };
            format!("{}-{}", p.amount(estimate).ok()?, p.amount(&max).ok()?)
        }
    };
    Some(Tag::custom(
        TagKind::custom("cap"),
        [format!("{kind}:{}", cap.name()), price, p.unit().to_owned()],
    ))
}

fn error(message: impl Into<String>) -> Admission {
    Admission::Answer(json!({"code": PAYMENT_ERROR, "message": message.into()}))
}

async fn notify(notifier: &Notifier, n: Notification) {
    match n.to_json_rpc() {
        Ok(m) => {
            if let Err(e) = notifier.notify(&m).await {
                tracing::warn!(error = %e, "contextvm payments: a notification was not published");
            }
        }
        Err(e) => tracing::warn!(error = %e, "contextvm payments: a notification was not built"),
    }
}

#[async_trait]
impl Middleware for ServerPayments {
    /// The position of the request's priced capability: the receiver's one decision, read
    /// again by `admit`.
    fn holds(&self, request: &Value) -> Option<usize> {
        self.receiver.decide_position(&request_of(request)?)
    }

    async fn admit(&self, held: Held, notifier: Notifier) -> Admission {
        let explicit = match held.interaction.as_deref() {
            None | Some(TRANSPARENT) => false,
            Some(EXPLICIT_GATING) if self.interaction == Interaction::Optional => true,
            Some(other) => {
                let supported = match self.interaction {
                    Interaction::Optional => vec![TRANSPARENT, EXPLICIT_GATING],
                    Interaction::Transparent => vec![TRANSPARENT],
                };
                return Admission::Answer(json!({
                    "code": UNSUPPORTED_INTERACTION,
                    "message": "Unsupported payment_interaction",
                    "data": {"requested": other, "supported": supported},
                }));
            }
        };
        let Some(mut req) = request_of(&held.message) else {
            return Admission::Forward;
        };
        req.client = Some(held.client.to_hex());
        let Some(cap) = self.receiver.capabilities().get(held.hold) else {
            return Admission::Forward;
        };
        // The receiver's one guard: no payment is asked for, nor taken, while the work cannot
        // be done.
        if let Err(e) = self.receiver.guard().await {
            return error(e.to_string());
        }
        let Some(processor) = self.processor_for(&held.pmis).cloned() else {
            return error("no payment processor");
        };
        let identity = invocation_identity(&held.client, &held.message);
        if explicit {
            let now = Instant::now();
            let mut table = lock(&self.table);
            table.sweep(now);
            // Claimed atomically under the lock: one payment, one run.
            if table.claim(&identity, now) {
                return Admission::Forward;
            }
            if table.stage_of(&identity) == Some(Stage::Unpaid) {
                return Admission::Answer(json!({
                    "code": PAYMENT_PENDING,
                    "message": "Payment Pending",
                    "data": {
                        "instructions": "Payment is still being processed. Retry the same request later with exactly the same method and params.",
                        "retry_after": RETRY_AFTER,
                    },
                }));
            }
        }
        let (price, description, meta) = match self.receiver.resolve(cap, &req).await {
            Decision::Waive => return Admission::Forward,
            Decision::Reject { message } => {
                if explicit {
                    return error(format!("Payment rejected: {message}"));
                }
                let amount = cap.price.max().ok().and_then(|m| processor.amount(&m).ok());
                notify(
                    &notifier,
                    Notification::Rejected(PaymentRejected {
                        pmi: processor.pmi().to_owned(),
                        amount,
                        message: Some(message),
                    }),
                )
                .await;
                return Admission::Drop;
            }
            Decision::Quote {
                price,
                description,
                meta,
            } => (price, description.or_else(|| cap.description.clone()), meta),
        };
        let Price::Fixed(price) = price else {
            return error(format!(
                "{} {} is priced by estimate; CEP-8 payments are of a fixed amount",
                cap.method(),
                cap.name()
            ));
        };
        // The client's share first: refusing it spends nothing.
        if let Err(why) = lock(&self.table).admits(&held.client, &identity) {
            tracing::info!(client = %held.client, "contextvm payments: the client holds its share of pending payments");
            return refused(why);
        }
        if let Err(why) = self
            .rates
            .admit(&held.client, processor.offers_cost(), Instant::now())
        {
            tracing::info!(client = %held.client, ?why, "contextvm payments: payment requests rate-limited");
            return rate_limited(why);
        }
        // The receiver's own costly-offer limit, the one its HTTP Quotes count against (shared
        // by the fleet through its store): an invoice is a costly offer like any other.
        if processor.offers_cost()
            && let Err(stipendex::Error::RateLimited { retry_after, .. }) =
                self.receiver.admit_costly(&held.client.to_hex()).await
        {
            tracing::info!(client = %held.client, "contextvm payments: costly offers rate-limited by the receiver");
            return rate_limited(RateLimited::Client(Duration::from_secs(retry_after)));
        }
        let now = Instant::now();
        let reserved = match lock(&self.table).reserve(held.client, identity, now + self.ttl, now) {
            Ok(r) => r,
            Err(why) => return refused(why),
        };
        if reserved.withdrawn > 0 {
            tracing::debug!(client = %held.client, withdrawn = reserved.withdrawn, "contextvm payments: unpaid payments withdrawn for a new one");
        }
        let slot = Slot {
            table: self.table.clone(),
            seq: reserved.seq,
        };
        let pending = match processor
            .require(&price, description.as_deref(), self.ttl, &held)
            .await
        {
            // The hook's `meta` over the processor's own keys (the SDK: `{...processor._meta,
            // ...quote.meta}`, under `_meta`).
            Ok(mut p) => {
                if let Some(meta) = meta {
                    p.required.meta.get_or_insert_with(Map::new).extend(meta);
                }
                p
            }
            Err(e) => {
                tracing::warn!(error = %e, pmi = processor.pmi(), "contextvm payments: no payment request");
                return error(format!("no payment request could be made: {e}"));
            }
        };
        let ttl = pending
            .required
            .ttl
            .map_or(self.ttl, Duration::from_secs)
            .min(self.ttl);
        let deadline = reserved.deadline.until(Instant::now() + ttl);
        if explicit {
            return self.gate(held.client, identity, slot, processor, pending, deadline);
        }
        notify(&notifier, Notification::Required(pending.required.clone())).await;
        match processor.verify(&pending, &deadline).await {
            Ok(meta) => {
                slot.paid();
                notify(
                    &notifier,
                    Notification::Accepted(PaymentAccepted {
                        amount: pending.required.amount,
                        pmi: pending.required.pmi.clone(),
                        meta,
                    }),
                )
                .await;
                Admission::Forward
            }
            Err(e) => {
                let message = if deadline.released() {
                    tracing::info!(client = %held.client, "contextvm payments: a payment request withdrawn unpaid");
                    "not paid: the payment request was withdrawn (the same call was asked again, or the server had too many payments pending)".to_owned()
                } else {
                    tracing::info!(error = %e, "contextvm payments: not paid");
                    format!("not paid: {e}")
                };
                drop(slot);
                notify(
                    &notifier,
                    Notification::Rejected(PaymentRejected {
                        pmi: pending.required.pmi.clone(),
                        amount: Some(pending.required.amount),
                        message: Some(message),
                    }),
                )
                .await;
                Admission::Drop
            }
        }
    }

    fn notified(
        &self,
        client: &nostr::PublicKey,
        request: nostr::EventId,
        message: &Value,
    ) -> bool {
        self.processors
            .iter()
            .any(|p| p.delivered(client, request, message))
    }

    async fn answering(
        &self,
        _client: nostr::PublicKey,
        request: nostr::EventId,
        message: &mut Value,
    ) {
        for p in &self.processors {
            p.answered(request, message).await;
        }
    }

    fn common_tags(&self, interaction: Option<&str>) -> Vec<Tag> {
        let mut tags: Vec<Tag> = self
            .processors
            .iter()
            .map(|p| crate::transport::wire::pmi_tag(p.pmi()))
            .collect();
        // The effective lifecycle, disclosed on the first answer when the client asked.
        let effective = match interaction {
            None => None,
            Some(EXPLICIT_GATING) if self.interaction == Interaction::Optional => {
                Some(EXPLICIT_GATING)
            }
            Some(_) => Some(TRANSPARENT),
        };
        if let Some(mode) = effective {
            tags.push(Tag::custom(
                TagKind::custom(crate::transport::wire::PAYMENT_INTERACTION),
                [mode],
            ));
        }
        tags
    }

    fn list_tags(&self) -> Vec<Tag> {
        let Some(p) = self.processors.first() else {
            return Vec::new();
        };
        self.receiver
            .capabilities()
            .iter()
            .filter_map(|c| cap_tag(c, p.as_ref()))
            .collect()
    }
}
