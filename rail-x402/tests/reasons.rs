#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]
//! One case (at least) per `invalidReason` the offline verifier can return, each built the way
//! a payer or a route would produce it, and checked through the header codec.

mod common;

use alloy_primitives::{U256, address};
use common::*;
use k256::ecdsa::SigningKey;
use rail_x402::eip3009::{SignatureError, TransferWithAuthorization};
use rail_x402::verify::{OfflineVerified, VerifyError, reasons, verify_exact_evm, verify_response};
use rail_x402::wire::{Extra, PaymentPayload, PaymentRequirements};

fn key() -> SigningKey {
    SigningKey::from_slice(&GOLDEN_KEY).unwrap()
}

/// A payload signed by the golden key over `message` (changed by `change`) under the domain
/// the requirements name, accepting `requirements` verbatim.
fn signed(
    requirements: &PaymentRequirements,
    change: impl FnOnce(&mut TransferWithAuthorization),
) -> PaymentPayload {
    let mut message = golden_message();
    change(&mut message);
    let extra = requirements.extra.clone().unwrap_or_default();
    let domain = rail_x402::eip3009::TokenDomain {
        name: extra.name.unwrap_or_default(),
        version: extra.version.unwrap_or_default(),
        chain_id: rail_x402::verify::eip155_chain_id(&requirements.network).unwrap_or(84_532),
        verifying_contract: requirements.asset.parse().unwrap_or(GOLDEN_ASSET),
    };
    let signature = sign_digest(&key(), &message.signing_hash(&domain));
    payload_for(requirements, &message, &signature)
}

/// Verifies after a round trip through the `PAYMENT-SIGNATURE` header.
fn check(
    payload: &PaymentPayload,
    requirements: &PaymentRequirements,
    now: u64,
) -> Result<OfflineVerified, VerifyError> {
    let decoded = PaymentPayload::from_header(&payload.to_header().unwrap()).unwrap();
    assert_eq!(&decoded, payload);
    verify_exact_evm(&decoded, requirements, now)
}

fn reason(payload: &PaymentPayload, requirements: &PaymentRequirements, now: u64) -> String {
    let result = check(payload, requirements, now);
    let response = verify_response(payload, &result);
    assert!(!response.is_valid, "expected a failure");
    assert_eq!(
        response.payer.as_deref(),
        Some(payload.payload.authorization.from.to_string().as_str()),
        "the reference reports the payer on failure too"
    );
    response.invalid_reason.unwrap()
}

#[test]
fn valid_baseline() {
    let req = golden_requirements();
    let payload = signed(&req, |_| {});
    assert_eq!(payload, golden_payload());
    assert_eq!(
        check(&payload, &req, GOLDEN_NOW).unwrap().payer,
        GOLDEN_FROM
    );
}

#[test]
fn invalid_exact_evm_scheme() {
    let req = golden_requirements();
    let mut payload = golden_payload();
    payload.accepted.scheme = "upto".into();
    assert_eq!(reason(&payload, &req, GOLDEN_NOW), reasons::INVALID_SCHEME);

    let mut upto = req;
    upto.scheme = "upto".into();
    assert_eq!(
        reason(&golden_payload(), &upto, GOLDEN_NOW),
        "invalid_exact_evm_scheme"
    );
}

#[test]
fn invalid_exact_evm_missing_eip712_domain() {
    let payload = golden_payload();
    let mut req = golden_requirements();
    req.extra = None;
    assert_eq!(
        reason(&payload, &req, GOLDEN_NOW),
        "invalid_exact_evm_missing_eip712_domain"
    );
    req.extra = Some(Extra {
        version: None,
        ..Extra::eip712("USD Coin", "2")
    });
    assert_eq!(
        reason(&payload, &req, GOLDEN_NOW),
        reasons::MISSING_EIP712_DOMAIN
    );
    req.extra = Some(Extra::eip712("USD Coin", ""));
    assert_eq!(
        reason(&payload, &req, GOLDEN_NOW),
        reasons::MISSING_EIP712_DOMAIN
    );
}

#[test]
fn invalid_payment_requirements() {
    let payload = golden_payload();
    let mut req = golden_requirements();
    req.asset = "USD".into();
    assert_eq!(
        reason(&payload, &req, GOLDEN_NOW),
        "invalid_payment_requirements"
    );
    let mut req = golden_requirements();
    req.pay_to = "merchant".into();
    assert_eq!(
        reason(&payload, &req, GOLDEN_NOW),
        reasons::INVALID_PAYMENT_REQUIREMENTS
    );
}

#[test]
fn invalid_exact_evm_network_mismatch() {
    let req = golden_requirements();
    let mut payload = golden_payload();
    payload.accepted.network = "eip155:8453".into();
    assert_eq!(
        reason(&payload, &req, GOLDEN_NOW),
        "invalid_exact_evm_network_mismatch"
    );
}

