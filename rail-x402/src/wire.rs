//! x402 **v2** typed payloads of `exact` on EVM, as in `specs/x402-specification-v2.md` and
//! `specs/transports-v2/http.md` of the x402 repository, on the one envelope codec of the
//! workspace (`x402_transport::wire`: header names, base64 of JSON, versions, [`ResourceInfo`],
//! the 402 body); [`PaymentRequired`] is the transport's 402 body with typed entries.
//!
//! Field names and order follow the specification (camelCase JSON). Headers carry standard,
//! padded base64 of compact JSON, as the reference SDKs write them.
//!
//! Strictness:
//! - What a payer sends ([`PaymentPayload`], and the [`PaymentRequirements`] and [`ResourceInfo`]
//!   inside it) refuses unknown fields, duplicate fields, JSON numbers where the spec has
//!   strings (`amount`, `value`, `validAfter`, `validBefore`), and non-canonical spellings of
//!   signed values (see [`crate::fields`]). `extra` and `extensions` are open objects by
//!   definition and stay open.
//! - What servers and facilitators answer ([`PaymentRequired`]'s envelope, [`SettleResponse`],
//!   [`VerifyResponse`]) ignores unknown top-level fields, so a newer peer still parses.
//! - Versions are never mixed: these decoders refuse any `x402Version` but 2, and nothing here
//!   converts to or from the v1 types in [`crate::v1`].
//!
//! The payload type is the exact-EVM EIP-3009 form (`{signature, authorization}`); other schemes
//! and the exact-EVM Permit2 form (`permit2Authorization`) are refused at decode.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use x402_transport::wire::{SameEntry, decode_header, encode_header};

use crate::fields::{Bytes32Hex, ChecksumAddress, HexBytes, Uint256Decimal};

pub use x402_transport::wire::{
    HeaderError, MAX_HEADER_LEN, PAYMENT_REQUIRED_ERROR, ResourceInfo, V2, X402Version,
};

/// The scheme this crate implements.
pub const SCHEME_EXACT: &str = "exact";

fn non_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let s = String::deserialize(deserializer)?;
    if s.is_empty() {
        return Err(serde::de::Error::custom("empty string"));
    }
    Ok(s)
}

/// CAIP-2 as the reference validates it: at least 3 characters with a `:`.
fn caip2<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let s = String::deserialize(deserializer)?;
    if s.len() < 3 || !s.contains(':') {
        return Err(serde::de::Error::custom(format_args!(
            "network {s:?} is not CAIP-2 (namespace:reference, e.g. eip155:84532)"
        )));
    }
    Ok(s)
}

pub(crate) fn positive<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let n = u64::deserialize(deserializer)?;
    if n == 0 {
        return Err(serde::de::Error::custom(
            "maxTimeoutSeconds must be positive",
        ));
    }
    Ok(n)
}

/// `PaymentRequirements.extra`: for exact on EVM, the token's EIP-712 domain `name` and
/// `version`; any other member (e.g. the reference's `assetTransferMethod`) is kept in `other`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extra {
    /// EIP-712 domain name of the token (USDC on Base Sepolia: `"USDC"`; FiatTokenV2_2
    /// deployed locally: `"USD Coin"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// EIP-712 domain version of the token (`"2"` for USDC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Every other member, as sent.
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

impl Extra {
    /// `extra` with the EIP-712 domain `name` and `version` only.
    #[must_use]
    pub fn eip712(name: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            name: Some(name.into()),
            version: Some(version.into()),
            other: Map::new(),
        }
    }

    /// Whether every member of `self` is present with an equal value in `other`
    /// (the reference server lets a client add members to `accepted.extra`, never drop or
    /// change one).
    #[must_use]
    pub fn is_subset_of(&self, other: &Self) -> bool {
        let name_ok = self.name.is_none() || self.name == other.name;
        let version_ok = self.version.is_none() || self.version == other.version;
        name_ok
            && version_ok
            && self
                .other
                .iter()
                .all(|(k, v)| other.other.get(k).is_some_and(|o| o == v))
    }
}

