//! Compact JWS (RFC 7515) with Ed25519 (`alg: EdDSA`, RFC 8037): the only signature format of
//! Stipendex objects.
//!
//! The parser is strict, and the signature is checked before the payload is read:
//! - exactly three parts, each canonical unpadded base64url, at most [`MAX_LEN`] bytes in all;
//! - the protected header is a JSON object with exactly `alg` (`"EdDSA"`), `kid` (the signer's
//!   key, `ed25519:…`) and optionally `typ`; any other member (`crit`, `b64`, `jku`, `x5u`, …)
//!   is refused, as this profile understands no extension;
//! - the signature is 64 bytes and verifies strictly (no malleable signatures, no weak keys)
//!   under the header's `kid`.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};

use super::key::{PublicKey, SecretKey};
use crate::Error;

/// The largest compact JWS accepted (64 KiB): far above any Stipendex object, small enough
/// that a hostile one costs nothing.
pub const MAX_LEN: usize = 64 * 1024;

/// The protected header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Header {
    alg: String,
    kid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    typ: Option<String>,
}

/// The `typ` header of Stipendex objects.
pub const TYP: &str = "stipendex+jws";

/// Signs `payload` (JSON bytes) with `key`: `base64url(header).base64url(payload).base64url(sig)`.
#[must_use]
pub fn sign(key: &SecretKey, payload: &[u8]) -> String {
    let header = Header {
        alg: "EdDSA".into(),
        kid: key.public().to_string(),
        typ: Some(TYP.into()),
    };
    // A struct of strings always serializes.
    let header = serde_json::to_vec(&header).unwrap_or_default();
    let mut out = URL_SAFE_NO_PAD.encode(header);
    out.push('.');
    out.push_str(&URL_SAFE_NO_PAD.encode(payload));
    let sig = key.sign(out.as_bytes());
    out.push('.');
    out.push_str(&URL_SAFE_NO_PAD.encode(sig));
    out
}

/// A compact JWS whose signature verified under the key its header names.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The signer's key (the header's `kid`), which the signature verified under.
    pub signer: PublicKey,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

fn part(p: &str, what: &str) -> Result<Vec<u8>, Error> {
    URL_SAFE_NO_PAD
        .decode(p)
        .map_err(|_| Error::Malformed(format!("the JWS {what} is not canonical base64url")))
}

/// Parses `compact` strictly and verifies its signature under the key its header names.
/// Nothing of the payload is read before the signature verifies.
///
/// # Errors
/// [`Error::Malformed`] (shape, encoding, header), [`Error::BadSignature`].
pub fn verify(compact: &str) -> Result<Verified, Error> {
    let parts = Parts::of(compact)?;
    parts.kid.verify(parts.input.as_bytes(), &parts.sig)?;
    parts.verified()
}

/// Parses `compact` as [`verify`] does but does not check its signature again: only for a JWS
/// whose signature this side has already checked (or made) and vouched for since — the Quote
/// inside a Proof this wallet signed, a Quote this receiver signed, a Quote pending in this
/// wallet's journal. Never for one that came from the network and was not verified.
///
/// # Errors
/// [`Error::Malformed`] (shape, encoding, header).
pub(crate) fn read_vouched(compact: &str) -> Result<Verified, Error> {
    Parts::of(compact)?.verified()
}

/// A compact JWS taken apart, its signature not checked yet.
struct Parts<'a> {
    kid: PublicKey,
    /// The signing input: the first two parts exactly as received.
    input: &'a str,
    payload: &'a str,
    sig: [u8; 64],
}

impl<'a> Parts<'a> {
    fn of(compact: &'a str) -> Result<Self, Error> {
        if compact.len() > MAX_LEN {
            return Err(Error::Malformed(format!(
                "the JWS is {} bytes, more than {MAX_LEN}",
                compact.len()
            )));
        }
        let mut parts = compact.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Error::Malformed(
                "a compact JWS has exactly three dot-separated parts".into(),
            ));
        };
        let header: Header = serde_json::from_slice(&part(h, "header")?)
            .map_err(|e| Error::Malformed(format!("the JWS header is not valid: {e}")))?;
        if header.alg != "EdDSA" {
            return Err(Error::Malformed(format!(
                "the JWS algorithm is {:?}; only EdDSA (Ed25519) is accepted",
                super::key::clip(&header.alg)
            )));
        }
        let sig: [u8; 64] = part(s, "signature")?
            .try_into()
            .map_err(|_| Error::Malformed("an Ed25519 signature is 64 bytes".into()))?;
        let kid = PublicKey::parse_cached(&header.kid)?;
        let input_len = h.len() + 1 + p.len();
        let input = compact.get(..input_len).unwrap_or_default();
        Ok(Parts {
            kid,
            input,
            payload: p,
            sig,
        })
    }

    fn verified(self) -> Result<Verified, Error> {
        Ok(Verified {
            signer: self.kid,
            payload: part(self.payload, "payload")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sign_then_verify() {
        let k = SecretKey::from_seed(&[1; 32]);
        let jws = sign(&k, br#"{"a":"b"}"#);
        let v = verify(&jws).unwrap();
        assert_eq!(v.signer, k.public());
        assert_eq!(v.payload, br#"{"a":"b"}"#);
    }

    #[test]
    fn refuses_tampering_and_foreign_shapes() {
        let k = SecretKey::from_seed(&[1; 32]);
        let jws = sign(&k, br#"{"a":"b"}"#);
        let parts: Vec<&str> = jws.split('.').collect();
        // payload swapped
        let other = format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(br#"{"a":"c"}"#),
            parts[2]
        );
        assert!(matches!(verify(&other), Err(Error::BadSignature(_))));
        // kid swapped for another key: the signature no longer verifies
        let h2 = URL_SAFE_NO_PAD.encode(format!(
            r#"{{"alg":"EdDSA","kid":"{}"}}"#,
            SecretKey::from_seed(&[2; 32]).public()
        ));
        assert!(verify(&format!("{h2}.{}.{}", parts[1], parts[2])).is_err());
        // alg none, crit, extra parts, padding
        for h in [
            r#"{"alg":"none","kid":"x"}"#.to_string(),
            format!(
                r#"{{"alg":"EdDSA","kid":"{}","crit":["b64"],"b64":false}}"#,
                k.public()
            ),
        ] {
            let jws = format!("{}.{}.{}", URL_SAFE_NO_PAD.encode(h), parts[1], parts[2]);
            assert!(matches!(verify(&jws), Err(Error::Malformed(_))), "{jws}");
        }
        assert!(verify(&format!("{jws}.x")).is_err());
        assert!(verify(&format!("{}=.{}.{}", parts[0], parts[1], parts[2])).is_err());
        assert!(verify("").is_err());
    }
}
