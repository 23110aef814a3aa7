//! The NIP-47 client side: [`NwcClient`] connects to every relay of a [`ConnectionUri`],
//! subscribes to the wallet service's responses and notifications before it sends anything,
//! reads the wallet's info event (kind 13194) to choose the encryption (NIP-44 v2 when offered,
//! else NIP-04), and then sends requests (kind 23194) and matches their responses (kind 23195)
//! by the request id.
//!
//! One background task reads every event from the relays. It routes responses to the calls that
//! wait for them, and decrypts notifications into a broadcast channel. Only events signed by the
//! wallet service are used, and their signatures are checked. Anything else is logged and
//! dropped, and a malformed event never stops the task.
//!
//! The relay plumbing under it — resubscribing after a reconnect, waiting for the relays,
//! collecting stored events until EOSE, republishing until a relay accepts — is
//! [`crate::relays`], which another Nostr protocol can use as it is.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use nostr_sdk::{
    Client, Event, EventId, Filter, Keys, Kind, PublicKey, Relay, RelayOptions,
    RelayPoolNotification, RelayUrl, SubscriptionId, TagKind, Timestamp,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, oneshot};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::nip47::{
    ConnectionUri, Encryption, ErrorCode, GetInfo, KIND_INFO, KIND_NOTIFICATION,
    KIND_NOTIFICATION_NIP04, KIND_RESPONSE, MakeHoldInvoiceParams, MakeInvoiceParams, Notification,
    PayInvoiceParams, PayInvoiceResult, Request, Response, Transaction,
};
use crate::relays::{
    Listening, Published, collect_until_eose, keep_subscribed, publish, send_once, wait_connected,
};
use crate::wire;

/// How long `connect` waits for the other relays once one relay is connected.
const CONNECT_GRACE: Duration = Duration::from_secs(1);

/// How far back the subscription reaches (clock skew between wallet and client).
const SINCE_SLACK: Duration = Duration::from_secs(60);
/// How many notification event ids are remembered for de-duplication.
const SEEN_IDS: usize = 4096;
/// How many recent notifications are remembered to drop the same one sent on the other kind.
const SEEN_CONTENTS: usize = 64;
/// Capacity of the notification broadcast channel.
const NOTIFICATION_CAPACITY: usize = 256;
/// How long a request waits for its answer before the same event is sent again; doubled after
/// each copy, up to [`REASK_MAX`].
const REASK_FIRST: Duration = Duration::from_secs(1);
/// The longest pause between two copies of one request.
const REASK_MAX: Duration = Duration::from_secs(4);

/// Whether a request may be sent again as the same event while its answer has not come.
/// Requests and answers are ephemeral events: a relay passes each to the subscriptions it has
/// at that instant, so one that reaches a relay while the wallet service's subscription is
/// being re-established after a reconnect is lost. NIP-47 does not say that a wallet service
/// answers an event id once (Alby Hub does; a service that does not would run a copy again,
/// and its answer — "already paid", "invoice exists" — could arrive before the first one's and
/// be taken for it): only requests that read, and `make_invoice` (a second invoice is as good
/// as the first), are sent again. A lost payment request is found by the payer's
/// `lookup_invoice` once the request has expired ([`crate::rail::NwcPayer`]).
fn may_send_again(method: &str) -> bool {
    matches!(
        method,
        "get_info" | "get_balance" | "lookup_invoice" | "list_transactions" | "make_invoice"
    )
}

/// Options of an [`NwcClient`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// Per request: a call without a response after this long fails with
    /// [`NwcError::Timeout`]. Also the bound on `connect`. Default 15 s.
    pub timeout: Duration,
    /// Relay reconnection interval (fixed, not adaptive), and the pause between publishing
    /// attempts when no relay accepts a request. Default 300 ms.
    pub retry_interval: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: Duration::from_secs(15),
            retry_interval: Duration::from_millis(300),
        }
    }
}

