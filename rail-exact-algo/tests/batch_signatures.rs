//! Strict batch verification (`txn::batch`) accepts exactly what `verify_strict` accepts, member
//! by member, over signatures built to sit on every edge `verify_strict` draws: a small-order
//! component in `R` or in the key, a small-order `R`, a non-canonical `s` or `R`, a wrong
//! message. And the reason the batch is built that way: a plain batch (`ed25519-dalek`'s
//! `verify_batch`) accepts a signature `verify_strict` refuses.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)]

use curve25519_dalek::constants::ED25519_BASEPOINT_POINT as B;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use proptest::prelude::*;
use rail_exact_algo::txn::batch::{Item, verify_strict_batch, verify_strict_one};
use sha2::{Digest, Sha512};

/// The point of order 2, (0, −1).
fn order_two() -> EdwardsPoint {
    let mut y = [0xff; 32];
    y[0] = 0xec;
    y[31] = 0x7f;
    let t = CompressedEdwardsY(y).decompress().unwrap();
    assert!(t.is_small_order() && !t.is_identity_point());
    t
}

/// A point of order 4, (√−1, 0).
fn order_four() -> EdwardsPoint {
    let t = CompressedEdwardsY([0; 32]).decompress().unwrap();
    assert!(t.is_small_order() && !(t + t).is_identity_point());
    t
}

trait Identity {
    fn is_identity_point(&self) -> bool;
}
impl Identity for EdwardsPoint {
    fn is_identity_point(&self) -> bool {
        use curve25519_dalek::traits::IsIdentity;
        self.is_identity()
    }
}

fn scalar(seed: &[u8; 32], tag: &[u8]) -> Scalar {
    Scalar::from_hash(Sha512::new().chain_update(tag).chain_update(seed))
}

/// A signature by secret scalar `a` under the encoded key `key`, with nonce point `r_point`
/// (whose discrete log over B is `r`): s = r + H(R ‖ key ‖ m)·a.
fn sign_raw(a: Scalar, key: [u8; 32], r: Scalar, r_point: EdwardsPoint, m: &[u8]) -> [u8; 64] {
    let r_bytes = r_point.compress().to_bytes();
    let k = Scalar::from_hash(
        Sha512::new()
            .chain_update(r_bytes)
            .chain_update(key)
            .chain_update(m),
    );
    let s = r + k * a;
    let mut sig = [0; 64];
    sig[..32].copy_from_slice(&r_bytes);
    sig[32..].copy_from_slice(s.as_bytes());
    sig
}

/// The edges a member can sit on.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Good,
    WrongMessage,
    TorsionInR,
    TorsionInKey,
    SmallOrderR,
    NonCanonicalS,
    NonCanonicalR,
    SmallOrderKey,
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        4 => Just(Kind::Good),
        1 => Just(Kind::WrongMessage),
        1 => Just(Kind::TorsionInR),
        1 => Just(Kind::TorsionInKey),
        1 => Just(Kind::SmallOrderR),
        1 => Just(Kind::NonCanonicalS),
        1 => Just(Kind::NonCanonicalR),
        1 => Just(Kind::SmallOrderKey),
    ]
}

