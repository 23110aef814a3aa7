//! Validated field types for the EVM values a payer sends.
//!
//! Each type accepts exactly one spelling per value, so a signed payload has one byte form:
//! a payload whose bytes differ (case of a hex digit, a leading zero, a `0X` prefix) is refused
//! rather than silently read as the same authorization. The reference clients (`@x402/evm`,
//! python `x402`, go `x402`) all emit these canonical spellings.
//!
//! - [`ChecksumAddress`]: `0x` + 40 hex digits in EIP-55 mixed case, as the exact-EVM scheme's
//!   encoding table requires (`from`, `to`).
//! - [`Uint256Decimal`]: a uint256 in canonical decimal (digits only, no sign, no leading zero).
//!   The scheme text also allows `0x` hex for `value`/`validAfter`/`validBefore`; no reference
//!   client sends it and it is refused here.
//! - [`Bytes32Hex`]: `0x` + 64 lowercase hex digits (`nonce`).
//! - [`HexBytes`]: `0x` + an even number of lowercase hex digits (`signature`), bounded in length.
//!
//! All of them (de)serialize as JSON strings; a JSON number is refused.

use std::fmt;
use std::str::FromStr;

use alloy_primitives::{Address, B256, U256};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Why a field value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// Not `0x` followed by exactly 40 hex digits.
    #[error("expected an address: 0x followed by 40 hex digits")]
    AddressFormat,
    /// Well formed, but not in EIP-55 checksum case.
    #[error("address is not EIP-55 checksummed (expected {expected})")]
    AddressChecksum {
        /// The checksummed spelling of the same address.
        expected: String,
    },
    /// Not a canonical decimal integer.
    #[error("expected a decimal integer string: digits only, no sign, no leading zero")]
    DecimalFormat,
    /// A decimal integer larger than `2^256 - 1`.
    #[error("integer does not fit in uint256")]
    DecimalOverflow,
    /// Not `0x` followed by exactly 64 lowercase hex digits.
    #[error("expected bytes32: 0x followed by 64 lowercase hex digits")]
    Bytes32Format,
    /// Not `0x` followed by an even number of lowercase hex digits.
    #[error("expected hex bytes: 0x followed by an even number of lowercase hex digits")]
    HexBytesFormat,
    /// More bytes than [`HexBytes::MAX_LEN`].
    #[error("hex value is {len} bytes long, at most {max} are accepted")]
    HexBytesTooLong {
        /// Decoded length.
        len: usize,
        /// The limit.
        max: usize,
    },
}

fn is_lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Strips the lowercase `0x` prefix and checks the rest is lowercase hex of the given length.
fn lower_hex_body(s: &str, hex_len: Option<usize>) -> Option<&str> {
    let body = s.strip_prefix("0x")?;
    if let Some(len) = hex_len
        && body.len() != len
    {
        return None;
    }
    is_lower_hex(body).then_some(body)
}

/// An EVM address spelled in EIP-55 checksum case (`0x` + 40 hex digits).
///
/// An all-lowercase spelling is refused too: the exact-EVM scheme requires EIP-55, and one
/// spelling per address keeps a signed payload's bytes unique.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChecksumAddress(Address);

impl ChecksumAddress {
    /// Parses a checksummed address.
    ///
    /// # Errors
    /// [`FieldError::AddressFormat`] or [`FieldError::AddressChecksum`].
    pub fn parse(s: &str) -> Result<Self, FieldError> {
        let body = s.strip_prefix("0x").ok_or(FieldError::AddressFormat)?;
        if body.len() != 40 || !body.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(FieldError::AddressFormat);
        }
        let address = Address::from_str(body).map_err(|_| FieldError::AddressFormat)?;
        let expected = address.to_checksum(None);
        if expected != s {
            return Err(FieldError::AddressChecksum { expected });
        }
        Ok(Self(address))
    }

    /// The address.
    #[must_use]
    pub const fn address(&self) -> Address {
        self.0
    }
}

impl From<Address> for ChecksumAddress {
    fn from(address: Address) -> Self {
        Self(address)
    }
}

impl fmt::Display for ChecksumAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.to_checksum(None))
    }
}

