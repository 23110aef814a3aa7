#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! The flow of `docs/exact-algo.md` end to end over HTTP: a devnet, a receiver, a payer.

use std::net::SocketAddr;
use std::sync::Arc;

use algod_devnet::{Devnet, DevnetConfig, RunningDevnet};
use ed25519_dalek::SigningKey;
use rail_core::{ManualClock, MemoryKeyStore, SharedClock};
use rail_exact_algo::wire::{self, Envelope};
use rail_exact_algo::{Address, AlgodClient, ExactAlgoPayer, ExactAlgoReceiver, Policy, Price};

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

/// The whole genesis hash in standard base64, padded: how some x402 SDKs spell a network
/// (`algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=` for testnet).
async fn whole_hash_network(receiver: &ExactAlgoReceiver) -> String {
    let gh = receiver.algod().params().await.unwrap().genesis_hash;
    format!("algorand:{}", data_encoding::BASE64.encode(&gh))
}

/// The envelope of `header` with its `network` replaced by `network`.
fn with_network(header: &str, network: &str) -> String {
    let json = data_encoding::BASE64.decode(header.as_bytes()).unwrap();
    let mut env: Envelope = serde_json::from_slice(&json).unwrap();
    env.network = network.to_owned();
    wire::header(&env).unwrap()
}

#[tokio::test]
async fn an_envelope_naming_the_network_by_its_whole_genesis_hash_settles() {
    let (net, payer, receiver, treasury) = setup().await;
    let whole = whole_hash_network(&receiver).await;
    assert_ne!(whole, receiver.network());
    assert!(wire::same_network(&whole, receiver.network()));
    let required = receiver
        .payment_required(&price(), "payment required")
        .await
        .unwrap();
    let signed = payer.pay_required(&required).await.unwrap();
    // Another chain's whole hash is another network, whatever the spelling.
    let mainnet = with_network(
        &signed.header,
        "algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73ktiC1qzkkit8=",
    );
    let e = receiver.settle(&mainnet, &price(), None).await.unwrap_err();
    assert_eq!(
        (e.code(), e.reason()),
        ("settlement failed", Some("wrong network"))
    );
    // This network's whole hash, base64 with padding: settles.
    let receipt = receiver
        .settle(&with_network(&signed.header, &whole), &price(), None)
        .await
        .unwrap();
    assert!(receipt.success);
    assert_eq!(receipt.transaction, signed.txid);
    // The receiver answers in its own spelling (CAIP-2), whatever the payer wrote.
    assert_eq!(receipt.network, receiver.network());
    assert_eq!(net.devnet.balance(&treasury), 101_000);
    // The same payment in the other spelling is the same payment: used.
    let again = receiver
        .settle(&signed.header, &price(), None)
        .await
        .unwrap_err();
    assert_eq!(again.code(), "paymentId already used");

    // base64url without padding works too.
    let required = receiver
        .payment_required(&price(), "payment required")
        .await
        .unwrap();
    let signed = payer.pay_required(&required).await.unwrap();
    let url = whole.replace('+', "-").replace('/', "_").replace('=', "");
    receiver
        .settle(&with_network(&signed.header, &url), &price(), None)
        .await
        .unwrap();
    assert_eq!(net.devnet.balance(&treasury), 102_000);
}

