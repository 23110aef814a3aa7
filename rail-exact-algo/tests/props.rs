#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! Property tests for everything that parses what payers send: the msgpack reader, the signed
//! transaction decoder and the `PAYMENT-SIGNATURE` envelope. Nothing may panic, whatever the
//! input, and whatever is accepted is exactly what was signed.

use data_encoding::BASE64;
use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use rail_exact_algo::Address;
use rail_exact_algo::msgpack;
use rail_exact_algo::txn::{PayTxn, SignedPay};
use rail_exact_algo::wire::decode_payment_header;

fn arb_addr() -> impl Strategy<Value = Address> {
    any::<[u8; 32]>()
        .prop_filter("non-zero", |a| a != &[0; 32])
        .prop_map(Address)
}

fn arb_txn() -> impl Strategy<Value = (PayTxn, [u8; 32])> {
    (
        any::<[u8; 32]>(),
        arb_addr(),
        any::<u64>(),
        0u64..1_000_000,
        1u64..u64::MAX / 2,
        0u64..=1000,
        "[a-z0-9.-]{0,20}",
        proptest::collection::vec(any::<u8>(), 0..64),
        proptest::option::of(arb_addr()),
        proptest::option::of(arb_addr()),
    )
        .prop_map(
            |(seed, receiver, amount, fee, fv, window, gen_id, note, close, rekey)| {
                let key = SigningKey::from_bytes(&seed);
                (
                    PayTxn {
                        sender: Address(key.verifying_key().to_bytes()),
                        receiver,
                        amount,
                        fee,
                        first_valid: fv,
                        last_valid: fv + window,
                        genesis_id: gen_id,
                        genesis_hash: [9; 32],
                        note,
                        close_to: close,
                        rekey_to: rekey,
                        group: None,
                        lease: None,
                    },
                    seed,
                )
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn msgpack_never_panics_and_accepts_only_canonical_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(v) = msgpack::decode(&bytes) {
            prop_assert_eq!(msgpack::encode(&v), bytes);
        }
    }

    #[test]
    fn signed_pay_decoder_never_panics_and_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(s) = SignedPay::decode(&bytes) {
            prop_assert_eq!(s.encode(), bytes);
        }
    }

    #[test]
    fn envelope_decoder_never_panics(s in ".{0,300}") {
        let _ = decode_payment_header(&s, "algorand:x");
    }

    #[test]
    fn base64_of_garbage_envelopes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_payment_header(&BASE64.encode(&bytes), "algorand:x");
    }

}

proptest! {
    // Signing and verifying cost ~100 µs a case: fewer cases, still every field combination.
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn signed_payments_round_trip_and_verify((txn, seed) in arb_txn()) {
        let key = SigningKey::from_bytes(&seed);
        let signed = txn.sign(&key, None);
        let bytes = signed.encode();
        let back = SignedPay::decode(&bytes).unwrap();
        prop_assert_eq!(&back, &signed);
        prop_assert!(back.verify_signature().is_ok());
    }

    #[test]
    fn any_single_byte_change_is_refused_or_unsigned((txn, seed) in arb_txn(), at in any::<prop::sample::Index>(), x in 1u8..=255) {
        let key = SigningKey::from_bytes(&seed);
        let mut bytes = txn.sign(&key, None).encode();
        let i = at.index(bytes.len());
        bytes[i] ^= x;
        // Either the decoder refuses the bytes, or what they decode to is not signed.
        if let Ok(s) = SignedPay::decode(&bytes) {
            prop_assert!(s.verify_signature().is_err());
        }
    }
}
