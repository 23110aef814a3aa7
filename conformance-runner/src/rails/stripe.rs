//! The Stripe rail's harness.
//!
//! - **mock**: the Stripe emulator in process (real HTTP on a loopback port), on the harness's
//!   clock (so authorisations can lapse), operation records in memory.
//! - **localnet**: the `stripe-emulator` binary at `STRIPE_EMULATOR_URL` (started by
//!   `scripts/test-all`), operation records in PostgreSQL.
//!
//! The payer is a test card with a credit limit (the emulator's `/_emulator/cards`): what it can
//! still be charged is the payer's balance; the merchant's captured-minus-refunded balance is the
//! payee's.

// `serde_json::Value[&str]` answers `Null` for a missing key and never panics.
#![allow(clippy::indexing_slicing)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use rail_core::payer::Idempotent;
use rail_core::{
    Asset, Charge, Clock, KeyStore, ManualClock, MemoryKeyStore, Money, OpId, Payment, PaymentMode,
    RailError, RailHandle, RailReason, RailResult, SharedClock,
};
use rail_stripe::{StripeHttp, StripePayer, StripeReceiver, webhook};
use serde_json::{Value, json};
use stripe_emulator::{Emulator, EmulatorConfig, RunningEmulator};

use conformance::{Balances, Harness, HarnessError, Tier};
use stipendex_conformance::{StipendexEntry, StipendexHarness};

/// Stripe in the suite's registry.
pub const ENTRY: StipendexEntry = StipendexEntry {
    name: "stripe",
    tiers: &[
        (
            Tier::Mock,
            "Stripe emulator in process over HTTP, on the harness clock",
        ),
        (
            Tier::Localnet,
            "stripe-emulator binary at STRIPE_EMULATOR_URL, operation records in PostgreSQL",
        ),
    ],
    make,
};

fn make(tier: Tier) -> BoxFuture<'static, Result<Box<dyn StipendexHarness>, HarnessError>> {
    Box::pin(async move {
        let h = StripeHarness::new(tier).await?;
        Ok(Box::new(h) as Box<dyn StipendexHarness>)
    })
}

/// Cents the payer's card may be charged.
const FUNDED: u64 = 1_000_000;
const SECRET: &str = "sk_test_emulator";
const PUBLISHABLE: &str = "pk_test_emulator";

fn setup(e: impl std::fmt::Display) -> HarnessError {
    HarnessError::Setup(e.to_string())
}

/// A card, a receiver (and another, and a twin) on one Stripe account.
pub struct StripeHarness {
    handle: RailHandle,
    other: RailHandle,
    twin: RailHandle,
    clock: ManualClock,
    base: String,
    card: String,
    http: reqwest::Client,
    _emulator: Option<RunningEmulator>,
    pg: Option<super::pg::Schema>,
}

impl StripeHarness {
    /// A fresh harness on `tier`.
    ///
    /// # Errors
    /// [`HarnessError::Unavailable`] when the localnet tier has no emulator or PostgreSQL.
    pub async fn new(tier: Tier) -> Result<Self, HarnessError> {
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let (base, emulator, store, pg): (String, _, Arc<dyn KeyStore>, _) = match tier {
            Tier::Mock => {
                let running = Emulator::spawn(
                    EmulatorConfig {
                        clock: shared.clone(),
                        ..EmulatorConfig::default()
                    },
                    SocketAddr::from(([127, 0, 0, 1], 0)),
                )
                .await
                .map_err(setup)?;
                (
                    running.url.clone(),
                    Some(running),
                    Arc::new(MemoryKeyStore::with_clock(shared.clone())),
                    None,
                )
            }
            Tier::Localnet => {
                let url = std::env::var("STRIPE_EMULATOR_URL").map_err(|_| {
                    HarnessError::Unavailable(
                        "STRIPE_EMULATOR_URL is not set (`conformance localnet up` starts stripe-emulator)"
                            .into(),
                    )
                })?;
                let schema = super::pg::Schema::create("stripe").await?;
                (
                    url,
                    None,
                    schema.key_store(shared.clone()).await?,
                    Some(schema),
                )
            }
        };
        // Builds the HTTP stack (and installs the one rustls provider) first.
        let api = StripeHttp::new(&base, SECRET).map_err(setup)?;
        let http = reqwest::Client::new();
        let card = http
            .post(format!("{base}/_emulator/cards"))
            .bearer_auth(SECRET)
            .form(&[("limit", FUNDED.to_string())])
            .send()
            .await
            .map_err(|e| HarnessError::Unavailable(format!("stripe emulator at {base}: {e}")))?
            .json::<Value>()
            .await
            .map_err(setup)?["id"]
            .as_str()
            .ok_or_else(|| setup("no card id"))?
            .to_owned();
        let payee = format!("shop-{}", hex::encode(rand::random::<[u8; 4]>()));
        let receiver = |payee: &str| {
            Arc::new(StripeReceiver::new(
                api.clone(),
                PUBLISHABLE,
                payee,
                Asset::usd(),
                store.clone(),
                shared.clone(),
            ))
        };
        // As a wallet assembles it: the rail's payer inside rail-core's idempotency layer.
        let payer = Arc::new(Idempotent::new(
            StripePayer::new(
                &base,
                card.clone(),
                Money::from_minor(Asset::usd(), u128::from(FUNDED) * 10).map_err(setup)?,
                shared.clone(),
            )
            .map_err(setup)?,
            store.clone(),
        ));
        let hand = |r: Arc<StripeReceiver>| RailHandle {
            payer: payer.clone(),
            hold_payer: Some(payer.clone()),
            receiver: r.clone(),
            hold_receiver: Some(r.clone()),
            refunds: Some(r),
        };
        Ok(StripeHarness {
            handle: hand(receiver(&payee)),
            other: hand(receiver(&format!("{payee}-other"))),
            twin: hand(receiver(&payee)),
            clock,
            base,
            card,
            http,
            _emulator: emulator,
            pg,
        })
    }