/// Why a NIP-47 call (or `connect`) failed.
///
/// For `pay_invoice`, [`NwcError::Timeout`] and [`NwcError::Relay`] leave the outcome
/// unknown: the request may still reach the wallet (the relay pool queues it), so check with
/// `lookup_invoice` before paying again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NwcError {
    /// The wallet service answered with an error.
    #[error("wallet error {code}: {message}")]
    Wallet {
        /// The NIP-47 code (unknown codes are kept).
        code: ErrorCode,
        /// The wallet's message.
        message: String,
    },
    /// No response in time.
    #[error("no response to {method} in time")]
    Timeout {
        /// The method (`info` for the wallet's info event during `connect`).
        method: String,
    },
    /// No relay reachable, or none accepted the request, or the client is shut down.
    #[error("relay: {0}")]
    Relay(String),
    /// The wallet's answer breaks NIP-47 (undecryptable, malformed, wrong `result_type`), or
    /// the connection URI holds an invalid key.
    #[error("protocol: {0}")]
    Protocol(String),
    /// The wallet service offers no encryption this client speaks.
    #[error("the wallet service offers no supported encryption")]
    UnsupportedEncryption,
}

impl NwcError {
    /// A short code: the NIP-47 code for wallet errors, else `TIMEOUT`, `RELAY`, `PROTOCOL` or
    /// `UNSUPPORTED_ENCRYPTION`.
    #[must_use]
    pub fn code(&self) -> &str {
        match self {
            NwcError::Wallet { code, .. } => code.as_str(),
            NwcError::Timeout { .. } => "TIMEOUT",
            NwcError::Relay(_) => "RELAY",
            NwcError::Protocol(_) => "PROTOCOL",
            NwcError::UnsupportedEncryption => "UNSUPPORTED_ENCRYPTION",
        }
    }

    /// Whether a retry later may succeed (mind the note on `pay_invoice` above).
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            NwcError::Wallet { code, .. } => code.is_retryable(),
            NwcError::Timeout { .. } | NwcError::Relay(_) => true,
            NwcError::Protocol(_) | NwcError::UnsupportedEncryption => false,
        }
    }
}

/// What the wallet service's info event (kind 13194) announces.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct WalletInfo {
    /// Supported methods (the event's content).
    pub methods: Vec<String>,
    /// Supported encryptions this client knows (`[Nip04]` when the event has no `encryption`
    /// tag).
    pub encryptions: Vec<Encryption>,
    /// Supported notification types (the `notifications` tag).
    pub notifications: Vec<String>,
}

#[derive(Default)]
struct Seen {
    ids: HashSet<EventId>,
    order: VecDeque<EventId>,
    recent: VecDeque<(Kind, Notification)>,
}

impl Seen {
    /// Records `id`; false if it was already there.
    fn first_time(&mut self, id: EventId) -> bool {
        if !self.ids.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > SEEN_IDS
            && let Some(old) = self.order.pop_front()
        {
            self.ids.remove(&old);
        }
        true
    }

    /// Records `n`; false if the same notification came recently on the other kind (a wallet
    /// that publishes both NIP-44 and NIP-04 notifications).
    fn fresh_content(&mut self, kind: Kind, n: &Notification) -> bool {
        if self.recent.iter().any(|(k, m)| *k != kind && m == n) {
            return false;
        }
        self.recent.push_back((kind, n.clone()));
        if self.recent.len() > SEEN_CONTENTS {
            self.recent.pop_front();
        }
        true
    }
}

/// State shared with the background task.
struct Shared {
    keys: Keys,
    wallet: PublicKey,
    pending: Mutex<HashMap<EventId, oneshot::Sender<Event>>>,
    notifications: broadcast::Sender<Notification>,
    seen: Mutex<Seen>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn handle_event(&self, ev: &Event) {
        if ev.pubkey != self.wallet {
            tracing::debug!(id = %ev.id, author = %ev.pubkey, kind = %ev.kind, "nwc: ignoring event not from the wallet service");
            return;
        }
        let kind = ev.kind.as_u16();
        if kind == KIND_RESPONSE {
            self.route_response(ev);
        } else if kind == KIND_NOTIFICATION || kind == KIND_NOTIFICATION_NIP04 {
            self.deliver_notification(ev);
        }
    }