#[test]
fn invalid_network() {
    let mut req = golden_requirements();
    req.network = "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1".into();
    let payload = payload_for(&req, &golden_message(), &GOLDEN_SIGNATURE);
    assert_eq!(reason(&payload, &req, GOLDEN_NOW), "invalid_network");
}

#[test]
fn invalid_exact_evm_signature() {
    let req = golden_requirements();
    let expect = |payload: &PaymentPayload, req: &PaymentRequirements| {
        assert_eq!(
            reason(payload, req, GOLDEN_NOW),
            "invalid_exact_evm_signature"
        );
    };

    // A flipped bit in r.
    let mut sig = GOLDEN_SIGNATURE;
    sig[0] ^= 1;
    expect(&payload_for(&req, &golden_message(), &sig), &req);

    // Signed by another key, `from` left as the golden payer.
    let other = SigningKey::from_slice(&[7u8; 32]).unwrap();
    let foreign = sign_digest(&other, &GOLDEN_DIGEST);
    expect(&payload_for(&req, &golden_message(), &foreign), &req);

    // Signed under another domain: token name, version, chain, contract.
    let other_domains: [fn(&mut PaymentRequirements); 4] = [
        |r| r.extra = Some(Extra::eip712("USDC", "2")),
        |r| r.extra = Some(Extra::eip712("USD Coin", "1")),
        |r| r.network = "eip155:8453".into(),
        |r| r.asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into(),
    ];
    for change in other_domains {
        let mut route = req.clone();
        change(&mut route);
        // The payer signed the golden domain; the route (and what it accepted) is another.
        expect(
            &payload_for(&route, &golden_message(), &GOLDEN_SIGNATURE),
            &route,
        );
    }

    // The malleable twin (r, n - s, !v).
    let n = U256::from_str_radix(
        "fffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141",
        16,
    )
    .unwrap();
    let s = U256::from_be_slice(&GOLDEN_SIGNATURE[32..64]);
    let mut twin = GOLDEN_SIGNATURE;
    twin[32..64].copy_from_slice(&(n - s).to_be_bytes::<32>());
    twin[64] = 27;
    let result = check(
        &payload_for(&req, &golden_message(), &twin),
        &req,
        GOLDEN_NOW,
    );
    assert_eq!(
        result.unwrap_err(),
        VerifyError::InvalidSignature(SignatureError::HighS)
    );

    // v outside {0, 1, 27, 28}.
    let mut bad_v = GOLDEN_SIGNATURE;
    bad_v[64] = 29;
    expect(&payload_for(&req, &golden_message(), &bad_v), &req);

    // A smart-wallet (ERC-1271/6492-sized) signature cannot be checked offline.
    let long = [GOLDEN_SIGNATURE.as_slice(), &[0u8; 31]].concat();
    let result = check(
        &payload_for(&req, &golden_message(), &long),
        &req,
        GOLDEN_NOW,
    );
    assert_eq!(
        result.unwrap_err(),
        VerifyError::InvalidSignature(SignatureError::Length(96))
    );

    // Someone else's valid signature presented under the golden payer's name.
    let mut claimed = golden_message();
    claimed.from = address!("0000000000000000000000000000000000000001");
    let digest = claimed.signing_hash(&golden_domain());
    let sig = sign_digest(&key(), &digest);
    let result = check(&payload_for(&req, &claimed, &sig), &req, GOLDEN_NOW);
    assert!(matches!(
        result.unwrap_err(),
        VerifyError::InvalidSignature(SignatureError::SignerMismatch { recovered, .. })
            if recovered == GOLDEN_FROM
    ));
}

#[test]
fn invalid_exact_evm_recipient_mismatch() {
    let req = golden_requirements();
    let payload = signed(&req, |m| {
        m.to = address!("3C44CdDdB6a900fa2b585dd299e03d12FA4293BC");
    });
    assert_eq!(
        reason(&payload, &req, GOLDEN_NOW),
        "invalid_exact_evm_recipient_mismatch"
    );

    // payTo written in another case is the same recipient.
    let mut lower = golden_requirements();
    lower.pay_to = lower.pay_to.to_ascii_lowercase();
    let payload = payload_for(&lower, &golden_message(), &GOLDEN_SIGNATURE);
    assert!(check(&payload, &lower, GOLDEN_NOW).is_ok());
}

#[test]
fn invalid_exact_evm_payload_authorization_valid_before() {
    let req = golden_requirements();
    let payload = golden_payload();
    // Within the 6-second block-time grace counts as expired.
    for now in [
        GOLDEN_VALID_BEFORE - 5,
        GOLDEN_VALID_BEFORE,
        GOLDEN_VALID_BEFORE + 60,
    ] {
        assert_eq!(
            reason(&payload, &req, now),
            "invalid_exact_evm_payload_authorization_valid_before"
        );
    }
    assert!(check(&payload, &req, GOLDEN_VALID_BEFORE - 6).is_ok());
}

