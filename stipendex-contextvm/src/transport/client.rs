//! The client transport: an rmcp client's messages to one ContextVM server over Nostr, as the
//! ContextVM SDK 0.11.14's `NostrClientTransport` writes and reads them
//! (`docs/research/contextvm-sdk-0.11.14.md` §1.3–1.5, §3.5):
//!
//! - each request is a kind 25910 event to the server (gift-wrapped by default: kind 21059 once
//!   the server said it reads ephemeral wraps, else 1059), the first one with the client's
//!   capability tags, every one with a `pmi` tag per payment method the client handles;
//! - an answer is matched by its `e` tag to the request's event id and given back to rmcp with
//!   the request's own id; an answer or a notification about a request this client did not
//!   send is dropped, and so is anything not signed by the server's key;
//! - CEP-8's `payment_required` about a pending request goes to the [`PaymentHook`]; a declined
//!   payment or the server's `payment_rejected` ends the request with a JSON-RPC error
//!   (`-32000`, as the SDK's client synthesises it).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use nostr::{Event, EventId, Keys, Kind, PublicKey, Tag, Timestamp};
use nostr_sdk::Filter;
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::Encryption;
use super::relay::{RelaySettings, Relays};
use super::wire::{self, Wrap};
use crate::Error;
use crate::payments::notify::{self, Notification, PaymentRequired};

/// How many messages wait for the rmcp client.
const QUEUE: usize = 256;
/// How many distinct payment requests one request may be asked to pay; more are ignored
/// (logged): a server cannot make the handler pay without end for one call.
const MAX_PAY_REQS: usize = 4;

/// How the client reaches its server.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// The relays (`ws://` or `wss://`).
    pub relays: Vec<String>,
    /// The server's key.
    pub server: PublicKey,
    /// Default [`Encryption::Optional`]: every message gift-wrapped, plain answers read.
    pub encryption: Encryption,
    /// Relay timeouts.
    pub relay: RelaySettings,
    /// The payment lifecycle to ask for (CEP-8 `payment_interaction` on the first message):
    /// `None` is transparent; `Some("explicit_gating")` makes a priced call answer
    /// `-32042 Payment Required` (the caller pays and repeats the call), and then no
    /// transparent payment request is ever paid automatically in this session.
    pub interaction: Option<String>,
    /// A request unanswered this long is sent again — the same signed request in a fresh
    /// wrap, so the server knows it for a retry: it sends its answer again if it has one (the
    /// answer was lost) and never runs or charges it twice. Default 10 s; `None`: never.
    pub resend_after: Option<std::time::Duration>,
}

impl ClientOptions {
    /// Options to reach `server` on `relays`.
    #[must_use]
    pub fn new(relays: Vec<String>, server: PublicKey) -> Self {
        ClientOptions {
            relays,
            server,
            encryption: Encryption::Optional,
            relay: RelaySettings::default(),
            interaction: None,
            resend_after: Some(std::time::Duration::from_secs(10)),
        }
    }
}

/// The request a payment is asked for, as the client sent it.
#[derive(Clone, Debug, PartialEq)]
pub struct PaidRequest {
    /// The server's key.
    pub server: PublicKey,
    /// The request's event id (what the server's notifications name in their `e` tag).
    pub event_id: EventId,
    /// The JSON-RPC request, with its own id.
    pub message: Value,
}

