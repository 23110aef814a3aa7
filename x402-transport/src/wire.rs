//! The envelope every scheme shares, and the one x402 codec of the workspace: header names,
//! the base64-of-JSON header codec ([`encode_header`], [`decode_header`], [`HeaderError`]), the
//! `x402Version` numbers ([`V1`], [`V2`]), the paid resource ([`ResourceInfo`]) and the 402 body
//! ([`PaymentRequired`], [`PaymentRequiredV1`]) whose `accepts[]` entries each scheme writes.
//!
//! The 402 bodies are generic over their entry type: [`Entry`] (each scheme's JSON, as
//! written) by default, or a scheme's typed requirements (`rail_x402::wire::PaymentRequired` is
//! `PaymentRequired<PaymentRequirements>`), so that a scheme keeps its typed payloads and
//! nothing else of the envelope.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// `PAYMENT-REQUIRED`: base64 of the 402 body's JSON.
pub const PAYMENT_REQUIRED: &str = "payment-required";
/// `PAYMENT-SIGNATURE`: base64 of the payment envelope's JSON (v2).
pub const PAYMENT_SIGNATURE: &str = "payment-signature";
/// `PAYMENT-RESPONSE`: base64 of the settlement's JSON.
pub const PAYMENT_RESPONSE: &str = "payment-response";
/// `X-PAYMENT` (v1).
pub const X_PAYMENT: &str = "x-payment";
/// `X-PAYMENT-RESPONSE` (v1).
pub const X_PAYMENT_RESPONSE: &str = "x-payment-response";
/// `params._meta` key of an MCP payment.
pub const PAYMENT_META: &str = "x402/payment";
/// `result._meta` key of an MCP settlement.
pub const PAYMENT_RESPONSE_META: &str = "x402/payment-response";
/// The `error` of a 402 for a request that carried no payment (x402's reference text).
pub const PAYMENT_REQUIRED_ERROR: &str = "Payment required";
/// The longest header value the decoders look at, in bytes (base64 text).
pub const MAX_HEADER_LEN: usize = 64 * 1024;
/// `Retry-After` of a 503 (seconds): the outcome is unknown, send the same payment again.
pub const RETRY_AFTER_SECS: u64 = 2;

const DECODER: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Why a header value could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Longer than [`MAX_HEADER_LEN`].
    #[error("header value is {len} bytes, at most {max} are accepted")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not standard base64.
    #[error("header value is not base64: {0}")]
    Base64(#[from] base64::DecodeError),
    /// A JSON `x402Version` other than the decoder's.
    #[error("unsupported x402Version {found}, expected {expected}")]
    UnsupportedVersion {
        /// The version in the message.
        found: u64,
        /// The version this decoder reads.
        expected: u8,
    },
    /// Not the expected JSON.
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Serialization failed.
    #[error("could not encode JSON: {0}")]
    Encode(#[source] serde_json::Error),
}

impl HeaderError {
    /// The reason code the reference SDKs use for this failure: `invalid_x402_version` for a
    /// version mismatch, `invalid_payload` otherwise.
    #[must_use]
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::UnsupportedVersion { .. } => "invalid_x402_version",
            _ => "invalid_payload",
        }
    }
}

#[derive(Deserialize)]
struct VersionProbe {
    #[serde(rename = "x402Version")]
    x402_version: Option<u64>,
}

/// A header value → `T`, strictly: at most [`MAX_HEADER_LEN`] bytes (checked before decoding),
/// standard base64 (padding optional, no surrounding whitespace), JSON; with `version`, a
/// different `x402Version` is refused ([`HeaderError::UnsupportedVersion`]) before anything
/// else is read.
///
/// # Errors
/// [`HeaderError`].
pub fn decode_header<T: DeserializeOwned>(
    header: &str,
    version: Option<u8>,
) -> Result<T, HeaderError> {
    if header.len() > MAX_HEADER_LEN {
        return Err(HeaderError::TooLong {
            len: header.len(),
            max: MAX_HEADER_LEN,
        });
    }
    let json = DECODER.decode(header)?;
    if let Some(expected) = version
        && let Ok(VersionProbe {
            x402_version: Some(found),
        }) = serde_json::from_slice::<VersionProbe>(&json)
        && found != u64::from(expected)
    {
        return Err(HeaderError::UnsupportedVersion { found, expected });
    }
    Ok(serde_json::from_slice(&json)?)
}

