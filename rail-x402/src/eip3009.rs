//! EIP-3009 `TransferWithAuthorization` under EIP-712, and ECDSA signer recovery.
//!
//! The digest a payer signs is
//! `keccak256(0x19 0x01 ‖ domainSeparator ‖ hashStruct(TransferWithAuthorization))`, with the
//! token's domain `{name, version, chainId, verifyingContract}` (no salt), as USDC's
//! `FiatTokenV2` checks it and as `@x402/evm` signs it. Hashing is `alloy-sol-types`' EIP-712
//! implementation over the [`TransferWithAuthorization`] struct declared with `sol!`.
//!
//! Signatures: 65 bytes `r ‖ s ‖ v` ([`EcdsaSignature::from_bytes`], the `bytes` form a payload
//! carries) or the `(v, r, s)` triple of `transferWithAuthorization`'s EOA overload
//! ([`EcdsaSignature::from_vrs`]); `v` may be 27/28 or 0/1. High-`s` signatures are refused, as
//! USDC's `ECRecover` refuses them on chain (EIP-2), and so are `r`/`s` outside `[1, n)`.

use std::borrow::Cow;

use alloy_primitives::{Address, B256, U256, b256};
use alloy_sol_types::{Eip712Domain, SolStruct, sol};

use crate::wire::Eip3009Authorization;

sol! {
    /// The EIP-3009 message (`TransferWithAuthorization(address from,address to,uint256 value,
    /// uint256 validAfter,uint256 validBefore,bytes32 nonce)`).
    #[derive(Debug, PartialEq, Eq)]
    struct TransferWithAuthorization {
        /// Payer.
        address from;
        /// Recipient.
        address to;
        /// Amount in atomic units.
        uint256 value;
        /// Valid after this Unix time (seconds); on chain strictly (`block.timestamp > validAfter`).
        uint256 validAfter;
        /// Valid before this Unix time (seconds); on chain `block.timestamp < validBefore`.
        uint256 validBefore;
        /// Single-use nonce.
        bytes32 nonce;
    }
}

/// `keccak256("TransferWithAuthorization(address from,address to,uint256 value,uint256
/// validAfter,uint256 validBefore,bytes32 nonce)")`, the `TRANSFER_WITH_AUTHORIZATION_TYPEHASH`
/// constant of USDC's `EIP3009` contract.
pub const TRANSFER_WITH_AUTHORIZATION_TYPEHASH: B256 =
    b256!("7c7c6cdb67a18743f49ec6fa9b35f50d52ed05cbed4cc592e13b44501c1a2267");

/// The order `n` of secp256k1.
const SECP256K1_N: U256 = U256::from_be_bytes([
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe,
    0xba, 0xae, 0xdc, 0xe6, 0xaf, 0x48, 0xa0, 0x3b, 0xbf, 0xd2, 0x5e, 0x8c, 0xd0, 0x36, 0x41, 0x41,
]);

impl From<&Eip3009Authorization> for TransferWithAuthorization {
    fn from(a: &Eip3009Authorization) -> Self {
        Self {
            from: a.from.address(),
            to: a.to.address(),
            value: a.value.value(),
            validAfter: a.valid_after.value(),
            validBefore: a.valid_before.value(),
            nonce: a.nonce.value(),
        }
    }
}

impl TransferWithAuthorization {
    /// `hashStruct(message)`.
    #[must_use]
    pub fn struct_hash(&self) -> B256 {
        self.eip712_hash_struct()
    }

    /// The EIP-712 digest the payer signs under `domain`.
    #[must_use]
    pub fn signing_hash(&self, domain: &TokenDomain) -> B256 {
        self.eip712_signing_hash(&domain.eip712())
    }
}

/// A token's EIP-712 domain: `{name, version, chainId, verifyingContract}`.
///
/// For x402: `name`/`version` from `requirements.extra`, `chainId` from the CAIP-2 network,
/// `verifyingContract` = `requirements.asset`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenDomain {
    /// The token's EIP-712 name (`"USDC"` on Base Sepolia, `"USD Coin"` on Ethereum).
    pub name: String,
    /// The token's EIP-712 version (`"2"` for USDC).
    pub version: String,
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The token contract.
    pub verifying_contract: Address,
}

impl TokenDomain {
    /// The domain as `alloy-sol-types` hashes it.
    #[must_use]
    pub fn eip712(&self) -> Eip712Domain {
        Eip712Domain::new(
            Some(Cow::Owned(self.name.clone())),
            Some(Cow::Owned(self.version.clone())),
            Some(U256::from(self.chain_id)),
            Some(self.verifying_contract),
            None,
        )
    }