/// A member of kind `k` from `seed`: (key, message, signature).
fn member(k: Kind, seed: [u8; 32]) -> ([u8; 32], Vec<u8>, [u8; 64]) {
    let m = seed[..8].to_vec();
    let (a, r) = (scalar(&seed, b"a"), scalar(&seed, b"r"));
    let key = (a * B).compress().to_bytes();
    match k {
        Kind::Good => {
            let sk = SigningKey::from_bytes(&seed);
            (
                sk.verifying_key().to_bytes(),
                m.clone(),
                sk.sign(&m).to_bytes(),
            )
        }
        Kind::WrongMessage => {
            let sig = sign_raw(a, key, r, r * B, &m);
            (key, [m, b"!".to_vec()].concat(), sig)
        }
        Kind::TorsionInR => (key, m.clone(), sign_raw(a, key, r, r * B + order_two(), &m)),
        Kind::TorsionInKey => {
            // Accepted by verify_strict exactly when H(R ‖ A ‖ m)·T vanishes (k ≡ 0 mod 4).
            let tk = (a * B + order_four()).compress().to_bytes();
            (tk, m.clone(), sign_raw(a, tk, r, r * B, &m))
        }
        Kind::SmallOrderR => {
            let mut sig = sign_raw(a, key, r, r * B, &m);
            sig[..32].copy_from_slice(order_two().compress().as_bytes());
            (key, m, sig)
        }
        Kind::NonCanonicalS => {
            let mut sig = sign_raw(a, key, r, r * B, &m);
            // s + ℓ: the same scalar, not canonically encoded (still below 2^256 here, since
            // s < ℓ < 2^253).
            let l: [u8; 32] = (-Scalar::ONE).to_bytes();
            let mut carry = 1u16; // ℓ = (ℓ − 1) + 1
            let mut sum = [0u8; 32];
            for i in 0..32 {
                let v = u16::from(sig[32 + i]) + u16::from(l[i]) + carry;
                sum[i] = (v & 0xff) as u8;
                carry = v >> 8;
            }
            sig[32..].copy_from_slice(&sum);
            (key, m, sig)
        }
        Kind::NonCanonicalR => {
            // y + p for the first small y that is on the curve and not of small order.
            let mut sig = sign_raw(a, key, r, r * B, &m);
            let enc = (2u8..19)
                .map(|y| {
                    let mut e = [0xff; 32];
                    e[0] = 0xed_u8.wrapping_add(y);
                    e[31] = 0x7f;
                    e
                })
                .find(|e| CompressedEdwardsY(*e).decompress().is_some())
                .unwrap();
            sig[..32].copy_from_slice(&enc);
            (key, m, sig)
        }
        Kind::SmallOrderKey => {
            let t = order_four().compress().to_bytes();
            (t, m.clone(), sign_raw(a, t, r, r * B, &m))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Every member's verdict in a batch is its verdict alone, whatever the mix.
    #[test]
    fn a_batch_accepts_exactly_what_verify_strict_accepts(
        members in prop::collection::vec((kind(), any::<[u8; 32]>()), 1..12)
    ) {
        let built: Vec<_> = members.iter().map(|(k, s)| member(*k, *s)).collect();
        let items: Vec<Item<'_>> = built
            .iter()
            .map(|(key, m, sig)| Item { key: *key, message: m, signature: *sig })
            .collect();
        let alone: Vec<bool> = items.iter().map(verify_strict_one).collect();
        for (it, (k, _)) in items.iter().zip(&members) {
            let dalek = VerifyingKey::from_bytes(&it.key)
                .is_ok_and(|vk| vk.verify_strict(it.message, &Signature::from_bytes(&it.signature)).is_ok());
            prop_assert_eq!(verify_strict_one(it), dalek);
            if matches!(k, Kind::Good) {
                prop_assert!(dalek, "a good signature must pass");
            }
            if !matches!(k, Kind::Good | Kind::TorsionInKey) {
                prop_assert!(!dalek, "{:?} must fail verify_strict", k);
            }
        }
        prop_assert_eq!(verify_strict_batch(&items), alone);
    }
}

/// A signature whose `R` carries the order-2 point: `verify_strict` refuses it, a plain batch
/// accepts it for about half of all messages (and its signer chooses the message), the strict
/// batch never does.
#[test]
fn a_plain_batch_accepts_a_torsioned_r_that_verify_strict_refuses() {
    let seed = [5u8; 32];
    let (a, r) = (scalar(&seed, b"a"), scalar(&seed, b"r"));
    let key = (a * B).compress().to_bytes();
    let vk = VerifyingKey::from_bytes(&key).unwrap();
    let good_sk = SigningKey::from_bytes(&[6; 32]);
    let mut ground = None;
    for i in 0..64u32 {
        let m = format!("pay 1 ALGO, try {i}").into_bytes();
        let sig = sign_raw(a, key, r, r * B + order_two(), &m);
        assert!(vk.verify_strict(&m, &Signature::from_bytes(&sig)).is_err());
        let good = good_sk.sign(b"an honest payment");
        let plain = ed25519_dalek::verify_batch(
            &[&m, b"an honest payment"],
            &[Signature::from_bytes(&sig), good],
            &[vk, good_sk.verifying_key()],
        );
        if plain.is_ok() {
            ground = Some((m, sig, good));
            break;
        }
    }
    let (m, sig, good) = ground.expect("a plain batch accepts the torsioned R for some message");
    let items = [
        Item {
            key,
            message: &m,
            signature: sig,
        },
        Item {
            key: good_sk.verifying_key().to_bytes(),
            message: b"an honest payment",
            signature: good.to_bytes(),
        },
    ];
    // The strict batch refuses the torsioned one and still accepts the honest one, every time.
    for _ in 0..32 {
        assert_eq!(verify_strict_batch(&items), vec![false, true]);
    }
}

/// Many good signatures pass in one combination; one bad among them fails alone.
#[test]
fn one_bad_signature_never_refuses_the_good_ones() {
    let built: Vec<_> = (0..40u8)
        .map(|i| {
            let k = if i == 17 {
                Kind::WrongMessage
            } else {
                Kind::Good
            };
            member(k, [i; 32])
        })
        .collect();
    let items: Vec<Item<'_>> = built
        .iter()
        .map(|(key, m, sig)| Item {
            key: *key,
            message: m,
            signature: *sig,
        })
        .collect();
    let got = verify_strict_batch(&items);
    for (i, ok) in got.iter().enumerate() {
        assert_eq!(*ok, i != 17, "member {i}");
    }
    assert!(verify_strict_batch(&[]).is_empty());
}
