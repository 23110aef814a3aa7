#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic,
    clippy::print_stderr,
    missing_docs
)]
//! Property tests for everything the rail reads from the other side: NIP-47 JSON (requests,
//! responses, notifications, transactions), connection URIs, preimages, and BOLT11 invoices.
//! Nothing may panic whatever the input; what is accepted round-trips; a preimage matches
//! exactly its SHA-256; and a tampered invoice never passes as one signed by our node.

use std::str::FromStr;
use std::sync::LazyLock;

use bitcoin::hashes::{Hash, sha256};
use lightning_invoice::Bolt11Invoice;
use nwc_devnet::Network;
use proptest::prelude::*;
use proptest::sample::Index;
use rail_ln_nwc::nip47::{
    ConnectionUri, ErrorCode, Notification, Request, Response, Transaction, TxState,
};
use rail_ln_nwc::rail::preimage_matches;
use serde_json::{Map, Value};

/// `cases` cases (`PROPTEST_CASES` overrides, for a longer hunt); failures are reported with
/// the minimal input, not persisted to a file.
fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(cases),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ---------------------------------------------------------------------------------------------
// NIP-47 JSON
// ---------------------------------------------------------------------------------------------

const METHODS: &[&str] = &[
    "pay_invoice",
    "make_invoice",
    "make_hold_invoice",
    "settle_hold_invoice",
    "cancel_hold_invoice",
    "lookup_invoice",
    "list_transactions",
    "get_balance",
    "get_info",
    "multi_pay_invoice",
    "pay_keysend",
];
const CODES: &[&str] = &[
    "RATE_LIMITED",
    "NOT_IMPLEMENTED",
    "INSUFFICIENT_BALANCE",
    "QUOTA_EXCEEDED",
    "RESTRICTED",
    "UNAUTHORIZED",
    "INTERNAL",
    "UNSUPPORTED_ENCRYPTION",
    "PAYMENT_FAILED",
    "NOT_FOUND",
    "OTHER",
    "BAD_REQUEST",
    "",
];
const STATES: &[&str] = &[
    "pending", "accepted", "settled", "expired", "failed", "unknown", "frozen", "SETTLED", "",
];
const NOTIFICATIONS: &[&str] = &[
    "payment_received",
    "payment_sent",
    "hold_invoice_accepted",
    "balance_changed",
];
const TX_KEYS: &[&str] = &[
    "type",
    "state",
    "invoice",
    "description",
    "description_hash",
    "preimage",
    "payment_hash",
    "amount",
    "fees_paid",
    "created_at",
    "expires_at",
    "settled_at",
    "metadata",
    "settle_deadline",
];

/// Any JSON value. Floats come from any `f64` (NaN and infinities become null, as in
/// `serde_json`), and numbers straddle the `u64` / `i64` edges.
fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        Just(serde_json::from_str::<Value>("18446744073709551616").unwrap()),
        Just(serde_json::from_str::<Value>("-0.0").unwrap()),
        Just(serde_json::from_str::<Value>("1e400").unwrap_or(Value::Null)),
        ".{0,12}".prop_map(Value::from),
        prop::sample::select(METHODS).prop_map(Value::from),
        prop::sample::select(CODES).prop_map(Value::from),
        prop::sample::select(STATES).prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(arb_key(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(TX_KEYS).prop_map(str::to_owned),
        prop::sample::select(&["result_type", "error", "result", "code", "message"][..])
            .prop_map(str::to_owned),
        ".{0,8}",
    ]
}

/// Mostly `good`, sometimes anything at all.
fn mostly(good: BoxedStrategy<Value>) -> BoxedStrategy<Value> {
    prop_oneof![6 => good, 1 => arb_json()].boxed()
}

