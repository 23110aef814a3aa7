//! The Lightning-over-NWC rail's harness.
//!
//! - **mock**: the NWC devnet in process — a real relay on a loopback port, the wallet service,
//!   the in-process Lightning network — with fresh wallets per harness; operation records in
//!   memory. The rail's own cases (lying wallets, preimage mismatch, relay restart, …) run here,
//!   where the devnet's fault knobs are at hand.
//! - **localnet**: the `nwc-devnet` binary (started by `scripts/test-all`) through the
//!   connection URIs in `NWC_PAYER_URI`, `NWC_PAYEE_URI`, `NWC_OTHER_URI`; records in PostgreSQL.

// `serde_json::Value[&str]` answers `Null` for a missing key and never panics.
#![allow(clippy::indexing_slicing)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use lightning_invoice::Currency;
use nwc_devnet::{Devnet, DevnetConfig, Faults, WalletSpec};
use rail_core::payer::Idempotent;
use rail_core::{
    Asset, Charge, KeyStore, ManualClock, MemoryKeyStore, Money, OpId, Payer, Payment, PaymentMode,
    RailHandle, RailResult, SharedClock,
};
use rail_ln_nwc::client::{ClientOptions, NwcClient};
use rail_ln_nwc::nip47::ConnectionUri;
use rail_ln_nwc::rail::{NwcPayer, NwcReceiver, rail_error};
use serde_json::json;

use conformance::{Balances, Harness, HarnessError, Tier};
use stipendex_conformance::{StipendexEntry, StipendexHarness};

/// Lightning over NWC in the suite's registry.
pub const ENTRY: StipendexEntry = StipendexEntry {
    name: "ln-nwc",
    tiers: &[
        (
            Tier::Mock,
            "NWC devnet in process: real relay, wallet service, in-process Lightning network",
        ),
        (
            Tier::Localnet,
            "nwc-devnet binary at NWC_PAYER_URI / NWC_PAYEE_URI / NWC_OTHER_URI, records in PostgreSQL",
        ),
    ],
    make,
};

fn make(tier: Tier) -> BoxFuture<'static, Result<Box<dyn StipendexHarness>, HarnessError>> {
    Box::pin(async move {
        let h = LnHarness::new(tier).await?;
        Ok(Box::new(h) as Box<dyn StipendexHarness>)
    })
}

/// msat the payer's wallet holds (mock tier).
const FUNDED: u64 = 100_000_000;

fn setup(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Setup(e.to_string())
}

/// A payer wallet, a payee wallet, another payee, the rail on top.
pub struct LnHarness {
    handle: RailHandle,
    other: RailHandle,
    twin: RailHandle,
    clock: ManualClock,
    payer_client: Arc<NwcClient>,
    payee_client: Arc<NwcClient>,
    other_node: String,
    funded: u64,
    devnet: Option<Devnet>,
    schema: Option<super::pg::Schema>,
}

async fn client(uri: &ConnectionUri) -> Result<Arc<NwcClient>, HarnessError> {
    NwcClient::connect(uri, ClientOptions::default())
        .await
        .map(Arc::new)
        .map_err(|e| HarnessError::Unavailable(format!("NWC wallet at {:?}: {e}", uri.relays)))
}

fn env_uri(name: &str) -> Result<ConnectionUri, HarnessError> {
    std::env::var(name)
        .map_err(|_| {
            HarnessError::Unavailable(format!(
                "{name} is not set (`conformance localnet up` starts nwc-devnet)"
            ))
        })?
        .parse()
        .map_err(|e| setup(format!("{name}: {e}")))
}

