//! Journal anchors: the journal head at one moment, authenticated with a key the database
//! never sees, kept outside the database.
//!
//! The hash chain proves the journal consistent with itself, not that it is the journal that
//! was written: someone with write access can rewrite entries and recompute every hash after
//! them. An anchor pins the hash of one entry. Take one regularly ([`crate::Ledger::anchor`])
//! and keep it elsewhere (another system, a log, paper); [`crate::Ledger::verify_journal_against`]
//! then reports any rewrite of that entry or of anything before it, however consistent. Entries
//! after the latest anchor are protected only by the next one.

use std::fmt;
use std::str::FromStr;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// Shortest key [`JournalAnchor`] accepts (bytes). Use 32 random bytes.
pub const MIN_ANCHOR_KEY: usize = 16;

const TAG: &[u8] = b"stipendex-ledger/anchor/v1";
const TOKEN_PREFIX: &str = "sla1";

/// Why an anchor was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnchorError {
    /// The key is shorter than [`MIN_ANCHOR_KEY`].
    #[error("anchor key too short: {0} bytes, at least {MIN_ANCHOR_KEY} required")]
    KeyTooShort(usize),
    /// The anchor's MAC does not verify with this key: altered, or another key.
    #[error("anchor MAC does not verify (altered anchor, or another key)")]
    BadMac,
    /// The token is not `sla1.<seq>.<hash hex>.<mac hex>`.
    #[error("malformed anchor token: {0}")]
    Malformed(String),
}

/// The journal head (entry `seq` and its hash) with an HMAC-SHA256 over both under a key
/// supplied by the caller.
///
/// Text form ([`fmt::Display`] / [`FromStr`]): `sla1.<seq>.<64 hex digits>.<64 hex digits>`.
#[derive(Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct JournalAnchor {
    /// The anchored entry (0: the empty journal).
    pub seq: i64,
    /// Its hash (zeros for the empty journal).
    pub hash: [u8; 32],
    /// HMAC-SHA256(key, tag ‖ seq ‖ hash).
    pub mac: [u8; 32],
}

fn hmac(key: &[u8]) -> Result<Hmac<Sha256>, AnchorError> {
    if key.len() < MIN_ANCHOR_KEY {
        return Err(AnchorError::KeyTooShort(key.len()));
    }
    // HMAC takes keys of any length; the length check above is ours.
    <Hmac<Sha256> as Mac>::new_from_slice(key).map_err(|_| AnchorError::KeyTooShort(key.len()))
}

fn message(m: &mut Hmac<Sha256>, seq: i64, hash: &[u8; 32]) {
    m.update(TAG);
    m.update(&seq.to_be_bytes());
    m.update(hash);
}

impl JournalAnchor {
    /// Authenticates head (`seq`, `hash`) with `key`.
    ///
    /// # Errors
    /// [`AnchorError::KeyTooShort`].
    pub fn new(seq: i64, hash: [u8; 32], key: &[u8]) -> Result<Self, AnchorError> {
        let mut m = hmac(key)?;
        message(&mut m, seq, &hash);
        Ok(JournalAnchor {
            seq,
            hash,
            mac: m.finalize().into_bytes().into(),
        })
    }

    /// Checks the MAC with `key` (in constant time).
    ///
    /// # Errors
    /// [`AnchorError::BadMac`] or [`AnchorError::KeyTooShort`].
    pub fn check(&self, key: &[u8]) -> Result<(), AnchorError> {
        let mut m = hmac(key)?;
        message(&mut m, self.seq, &self.hash);
        m.verify_slice(&self.mac).map_err(|_| AnchorError::BadMac)
    }
}

impl fmt::Display for JournalAnchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{TOKEN_PREFIX}.{}.{}.{}",
            self.seq,
            hex::encode(self.hash),
            hex::encode(self.mac)
        )
    }
}

impl fmt::Debug for JournalAnchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "JournalAnchor({self})")
    }
}

fn hex32(s: &str, what: &str) -> Result<[u8; 32], AnchorError> {
    let mut b = [0u8; 32];
    if s.len() != 64 || !s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(AnchorError::Malformed(format!(
            "{what} must be 64 lowercase hex digits"
        )));
    }
    hex::decode_to_slice(s, &mut b).map_err(|e| AnchorError::Malformed(format!("{what}: {e}")))?;
    Ok(b)
}

impl FromStr for JournalAnchor {
    type Err = AnchorError;
    fn from_str(s: &str) -> Result<Self, AnchorError> {
        let mut parts = s.split('.');
        let (Some(prefix), Some(seq), Some(hash), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(AnchorError::Malformed(
                "expected 4 dot-separated parts".into(),
            ));
        };
        if prefix != TOKEN_PREFIX {
            return Err(AnchorError::Malformed(format!(
                "unknown version {prefix:?}"
            )));
        }
        if seq.is_empty() || !seq.bytes().all(|c| c.is_ascii_digit()) {
            return Err(AnchorError::Malformed("seq must be decimal digits".into()));
        }
        let seq = seq
            .parse::<i64>()
            .map_err(|e| AnchorError::Malformed(format!("seq: {e}")))?;
        Ok(JournalAnchor {
            seq,
            hash: hex32(hash, "hash")?,
            mac: hex32(mac, "mac")?,
        })
    }
}

impl From<JournalAnchor> for String {
    fn from(a: JournalAnchor) -> String {
        a.to_string()
    }
}

impl TryFrom<String> for JournalAnchor {
    type Error = AnchorError;
    fn try_from(s: String) -> Result<Self, AnchorError> {
        s.parse()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_macs_bind_seq_and_hash() {
        let key = [7u8; 32];
        let a = JournalAnchor::new(42, [9; 32], &key).unwrap_or_else(|e| panic!("{e}"));
        let t = a.to_string();
        assert!(t.starts_with("sla1.42."));
        let b: JournalAnchor = t.parse().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a, b);
        assert_eq!(b.check(&key), Ok(()));
        assert_eq!(b.check(&[8u8; 32]), Err(AnchorError::BadMac));
        let moved = JournalAnchor { seq: 43, ..a };
        assert_eq!(moved.check(&key), Err(AnchorError::BadMac));
        let rehashed = JournalAnchor { hash: [1; 32], ..a };
        assert_eq!(rehashed.check(&key), Err(AnchorError::BadMac));
        assert_eq!(
            JournalAnchor::new(1, [0; 32], b"short"),
            Err(AnchorError::KeyTooShort(5))
        );
        for bad in [
            "sla1.42.00",
            "sla2.1.".to_owned().as_str(),
            &t.replace("sla1.42", "sla1.-42"),
            &t.to_uppercase(),
            &format!("{t}.x"),
        ] {
            assert!(bad.parse::<JournalAnchor>().is_err(), "{bad}");
        }
    }
}
