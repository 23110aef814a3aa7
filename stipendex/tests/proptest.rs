//! Properties of the envelope: the JWS parser never panics, signing then parsing round-trips any
//! content, a single changed byte is always refused, the tag grammar is exactly
//! `<type>/<major>.<minor>`, and digests round-trip through their text form.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

use std::sync::LazyLock;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use proptest::prelude::*;
use serde_json::{Value, json};
use stipendex::envelope::{
    Allow, Capability, Digest, Limits, Mandate, Party, Period, Profile, Proof, Quote, RailOffer,
    SecretKey, Signed, Tag, jws,
};
use stipendex::rail_core::RailId;
use stipendex::{Amount, Asset, Money, Offer, Payment, PaymentMode, Timestamp};

const CASES: u32 = 256;
const SIGNED_CASES: u32 = 128;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// An asset of the scales the rails use: USD (2), USDC (6), BTC (11: millisatoshi).
fn asset() -> impl Strategy<Value = Asset> {
    prop_oneof![Just(Asset::usd()), Just(Asset::usdc()), Just(Asset::btc())]
}

/// An amount that fits `asset`: any number of minor units (up to 10^18) at the asset's scale.
fn amount_in(asset: &Asset) -> impl Strategy<Value = Amount> + use<> {
    let scale = asset.scale();
    (0u128..=1_000_000_000_000_000_000)
        .prop_map(move |units| Amount::from_minor(units, scale).unwrap())
}

fn key() -> impl Strategy<Value = SecretKey> {
    any::<[u8; 32]>().prop_map(|s| SecretKey::from_seed(&s))
}

fn id(prefix: &'static str) -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-]{1,62}".prop_map(move |rest| format!("{prefix}{rest}"))
}

/// Any text, Unicode included (control characters, quotes, backslashes, NULs, emoji).
fn text() -> impl Strategy<Value = String> {
    prop_oneof![any::<String>(), "\\PC{0,64}", ".{0,8}"]
}

fn quote_strategy() -> impl Strategy<Value = (SecretKey, Quote)> {
    (key(), asset(), any::<bool>())
        .prop_flat_map(|(key, asset, checkout)| {
            (
                Just(key),
                Just(asset.clone()),
                Just(checkout),
                amount_in(&asset),
                amount_in(&asset),
                id("q_"),
                (text(), text(), text(), text(), text()),
                (0u64..4_000_000_000, 1u64..1_000_000),
                prop::option::of(any::<[u8; 16]>()),
            )
        })
        .prop_map(
            |(
                key,
                asset,
                checkout,
                a,
                b,
                id,
                (rid, desc, method, name, payee),
                (iat, ttl),
                req,
            )| {
                let (profile, mode, amount, estimate, tolerance, max) = if checkout {
                    let max = a.checked_add(b).unwrap();
                    (
                        Profile::Checkout,
                        PaymentMode::Hold,
                        None,
                        Some(a),
                        Some(b),
                        max,
                    )
                } else {
                    (
                        Profile::Service,
                        PaymentMode::Capture,
                        Some(a),
                        None,
                        None,
                        a,
                    )
                };
                let quote = Quote {
                    stipendex: Tag::current("quote"),
                    id: id.clone(),
                    receiver: Party {
                        id: rid,
                        key: key.public(),
                    },
                    iat,
                    exp: iat + ttl,
                    profile,
                    asset: asset.clone(),
                    amount,
                    estimate,
                    tolerance,
                    capability: Some(Capability { method, name }),
                    request: req.map(|r| Digest::of(&r)),
                    resource: None,
                    description: Some(desc),
                    rails: vec![RailOffer {
                        rail: "ledger".into(),
                        offer: Offer {
                            rail: RailId::new("ledger"),
                            id: format!("o_{id}"),
                            amount: Money::new(asset, max).unwrap(),
                            payee,
                            mode,
                            expires_at: Timestamp(i64::try_from((iat + ttl) * 1000).unwrap()),
                            details: Value::Null,
                        },
                    }],
                };
                (key, quote)
            },
        )
}