impl LnHarness {
    /// A fresh harness on `tier`.
    ///
    /// # Errors
    /// [`HarnessError::Unavailable`] without the devnet or PostgreSQL on the localnet tier.
    pub async fn new(tier: Tier) -> Result<Self, HarnessError> {
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let (devnet, uris, store, schema, funded): (_, _, Arc<dyn KeyStore>, _, u64) = match tier {
            Tier::Mock => {
                let d = Devnet::start(DevnetConfig::default())
                    .await
                    .map_err(setup)?;
                let payer = d
                    .create_wallet(WalletSpec::new("payer", FUNDED))
                    .await
                    .map_err(setup)?;
                let payee = d
                    .create_wallet(WalletSpec::new("payee", 0))
                    .await
                    .map_err(setup)?;
                let other = d
                    .create_wallet(WalletSpec::new("other", 0))
                    .await
                    .map_err(setup)?;
                (
                    Some(d),
                    (payer.uri, payee.uri, other.uri),
                    Arc::new(MemoryKeyStore::with_clock(shared.clone())),
                    None,
                    FUNDED,
                )
            }
            Tier::Localnet => {
                let uris = (
                    env_uri("NWC_PAYER_URI")?,
                    env_uri("NWC_PAYEE_URI")?,
                    env_uri("NWC_OTHER_URI")?,
                );
                let schema = super::pg::Schema::create("ln").await?;
                let store = schema.key_store(shared.clone()).await?;
                (None, uris, store, Some(schema), 0)
            }
        };
        let payer_client = client(&uris.0).await?;
        let payee_client = client(&uris.1).await?;
        let other_client = client(&uris.2).await?;
        let twin_client = client(&uris.1).await?;
        let funded = if funded == 0 {
            payer_client
                .get_balance()
                .await
                .map_err(|e| setup(rail_error(&e)))?
        } else {
            funded
        };
        let seed: [u8; 32] = rand::random();
        let receiver = |c: Arc<NwcClient>, seed: [u8; 32]| {
            let (store, shared) = (store.clone(), shared.clone());
            async move {
                NwcReceiver::new(c, seed, store, shared)
                    .await
                    .map(Arc::new)
                    .map_err(setup)
            }
        };
        let mine = receiver(payee_client.clone(), seed).await?;
        let theirs = receiver(other_client, rand::random()).await?;
        let twin = receiver(twin_client, seed).await?;
        // As a wallet assembles it: the rail's payer inside rail-core's idempotency layer.
        let payer = Arc::new(Idempotent::new(
            NwcPayer::new(
                payer_client.clone(),
                Currency::Regtest,
                Money::from_minor(Asset::btc(), u128::from(funded) * 10).map_err(setup)?,
                shared.clone(),
            ),
            store.clone(),
        ));
        let hand = |r: Arc<NwcReceiver>| RailHandle {
            payer: payer.clone(),
            hold_payer: Some(payer.clone()),
            receiver: r.clone(),
            hold_receiver: Some(r),
            refunds: None,
        };
        let other_node = theirs.node().to_owned();
        Ok(LnHarness {
            handle: hand(mine),
            other: hand(theirs),
            twin: hand(twin),
            clock,
            payer_client,
            payee_client,
            other_node,
            funded,
            devnet,
            schema,
        })
    }

    async fn offer(&self, msat: u64, mode: PaymentMode) -> Result<rail_core::Offer, String> {
        let m = Money::from_minor(Asset::btc(), u128::from(msat)).map_err(|e| e.to_string())?;
        let c = match mode {
            PaymentMode::Capture => Charge::capture(m, Duration::from_secs(600)),
            PaymentMode::Hold => Charge::hold(m, Duration::from_secs(600)),
        };
        self.handle
            .receiver
            .offer(&c)
            .await
            .map_err(|e| e.to_string())
    }

    async fn checks(&self) -> Vec<(String, Result<(), String>)> {
        let mut out = vec![
            (
                "preimage mismatch".to_owned(),
                self.preimage_mismatch().await,
            ),
            (
                "amount above the offer".to_owned(),
                self.amount_above().await,
            ),
            (
                "wrong-network invoice".to_owned(),
                self.wrong_network().await,
            ),
            ("expired invoice".to_owned(), self.expired().await),
            (
                "hold accepted, then cancelled".to_owned(),
                self.hold_cancelled().await,
            ),
            (
                "hold accepted, presented after its offer expired: released".to_owned(),
                self.hold_expired_offer().await,
            ),
        ];
        if let Some(d) = &self.devnet {
            out.push(("lying payer wallet".to_owned(), self.lying_payer(d).await));
            out.push(("lying payee wallet".to_owned(), self.lying_payee(d).await));
            out.push((
                "relay restart mid-payment".to_owned(),
                self.relay_restart(d).await,
            ));
        }
        out
    }

    async fn preimage_mismatch(&self) -> Result<(), String> {
        let o = self.offer(2_000, PaymentMode::Capture).await?;
        let p = self
            .handle
            .payer
            .pay(&OpId::random(), &o)
            .await
            .map_err(|e| e.to_string())?;
        let mut forged = p.clone();
        forged.proof = json!({"payment_hash": p.proof["payment_hash"], "preimage": hex_of(rand::random::<[u8; 32]>())});
        match self.handle.receiver.verify(&o, &forged).await {
            Err(e) if e.code() == "bad_signature" => {}
            other => return Err(format!("a wrong preimage: {other:?}")),
        }
        self.handle
            .receiver
            .verify(&o, &p)
            .await
            .map(|_| ())
            .map_err(|e| format!("the genuine payment after a forged one: {e}"))
    }