#[test]
fn invalid_exact_evm_payload_authorization_valid_after() {
    let req = golden_requirements();
    let payload = signed(&req, |m| m.validAfter = U256::from(GOLDEN_NOW + 1));
    assert_eq!(
        reason(&payload, &req, GOLDEN_NOW),
        "invalid_exact_evm_payload_authorization_valid_after"
    );
    assert!(check(&payload, &req, GOLDEN_NOW + 1).is_ok());
}

#[test]
fn invalid_exact_evm_payload_authorization_value_mismatch() {
    let req = golden_requirements();
    for value in [GOLDEN_VALUE - 1, GOLDEN_VALUE + 1, 0] {
        let payload = signed(&req, |m| m.value = U256::from(value));
        assert_eq!(
            reason(&payload, &req, GOLDEN_NOW),
            "invalid_exact_evm_payload_authorization_value_mismatch",
            "value {value}: exact means neither less nor more"
        );
    }
}

#[test]
fn invalid_exact_evm_accepted_mismatch() {
    let req = golden_requirements();
    type Change = fn(&mut PaymentRequirements);
    let cases: [(&str, Change); 5] = [
        ("asset", |a| a.asset = a.asset.to_ascii_lowercase()),
        ("asset", |a| {
            a.asset = "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into();
        }),
        ("maxTimeoutSeconds", |a| a.max_timeout_seconds = 3600),
        ("extra", |a| a.extra = None),
        ("payTo", |a| a.pay_to = a.pay_to.to_ascii_lowercase()),
    ];
    for (field, change) in cases {
        let mut payload = golden_payload();
        change(&mut payload.accepted);
        let result = check(&payload, &req, GOLDEN_NOW);
        assert_eq!(result, Err(VerifyError::AcceptedMismatch(field)), "{field}");
        assert_eq!(
            reason(&payload, &req, GOLDEN_NOW),
            "invalid_exact_evm_accepted_mismatch"
        );
    }
    // Adding members to accepted.extra is allowed, as in the reference.
    let mut payload = golden_payload();
    payload
        .accepted
        .extra
        .as_mut()
        .unwrap()
        .other
        .insert("assetTransferMethod".into(), "eip3009".into());
    assert!(check(&payload, &req, GOLDEN_NOW).is_ok());
}

#[test]
fn decode_level_reasons() {
    let header = golden_payload().to_header().unwrap();
    let garbage = PaymentPayload::from_header("not base64!").unwrap_err();
    assert_eq!(garbage.reason(), "invalid_payload");

    use base64::Engine as _;
    let engine = base64::engine::general_purpose::STANDARD;
    let json = String::from_utf8(engine.decode(&header).unwrap()).unwrap();
    let v1 = json.replacen("\"x402Version\":2", "\"x402Version\":1", 1);
    let err = PaymentPayload::from_header(&engine.encode(v1)).unwrap_err();
    assert_eq!(err.reason(), "invalid_x402_version");
}

#[test]
fn every_reason_string_is_the_reference_spelling() {
    // @x402/evm 2.27.0 exact/facilitator/errors.ts, and spec §9 for the generic codes.
    let expected = [
        (reasons::INVALID_SCHEME, "invalid_exact_evm_scheme"),
        (
            reasons::NETWORK_MISMATCH,
            "invalid_exact_evm_network_mismatch",
        ),
        (
            reasons::MISSING_EIP712_DOMAIN,
            "invalid_exact_evm_missing_eip712_domain",
        ),
        (
            reasons::RECIPIENT_MISMATCH,
            "invalid_exact_evm_recipient_mismatch",
        ),
        (reasons::INVALID_SIGNATURE, "invalid_exact_evm_signature"),
        (
            reasons::VALID_BEFORE_EXPIRED,
            "invalid_exact_evm_payload_authorization_valid_before",
        ),
        (
            reasons::VALID_AFTER_IN_FUTURE,
            "invalid_exact_evm_payload_authorization_valid_after",
        ),
        (
            reasons::AUTHORIZATION_VALUE_MISMATCH,
            "invalid_exact_evm_payload_authorization_value_mismatch",
        ),
        (
            reasons::INSUFFICIENT_BALANCE,
            "invalid_exact_evm_insufficient_balance",
        ),
        (
            reasons::NONCE_ALREADY_USED,
            "invalid_exact_evm_nonce_already_used",
        ),
        (
            reasons::SIMULATION_FAILED,
            "invalid_exact_evm_transaction_simulation_failed",
        ),
        (
            reasons::INVALID_PAYMENT_REQUIREMENTS,
            "invalid_payment_requirements",
        ),
        (reasons::INVALID_NETWORK, "invalid_network"),
    ];
    for (ours, reference) in expected {
        assert_eq!(ours, reference);
    }
}