fn mandate_strategy() -> impl Strategy<Value = (SecretKey, Mandate)> {
    (key(), key(), asset())
        .prop_flat_map(|(principal, wallet, asset)| {
            (
                Just(principal),
                Just(wallet),
                Just(asset.clone()),
                prop::collection::vec(prop::option::of(amount_in(&asset)), 5),
                1u64..10_000_000,
                id("m_"),
                (text(), text(), text(), text()),
                (0u64..4_000_000_000, 0u64..1_000_000, 1u64..100_000_000),
                prop::option::of(prop::collection::vec(text(), 0..3)),
                key(),
            )
        })
        .prop_map(
            |(
                principal,
                wallet,
                asset,
                amounts,
                seconds,
                id,
                (pid, desc, rid, origin),
                (iat, delay, length),
                rails,
                receiver,
            )| {
                let mandate = Mandate {
                    stipendex: Tag::current("mandate"),
                    id,
                    principal: Party {
                        id: pid,
                        key: principal.public(),
                    },
                    wallet: wallet.public(),
                    iat,
                    nbf: iat + delay,
                    exp: iat + delay + length,
                    limits: vec![Limits {
                        asset,
                        per_call: amounts[0],
                        per_period: amounts[1].map(|amount| Period { seconds, amount }),
                        total: amounts[2],
                        per_receiver: amounts[3],
                        confirm_above: amounts[4],
                        tab_cap: None,
                        open_tabs: None,
                    }],
                    allow: vec![
                        Allow::Receiver {
                            id: rid,
                            key: receiver.public(),
                            origins: vec!["https://shop.example:8443".into()],
                        },
                        Allow::X402Http {
                            origin: origin.clone(),
                            pay_to: "0xpayee".into(),
                        },
                        Allow::X402Mcp {
                            server: origin,
                            pay_to: "payee".into(),
                        },
                    ],
                    rails,
                    description: Some(desc),
                };
                (principal, mandate)
            },
        )
}

/// A signed quote and a signed proof (which carries the quote), for the byte-flipping property.
static FIXED: LazyLock<Vec<String>> = LazyLock::new(fixed_objects);

fn fixed_objects() -> Vec<String> {
    let receiver = SecretKey::from_seed(&[3; 32]);
    let wallet = SecretKey::from_seed(&[2; 32]);
    let price = Money::parse(Asset::usd(), "2.50").unwrap();
    let offer = Offer {
        rail: RailId::new("ledger"),
        id: "o_1".into(),
        amount: price.clone(),
        payee: "shop".into(),
        mode: PaymentMode::Capture,
        expires_at: Timestamp(2_000_000_000_000),
        details: Value::Null,
    };
    let quote = Signed::sign(
        Quote {
            stipendex: Tag::current("quote"),
            id: "q_flip".into(),
            receiver: Party {
                id: "search".into(),
                key: receiver.public(),
            },
            iat: 1_900_000_000,
            exp: 1_900_000_060,
            profile: Profile::Service,
            asset: Asset::usd(),
            amount: Some(price.amount()),
            estimate: None,
            tolerance: None,
            capability: None,
            request: None,
            resource: Some(stipendex::envelope::Resource {
                origin: "https://xn--caf-dma.example".into(),
                method: "GET".into(),
                path: "/caf%C3%A9".into(),
                query: Some("q=%E2%98%95".into()),
            }),
            description: Some("caf\u{e9} \u{2615}".into()),
            rails: vec![RailOffer {
                rail: "ledger".into(),
                offer: offer.clone(),
            }],
        },
        &receiver,
    )
    .unwrap();
    let proof = Signed::sign(
        Proof {
            stipendex: Tag::current("proof"),
            id: "p_flip".into(),
            wallet: wallet.public(),
            mandate: Digest::of(b"mandate"),
            quote: Some(quote.digest().clone()),
            quote_jws: Some(quote.jws().to_owned()),
            tab: None,
            tab_jws: None,
            challenge: None,
            confirmation: None,
            confirmation_jws: None,
            iat: 1_900_000_010,
            mode: PaymentMode::Capture,
            rail: "ledger".into(),
            asset: Asset::usd(),
            amount: price.amount(),
            payment: Payment {
                rail: RailId::new("ledger"),
                offer_id: offer.id,
                mode: PaymentMode::Capture,
                payer: "agent".into(),
                amount: price,
                proof: json!({"transfer": "t_1"}),
            },
        },
        &wallet,
    )
    .unwrap();
    vec![quote.jws().to_owned(), proof.jws().to_owned()]
}

