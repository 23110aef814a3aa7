//! The conformance suite under `cargo test`: every rail on every tier, and proof that the suite
//! catches a broken rail (a behaviour that cannot fail proves nothing).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stdout,
    clippy::print_stderr,
    missing_docs
)]

use std::sync::Arc;

use async_trait::async_trait;
use conformance::report::{self, Outcome, ResultRow};
use conformance::{Balances, Harness, HarnessError, RailEntry, Tier};
use conformance_runner::rails;
use futures::future::BoxFuture;
use rail_core::{
    Asset, Capabilities, Charge, ManualClock, Offer, Payment, PaymentState, Rail, RailHandle,
    RailId, RailReceiver, RailResult, Verified,
};
use stipendex_conformance::StipendexEntry;

/// Runs one rail on one tier and prints one line for it, plus one line per failed behaviour:
/// short enough that a truncated CI log still shows which behaviour failed and why (a full
/// matrix per rail is `cargo run --bin conformance -- run`).
async fn run(entry: &StipendexEntry, tier: Tier) -> Vec<ResultRow> {
    let rows = stipendex_conformance::run_rail_tier(entry, tier, &[], &mut |_| {}).await;
    let (passed, failed, skipped) = report::counts(&rows);
    println!(
        "{}/{tier}: {passed} passed, {failed} failed, {skipped} skipped",
        entry.name
    );
    for f in failures(&rows) {
        println!("  FAILED {f}");
    }
    rows
}

fn failures(rows: &[ResultRow]) -> Vec<String> {
    rows.iter()
        .filter(|r| r.outcome == Outcome::Fail)
        .map(|r| format!("{}/{} {}: {}", r.rail, r.tier, r.behaviour, r.detail))
        .collect()
}

/// Skips the rail may not have: for the ledger and the account rail, which claim every
/// capability, only the behaviour that needs an x402 scheme, the one about rails that cannot
/// capture part of a hold (and, off CI, an absent localnet).
fn unexpected_skips(entry: &StipendexEntry, rows: &[ResultRow]) -> Vec<String> {
    if entry.name != "ledger" && entry.name != "account" {
        return Vec::new();
    }
    rows.iter()
        .filter(|r| r.outcome == Outcome::Skip)
        .filter(|r| {
            r.behaviour != "stipendex_x402_402_paid_under_mandate"
                && r.behaviour != "stipendex_tab_refused_without_partial_capture"
                && !r.detail.starts_with("localnet unavailable")
        })
        .map(|r| {
            format!(
                "{}/{} {} skipped: {}",
                r.rail, r.tier, r.behaviour, r.detail
            )
        })
        .collect()
}

/// Every rail on `tier`; all rails run even when one fails, and the test's error lists every
/// failure (a returned error prints no backtrace to push it out of the log).
async fn every_rail_passes(tier: Tier) -> Result<(), String> {
    let mut problems = Vec::new();
    for entry in rails::all() {
        let rows = run(&entry, tier).await;
        problems.extend(failures(&rows));
        problems.extend(unexpected_skips(&entry, &rows));
        if rows.iter().all(|r| r.outcome == Outcome::Skip) {
            eprintln!(
                "SKIPPED: {} {tier} tier: {}",
                entry.name,
                rows.first().map(|r| r.detail.as_str()).unwrap_or("")
            );
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} problem(s): {}",
            problems.len(),
            problems.join(" | ")
        ))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rail_passes_on_the_mock_tier() -> Result<(), String> {
    every_rail_passes(Tier::Mock).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rail_passes_on_the_localnet_tier() -> Result<(), String> {
    // In CI an unavailable localnet is reported as a failure by the runner itself.
    every_rail_passes(Tier::Localnet).await
}

/// A receiver that trusts the payment envelope and never consults the rail or a replay guard.
struct TrustingReceiver {
    inner: Arc<dyn RailReceiver>,
}

impl Rail for TrustingReceiver {
    fn id(&self) -> RailId {
        self.inner.id()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait]
impl RailReceiver for TrustingReceiver {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        self.inner.offer(charge).await
    }
    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        offer.check_live(rail_core::Timestamp(0))?;
        Ok(Verified {
            rail: offer.rail.clone(),
            offer_id: offer.id.clone(),
            payment_ref: payment.proof.to_string(),
            payer: payment.payer.clone(),
            amount: offer.amount.clone(),
            state: PaymentState::Settled,
        })
    }
}

