//! Stripe webhooks: `Stripe-Signature` verification and the events the rail uses.
//!
//! The scheme (Stripe docs, "Check the webhook signatures"): the header is
//! `t=<unix seconds>,v1=<hex>,v1=<hex>…`; each `v1` is HMAC-SHA256 of `"{t}.{payload}"` keyed
//! with the endpoint's signing secret (`whsec_…`). A payload is accepted when one `v1` matches
//! (compared in constant time) and `t` is within the tolerance of now (default 300 s), which
//! bounds replays; the rail also remembers event ids it has handled.

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Stripe's default tolerance.
pub const DEFAULT_TOLERANCE_SECS: i64 = 300;

type HmacSha256 = Hmac<Sha256>;

/// Why a webhook is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WebhookError {
    /// The header is missing or has no `t` or no `v1`.
    #[error("malformed Stripe-Signature header")]
    MalformedHeader,
    /// No `v1` matches the payload.
    #[error("no signature matches the payload")]
    BadSignature,
    /// The timestamp is outside the tolerance.
    #[error("timestamp {t} is outside the tolerance (now {now})")]
    Stale {
        /// The header's `t`.
        t: i64,
        /// Now.
        now: i64,
    },
    /// The payload is not an event.
    #[error("payload is not a Stripe event: {0}")]
    Payload(String),
}

fn mac(secret: &str, t: i64, payload: &str) -> Vec<u8> {
    // HMAC accepts keys of any length: `new_from_slice` cannot fail for it.
    let Ok(mut m) = HmacSha256::new_from_slice(secret.as_bytes()) else {
        return Vec::new();
    };
    m.update(t.to_string().as_bytes());
    m.update(b".");
    m.update(payload.as_bytes());
    m.finalize().into_bytes().to_vec()
}

/// The `Stripe-Signature` header Stripe would send for `payload` at time `t`.
#[must_use]
pub fn sign(payload: &str, secret: &str, t: i64) -> String {
    format!("t={t},v1={}", hex::encode(mac(secret, t, payload)))
}

/// Verifies `header` for `payload` at `now` (unix seconds).
///
/// # Errors
/// [`WebhookError`].
pub fn verify(
    payload: &str,
    header: &str,
    secret: &str,
    now: i64,
    tolerance_secs: i64,
) -> Result<(), WebhookError> {
    let mut t = None;
    let mut sigs = Vec::new();
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", v)) => t = v.parse::<i64>().ok(),
            Some(("v1", v)) => {
                if let Ok(b) = hex::decode(v) {
                    sigs.push(b);
                }
            }
            _ => {}
        }
    }
    let t = t.ok_or(WebhookError::MalformedHeader)?;
    if sigs.is_empty() {
        return Err(WebhookError::MalformedHeader);
    }
    let expected = mac(secret, t, payload);
    // Every candidate is compared, in constant time each.
    let matched = sigs
        .iter()
        .fold(subtle::Choice::from(0), |acc, s| acc | s.ct_eq(&expected));
    if !bool::from(matched) {
        return Err(WebhookError::BadSignature);
    }
    // `t` comes from the header: compare without arithmetic that could overflow.
    if now.abs_diff(t) > tolerance_secs.unsigned_abs() {
        return Err(WebhookError::Stale { t, now });
    }
    Ok(())
}

/// The parts of a Stripe event the rail reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// `evt_…` (handle each once).
    pub id: String,
    /// `payment_intent.succeeded`, `charge.refunded`, …
    pub kind: String,
    /// What it says.
    pub what: EventKind,
}

/// What an event says, for the types the rail handles.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EventKind {
    /// A `payment_intent.*` event: the intent's id, status and amounts.
    PaymentIntent {
        /// `pi_…`.
        id: String,
        /// Its status after the event.
        status: String,
        /// `amount_capturable`.
        amount_capturable: u64,
        /// `amount_received`.
        amount_received: u64,
        /// `cancellation_reason`, when canceled.
        cancellation_reason: Option<String>,
    },
    /// `charge.refunded`: how much of the charge has been refunded in all.
    ChargeRefunded {
        /// `ch_…`.
        charge: String,
        /// `pi_…`.
        payment_intent: Option<String>,
        /// `amount_refunded`.
        amount_refunded: u64,
    },
    /// Any other event type (ignored by the rail, not an error).
    Other,
}

