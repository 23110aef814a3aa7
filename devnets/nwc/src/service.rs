//! The NIP-47 wallet service of the devnet: one nostr client on the relay, serving every
//! connection (one wallet-service key and one client key each) and relaying the network's
//! notifications. Per-wallet fault knobs make it misbehave on purpose.

use std::collections::{HashMap, HashSet, VecDeque};
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Duration;

use lightning_invoice::Bolt11Invoice;
use nostr_sdk::prelude::{
    Client, Event, EventBuilder, EventId, Filter, Keys, Kind, PublicKey, RelayMessage,
    RelayNotification, RelayOptions, RelayPoolNotification, RelayStatus, RelayUrl, SubscriptionId,
    Tag, TagKind, Timestamp,
};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;

use super::DevnetError;
use super::network::{
    BLOCK_HEIGHT, ListFilter, Lookup, NetError, NetEvent, Network, NotificationKind,
};
use rail_ln_nwc::nip47::{
    ConnectionUri, Encryption, ErrorBody, ErrorCode, KIND_REQUEST, KIND_RESPONSE,
    MakeHoldInvoiceParams, MakeInvoiceParams, PayInvoiceParams, PayInvoiceResult, Request,
    Response, Transaction, TxState,
};
use rail_ln_nwc::wire::{self, WireError};

/// Every method the service implements.
pub const METHODS: [&str; 9] = [
    "pay_invoice",
    "make_invoice",
    "make_hold_invoice",
    "settle_hold_invoice",
    "cancel_hold_invoice",
    "lookup_invoice",
    "get_balance",
    "get_info",
    "list_transactions",
];

/// How long an `out_of_order` response waits for the next one before going out anyway.
pub const OUT_OF_ORDER_HOLD: Duration = Duration::from_millis(300);
/// Reconnect interval of the service's relay connection.
const RETRY_INTERVAL: Duration = Duration::from_millis(300);
/// Publishing is retried (every 100 ms) for this many attempts while the relay is down.
const PUBLISH_ATTEMPTS: u32 = 150;
/// How many times a subscription is sent before giving up on its EOSE (3 s each).
const RESUBSCRIBE_ATTEMPTS: u32 = 5;
/// Request ids remembered for deduplication.
const SEEN_CAPACITY: usize = 100_000;

/// Misbehaviours of one wallet's service, settable at run time. `Default` = well-behaved.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Ignore requests (nothing is executed, nothing answered) and send no notifications.
    pub silent: bool,
    /// Wait this long before publishing each response (after executing the request).
    pub delay: Option<Duration>,
    /// Hold each response back until the next response of the same connection has been
    /// published (or [`OUT_OF_ORDER_HOLD`] has passed).
    pub out_of_order: bool,
    /// Responses decrypt to truncated, unparsable JSON.
    pub malformed_content: bool,
    /// Responses carry another method's `result_type` (`get_balance`, or `get_info` for a
    /// `get_balance` request).
    pub wrong_result_type: bool,
    /// Responses lack the `e` tag (the request id).
    pub missing_e_tag: bool,
    /// Responses lack the `p` tag (the client).
    pub missing_p_tag: bool,
    /// Every notification is published twice (two distinct events).
    pub duplicate_notifications: bool,
    /// `lookup_invoice` says settled (with a made-up preimage); `pay_invoice` returns a random
    /// preimage without paying.
    pub lie_about_settlement: bool,
    /// Execute requests but never publish the responses (a lost response).
    pub drop_responses: bool,
    /// Answer every request with this error code, without executing it.
    pub fail_with: Option<ErrorCode>,
    /// Miss this many requests from now on, as when a relay loses them (a request reaching a
    /// relay while the service's subscription is being re-established): nothing is run,
    /// nothing answered, and the request's id is not remembered.
    pub miss_requests: u32,
}

/// One connection (an app's access to a wallet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnectionSpec {
    /// The network wallet it spends from.
    pub wallet: String,
    /// Speak NIP-04 only (info event `encryption` = `nip04`, notifications kind 23196,
    /// NIP-44 requests answered `UNSUPPORTED_ENCRYPTION`).
    pub nip04_only: bool,
    /// Only these methods (others known ones are answered `RESTRICTED`); `None` = all.
    pub allowed_methods: Option<Vec<String>>,
    /// Total msat this connection may pay (`QUOTA_EXCEEDED` beyond); `None` = unlimited.
    pub budget_msat: Option<u64>,
}

