//! The server transport: an rmcp server reached over Nostr, one MCP session per client key, as
//! the ContextVM SDK 0.11.14's `NostrServerTransport` behaves on the wire
//! (`docs/research/contextvm-sdk-0.11.14.md` §1.3–1.5, §2.4):
//!
//! - each request's id is rewritten to its event id before the MCP server sees it (ids from
//!   many clients never collide) and restored on the answer, which is tagged `["e", <request
//!   event id>]`;
//! - the first message to each client carries the server's common tags (name, about,
//!   encryption support, the [`Middleware`]'s tags such as `pmi`); list results carry its
//!   pricing tags;
//! - an answer goes as the client's last message came: plain, or gift-wrapped (kind 21059 when
//!   the client said it reads ephemeral wraps, else the kind it used);
//! - a client that sends a request without `initialize` (the SDK's stateless mode) gets a
//!   session initialised for it.
//!
//! Unlike the SDK, where one MCP server instance serves every client, each client key gets its
//! own rmcp service from the factory (a second `initialize` starts a new one). A
//! [`Middleware`] sees every request before the MCP server does: a request it holds (CEP-8's
//! priced ones) is forwarded only once it says so, and at most once.
//!
//! Everything a client key can make the server keep is bounded, since keys are free: sessions
//! ([`ServerOptions::max_sessions`]; the least recently used with no request in flight is
//! evicted first, then the least recently used), requests in flight per
//! session (128; beyond, answered with an error), a session's queue (256; never waited on by
//! the receive loop: a request finding it full is refused), the inner event ids seen (8 192)
//! and the answers kept for a retry (4 096). A request admitted late (paid) whose session was
//! evicted meanwhile is served by a new session: new keys taking the sessions never make a
//! payment lost.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use nostr::{Event, EventId, Keys, Kind, PublicKey, Tag, TagKind, Timestamp};
use nostr_sdk::Filter;
use rmcp::service::{RoleServer, RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{ServerHandler, ServiceExt as _};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use super::relay::{RelaySettings, Relays, SeenIds};
use super::wire::{self, Wrap};
use super::{Encryption, ServerInfo};
use crate::Error;

/// How many inner event ids the server remembers, to run a request once however many times it
/// is relayed or re-wrapped.
const SEEN_INNER: usize = 8192;
/// A message signed longer ago than this is dropped (a replay of an old request).
const MAX_AGE: Duration = Duration::from_secs(600);
/// The largest message content a peer reads ([`wire::MAX_MESSAGE`]).
pub use super::wire::MAX_MESSAGE;
/// How many answers the server keeps to send again when a request event comes again (its
/// answer was lost: CEP-8's "same request event id = a retry, never charged twice").
const KEPT_ANSWERS: usize = 4096;
/// How many messages wait for one session's MCP service. A message that finds the queue full
/// is refused (a request) or dropped (a notification): one client never stalls the server's
/// receive loop.
const SESSION_QUEUE: usize = 256;
/// How many requests of one session may be in flight (queued, running, or held by the
/// [`Middleware`]); beyond, a request is answered with an error without running.
const MAX_IN_FLIGHT: usize = 128;
/// The JSON-RPC error code of a request refused because its session is busy.
const BUSY: i64 = -32000;
/// The id of the `initialize` the server sends itself for a stateless client.
const INTERNAL_INIT: &str = "stipendex-contextvm/initialize";

/// How the server runs.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The relays (`ws://` or `wss://`).
    pub relays: Vec<String>,
    /// Which messages it reads and how it answers (default [`Encryption::Optional`]: it reads
    /// both and mirrors each client).
    pub encryption: Encryption,
    /// Its name and description on the first message to each client.
    pub info: ServerInfo,
    /// The most client sessions kept; the least recently used with no request in flight goes
    /// first, else the least recently used (a request it had admitted — paid — is still
    /// served, by a new session). Default 1 000.
    pub max_sessions: usize,
    /// Relay timeouts.
    pub relay: RelaySettings,
}

impl ServerOptions {
    /// Options for `relays`, defaults otherwise.
    #[must_use]
    pub fn new(relays: Vec<String>) -> Self {
        ServerOptions {
            relays,
            encryption: Encryption::Optional,
            info: ServerInfo::default(),
            max_sessions: 1000,
            relay: RelaySettings::default(),
        }
    }
}

