//! A Proof's answer record as it is stored (namespace `stipendex/<who>/answers`): the record
//! itself, its state name and its namespace's owner name. Below both the answers
//! ([`super::answers`]), which write and read it, and the bound on kept answers
//! ([`super::keep`]), which drops its body.

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The state name of an answer record.
pub(crate) const ANSWER_STATE: &str = "answer";

/// The name of `receiver` in its records' namespaces (`stipendex/<who>/…`): its id may hold
/// any character, so its hash names them.
pub(crate) fn who(receiver: &str) -> String {
    hex::encode(
        Sha256::digest(receiver.as_bytes())
            .get(..8)
            .unwrap_or_default(),
    )
}

/// What a paid request was answered: replayed as it is for the same Proof and request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    /// The status code (HTTP), or 200 for a transport without one.
    pub status: u16,
    /// The body's media type, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_type: Option<String>,
    /// The body.
    #[serde(with = "b64")]
    pub body: Vec<u8>,
    /// The Receipt (compact JWS), if the work succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
    /// Headers the answer carried beyond its content type and Receipt, replayed as they were:
    /// an x402 payment's `PAYMENT-RESPONSE` (name, value).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headers: Vec<(String, String)>,
}

impl Answer {
    /// A JSON answer: `body` as its text, `application/json`, with `receipt` if any (what the
    /// MCP and ContextVM bindings keep, and every binding's `outcome_unknown`).
    #[must_use]
    pub fn json(status: u16, body: &serde_json::Value, receipt: Option<String>) -> Self {
        Answer {
            status,
            content_type: Some("application/json".into()),
            body: body.to_string().into_bytes(),
            receipt,
            headers: Vec::new(),
        }
    }

    /// Nothing to keep (status 0): the answer was given once and is not replayed (too large
    /// to keep, or lost); the same payment again is `answer_gone`.
    #[must_use]
    pub fn nothing() -> Self {
        Answer {
            status: 0,
            content_type: None,
            body: Vec::new(),
            receipt: None,
            headers: Vec::new(),
        }
    }
}

mod b64 {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(b: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(b))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        STANDARD.decode(s).map_err(serde::de::Error::custom)
    }
}

/// The answer record: for which request it was given.
#[derive(Serialize, Deserialize)]
pub(super) struct Kept {
    pub(super) request: String,
    pub(super) answer: Answer,
    /// The body is not kept: why, and how long it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) dropped: Option<Dropped>,
}

/// Why an answer record holds no body.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(super) struct Dropped {
    /// The body's length.
    pub(super) bytes: u64,
    /// `true`: dropped to keep within the bound; `false`: over [`super::MAX_KEPT_ANSWER`].
    pub(super) bound: bool,
}

/// The answer record `value` without its body (dropped for the bound), if it has one.
pub(crate) fn without_body(value: &str) -> Option<String> {
    let mut k = serde_json::from_str::<Kept>(value).ok()?;
    if k.dropped.is_some() {
        return None;
    }
    k.dropped = Some(Dropped {
        bytes: k.answer.body.len() as u64,
        bound: true,
    });
    k.answer.body = Vec::new();
    serde_json::to_string(&k).ok()
}
