#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! x402's `exact` on Algorand end to end on the devnet posing as testnet: USDC (ASA 10458941)
//! through the shared paywall and client, with and without the facilitator's fee payer; every
//! rule of the scheme with a payment an attacker crafted and signed itself; the chain's
//! verdicts (not opted in, frozen, expired); replays and concurrent settlements of one group.

use std::net::SocketAddr;
use std::sync::Arc;

use algod_devnet::{Devnet, DevnetConfig, RunningDevnet, TESTNET_USDC};
use axum::Router;
use axum::routing::get;
use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use rail_core::{KeyStore, MemoryKeyStore};
use rail_exact_algo::AlgodClient;
use rail_exact_algo::address::Address;
use rail_exact_algo::avm::wire::{Envelope, Payload, Requirements, code};
use rail_exact_algo::avm::{
    AvmError, AvmFacilitator, AvmPayer, AvmPolicy, ExactAvm, FeePayer, Spelling,
};
use rail_exact_algo::txn::{AxferTxn, PayTxn, SignedTxn, Transaction, group_id};
use x402_transport::client::Client;
use x402_transport::paywall::Paywall;
use x402_transport::settle::SettleWhen;
use x402_transport::wire::{PaymentRequired, decode_base64_json, encode_base64_json};
use x402_transport::{Accepts, Scheme};

const PRICE: u64 = 10_000; // 0.01 USDC

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

struct World {
    net: RunningDevnet,
    algod: AlgodClient,
    payer: SigningKey,
    merchant: Address,
    fee_payer: SigningKey,
    store: Arc<dyn KeyStore>,
}

/// A devnet posing as testnet; the payer holds 1 USDC and 1 ALGO, the merchant is opted in.
async fn world() -> World {
    let (issuer, payer, merchant, fee_payer) = (key(1), key(2), key(3), key(4));
    let net = Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (addr(&issuer), 10_000_000),
                (addr(&payer), 1_000_000),
                (addr(&merchant), 1_000_000),
                (addr(&fee_payer), 10_000_000),
            ],
            ..DevnetConfig::testnet(addr(&issuer))
        },
        SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let d = &net.devnet;
    d.opt_in(addr(&payer), TESTNET_USDC).unwrap();
    d.fund_asset(addr(&payer), TESTNET_USDC, 1_000_000).unwrap();
    d.opt_in(addr(&merchant), TESTNET_USDC).unwrap();
    let algod = AlgodClient::new(&net.url, None).unwrap();
    World {
        net,
        algod,
        payer,
        merchant: addr(&merchant),
        fee_payer,
        store: Arc::new(MemoryKeyStore::default()),
    }
}

impl World {
    async fn facilitator(&self, with_fee_payer: bool) -> AvmFacilitator {
        AvmFacilitator::connect(
            self.algod.clone(),
            with_fee_payer.then(|| FeePayer::new(self.fee_payer.clone())),
            self.store.clone(),
        )
        .await
        .unwrap()
    }

    fn usdc(&self, a: &Address) -> Option<u64> {
        self.net.devnet.asset_balance(a, TESTNET_USDC)
    }

    async fn payer(&self) -> AvmPayer {
        AvmPayer::connect(
            self.payer.clone(),
            self.algod.clone(),
            AvmPolicy::usdc(100_000),
        )
        .await
        .unwrap()
    }
}

async fn serve(scheme: Arc<dyn Scheme>, when: SettleWhen) -> String {
    let paywall = Paywall::new().settle(when).route(
        "/report",
        "the report",
        Accepts::one(scheme, u128::from(PRICE)).unwrap(),
    );
    let app = paywall.apply(Router::new().route("/report", get(|| async { "the report" })));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/report", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn client(payer: AvmPayer) -> Client {
    // Installs the TLS provider reqwest needs (plain HTTP here).
    rail_exact_algo::algod::http_client(std::time::Duration::from_secs(10)).unwrap();
    Client::new(reqwest::Client::builder().timeout(std::time::Duration::from_secs(10)))
        .unwrap()
        .with_payer(Arc::new(payer))
}