/// `value` → JSON → padded standard base64: a header value as the reference SDKs write it.
///
/// # Errors
/// [`HeaderError::Encode`] if `value` does not serialize.
pub fn encode_header<T: Serialize + ?Sized>(value: &T) -> Result<String, HeaderError> {
    encode_base64_json(value).map_err(HeaderError::Encode)
}

/// Base64 (standard alphabet, padding optional, surrounding whitespace ignored) of JSON → `T`,
/// any `x402Version`: [`decode_header`] for a value read from elsewhere than an HTTP header.
///
/// # Errors
/// [`HeaderError`].
pub fn decode_base64_json<T: DeserializeOwned>(header: &str) -> Result<T, HeaderError> {
    decode_header(header.trim(), None)
}

/// `T` → JSON → padded standard base64, as the reference SDKs write headers.
///
/// # Errors
/// Only if `T` does not serialize.
pub fn encode_base64_json<T: Serialize + ?Sized>(value: &T) -> Result<String, serde_json::Error> {
    Ok(base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(value)?))
}

/// Padded standard base64 of `bytes`.
#[must_use]
pub fn encode_base64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// The `x402Version` number `N`: serializes as the JSON number `N` and refuses any other value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct X402Version<const N: u8>;

/// `x402Version: 1`.
pub type V1 = X402Version<1>;
/// `x402Version: 2`.
pub type V2 = X402Version<2>;

impl<const N: u8> X402Version<N> {
    /// The version number.
    pub const NUMBER: u8 = N;
}

impl<const N: u8> Serialize for X402Version<N> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u8(N)
    }
}

impl<'de, const N: u8> Deserialize<'de> for X402Version<N> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let found = u64::deserialize(deserializer)?;
        if found == u64::from(N) {
            Ok(Self)
        } else {
            Err(serde::de::Error::custom(format_args!(
                "unsupported x402Version {found}, expected {N}"
            )))
        }
    }
}

fn non_empty<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let s = String::deserialize(deserializer)?;
    if s.is_empty() {
        return Err(serde::de::Error::custom("empty string"));
    }
    Ok(s)
}

fn non_empty_vec<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    let v = Vec::<T>::deserialize(deserializer)?;
    if v.is_empty() {
        return Err(serde::de::Error::custom("accepts must not be empty"));
    }
    Ok(v)
}

/// One `accepts[]` entry, exactly as its scheme serialized it: the transport never re-orders
/// or re-encodes a scheme's members (an EVM entry is byte for byte x402's, an exact-algo entry
/// that of `docs/exact-algo.md` §2.2).
pub type Entry = Box<RawValue>;

/// `value` as an [`Entry`].
///
/// # Errors
/// Only if `value` does not serialize.
pub fn entry<T: Serialize + ?Sized>(value: &T) -> Result<Entry, serde_json::Error> {
    serde_json::value::to_raw_value(value)
}

/// An [`Entry`] as JSON, `None` if it is not JSON (it always is when a scheme wrote it).
#[must_use]
pub fn entry_value(entry: &RawValue) -> Option<Value> {
    serde_json::from_str(entry.get()).ok()
}

/// The paid resource (`resource` of a v2 402, echoed in a payment), decoded strictly:
/// unknown members are refused, `url` is not empty.
///
/// `serviceName`, `tags` and `iconUrl` are optional members the reference SDK (2.27) sends
/// besides the three of the specification; a client echoes the object back in its payload.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceInfo {
    /// URL of the paid resource.
    #[serde(deserialize_with = "non_empty")]
    pub url: String,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The MIME type of the paid answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// Short service name (reference SDK extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// Tags (reference SDK extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// Icon URL (reference SDK extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icon_url: Option<String>,
}

