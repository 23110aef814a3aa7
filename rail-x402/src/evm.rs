//! EVM building blocks the rail needs and nothing more: the FiatToken (USDC) calls it makes,
//! a local secp256k1 signer, and EIP-1559 transactions signed with it.
//!
//! Transactions are encoded by hand (RLP with `alloy-rlp`, [EIP-1559]: `0x02 ‖
//! rlp([chainId, nonce, maxPriorityFeePerGas, maxFeePerGas, gasLimit, to, value, data,
//! accessList, yParity, r, s])`) rather than through alloy's consensus and provider crates: the
//! settler sends one kind of transaction, and the encoding is checked by a node accepting it
//! (the anvil tests) and by a golden vector signed with `eth-account` (tests below).
//!
//! [EIP-1559]: https://eips.ethereum.org/EIPS/eip-1559

use std::fmt;

use alloy_primitives::{Address, B256, Bytes, U256, keccak256};
use alloy_rlp::{Encodable, Header};
use alloy_sol_types::sol;
use k256::ecdsa::SigningKey;

use crate::eip3009::{EcdsaSignature, SignatureError, TransferWithAuthorization};

sol! {
    /// The calls the rail makes on a FiatToken (USDC `FiatTokenV2_2`) contract, as its ABI
    /// declares them (`centre-tokens` / `stablecoin-evm`, `contracts/v2/EIP3009.sol`,
    /// `FiatTokenV1.sol`).
    #[allow(missing_docs)]
    interface IFiatToken {
        function name() external view returns (string);
        function version() external view returns (string);
        function balanceOf(address account) external view returns (uint256);
        function authorizationState(address authorizer, bytes32 nonce) external view returns (bool);
        function transferWithAuthorization(
            address from,
            address to,
            uint256 value,
            uint256 validAfter,
            uint256 validBefore,
            bytes32 nonce,
            uint8 v,
            bytes32 r,
            bytes32 s
        ) external;
        function mint(address to, uint256 amount) external returns (bool);
        event Transfer(address indexed from, address indexed to, uint256 value);
        event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce);
        event AuthorizationCanceled(address indexed authorizer, bytes32 indexed nonce);
    }
}

sol! {
    /// FiatTokenV2_2's overload for any signer, contract wallets included (it checks with
    /// `SignatureChecker`: ECDSA for an EOA, ERC-1271 `isValidSignature` for a contract).
    #[allow(missing_docs)]
    interface IFiatTokenBytes {
        function transferWithAuthorization(
            address from,
            address to,
            uint256 value,
            uint256 validAfter,
            uint256 validBefore,
            bytes32 nonce,
            bytes signature
        ) external;
    }

    /// ERC-1271.
    #[allow(missing_docs)]
    interface IERC1271 {
        function isValidSignature(bytes32 hash, bytes signature) external view returns (bytes4);
    }
}

/// ERC-1271's "valid" answer, `bytes4(keccak256("isValidSignature(bytes32,bytes)"))`.
pub const ERC1271_MAGIC: [u8; 4] = [0x16, 0x26, 0xba, 0x7e];

/// `transferWithAuthorization` calldata for a signed authorization: the `(v, r, s)` overload
/// for an EOA (as `@x402/evm` settles 65-byte signatures), the `bytes` overload for a contract
/// wallet.
#[must_use]
pub fn transfer_with_authorization_calldata(
    auth: &TransferWithAuthorization,
    sig: &crate::verify::PayerSignature,
) -> Bytes {
    use alloy_sol_types::SolCall;
    let sig = match sig {
        crate::verify::PayerSignature::Eoa(sig) => sig,
        crate::verify::PayerSignature::Contract(bytes) => {
            return IFiatTokenBytes::transferWithAuthorizationCall {
                from: auth.from,
                to: auth.to,
                value: auth.value,
                validAfter: auth.validAfter,
                validBefore: auth.validBefore,
                nonce: auth.nonce,
                signature: bytes.clone().into(),
            }
            .abi_encode()
            .into();
        }
    };
    IFiatToken::transferWithAuthorizationCall {
        from: auth.from,
        to: auth.to,
        value: auth.value,
        validAfter: auth.validAfter,
        validBefore: auth.validBefore,
        nonce: auth.nonce,
        v: sig.v(),
        r: sig.r(),
        s: sig.s(),
    }
    .abi_encode()
    .into()
}