/// An object with (usually) the given fields, each (usually) of the right type, plus a few
/// unknown fields.
fn shaped(fields: Vec<(&'static str, BoxedStrategy<Value>)>) -> BoxedStrategy<Value> {
    let names: Vec<&'static str> = fields.iter().map(|(n, _)| *n).collect();
    let values: Vec<_> = fields
        .into_iter()
        .map(|(_, s)| proptest::option::weighted(0.9, mostly(s)))
        .collect();
    (
        values,
        prop::collection::btree_map(arb_key(), arb_json(), 0..3),
    )
        .prop_map(move |(values, extra)| {
            let mut m: Map<String, Value> = extra.into_iter().collect();
            for (name, v) in names.iter().zip(values) {
                if let Some(v) = v {
                    m.insert((*name).to_owned(), v);
                }
            }
            Value::Object(m)
        })
        .boxed()
}

fn json_str(pattern: &'static str) -> BoxedStrategy<Value> {
    pattern.prop_map(Value::from).boxed()
}

fn json_u64() -> BoxedStrategy<Value> {
    prop_oneof![
        any::<u64>().prop_map(Value::from),
        (0u64..2_000_000_000).prop_map(Value::from),
    ]
    .boxed()
}

fn hex_value(len: usize) -> BoxedStrategy<Value> {
    prop::collection::vec(any::<u8>(), len)
        .prop_map(|b| Value::from(hex::encode(b)))
        .boxed()
}

fn shaped_transaction() -> BoxedStrategy<Value> {
    shaped(vec![
        (
            "type",
            prop::sample::select(&["incoming", "outgoing", "sideways"][..])
                .prop_map(Value::from)
                .boxed(),
        ),
        (
            "state",
            prop::sample::select(STATES).prop_map(Value::from).boxed(),
        ),
        ("invoice", json_str("lnbcrt[0-9a-z]{0,60}")),
        ("description", json_str(".{0,20}")),
        ("preimage", hex_value(32)),
        ("payment_hash", hex_value(32)),
        ("amount", json_u64()),
        ("fees_paid", json_u64()),
        ("created_at", json_u64()),
        ("expires_at", json_u64()),
        ("settled_at", json_u64()),
    ])
}

fn shaped_response() -> BoxedStrategy<Value> {
    let error = prop_oneof![
        Just(Value::Null).boxed(),
        shaped(vec![
            (
                "code",
                prop_oneof![
                    prop::sample::select(CODES).prop_map(Value::from),
                    ".{0,10}".prop_map(Value::from)
                ]
                .boxed(),
            ),
            ("message", json_str(".{0,20}")),
        ]),
    ];
    let result = prop_oneof![
        shaped_transaction(),
        shaped(vec![("balance", json_u64())]),
        shaped(vec![("preimage", hex_value(32)), ("fees_paid", json_u64())]),
        arb_json().boxed(),
    ];
    shaped(vec![
        (
            "result_type",
            prop::sample::select(METHODS).prop_map(Value::from).boxed(),
        ),
        ("error", error.boxed()),
        ("result", result.boxed()),
    ])
}

fn shaped_notification() -> BoxedStrategy<Value> {
    shaped(vec![
        (
            "notification_type",
            prop::sample::select(NOTIFICATIONS)
                .prop_map(Value::from)
                .boxed(),
        ),
        (
            "notification",
            prop_oneof![shaped_transaction(), arb_json().boxed()].boxed(),
        ),
    ])
}

fn shaped_request() -> BoxedStrategy<Value> {
    let params = prop_oneof![
        shaped(vec![
            ("invoice", json_str("lnbcrt[0-9a-z]{0,60}")),
            ("amount", json_u64()),
        ]),
        shaped(vec![
            ("amount", json_u64()),
            ("payment_hash", hex_value(32)),
            ("description", json_str(".{0,20}")),
            ("expiry", json_u64()),
        ]),
        arb_json().boxed(),
    ];
    shaped(vec![
        (
            "method",
            prop::sample::select(METHODS).prop_map(Value::from).boxed(),
        ),
        ("params", params.boxed()),
    ])
}

/// Parses `text` as `T`; if accepted, `T` must survive a trip through JSON unchanged.
fn parse_and_round_trip<T>(text: &str) -> Result<(), TestCaseError>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    if let Ok(t) = serde_json::from_str::<T>(text) {
        // Through a `Value` (exact, whatever the floats), and through text.
        let v = serde_json::to_value(&t).unwrap();
        prop_assert_eq!(&serde_json::from_value::<T>(v).unwrap(), &t);
        let s = serde_json::to_string(&t).unwrap();
        prop_assert!(serde_json::from_str::<T>(&s).is_ok(), "{s}");
    }
    Ok(())
}

fn all_types(text: &str) -> Result<(), TestCaseError> {
    parse_and_round_trip::<Response>(text)?;
    parse_and_round_trip::<Notification>(text)?;
    parse_and_round_trip::<Request>(text)?;
    parse_and_round_trip::<Transaction>(text)?;
    Ok(())
}

fn arb_tx_state() -> impl Strategy<Value = Option<TxState>> {
    proptest::option::of(prop::sample::select(vec![
        TxState::Pending,
        TxState::Accepted,
        TxState::Settled,
        TxState::Expired,
        TxState::Failed,
        TxState::Unknown,
    ]))
}

fn opt_str() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(".{0,16}")
}