impl ResourceInfo {
    /// A resource with only its URL.
    #[must_use]
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            description: None,
            mime_type: None,
            service_name: None,
            tags: None,
            icon_url: None,
        }
    }
}

/// How two `accepts[]` entries compare: [`Entry`] by its JSON text (as written), a scheme's
/// typed requirements by value.
pub trait SameEntry {
    /// Whether `self` and `other` are the same entry.
    fn same(&self, other: &Self) -> bool;
}

impl SameEntry for Entry {
    fn same(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

fn same_entries<E: SameEntry>(a: &[E], b: &[E]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y))
}

/// The 402 body of every scheme: x402 v2's `PaymentRequired`, whose `accepts[]` entries each scheme
/// writes ([`crate::Scheme::requirements`]); `E` is [`Entry`] (any scheme, as written) or one
/// scheme's typed requirements. Serialized member order: `x402Version`, `error`, `reason`,
/// `resource`, `accepts`, `extensions` — byte for byte x402 v2's for an EVM route, and that of
/// `docs/exact-algo.md` §2.1 for an exact-algo route (no `resource`; `reason` only with a refusal
/// that has a finer code). Unknown top-level members are ignored (a newer server still parses);
/// `accepts` is never empty.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "E: Deserialize<'de>"))]
pub struct PaymentRequired<E = Entry> {
    /// 2.
    pub x402_version: V2,
    /// Why a payment is required: the unpaid text, or a refusal's code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// A refusal's finer code, when its scheme has one beyond `error`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The paid resource (x402 v2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceInfo>,
    /// The ways to pay, one entry per scheme, in the receiver's order of preference.
    #[serde(deserialize_with = "non_empty_vec")]
    pub accepts: Vec<E>,
    /// Protocol extensions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Map<String, Value>>,
}

impl<E: SameEntry> PartialEq for PaymentRequired<E> {
    fn eq(&self, other: &Self) -> bool {
        self.x402_version == other.x402_version
            && self.error == other.error
            && self.reason == other.reason
            && self.resource == other.resource
            && same_entries(&self.accepts, &other.accepts)
            && self.extensions == other.extensions
    }
}

impl<E: SameEntry> Eq for PaymentRequired<E> {}

impl<E: Serialize + DeserializeOwned> PaymentRequired<E> {
    /// The `PAYMENT-REQUIRED` header value.
    ///
    /// # Errors
    /// [`HeaderError::Encode`] if a value does not serialize.
    pub fn to_header(&self) -> Result<String, HeaderError> {
        encode_header(self)
    }

    /// Reads a `PAYMENT-REQUIRED` header value ([`decode_header`]); a v1 message is refused,
    /// not converted.
    ///
    /// # Errors
    /// [`HeaderError`].
    pub fn from_header(header: &str) -> Result<Self, HeaderError> {
        decode_header(header, Some(V2::NUMBER))
    }
}

impl PaymentRequired {
    /// The entries as JSON (for reading them; the 402 sends them as written).
    #[must_use]
    pub fn entries(&self) -> Vec<Value> {
        self.accepts.iter().filter_map(|e| entry_value(e)).collect()
    }
}

/// The v1 402 body (`x402Version: 1`): v1 clients read it from the body; `E` as in
/// [`PaymentRequired`].
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequiredV1<E = Entry> {
    /// 1.
    pub x402_version: V1,
    /// Why a payment is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The v1 entries.
    pub accepts: Vec<E>,
}

impl<E: SameEntry> PartialEq for PaymentRequiredV1<E> {
    fn eq(&self, other: &Self) -> bool {
        self.x402_version == other.x402_version
            && self.error == other.error
            && same_entries(&self.accepts, &other.accepts)
    }
}

