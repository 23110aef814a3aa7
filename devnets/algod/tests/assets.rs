#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! Assets (ASAs), asset transfers, groups with pooled fees and `simulate` on the devnet: what
//! x402's `exact` scheme on Algorand needs from a chain, with go-algorand's messages
//! (`ledger/apply/asset.go`, `ledger/apply/payment.go`).

use std::collections::BTreeMap;

use algod_devnet::{Devnet, DevnetConfig, MIN_BALANCE, TESTNET_GENESIS_HASH, TESTNET_USDC};
use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use rail_exact_algo::address::Address;
use rail_exact_algo::msgpack::{self, Value};
use rail_exact_algo::txn::{AxferTxn, Member, PayTxn, SignedTxn, Transaction, group_id};

fn key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

struct Net {
    devnet: Devnet,
    issuer: SigningKey,
    payer: SigningKey,
    merchant: SigningKey,
    fee_payer: SigningKey,
}

/// Testnet's genesis and USDC; the payer holds 5 USDC, the merchant is opted in, the fee payer
/// holds ALGO only.
fn net() -> Net {
    let (issuer, payer, merchant, fee_payer) = (key(1), key(2), key(3), key(4));
    let mut cfg = DevnetConfig::testnet(addr(&issuer));
    cfg.accounts = vec![
        (addr(&issuer), 10_000_000),
        (addr(&payer), 1_000_000),
        (addr(&merchant), 1_000_000),
        (addr(&fee_payer), 10_000_000),
    ];
    let devnet = Devnet::new(cfg);
    devnet.opt_in(addr(&payer), TESTNET_USDC).unwrap();
    devnet
        .fund_asset(addr(&payer), TESTNET_USDC, 5_000_000)
        .unwrap();
    devnet.opt_in(addr(&merchant), TESTNET_USDC).unwrap();
    Net {
        devnet,
        issuer,
        payer,
        merchant,
        fee_payer,
    }
}

fn axfer(d: &Devnet, from: &SigningKey, to: Address, amount: u64, fee: u64) -> AxferTxn {
    let r = d.round();
    AxferTxn {
        sender: addr(from),
        asset: TESTNET_USDC,
        amount,
        receiver: to,
        asset_sender: None,
        close_to: None,
        fee,
        first_valid: r,
        last_valid: r + 1000,
        genesis_id: d.genesis_id().into(),
        genesis_hash: d.genesis_hash(),
        note: b"x402-payment-1".to_vec(),
        rekey_to: None,
        group: None,
        lease: None,
    }
}

fn fee_pay(d: &Devnet, fee_payer: &SigningKey, fee: u64) -> PayTxn {
    let r = d.round();
    PayTxn {
        sender: addr(fee_payer),
        receiver: addr(fee_payer),
        amount: 0,
        fee,
        first_valid: r,
        last_valid: r + 1000,
        genesis_id: d.genesis_id().into(),
        genesis_hash: d.genesis_hash(),
        note: b"x402-fee-payer-1".to_vec(),
        close_to: None,
        rekey_to: None,
        group: None,
        lease: None,
    }
}

/// Groups `txns` (sets `grp` on each).
fn grouped(txns: Vec<Transaction>) -> Vec<Transaction> {
    let gid = group_id(&txns);
    txns.into_iter().map(|t| t.with_group(Some(gid))).collect()
}

fn body(signed: &[SignedTxn]) -> Vec<u8> {
    signed.iter().flat_map(SignedTxn::encode).collect()
}

fn usdc(d: &Devnet, a: &SigningKey) -> Option<u64> {
    d.asset_balance(&addr(a), TESTNET_USDC)
}