#[tokio::test]
async fn a_payer_reads_either_spelling_in_a_challenge_and_in_its_policy() {
    let (net, payer, receiver, treasury) = setup().await;
    let whole = whole_hash_network(&receiver).await;
    // A challenge naming the network by its whole hash (as an x402 SDK's receiver would):
    // the payer, on that network, pays it and echoes the challenge's spelling.
    let mut required = receiver
        .payment_required(&price(), "payment required")
        .await
        .unwrap();
    required.accepts[0].network = whole.clone();
    let signed = payer.pay_required(&required).await.unwrap();
    let json = data_encoding::BASE64
        .decode(signed.header.as_bytes())
        .unwrap();
    let env: Envelope = serde_json::from_slice(&json).unwrap();
    assert_eq!(env.network, whole);
    // The same challenge in the CAIP-2 spelling is the same payment: the same transaction.
    required.accepts[0].network = receiver.network().to_owned();
    let again = payer.pay_required(&required).await.unwrap();
    assert_eq!(again.txid, signed.txid);
    receiver
        .settle(&signed.header, &price(), None)
        .await
        .unwrap();
    assert_eq!(net.devnet.balance(&treasury), 101_000);

    // A policy naming the network by its whole hash pays a CAIP-2 challenge; one naming
    // another network does not.
    let algod = receiver.algod().clone();
    let store = Arc::new(MemoryKeyStore::default());
    let clock: SharedClock = Arc::new(ManualClock::starting_now());
    let policy = |networks: Vec<String>| Policy {
        networks,
        ..Policy::default()
    };
    let whole_policy = ExactAlgoPayer::new(
        key(1),
        algod.clone(),
        policy(vec![whole.clone()]),
        store.clone(),
        clock.clone(),
    );
    let required = receiver
        .payment_required(&price(), "payment required")
        .await
        .unwrap();
    assert!(whole_policy.choose(&required.accepts, "").is_ok());
    let signed = whole_policy.pay_required(&required).await.unwrap();
    receiver
        .settle(&signed.header, &price(), None)
        .await
        .unwrap();
    assert_eq!(net.devnet.balance(&treasury), 102_000);
    let mainnet_only = ExactAlgoPayer::new(
        key(1),
        algod,
        policy(vec![
            "algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73ktiC1qzkkit8=".into(),
        ]),
        store,
        clock,
    );
    let required = receiver
        .payment_required(&price(), "payment required")
        .await
        .unwrap();
    let refused = mainnet_only.pay_required(&required).await.unwrap_err();
    assert!(refused.to_string().contains("not allowed"), "{refused}");
}

/// Settle-after on an exact-algo route: the payment is simulated before the paid work runs, so
/// one that can no longer be afforded (the payer spent its ALGO after signing) is refused with
/// the chain's reason and the work never runs; an affordable one is served and settled.
#[tokio::test]
async fn settle_after_simulates_before_the_paid_work_runs() {
    use axum::Router;
    use axum::routing::get;
    use rail_exact_algo::ExactAlgo;
    use rail_exact_algo::txn::PayTxn;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use x402_transport::Accepts;
    use x402_transport::paywall::Paywall;
    use x402_transport::settle::SettleWhen;
    use x402_transport::wire::PaymentRequired;

    let (net, payer, receiver, treasury) = setup().await;
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = runs.clone();
    let paywall = Paywall::new()
        .settle(SettleWhen::After)
        .with_served(receiver.served().clone())
        .route(
            "/api/posts/{id}",
            "read post body",
            Accepts::one(Arc::new(ExactAlgo::new(receiver.clone())), 1000).unwrap(),
        );
    let app = paywall.apply(Router::new().route(
        "/api/posts/{id}",
        get(move || {
            seen.fetch_add(1, Ordering::SeqCst);
            async { "the body" }
        }),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api/posts/1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = rail_exact_algo::algod::http_client(std::time::Duration::from_secs(10)).unwrap();

    // An affordable payment: simulated, served, settled.
    let required: wire::PaymentRequired =
        http.get(&url).send().await.unwrap().json().await.unwrap();
    let signed = payer.pay_required(&required).await.unwrap();
    let ok = http
        .get(&url)
        .header("PAYMENT-SIGNATURE", &signed.header)
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(net.devnet.balance(&treasury), 101_000);

    // Signed, then the payer spends everything but its minimum balance elsewhere.
    let required: wire::PaymentRequired =
        http.get(&url).send().await.unwrap().json().await.unwrap();
    let signed = payer.pay_required(&required).await.unwrap();
    let p = AlgodClient::new(&net.url, Some("t0ken".into()))
        .unwrap()
        .params()
        .await
        .unwrap();
    let left = net.devnet.balance(&payer.address());
    let drain = PayTxn {
        sender: payer.address(),
        receiver: addr(&key(9)),
        amount: left - 100_000 - 1000,
        fee: 1000,
        first_valid: p.last_round,
        last_valid: p.last_round + 1000,
        genesis_id: p.genesis_id,
        genesis_hash: p.genesis_hash,
        note: b"elsewhere".to_vec(),
        close_to: None,
        rekey_to: None,
        group: None,
        lease: None,
    }
    .sign(&key(1), None);
    net.devnet.submit(&drain.encode()).unwrap();
    let refused = http
        .get(&url)
        .header("PAYMENT-SIGNATURE", &signed.header)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 402);
    let body: PaymentRequired = refused.json().await.unwrap();
    assert_eq!(body.reason.as_deref(), Some("simulation failed"));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the paid work did not run");
    assert_eq!(net.devnet.balance(&treasury), 101_000);
}
