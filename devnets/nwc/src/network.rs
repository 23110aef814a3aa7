//! The Lightning side of the devnet: an in-memory network of wallets, one node key each, whose
//! invoices are real BOLT11 (regtest, signed by the payee's node key) and whose payments move
//! msat between wallets atomically. Hold invoices lock the payer's amount until the payee
//! settles (with the preimage), cancels, or the invoice expires.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bitcoin::hashes::{Hash, sha256};
use bitcoin::secp256k1::{All, PublicKey, Secp256k1, SecretKey};
use lightning_invoice::{Bolt11Invoice, Currency, InvoiceBuilder, PaymentSecret};
use tokio::sync::{mpsc, oneshot};

use rail_ln_nwc::nip47::{ErrorCode, Notification, Transaction, TxState};

/// The devnet's pretend block height (notifications' `settle_deadline` is this plus the
/// invoice's final CLTV delta).
pub const BLOCK_HEIGHT: u32 = 1_000;
/// Invoice expiry when the caller gives none (seconds).
pub const DEFAULT_EXPIRY_SECS: u64 = 3_600;
/// Final CLTV delta when the caller gives none.
pub const DEFAULT_MIN_FINAL_CLTV: u32 = 18;
/// The longest expiry accepted (seconds): ten years.
const MAX_EXPIRY_SECS: u64 = 10 * 365 * 24 * 3_600;

/// A refusal of the network, already in NIP-47 terms.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct NetError {
    /// The NIP-47 error code.
    pub code: ErrorCode,
    /// What went wrong.
    pub message: String,
}

impl NetError {
    /// A refusal with `code`.
    #[must_use]
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        NetError {
            code,
            message: message.into(),
        }
    }

    fn failed(message: impl Into<String>) -> Self {
        NetError::new(ErrorCode::PaymentFailed, message)
    }

    fn other(message: impl Into<String>) -> Self {
        NetError::new(ErrorCode::Other, message)
    }

    fn not_found(message: impl Into<String>) -> Self {
        NetError::new(ErrorCode::NotFound, message)
    }
}

/// The notification types the network emits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NotificationKind {
    /// `payment_received`, to the payee, once a payment settles.
    PaymentReceived,
    /// `payment_sent`, to the payer, once a payment settles.
    PaymentSent,
    /// `hold_invoice_accepted`, to the payee, when a hold invoice's payment is locked in.
    HoldInvoiceAccepted,
}

impl NotificationKind {
    /// Every kind, for `get_info` and the info event.
    pub const ALL: [NotificationKind; 3] = [
        NotificationKind::PaymentReceived,
        NotificationKind::PaymentSent,
        NotificationKind::HoldInvoiceAccepted,
    ];

    /// The wire name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            NotificationKind::PaymentReceived => "payment_received",
            NotificationKind::PaymentSent => "payment_sent",
            NotificationKind::HoldInvoiceAccepted => "hold_invoice_accepted",
        }
    }
}

/// Something that happened to a wallet, to be notified to its connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetEvent {
    /// The wallet concerned.
    pub wallet: String,
    /// What happened.
    pub kind: NotificationKind,
    /// The transaction as the wallet sees it.
    pub transaction: Transaction,
    /// For `hold_invoice_accepted`: the (pretend) block height by which to settle.
    pub settle_deadline: Option<u32>,
}

impl NetEvent {
    /// The NIP-47 notification content.
    #[must_use]
    pub fn to_notification(&self) -> Notification {
        let mut body = serde_json::to_value(&self.transaction).unwrap_or_default();
        if let (Some(deadline), Some(obj)) = (self.settle_deadline, body.as_object_mut()) {
            obj.insert("settle_deadline".into(), deadline.into());
        }
        Notification {
            notification_type: self.kind.as_str().to_owned(),
            notification: body,
        }
    }
}

/// A settled payment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paid {
    /// Hex preimage (hashes to the invoice's payment hash).
    pub preimage: String,
    /// Hex payment hash.
    pub payment_hash: String,
    /// msat moved.
    pub amount_msat: u64,
    /// msat (always 0: the devnet has no routing fees).
    pub fees_paid_msat: u64,
}