/// How a byte is changed.
#[derive(Clone, Copy, Debug)]
enum Change {
    /// Replaced by a character (of one to four bytes).
    To(char),
    /// One of its seven low bits flipped.
    FlipBit(u8),
}

/// `s` with its byte at `at` (an ASCII character: compact JWS are ASCII) replaced by `by`.
fn replace_byte(s: &str, at: usize, by: char) -> String {
    let mut out = String::with_capacity(s.len() + 4);
    out.push_str(&s[..at]);
    out.push(by);
    out.push_str(&s[at + 1..]);
    out
}

/// An independent reading of the tag grammar, character by character:
/// `[a-z-]+ "/" [0-9]{1,9} "." [0-9]{1,9}`.
fn tag_grammar(s: &str) -> bool {
    #[derive(Clone, Copy)]
    enum St {
        Kind(usize),
        Major(usize),
        Minor(usize),
    }
    let mut st = St::Kind(0);
    for c in s.chars() {
        st = match (st, c) {
            (St::Kind(n), 'a'..='z' | '-') => St::Kind(n + 1),
            (St::Kind(n), '/') if n > 0 => St::Major(0),
            (St::Major(n), '0'..='9') if n < 9 => St::Major(n + 1),
            (St::Major(n), '.') if n > 0 => St::Minor(0),
            (St::Minor(n), '0'..='9') if n < 9 => St::Minor(n + 1),
            _ => return false,
        };
    }
    matches!(st, St::Minor(n) if n > 0)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    // (a) The JWS parser never panics.

    #[test]
    fn jws_verify_never_panics_on_any_string(s in any::<String>()) {
        let _ = jws::verify(&s);
        let _ = Signed::<Quote>::parse(&s);
    }

    #[test]
    fn jws_verify_never_panics_on_dotted_base64url(
        h in "[A-Za-z0-9_-]{0,120}",
        p in "[A-Za-z0-9_-]{0,200}",
        s in "[A-Za-z0-9_-]{0,100}",
    ) {
        let compact = format!("{h}.{p}.{s}");
        prop_assert!(jws::verify(&compact).is_err());
        let _ = Signed::<Mandate>::parse(&compact);
    }

    #[test]
    fn jws_verify_never_panics_on_encoded_parts(
        h in prop::collection::vec(any::<u8>(), 0..100),
        p in prop::collection::vec(any::<u8>(), 0..200),
        s in prop::collection::vec(any::<u8>(), 0..80),
    ) {
        let compact = format!("{}.{}.{}", b64(&h), b64(&p), b64(&s));
        prop_assert!(jws::verify(&compact).is_err());
    }

    /// A well-formed header naming a real key, any payload, any 64 bytes as signature: the
    /// parser reaches the signature check, and refuses.
    #[test]
    fn jws_verify_refuses_random_signatures(
        seed in any::<[u8; 32]>(),
        typ in any::<bool>(),
        payload in prop::collection::vec(any::<u8>(), 0..200),
        sig in prop::collection::vec(any::<u8>(), 64),
    ) {
        let kid = SecretKey::from_seed(&seed).public();
        let header = if typ {
            format!(r#"{{"alg":"EdDSA","kid":"{kid}","typ":"stipendex+jws"}}"#)
        } else {
            format!(r#"{{"alg":"EdDSA","kid":"{kid}"}}"#)
        };
        let compact = format!("{}.{}.{}", b64(header.as_bytes()), b64(&payload), b64(&sig));
        let err = jws::verify(&compact).unwrap_err();
        prop_assert_eq!(err.code(), "bad_signature");
    }

    // (d) The tag grammar.

    #[test]
    fn tag_parse_is_the_grammar_on_any_string(s in any::<String>()) {
        prop_assert_eq!(Tag::parse(&s).is_ok(), tag_grammar(&s), "{:?}", s);
    }

    #[test]
    fn tag_parse_is_the_grammar_near_it(s in "[a-zA-Z/.0-9_ -]{0,24}") {
        prop_assert_eq!(Tag::parse(&s).is_ok(), tag_grammar(&s), "{:?}", s);
    }

    #[test]
    fn tag_parse_is_the_grammar_on_tag_shapes(s in "[a-z-]{0,12}/[0-9]{0,11}\\.[0-9]{0,11}") {
        prop_assert_eq!(Tag::parse(&s).is_ok(), tag_grammar(&s), "{:?}", s);
    }

    #[test]
    fn tags_read_back(kind in "[a-z-]{1,20}", major in 0u32..1_000_000_000, minor in 0u32..1_000_000_000) {
        let text = format!("{kind}/{major}.{minor}");
        let tag = Tag::parse(&text).unwrap();
        prop_assert_eq!(&tag.kind, &kind);
        prop_assert_eq!((tag.major, tag.minor), (major, minor));
        prop_assert_eq!(tag.to_string(), text);
    }

    // (e) Digests through their text form.

    #[test]
    fn digests_round_trip(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        let d = Digest::of(&bytes);
        let text = d.to_string();
        prop_assert_eq!(Digest::try_from(text.clone()).unwrap(), d.clone());
        let json = serde_json::to_string(&d).unwrap();
        prop_assert_eq!(serde_json::from_str::<Digest>(&json).unwrap(), d);
        prop_assert_eq!(text.len(), "sha256:".len() + 43);
    }

    #[test]
    fn any_32_bytes_are_a_digest(raw in any::<[u8; 32]>()) {
        let text = format!("sha256:{}", b64(&raw));
        let d = Digest::try_from(text.clone()).unwrap();
        prop_assert_eq!(d.as_str(), text.as_str());
    }

    #[test]
    fn digest_text_is_canonical(s in prop_oneof![any::<String>(), "sha256:[A-Za-z0-9_=+/-]{40,46}"]) {
        if let Ok(d) = Digest::try_from(s.clone()) {
            // Only `sha256:` + the canonical unpadded base64url of 32 bytes.
            let raw = URL_SAFE_NO_PAD.decode(s.strip_prefix("sha256:").unwrap()).unwrap();
            prop_assert_eq!(raw.len(), 32);
            prop_assert_eq!(format!("sha256:{}", b64(&raw)), s);
            prop_assert_eq!(d.to_string(), d.as_str());
        }
    }
}

proptest! {
    // Each case below verifies an Ed25519 signature, ~14 ms in a debug build: fewer cases.
    #![proptest_config(ProptestConfig::with_cases(SIGNED_CASES))]

    // (b) Sign, then parse: the same object, whatever it holds.

    #[test]
    fn quote_round_trips(kq in quote_strategy()) {
        let (key, quote) = kq;
        let signed = Signed::sign(quote.clone(), &key).unwrap();
        let parsed = Signed::<Quote>::parse(signed.jws()).unwrap();
        prop_assert_eq!(parsed.object(), &quote);
        prop_assert_eq!(parsed.digest(), signed.digest());
        prop_assert_eq!(parsed.jws(), signed.jws());
    }

    #[test]
    fn mandate_round_trips(km in mandate_strategy()) {
        let (key, mandate) = km;
        let signed = Signed::sign(mandate.clone(), &key).unwrap();
        let parsed = Signed::<Mandate>::parse(signed.jws()).unwrap();
        prop_assert_eq!(parsed.object(), &mandate);
        prop_assert_eq!(parsed.digest(), signed.digest());
        prop_assert_eq!(parsed.jws(), signed.jws());
    }

    // (c) One changed byte is always refused: never accepted, never a panic.

    #[test]
    fn a_changed_byte_is_refused(
        which in 0usize..2,
        at in any::<prop::sample::Index>(),
        change in prop_oneof![
            any::<char>().prop_map(Change::To),
            (0u8..7).prop_map(Change::FlipBit),
        ],
    ) {
        let jws = &FIXED[which];
        let at = at.index(jws.len());
        let was = jws.as_bytes()[at];
        let by = match change {
            Change::To(c) => c,
            // Stays ASCII: bit 7 is never flipped.
            Change::FlipBit(bit) => char::from(was ^ (1 << bit)),
        };
        prop_assume!(char::from(was) != by);
        let changed = replace_byte(jws, at, by);
        let verdict = if which == 0 {
            Signed::<Quote>::parse(&changed).map(|_| ())
        } else {
            Signed::<Proof>::parse(&changed).map(|_| ())
        };
        prop_assert!(verdict.is_err(), "byte {} changed to {:?} was accepted", at, by);
    }
}