    fn route_response(&self, ev: &Event) {
        if ev.verify().is_err() {
            tracing::warn!(id = %ev.id, "nwc: dropping response with a bad id or signature");
            return;
        }
        let waiter = {
            let mut pending = lock(&self.pending);
            ev.tags.event_ids().find_map(|id| pending.remove(id))
        };
        match waiter {
            Some(tx) => {
                // The call may have given up in the meantime; nothing to do then.
                let _ = tx.send(ev.clone());
            }
            None => {
                tracing::debug!(id = %ev.id, "nwc: response for no pending request (late or duplicate)");
            }
        }
    }

    fn deliver_notification(&self, ev: &Event) {
        if !lock(&self.seen).first_time(ev.id) {
            tracing::debug!(id = %ev.id, "nwc: duplicate notification event");
            return;
        }
        let enc = if ev.kind.as_u16() == KIND_NOTIFICATION {
            Encryption::Nip44V2
        } else {
            Encryption::Nip04
        };
        let n: Notification = match wire::open(&self.keys, ev, enc) {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(id = %ev.id, error = %e, "nwc: dropping unreadable notification");
                return;
            }
        };
        if !lock(&self.seen).fresh_content(ev.kind, &n) {
            tracing::debug!(id = %ev.id, "nwc: notification already delivered on the other kind");
            return;
        }
        // No receiver is not an error.
        let _ = self.notifications.send(n);
    }
}

/// Reads every event from the pool until it shuts down.
async fn read_events(shared: Arc<Shared>, mut rx: broadcast::Receiver<RelayPoolNotification>) {
    loop {
        match rx.recv().await {
            Ok(RelayPoolNotification::Event { event, .. }) => shared.handle_event(&event),
            Ok(RelayPoolNotification::Shutdown) | Err(RecvError::Closed) => break,
            Ok(RelayPoolNotification::Message { .. }) => {}
            Err(RecvError::Lagged(n)) => {
                tracing::warn!(
                    skipped = n,
                    "nwc: event reader lagged; some events were lost"
                );
            }
        }
    }
}

/// The NIP-47 client. Not `Clone`: share it behind an `Arc`. Dropping it stops its tasks;
/// [`NwcClient::shutdown`] also closes the relay connections and fails the calls in flight.
pub struct NwcClient {
    shared: Arc<Shared>,
    client: Client,
    relays: Vec<RelayUrl>,
    info: WalletInfo,
    encryption: Encryption,
    opts: ClientOptions,
    tasks: Vec<AbortHandle>,
    closed: AtomicBool,
    /// Which relays carry the answers' subscription on their current connection.
    listening: Arc<Listening>,
}

impl fmt::Debug for NwcClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NwcClient")
            .field("pubkey", &self.shared.keys.public_key().to_hex())
            .field("wallet", &self.shared.wallet.to_hex())
            .field("relays", &self.relays)
            .field("encryption", &self.encryption)
            .field("info", &self.info)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

/// Removes a pending request when its call ends, however it ends.
struct PendingGuard<'a> {
    shared: &'a Shared,
    id: EventId,
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        lock(&self.shared.pending).remove(&self.id);
    }
}

fn relay_err(e: impl fmt::Display) -> NwcError {
    NwcError::Relay(e.to_string())
}

fn wire_err(e: impl fmt::Display) -> NwcError {
    NwcError::Protocol(e.to_string())
}

fn shut_down() -> NwcError {
    NwcError::Relay("client is shut down".to_owned())
}

/// The values of a tag (after its name), split on whitespace.
fn tag_words(ev: &Event, name: &str) -> Option<Vec<String>> {
    ev.tags.find(TagKind::custom(name)).map(|t| {
        t.as_slice()
            .iter()
            .skip(1)
            .flat_map(|v| v.split_whitespace())
            .map(str::to_owned)
            .collect()
    })
}

