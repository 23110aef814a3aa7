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
use rail_exact_algo::txn::{AxferTxn, Member, PayTxn, SignedTxn, Transaction, TxnError};
use rail_exact_algo::wire::network_id;

pub use rail_exact_algo::rules::MIN_BALANCE;
/// The protocol's minimum fee per transaction, µALGO.
pub const MIN_FEE: u64 = 1_000;
/// The longest validity window, rounds (`MaxTxnLife`).
pub const MAX_TXN_LIFE: u64 = 1_000;
/// The largest group (`MaxTxGroupSize`).
pub const MAX_GROUP: usize = 16;
/// Algorand testnet's USDC (ASA 10458941, 6 decimals): a devnet created with
/// [`AssetConfig::usdc`] holds it under this id, so a dollar price resolves as on testnet.
pub const TESTNET_USDC: u64 = 10_458_941;
/// Algorand testnet's genesis id, for a devnet that poses as testnet ([`DevnetConfig::testnet`]).
pub const TESTNET_GENESIS_ID: &str = "testnet-v1.0";
/// Algorand testnet's genesis hash (`SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=`).
pub const TESTNET_GENESIS_HASH: [u8; 32] = [
    0x48, 0x63, 0xb5, 0x18, 0xa4, 0xb3, 0xc8, 0x4e, 0xc8, 0x10, 0xf2, 0x2d, 0x4f, 0x10, 0x81, 0xcb,
    0x0f, 0x71, 0xf0, 0x59, 0xa7, 0xac, 0x20, 0xde, 0xc6, 0x2f, 0x7f, 0x70, 0xe5, 0x09, 0x3a, 0x22,
];
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
    /// Assets (ASAs) at genesis, each held in full by its creator.
    pub assets: Vec<AssetConfig>,
}

impl DevnetConfig {
    /// A devnet posing as Algorand testnet: testnet's genesis id and hash (the x402-avm SDK
    /// accepts only testnet's and mainnet's network ids) and testnet's USDC id, created by
    /// `usdc_creator` (who must also be funded in `accounts` to hold it).
    #[must_use]
    pub fn testnet(usdc_creator: Address) -> Self {
        DevnetConfig {
            genesis_id: TESTNET_GENESIS_ID.into(),
            genesis_hash: TESTNET_GENESIS_HASH,
            assets: vec![AssetConfig::usdc(usdc_creator)],
            ..DevnetConfig::default()
        }
    }
}

/// An asset (ASA) at genesis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AssetConfig {
    /// Its id (`xaid`).
    pub id: u64,
    /// Who created it: holds the whole supply at genesis (and needs ALGO for its minimum
    /// balance).
    pub creator: Address,
    /// The supply, in base units.
    pub total: u64,
    /// Decimals (USDC: 6).
    pub decimals: u32,
    /// `unit-name` (`USDC`).
    pub unit_name: String,
    /// `name`.
    pub name: String,
    /// New holdings start frozen.
    pub default_frozen: bool,
    /// Who may freeze and unfreeze holdings (here through [`Devnet::set_frozen`]).
    pub freeze: Option<Address>,
    /// Who may claw back (`asnd`).
    pub clawback: Option<Address>,
}

impl AssetConfig {
    /// Testnet's USDC ([`TESTNET_USDC`], 6 decimals, a supply of 10¹⁵ base units) created by
    /// `creator`, which is also its freeze and clawback address, as Circle's is.
    #[must_use]
    pub fn usdc(creator: Address) -> Self {
        AssetConfig {
            id: TESTNET_USDC,
            creator,
            total: 1_000_000_000_000_000,
            decimals: 6,
            unit_name: "USDC".into(),
            name: "USDC".into(),
            default_frozen: false,
            freeze: Some(creator),
            clawback: Some(creator),
        }
    }
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
            assets: Vec::new(),
        }
    }
}

#[derive(Clone, Debug, Default)]
struct AccountState {
    amount: u64,
    auth: Option<Address>,
    /// Asset holdings (opted in), by asset id.
    assets: BTreeMap<u64, Holding>,
}

impl AccountState {
    /// go-algorand's minimum balance: 0.1 ALGO, and 0.1 ALGO more per asset held.
    fn min_balance(&self) -> u64 {
        let n = u64::try_from(self.assets.len()).unwrap_or(u64::MAX);
        MIN_BALANCE.saturating_mul(n.saturating_add(1))
    }

