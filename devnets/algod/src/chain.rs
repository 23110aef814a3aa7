//! The devnet's chain: an in-memory Algorand ledger with go-algorand's checks and error strings,
//! and algod's JSON views of its state (the routes are in [`crate::http`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use data_encoding::{BASE32_NOPAD, BASE64};
use serde_json::{Value as Json, json};
use sha2::{Digest, Sha512_256};
use tokio::sync::watch;

use rail_exact_algo::address::Address;
use rail_exact_algo::txn::{SignedPay, TxnError};
use rail_exact_algo::wire::network_id;

pub use rail_exact_algo::rules::MIN_BALANCE;
/// The protocol's minimum fee per transaction, µALGO.
pub const MIN_FEE: u64 = 1_000;
/// The longest validity window, rounds (`MaxTxnLife`).
pub const MAX_TXN_LIFE: u64 = 1_000;
/// The largest group (`MaxTxGroupSize`).
pub const MAX_GROUP: usize = 16;
/// The consensus version the devnet reports.
pub const CONSENSUS_VERSION: &str =
    "https://github.com/algorandfoundation/specs/tree/stipendex-devnet";

pub(crate) const NOT_FOUND: &str =
    "could not find the transaction in the transaction pool or in the last 1000 confirmed rounds";

/// How a devnet starts.
#[derive(Clone, Debug)]
pub struct DevnetConfig {
    /// `genesis-id`.
    pub genesis_id: String,
    /// `genesis-hash`.
    pub genesis_hash: [u8; 32],
    /// The API token (`X-Algo-API-Token`); `None` accepts any request.
    pub token: Option<String>,
    /// Funded accounts at genesis.
    pub accounts: Vec<(Address, u64)>,
    /// The last round at start.
    pub start_round: u64,
    /// Produce an empty block this often (`None`: blocks only for transactions and
    /// [`Devnet::advance`], like algod's dev mode).
    pub block_time: Option<Duration>,
}

impl Default for DevnetConfig {
    fn default() -> Self {
        DevnetConfig {
            genesis_id: "stipendex-devnet-v1".into(),
            genesis_hash: Sha512_256::digest(b"stipendex-devnet-v1").into(),
            token: None,
            accounts: Vec::new(),
            start_round: 1,
            block_time: None,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct AccountState {
    amount: u64,
    auth: Option<Address>,
}

#[derive(Clone, Debug)]
struct Confirmed {
    round: u64,
    stxn: SignedPay,
    closing_amount: Option<u64>,
}

#[derive(Debug)]
struct Chain {
    round: u64,
    last_block_at: Instant,
    accounts: HashMap<Address, AccountState>,
    /// Confirmed transactions of the last [`MAX_TXN_LIFE`] rounds, by txid.
    confirmed: HashMap<String, Confirmed>,
    /// Which txids each recent round confirmed, oldest first (to forget them).
    tail: VecDeque<(u64, Vec<String>)>,
    /// Active leases: (sender, lease) → last valid round.
    leases: HashMap<(Address, [u8; 32]), u64>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) cfg: DevnetConfig,
    chain: Mutex<Chain>,
    pub(crate) rounds: watch::Sender<u64>,
}

/// An in-memory Algorand ledger with algod's REST API. Cheap to clone (shared state).
#[derive(Clone, Debug)]
pub struct Devnet {
    pub(crate) inner: Arc<Inner>,
}

/// Why a submission was refused: the HTTP status and go-algorand's message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    /// 400 for every refusal of a transaction.
    pub status: u16,
    /// The `message` of the error body.
    pub message: String,
}

fn refused(message: impl Into<String>) -> Refused {
    Refused {
        status: 400,
        message: message.into(),
    }
}

fn digest_string(d: &[u8; 32]) -> String {
    BASE32_NOPAD.encode(d)
}

impl Devnet {
    /// A devnet at genesis.
    #[must_use]
    pub fn new(cfg: DevnetConfig) -> Self {
        let accounts = cfg
            .accounts
            .iter()
            .map(|(a, amount)| {
                (
                    *a,
                    AccountState {
                        amount: *amount,
                        auth: None,
                    },
                )
            })
            .collect();
        let (rounds, _) = watch::channel(cfg.start_round);
        let chain = Chain {
            round: cfg.start_round,
            last_block_at: Instant::now(),
            accounts,
            confirmed: HashMap::new(),
            tail: VecDeque::new(),
            leases: HashMap::new(),
        };
        Devnet {
            inner: Arc::new(Inner {
                cfg,
                chain: Mutex::new(chain),
                rounds,
            }),
        }
    }

