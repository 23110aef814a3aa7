//! Ed25519 keys of the parties, and their text form `ed25519:<base64url of the 32 bytes>`.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signer as _, SigningKey};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use zeroize::Zeroizing;

use crate::Error;

const PREFIX: &str = "ed25519:";

/// A party's public key (principal, wallet or receiver). Its text form, used in objects, JWS
/// headers (`kid`) and files, is `ed25519:` followed by the base64url (no padding) of the 32
/// bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(ed25519_dalek::VerifyingKey);

impl PublicKey {
    /// The key's 32 bytes.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; 32] {
        self.0.to_bytes()
    }

    /// A key from its 32 bytes.
    ///
    /// # Errors
    /// [`Error::Malformed`] if the bytes are not a valid Ed25519 point, or a weak (small-order)
    /// key, which could verify signatures it never made.
    pub fn from_bytes(bytes: &[u8; 32]) -> Result<Self, Error> {
        let key = ed25519_dalek::VerifyingKey::from_bytes(bytes)
            .map_err(|_| Error::Malformed("the public key is not an Ed25519 point".into()))?;
        if key.is_weak() {
            return Err(Error::Malformed(
                "the public key is a weak (small-order) Ed25519 key".into(),
            ));
        }
        Ok(PublicKey(key))
    }

    /// Parses the text form `ed25519:<base64url>`.
    ///
    /// # Errors
    /// [`Error::Malformed`] naming what is wrong.
    pub fn parse(text: &str) -> Result<Self, Error> {
        let b64 = text.strip_prefix(PREFIX).ok_or_else(|| {
            Error::Malformed(format!(
                "a key must be written `{PREFIX}<base64url>`, got {:?}",
                clip(text)
            ))
        })?;
        let bytes = URL_SAFE_NO_PAD
            .decode(b64)
            .map_err(|_| Error::Malformed("a key's base64url is invalid".into()))?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|_| Error::Malformed("a key must be 32 bytes".into()))?;
        Self::from_bytes(&bytes)
    }

    /// As [`PublicKey::parse`], remembering keys already decoded (each costs a point
    /// decompression and a weak-key check): readers see the same few keys again and again (a
    /// receiver its own, a wallet its mandate's). The cache is bounded (cleared when full).
    ///
    /// # Errors
    /// As [`PublicKey::parse`].
    pub fn parse_cached(text: &str) -> Result<Self, Error> {
        let cache = key_cache();
        if let Some(k) = cache.lock().ok().and_then(|c| c.get(text).copied()) {
            return Ok(k);
        }
        let key = Self::parse(text)?;
        if let Ok(mut c) = cache.lock() {
            if c.len() >= KEY_CACHE {
                c.clear();
            }
            c.insert(text.to_owned(), key);
        }
        Ok(key)
    }

    /// Checks `signature` over `message` (strict verification: no malleable signatures).
    ///
    /// # Errors
    /// [`Error::BadSignature`].
    pub fn verify(&self, message: &[u8], signature: &[u8; 64]) -> Result<(), Error> {
        let sig = ed25519_dalek::Signature::from_bytes(signature);
        self.0
            .verify_strict(message, &sig)
            .map_err(|_| Error::BadSignature("the signature does not verify with the key".into()))
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", URL_SAFE_NO_PAD.encode(self.0.as_bytes()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

impl std::str::FromStr for PublicKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

impl Serialize for PublicKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PublicKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        Self::parse_cached(&text).map_err(serde::de::Error::custom)
    }
}

/// A party's secret signing key. It is never printed (`Debug` shows only the public key) and
/// its bytes are wiped when dropped.
#[derive(Clone)]
pub struct SecretKey(SigningKey);

impl SecretKey {
    /// A fresh random key (from the operating system's generator).
    #[must_use]
    pub fn generate() -> Self {
        let seed = Zeroizing::new(rand::random::<[u8; 32]>());
        SecretKey(SigningKey::from_bytes(&seed))
    }

