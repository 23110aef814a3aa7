#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    missing_docs
)]
//! Properties of `webhook::{sign, verify, parse}` (Stripe's "Check the webhook signatures"
//! scheme: `t=<unix seconds>,v1=<hex HMAC-SHA256 of "{t}.{payload}">`).

use proptest::prelude::*;
use rail_stripe::webhook::{self, EventKind, WebhookError};
use serde_json::{Value, json};

/// Headers: anything at all, or shaped like Stripe's with random parts.
fn header() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[tv0-9a-f=, ]{0,80}",
        (
            any::<i64>(),
            proptest::collection::vec(any::<u8>(), 0..40),
            "[ ,]{0,2}"
        )
            .prop_map(|(t, sig, sep)| format!("t={t},{sep}v1={}", hex::encode(sig))),
        (any::<String>(), any::<String>()).prop_map(|(t, v)| format!("t={t},v1={v}")),
    ]
}

/// Any JSON value, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        any::<String>().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::from),
            proptest::collection::btree_map(
                prop_oneof![
                    Just("id".to_owned()),
                    Just("status".to_owned()),
                    Just("amount_capturable".to_owned()),
                    Just("amount_received".to_owned()),
                    Just("amount_refunded".to_owned()),
                    Just("payment_intent".to_owned()),
                    Just("cancellation_reason".to_owned()),
                    any::<String>(),
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Event-shaped payloads with arbitrary contents.
fn event_payload() -> impl Strategy<Value = String> {
    (
        json_value(),
        prop_oneof![
            Just("payment_intent.succeeded".to_owned()),
            Just("payment_intent.canceled".to_owned()),
            Just("charge.refunded".to_owned()),
            any::<String>(),
        ],
        json_value(),
    )
        .prop_map(|(id, kind, object)| {
            json!({"id": id, "type": kind, "data": {"object": object}}).to_string()
        })
}

proptest! {
    #[test]
    fn verify_and_parse_never_panic_on_arbitrary_input(
        payload in any::<String>(),
        header in header(),
        secret in any::<String>(),
        now in any::<i64>(),
        tolerance in any::<i64>(),
    ) {
        let v = webhook::verify(&payload, &header, &secret, now, tolerance);
        let p = webhook::parse(&payload, &header, &secret, now, tolerance);
        // A header that was not made with the secret never passes.
        prop_assert!(v.is_err());
        prop_assert_eq!(v.err(), p.err());
    }

    #[test]
    fn parse_of_a_genuinely_signed_payload_never_panics(
        payload in prop_oneof![any::<String>(), event_payload()],
        secret in any::<String>(),
        t in 0i64..4_000_000_000,
    ) {
        let header = webhook::sign(&payload, &secret, t);
        match webhook::parse(&payload, &header, &secret, t, webhook::DEFAULT_TOLERANCE_SECS) {
            Ok(e) => {
                // Whatever parsed came from the payload.
                let raw: Value = serde_json::from_str(&payload).unwrap();
                prop_assert_eq!(raw["id"].as_str(), Some(e.id.as_str()));
                prop_assert_eq!(raw["type"].as_str(), Some(e.kind.as_str()));
                if let EventKind::ChargeRefunded { amount_refunded, .. } = e.what {
                    prop_assert_eq!(
                        raw["data"]["object"]["amount_refunded"].as_u64(),
                        Some(amount_refunded)
                    );
                }
            }
            Err(WebhookError::Payload(_)) => {}
            Err(other) => prop_assert!(false, "signed payload refused: {other:?}"),
        }
    }

    #[test]
    fn sign_then_verify_round_trips(
        payload in any::<String>(),
        secret in any::<String>(),
        t in any::<i64>(),
        tolerance in 0i64..100_000,
        skew in -100_000i64..=100_000,
    ) {
        let header = webhook::sign(&payload, &secret, t);
        // At the signing time itself.
        prop_assert_eq!(webhook::verify(&payload, &header, &secret, t, tolerance), Ok(()));
        // Anywhere within the tolerance, before or after.
        let within = skew.clamp(-tolerance, tolerance);
        if let Some(now) = t.checked_add(within) {
            prop_assert_eq!(webhook::verify(&payload, &header, &secret, now, tolerance), Ok(()));
        }
        // Beyond it, stale.
        let beyond = if skew < 0 { -tolerance - 1 } else { tolerance + 1 };
        if let Some(now) = t.checked_add(beyond) {
            prop_assert_eq!(
                webhook::verify(&payload, &header, &secret, now, tolerance),
                Err(WebhookError::Stale { t, now })
            );
        }
        // Another secret never verifies it.
        let other = format!("{secret}x");
        prop_assert_eq!(
            webhook::verify(&payload, &header, &other, t, tolerance),
            Err(WebhookError::BadSignature)
        );
    }

    #[test]
    fn a_signature_for_another_time_does_not_verify(
        payload in any::<String>(),
        secret in any::<String>(),
        t in 0i64..4_000_000_000,
        shift in 1i64..1000,
    ) {
        // The timestamp is signed: moving `t` in the header breaks the signature.
        let header = webhook::sign(&payload, &secret, t);
        let moved = header.replacen(&format!("t={t},"), &format!("t={},", t + shift), 1);
        prop_assert_eq!(
            webhook::verify(&payload, &moved, &secret, t, 300_000),
            Err(WebhookError::BadSignature)
        );
    }

    #[test]
    fn any_single_character_change_fails_verification(
        payload in ".{1,200}",
        secret in any::<String>(),
        t in 0i64..4_000_000_000,
        at in any::<prop::sample::Index>(),
        with in any::<char>(),
    ) {
        let header = webhook::sign(&payload, &secret, t);
        let chars: Vec<char> = payload.chars().collect();
        let i = at.index(chars.len());
        prop_assume!(chars[i] != with);
        let mut changed = chars.clone();
        changed[i] = with;
        let changed: String = changed.into_iter().collect();
        prop_assert_eq!(
            webhook::verify(&changed, &header, &secret, t, 300),
            Err(WebhookError::BadSignature)
        );
        prop_assert_eq!(
            webhook::parse(&changed, &header, &secret, t, 300),
            Err(WebhookError::BadSignature)
        );
        // Inserting or removing that character fails as well.
        let mut longer = chars.clone();
        longer.insert(i, with);
        let longer: String = longer.into_iter().collect();
        prop_assert_eq!(
            webhook::verify(&longer, &header, &secret, t, 300),
            Err(WebhookError::BadSignature)
        );
        let mut shorter = chars;
        shorter.remove(i);
        let shorter: String = shorter.into_iter().collect();
        prop_assert_eq!(
            webhook::verify(&shorter, &header, &secret, t, 300),
            Err(WebhookError::BadSignature)
        );
    }
}

proptest! {
    // Was a bug (unchecked `now - t`); fixed with `abs_diff`.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn verify_never_panics_on_a_genuine_signature_at_any_time(
        payload in any::<String>(),
        secret in any::<String>(),
        t in any::<i64>(),
        now in any::<i64>(),
    ) {
        let header = webhook::sign(&payload, &secret, t);
        let r = webhook::verify(&payload, &header, &secret, now, 300);
        let fresh = i128::from(now).abs_diff(i128::from(t)) <= 300;
        prop_assert_eq!(r.is_ok(), fresh);
    }
}

/// The overflow that was fixed, pinned: `t = i64::MIN` signed with the endpoint's secret.
#[test]
fn verify_of_an_extreme_timestamp_is_stale_not_a_panic() {
    let payload = r#"{"id":"evt_1","type":"payment_intent.succeeded","data":{"object":{}}}"#;
    for (t, now) in [(i64::MIN, 1), (i64::MAX, -1), (i64::MIN, 0)] {
        let header = webhook::sign(payload, "whsec_x", t);
        let r = std::panic::catch_unwind(|| webhook::verify(payload, &header, "whsec_x", now, 300));
        assert_eq!(
            r.ok(),
            Some(Err(WebhookError::Stale { t, now })),
            "t={t} now={now}"
        );
    }
}