#[test]
fn a_fee_payer_group_moves_usdc_and_the_fee_payer_pays_both_fees() {
    let n = net();
    let d = &n.devnet;
    let g = grouped(vec![
        Transaction::Pay(fee_pay(d, &n.fee_payer, 2000)),
        Transaction::Axfer(axfer(d, &n.payer, addr(&n.merchant), 10_000, 0)),
    ]);
    let signed = [
        SignedTxn::sign(g[0].clone(), &n.fee_payer, None),
        SignedTxn::sign(g[1].clone(), &n.payer, None),
    ];
    let algo_before = d.balance(&addr(&n.payer));
    let txid = d.submit(&body(&signed)).unwrap();
    assert_eq!(txid, g[0].id(), "algod answers the first transaction's id");
    assert_eq!(usdc(d, &n.payer), Some(4_990_000));
    assert_eq!(usdc(d, &n.merchant), Some(10_000));
    assert_eq!(
        d.balance(&addr(&n.payer)),
        algo_before,
        "the payer paid no ALGO"
    );
    assert_eq!(d.balance(&addr(&n.fee_payer)), 10_000_000 - 2000);
    // The same group again is a duplicate.
    let again = d.submit(&body(&signed)).unwrap_err();
    assert!(
        again.message.contains("transaction already in ledger"),
        "{again}"
    );
}

#[test]
fn the_fee_payer_must_cover_the_pooled_fee() {
    let n = net();
    let d = &n.devnet;
    let g = grouped(vec![
        Transaction::Pay(fee_pay(d, &n.fee_payer, 1999)),
        Transaction::Axfer(axfer(d, &n.payer, addr(&n.merchant), 10_000, 0)),
    ]);
    let signed = [
        SignedTxn::sign(g[0].clone(), &n.fee_payer, None),
        SignedTxn::sign(g[1].clone(), &n.payer, None),
    ];
    let e = d.submit(&body(&signed)).unwrap_err();
    assert_eq!(
        e.message,
        "txgroup had 1999 in fees, which is less than the minimum 2 * 1000"
    );
    assert_eq!(usdc(d, &n.merchant), Some(0), "nothing moved");
}

#[test]
fn asset_transfer_refusals_carry_go_algorands_messages_and_move_nothing() {
    let n = net();
    let d = &n.devnet;
    let stranger = key(9);
    d.fund(addr(&stranger), 1_000_000);
    let submit = |t: AxferTxn, k: &SigningKey| {
        let s = SignedTxn::sign(Transaction::Axfer(t), k, None);
        d.submit(&s.encode()).unwrap_err().message
    };
    // A receiver that has not opted in.
    let m = submit(axfer(d, &n.payer, addr(&stranger), 1, 1000), &n.payer);
    assert!(
        m.ends_with(&format!(
            "asset {TESTNET_USDC} missing from {}",
            addr(&stranger)
        )),
        "{m}"
    );
    // More than the payer holds.
    let m = submit(
        axfer(d, &n.payer, addr(&n.merchant), 5_000_001, 1000),
        &n.payer,
    );
    assert!(
        m.ends_with("underflow on subtracting 5000001 from sender amount 5000000"),
        "{m}"
    );
    // An asset that does not exist: a transfer fails taking it from the sender (go-algorand
    // looks the asset up only for an opt-in, a clawback or a close-to; the differential test
    // pins this against its evaluator); an opt-in names the asset.
    let mut t = axfer(d, &n.payer, addr(&n.merchant), 1, 1000);
    t.asset = 7;
    let m = submit(t, &n.payer);
    assert!(
        m.ends_with(&format!("asset 7 missing from {}", addr(&n.payer))),
        "{m}"
    );
    let mut t = axfer(d, &n.payer, addr(&n.payer), 0, 1000);
    t.asset = 7;
    let m = submit(t, &n.payer);
    assert!(
        m.ends_with("asset 7 does not exist or has been deleted"),
        "{m}"
    );
    // A frozen holding, on either side.
    d.set_frozen(&addr(&n.payer), TESTNET_USDC, true).unwrap();
    let m = submit(axfer(d, &n.payer, addr(&n.merchant), 1, 1000), &n.payer);
    assert!(
        m.ends_with(&format!(
            "asset {TESTNET_USDC} frozen in {}",
            addr(&n.payer)
        )),
        "{m}"
    );
    d.set_frozen(&addr(&n.payer), TESTNET_USDC, false).unwrap();
    d.set_frozen(&addr(&n.merchant), TESTNET_USDC, true)
        .unwrap();
    let m = submit(axfer(d, &n.payer, addr(&n.merchant), 1, 1000), &n.payer);
    assert!(m.ends_with("asset frozen in recipient"), "{m}");
    // Clawback by someone who is not the clawback address.
    let mut t = axfer(d, &n.merchant, addr(&n.merchant), 1, 1000);
    t.asset_sender = Some(addr(&n.payer));
    let m = submit(t, &n.merchant);
    assert!(m.contains("clawback not allowed"), "{m}");
    assert_eq!(usdc(d, &n.payer), Some(5_000_000));
    assert_eq!(usdc(d, &n.merchant), Some(0));
}