    async fn amount_above(&self) -> Result<(), String> {
        let mut o = self.offer(3_000, PaymentMode::Capture).await?;
        // The envelope claims less than the invoice asks.
        o.amount = Money::from_minor(Asset::btc(), 1_000).map_err(|e| e.to_string())?;
        match self.handle.payer.pay(&OpId::random(), &o).await {
            Err(e) if e.code() == "amount_mismatch" => Ok(()),
            other => Err(format!("an invoice above its offer: {other:?}")),
        }
    }

    async fn wrong_network(&self) -> Result<(), String> {
        let o = self.offer(2_000, PaymentMode::Capture).await?;
        let mainnet = NwcPayer::new(
            self.payer_client.clone(),
            Currency::Bitcoin,
            Money::from_minor(Asset::btc(), 1_000_000).map_err(|e| e.to_string())?,
            Arc::new(self.clock.clone()),
        );
        match mainnet.pay(&OpId::random(), &o).await {
            Err(e) if e.code() == "wrong_network" => Ok(()),
            other => Err(format!("a regtest invoice for a mainnet payer: {other:?}")),
        }
    }

    async fn expired(&self) -> Result<(), String> {
        let m = Money::from_minor(Asset::btc(), 2_000).map_err(|e| e.to_string())?;
        let o = self
            .handle
            .receiver
            .offer(&Charge::capture(m, Duration::from_secs(1)))
            .await
            .map_err(|e| e.to_string())?;
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let before = self
            .payer_client
            .get_balance()
            .await
            .map_err(|e| e.to_string())?;
        match self.handle.payer.pay(&OpId::random(), &o).await {
            Err(e) if e.code() == "offer_expired" => {}
            other => return Err(format!("an expired invoice: {other:?}")),
        }
        let after = self
            .payer_client
            .get_balance()
            .await
            .map_err(|e| e.to_string())?;
        if before != after {
            return Err("paying an expired invoice moved money".into());
        }
        Ok(())
    }