#[tokio::test]
async fn a_usdc_route_is_paid_through_the_fee_payer_group_and_served_once() {
    for when in [SettleWhen::Before, SettleWhen::After] {
        let w = world().await;
        let scheme = ExactAvm::usdc(w.facilitator(true).await, w.merchant);
        let url = serve(Arc::new(scheme), when).await;

        // The 402 offers USDC on testnet, spelled with the whole genesis hash, with a fee payer.
        let http = rail_exact_algo::algod::http_client(std::time::Duration::from_secs(10)).unwrap();
        let unpaid = http.get(&url).send().await.unwrap();
        assert_eq!(unpaid.status(), 402);
        let required: PaymentRequired =
            decode_base64_json(unpaid.headers()["payment-required"].to_str().unwrap()).unwrap();
        let entry = &required.entries()[0];
        assert_eq!(
            entry["network"],
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI="
        );
        assert_eq!(entry["asset"], "10458941");
        assert_eq!(entry["amount"], "10000");
        assert_eq!(entry["extra"]["decimals"], 6);
        assert_eq!(entry["extra"]["feePayer"], addr(&w.fee_payer).to_string());
        assert_eq!(entry["extra"]["genesisId"], "testnet-v1.0");

        let algo_before = w.net.devnet.balance(&addr(&w.payer));
        let paid = client(w.payer().await).get(&url).await.unwrap();
        assert_eq!(paid.status, 200, "{when:?}");
        assert_eq!(paid.body, b"the report");
        let response = paid.response.clone().unwrap();
        assert_eq!(response["success"], true);
        assert_eq!(response["payer"], addr(&w.payer).to_string());
        assert_eq!(w.usdc(&w.merchant), Some(PRICE));
        assert_eq!(w.usdc(&addr(&w.payer)), Some(1_000_000 - PRICE));
        assert_eq!(
            w.net.devnet.balance(&addr(&w.payer)),
            algo_before,
            "fees were sponsored"
        );
        assert_eq!(
            w.net.devnet.balance(&addr(&w.fee_payer)),
            10_000_000 - 2_000
        );

        // The settlement names the payment (the asset transfer), as the spec says.
        let envelope: Envelope =
            serde_json::from_value(paid.payment.clone().unwrap().envelope).unwrap();
        assert_eq!(envelope.payload.payment_index, 1);
        let transfer =
            rail_exact_algo::avm::verify::decode_member(1, &envelope.payload.payment_group[1])
                .unwrap();
        assert_eq!(response["transaction"], transfer.txn().id());

        // The same payment again: served once.
        let header = encode_base64_json(&paid.payment.unwrap().envelope).unwrap();
        let replay = http
            .get(&url)
            .header("PAYMENT-SIGNATURE", &header)
            .send()
            .await
            .unwrap();
        assert_eq!(replay.status(), 402);
        let body: PaymentRequired = replay.json().await.unwrap();
        assert_eq!(body.error.as_deref(), Some(code::ALREADY_SETTLED));
        assert_eq!(w.usdc(&w.merchant), Some(PRICE));
    }
}

#[tokio::test]
async fn without_a_fee_payer_the_payer_sends_a_lone_transfer_and_pays_its_fee() {
    let w = world().await;
    let scheme =
        ExactAvm::usdc(w.facilitator(false).await, w.merchant).with_spelling(Spelling::Caip2);
    assert_eq!(
        scheme.info().network,
        "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe"
    );
    let url = serve(Arc::new(scheme), SettleWhen::Before).await;
    let algo_before = w.net.devnet.balance(&addr(&w.payer));
    let paid = client(w.payer().await).get(&url).await.unwrap();
    assert_eq!(paid.status, 200);
    let envelope: Envelope = serde_json::from_value(paid.payment.unwrap().envelope).unwrap();
    assert_eq!(envelope.payload.payment_group.len(), 1);
    assert_eq!(envelope.payload.payment_index, 0);
    assert_eq!(w.usdc(&w.merchant), Some(PRICE));
    assert_eq!(w.net.devnet.balance(&addr(&w.payer)), algo_before - 1_000);
}

/// What an attacker can shape: a group it builds and signs with its own key (the payer's, or
/// anyone's), around the merchant's requirements.
struct Craft {
    fee: Option<PayTxn>,
    transfer: AxferTxn,
    extra: Vec<Transaction>,
    signer: SigningKey,
}

