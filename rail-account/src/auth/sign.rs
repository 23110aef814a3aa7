//! The account's keys and the signing side.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};

use super::{AuthError, Canonical};

/// How a public key is written: `ed25519:` and 32 bytes in base64url (the Stipendex key form).
const PREFIX: &str = "ed25519:";

/// An account's secret key (Ed25519). Never printed: `Debug` shows the public key only.
#[derive(Clone)]
pub struct AccountKey(SigningKey);

impl AccountKey {
    /// A fresh random key.
    #[must_use]
    pub fn generate() -> Self {
        AccountKey(SigningKey::from_bytes(&rand::random::<[u8; 32]>()))
    }

    /// The key from its 32-byte seed.
    #[must_use]
    pub fn from_seed(seed: &[u8; 32]) -> Self {
        AccountKey(SigningKey::from_bytes(seed))
    }

    /// The key from its 32-byte seed written in hex (64 digits).
    ///
    /// # Errors
    /// [`AuthError::Key`] naming what is wrong, never echoing the text.
    pub fn from_hex(text: &str) -> Result<Self, AuthError> {
        let mut bytes = zeroize::Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(text.trim(), bytes.as_mut_slice()).map_err(|_| {
            AuthError::Key("an account key is 32 bytes written as 64 hex digits".into())
        })?;
        Ok(AccountKey(SigningKey::from_bytes(&bytes)))
    }

    /// The seed in hex, to store it (keep it secret).
    #[must_use]
    pub fn to_hex(&self) -> zeroize::Zeroizing<String> {
        zeroize::Zeroizing::new(hex::encode(self.0.to_bytes()))
    }

    /// The public key the facilitator registers for the account.
    #[must_use]
    pub fn public(&self) -> AccountPublicKey {
        AccountPublicKey(self.0.verifying_key())
    }

    /// Signs one request.
    #[must_use]
    pub fn sign(&self, request: &Canonical<'_>) -> Signature {
        Signature(self.0.sign(&request.to_bytes()))
    }
}

impl fmt::Debug for AccountKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AccountKey({})", self.public())
    }
}

/// An account's public key, written `ed25519:<base64url>`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct AccountPublicKey(pub(crate) VerifyingKey);

impl AccountPublicKey {
    /// Reads `ed25519:<base64url of 32 bytes>`; refuses weak (small-order) keys.
    ///
    /// # Errors
    /// [`AuthError::Key`].
    pub fn parse(text: &str) -> Result<Self, AuthError> {
        let b64 = text.strip_prefix(PREFIX).ok_or_else(|| {
            AuthError::Key(format!("a public key is written {PREFIX}<base64url>"))
        })?;
        let bytes: [u8; 32] = URL_SAFE_NO_PAD
            .decode(b64)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| AuthError::Key("a public key is 32 bytes in base64url".into()))?;
        let key = VerifyingKey::from_bytes(&bytes)
            .map_err(|_| AuthError::Key("the public key is not a point on Ed25519".into()))?;
        if key.is_weak() {
            return Err(AuthError::Key(
                "the public key is a weak (small-order) key".into(),
            ));
        }
        Ok(AccountPublicKey(key))
    }
}

impl fmt::Display for AccountPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{PREFIX}{}", URL_SAFE_NO_PAD.encode(self.0.as_bytes()))
    }
}

impl fmt::Debug for AccountPublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A request signature, written base64url in the [`super::SIGNATURE`] header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Signature(pub(crate) ed25519_dalek::Signature);

impl Signature {
    /// Reads the header's value.
    ///
    /// # Errors
    /// [`AuthError::Malformed`].
    pub fn parse(text: &str) -> Result<Self, AuthError> {
        let bytes: [u8; 64] = URL_SAFE_NO_PAD
            .decode(text)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                AuthError::Malformed(super::SIGNATURE, "not 64 bytes in base64url".into())
            })?;
        Ok(Signature(ed25519_dalek::Signature::from_bytes(&bytes)))
    }
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&URL_SAFE_NO_PAD.encode(self.0.to_bytes()))
    }
}

/// A fresh nonce: 16 random bytes, base64url.
#[must_use]
pub fn nonce() -> String {
    URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>())
}
