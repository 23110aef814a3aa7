//! The x402 facilitator protocol's messages, the same for every scheme: the body of
//! `POST /verify` and `POST /settle` ([`FacilitatorRequest`]) and the answer of `/verify`
//! ([`VerifyResponse`]). A scheme plugs in its own payload and requirements types.

use serde::{Deserialize, Serialize};

/// `POST /verify` and `POST /settle` bodies: the payment and what the receiver requires, of
/// the scheme's own types (`P`, `R`; borrowed ones serialize the same). `V` is how the
/// version is read: `u8` requires it, `Option<u8>` lets it be absent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FacilitatorRequest<P, R, V = u8> {
    /// The payload's version (2).
    pub x402_version: V,
    /// The payment.
    pub payment_payload: P,
    /// What the receiver requires.
    pub payment_requirements: R,
}

/// The answer of `POST /verify` (`VerifyResponse`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyResponse {
    /// Whether the payment is valid.
    pub is_valid: bool,
    /// Why not: a reason code (e.g. `invalid_exact_evm_signature`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_reason: Option<String>,
    /// Why not: free-text detail (reference SDK field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invalid_message: Option<String>,
    /// Who pays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payer: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_read_as_an_option_may_be_absent_a_required_one_may_not() {
        let body = r#"{"paymentPayload":1,"paymentRequirements":2}"#;
        let r: FacilitatorRequest<u8, u8, Option<u8>> = serde_json::from_str(body).unwrap();
        assert_eq!(r.x402_version, None);
        assert!(serde_json::from_str::<FacilitatorRequest<u8, u8>>(body).is_err());
        let r = FacilitatorRequest {
            x402_version: 2u8,
            payment_payload: &1u8,
            payment_requirements: &2u8,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"x402Version":2,"paymentPayload":1,"paymentRequirements":2}"#
        );
    }
}
