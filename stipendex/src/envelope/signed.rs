//! [`Signed`]: an object with its compact JWS; the type tag, ids, digests and amounts every object
//! shares.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rail_core::{Amount, Asset, Money};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use super::jws;
use super::key::{PublicKey, SecretKey, clip};
use crate::Error;

/// The major version this build understands: objects of any other major version are refused.
pub const MAJOR: u32 = 0;
/// The minor version this build writes.
pub const MINOR: u32 = 1;

/// The `stipendex` member of every object: `"<type>/<major>.<minor>"` (`"quote/0.1"`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    /// The object type (`mandate`, `quote`, `confirmation`, `proof`, `receipt`).
    pub kind: String,
    /// Major version: a change that breaks compatibility.
    pub major: u32,
    /// Minor version: additions a reader of the same major version may ignore.
    pub minor: u32,
}

impl Tag {
    /// The tag this build writes for `kind`.
    #[must_use]
    pub fn current(kind: &str) -> Self {
        Tag {
            kind: kind.to_owned(),
            major: MAJOR,
            minor: MINOR,
        }
    }

    /// Parses `"<type>/<major>.<minor>"`.
    ///
    /// # Errors
    /// [`Error::Malformed`].
    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = || {
            Error::Malformed(format!(
                "`stipendex` must be \"<type>/<major>.<minor>\", got {:?}",
                clip(text)
            ))
        };
        let (kind, version) = text.split_once('/').ok_or_else(bad)?;
        let (major, minor) = version.split_once('.').ok_or_else(bad)?;
        let num = |s: &str| -> Result<u32, Error> {
            if s.is_empty() || s.len() > 9 || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        if kind.is_empty() || !kind.bytes().all(|b| b.is_ascii_lowercase() || b == b'-') {
            return Err(bad());
        }
        Ok(Tag {
            kind: kind.to_owned(),
            major: num(major)?,
            minor: num(minor)?,
        })
    }

    /// Refuses a tag of another type or of a major version this build does not know.
    ///
    /// # Errors
    /// [`Error::WrongType`], [`Error::UnsupportedVersion`].
    pub fn expect(&self, kind: &str) -> Result<(), Error> {
        if self.kind != kind {
            return Err(Error::WrongType {
                expected: kind.to_owned(),
                found: self.kind.clone(),
            });
        }
        if self.major != MAJOR {
            return Err(Error::UnsupportedVersion {
                tag: self.to_string(),
            });
        }
        Ok(())
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}.{}", self.kind, self.major, self.minor)
    }
}

impl Serialize for Tag {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Tag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Tag::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A new identifier: `prefix` (`q_`) and 22 base64url characters of randomness (128 bits), so
/// ids are unique per issuer without coordination.
#[must_use]
pub fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}{}",
        URL_SAFE_NO_PAD.encode(rand::random::<[u8; 16]>())
    )
}

/// Refuses an id without its type's prefix, or with characters outside `A-Z a-z 0-9 _ -`.
///
/// # Errors
/// [`Error::Malformed`].
pub fn check_id(id: &str, prefix: &str) -> Result<(), Error> {
    let rest = id.strip_prefix(prefix).unwrap_or_default();
    if rest.is_empty()
        || id.len() > 64
        || !rest
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(Error::Malformed(format!(
            "id {:?} must be `{prefix}` then 1-62 characters of A-Z a-z 0-9 _ -",
            clip(id)
        )));
    }
    Ok(())
}

/// The digest that binds one object to another: `sha256:` and the base64url (no padding) of
/// SHA-256 over the object's compact JWS, exactly as signed.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes` (a compact JWS, or a result's bytes for a Receipt).
    #[must_use]
    pub fn of(bytes: &[u8]) -> Self {
        Self::from_sha256(Sha256::digest(bytes).into())
    }

    /// The digest whose SHA-256 is `hash` (of bytes hashed as they streamed by).
    #[must_use]
    pub fn from_sha256(hash: [u8; 32]) -> Self {
        Digest(format!("sha256:{}", URL_SAFE_NO_PAD.encode(hash)))
    }

    /// The text form.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The 32 bytes of the hash.
    #[must_use]
    pub fn hash(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        if let Some(b) = self
            .0
            .strip_prefix("sha256:")
            .and_then(|b| URL_SAFE_NO_PAD.decode(b).ok())
            && let Some(h) = b.get(..32)
        {
            out.copy_from_slice(h);
        }
        out
    }

    /// The digest whose hash is `hash` (a Merkle root).
    #[must_use]
    pub fn from_hash(hash: [u8; 32]) -> Self {
        Self::from_sha256(hash)
    }
}

impl TryFrom<String> for Digest {
    type Error = Error;
    fn try_from(s: String) -> Result<Self, Error> {
        let ok = s
            .strip_prefix("sha256:")
            .and_then(|b| URL_SAFE_NO_PAD.decode(b).ok())
            .is_some_and(|b| b.len() == 32);
        if ok {
            Ok(Digest(s))
        } else {
            Err(Error::Malformed(format!(
                "a digest is `sha256:` and 43 base64url characters, got {:?}",
                clip(&s)
            )))
        }
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.0)
    }
}

