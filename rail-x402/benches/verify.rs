//! Offline verification throughput (no RPC): header base64 → strict JSON → EIP-712 digest →
//! secp256k1 recovery → every reference check. What a facilitator does before it touches the
//! chain.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use alloy_primitives::{Address, B256, U256};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use rail_x402::evm::LocalSigner;
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::verify::verify_exact_evm;
use rail_x402::wire::{
    Extra, PaymentPayload, PaymentRequired, PaymentRequirements, ResourceInfo, V2,
};

const NOW: u64 = 1_800_000_000;

fn fixture() -> (String, PaymentRequirements) {
    let token = Address::repeat_byte(0x11);
    let req = PaymentRequirements {
        scheme: "exact".into(),
        network: "eip155:84532".into(),
        amount: 10_000u64.into(),
        asset: token.to_checksum(None),
        pay_to: Address::repeat_byte(0x22).to_checksum(None),
        max_timeout_seconds: 60,
        extra: Some(Extra::eip712("USDC", "2")),
    };
    let pr = PaymentRequired {
        x402_version: V2::default(),
        error: None,
        reason: None,
        resource: Some(ResourceInfo::new("https://api.example.com/premium-data")),
        accepts: vec![req.clone()],
        extensions: None,
    };
    let payer = X402Payer::new(
        LocalSigner::from_hex(&"42".repeat(32)).unwrap(),
        Policy::new("eip155:84532", token, U256::from(10_000)),
    );
    let p = payer.sign(&pr, &req, NOW, B256::repeat_byte(9)).unwrap();
    (p.to_header().unwrap(), req)
}

fn bench(c: &mut Criterion) {
    let (header, req) = fixture();
    let payload = PaymentPayload::from_header(&header).unwrap();
    let mut g = c.benchmark_group("x402_verify");
    g.throughput(Throughput::Elements(1));
    g.bench_function("header_decode_and_full_offline_verify", |b| {
        b.iter(|| {
            let p = PaymentPayload::from_header(std::hint::black_box(&header)).unwrap();
            verify_exact_evm(&p, &req, NOW).unwrap()
        });
    });
    g.bench_function("offline_verify_decoded", |b| {
        b.iter(|| verify_exact_evm(std::hint::black_box(&payload), &req, NOW).unwrap());
    });
    g.bench_function("header_decode_only", |b| {
        b.iter(|| PaymentPayload::from_header(std::hint::black_box(&header)).unwrap());
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