    /// The domain separator (`DOMAIN_SEPARATOR()` on the token).
    #[must_use]
    pub fn separator(&self) -> B256 {
        self.eip712().separator()
    }
}

/// Why a signature was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SignatureError {
    /// Not 65 bytes. Smart-wallet signatures (ERC-1271, ERC-6492) are longer and need a chain
    /// to check; they are not supported offline.
    #[error("signature is {0} bytes; only 65-byte ECDSA signatures are verified offline")]
    Length(usize),
    /// `v` is not 0, 1, 27 or 28.
    #[error("invalid signature v value {0}")]
    InvalidV(u8),
    /// `r` or `s` is zero or not below the curve order.
    #[error("signature r or s out of range")]
    OutOfRange,
    /// `s` is in the upper half of the curve order (malleable; refused on chain by USDC).
    #[error("signature s value is high (malleable)")]
    HighS,
    /// No public key recovers from this signature and digest.
    #[error("signature does not recover a public key")]
    Recovery,
    /// Recovery worked, but to another address than the claimed signer.
    #[error("signature recovers {recovered}, not {expected}")]
    SignerMismatch {
        /// Who signed.
        recovered: Address,
        /// Who was claimed.
        expected: Address,
    },
}

/// A 65-byte secp256k1 ECDSA signature, low-`s`, with its recovery parity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EcdsaSignature {
    r: U256,
    s: U256,
    y_parity: bool,
}

impl EcdsaSignature {
    /// Encoded length, `r ‖ s ‖ v`.
    pub const LEN: usize = 65;

    /// Reads `r ‖ s ‖ v` (32 + 32 + 1 bytes), `v` ∈ {27, 28, 0, 1}.
    ///
    /// # Errors
    /// [`SignatureError::Length`], [`SignatureError::InvalidV`], [`SignatureError::OutOfRange`],
    /// [`SignatureError::HighS`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, SignatureError> {
        let Ok(array) = <&[u8; Self::LEN]>::try_from(bytes) else {
            return Err(SignatureError::Length(bytes.len()));
        };
        let (r, rest) = array.split_at(32);
        let (s, v) = rest.split_at(32);
        let v = v
            .first()
            .copied()
            .ok_or(SignatureError::Length(bytes.len()))?;
        Self::from_parts(v, U256::from_be_slice(r), U256::from_be_slice(s))
    }

    /// Builds a signature from the `(v, r, s)` triple, `v` ∈ {27, 28, 0, 1}.
    ///
    /// # Errors
    /// As [`EcdsaSignature::from_bytes`], less the length.
    pub fn from_vrs(v: u8, r: B256, s: B256) -> Result<Self, SignatureError> {
        Self::from_parts(v, U256::from_be_bytes(r.0), U256::from_be_bytes(s.0))
    }

    fn from_parts(v: u8, r: U256, s: U256) -> Result<Self, SignatureError> {
        let y_parity = match v {
            0 | 27 => false,
            1 | 28 => true,
            other => return Err(SignatureError::InvalidV(other)),
        };
        if r.is_zero() || s.is_zero() || r >= SECP256K1_N || s >= SECP256K1_N {
            return Err(SignatureError::OutOfRange);
        }
        if s > SECP256K1_N >> 1 {
            return Err(SignatureError::HighS);
        }
        Ok(Self { r, s, y_parity })
    }

    /// `r`.
    #[must_use]
    pub fn r(&self) -> B256 {
        B256::from(self.r.to_be_bytes::<32>())
    }

    /// `s` (always in the lower half of the curve order).
    #[must_use]
    pub fn s(&self) -> B256 {
        B256::from(self.s.to_be_bytes::<32>())
    }

    /// The recovery parity (`v - 27`).
    #[must_use]
    pub const fn y_parity(&self) -> bool {
        self.y_parity
    }

    /// `v` as 27 or 28, the form USDC's `transferWithAuthorization(…, v, r, s)` accepts.
    #[must_use]
    pub const fn v(&self) -> u8 {
        if self.y_parity { 28 } else { 27 }
    }

    /// `r ‖ s ‖ v` with `v` = 27/28.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        let (r, rest) = out.split_at_mut(32);
        let (s, v) = rest.split_at_mut(32);
        r.copy_from_slice(&self.r.to_be_bytes::<32>());
        s.copy_from_slice(&self.s.to_be_bytes::<32>());
        v.fill(self.v());
        out
    }

    /// The address whose key made this signature over `prehash`.
    ///
    /// # Errors
    /// [`SignatureError::Recovery`].
    pub fn recover(&self, prehash: &B256) -> Result<Address, SignatureError> {
        // libsecp256k1 (the `secp256k1` crate, already built for Lightning): ~4x faster than
        // the pure-Rust k256 recovery on this hardware (docs/performance.md, x402 on EVM).
        use secp256k1::ecdsa::{RecoverableSignature, RecoveryId};
        static SECP: std::sync::OnceLock<secp256k1::Secp256k1<secp256k1::VerifyOnly>> =
            std::sync::OnceLock::new();
        let secp = SECP.get_or_init(secp256k1::Secp256k1::verification_only);
        let mut compact = [0u8; 64];
        let (r, s) = compact.split_at_mut(32);
        r.copy_from_slice(&self.r.to_be_bytes::<32>());
        s.copy_from_slice(&self.s.to_be_bytes::<32>());
        let recid =
            RecoveryId::from_i32(i32::from(self.y_parity)).map_err(|_| SignatureError::Recovery)?;
        let sig = RecoverableSignature::from_compact(&compact, recid)
            .map_err(|_| SignatureError::Recovery)?;
        let msg = secp256k1::Message::from_digest(prehash.0);
        let key = secp
            .recover_ecdsa(&msg, &sig)
            .map_err(|_| SignatureError::Recovery)?;
        let point = key.serialize_uncompressed();
        let hash = alloy_primitives::keccak256(point.get(1..).unwrap_or_default());
        Ok(Address::from_slice(hash.get(12..).unwrap_or_default()))
    }
}

