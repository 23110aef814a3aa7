//! x402 **v1** wire types (`specs/x402-specification-v1.md`), kept apart from v2.
//!
//! v1 differs from v2: the client header is `X-PAYMENT`, the server's is `X-PAYMENT-RESPONSE`,
//! the 402 carries [`PaymentRequiredV1`] as a JSON **body**, requirements use
//! `maxAmountRequired` and carry the resource inline, the payload names `scheme`/`network` at top
//! level instead of `accepted`, and networks are names (`"base-sepolia"`) rather than CAIP-2.
//!
//! There is no conversion between v1 and v2 in this crate, in either direction, and each
//! decoder refuses the other version's `x402Version`: a v2 peer is never silently downgraded.
//! Nothing here verifies v1 payments yet; [`crate::verify`] takes v2 payloads only.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::fields::Uint256Decimal;
use x402_transport::wire::{SameEntry, decode_header, encode_header};

use crate::wire::{ExactEvmPayload, Extra, HeaderError, positive};

pub use x402_transport::wire::V1;

/// One way to pay in v1.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PaymentRequirementsV1 {
    /// Scheme, `"exact"`.
    pub scheme: String,
    /// Network name, e.g. `"base-sepolia"` (see [`network_chain_id`]).
    pub network: String,
    /// Price in atomic units, a decimal string.
    pub max_amount_required: Uint256Decimal,
    /// Resource URL.
    pub resource: String,
    /// Resource description.
    pub description: String,
    /// MIME type of the paid response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mime_type: Option<String>,
    /// JSON schema of the paid response.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
    /// Recipient address.
    pub pay_to: String,
    /// Seconds the payer may take (positive).
    #[serde(deserialize_with = "positive")]
    pub max_timeout_seconds: u64,
    /// Token contract address.
    pub asset: String,
    /// EIP-712 domain `{name, version}` for exact on EVM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra: Option<Extra>,
}

/// The v1 402 JSON body with exact-EVM entries: the transport's v1 body, typed.
pub type PaymentRequiredV1 = x402_transport::wire::PaymentRequiredV1<PaymentRequirementsV1>;

impl SameEntry for PaymentRequirementsV1 {
    fn same(&self, other: &Self) -> bool {
        self == other
    }
}

/// The v1 `X-PAYMENT` payload (exact EVM).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PaymentPayloadV1 {
    /// Always 1.
    pub x402_version: V1,
    /// Scheme, `"exact"`.
    pub scheme: String,
    /// Network name.
    pub network: String,
    /// Signature and authorization, same shape as v2.
    pub payload: ExactEvmPayload,
}

/// The v1 settlement answer (`X-PAYMENT-RESPONSE`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SettleResponseV1 {
    /// Whether settlement succeeded.
    pub success: bool,
    /// Reason code when it did not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<String>,
    /// Transaction hash, `""` on failure.
    #[serde(default)]
    pub transaction: String,
    /// Network name.
    pub network: String,
    /// Payer address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payer: Option<String>,
}

impl PaymentPayloadV1 {
    /// The `X-PAYMENT` header value.
    ///
    /// # Errors
    /// [`HeaderError::Encode`] if serialization fails.
    pub fn to_header(&self) -> Result<String, HeaderError> {
        encode_header(self)
    }

    /// Reads an `X-PAYMENT` header value (v1 only).
    ///
    /// # Errors
    /// Any [`HeaderError`]; a v2 payload is refused.
    pub fn from_header(header: &str) -> Result<Self, HeaderError> {
        decode_header(header, Some(V1::NUMBER))
    }
}

impl SettleResponseV1 {
    /// The `X-PAYMENT-RESPONSE` header value.
    ///
    /// # Errors
    /// [`HeaderError::Encode`] if serialization fails.
    pub fn to_header(&self) -> Result<String, HeaderError> {
        encode_header(self)
    }

    /// Reads an `X-PAYMENT-RESPONSE` header value.
    ///
    /// # Errors
    /// Any [`HeaderError`].
    pub fn from_header(header: &str) -> Result<Self, HeaderError> {
        decode_header(header, None)
    }
}

/// v1 EVM network names and their chain ids, as in `@x402/evm` 2.27.0
/// (`EVM_NETWORK_CHAIN_ID_MAP`).
pub const EVM_NETWORKS: &[(&str, u64)] = &[
    ("ethereum", 1),
    ("sepolia", 11_155_111),
    ("abstract", 2741),
    ("abstract-testnet", 11_124),
    ("base-sepolia", 84_532),
    ("base", 8453),
    ("avalanche-fuji", 43_113),
    ("avalanche", 43_114),
    ("iotex", 4689),
    ("sei", 1329),
    ("sei-testnet", 1328),
    ("polygon", 137),
    ("polygon-amoy", 80_002),
    ("peaq", 3338),
    ("story", 1514),
    ("educhain", 41_923),
    ("skale-base-sepolia", 324_705_682),
    ("megaeth", 4326),
    ("monad", 143),
    ("stable", 988),
    ("stable-testnet", 2201),
    ("celo", 42_220),
    ("flare", 14),
];

