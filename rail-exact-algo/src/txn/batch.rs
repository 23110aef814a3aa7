//! Strict Ed25519 verification of many signatures at once, accepting exactly what
//! `verify_strict` accepts, member by member.
//!
//! A batch checks one random linear combination of the members' equations,
//! `Σ zᵢ·(Rᵢ + kᵢ·Aᵢ − sᵢ·B) = O`, with one multi-scalar multiplication instead of one
//! double-scalar multiplication per signature. `verify_strict` is *cofactorless*: it refuses a
//! signature whose `R` (or a key whose `A`) carries a small-order component that the equation
//! does not cancel. In a combination, a member's small-order component is multiplied by its
//! `zᵢ` and vanishes whenever the component's order divides `zᵢ` (for an order-2 component,
//! half the time). So a plain batch — `ed25519-dalek`'s `verify_batch` among them, whose `zᵢ`
//! come from a transcript of the inputs and can be ground by the signer — accepts signatures
//! that `verify_strict`, and algod, refuse (`tests/batch_signatures.rs` shows one).
//!
//! Here only *clean* members join the combination: `s` canonical, `R` and `A` canonically
//! encoded, neither of small order, and both torsion-free (`[ℓ]P = O`). For such members each
//! term is in the prime-order subgroup, the cofactorless and the combined equations agree, and
//! a combination with 128-bit `zᵢ` drawn from the operating system's generator accepts an
//! invalid member with probability 2⁻¹²⁸. Every other member, and every member of a
//! combination that fails, is checked alone with `verify_strict`: one bad signature never
//! refuses a good one.
//!
//! The cost of exactness is the torsion check of each `R` (a key's is remembered). On this
//! project's machine it costs about as much as the batch saves
//! (`docs/decisions/0035-strict-batch-verification.md`; `cargo bench -p rail-exact-algo --bench
//! batch`), so the facilitators verify one signature at a time; this is the exact construction
//! to use where the balance differs.
//!
//! ```
//! use ed25519_dalek::{Signer, SigningKey};
//! use rail_exact_algo::txn::batch::{Item, verify_strict_batch};
//!
//! let key = SigningKey::from_bytes(&[7; 32]);
//! let sig = key.sign(b"pay 1 ALGO").to_bytes();
//! let items = [
//!     Item { key: key.verifying_key().to_bytes(), message: b"pay 1 ALGO", signature: sig },
//!     Item { key: key.verifying_key().to_bytes(), message: b"pay 9 ALGO", signature: sig },
//! ];
//! assert_eq!(verify_strict_batch(&items), vec![true, false]);
//! ```

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use curve25519_dalek::constants::ED25519_BASEPOINT_POINT;
use curve25519_dalek::edwards::{CompressedEdwardsY, EdwardsPoint};
use curve25519_dalek::scalar::Scalar;
use curve25519_dalek::traits::{IsIdentity, VartimeMultiscalarMul};
use ed25519_dalek::{Signature, VerifyingKey};
use sha2::{Digest, Sha512};

/// One signature to check: the signer's public key, the signed message, the signature.
#[derive(Clone, Copy, Debug)]
pub struct Item<'a> {
    /// The signer's Ed25519 public key (its 32-byte encoding, as signed over).
    pub key: [u8; 32],
    /// The signed message.
    pub message: &'a [u8],
    /// The signature: `R` (32 bytes) then `s` (32 bytes).
    pub signature: [u8; 64],
}

/// `verify_strict` of `item` alone.
#[must_use]
pub fn verify_strict_one(item: &Item<'_>) -> bool {
    VerifyingKey::from_bytes(&item.key).is_ok_and(|k| {
        k.verify_strict(item.message, &Signature::from_bytes(&item.signature))
            .is_ok()
    })
}

/// Each item's `verify_strict` verdict, in order, computed in one combination where the items
/// allow it (the module's documentation says when, and why that is exact).
#[must_use]
pub fn verify_strict_batch(items: &[Item<'_>]) -> Vec<bool> {
    let members: Vec<Option<Member>> = items.iter().map(Member::clean).collect();
    let clean = members.iter().flatten().count();
    // One clean member gains nothing from a combination; a failed one says nothing of which
    // member failed: each is then checked alone.
    let together = clean > 1 && combination_holds(members.iter().flatten());
    items
        .iter()
        .zip(&members)
        .map(|(item, m)| match m {
            Some(_) if together => true,
            _ => verify_strict_one(item),
        })
        .collect()
}

/// A clean member, decoded for the combination.
struct Member {
    r: EdwardsPoint,
    a: EdwardsPoint,
    k: Scalar,
    s: Scalar,
}

impl Member {
    /// The member decoded, if it is clean: `s` canonical; `R` and `A` canonical, not of small
    /// order and torsion-free. `None`: it is checked alone.
    fn clean(item: &Item<'_>) -> Option<Member> {
        let (r_bytes, s_bytes) = item.signature.split_at(32);
        let s = Option::<Scalar>::from(Scalar::from_canonical_bytes(s_bytes.try_into().ok()?))?;
        let r = prime_order_point(r_bytes.try_into().ok()?)?;
        let a = clean_key(&item.key)?;
        let k = Scalar::from_hash(
            Sha512::new()
                .chain_update(r_bytes)
                .chain_update(item.key)
                .chain_update(item.message),
        );
        Some(Member { r, a, k, s })
    }
}

/// The point encoded by `bytes`, if the encoding is canonical and the point is in the
/// prime-order subgroup and not the identity.
fn prime_order_point(bytes: &[u8; 32]) -> Option<EdwardsPoint> {
    let p = CompressedEdwardsY(*bytes).decompress()?;
    if p.compress().as_bytes() != bytes || p.is_small_order() {
        return None;
    }
    // [ℓ]P = [ℓ − 1]P + P, in variable time (public data).
    let l_minus_one = -Scalar::ONE;
    let lp = EdwardsPoint::vartime_double_scalar_mul_basepoint(&l_minus_one, &p, &Scalar::ZERO) + p;
    lp.is_identity().then_some(p)
}

/// Keys already found clean, remembered up to this many (then forgotten all at once).
const CLEAN_KEYS: usize = 1 << 16;

/// The key's point, if it is clean (remembered per key: a payer's key recurs).
fn clean_key(key: &[u8; 32]) -> Option<EdwardsPoint> {
    static SEEN: OnceLock<Mutex<HashSet<[u8; 32]>>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    let known = seen.lock().is_ok_and(|s| s.contains(key));
    if known {
        return CompressedEdwardsY(*key).decompress();
    }
    let p = prime_order_point(key)?;
    if let Ok(mut s) = seen.lock() {
        if s.len() >= CLEAN_KEYS {
            s.clear();
        }
        s.insert(*key);
    }
    Some(p)
}

/// Whether `Σ zᵢ·Rᵢ + Σ (zᵢ·kᵢ)·Aᵢ − (Σ zᵢ·sᵢ)·B = O` for fresh random 128-bit `zᵢ`.
fn combination_holds<'a>(members: impl Iterator<Item = &'a Member>) -> bool {
    let (mut scalars, mut points) = (Vec::new(), Vec::new());
    let mut b = Scalar::ZERO;
    for m in members {
        let z = Scalar::from(rand::random::<u128>());
        scalars.push(z);
        points.push(m.r);
        scalars.push(z * m.k);
        points.push(m.a);
        b += z * m.s;
    }
    scalars.push(-b);
    points.push(ED25519_BASEPOINT_POINT);
    EdwardsPoint::vartime_multiscalar_mul(scalars, points).is_identity()
}
