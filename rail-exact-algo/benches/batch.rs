//! Strict batch verification against one `verify_strict` at a time, on 64 signatures in flight
//! (64 concurrent payments, each one Ed25519 signature), and what bounds it: the plain batch
//! (`ed25519-dalek`'s `verify_batch`, which is not exact: `txn::batch`'s documentation says
//! why) and the torsion check of each `R` that exactness adds.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::IsIdentity;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use rail_exact_algo::txn::batch::{Item, verify_strict_batch};

const IN_FLIGHT: usize = 64;

fn bench(c: &mut Criterion) {
    let keys: Vec<SigningKey> = (0..IN_FLIGHT)
        .map(|i| SigningKey::from_bytes(&[u8::try_from(i).unwrap() + 1; 32]))
        .collect();
    // A transfer's signing bytes are about 250 bytes long.
    let msgs: Vec<Vec<u8>> = (0..IN_FLIGHT)
        .map(|i| vec![u8::try_from(i).unwrap(); 250])
        .collect();
    let sigs: Vec<Signature> = keys.iter().zip(&msgs).map(|(k, m)| k.sign(m)).collect();
    let vks: Vec<VerifyingKey> = keys.iter().map(SigningKey::verifying_key).collect();
    let items: Vec<Item<'_>> = (0..IN_FLIGHT)
        .map(|i| Item {
            key: vks[i].to_bytes(),
            message: &msgs[i],
            signature: sigs[i].to_bytes(),
        })
        .collect();
    let msg_refs: Vec<&[u8]> = msgs.iter().map(Vec::as_slice).collect();

    let mut g = c.benchmark_group("ed25519_64_in_flight");
    g.throughput(Throughput::Elements(IN_FLIGHT as u64));
    g.bench_function("verify_strict_one_at_a_time", |b| {
        b.iter(|| {
            for i in 0..IN_FLIGHT {
                vks[i].verify_strict(&msgs[i], &sigs[i]).unwrap();
            }
        });
    });
    g.bench_function("strict_batch_exact", |b| {
        b.iter(|| assert!(verify_strict_batch(&items).iter().all(|ok| *ok)));
    });
    g.bench_function("plain_batch_dalek_not_exact", |b| {
        b.iter(|| ed25519_dalek::verify_batch(&msg_refs, &sigs, &vks).unwrap());
    });
    let rs: Vec<EdwardsPoint> = sigs
        .iter()
        .map(|s| CompressedEdwardsY(*s.r_bytes()).decompress().unwrap())
        .collect();
    g.bench_function("torsion_check_of_each_r", |b| {
        b.iter(|| {
            for r in &rs {
                let lr = EdwardsPoint::vartime_double_scalar_mul_basepoint(
                    &-Scalar::ONE,
                    r,
                    &Scalar::ZERO,
                ) + r;
                assert!(lr.is_identity());
            }
        });
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