    fn chain(&self) -> MutexGuard<'_, Chain> {
        // A panic while holding the lock cannot leave a half-applied group: groups are applied
        // to a copy and swapped in. Recover the guard rather than poisoning every later call.
        self.inner
            .chain
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The genesis hash.
    #[must_use]
    pub fn genesis_hash(&self) -> [u8; 32] {
        self.inner.cfg.genesis_hash
    }

    /// The genesis id.
    #[must_use]
    pub fn genesis_id(&self) -> &str {
        &self.inner.cfg.genesis_id
    }

    /// The exact-algo `network` of this devnet.
    #[must_use]
    pub fn network(&self) -> String {
        network_id(&self.inner.cfg.genesis_hash)
    }

    /// The last committed round.
    #[must_use]
    pub fn round(&self) -> u64 {
        self.chain().round
    }

    /// An account's balance, µALGO.
    #[must_use]
    pub fn balance(&self, a: &Address) -> u64 {
        self.chain().accounts.get(a).map_or(0, |s| s.amount)
    }

    /// An account's authorized address, when rekeyed.
    #[must_use]
    pub fn auth_addr(&self, a: &Address) -> Option<Address> {
        self.chain().accounts.get(a).and_then(|s| s.auth)
    }

    /// Credits `amount` µALGO to `a` out of thin air (a faucet; tests and the binary only).
    pub fn fund(&self, a: Address, amount: u64) {
        let mut c = self.chain();
        let s = c.accounts.entry(a).or_default();
        s.amount = s.amount.saturating_add(amount);
    }

    /// Commits `n` empty blocks.
    pub fn advance(&self, n: u64) {
        let mut c = self.chain();
        for _ in 0..n {
            Self::commit_block(&mut c, Vec::new());
        }
        let r = c.round;
        drop(c);
        self.inner.rounds.send_replace(r);
    }

    fn commit_block(c: &mut Chain, txids: Vec<String>) {
        c.round = c.round.saturating_add(1);
        c.last_block_at = Instant::now();
        c.tail.push_back((c.round, txids));
        while let Some((r, _)) = c.tail.front() {
            if c.round.saturating_sub(*r) < MAX_TXN_LIFE {
                break;
            }
            if let Some((_, old)) = c.tail.pop_front() {
                for id in old {
                    c.confirmed.remove(&id);
                }
            }
        }
        let round = c.round;
        c.leases.retain(|_, lv| *lv >= round);
    }

    /// Submits a group (the body of `POST /v2/transactions`): checked as algod checks it, then
    /// committed in a block of its own. Returns the first transaction's id.
    ///
    /// # Errors
    /// [`Refused`] with go-algorand's message; nothing is applied.
    pub fn submit(&self, body: &[u8]) -> Result<String, Refused> {
        let group = SignedPay::decode_stream(body).map_err(|e: TxnError| refused(e.to_string()))?;
        let Some(first) = group.first() else {
            return Err(refused("empty txgroup"));
        };
        let first_id = first.txn.id();
        self.well_formed(&group)?;
        if group.iter().any(|s| s.verify_signature().is_err()) {
            return Err(refused("At least one signature didn't pass verification"));
        }
        let mut c = self.chain();
        let mut new_leases = HashMap::new();
        let mut touched: BTreeMap<Address, AccountState> = BTreeMap::new();
        let mut closing = HashMap::new();
        let mut ids = Vec::new();
        for s in &group {
            let id = s.txn.id();
            let closed = self
                .evaluate(&c, &mut touched, &mut new_leases, s, &id, &ids)
                .map_err(|m| refused(format!("TransactionPool.Remember: {m}")))?;
            if let Some(amount) = closed {
                closing.insert(id.clone(), amount);
            }
            ids.push(id);
        }
        // Everything checked: apply.
        for (a, s) in touched {
            if s.amount == 0 && s.auth.is_none() {
                c.accounts.remove(&a);
            } else {
                c.accounts.insert(a, s);
            }
        }
        c.leases.extend(new_leases);
        Self::commit_block(&mut c, ids.clone());
        let round = c.round;
        for (s, id) in group.into_iter().zip(ids) {
            let closing_amount = closing.remove(&id);
            c.confirmed.insert(
                id,
                Confirmed {
                    round,
                    stxn: s,
                    closing_amount,
                },
            );
        }
        drop(c);
        self.inner.rounds.send_replace(round);
        tracing::debug!(txid = %first_id, round, "devnet: committed");
        Ok(first_id)
    }

