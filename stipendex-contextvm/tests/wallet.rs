//! CEP-8 paid through a Stipendex wallet under its mandate: the server allowlisted by its
//! Nostr key, the limits applied, the audit chain holding a Proof of what was paid; a server
//! the mandate does not name, or a price above the per-call limit, is declined and nothing is
//! paid.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{Tools, call, stipendex_wallet, text, world};
use stipendex::envelope::{ChallengeSource, Proof, Signed};
use stipendex_contextvm::payments::WalletHandler;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wallet_pays_an_allowlisted_server_under_its_mandate_and_audits_it() {
    let w = world().await;
    let tools = Tools::default();
    let server = w.server(tools.clone(), Some(w.payments(None))).await;
    let (wallet, journal) =
        stipendex_wallet(&w, "agent", &[server.public_key().to_hex()], 100, 1000).await;
    let client = w
        .client(&server, Some(Arc::new(WalletHandler::new(wallet))))
        .await;
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        client.call_tool(call("search", "x")),
    )
    .await
    .expect("in time")
    .unwrap();
    assert_eq!(text(&r), "search: x");
    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 10_000);
    assert_eq!(w.devnet.balance_msat("agent").unwrap(), 990_000);

    // The audit chain: the mandate, then a Proof of a ContextVM payment request.
    let names = journal.names();
    assert_eq!(names.len(), 1, "{names:?}");
    let chain = journal.chain(&names[0]);
    let proof = Signed::<Proof>::parse(chain.last().unwrap()).unwrap();
    let c = proof.object().challenge.as_ref().expect("a challenge");
    assert_eq!(c.source, ChallengeSource::Contextvm);
    assert_eq!(c.origin, server.public_key().to_hex());
    assert_eq!(c.entry["amount"], 10);
    assert_eq!(proof.object().rail, "ln-nwc");
    // `verify-chain`'s check: the mandate allows this server, the Proof is within its limits.
    let objects: Vec<&str> = chain.iter().map(String::as_str).collect();
    stipendex::chain::verify_chain(&objects, None).expect("the chain verifies");
    assert_eq!(tools.runs.load(Ordering::SeqCst), 1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_not_in_the_mandate_or_above_the_limit_is_declined_and_nothing_is_paid() {
    let w = world().await;
    let tools = Tools::default();
    let server = w.server(tools.clone(), Some(w.payments(None))).await;

    // Another server's key in the mandate: denied.
    let other = nostr::Keys::generate().public_key().to_hex();
    let (wallet, _) = stipendex_wallet(&w, "stranger", &[other], 100, 1000).await;
    let client = w
        .client(&server, Some(Arc::new(WalletHandler::new(wallet))))
        .await;
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        client.call_tool(call("search", "x")),
    )
    .await
    .expect("in time")
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("Payment declined by client handler"),
        "{err}"
    );

    // Allowed, but 10 sats is above a 5-sat per-call limit: refused by the limits.
    let (wallet, _) =
        stipendex_wallet(&w, "frugal", &[server.public_key().to_hex()], 5, 1000).await;
    let client = w
        .client(&server, Some(Arc::new(WalletHandler::new(wallet))))
        .await;
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        client.call_tool(call("search", "y")),
    )
    .await
    .expect("in time")
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("Payment declined by client handler"),
        "{err}"
    );

    assert_eq!(w.devnet.balance_msat("shop").unwrap(), 0);
    assert_eq!(w.devnet.balance_msat("stranger").unwrap(), 1_000_000);
    assert_eq!(w.devnet.balance_msat("frugal").unwrap(), 1_000_000);
    assert_eq!(tools.runs.load(Ordering::SeqCst), 0);
    server.shutdown().await;
}