    async fn emulator_balances(&self) -> RailResult<Value> {
        let unavailable = |e: reqwest::Error| {
            RailError::Unavailable(RailReason::new("stripe_emulator", e.to_string()))
        };
        self.http
            .get(format!("{}/_emulator/balances", self.base))
            .query(&[("card", self.card.as_str())])
            .bearer_auth(SECRET)
            .send()
            .await
            .map_err(unavailable)?
            .json()
            .await
            .map_err(unavailable)
    }

    async fn checks(&self) -> Vec<(String, Result<(), String>)> {
        vec![
            (
                "declined card".into(),
                self.declined("pm_card_chargeDeclined", "declined").await,
            ),
            (
                "insufficient funds card".into(),
                self.declined(
                    "pm_card_chargeDeclinedInsufficientFunds",
                    "insufficient_funds",
                )
                .await,
            ),
            ("idempotency at the API".into(), self.idempotency().await),
            (
                "publishable key cannot move money".into(),
                self.publishable_limits().await,
            ),
            ("webhook signature and replay".into(), self.webhooks().await),
            ("below Stripe's minimum".into(), self.minimum().await),
        ]
    }

    async fn offer(&self, cents: u64, mode: PaymentMode) -> Result<rail_core::Offer, String> {
        let m = Money::from_minor(Asset::usd(), u128::from(cents)).map_err(|e| e.to_string())?;
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

    async fn declined(&self, card: &str, code: &str) -> Result<(), String> {
        let payer = StripePayer::new(
            &self.base,
            card,
            Money::from_minor(Asset::usd(), 1_000_000).map_err(|e| e.to_string())?,
            Arc::new(self.clock.clone()),
        )
        .map_err(|e| e.to_string())?;
        let o = self.offer(500, PaymentMode::Capture).await?;
        let before = self.emulator_balances().await.map_err(|e| e.to_string())?;
        match rail_core::Payer::pay(&payer, &OpId::random(), &o).await {
            Ok(p) => return Err(format!("a {card} payment went through: {p:?}")),
            Err(e) if e.code() == code => {}
            Err(e) => return Err(format!("{card}: expected {code}, got {} ({e})", e.code())),
        }
        let after = self.emulator_balances().await.map_err(|e| e.to_string())?;
        if before["merchant"] != after["merchant"] {
            return Err("a decline moved the merchant balance".into());
        }
        // The intent can still be paid with a good card.
        rail_core::Payer::pay(&*self.handle.payer, &OpId::random(), &o)
            .await
            .map(|_| ())
            .map_err(|e| format!("paying after a decline: {e}"))
    }

    async fn post(
        &self,
        path: &str,
        key: &str,
        idem: Option<&str>,
        form: &[(&str, &str)],
    ) -> Result<(u16, Option<String>, Value), String> {
        let mut r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .form(form);
        if let Some(k) = idem {
            r = r.header("Idempotency-Key", k);
        }
        let resp = r.send().await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let replayed = resp
            .headers()
            .get("idempotent-replayed")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp.json::<Value>().await.map_err(|e| e.to_string())?;
        Ok((status, replayed, body))
    }

    async fn idempotency(&self) -> Result<(), String> {
        let k = format!("conformance-{}", hex::encode(rand::random::<[u8; 8]>()));
        let form = [("amount", "700"), ("currency", "usd")];
        let (s1, r1, b1) = self
            .post("/v1/payment_intents", SECRET, Some(&k), &form)
            .await?;
        let (s2, r2, b2) = self
            .post("/v1/payment_intents", SECRET, Some(&k), &form)
            .await?;
        if s1 != 200
            || s2 != 200
            || b1["id"] != b2["id"]
            || r1.is_some()
            || r2.as_deref() != Some("true")
        {
            return Err(format!(
                "same key, same parameters: {s1}/{s2} {r1:?}/{r2:?} {} vs {}",
                b1["id"], b2["id"]
            ));
        }
        let (s3, _, b3) = self
            .post(
                "/v1/payment_intents",
                SECRET,
                Some(&k),
                &[("amount", "701"), ("currency", "usd")],
            )
            .await?;
        if s3 != 400 || b3["error"]["type"] != "idempotency_error" {
            return Err(format!("same key, other parameters: {s3} {b3}"));
        }
        Ok(())
    }

    async fn publishable_limits(&self) -> Result<(), String> {
        let o = self.offer(900, PaymentMode::Hold).await?;
        let pi = o.details["payment_intent"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        // Without the client secret, a publishable key cannot confirm…
        let (s, _, b) = self
            .post(
                &format!("/v1/payment_intents/{pi}/confirm"),
                PUBLISHABLE,
                None,
                &[("payment_method", &self.card)],
            )
            .await?;
        if s != 400 {
            return Err(format!("confirm without client secret: {s} {b}"));
        }
        // …and can neither capture, cancel, refund nor create.
        for (path, form) in [
            (format!("/v1/payment_intents/{pi}/capture"), vec![]),
            (format!("/v1/payment_intents/{pi}/cancel"), vec![]),
            (
                "/v1/refunds".to_owned(),
                vec![("payment_intent", pi.as_str())],
            ),
            (
                "/v1/payment_intents".to_owned(),
                vec![("amount", "100"), ("currency", "usd")],
            ),
        ] {
            let (s, _, b) = self.post(&path, PUBLISHABLE, None, &form).await?;
            if s != 401 {
                return Err(format!("{path} with a publishable key: {s} {b}"));
            }
        }
        Ok(())
    }

    async fn webhooks(&self) -> Result<(), String> {
        let secret = "whsec_conformance";
        let payload = json!({"id": "evt_1", "type": "payment_intent.succeeded", "data": {"object": {"id": "pi_1", "status": "succeeded", "amount_received": 500}}}).to_string();
        let now = self.clock.now().unix_seconds();
        let header = webhook::sign(&payload, secret, now);
        webhook::parse(
            &payload,
            &header,
            secret,
            now,
            webhook::DEFAULT_TOLERANCE_SECS,
        )
        .map_err(|e| format!("a genuine event: {e}"))?;
        let tampered = payload.replace("500", "50000");
        if webhook::parse(&tampered, &header, secret, now, 300).is_ok() {
            return Err("a tampered payload was accepted".into());
        }
        if webhook::parse(&payload, &header, secret, now + 301, 300).is_ok() {
            return Err("a replay after the tolerance was accepted".into());
        }
        if webhook::parse(&payload, &header, "whsec_other", now, 300).is_ok() {
            return Err("another endpoint's secret was accepted".into());
        }
        Ok(())
    }

    async fn minimum(&self) -> Result<(), String> {
        let m = Money::from_minor(Asset::usd(), 49).map_err(|e| e.to_string())?;
        match self
            .handle
            .receiver
            .offer(&Charge::capture(m, Duration::from_secs(60)))
            .await
        {
            Err(e) if e.code() == "invalid_input" => Ok(()),
            other => Err(format!("an offer of $0.49: {other:?}")),
        }
    }
}

impl StipendexHarness for StripeHarness {}

#[async_trait]
impl Harness for StripeHarness {
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
        "shop-elsewhere".into()
    }
    fn smallest_payable(&self) -> u128 {
        u128::from(stripe_emulator::MIN_CHARGE_USD)
    }

    async fn balances(&self) -> RailResult<Balances> {
        let b = self.emulator_balances().await?;
        let card = b["card_available"].as_i64().unwrap_or(0);
        let merchant = b["merchant"]["usd"].as_i64().unwrap_or(0);
        Ok(Balances {
            payer_available: i128::from(card),
            payee_settled: i128::from(merchant),
        })
    }

    fn malformed(&self, valid: &Payment) -> Vec<(String, Payment)> {
        let with = |name: &str, proof: Value| {
            let mut p = valid.clone();
            p.proof = proof;
            (name.to_owned(), p)
        };
        let pi = valid.proof["payment_intent"].as_str().unwrap_or_default();
        vec![
            with(
                "intent that does not exist",
                json!({"payment_intent": "pi_doesnotexist0000000000"}),
            ),
            with(
                "intent id in upper case",
                json!({"payment_intent": pi.to_uppercase()}),
            ),
            with(
                "intent id with a path",
                json!({"payment_intent": format!("{pi}/capture")}),
            ),
            with("intent id as a number", json!({"payment_intent": 42})),
        ]
    }

    fn other_receiver(&self) -> Option<RailHandle> {
        Some(self.other.clone())
    }

    fn twin_receiver(&self) -> Option<RailHandle> {
        Some(self.twin.clone())
    }

    fn hold_lifetime(&self) -> Option<Duration> {
        // Only the in-process emulator runs on the harness clock.
        self._emulator
            .as_ref()
            .map(|_| stripe_emulator::AUTHORIZATION_LIFETIME)
    }

    async fn rail_checks(&self) -> Vec<(String, Result<(), String>)> {
        self.checks().await
    }

    async fn teardown(&self) {
        if let Some(schema) = &self.pg {
            schema.drop_all().await;
        }
    }
}