/// A request the [`Middleware`] holds, with what the transport knows of it.
#[derive(Clone, Debug)]
pub struct Held {
    /// The client's key.
    pub client: PublicKey,
    /// The payment methods the client handles (its `pmi` tags, in its order).
    pub pmis: Vec<String>,
    /// The request's event id (also its JSON-RPC id as the MCP server sees it).
    pub event_id: EventId,
    /// The payment lifecycle the client asked for on the session's first message (CEP-8's
    /// `payment_interaction` tag), if it asked.
    pub interaction: Option<String>,
    /// The JSON-RPC request, with the client's own id.
    pub message: Value,
    /// What [`Middleware::holds`] said of it (payments: the position of its priced capability
    /// in the receiver's table, decided once there).
    pub hold: usize,
}

impl Held {
    /// The request's method.
    #[must_use]
    pub fn method(&self) -> &str {
        self.message
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }
}

/// What the middleware decided for a held request.
#[derive(Clone, Debug, PartialEq)]
pub enum Admission {
    /// Forward it to the MCP server (once).
    Forward,
    /// Drop it: no answer (CEP-8's rejection, which notified the client instead).
    Drop,
    /// Answer with this JSON-RPC error object (`{"code", "message", "data"?}`), not forwarded.
    Answer(Value),
}

/// Sends notifications about one held request to its client: tagged with the request's `e`,
/// wrapped as the session is.
#[derive(Clone)]
pub struct Notifier {
    core: Arc<Core>,
    client: PublicKey,
    event_id: EventId,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("client", &self.client.to_hex())
            .field("event_id", &self.event_id.to_hex())
            .finish()
    }
}

impl Notifier {
    /// Publishes the JSON-RPC notification `message` to the client, about the request.
    ///
    /// # Errors
    /// [`Error::Relay`] when no relay accepted it.
    pub async fn notify(&self, message: &Value) -> Result<(), Error> {
        self.core
            .publish_to(self.client, message, Some(self.event_id), None)
            .await
    }
}

/// What runs between the relays and the MCP server (CEP-8 payments are one).
#[async_trait]
pub trait Middleware: Send + Sync + 'static {
    /// Whether `request` waits for [`Middleware::admit`] (`Some`, with what the middleware
    /// wants to know of it again there: [`Held::hold`]); anything else goes to the MCP server
    /// at once, in the order it came. Called in the receive loop: keep it fast.
    fn holds(&self, request: &Value) -> Option<usize>;

    /// Decides a held request; runs in a task of its own, so it may wait (for a payment).
    async fn admit(&self, held: Held, notifier: Notifier) -> Admission;

    /// Tags on the first message to each client (CEP-8: a `pmi` tag per processor), given
    /// the payment lifecycle the client asked for on its first message (CEP-8's effective-mode
    /// disclosure).
    fn common_tags(&self, interaction: Option<&str>) -> Vec<Tag> {
        let _ = interaction;
        Vec::new()
    }

    /// Tags on list results (CEP-8: the `cap` pricing tags).
    fn list_tags(&self) -> Vec<Tag> {
        Vec::new()
    }

    /// A notification from `client` about its request `request` (tagged `e`): `true` if the
    /// middleware takes it — a payment method's settlement message — so it never reaches the
    /// MCP server. Called in the receive loop: keep it fast.
    fn notified(&self, client: &PublicKey, request: EventId, message: &Value) -> bool {
        let _ = (client, request, message);
        false
    }

    /// The answer to `client`'s request `request`, before it is sent (and kept for a retry):
    /// the middleware may finish what it admitted (settle a payment) and add to it (a Receipt).
    async fn answering(&self, client: PublicKey, request: EventId, message: &mut Value) {
        let _ = (client, request, message);
    }
}

/// A request on its way through the MCP server: what its answer needs.
#[derive(Clone, Debug)]
struct Route {
    original_id: Value,
    wrap: Option<Wrap>,
    progress_token: Option<Value>,
}

struct Session {
    /// Bumped at each new session of the same client key.
    generation: u64,
    to_mcp: mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    task: AbortHandle,
    /// How the client's last message came (the answer mirrors it).
    last_wrap: Option<Wrap>,
    reads_ephemeral: bool,
    sent_common_tags: bool,
    pmis: Vec<String>,
    /// What the session's first message asked of payments (`payment_interaction`).
    interaction: Option<String>,
    routes: HashMap<String, Route>,
}

