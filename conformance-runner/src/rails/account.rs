//! The `account` rail's harness: the hosted facilitator served in-process over HTTP, its
//! clients signing every request. Mock tier: one instance on a SQLite file. Localnet tier:
//! two instances on one PostgreSQL schema (their own connection pools and listeners, as two
//! hosts behind a load balancer would have), every client failing over between them.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use rail_account::api::{self, AccountView, PaymentView};
use rail_account::{AccountClient, AccountKey, AccountPayer, AccountReceiver, Submitted};
use rail_core::payer::Idempotent;
use rail_core::{
    Asset, Charge, KeyStore, ManualClock, MemoryKeyStore, Money, OpId, Payer, Payment, PaymentMode,
    RailError, RailHandle, RailResult, SharedClock,
};
use rail_ledger::{AccountId, Ledger};
use serde_json::json;
use stipendex_facilitator::store::ReviewState;
use stipendex_facilitator::{Config, Facilitator, NewAccount, open, serve};

use conformance::{Balances, Harness, HarnessError, Tier};
use stipendex_conformance::{StipendexEntry, StipendexHarness};

/// The account rail in the suite's registry.
pub const ENTRY: StipendexEntry = StipendexEntry {
    name: "account",
    tiers: &[
        (
            Tier::Mock,
            "one facilitator instance on a SQLite file, served over loopback HTTP",
        ),
        (
            Tier::Localnet,
            "two facilitator instances on one PostgreSQL schema (STIPENDEX_PG_URL or 127.0.0.1:5432), clients failing over between them",
        ),
    ],
    make,
};

fn make(tier: Tier) -> BoxFuture<'static, Result<Box<dyn StipendexHarness>, HarnessError>> {
    Box::pin(async move {
        let h = AccountHarness::new(tier).await?;
        Ok(Box::new(h) as Box<dyn StipendexHarness>)
    })
}

/// The facilitator's network name in the suite.
pub const NETWORK: &str = "conformance.facilitator";

/// Minor units the payer starts with.
const FUNDED: u64 = 1_000_000;

/// How long the harness's receivers ask payers to hold funds.
const HOLD_FOR: Duration = Duration::from_secs(600);

/// One account at the facilitator.
struct Party {
    id: AccountId,
    key: AccountKey,
}

impl Party {
    async fn open(fac: &Facilitator, review_above: Option<u64>) -> Result<Self, HarnessError> {
        let p = Party {
            id: AccountId::random(),
            key: AccountKey::generate(),
        };
        let review_above = review_above
            .map(|v| Money::from_minor(Asset::usd(), u128::from(v)))
            .transpose()
            .map_err(setup)?;
        fac.create_account(NewAccount {
            id: Some(p.id),
            key: p.key.public(),
            asset: Asset::usd(),
            review_above,
            label: "conformance".into(),
        })
        .await
        .map_err(setup)?;
        Ok(p)
    }
}

/// Facilitator instances with a funded payer, a payee, another payee, and the rail on top.
pub struct AccountHarness {
    handle: RailHandle,
    other_handle: RailHandle,
    twin_handle: RailHandle,
    clock: ManualClock,
    instances: Vec<Facilitator>,
    urls: Vec<String>,
    servers: Vec<tokio::task::JoinHandle<()>>,
    payer: Party,
    payee: Party,
    other: Party,
    funding: String,
    _dir: Option<tempfile::TempDir>,
    schema: Option<super::pg::Schema>,
}

fn setup(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Setup(e.to_string())
}