    fn is_empty(&self) -> bool {
        self.amount == 0 && self.auth.is_none() && self.assets.is_empty()
    }
}

/// One account's holding of one asset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Holding {
    amount: u64,
    frozen: bool,
}

#[derive(Clone, Debug)]
struct Confirmed {
    round: u64,
    stxn: SignedTxn,
    closing_amount: Option<u64>,
    asset_closing_amount: Option<u64>,
}

/// What a group did, checked and not yet applied.
#[derive(Debug, Default)]
struct Effects {
    touched: BTreeMap<Address, AccountState>,
    leases: HashMap<(Address, [u8; 32]), u64>,
    ids: Vec<String>,
    closing: HashMap<String, u64>,
    asset_closing: HashMap<String, u64>,
}

/// Why a group failed evaluation: which member, and go-algorand's message.
#[derive(Debug)]
struct Failed {
    at: usize,
    message: String,
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
    /// Assets, by id.
    assets: HashMap<u64, AssetConfig>,
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
        let mut accounts: HashMap<Address, AccountState> = cfg
            .accounts
            .iter()
            .map(|(a, amount)| {
                (
                    *a,
                    AccountState {
                        amount: *amount,
                        ..AccountState::default()
                    },
                )
            })
            .collect();
        for asset in &cfg.assets {
            accounts.entry(asset.creator).or_default().assets.insert(
                asset.id,
                Holding {
                    amount: asset.total,
                    frozen: false,
                },
            );
        }
        let assets = cfg.assets.iter().map(|a| (a.id, a.clone())).collect();
        let (rounds, _) = watch::channel(cfg.start_round);
        let chain = Chain {
            round: cfg.start_round,
            last_block_at: Instant::now(),
            accounts,
            confirmed: HashMap::new(),
            tail: VecDeque::new(),
            leases: HashMap::new(),
            assets,
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

    /// `a`'s holding of `asset`, when opted in.
    #[must_use]
    pub fn asset_balance(&self, a: &Address, asset: u64) -> Option<u64> {
        self.chain()
            .accounts
            .get(a)
            .and_then(|s| s.assets.get(&asset))
            .map(|h| h.amount)
    }

    /// Opts `a` in to `asset` out of band (a test's shortcut for the zero self-transfer; its
    /// minimum balance is not checked).
    ///
    /// # Errors
    /// The asset does not exist.
    pub fn opt_in(&self, a: Address, asset: u64) -> Result<(), String> {
        let mut c = self.chain();
        let frozen = c
            .assets
            .get(&asset)
            .ok_or_else(|| format!("asset {asset} does not exist or has been deleted"))?
            .default_frozen;
        c.accounts
            .entry(a)
            .or_default()
            .assets
            .entry(asset)
            .or_insert(Holding { amount: 0, frozen });
        Ok(())
    }

    /// Moves `amount` of `asset` from its creator to `a`, which must have opted in (a faucet;
    /// tests and the binary only).
    ///
    /// # Errors
    /// go-algorand's message when the creator holds too little or `a` has not opted in.
    pub fn fund_asset(&self, a: Address, asset: u64, amount: u64) -> Result<(), String> {
        let mut c = self.chain();
        let creator = c
            .assets
            .get(&asset)
            .ok_or_else(|| format!("asset {asset} does not exist or has been deleted"))?
            .creator;
        let mut fx = Effects::default();
        let mut view = View { c: &c, fx: &mut fx };
        take_out(&mut view, &creator, asset, amount, true)?;
        put_in(&mut view, &a, asset, amount, true)?;
        for (addr, st) in fx.touched {
            c.accounts.insert(addr, st);
        }
        Ok(())
    }

    /// Freezes or unfreezes `a`'s holding of `asset` (what the asset's freeze address does with
    /// an `afrz` transaction).
    ///
    /// # Errors
    /// `a` holds no such asset.
    pub fn set_frozen(&self, a: &Address, asset: u64, frozen: bool) -> Result<(), String> {
        let mut c = self.chain();
        let h = c
            .accounts
            .get_mut(a)
            .and_then(|s| s.assets.get_mut(&asset))
            .ok_or_else(|| "asset not found in account".to_owned())?;
        h.frozen = frozen;
        Ok(())
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
        let group = SignedTxn::decode_stream(body).map_err(|e: TxnError| refused(e.to_string()))?;
        let Some(first) = group.first() else {
            return Err(refused("empty txgroup"));
        };
        let first_id = first.txn.id();
        let txns: Vec<&Transaction> = group.iter().map(|s| &s.txn).collect();
        well_formed(&txns).map_err(refused)?;
        if group.iter().any(|s| s.verify_signature().is_err()) {
            return Err(refused("At least one signature didn't pass verification"));
        }
        let signers: Vec<Option<Address>> = group.iter().map(|s| Some(s.signer())).collect();
        let mut c = self.chain();
        let effects = self
            .run(&c, &txns, &signers)
            .map_err(|f| refused(format!("TransactionPool.Remember: {}", f.message)))?;
        // Everything checked: apply.
        let Effects {
            touched,
            leases,
            ids,
            mut closing,
            mut asset_closing,
        } = effects;
        for (a, s) in touched {
            if s.is_empty() {
                c.accounts.remove(&a);
            } else {
                c.accounts.insert(a, s);
            }
        }
        c.leases.extend(leases);
        Self::commit_block(&mut c, ids.clone());
        let round = c.round;
        for (s, id) in group.into_iter().zip(ids) {
            let closing_amount = closing.remove(&id);
            let asset_closing_amount = asset_closing.remove(&id);
            c.confirmed.insert(
                id,
                Confirmed {
                    round,
                    stxn: s,
                    closing_amount,
                    asset_closing_amount,
                },
            );
        }
        drop(c);
        self.inner.rounds.send_replace(round);
        tracing::debug!(txid = %first_id, round, "devnet: committed");
        Ok(first_id)
    }

    /// Simulates a group (`POST /v2/transactions/simulate`): evaluates it against the next
    /// round as [`Devnet::submit`] would, applies nothing. Members may be unsigned when
    /// `allow_empty_signatures` is set (their authorization is then not checked, as in
    /// go-algorand's simulator); a present signature is always checked.
    ///
    /// # Errors
    /// [`Refused`] when the group cannot be read at all (algod's 400). A group that reads but
    /// would fail is an `Ok` with the failure in the result.
    pub fn simulate(
        &self,
        members: &[Member],
        allow_empty_signatures: bool,
    ) -> Result<Simulated, Refused> {
        if members.is_empty() {
            return Err(refused("empty txgroup"));
        }
        let txns: Vec<&Transaction> = members.iter().map(Member::txn).collect();
        let c = self.chain();
        let round = c.round;
        let mut failure = well_formed(&txns)
            .err()
            .map(|m| Failed { at: 0, message: m });
        let mut signers = Vec::new();
        for (i, m) in members.iter().enumerate() {
            match m {
                Member::Signed(s) => {
                    if failure.is_none() && s.verify_signature().is_err() {
                        failure = Some(Failed {
                            at: i,
                            message: "At least one signature didn't pass verification".into(),
                        });
                    }
                    signers.push(Some(s.signer()));
                }
                Member::Unsigned(_) => {
                    if failure.is_none() && !allow_empty_signatures {
                        failure = Some(Failed {
                            at: i,
                            message: "signedtxn has no sig".into(),
                        });
                    }
                    signers.push(None);
                }
            }
        }
        if failure.is_none() {
            failure = self.run(&c, &txns, &signers).err();
        }
        Ok(Simulated {
            last_round: round,
            ids: txns.iter().map(|t| t.id()).collect(),
            failure: failure.map(|f| (f.at, f.message)),
        })
    }

    /// Evaluates a group against the chain: every member in order, each seeing the earlier
    /// ones' effects (`signers[i]`: who signed member `i`; `None` skips the authorization
    /// check, for a simulation without signatures).
    fn run(
        &self,
        c: &Chain,
        txns: &[&Transaction],
        signers: &[Option<Address>],
    ) -> Result<Effects, Failed> {
        let mut fx = Effects::default();
        for (i, (t, signer)) in txns.iter().zip(signers).enumerate() {
            let id = t.id();
            self.evaluate(c, &mut fx, t, *signer, &id)
                .map_err(|message| Failed { at: i, message })?;
            fx.ids.push(id);
        }
        Ok(fx)
    }

    /// Evaluates one transaction against the chain plus the group's earlier effects.
    fn evaluate(
        &self,
        c: &Chain,
        fx: &mut Effects,
        t: &Transaction,
        signer: Option<Address>,
        id: &str,
    ) -> Result<(), String> {
        let h = t.header();
        let round = c.round.saturating_add(1);
        if round < h.first_valid || round > h.last_valid {
            return Err(format!(
                "txn dead: round {round} outside of {}--{}",
                h.first_valid, h.last_valid
            ));
        }
        if !h.genesis_id.is_empty() && h.genesis_id != self.inner.cfg.genesis_id {
            return Err(format!(
                "tx.GenesisID <{}> does not match expected <{}>",
                h.genesis_id, self.inner.cfg.genesis_id
            ));
        }
        if h.genesis_hash != self.inner.cfg.genesis_hash {
            return Err(format!(
                "tx.GenesisHash <{}> does not match expected <{}>",
                digest_string(&h.genesis_hash),
                digest_string(&self.inner.cfg.genesis_hash)
            ));
        }
        if c.confirmed.contains_key(id) || fx.ids.iter().any(|e| e == id) {
            return Err(format!("transaction already in ledger: {id}"));
        }
        if let Some(lease) = h.lease {
            let key = (h.sender, lease);
            if c.leases.get(&key).is_some_and(|lv| *lv >= round) || fx.leases.contains_key(&key) {
                return Err(format!(
                    "transaction {id} using an overlapping lease (sender, lease):({}, {})",
                    h.sender,
                    Address(lease)
                ));
            }
            fx.leases.insert(key, h.last_valid);
        }
        let mut view = View { c, fx };
        let mut sender = view.get(&h.sender);
        let authorized = sender.auth.unwrap_or(h.sender);
        if let Some(signer) = signer
            && signer != authorized
        {
            return Err(format!(
                "transaction {id}: should have been authorized by {authorized} but was actually authorized by {signer}",
            ));
        }
        // The fee first (to the fee sink), as `ledger/apply` does.
        sender.amount = sender
            .amount
            .checked_sub(h.fee)
            .ok_or_else(|| overspend(id, &h.sender, sender.amount, h.fee))?;
        view.put(h.sender, sender);
        let mut checked = vec![h.sender];
        match t {
            Transaction::Pay(p) => Self::apply_pay(&mut view, p, id, &mut checked)?,
            Transaction::Axfer(a) => Self::apply_axfer(&mut view, a, id)?,
        }
        if let Some(to) = h.rekey_to {
            let mut sender = view.get(&h.sender);
            sender.auth = (to != h.sender).then_some(to);
            view.put(h.sender, sender);
        }
        for a in checked {
            let s = view.get(&a);
            if s.amount != 0 && s.amount < s.min_balance() {
                return Err(format!(
                    "transaction {id}: account {a} balance {} below min {} ({} assets)",
                    s.amount,
                    s.min_balance(),
                    s.assets.len()
                ));
            }
        }
        Ok(())
    }

    /// A native payment's amount and close-to (`ledger/apply/payment.go`).
    fn apply_pay(
        view: &mut View<'_>,
        t: &PayTxn,
        id: &str,
        checked: &mut Vec<Address>,
    ) -> Result<(), String> {
        let mut sender = view.get(&t.sender);
        sender.amount = sender
            .amount
            .checked_sub(t.amount)
            .ok_or_else(|| overspend(id, &t.sender, sender.amount, t.amount))?;
        view.put(t.sender, sender);
        let mut receiver = view.get(&t.receiver);
        receiver.amount = receiver
            .amount
            .checked_add(t.amount)
            .ok_or_else(|| format!("transaction {id}: balance overflow"))?;
        view.put(t.receiver, receiver);
        checked.push(t.receiver);
        if let Some(to) = t.close_to {
            let mut sender = view.get(&t.sender);
            if !sender.assets.is_empty() {
                return Err(format!(
                    "transaction {id}: cannot close: {} outstanding assets",
                    sender.assets.len()
                ));
            }
            let rest = sender.amount;
            sender.amount = 0;
            sender.auth = None;
            view.put(t.sender, sender);
            let mut dest = view.get(&to);
            dest.amount = dest
                .amount
                .checked_add(rest)
                .ok_or_else(|| format!("transaction {id}: balance overflow"))?;
            view.put(to, dest);
            checked.push(to);
            view.fx.closing.insert(id.to_owned(), rest);
        }
        Ok(())
    }

    /// An asset transfer: opt-in, transfer, clawback and close-to, with go-algorand's checks
    /// and messages (`ledger/apply/asset.go`: `AssetTransfer`, `takeOut`, `putIn`).
    fn apply_axfer(view: &mut View<'_>, t: &AxferTxn, id: &str) -> Result<(), String> {
        let fail = |m: String| format!("transaction {id}: {m}");
        // go-algorand looks the asset up only for a clawback, an opt-in and a close-to; a plain
        // transfer of an asset that does not exist fails in `takeOut` ("missing from").
        let chain = view.c;
        let params = chain.assets.get(&t.asset);
        let exists = || {
            params.ok_or_else(|| {
                fail(format!(
                    "asset {} does not exist or has been deleted",
                    t.asset
                ))
            })
        };
        let mut source = t.sender;
        let clawback = t.asset_sender.is_some();
        if let Some(from) = t.asset_sender {
            let params = exists()?;
            if params.clawback != Some(t.sender) {
                return Err(fail(format!(
                    "clawback not allowed: sender {}, clawback {}",
                    t.sender,
                    params.clawback.unwrap_or(Address([0; 32]))
                )));
            }
            source = from;
        }
        // A zero self-transfer opts in.
        if t.amount == 0 && t.receiver == source && !clawback {
            let frozen = exists()?.default_frozen;
            let mut s = view.get(&source);
            s.assets
                .entry(t.asset)
                .or_insert(Holding { amount: 0, frozen });
            view.put(source, s);
        }
        take_out(view, &source, t.asset, t.amount, clawback).map_err(fail)?;
        put_in(view, &t.receiver, t.asset, t.amount, clawback).map_err(fail)?;
        if let Some(to) = t.close_to {
            if clawback {
                return Err(fail("cannot close asset by clawback".into()));
            }
            let params = exists()?;
            if params.creator == source {
                return Err(fail("cannot close asset ID in allocating account".into()));
            }
            let Some(held) = view.get(&source).assets.get(&t.asset).copied() else {
                return Err(fail(format!(
                    "asset {} not present in account {source}",
                    t.asset
                )));
            };
            let bypass = to == params.creator;
            take_out(view, &source, t.asset, held.amount, bypass).map_err(fail)?;
            put_in(view, &to, t.asset, held.amount, bypass).map_err(fail)?;
            let mut s = view.get(&source);
            s.assets.remove(&t.asset);
            view.put(source, s);
            view.fx.asset_closing.insert(id.to_owned(), held.amount);
        }
        Ok(())
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
        if let Some(obj) = body.as_object_mut() {
            if let Some(n) = conf.closing_amount {
                obj.insert("closing-amount".into(), json!(n));
            }
            if let Some(n) = conf.asset_closing_amount {
                obj.insert("asset-closing-amount".into(), json!(n));
            }
        }
        Some(body)
    }

    /// `GET /v2/assets/{id}`: the asset, or `None` (404).
    pub(crate) fn asset_info_json(&self, id: u64) -> Option<Json> {
        self.chain().assets.get(&id).map(asset_json)
    }

    /// `GET /v2/accounts/{address}/assets/{id}`: the holding, or `None` (404).
    pub(crate) fn account_asset_json(&self, a: &Address, id: u64) -> Option<Json> {
        let c = self.chain();
        let h = c.accounts.get(a)?.assets.get(&id)?;
        let mut body = json!({"round": c.round, "asset-holding": holding_json(id, h)});
        if let (Some(p), Some(obj)) = (c.assets.get(&id), body.as_object_mut())
            && p.creator == *a
        {
            obj.insert(
                "created-asset".into(),
                asset_json(p).get("params").cloned().unwrap_or_default(),
            );
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
        let created: Vec<u64> = c
            .assets
            .values()
            .filter(|p| p.creator == *a)
            .map(|p| p.id)
            .collect();
        let mut body = json!({
            "address": a.to_string(),
            "amount": s.amount,
            "amount-without-pending-rewards": s.amount,
            "assets": s.assets.iter().map(|(id, h)| holding_json(*id, h)).collect::<Vec<_>>(),
            "created-assets": created.iter().filter_map(|id| c.assets.get(id)).map(asset_json).collect::<Vec<_>>(),
            "min-balance": s.min_balance(),
            "pending-rewards": 0,
            "reward-base": 0,
            "rewards": 0,
            "round": c.round,
            "status": "Offline",
            "total-apps-opted-in": 0,
            "total-assets-opted-in": s.assets.len(),
            "total-box-bytes": 0,
            "total-boxes": 0,
            "total-created-apps": 0,
            "total-created-assets": created.len(),
        });
        if let (Some(auth), Some(obj)) = (s.auth, body.as_object_mut()) {
            obj.insert("auth-addr".into(), json!(auth.to_string()));
        }
        body
    }
}

/// The chain as one transaction of a group sees it: the committed state under the group's
/// earlier effects.
struct View<'a> {
    c: &'a Chain,
    fx: &'a mut Effects,
}

impl View<'_> {
    fn get(&self, a: &Address) -> AccountState {
        self.fx
            .touched
            .get(a)
            .cloned()
            .or_else(|| self.c.accounts.get(a).cloned())
            .unwrap_or_default()
    }

