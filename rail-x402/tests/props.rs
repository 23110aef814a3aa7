#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! Property tests for what payers and peers send: no decoder panics on any input, whatever
//! verifies was signed by `from` for exactly these requirements, and changing any single byte
//! of a signed payload makes it fail (to decode or to verify).

mod common;

use alloy_primitives::{B256, U256};
use base64::Engine as _;
use common::*;
use k256::ecdsa::SigningKey;
use proptest::prelude::*;
use rail_x402::eip3009::{EcdsaSignature, TransferWithAuthorization};
use rail_x402::v1::{PaymentPayloadV1, PaymentRequiredV1, SettleResponseV1};
use rail_x402::verify::verify_exact_evm;
use rail_x402::wire::{PaymentPayload, PaymentRequired, PaymentRequirements, SettleResponse};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

fn golden_json() -> Vec<u8> {
    serde_json::to_vec(&golden_payload()).unwrap()
}

/// Every decoder on one input: none may panic.
fn decode_everything(header: &str) {
    let _ = PaymentPayload::from_header(header);
    let _ = PaymentRequired::from_header(header);
    let _ = SettleResponse::from_header(header);
    let _ = PaymentPayloadV1::from_header(header);
    let _ = SettleResponseV1::from_header(header);
    if let Ok(bytes) = B64.decode(header) {
        let _ = serde_json::from_slice::<PaymentRequiredV1>(&bytes);
        let _ = serde_json::from_slice::<PaymentRequirements>(&bytes);
    }
    if let Ok(p) = PaymentPayload::from_header(header) {
        let _ = verify_exact_evm(&p, &p.accepted, GOLDEN_NOW);
        let _ = verify_exact_evm(&p, &golden_requirements(), u64::MAX);
    }
}

/// Decodes and verifies raw JSON bytes as a `PAYMENT-SIGNATURE` against the golden route.
fn accepted(json: &[u8]) -> bool {
    PaymentPayload::from_header(&B64.encode(json))
        .is_ok_and(|p| verify_exact_evm(&p, &golden_requirements(), GOLDEN_NOW).is_ok())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn decoders_never_panic_on_any_string(s in ".{0,512}") {
        decode_everything(&s);
    }

    #[test]
    fn decoders_never_panic_on_any_base64_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
        decode_everything(&B64.encode(&bytes));
    }

    #[test]
    fn decoders_never_panic_on_edited_valid_json(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        // Valid JSON with a few bytes replaced, inserted or deleted: close to valid, so the
        // typed decoders get deep before failing.
        let mut json = golden_json();
        for (at, byte, op) in edits {
            let i = at.index(json.len());
            match op {
                0 => json[i] = byte,
                1 => json.insert(i, byte),
                _ => { json.remove(i); }
            }
        }
        decode_everything(&B64.encode(&json));
    }

    #[test]
    fn any_single_byte_change_of_the_signed_payload_fails(
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let original = golden_json();
        prop_assert!(accepted(&original));
        let i = at.index(original.len());
        prop_assume!(original[i] != byte);
        let mut changed = original;
        changed[i] = byte;
        prop_assert!(
            !accepted(&changed),
            "accepted after changing byte {} to {:?}: {}",
            i,
            byte as char,
            String::from_utf8_lossy(&changed)
        );
    }

    #[test]
    fn any_single_character_change_of_the_header_fails(
        at in any::<prop::sample::Index>(),
        c in proptest::char::any(),
    ) {
        let header = golden_payload().to_header().unwrap();
        let i = at.index(header.len());
        let original = header.as_bytes()[i] as char;
        prop_assume!(original != c);
        let mut changed = header[..i].to_owned();
        changed.push(c);
        changed.push_str(&header[i + 1..]);
        // A change may still decode to the very same payment: a padding `=` replaced by a
        // character whose bits append a whitespace byte (`J` after a group ending in zero
        // bits decodes to a trailing TAB), which JSON ignores. Same signature, same nonce: one
        // payment, served once. Anything else accepted is a different, forged payment.
        let forged = PaymentPayload::from_header(&changed).is_ok_and(|p| {
            p != golden_payload()
                && verify_exact_evm(&p, &golden_requirements(), GOLDEN_NOW).is_ok()
        });
        prop_assert!(!forged, "accepted another payment with {:?} at {}", c, i);
    }
}

