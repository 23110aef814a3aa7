//! NIP-47 events on the wire: sealing (NIP-44 v2 or NIP-04) and building the four event kinds,
//! and opening what arrives (signature checked first). Shared by the client and the devnet's
//! wallet service.

use std::time::Duration;

use nostr::nips::{nip04, nip44};
use nostr::prelude::*;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::nip47::{
    Encryption, KIND_INFO, KIND_NOTIFICATION, KIND_NOTIFICATION_NIP04, KIND_REQUEST, KIND_RESPONSE,
};

/// Why an event could not be sealed or opened.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The event's id or signature does not verify.
    #[error("event signature or id does not verify")]
    BadEvent,
    /// Encryption or decryption failed.
    #[error("payload encryption: {0}")]
    Crypto(String),
    /// The decrypted content is not the expected JSON.
    #[error("malformed content: {0}")]
    Content(String),
    /// Building or signing the event failed.
    #[error("event: {0}")]
    Build(String),
}

/// The `encryption` tag of an event: `None` when absent (legacy NIP-04 peers), `Some(None)`
/// when present with a value this version does not know.
#[must_use]
pub fn encryption_tag(ev: &Event) -> Option<Option<Encryption>> {
    ev.tags
        .find(TagKind::custom("encryption"))
        .map(|t| t.content().and_then(Encryption::parse))
}

/// Encrypts `plaintext` from `keys` to `peer`.
///
/// # Errors
/// [`WireError::Crypto`].
pub fn seal(
    keys: &Keys,
    peer: &PublicKey,
    enc: Encryption,
    plaintext: &str,
) -> Result<String, WireError> {
    match enc {
        Encryption::Nip44V2 => {
            nip44::encrypt(keys.secret_key(), peer, plaintext, nip44::Version::V2)
                .map_err(|e| WireError::Crypto(e.to_string()))
        }
        Encryption::Nip04 => nip04::encrypt(keys.secret_key(), peer, plaintext)
            .map_err(|e| WireError::Crypto(e.to_string())),
    }
}

/// Decrypts `ciphertext` sent by `peer` to `keys`.
///
/// # Errors
/// [`WireError::Crypto`].
pub fn unseal(
    keys: &Keys,
    peer: &PublicKey,
    enc: Encryption,
    ciphertext: &str,
) -> Result<String, WireError> {
    match enc {
        Encryption::Nip44V2 => nip44::decrypt(keys.secret_key(), peer, ciphertext)
            .map_err(|e| WireError::Crypto(e.to_string())),
        Encryption::Nip04 => nip04::decrypt(keys.secret_key(), peer, ciphertext)
            .map_err(|e| WireError::Crypto(e.to_string())),
    }
}

fn encryption(enc: Encryption) -> Tag {
    Tag::custom(TagKind::custom("encryption"), [enc.as_str()])
}

fn json<T: Serialize>(v: &T) -> Result<String, WireError> {
    serde_json::to_string(v).map_err(|e| WireError::Content(e.to_string()))
}

/// A request (kind 23194) from the client `keys` to the wallet service `wallet`, expiring after
/// `ttl`.
///
/// # Errors
/// [`WireError`].
pub fn request_event<T: Serialize>(
    keys: &Keys,
    wallet: &PublicKey,
    enc: Encryption,
    content: &T,
    ttl: Duration,
) -> Result<Event, WireError> {
    EventBuilder::new(
        Kind::from(KIND_REQUEST),
        seal(keys, wallet, enc, &json(content)?)?,
    )
    .tag(Tag::public_key(*wallet))
    .tag(encryption(enc))
    .tag(Tag::expiration(Timestamp::now() + ttl))
    .sign_with_keys(keys)
    .map_err(|e| WireError::Build(e.to_string()))
}

/// A response (kind 23195) from the wallet service `keys` to `client`, for `request`.
///
/// # Errors
/// [`WireError`].
pub fn response_event<T: Serialize>(
    keys: &Keys,
    client: &PublicKey,
    request: EventId,
    enc: Encryption,
    content: &T,
) -> Result<Event, WireError> {
    EventBuilder::new(
        Kind::from(KIND_RESPONSE),
        seal(keys, client, enc, &json(content)?)?,
    )
    .tag(Tag::public_key(*client))
    .tag(Tag::event(request))
    .tag(encryption(enc))
    .sign_with_keys(keys)
    .map_err(|e| WireError::Build(e.to_string()))
}

/// A notification from the wallet service `keys` to `client`: kind 23197 with NIP-44, 23196
/// with NIP-04.
///
/// # Errors
/// [`WireError`].
pub fn notification_event<T: Serialize>(
    keys: &Keys,
    client: &PublicKey,
    enc: Encryption,
    content: &T,
) -> Result<Event, WireError> {
    let kind = match enc {
        Encryption::Nip44V2 => KIND_NOTIFICATION,
        Encryption::Nip04 => KIND_NOTIFICATION_NIP04,
    };
    EventBuilder::new(Kind::from(kind), seal(keys, client, enc, &json(content)?)?)
        .tag(Tag::public_key(*client))
        .tag(encryption(enc))
        .sign_with_keys(keys)
        .map_err(|e| WireError::Build(e.to_string()))
}

/// The info event (kind 13194) of the wallet service `keys`: its methods, encryptions and
/// notification types.
///
/// # Errors
/// [`WireError`].
pub fn info_event(
    keys: &Keys,
    methods: &[&str],
    encryptions: &[Encryption],
    notifications: &[&str],
) -> Result<Event, WireError> {
    let enc: Vec<&str> = encryptions.iter().map(|e| e.as_str()).collect();
    EventBuilder::new(Kind::from(KIND_INFO), methods.join(" "))
        .tag(Tag::custom(TagKind::custom("encryption"), [enc.join(" ")]))
        .tag(Tag::custom(
            TagKind::custom("notifications"),
            [notifications.join(" ")],
        ))
        .sign_with_keys(keys)
        .map_err(|e| WireError::Build(e.to_string()))
}

/// Checks `ev`'s id and signature, then decrypts and parses its content as `T` (sent by its
/// author to `keys`).
///
/// # Errors
/// [`WireError`].
pub fn open<T: DeserializeOwned>(keys: &Keys, ev: &Event, enc: Encryption) -> Result<T, WireError> {
    ev.verify().map_err(|_| WireError::BadEvent)?;
    let plain = unseal(keys, &ev.pubkey, enc, &ev.content)?;
    serde_json::from_str(&plain).map_err(|e| WireError::Content(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nip47::Request;

    #[test]
    fn requests_round_trip_in_both_encryptions_and_tampering_is_refused() {
        let (app, wallet) = (Keys::generate(), Keys::generate());
        for enc in [Encryption::Nip44V2, Encryption::Nip04] {
            let req = Request {
                method: "get_balance".into(),
                params: serde_json::json!({}),
            };
            let ev = request_event(
                &app,
                &wallet.public_key(),
                enc,
                &req,
                Duration::from_secs(30),
            )
            .unwrap();
            assert_eq!(encryption_tag(&ev), Some(Some(enc)));
            let back: Request = open(&wallet, &ev, enc).unwrap();
            assert_eq!(back, req);
            // Another key cannot read it.
            assert!(open::<Request>(&Keys::generate(), &ev, enc).is_err());
            // A changed content breaks the id.
            let mut forged = ev.clone();
            forged.content.push('A');
            assert_eq!(
                open::<Request>(&wallet, &forged, enc),
                Err(WireError::BadEvent)
            );
        }
    }
}