/// Reads an info event: its methods, encryptions and notifications, and the encryption to use.
fn parse_info(ev: &Event) -> Result<(WalletInfo, Encryption), NwcError> {
    let methods = ev.content.split_whitespace().map(str::to_owned).collect();
    let encryptions = match tag_words(ev, "encryption") {
        None => vec![Encryption::Nip04],
        Some(words) => {
            let mut out = Vec::new();
            for e in words.iter().filter_map(|w| Encryption::parse(w)) {
                if !out.contains(&e) {
                    out.push(e);
                }
            }
            out
        }
    };
    let encryption = if encryptions.contains(&Encryption::Nip44V2) {
        Encryption::Nip44V2
    } else if encryptions.contains(&Encryption::Nip04) {
        Encryption::Nip04
    } else {
        return Err(NwcError::UnsupportedEncryption);
    };
    let notifications = tag_words(ev, "notifications").unwrap_or_default();
    Ok((
        WalletInfo {
            methods,
            encryptions,
            notifications,
        },
        encryption,
    ))
}

#[derive(Deserialize)]
struct Transactions {
    transactions: Vec<Transaction>,
}

fn typed<T: DeserializeOwned>(method: &str, v: Value) -> Result<T, NwcError> {
    serde_json::from_value(v).map_err(|e| NwcError::Protocol(format!("{method} result: {e}")))
}

fn to_params<T: serde::Serialize>(p: &T) -> Result<Value, NwcError> {
    serde_json::to_value(p).map_err(|e| NwcError::Protocol(format!("params: {e}")))
}

impl NwcClient {
    /// Connects to every relay of `uri`, subscribes to the wallet service's responses and
    /// notifications (waiting for EOSE), and reads its info event (kind 13194) to choose the
    /// encryption: NIP-44 v2 when its `encryption` tag lists `nip44_v2`, else NIP-04 (no tag
    /// means NIP-04 only). Everything is bounded by `opts.timeout`.
    ///
    /// # Errors
    /// [`NwcError::Relay`] when no relay is reachable or confirms the subscription,
    /// [`NwcError::Timeout`] (method `info`) when the wallet has no info event,
    /// [`NwcError::UnsupportedEncryption`] when it offers neither NIP-44 v2 nor NIP-04,
    /// [`NwcError::Protocol`] for an invalid key in the URI.
    pub async fn connect(uri: &ConnectionUri, opts: ClientOptions) -> Result<Self, NwcError> {
        let keys = Keys::parse(&uri.secret)
            .map_err(|_| NwcError::Protocol("the connection secret is not a valid key".into()))?;
        let wallet = PublicKey::from_hex(&uri.wallet_pubkey)
            .map_err(|e| NwcError::Protocol(format!("wallet public key: {e}")))?;
        let mut urls: Vec<RelayUrl> = Vec::new();
        for r in &uri.relays {
            let u = RelayUrl::parse(r).map_err(|e| NwcError::Relay(format!("{r}: {e}")))?;
            if !urls.contains(&u) {
                urls.push(u);
            }
        }

        let client = Client::builder().signer(keys.clone()).build();
        let relay_opts = RelayOptions::new()
            .retry_interval(opts.retry_interval)
            .adjust_retry_interval(false);
        let mut relays: Vec<Relay> = Vec::with_capacity(urls.len());
        for u in &urls {
            client
                .pool()
                .add_relay(u.clone(), relay_opts.clone())
                .await
                .map_err(relay_err)?;
            relays.push(client.relay(u.clone()).await.map_err(relay_err)?);
        }

        let (notifications, _) = broadcast::channel(NOTIFICATION_CAPACITY);
        let shared = Arc::new(Shared {
            keys: keys.clone(),
            wallet,
            pending: Mutex::new(HashMap::new()),
            notifications,
            seen: Mutex::new(Seen::default()),
        });

        // Every receiver exists before anything is connected or subscribed.
        let mut messages = client.notifications();
        let mut tasks =
            vec![tokio::spawn(read_events(shared.clone(), client.notifications())).abort_handle()];
        let sub_id = SubscriptionId::generate();
        let filter = Filter::new()
            .kinds([
                Kind::from(KIND_RESPONSE),
                Kind::from(KIND_NOTIFICATION),
                Kind::from(KIND_NOTIFICATION_NIP04),
            ])
            .author(wallet)
            .pubkey(keys.public_key())
            .since(Timestamp::now() - SINCE_SLACK);
        let listening = Arc::new(Listening::default());
        for relay in &relays {
            let rx = relay.notifications();
            tasks.push(
                tokio::spawn(keep_subscribed(
                    "nwc",
                    relay.clone(),
                    rx,
                    sub_id.clone(),
                    filter.clone(),
                    listening.clone(),
                ))
                .abort_handle(),
            );
        }

        let mut this = NwcClient {
            shared,
            client,
            relays: urls,
            info: WalletInfo::default(),
            encryption: Encryption::Nip04,
            opts,
            tasks,
            closed: AtomicBool::new(false),
            listening,
        };
        match this.start(&relays, &mut messages, sub_id, filter).await {
            Ok((info, encryption)) => {
                tracing::debug!(?info, ?encryption, "nwc: connected");
                this.info = info;
                this.encryption = encryption;
                Ok(this)
            }
            Err(e) => {
                this.shutdown().await;
                Err(e)
            }
        }
    }