fn craft(w: &World, with_fee_payer: bool) -> Craft {
    let d = &w.net.devnet;
    let r = d.round();
    let fee = with_fee_payer.then(|| PayTxn {
        sender: addr(&w.fee_payer),
        receiver: addr(&w.fee_payer),
        amount: 0,
        fee: 2_000,
        first_valid: r,
        last_valid: r + 1000,
        genesis_id: d.genesis_id().into(),
        genesis_hash: d.genesis_hash(),
        note: b"x402-fee-payer-t".to_vec(),
        close_to: None,
        rekey_to: None,
        group: None,
        lease: None,
    });
    Craft {
        fee,
        transfer: AxferTxn {
            sender: addr(&w.payer),
            asset: TESTNET_USDC,
            amount: PRICE,
            receiver: w.merchant,
            asset_sender: None,
            close_to: None,
            fee: if with_fee_payer { 0 } else { 1_000 },
            first_valid: r,
            last_valid: r + 1000,
            genesis_id: d.genesis_id().into(),
            genesis_hash: d.genesis_hash(),
            note: b"x402-payment-t".to_vec(),
            rekey_to: None,
            group: None,
            lease: None,
        },
        extra: Vec::new(),
        signer: w.payer.clone(),
    }
}

impl Craft {
    fn payload(self) -> Payload {
        let mut txns: Vec<Transaction> = Vec::new();
        let fee_at = self.fee.as_ref().map(|_| 0);
        if let Some(f) = self.fee {
            txns.push(Transaction::Pay(f));
        }
        let index = txns.len();
        txns.push(Transaction::Axfer(self.transfer));
        txns.extend(self.extra);
        if txns.len() > 1 {
            let gid = group_id(&txns);
            txns = txns.into_iter().map(|t| t.with_group(Some(gid))).collect();
        }
        let payment_group = txns
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if Some(i) == fee_at {
                    BASE64.encode(&t.encode())
                } else {
                    BASE64.encode(&SignedTxn::sign(t, &self.signer, None).encode())
                }
            })
            .collect();
        Payload {
            payment_group,
            payment_index: index,
        }
    }
}

fn envelope(req: &Requirements, payload: Payload) -> Envelope {
    Envelope {
        x402_version: 2,
        payload,
        accepted: req.clone(),
        resource: None,
        extensions: None,
    }
}