impl<E: SameEntry> Eq for PaymentRequiredV1<E> {}

impl PaymentRequiredV1 {
    /// The entries as JSON.
    #[must_use]
    pub fn entries(&self) -> Vec<Value> {
        self.accepts.iter().filter_map(|e| entry_value(e)).collect()
    }
}

/// The scheme and network an envelope names: `accepted.scheme` / `accepted.network` (x402 v2)
/// or top-level `scheme` / `network` (x402 v1, exact-algo).
#[must_use]
pub fn scheme_and_network(envelope: &Value) -> Option<(&str, &str)> {
    let from = envelope.get("accepted").unwrap_or(envelope);
    Some((
        from.get("scheme")?.as_str()?,
        from.get("network")?.as_str()?,
    ))
}

/// The payment requirement of an MCP tool result given as JSON (`{"isError": true, …}`), looked
/// for in the x402 MCP convention's order: `structuredContent`, its `x402/error.data`, then
/// the first text content parsed as JSON. `None` unless `isError` and it has `accepts`. (No
/// MCP SDK needed: a wallet reads results its host hands it.)
#[must_use]
pub fn payment_required_in_tool_result(result: &Value) -> Option<Value> {
    if result.get("isError").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    let pick = |v: &Value| -> Option<Value> {
        if v.get("accepts").is_some_and(Value::is_array) {
            return Some(v.clone());
        }
        v.pointer("/x402~1error/data")
            .filter(|d| d.get("accepts").is_some_and(Value::is_array))
            .cloned()
    };
    if let Some(found) = result.get("structuredContent").and_then(pick) {
        return Some(found);
    }
    let text = result.pointer("/content/0/text")?.as_str()?;
    pick(&serde_json::from_str(text).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn bodies_keep_each_schemes_member_order() {
        let seed = PaymentRequired {
            x402_version: V2::default(),
            error: Some("payment required".into()),
            reason: None,
            resource: None,
            accepts: vec![entry(&json!({"scheme": "exact"})).unwrap()],
            extensions: None,
        };
        assert_eq!(
            serde_json::to_string(&seed).unwrap(),
            r#"{"x402Version":2,"error":"payment required","accepts":[{"scheme":"exact"}]}"#
        );
        let v2 = PaymentRequired {
            resource: Some(ResourceInfo {
                description: Some("d".into()),
                ..ResourceInfo::new("http://h/w")
            }),
            error: Some("Payment required".into()),
            ..seed
        };
        assert_eq!(
            serde_json::to_string(&v2).unwrap(),
            r#"{"x402Version":2,"error":"Payment required","resource":{"url":"http://h/w","description":"d"},"accepts":[{"scheme":"exact"}]}"#
        );
    }

    #[test]
    fn headers_round_trip_and_refuse_garbage() {
        let h = encode_base64_json(&json!({"a": 1})).unwrap();
        assert_eq!(decode_base64_json::<Value>(&h).unwrap(), json!({"a": 1}));
        assert_eq!(
            decode_base64_json::<Value>(h.trim_end_matches('=')).unwrap(),
            json!({"a": 1})
        );
        assert!(matches!(
            decode_base64_json::<Value>("!!"),
            Err(HeaderError::Base64(_))
        ));
        let long = "A".repeat(MAX_HEADER_LEN + 4);
        assert!(matches!(
            decode_base64_json::<Value>(&long),
            Err(HeaderError::TooLong { .. })
        ));
    }

    #[test]
    fn envelopes_name_their_scheme_either_way() {
        let v2 = json!({"x402Version": 2, "accepted": {"scheme": "exact", "network": "eip155:1"}});
        assert_eq!(scheme_and_network(&v2), Some(("exact", "eip155:1")));
        let seed = json!({"x402Version": 2, "scheme": "exact", "network": "algorand:x"});
        assert_eq!(scheme_and_network(&seed), Some(("exact", "algorand:x")));
        assert_eq!(scheme_and_network(&json!({})), None);
    }
}