/// The members every object declares about itself, borrowed from it: its tag, its id and the
/// key it says signed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity<'a> {
    /// The object's `stipendex` tag.
    pub tag: &'a Tag,
    /// The object's id.
    pub id: &'a str,
    /// The key the object says signed it.
    pub signer: &'a PublicKey,
}

impl<'a> Identity<'a> {
    /// The identity of an object with tag `tag`, id `id` and declared signer `signer`.
    #[must_use]
    pub fn new(tag: &'a Tag, id: &'a str, signer: &'a PublicKey) -> Self {
        Identity { tag, id, signer }
    }
}

/// What every Stipendex object declares about itself.
pub trait Object: Serialize + DeserializeOwned + Clone + fmt::Debug + Send + Sync {
    /// Its type, as in its tag (`quote`).
    const KIND: &'static str;
    /// Its id prefix (`q_`).
    const PREFIX: &'static str;
    /// Its tag, its id and its declared signer, in one borrow: what [`Object::tag`],
    /// [`Object::id`] and [`Object::signer`] read.
    fn identity(&self) -> Identity<'_>;
    /// Its tag.
    fn tag(&self) -> &Tag {
        self.identity().tag
    }
    /// Its id.
    fn id(&self) -> &str {
        self.identity().id
    }
    /// The key the object says signed it; the JWS must verify under exactly this key.
    fn signer(&self) -> &PublicKey {
        self.identity().signer
    }
    /// The object's own consistency rules (amounts, ids of the objects it names), checked on
    /// signing and on parsing.
    ///
    /// # Errors
    /// [`Error::Malformed`] naming the rule, or [`Error::Mismatch`] when an object it carries
    /// is not the one its digest names.
    fn check(&self) -> Result<(), Error> {
        Ok(())
    }
}

/// `amount` as money of `asset`; `what` names the amount in the error (`receipt amount`).
///
/// # Errors
/// [`Error::Malformed`] (`"<what>: <why>"`) if the amount does not fit the asset.
pub(crate) fn money(
    asset: &Asset,
    amount: Amount,
    what: impl fmt::Display,
) -> Result<Money, Error> {
    Money::new(asset.clone(), amount).map_err(|e| Error::Malformed(format!("{what}: {e}")))
}

/// The rules both signing and parsing apply to an object: its tag (type, major version), its
/// id, then its own rules.
fn validate<T: Object>(object: &T) -> Result<(), Error> {
    object.tag().expect(T::KIND)?;
    check_id(object.id(), T::PREFIX)?;
    object.check()
}

/// An object and its compact JWS. A `Signed` exists only for a JWS whose signature verified
/// under the key the object declares, with the right type, a known major version and a valid
/// id: parsing *is* verifying. Whether that key is trusted is the reader's decision (a
/// mandate's allowlist, a mandate's wallet key, a principal key given as the trust anchor).
#[derive(Clone, Debug)]
pub struct Signed<T> {
    jws: String,
    object: T,
    /// Computed on first use: not every reader needs it.
    digest: std::sync::OnceLock<Digest>,
}

#[derive(Deserialize)]
struct Peek {
    stipendex: Tag,
}

impl<T: Object> Signed<T> {
    /// Signs `object` with `key`, which must be the key the object declares.
    ///
    /// # Errors
    /// [`Error::Untrusted`] if `key` is not the object's declared signer; the object's own
    /// rules ([`Object::check`]).
    pub fn sign(object: T, key: &SecretKey) -> Result<Self, Error> {
        validate(&object)?;
        if object.signer() != &key.public() {
            return Err(Error::Untrusted(format!(
                "a {} declaring signer {} cannot be signed with key {}",
                T::KIND,
                object.signer(),
                key.public()
            )));
        }
        let payload = serde_json::to_vec(&object)
            .map_err(|e| Error::Malformed(format!("cannot serialize the {}: {e}", T::KIND)))?;
        let jws = jws::sign(key, &payload);
        Ok(Signed {
            jws,
            object,
            digest: std::sync::OnceLock::new(),
        })
    }

    /// Verifies `compact` and reads the object: signature first (under the header's key), then
    /// the tag (type, major version), then the object, its id, its own rules, and that the key
    /// it declares is the key that signed it.
    ///
    /// # Errors
    /// [`Error::Malformed`], [`Error::BadSignature`], [`Error::WrongType`],
    /// [`Error::UnsupportedVersion`], [`Error::Untrusted`], [`Error::Mismatch`] (the object's
    /// own rules: a Proof whose digests do not match what it carries).
    pub fn parse(compact: &str) -> Result<Self, Error> {
        let verified = jws::verify(compact.trim())?;
        Self::read(compact, &verified)
    }