/// A well-formed transaction (what a wallet following NIP-47 sends).
fn arb_transaction() -> impl Strategy<Value = Transaction> {
    (
        (
            prop::sample::select(&["incoming", "outgoing"][..]),
            arb_tx_state(),
            opt_str(),
            opt_str(),
            proptest::option::of(any::<[u8; 32]>().prop_map(hex::encode)),
            any::<[u8; 32]>().prop_map(hex::encode),
        ),
        (
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            proptest::option::of(any::<u64>()),
            proptest::option::of(any::<u64>()),
        ),
    )
        .prop_map(
            |(
                (kind, state, invoice, description, preimage, payment_hash),
                (amount, fees_paid, created_at, expires_at, settled_at),
            )| Transaction {
                kind: kind.to_owned(),
                state,
                invoice,
                description,
                preimage,
                payment_hash,
                amount,
                fees_paid,
                created_at,
                expires_at,
                settled_at,
            },
        )
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn nip47_json_never_panics_on_arbitrary_strings(s in any::<String>()) {
        all_types(&s)?;
    }

    #[test]
    fn nip47_json_never_panics_on_json_like_text(
        s in r#"[\[\]{}":,0-9a-z_ .eE+\-\\]{0,80}"#
    ) {
        all_types(&s)?;
    }

    #[test]
    fn nip47_json_never_panics_on_arbitrary_values(v in arb_json()) {
        all_types(&v.to_string())?;
    }

    #[test]
    fn responses_of_roughly_the_right_shape(v in shaped_response()) {
        all_types(&v.to_string())?;
    }

    #[test]
    fn notifications_of_roughly_the_right_shape(v in shaped_notification()) {
        all_types(&v.to_string())?;
    }

    #[test]
    fn requests_of_roughly_the_right_shape(v in shaped_request()) {
        all_types(&v.to_string())?;
    }

    #[test]
    fn transactions_of_roughly_the_right_shape(v in shaped_transaction()) {
        all_types(&v.to_string())?;
    }

    /// Well-formed transactions are always accepted, whatever unknown fields ride along and
    /// whatever state string a newer wallet uses.
    #[test]
    fn well_formed_transactions_are_accepted(
        tx in arb_transaction(),
        extra in prop::collection::btree_map("[a-z_]{1,10}", arb_json(), 0..4),
        new_state in proptest::option::of("[a-z_]{1,12}"),
    ) {
        let mut v = serde_json::to_value(&tx).unwrap();
        let obj = v.as_object_mut().unwrap();
        for (k, x) in extra {
            if !TX_KEYS.contains(&k.as_str()) {
                obj.insert(k, x);
            }
        }
        let mut want = tx.clone();
        if let Some(s) = &new_state {
            obj.insert("state".into(), Value::from(s.as_str()));
            want.state = Some(match s.as_str() {
                "pending" => TxState::Pending,
                "accepted" => TxState::Accepted,
                "settled" => TxState::Settled,
                "expired" => TxState::Expired,
                "failed" => TxState::Failed,
                _ => TxState::Unknown,
            });
        }
        let text = v.to_string();
        let got: Transaction = serde_json::from_str(&text).unwrap();
        prop_assert_eq!(&got, &want);
        // Through a notification and a response too.
        let n: Notification = serde_json::from_str(&format!(
            r#"{{"notification_type":"payment_received","notification":{text}}}"#
        )).unwrap();
        prop_assert_eq!(
            serde_json::from_value::<Transaction>(n.notification).unwrap(),
            want.clone()
        );
        let r: Response = serde_json::from_str(&format!(
            r#"{{"result_type":"lookup_invoice","result":{text},"error":null}}"#
        )).unwrap();
        prop_assert!(r.error.is_none());
        prop_assert_eq!(serde_json::from_value::<Transaction>(r.result.unwrap()).unwrap(), want);
    }

    /// Error codes are kept verbatim, known or not.
    #[test]
    fn error_codes_round_trip(code in prop_oneof![
        prop::sample::select(CODES).prop_map(str::to_owned),
        ".{0,16}",
    ], message in ".{0,20}") {
        let parsed = ErrorCode::from(code.as_str());
        prop_assert_eq!(parsed.as_str(), code.as_str());
        let text = serde_json::json!({
            "result_type": "pay_invoice",
            "error": {"code": code, "message": message},
        }).to_string();
        let r: Response = serde_json::from_str(&text).unwrap();
        let e = r.error.unwrap();
        prop_assert_eq!(e.code.as_str(), code.as_str());
        prop_assert_eq!(e.message, message);
    }
}