    fn put(&mut self, a: Address, s: AccountState) {
        self.fx.touched.insert(a, s);
    }
}

fn overspend(id: &str, a: &Address, have: u64, tried: u64) -> String {
    format!(
        "transaction {id}: overspend (account {a}, data {{MicroAlgos:{{Raw:{have}}}}}, tried to spend {{{tried}}})"
    )
}

/// `takeOut` of `ledger/apply/asset.go`.
fn take_out(
    view: &mut View<'_>,
    a: &Address,
    asset: u64,
    amount: u64,
    bypass_freeze: bool,
) -> Result<(), String> {
    if amount == 0 {
        return Ok(());
    }
    let mut s = view.get(a);
    let Some(h) = s.assets.get_mut(&asset) else {
        return Err(format!("asset {asset} missing from {a}"));
    };
    if h.frozen && !bypass_freeze {
        return Err(format!("asset {asset} frozen in {a}"));
    }
    h.amount = h.amount.checked_sub(amount).ok_or_else(|| {
        format!(
            "underflow on subtracting {amount} from sender amount {}",
            h.amount
        )
    })?;
    view.put(*a, s);
    Ok(())
}

/// `putIn` of `ledger/apply/asset.go`.
fn put_in(
    view: &mut View<'_>,
    a: &Address,
    asset: u64,
    amount: u64,
    bypass_freeze: bool,
) -> Result<(), String> {
    if amount == 0 {
        return Ok(());
    }
    let mut s = view.get(a);
    let Some(h) = s.assets.get_mut(&asset) else {
        return Err(format!(
            "receiver error: must optin, asset {asset} missing from {a}"
        ));
    };
    if h.frozen && !bypass_freeze {
        return Err("asset frozen in recipient".into());
    }
    h.amount = h.amount.checked_add(amount).ok_or_else(|| {
        format!(
            "overflow on adding {amount} to receiver amount {}",
            h.amount
        )
    })?;
    view.put(*a, s);
    Ok(())
}

