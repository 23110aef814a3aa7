//! The whole conformance suite, run against the toy rail from its own `cargo test`. This is what
//! a rail author writes: a `Harness` (the rail's parts, a funded payer, a payee, the clock, the
//! balances), a `RailEntry`, and one test calling `conformance::check`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use conformance::report::Outcome;
use conformance::{Balances, Harness, HarnessError, RailEntry, Tier};
use rail_core::{
    Asset, Capabilities, Charge, Finality, ManualClock, Money, Offer, Payment, PaymentState, Rail,
    RailError, RailHandle, RailId, RailReceiver, RailResult, Verified,
};
use toy_rail::{ToyBank, ToyReceiver};

/// The toy in the suite's terms; `make` builds a fresh harness for every behaviour.
const ENTRY: RailEntry = RailEntry {
    name: "toy",
    tiers: &[(Tier::Mock, "in memory")],
    make: |_tier| Box::pin(harness(|bank| parts(bank, "payee"))),
};

const FUNDED: u64 = 1_000_000;

/// A fresh bank per behaviour: a funded payer, the payee under test, another payee.
struct ToyHarness {
    bank: ToyBank,
    clock: ManualClock,
    rail: RailHandle,
}

async fn harness(rail: fn(&ToyBank) -> RailHandle) -> Result<Box<dyn Harness>, HarnessError> {
    let clock = ManualClock::starting_now();
    let bank = ToyBank::new(Asset::usd(), Arc::new(clock.clone()));
    for (account, balance) in [("payer", FUNDED), ("payee", 0), ("other", 0)] {
        bank.open(account, balance)
            .map_err(|e| HarnessError::Setup(e.to_string()))?;
    }
    let rail = rail(&bank);
    Ok(Box::new(ToyHarness { bank, clock, rail }))
}

/// The toy's parts as the suite takes them: `payer` pays, `payee` receives.
fn parts(bank: &ToyBank, payee: &str) -> RailHandle {
    let payer = Arc::new(bank.payer("payer"));
    let receiver = Arc::new(bank.receiver(payee));
    RailHandle {
        payer: payer.clone(),
        hold_payer: Some(payer),
        receiver: receiver.clone(),
        hold_receiver: Some(receiver.clone()),
        refunds: Some(receiver),
    }
}

#[async_trait]
impl Harness for ToyHarness {
    fn rail(&self) -> &RailHandle {
        &self.rail
    }
    fn clock(&self) -> &ManualClock {
        &self.clock
    }
    fn asset(&self) -> Asset {
        Asset::usd()
    }
    fn funded(&self) -> u128 {
        FUNDED.into()
    }
    fn other_payee(&self) -> String {
        "other".into()
    }
    async fn balances(&self) -> RailResult<Balances> {
        Ok(Balances {
            payer_available: self.bank.balance("payer")?.into(),
            payee_settled: self.bank.balance("payee")?.into(),
        })
    }
    fn malformed(&self, valid: &Payment) -> Vec<(String, Payment)> {
        let mut unknown = valid.clone();
        unknown.proof = serde_json::json!({ "transfer": "t999999" });
        vec![("a transfer the bank never made".into(), unknown)]
    }
    fn other_receiver(&self) -> Option<RailHandle> {
        Some(parts(&self.bank, "other"))
    }
    fn twin_receiver(&self) -> Option<RailHandle> {
        Some(parts(&self.bank, "payee"))
    }
    fn hold_lifetime(&self) -> Option<Duration> {
        Some(toy_rail::HOLD_LIFETIME)
    }
    /// The toy's own rules: it carries one asset, and no zero amounts.
    async fn rail_checks(&self) -> Vec<(String, Result<(), String>)> {
        let refused = |asset, units| async move {
            let amount = Money::from_minor(asset, units).map_err(|e| e.to_string())?;
            let charge = Charge::capture(amount, Duration::from_secs(60));
            match self.rail.receiver.offer(&charge).await {
                Err(e) if e.code() == "invalid_input" => Ok(()),
                other => Err(format!("expected invalid_input, got {other:?}")),
            }
        };
        vec![
            ("offer in BTC".into(), refused(Asset::btc(), 10).await),
            ("offer of zero".into(), refused(Asset::usd(), 0).await),
        ]
    }
}

#[tokio::test]
async fn toy_rail_passes_the_suite() {
    let rows = conformance::check(&ENTRY, Tier::Mock).await.unwrap();
    // The toy claims every capability and gives every hook: nothing may be skipped otherwise,
    // but the Stipendex behaviour that needs an x402 scheme (the toy is none; that behaviour
    // exists when the suite's `stipendex` feature is on, as in a workspace build).
    let skipped: Vec<_> = rows
        .iter()
        .filter(|r| r.outcome == Outcome::Skip && !r.detail.starts_with("capability not claimed"))
        .filter(|r| r.behaviour != "stipendex_x402_402_paid_under_mandate")
        .collect();
    assert!(skipped.is_empty(), "{skipped:#?}");
}

// ---- The suite also fails a broken rail: a receiver that forgets what it verified. ----------

const BROKEN: RailEntry = RailEntry {
    make: |_tier| Box::pin(harness(forgetful)),
    ..ENTRY
};

fn forgetful(bank: &ToyBank) -> RailHandle {
    RailHandle {
        payer: Arc::new(bank.payer("payer")),
        hold_payer: None,
        receiver: Arc::new(Forgetful(bank.receiver("payee"))),
        hold_receiver: None,
        refunds: None,
    }
}

/// Pay only, and a replayed payment is accepted again as if it were new.
struct Forgetful(ToyReceiver);

impl Rail for Forgetful {
    fn id(&self) -> RailId {
        self.0.id()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::pay_only(Finality::Immediate, vec![Asset::usd()])
    }
}

#[async_trait]
impl RailReceiver for Forgetful {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        self.0.offer(charge).await
    }
    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        match self.0.verify(offer, payment).await {
            Err(RailError::Replayed { .. }) => Ok(Verified {
                rail: offer.rail.clone(),
                offer_id: offer.id.clone(),
                payment_ref: payment.proof.to_string(),
                payer: payment.payer.clone(),
                amount: offer.amount.clone(),
                state: PaymentState::Settled,
            }),
            first => first,
        }
    }
}

#[tokio::test]
async fn the_suite_fails_a_rail_that_accepts_replays() {
    let failures = conformance::check(&BROKEN, Tier::Mock).await.unwrap_err();
    assert!(
        failures.0.iter().any(|f| f.contains(" replay_refused: ")),
        "{failures}"
    );
}
