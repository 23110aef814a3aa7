//! The three CEP-8 notifications, as the ContextVM SDK 0.11.14 sends them about a request
//! (`docs/research/contextvm-sdk-0.11.14.md` §3.1, §3.2, §3.7): each a JSON-RPC notification in a
//! kind 25910 message tagged `["e", <the request event's id>]`.
//!
//! Amounts are JSON numbers in the capability's unit (satoshis for `bitcoin-lightning-bolt11`):
//! read as whole numbers only — a fractional or negative amount is refused, never rounded.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::Error;

/// `notifications/payment_required`.
pub const PAYMENT_REQUIRED: &str = "notifications/payment_required";
/// `notifications/payment_accepted`.
pub const PAYMENT_ACCEPTED: &str = "notifications/payment_accepted";
/// `notifications/payment_rejected`.
pub const PAYMENT_REJECTED: &str = "notifications/payment_rejected";
/// The payment method identifier of a BOLT11 Lightning invoice.
pub const PMI_BOLT11: &str = "bitcoin-lightning-bolt11";

/// What to pay for a request: the server's payment request under one PMI.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentRequired {
    /// The amount, in the capability's unit.
    pub amount: u64,
    /// The payment request (a BOLT11 invoice for `bitcoin-lightning-bolt11`).
    pub pay_req: String,
    /// The payment method identifier.
    pub pmi: String,
    /// What is paid for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// How long the request may be paid (seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<u64>,
    /// The processor's or the price's extra data.
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Map<String, Value>>,
}

/// The payment was seen: the request is forwarded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentAccepted {
    /// The amount paid.
    pub amount: u64,
    /// The payment method identifier.
    pub pmi: String,
    /// The processor's data (`{"payment_hash": …}` for Lightning).
    #[serde(default, rename = "_meta", skip_serializing_if = "Option::is_none")]
    pub meta: Option<Map<String, Value>>,
}

/// The request is refused before any payment (the price hook's rejection): nothing to pay,
/// and no response will come.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PaymentRejected {
    /// The payment method identifier.
    pub pmi: String,
    /// The price that was asked, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<u64>,
    /// Why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// One of the three notifications.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notification {
    /// `notifications/payment_required`.
    Required(PaymentRequired),
    /// `notifications/payment_accepted`.
    Accepted(PaymentAccepted),
    /// `notifications/payment_rejected`.
    Rejected(PaymentRejected),
}

impl Notification {
    /// The JSON-RPC notification.
    ///
    /// # Errors
    /// [`Error::Refused`] (cannot happen for these types).
    pub fn to_json_rpc(&self) -> Result<Value, Error> {
        let (method, params) = match self {
            Notification::Required(p) => (PAYMENT_REQUIRED, serde_json::to_value(p)),
            Notification::Accepted(p) => (PAYMENT_ACCEPTED, serde_json::to_value(p)),
            Notification::Rejected(p) => (PAYMENT_REJECTED, serde_json::to_value(p)),
        };
        let params = params.map_err(|e| Error::Refused(e.to_string()))?;
        Ok(serde_json::json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    /// The notification a JSON-RPC message is, if it is one of the three; `Ok(None)` for any
    /// other message.
    ///
    /// # Errors
    /// [`Error::Refused`] for one of the three methods with params that do not fit (a missing
    /// field, an amount that is not a whole number).
    pub fn from_json_rpc(message: &Value) -> Result<Option<Self>, Error> {
        let Some(method) = message.get("method").and_then(Value::as_str) else {
            return Ok(None);
        };
        let params = message.get("params").cloned().unwrap_or(Value::Null);
        let bad = |e: serde_json::Error| Error::Refused(format!("{method}: {e}"));
        Ok(Some(match method {
            PAYMENT_REQUIRED => {
                Notification::Required(serde_json::from_value(params).map_err(bad)?)
            }
            PAYMENT_ACCEPTED => {
                Notification::Accepted(serde_json::from_value(params).map_err(bad)?)
            }
            PAYMENT_REJECTED => {
                Notification::Rejected(serde_json::from_value(params).map_err(bad)?)
            }
            _ => return Ok(None),
        }))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    /// The SDK 0.11.14's notifications, as the research note quotes them (§3.7).
    #[test]
    fn the_sdks_notifications_read_and_write_the_same() {
        for text in [
            r#"{"jsonrpc":"2.0","method":"notifications/payment_required","params":{"amount":10,"pay_req":"lnbc100n1xyz","pmi":"bitcoin-lightning-bolt11","description":"Example paid tool","ttl":300}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/payment_accepted","params":{"amount":10,"pmi":"bitcoin-lightning-bolt11","_meta":{"payment_hash":"ab12"}}}"#,
            r#"{"jsonrpc":"2.0","method":"notifications/payment_rejected","params":{"pmi":"bitcoin-lightning-bolt11","amount":10,"message":"Access denied"}}"#,
        ] {
            let v: Value = serde_json::from_str(text).unwrap();
            let n = Notification::from_json_rpc(&v).unwrap().unwrap();
            assert_eq!(n.to_json_rpc().unwrap(), v, "{text}");
        }
        // Another message is none of them.
        let other = json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}});
        assert_eq!(Notification::from_json_rpc(&other).unwrap(), None);
    }

    #[test]
    fn an_amount_that_is_not_a_whole_number_is_refused_never_rounded() {
        for amount in [json!(10.5), json!(-1), json!("10"), Value::Null] {
            let v = json!({"jsonrpc": "2.0", "method": PAYMENT_REQUIRED,
                "params": {"amount": amount, "pay_req": "lnbc1", "pmi": PMI_BOLT11}});
            assert_eq!(
                Notification::from_json_rpc(&v).unwrap_err().code(),
                "refused",
                "{amount}"
            );
        }
    }
}
