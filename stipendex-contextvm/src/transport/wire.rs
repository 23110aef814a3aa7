//! The events of ContextVM's transport, as the TypeScript SDK 0.11.14 writes and reads them
//! (`docs/research/contextvm-sdk-0.11.14.md` §1, which cites the SDK's code line by line):
//!
//! - an MCP JSON-RPC message is a kind [`MESSAGE`] (25910) event whose content is the message
//!   as JSON, tagged `["p", <recipient>]` (and, for a response or a notification about a
//!   request, `["e", <the request event's id>]`), signed by the sender's key;
//! - encrypted (CEP-4), that signed event is wrapped whole: NIP-44 v2 of its JSON under the
//!   conversation key of a fresh random key and the recipient's, in a kind [`GIFT_WRAP`] (1059)
//!   or [`EPHEMERAL_GIFT_WRAP`] (21059, CEP-19) event signed by the random key and tagged only
//!   `["p", <recipient>]` — a single layer, not NIP-59's seal and rumor;
//! - opening a wrap decrypts it, then checks the inner event's own signature and kind, and that
//!   it is addressed to the opener: nothing from a relay is taken on its word.

use nostr::nips::nip44;
use nostr::{Event, EventBuilder, JsonUtil as _, Keys, Kind, PublicKey, Tag, TagKind};
use serde_json::Value;

use crate::Error;

/// The kind of an MCP JSON-RPC message.
pub const MESSAGE: u16 = 25910;
/// The kind of a gift wrap kept by relays (CEP-4).
pub const GIFT_WRAP: u16 = 1059;
/// The kind of a gift wrap in the ephemeral range, not stored by relays (CEP-19).
pub const EPHEMERAL_GIFT_WRAP: u16 = 21059;
/// Server announcement kinds (public, replaceable, never encrypted): the server's
/// `initialize` result, then its tools, resources, resource templates and prompts lists.
pub const ANNOUNCEMENTS: [u16; 5] = [11316, 11317, 11318, 11319, 11320];

/// A capability tag: the sender can read encrypted messages.
pub const SUPPORT_ENCRYPTION: &str = "support_encryption";
/// A capability tag: the sender can read ephemeral gift wraps (kind 21059).
pub const SUPPORT_ENCRYPTION_EPHEMERAL: &str = "support_encryption_ephemeral";
/// A payment method identifier the sender handles (CEP-8), one tag per PMI.
pub const PMI: &str = "pmi";
/// CEP-8's session negotiation tag: the payment lifecycle a client asks for on its first
/// message (`transparent`, `explicit_gating`), and the one a server discloses on its first
/// answer.
pub const PAYMENT_INTERACTION: &str = "payment_interaction";

/// Which gift wrap to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wrap {
    /// Kind 1059: relays keep it.
    Persistent,
    /// Kind 21059: relays forward it without keeping it.
    Ephemeral,
}

impl Wrap {
    /// The wrap's kind.
    #[must_use]
    pub fn kind(self) -> u16 {
        match self {
            Wrap::Persistent => GIFT_WRAP,
            Wrap::Ephemeral => EPHEMERAL_GIFT_WRAP,
        }
    }
}

fn nostr_err(e: impl std::fmt::Display) -> Error {
    Error::Nostr(e.to_string())
}

/// A signed kind 25910 event carrying `message` (a JSON-RPC request, response or notification)
/// from `keys` to `to`, with `extra` tags after the `p` tag (`["e", …]` for an answer,
/// capability and `pmi` tags).
///
/// # Errors
/// [`Error::Nostr`] if it cannot be signed.
pub fn message(
    keys: &Keys,
    to: &PublicKey,
    message: &Value,
    extra: Vec<Tag>,
) -> Result<Event, Error> {
    let mut tags = vec![Tag::public_key(*to)];
    tags.extend(extra);
    EventBuilder::new(Kind::from(MESSAGE), message.to_string())
        .tags(tags)
        .sign_with_keys(keys)
        .map_err(nostr_err)
}

/// `event` wrapped for `to`: NIP-44 v2 of its JSON from a fresh random key, in a `wrap` event
/// signed by that key and tagged only `["p", to]`.
///
/// # Errors
/// [`Error::Nostr`] if it cannot be encrypted or signed.
pub fn wrap(event: &Event, to: &PublicKey, wrap: Wrap) -> Result<Event, Error> {
    let ephemeral = Keys::generate();
    let content = nip44::encrypt(
        ephemeral.secret_key(),
        to,
        event.as_json(),
        nip44::Version::V2,
    )
    .map_err(nostr_err)?;
    EventBuilder::new(Kind::from(wrap.kind()), content)
        .tag(Tag::public_key(*to))
        .sign_with_keys(&ephemeral)
        .map_err(nostr_err)
}

