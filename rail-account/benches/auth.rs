//! What request signing costs: signing a request as the client does, and checking it as the
//! facilitator does (time window and Ed25519 strict verification over the canonical text),
//! for an empty body (a GET) and a 1 KiB body (a payment with its offer).
//! Run: `cargo bench -p rail-account --bench auth`.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use rail_account::AccountKey;
use rail_account::auth::{self, Canonical, RequestParts, SignedRequest};
use rail_core::Timestamp;

fn signing(c: &mut Criterion) {
    let key = AccountKey::from_seed(&[7; 32]);
    let public = key.public();
    let account = "0000000000000000000000000000a11c";
    let now = Timestamp(1_800_000_000_000);
    let nonce = "AAAAAAAAAAAAAAAAAAAAAA";
    for (name, body) in [("empty", Vec::new()), ("1KiB", vec![b'x'; 1024])] {
        let canonical = Canonical {
            network: "facilitator.example",
            method: "POST",
            path_and_query: "/v1/payments",
            account,
            timestamp_ms: now.0,
            nonce,
            idempotency_key: Some("op_0123456789abcdef0123456789abcdef"),
            body: &body,
        };
        c.bench_function(&format!("sign/{name}"), |b| {
            b.iter(|| key.sign(black_box(&canonical)));
        });
        let signed = SignedRequest {
            account: account.into(),
            timestamp_ms: now.0,
            nonce: nonce.into(),
            signature: key.sign(&canonical),
        };
        let parts = RequestParts {
            network: "facilitator.example",
            method: "POST",
            path_and_query: "/v1/payments",
            idempotency_key: Some("op_0123456789abcdef0123456789abcdef"),
            body: &body,
        };
        auth::check(&signed, &public, &parts, now, auth::DEFAULT_WINDOW).unwrap();
        c.bench_function(&format!("check/{name}"), |b| {
            b.iter(|| {
                auth::check(
                    black_box(&signed),
                    &public,
                    black_box(&parts),
                    now,
                    auth::DEFAULT_WINDOW,
                )
            });
        });
    }
}

criterion_group!(benches, signing);
criterion_main!(benches);