/// The checks algod makes on a group before evaluating it: size, validity windows, pooled
/// fees, group ids (`data/transactions/transaction.go` `WellFormed`,
/// `data/transactions/verify/txn.go`, `ledger/eval`).
fn well_formed(group: &[&Transaction]) -> Result<(), String> {
    if group.len() > MAX_GROUP {
        return Err(format!(
            "group size {} exceeds maximum {MAX_GROUP}",
            group.len()
        ));
    }
    for t in group {
        let h = t.header();
        if h.last_valid < h.first_valid {
            return Err(format!(
                "transaction invalid range ({}--{})",
                h.first_valid, h.last_valid
            ));
        }
        if h.last_valid - h.first_valid > MAX_TXN_LIFE {
            return Err(format!(
                "transaction window size excessive ({}--{})",
                h.first_valid, h.last_valid
            ));
        }
    }
    // Fees are pooled across a group (consensus since v24).
    let fees = group
        .iter()
        .try_fold(0u64, |acc, t| acc.checked_add(t.header().fee))
        .unwrap_or(u64::MAX);
    let n = u64::try_from(group.len()).unwrap_or(u64::MAX);
    if fees < n.saturating_mul(MIN_FEE) {
        return Err(format!(
            "txgroup had {fees} in fees, which is less than the minimum {n} * {MIN_FEE}"
        ));
    }
    // Group ids: a single transaction must not claim one; several must all carry the hash of
    // the group.
    if group.len() > 1 {
        let expected = rail_exact_algo::txn::group_id_of(group.iter().copied());
        if group.iter().any(|t| t.group() != Some(expected)) {
            return Err("transactionGroup: incomplete group".into());
        }
    } else if group.iter().any(|t| t.group().is_some()) {
        return Err("transactionGroup: incomplete group".into());
    }
    Ok(())
}

