//! The envelope both schemes share: header names, base64-of-JSON codecs, and the 402 body
//! (`PaymentRequired`) whose `accepts[]` entries each scheme writes.

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

/// Why a header value did not decode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Longer than [`MAX_HEADER_LEN`].
    #[error("header is {len} bytes, over {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Not base64.
    #[error("header is not base64: {0}")]
    Base64(#[from] base64::DecodeError),
    /// Not the expected JSON.
    #[error("header is not the expected JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// Base64 (standard alphabet, padding optional, surrounding whitespace ignored) of JSON → `T`.
///
/// # Errors
/// [`HeaderError`].
pub fn decode_base64_json<T: DeserializeOwned>(header: &str) -> Result<T, HeaderError> {
    let header = header.trim();
    if header.len() > MAX_HEADER_LEN {
        return Err(HeaderError::TooLong {
            len: header.len(),
            max: MAX_HEADER_LEN,
        });
    }
    Ok(serde_json::from_slice(&DECODER.decode(header)?)?)
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

/// One `accepts[]` entry, exactly as its scheme serialized it: the transport never re-orders
/// or re-encodes a scheme's members (an EVM entry is byte for byte x402's, an exact-algo entry
/// the seed's).
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

/// The paid resource (`resource` of a v2 402).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceInfo {
    /// Its URL.
    pub url: String,
    /// What it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The MIME type of the paid answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
}

/// The 402 body of every scheme: x402 v2's `PaymentRequired`, whose `accepts[]` entries each
/// scheme writes ([`crate::Scheme::requirements`]). Serialized member order: `x402Version`,
/// `error`, `reason`, `resource`, `accepts`, `extensions` — byte for byte x402 v2's for an EVM
/// route, and the exact-algo seed's for an exact-algo route (no `resource`; `reason` only with
/// a refusal that has a finer code).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequired {
    /// 2.
    pub x402_version: u8,
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
    pub accepts: Vec<Entry>,
    /// Protocol extensions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Map<String, Value>>,
}

fn same_entries(a: &[Entry], b: &[Entry]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.get() == y.get())
}

impl PartialEq for PaymentRequired {
    fn eq(&self, other: &Self) -> bool {
        self.x402_version == other.x402_version
            && self.error == other.error
            && self.reason == other.reason
            && self.resource == other.resource
            && same_entries(&self.accepts, &other.accepts)
            && self.extensions == other.extensions
    }
}

impl PaymentRequired {
    /// The `PAYMENT-REQUIRED` header value.
    ///
    /// # Errors
    /// Only if a value does not serialize.
    pub fn to_header(&self) -> Result<String, serde_json::Error> {
        encode_base64_json(self)
    }

    /// Reads a `PAYMENT-REQUIRED` header value (any scheme's entries, as JSON).
    ///
    /// # Errors
    /// [`HeaderError`].
    pub fn from_header(header: &str) -> Result<Self, HeaderError> {
        decode_base64_json(header)
    }
}

/// The v1 402 body (`x402Version: 1`): v1 clients read it from the body.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequiredV1 {
    /// 1.
    pub x402_version: u8,
    /// Why a payment is required.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The v1 entries.
    pub accepts: Vec<Entry>,
}

impl PaymentRequiredV1 {
    /// The entries as JSON.
    #[must_use]
    pub fn entries(&self) -> Vec<Value> {
        self.accepts.iter().filter_map(|e| entry_value(e)).collect()
    }
}

impl PaymentRequired {
    /// The entries as JSON (for reading them; the 402 sends them as written).
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
            x402_version: 2,
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
                url: "http://h/w".into(),
                description: Some("d".into()),
                mime_type: None,
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
