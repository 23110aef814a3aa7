//! The shared test world: a ledger on SQLite with a funded agent, a registry holding both
//! sides, keys for the principal, the wallet and the receiver.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    dead_code,
    unreachable_pub
)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use rail_core::keys::sql::SqliteKeyStore;
use stipendex::envelope::{Allow, Limits, Mandate, Period, SecretKey, Signed};
use stipendex::ledger::{AccountId, Ledger, NewAccount, TransferId, TransferRequest};
use stipendex::receiver::{Gate, PricedCapability, Receiver, Request};
use stipendex::wallet::{Answer, Callback, MemoryJournal, Wallet};
use stipendex::{Asset, KeyStore, ManualClock, Money, Registry, SharedClock};
use stipendex_test_kit as kit;

pub fn usd(s: &str) -> Money {
    Money::parse(Asset::usd(), s).unwrap()
}

pub struct World {
    pub _dir: tempfile::TempDir,
    pub registry: Registry,
    pub clock: ManualClock,
    pub principal: SecretKey,
    pub wallet_key: SecretKey,
    pub receiver_key: SecretKey,
    pub store: Arc<dyn KeyStore>,
    pub journal: Arc<MemoryJournal>,
    pub asked: Arc<AtomicUsize>,
    pub denied: Arc<AtomicUsize>,
    /// The ledger behind rail `house`, and its payer's and payee's accounts.
    pub ledger: Ledger,
    pub agent: AccountId,
    pub shop: AccountId,
}

pub async fn world() -> World {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/ledger.db", dir.path().display());
    let clock = ManualClock::starting_now();
    let shared: SharedClock = Arc::new(clock.clone());
    let ledger = Ledger::sqlite_with_clock(&url, shared.clone())
        .await
        .unwrap();
    let (bank, agent, shop) = (
        AccountId::random(),
        AccountId::random(),
        AccountId::random(),
    );
    for (id, no_overdraft) in [(bank, false), (agent, true), (shop, true)] {
        ledger
            .create_account(NewAccount {
                id,
                asset: Asset::usd(),
                no_overdraft,
            })
            .await
            .unwrap();
    }
    ledger
        .transfer(TransferRequest::Single {
            id: TransferId::random(),
            debit: bank,
            credit: agent,
            amount: 100_000,
            user_data: 0,
        })
        .await
        .unwrap();
    let config = format!(
        r#"
        [store]
        url = "memory"
        [rails.house]
        kind = "ledger"
        url = "{url}"
        asset = "USD"
        payer_account = "{agent}"
        payee_account = "{shop}"
        "#
    );
    let registry = Registry::from_toml_with_clock(&config, &BTreeMap::new(), shared.clone())
        .await
        .unwrap();
    let store: Arc<dyn KeyStore> = Arc::new(
        SqliteKeyStore::open(&dir.path().join("wallet.db"))
            .await
            .unwrap()
            .with_clock(shared),
    );
    World {
        _dir: dir,
        registry,
        clock,
        principal: SecretKey::generate(),
        wallet_key: SecretKey::generate(),
        receiver_key: SecretKey::generate(),
        store,
        journal: Arc::new(MemoryJournal::default()),
        asked: Arc::new(AtomicUsize::new(0)),
        denied: Arc::new(AtomicUsize::new(0)),
        ledger,
        agent,
        shop,
    }
}

impl World {
    /// The posted balance of `account` (cents) and what is held on it.
    pub async fn balance(&self, account: AccountId) -> (i128, u64) {
        let a = self.ledger.account(account).await.unwrap().unwrap();
        (a.posted_balance(), a.debits_pending)
    }

    pub fn now(&self) -> u64 {
        u64::try_from(rail_core::Clock::now(&self.clock).unix_seconds()).unwrap()
    }

    pub fn mandate(&self, edit: impl FnOnce(&mut Mandate)) -> Signed<Mandate> {
        kit::mandate(&self.principal, self.wallet_key.public())
            .from(self.now())
            .limits(Limits {
                per_period: Some(Period {
                    seconds: 86_400,
                    amount: kit::amount("20.00"),
                }),
                confirm_above: Some(kit::amount("1.00")),
                ..kit::limits(Asset::usd(), "5.00", "100.00")
            })
            .allow(kit::receiver(
                "search",
                self.receiver_key.public(),
                Vec::new(),
            ))
            .edit(edit)
            .sign()
    }

    pub fn wallet(&self, mandate: Signed<Mandate>, confirm: bool) -> Wallet {
        let asked = self.asked.clone();
        let denied = self.denied.clone();
        let confirmer = Callback::new(move |_| {
            asked.fetch_add(1, Ordering::SeqCst);
            if confirm {
                Answer::Yes { by: "test".into() }
            } else {
                Answer::No {
                    why: "test says no".into(),
                }
            }
        })
        .on_denial(move |_| {
            denied.fetch_add(1, Ordering::SeqCst);
        });
        Wallet::builder(self.wallet_key.clone(), mandate)
            .registry(&self.registry)
            .store(self.store.clone())
            .confirmer(Arc::new(confirmer))
            .journal(self.journal.clone())
            .clock(Arc::new(self.clock.clone()))
            .principal(self.principal.public())
            .build()
            .unwrap()
    }

    pub fn receiver_with(&self, id: &str, key: &SecretKey) -> Receiver {
        Receiver::builder(id, key.clone())
            .registry(&self.registry)
            .price(PricedCapability::fixed("GET", "/search", usd("0.05")).describe("one search"))
            .price(PricedCapability::fixed("GET", "/report", usd("2.50")))
            .price(PricedCapability::estimate(
                "POST",
                "/order",
                usd("3.00"),
                "0.50".parse().unwrap(),
            ))
            .clock(Arc::new(self.clock.clone()))
            .build()
            .unwrap()
    }

    pub fn receiver(&self) -> Receiver {
        self.receiver_with("search", &self.receiver_key)
    }
}

/// Pins `origin` on the mandate's entry for receiver `search`.
#[allow(dead_code)]
pub fn pin(m: &mut Mandate, origin: &str) {
    for a in &mut m.allow {
        if let Allow::Receiver { id, origins, .. } = a
            && id == "search"
        {
            origins.push(origin.to_owned());
        }
    }
}

pub async fn quote(r: &Receiver, req: &Request) -> Signed<stipendex::envelope::Quote> {
    match r.gate(req).await.unwrap() {
        Gate::Quote(q) => *q,
        other => panic!("expected a quote, got {other:?}"),
    }
}

/// Counts the receiver's pricing decisions ([`Receiver::decide`] emits one `stipendex::decide`
/// event each) made on this thread while it lives.
pub struct Decisions(test_kit::events::Events);

impl Decisions {
    pub fn start() -> Self {
        Decisions(test_kit::events::Events::count("stipendex::decide"))
    }

    /// The decisions counted since the last `take`.
    pub fn take(&self) -> usize {
        self.0.take()
    }
}

/// A price hook that keeps the list price and counts how often it is asked.
#[derive(Clone, Default)]
pub struct CountingHook(pub Arc<AtomicUsize>);

#[async_trait::async_trait]
impl stipendex::receiver::ResolvePrice for CountingHook {
    async fn resolve(&self, cap: &PricedCapability, _: &Request) -> stipendex::receiver::Decision {
        self.0.fetch_add(1, Ordering::SeqCst);
        stipendex::receiver::Decision::quote(cap.price.clone())
    }
}

impl CountingHook {
    /// The times asked since the last `take`.
    pub fn take(&self) -> usize {
        self.0.swap(0, Ordering::SeqCst)
    }
}