impl Serialize for ChecksumAddress {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0.to_checksum(None))
    }
}

impl<'de> Deserialize<'de> for ChecksumAddress {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A uint256 written as a canonical decimal string (`"0"`, `"10000"`; never `"010"`, `"+1"`,
/// `"0x10"`, or a JSON number).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Uint256Decimal(U256);

impl Uint256Decimal {
    /// Parses a canonical decimal string.
    ///
    /// # Errors
    /// [`FieldError::DecimalFormat`] or [`FieldError::DecimalOverflow`].
    pub fn parse(s: &str) -> Result<Self, FieldError> {
        let digits_only = !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let leading_zero = s.len() > 1 && s.starts_with('0');
        if !digits_only || leading_zero {
            return Err(FieldError::DecimalFormat);
        }
        // uint256 max has 78 decimal digits; longer strings overflow (no leading zeros here).
        if s.len() > 78 {
            return Err(FieldError::DecimalOverflow);
        }
        U256::from_str_radix(s, 10)
            .map(Self)
            .map_err(|_| FieldError::DecimalOverflow)
    }

    /// The value.
    #[must_use]
    pub const fn value(&self) -> U256 {
        self.0
    }
}

impl From<U256> for Uint256Decimal {
    fn from(value: U256) -> Self {
        Self(value)
    }
}

impl From<u64> for Uint256Decimal {
    fn from(value: u64) -> Self {
        Self(U256::from(value))
    }
}

impl fmt::Display for Uint256Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl Serialize for Uint256Decimal {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Uint256Decimal {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// 32 bytes written as `0x` + 64 lowercase hex digits (the EIP-3009 `nonce`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Bytes32Hex(B256);

impl Bytes32Hex {
    /// Parses `0x` + 64 lowercase hex digits.
    ///
    /// # Errors
    /// [`FieldError::Bytes32Format`].
    pub fn parse(s: &str) -> Result<Self, FieldError> {
        let body = lower_hex_body(s, Some(64)).ok_or(FieldError::Bytes32Format)?;
        B256::from_str(body)
            .map(Self)
            .map_err(|_| FieldError::Bytes32Format)
    }

    /// The bytes.
    #[must_use]
    pub const fn value(&self) -> B256 {
        self.0
    }
}

impl From<B256> for Bytes32Hex {
    fn from(value: B256) -> Self {
        Self(value)
    }
}

impl fmt::Display for Bytes32Hex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&alloy_primitives::hex::encode_prefixed(self.0))
    }
}

impl Serialize for Bytes32Hex {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Bytes32Hex {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Bytes written as `0x` + an even number of lowercase hex digits (the `signature`).
///
/// Any length up to [`HexBytes::MAX_LEN`] decodes, so a smart-wallet (ERC-1271 / ERC-6492)
/// signature still parses; the offline verifier only accepts 65-byte ECDSA signatures.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct HexBytes(Vec<u8>);

impl HexBytes {
    /// The longest value accepted, in bytes (ERC-6492 wrappers carry factory calldata).
    pub const MAX_LEN: usize = 8 * 1024;

    /// Parses `0x` + an even number of lowercase hex digits.
    ///
    /// # Errors
    /// [`FieldError::HexBytesFormat`] or [`FieldError::HexBytesTooLong`].
    pub fn parse(s: &str) -> Result<Self, FieldError> {
        let body = lower_hex_body(s, None).ok_or(FieldError::HexBytesFormat)?;
        let len = body.len() / 2;
        if len > Self::MAX_LEN {
            return Err(FieldError::HexBytesTooLong {
                len,
                max: Self::MAX_LEN,
            });
        }
        alloy_primitives::hex::decode(body)
            .map(Self)
            .map_err(|_| FieldError::HexBytesFormat)
    }

    /// The bytes.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        &self.0
    }

    /// Number of bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl From<Vec<u8>> for HexBytes {
    fn from(value: Vec<u8>) -> Self {
        Self(value)
    }
}

impl fmt::Display for HexBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&alloy_primitives::hex::encode_prefixed(&self.0))
    }
}