/// One way to pay (`PaymentRequirements`, v2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PaymentRequirements {
    /// Scheme, `"exact"` here.
    #[serde(deserialize_with = "non_empty")]
    pub scheme: String,
    /// CAIP-2 network, e.g. `"eip155:84532"`.
    #[serde(deserialize_with = "caip2")]
    pub network: String,
    /// Price in the asset's atomic units, a decimal string.
    pub amount: Uint256Decimal,
    /// Token contract address (for EVM), kept as sent.
    #[serde(deserialize_with = "non_empty")]
    pub asset: String,
    /// Recipient address, kept as sent.
    #[serde(deserialize_with = "non_empty")]
    pub pay_to: String,
    /// How long the payer may take, in seconds (positive).
    #[serde(deserialize_with = "positive")]
    pub max_timeout_seconds: u64,
    /// Scheme-specific data: the EIP-712 domain for exact on EVM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Extra>,
}

/// The 402 answer (`PaymentRequired`, v2) with exact-EVM entries, sent in the `PAYMENT-REQUIRED`
/// header: the transport's 402 body, typed. Its `resource` is optional in the envelope
/// (exact-algo's 402 has none, `docs/exact-algo.md` §2.1); an x402 v2 402 of this scheme carries
/// it.
pub type PaymentRequired = x402_transport::wire::PaymentRequired<PaymentRequirements>;

impl SameEntry for PaymentRequirements {
    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

/// The EIP-3009 `TransferWithAuthorization` parameters as they travel (`authorization`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Eip3009Authorization {
    /// Payer.
    pub from: ChecksumAddress,
    /// Recipient; must equal `payTo`.
    pub to: ChecksumAddress,
    /// Amount in atomic units; must equal the required `amount`.
    pub value: Uint256Decimal,
    /// Unix time (seconds) from which the authorization is valid.
    pub valid_after: Uint256Decimal,
    /// Unix time (seconds) before which the authorization is valid.
    pub valid_before: Uint256Decimal,
    /// Random 32-byte nonce (single use on chain).
    pub nonce: Bytes32Hex,
}

/// The exact-EVM payload (`payload`): the EIP-712 signature and what it signs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExactEvmPayload {
    /// The signature: 65 bytes `r || s || v` for an EOA.
    pub signature: HexBytes,
    /// The signed authorization.
    pub authorization: Eip3009Authorization,
}

/// What a client sends on the paid retry (`PaymentPayload`, v2), in `PAYMENT-SIGNATURE`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PaymentPayload {
    /// Always 2.
    pub x402_version: V2,
    /// The resource, echoed from the 402.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<ResourceInfo>,
    /// The requirements the client chose, echoed from `accepts`.
    pub accepted: PaymentRequirements,
    /// The signed authorization.
    pub payload: ExactEvmPayload,
    /// Extensions echoed from the 402.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Map<String, Value>>,
}

/// Settlement result (`SettleResponse`), in `PAYMENT-RESPONSE` and from `POST /settle`: the
/// transport's, the same for every scheme. `success: false` is a failure whatever the HTTP
/// status; a missing `transaction` reads as `""`.
pub use x402_transport::facilitator::SettleResponse;

/// Verification result (`VerifyResponse`), from `POST /verify`: the transport's, the same for
/// every scheme.
pub use x402_transport::facilitator::VerifyResponse;

/// Reads a `PAYMENT-REQUIRED` header whose `accepts[]` may also list other schemes' entries (a
/// route of the shared x402 transport offering, say, exact-algo beside `exact` on EVM): the
/// entries that are not x402 v2 `PaymentRequirements` are left out, everything else is read as
/// strictly as [`PaymentRequired::from_header`] reads it.
///
/// # Errors
/// Any [`HeaderError`]; a header with no entry of this shape is [`HeaderError::Json`].
pub fn payment_required_mixed(header: &str) -> Result<PaymentRequired, HeaderError> {
    payment_required_from_value_mixed(decode_header(header, Some(V2::NUMBER))?)
}

/// As [`payment_required_mixed`], for a 402 body already read as JSON.
///
/// # Errors
/// [`HeaderError::Json`] if it is not an x402 v2 body with an entry of this shape.
pub fn payment_required_from_value_mixed(mut v: Value) -> Result<PaymentRequired, HeaderError> {
    if let Some(Value::Array(accepts)) = v.get_mut("accepts") {
        accepts.retain(|a| serde_json::from_value::<PaymentRequirements>(a.clone()).is_ok());
    }
    serde_json::from_value(v).map_err(HeaderError::Json)
}