/// Starts an MCP service on a session's transport.
type Factory = dyn Fn(SessionTransport) -> AbortHandle + Send + Sync;

struct State {
    sessions: HashMap<PublicKey, Session>,
    order: VecDeque<PublicKey>,
    seen: SeenIds,
    /// Answers by the request event they answer: (client, the signed answer, its wrap).
    answers: HashMap<EventId, (PublicKey, Event, Option<Wrap>)>,
    answers_order: VecDeque<EventId>,
    generation: u64,
}

struct Core {
    announcer: Box<super::announce::Announcer>,
    keys: Keys,
    relays: Relays,
    opts: ServerOptions,
    middleware: Option<Arc<dyn Middleware>>,
    factory: Box<Factory>,
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A ContextVM server: an rmcp service per client, reached over Nostr.
pub struct Server {
    core: Arc<Core>,
    task: AbortHandle,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("pubkey", &self.core.keys.public_key().to_hex())
            .field("relays", &self.core.relays)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// Starts serving as `keys` on `opts.relays`: each client key gets an rmcp service from
    /// `factory`; `middleware` (CEP-8 payments) sees every request first.
    ///
    /// # Errors
    /// [`Error::Relay`] when no relay is reachable or confirms the subscription.
    pub async fn start<S, F>(
        keys: Keys,
        opts: ServerOptions,
        factory: F,
        middleware: Option<Arc<dyn Middleware>>,
    ) -> Result<Server, Error>
    where
        S: ServerHandler,
        F: Fn() -> S + Send + Sync + 'static,
    {
        let mut kinds = vec![Kind::from(wire::MESSAGE)];
        if opts.encryption != Encryption::Disabled {
            kinds.push(Kind::from(wire::GIFT_WRAP));
            kinds.push(Kind::from(wire::EPHEMERAL_GIFT_WRAP));
        }
        let filter = Filter::new()
            .kinds(kinds)
            .pubkey(keys.public_key())
            .since(Timestamp::now());
        let (relays, inbox) =
            Relays::connect(&keys, &opts.relays, filter, opts.relay.clone()).await?;
        let factory = Arc::new(factory);
        let for_announcements = factory.clone();
        let announcer: Box<super::announce::Announcer> = Box::new(move || {
            let handler = for_announcements();
            Box::pin(super::announce::read(handler))
        });
        let factory: Box<Factory> = Box::new(move |transport: SessionTransport| {
            let handler = factory();
            tokio::spawn(async move {
                match handler.serve(transport).await {
                    Ok(running) => {
                        let _ = running.waiting().await;
                    }
                    Err(e) => tracing::debug!(error = %e, "contextvm: session did not start"),
                }
            })
            .abort_handle()
        });
        let core = Arc::new(Core {
            announcer,
            keys,
            relays,
            opts,
            middleware,
            factory,
            state: Mutex::new(State {
                sessions: HashMap::new(),
                order: VecDeque::new(),
                seen: SeenIds::new(SEEN_INNER),
                answers: HashMap::new(),
                answers_order: VecDeque::new(),
                generation: 0,
            }),
        });
        let task = tokio::spawn(receive(core.clone(), inbox)).abort_handle();
        Ok(Server { core, task })
    }

    /// The server's public key (what clients address).
    #[must_use]
    pub fn public_key(&self) -> PublicKey {
        self.core.keys.public_key()
    }

    /// Publishes the server's public announcements (CEP-6: kinds 11316–11320, in the clear,
    /// with its common and pricing tags) and returns them.
    ///
    /// # Errors
    /// [`Error::Refused`] if the MCP service does not answer its own `initialize` and lists;
    /// [`Error::Relay`] if no relay accepts an announcement.
    pub async fn announce(&self) -> Result<Vec<Event>, Error> {
        let announced = (self.core.announcer)().await?;
        let common = self.core.server_tags(None);
        let cap = self
            .core
            .middleware
            .as_ref()
            .map(|m| m.list_tags())
            .unwrap_or_default();
        let events = super::announce::events(&self.core.keys, &announced, &common, &cap)?;
        for ev in &events {
            self.core.relays.publish(ev).await?;
        }
        Ok(events)
    }