/// Pays what a server asks for (CEP-8's client side).
#[async_trait]
pub trait PaymentHook: Send + Sync + 'static {
    /// The payment methods handled, in order of preference (sent as `pmi` tags).
    fn pmis(&self) -> Vec<String>;

    /// Pays `required` for `request`: `Ok` once paid (the answer then comes from the server),
    /// with a JSON-RPC notification to send the server about the request when the payment
    /// method settles that way (the Stipendex method's Proof); `Err(why)` to decline (the
    /// request ends with an error).
    async fn pay(
        &self,
        request: &PaidRequest,
        required: &PaymentRequired,
    ) -> Result<Option<Value>, String>;

    /// The server accepted the payment for `request` (`_meta` as it sent it).
    async fn accepted(&self, request: &PaidRequest, meta: Option<&serde_json::Map<String, Value>>) {
        let _ = (request, meta);
    }

    /// The answer to a request this hook paid for, before rmcp sees it (a Receipt to check and
    /// keep). `Err(why)` turns it into an error.
    async fn answered(&self, request: &PaidRequest, answer: &Value) -> Result<(), String> {
        let _ = (request, answer);
        Ok(())
    }

    /// The client gave up on `request`, paid for and not answered (the MCP client cancelled
    /// it: a timeout, or its caller's choice): its answer is lost, and the same call asked
    /// again may present this payment instead of paying again.
    fn unanswered(&self, request: &PaidRequest) {
        let _ = request;
    }
}

struct Pending {
    original_id: Value,
    message: Value,
    /// The payment requests seen for it: at most [`MAX_PAY_REQS`].
    pay_reqs: HashSet<String>,
    /// The hook paid for it.
    paid: bool,
    /// The signed request, to send again in a fresh wrap.
    event: Event,
    /// When it was last sent.
    sent: tokio::time::Instant,
}

struct Shared {
    keys: Keys,
    server: PublicKey,
    encryption: Encryption,
    pending: Mutex<HashMap<EventId, Pending>>,
    server_reads_ephemeral: AtomicBool,
    sent_discovery: AtomicBool,
    interaction: Option<String>,
    to_mcp: mpsc::Sender<RxJsonRpcMessage<RoleClient>>,
    hook: Option<Arc<dyn PaymentHook>>,
    /// Set once connected: the relays, for settlement messages.
    relays: Mutex<Option<Arc<Relays>>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An rmcp client transport to one ContextVM server.
pub struct ClientTransport {
    shared: Arc<Shared>,
    relays: Arc<Relays>,
    rx: mpsc::Receiver<RxJsonRpcMessage<RoleClient>>,
    task: AbortHandle,
    resender: Option<AbortHandle>,
}

impl std::fmt::Debug for ClientTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTransport")
            .field("pubkey", &self.shared.keys.public_key().to_hex())
            .field("server", &self.shared.server.to_hex())
            .finish_non_exhaustive()
    }
}

impl ClientTransport {
    /// Connects as `keys` to `opts.relays`, listening for `opts.server`'s messages to it;
    /// `hook` pays CEP-8 payment requests (none: a priced request waits until it times out).
    ///
    /// # Errors
    /// [`Error::Relay`] when no relay is reachable or confirms the subscription.
    pub async fn connect(
        keys: Keys,
        opts: ClientOptions,
        hook: Option<Arc<dyn PaymentHook>>,
    ) -> Result<ClientTransport, Error> {
        let filter = Filter::new()
            .kinds([
                Kind::from(wire::MESSAGE),
                Kind::from(wire::GIFT_WRAP),
                Kind::from(wire::EPHEMERAL_GIFT_WRAP),
            ])
            .pubkey(keys.public_key())
            .since(Timestamp::now() - 60);
        let (relays, inbox) =
            Relays::connect(&keys, &opts.relays, filter, opts.relay.clone()).await?;
        let (to_mcp, rx) = mpsc::channel(QUEUE);
        let shared = Arc::new(Shared {
            keys,
            server: opts.server,
            encryption: opts.encryption,
            pending: Mutex::new(HashMap::new()),
            server_reads_ephemeral: AtomicBool::new(false),
            sent_discovery: AtomicBool::new(false),
            interaction: opts.interaction,
            to_mcp,
            hook,
            relays: Mutex::new(None),
        });
        let task = tokio::spawn(receive(shared.clone(), inbox)).abort_handle();
        let relays = Arc::new(relays);
        *lock(&shared.relays) = Some(relays.clone());
        let resender = opts.resend_after.map(|every| {
            tokio::spawn(resend(shared.clone(), relays.clone(), every)).abort_handle()
        });
        Ok(ClientTransport {
            shared,
            relays,
            rx,
            task,
            resender,
        })
    }

