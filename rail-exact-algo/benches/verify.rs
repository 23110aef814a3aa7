//! Offline verification throughput: the whole check a receiver makes before it submits —
//! base64 → JSON envelope → base64 → strict canonical msgpack (decode, re-encode, compare) →
//! Ed25519 `verify_strict` → every rule of `docs/exact-algo.md` §3.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use rail_exact_algo::Address;
use rail_exact_algo::rules::{self, ChainView, Requirement};
use rail_exact_algo::txn::{PayTxn, SignedPay};
use rail_exact_algo::wire::{Envelope, Payload, decode_payment_header, header, network_id};

fn fixture() -> (String, Requirement, String) {
    let key = SigningKey::from_bytes(&[7; 32]);
    let pay_to = Address(SigningKey::from_bytes(&[8; 32]).verifying_key().to_bytes());
    let gh = [42u8; 32];
    let pid = "0123456789abcdef0123456789abcdef".to_owned();
    let t = PayTxn {
        sender: Address(key.verifying_key().to_bytes()),
        receiver: pay_to,
        amount: 1000,
        fee: 1000,
        first_valid: 1000,
        last_valid: 2000,
        genesis_id: "testnet-v1.0".into(),
        genesis_hash: gh,
        note: pid.as_bytes().to_vec(),
        close_to: None,
        rekey_to: None,
        group: None,
        lease: None,
    };
    let s: SignedPay = t.sign(&key, None);
    let net = network_id(&gh);
    let h = header(&Envelope {
        x402_version: 2,
        scheme: "exact".into(),
        network: net.clone(),
        payload: Payload {
            txn: BASE64.encode(&s.encode()),
        },
    })
    .unwrap();
    let req = Requirement {
        pay_to,
        amount: 1000,
        payment_id: pid,
        min_fee: 1000,
        genesis_hash: gh,
    };
    (h, req, net)
}

fn bench(c: &mut Criterion) {
    let (h, req, net) = fixture();
    let chain = ChainView {
        round: 1500,
        auth_addr: None,
    };
    let mut g = c.benchmark_group("exact-algo");
    g.throughput(Throughput::Elements(1));
    g.bench_function("verify_offline_full", |b| {
        b.iter(|| {
            let (_, s) = decode_payment_header(std::hint::black_box(&h), &net).unwrap();
            rules::check(&s, &req, &chain).unwrap();
        });
    });
    g.bench_function("decode_only", |b| {
        b.iter(|| decode_payment_header(std::hint::black_box(&h), &net).unwrap());
    });
    let (_, signed) = decode_payment_header(&h, &net).unwrap();
    g.bench_function("signature_only", |b| {
        b.iter(|| std::hint::black_box(&signed).verify_signature().unwrap());
    });
    let pk = signed.signer().0;
    g.bench_function("key_decompress_only", |b| {
        b.iter(|| ed25519_dalek::VerifyingKey::from_bytes(std::hint::black_box(&pk)).unwrap());
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