    async fn start(
        &self,
        relays: &[Relay],
        messages: &mut broadcast::Receiver<RelayPoolNotification>,
        sub_id: SubscriptionId,
        filter: Filter,
    ) -> Result<(WalletInfo, Encryption), NwcError> {
        let deadline = Instant::now() + self.opts.timeout;
        let wallet = self.shared.wallet;
        self.client.connect().await;
        if !wait_connected(relays, deadline, CONNECT_GRACE, "nwc").await {
            return Err(NwcError::Relay(
                "no relay of the connection URI is reachable".to_owned(),
            ));
        }

        self.client
            .subscribe_with_id(sub_id.clone(), filter, None)
            .await
            .map_err(relay_err)?;
        let (_, eose) =
            collect_until_eose(messages, relays, &sub_id, &wallet, deadline, false).await;
        if eose == 0 {
            return Err(NwcError::Relay(
                "no relay confirmed the subscription (EOSE)".to_owned(),
            ));
        }

        let info_id = SubscriptionId::generate();
        let info_filter = Filter::new().kind(Kind::from(KIND_INFO)).author(wallet);
        self.client
            .subscribe_with_id(info_id.clone(), info_filter, None)
            .await
            .map_err(relay_err)?;
        let (events, _) =
            collect_until_eose(messages, relays, &info_id, &wallet, deadline, true).await;
        self.client.unsubscribe(&info_id).await;
        let newest = events
            .iter()
            .filter(|e| e.kind.as_u16() == KIND_INFO)
            .max_by_key(|e| e.created_at)
            .ok_or_else(|| NwcError::Timeout {
                method: "info".to_owned(),
            })?;
        parse_info(newest)
    }

    /// What the wallet's info event announced.
    #[must_use]
    pub fn info(&self) -> &WalletInfo {
        &self.info
    }

    /// The encryption of requests.
    #[must_use]
    pub fn encryption(&self) -> Encryption {
        self.encryption
    }

    /// The client's public key (hex).
    #[must_use]
    pub fn pubkey(&self) -> String {
        self.shared.keys.public_key().to_hex()
    }