impl AccountHarness {
    /// A fresh harness on `tier`.
    ///
    /// # Errors
    /// [`HarnessError::Unavailable`] when PostgreSQL cannot be reached for the localnet tier.
    pub async fn new(tier: Tier) -> Result<Self, HarnessError> {
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let (instances, keys, dir, schema) = match tier {
            Tier::Mock => {
                let dir = tempfile::tempdir().map_err(setup)?;
                let url = format!("sqlite://{}/facilitator.db", dir.path().display());
                let fac = open(&url, None, config("solo"), Some(shared.clone()))
                    .await
                    .map_err(setup)?;
                let keys: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(shared.clone()));
                (vec![fac], keys, Some(dir), None)
            }
            Tier::Localnet => {
                let schema = super::pg::Schema::create("account").await?;
                let mut instances = Vec::new();
                for name in ["a", "b"] {
                    instances.push(
                        open(
                            &schema.url,
                            Some(&schema.name),
                            config(name),
                            Some(shared.clone()),
                        )
                        .await
                        .map_err(setup)?,
                    );
                }
                let keys = schema.key_store(shared.clone()).await?;
                (instances, keys, None, Some(schema))
            }
        };
        let Some(first) = instances.first() else {
            return Err(setup("no facilitator instance"));
        };
        let payer = Party::open(first, None).await?;
        let payee = Party::open(first, None).await?;
        let other = Party::open(first, None).await?;
        let funded = first
            .fund(
                payer.id,
                &Money::from_minor(Asset::usd(), u128::from(FUNDED)).map_err(setup)?,
                "conformance",
            )
            .await
            .map_err(setup)?;
        let mut urls = Vec::new();
        let mut servers = Vec::new();
        for fac in &instances {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(setup)?;
            urls.push(format!("http://{}", listener.local_addr().map_err(setup)?));
            let served = fac.clone();
            servers.push(tokio::spawn(async move {
                if let Err(e) = serve(listener, served, std::future::pending()).await {
                    tracing::error!(error = %e, "facilitator instance stopped");
                }
            }));
        }
        let client = |p: &Party, urls: &[String]| {
            AccountClient::new(urls.to_vec(), &p.id.to_string(), p.key.clone(), NETWORK)
                .map(|c| c.with_clock(shared.clone()))
                .map_err(setup)
        };
        let mut reversed = urls.clone();
        reversed.reverse();
        let receiver = Arc::new(
            AccountReceiver::new(client(&payee, &urls)?, Asset::usd()).with_hold_duration(HOLD_FOR),
        );
        // The same payee's receiver as a second service host: the other instance first.
        let twin = Arc::new(
            AccountReceiver::new(client(&payee, &reversed)?, Asset::usd())
                .with_hold_duration(HOLD_FOR),
        );
        let other_receiver = Arc::new(
            AccountReceiver::new(client(&other, &urls)?, Asset::usd()).with_hold_duration(HOLD_FOR),
        );
        // As a wallet assembles it: the rail's payer inside rail-core's idempotency layer.
        let payer_side = Arc::new(Idempotent::new(
            AccountPayer::new(client(&payer, &urls)?, Asset::usd()),
            keys,
        ));
        let handle = RailHandle {
            payer: payer_side.clone(),
            hold_payer: Some(payer_side.clone()),
            receiver: receiver.clone(),
            hold_receiver: Some(receiver.clone()),
            refunds: Some(receiver),
        };
        let twin_handle = RailHandle {
            payer: payer_side.clone(),
            hold_payer: Some(payer_side.clone()),
            receiver: twin.clone(),
            hold_receiver: Some(twin.clone()),
            refunds: Some(twin),
        };
        let other_handle = RailHandle {
            payer: payer_side.clone(),
            hold_payer: None,
            receiver: other_receiver.clone(),
            hold_receiver: Some(other_receiver.clone()),
            refunds: Some(other_receiver),
        };
        Ok(AccountHarness {
            handle,
            other_handle,
            twin_handle,
            clock,
            instances,
            urls,
            servers,
            payer,
            payee,
            other,
            funding: funded.transfer().id.to_string(),
            _dir: dir,
            schema,
        })
    }

    fn ledger(&self) -> RailResult<&Ledger> {
        self.instances
            .first()
            .map(Facilitator::ledger)
            .ok_or_else(|| RailError::NotFound("facilitator instance".into()))
    }

    fn client(&self, id: AccountId, key: AccountKey) -> RailResult<AccountClient> {
        Ok(
            AccountClient::new(self.urls.clone(), &id.to_string(), key, NETWORK)?
                .with_clock(Arc::new(self.clock.clone())),
        )
    }

    /// The facilitator's own cases: signing, the review queue, and (two instances) one
    /// payment seen the same from both.
    async fn checks(&self) -> Vec<(String, Result<(), String>)> {
        let mut out = Vec::new();
        out.push((
            "a request signed by another key is refused".into(),
            self.impostor().await,
        ));
        out.push((
            "a payment above the threshold waits, then pays once approved".into(),
            self.review(true).await,
        ));
        out.push((
            "a payment rejected in review is declined and released".into(),
            self.review(false).await,
        ));
        out.push((
            "every instance answers the same payment".into(),
            self.same_everywhere().await,
        ));
        out.push((
            "health answers on every instance".into(),
            self.health().await,
        ));
        let report = match self.ledger() {
            Ok(l) => l.verify_journal().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        out.push((
            "journal hash chain and balances verify".into(),
            match report {
                Ok(r) if r.is_intact() && r.entries > 0 => Ok(()),
                Ok(r) => Err(format!("journal problems: {:?}", r.problems)),
                Err(e) => Err(e),
            },
        ));
        out
    }

    async fn impostor(&self) -> Result<(), String> {
        let c = self
            .client(self.payer.id, AccountKey::generate())
            .map_err(|e| e.to_string())?;
        match c.get::<AccountView>(api::ACCOUNT).await {
            Err(e)
                if e.rail_reason()
                    .is_some_and(|r| r.code == "bad_request_signature") =>
            {
                Ok(())
            }
            other => Err(format!("expected bad_request_signature, got {other:?}")),
        }
    }

    async fn review(&self, approve: bool) -> Result<(), String> {
        let err = |e: RailError| e.to_string();
        let fac = self.instances.last().ok_or("no instance")?;
        let careful = Party::open(fac, Some(100))
            .await
            .map_err(|e| e.to_string())?;
        fac.fund(careful.id, &money(1_000)?, "review")
            .await
            .map_err(err)?;
        let payer = AccountPayer::new(
            self.client(careful.id, careful.key.clone()).map_err(err)?,
            Asset::usd(),
        );
        let offer = self
            .handle
            .receiver
            .offer(&Charge::capture(money(250)?, HOLD_FOR))
            .await
            .map_err(err)?;
        let op = OpId::random();
        let Submitted::PendingReview { payment_ref, .. } = payer
            .submit(&op, &offer, PaymentMode::Capture)
            .await
            .map_err(err)?
        else {
            return Err("a payment of 2.50 above a 1.00 threshold was not held for review".into());
        };
        let queued = fac
            .reviews(Some(ReviewState::Pending), 1000)
            .await
            .map_err(err)?;
        if !queued.iter().any(|r| r.payment_id == payment_ref) {
            return Err("the payment is not in the review queue".into());
        }
        let first = self.instances.first().ok_or("no instance")?;
        if approve {
            first
                .approve(&payment_ref, "conformance", None)
                .await
                .map_err(err)?;
            let payment = payer.pay(&op, &offer).await.map_err(err)?;
            self.handle
                .receiver
                .verify(&offer, &payment)
                .await
                .map_err(err)?;
            let left = self.available(careful.id).await?;
            if left != 750 {
                return Err(format!("the payer has {left} left, expected 750"));
            }
        } else {
            first
                .reject(&payment_ref, "conformance", Some("test"))
                .await
                .map_err(err)?;
            match payer.pay(&op, &offer).await {
                Err(RailError::Declined(_)) => {}
                other => return Err(format!("expected declined, got {other:?}")),
            }
            let left = self.available(careful.id).await?;
            if left != 1_000 {
                return Err(format!("the payer has {left} left, expected all 1000 back"));
            }
        }
        Ok(())
    }

    async fn same_everywhere(&self) -> Result<(), String> {
        let err = |e: RailError| e.to_string();
        let offer = self
            .handle
            .receiver
            .offer(&Charge::capture(money(7)?, HOLD_FOR))
            .await
            .map_err(err)?;
        let payment = self
            .handle
            .payer
            .pay(&OpId::random(), &offer)
            .await
            .map_err(err)?;
        let id = payment
            .proof
            .get("payment_id")
            .and_then(|v| v.as_str())
            .ok_or("no payment_id in the proof")?
            .to_owned();
        let mut seen = Vec::new();
        for url in &self.urls {
            let c = AccountClient::new(
                [url.clone()],
                &self.payee.id.to_string(),
                self.payee.key.clone(),
                NETWORK,
            )
            .map_err(err)?
            .with_clock(Arc::new(self.clock.clone()));
            seen.push(
                c.get::<PaymentView>(&api::payment(&id))
                    .await
                    .map_err(err)?
                    .body,
            );
        }
        if seen.windows(2).all(|w| w.first() == w.get(1)) {
            Ok(())
        } else {
            Err(format!("instances disagree: {seen:?}"))
        }
    }

    async fn health(&self) -> Result<(), String> {
        let http = reqwest::Client::new();
        for url in &self.urls {
            let h: api::Health = http
                .get(format!("{url}{}", api::HEALTH))
                .send()
                .await
                .map_err(|e| e.to_string())?
                .json()
                .await
                .map_err(|e| e.to_string())?;
            if h.status != "ok" || h.network != NETWORK {
                return Err(format!("{url}: {h:?}"));
            }
        }
        Ok(())
    }

    async fn available(&self, id: AccountId) -> Result<i128, String> {
        let l = self.ledger().map_err(|e| e.to_string())?;
        Ok(l.account(id)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no account")?
            .available())
    }
}