/// Opens a gift wrap addressed to `keys`: the wrap's own signature, then the inner event —
/// decrypted, its signature checked, a kind 25910 message tagged to `keys`.
///
/// # Errors
/// [`Error::Refused`] for a wrap or inner event that is not one (another kind, another
/// recipient, a bad signature, content that is not an event); [`Error::Nostr`] if it cannot be
/// decrypted.
pub fn unwrap(keys: &Keys, wrapped: &Event) -> Result<Event, Error> {
    let kind = wrapped.kind.as_u16();
    if kind != GIFT_WRAP && kind != EPHEMERAL_GIFT_WRAP {
        return Err(Error::Refused(format!(
            "kind {kind} is not a gift wrap ({GIFT_WRAP} or {EPHEMERAL_GIFT_WRAP})"
        )));
    }
    wrapped
        .verify()
        .map_err(|e| Error::Refused(format!("the gift wrap's signature: {e}")))?;
    let json =
        nip44::decrypt(keys.secret_key(), &wrapped.pubkey, &wrapped.content).map_err(nostr_err)?;
    let inner = Event::from_json(&json)
        .map_err(|e| Error::Refused(format!("the gift wrap does not hold an event: {e}")))?;
    inner
        .verify()
        .map_err(|e| Error::Refused(format!("the wrapped event's signature: {e}")))?;
    if inner.kind.as_u16() != MESSAGE {
        return Err(Error::Refused(format!(
            "the wrapped event is of kind {}, not a message ({MESSAGE})",
            inner.kind.as_u16()
        )));
    }
    if recipient(&inner) != Some(keys.public_key()) {
        return Err(Error::Refused(
            "the wrapped message is addressed to another key".into(),
        ));
    }
    Ok(inner)
}

/// Opens what a relay delivered to `keys`: a plain kind 25910 message (its signature checked,
/// addressed to `keys`) or a gift wrap ([`unwrap`]). Returns the message and the wrap it came
/// in (`None` for a plain one).
///
/// # Errors
/// As [`unwrap`]; [`Error::Refused`] for a plain event of another kind, another recipient or a
/// bad signature.
pub fn open(keys: &Keys, event: &Event) -> Result<(Event, Option<Wrap>), Error> {
    match event.kind.as_u16() {
        GIFT_WRAP => Ok((unwrap(keys, event)?, Some(Wrap::Persistent))),
        EPHEMERAL_GIFT_WRAP => Ok((unwrap(keys, event)?, Some(Wrap::Ephemeral))),
        MESSAGE => {
            event
                .verify()
                .map_err(|e| Error::Refused(format!("the message's signature: {e}")))?;
            if recipient(event) != Some(keys.public_key()) {
                return Err(Error::Refused(
                    "the message is addressed to another key".into(),
                ));
            }
            Ok((event.clone(), None))
        }
        k => Err(Error::Refused(format!(
            "kind {k} is not a ContextVM message"
        ))),
    }
}

/// `message` as it goes to `to`: wrapped with `wrap`, or as it is (`None`).
///
/// # Errors
/// As [`wrap`].
pub fn seal(message: Event, to: &PublicKey, how: Option<Wrap>) -> Result<Event, Error> {
    match how {
        Some(w) => wrap(&message, to, w),
        None => Ok(message),
    }
}

/// The values of the `pmi` tags, in order.
#[must_use]
pub fn pmis(event: &Event) -> Vec<String> {
    event
        .tags
        .iter()
        .filter(|t| t.kind() == TagKind::custom(PMI))
        .filter_map(|t| t.content().map(str::to_owned))
        .collect()
}

/// Sets `message`'s top-level `key` (a JSON-RPC message is an object; anything else is left
/// as it is).
pub(crate) fn set(message: &mut Value, key: &str, v: Value) {
    if let Some(m) = message.as_object_mut() {
        m.insert(key.to_owned(), v);
    }
}

/// The value of the first `name` tag with a value (`["payment_interaction", "explicit_gating"]`).
#[must_use]
pub fn tag_value(event: &Event, name: &str) -> Option<String> {
    event
        .tags
        .iter()
        .find(|t| t.kind() == TagKind::custom(name))
        .and_then(|t| t.content().map(str::to_owned))
}

/// A `["pmi", pmi]` tag.
#[must_use]
pub fn pmi_tag(pmi: &str) -> Tag {
    Tag::custom(TagKind::custom(PMI), [pmi])
}

/// The recipient a message names (its first `p` tag).
#[must_use]
pub fn recipient(event: &Event) -> Option<PublicKey> {
    event.tags.public_keys().next().copied()
}

/// The request event a message answers (its first `e` tag), if any.
#[must_use]
pub fn answers(event: &Event) -> Option<nostr::EventId> {
    event.tags.event_ids().next().copied()
}

/// Whether a message carries the single-element capability tag `name`.
#[must_use]
pub fn has_capability(event: &Event, name: &str) -> bool {
    event
        .tags
        .iter()
        .any(|t| t.kind() == TagKind::custom(name) && t.as_slice().len() == 1)
}