    /// The key of a 32-byte seed.
    #[must_use]
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        SecretKey(SigningKey::from_bytes(seed))
    }

    /// Parses 64 hex digits (a 32-byte seed), as key files and environment variables hold it.
    ///
    /// # Errors
    /// [`Error::Malformed`] (`is not a 32-byte hex key`); the value is never repeated.
    pub fn from_hex(text: &str) -> Result<Self, Error> {
        let mut seed = Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(text.trim(), seed.as_mut_slice())
            .map_err(|_| Error::Malformed("the secret key is not a 32-byte hex key".into()))?;
        Ok(Self::from_seed(&seed))
    }

    /// The seed as 64 hex digits (to write a key file; handle with care).
    #[must_use]
    pub fn to_hex(&self) -> Zeroizing<String> {
        Zeroizing::new(hex::encode(self.0.to_bytes()))
    }

    /// The public half.
    #[must_use]
    pub fn public(&self) -> PublicKey {
        PublicKey(self.0.verifying_key())
    }

    /// Signs `message`.
    #[must_use]
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.0.sign(message).to_bytes()
    }
}

impl fmt::Debug for SecretKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretKey(public {})", self.public())
    }
}

/// The most keys [`PublicKey::parse_cached`] remembers (then it forgets them all at once): a
/// JWS's `kid` is read before its signature is checked, so anyone can show it new keys.
const KEY_CACHE: usize = 4096;

/// The keys [`PublicKey::parse_cached`] decoded, by their text form (only valid keys, whose
/// text is bounded).
fn key_cache() -> &'static std::sync::Mutex<std::collections::HashMap<String, PublicKey>> {
    static CACHE: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, PublicKey>>,
    > = std::sync::OnceLock::new();
    CACHE.get_or_init(Default::default)
}

pub(crate) fn clip(s: &str) -> String {
    s.chars().take(40).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_form_round_trips_and_refuses_bad_keys() {
        let k = SecretKey::from_seed(&[7; 32]).public();
        let text = k.to_string();
        assert!(text.starts_with("ed25519:"));
        assert_eq!(PublicKey::parse(&text).unwrap(), k);
        assert!(PublicKey::parse("ed25519:AAAA").is_err());
        assert!(PublicKey::parse(&text.replace("ed25519:", "x25519:")).is_err());
        // the identity point is a weak key
        let mut ident = [0u8; 32];
        ident[0] = 1;
        assert!(PublicKey::from_bytes(&ident).is_err());
    }

    /// Issue #47: a `kid` is read before the signature is checked. 10,000 keys never seen
    /// before (as many unauthenticated requests with a key each) and 10,000 texts that are
    /// not keys: the cache stays within its bound, holds no text that is not a key, and a
    /// known key is still read right.
    #[test]
    fn the_key_cache_stays_bounded_under_new_keys() {
        let honest = SecretKey::from_seed(&[3; 32]).public();
        assert_eq!(
            PublicKey::parse_cached(&honest.to_string()).unwrap(),
            honest
        );
        for i in 0..10_000u32 {
            let mut seed = [0u8; 32];
            seed[..4].copy_from_slice(&i.to_be_bytes());
            seed[4] = 0xa7;
            let k = SecretKey::from_seed(&seed).public();
            assert_eq!(PublicKey::parse_cached(&k.to_string()).unwrap(), k);
            assert!(PublicKey::parse_cached(&format!("ed25519:{i}{}", "A".repeat(200))).is_err());
            assert!(key_cache().lock().unwrap().len() <= KEY_CACHE);
        }
        assert!(
            key_cache()
                .lock()
                .unwrap()
                .keys()
                .all(|t| t.len() < 60 && t.starts_with("ed25519:"))
        );
        assert_eq!(
            PublicKey::parse_cached(&honest.to_string()).unwrap(),
            honest
        );
    }

    #[test]
    fn secret_key_debug_hides_the_seed() {
        let k = SecretKey::from_seed(&[9; 32]);
        let dbg = format!("{k:?}");
        assert!(!dbg.contains(&hex::encode([9u8; 32])));
        assert!(SecretKey::from_hex("zz").is_err());
        assert_eq!(
            SecretKey::from_hex(&k.to_hex()).unwrap().public(),
            k.public()
        );
    }
}