struct Connection {
    wallet: String,
    keys: Keys,
    client: PublicKey,
    /// Supported encryptions, preferred first.
    encryptions: Vec<Encryption>,
    methods: Vec<&'static str>,
    /// (limit, spent or reserved)
    budget: Option<Mutex<(u64, u64)>>,
    held: Mutex<Option<Event>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Connection {
    fn preferred(&self) -> Encryption {
        self.encryptions
            .first()
            .copied()
            .unwrap_or(Encryption::Nip04)
    }

    /// The encryptions notifications go out in, NIP-44 first: a connection that speaks both
    /// gets each notification twice, kind 23197 (NIP-44) then kind 23196 (NIP-04), as wallet
    /// services in the field publish them — NIP-04-only clients (the ContextVM SDK 0.11.14's
    /// `NwcClient`, which decrypts both kinds with NIP-04) listen on 23196 only.
    fn notification_encryptions(&self) -> Vec<Encryption> {
        let mut out = Vec::with_capacity(2);
        if self.encryptions.contains(&Encryption::Nip44V2) {
            out.push(Encryption::Nip44V2);
        }
        if self.encryptions.contains(&Encryption::Nip04) || out.is_empty() {
            out.push(Encryption::Nip04);
        }
        out
    }

    fn reserve(&self, amount: u64) -> Result<(), NetError> {
        if let Some(b) = &self.budget {
            let mut b = lock(b);
            let (limit, spent) = *b;
            if spent.saturating_add(amount) > limit {
                return Err(NetError::new(
                    ErrorCode::QuotaExceeded,
                    format!("budget {limit} msat, {spent} msat used"),
                ));
            }
            b.1 = spent.saturating_add(amount);
        }
        Ok(())
    }

    fn release(&self, amount: u64) {
        if let Some(b) = &self.budget {
            let mut b = lock(b);
            b.1 = b.1.saturating_sub(amount);
        }
    }
}

#[derive(Default)]
struct Seen {
    set: HashSet<EventId>,
    order: VecDeque<EventId>,
}

impl Seen {
    fn insert(&mut self, id: EventId) -> bool {
        if !self.set.insert(id) {
            return false;
        }
        self.order.push_back(id);
        if self.order.len() > SEEN_CAPACITY
            && let Some(old) = self.order.pop_front()
        {
            self.set.remove(&old);
        }
        true
    }
}

struct Inner {
    client: Client,
    url: RelayUrl,
    network: Network,
    sub_id: SubscriptionId,
    /// Serializes (re)subscriptions so the last REQ carries the newest filter.
    sub_lock: tokio::sync::Mutex<()>,
    conns: RwLock<HashMap<PublicKey, Arc<Connection>>>,
    faults: Mutex<HashMap<String, Faults>>,
    seen: Mutex<Seen>,
    /// Requests taken (first copies of request events for a known connection).
    taken: std::sync::atomic::AtomicU64,
}

/// The wallet service. Dropping it stops its tasks.
pub struct WalletService {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for WalletService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WalletService")
            .field("relay", &self.inner.url.as_str())
            .finish_non_exhaustive()
    }
}

