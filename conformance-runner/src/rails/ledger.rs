//! The ledger rail's harness: SQLite for the mock tier, PostgreSQL for the localnet tier.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use rail_core::keys::sql::{PgKeyStore, SqliteKeyStore};
use rail_core::payer::Idempotent;
use rail_core::{
    Asset, KeyStore, ManualClock, Payment, RailError, RailHandle, RailResult, ReplayGuard,
    SharedClock,
};
use rail_ledger::{
    AccountId, Ledger, LedgerPayer, LedgerReceiver, NewAccount, TransferId, TransferRequest,
};
use serde_json::json;

use conformance::{Balances, Harness, HarnessError, Tier};
use stipendex_conformance::{StipendexEntry, StipendexHarness};

/// The ledger in the suite's registry.
pub const ENTRY: StipendexEntry = StipendexEntry {
    name: "ledger",
    tiers: &[
        (
            Tier::Mock,
            "SQLite file in a temporary directory (WAL, durable commits)",
        ),
        (
            Tier::Localnet,
            "PostgreSQL at STIPENDEX_PG_URL or 127.0.0.1:5432, one schema per harness",
        ),
    ],
    make,
};

fn make(tier: Tier) -> BoxFuture<'static, Result<Box<dyn StipendexHarness>, HarnessError>> {
    Box::pin(async move {
        let h = LedgerHarness::new(tier).await?;
        Ok(Box::new(h) as Box<dyn StipendexHarness>)
    })
}

/// Minor units the payer starts with.
const FUNDED: u64 = 1_000_000;

/// How long the harness's receivers ask payers to hold funds.
const HOLD_FOR: Duration = Duration::from_secs(600);

/// A ledger with a funded payer, a payee, another payee, and the rail's two sides on top.
pub struct LedgerHarness {
    handle: RailHandle,
    other_handle: RailHandle,
    twin_handle: RailHandle,
    clock: ManualClock,
    ledger: Ledger,
    payer: AccountId,
    payee: AccountId,
    other: AccountId,
    funding: TransferId,
    _dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
}

fn setup(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Setup(e.to_string())
}

impl LedgerHarness {
    /// A fresh harness on `tier`.
    ///
    /// # Errors
    /// [`HarnessError::Unavailable`] when PostgreSQL cannot be reached for the localnet tier.
    pub async fn new(tier: Tier) -> Result<Self, HarnessError> {
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let (ledger, keys, dir, pg): (Ledger, Arc<dyn KeyStore>, _, _) = match tier {
            Tier::Mock => {
                let dir = tempfile::tempdir().map_err(setup)?;
                let url = format!("sqlite://{}/ledger.db", dir.path().display());
                let ledger = Ledger::sqlite_with_clock(&url, shared.clone())
                    .await
                    .map_err(setup)?;
                let keys = SqliteKeyStore::open(&dir.path().join("keys.db"))
                    .await
                    .map_err(setup)?
                    .with_clock(shared.clone());
                (ledger, Arc::new(keys) as Arc<dyn KeyStore>, Some(dir), None)
            }
            Tier::Localnet => {
                let url = test_kit::localnet::postgres_url();
                let schema = format!("conformance_{:016x}", rand::random::<u64>());
                let ledger = tokio::time::timeout(
                    Duration::from_secs(5),
                    Ledger::postgres_with_clock(&url, Some(&schema), shared.clone()),
                )
                .await
                .map_err(|_| {
                    HarnessError::Unavailable(format!("PostgreSQL at {url}: connection timed out"))
                })?
                .map_err(|e| HarnessError::Unavailable(format!("PostgreSQL at {url}: {e}")))?;
                let opts: sqlx::postgres::PgConnectOptions = url.parse().map_err(setup)?;
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(4)
                    .connect_with(opts.options([("search_path", schema.as_str())]))
                    .await
                    .map_err(setup)?;
                let keys = PgKeyStore::new(pool)
                    .await
                    .map_err(setup)?
                    .with_clock(shared.clone());
                (
                    ledger,
                    Arc::new(keys) as Arc<dyn KeyStore>,
                    None,
                    Some((url, schema)),
                )
            }
        };
        let asset = Asset::usd();
        let bank = AccountId::random();
        let payer = AccountId::random();
        let payee = AccountId::random();
        let other = AccountId::random();
        for (id, no_overdraft) in [(bank, false), (payer, true), (payee, true), (other, true)] {
            ledger
                .create_account(NewAccount {
                    id,
                    asset: asset.clone(),
                    no_overdraft,
                })
                .await
                .map_err(setup)?;
        }
        let funding = TransferId::random();
        ledger
            .transfer(TransferRequest::Single {
                id: funding,
                debit: bank,
                credit: payer,
                amount: FUNDED,
                user_data: 0,
            })
            .await
            .map_err(setup)?;
        let guard = ReplayGuard::new(keys.clone(), "ledger-offers");
        let other_receiver = Arc::new(
            LedgerReceiver::new(ledger.clone(), other, asset.clone(), guard.clone())
                .with_hold_duration(HOLD_FOR),
        );
        let other_handle = RailHandle {
            payer: Arc::new(LedgerPayer::new(ledger.clone(), payer, asset.clone())),
            hold_payer: None,
            receiver: other_receiver.clone(),
            hold_receiver: Some(other_receiver.clone()),
            refunds: Some(other_receiver),
        };
        // A second receiver instance for the same payee over the same replay store, as a
        // second server behind a load balancer would have.
        let twin = Arc::new(
            LedgerReceiver::new(
                ledger.clone(),
                payee,
                asset.clone(),
                ReplayGuard::new(keys.clone(), "ledger-offers"),
            )
            .with_hold_duration(HOLD_FOR),
        );
        let receiver = Arc::new(
            LedgerReceiver::new(ledger.clone(), payee, asset.clone(), guard)
                .with_hold_duration(HOLD_FOR),
        );
        // As a wallet assembles it: the rail's payer inside rail-core's idempotency layer.
        let payer_side = Arc::new(Idempotent::new(
            LedgerPayer::new(ledger.clone(), payer, asset),
            keys.clone(),
        ));
        let twin_handle = RailHandle {
            payer: payer_side.clone(),
            hold_payer: Some(payer_side.clone()),
            receiver: twin.clone(),
            hold_receiver: Some(twin.clone()),
            refunds: Some(twin),
        };
        let handle = RailHandle {
            payer: payer_side.clone(),
            hold_payer: Some(payer_side),
            receiver: receiver.clone(),
            hold_receiver: Some(receiver.clone()),
            refunds: Some(receiver),
        };
        Ok(LedgerHarness {
            handle,
            other_handle,
            twin_handle,
            clock,
            ledger,
            payer,
            payee,
            other,
            funding,
            _dir: dir,
            pg,
        })
    }