    /// How many client sessions are open.
    #[must_use]
    pub fn sessions(&self) -> usize {
        lock(&self.core.state).sessions.len()
    }

    /// Stops serving: every session, then the relays.
    pub async fn shutdown(&self) {
        self.task.abort();
        let tasks: Vec<AbortHandle> = lock(&self.core.state)
            .sessions
            .drain()
            .map(|(_, s)| s.task)
            .collect();
        for t in tasks {
            t.abort();
        }
        self.core.relays.shutdown().await;
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(core: Arc<Core>, mut inbox: mpsc::Receiver<Event>) {
    while let Some(ev) = inbox.recv().await {
        if let Err(e) = core.inbound(&ev).await {
            tracing::debug!(id = %ev.id, error = %e, "contextvm server: event dropped");
        }
    }
}

/// The single-element tags a message carries (capabilities).
fn reads_ephemeral(ev: &Event) -> bool {
    wire::has_capability(ev, wire::SUPPORT_ENCRYPTION_EPHEMERAL)
}

impl Core {
    async fn inbound(self: &Arc<Self>, ev: &Event) -> Result<(), Error> {
        let (inner, wrap) = wire::open(&self.keys, ev)?;
        match (self.opts.encryption, wrap) {
            (Encryption::Required, None) => {
                return Err(Error::Refused(
                    "a plain message to a server that requires encryption".into(),
                ));
            }
            (Encryption::Disabled, Some(_)) => {
                return Err(Error::Refused(
                    "a gift wrap to a server without encryption".into(),
                ));
            }
            _ => {}
        }
        let now = Timestamp::now().as_secs();
        let at = inner.created_at.as_secs();
        if at.saturating_add(MAX_AGE.as_secs()) < now || at > now.saturating_add(MAX_AGE.as_secs())
        {
            return Err(Error::Refused(format!(
                "a message signed at {at}, now is {now}"
            )));
        }
        let message = wire::json_rpc(&inner)?;
        if message.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(Error::Refused("not a JSON-RPC 2.0 message".into()));
        }
        if !self.first_time(inner.id) {
            // A request event again: its answer was lost, or it is a replay. The answer, if
            // there is one, goes again (to the request's signer, sealed afresh); the request
            // never runs, and is never charged, twice.
            let kept = lock(&self.state).answers.get(&inner.id).cloned();
            return match kept {
                Some((client, answer, how)) if client == inner.pubkey => {
                    tracing::debug!(request = %inner.id, "contextvm server: an answer sent again");
                    self.relays
                        .publish(&wire::seal(answer, &client, how)?)
                        .await
                }
                _ => Err(Error::Refused(format!(
                    "event {} seen already (its answer is not ready)",
                    inner.id
                ))),
            };
        }
        let client = inner.pubkey;
        let method = message.get("method").and_then(Value::as_str);
        let is_request = method.is_some() && message.get("id").is_some();
        if !is_request
            && method.is_some()
            && let (Some(m), Some(e)) = (&self.middleware, wire::answers(&inner))
            && m.notified(&client, e, &message)
        {
            return Ok(());
        }
        let interaction = wire::tag_value(&inner, wire::PAYMENT_INTERACTION);
        if is_request && method == Some("initialize") {
            self.new_session(client, interaction);
        } else if !self.has_session(client) {
            // The SDK's stateless clients never send `initialize`.
            self.new_session(client, interaction);
            self.initialize_for(client).await?;
        }
        let (to_mcp, mut forwarded, generation, route, over) = {
            let mut st = lock(&self.state);
            touch(&mut st.order, client);
            let s = st
                .sessions
                .get_mut(&client)
                .ok_or_else(|| Error::Refused("session evicted".into()))?;
            s.last_wrap = wrap;
            s.reads_ephemeral |= reads_ephemeral(&inner);
            if is_request {
                s.pmis = wire::pmis(&inner);
            }
            let mut forwarded = message.clone();
            let (mut route, mut over) = (None, None);
            if is_request {
                let r = Route {
                    original_id: message.get("id").cloned().unwrap_or(Value::Null),
                    wrap,
                    progress_token: message.pointer("/params/_meta/progressToken").cloned(),
                };
                if s.routes.len() >= MAX_IN_FLIGHT {
                    over = Some(r);
                } else {
                    s.routes.insert(inner.id.to_hex(), r.clone());
                    route = Some(r);
                    wire::set(&mut forwarded, "id", Value::String(inner.id.to_hex()));
                }
            } else if method == Some("notifications/cancelled")
                && let Some(orig) = message.pointer("/params/requestId")
                && let Some((eid, _)) = s.routes.iter().find(|(_, r)| r.original_id == *orig)
                && let Some(r) = forwarded.pointer_mut("/params/requestId")
            {
                *r = Value::String(eid.clone());
            }
            (s.to_mcp.clone(), forwarded, s.generation, route, over)
        };
        if let Some(r) = over {
            tracing::info!(%client, "contextvm server: too many requests in flight for one session; refused");
            return self
                .refuse(
                    client,
                    inner.id,
                    &r,
                    "too many requests in flight; retry later",
                )
                .await;
        }
        let hold = if is_request {
            self.middleware.as_ref().and_then(|m| m.holds(&message))
        } else {
            None
        };
        let Some(hold) = hold else {
            return match (offer(&to_mcp, forwarded)?, route) {
                (true, _) | (false, None) => Ok(()),
                (false, Some(r)) => {
                    self.forget(client, inner.id);
                    tracing::info!(%client, "contextvm server: a session's queue is full; a request refused");
                    self.refuse(client, inner.id, &r, "the session is busy; retry later")
                        .await
                }
            };
        };
        let Some(route) = route else {
            return Ok(());
        };
        let Some(mw) = self.middleware.clone() else {
            return Ok(());
        };
        let (pmis, interaction) = self.negotiated(client);
        let held = Held {
            client,
            pmis,
            event_id: inner.id,
            interaction,
            message,
            hold,
        };
        let notifier = Notifier {
            core: self.clone(),
            client,
            event_id: inner.id,
        };
        let core = self.clone();
        let asked = held.interaction.clone();
        tokio::spawn(async move {
            let event_id = held.event_id;
            match mw.admit(held, notifier).await {
                Admission::Forward => {
                    let sent = match core
                        .reroute(client, generation, event_id, &route, asked)
                        .await
                    {
                        Ok(Some(to)) => send_to(&to, forwarded.take()).await,
                        Ok(None) => send_to(&to_mcp, forwarded.take()).await,
                        Err(e) => Err(e),
                    };
                    if let Err(e) = sent {
                        tracing::warn!(error = %e, "contextvm server: an admitted request could not reach its session");
                    }
                }
                Admission::Drop => core.forget(client, event_id),
                Admission::Answer(error) => {
                    let current = lock(&core.state)
                        .sessions
                        .get(&client)
                        .is_some_and(|s| s.generation == generation);
                    let answered = if current {
                        let answer =
                            json!({"jsonrpc": "2.0", "id": event_id.to_hex(), "error": error});
                        core.outbound(client, answer).await
                    } else {
                        // Its session went: answered from the route it came with.
                        let answer =
                            json!({"jsonrpc": "2.0", "id": route.original_id, "error": error});
                        core.publish_to(client, &answer, Some(event_id), route.wrap)
                            .await
                    };
                    if let Err(e) = answered {
                        tracing::warn!(error = %e, "contextvm server: could not answer a refused request");
                    }
                }
            }
        });
        Ok(())
    }

    /// Answers request `e` of `client` with an error (`BUSY`) without running it.
    async fn refuse(
        &self,
        client: PublicKey,
        e: EventId,
        route: &Route,
        message: &str,
    ) -> Result<(), Error> {
        let answer = json!({"jsonrpc": "2.0", "id": route.original_id,
                            "error": {"code": BUSY, "message": message}});
        self.publish_to(client, &answer, Some(e), route.wrap).await
    }

    /// Where a request admitted late (paid) goes when the session it came in is gone —
    /// evicted by newer clients, or replaced by the client's own `initialize` — meanwhile:
    /// its route is put in the client's current session (a new one, initialised as for a
    /// stateless client, if it has none), whose queue is returned; `None` while the session
    /// is the same. A payment made is never lost to a crowd of new keys taking the sessions.
    async fn reroute(
        self: &Arc<Self>,
        client: PublicKey,
        generation: u64,
        e: EventId,
        route: &Route,
        interaction: Option<String>,
    ) -> Result<Option<mpsc::Sender<RxJsonRpcMessage<RoleServer>>>, Error> {
        {
            let mut st = lock(&self.state);
            if let Some(s) = st.sessions.get_mut(&client) {
                if s.generation == generation {
                    return Ok(None);
                }
                s.routes.insert(e.to_hex(), route.clone());
                return Ok(Some(s.to_mcp.clone()));
            }
        }
        tracing::info!(%client, "contextvm server: the session of an admitted request was evicted; a new one serves it");
        self.new_session(client, interaction);
        self.initialize_for(client).await?;
        let mut st = lock(&self.state);
        let s = st
            .sessions
            .get_mut(&client)
            .ok_or_else(|| Error::Refused("session evicted".into()))?;
        s.last_wrap = route.wrap;
        s.routes.insert(e.to_hex(), route.clone());
        Ok(Some(s.to_mcp.clone()))
    }

    fn first_time(&self, id: EventId) -> bool {
        lock(&self.state).seen.first_time(id)
    }

    fn has_session(&self, client: PublicKey) -> bool {
        lock(&self.state).sessions.contains_key(&client)
    }

    fn negotiated(&self, client: PublicKey) -> (Vec<String>, Option<String>) {
        lock(&self.state)
            .sessions
            .get(&client)
            .map(|s| (s.pmis.clone(), s.interaction.clone()))
            .unwrap_or_default()
    }

    fn forget(&self, client: PublicKey, event_id: EventId) {
        if let Some(s) = lock(&self.state).sessions.get_mut(&client) {
            s.routes.remove(&event_id.to_hex());
        }
    }

    /// A new MCP session for `client`, replacing its old one.
    fn new_session(self: &Arc<Self>, client: PublicKey, interaction: Option<String>) {
        let (tx, rx) = mpsc::channel(SESSION_QUEUE);
        let mut st = lock(&self.state);
        st.generation += 1;
        let generation = st.generation;
        let transport = SessionTransport {
            rx,
            core: self.clone(),
            client,
            generation,
        };
        let task = (self.factory)(transport);
        let old = st.sessions.insert(
            client,
            Session {
                generation,
                to_mcp: tx,
                task,
                last_wrap: None,
                reads_ephemeral: false,
                sent_common_tags: false,
                pmis: Vec::new(),
                interaction,
                routes: HashMap::new(),
            },
        );
        if let Some(old) = old {
            old.task.abort();
        }
        touch(&mut st.order, client);
        // The least recently used session with no request in flight goes first (a crowd of
        // new keys does not cut an honest client's call short), else the least recently used;
        // never the one just made.
        while st.sessions.len() > self.opts.max_sessions.max(1) {
            let victim = {
                let State {
                    order, sessions, ..
                } = &*st;
                let others = || order.iter().enumerate().filter(|(_, c)| **c != client);
                others()
                    .find(|(_, c)| sessions.get(*c).is_some_and(|s| s.routes.is_empty()))
                    .or_else(|| others().next())
                    .map(|(i, _)| i)
            };
            let Some(victim) = victim.and_then(|i| st.order.remove(i)) else {
                break;
            };
            if let Some(s) = st.sessions.remove(&victim) {
                s.task.abort();
            }
        }
    }

    /// Initialises a stateless client's session the way the SDK's stateless mode expects:
    /// the server sends its MCP service `initialize` (answer dropped) and `initialized`.
    async fn initialize_for(&self, client: PublicKey) -> Result<(), Error> {
        let to_mcp = lock(&self.state)
            .sessions
            .get(&client)
            .map(|s| s.to_mcp.clone())
            .ok_or_else(|| Error::Refused("session evicted".into()))?;
        send_to(
            &to_mcp,
            json!({"jsonrpc": "2.0", "id": INTERNAL_INIT, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "contextvm-stateless-client", "version": "0"}
            }}),
        )
        .await?;
        send_to(
            &to_mcp,
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await
    }