/// A secp256k1 key held in memory. `Debug` prints the address only, never the key.
#[derive(Clone)]
pub struct LocalSigner {
    key: SigningKey,
    address: Address,
}

impl fmt::Debug for LocalSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalSigner")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

/// Why a key could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// Not 32 bytes of hex (with or without `0x`). The text is never echoed.
    #[error("private key is not 32 bytes of hex")]
    Format,
    /// Zero, or not below the curve order.
    #[error("private key is not a valid secp256k1 scalar")]
    Scalar,
}

impl LocalSigner {
    /// A signer from a hex private key (`0x` optional).
    ///
    /// # Errors
    /// [`KeyError`]; the key text is never part of the error.
    pub fn from_hex(hex_key: &str) -> Result<Self, KeyError> {
        let body = hex_key.trim().trim_start_matches("0x");
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(body, &mut bytes).map_err(|_| KeyError::Format)?;
        let key = SigningKey::from_slice(&bytes).map_err(|_| KeyError::Scalar)?;
        bytes.fill(0);
        Ok(Self::from_key(key))
    }

    /// A fresh random key.
    #[must_use]
    pub fn random() -> Self {
        loop {
            if let Ok(key) = SigningKey::from_slice(&rand::random::<[u8; 32]>()) {
                return Self::from_key(key);
            }
        }
    }

    fn from_key(key: SigningKey) -> Self {
        let point = key.verifying_key().to_encoded_point(false);
        let raw = point.as_bytes().get(1..).unwrap_or_default();
        let address = Address::from_slice(keccak256(raw).get(12..).unwrap_or_default());
        Self { key, address }
    }

    /// The account's address.
    #[must_use]
    pub const fn address(&self) -> Address {
        self.address
    }

    /// Signs a 32-byte digest: a low-`s` signature (EIP-2), `v` 27/28.
    ///
    /// # Errors
    /// [`SignatureError::Recovery`] if the signing library fails (it does not for valid keys).
    pub fn sign_hash(&self, hash: &B256) -> Result<EcdsaSignature, SignatureError> {
        let (sig, recid) = self
            .key
            .sign_prehash_recoverable(hash.as_slice())
            .map_err(|_| SignatureError::Recovery)?;
        let (sig, parity) = match sig.normalize_s() {
            Some(low) => (low, !recid.is_y_odd()),
            None => (sig, recid.is_y_odd()),
        };
        let (r, s) = sig.split_bytes();
        EcdsaSignature::from_vrs(
            27 + u8::from(parity),
            B256::from_slice(&r),
            B256::from_slice(&s),
        )
    }
}

/// An unsigned EIP-1559 (type 2) transaction with an empty access list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eip1559Tx {
    /// Chain id (replay protection across chains).
    pub chain_id: u64,
    /// The sender's account nonce.
    pub nonce: u64,
    /// Tip per gas, wei.
    pub max_priority_fee_per_gas: u128,
    /// Fee cap per gas, wei.
    pub max_fee_per_gas: u128,
    /// Gas limit.
    pub gas_limit: u64,
    /// Callee.
    pub to: Address,
    /// Wei sent along.
    pub value: U256,
    /// Calldata.
    pub input: Bytes,
}

/// A signed transaction: the raw bytes for `eth_sendRawTransaction` and its hash.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedTx {
    /// `0x02 ‖ rlp(...)`.
    pub raw: Bytes,
    /// `keccak256(raw)`, the transaction hash.
    pub hash: B256,
}

impl Eip1559Tx {
    const TYPE: u8 = 2;

    fn fields_len(&self) -> usize {
        self.chain_id.length()
            + self.nonce.length()
            + self.max_priority_fee_per_gas.length()
            + self.max_fee_per_gas.length()
            + self.gas_limit.length()
            + self.to.length()
            + self.value.length()
            + self.input.length()
            + 1 // empty access list: 0xc0
    }

    fn encode_fields(&self, out: &mut Vec<u8>) {
        self.chain_id.encode(out);
        self.nonce.encode(out);
        self.max_priority_fee_per_gas.encode(out);
        self.max_fee_per_gas.encode(out);
        self.gas_limit.encode(out);
        self.to.encode(out);
        self.value.encode(out);
        self.input.encode(out);
        Header {
            list: true,
            payload_length: 0,
        }
        .encode(out);
    }

