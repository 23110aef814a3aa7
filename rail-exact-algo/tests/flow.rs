#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! The seed's flow end to end over HTTP: a devnet, a receiver, a payer.

use std::net::SocketAddr;
use std::sync::Arc;

use ed25519_dalek::SigningKey;
use rail_core::{ManualClock, MemoryKeyStore, SharedClock};
use rail_exact_algo::{
    Address, AlgodClient, Devnet, DevnetConfig, ExactAlgoPayer, ExactAlgoReceiver, Policy, Price,
    RunningDevnet,
};

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

async fn setup() -> (RunningDevnet, ExactAlgoPayer, ExactAlgoReceiver, Address) {
    let payer_key = key(1);
    let treasury = addr(&key(2));
    let cfg = DevnetConfig {
        accounts: vec![(addr(&payer_key), 5_000_000), (treasury, 100_000)],
        token: Some("t0ken".into()),
        ..DevnetConfig::default()
    };
    let net = Devnet::spawn(cfg, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap();
    let algod = AlgodClient::new(&net.url, Some("t0ken".into())).unwrap();
    let clock: SharedClock = Arc::new(ManualClock::starting_now());
    let store = Arc::new(MemoryKeyStore::with_clock(clock.clone()));
    let receiver =
        ExactAlgoReceiver::connect(algod.clone(), treasury, store.clone(), clock.clone())
            .await
            .unwrap();
    let payer = ExactAlgoPayer::new(payer_key, algod, Policy::default(), store.clone(), clock);
    (net, payer, receiver, treasury)
}

fn price() -> Price {
    Price {
        resource: "/api/posts/1".into(),
        description: "read post body".into(),
        amount: 1000,
    }
}

#[tokio::test]
async fn pay_settle_and_refuse_a_replay() {
    let (net, payer, receiver, treasury) = setup().await;
    let required = receiver
        .payment_required(&price(), "payment required")
        .await
        .unwrap();
    let signed = payer.pay_required(&required).await.unwrap();
    let receipt = receiver
        .settle(&signed.header, &price(), None)
        .await
        .unwrap();
    assert!(receipt.success);
    assert_eq!(receipt.transaction, signed.txid);
    assert_eq!(receipt.amount, "1000");
    assert_eq!(net.devnet.balance(&treasury), 101_000);
    assert_eq!(
        net.devnet.balance(&payer.address()),
        5_000_000 - 1000 - 1000
    );
    let again = receiver
        .settle(&signed.header, &price(), None)
        .await
        .unwrap_err();
    assert_eq!(again.code(), "paymentId already used");
    assert_eq!(net.devnet.balance(&treasury), 101_000);
}

#[tokio::test]
async fn a_payment_for_a_cheap_resource_does_not_unlock_a_dear_one() {
    let (_net, payer, receiver, _) = setup().await;
    let required = receiver
        .payment_required(&price(), "payment required")
        .await
        .unwrap();
    let signed = payer.pay_required(&required).await.unwrap();
    let dear = Price {
        resource: "/api/posts/2".into(),
        amount: 1000,
        ..price()
    };
    let e = receiver
        .settle(&signed.header, &dear, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "unknown or expired paymentId");
    let dearer = Price {
        amount: 5000,
        ..price()
    };
    let e = receiver
        .settle(&signed.header, &dearer, None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "underpaid");
    // The genuine one still settles.
    receiver
        .settle(&signed.header, &price(), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn the_token_is_required_and_never_printed() {
    let (net, _, _, _) = setup().await;
    let bad = AlgodClient::new(&net.url, Some("wrong".into())).unwrap();
    let e = bad.last_round().await.unwrap_err();
    assert_eq!(e.to_string(), "algod 401: Invalid API Token");
    assert!(!format!("{bad:?}").contains("wrong"));
}

#[tokio::test]
async fn paid_work_that_fails_can_be_served_again_without_a_second_charge() {
    let (net, payer, receiver, treasury) = setup().await;
    let required = receiver
        .payment_required(&price(), "payment required")
        .await
        .unwrap();
    let signed = payer.pay_required(&required).await.unwrap();
    // Through the shared transport (as the paywall and the MCP adapter run it): settled, then
    // the paid work fails: not served.
    let accept = x402_transport::Accept {
        scheme: std::sync::Arc::new(rail_exact_algo::ExactAlgo::new(receiver.clone())),
        amount: u128::from(price().amount),
    };
    let tprice = x402_transport::Price {
        resource: price().resource,
        url: "http://localhost/api/posts/1".into(),
        description: price().description,
        amount: u128::from(price().amount),
    };
    let presented = x402_transport::Presented::Header(signed.header.clone());
    let taken = x402_transport::settle::take(
        &accept,
        tprice,
        &presented,
        receiver.served(),
        receiver.clock().now(),
    )
    .await
    .unwrap();
    let paid = taken.settle().await.unwrap();
    assert_eq!(paid.settled.transaction, signed.txid);
    let (served, settled) = paid.run(|| async { false }, |ok| *ok).await.unwrap();
    assert!(!served && settled.is_some());
    assert_eq!(net.devnet.balance(&treasury), 101_000);
    // The same payment again: found on chain, served, no new transaction.
    let r = receiver
        .settle(&signed.header, &price(), None)
        .await
        .unwrap();
    assert_eq!(r.transaction, signed.txid);
    assert_eq!(net.devnet.balance(&treasury), 101_000);
    // Served once: never again.
    let e = receiver
        .settle(&signed.header, &price(), None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "paymentId already used");
}

/// One transaction per paymentId: the payer records each signed payment before handing it out,
/// so the same challenge answered twice (a retry, a recovering attempt, another process with the
/// same store) gets the same transaction — a receiver is never given two valid transactions
/// with one paymentId, both of which the chain would accept. Before, each call signed anew.
#[tokio::test]
async fn one_challenge_is_signed_once() {
    let (net, payer, receiver, treasury) = setup().await;
    let required = receiver
        .payment_required(&price(), "payment required")
        .await
        .unwrap();
    let first = payer.pay_required(&required).await.unwrap();
    // The chain moves on: a fresh signature would carry other rounds, hence another txid.
    net.devnet.advance(5);
    let again = payer.pay_required(&required).await.unwrap();
    assert_eq!(again, first, "the same challenge gets the same transaction");
    // The same challenge rewritten to ask for more is refused, not signed a second time.
    let mut dearer = required.clone();
    dearer.accepts[0].max_amount_required = "2000".into();
    let refused = payer.pay_required(&dearer).await.unwrap_err();
    assert!(refused.to_string().contains("already signed"), "{refused}");
    let receipt = receiver
        .settle(&again.header, &price(), None)
        .await
        .unwrap();
    assert!(receipt.success);
    assert_eq!(net.devnet.balance(&treasury), 101_000);
}