    fn well_formed(&self, group: &[SignedPay]) -> Result<(), Refused> {
        if group.len() > MAX_GROUP {
            return Err(refused(format!(
                "group size {} exceeds maximum {MAX_GROUP}",
                group.len()
            )));
        }
        for s in group {
            let t = &s.txn;
            if t.last_valid < t.first_valid {
                return Err(refused(format!(
                    "transaction invalid range ({}--{})",
                    t.first_valid, t.last_valid
                )));
            }
            if t.last_valid - t.first_valid > MAX_TXN_LIFE {
                return Err(refused(format!(
                    "transaction window size excessive ({}--{})",
                    t.first_valid, t.last_valid
                )));
            }
        }
        // Fees are pooled across a group (consensus since v24).
        let fees = group
            .iter()
            .try_fold(0u64, |acc, s| acc.checked_add(s.txn.fee))
            .unwrap_or(u64::MAX);
        let n = u64::try_from(group.len()).unwrap_or(u64::MAX);
        if fees < n.saturating_mul(MIN_FEE) {
            return Err(refused(format!(
                "txgroup had {fees} in fees, which is less than the minimum {n} * {MIN_FEE}"
            )));
        }
        // Group ids: a single transaction must not claim one; several must all carry the
        // hash of the group (`ledger/eval` and `data/transactions/verify`).
        if group.len() > 1 {
            let expected = group_id(group);
            if group.iter().any(|s| s.txn.group != Some(expected)) {
                return Err(refused("transactionGroup: incomplete group"));
            }
        } else if group.iter().any(|s| s.txn.group.is_some()) {
            return Err(refused("transactionGroup: incomplete group"));
        }
        Ok(())
    }

    /// Evaluates one transaction against the chain plus the group's earlier effects.
    /// Returns the closing amount when the sender's account was closed.
    fn evaluate(
        &self,
        c: &Chain,
        touched: &mut BTreeMap<Address, AccountState>,
        leases: &mut HashMap<(Address, [u8; 32]), u64>,
        s: &SignedPay,
        id: &str,
        earlier: &[String],
    ) -> Result<Option<u64>, String> {
        let t = &s.txn;
        let round = c.round.saturating_add(1);
        if round < t.first_valid || round > t.last_valid {
            return Err(format!(
                "txn dead: round {round} outside of {}--{}",
                t.first_valid, t.last_valid
            ));
        }
        if !t.genesis_id.is_empty() && t.genesis_id != self.inner.cfg.genesis_id {
            return Err(format!(
                "tx.GenesisID <{}> does not match expected <{}>",
                t.genesis_id, self.inner.cfg.genesis_id
            ));
        }
        if t.genesis_hash != self.inner.cfg.genesis_hash {
            return Err(format!(
                "tx.GenesisHash <{}> does not match expected <{}>",
                digest_string(&t.genesis_hash),
                digest_string(&self.inner.cfg.genesis_hash)
            ));
        }
        if c.confirmed.contains_key(id) || earlier.iter().any(|e| e == id) {
            return Err(format!("transaction already in ledger: {id}"));
        }
        if let Some(lease) = t.lease {
            let key = (t.sender, lease);
            if c.leases.get(&key).is_some_and(|lv| *lv >= round) || leases.contains_key(&key) {
                return Err(format!(
                    "transaction {id} using an overlapping lease (sender, lease):({}, {})",
                    t.sender,
                    Address(lease)
                ));
            }
            leases.insert(key, t.last_valid);
        }
        let get = |touched: &BTreeMap<Address, AccountState>, a: &Address| {
            touched
                .get(a)
                .cloned()
                .or_else(|| c.accounts.get(a).cloned())
                .unwrap_or_default()
        };
        let mut sender = get(touched, &t.sender);
        let authorized = sender.auth.unwrap_or(t.sender);
        if s.signer() != authorized {
            return Err(format!(
                "transaction {id}: should have been authorized by {authorized} but was actually authorized by {}",
                s.signer()
            ));
        }
        let overspend = |have: u64, tried: u64| {
            format!(
                "transaction {id}: overspend (account {}, data {{MicroAlgos:{{Raw:{have}}}}}, tried to spend {{{tried}}})",
                t.sender
            )
        };
        // Fee first (to the fee sink), then the amount, as `ledger/apply/payment.go` does.
        sender.amount = sender
            .amount
            .checked_sub(t.fee)
            .ok_or_else(|| overspend(sender.amount, t.fee))?;
        sender.amount = sender
            .amount
            .checked_sub(t.amount)
            .ok_or_else(|| overspend(sender.amount, t.amount))?;
        touched.insert(t.sender, sender);
        let mut receiver = get(touched, &t.receiver);
        receiver.amount = receiver
            .amount
            .checked_add(t.amount)
            .ok_or_else(|| format!("transaction {id}: balance overflow"))?;
        touched.insert(t.receiver, receiver);
        let mut closed = None;
        if let Some(to) = t.close_to {
            let mut sender = get(touched, &t.sender);
            let rest = sender.amount;
            sender.amount = 0;
            sender.auth = None;
            touched.insert(t.sender, sender);
            let mut dest = get(touched, &to);
            dest.amount = dest
                .amount
                .checked_add(rest)
                .ok_or_else(|| format!("transaction {id}: balance overflow"))?;
            touched.insert(to, dest);
            closed = Some(rest);
        }
        if let Some(to) = t.rekey_to {
            let mut sender = get(touched, &t.sender);
            sender.auth = (to != t.sender).then_some(to);
            touched.insert(t.sender, sender);
        }
        for a in [Some(t.sender), Some(t.receiver), t.close_to]
            .into_iter()
            .flatten()
        {
            let bal = get(touched, &a).amount;
            if bal != 0 && bal < MIN_BALANCE {
                return Err(format!(
                    "transaction {id}: account {a} balance {bal} below min {MIN_BALANCE} (0 assets)"
                ));
            }
        }
        Ok(closed)
    }

