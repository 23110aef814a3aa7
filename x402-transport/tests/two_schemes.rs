//! One route, two schemes: the shared paywall offers `exact` on EVM (EIP-3009, on the in-memory
//! token) and exact-algo (`docs/exact-algo.md`, on the algod devnet) in one 402, and the shared
//! client pays it with whichever scheme its payers' order and policies choose; each payment is
//! served once.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    unreachable_pub
)]

use std::net::SocketAddr;
use std::sync::Arc;

use algod_devnet::{Devnet, DevnetConfig};
use alloy_primitives::{Address, U256};
use axum::Router;
use axum::routing::get;
use ed25519_dalek::SigningKey;
use rail_core::{MemoryKeyStore, SystemClock};
use rail_exact_algo::{AlgodClient, ExactAlgo, ExactAlgoPayer, ExactAlgoReceiver, Policy};
use rail_x402::client::{EvmFetched, client};
use rail_x402::evm::LocalSigner;
use rail_x402::payer::{Policy as EvmPolicy, X402Payer};
use rail_x402::{ExactEvm, Token};
use x402_devnet::DevnetFacilitator;
use x402_transport::client::Client;
use x402_transport::paywall::Paywall;
use x402_transport::wire::{PaymentRequired, decode_base64_json};
use x402_transport::{Accepts, Scheme};

const NET: &str = "eip155:84532";

fn algo_addr(k: &SigningKey) -> rail_exact_algo::Address {
    rail_exact_algo::Address(k.verifying_key().to_bytes())
}