    /// The ledger under test.
    #[must_use]
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }
}

fn storage(e: rail_ledger::LedgerError) -> RailError {
    e.into()
}

impl StipendexHarness for LedgerHarness {}

#[async_trait]
impl Harness for LedgerHarness {
    fn rail(&self) -> &RailHandle {
        &self.handle
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn asset(&self) -> Asset {
        Asset::usd()
    }
    fn funded(&self) -> u128 {
        u128::from(FUNDED)
    }
    fn other_payee(&self) -> String {
        self.other.to_string()
    }

    async fn balances(&self) -> RailResult<Balances> {
        let get = |id| async move {
            self.ledger
                .account(id)
                .await
                .map_err(storage)?
                .ok_or_else(|| RailError::NotFound(format!("account {id}")))
        };
        let payer = get(self.payer).await?;
        let payee = get(self.payee).await?;
        Ok(Balances {
            payer_available: payer.available(),
            payee_settled: payee.posted_balance(),
        })
    }

    fn malformed(&self, valid: &Payment) -> Vec<(String, Payment)> {
        let with = |name: &str, proof: serde_json::Value| {
            let mut p = valid.clone();
            p.proof = proof;
            (name.to_owned(), p)
        };
        let id = valid
            .proof
            .get("transfer_id")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        vec![
            with(
                "transfer id of another, real transfer",
                json!({"transfer_id": self.funding.to_string()}),
            ),
            with(
                "transfer id that does not exist",
                json!({"transfer_id": TransferId::random().to_string()}),
            ),
            with("transfer id zero", json!({"transfer_id": "0".repeat(32)})),
            with(
                "transfer id in upper case",
                json!({"transfer_id": id.to_uppercase()}),
            ),
            with(
                "transfer id one digit short",
                json!({"transfer_id": id.get(1..).unwrap_or_default()}),
            ),
            with(
                "transfer id with a sign",
                json!({"transfer_id": format!("-{}", id.get(1..).unwrap_or_default())}),
            ),
        ]
    }

    async fn rail_checks(&self) -> Vec<(String, Result<(), String>)> {
        // Pay, hold and capture, void, then check the journal: hash chain intact, balances
        // before/after consistent with the accounts.
        let mut out = Vec::new();
        let work = async {
            let charge = |n: u64| {
                rail_core::Money::from_minor(Asset::usd(), u128::from(n))
                    .map(|m| rail_core::Charge::capture(m, HOLD_FOR))
                    .map_err(|e| e.to_string())
            };
            let o = self
                .handle
                .receiver
                .offer(&charge(42)?)
                .await
                .map_err(|e| e.to_string())?;
            let p = self
                .handle
                .payer
                .pay(&rail_core::OpId::random(), &o)
                .await
                .map_err(|e| e.to_string())?;
            self.handle
                .receiver
                .verify(&o, &p)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        };
        out.push(("a payment journals".to_owned(), work.await));
        let report = self.ledger.verify_journal().await;
        out.push((
            "journal hash chain and balances verify".to_owned(),
            match report {
                Ok(r) if r.is_intact() && r.entries > 0 => Ok(()),
                Ok(r) => Err(format!("journal problems: {:?}", r.problems)),
                Err(e) => Err(e.to_string()),
            },
        ));
        out
    }

    fn twin_receiver(&self) -> Option<RailHandle> {
        Some(self.twin_handle.clone())
    }

    fn other_receiver(&self) -> Option<RailHandle> {
        Some(self.other_handle.clone())
    }

    fn hold_lifetime(&self) -> Option<Duration> {
        Some(HOLD_FOR)
    }

    async fn teardown(&self) {
        if let Some((url, name)) = &self.pg {
            super::pg::Schema {
                url: url.clone(),
                name: name.clone(),
            }
            .drop_all()
            .await;
        }
    }
}