#[tokio::test]
async fn every_rule_refuses_a_crafted_group_with_its_code_and_nothing_moves() {
    let w = world().await;
    let f = w.facilitator(true).await;
    let scheme = ExactAvm::usdc(f.clone(), w.merchant);
    let req = scheme.requirements_for(PRICE);
    let refuse = |c: Craft| {
        let env = envelope(&req, c.payload());
        f.check(&env, &req).map(|_| ()).unwrap_err().code
    };
    let stranger = key(9);

    let mut c = craft(&w, true);
    c.transfer.asset = 31_566_704;
    assert_eq!(refuse(c), code::ASSET_ID_MISMATCH, "wrong asset");
    let mut c = craft(&w, true);
    c.transfer.receiver = addr(&stranger);
    assert_eq!(refuse(c), code::RECIPIENT_MISMATCH, "wrong receiver");
    let mut c = craft(&w, true);
    c.transfer.amount = PRICE - 1;
    assert_eq!(refuse(c), code::AMOUNT_INSUFFICIENT, "underpay");
    let mut c = craft(&w, true);
    c.transfer.close_to = Some(addr(&stranger));
    assert_eq!(
        refuse(c),
        code::CLOSE_TO_DETECTED,
        "asset close-to on the transfer"
    );
    let mut c = craft(&w, true);
    c.transfer.rekey_to = Some(addr(&stranger));
    assert_eq!(refuse(c), code::REKEY_DETECTED, "rekey on the transfer");
    let mut c = craft(&w, true);
    c.fee.as_mut().unwrap().close_to = Some(addr(&stranger));
    assert_eq!(
        refuse(c),
        code::FEE_PAYER_HAS_CLOSE,
        "close-to on the fee payer's"
    );
    let mut c = craft(&w, true);
    c.fee.as_mut().unwrap().rekey_to = Some(addr(&stranger));
    assert_eq!(
        refuse(c),
        code::FEE_PAYER_HAS_REKEY,
        "rekey on the fee payer's"
    );
    let mut c = craft(&w, true);
    c.fee.as_mut().unwrap().receiver = addr(&stranger);
    assert_eq!(
        refuse(c),
        code::FEE_PAYER_INVALID_TXN,
        "a fee payment that pays someone"
    );
    let mut c = craft(&w, true);
    c.fee.as_mut().unwrap().amount = 1;
    assert_eq!(
        refuse(c),
        code::FEE_PAYER_HAS_AMOUNT,
        "a fee payment that moves ALGO"
    );
    let mut c = craft(&w, true);
    c.fee.as_mut().unwrap().fee = 16_001;
    assert_eq!(refuse(c), code::FEE_PAYER_INVALID_TXN, "a fee over the cap");
    let mut c = craft(&w, true);
    c.fee.as_mut().unwrap().fee = 10_001;
    assert_eq!(
        refuse(c),
        code::FEE_PAYER_INVALID_TXN,
        "a fee over 5 000 per member (two members)"
    );
    let mut c = craft(&w, true);
    c.transfer.genesis_hash = [7; 32];
    assert_eq!(refuse(c), code::GENESIS_HASH_MISMATCH, "another chain");
    // A group over 16 (the extra members are the payer's own opt-in-shaped transfers).
    let mut c = craft(&w, true);
    for i in 0..15u8 {
        let mut t = c.transfer.clone();
        t.amount = 0;
        t.receiver = addr(&w.payer);
        t.note = vec![i + 1];
        c.extra.push(Transaction::Axfer(t));
    }
    assert_eq!(refuse(c), code::GROUP_TOO_LARGE, "17 members");
    // Signed by someone else than the sender.
    let mut c = craft(&w, true);
    c.signer = stranger.clone();
    assert_eq!(refuse(c), code::INVALID_SIGNATURE, "a forged signature");
    // The payment left unsigned for the facilitator to sign.
    let c = craft(&w, true);
    let mut p = c.payload();
    let t = rail_exact_algo::avm::verify::decode_member(1, &p.payment_group[1]).unwrap();
    p.payment_group[1] = BASE64.encode(&t.txn().encode());
    assert_eq!(
        f.check(&envelope(&req, p), &req).unwrap_err().code,
        code::MISSING_SIGNATURE
    );
    // The fee payer made to pay the merchant.
    let mut c = craft(&w, true);
    c.transfer.sender = addr(&w.fee_payer);
    c.signer = w.fee_payer.clone();
    assert_eq!(
        refuse(c),
        code::FEE_PAYER_INVALID_TXN,
        "a signed fee-payer transfer"
    );
    // A feePayer this facilitator does not hold.
    let mut other = req.clone();
    other.extra.fee_payer = Some(addr(&stranger).to_string());
    let env = envelope(&other, craft(&w, true).payload());
    assert_eq!(
        f.check(&env, &other).unwrap_err().code,
        code::FEE_PAYER_NOT_MANAGED
    );
    // A group id that is not the group's.
    let c = craft(&w, true);
    let mut p = c.payload();
    let mut fee = rail_exact_algo::avm::verify::decode_member(0, &p.payment_group[0])
        .unwrap()
        .txn()
        .clone();
    fee = fee.with_group(Some([1; 32]));
    p.payment_group[0] = BASE64.encode(&fee.encode());
    assert_eq!(
        f.check(&envelope(&req, p), &req).unwrap_err().code,
        code::GROUP_ID_MISMATCH
    );
    // Not base64 of a transaction.
    let mut p = craft(&w, true).payload();
    p.payment_group[1] = "bm90IGEgdHJhbnNhY3Rpb24=".into();
    assert_eq!(
        f.check(&envelope(&req, p), &req).unwrap_err().code,
        code::GROUP_DECODE_FAILED
    );
    assert_eq!(w.usdc(&w.merchant), Some(0));
    assert_eq!(w.net.devnet.balance(&addr(&w.fee_payer)), 10_000_000);
}