    pub(crate) fn pending_json(&self, txid: &str) -> Option<Json> {
        let c = self.chain();
        let conf = c.confirmed.get(txid)?;
        let mut body = json!({
            "confirmed-round": conf.round,
            "pool-error": "",
            "sender-rewards": 0,
            "receiver-rewards": 0,
            "close-rewards": 0,
            "txn": signed_json(&conf.stxn),
        });
        if let (Some(n), Some(obj)) = (conf.closing_amount, body.as_object_mut()) {
            obj.insert("closing-amount".into(), json!(n));
        }
        Some(body)
    }

    pub(crate) fn status_json(&self) -> Json {
        let c = self.chain();
        let since = u64::try_from(c.last_block_at.elapsed().as_nanos()).unwrap_or(u64::MAX);
        json!({
            "catchup-time": 0,
            "last-round": c.round,
            "last-version": CONSENSUS_VERSION,
            "next-version": CONSENSUS_VERSION,
            "next-version-round": c.round.saturating_add(1),
            "next-version-supported": true,
            "stopped-at-unsupported-round": false,
            "time-since-last-round": since,
        })
    }

    pub(crate) fn account_json(&self, a: &Address) -> Json {
        let c = self.chain();
        let s = c.accounts.get(a).cloned().unwrap_or_default();
        let mut body = json!({
            "address": a.to_string(),
            "amount": s.amount,
            "amount-without-pending-rewards": s.amount,
            "min-balance": MIN_BALANCE,
            "pending-rewards": 0,
            "reward-base": 0,
            "rewards": 0,
            "round": c.round,
            "status": "Offline",
            "total-apps-opted-in": 0,
            "total-assets-opted-in": 0,
            "total-box-bytes": 0,
            "total-boxes": 0,
            "total-created-apps": 0,
            "total-created-assets": 0,
        });
        if let (Some(auth), Some(obj)) = (s.auth, body.as_object_mut()) {
            obj.insert("auth-addr".into(), json!(auth.to_string()));
        }
        body
    }
}

/// The group id of `group`: SHA-512/256 of `"TG"` and the canonical `{txlist: [txid…]}`.
#[must_use]
pub fn group_id(group: &[SignedPay]) -> [u8; 32] {
    let txns: Vec<rail_exact_algo::txn::Transaction> = group
        .iter()
        .map(|s| rail_exact_algo::txn::Transaction::Pay(s.txn.clone()))
        .collect();
    rail_exact_algo::txn::group_id(&txns)
}

/// A signed payment as algod renders it in JSON (addresses in base32, bytes in base64).
pub(crate) fn signed_json(s: &SignedPay) -> Json {
    let t = &s.txn;
    let mut txn = serde_json::Map::new();
    let mut put = |k: &str, v: Json| {
        txn.insert(k.to_owned(), v);
    };
    if t.amount != 0 {
        put("amt", json!(t.amount));
    }
    if let Some(a) = t.close_to {
        put("close", json!(a.to_string()));
    }
    put("fee", json!(t.fee));
    put("fv", json!(t.first_valid));
    if !t.genesis_id.is_empty() {
        put("gen", json!(t.genesis_id));
    }
    put("gh", json!(BASE64.encode(&t.genesis_hash)));
    if let Some(g) = t.group {
        put("grp", json!(BASE64.encode(&g)));
    }
    put("lv", json!(t.last_valid));
    if let Some(l) = t.lease {
        put("lx", json!(BASE64.encode(&l)));
    }
    if !t.note.is_empty() {
        put("note", json!(BASE64.encode(&t.note)));
    }
    put("rcv", json!(t.receiver.to_string()));
    if let Some(r) = t.rekey_to {
        put("rekey", json!(r.to_string()));
    }
    put("snd", json!(t.sender.to_string()));
    put("type", json!("pay"));
    let mut out = json!({"sig": BASE64.encode(&s.sig), "txn": Json::Object(txn)});
    if let (Some(a), Some(obj)) = (s.auth, out.as_object_mut()) {
        obj.insert("sgnr".into(), json!(a.to_string()));
    }
    out
}