impl Serialize for HexBytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HexBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_address_accepts_only_eip55() {
        let good = "0x857b06519E91e3A54538791bDbb0E22373e36b66";
        let parsed = ChecksumAddress::parse(good).unwrap();
        assert_eq!(parsed.to_string(), good);
        assert_eq!(
            serde_json::to_string(&parsed).unwrap(),
            format!("\"{good}\"")
        );

        let lower = good.to_ascii_lowercase();
        assert!(matches!(
            ChecksumAddress::parse(&lower),
            Err(FieldError::AddressChecksum { expected }) if expected == good
        ));
        let upper_prefix = good.replacen("0x", "0X", 1);
        assert_eq!(
            ChecksumAddress::parse(&upper_prefix),
            Err(FieldError::AddressFormat)
        );
        assert_eq!(
            ChecksumAddress::parse(&good[2..]),
            Err(FieldError::AddressFormat)
        );
        assert_eq!(
            ChecksumAddress::parse(&good[..41]),
            Err(FieldError::AddressFormat)
        );
        assert_eq!(
            ChecksumAddress::parse("0x857b06519E91e3A54538791bDbb0E22373e36bgg"),
            Err(FieldError::AddressFormat)
        );
        assert!(serde_json::from_str::<ChecksumAddress>("1234").is_err());
    }

    #[test]
    fn decimal_is_canonical_and_bounded() {
        assert_eq!(Uint256Decimal::parse("0").unwrap().value(), U256::ZERO);
        assert_eq!(
            Uint256Decimal::parse("10000").unwrap().value(),
            U256::from(10_000u64)
        );
        for bad in [
            "", "00", "010", "+1", "-1", "1e3", " 1", "1 ", "0x10", "1.0", "١",
        ] {
            assert_eq!(
                Uint256Decimal::parse(bad),
                Err(FieldError::DecimalFormat),
                "{bad:?}"
            );
        }
        let max = U256::MAX.to_string();
        assert_eq!(Uint256Decimal::parse(&max).unwrap().value(), U256::MAX);
        // 2^256 exactly: 78 digits, one more than the maximum.
        let over = "115792089237316195423570985008687907853269984665640564039457584007913129639936";
        assert_eq!(
            Uint256Decimal::parse(over),
            Err(FieldError::DecimalOverflow)
        );
        assert_eq!(
            Uint256Decimal::parse(&"9".repeat(79)),
            Err(FieldError::DecimalOverflow)
        );
        // JSON numbers are refused: amounts travel as strings.
        assert!(serde_json::from_str::<Uint256Decimal>("10000").is_err());
        assert_eq!(
            serde_json::from_str::<Uint256Decimal>("\"10000\"")
                .unwrap()
                .to_string(),
            "10000"
        );
    }

    #[test]
    fn bytes32_is_lowercase_0x_64() {
        let nonce = "0xf3746613c2d920b5fdabc0856f2aeb2d4f88ee6037b8cc5d04a71a4462f13480";
        assert_eq!(Bytes32Hex::parse(nonce).unwrap().to_string(), nonce);
        assert!(Bytes32Hex::parse(&nonce.to_ascii_uppercase().replacen("0X", "0x", 1)).is_err());
        assert!(Bytes32Hex::parse(&nonce.replacen("0x", "0X", 1)).is_err());
        assert!(Bytes32Hex::parse(&nonce[2..]).is_err());
        assert!(Bytes32Hex::parse(&nonce[..65]).is_err());
        assert!(Bytes32Hex::parse(&format!("{nonce}00")).is_err());
    }

    #[test]
    fn hex_bytes_is_lowercase_even_and_bounded() {
        assert_eq!(HexBytes::parse("0x").unwrap().len(), 0);
        assert_eq!(HexBytes::parse("0x00ff").unwrap().as_slice(), &[0, 255]);
        assert!(HexBytes::parse("0x0").is_err());
        assert!(HexBytes::parse("0x00FF").is_err());
        assert!(HexBytes::parse("00ff").is_err());
        let too_long = format!("0x{}", "00".repeat(HexBytes::MAX_LEN + 1));
        assert!(matches!(
            HexBytes::parse(&too_long),
            Err(FieldError::HexBytesTooLong { .. })
        ));
    }
}