#[test]
fn deeply_nested_json_is_refused_not_overflowed() {
    for depth in [64, 200, 10_000, 100_000] {
        for (open, close) in [("[", "]"), ("{\"a\":", "}")] {
            let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            for text in [
                nested.clone(),
                format!(r#"{{"result_type":"x","result":{nested}}}"#),
                format!(r#"{{"notification_type":"x","notification":{nested}}}"#),
                format!(r#"{{"method":"x","params":{nested}}}"#),
            ] {
                all_types(&text).unwrap();
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Connection URIs
// ---------------------------------------------------------------------------------------------

fn hex32() -> impl Strategy<Value = String> {
    any::<[u8; 32]>().prop_map(hex::encode)
}

/// Relay URLs, plausible and not: ports, paths, query-ish and fragment-ish characters,
/// percent signs, plus signs, spaces, non-ASCII.
fn arb_relay() -> impl Strategy<Value = String> {
    prop_oneof![
        "wss?://[a-z0-9-]{1,12}(\\.[a-z]{2,5}){0,2}(:[0-9]{1,5})?/?",
        "wss://[a-z]{1,8}/[ -~]{0,24}",
        "wss://[a-z]{1,8}\\?[a-z]{1,4}=[a-z&=%+#]{0,10}",
        "wss?://\\PC{1,12}",
        "[ -~]{0,16}",
        Just("wss://relay.example.com/?secret=00&relay=x#frag".to_owned()),
        Just("ws://127.0.0.1:7000".to_owned()),
        Just(String::new()),
    ]
}

fn arb_lud16() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(prop_oneof![
        "[a-z0-9._+-]{1,12}@[a-z0-9.-]{1,12}",
        "\\PC{1,16}",
        "[ -~]{1,16}",
    ])
}

fn arb_uri() -> impl Strategy<Value = ConnectionUri> {
    (
        hex32(),
        prop::collection::vec(arb_relay(), 1..=3),
        hex32(),
        arb_lud16(),
    )
        .prop_map(|(wallet_pubkey, relays, secret, lud16)| ConnectionUri {
            wallet_pubkey,
            relays,
            secret,
            lud16,
        })
}

fn query_pair() -> impl Strategy<Value = String> {
    let key = prop_oneof![
        Just("relay".to_owned()),
        Just("secret".to_owned()),
        Just("lud16".to_owned()),
        "[a-z%+=&]{0,6}",
    ];
    let value = prop_oneof![
        hex32(),
        hex32().prop_map(|h| h.to_uppercase()),
        "[0-9a-fA-F]{60,68}",
        "[ -~]{0,20}",
        "\\PC{0,8}",
        "(%[0-9a-fA-F]{0,2}){1,4}",
    ];
    (key, value).prop_map(|(k, v)| format!("{k}={v}"))
}

/// Strings that get past the scheme and often further.
fn uri_like() -> impl Strategy<Value = String> {
    (
        prop::sample::select(
            &[
                "nostr+walletconnect://",
                "nostr+walletconnect:",
                "nostr+walletconnect:/",
                "NOSTR+WALLETCONNECT://",
                "",
            ][..],
        ),
        prop_oneof![
            hex32(),
            hex32().prop_map(|h| h.to_uppercase()),
            "[0-9a-fA-F/]{60,70}",
            "\\PC{0,8}",
        ],
        prop::sample::select(&["?", "/?", "", "??", "#?"][..]),
        prop::collection::vec(query_pair(), 0..5),
        prop::sample::select(&["&", "&&", ";"][..]),
    )
        .prop_map(|(scheme, pk, q, pairs, sep)| format!("{scheme}{pk}{q}{}", pairs.join(sep)))
}

fn check_parsed(s: &str) -> Result<(), TestCaseError> {
    if let Ok(u) = ConnectionUri::from_str(s) {
        let is_hex = |h: &str| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        prop_assert!(is_hex(&u.wallet_pubkey), "{u:?}");
        prop_assert!(is_hex(&u.secret), "{u:?}");
        prop_assert!(!u.relays.is_empty());
        prop_assert_ne!(u.lud16.as_deref(), Some(""));
        // What we accepted, we print back into something that parses to the same.
        prop_assert_eq!(ConnectionUri::from_str(&u.to_string()), Ok(u.clone()));
        // The secret never shows in Debug.
        let shown = format!("{u:?}");
        prop_assert!(!shown.contains(&u.secret));
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn connection_uri_never_panics_on_arbitrary_strings(s in any::<String>()) {
        check_parsed(&s)?;
    }

    #[test]
    fn connection_uri_never_panics_on_near_misses(s in uri_like()) {
        check_parsed(&s)?;
    }

    #[test]
    fn connection_uri_display_then_parse_is_identity(u in arb_uri()) {
        let s = u.to_string();
        prop_assert!(s.starts_with("nostr+walletconnect://"));
        prop_assert_eq!(ConnectionUri::from_str(&s), Ok(u.clone()));
        // The short scheme form and a trailing slash after the key mean the same.
        let rest = s.strip_prefix("nostr+walletconnect://").unwrap();
        prop_assert_eq!(
            ConnectionUri::from_str(&format!("nostr+walletconnect:{rest}")),
            Ok(u.clone())
        );
        let (pk, query) = rest.split_once('?').unwrap();
        prop_assert_eq!(
            ConnectionUri::from_str(&format!("nostr+walletconnect://{pk}/?{query}")),
            Ok(u.clone())
        );
        // Upper-case hex is read as the same key and secret.
        let upper = format!("nostr+walletconnect://{}?{query}", pk.to_uppercase())
            .replace(
                &format!("secret={}", u.secret),
                &format!("secret={}", u.secret.to_uppercase()),
            );
        prop_assert_eq!(ConnectionUri::from_str(&upper), Ok(u.clone()));
        check_parsed(&s)?;
    }
}

// ---------------------------------------------------------------------------------------------
// Preimages
// ---------------------------------------------------------------------------------------------

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(sha256::Hash::hash(bytes).to_byte_array())
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn a_preimage_matches_its_own_hash(p in any::<[u8; 32]>()) {
        let (ph, hh) = (hex::encode(p), sha256_hex(&p));
        prop_assert!(preimage_matches(&ph, &hh));
        prop_assert!(preimage_matches(&ph.to_uppercase(), &hh.to_uppercase()));
    }

    #[test]
    fn any_other_preimage_does_not(
        p in any::<[u8; 32]>(),
        q in any::<[u8; 32]>(),
        bit in 0usize..256,
    ) {
        prop_assume!(p != q);
        let hh = sha256_hex(&p);
        prop_assert!(!preimage_matches(&hex::encode(q), &hh));
        // Nor does the right preimage against a hash one bit off.
        let mut h = sha256::Hash::hash(&p).to_byte_array();
        h[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(!preimage_matches(&hex::encode(p), &hex::encode(h)));
        // Nor the right preimage one bit off.
        let mut p2 = p;
        p2[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(!preimage_matches(&hex::encode(p2), &hh));
    }

    /// Preimages are 32 bytes: a shorter or longer one never matches, even its own hash.
    #[test]
    fn only_32_byte_preimages_match(p in prop::collection::vec(any::<u8>(), 0..80)) {
        prop_assert_eq!(preimage_matches(&hex::encode(&p), &sha256_hex(&p)), p.len() == 32);
    }

    #[test]
    fn preimage_matches_never_panics(
        a in prop_oneof![any::<String>(), "[0-9a-fA-F]{0,70}", "[0-9a-fA-F ]{62,66}"],
        b in prop_oneof![any::<String>(), "[0-9a-fA-F]{0,70}"],
    ) {
        if preimage_matches(&a, &b) {
            let p = hex::decode(&a).unwrap();
            prop_assert_eq!(p.len(), 32);
            prop_assert_eq!(sha256_hex(&p), b.to_ascii_lowercase());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// BOLT11
// ---------------------------------------------------------------------------------------------

const CHARSET: &[u8; 32] = b"qpzry9x8gf2tvdw0s3jn54khce6mua7l";

/// The bech32 checksum (BIP-173), to build strings whose checksum is right.
fn polymod(values: &[u8]) -> u32 {
    const GEN: [u32; 5] = [
        0x3b6a_57b2,
        0x2650_8e6d,
        0x1ea1_19fa,
        0x3d42_33dd,
        0x2a14_62b3,
    ];
    let mut chk: u32 = 1;
    for &v in values {
        let top = chk >> 25;
        chk = ((chk & 0x01ff_ffff) << 5) ^ u32::from(v);
        for (i, g) in GEN.iter().enumerate() {
            if (top >> i) & 1 == 1 {
                chk ^= g;
            }
        }
    }
    chk
}

fn hrp_expand(hrp: &str) -> Vec<u8> {
    let lower = hrp.to_ascii_lowercase();
    let mut v: Vec<u8> = lower.bytes().map(|b| b >> 5).collect();
    v.push(0);
    v.extend(lower.bytes().map(|b| b & 31));
    v
}

/// `hrp` + `1` + `data` (5-bit words) + a valid bech32 checksum.
fn bech32_encode(hrp: &str, data: &[u8]) -> String {
    let mut values = hrp_expand(hrp);
    values.extend(data.iter().map(|d| d & 31));
    values.extend([0; 6]);
    let pm = polymod(&values) ^ 1;
    let mut s = format!("{hrp}1");
    for d in data {
        s.push(char::from(CHARSET[usize::from(d & 31)]));
    }
    for i in 0..6 {
        let word = (pm >> (5 * (5 - i))) & 31;
        s.push(char::from(CHARSET[usize::try_from(word).unwrap()]));
    }
    s
}

fn bech32_checksum_ok(s: &str) -> bool {
    let lower = s.to_ascii_lowercase();
    let Some(pos) = lower.rfind('1') else {
        return false;
    };
    let (hrp, rest) = (&lower[..pos], &lower[pos + 1..]);
    let Some(data) = rest
        .bytes()
        .map(|c| {
            CHARSET
                .iter()
                .position(|&x| x == c)
                .map(|p| u8::try_from(p).unwrap())
        })
        .collect::<Option<Vec<u8>>>()
    else {
        return false;
    };
    let mut values = hrp_expand(hrp);
    values.extend(data);
    polymod(&values) == 1
}

/// Splits a bech32 string into its hrp and its data words (checksum dropped).
fn bech32_split(s: &str) -> (String, Vec<u8>) {
    let pos = s.rfind('1').unwrap();
    let data: Vec<u8> = s[pos + 1..]
        .bytes()
        .map(|c| u8::try_from(CHARSET.iter().position(|&x| x == c).unwrap()).unwrap())
        .collect();
    (s[..pos].to_owned(), data[..data.len() - 6].to_vec())
}

struct Sample {
    node: String,
    invoices: Vec<(String, Bolt11Invoice)>,
}

/// Real devnet invoices (regular and hold, several amounts), from one node.
static SAMPLE: LazyLock<Sample> = LazyLock::new(|| {
    let net = Network::new();
    let node = net.add_wallet("shop", 0).unwrap();
    let mut invoices = Vec::new();
    for (i, amount) in [1_u64, 1_234, 21_000, 21_000_000_000]
        .into_iter()
        .enumerate()
    {
        let tx = net
            .make_invoice("shop", amount, Some("mutation target ⚡"), Some(600))
            .unwrap();
        invoices.push(tx.invoice.unwrap());
        let hash = sha256_hex(&[u8::try_from(i).unwrap(); 32]);
        let tx = net
            .make_hold_invoice("shop", amount, &hash, Some("hold"), Some(600), Some(40))
            .unwrap();
        invoices.push(tx.invoice.unwrap());
    }
    let invoices = invoices
        .into_iter()
        .map(|s| {
            let inv = Bolt11Invoice::from_str(&s).unwrap();
            assert_eq!(inv.recover_payee_pub_key().to_string(), node);
            (s, inv)
        })
        .collect();
    Sample { node, invoices }
});

#[derive(Clone, Debug)]
enum Edit {
    Replace(Index, char),
    Insert(Index, char),
    Delete(Index),
}

fn arb_char() -> impl Strategy<Value = char> {
    prop_oneof![
        4 => prop::sample::select(CHARSET.to_vec()).prop_map(char::from),
        1 => prop::sample::select(CHARSET.to_vec())
            .prop_map(|c| char::from(c.to_ascii_uppercase())),
        1 => prop::sample::select(&['1', 'b', 'i', 'o', ' ', '\n', '\u{0}', 'é'][..]),
        1 => any::<char>(),
    ]
}

fn arb_edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        3 => (any::<Index>(), arb_char()).prop_map(|(i, c)| Edit::Replace(i, c)),
        1 => (any::<Index>(), arb_char()).prop_map(|(i, c)| Edit::Insert(i, c)),
        1 => any::<Index>().prop_map(Edit::Delete),
    ]
}

fn apply(s: &str, edit: &Edit) -> String {
    let mut chars: Vec<char> = s.chars().collect();
    match edit {
        Edit::Replace(i, c) => {
            let at = i.index(chars.len());
            chars[at] = *c;
        }
        Edit::Insert(i, c) => chars.insert(i.index(chars.len() + 1), *c),
        Edit::Delete(i) => {
            let at = i.index(chars.len());
            chars.remove(at);
        }
    }
    chars.into_iter().collect()
}

/// The property every tampered invoice must have: if it still parses, its signature fails, or
/// it is the very same invoice, or it is not our node's any more. (Without an `n` field the
/// payee is whoever the signature recovers to, so a well-formed change that keeps a valid
/// checksum always "verifies", for some other key: what must never happen is a changed invoice
/// that still verifies as our node's.)
fn tamper_check(
    original: &Bolt11Invoice,
    node: &str,
    mutated: &str,
) -> Result<Option<Bolt11Invoice>, TestCaseError> {
    let Ok(inv) = Bolt11Invoice::from_str(mutated) else {
        return Ok(None);
    };
    if inv.check_signature().is_err() || inv == *original {
        return Ok(Some(inv));
    }
    prop_assert_ne!(
        inv.recover_payee_pub_key().to_string(),
        node,
        "a changed invoice still verifies as our node's: {}",
        mutated
    );
    Ok(Some(inv))
}

/// One tagged field: `tag`, a `len`-word length, `len` pseudo-random words from `seed`.
fn field(tag: u8, len: usize, seed: u64) -> Vec<u8> {
    let len = len.min(1023);
    let mut words = vec![
        tag & 31,
        u8::try_from(len / 32).unwrap(),
        u8::try_from(len % 32).unwrap(),
    ];
    let mut x = seed;
    for _ in 0..len {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        words.push(u8::try_from(x >> 59).unwrap());
    }
    words
}

/// Parses `s`; whatever is accepted has a signature that checks and answers every accessor.
fn parse_anything(s: &str) -> Result<(), TestCaseError> {
    if let Ok(inv) = Bolt11Invoice::from_str(s) {
        prop_assert!(inv.check_signature().is_ok());
        let _ = (
            inv.amount_milli_satoshis(),
            inv.description(),
            inv.expiry_time(),
            inv.expires_at(),
            inv.min_final_cltv_expiry_delta(),
            inv.route_hints(),
            inv.fallback_addresses(),
            inv.recover_payee_pub_key(),
            inv.features(),
            inv.payment_metadata(),
            inv.is_expired(),
        );
        // What was accepted re-encodes to something that parses to the same invoice.
        prop_assert_eq!(Bolt11Invoice::from_str(&inv.to_string()), Ok(inv.clone()));
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(1024))]

    #[test]
    fn bolt11_never_panics_on_arbitrary_strings(s in any::<String>()) {
        let _ = Bolt11Invoice::from_str(&s);
    }

    #[test]
    fn bolt11_never_panics_on_bech32_like_strings(
        s in concat!(
            "(ln|LN)(bc|bcrt|tb|tbs|sb|xx)?[0-9]{0,22}[munpx]?1",
            "[qpzry9x8gf2tvdw0s3jn54khce6mua7l]{0,700}"
        )
    ) {
        let _ = Bolt11Invoice::from_str(&s);
    }

    /// Random data words with a correct checksum: the parser gets past bech32 every time.
    #[test]
    fn bolt11_never_panics_on_random_data_with_a_valid_checksum(
        hrp in prop_oneof![
            prop::sample::select(&["lnbcrt", "lnbc", "lntb", "lntbs", "lnbcrt10p", "lnbcrt1234n",
                                   "lnbc2500u", "lnbc0", "lnbc1p", "lnbcrt18446744073709551616p",
                                   "lnbcrt99999999999999999999m", "ln", "lnsb"][..])
                .prop_map(str::to_owned),
            "ln[a-z0-9]{0,24}",
        ],
        data in prop::collection::vec(0u8..32, 0..900),
    ) {
        let s = bech32_encode(&hrp, &data);
        prop_assert!(bech32_checksum_ok(&s));
        parse_anything(&s)?;
    }

    /// Random well-formed tagged fields (right lengths, random contents, unknown tags included)
    /// after a real timestamp, with a random signature and a valid checksum: deep into the
    /// field parsers.
    #[test]
    fn bolt11_never_panics_on_random_tagged_fields(
        which in any::<Index>(),
        fields in prop::collection::vec(
            (
                0u8..32,
                prop_oneof![
                    prop::sample::select(vec![0usize, 1, 2, 4, 7, 10, 52, 53, 104, 1023]),
                    0usize..200,
                ],
                any::<u64>(),
            ),
            0..8,
        ),
        sig in prop::collection::vec(0u8..32, 104),
    ) {
        let (s, _) = &SAMPLE.invoices[which.index(SAMPLE.invoices.len())];
        let (hrp, data) = bech32_split(s);
        let mut words = data[..7].to_vec();
        for (tag, len, seed) in fields {
            words.extend(field(tag, len, seed));
        }
        words.extend(sig);
        parse_anything(&bech32_encode(&hrp, &words))?;
    }

    /// A real invoice's own fields, dropped, duplicated, reordered, corrupted and joined by
    /// random ones, under its own or a random signature: the semantic checks (one payment
    /// hash, a payment secret, a description, features) and the signature, with a valid
    /// checksum every time.
    #[test]
    fn restructured_invoices_never_verify_as_ours(
        which in any::<Index>(),
        ops in prop::collection::vec(
            (0u8..5, any::<Index>(), any::<Index>(), 0u8..32, 0usize..80, any::<u64>()),
            1..5,
        ),
        random_sig in proptest::option::weighted(0.2, prop::collection::vec(0u8..32, 104)),
    ) {
        let (s, original) = &SAMPLE.invoices[which.index(SAMPLE.invoices.len())];
        let (hrp, data) = bech32_split(s);
        let mut fields: Vec<Vec<u8>> = tagged_fields(&data)
            .into_iter()
            .map(|(_, start, len)| data[start - 3..start + len].to_vec())
            .collect();
        for (op, a, b, x, len, seed) in ops {
            match op {
                0 if !fields.is_empty() => {
                    fields.remove(a.index(fields.len()));
                }
                1 if !fields.is_empty() => {
                    let f = fields[a.index(fields.len())].clone();
                    fields.insert(b.index(fields.len() + 1), f);
                }
                2 if !fields.is_empty() => {
                    let i = a.index(fields.len());
                    let j = b.index(fields.len());
                    fields.swap(i, j);
                }
                3 if !fields.is_empty() => {
                    let i = a.index(fields.len());
                    let j = b.index(fields[i].len());
                    fields[i][j] ^= x.max(1);
                }
                _ => fields.insert(b.index(fields.len() + 1), field(x, len, seed)),
            }
        }
        let mut words = data[..7].to_vec();
        words.extend(fields.concat());
        words.extend(random_sig.unwrap_or_else(|| data[data.len() - 104..].to_vec()));
        let mutated = bech32_encode(&hrp, &words);
        parse_anything(&mutated)?;
        tamper_check(original, &SAMPLE.node, &mutated)?;
    }

    /// One-character edits of a real devnet invoice (replace, insert, delete; any character).
    #[test]
    fn one_character_mutations_of_our_invoices_never_verify_as_ours(
        which in any::<Index>(),
        edit in arb_edit(),
    ) {
        let (s, original) = &SAMPLE.invoices[which.index(SAMPLE.invoices.len())];
        let mutated = apply(s, &edit);
        tamper_check(original, &SAMPLE.node, &mutated)?;
    }

    /// Data-word edits with the checksum recomputed (what bech32 cannot catch): anywhere in the
    /// timestamp, the tagged fields or the signature.
    #[test]
    fn checksum_preserving_mutations_of_our_invoices_never_verify_as_ours(
        which in any::<Index>(),
        edits in prop::collection::vec((any::<Index>(), 1u8..32), 1..4),
    ) {
        let (s, original) = &SAMPLE.invoices[which.index(SAMPLE.invoices.len())];
        let (hrp, mut data) = bech32_split(s);
        for (at, x) in &edits {
            let i = at.index(data.len());
            data[i] ^= x;
        }
        let mutated = bech32_encode(&hrp, &data);
        tamper_check(original, &SAMPLE.node, &mutated)?;
    }
}

/// Every single-character edit of several devnet invoices, exhaustively: substitutions by every
/// bech32 character (either case) and a few others, deletions, insertions of every bech32
/// character. A one-character substitution can never keep a bech32 checksum (the generator has
/// a non-zero constant term), so none of those parses; insertions and deletions are caught too
/// except for bech32's known weakness (a `q` inserted or deleted just before a final `p`),
/// covered by the next test.
#[test]
fn every_single_character_edit_of_our_invoices_is_refused() {
    let sample = &*SAMPLE;
    let mut alphabet: Vec<char> = CHARSET.iter().map(|&c| char::from(c)).collect();
    alphabet.extend(CHARSET.iter().map(|&c| char::from(c.to_ascii_uppercase())));
    alphabet.extend(['1', 'b', 'i', 'o', ' ']);
    let mut tried = 0_usize;
    for (s, original) in sample.invoices.iter().take(4) {
        let chars: Vec<char> = s.chars().collect();
        let mut edits: Vec<String> = Vec::new();
        for at in 0..chars.len() {
            for &c in &alphabet {
                if c != chars[at] {
                    let mut m = chars.clone();
                    m[at] = c;
                    edits.push(m.into_iter().collect());
                }
            }
            let mut m = chars.clone();
            m.remove(at);
            edits.push(m.into_iter().collect());
        }
        for at in 0..=chars.len() {
            for &c in CHARSET {
                let mut m = chars.clone();
                m.insert(at, char::from(c));
                edits.push(m.into_iter().collect());
            }
        }
        for m in &edits {
            if m == s {
                continue;
            }
            tried += 1;
            let parsed = tamper_check(original, &sample.node, m).unwrap();
            // The q-before-final-p case aside, nothing single-character gets through at all.
            let qp_weakness = s.ends_with('p') && bech32_checksum_ok(m);
            assert!(
                parsed.is_none() || qp_weakness,
                "a one-character edit parses: {m}"
            );
        }
    }
    eprintln!("{tried} single-character edits refused");
    assert!(tried > 50_000);
}

/// bech32's known mutation weakness (the reason bech32m exists, BIP-350): when the string ends
/// in `p`, inserting or deleting `q`s just before it keeps the checksum valid. Such an edit
/// moves the data/signature boundary; it must still not yield an invoice that verifies as our
/// node's with different content.
#[test]
fn the_bech32_q_before_final_p_weakness_does_not_forge_our_invoices() {
    let net = Network::new();
    let node = net.add_wallet("shop", 0).unwrap();
    let mut found = 0;
    let mut parsed = 0;
    for i in 0..2_000_u32 {
        let tx = net
            .make_invoice("shop", 1_000 + u64::from(i), Some("qp"), Some(600))
            .unwrap();
        let s = tx.invoice.unwrap();
        if !s.ends_with('p') {
            continue;
        }
        found += 1;
        let original = Bolt11Invoice::from_str(&s).unwrap();
        let (head, _) = s.split_at(s.len() - 1);
        let mut edits = Vec::new();
        for n in 1..=3 {
            edits.push(format!("{head}{}p", "q".repeat(n)));
        }
        let mut shorter = head.to_owned();
        while shorter.ends_with('q') {
            shorter.pop();
            edits.push(format!("{shorter}p"));
        }
        for m in &edits {
            assert!(bech32_checksum_ok(m), "the weakness holds: {m}");
            if tamper_check(&original, &node, m).unwrap().is_some() {
                parsed += 1;
            }
        }
        if found == 8 {
            break;
        }
    }
    assert!(found >= 8, "only {found} invoices ending in p");
    eprintln!("q-before-p edits: {found} invoices, {parsed} edits parsed (none as ours)");
}

/// The tagged fields of an invoice's data words: (tag, start of the field's data, its length).
fn tagged_fields(data: &[u8]) -> Vec<(u8, usize, usize)> {
    let end = data.len() - 104;
    let mut fields = Vec::new();
    let mut at = 7;
    while at + 3 <= end {
        let len = usize::from(data[at + 1]) * 32 + usize::from(data[at + 2]);
        fields.push((data[at], at + 3, len));
        at += 3 + len;
    }
    fields
}

/// The padding bits of the payment hash (`p`), payment secret (`s`) and description (`d`)
/// fields: BOLT11 writers must make them 0 and the signature covers them as sent. Setting them
/// gives another string; `lightning-invoice` 0.34 drops them and checks the signature against
/// its own re-encoding, so it reads the very same invoice, from the same node (a spec-literal
/// reader, like PyPI `bolt11`, recovers another payee: see `interop.rs`). Whether refused or
/// read that way, the content must never change.
#[test]
fn padding_bits_never_change_what_an_invoice_says() {
    let sample = &*SAMPLE;
    let (mut tried, mut read_as_original) = (0, 0);
    for (s, original) in &sample.invoices {
        let (hrp, data) = bech32_split(s);
        for (tag, start, len) in tagged_fields(&data) {
            let bits = match tag {
                1 | 16 => 4,       // 52 words = 256 bits + 4
                13 => len * 5 % 8, // d: whole bytes, then padding
                _ => continue,
            };
            for flip in 1..(1_u8 << bits) {
                let mut d = data.clone();
                d[start + len - 1] ^= flip;
                let m = bech32_encode(&hrp, &d);
                assert_ne!(&m, s);
                tried += 1;
                if let Some(inv) = tamper_check(original, &sample.node, &m).unwrap() {
                    assert_eq!(&inv, original, "{m}");
                    assert_eq!(&inv.to_string(), s, "re-encoding drops the padding");
                    read_as_original += 1;
                }
            }
        }
    }
    assert!(tried >= 8 * 30, "{tried}");
    eprintln!(
        "{tried} padding-bit variants of our invoices: {read_as_original} read as the original \
         invoice (same payee), {} refused",
        tried - read_as_original
    );
}