#[test]
fn opting_in_costs_minimum_balance_and_closing_out_moves_the_rest() {
    let n = net();
    let d = &n.devnet;
    let newcomer = key(10);
    // Exactly one minimum balance and a fee: opting in would need a second one.
    d.fund(addr(&newcomer), MIN_BALANCE + 1000);
    let opt_in = axfer(d, &newcomer, addr(&newcomer), 0, 1000);
    let s = SignedTxn::sign(Transaction::Axfer(opt_in), &newcomer, None);
    let m = d.submit(&s.encode()).unwrap_err().message;
    assert!(
        m.ends_with("balance 100000 below min 200000 (1 assets)"),
        "{m}"
    );
    assert_eq!(usdc(d, &newcomer), None);
    d.fund(addr(&newcomer), MIN_BALANCE);
    d.submit(&s.encode()).unwrap();
    assert_eq!(
        usdc(d, &newcomer),
        Some(0),
        "opted in by a zero self-transfer"
    );

    // Close the payer's holding to the merchant: everything moves, the holding is gone.
    let mut close = axfer(d, &n.payer, addr(&n.merchant), 1_000, 1000);
    close.close_to = Some(addr(&n.merchant));
    let s = SignedTxn::sign(Transaction::Axfer(close), &n.payer, None);
    d.submit(&s.encode()).unwrap();
    assert_eq!(usdc(d, &n.payer), None);
    assert_eq!(usdc(d, &n.merchant), Some(5_000_000));
    // The creator cannot close its own holding.
    let mut close = axfer(d, &n.issuer, addr(&n.merchant), 0, 1000);
    close.close_to = Some(addr(&n.merchant));
    let s = SignedTxn::sign(Transaction::Axfer(close), &n.issuer, None);
    let m = d.submit(&s.encode()).unwrap_err().message;
    assert!(
        m.ends_with("cannot close asset ID in allocating account"),
        "{m}"
    );
    // An account holding an asset cannot close its ALGO.
    let mut p = fee_pay(d, &n.merchant, 1000);
    p.receiver = addr(&n.issuer);
    p.close_to = Some(addr(&n.issuer));
    let s = SignedTxn::sign(Transaction::Pay(p), &n.merchant, None);
    let m = d.submit(&s.encode()).unwrap_err().message;
    assert!(m.ends_with("cannot close: 1 outstanding assets"), "{m}");
}

#[test]
fn simulate_evaluates_without_applying_and_names_the_failing_member() {
    let n = net();
    let d = &n.devnet;
    let g = grouped(vec![
        Transaction::Pay(fee_pay(d, &n.fee_payer, 2000)),
        Transaction::Axfer(axfer(d, &n.payer, addr(&n.merchant), 10_000, 0)),
    ]);
    let paid = Member::Signed(SignedTxn::sign(g[1].clone(), &n.payer, None));
    // The fee payer's transaction unsigned: valid only when empty signatures are allowed.
    let members = [Member::Unsigned(g[0].clone()), paid.clone()];
    let ok = d.simulate(&members, true).unwrap();
    assert_eq!(ok.failure, None);
    assert_eq!(ok.ids, vec![g[0].id(), g[1].id()]);
    let strict = d.simulate(&members, false).unwrap();
    assert_eq!(strict.failure, Some((0, "signedtxn has no sig".into())));
    assert_eq!(usdc(d, &n.merchant), Some(0), "a simulation moves nothing");
    // Signed by the wrong key: the signature is checked even when empty ones are allowed.
    let forged = Member::Signed(SignedTxn::sign(g[1].clone(), &n.merchant, None));
    let bad = d
        .simulate(&[Member::Unsigned(g[0].clone()), forged], true)
        .unwrap();
    assert_eq!(bad.failure.unwrap().0, 1);
    // An underfunded payment fails at its index with the evaluator's message.
    d.set_frozen(&addr(&n.merchant), TESTNET_USDC, true)
        .unwrap();
    let frozen = d.simulate(&members, true).unwrap();
    let (at, message) = frozen.failure.unwrap();
    assert_eq!(at, 1);
    assert!(message.ends_with("asset frozen in recipient"), "{message}");
}