    /// This client's key.
    #[must_use]
    pub fn public_key(&self) -> PublicKey {
        self.shared.keys.public_key()
    }

    /// How many requests wait for an answer.
    #[must_use]
    pub fn pending(&self) -> usize {
        lock(&self.shared.pending).len()
    }
}

impl Drop for ClientTransport {
    fn drop(&mut self) {
        self.task.abort();
        if let Some(r) = &self.resender {
            r.abort();
        }
    }
}

/// Sends each request unanswered for `every` again, in a fresh wrap.
async fn resend(shared: Arc<Shared>, relays: Arc<Relays>, every: std::time::Duration) {
    let tick = (every / 4).max(std::time::Duration::from_millis(50));
    loop {
        tokio::time::sleep(tick).await;
        let now = tokio::time::Instant::now();
        let due: Vec<Event> = lock(&shared.pending)
            .values_mut()
            .filter(|p| now.duration_since(p.sent) >= every)
            .map(|p| {
                p.sent = now;
                p.event.clone()
            })
            .collect();
        for inner in due {
            tracing::debug!(request = %inner.id, "contextvm client: no answer yet; sending the request again");
            match wire::seal(inner, &shared.server, shared.wrap()) {
                Ok(ev) => {
                    if let Err(e) = relays.publish(&ev).await {
                        tracing::debug!(error = %e, "contextvm client: could not send a request again");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "contextvm client: could not seal a request"),
            }
        }
    }
}

impl Shared {
    fn wrap(&self) -> Option<Wrap> {
        match self.encryption {
            Encryption::Disabled => None,
            Encryption::Optional | Encryption::Required => {
                Some(if self.server_reads_ephemeral.load(Ordering::Relaxed) {
                    Wrap::Ephemeral
                } else {
                    Wrap::Persistent
                })
            }
        }
    }

    /// Builds, registers (a request) and seals a message for the server; returns the message's
    /// own event id and what to publish.
    fn outgoing(&self, message: &Value) -> Result<(EventId, Event), Error> {
        let is_request = message.get("method").is_some() && message.get("id").is_some();
        let mut tags: Vec<Tag> = Vec::new();
        if is_request {
            if !self.sent_discovery.swap(true, Ordering::Relaxed) {
                if self.encryption != Encryption::Disabled {
                    tags.push(wire::capability(wire::SUPPORT_ENCRYPTION));
                    tags.push(wire::capability(wire::SUPPORT_ENCRYPTION_EPHEMERAL));
                }
                if let Some(mode) = &self.interaction {
                    tags.push(nostr::Tag::custom(
                        nostr::TagKind::custom(wire::PAYMENT_INTERACTION),
                        [mode.as_str()],
                    ));
                }
            }
            if let Some(h) = &self.hook {
                tags.extend(h.pmis().iter().map(|p| wire::pmi_tag(p)));
            }
        }
        let inner = wire::message(&self.keys, &self.server, message, tags)?;
        if is_request {
            lock(&self.pending).insert(
                inner.id,
                Pending {
                    original_id: message.get("id").cloned().unwrap_or(Value::Null),
                    message: message.clone(),
                    pay_reqs: HashSet::new(),
                    paid: false,
                    event: inner.clone(),
                    sent: tokio::time::Instant::now(),
                },
            );
        } else if message.get("method").and_then(Value::as_str) == Some("notifications/cancelled")
            && let Some(id) = message.pointer("/params/requestId")
        {
            let mut gone = Vec::new();
            lock(&self.pending).retain(|e, p| {
                let keep = p.original_id != *id;
                if !keep && p.paid {
                    gone.push(PaidRequest {
                        server: self.server,
                        event_id: *e,
                        message: p.message.clone(),
                    });
                }
                keep
            });
            if let Some(hook) = &self.hook {
                for request in &gone {
                    hook.unanswered(request);
                }
            }
        }
        let id = inner.id;
        Ok((id, wire::seal(inner, &self.server, self.wrap())?))
    }

    async fn deliver(&self, message: Value) {
        match serde_json::from_value::<RxJsonRpcMessage<RoleClient>>(message) {
            Ok(m) => {
                let _ = self.to_mcp.send(m).await;
            }
            Err(e) => tracing::debug!(error = %e, "contextvm client: not an MCP server message"),
        }
    }

    /// Sends the server the JSON-RPC notification `note` about request `e` (tagged `e`, sealed
    /// as requests are).
    async fn notify_server(&self, e: EventId, note: &Value) -> Result<(), Error> {
        let inner = wire::message(&self.keys, &self.server, note, vec![Tag::event(e)])?;
        let ev = wire::seal(inner, &self.server, self.wrap())?;
        let relays = lock(&self.relays).clone();
        match relays {
            Some(r) => r.publish(&ev).await,
            None => Err(Error::Relay("not connected".into())),
        }
    }

    /// Ends the pending request `e` with a JSON-RPC error.
    async fn fail(&self, e: EventId, error: Value) {
        let Some(p) = lock(&self.pending).remove(&e) else {
            return;
        };
        self.deliver(json!({"jsonrpc": "2.0", "id": p.original_id, "error": error}))
            .await;
    }

    async fn inbound(self: &Arc<Self>, ev: &Event) -> Result<(), Error> {
        let (inner, _) = wire::open(&self.keys, ev)?;
        if inner.pubkey != self.server {
            return Err(Error::Refused(format!(
                "a message from {}, not the server",
                inner.pubkey
            )));
        }
        if wire::has_capability(&inner, wire::SUPPORT_ENCRYPTION_EPHEMERAL) {
            self.server_reads_ephemeral.store(true, Ordering::Relaxed);
        }
        let mut message = wire::json_rpc(&inner)?;
        let e = wire::answers(&inner);
        let method = message
            .get("method")
            .and_then(Value::as_str)
            .map(str::to_owned);
        match (method, message.get("id").is_some()) {
            (None, _) => {
                // An answer: to one of this client's requests, or dropped.
                let Some((e, p)) = e.and_then(|e| lock(&self.pending).remove(&e).map(|p| (e, p)))
                else {
                    return Err(Error::Refused(
                        "an answer to no request of this client".into(),
                    ));
                };
                if p.paid
                    && let Some(hook) = &self.hook
                {
                    let request = PaidRequest {
                        server: self.server,
                        event_id: e,
                        message: p.message.clone(),
                    };
                    if let Err(why) = hook.answered(&request, &message).await {
                        tracing::warn!(%why, "contextvm client: a paid answer refused");
                        message = json!({"jsonrpc": "2.0", "error": {"code": -32000,
                            "message": format!("the paid answer does not hold: {why}")}});
                    }
                }
                wire::set(&mut message, "id", p.original_id);
                self.deliver(message).await;
            }
            (Some(_), true) => self.deliver(message).await,
            (Some(method), false) => {
                let known = e.filter(|e| lock(&self.pending).contains_key(e));
                if e.is_some() && known.is_none() {
                    return Err(Error::Refused(format!(
                        "{method} about no request of this client"
                    )));
                }
                match (notify::Notification::from_json_rpc(&message), known) {
                    (Ok(Some(n)), Some(e)) => self.payment(e, n).await,
                    (Ok(Some(_)), None) => {
                        return Err(Error::Refused(format!("{method} without its request")));
                    }
                    (Err(err), _) => return Err(err),
                    (Ok(None), _) => self.deliver(message).await,
                }
            }
        }
        Ok(())
    }

    async fn payment(self: &Arc<Self>, e: EventId, n: Notification) {
        match n {
            Notification::Required(required) => {
                if self
                    .interaction
                    .as_deref()
                    .is_some_and(|m| m != "transparent")
                {
                    // CEP-8: a client that asked for explicit gating never pays a transparent
                    // request automatically (the server did not accept the mode).
                    self.fail(
                        e,
                        json!({"code": -32000, "message": "Payment declined by client policy",
                               "data": {"reason": "explicit_gating was asked; the server sent a transparent payment request"}}),
                    )
                    .await;
                    return;
                }
                let Some(hook) = self.hook.clone() else {
                    tracing::info!(pmi = %required.pmi, "contextvm client: a payment is required and no handler pays");
                    return;
                };
                if !hook.pmis().contains(&required.pmi) {
                    tracing::info!(pmi = %required.pmi, "contextvm client: no handler for this payment method");
                    return;
                }
                let request = {
                    let mut pending = lock(&self.pending);
                    let Some(p) = pending.get_mut(&e) else {
                        return;
                    };
                    if p.pay_reqs.contains(&required.pay_req) {
                        return;
                    }
                    if p.pay_reqs.len() >= MAX_PAY_REQS {
                        tracing::warn!(request = %e, "contextvm client: too many payment requests for one request; ignored");
                        return;
                    }
                    p.pay_reqs.insert(required.pay_req.clone());
                    PaidRequest {
                        server: self.server,
                        event_id: e,
                        message: p.message.clone(),
                    }
                };
                let this = self.clone();
                tokio::spawn(async move {
                    let paid = hook.pay(&request, &required).await;
                    if paid.is_ok()
                        && let Some(p) = lock(&this.pending).get_mut(&e)
                    {
                        p.paid = true;
                    }
                    if let Ok(Some(note)) = &paid
                        && let Err(err) = this.notify_server(e, note).await
                    {
                        tracing::warn!(error = %err, "contextvm client: a settlement message was not sent");
                    }
                    if let Err(why) = paid {
                        tracing::info!(%why, "contextvm client: payment declined");
                        let data = json!({
                            "pmi": required.pmi,
                            "amount": required.amount,
                            "method": request.message.get("method"),
                            "capability": request.message.pointer("/params/name")
                                .or_else(|| request.message.pointer("/params/uri")),
                            "reason": why,
                        });
                        this.fail(
                            e,
                            json!({"code": -32000, "message": "Payment declined by client handler", "data": data}),
                        )
                        .await;
                    }
                });
            }
            Notification::Accepted(accepted) => {
                if let Some(hook) = &self.hook {
                    let request = lock(&self.pending).get(&e).map(|p| PaidRequest {
                        server: self.server,
                        event_id: e,
                        message: p.message.clone(),
                    });
                    if let Some(r) = request {
                        hook.accepted(&r, accepted.meta.as_ref()).await;
                    }
                }
            }
            Notification::Rejected(rejected) => {
                let message = match &rejected.message {
                    Some(m) => format!("Payment rejected: {m}"),
                    None => "Payment rejected".to_owned(),
                };
                self.fail(e, json!({"code": -32000, "message": message}))
                    .await;
            }
        }
    }
}

async fn receive(shared: Arc<Shared>, mut inbox: mpsc::Receiver<Event>) {
    while let Some(ev) = inbox.recv().await {
        if let Err(e) = shared.inbound(&ev).await {
            tracing::debug!(id = %ev.id, error = %e, "contextvm client: event dropped");
        }
    }
}

impl Transport<RoleClient> for ClientTransport {
    type Error = Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        let (shared, relays) = (self.shared.clone(), self.relays.clone());
        async move {
            let message = serde_json::to_value(&item)
                .map_err(|e| Error::Refused(format!("an MCP message that is not JSON: {e}")))?;
            let (id, ev) = shared.outgoing(&message)?;
            let sent = relays.publish(&ev).await;
            if sent.is_err() {
                // Never sent: nothing will answer it.
                lock(&shared.pending).remove(&id);
            }
            sent
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.rx.recv()
    }

    async fn close(&mut self) -> Result<(), Error> {
        self.task.abort();
        if let Some(r) = &self.resender {
            r.abort();
        }
        self.relays.shutdown().await;
        Ok(())
    }
}