    /// Sends `method` with `params` and returns the wallet's `result` (`Value::Null` when
    /// absent). While no answer has come, a request that only reads (or `make_invoice`) is
    /// sent again as the same event after 1 s, then 2 s, then every 4 s (a relay loses a
    /// request that arrives while the wallet's subscription is being re-established); a
    /// request that moves money is sent once.
    ///
    /// # Errors
    /// [`NwcError::Wallet`] for a wallet error (unknown codes kept), [`NwcError::Timeout`]
    /// after `timeout`, [`NwcError::Relay`] when no relay accepted the request,
    /// [`NwcError::Protocol`] for an undecryptable or malformed response or a `result_type`
    /// other than `method`.
    pub async fn call(&self, method: &str, params: Value) -> Result<Value, NwcError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(shut_down());
        }
        let timeout = self.opts.timeout;
        let deadline = Instant::now() + timeout;
        // Whole seconds, rounded up: a sub-second expiration would already be expired.
        let ttl = Duration::from_secs(
            timeout
                .as_secs()
                .saturating_add(u64::from(timeout.subsec_nanos() > 0))
                .max(1),
        );
        let req = Request {
            method: method.to_owned(),
            params,
        };
        let ev = wire::request_event(
            &self.shared.keys,
            &self.shared.wallet,
            self.encryption,
            &req,
            ttl,
        )
        .map_err(wire_err)?;
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(ev.id, tx);
        let _guard = PendingGuard {
            shared: &self.shared,
            id: ev.id,
        };
        let response = self.publish_and_wait(method, &ev, rx, deadline).await?;
        self.decode(method, &response)
    }

    async fn publish_and_wait(
        &self,
        method: &str,
        ev: &Event,
        mut rx: oneshot::Receiver<Event>,
        deadline: Instant,
    ) -> Result<Event, NwcError> {
        // Answers are ephemeral: one that comes back before this client's subscription is live
        // again (just after a reconnect) is lost for good. Send only when a relay carries it.
        if !self.listening.wait_live(deadline).await {
            return Err(NwcError::Relay(format!(
                "no relay carries this client's subscription, so the {method} request was not sent"
            )));
        }
        let outcome = publish(
            &self.client,
            ev,
            &mut rx,
            deadline,
            self.opts.retry_interval,
            "nwc",
        )
        .await;
        let (mut accepted, mut failure) = match outcome {
            Published::Answered(ev) => return Ok(ev),
            Published::Closed => return Err(shut_down()),
            Published::Accepted => (true, String::new()),
            Published::NotAccepted(why) => (false, why),
        };
        // An accepted request can still be lost (see `may_send_again`): while no answer has
        // come, send the same event again at growing intervals.
        let mut pause = REASK_FIRST;
        loop {
            let next = if may_send_again(method) {
                (Instant::now() + pause).min(deadline)
            } else {
                deadline
            };
            match tokio::time::timeout_at(next, &mut rx).await {
                Ok(Ok(ev)) => return Ok(ev),
                Ok(Err(_)) => return Err(shut_down()),
                Err(_) if Instant::now() < deadline => {}
                Err(_) if accepted => {
                    return Err(NwcError::Timeout {
                        method: method.to_owned(),
                    });
                }
                Err(_) => {
                    return Err(NwcError::Relay(format!(
                        "no relay accepted the {method} request: {failure}"
                    )));
                }
            }
            tracing::debug!(id = %ev.id, %method, "nwc: no answer yet; sending the request again");
            if !self.listening.wait_live(deadline).await {
                continue;
            }
            // One attempt per copy.
            match send_once(&self.client, ev, &mut rx, deadline).await {
                Published::Answered(ev) => return Ok(ev),
                Published::Closed => return Err(shut_down()),
                Published::Accepted => accepted = true,
                Published::NotAccepted(why) => failure = why,
            }
            pause = pause.saturating_mul(2).min(REASK_MAX);
        }
    }

    fn decode(&self, method: &str, ev: &Event) -> Result<Value, NwcError> {
        let enc = match wire::encryption_tag(ev) {
            Some(Some(e)) => e,
            _ => self.encryption,
        };
        let resp: Response = wire::open(&self.shared.keys, ev, enc)
            .map_err(|e| NwcError::Protocol(format!("{method} response: {e}")))?;
        if resp.result_type != method {
            // A wallet that could not read the request cannot know its method.
            let unknown_method = resp.result_type.is_empty() && resp.error.is_some();
            if !unknown_method {
                return Err(NwcError::Protocol(format!(
                    "result_type {:?} answers a {method} request",
                    resp.result_type
                )));
            }
        }
        if let Some(err) = resp.error {
            return Err(NwcError::Wallet {
                code: err.code,
                message: err.message,
            });
        }
        Ok(resp.result.unwrap_or(Value::Null))
    }

    /// Pays a BOLT11 invoice (`amount_msat` for an invoice without an amount).
    ///
    /// # Errors
    /// See [`NwcClient::call`]; on [`NwcError::Timeout`] or [`NwcError::Relay`] the payment's
    /// outcome is unknown.
    pub async fn pay_invoice(
        &self,
        invoice: &str,
        amount_msat: Option<u64>,
    ) -> Result<PayInvoiceResult, NwcError> {
        let params = to_params(&PayInvoiceParams {
            invoice: invoice.to_owned(),
            amount: amount_msat,
        })?;
        typed("pay_invoice", self.call("pay_invoice", params).await?)
    }

    /// Creates an invoice.
    ///
    /// # Errors
    /// See [`NwcClient::call`].
    pub async fn make_invoice(&self, p: &MakeInvoiceParams) -> Result<Transaction, NwcError> {
        typed(
            "make_invoice",
            self.call("make_invoice", to_params(p)?).await?,
        )
    }

    /// Creates a hold invoice for a payment hash whose preimage the caller keeps.
    ///
    /// # Errors
    /// See [`NwcClient::call`].
    pub async fn make_hold_invoice(
        &self,
        p: &MakeHoldInvoiceParams,
    ) -> Result<Transaction, NwcError> {
        typed(
            "make_hold_invoice",
            self.call("make_hold_invoice", to_params(p)?).await?,
        )
    }

    /// Settles a held payment by revealing its preimage (hex).
    ///
    /// # Errors
    /// See [`NwcClient::call`].
    pub async fn settle_hold_invoice(&self, preimage_hex: &str) -> Result<(), NwcError> {
        self.call(
            "settle_hold_invoice",
            serde_json::json!({ "preimage": preimage_hex }),
        )
        .await
        .map(drop)
    }

    /// Cancels a hold invoice (the held payment goes back to the payer).
    ///
    /// # Errors
    /// See [`NwcClient::call`].
    pub async fn cancel_hold_invoice(&self, payment_hash_hex: &str) -> Result<(), NwcError> {
        self.call(
            "cancel_hold_invoice",
            serde_json::json!({ "payment_hash": payment_hash_hex }),
        )
        .await
        .map(drop)
    }

    /// Looks up an invoice or payment by payment hash (hex).
    ///
    /// # Errors
    /// See [`NwcClient::call`].
    pub async fn lookup_invoice(&self, payment_hash_hex: &str) -> Result<Transaction, NwcError> {
        let v = self
            .call(
                "lookup_invoice",
                serde_json::json!({ "payment_hash": payment_hash_hex }),
            )
            .await?;
        typed("lookup_invoice", v)
    }

    /// The wallet's balance, msat.
    ///
    /// # Errors
    /// See [`NwcClient::call`].
    pub async fn get_balance(&self) -> Result<u64, NwcError> {
        let v = self.call("get_balance", serde_json::json!({})).await?;
        typed::<crate::nip47::Balance>("get_balance", v).map(|b| b.balance)
    }

    /// The wallet's node and capabilities.
    ///
    /// # Errors
    /// See [`NwcClient::call`].
    pub async fn get_info(&self) -> Result<GetInfo, NwcError> {
        typed(
            "get_info",
            self.call("get_info", serde_json::json!({})).await?,
        )
    }

    /// Lists transactions (`params`: `from`, `until`, `limit`, `offset`, `unpaid`, `type`).
    ///
    /// # Errors
    /// See [`NwcClient::call`].
    pub async fn list_transactions(&self, params: Value) -> Result<Vec<Transaction>, NwcError> {
        let v = self.call("list_transactions", params).await?;
        typed::<Transactions>("list_transactions", v).map(|t| t.transactions)
    }

    /// Notifications from now on: decrypted, signature-checked, from the wallet service only,
    /// each delivered once (by event id; and a wallet publishing the same notification as both
    /// 23197 and 23196 is delivered once).
    #[must_use]
    pub fn notifications(&self) -> broadcast::Receiver<Notification> {
        self.shared.notifications.subscribe()
    }

    /// Stops the background tasks, fails the calls in flight with [`NwcError::Relay`], and
    /// closes the relay connections. Later calls fail the same way.
    pub async fn shutdown(&self) {
        self.closed.store(true, Ordering::Release);
        for t in &self.tasks {
            t.abort();
        }
        lock(&self.shared.pending).clear();
        self.client.shutdown().await;
    }
}

