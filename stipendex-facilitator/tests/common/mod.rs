//! A facilitator served in-process on SQLite (or PostgreSQL), with funded accounts.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    dead_code,
    unreachable_pub,
    missing_docs
)]

use std::sync::Arc;

use rail_account::{AccountClient, AccountKey, AccountPayer, AccountReceiver};
use rail_core::{Asset, ManualClock, Money, SharedClock};
use rail_ledger::AccountId;
use stipendex_facilitator::{Config, Facilitator, NewAccount, open, serve};

pub const NETWORK: &str = "facilitator.test";

pub struct Party {
    pub id: AccountId,
    pub key: AccountKey,
}

pub struct World {
    pub fac: Facilitator,
    pub url: String,
    pub clock: ManualClock,
    pub payer: Party,
    pub payee: Party,
    pub _dir: tempfile::TempDir,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for World {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl World {
    pub async fn sqlite() -> World {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/fac.db", dir.path().display());
        Self::on(&url, None, dir).await
    }

    /// As [`World::sqlite`], the facilitator judging time by the system's clock (for
    /// clients that sign with it).
    pub async fn sqlite_system_clock() -> World {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/fac.db", dir.path().display());
        Self::with(&url, None, dir, false).await
    }

    pub async fn on(url: &str, schema: Option<&str>, dir: tempfile::TempDir) -> World {
        Self::with(url, schema, dir, true).await
    }

    async fn with(url: &str, schema: Option<&str>, dir: tempfile::TempDir, manual: bool) -> World {
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let fac = open(
            url,
            schema,
            Config::new(NETWORK).with_instance("test-1"),
            manual.then_some(shared),
        )
        .await
        .unwrap();
        let (payer, payee) = (Party::new(), Party::new());
        payer.register(&fac, Some("5.00")).await;
        payee.register(&fac, None).await;
        fac.fund(payer.id, &usd("100.00"), "initial").await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let served = fac.clone();
        let server = tokio::spawn(async move {
            serve(listener, served, std::future::pending())
                .await
                .unwrap();
        });
        World {
            fac,
            url: format!("http://{addr}"),
            clock,
            payer,
            payee,
            _dir: dir,
            server,
        }
    }

    pub fn client(&self, p: &Party) -> AccountClient {
        AccountClient::new(
            [self.url.clone()],
            &p.id.to_string(),
            p.key.clone(),
            NETWORK,
        )
        .unwrap()
        .with_clock(Arc::new(self.clock.clone()))
    }

    pub fn payer(&self) -> AccountPayer {
        AccountPayer::new(self.client(&self.payer), Asset::usd())
    }

    pub fn receiver(&self) -> AccountReceiver {
        AccountReceiver::new(self.client(&self.payee), Asset::usd())
    }

    pub async fn available(&self, p: &Party) -> i128 {
        self.fac
            .ledger()
            .account(p.id)
            .await
            .unwrap()
            .unwrap()
            .available()
    }

    pub async fn balance(&self, p: &Party) -> i128 {
        self.fac
            .ledger()
            .account(p.id)
            .await
            .unwrap()
            .unwrap()
            .posted_balance()
    }
}

impl Party {
    pub fn new() -> Party {
        Party {
            id: AccountId::random(),
            key: AccountKey::generate(),
        }
    }

    pub async fn register(&self, fac: &Facilitator, review_above: Option<&str>) {
        fac.create_account(NewAccount {
            id: Some(self.id),
            key: self.key.public(),
            asset: Asset::usd(),
            review_above: review_above.map(usd),
            label: "test".into(),
        })
        .await
        .unwrap();
    }
}

pub fn usd(s: &str) -> Money {
    Money::parse(Asset::usd(), s).unwrap()
}