/// What `lookup_invoice` looks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// By payment hash (hex).
    PaymentHash(String),
    /// By BOLT11 invoice.
    Invoice(String),
}

/// `list_transactions` filters (NIP-47 params).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(default)]
pub struct ListFilter {
    /// Created at or after (unix seconds).
    pub from: Option<u64>,
    /// Created at or before (unix seconds).
    pub until: Option<u64>,
    /// At most this many.
    pub limit: Option<u64>,
    /// Skip this many (newest first).
    pub offset: Option<u64>,
    /// Include unsettled ones (pending, accepted, expired, failed).
    pub unpaid: bool,
    /// `incoming` or `outgoing`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InvState {
    Open,
    Accepted,
    Settled,
    Canceled,
    Expired,
}

type Waiter = oneshot::Sender<Result<[u8; 32], NetError>>;

struct Invoice {
    payee: String,
    bolt11: String,
    hash: [u8; 32],
    secret: [u8; 32],
    amount: u64,
    description: String,
    created_at: u64,
    expires_at: u64,
    preimage: Option<[u8; 32]>,
    hold: bool,
    cltv: u32,
    state: InvState,
    payer: Option<String>,
    paid_at: Option<u64>,
    settled_at: Option<u64>,
    waiter: Option<Waiter>,
}

struct WalletState {
    node_sk: SecretKey,
    node_pk: PublicKey,
    balance: u64,
    locked: u64,
}

#[derive(Default)]
struct State {
    wallets: HashMap<String, WalletState>,
    by_node: HashMap<PublicKey, String>,
    invoices: HashMap<[u8; 32], Invoice>,
    /// (expires_at in unix ms, payment hash) of invoices that may still lapse.
    deadlines: BTreeSet<(u64, [u8; 32])>,
    subscribers: Vec<mpsc::UnboundedSender<NetEvent>>,
}

/// The in-memory Lightning network. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Network {
    state: Arc<Mutex<State>>,
    secp: Arc<Secp256k1<All>>,
}

impl fmt::Debug for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("Network")
            .field("wallets", &st.wallets.len())
            .field("invoices", &st.invoices.len())
            .finish_non_exhaustive()
    }
}

impl Default for Network {
    fn default() -> Self {
        Network::new()
    }
}

fn now_ms() -> u64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn now_secs() -> u64 {
    now_ms() / 1_000
}

fn hex32(s: &str, what: &str) -> Result<[u8; 32], NetError> {
    let bytes = hex::decode(s.trim()).map_err(|_| NetError::other(format!("{what} is not hex")))?;
    <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| NetError::other(format!("{what} is not 32 bytes")))
}

fn random_secret_key() -> SecretKey {
    loop {
        if let Ok(sk) = SecretKey::from_slice(&rand::random::<[u8; 32]>()) {
            return sk;
        }
    }
}

fn parse_invoice(bolt11: &str) -> Result<Bolt11Invoice, NetError> {
    let inv = Bolt11Invoice::from_str(bolt11.trim())
        .map_err(|e| NetError::other(format!("invalid invoice: {e}")))?;
    inv.check_signature()
        .map_err(|e| NetError::other(format!("invalid invoice signature: {e}")))?;
    Ok(inv)
}

impl State {
    fn wallet(&self, name: &str) -> Result<&WalletState, NetError> {
        self.wallets
            .get(name)
            .ok_or_else(|| NetError::not_found(format!("unknown wallet {name}")))
    }

    fn wallet_mut(&mut self, name: &str) -> Result<&mut WalletState, NetError> {
        self.wallets
            .get_mut(name)
            .ok_or_else(|| NetError::not_found(format!("unknown wallet {name}")))
    }

    fn emit(&mut self, ev: &NetEvent) {
        self.subscribers.retain(|s| s.send(ev.clone()).is_ok());
    }

