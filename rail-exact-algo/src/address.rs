//! Algorand addresses: base32 (no padding) of the 32-byte public key followed by the last four
//! bytes of its SHA-512/256 — 58 characters.

use std::fmt;
use std::str::FromStr;

use data_encoding::BASE32_NOPAD;
use sha2::{Digest, Sha512_256};

/// An account address (an Ed25519 public key).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Address(pub [u8; 32]);

/// Why text is not an Algorand address.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AddressError {
    /// Not 58 characters of the base32 alphabet.
    #[error("not an Algorand address: {0}")]
    Malformed(&'static str),
    /// The checksum does not match the key.
    #[error("address checksum mismatch")]
    Checksum,
}

fn checksum(pk: &[u8; 32]) -> [u8; 4] {
    let h = Sha512_256::digest(pk);
    let mut c = [0u8; 4];
    c.copy_from_slice(h.get(28..32).unwrap_or(&[0; 4]));
    c
}

impl Address {
    /// Whether this is the all-zero address (the "absent" value in transactions).
    #[must_use]
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 32]
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut b = [0u8; 36];
        b[..32].copy_from_slice(&self.0);
        b[32..].copy_from_slice(&checksum(&self.0));
        f.write_str(&BASE32_NOPAD.encode(&b))
    }
}

impl fmt::Debug for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Address({self})")
    }
}

impl FromStr for Address {
    type Err = AddressError;
    fn from_str(s: &str) -> Result<Self, AddressError> {
        if s.len() != 58 {
            return Err(AddressError::Malformed("length must be 58"));
        }
        let raw = BASE32_NOPAD
            .decode(s.as_bytes())
            .map_err(|_| AddressError::Malformed("not base32"))?;
        let (pk, sum) = raw
            .split_at_checked(32)
            .ok_or(AddressError::Malformed("too short"))?;
        let pk: [u8; 32] = pk
            .try_into()
            .map_err(|_| AddressError::Malformed("too short"))?;
        if sum != checksum(&pk) {
            return Err(AddressError::Checksum);
        }
        // Re-encode to refuse non-canonical base32 (stray bits in the last character).
        let a = Address(pk);
        if a.to_string() != s {
            return Err(AddressError::Malformed("non-canonical base32"));
        }
        Ok(a)
    }
}