    /// The digest the sender signs: `keccak256(0x02 ‖ rlp(fields))`.
    #[must_use]
    pub fn signing_hash(&self) -> B256 {
        let mut out = vec![Self::TYPE];
        Header {
            list: true,
            payload_length: self.fields_len(),
        }
        .encode(&mut out);
        self.encode_fields(&mut out);
        keccak256(&out)
    }

    /// Signs with `signer`.
    ///
    /// # Errors
    /// [`SignatureError`] from the signer.
    pub fn sign(&self, signer: &LocalSigner) -> Result<SignedTx, SignatureError> {
        let sig = signer.sign_hash(&self.signing_hash())?;
        let parity = u8::from(sig.y_parity());
        let r = U256::from_be_bytes(sig.r().0);
        let s = U256::from_be_bytes(sig.s().0);
        let payload_length = self.fields_len() + parity.length() + r.length() + s.length();
        let mut out = vec![Self::TYPE];
        Header {
            list: true,
            payload_length,
        }
        .encode(&mut out);
        self.encode_fields(&mut out);
        parity.encode(&mut out);
        r.encode(&mut out);
        s.encode(&mut out);
        let hash = keccak256(&out);
        Ok(SignedTx {
            raw: out.into(),
            hash,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloy_primitives::{address, hex};

    // anvil's first dev account (mnemonic "test test ... junk"), a public test key.
    const ANVIL0: &str = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";

    #[test]
    fn address_from_key() {
        let s = LocalSigner::from_hex(ANVIL0).unwrap();
        assert_eq!(
            s.address(),
            address!("f39Fd6e51aad88F6F4ce6aB8827279cffFb92266")
        );
        assert!(!format!("{s:?}").contains("ac0974"));
    }

    #[test]
    fn bad_keys_are_refused_without_echo() {
        let e = LocalSigner::from_hex("0xzz").unwrap_err().to_string();
        assert!(!e.contains("zz"));
        assert!(matches!(
            LocalSigner::from_hex(&"00".repeat(32)),
            Err(KeyError::Scalar)
        ));
    }

    #[test]
    fn signatures_recover_and_are_low_s() {
        let s = LocalSigner::random();
        for i in 0u8..32 {
            let h = keccak256([i]);
            let sig = s.sign_hash(&h).unwrap();
            assert_eq!(sig.recover(&h).unwrap(), s.address());
        }
    }

    /// Golden vector: the same transaction signed by `eth-account` 0.14.0
    /// (`Account.sign_transaction({type: 2, chainId: 31337, nonce: 7, maxPriorityFeePerGas:
    /// 1_000_000_000, maxFeePerGas: 3_000_000_000, gas: 90_000, to: 0x5FbDB..., value: 0,
    /// data: 0xa9059cbb..., accessList: []}, ANVIL0)`).
    #[test]
    fn eip1559_golden_vector() {
        let tx = Eip1559Tx {
            chain_id: 31337,
            nonce: 7,
            max_priority_fee_per_gas: 1_000_000_000,
            max_fee_per_gas: 3_000_000_000,
            gas_limit: 90_000,
            to: address!("5FbDB2315678afecb367f032d93F642f64180aa3"),
            value: U256::ZERO,
            input: hex!("a9059cbb00000000000000000000000070997970c51812dc3a010c7d01b50e0d17dc79c800000000000000000000000000000000000000000000000000000000000003e8").into(),
        };
        let signed = tx.sign(&LocalSigner::from_hex(ANVIL0).unwrap()).unwrap();
        assert_eq!(hex::encode(&signed.raw), GOLDEN_RAW);
        assert_eq!(hex::encode(signed.hash), GOLDEN_HASH);
    }

    const GOLDEN_RAW: &str = "02f8b2827a6907843b9aca0084b2d05e0083015f90945fbdb2315678afecb367f032d93f642f64180aa380b844a9059cbb00000000000000000000000070997970c51812dc3a010c7d01b50e0d17dc79c800000000000000000000000000000000000000000000000000000000000003e8c080a0ecfbdc337ff352d7b1a192601bc992715150ce0638165b65b1b2e8b8ba6031a7a0632750dc4e604e22bdce25f6dce6e95901e914506037bd57aac7c8d2c7c7838f";
    const GOLDEN_HASH: &str = "60de2578257c3bcd28f6cae53a35036ea93b7eb798ecd119256aed1cb47f2036";
}