    /// Lapses what is due: open invoices expire, accepted hold invoices are canceled (the payer
    /// is refunded and its payment fails).
    fn sweep(&mut self, now: u64) {
        while let Some(&(at, hash)) = self.deadlines.first() {
            if at > now {
                break;
            }
            self.deadlines.remove(&(at, hash));
            let Some(inv) = self.invoices.get_mut(&hash) else {
                continue;
            };
            match inv.state {
                InvState::Open => inv.state = InvState::Expired,
                InvState::Accepted => {
                    let _ = self.cancel_accepted(hash, "hold invoice expired before settlement");
                }
                InvState::Settled | InvState::Canceled | InvState::Expired => {}
            }
        }
    }

    /// Cancels an accepted hold invoice: the payer's locked amount goes back to its balance.
    fn cancel_accepted(&mut self, hash: [u8; 32], why: &str) -> Result<(), NetError> {
        let inv = self
            .invoices
            .get_mut(&hash)
            .ok_or_else(|| NetError::not_found("no such invoice"))?;
        inv.state = InvState::Canceled;
        let amount = inv.amount;
        let waiter = inv.waiter.take();
        let payer = inv.payer.clone();
        if let Some(payer) = payer {
            let w = self.wallet_mut(&payer)?;
            w.locked = w.locked.saturating_sub(amount);
            w.balance = w.balance.saturating_add(amount);
        }
        if let Some(tx) = waiter {
            let _ = tx.send(Err(NetError::failed(why)));
        }
        Ok(())
    }

    fn tx_view(&self, inv: &Invoice, wallet: &str) -> Transaction {
        let incoming = inv.payee == wallet;
        let state = match (inv.state, incoming) {
            (InvState::Open, _) | (InvState::Accepted, false) => TxState::Pending,
            (InvState::Accepted, true) => TxState::Accepted,
            (InvState::Settled, _) => TxState::Settled,
            (InvState::Canceled, _) => TxState::Failed,
            (InvState::Expired, _) => TxState::Expired,
        };
        let settled = inv.state == InvState::Settled;
        Transaction {
            kind: if incoming { "incoming" } else { "outgoing" }.to_owned(),
            state: Some(state),
            invoice: Some(inv.bolt11.clone()),
            description: Some(inv.description.clone()),
            preimage: inv.preimage.filter(|_| settled).map(hex::encode),
            payment_hash: hex::encode(inv.hash),
            amount: inv.amount,
            fees_paid: 0,
            created_at: if incoming {
                inv.created_at
            } else {
                inv.paid_at.unwrap_or(inv.created_at)
            },
            expires_at: Some(inv.expires_at),
            settled_at: inv.settled_at,
        }
    }

    /// Settles `hash` (already accepted or just paid): credits the payee, releases the payer's
    /// side, notifies both, and wakes a waiting payer.
    fn settle(&mut self, hash: [u8; 32], preimage: [u8; 32]) -> Result<(), NetError> {
        let now = now_secs();
        let inv = self
            .invoices
            .get_mut(&hash)
            .ok_or_else(|| NetError::not_found("no such invoice"))?;
        inv.state = InvState::Settled;
        inv.preimage = Some(preimage);
        inv.settled_at = Some(now);
        let (amount, payee, payer, hold) =
            (inv.amount, inv.payee.clone(), inv.payer.clone(), inv.hold);
        let waiter = inv.waiter.take();
        if hold && let Some(p) = &payer {
            let w = self.wallet_mut(p)?;
            w.locked = w.locked.saturating_sub(amount);
        }
        let w = self.wallet_mut(&payee)?;
        w.balance = w.balance.saturating_add(amount);
        if let Some(tx) = waiter {
            let _ = tx.send(Ok(preimage));
        }
        if let Some(inv) = self.invoices.get(&hash) {
            let received = NetEvent {
                wallet: payee.clone(),
                kind: NotificationKind::PaymentReceived,
                transaction: self.tx_view(inv, &payee),
                settle_deadline: None,
            };
            let sent = payer.as_deref().map(|p| NetEvent {
                wallet: p.to_owned(),
                kind: NotificationKind::PaymentSent,
                transaction: self.tx_view(inv, p),
                settle_deadline: None,
            });
            self.emit(&received);
            if let Some(sent) = sent {
                self.emit(&sent);
            }
        }
        Ok(())
    }
}

enum Started {
    Done([u8; 32]),
    Held(oneshot::Receiver<Result<[u8; 32], NetError>>, u64),
}