#[tokio::test]
async fn the_chain_refuses_what_the_rules_cannot_see_before_anything_is_sent() {
    let w = world().await;
    let f = w.facilitator(true).await;
    let scheme = ExactAvm::usdc(f.clone(), w.merchant);
    let req = scheme.requirements_for(PRICE);
    let check = |c: Craft| f.check(&envelope(&req, c.payload()), &req).unwrap();

    // The merchant's holding frozen: simulate says so, settle refuses for certain.
    w.net
        .devnet
        .set_frozen(&w.merchant, TESTNET_USDC, true)
        .unwrap();
    let p = check(craft(&w, true));
    match f.verify(&p).await {
        Err(AvmError::Refused { code: c, detail }) => {
            assert_eq!(c, code::SIMULATION_FAILED);
            assert!(detail.contains("asset frozen in recipient"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    let e = f.settle(&p, &req.network).await.unwrap_err();
    assert!(
        matches!(
            e,
            AvmError::Refused {
                code: code::TRANSACTION_FAILED,
                ..
            }
        ),
        "{e:?}"
    );
    w.net
        .devnet
        .set_frozen(&w.merchant, TESTNET_USDC, false)
        .unwrap();

    // A receiver that has not opted in.
    let stranger = key(9);
    w.net.devnet.fund(addr(&stranger), 1_000_000);
    let other = ExactAvm::usdc(f.clone(), addr(&stranger)).requirements_for(PRICE);
    let mut c = craft(&w, true);
    c.transfer.receiver = addr(&stranger);
    let p = f.check(&envelope(&other, c.payload()), &other).unwrap();
    match f.verify(&p).await {
        Err(AvmError::Refused { code: c, detail }) => {
            assert_eq!(c, code::SIMULATION_FAILED);
            assert!(detail.contains("missing from"), "{detail}");
        }
        other => panic!("{other:?}"),
    }

    // An expired window.
    let mut c = craft(&w, true);
    let r = w.net.devnet.round();
    c.transfer.last_valid = r + 2;
    c.fee.as_mut().unwrap().last_valid = r + 2;
    let p = check(c);
    w.net.devnet.advance(3);
    assert!(matches!(
        f.verify(&p).await,
        Err(AvmError::Refused {
            code: code::EXPIRED,
            ..
        })
    ));
    assert!(matches!(
        f.settle(&p, &req.network).await,
        Err(AvmError::Refused {
            code: code::EXPIRED,
            ..
        })
    ));
    assert_eq!(w.usdc(&w.merchant), Some(0));
    assert_eq!(w.net.devnet.balance(&addr(&w.fee_payer)), 10_000_000);
}

#[tokio::test]
async fn concurrent_and_repeated_settlements_of_one_group_settle_it_once_across_instances() {
    let w = world().await;
    // Two facilitator instances sharing one store.
    let f1 = w.facilitator(true).await;
    let f2 = w.facilitator(true).await;
    let req = ExactAvm::usdc(f1.clone(), w.merchant).requirements_for(PRICE);
    let p = f1
        .check(&envelope(&req, craft(&w, true).payload()), &req)
        .unwrap();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let f = if i % 2 == 0 { f1.clone() } else { f2.clone() };
        let p = p.clone();
        let network = req.network.clone();
        tasks.push(tokio::spawn(async move { f.settle(&p, &network).await }));
    }
    let mut settled = 0;
    for t in tasks {
        match t.await.unwrap() {
            Ok(s) => {
                assert_eq!(s.txid, p.txid);
                settled += 1;
            }
            Err(AvmError::Unknown(_)) => {} // in flight elsewhere: present the same again
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(settled >= 1);
    // Afterwards every instance answers the one settlement.
    for f in [&f1, &f2] {
        assert_eq!(f.settle(&p, &req.network).await.unwrap().txid, p.txid);
    }
    assert_eq!(w.usdc(&w.merchant), Some(PRICE), "paid once");
    assert_eq!(
        w.net.devnet.balance(&addr(&w.fee_payer)),
        10_000_000 - 2_000
    );
    // Its simulation now says it is on chain (a lost answer is recognised, not paid again).
    assert!(!f2.verify(&p).await.unwrap());
}

/// The facilitator's HTTP routes, attacked: an oversized body, bad JSON, a payment for someone
/// else's requirements, a settle replayed (answered with the first settlement, charged once).
#[tokio::test]
async fn the_facilitator_server_refuses_what_it_must_and_settles_a_replay_once() {
    let w = world().await;
    let f = w.facilitator(true).await;
    let app = rail_exact_algo::avm::server::router(f.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let http = rail_exact_algo::algod::http_client(std::time::Duration::from_secs(10)).unwrap();

    let supported: serde_json::Value = http
        .get(format!("{base}/supported"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let networks: Vec<&str> = supported["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["network"].as_str().unwrap())
        .collect();
    assert_eq!(
        networks,
        [
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=",
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe"
        ]
    );
    assert_eq!(
        supported["kinds"][0]["extra"]["feePayer"],
        addr(&w.fee_payer).to_string()
    );

    let too_big = http
        .post(format!("{base}/settle"))
        .header("content-type", "application/json")
        .body(vec![b' '; 70 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(too_big.status(), 413);
    let garbage = http
        .post(format!("{base}/verify"))
        .header("content-type", "application/json")
        .body("{\"paymentPayload\": 1}")
        .send()
        .await
        .unwrap();
    assert_eq!(garbage.status(), 400);

    let req = ExactAvm::usdc(f.clone(), w.merchant).requirements_for(PRICE);
    let env = envelope(&req, craft(&w, true).payload());
    // Someone else's requirements (another payee): refused, 200, with the code.
    let mut other = req.clone();
    other.pay_to = addr(&key(9)).to_string();
    let body =
        serde_json::json!({"x402Version": 2, "paymentPayload": env, "paymentRequirements": other});
    let r: serde_json::Value = http
        .post(format!("{base}/verify"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["isValid"], false);
    assert_eq!(r["invalidReason"], code::RECIPIENT_MISMATCH);

    let body =
        serde_json::json!({"x402Version": 2, "paymentPayload": env, "paymentRequirements": req});
    let v: serde_json::Value = http
        .post(format!("{base}/verify"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["isValid"], true, "{v}");
    let mut answers = Vec::new();
    for _ in 0..2 {
        let s: serde_json::Value = http
            .post(format!("{base}/settle"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(s["success"], true, "{s}");
        answers.push(s);
    }
    assert_eq!(
        answers[0], answers[1],
        "a replayed settle answers the first settlement"
    );
    assert_eq!(w.usdc(&w.merchant), Some(PRICE), "charged once");
}

/// The payer's own payment of 1 000 µALGO to `to`, beside the transfer that pays the offer:
/// what an attacker adds to a group for the fee payer's pooled fee to cover.
fn extra_payment(c: &Craft, to: Address, n: u8) -> Transaction {
    Transaction::Pay(PayTxn {
        sender: c.transfer.sender,
        receiver: to,
        amount: 1_000,
        fee: 0,
        first_valid: c.transfer.first_valid,
        last_valid: c.transfer.last_valid,
        genesis_id: c.transfer.genesis_id.clone(),
        genesis_hash: c.transfer.genesis_hash,
        note: format!("extra-{n}").into_bytes(),
        close_to: None,
        rekey_to: None,
        group: None,
        lease: None,
    })
}

/// Runs an attacker's group through the facilitator as a paywall would (check, then settle)
/// and answers the refusal's code. If the group is accepted, it is settled and the test fails
/// saying what that cost the fee payer.
async fn refusal_of(w: &World, f: &AvmFacilitator, req: &Requirements, c: Craft) -> &'static str {
    match f.check(&envelope(req, c.payload()), req) {
        Err(v) => v.code,
        Ok(p) => {
            let before = w.net.devnet.balance(&addr(&w.fee_payer));
            let settled = f.settle(&p, &req.network).await;
            let after = w.net.devnet.balance(&addr(&w.fee_payer));
            panic!(
                "accepted a group of {} members (fee payer's fee {} µALGO); settled: {settled:?}; \
                 the fee payer paid {} µALGO",
                p.members.len(),
                p.fee_payer_fee,
                before.saturating_sub(after)
            );
        }
    }
}

/// A group with one of the payer's own payments beside the transfer: the fee payer's pooled
/// fee would pay for it. Refused before anything is signed or sent.
#[tokio::test]
async fn a_group_with_one_extra_payer_transaction_is_refused() {
    let w = world().await;
    let f = w.facilitator(true).await;
    let req = ExactAvm::usdc(f.clone(), w.merchant).requirements_for(PRICE);
    let mut c = craft(&w, true);
    c.extra.push(extra_payment(&c, w.merchant, 1));
    c.fee.as_mut().unwrap().fee = 3_000;
    assert_eq!(
        refusal_of(&w, &f, &req, c).await,
        code::UNEXPECTED_TRANSACTION
    );
    // Without a fee payer too: a payment group is the transfer, nothing else.
    let f = w.facilitator(false).await;
    let req = ExactAvm::usdc(f.clone(), w.merchant).requirements_for(PRICE);
    let mut c = craft(&w, false);
    c.extra.push(extra_payment(&c, w.merchant, 1));
    assert_eq!(
        refusal_of(&w, &f, &req, c).await,
        code::UNEXPECTED_TRANSACTION
    );
    assert_eq!(w.usdc(&w.merchant), Some(0));
    assert_eq!(w.net.devnet.balance(&addr(&w.fee_payer)), 10_000_000);
}

/// The most an attacker can put in one group (16 members): the fee payer's transaction and
/// fifteen of the payer's (the transfer and fourteen more payments), the fee payer's pooled
/// fee (16 000 µALGO, the SDK's cap) paying for all of them. Refused.
#[tokio::test]
async fn a_group_with_fifteen_extra_payer_transactions_is_refused() {
    let w = world().await;
    let f = w.facilitator(true).await;
    let req = ExactAvm::usdc(f.clone(), w.merchant).requirements_for(PRICE);
    let mut c = craft(&w, true);
    for n in 0..14u8 {
        let t = extra_payment(&c, w.merchant, n);
        c.extra.push(t);
    }
    c.fee.as_mut().unwrap().fee = 16_000;
    assert_eq!(
        refusal_of(&w, &f, &req, c).await,
        code::UNEXPECTED_TRANSACTION
    );
    assert_eq!(w.usdc(&w.merchant), Some(0));
    assert_eq!(w.net.devnet.balance(&addr(&w.fee_payer)), 10_000_000);
}

/// A lease on the fee payer's transaction would lock that lease on the fee payer's account
/// for the whole validity window. Refused.
#[tokio::test]
async fn a_fee_transaction_with_a_lease_is_refused() {
    let w = world().await;
    let f = w.facilitator(true).await;
    let req = ExactAvm::usdc(f.clone(), w.merchant).requirements_for(PRICE);
    let mut c = craft(&w, true);
    c.fee.as_mut().unwrap().lease = Some([7; 32]);
    assert_eq!(
        refusal_of(&w, &f, &req, c).await,
        code::FEE_PAYER_INVALID_TXN
    );
    assert_eq!(w.usdc(&w.merchant), Some(0));
    assert_eq!(w.net.devnet.balance(&addr(&w.fee_payer)), 10_000_000);
}

/// The fee payer signs its transaction's note: a payer-chosen kilobyte is refused; the notes
/// the SDKs write (`x402-fee-payer-<ns>`, `x402-fee-payer-<ms>`), none, and one at the bound
/// pass.
#[tokio::test]
async fn a_fee_transaction_with_a_long_note_is_refused() {
    let w = world().await;
    let f = w.facilitator(true).await;
    let req = ExactAvm::usdc(f.clone(), w.merchant).requirements_for(PRICE);
    let mut c = craft(&w, true);
    c.fee.as_mut().unwrap().note = vec![b'x'; 1024];
    assert_eq!(
        refusal_of(&w, &f, &req, c).await,
        code::FEE_PAYER_INVALID_TXN
    );
    let mut c = craft(&w, true);
    c.fee.as_mut().unwrap().note = vec![b'x'; 65];
    assert_eq!(
        refusal_of(&w, &f, &req, c).await,
        code::FEE_PAYER_INVALID_TXN,
        "one byte over the bound"
    );
    for note in [
        b"x402-fee-payer-1786944043683123456".to_vec(),
        b"x402-fee-payer-1786944043683".to_vec(),
        Vec::new(),
        vec![b'x'; 64],
    ] {
        let mut c = craft(&w, true);
        c.fee.as_mut().unwrap().note = note.clone();
        let env = envelope(&req, c.payload());
        assert!(
            f.check(&env, &req).is_ok(),
            "{:?}",
            String::from_utf8_lossy(&note)
        );
    }
    assert_eq!(w.usdc(&w.merchant), Some(0));
    assert_eq!(w.net.devnet.balance(&addr(&w.fee_payer)), 10_000_000);
}
