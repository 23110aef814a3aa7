//! x402's `exact` on Algorand, offline verification of the common shape — a two-transaction
//! group of the facilitator's unsigned fee payment and the client's signed USDC transfer, so
//! one signature to check — per second on one core: `PAYMENT-SIGNATURE` base64 → JSON
//! envelope → each member's base64 → strict canonical msgpack (decode, re-encode, compare) →
//! Ed25519 `verify_strict` of the transfer → the group id → every rule of the scheme. Beside it,
//! the bound: one bare Ed25519 `verify_strict` of a message of the same length.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use data_encoding::BASE64;
use ed25519_dalek::{Signer, SigningKey};
use rail_exact_algo::Address;
use rail_exact_algo::avm::verify::{self, Expect};
use rail_exact_algo::avm::wire::{Envelope, Extra, Payload, Requirements};
use rail_exact_algo::txn::{AxferTxn, PayTxn, SignedTxn, Transaction, group_id};

fn addr(k: &SigningKey) -> Address {
    Address(k.verifying_key().to_bytes())
}

fn fixture() -> (String, Expect, Vec<u8>) {
    let (payer, fee_payer, merchant) = (
        SigningKey::from_bytes(&[7; 32]),
        SigningKey::from_bytes(&[8; 32]),
        SigningKey::from_bytes(&[9; 32]),
    );
    let gh = [42u8; 32];
    let fee = Transaction::Pay(PayTxn {
        sender: addr(&fee_payer),
        receiver: addr(&fee_payer),
        amount: 0,
        fee: 2000,
        first_valid: 1000,
        last_valid: 2000,
        genesis_id: "testnet-v1.0".into(),
        genesis_hash: gh,
        note: b"x402-fee-payer-1764870000000000000".to_vec(),
        close_to: None,
        rekey_to: None,
        group: None,
        lease: None,
    });
    let transfer = Transaction::Axfer(AxferTxn {
        sender: addr(&payer),
        asset: 10_458_941,
        amount: 10_000,
        receiver: addr(&merchant),
        asset_sender: None,
        close_to: None,
        fee: 0,
        first_valid: 1000,
        last_valid: 2000,
        genesis_id: "testnet-v1.0".into(),
        genesis_hash: gh,
        note: b"x402-payment-1764870000000000000".to_vec(),
        rekey_to: None,
        group: None,
        lease: None,
    });
    let gid = group_id(&[fee.clone(), transfer.clone()]);
    let (fee, transfer) = (fee.with_group(Some(gid)), transfer.with_group(Some(gid)));
    let signed = SignedTxn::sign(transfer.clone(), &payer, None);
    let req = Requirements {
        scheme: "exact".into(),
        network: "algorand:KioqKioqKioqKioqKioqKioqKioqKioqKioqKioqKio=".into(),
        asset: "10458941".into(),
        amount: "10000".into(),
        pay_to: addr(&merchant).to_string(),
        max_timeout_seconds: 300,
        extra: Extra {
            decimals: Some(6),
            fee_payer: Some(addr(&fee_payer).to_string()),
            ..Extra::default()
        },
    };
    let envelope = Envelope {
        x402_version: 2,
        payload: Payload {
            payment_group: vec![
                BASE64.encode(&fee.encode()),
                BASE64.encode(&signed.encode()),
            ],
            payment_index: 1,
        },
        accepted: req,
        resource: None,
        extensions: None,
    };
    let header = x402_transport::wire::encode_base64_json(&envelope).unwrap();
    let expect = Expect {
        genesis_hash: gh,
        genesis_id: "testnet-v1.0".into(),
        asset: 10_458_941,
        amount: 10_000,
        pay_to: addr(&merchant),
        fee_payer: Some(addr(&fee_payer)),
        max_fee: 16_000,
    };
    (header, expect, transfer.signing_bytes())
}

fn bench(c: &mut Criterion) {
    let (header, expect, message) = fixture();
    let mut g = c.benchmark_group("exact-avm");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode_and_verify_group", |b| {
        b.iter(|| {
            let env: Envelope =
                x402_transport::wire::decode_base64_json(std::hint::black_box(&header)).unwrap();
            verify::check(&env.payload, &expect).unwrap()
        });
    });
    let env: Envelope = x402_transport::wire::decode_base64_json(&header).unwrap();
    g.bench_function("parts/envelope_only", |b| {
        b.iter(|| {
            x402_transport::wire::decode_base64_json::<Envelope>(std::hint::black_box(&header))
                .unwrap()
        });
    });
    g.bench_function("parts/members_only", |b| {
        b.iter(|| {
            for (i, m) in env.payload.payment_group.iter().enumerate() {
                verify::decode_member(i, std::hint::black_box(m)).unwrap();
            }
        });
    });
    let members: Vec<Transaction> = env
        .payload
        .payment_group
        .iter()
        .enumerate()
        .map(|(i, m)| verify::decode_member(i, m).unwrap().txn().clone())
        .collect();
    g.bench_function("parts/group_id_only", |b| {
        b.iter(|| group_id(std::hint::black_box(&members)));
    });
    let key = SigningKey::from_bytes(&[7; 32]);
    let sig = key.sign(&message);
    let pk = key.verifying_key().to_bytes();
    g.bench_function("bare_ed25519_verify_strict", |b| {
        b.iter(|| {
            let vk = ed25519_dalek::VerifyingKey::from_bytes(std::hint::black_box(&pk)).unwrap();
            vk.verify_strict(std::hint::black_box(&message), &sig)
                .unwrap();
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