struct Broken {
    inner: Box<dyn Harness>,
    handle: RailHandle,
}

#[async_trait]
impl Harness for Broken {
    fn rail(&self) -> &RailHandle {
        &self.handle
    }
    fn clock(&self) -> &ManualClock {
        self.inner.clock()
    }
    fn asset(&self) -> Asset {
        self.inner.asset()
    }
    fn funded(&self) -> u128 {
        self.inner.funded()
    }
    fn other_payee(&self) -> String {
        self.inner.other_payee()
    }
    async fn balances(&self) -> RailResult<Balances> {
        self.inner.balances().await
    }
    async fn teardown(&self) {
        self.inner.teardown().await;
    }
}

fn broken(tier: Tier) -> BoxFuture<'static, Result<Box<dyn Harness>, HarnessError>> {
    Box::pin(async move {
        let inner =
            stipendex_conformance::make_harness(&rails::find("ledger").unwrap(), tier).await?;
        let mut handle = inner.rail().clone();
        handle.receiver = Arc::new(TrustingReceiver {
            inner: handle.receiver.clone(),
        });
        // Pay-only: the hold and refund parts are dropped, and the claim with them.
        handle.hold_receiver = None;
        handle.refunds = None;
        Ok(Box::new(Broken { inner, handle }) as Box<dyn Harness>)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_catches_a_broken_rail() {
    let entry = RailEntry {
        name: "broken-ledger",
        tiers: &[(Tier::Mock, "trusting receiver")],
        make: broken,
    };
    let rows = report::run_rail_tier(&entry, Tier::Mock, &[], &mut |_| {}).await;
    let failed: Vec<&str> = rows
        .iter()
        .filter(|r| r.outcome == Outcome::Fail)
        .map(|r| r.behaviour.as_str())
        .collect();
    for must in [
        "capabilities_are_honest",
        "verify_binds_offer",
        "verify_binds_amount",
        "verify_binds_payee",
        "replay_refused",
        "concurrent_verify_settles_once",
        "expired_offer_refused",
        "malformed_payments_refused",
    ] {
        assert!(
            failed.contains(&must),
            "{must} did not catch the trusting receiver; failed: {failed:?}"
        );
    }
}

/// The ledger's receiver, claiming that `pay` only signs (it moves the money).
struct ClaimsSignOnly {
    inner: Arc<dyn RailReceiver>,
}

impl Rail for ClaimsSignOnly {
    fn id(&self) -> RailId {
        self.inner.id()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pay_effect: rail_core::PayEffect::SignsOnly,
            ..self.inner.capabilities()
        }
    }
}

#[async_trait]
impl RailReceiver for ClaimsSignOnly {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        self.inner.offer(charge).await
    }
    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        self.inner.verify(offer, payment).await
    }
}

fn lying_about_pay(tier: Tier) -> BoxFuture<'static, Result<Box<dyn Harness>, HarnessError>> {
    Box::pin(async move {
        let inner =
            stipendex_conformance::make_harness(&rails::find("ledger").unwrap(), tier).await?;
        let mut handle = inner.rail().clone();
        handle.receiver = Arc::new(ClaimsSignOnly {
            inner: handle.receiver.clone(),
        });
        Ok(Box::new(Broken { inner, handle }) as Box<dyn Harness>)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_suite_catches_a_false_claim_about_where_money_moves() {
    let entry = RailEntry {
        name: "ledger-claiming-sign-only",
        tiers: &[(Tier::Mock, "ledger whose receiver claims pay only signs")],
        make: lying_about_pay,
    };
    let rows = report::run_rail_tier(
        &entry,
        Tier::Mock,
        &["pay_moves_money_as_claimed".to_owned()],
        &mut |_| {},
    )
    .await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, Outcome::Fail, "{:?}", rows[0]);
    assert!(
        rows[0].detail.contains("claims `pay` only signs"),
        "{}",
        rows[0].detail
    );
}
