//! `conformance demo --rail NAME`: the `stipendex demo` scenario over a rail's localnet.
//!
//! The product's `stipendex demo` runs on the embedded ledger; this runs the same calls
//! ([`stipendex_app::demo::run_stage`]) over the named rail's localnet harness, with prices
//! that are multiples of the rail's smallest practical charge. Start the localnets first
//! (`conformance localnet up --env-out ln.env`, then `source ln.env`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use async_trait::async_trait;
use conformance::{Harness, HarnessError, Tier};
use rail_core::{PayerHandle, ReceiverHandle};
use stipendex_app::demo::{Prices, ReadBalances, Stage, demo_dir, run_stage};
use stipendex_app::{Error as CliError, msg as fail};

use crate::rails;

/// The localnet harness's balances, for the demo.
struct HarnessBalances(Box<dyn Harness>);

#[async_trait]
impl ReadBalances for HarnessBalances {
    async fn read(&self) -> Result<(i128, i128), String> {
        let b = self
            .0
            .balances()
            .await
            .map_err(|e| format!("cannot read balances: {e}"))?;
        Ok((b.payer_available, b.payee_settled))
    }
    async fn teardown(&self) {
        self.0.teardown().await;
    }
}

/// The demo's stage on `name`'s localnet.
///
/// # Errors
/// An unknown rail, a localnet that is not up, or a payer without enough funds.
pub async fn stage(name: &str) -> Result<Stage, CliError> {
    let entry = rails::find(name).ok_or_else(|| {
        fail(format!(
            "--rail {name:?} is not a rail: use ledger, account, exact-algo, stripe, ln-nwc or x402"
        ))
    })?;
    let harness = stipendex_conformance::make_harness(&entry, Tier::Localnet)
        .await
        .map_err(|e| match e {
            HarnessError::Unavailable(why) => fail(format!(
                "the {name} localnet is not up ({why}): start it with `conformance localnet up --env-out ln.env`, then `source ln.env`"
            )),
            e => fail(format!("cannot set up the {name} rail: {e}")),
        })?;
    let rail = harness.rail().clone();
    let too_large = || {
        fail(format!(
            "the {name} rail's smallest charge ({}) is too large for the demo's prices",
            harness.smallest_payable()
        ))
    };
    let prices = Prices::from_base(harness.smallest_payable().max(125)).ok_or_else(too_large)?;
    let needed = prices.needed().ok_or_else(too_large)?;
    if harness.funded() < needed {
        return Err(fail(format!(
            "the {name} localnet's payer holds {} minor units, the demo needs {needed}",
            harness.funded()
        )));
    }
    Ok(Stage {
        label: format!(
            "the {name} rail on its localnet ({})",
            entry.tier(Tier::Localnet).unwrap_or("")
        ),
        payer: PayerHandle {
            payer: rail.payer.clone(),
            hold_payer: rail.hold_payer.clone(),
        },
        receiver: ReceiverHandle {
            receiver: rail.receiver.clone(),
            hold_receiver: rail.hold_receiver.clone(),
            refunds: rail.refunds.clone(),
        },
        // The harness keeps the rail's records itself; the demo's receiver keeps its own.
        store: None,
        asset: harness.asset(),
        clock: Arc::new(harness.clock().clone()),
        prices,
        balances: Box::new(HarnessBalances(harness)),
    })
}

/// Runs the demo on `rail`'s localnet, keeping its files in `dir` (a new temporary directory
/// when `None`); the human's answer to confirmations is `confirm`.
///
/// # Errors
/// As [`stage`] and [`run_stage`].
pub async fn run(rail: &str, dir: Option<PathBuf>, confirm: bool) -> Result<ExitCode, CliError> {
    let dir = demo_dir(dir)?;
    let stage = stage(rail).await?;
    run_stage(stage, &dir, confirm).await
}