impl Drop for WalletService {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn params<T: DeserializeOwned>(req: &Request) -> Result<T, NetError> {
    let v = if req.params.is_null() {
        json!({})
    } else {
        req.params.clone()
    };
    serde_json::from_value(v)
        .map_err(|e| NetError::new(ErrorCode::Other, format!("invalid params: {e}")))
}

fn to_value<T: serde::Serialize>(v: &T) -> Result<Value, NetError> {
    serde_json::to_value(v).map_err(|e| NetError::new(ErrorCode::Internal, e.to_string()))
}

fn random_hex32() -> String {
    hex::encode(rand::random::<[u8; 32]>())
}

#[derive(Deserialize)]
struct SettleParams {
    preimage: String,
}

#[derive(Deserialize)]
struct CancelParams {
    payment_hash: String,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct LookupParams {
    payment_hash: Option<String>,
    invoice: Option<String>,
}

impl WalletService {
    /// Connects to the relay at `relay_url` and starts serving (no connection yet).
    ///
    /// # Errors
    /// [`DevnetError::Client`] if the relay is unreachable.
    pub async fn start(relay_url: &str, network: Network) -> Result<WalletService, DevnetError> {
        let url = RelayUrl::parse(relay_url).map_err(|e| DevnetError::Client(e.to_string()))?;
        let client = Client::builder().build();
        client
            .pool()
            .add_relay(
                url.clone(),
                RelayOptions::new()
                    .retry_interval(RETRY_INTERVAL)
                    .adjust_retry_interval(false),
            )
            .await
            .map_err(|e| DevnetError::Client(e.to_string()))?;
        let requests = client.notifications();
        client.connect().await;
        client.wait_for_connection(Duration::from_secs(5)).await;
        let relay = client
            .relay(url.clone())
            .await
            .map_err(|e| DevnetError::Client(e.to_string()))?;
        if relay.status() != RelayStatus::Connected {
            return Err(DevnetError::Client(format!("cannot connect to {url}")));
        }
        let status = relay.notifications();
        let inner = Arc::new(Inner {
            client,
            url,
            network: network.clone(),
            sub_id: SubscriptionId::new("nwc-devnet-requests"),
            sub_lock: tokio::sync::Mutex::new(()),
            conns: RwLock::new(HashMap::new()),
            faults: Mutex::new(HashMap::new()),
            seen: Mutex::new(Seen::default()),
            taken: std::sync::atomic::AtomicU64::new(0),
        });
        let tasks = vec![
            tokio::spawn(request_loop(inner.clone(), requests)),
            tokio::spawn(notification_loop(inner.clone(), network.subscribe())),
            tokio::spawn(resubscribe_loop(inner.clone(), status)),
        ];
        Ok(WalletService { inner, tasks })
    }

    /// Adds a connection to a network wallet: new wallet-service keys and client secret,
    /// publishes its info event (kind 13194) and waits until requests to it are subscribed.
    ///
    /// # Errors
    /// [`DevnetError::UnknownWallet`], [`DevnetError::Client`] / [`DevnetError::Timeout`] on
    /// relay trouble.
    pub async fn add_connection(&self, spec: ConnectionSpec) -> Result<ConnectionUri, DevnetError> {
        if !self.inner.network.wallets().contains(&spec.wallet) {
            return Err(DevnetError::UnknownWallet(spec.wallet));
        }
        let keys = Keys::generate();
        let client_keys = Keys::generate();
        let encryptions = if spec.nip04_only {
            vec![Encryption::Nip04]
        } else {
            vec![Encryption::Nip44V2, Encryption::Nip04]
        };
        let methods: Vec<&'static str> = METHODS
            .iter()
            .copied()
            .filter(|m| {
                spec.allowed_methods
                    .as_ref()
                    .is_none_or(|a| a.iter().any(|x| x == m))
            })
            .collect();
        let notifications: Vec<&str> = NotificationKind::ALL.iter().map(|k| k.as_str()).collect();
        let info = wire::info_event(&keys, &methods, &encryptions, &notifications)?;
        let conn = Arc::new(Connection {
            wallet: spec.wallet.clone(),
            keys: keys.clone(),
            client: client_keys.public_key(),
            encryptions,
            methods,
            budget: spec.budget_msat.map(|b| Mutex::new((b, 0))),
            held: Mutex::new(None),
        });
        self.inner
            .conns
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(keys.public_key(), conn);
        if !self.inner.publish(&info).await {
            return Err(DevnetError::Client("cannot publish the info event".into()));
        }
        self.inner.resubscribe(true).await?;
        Ok(ConnectionUri {
            wallet_pubkey: keys.public_key().to_hex(),
            relays: vec![self.inner.url.to_string()],
            secret: client_keys.secret_key().to_secret_hex(),
            lud16: None,
        })
    }

    /// Sets a wallet's faults (for all its connections), effective for the next request.
    pub fn set_faults(&self, wallet: &str, faults: Faults) {
        lock(&self.inner.faults).insert(wallet.to_owned(), faults);
    }

    /// A wallet's current faults.
    #[must_use]
    pub fn faults(&self, wallet: &str) -> Faults {
        self.inner.faults(wallet)
    }

    /// Waits (up to `timeout`) until the service is connected to the relay and its request
    /// subscription is live again (after a relay restart).
    ///
    /// # Errors
    /// [`DevnetError::Timeout`].
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), DevnetError> {
        self.wait_ready_after(0, timeout).await
    }