    /// A hold accepted for an offer, presented after the offer expired: refused, and the
    /// payer's funds are released at once (not locked until the invoice's own expiry).
    async fn hold_expired_offer(&self) -> Result<(), String> {
        let before = self
            .payer_client
            .get_balance()
            .await
            .map_err(|e| e.to_string())?;
        let o = self.offer(4_000, PaymentMode::Hold).await?;
        let p = rail_core::HoldPayer::hold(
            self.handle.hold_payer.as_deref().ok_or("no hold payer")?,
            &OpId::random(),
            &o,
        )
        .await
        .map_err(|e| e.to_string())?;
        self.clock.advance(Duration::from_secs(601));
        match self.handle.receiver.verify(&o, &p).await {
            Err(e) if e.code() == "offer_expired" => {}
            other => return Err(format!("expected offer_expired, got {other:?}")),
        }
        // The cancel reaches the payer's wallet through the network: give it a moment.
        for _ in 0..50 {
            let now = self
                .payer_client
                .get_balance()
                .await
                .map_err(|e| e.to_string())?;
            if now == before {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err("the expired offer's hold still locks the payer's funds".into())
    }

    async fn hold_cancelled(&self) -> Result<(), String> {
        let before = self
            .payer_client
            .get_balance()
            .await
            .map_err(|e| e.to_string())?;
        let o = self.offer(5_000, PaymentMode::Hold).await?;
        let p = rail_core::HoldPayer::hold(
            self.handle.hold_payer.as_deref().ok_or("no hold payer")?,
            &OpId::random(),
            &o,
        )
        .await
        .map_err(|e| e.to_string())?;
        let v = self
            .handle
            .receiver
            .verify(&o, &p)
            .await
            .map_err(|e| e.to_string())?;
        let held = self
            .payer_client
            .get_balance()
            .await
            .map_err(|e| e.to_string())?;
        if held + 5_000 != before {
            return Err(format!(
                "an accepted hold locked {} msat, not 5000",
                before - held
            ));
        }
        let r = self
            .handle
            .hold_receiver
            .as_ref()
            .ok_or("no hold receiver")?;
        r.void(&OpId::random(), &v)
            .await
            .map_err(|e| e.to_string())?;
        let after = self
            .payer_client
            .get_balance()
            .await
            .map_err(|e| e.to_string())?;
        if after != before {
            return Err(format!(
                "a cancelled hold did not return the funds: {before} -> {after}"
            ));
        }
        Ok(())
    }

    async fn lying_payer(&self, d: &Devnet) -> Result<(), String> {
        let o = self.offer(2_000, PaymentMode::Capture).await?;
        let before = self
            .payee_client
            .get_balance()
            .await
            .map_err(|e| e.to_string())?;
        d.set_faults(
            "payer",
            Faults {
                lie_about_settlement: true,
                ..Faults::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let r = self.handle.payer.pay(&OpId::random(), &o).await;
        d.set_faults("payer", Faults::default())
            .map_err(|e| e.to_string())?;
        match r {
            Err(e) if e.to_string().contains("preimage") => {}
            other => return Err(format!("a wallet that says paid without paying: {other:?}")),
        }
        let after = self
            .payee_client
            .get_balance()
            .await
            .map_err(|e| e.to_string())?;
        if after != before {
            return Err("the payee's balance moved on a lie".into());
        }
        Ok(())
    }

    async fn lying_payee(&self, d: &Devnet) -> Result<(), String> {
        // The receiver's own wallet claims the invoice settled; without a payer's preimage
        // the receiver does not believe it.
        let o = self.offer(2_000, PaymentMode::Capture).await?;
        let fake = Payment {
            rail: o.rail.clone(),
            offer_id: o.id.clone(),
            mode: PaymentMode::Capture,
            payer: hex_of([3; 32]),
            amount: o.amount.clone(),
            proof: json!({"payment_hash": o.details["payment_hash"], "preimage": hex_of(rand::random::<[u8; 32]>())}),
        };
        d.set_faults(
            "payee",
            Faults {
                lie_about_settlement: true,
                ..Faults::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let r = self.handle.receiver.verify(&o, &fake).await;
        d.set_faults("payee", Faults::default())
            .map_err(|e| e.to_string())?;
        match r {
            Err(e) if e.code() == "bad_signature" => Ok(()),
            other => Err(format!("a lying receiving wallet: {other:?}")),
        }
    }

    async fn relay_restart(&self, d: &Devnet) -> Result<(), String> {
        let o = self.offer(2_500, PaymentMode::Capture).await?;
        d.restart_relay().await.map_err(|e| e.to_string())?;
        let taken = d.service().requests_taken();
        let p = match self.handle.payer.pay(&OpId::random(), &o).await {
            Ok(p) => p,
            Err(e) => {
                // Say where the payment was lost: before the service, in it, or after it.
                let hash = o.details["payment_hash"].as_str().unwrap_or_default();
                let on_network = d
                    .network()
                    .lookup_invoice("payer", &nwc_devnet::Lookup::PaymentHash(hash.to_owned()))
                    .map_or_else(|e| e.to_string(), |t| format!("{:?}", t.state));
                return Err(format!(
                    "paying after a relay restart: {e} (the wallet service took {} request(s) \
                     meanwhile; the payer's payment on the network: {on_network})",
                    d.service().requests_taken().saturating_sub(taken)
                ));
            }
        };
        self.handle
            .receiver
            .verify(&o, &p)
            .await
            .map(|_| ())
            .map_err(|e| format!("verifying after a relay restart: {e}"))
    }
}

fn hex_of(b: [u8; 32]) -> String {
    hex::encode(b)
}

impl StipendexHarness for LnHarness {}

#[async_trait]
impl Harness for LnHarness {
    fn rail(&self) -> &RailHandle {
        &self.handle
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn asset(&self) -> Asset {
        Asset::btc()
    }
    fn funded(&self) -> u128 {
        u128::from(self.funded)
    }
    fn other_payee(&self) -> String {
        self.other_node.clone()
    }

    async fn balances(&self) -> RailResult<Balances> {
        let payer = self
            .payer_client
            .get_balance()
            .await
            .map_err(|e| rail_error(&e))?;
        let payee = self
            .payee_client
            .get_balance()
            .await
            .map_err(|e| rail_error(&e))?;
        Ok(Balances {
            payer_available: i128::from(payer),
            payee_settled: i128::from(payee),
        })
    }

    fn malformed(&self, valid: &Payment) -> Vec<(String, Payment)> {
        let with = |name: &str, proof: serde_json::Value| {
            let mut p = valid.clone();
            p.proof = proof;
            (name.to_owned(), p)
        };
        let hash = valid.proof["payment_hash"].clone();
        vec![
            with("no preimage", json!({"payment_hash": hash})),
            with(
                "preimage not hex",
                json!({"payment_hash": hash, "preimage": "zz"}),
            ),
            with(
                "preimage too short",
                json!({"payment_hash": hash, "preimage": "00"}),
            ),
            with(
                "payment hash of another invoice",
                json!({"payment_hash": hex_of([7; 32]), "preimage": valid.proof["preimage"]}),
            ),
        ]
    }

    fn other_receiver(&self) -> Option<RailHandle> {
        Some(self.other.clone())
    }

    fn twin_receiver(&self) -> Option<RailHandle> {
        Some(self.twin.clone())
    }

    async fn rail_checks(&self) -> Vec<(String, Result<(), String>)> {
        self.checks().await
    }

    async fn teardown(&self) {
        if let Some(s) = &self.schema {
            s.drop_all().await;
        }
    }
}