impl PaymentPayload {
    /// The `PAYMENT-SIGNATURE` header value.
    ///
    /// # Errors
    /// [`HeaderError::Encode`] if serialization fails.
    pub fn to_header(&self) -> Result<String, HeaderError> {
        encode_header(self)
    }

    /// Reads a `PAYMENT-SIGNATURE` header value, strictly (see the module docs).
    ///
    /// # Errors
    /// Any [`HeaderError`]; [`HeaderError::reason`] gives the reference reason code.
    pub fn from_header(header: &str) -> Result<Self, HeaderError> {
        decode_header(header, Some(V2::NUMBER))
    }
}

impl fmt::Display for PaymentRequirements {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} of {} on {} to {}",
            self.scheme, self.amount, self.asset, self.network, self.pay_to
        )
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::Engine as _;

    // specs/transports-v2/http.md (coinbase/x402): the three example headers, verbatim.
    pub(crate) const SPEC_PAYMENT_REQUIRED: &str = "eyJ4NDAyVmVyc2lvbiI6MiwiZXJyb3IiOiJQQVlNRU5ULVNJR05BVFVSRSBoZWFkZXIgaXMgcmVxdWlyZWQiLCJyZXNvdXJjZSI6eyJ1cmwiOiJodHRwczovL2FwaS5leGFtcGxlLmNvbS9wcmVtaXVtLWRhdGEiLCJkZXNjcmlwdGlvbiI6IkFjY2VzcyB0byBwcmVtaXVtIG1hcmtldCBkYXRhIiwibWltZVR5cGUiOiJhcHBsaWNhdGlvbi9qc29uIn0sImFjY2VwdHMiOlt7InNjaGVtZSI6ImV4YWN0IiwibmV0d29yayI6ImVpcDE1NTo4NDUzMiIsImFtb3VudCI6IjEwMDAwIiwiYXNzZXQiOiIweDAzNkNiRDUzODQyYzU0MjY2MzRlNzkyOTU0MWVDMjMxOGYzZENGN2UiLCJwYXlUbyI6IjB4MjA5NjkzQmM2YWZjMEM1MzI4YkEzNkZhRjAzQzUxNEVGMzEyMjg3QyIsIm1heFRpbWVvdXRTZWNvbmRzIjo2MCwiZXh0cmEiOnsibmFtZSI6IlVTREMiLCJ2ZXJzaW9uIjoiMiJ9fV19";
    pub(crate) const SPEC_PAYMENT_SIGNATURE: &str = "eyJ4NDAyVmVyc2lvbiI6MiwicmVzb3VyY2UiOnsidXJsIjoiaHR0cHM6Ly9hcGkuZXhhbXBsZS5jb20vcHJlbWl1bS1kYXRhIiwiZGVzY3JpcHRpb24iOiJBY2Nlc3MgdG8gcHJlbWl1bSBtYXJrZXQgZGF0YSIsIm1pbWVUeXBlIjoiYXBwbGljYXRpb24vanNvbiJ9LCJhY2NlcHRlZCI6eyJzY2hlbWUiOiJleGFjdCIsIm5ldHdvcmsiOiJlaXAxNTU6ODQ1MzIiLCJhbW91bnQiOiIxMDAwMCIsImFzc2V0IjoiMHgwMzZDYkQ1Mzg0MmM1NDI2NjM0ZTc5Mjk1NDFlQzIzMThmM2RDRjdlIiwicGF5VG8iOiIweDIwOTY5M0JjNmFmYzBDNTMyOGJBMzZGYUYwM0M1MTRFRjMxMjI4N0MiLCJtYXhUaW1lb3V0U2Vjb25kcyI6NjAsImV4dHJhIjp7Im5hbWUiOiJVU0RDIiwidmVyc2lvbiI6IjIifX0sInBheWxvYWQiOnsic2lnbmF0dXJlIjoiMHgyZDZhNzU4OGQ2YWNjYTUwNWNiZjBkOWE0YTIyN2UwYzUyYzZjMzQwMDhjOGU4OTg2YTEyODMyNTk3NjQxNzM2MDhhMmNlNjQ5NjY0MmUzNzdkNmRhOGRiYmY1ODM2ZTliZDE1MDkyZjllY2FiMDVkZWQzZDYyOTNhZjE0OGI1NzFjIiwiYXV0aG9yaXphdGlvbiI6eyJmcm9tIjoiMHg4NTdiMDY1MTlFOTFlM0E1NDUzODc5MWJEYmIwRTIyMzczZTM2YjY2IiwidG8iOiIweDIwOTY5M0JjNmFmYzBDNTMyOGJBMzZGYUYwM0M1MTRFRjMxMjI4N0MiLCJ2YWx1ZSI6IjEwMDAwIiwidmFsaWRBZnRlciI6IjE3NDA2NzIwODkiLCJ2YWxpZEJlZm9yZSI6IjE3NDA2NzIxNTQiLCJub25jZSI6IjB4ZjM3NDY2MTNjMmQ5MjBiNWZkYWJjMDg1NmYyYWViMmQ0Zjg4ZWU2MDM3YjhjYzVkMDRhNzFhNDQ2MmYxMzQ4MCJ9fX0=";
    pub(crate) const SPEC_PAYMENT_RESPONSE: &str = "eyJzdWNjZXNzIjp0cnVlLCJ0cmFuc2FjdGlvbiI6IjB4MTIzNDU2Nzg5MGFiY2RlZjEyMzQ1Njc4OTBhYmNkZWYxMjM0NTY3ODkwYWJjZGVmMTIzNDU2Nzg5MGFiY2RlZiIsIm5ldHdvcmsiOiJlaXAxNTU6ODQ1MzIiLCJwYXllciI6IjB4ODU3YjA2NTE5RTkxZTNBNTQ1Mzg3OTFiRGJiMEUyMjM3M2UzNmI2NiJ9";
    const SPEC_PAYMENT_RESPONSE_FAILURE: &str = "eyJzdWNjZXNzIjpmYWxzZSwiZXJyb3JSZWFzb24iOiJpbnN1ZmZpY2llbnRfZnVuZHMiLCJuZXR3b3JrIjoiZWlwMTU1Ojg0NTMyIn0=";

    fn b64(json: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(json)
    }

    #[test]
    fn spec_headers_decode_and_reencode_byte_for_byte() {
        let required = PaymentRequired::from_header(SPEC_PAYMENT_REQUIRED).unwrap();
        assert_eq!(required.accepts.len(), 1);
        let req = &required.accepts[0];
        assert_eq!(req.network, "eip155:84532");
        assert_eq!(req.amount.to_string(), "10000");
        assert_eq!(req.pay_to, "0x209693Bc6afc0C5328bA36FaF03C514EF312287C");
        assert_eq!(req.extra, Some(Extra::eip712("USDC", "2")));
        assert_eq!(required.to_header().unwrap(), SPEC_PAYMENT_REQUIRED);

        let payload = PaymentPayload::from_header(SPEC_PAYMENT_SIGNATURE).unwrap();
        assert_eq!(payload.accepted, *req);
        assert_eq!(payload.payload.signature.len(), 65);
        assert_eq!(
            payload.payload.authorization.valid_before.to_string(),
            "1740672154"
        );
        assert_eq!(payload.to_header().unwrap(), SPEC_PAYMENT_SIGNATURE);

        let settled = SettleResponse::from_header(SPEC_PAYMENT_RESPONSE).unwrap();
        assert!(settled.success);
        assert_eq!(
            settled.payer.as_deref(),
            Some("0x857b06519E91e3A54538791bDbb0E22373e36b66")
        );
        assert_eq!(settled.to_header().unwrap(), SPEC_PAYMENT_RESPONSE);

        let failed = SettleResponse::from_header(SPEC_PAYMENT_RESPONSE_FAILURE).unwrap();
        assert!(!failed.success);
        assert_eq!(failed.error_reason.as_deref(), Some("insufficient_funds"));
        assert_eq!(failed.transaction, "");
    }

    #[test]
    fn padding_is_optional_on_decode_url_safe_alphabet_is_not_accepted() {
        let unpadded = SPEC_PAYMENT_SIGNATURE.trim_end_matches('=');
        assert!(PaymentPayload::from_header(unpadded).is_ok());
        for bad in [
            SPEC_PAYMENT_SIGNATURE.replacen('J', "-", 1),
            SPEC_PAYMENT_SIGNATURE.replacen('J', "_", 1),
            format!(" {SPEC_PAYMENT_SIGNATURE}"),
            format!("{SPEC_PAYMENT_SIGNATURE}\n"),
        ] {
            assert!(matches!(
                PaymentPayload::from_header(&bad),
                Err(HeaderError::Base64(_))
            ));
        }
    }

    fn spec_payload_json() -> Value {
        serde_json::to_value(PaymentPayload::from_header(SPEC_PAYMENT_SIGNATURE).unwrap()).unwrap()
    }

    fn decode_value(v: &Value) -> Result<PaymentPayload, HeaderError> {
        PaymentPayload::from_header(&b64(&v.to_string()))
    }

    #[test]
    fn payer_messages_refuse_unknown_fields_everywhere_but_extra_and_extensions() {
        for pointer in [
            "",
            "/accepted",
            "/payload",
            "/payload/authorization",
            "/resource",
        ] {
            let mut v = spec_payload_json();
            v.pointer_mut(pointer)
                .unwrap()
                .as_object_mut()
                .unwrap()
                .insert("surprise".into(), Value::Bool(true));
            let err = decode_value(&v).unwrap_err();
            assert!(
                err.to_string().contains("unknown field"),
                "{pointer}: {err}"
            );
            assert_eq!(err.reason(), "invalid_payload");
        }
        let mut v = spec_payload_json();
        v.pointer_mut("/accepted/extra")
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert("assetTransferMethod".into(), "eip3009".into());
        v.as_object_mut().unwrap().insert(
            "extensions".into(),
            serde_json::json!({"bazaar": {"info": {}}}),
        );
        let decoded = decode_value(&v).unwrap();
        assert_eq!(
            decoded.accepted.extra.unwrap().other["assetTransferMethod"],
            "eip3009"
        );
    }

    #[test]
    fn json_numbers_for_amounts_are_refused() {
        for pointer in [
            "/accepted/amount",
            "/payload/authorization/value",
            "/payload/authorization/validAfter",
            "/payload/authorization/validBefore",
        ] {
            let mut v = spec_payload_json();
            let n: u64 = v
                .pointer(pointer)
                .unwrap()
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            *v.pointer_mut(pointer).unwrap() = Value::from(n);
            assert!(
                decode_value(&v).is_err(),
                "{pointer} accepted a JSON number"
            );
        }
    }

    #[test]
    fn non_canonical_signed_values_are_refused() {
        type Change = fn(&str) -> String;
        let cases: [(&str, Change); 6] = [
            ("/payload/authorization/value", |s| format!("0{s}")),
            ("/payload/authorization/nonce", |s| {
                s.to_ascii_uppercase().replacen("0X", "0x", 1)
            }),
            ("/payload/authorization/nonce", |s| {
                s.replacen("0x", "0X", 1)
            }),
            ("/payload/signature", |s| {
                s.to_ascii_uppercase().replacen("0X", "0x", 1)
            }),
            ("/payload/authorization/from", str::to_ascii_lowercase),
            ("/payload/authorization/to", str::to_ascii_lowercase),
        ];
        for (pointer, change) in cases {
            let mut v = spec_payload_json();
            let changed = change(v.pointer(pointer).unwrap().as_str().unwrap());
            *v.pointer_mut(pointer).unwrap() = Value::from(changed);
            assert!(decode_value(&v).is_err(), "{pointer}");
        }
    }

    #[test]
    fn missing_and_duplicate_fields_are_refused() {
        let mut v = spec_payload_json();
        v.pointer_mut("/payload")
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove("signature");
        assert!(decode_value(&v).is_err());

        let json = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(SPEC_PAYMENT_SIGNATURE)
                .unwrap(),
        )
        .unwrap();
        assert!(json.starts_with("{\"x402Version\":2,"));
        let dup = json.replacen(
            "\"x402Version\":2,",
            "\"x402Version\":2,\"x402Version\":2,",
            1,
        );
        assert!(PaymentPayload::from_header(&b64(&dup)).is_err());
        for (field, dup) in [
            (
                "\"value\":\"10000\",",
                "\"value\":\"10000\",\"value\":\"1\",",
            ),
            (
                "\"scheme\":\"exact\",",
                "\"scheme\":\"exact\",\"scheme\":\"exact\",",
            ),
        ] {
            assert!(json.contains(field));
            let dup_json = json.replacen(field, dup, 1);
            assert!(
                PaymentPayload::from_header(&b64(&dup_json)).is_err(),
                "{field}"
            );
        }
    }

    #[test]
    fn other_versions_are_refused_not_downgraded() {
        let mut v = spec_payload_json();
        v["x402Version"] = Value::from(1);
        let err = decode_value(&v).unwrap_err();
        assert!(matches!(
            err,
            HeaderError::UnsupportedVersion {
                found: 1,
                expected: 2
            }
        ));
        assert_eq!(err.reason(), "invalid_x402_version");

        // A v1 X-PAYMENT body is not a v2 payload either.
        let v1 = serde_json::json!({
            "x402Version": 1, "scheme": "exact", "network": "base-sepolia",
            "payload": spec_payload_json()["payload"].clone()
        });
        assert!(decode_value(&v1).is_err());

        let mut required: Value = serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(SPEC_PAYMENT_REQUIRED)
                .unwrap(),
        )
        .unwrap();
        required["x402Version"] = Value::from(3);
        assert!(matches!(
            PaymentRequired::from_header(&b64(&required.to_string())),
            Err(HeaderError::UnsupportedVersion { found: 3, .. })
        ));
    }

    #[test]
    fn payment_required_needs_accepts_and_tolerates_unknown_top_level_fields() {
        let mut required: Value = serde_json::from_slice(
            &base64::engine::general_purpose::STANDARD
                .decode(SPEC_PAYMENT_REQUIRED)
                .unwrap(),
        )
        .unwrap();
        required["futureField"] = Value::Bool(true);
        assert!(PaymentRequired::from_header(&b64(&required.to_string())).is_ok());
        required["accepts"] = Value::Array(vec![]);
        assert!(PaymentRequired::from_header(&b64(&required.to_string())).is_err());
    }

    #[test]
    fn requirement_field_rules() {
        let base = serde_json::json!({
            "scheme": "exact", "network": "eip155:84532", "amount": "1",
            "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e",
            "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C", "maxTimeoutSeconds": 60
        });
        assert!(serde_json::from_value::<PaymentRequirements>(base.clone()).is_ok());
        for (field, bad) in [
            ("network", Value::from("base-sepolia")),
            ("scheme", Value::from("")),
            ("maxTimeoutSeconds", Value::from(0)),
            ("maxTimeoutSeconds", Value::from(1.5)),
            ("maxTimeoutSeconds", Value::from(-1)),
            ("amount", Value::from("-1")),
            ("payTo", Value::from("")),
        ] {
            let mut v = base.clone();
            v[field] = bad;
            assert!(
                serde_json::from_value::<PaymentRequirements>(v).is_err(),
                "{field}"
            );
        }
        let mut v = base;
        v["extra"] = Value::Null;
        assert_eq!(
            serde_json::from_value::<PaymentRequirements>(v)
                .unwrap()
                .extra,
            None
        );
    }

    #[test]
    fn oversized_headers_are_refused_before_decoding() {
        let long = "A".repeat(MAX_HEADER_LEN + 4);
        assert!(matches!(
            PaymentPayload::from_header(&long),
            Err(HeaderError::TooLong { .. })
        ));
    }

    #[test]
    fn verify_response_round_trip() {
        let v: VerifyResponse = serde_json::from_str(
            r#"{"isValid":false,"invalidReason":"insufficient_funds","payer":"0x857b06519E91e3A54538791bDbb0E22373e36b66","extra":{}}"#,
        )
        .unwrap();
        assert!(!v.is_valid);
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"isValid":false,"invalidReason":"insufficient_funds","payer":"0x857b06519E91e3A54538791bDbb0E22373e36b66"}"#
        );
    }

    #[test]
    fn extra_subset_rule() {
        let server = Extra::eip712("USDC", "2");
        let mut client = server.clone();
        client.other.insert("added".into(), Value::Bool(true));
        assert!(server.is_subset_of(&client));
        assert!(!client.is_subset_of(&server));
        let changed = Extra::eip712("USDC", "1");
        assert!(!server.is_subset_of(&changed));
    }
}