    /// [`Signed::parse`] without checking the signature again, for an object this side has
    /// already verified (or signed) and vouched for since: the Quote inside a Proof this
    /// wallet signed (it signs a Proof only for a verified Quote), a Quote this receiver
    /// signed, a Quote this wallet's journal holds as pending (verified before it was paid).
    /// Every other rule is checked as in [`Signed::parse`].
    ///
    /// # Errors
    /// As [`Signed::parse`] but [`Error::BadSignature`].
    pub(crate) fn reread_vouched(compact: &str) -> Result<Self, Error> {
        let verified = jws::read_vouched(compact.trim())?;
        Self::read(compact, &verified)
    }

    /// The object of `compact`, whose signature `verified` holds.
    fn read(compact: &str, verified: &jws::Verified) -> Result<Self, Error> {
        // One pass on the way that succeeds; the tag is read alone only to explain a failure
        // (another type, an unknown major version: their members may not parse as `T`).
        let object: T = match serde_json::from_slice(&verified.payload) {
            Ok(o) => o,
            Err(e) => {
                let peek: Peek = serde_json::from_slice(&verified.payload).map_err(|e| {
                    Error::Malformed(format!("the payload has no valid `stipendex` tag: {e}"))
                })?;
                peek.stipendex.expect(T::KIND)?;
                return Err(Error::Malformed(format!(
                    "the {} is not valid: {e}",
                    T::KIND
                )));
            }
        };
        validate(&object)?;
        if object.signer() != &verified.signer {
            return Err(Error::Untrusted(format!(
                "the {} declares signer {} but was signed by {}",
                T::KIND,
                object.signer(),
                verified.signer
            )));
        }
        Ok(Signed {
            jws: compact.trim().to_owned(),
            object,
            digest: std::sync::OnceLock::new(),
        })
    }

    /// The object.
    #[must_use]
    pub fn object(&self) -> &T {
        &self.object
    }

    /// The compact JWS, exactly as signed.
    #[must_use]
    pub fn jws(&self) -> &str {
        &self.jws
    }

    /// The digest other objects bind this one by.
    #[must_use]
    pub fn digest(&self) -> &Digest {
        self.digest.get_or_init(|| Digest::of(self.jws.as_bytes()))
    }

    /// The header value of the HTTP binding: base64url of the compact JWS.
    #[must_use]
    pub fn to_header(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.jws.as_bytes())
    }

    /// Parses an HTTP binding header value (base64url of the compact JWS).
    ///
    /// # Errors
    /// As [`Signed::parse`]; [`Error::Malformed`] if the value is not base64url.
    pub fn from_header(value: &str) -> Result<Self, Error> {
        if value.len() > jws::MAX_LEN * 2 {
            return Err(Error::Malformed("the header is too long".into()));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(value.trim())
            .map_err(|_| Error::Malformed("the header is not base64url".into()))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::Malformed("the header does not hold a compact JWS".into()))?;
        Self::parse(&text)
    }
}

/// The form of a signed object inside JSON (a 402 body, a JSON-RPC error's `data`, MCP
/// `_meta`): `{"stipendex": "<type>/<version>", "jws": "<compact JWS>"}`. The tag lets a host
/// route the object without verifying it; the JWS is the object, and the tag must match it.
#[derive(Serialize, Deserialize)]
struct Wire {
    stipendex: Tag,
    jws: String,
}

impl<T: Object> Serialize for Signed<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Wire {
            stipendex: self.object.tag().clone(),
            jws: self.jws.clone(),
        }
        .serialize(s)
    }
}

impl<'de, T: Object> Deserialize<'de> for Signed<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(d)?;
        let signed = Signed::<T>::parse(&wire.jws).map_err(serde::de::Error::custom)?;
        if signed.object.tag() != &wire.stipendex {
            return Err(serde::de::Error::custom(format!(
                "the outer tag {} does not match the signed object's {}",
                wire.stipendex,
                signed.object.tag()
            )));
        }
        Ok(signed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_parse_strictly() {
        assert_eq!(Tag::parse("quote/0.1").unwrap(), Tag::current("quote"));
        for bad in [
            "quote",
            "quote/0",
            "quote/0.x",
            "Quote/0.1",
            "/0.1",
            "quote/-1.0",
            "quote/0.1.2",
        ] {
            assert!(Tag::parse(bad).is_err(), "{bad}");
        }
        assert!(matches!(
            Tag::parse("quote/1.0").unwrap().expect("quote"),
            Err(Error::UnsupportedVersion { .. })
        ));
        assert!(matches!(
            Tag::current("receipt").expect("quote"),
            Err(Error::WrongType { .. })
        ));
    }

    #[test]
    fn ids_and_digests() {
        let id = new_id("q_");
        check_id(&id, "q_").unwrap();
        assert!(check_id(&id, "p_").is_err());
        assert!(check_id("q_", "q_").is_err());
        assert!(check_id("q_a b", "q_").is_err());
        let d = Digest::of(b"abc");
        assert_eq!(Digest::try_from(d.to_string()).unwrap(), d);
        assert!(Digest::try_from("sha256:abc".to_string()).is_err());
    }
}