/// What a simulation found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Simulated {
    /// The round it was evaluated after.
    pub last_round: u64,
    /// The members' txids.
    pub ids: Vec<String>,
    /// Where and why it would fail, if it would.
    pub failure: Option<(usize, String)>,
}

/// An asset as algod renders it (`Asset`: `index`, `params`).
fn asset_json(p: &AssetConfig) -> Json {
    let mut params = json!({
        "creator": p.creator.to_string(),
        "decimals": p.decimals,
        "default-frozen": p.default_frozen,
        "name": p.name,
        "total": p.total,
        "unit-name": p.unit_name,
    });
    if let Some(obj) = params.as_object_mut() {
        if let Some(f) = p.freeze {
            obj.insert("freeze".into(), json!(f.to_string()));
        }
        if let Some(cb) = p.clawback {
            obj.insert("clawback".into(), json!(cb.to_string()));
        }
    }
    json!({"index": p.id, "params": params})
}

/// A holding as algod renders it (`AssetHolding`).
fn holding_json(id: u64, h: &Holding) -> Json {
    json!({"amount": h.amount, "asset-id": id, "is-frozen": h.frozen})
}

/// A transaction as algod renders it in JSON (addresses in base32, bytes in base64).
pub(crate) fn txn_json(t: &Transaction) -> Json {
    let h = t.header();
    let mut txn = serde_json::Map::new();
    let mut put = |k: &str, v: Json| {
        txn.insert(k.to_owned(), v);
    };
    match t {
        Transaction::Pay(p) => {
            if p.amount != 0 {
                put("amt", json!(p.amount));
            }
            if let Some(a) = p.close_to {
                put("close", json!(a.to_string()));
            }
            put("rcv", json!(p.receiver.to_string()));
        }
        Transaction::Axfer(x) => {
            if x.amount != 0 {
                put("aamt", json!(x.amount));
            }
            if let Some(a) = x.close_to {
                put("aclose", json!(a.to_string()));
            }
            put("arcv", json!(x.receiver.to_string()));
            if let Some(a) = x.asset_sender {
                put("asnd", json!(a.to_string()));
            }
            put("xaid", json!(x.asset));
        }
    }
    put("fee", json!(h.fee));
    put("fv", json!(h.first_valid));
    if !h.genesis_id.is_empty() {
        put("gen", json!(h.genesis_id));
    }
    put("gh", json!(BASE64.encode(&h.genesis_hash)));
    if let Some(g) = h.group {
        put("grp", json!(BASE64.encode(&g)));
    }
    put("lv", json!(h.last_valid));
    if let Some(l) = h.lease {
        put("lx", json!(BASE64.encode(&l)));
    }
    if !h.note.is_empty() {
        put("note", json!(BASE64.encode(h.note)));
    }
    if let Some(r) = h.rekey_to {
        put("rekey", json!(r.to_string()));
    }
    put("snd", json!(h.sender.to_string()));
    put("type", json!(t.kind()));
    Json::Object(txn)
}

/// A signed transaction as algod renders it in JSON.
pub(crate) fn signed_json(s: &SignedTxn) -> Json {
    let mut out = json!({"sig": BASE64.encode(&s.sig), "txn": txn_json(&s.txn)});
    if let (Some(a), Some(obj)) = (s.auth, out.as_object_mut()) {
        obj.insert("sgnr".into(), json!(a.to_string()));
    }
    out
}