#[derive(Deserialize)]
struct RawEvent {
    id: String,
    #[serde(rename = "type")]
    kind: String,
    data: RawData,
}

#[derive(Deserialize)]
struct RawData {
    object: serde_json::Value,
}

/// Verifies and parses a webhook delivery.
///
/// # Errors
/// [`WebhookError`]; a signature is checked before the payload is parsed.
pub fn parse(
    payload: &str,
    header: &str,
    secret: &str,
    now: i64,
    tolerance_secs: i64,
) -> Result<Event, WebhookError> {
    verify(payload, header, secret, now, tolerance_secs)?;
    let raw: RawEvent =
        serde_json::from_str(payload).map_err(|e| WebhookError::Payload(e.to_string()))?;
    let o = &raw.data.object;
    let s = |k: &str| o.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let n = |k: &str| o.get(k).and_then(serde_json::Value::as_u64);
    let what = if raw.kind.starts_with("payment_intent.") {
        EventKind::PaymentIntent {
            id: s("id").ok_or_else(|| WebhookError::Payload("data.object.id".into()))?,
            status: s("status")
                .ok_or_else(|| WebhookError::Payload("data.object.status".into()))?,
            amount_capturable: n("amount_capturable").unwrap_or(0),
            amount_received: n("amount_received").unwrap_or(0),
            cancellation_reason: s("cancellation_reason"),
        }
    } else if raw.kind == "charge.refunded" {
        EventKind::ChargeRefunded {
            charge: s("id").ok_or_else(|| WebhookError::Payload("data.object.id".into()))?,
            payment_intent: s("payment_intent"),
            amount_refunded: n("amount_refunded")
                .ok_or_else(|| WebhookError::Payload("data.object.amount_refunded".into()))?,
        }
    } else {
        EventKind::Other
    };
    Ok(Event {
        id: raw.id,
        kind: raw.kind,
        what,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_test_secret";

    #[test]
    fn signs_and_verifies_with_tolerance_and_several_v1() {
        let p = r#"{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{"id":"pi_1","status":"succeeded","amount_received":500}}}"#;
        let h = sign(p, SECRET, 1000);
        verify(p, &h, SECRET, 1000, 300).unwrap();
        verify(p, &h, SECRET, 1300, 300).unwrap();
        assert_eq!(
            verify(p, &h, SECRET, 1301, 300),
            Err(WebhookError::Stale { t: 1000, now: 1301 })
        );
        // Tampered payload, wrong secret.
        assert_eq!(
            verify(&p.replace("500", "900"), &h, SECRET, 1000, 300),
            Err(WebhookError::BadSignature)
        );
        assert_eq!(
            verify(p, &h, "whsec_other", 1000, 300),
            Err(WebhookError::BadSignature)
        );
        // Several v1 (a secret being rolled): any match is enough.
        let other = sign(p, "whsec_old", 1000);
        let both = format!("{},{}", other, h.split(',').nth(1).unwrap());
        verify(p, &both, SECRET, 1000, 300).unwrap();
        // Malformed headers.
        for bad in ["", "t=abc,v1=00", "v1=00", "t=1000", "t=1000,v0=00"] {
            assert_eq!(
                verify(p, bad, SECRET, 1000, 300),
                Err(WebhookError::MalformedHeader),
                "{bad}"
            );
        }
        let e = parse(p, &h, SECRET, 1000, 300).unwrap();
        assert_eq!(e.id, "evt_1");
        assert!(matches!(
            e.what,
            EventKind::PaymentIntent {
                amount_received: 500,
                ..
            }
        ));
    }
}