fn config(instance: &str) -> Config {
    Config::new(NETWORK).with_instance(instance)
}

fn money(units: u64) -> Result<Money, String> {
    Money::from_minor(Asset::usd(), u128::from(units)).map_err(|e| e.to_string())
}

impl Drop for AccountHarness {
    fn drop(&mut self) {
        for s in &self.servers {
            s.abort();
        }
    }
}

impl StipendexHarness for AccountHarness {}

#[async_trait]
impl Harness for AccountHarness {
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
        self.other.id.to_string()
    }

    async fn balances(&self) -> RailResult<Balances> {
        let ledger = self.ledger()?;
        let get = |id| async move {
            ledger
                .account(id)
                .await
                .map_err(RailError::from)?
                .ok_or_else(|| RailError::NotFound(format!("account {id}")))
        };
        let payer = get(self.payer.id).await?;
        let payee = get(self.payee.id).await?;
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
            .get("payment_id")
            .and_then(|v| v.as_str())
            .unwrap_or_default();
        vec![
            with(
                "payment id of another, real transfer",
                json!({"payment_id": self.funding}),
            ),
            with(
                "payment id that does not exist",
                json!({"payment_id": AccountId::random().to_string()}),
            ),
            with("payment id zero", json!({"payment_id": "0".repeat(32)})),
            with(
                "payment id in upper case",
                json!({"payment_id": id.to_uppercase()}),
            ),
            with(
                "payment id one digit short",
                json!({"payment_id": id.get(1..).unwrap_or_default()}),
            ),
            with(
                "payment id with a path in it",
                json!({"payment_id": format!("{}/../x", id.get(4..).unwrap_or_default())}),
            ),
            with("a ledger transfer_id instead", json!({"transfer_id": id})),
        ]
    }

    async fn rail_checks(&self) -> Vec<(String, Result<(), String>)> {
        self.checks().await
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
        for s in &self.servers {
            s.abort();
        }
        if let Some(schema) = &self.schema {
            schema.drop_all().await;
        }
    }
}