/// The request py-algorand-sdk 2.12.0 sends (`SimulateRequest` with `allow_empty_signatures`
/// and `allow_unnamed_resources`; research `docs/research/x402-avm-2.0.2.md` §5.4), over HTTP,
/// and the asset look-ups.
#[tokio::test]
async fn the_simulate_and_asset_routes_answer_as_algod() {
    let n = net();
    let running = algod_devnet::Devnet::spawn(
        DevnetConfig {
            accounts: vec![
                (addr(&n.issuer), 10_000_000),
                (addr(&n.payer), 1_000_000),
                (addr(&n.merchant), 1_000_000),
                (addr(&n.fee_payer), 10_000_000),
            ],
            ..DevnetConfig::testnet(addr(&n.issuer))
        },
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let d = &running.devnet;
    assert_eq!(d.genesis_hash(), TESTNET_GENESIS_HASH);
    d.opt_in(addr(&n.payer), TESTNET_USDC).unwrap();
    d.fund_asset(addr(&n.payer), TESTNET_USDC, 5_000_000)
        .unwrap();
    d.opt_in(addr(&n.merchant), TESTNET_USDC).unwrap();
    let g = grouped(vec![
        Transaction::Pay(fee_pay(d, &n.fee_payer, 2000)),
        Transaction::Axfer(axfer(d, &n.payer, addr(&n.merchant), 10_000, 0)),
    ]);
    let signed = SignedTxn::sign(g[1].clone(), &n.payer, None);
    let unsigned = Value::Map(BTreeMap::from([(
        "txn".to_owned(),
        msgpack::decode(&g[0].encode()).unwrap(),
    )]));
    let txn_groups = Value::Array(vec![Value::Map(BTreeMap::from([(
        "txns".to_owned(),
        Value::Array(vec![unsigned, msgpack::decode(&signed.encode()).unwrap()]),
    )]))]);
    // Written as algosdk writes it: `exec-trace-config` kept as an empty map, which canonical
    // encoding (ours) would drop.
    let mut bytes = vec![0x84];
    for (k, v) in [
        ("allow-empty-signatures", vec![0xc3]),
        ("allow-unnamed-resources", vec![0xc3]),
        ("exec-trace-config", vec![0x80]),
        ("txn-groups", msgpack::encode(&txn_groups)),
    ] {
        bytes.extend_from_slice(&msgpack::encode(&Value::Str(k.into())));
        bytes.extend_from_slice(&v);
    }
    let http = rail_exact_algo::algod::http_client(std::time::Duration::from_secs(10)).unwrap();
    let r = http
        .post(format!("{}/v2/transactions/simulate", running.url))
        .header("content-type", "application/msgpack")
        .body(bytes)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["txn-groups"][0].get("failure-message"), None, "{v}");
    assert_eq!(
        v["txn-groups"][0]["txn-results"].as_array().unwrap().len(),
        2
    );
    assert_eq!(d.asset_balance(&addr(&n.merchant), TESTNET_USDC), Some(0));

    let asset: serde_json::Value = http
        .get(format!("{}/v2/assets/{TESTNET_USDC}", running.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(asset["params"]["decimals"], 6);
    assert_eq!(asset["params"]["unit-name"], "USDC");
    let holding: serde_json::Value = http
        .get(format!(
            "{}/v2/accounts/{}/assets/{TESTNET_USDC}",
            running.url,
            addr(&n.payer)
        ))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(holding["asset-holding"]["amount"], 5_000_000);
    assert_eq!(holding["asset-holding"]["is-frozen"], false);
    let missing = http
        .get(format!(
            "{}/v2/accounts/{}/assets/{TESTNET_USDC}",
            running.url,
            addr(&key(77))
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let account: serde_json::Value = http
        .get(format!("{}/v2/accounts/{}", running.url, addr(&n.payer)))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(account["min-balance"], 2 * MIN_BALANCE);
    assert_eq!(account["total-assets-opted-in"], 1);
    assert_eq!(
        BASE64.encode(&d.genesis_hash()),
        "SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI="
    );
}
