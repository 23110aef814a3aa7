//! JWS sign and verify of a Stipendex Quote against a bare Ed25519 sign and verify of the same
//! payload bytes, on the same machine (the bound: the envelope may add at most 15 % to
//! verification). Run: `cargo bench -p stipendex --bench envelope`.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use ed25519_dalek::{Signer as _, SigningKey, Verifier as _};
use std::hint::black_box;
use stipendex::envelope::{Party, Profile, Quote, RailOffer, SecretKey, Signed, Tag, jws};
use stipendex::{Asset, Money, Offer, PaymentMode, Timestamp};

fn quote(key: &SecretKey) -> Quote {
    let price = Money::parse(Asset::usd(), "0.05").unwrap();
    let offer = Offer {
        rail: stipendex::rail_core::RailId::new("ledger"),
        id: "ledger-offer-7f3c2a9e".into(),
        amount: price.clone(),
        payee: "00000000000000000000000000000b0b".into(),
        mode: PaymentMode::Capture,
        expires_at: Timestamp(1_800_000_000_000),
        details: serde_json::json!({"account": "00000000000000000000000000000b0b"}),
    };
    Quote {
        stipendex: Tag::current("quote"),
        id: "q_AAAAAAAAAAAAAAAAAAAAAA".into(),
        receiver: Party {
            id: "demo-shop".into(),
            key: key.public(),
        },
        iat: 1_799_999_880,
        exp: 1_800_000_000,
        profile: Profile::Service,
        asset: Asset::usd(),
        amount: Some(price.amount()),
        estimate: None,
        tolerance: None,
        capability: Some(stipendex::envelope::Capability {
            method: "GET".into(),
            name: "/api/search".into(),
        }),
        request: Some(stipendex::envelope::Digest::of(b"request")),
        resource: Some(stipendex::envelope::Resource {
            origin: "https://search.example".into(),
            method: "GET".into(),
            path: "/api/search".into(),
            query: Some("q=rust".into()),
        }),
        description: Some("one web search".into()),
        rails: vec![RailOffer {
            rail: "ledger".into(),
            offer,
        }],
    }
}

fn bench(c: &mut Criterion) {
    let key = SecretKey::from_seed(&[7; 32]);
    let q = quote(&key);
    let signed = Signed::sign(q.clone(), &key).unwrap();
    let compact = signed.jws().to_owned();
    // The bare baseline signs and verifies what the JWS signs: the signing input.
    let input = compact.rsplit_once('.').unwrap().0.as_bytes().to_vec();
    let raw = SigningKey::from_bytes(&[7; 32]);
    let raw_sig = raw.sign(&input);
    let vk = raw.verifying_key();

    let mut g = c.benchmark_group("sign");
    g.bench_function("bare ed25519", |b| b.iter(|| raw.sign(black_box(&input))));
    g.bench_function("jws quote (serialize + sign)", |b| {
        b.iter(|| Signed::sign(black_box(q.clone()), &key).unwrap());
    });
    g.finish();

    let mut g = c.benchmark_group("verify");
    g.bench_function("bare ed25519 (verify_strict)", |b| {
        b.iter(|| vk.verify_strict(black_box(&input), &raw_sig).unwrap());
    });
    g.bench_function("bare ed25519 (verify)", |b| {
        b.iter(|| vk.verify(black_box(&input), &raw_sig).unwrap());
    });
    // Like for like with the full parse: a bare signature over the same JSON, then the same
    // typed parse of that JSON (what any signed-message design must do to use the Quote).
    let payload = serde_json::to_vec(&q).unwrap();
    let payload_sig = raw.sign(&payload);
    g.bench_function("bare ed25519 + serde parse of the quote", |b| {
        b.iter(|| {
            vk.verify_strict(black_box(&payload), &payload_sig).unwrap();
            serde_json::from_slice::<Quote>(black_box(&payload)).unwrap()
        });
    });
    g.bench_function("jws only (parse header + verify)", |b| {
        b.iter(|| jws::verify(black_box(&compact)).unwrap());
    });
    g.bench_function("jws quote (verify + parse + rules)", |b| {
        b.iter(|| Signed::<Quote>::parse(black_box(&compact)).unwrap());
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