#[tokio::test]
async fn each_client_pays_a_route_offering_both_schemes() {
    // exact-algo: a devnet, a receiver and a funded payer.
    let algo_payer_key = SigningKey::from_bytes(&[1; 32]);
    let treasury = algo_addr(&SigningKey::from_bytes(&[2; 32]));
    let net = Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (algo_addr(&algo_payer_key), 5_000_000),
                (algo_addr(&SigningKey::from_bytes(&[3; 32])), 5_000_000),
                (treasury, 100_000),
            ],
            ..DevnetConfig::default()
        },
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let algod = AlgodClient::new(&net.url, None).unwrap();
    let store = Arc::new(MemoryKeyStore::default());
    let receiver = ExactAlgoReceiver::connect(
        algod.clone(),
        treasury,
        store.clone(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let algo_payer = ExactAlgoPayer::new(
        algo_payer_key,
        algod.clone(),
        Policy::default(),
        store.clone(),
        Arc::new(SystemClock),
    );
    let algo_payer2 = ExactAlgoPayer::new(
        SigningKey::from_bytes(&[3; 32]),
        algod,
        Policy::default(),
        store.clone(),
        Arc::new(SystemClock),
    );

    // exact on EVM: the in-memory EIP-3009 token and a funded payer.
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let token = Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2");
    let evm_pay_to = Address::repeat_byte(0x22);
    let evm_key = LocalSigner::random();
    mock.mint(token.address, evm_key.address(), U256::from(10_000))
        .unwrap();
    let evm_key2 = LocalSigner::random();
    mock.mint(token.address, evm_key2.address(), U256::from(10_000))
        .unwrap();

    // One route, both schemes, one served-once record (the receiver's store).
    let evm: Arc<dyn Scheme> = Arc::new(ExactEvm::new(mock.clone(), token.clone(), evm_pay_to));
    let algo: Arc<dyn Scheme> = Arc::new(ExactAlgo::new(receiver.clone()));
    let accepts = Accepts::one(evm, 1_000).unwrap().or(algo, 2_000).unwrap();
    let paywall = Paywall::new().with_served(receiver.served().clone()).route(
        "/paid",
        "the paid thing",
        accepts,
    );
    let app = paywall.apply(Router::new().route("/paid", get(|| async { "content" })));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/paid", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = rail_x402::rpc::http_client(std::time::Duration::from_secs(10)).unwrap();

    // One 402, both entries, in the route's order; the v2 `resource` is there (EVM wants it).
    let unpaid = http.get(&url).send().await.unwrap();
    assert_eq!(unpaid.status(), 402);
    let header = unpaid.headers()["payment-required"]
        .to_str()
        .unwrap()
        .to_owned();
    let required: PaymentRequired = decode_base64_json(&header).unwrap();
    let entries = required.entries();
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["network"], NET);
    assert_eq!(entries[0]["amount"], "1000");
    assert_eq!(entries[1]["asset"], "ALGO");
    assert_eq!(entries[1]["maxAmountRequired"], "2000");
    // Each entry is sent exactly as its scheme wrote it (x402's member order, that of
    // `docs/exact-algo.md` §2.2).
    assert!(
        required.accepts[0]
            .get()
            .starts_with(r#"{"scheme":"exact","network":"#)
    );
    assert!(
        required.accepts[1]
            .get()
            .starts_with(r#"{"scheme":"exact","network":"algorand:"#)
    );
    assert!(required.resource.is_some());
    assert_eq!(unpaid.json::<PaymentRequired>().await.unwrap(), required);

    // The shared client with the exact-algo payer: it passes over the EVM entry by policy.
    let algo_client = Client::new(rail_x402::rpc::http_builder(
        std::time::Duration::from_secs(10),
    ))
    .unwrap()
    .with_payer(Arc::new(algo_payer.for_client().await.unwrap()));
    let paid = algo_client.get(&url).await.unwrap();
    assert_eq!(paid.status, 200);
    assert_eq!(paid.body, b"content");
    let receipt: rail_exact_algo::wire::PaymentResponse =
        serde_json::from_value(paid.response.clone().unwrap()).unwrap();
    assert!(receipt.success);
    assert_eq!(net.devnet.balance(&treasury), 102_000);
    let sent = paid.payment.clone().unwrap();
    assert_eq!(sent.label, "exact-algo");
    let algo_header = x402_transport::wire::encode_base64_json(&sent.envelope).unwrap();

    // A client with both payers pays with the first it holds that accepts an entry (EVM here).
    let evm_payer2 = X402Payer::new(
        evm_key2.clone(),
        EvmPolicy::new(NET, token.address, U256::from(1000)),
    );
    let both = Client::new(rail_x402::rpc::http_builder(
        std::time::Duration::from_secs(10),
    ))
    .unwrap()
    .with_payer(Arc::new(evm_payer2))
    .with_payer(Arc::new(algo_payer2.for_client().await.unwrap()));
    let paid = both.get(&url).await.unwrap();
    assert_eq!(paid.status, 200);
    assert_eq!(paid.payment.unwrap().label, "exact-evm");
    assert_eq!(
        mock.balance(token.address, evm_pay_to).unwrap(),
        U256::from(1_000)
    );

    // rail-x402's typed client (the shared one underneath) picks the EVM entry by policy.
    let evm_payer = X402Payer::new(
        evm_key,
        EvmPolicy::new(NET, token.address, U256::from(1000)),
    );
    let client = client(evm_payer).unwrap();
    let evm_paid = EvmFetched::from(client.get(&url).await.unwrap());
    assert_eq!(evm_paid.status, 200);
    let settled = evm_paid.settlement.expect("a PAYMENT-RESPONSE");
    assert!(settled.success);
    assert_eq!(
        mock.balance(token.address, evm_pay_to).unwrap(),
        U256::from(2_000)
    );

    // Each payment is served once: the exact-algo replay gets `paymentId already used`
    // (`docs/exact-algo.md` §8).
    let replay = http
        .get(&url)
        .header("PAYMENT-SIGNATURE", &algo_header)
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 402);
    let body: PaymentRequired = replay.json().await.unwrap();
    assert_eq!(body.error.as_deref(), Some("paymentId already used"));
    assert_eq!(net.devnet.balance(&treasury), 102_000);
}

/// One route, three ways to pay: USDC on EVM, USDC on Algorand (x402's own `exact` on Algorand, the
/// facilitator paying the fees) and native ALGO (exact-algo, `docs/exact-algo.md`), in one 402;
/// each client pays the entry its payer holds, and the Algorand USDC payment is told apart from the
/// exact-algo one by its shape, though both are `exact` on the same network.
#[tokio::test]
async fn usdc_on_evm_usdc_on_algorand_and_algo_in_one_402() {
    use algod_devnet::TESTNET_USDC;
    use rail_exact_algo::avm::{AvmFacilitator, AvmPayer, AvmPolicy, ExactAvm, FeePayer};

    // Algorand: a devnet posing as testnet, with USDC.
    let issuer = SigningKey::from_bytes(&[0x31; 32]);
    let algo_payer_key = SigningKey::from_bytes(&[0x32; 32]);
    let fee_payer = SigningKey::from_bytes(&[0x33; 32]);
    let treasury = algo_addr(&SigningKey::from_bytes(&[0x34; 32]));
    let net = Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (algo_addr(&issuer), 1_000_000),
                (algo_addr(&algo_payer_key), 5_000_000),
                (algo_addr(&fee_payer), 1_000_000),
                (treasury, 1_000_000),
            ],
            ..DevnetConfig::testnet(algo_addr(&issuer))
        },
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let d = &net.devnet;
    d.opt_in(algo_addr(&algo_payer_key), TESTNET_USDC).unwrap();
    d.fund_asset(algo_addr(&algo_payer_key), TESTNET_USDC, 1_000_000)
        .unwrap();
    d.opt_in(treasury, TESTNET_USDC).unwrap();
    let algod = AlgodClient::new(&net.url, None).unwrap();
    let store = Arc::new(MemoryKeyStore::default());
    let receiver = ExactAlgoReceiver::connect(
        algod.clone(),
        treasury,
        store.clone(),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    let facilitator = AvmFacilitator::connect(
        algod.clone(),
        Some(FeePayer::new(fee_payer.clone())),
        store.clone(),
    )
    .await
    .unwrap();

    // EVM: the in-memory EIP-3009 token.
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let token = Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2");
    let evm_pay_to = Address::repeat_byte(0x23);

    // $0.01 in each USDC, 0.002 ALGO natively.
    let evm: Arc<dyn Scheme> = Arc::new(ExactEvm::new(mock.clone(), token.clone(), evm_pay_to));
    let avm: Arc<dyn Scheme> = Arc::new(ExactAvm::usdc(facilitator, treasury));
    let algo: Arc<dyn Scheme> = Arc::new(ExactAlgo::new(receiver.clone()));
    let accepts = Accepts::one(evm, 10_000)
        .unwrap()
        .or(avm, 10_000)
        .unwrap()
        .or(algo, 2_000)
        .unwrap();
    let paywall = Paywall::new().with_served(receiver.served().clone()).route(
        "/paid",
        "the paid thing",
        accepts,
    );
    let app = paywall.apply(Router::new().route("/paid", get(|| async { "content" })));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/paid", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = rail_x402::rpc::http_client(std::time::Duration::from_secs(10)).unwrap();

    let unpaid = http.get(&url).send().await.unwrap();
    assert_eq!(unpaid.status(), 402);
    let required: PaymentRequired =
        decode_base64_json(unpaid.headers()["payment-required"].to_str().unwrap()).unwrap();
    let entries = required.entries();
    assert_eq!(entries.len(), 3);
    assert_eq!(entries[0]["network"], NET);
    assert_eq!(
        entries[1]["network"],
        "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI="
    );
    assert_eq!(entries[1]["asset"], "10458941");
    assert_eq!(
        entries[1]["extra"]["feePayer"],
        algo_addr(&fee_payer).to_string()
    );
    assert_eq!(entries[2]["asset"], "ALGO");

    // USDC on Algorand, paid by the AVM payer.
    let avm_payer = AvmPayer::connect(
        algo_payer_key.clone(),
        algod.clone(),
        AvmPolicy::usdc(100_000),
    )
    .await
    .unwrap();
    let client = Client::new(rail_x402::rpc::http_builder(
        std::time::Duration::from_secs(10),
    ))
    .unwrap()
    .with_payer(Arc::new(avm_payer));
    let paid = client.get(&url).await.unwrap();
    assert_eq!(paid.status, 200);
    assert_eq!(paid.payment.unwrap().label, "exact-avm");
    assert_eq!(d.asset_balance(&treasury, TESTNET_USDC), Some(10_000));

    // Native ALGO, paid by the exact-algo payer of the same account.
    let algo_payer = ExactAlgoPayer::new(
        algo_payer_key,
        algod,
        Policy::default(),
        store.clone(),
        Arc::new(SystemClock),
    );
    let client = Client::new(rail_x402::rpc::http_builder(
        std::time::Duration::from_secs(10),
    ))
    .unwrap()
    .with_payer(Arc::new(algo_payer.for_client().await.unwrap()));
    let paid = client.get(&url).await.unwrap();
    assert_eq!(paid.status, 200);
    assert_eq!(paid.payment.unwrap().label, "exact-algo");
    assert_eq!(d.balance(&treasury), 1_002_000);

    // USDC on EVM.
    let evm_key = LocalSigner::random();
    mock.mint(token.address, evm_key.address(), U256::from(100_000))
        .unwrap();
    let client = client_for_evm(evm_key, &token);
    let paid = client.get(&url).await.unwrap();
    assert_eq!(paid.status, 200);
    assert_eq!(paid.payment.unwrap().label, "exact-evm");
    assert_eq!(
        mock.balance(token.address, evm_pay_to).unwrap(),
        U256::from(10_000)
    );
}

fn client_for_evm(key: LocalSigner, token: &Token) -> Client {
    Client::new(rail_x402::rpc::http_builder(
        std::time::Duration::from_secs(10),
    ))
    .unwrap()
    .with_payer(Arc::new(X402Payer::new(
        key,
        EvmPolicy::new(NET, token.address, U256::from(100_000)),
    )))
}