    /// How many times the service has connected to the relay so far.
    ///
    /// # Errors
    /// [`DevnetError::Client`] if the relay is not in the service's pool.
    pub async fn connections(&self) -> Result<usize, DevnetError> {
        let relay = self
            .inner
            .client
            .relay(self.inner.url.clone())
            .await
            .map_err(|e| DevnetError::Client(e.to_string()))?;
        Ok(relay.stats().success())
    }

    /// As [`WalletService::wait_ready`], on a connection made after the first `connections`
    /// ([`WalletService::connections`] before a relay restart): a status still `Connected`
    /// from the connection the restart cut is not taken for the new one.
    ///
    /// # Errors
    /// [`DevnetError::Timeout`].
    pub async fn wait_ready_after(
        &self,
        connections: usize,
        timeout: Duration,
    ) -> Result<(), DevnetError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let relay = self
            .inner
            .client
            .relay(self.inner.url.clone())
            .await
            .map_err(|e| DevnetError::Client(e.to_string()))?;
        while relay.status() != RelayStatus::Connected || relay.stats().success() <= connections {
            if tokio::time::Instant::now() >= deadline {
                return Err(DevnetError::Timeout("service reconnect".into()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::timeout_at(deadline, self.inner.resubscribe(true))
            .await
            .map_err(|_| DevnetError::Timeout("service resubscribe".into()))?
    }

    /// How many requests the service has taken so far (each request event once, whether or
    /// not it answers): a test that lost a request can tell whether the service ever saw it.
    #[must_use]
    pub fn requests_taken(&self) -> u64 {
        self.inner.taken.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Disconnects from the relay and stops serving.
    pub async fn shutdown(&self) {
        for t in &self.tasks {
            t.abort();
        }
        self.inner.client.shutdown().await;
    }
}

async fn request_loop(
    inner: Arc<Inner>,
    mut rx: tokio::sync::broadcast::Receiver<RelayPoolNotification>,
) {
    loop {
        match rx.recv().await {
            Ok(RelayPoolNotification::Event { event, .. }) => {
                if event.kind == Kind::from(KIND_REQUEST) {
                    let inner = inner.clone();
                    tokio::spawn(async move { inner.handle_request(*event).await });
                }
            }
            Ok(RelayPoolNotification::Shutdown) | Err(RecvError::Closed) => break,
            Ok(RelayPoolNotification::Message { .. }) => {}
            Err(RecvError::Lagged(n)) => tracing::warn!("wallet service lagged, {n} messages lost"),
        }
    }
}

async fn notification_loop(
    inner: Arc<Inner>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<NetEvent>,
) {
    while let Some(ev) = rx.recv().await {
        inner.notify(&ev).await;
    }
}

/// Works around nostr-relay-pool 0.44 skipping re-subscription when it reconnects within the
/// same wall-clock second as the original subscribe: re-sends the REQ on every reconnect.
async fn resubscribe_loop(
    inner: Arc<Inner>,
    mut rx: tokio::sync::broadcast::Receiver<RelayNotification>,
) {
    loop {
        match rx.recv().await {
            Ok(RelayNotification::RelayStatus {
                status: RelayStatus::Connected,
            }) => {
                if let Err(e) = inner.resubscribe(false).await {
                    tracing::warn!("wallet service resubscribe: {e}");
                }
            }
            Ok(RelayNotification::Shutdown) | Err(RecvError::Closed) => break,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
        }
    }
}

impl Inner {
    fn faults(&self, wallet: &str) -> Faults {
        lock(&self.faults).get(wallet).cloned().unwrap_or_default()
    }

    fn conns(&self) -> std::sync::RwLockReadGuard<'_, HashMap<PublicKey, Arc<Connection>>> {
        self.conns.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn filter(&self) -> Option<Filter> {
        let conns = self.conns();
        if conns.is_empty() {
            // A filter without `#p` would match every request on the relay.
            return None;
        }
        Some(
            Filter::new()
                .kind(Kind::from(KIND_REQUEST))
                .pubkeys(conns.keys().copied()),
        )
    }

    /// (Re-)sends the request subscription; with `wait`, until the relay's EOSE.
    async fn resubscribe(&self, wait: bool) -> Result<(), DevnetError> {
        let _guard = self.sub_lock.lock().await;
        let Some(filter) = self.filter() else {
            return Ok(());
        };
        // Under load a subscription sent just as the relay comes back can go unanswered:
        // send it again (same id) until the relay confirms it with EOSE.
        for _ in 0..RESUBSCRIBE_ATTEMPTS {
            let mut rx = self.client.notifications();
            self.client
                .subscribe_with_id(self.sub_id.clone(), filter.clone(), None)
                .await
                .map_err(|e| DevnetError::Client(e.to_string()))?;
            if !wait {
                return Ok(());
            }
            let eose = async {
                loop {
                    match rx.recv().await {
                        Ok(RelayPoolNotification::Message {
                            message: RelayMessage::EndOfStoredEvents(sid),
                            ..
                        }) if *sid == self.sub_id => return true,
                        Ok(_) | Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => return false,
                    }
                }
            };
            if let Ok(true) = tokio::time::timeout(Duration::from_secs(3), eose).await {
                return Ok(());
            }
        }
        Err(DevnetError::Timeout("request subscription (EOSE)".into()))
    }

    /// Publishes, retrying while the relay is down. A publish reported as failed may still be
    /// delivered after a reconnect; receivers dedupe by event id.
    async fn publish(&self, ev: &Event) -> bool {
        for _ in 0..PUBLISH_ATTEMPTS {
            match self.client.send_event(ev).await {
                Ok(out) if !out.success.is_empty() => return true,
                Ok(out) => tracing::debug!(id = %ev.id, "publish failed: {:?}", out.failed),
                Err(e) => tracing::debug!(id = %ev.id, "publish error: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tracing::warn!(id = %ev.id, "giving up publishing");
        false
    }

    fn connection_for(&self, ev: &Event) -> Option<Arc<Connection>> {
        let conns = self.conns();
        ev.tags.public_keys().find_map(|pk| conns.get(pk).cloned())
    }

    /// Whether the next request of `wallet` is to be missed ([`Faults::miss_requests`]), counting
    /// it.
    fn misses(&self, wallet: &str) -> bool {
        let mut faults = lock(&self.faults);
        match faults.get_mut(wallet) {
            Some(f) if f.miss_requests > 0 => {
                f.miss_requests -= 1;
                true
            }
            _ => false,
        }
    }

    async fn handle_request(self: Arc<Self>, ev: Event) {
        let Some(conn) = self.connection_for(&ev) else {
            return;
        };
        if self.misses(&conn.wallet) {
            tracing::debug!(id = %ev.id, "request missed (fault)");
            return;
        }
        if ev.is_expired() {
            tracing::debug!(id = %ev.id, "expired request ignored");
            return;
        }
        if !lock(&self.seen).insert(ev.id) {
            tracing::debug!(id = %ev.id, "duplicate request ignored");
            return;
        }
        self.taken
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let faults = self.faults(&conn.wallet);
        if faults.silent {
            return;
        }
        // Absent tag = legacy NIP-04.
        let requested = wire::encryption_tag(&ev).unwrap_or(Some(Encryption::Nip04));
        let supported = requested.filter(|e| conn.encryptions.contains(e));
        let enc = supported.unwrap_or_else(|| conn.preferred());
        let opened: Result<Request, WireError> = match requested {
            Some(r) => wire::open(&conn.keys, &ev, r),
            None => Err(WireError::Crypto("unknown encryption".into())),
        };
        if matches!(opened, Err(WireError::BadEvent)) {
            return;
        }
        let method = opened
            .as_ref()
            .map(|r| r.method.clone())
            .unwrap_or_default();
        let outcome: Result<Value, NetError> = if supported.is_none() {
            Err(NetError::new(
                ErrorCode::UnsupportedEncryption,
                format!(
                    "supported: {}",
                    conn.encryptions
                        .iter()
                        .map(|e| e.as_str())
                        .collect::<Vec<_>>()
                        .join(" ")
                ),
            ))
        } else if ev.pubkey != conn.client {
            Err(NetError::new(ErrorCode::Unauthorized, "unknown connection"))
        } else {
            match opened {
                Err(e) => Err(NetError::new(ErrorCode::Other, format!("bad request: {e}"))),
                Ok(req) => match faults.fail_with.clone() {
                    Some(code) => Err(NetError::new(code, "injected failure")),
                    None => self.dispatch(&conn, &faults, &req).await,
                },
            }
        };
        let response = match outcome {
            Ok(result) => Response {
                result_type: method,
                error: None,
                result: Some(result),
            },
            Err(e) => Response {
                result_type: method,
                error: Some(ErrorBody {
                    code: e.code,
                    message: e.message,
                }),
                result: None,
            },
        };
        self.respond(&conn, &faults, &ev, enc, response).await;
    }

    async fn dispatch(
        &self,
        conn: &Connection,
        faults: &Faults,
        req: &Request,
    ) -> Result<Value, NetError> {
        let method = req.method.as_str();
        if !METHODS.contains(&method) {
            return Err(NetError::new(
                ErrorCode::NotImplemented,
                format!("unknown method {method}"),
            ));
        }
        if !conn.methods.contains(&method) {
            return Err(NetError::new(
                ErrorCode::Restricted,
                format!("{method} is not allowed for this connection"),
            ));
        }
        let wallet = conn.wallet.as_str();
        let net = &self.network;
        match method {
            "pay_invoice" => {
                let p: PayInvoiceParams = params(req)?;
                if faults.lie_about_settlement {
                    return to_value(&PayInvoiceResult {
                        preimage: random_hex32(),
                        fees_paid: Some(0),
                    });
                }
                let amount = if conn.budget.is_some() {
                    Bolt11Invoice::from_str(p.invoice.trim())
                        .ok()
                        .and_then(|i| i.amount_milli_satoshis())
                        .or(p.amount)
                        .unwrap_or_default()
                } else {
                    0
                };
                conn.reserve(amount)?;
                match net.pay(wallet, &p.invoice, p.amount).await {
                    Ok(paid) => to_value(&PayInvoiceResult {
                        preimage: paid.preimage,
                        fees_paid: Some(paid.fees_paid_msat),
                    }),
                    Err(e) => {
                        conn.release(amount);
                        Err(e)
                    }
                }
            }
            "make_invoice" => {
                let p: MakeInvoiceParams = params(req)?;
                to_value(&net.make_invoice(wallet, p.amount, p.description.as_deref(), p.expiry)?)
            }
            "make_hold_invoice" => {
                let p: MakeHoldInvoiceParams = params(req)?;
                to_value(&net.make_hold_invoice(
                    wallet,
                    p.amount,
                    &p.payment_hash,
                    p.description.as_deref(),
                    p.expiry,
                    p.min_cltv_expiry_delta,
                )?)
            }
            "settle_hold_invoice" => {
                let p: SettleParams = params(req)?;
                net.settle_hold_invoice(wallet, &p.preimage)?;
                Ok(json!({}))
            }
            "cancel_hold_invoice" => {
                let p: CancelParams = params(req)?;
                net.cancel_hold_invoice(wallet, &p.payment_hash)?;
                Ok(json!({}))
            }
            "lookup_invoice" => {
                let p: LookupParams = params(req)?;
                let by = match (p.payment_hash, p.invoice) {
                    (Some(h), _) => Lookup::PaymentHash(h),
                    (None, Some(i)) => Lookup::Invoice(i),
                    (None, None) => {
                        return Err(NetError::new(
                            ErrorCode::Other,
                            "payment_hash or invoice required",
                        ));
                    }
                };
                let found = net.lookup_invoice(wallet, &by);
                if faults.lie_about_settlement {
                    return to_value(&lie(found, &by));
                }
                to_value(&found?)
            }
            "get_balance" => Ok(json!({ "balance": net.balance_msat(wallet)? })),
            "get_info" => Ok(json!({
                "alias": wallet,
                "color": "#f7931a",
                "pubkey": net.node_pubkey(wallet)?,
                "network": "regtest",
                "block_height": BLOCK_HEIGHT,
                "block_hash": "0".repeat(64),
                "methods": conn.methods,
                "notifications": NotificationKind::ALL.iter().map(|k| k.as_str()).collect::<Vec<_>>(),
            })),
            "list_transactions" => {
                let f: ListFilter = params(req)?;
                Ok(json!({ "transactions": net.list_transactions(wallet, &f)? }))
            }
            other => Err(NetError::new(
                ErrorCode::NotImplemented,
                format!("unknown method {other}"),
            )),
        }
    }

    fn response_event(
        conn: &Connection,
        faults: &Faults,
        req: &Event,
        enc: Encryption,
        resp: &Response,
    ) -> Result<Event, WireError> {
        if !(faults.malformed_content || faults.missing_e_tag || faults.missing_p_tag) {
            return wire::response_event(&conn.keys, &req.pubkey, req.id, enc, resp);
        }
        let mut plain =
            serde_json::to_string(resp).map_err(|e| WireError::Content(e.to_string()))?;
        if faults.malformed_content {
            plain.truncate(plain.len() / 2);
        }
        let mut tags = Vec::new();
        if !faults.missing_p_tag {
            tags.push(Tag::public_key(req.pubkey));
        }
        if !faults.missing_e_tag {
            tags.push(Tag::event(req.id));
        }
        tags.push(Tag::custom(TagKind::custom("encryption"), [enc.as_str()]));
        EventBuilder::new(
            Kind::from(KIND_RESPONSE),
            wire::seal(&conn.keys, &req.pubkey, enc, &plain)?,
        )
        .tags(tags)
        .sign_with_keys(&conn.keys)
        .map_err(|e| WireError::Build(e.to_string()))
    }

    async fn respond(
        &self,
        conn: &Arc<Connection>,
        faults: &Faults,
        req: &Event,
        enc: Encryption,
        mut resp: Response,
    ) {
        if faults.drop_responses {
            return;
        }
        if faults.wrong_result_type {
            resp.result_type = if resp.result_type == "get_balance" {
                "get_info".into()
            } else {
                "get_balance".into()
            };
        }
        let ev = match Self::response_event(conn, faults, req, enc, &resp) {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!("cannot build response: {e}");
                return;
            }
        };
        if let Some(d) = faults.delay {
            tokio::time::sleep(d).await;
        }
        if !faults.out_of_order {
            self.publish(&ev).await;
            return;
        }
        let earlier = {
            let mut held = lock(&conn.held);
            match held.take() {
                Some(prev) => Some(prev),
                None => {
                    *held = Some(ev.clone());
                    None
                }
            }
        };
        match earlier {
            Some(prev) => {
                self.publish(&ev).await;
                self.publish(&prev).await;
            }
            None => {
                tokio::time::sleep(OUT_OF_ORDER_HOLD).await;
                let still = {
                    let mut held = lock(&conn.held);
                    if held.as_ref().map(|e| e.id) == Some(ev.id) {
                        held.take()
                    } else {
                        None
                    }
                };
                if let Some(ev) = still {
                    self.publish(&ev).await;
                }
            }
        }
    }

    async fn notify(&self, ev: &NetEvent) {
        let faults = self.faults(&ev.wallet);
        if faults.silent {
            return;
        }
        let conns: Vec<Arc<Connection>> = self
            .conns()
            .values()
            .filter(|c| c.wallet == ev.wallet)
            .cloned()
            .collect();
        let content = ev.to_notification();
        let copies = if faults.duplicate_notifications { 2 } else { 1 };
        for conn in conns {
            for enc in conn.notification_encryptions() {
                for _ in 0..copies {
                    match wire::notification_event(&conn.keys, &conn.client, enc, &content) {
                        Ok(n) => {
                            self.publish(&n).await;
                        }
                        Err(e) => tracing::warn!("cannot build notification: {e}"),
                    }
                }
            }
        }
    }
}

/// What a lying wallet answers to `lookup_invoice`: settled, with a preimage that does not
/// hash to the payment hash.
fn lie(found: Result<Transaction, NetError>, by: &Lookup) -> Transaction {
    let mut tx = found.unwrap_or_else(|_| {
        let (hash, amount, invoice) = match by {
            Lookup::PaymentHash(h) => (h.clone(), 0, None),
            Lookup::Invoice(i) => {
                let parsed = Bolt11Invoice::from_str(i.trim()).ok();
                (
                    parsed
                        .as_ref()
                        .map(|p| p.payment_hash().to_string())
                        .unwrap_or_default(),
                    parsed
                        .as_ref()
                        .and_then(Bolt11Invoice::amount_milli_satoshis)
                        .unwrap_or_default(),
                    Some(i.clone()),
                )
            }
        };
        Transaction {
            kind: "outgoing".into(),
            state: None,
            invoice,
            description: None,
            preimage: None,
            payment_hash: hash,
            amount,
            fees_paid: 0,
            created_at: Timestamp::now().as_secs(),
            expires_at: None,
            settled_at: None,
        }
    });
    tx.state = Some(TxState::Settled);
    tx.preimage = Some(random_hex32());
    tx.settled_at = Some(Timestamp::now().as_secs());
    tx
}