/// The chain id of a v1 EVM network name (`"base-sepolia"` → 84532).
#[must_use]
pub fn network_chain_id(name: &str) -> Option<u64> {
    EVM_NETWORKS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|&(_, id)| id)
}

/// The v1 402 body for `pr` on v1 network `name` (`maxAmountRequired`, inline resource).
#[must_use]
pub fn v1_body(pr: &crate::wire::PaymentRequired, name: &str) -> PaymentRequiredV1 {
    let resource = pr.resource.as_ref();
    PaymentRequiredV1 {
        x402_version: V1::default(),
        error: pr.error.clone(),
        accepts: pr
            .accepts
            .iter()
            .map(|r| PaymentRequirementsV1 {
                scheme: r.scheme.clone(),
                network: name.to_owned(),
                max_amount_required: r.amount,
                resource: resource.map(|r| r.url.clone()).unwrap_or_default(),
                description: resource
                    .and_then(|r| r.description.clone())
                    .unwrap_or_default(),
                mime_type: resource.and_then(|r| r.mime_type.clone()),
                output_schema: None,
                pay_to: r.pay_to.clone(),
                max_timeout_seconds: r.max_timeout_seconds,
                asset: r.asset.clone(),
                extra: r.extra.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{PaymentPayload, tests::SPEC_PAYMENT_SIGNATURE};
    use base64::Engine as _;

    fn b64(json: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(json)
    }

    // The `X-PAYMENT` example of specs/schemes/exact/scheme_exact_evm.md (v1 revision).
    const V1_EXAMPLE: &str = r#"{"x402Version":1,"scheme":"exact","network":"base-sepolia","payload":{"signature":"0x2d6a7588d6acca505cbf0d9a4a227e0c52c6c34008c8e8986a1283259764173608a2ce6496642e377d6da8dbbf5836e9bd15092f9ecab05ded3d6293af148b571c","authorization":{"from":"0x857b06519E91e3A54538791bDbb0E22373e36b66","to":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C","value":"10000","validAfter":"1740672089","validBefore":"1740672154","nonce":"0xf3746613c2d920b5fdabc0856f2aeb2d4f88ee6037b8cc5d04a71a4462f13480"}}}"#;

    #[test]
    fn v1_example_round_trips_and_is_not_a_v2_payload() {
        let header = b64(V1_EXAMPLE);
        let p = PaymentPayloadV1::from_header(&header).unwrap();
        assert_eq!(p.network, "base-sepolia");
        assert_eq!(network_chain_id(&p.network), Some(84_532));
        assert_eq!(p.to_header().unwrap(), header);
        assert!(matches!(
            PaymentPayload::from_header(&header),
            Err(HeaderError::UnsupportedVersion {
                found: 1,
                expected: 2
            })
        ));
        // And a v2 payload is not read as v1.
        assert!(matches!(
            PaymentPayloadV1::from_header(SPEC_PAYMENT_SIGNATURE),
            Err(HeaderError::UnsupportedVersion {
                found: 2,
                expected: 1
            })
        ));
    }

    #[test]
    fn v1_requirements_use_max_amount_required() {
        let body = r#"{"x402Version":1,"error":"X-PAYMENT header is required","accepts":[{"scheme":"exact","network":"base-sepolia","maxAmountRequired":"10000","resource":"https://api.example.com/premium-data","description":"Access to premium market data","mimeType":"application/json","payTo":"0x209693Bc6afc0C5328bA36FaF03C514EF312287C","maxTimeoutSeconds":60,"asset":"0x036CbD53842c5426634e7929541eC2318f3dCF7e","extra":{"name":"USDC","version":"2"}}]}"#;
        let r: PaymentRequiredV1 = serde_json::from_str(body).unwrap();
        assert_eq!(r.accepts[0].max_amount_required.to_string(), "10000");
        assert_eq!(serde_json::to_string(&r).unwrap(), body);
        let v2_shaped = body.replace("maxAmountRequired", "amount");
        assert!(serde_json::from_str::<PaymentRequiredV1>(&v2_shaped).is_err());
        let v2_version = body.replace("\"x402Version\":1", "\"x402Version\":2");
        assert!(serde_json::from_str::<PaymentRequiredV1>(&v2_version).is_err());
    }

    #[test]
    fn v1_settle_response() {
        let json = r#"{"success":true,"transaction":"0xabc","network":"base-sepolia","payer":"0x857b06519E91e3A54538791bDbb0E22373e36b66"}"#;
        let header = b64(json);
        let r = SettleResponseV1::from_header(&header).unwrap();
        assert!(r.success);
        assert_eq!(r.to_header().unwrap(), header);
        assert_eq!(network_chain_id("base"), Some(8453));
        assert_eq!(network_chain_id("eip155:8453"), None);
    }
}