impl Network {
    /// An empty network.
    #[must_use]
    pub fn new() -> Self {
        Network {
            state: Arc::new(Mutex::new(State::default())),
            secp: Arc::new(Secp256k1::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks the state after lapsing whatever is due.
    fn swept(&self) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        st.sweep(now_ms());
        st
    }

    /// Applies due expiries now (they are also applied lazily by every other call).
    pub fn sweep(&self) {
        drop(self.swept());
    }

    /// Events (notifications) from now on, for every wallet.
    pub fn subscribe(&self) -> mpsc::UnboundedReceiver<NetEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.lock().subscribers.push(tx);
        rx
    }

    /// Adds a wallet with its own node key and `balance_msat`; returns the node public key
    /// (hex, compressed).
    ///
    /// # Errors
    /// `OTHER` if the name is taken.
    pub fn add_wallet(&self, name: &str, balance_msat: u64) -> Result<String, NetError> {
        let mut st = self.lock();
        if st.wallets.contains_key(name) {
            return Err(NetError::other(format!("wallet {name} already exists")));
        }
        let node_sk = random_secret_key();
        let node_pk = PublicKey::from_secret_key(&self.secp, &node_sk);
        st.by_node.insert(node_pk, name.to_owned());
        st.wallets.insert(
            name.to_owned(),
            WalletState {
                node_sk,
                node_pk,
                balance: balance_msat,
                locked: 0,
            },
        );
        Ok(node_pk.to_string())
    }

    /// The wallets' names.
    #[must_use]
    pub fn wallets(&self) -> Vec<String> {
        let mut names: Vec<String> = self.lock().wallets.keys().cloned().collect();
        names.sort();
        names
    }

    /// The wallet's node public key (hex).
    ///
    /// # Errors
    /// `NOT_FOUND` for an unknown wallet.
    pub fn node_pubkey(&self, wallet: &str) -> Result<String, NetError> {
        Ok(self.lock().wallet(wallet)?.node_pk.to_string())
    }

    /// Spendable msat (amounts locked by pending hold payments excluded).
    ///
    /// # Errors
    /// `NOT_FOUND` for an unknown wallet.
    pub fn balance_msat(&self, wallet: &str) -> Result<u64, NetError> {
        Ok(self.swept().wallet(wallet)?.balance)
    }

    /// msat locked in outgoing hold payments not yet settled or canceled.
    ///
    /// # Errors
    /// `NOT_FOUND` for an unknown wallet.
    pub fn locked_msat(&self, wallet: &str) -> Result<u64, NetError> {
        Ok(self.swept().wallet(wallet)?.locked)
    }

    /// Adds `msat` to a wallet's balance (a faucet).
    ///
    /// # Errors
    /// `NOT_FOUND` for an unknown wallet.
    pub fn fund(&self, wallet: &str, msat: u64) -> Result<(), NetError> {
        let mut st = self.lock();
        let w = st.wallet_mut(wallet)?;
        w.balance = w.balance.saturating_add(msat);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn create_invoice(
        &self,
        wallet: &str,
        amount_msat: u64,
        hash: [u8; 32],
        preimage: Option<[u8; 32]>,
        description: Option<&str>,
        expiry_secs: Option<u64>,
        cltv: u32,
    ) -> Result<Transaction, NetError> {
        if amount_msat == 0 {
            return Err(NetError::other("amount must be positive"));
        }
        let expiry = expiry_secs.unwrap_or(DEFAULT_EXPIRY_SECS);
        if expiry == 0 || expiry > MAX_EXPIRY_SECS {
            return Err(NetError::other(format!(
                "expiry must be 1..={MAX_EXPIRY_SECS} seconds"
            )));
        }
        let description = description.unwrap_or_default().to_owned();
        let mut st = self.swept();
        if st.invoices.contains_key(&hash) {
            return Err(NetError::other("an invoice with this payment hash exists"));
        }
        let w = st.wallet(wallet)?;
        let node_sk = w.node_sk;
        let created_at = now_secs();
        let secret = rand::random::<[u8; 32]>();
        let secp = &self.secp;
        let invoice = InvoiceBuilder::new(Currency::Regtest)
            .description(description.clone())
            .payment_hash(sha256::Hash::from_byte_array(hash))
            .payment_secret(PaymentSecret(secret))
            .amount_milli_satoshis(amount_msat)
            .duration_since_epoch(Duration::from_secs(created_at))
            .expiry_time(Duration::from_secs(expiry))
            .min_final_cltv_expiry_delta(u64::from(cltv))
            .build_signed(|msg| secp.sign_ecdsa_recoverable(msg, &node_sk))
            .map_err(|e| NetError::other(format!("cannot build invoice: {e}")))?;
        let expires_at = created_at.saturating_add(expiry);
        let inv = Invoice {
            payee: wallet.to_owned(),
            bolt11: invoice.to_string(),
            hash,
            secret,
            amount: amount_msat,
            description,
            created_at,
            expires_at,
            preimage,
            hold: preimage.is_none(),
            cltv,
            state: InvState::Open,
            payer: None,
            paid_at: None,
            settled_at: None,
            waiter: None,
        };
        let tx = st.tx_view(&inv, wallet);
        st.deadlines
            .insert((expires_at.saturating_mul(1_000), hash));
        st.invoices.insert(hash, inv);
        Ok(tx)
    }

    /// A regular invoice of `wallet`: the network picks (and keeps) the preimage.
    ///
    /// # Errors
    /// `OTHER` for a zero amount or a bad expiry, `NOT_FOUND` for an unknown wallet.
    pub fn make_invoice(
        &self,
        wallet: &str,
        amount_msat: u64,
        description: Option<&str>,
        expiry_secs: Option<u64>,
    ) -> Result<Transaction, NetError> {
        let preimage = rand::random::<[u8; 32]>();
        let hash = sha256::Hash::hash(&preimage).to_byte_array();
        self.create_invoice(
            wallet,
            amount_msat,
            hash,
            Some(preimage),
            description,
            expiry_secs,
            DEFAULT_MIN_FINAL_CLTV,
        )
    }

    /// A hold invoice of `wallet` for the given payment hash (hex); the network never knows the
    /// preimage until the payee settles.
    ///
    /// # Errors
    /// `OTHER` for a bad hash, amount or expiry, or a hash already used.
    pub fn make_hold_invoice(
        &self,
        wallet: &str,
        amount_msat: u64,
        payment_hash: &str,
        description: Option<&str>,
        expiry_secs: Option<u64>,
        min_cltv_expiry_delta: Option<u32>,
    ) -> Result<Transaction, NetError> {
        let hash = hex32(payment_hash, "payment_hash")?;
        self.create_invoice(
            wallet,
            amount_msat,
            hash,
            None,
            description,
            expiry_secs,
            min_cltv_expiry_delta.unwrap_or(DEFAULT_MIN_FINAL_CLTV),
        )
    }

    fn start_pay(
        &self,
        payer: &str,
        parsed: &Bolt11Invoice,
        amount_msat: Option<u64>,
    ) -> Result<Started, NetError> {
        if parsed.currency() != Currency::Regtest {
            return Err(NetError::failed("invoice is not for regtest"));
        }
        if parsed.is_expired() {
            return Err(NetError::failed("invoice expired"));
        }
        let amount = match (parsed.amount_milli_satoshis(), amount_msat) {
            (Some(a), None) => a,
            (Some(a), Some(b)) if a == b => a,
            (Some(_), Some(_)) => {
                return Err(NetError::other("amount differs from the invoice's"));
            }
            (None, Some(b)) if b > 0 => b,
            (None, _) => return Err(NetError::other("amount required")),
        };
        let hash = parsed.payment_hash().to_byte_array();
        let payee_node = parsed.recover_payee_pub_key();
        let mut st = self.swept();
        st.wallet(payer)?;
        let Some(payee) = st.by_node.get(&payee_node).cloned() else {
            return Err(NetError::failed("no route to the payee"));
        };
        if payee == payer {
            return Err(NetError::failed("self-payment"));
        }
        let inv = st
            .invoices
            .get(&hash)
            .filter(|i| i.payee == payee && i.secret == parsed.payment_secret().0)
            .ok_or_else(|| NetError::failed("unknown invoice (incorrect payment details)"))?;
        match inv.state {
            InvState::Open => {}
            InvState::Accepted | InvState::Settled => {
                return Err(NetError::failed("invoice already paid"));
            }
            InvState::Canceled => return Err(NetError::failed("invoice canceled")),
            InvState::Expired => return Err(NetError::failed("invoice expired")),
        }
        if inv.amount != amount {
            return Err(NetError::failed("amount differs from the invoice's"));
        }
        let (hold, preimage, expires_ms, cltv) = (
            inv.hold,
            inv.preimage,
            inv.expires_at.saturating_mul(1_000),
            inv.cltv,
        );
        let w = st.wallet_mut(payer)?;
        if w.balance < amount {
            return Err(NetError::new(
                ErrorCode::InsufficientBalance,
                format!("balance {} msat < {amount} msat", w.balance),
            ));
        }
        w.balance -= amount;
        if hold {
            w.locked = w.locked.saturating_add(amount);
        }
        let now = now_secs();
        let (tx, rx) = oneshot::channel();
        let Some(inv) = st.invoices.get_mut(&hash) else {
            return Err(NetError::new(ErrorCode::Internal, "invoice vanished"));
        };
        inv.payer = Some(payer.to_owned());
        inv.paid_at = Some(now);
        match preimage {
            Some(preimage) if !hold => {
                st.settle(hash, preimage)?;
                Ok(Started::Done(preimage))
            }
            _ => {
                inv.state = InvState::Accepted;
                inv.waiter = Some(tx);
                if let Some(inv) = st.invoices.get(&hash) {
                    let ev = NetEvent {
                        wallet: payee.clone(),
                        kind: NotificationKind::HoldInvoiceAccepted,
                        transaction: st.tx_view(inv, &payee),
                        settle_deadline: Some(BLOCK_HEIGHT.saturating_add(cltv)),
                    };
                    st.emit(&ev);
                }
                Ok(Started::Held(rx, expires_ms))
            }
        }
    }

    /// Pays `bolt11` from `payer`. A regular invoice settles at once. A hold invoice locks the
    /// amount and this call completes only when the payee settles (`Ok`, with the preimage) or
    /// cancels, or the invoice expires first (`PAYMENT_FAILED`, the amount is released).
    ///
    /// # Errors
    /// `OTHER` (unparsable invoice or bad signature, amount missing or different),
    /// `PAYMENT_FAILED` (expired, no route, self-payment, already paid, canceled),
    /// `INSUFFICIENT_BALANCE`, `NOT_FOUND` (unknown payer).
    pub async fn pay(
        &self,
        payer: &str,
        bolt11: &str,
        amount_msat: Option<u64>,
    ) -> Result<Paid, NetError> {
        let parsed = parse_invoice(bolt11)?;
        let payment_hash = parsed.payment_hash().to_string();
        let amount = parsed
            .amount_milli_satoshis()
            .or(amount_msat)
            .unwrap_or_default();
        let preimage = match self.start_pay(payer, &parsed, amount_msat)? {
            Started::Done(p) => p,
            Started::Held(mut rx, deadline_ms) => loop {
                let wait =
                    Duration::from_millis(deadline_ms.saturating_sub(now_ms()).saturating_add(20));
                match tokio::time::timeout(wait, &mut rx).await {
                    Ok(Ok(outcome)) => break outcome?,
                    Ok(Err(_)) => {
                        return Err(NetError::new(ErrorCode::Internal, "payment abandoned"));
                    }
                    Err(_) => self.sweep(),
                }
            },
        };
        Ok(Paid {
            preimage: hex::encode(preimage),
            payment_hash,
            amount_msat: amount,
            fees_paid_msat: 0,
        })
    }

    /// Settles `wallet`'s accepted hold invoice whose payment hash is sha256(`preimage`):
    /// the payee is credited and the payer's `pay` returns the preimage. Settling again with
    /// the same preimage is a no-op.
    ///
    /// # Errors
    /// `NOT_FOUND` (no hold invoice of this wallet for that hash), `OTHER` (bad hex, not
    /// accepted yet, already canceled or expired).
    pub fn settle_hold_invoice(&self, wallet: &str, preimage: &str) -> Result<(), NetError> {
        let preimage = hex32(preimage, "preimage")?;
        let hash = sha256::Hash::hash(&preimage).to_byte_array();
        let mut st = self.swept();
        let inv = st
            .invoices
            .get(&hash)
            .filter(|i| i.payee == wallet && i.hold)
            .ok_or_else(|| NetError::not_found("no hold invoice for this preimage"))?;
        match inv.state {
            InvState::Accepted => st.settle(hash, preimage),
            InvState::Settled => Ok(()),
            InvState::Open => Err(NetError::other("hold invoice not paid yet")),
            InvState::Canceled => Err(NetError::other("hold invoice canceled")),
            InvState::Expired => Err(NetError::other("hold invoice expired")),
        }
    }

    /// Cancels `wallet`'s hold invoice (hex payment hash): an accepted payment is refunded and
    /// fails; an open invoice can no longer be paid. Canceling again is a no-op.
    ///
    /// # Errors
    /// `NOT_FOUND`, `OTHER` (bad hex, already settled).
    pub fn cancel_hold_invoice(&self, wallet: &str, payment_hash: &str) -> Result<(), NetError> {
        let hash = hex32(payment_hash, "payment_hash")?;
        let mut st = self.swept();
        let inv = st
            .invoices
            .get_mut(&hash)
            .filter(|i| i.payee == wallet && i.hold)
            .ok_or_else(|| NetError::not_found("no hold invoice for this payment hash"))?;
        match inv.state {
            InvState::Accepted => st.cancel_accepted(hash, "hold invoice canceled by the payee"),
            InvState::Open | InvState::Expired => {
                inv.state = InvState::Canceled;
                Ok(())
            }
            InvState::Canceled => Ok(()),
            InvState::Settled => Err(NetError::other("hold invoice already settled")),
        }
    }

    /// An invoice (incoming) or payment (outgoing) of `wallet`.
    ///
    /// # Errors
    /// `NOT_FOUND`, `OTHER` (bad hash or invoice).
    pub fn lookup_invoice(&self, wallet: &str, by: &Lookup) -> Result<Transaction, NetError> {
        let hash = match by {
            Lookup::PaymentHash(h) => hex32(h, "payment_hash")?,
            Lookup::Invoice(s) => parse_invoice(s)?.payment_hash().to_byte_array(),
        };
        let st = self.swept();
        st.wallet(wallet)?;
        st.invoices
            .get(&hash)
            .filter(|i| i.payee == wallet || i.payer.as_deref() == Some(wallet))
            .map(|i| st.tx_view(i, wallet))
            .ok_or_else(|| NetError::not_found("invoice not found"))
    }

    /// `wallet`'s invoices and payments, newest first.
    ///
    /// # Errors
    /// `NOT_FOUND` for an unknown wallet.
    pub fn list_transactions(
        &self,
        wallet: &str,
        filter: &ListFilter,
    ) -> Result<Vec<Transaction>, NetError> {
        let st = self.swept();
        st.wallet(wallet)?;
        let mut txs: Vec<Transaction> = st
            .invoices
            .values()
            .filter(|i| i.payee == wallet || i.payer.as_deref() == Some(wallet))
            .map(|i| st.tx_view(i, wallet))
            .filter(|t| filter.unpaid || t.state == Some(TxState::Settled))
            .filter(|t| filter.kind.as_deref().is_none_or(|k| k == t.kind))
            .filter(|t| filter.from.is_none_or(|f| t.created_at >= f))
            .filter(|t| filter.until.is_none_or(|u| t.created_at <= u))
            .collect();
        txs.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then_with(|| a.payment_hash.cmp(&b.payment_hash))
        });
        let offset = usize::try_from(filter.offset.unwrap_or(0)).unwrap_or(usize::MAX);
        let limit = usize::try_from(filter.limit.unwrap_or(u64::MAX)).unwrap_or(usize::MAX);
        Ok(txs.into_iter().skip(offset).take(limit).collect())
    }
}