impl Drop for NwcClient {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if !self.closed.swap(true, Ordering::AcqRel)
            && let Ok(rt) = tokio::runtime::Handle::try_current()
        {
            let client = self.client.clone();
            rt.spawn(async move { client.shutdown().await });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nip47::Balance;

    fn shared(wallet: &Keys, client: &Keys) -> Shared {
        let (tx, _) = broadcast::channel(16);
        Shared {
            keys: client.clone(),
            wallet: wallet.public_key(),
            pending: Mutex::new(HashMap::new()),
            notifications: tx,
            seen: Mutex::new(Seen::default()),
        }
    }

    #[test]
    fn responses_not_from_the_wallet_are_not_routed() {
        let (wallet, app, mallory) = (Keys::generate(), Keys::generate(), Keys::generate());
        let s = shared(&wallet, &app);
        let req = wire::request_event(
            &app,
            &wallet.public_key(),
            Encryption::Nip44V2,
            &Request {
                method: "get_balance".into(),
                params: Value::Null,
            },
            Duration::from_secs(5),
        )
        .unwrap();
        let (tx, mut rx) = oneshot::channel();
        lock(&s.pending).insert(req.id, tx);
        let body = Response {
            result_type: "get_balance".into(),
            error: None,
            result: Some(serde_json::to_value(Balance { balance: 1 }).unwrap()),
        };
        let forged = wire::response_event(
            &mallory,
            &app.public_key(),
            req.id,
            Encryption::Nip44V2,
            &body,
        )
        .unwrap();
        s.handle_event(&forged);
        assert!(rx.try_recv().is_err());
        // Tampered content from the wallet: bad id, dropped.
        let mut tampered = wire::response_event(
            &wallet,
            &app.public_key(),
            req.id,
            Encryption::Nip44V2,
            &body,
        )
        .unwrap();
        let real = tampered.clone();
        tampered.content.push('A');
        s.handle_event(&tampered);
        assert!(rx.try_recv().is_err());
        s.handle_event(&real);
        assert_eq!(rx.try_recv().unwrap().id, real.id);
    }

    #[test]
    fn info_parsing_picks_the_encryption() {
        let w = Keys::generate();
        let both = wire::info_event(
            &w,
            &["get_balance", "pay_invoice"],
            &[Encryption::Nip04, Encryption::Nip44V2],
            &["payment_received"],
        )
        .unwrap();
        let (info, enc) = parse_info(&both).unwrap();
        assert_eq!(enc, Encryption::Nip44V2);
        assert_eq!(info.methods, ["get_balance", "pay_invoice"]);
        assert_eq!(info.notifications, ["payment_received"]);
        let legacy = nostr_sdk::EventBuilder::new(Kind::from(KIND_INFO), "get_balance")
            .sign_with_keys(&w)
            .unwrap();
        let (info, enc) = parse_info(&legacy).unwrap();
        assert_eq!(enc, Encryption::Nip04);
        assert_eq!(info.encryptions, [Encryption::Nip04]);
        let future = nostr_sdk::EventBuilder::new(Kind::from(KIND_INFO), "get_balance")
            .tag(nostr_sdk::Tag::custom(
                TagKind::custom("encryption"),
                ["nip44_v3"],
            ))
            .sign_with_keys(&w)
            .unwrap();
        assert_eq!(
            parse_info(&future).unwrap_err(),
            NwcError::UnsupportedEncryption
        );
    }

    #[test]
    fn error_codes_and_retryability() {
        let e = NwcError::Wallet {
            code: ErrorCode::from("BAD_REQUEST"),
            message: String::new(),
        };
        assert_eq!(e.code(), "BAD_REQUEST");
        assert!(!e.is_retryable());
        assert!(NwcError::Timeout { method: "x".into() }.is_retryable());
        assert_eq!(NwcError::Protocol(String::new()).code(), "PROTOCOL");
    }
}