/// Recovers the signer of `message` under `domain` from a 65-byte signature.
///
/// # Errors
/// Any [`SignatureError`] but [`SignatureError::SignerMismatch`].
pub fn recover_signer(
    domain: &TokenDomain,
    message: &TransferWithAuthorization,
    signature: &[u8],
) -> Result<Address, SignatureError> {
    EcdsaSignature::from_bytes(signature)?.recover(&message.signing_hash(domain))
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{address, keccak256};

    // Golden vector 1: the example in coinbase/x402 specs/x402-specification-v2.md §5.2 and
    // specs/transports-v2/http.md (Base Sepolia USDC). The signature is real: eth-account
    // 0.14.0 (PyPI) recovers the example's `from` from it with domain {USDC, 2, 84532,
    // 0x036C…CF7e}, and computed the separator, struct hash and digest below
    // (`encode_typed_data(domain_data=…, message_types=…, message_data=…)`; digest =
    // keccak(b"\x19\x01" + header + body)).
    pub(crate) fn spec_domain() -> TokenDomain {
        TokenDomain {
            name: "USDC".into(),
            version: "2".into(),
            chain_id: 84_532,
            verifying_contract: address!("036CbD53842c5426634e7929541eC2318f3dCF7e"),
        }
    }

    pub(crate) fn spec_message() -> TransferWithAuthorization {
        TransferWithAuthorization {
            from: address!("857b06519E91e3A54538791bDbb0E22373e36b66"),
            to: address!("209693Bc6afc0C5328bA36FaF03C514EF312287C"),
            value: U256::from(10_000u64),
            validAfter: U256::from(1_740_672_089u64),
            validBefore: U256::from(1_740_672_154u64),
            nonce: b256!("f3746613c2d920b5fdabc0856f2aeb2d4f88ee6037b8cc5d04a71a4462f13480"),
        }
    }

    const SPEC_SIGNATURE: [u8; 65] = alloy_primitives::hex!(
        "2d6a7588d6acca505cbf0d9a4a227e0c52c6c34008c8e8986a1283259764173608a2ce6496642e377d6da8dbbf5836e9bd15092f9ecab05ded3d6293af148b571c"
    );

    #[test]
    fn typehash_matches_usdc_constant_and_sol_struct() {
        let type_string = TransferWithAuthorization::eip712_encode_type();
        assert_eq!(
            type_string,
            "TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"
        );
        assert_eq!(
            keccak256(type_string.as_bytes()),
            TRANSFER_WITH_AUTHORIZATION_TYPEHASH
        );
        assert_eq!(
            spec_message().eip712_type_hash(),
            TRANSFER_WITH_AUTHORIZATION_TYPEHASH
        );
    }

    #[test]
    fn ethereum_mainnet_usdc_domain_separator() {
        // USDC on Ethereum (FiatTokenV2_2): DOMAIN_SEPARATOR() =
        // 0x06c37168…e335; eth-account 0.14.0 computes the same value for
        // {"USD Coin", "2", 1, 0xA0b8…eB48}.
        let domain = TokenDomain {
            name: "USD Coin".into(),
            version: "2".into(),
            chain_id: 1,
            verifying_contract: address!("A0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"),
        };
        assert_eq!(
            domain.separator(),
            b256!("06c37168a7db5138defc7866392bb87a741f9b3d104deb5094588ce041cae335")
        );
    }

    #[test]
    fn spec_vector_hashes_and_recovers() {
        let domain = spec_domain();
        let message = spec_message();
        assert_eq!(
            domain.separator(),
            b256!("71f17a3b2ff373b803d70a5a07c046c1a2bc8e89c09ef722fcb047abe94c9818")
        );
        assert_eq!(
            message.struct_hash(),
            b256!("49ad644555c7bdf3ea4fc022a4940ae5589b230b1dde0065c5504fa19bbe39a4")
        );
        assert_eq!(
            message.signing_hash(&domain),
            b256!("f256992871671abcb27ff92885a7afa46218724e5fc0bac35d050115aa1d22e6")
        );
        assert_eq!(
            recover_signer(&domain, &message, &SPEC_SIGNATURE).unwrap(),
            message.from
        );
        // The same signature under the token's other common name recovers someone else.
        let other = TokenDomain {
            name: "USD Coin".into(),
            ..domain
        };
        assert_ne!(
            recover_signer(&other, &message, &SPEC_SIGNATURE).unwrap(),
            message.from
        );
    }

    #[test]
    fn v_forms_and_vrs_agree() {
        let domain = spec_domain();
        let message = spec_message();
        let hash = message.signing_hash(&domain);
        let sig = EcdsaSignature::from_bytes(&SPEC_SIGNATURE).unwrap();
        assert_eq!(sig.v(), 28);
        assert_eq!(sig.to_bytes(), SPEC_SIGNATURE);

        let mut zero_one = SPEC_SIGNATURE;
        zero_one[64] = 1;
        let sig01 = EcdsaSignature::from_bytes(&zero_one).unwrap();
        assert_eq!(sig01, sig);
        assert_eq!(sig01.recover(&hash).unwrap(), message.from);

        let vrs = EcdsaSignature::from_vrs(28, sig.r(), sig.s()).unwrap();
        assert_eq!(vrs, sig);
        assert_eq!(vrs.recover(&hash).unwrap(), message.from);

        // Flipping the parity recovers another key.
        let mut flipped = SPEC_SIGNATURE;
        flipped[64] = 27;
        assert_ne!(
            EcdsaSignature::from_bytes(&flipped)
                .unwrap()
                .recover(&hash)
                .ok(),
            Some(message.from)
        );
    }

    #[test]
    fn malleable_and_malformed_signatures_are_refused() {
        let sig = EcdsaSignature::from_bytes(&SPEC_SIGNATURE).unwrap();
        // (r, n - s, !parity) is the same signature's malleable twin: alloy would recover the
        // same signer from it; USDC refuses it, and so do we.
        let high_s = SECP256K1_N - U256::from_be_bytes(sig.s().0);
        let mut twin = [0u8; 65];
        twin[..32].copy_from_slice(sig.r().as_slice());
        twin[32..64].copy_from_slice(&high_s.to_be_bytes::<32>());
        twin[64] = 27;
        assert_eq!(
            EcdsaSignature::from_bytes(&twin),
            Err(SignatureError::HighS)
        );
        assert_eq!(
            alloy_primitives::Signature::from_raw(&twin)
                .unwrap()
                .recover_address_from_prehash(&spec_message().signing_hash(&spec_domain()))
                .unwrap(),
            spec_message().from,
            "alloy alone normalizes s: the explicit check is what refuses the twin"
        );

        for v in [2u8, 26, 29, 35, 36, 255] {
            let mut bad = SPEC_SIGNATURE;
            bad[64] = v;
            assert_eq!(
                EcdsaSignature::from_bytes(&bad),
                Err(SignatureError::InvalidV(v))
            );
        }
        let mut zero_r = SPEC_SIGNATURE;
        zero_r[..32].fill(0);
        assert_eq!(
            EcdsaSignature::from_bytes(&zero_r),
            Err(SignatureError::OutOfRange)
        );
        let mut big_r = SPEC_SIGNATURE;
        big_r[..32].fill(0xff);
        assert_eq!(
            EcdsaSignature::from_bytes(&big_r),
            Err(SignatureError::OutOfRange)
        );
        assert_eq!(
            EcdsaSignature::from_bytes(&SPEC_SIGNATURE[..64]),
            Err(SignatureError::Length(64))
        );
        assert_eq!(
            EcdsaSignature::from_bytes(&[0u8; 66]),
            Err(SignatureError::Length(66))
        );
    }
}