    /// The common tags, if `client` has not had them yet (then marks them sent).
    fn common_tags_once(&self, client: PublicKey) -> Vec<Tag> {
        let (first, interaction) =
            lock(&self.state)
                .sessions
                .get_mut(&client)
                .map_or((false, None), |s| {
                    (
                        !std::mem::replace(&mut s.sent_common_tags, true),
                        s.interaction.clone(),
                    )
                });
        if !first {
            return Vec::new();
        }
        self.server_tags(interaction.as_deref())
    }

    /// The server's common tags: its name and description, encryption support, and the
    /// middleware's (`pmi`; the effective payment lifecycle for a client that asked).
    fn server_tags(&self, interaction: Option<&str>) -> Vec<Tag> {
        let mut tags = Vec::new();
        let info = &self.opts.info;
        for (name, v) in [
            ("name", &info.name),
            ("about", &info.about),
            ("website", &info.website),
            ("picture", &info.picture),
        ] {
            if let Some(v) = v {
                tags.push(Tag::custom(TagKind::custom(name), [v.as_str()]));
            }
        }
        if self.opts.encryption != Encryption::Disabled {
            tags.push(wire::capability(wire::SUPPORT_ENCRYPTION));
            tags.push(wire::capability(wire::SUPPORT_ENCRYPTION_EPHEMERAL));
        }
        if let Some(m) = &self.middleware {
            tags.extend(m.common_tags(interaction));
        }
        tags
    }

