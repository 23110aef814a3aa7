#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]
//! Golden vectors: EIP-712 hashing and signer recovery against digests and a signature
//! computed independently with Python's eth-account, and k256 signing reproducing it.

mod common;

use common::*;
use k256::ecdsa::SigningKey;
use rail_x402::eip3009::{EcdsaSignature, recover_signer};
use rail_x402::verify::verify_exact_evm;
use rail_x402::wire::PaymentPayload;

#[test]
fn golden_hashes_match_eth_account() {
    let domain = golden_domain();
    let message = golden_message();
    assert_eq!(domain.separator(), GOLDEN_DOMAIN_SEPARATOR);
    assert_eq!(message.struct_hash(), GOLDEN_STRUCT_HASH);
    assert_eq!(message.signing_hash(&domain), GOLDEN_DIGEST);
}

#[test]
fn golden_signature_recovers_the_key_address() {
    let key = SigningKey::from_slice(&GOLDEN_KEY).unwrap();
    assert_eq!(address_of(&key), GOLDEN_FROM);
    assert_eq!(
        recover_signer(&golden_domain(), &golden_message(), &GOLDEN_SIGNATURE).unwrap(),
        GOLDEN_FROM
    );
    let sig = EcdsaSignature::from_bytes(&GOLDEN_SIGNATURE).unwrap();
    assert_eq!(sig.v(), 28);
    // v as 0/1 and as the (v, r, s) triple recover the same signer.
    let mut zero_one = GOLDEN_SIGNATURE;
    zero_one[64] -= 27;
    assert_eq!(
        recover_signer(&golden_domain(), &golden_message(), &zero_one).unwrap(),
        GOLDEN_FROM
    );
    let vrs = EcdsaSignature::from_vrs(sig.v(), sig.r(), sig.s()).unwrap();
    assert_eq!(vrs.recover(&GOLDEN_DIGEST).unwrap(), GOLDEN_FROM);
}

#[test]
fn k256_signing_reproduces_the_eth_account_signature_byte_for_byte() {
    // Both sides use RFC 6979 deterministic nonces and low-s: same key, same digest, same bytes.
    let key = SigningKey::from_slice(&GOLDEN_KEY).unwrap();
    assert_eq!(sign_digest(&key, &GOLDEN_DIGEST), GOLDEN_SIGNATURE);
}

#[test]
fn golden_payload_verifies_and_round_trips_through_the_header() {
    let payload = golden_payload();
    let header = payload.to_header().unwrap();
    let decoded = PaymentPayload::from_header(&header).unwrap();
    assert_eq!(decoded, payload);
    let ok = verify_exact_evm(&decoded, &golden_requirements(), GOLDEN_NOW).unwrap();
    assert_eq!(ok.payer, GOLDEN_FROM);
    assert_eq!(ok.signing_hash, GOLDEN_DIGEST);
    assert_eq!(ok.domain, golden_domain());
    let rail_x402::verify::PayerSignature::Eoa(sig) = &ok.signature else {
        panic!("an EOA signature");
    };
    assert_eq!(sig.to_bytes(), GOLDEN_SIGNATURE);
}