/// A single-element capability tag (`["support_encryption"]`).
#[must_use]
pub fn capability(name: &str) -> Tag {
    Tag::custom(TagKind::custom(name), Vec::<String>::new())
}

/// The largest message content a peer reads (a relay's limit is usually lower): anything
/// longer is refused before it is parsed.
pub const MAX_MESSAGE: usize = 512 * 1024;

/// The JSON-RPC message a kind 25910 event carries.
///
/// # Errors
/// [`Error::Refused`] if its content is longer than [`MAX_MESSAGE`] or not JSON.
pub fn json_rpc(event: &Event) -> Result<Value, Error> {
    if event.content.len() > MAX_MESSAGE {
        return Err(Error::Refused(format!(
            "a message of {} bytes (at most {MAX_MESSAGE})",
            event.content.len()
        )));
    }
    serde_json::from_str(&event.content)
        .map_err(|e| Error::Refused(format!("a message whose content is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    fn request() -> Value {
        json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "search"}})
    }

    #[test]
    fn a_message_round_trips_through_either_wrap() {
        let (client, server) = (Keys::generate(), Keys::generate());
        let inner = message(
            &client,
            &server.public_key(),
            &request(),
            vec![
                capability(SUPPORT_ENCRYPTION),
                Tag::custom(TagKind::custom(PMI), ["bitcoin-lightning-bolt11"]),
            ],
        )
        .unwrap();
        assert!(has_capability(&inner, SUPPORT_ENCRYPTION));
        assert!(!has_capability(&inner, SUPPORT_ENCRYPTION_EPHEMERAL));
        for w in [Wrap::Persistent, Wrap::Ephemeral] {
            let wrapped = wrap(&inner, &server.public_key(), w).unwrap();
            assert_eq!(wrapped.kind.as_u16(), w.kind());
            assert_ne!(
                wrapped.pubkey,
                client.public_key(),
                "the wrap hides the sender"
            );
            assert_eq!(recipient(&wrapped), Some(server.public_key()));
            assert_eq!(wrapped.tags.len(), 1, "the wrap carries only its p tag");
            let opened = unwrap(&server, &wrapped).unwrap();
            assert_eq!(opened, inner);
            assert_eq!(json_rpc(&opened).unwrap(), request());
            assert_eq!(opened.pubkey, client.public_key());
        }
        // An answer names the request it answers.
        let answer = message(
            &server,
            &client.public_key(),
            &json!({"jsonrpc": "2.0", "id": 7, "result": {}}),
            vec![Tag::event(inner.id)],
        )
        .unwrap();
        assert_eq!(answers(&answer), Some(inner.id));
    }

    #[test]
    fn an_oversized_message_is_refused_before_it_is_parsed() {
        let (client, server) = (Keys::generate(), Keys::generate());
        let big = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "x", "arguments": {"q": "a".repeat(MAX_MESSAGE)}}});
        let ev = message(&client, &server.public_key(), &big, Vec::new()).unwrap();
        let err = json_rpc(&ev).unwrap_err();
        assert_eq!(err.code(), "refused");
        assert!(err.to_string().contains("at most"), "{err}");
        let small = message(&client, &server.public_key(), &request(), Vec::new()).unwrap();
        assert_eq!(json_rpc(&small).unwrap(), request());
    }

    #[test]
    fn a_wrap_for_another_key_a_forged_inner_event_or_another_kind_is_refused() {
        let (client, server, mallory) = (Keys::generate(), Keys::generate(), Keys::generate());
        let inner = message(&client, &server.public_key(), &request(), Vec::new()).unwrap();
        // Wrapped for the server: mallory cannot open it.
        let wrapped = wrap(&inner, &server.public_key(), Wrap::Ephemeral).unwrap();
        assert!(unwrap(&mallory, &wrapped).is_err());
        // A message addressed to mallory, wrapped for the server: refused (relayed).
        let to_mallory = message(&client, &mallory.public_key(), &request(), Vec::new()).unwrap();
        let relayed = wrap(&to_mallory, &server.public_key(), Wrap::Persistent).unwrap();
        assert_eq!(unwrap(&server, &relayed).unwrap_err().code(), "refused");
        // An inner event whose content was changed after signing.
        let mut forged: Value = serde_json::from_str(&inner.as_json()).unwrap();
        forged["content"] = Value::String(json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "delete_all"}}).to_string());
        let ephemeral = Keys::generate();
        let content = nip44::encrypt(
            ephemeral.secret_key(),
            &server.public_key(),
            forged.to_string(),
            nip44::Version::V2,
        )
        .unwrap();
        let forged_wrap = EventBuilder::new(Kind::from(GIFT_WRAP), content)
            .tag(Tag::public_key(server.public_key()))
            .sign_with_keys(&ephemeral)
            .unwrap();
        assert_eq!(unwrap(&server, &forged_wrap).unwrap_err().code(), "refused");
        // A plain message is not a wrap.
        assert_eq!(unwrap(&server, &inner).unwrap_err().code(), "refused");
    }
}