    /// How a message to `client` goes: plain, or the wrap its session calls for.
    fn wrap_for(&self, client: PublicKey, fallback: Option<Wrap>) -> Option<Wrap> {
        let st = lock(&self.state);
        let s = st.sessions.get(&client);
        let encrypted = match self.opts.encryption {
            Encryption::Disabled => false,
            Encryption::Required => true,
            Encryption::Optional => s.map_or(fallback.is_some(), |s| s.last_wrap.is_some()),
        };
        if !encrypted {
            return None;
        }
        if s.is_some_and(|s| s.reads_ephemeral) {
            return Some(Wrap::Ephemeral);
        }
        Some(
            fallback
                .or_else(|| s.and_then(|s| s.last_wrap))
                .unwrap_or(Wrap::Persistent),
        )
    }

    async fn publish_to(
        &self,
        client: PublicKey,
        message: &Value,
        e: Option<EventId>,
        wrap_hint: Option<Wrap>,
    ) -> Result<(), Error> {
        let mut tags = Vec::new();
        if let Some(e) = e {
            tags.push(Tag::event(e));
        }
        tags.extend(self.common_tags_once(client));
        if let Some(m) = &self.middleware
            && is_list_result(message)
        {
            tags.extend(m.list_tags());
        }
        let ev = wire::message(&self.keys, &client, message, tags)?;
        let how = self.wrap_for(client, wrap_hint);
        if let Some(e) = e
            && message.get("method").is_none()
        {
            let mut st = lock(&self.state);
            st.answers.insert(e, (client, ev.clone(), how));
            st.answers_order.push_back(e);
            if st.answers_order.len() > KEPT_ANSWERS
                && let Some(old) = st.answers_order.pop_front()
            {
                st.answers.remove(&old);
            }
        }
        let out = wire::seal(ev, &client, how)?;
        self.relays.publish(&out).await
    }

