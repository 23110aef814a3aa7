//! Fixtures shared by the integration tests: the eth-account golden vector and a test signer.

#![allow(
    dead_code,
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

use alloy_primitives::{Address, B256, U256, address, b256, hex};
use k256::ecdsa::SigningKey;
use rail_x402::eip3009::{TokenDomain, TransferWithAuthorization};
use rail_x402::fields::{Bytes32Hex, HexBytes, Uint256Decimal};
use rail_x402::wire::{
    Eip3009Authorization, ExactEvmPayload, Extra, PaymentPayload, PaymentRequirements, V2,
};

// Golden vector 2, computed with eth-account 0.14.0 (PyPI) in a venv:
//
//   python3 -m venv /var/tmp/ethvenv && /var/tmp/ethvenv/bin/pip install eth-account
//   /var/tmp/ethvenv/bin/python - <<'EOF'
//   from eth_account import Account
//   from eth_account.messages import encode_typed_data
//   from eth_utils import keccak
//   key = "0x4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318"
//   types = {"TransferWithAuthorization": [
//     {"name": "from", "type": "address"}, {"name": "to", "type": "address"},
//     {"name": "value", "type": "uint256"}, {"name": "validAfter", "type": "uint256"},
//     {"name": "validBefore", "type": "uint256"}, {"name": "nonce", "type": "bytes32"}]}
//   dom = {"name": "USD Coin", "version": "2", "chainId": 84532,
//          "verifyingContract": "0x5FbDB2315678afecb367f032d93F642f64180aa3"}
//   nonce = keccak(text="stipendex rail-x402 golden vector")
//   msg = {"from": Account.from_key(key).address,
//          "to": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "value": 1000000,
//          "validAfter": 0, "validBefore": 1900000000, "nonce": nonce}
//   sm = encode_typed_data(domain_data=dom, message_types=types, message_data=msg)
//   print(sm.header.hex(), sm.body.hex(), keccak(b"\x19\x01" + sm.header + sm.body).hex())
//   print(bytes(Account.sign_message(sm, key).signature).hex())
//   EOF
//
// (The key is the well-known eth-account documentation key; never fund it.)
pub const GOLDEN_KEY: [u8; 32] =
    hex!("4c0883a69102937d6231471b5dbb6204fe5129617082792ae468d01a3f362318");
pub const GOLDEN_FROM: Address = address!("2c7536E3605D9C16a7a3D7b1898e529396a65c23");
pub const GOLDEN_TO: Address = address!("70997970C51812dc3A010C7d01b50e0d17dc79C8");
pub const GOLDEN_ASSET: Address = address!("5FbDB2315678afecb367f032d93F642f64180aa3");
pub const GOLDEN_NONCE: B256 =
    b256!("58cb86861011ce9f3f1c6eb185947ba9db0f85bdc7cb838685020a307a534d07");
pub const GOLDEN_DOMAIN_SEPARATOR: B256 =
    b256!("dcce7bd2ca5dc3e09e86f7f258d131181d89d89eb506c5e085e32fb8c195cfe4");
pub const GOLDEN_STRUCT_HASH: B256 =
    b256!("45052893be19fa2f02983c46f9af2317be50f61214cba402aff8e73aaa3779d5");
pub const GOLDEN_DIGEST: B256 =
    b256!("599ac996b217f049245d5c29152ea2955c02c03619f25909f51bfe0c5e9327b2");
pub const GOLDEN_SIGNATURE: [u8; 65] = hex!(
    "7cce13ba62d6727686701ba9e2cd53cfaebf5ce4f674e7426115555a16316af86ee6bae69be40737974afdb6e838a21e338872841ed6e77e51a52965542438771c"
);
pub const GOLDEN_VALUE: u64 = 1_000_000;
pub const GOLDEN_VALID_BEFORE: u64 = 1_900_000_000;
/// A verification time inside the golden window.
pub const GOLDEN_NOW: u64 = GOLDEN_VALID_BEFORE - 60;

pub fn golden_domain() -> TokenDomain {
    TokenDomain {
        name: "USD Coin".into(),
        version: "2".into(),
        chain_id: 84_532,
        verifying_contract: GOLDEN_ASSET,
    }
}

pub fn golden_message() -> TransferWithAuthorization {
    TransferWithAuthorization {
        from: GOLDEN_FROM,
        to: GOLDEN_TO,
        value: U256::from(GOLDEN_VALUE),
        validAfter: U256::ZERO,
        validBefore: U256::from(GOLDEN_VALID_BEFORE),
        nonce: GOLDEN_NONCE,
    }
}

/// The route's requirements for the golden vector.
pub fn golden_requirements() -> PaymentRequirements {
    PaymentRequirements {
        scheme: "exact".into(),
        network: "eip155:84532".into(),
        amount: GOLDEN_VALUE.into(),
        asset: GOLDEN_ASSET.to_checksum(None),
        pay_to: GOLDEN_TO.to_checksum(None),
        max_timeout_seconds: 60,
        extra: Some(Extra::eip712("USD Coin", "2")),
    }
}

pub fn payload_for(
    requirements: &PaymentRequirements,
    message: &TransferWithAuthorization,
    signature: &[u8],
) -> PaymentPayload {
    PaymentPayload {
        x402_version: V2::default(),
        resource: None,
        accepted: requirements.clone(),
        payload: ExactEvmPayload {
            signature: HexBytes::from(signature.to_vec()),
            authorization: Eip3009Authorization {
                from: message.from.into(),
                to: message.to.into(),
                value: Uint256Decimal::from(message.value),
                valid_after: Uint256Decimal::from(message.validAfter),
                valid_before: Uint256Decimal::from(message.validBefore),
                nonce: Bytes32Hex::from(message.nonce),
            },
        },
        extensions: None,
    }
}

/// The golden payload, as a payer would send it.
pub fn golden_payload() -> PaymentPayload {
    payload_for(&golden_requirements(), &golden_message(), &GOLDEN_SIGNATURE)
}

/// Signs `digest` with k256 (RFC 6979, low-s), returning `r || s || v` with v = 27/28.
pub fn sign_digest(key: &SigningKey, digest: &B256) -> [u8; 65] {
    let (sig, recid) = key.sign_prehash_recoverable(digest.as_slice()).unwrap();
    let mut out = [0u8; 65];
    out[..64].copy_from_slice(&sig.to_bytes());
    out[64] = 27 + recid.to_byte();
    out
}

pub fn address_of(key: &SigningKey) -> Address {
    Address::from_public_key(key.verifying_key())
}