fn arb_key() -> impl Strategy<Value = SigningKey> {
    any::<[u8; 32]>().prop_filter_map("valid secp256k1 scalar", |b| {
        SigningKey::from_slice(&b).ok()
    })
}

proptest! {
    // Signing and recovery cost ~1 ms a case in debug builds: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn whatever_a_key_signs_for_the_route_verifies_as_that_key(
        key in arb_key(),
        amount in any::<u128>(),
        nonce in any::<[u8; 32]>(),
        valid_after in 0u64..=GOLDEN_NOW,
        timeout in 1u64..100_000,
        lifetime_pick in any::<u64>(),
    ) {
        // Anything from the 6 s block grace up to the requirements' timeout (+ slack).
        let lifetime = 6 + lifetime_pick % (timeout + rail_x402::verify::VALID_BEFORE_SLACK_SECONDS - 5);
        let payer = address_of(&key);
        let mut req = golden_requirements();
        req.amount = U256::from(amount).into();
        req.max_timeout_seconds = timeout;
        let message = TransferWithAuthorization {
            from: payer,
            to: GOLDEN_TO,
            value: U256::from(amount),
            validAfter: U256::from(valid_after),
            validBefore: U256::from(GOLDEN_NOW + lifetime),
            nonce: B256::from(nonce),
        };
        let signature = sign_digest(&key, &message.signing_hash(&golden_domain()));
        let payload = payload_for(&req, &message, &signature);
        let header = payload.to_header().unwrap();
        let decoded = PaymentPayload::from_header(&header).unwrap();
        let ok = verify_exact_evm(&decoded, &req, GOLDEN_NOW).unwrap();
        prop_assert_eq!(ok.payer, payer);
        prop_assert_eq!(&ok.authorization, &message);

        // The same signature with v as 0/1 verifies the same; with the parity flipped it
        // does not.
        let mut zero_one = signature;
        zero_one[64] -= 27;
        let p01 = payload_for(&req, &message, &zero_one);
        prop_assert_eq!(verify_exact_evm(&p01, &req, GOLDEN_NOW).unwrap().payer, payer);
        let mut flipped = signature;
        flipped[64] ^= 1;
        let pflip = payload_for(&req, &message, &flipped);
        prop_assert!(verify_exact_evm(&pflip, &req, GOLDEN_NOW).is_err());

        // Any single-byte change of this payload's JSON fails too (sampled position).
        let json = serde_json::to_vec(&payload).unwrap();
        let i = (nonce[0] as usize * 257 + nonce[1] as usize) % json.len();
        let mut changed = json.clone();
        changed[i] = if json[i] == b'0' { b'1' } else { b'0' };
        let still_ok = PaymentPayload::from_header(&B64.encode(&changed))
            .is_ok_and(|p| verify_exact_evm(&p, &req, GOLDEN_NOW).is_ok());
        prop_assert!(!still_ok, "byte {} changed: {}", i, String::from_utf8_lossy(&changed));
    }

    #[test]
    fn signature_parsing_never_panics_and_keeps_s_low(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
        if let Ok(sig) = EcdsaSignature::from_bytes(&bytes) {
            let half = U256::from_str_radix(
                "7fffffffffffffffffffffffffffffff5d576e7357a4501ddfe92f46681b20a0",
                16,
            )
            .unwrap();
            prop_assert!(U256::from_be_bytes(sig.s().0) <= half);
            prop_assert_eq!(&sig.to_bytes()[..64], &bytes[..64]);
            let _ = sig.recover(&GOLDEN_DIGEST);
        }
    }
}

/// What the header property allows, pinned: a padding `=` replaced by a base64 character either
/// fails to decode or decodes to the very same payment (the extra byte is JSON whitespace).
#[test]
fn a_padding_character_replaced_is_refused_or_the_same_payment() {
    let header = golden_payload().to_header().unwrap();
    let Some(i) = header.find('=') else {
        return; // no padding in this header: nothing to replace
    };
    let mut same = 0;
    for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/".chars() {
        let mut changed = header[..i].to_owned();
        changed.push(c);
        changed.push_str(&header[i + 1..]);
        if let Ok(p) = PaymentPayload::from_header(&changed) {
            assert_eq!(
                p,
                golden_payload(),
                "{c:?} at {i} decoded to another payment"
            );
            same += 1;
        }
    }
    println!("{same} of 64 replacements decode to the same payment (JSON whitespace)");
}