    /// A message from `client`'s MCP service: an answer goes back with the client's id and an
    /// `e` tag; anything else goes as it is.
    async fn outbound(&self, client: PublicKey, mut message: Value) -> Result<(), Error> {
        let is_answer = message.get("method").is_none()
            && (message.get("result").is_some() || message.get("error").is_some());
        if is_answer {
            let id = message
                .get("id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            if id == INTERNAL_INIT {
                return Ok(());
            }
            let route = lock(&self.state)
                .sessions
                .get_mut(&client)
                .and_then(|s| s.routes.remove(&id));
            let Some(route) = route else {
                tracing::debug!(%id, "contextvm server: an answer with no request; dropped");
                return Ok(());
            };
            let e = EventId::from_hex(&id).map_err(|e| Error::Refused(e.to_string()))?;
            if let Some(m) = &self.middleware {
                m.answering(client, e, &mut message).await;
            }
            wire::set(&mut message, "id", route.original_id);
            return self.publish_to(client, &message, Some(e), route.wrap).await;
        }
        // Progress goes with the request that asked for it.
        let e = if message.get("method").and_then(Value::as_str) == Some("notifications/progress") {
            let token = message.pointer("/params/progressToken").cloned();
            lock(&self.state).sessions.get(&client).and_then(|s| {
                s.routes
                    .iter()
                    .find(|(_, r)| r.progress_token.is_some() && r.progress_token == token)
                    .and_then(|(id, _)| EventId::from_hex(id).ok())
            })
        } else {
            None
        };
        self.publish_to(client, &message, e, None).await
    }
}

fn touch(order: &mut VecDeque<PublicKey>, client: PublicKey) {
    if let Some(i) = order.iter().position(|c| *c == client) {
        order.remove(i);
    }
    order.push_back(client);
}

fn is_list_result(message: &Value) -> bool {
    message.get("result").is_some_and(|r| {
        ["tools", "resources", "resourceTemplates", "prompts"]
            .iter()
            .any(|k| r.get(*k).is_some_and(Value::is_array))
    })
}

/// Puts `message` in a session's queue without waiting: `false` when the queue is full (the
/// receive loop never waits for one session).
fn offer(
    to_mcp: &mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    message: Value,
) -> Result<bool, Error> {
    let typed: RxJsonRpcMessage<RoleServer> = serde_json::from_value(message)
        .map_err(|e| Error::Refused(format!("not an MCP client message: {e}")))?;
    match to_mcp.try_send(typed) {
        Ok(()) => Ok(true),
        Err(mpsc::error::TrySendError::Full(_)) => Ok(false),
        Err(mpsc::error::TrySendError::Closed(_)) => {
            Err(Error::Refused("the session is closed".into()))
        }
    }
}

async fn send_to(
    to_mcp: &mpsc::Sender<RxJsonRpcMessage<RoleServer>>,
    message: Value,
) -> Result<(), Error> {
    let typed: RxJsonRpcMessage<RoleServer> = serde_json::from_value(message)
        .map_err(|e| Error::Refused(format!("not an MCP client message: {e}")))?;
    to_mcp
        .send(typed)
        .await
        .map_err(|_| Error::Refused("the session is closed".into()))
}

/// One client's MCP session as an rmcp transport.
pub struct SessionTransport {
    rx: mpsc::Receiver<RxJsonRpcMessage<RoleServer>>,
    core: Arc<Core>,
    client: PublicKey,
    generation: u64,
}

impl std::fmt::Debug for SessionTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTransport")
            .field("client", &self.client.to_hex())
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

impl Transport<RoleServer> for SessionTransport {
    type Error = Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl Future<Output = Result<(), Error>> + Send + 'static {
        let (core, client, generation) = (self.core.clone(), self.client, self.generation);
        async move {
            let current = lock(&core.state)
                .sessions
                .get(&client)
                .is_some_and(|s| s.generation == generation);
            if !current {
                return Ok(());
            }
            let message = serde_json::to_value(&item)
                .map_err(|e| Error::Refused(format!("an MCP message that is not JSON: {e}")))?;
            core.outbound(client, message).await
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleServer>>> + Send {
        self.rx.recv()
    }

    async fn close(&mut self) -> Result<(), Error> {
        self.rx.close();
        Ok(())
    }
}

/// The server's Nostr key from the environment variable `var` (64 hex characters or an
/// `nsec`), never from a file in a repository; the key itself is never logged or echoed.
///
/// # Errors
/// [`Error::Refused`] naming the variable: unset, or not a secret key.
pub fn keys_from_env(var: &str) -> Result<Keys, Error> {
    let value = std::env::var(var).map_err(|_| {
        Error::Refused(format!(
            "{var} is not set: set it to the server's Nostr secret key (64 hex characters or nsec1…)"
        ))
    })?;
    Keys::parse(value.trim()).map_err(|_| {
        Error::Refused(format!(
            "{var} is not a Nostr secret key (64 hex characters or nsec1…)"
        ))
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_key_comes_from_the_environment_and_a_bad_one_is_named_not_echoed() {
        // Variables no other test sets (tests run in one process).
        let missing = keys_from_env("STIPENDEX_CVM_TEST_KEY_UNSET").unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("STIPENDEX_CVM_TEST_KEY_UNSET is not set")
        );
        // A variable that is set but holds no key (`set_var` is unsafe in edition 2024): its
        // name is in the error, its value is not.
        let path_err = keys_from_env("PATH").unwrap_err().to_string();
        assert!(
            path_err.contains("PATH is not a Nostr secret key"),
            "{path_err}"
        );
        assert!(!path_err.contains(&std::env::var("PATH").unwrap()));
    }
}
