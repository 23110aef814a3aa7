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

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use nostr::{Tag, TagKind};
use rail_core::Money;
use serde_json::{Map, Value, json};
use stipendex::receiver::{Decision, Price, PricedCapability, Receiver, Request};
use tokio::time::Instant;

use crate::Error;
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

/// A paid or pending authorization of one invocation (explicit gating).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Grant {
    /// A payment is being verified.
    Pending { until: Instant },
    /// Paid: the next matching invocation runs.
    Paid { until: Instant },
}

/// The explicit-gating authorizations, by client and canonical invocation (in memory: a
/// restart forgets them, and a paid but unclaimed invocation is asked for again — documented).
#[derive(Debug, Default)]
struct Grants(Mutex<HashMap<[u8; 32], Grant>>);

impl Grants {
    fn lock(&self) -> MutexGuard<'_, HashMap<[u8; 32], Grant>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

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

    /// Waits until `pending` is paid (then returns the `_meta` of `payment_accepted`) or
    /// `deadline` passes. A payment is accepted once: a second check of the same payment is
    /// refused.
    ///
    /// # Errors
    /// [`Error::Payment`] when it is not paid in time or its evidence does not hold.
    async fn verify(
        &self,
        pending: &Pending,
        deadline: Instant,
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
    pending: AtomicUsize,
    interaction: Interaction,
    grants: Arc<Grants>,
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
            .finish_non_exhaustive()
    }
}

/// Decrements the pending count however an admission ends.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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
        Ok(ServerPayments {
            receiver,
            processors,
            ttl: Duration::from_secs(300),
            max_pending: 1000,
            pending: AtomicUsize::new(0),
            interaction: Interaction::Optional,
            grants: Arc::new(Grants::default()),
        })
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

    /// The most payments waiting at once (default 1 000); beyond, a priced request is answered
    /// with an error before any payment request is made.
    #[must_use]
    pub fn max_pending(mut self, n: usize) -> Self {
        self.max_pending = n;
        self
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
    /// while a task verifies the payment and, once it holds, records one paid authorization
    /// for this client and invocation (until the TTL).
    fn gate(
        &self,
        identity: [u8; 32],
        processor: Arc<dyn Processor>,
        pending: Pending,
        deadline: Instant,
    ) -> Admission {
        {
            let mut grants = self.grants.lock();
            if grants.len() >= self.max_pending {
                return error("too many payments pending; retry later");
            }
            grants.insert(identity, Grant::Pending { until: deadline });
        }
        let grants = self.grants.clone();
        let option = pending.required.clone();
        // An unclaimed paid authorization is kept as long as a payment request lives.
        let keep = self.ttl;
        tokio::spawn(async move {
            let verified = processor.verify(&pending, deadline).await;
            let mut g = grants.lock();
            match verified {
                Ok(_) => {
                    g.insert(
                        identity,
                        Grant::Paid {
                            until: Instant::now() + keep,
                        },
                    );
                }
                Err(e) => {
                    tracing::info!(error = %e, "contextvm payments: explicit gating, not paid");
                    g.remove(&identity);
                }
            }
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
    fn holds(&self, request: &Value) -> bool {
        request_of(request).is_some_and(|r| self.receiver.decide(&r).is_some())
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
        let Some(cap) = self.receiver.decide(&req) else {
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
            let mut grants = self.grants.lock();
            grants.retain(|_, g| match g {
                Grant::Pending { until } | Grant::Paid { until } => *until > now,
            });
            match grants.get(&identity).copied() {
                // Claimed atomically under the lock: one payment, one run.
                Some(Grant::Paid { .. }) => {
                    grants.remove(&identity);
                    return Admission::Forward;
                }
                Some(Grant::Pending { .. }) => {
                    return Admission::Answer(json!({
                        "code": PAYMENT_PENDING,
                        "message": "Payment Pending",
                        "data": {
                            "instructions": "Payment is still being processed. Retry the same request later with exactly the same method and params.",
                            "retry_after": RETRY_AFTER,
                        },
                    }));
                }
                None => {}
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
        if self.pending.fetch_add(1, Ordering::SeqCst) >= self.max_pending {
            self.pending.fetch_sub(1, Ordering::SeqCst);
            return error("too many payments pending; retry later");
        }
        let slot = Slot(&self.pending);
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
        let deadline = Instant::now() + ttl;
        if explicit {
            drop(slot);
            return self.gate(identity, processor, pending, deadline);
        }
        notify(&notifier, Notification::Required(pending.required.clone())).await;
        match processor.verify(&pending, deadline).await {
            Ok(meta) => {
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
                tracing::info!(error = %e, "contextvm payments: not paid");
                notify(
                    &notifier,
                    Notification::Rejected(PaymentRejected {
                        pmi: pending.required.pmi.clone(),
                        amount: Some(pending.required.amount),
                        message: Some(format!("not paid: {e}")),
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
