//! Test vectors of the signed objects: `tests/vectors/{mandate,quote,confirmation,proof,receipt}.json`
//! (one file per object: fixed keys, a fixed `now`, and cases with the outcome every
//! implementation must give), `tests/vectors/chain.json` (a full chain and variants each
//! breaking one link) and `tests/vectors/tab-chain.json` (a tab's chain in journal order, over
//! HTTP and over MCP, and splices each breaking one link; `stipendex-cli/tests/cli.rs` runs
//! `stipendex verify-chain` on them too).
//!
//! The files are written by the generator below, from fixed seeds, ids and timestamps; Ed25519
//! signing is deterministic, so the generator reproduces them byte for byte
//! (`vectors_are_reproducible` checks it). After a deliberate change of the objects, regenerate
//! them with:
//!
//! ```text
//! cargo test -p stipendex --test vectors -- --ignored regenerate
//! ```
//!
//! `every_case_gives_its_outcome`, `chain_cases_break_where_they_say` and
//! `tab_chain_cases_break_where_they_say` read the files (not the generator) and check every
//! case through `Signed::<T>::parse`, the consumer checks that judge time (`Wallet::pay`,
//! `Receiver::accept` at the file's `now`), `verify_chain` and `verify_tab_chain`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use stipendex::envelope::{
    Allow, CallTree, Capability, Confirmation, Digest, LaneEnd, Limits, Mandate, Object, Party,
    Period, Profile, Proof, Quote, RailOffer, Receipt, Resource, SecretKey, Signed, Tab, TabPrice,
    TabReceipt, Tag, Voucher, jws, tab_root,
};
use stipendex::rail_core::RailId;
use stipendex::receiver::Request;
use stipendex::wallet::Wallet;
use stipendex::{
    Amount, Asset, Capabilities, Charge, Error, Finality, ManualClock, Money, Offer, Payment,
    PaymentMode, RailError, RailResult, ReceiverHandle, SharedClock, Timestamp, Verified,
};

// ---------------------------------------------------------------------------------------------
// The files' format.
// ---------------------------------------------------------------------------------------------

/// `tests/vectors/<object>.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct VectorFile {
    /// `mandate`, `quote`, …: every case's `jws` is parsed as this type.
    object: String,
    about: Vec<String>,
    /// Unix seconds: the instant the consumer checks judge time at.
    now: u64,
    keys: BTreeMap<String, Key>,
    cases: Vec<Case>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Key {
    /// The 32-byte Ed25519 seed (RFC 8032 private key), hex.
    seed: String,
    /// Its public key in the Stipendex text form, `ed25519:<base64url of the 32 bytes>`.
    public: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    /// `valid`, or the error code of `Signed::<T>::parse`.
    expect: String,
    /// The key (a name in `keys`) that made the signature, if one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    signer: Option<String>,
    note: String,
    jws: String,
    /// A consumer check that judges time, and its outcome at the file's `now`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    consumer: Option<Consumer>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Consumer {
    /// `wallet.pay` or `receiver.accept`.
    check: String,
    /// The error code of the check.
    expect: String,
    /// The key the consumer holds (a name in `keys`).
    key: String,
    /// `receiver.accept`: the receiver's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    receiver_id: Option<String>,
    /// `wallet.pay` of a quote case: the wallet's mandate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mandate: Option<String>,
    /// `wallet.pay` of a mandate case: the quote paid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quote: Option<String>,
    /// `receiver.accept`: the request the proof pays for (`origin`, `method`, `name`, `params`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    request: Option<Value>,
}

/// `tests/vectors/chain.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChainFile {
    about: Vec<String>,
    now: u64,
    keys: BTreeMap<String, Key>,
    /// The trust anchor every case is verified with (`verify_chain(objects, Some(principal))`).
    principal: String,
    cases: Vec<ChainCase>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ChainCase {
    name: String,
    /// `valid` or `broken_chain`.
    expect: String,
    /// For `broken_chain`: the link `verify_chain` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    link: Option<String>,
    note: String,
    /// The compact JWS of the objects, in the order given to `verify_chain`.
    objects: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// The generator: fixed keys, ids and timestamps.
// ---------------------------------------------------------------------------------------------

/// 2026-01-01T00:00:00Z.
const NOW: u64 = 1_767_225_600;
const DAY: u64 = 86_400;

const SEEDS: [(&str, u8); 4] = [
    ("principal", 0x11),
    ("wallet", 0x22),
    ("receiver", 0x33),
    ("other", 0x44),
];

struct Keys {
    principal: SecretKey,
    wallet: SecretKey,
    receiver: SecretKey,
    other: SecretKey,
}

fn keys() -> Keys {
    let k = |i: usize| SecretKey::from_seed(&[SEEDS[i].1; 32]);
    Keys {
        principal: k(0),
        wallet: k(1),
        receiver: k(2),
        other: k(3),
    }
}

fn keys_json() -> BTreeMap<String, Key> {
    SEEDS
        .iter()
        .map(|(name, b)| {
            let key = SecretKey::from_seed(&[*b; 32]);
            (
                (*name).to_owned(),
                Key {
                    seed: (*key.to_hex()).clone(),
                    public: key.public().to_string(),
                },
            )
        })
        .collect()
}

fn usd(s: &str) -> Money {
    Money::parse(Asset::usd(), s).unwrap()
}

fn amount(s: &str) -> Amount {
    s.parse().unwrap()
}

fn ms(secs: u64) -> Timestamp {
    Timestamp(i64::try_from(secs * 1000).unwrap())
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The request the vectors' quotes price.
fn request() -> Request {
    let mut r = Request::new("GET", "/report")
        .at("https://search.example")
        .with_params(json!({"topic": "rust"}));
    r.query = Some("topic=rust".into());
    r
}

fn request_json() -> Value {
    let r = request();
    json!({"origin": r.origin, "method": r.method, "name": r.name, "params": r.params})
}

fn mandate(k: &Keys) -> Mandate {
    Mandate {
        stipendex: Tag::current("mandate"),
        id: "m_vector-mandate-1".into(),
        principal: Party {
            id: "alice".into(),
            key: k.principal.public(),
        },
        wallet: k.wallet.public(),
        iat: NOW - 3600,
        nbf: NOW - 3600,
        exp: NOW + 30 * DAY,
        limits: vec![Limits {
            asset: Asset::usd(),
            per_call: Some(amount("5.00")),
            per_period: Some(Period {
                seconds: DAY,
                amount: amount("20.00"),
            }),
            total: Some(amount("100.00")),
            per_receiver: None,
            confirm_above: Some(amount("1.00")),
            tab_cap: None,
            open_tabs: None,
        }],
        allow: vec![Allow::Receiver {
            origins: vec!["https://search.example".into()],
            id: "search".into(),
            key: k.receiver.public(),
        }],
        rails: Some(vec!["ledger".into()]),
        description: Some("research for the agent".into()),
    }
}

fn quote(k: &Keys, id: &str, iat: u64, exp: u64) -> Quote {
    let price = usd("2.50");
    Quote {
        stipendex: Tag::current("quote"),
        id: id.into(),
        receiver: Party {
            id: "search".into(),
            key: k.receiver.public(),
        },
        iat,
        exp,
        profile: Profile::Service,
        asset: Asset::usd(),
        amount: Some(price.amount()),
        estimate: None,
        tolerance: None,
        capability: Some(Capability {
            method: "GET".into(),
            name: "/report".into(),
        }),
        request: Some(request().digest()),
        resource: request().resource(),
        description: Some("one report".into()),
        rails: vec![RailOffer {
            rail: "ledger".into(),
            offer: Offer {
                rail: RailId::new("ledger"),
                id: format!("o_{id}"),
                amount: price,
                payee: "acct-shop".into(),
                mode: PaymentMode::Capture,
                expires_at: ms(exp),
                details: Value::Null,
            },
        }],
    }
}

fn confirmation(k: &Keys, id: &str, m: &Signed<Mandate>, q: &Signed<Quote>) -> Confirmation {
    Confirmation {
        stipendex: Tag::current("confirmation"),
        id: id.into(),
        wallet: k.wallet.public(),
        mandate: m.digest().clone(),
        quote: q.digest().clone(),
        quote_id: q.object().id.clone(),
        receiver: q.object().receiver.id.clone(),
        asset: Asset::usd(),
        total: amount("2.50"),
        tolerance: Amount::ZERO,
        iat: q.object().iat + 10,
        by: "terminal".into(),
    }
}

fn proof(
    k: &Keys,
    id: &str,
    m: &Signed<Mandate>,
    q: &Signed<Quote>,
    c: Option<&Signed<Confirmation>>,
    iat: u64,
) -> Proof {
    let offer = &q.object().rails[0].offer;
    Proof {
        stipendex: Tag::current("proof"),
        id: id.into(),
        wallet: k.wallet.public(),
        mandate: m.digest().clone(),
        quote: Some(q.digest().clone()),
        quote_jws: Some(q.jws().to_owned()),
        tab: None,
        tab_jws: None,
        challenge: None,
        confirmation: c.map(|c| c.digest().clone()),
        confirmation_jws: c.map(|c| c.jws().to_owned()),
        iat,
        mode: PaymentMode::Capture,
        rail: "ledger".into(),
        asset: Asset::usd(),
        amount: offer.amount.amount(),
        payment: Payment {
            rail: RailId::new("ledger"),
            offer_id: offer.id.clone(),
            mode: PaymentMode::Capture,
            payer: "acct-agent".into(),
            amount: offer.amount.clone(),
            proof: json!({"transfer": "t_vector-1"}),
        },
    }
}

fn receipt(id: &str, q: &Signed<Quote>, p: &Signed<Proof>) -> Receipt {
    Receipt {
        stipendex: Tag::current("receipt"),
        id: id.into(),
        receiver: q.object().receiver.clone(),
        quote_id: q.object().id.clone(),
        proof: p.digest().clone(),
        iat: p.object().iat + 10,
        asset: Asset::usd(),
        amount: amount("2.50"),
        result: Some(Digest::of(b"the report")),
        rail: "ledger".into(),
        reference: "t_vector-1".into(),
    }
}

/// The valid objects every file refers to: one payment, with a human's confirmation (2.50 is
/// above the mandate's `confirm_above` of 1.00).
struct World {
    k: Keys,
    mandate: Signed<Mandate>,
    quote: Signed<Quote>,
    confirmation: Signed<Confirmation>,
    proof: Signed<Proof>,
    receipt: Signed<Receipt>,
    /// A quote that expired before `now` (payable from now-600 to now-480).
    expired_quote: Signed<Quote>,
}

fn world() -> World {
    let k = keys();
    let mandate = Signed::sign(mandate(&k), &k.principal).unwrap();
    let quote = Signed::sign(
        quote(&k, "q_vector-quote-1", NOW - 60, NOW + 60),
        &k.receiver,
    )
    .unwrap();
    let confirmation = Signed::sign(
        confirmation(&k, "c_vector-confirmation-1", &mandate, &quote),
        &k.wallet,
    )
    .unwrap();
    let proof = Signed::sign(
        proof(
            &k,
            "p_vector-proof-1",
            &mandate,
            &quote,
            Some(&confirmation),
            NOW - 40,
        ),
        &k.wallet,
    )
    .unwrap();
    let receipt = Signed::sign(receipt("r_vector-receipt-1", &quote, &proof), &k.receiver).unwrap();
    let expired_quote = Signed::sign(
        crate::quote(&k, "q_vector-quote-expired", NOW - 86_400, NOW - 80_000),
        &k.receiver,
    )
    .unwrap();
    World {
        k,
        mandate,
        quote,
        confirmation,
        proof,
        receipt,
        expired_quote,
    }
}

fn case(name: &str, expect: &str, signer: Option<&str>, note: &str, jws: String) -> Case {
    Case {
        name: name.into(),
        expect: expect.into(),
        signer: signer.map(str::to_owned),
        note: note.into(),
        jws,
        consumer: None,
    }
}

fn header(kid: &str, typ: bool) -> String {
    if typ {
        format!(r#"{{"alg":"EdDSA","kid":"{kid}","typ":"{}"}}"#, jws::TYP)
    } else {
        format!(r#"{{"alg":"EdDSA","kid":"{kid}"}}"#)
    }
}

/// `base64url(header).base64url(payload)` signed with `key`, whatever the header says.
fn sign_raw(key: &SecretKey, header: &str, payload: &[u8]) -> String {
    let input = format!("{}.{}", b64(header.as_bytes()), b64(payload));
    let sig = key.sign(input.as_bytes());
    format!("{input}.{}", b64(&sig))
}

fn split(jws: &str) -> (String, String, String) {
    let p: Vec<&str> = jws.split('.').collect();
    assert_eq!(p.len(), 3);
    (p[0].to_owned(), p[1].to_owned(), p[2].to_owned())
}

/// `text` with its first `from` replaced by `to` (which must be there).
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in {text}");
    text.replacen(from, to, 1)
}

/// Another object, presented where a `T` is expected.
struct Foreign {
    kind: &'static str,
    jws: String,
    signer: &'static str,
}

/// The cases every object type has: valid forms, tampering, keys, versions, types and the
/// malformed shapes of the JWS.
fn standard_cases<T: Object>(
    obj: &T,
    key: &SecretKey,
    signer: &'static str,
    other: &SecretKey,
    tamper: impl FnOnce(&mut T),
    foreign: &Foreign,
) -> Vec<Case> {
    let kind = T::KIND;
    let declared = key.public().to_string();
    let valid = Signed::sign(obj.clone(), key).unwrap().jws().to_owned();
    let (h, p, s) = split(&valid);
    let text = serde_json::to_string(obj).unwrap();
    let tag = format!(r#""stipendex":"{kind}/0.1","#);
    let signed = |payload: &str| sign_raw(key, &header(&declared, true), payload.as_bytes());
    let mut tampered = obj.clone();
    tamper(&mut tampered);
    let tampered = b64(&serde_json::to_vec(&tampered).unwrap());
    let sig = URL_SAFE_NO_PAD.decode(&s).unwrap();
    // The last of the 86 characters of a 64-byte signature carries 2 bits and 4 zero bits;
    // the next letter of the alphabet sets one of those zero bits.
    let mut noncanonical = s.clone().into_bytes();
    let last = noncanonical.last_mut().unwrap();
    *last = match *last {
        b'A' => b'B',
        b'Q' => b'R',
        b'g' => b'h',
        b'w' => b'x',
        c => panic!("not the last character of a 64-byte signature: {c}"),
    };
    let noncanonical = String::from_utf8(noncanonical).unwrap();
    let not_b64_input = format!("{h}.{}", "not*base64url");
    let not_b64 = format!(
        "{not_b64_input}.{}",
        b64(&key.sign(not_b64_input.as_bytes()))
    );
    vec![
        case(
            "valid",
            "valid",
            Some(signer),
            &format!(
                "Signed by the key the {kind} declares; the header is exactly {{alg, kid, typ}}."
            ),
            valid.clone(),
        ),
        case(
            "valid_without_typ",
            "valid",
            Some(signer),
            "The header's typ is optional: {alg, kid} only.",
            sign_raw(key, &header(&declared, false), text.as_bytes()),
        ),
        case(
            "future_minor_version_with_unknown_member",
            "valid",
            Some(signer),
            &format!(
                "A minor version this build does not know ({kind}/0.9) with a member it does not know: a reader of major version 0 ignores both."
            ),
            signed(&replace_once(
                &text,
                &tag,
                &format!(r#""stipendex":"{kind}/0.9","x_future":{{"added_in":"0.9"}},"#),
            )),
        ),
        case(
            "tampered_payload",
            "bad_signature",
            Some(signer),
            "The payload was changed after signing; header and signature are the valid case's.",
            format!("{h}.{tampered}.{s}"),
        ),
        case(
            "kid_forged",
            "bad_signature",
            Some("other"),
            "The header names the declared key but another key signed: the signature does not verify under the kid.",
            sign_raw(other, &header(&declared, true), text.as_bytes()),
        ),
        case(
            "wrong_key",
            "untrusted",
            Some("other"),
            &format!(
                "A valid signature by another key (its own kid), over a {kind} that declares the valid case's signer."
            ),
            jws::sign(other, text.as_bytes()),
        ),
        case(
            "unsupported_version",
            "unsupported_version",
            Some(signer),
            &format!(
                "Validly signed, tagged {kind}/1.0: a major version this build does not read."
            ),
            signed(&replace_once(
                &text,
                &tag,
                &format!(r#""stipendex":"{kind}/1.0","#),
            )),
        ),
        case(
            "wrong_type",
            "wrong_type",
            Some(foreign.signer),
            &format!("A valid {} presented as a {kind}.", foreign.kind),
            foreign.jws.clone(),
        ),
        case(
            "missing_tag",
            "malformed",
            Some(signer),
            "Validly signed, without the `stipendex` member.",
            signed(&replace_once(&text, &tag, "")),
        ),
        case(
            "bad_id_prefix",
            "malformed",
            Some(signer),
            &format!(
                "Validly signed, with an id that lacks the `{}` prefix.",
                T::PREFIX
            ),
            signed(&replace_once(
                &text,
                &format!(r#""id":"{}"#, T::PREFIX),
                r#""id":"x_"#,
            )),
        ),
        case(
            "payload_not_json",
            "malformed",
            Some(signer),
            "Validly signed; the payload is not JSON.",
            signed("not json"),
        ),
        case(
            "signed_payload_not_base64url",
            "malformed",
            Some(signer),
            "The signature verifies over the signing input, but the payload part is not base64url.",
            not_b64,
        ),
        case(
            "alg_none",
            "malformed",
            None,
            "alg none, empty signature: only EdDSA is accepted.",
            format!(
                "{}.{p}.",
                b64(format!(
                    r#"{{"alg":"none","kid":"{declared}","typ":"{}"}}"#,
                    jws::TYP
                )
                .as_bytes())
            ),
        ),
        case(
            "alg_hs256",
            "malformed",
            None,
            "alg HS256 (the algorithm-confusion attack): only EdDSA is accepted.",
            format!(
                "{}.{p}.{s}",
                b64(format!(
                    r#"{{"alg":"HS256","kid":"{declared}","typ":"{}"}}"#,
                    jws::TYP
                )
                .as_bytes())
            ),
        ),
        case(
            "header_with_crit",
            "malformed",
            Some(signer),
            "Validly signed; the header has a member this profile does not know (crit): refused.",
            sign_raw(
                key,
                &format!(
                    r#"{{"alg":"EdDSA","kid":"{declared}","typ":"{}","crit":["exp"],"exp":1}}"#,
                    jws::TYP
                ),
                text.as_bytes(),
            ),
        ),
        case(
            "kid_not_a_key",
            "malformed",
            Some(signer),
            "The header's kid is not an ed25519: key of 32 bytes.",
            sign_raw(key, &header("ed25519:AAAA", true), text.as_bytes()),
        ),
        case(
            "header_not_json",
            "malformed",
            None,
            "The header part is base64url of something that is not JSON.",
            format!("{}.{p}.{s}", b64(b"EdDSA")),
        ),
        case(
            "extra_part",
            "malformed",
            Some(signer),
            "Four dot-separated parts (the signature repeated).",
            format!("{valid}.{s}"),
        ),
        case(
            "two_parts",
            "malformed",
            None,
            "Header and payload, no signature part.",
            format!("{h}.{p}"),
        ),
        case(
            "empty",
            "malformed",
            None,
            "The empty string.",
            String::new(),
        ),
        case(
            "header_padded",
            "malformed",
            Some(signer),
            "The header part ends with `=` padding: base64url without padding only.",
            format!("{h}=.{p}.{s}"),
        ),
        case(
            "signature_standard_base64",
            "malformed",
            Some(signer),
            "The signature in standard base64 with padding, not base64url.",
            format!("{h}.{p}.{}", STANDARD.encode(&sig)),
        ),
        case(
            "signature_noncanonical_bits",
            "malformed",
            Some(signer),
            "The signature's last character sets a bit past the 64 bytes: not canonical base64url.",
            format!("{h}.{p}.{noncanonical}"),
        ),
        case(
            "signature_truncated",
            "malformed",
            Some(signer),
            "The signature part holds 63 bytes.",
            format!("{h}.{p}.{}", b64(&sig[..63])),
        ),
        case(
            "jws_json_serialization",
            "malformed",
            Some(signer),
            "The JWS JSON serialization of the valid case: only the compact form is accepted.",
            json!({"protected": h, "payload": p, "signature": s}).to_string(),
        ),
    ]
}

fn about(kind: &str) -> Vec<String> {
    [
        format!("Stipendex test vectors: {kind} objects, each a compact JWS (RFC 7515) signed with Ed25519 (alg EdDSA, RFC 8037)."),
        "keys: each a 32-byte Ed25519 seed (hex) and its public key `ed25519:<base64url of the 32 bytes>`, the JWS header's kid.".into(),
        format!("cases[].expect: `valid`, or the error code of Signed::<{}>::parse (stipendex::Error::code): bad_signature, untrusted, unsupported_version, wrong_type, malformed, mismatch.", capitalized(kind)),
        "cases[].signer: the key in `keys` that made the signature, where one was made.".into(),
        "now: the instant (Unix seconds) the consumer checks judge time at. The parser never reads the clock: an object outside its validity window parses (expect valid), and the consumer check refuses it (cases[].consumer: the check, its inputs, the code it gives).".into(),
        "consumer.check wallet.pay: a Wallet holding keys[consumer.key] and the mandate (the case's, or consumer.mandate), its clock at now and no rail, pays the quote (the case's, or consumer.quote). consumer.check receiver.accept: the Receiver consumer.receiver_id holding keys[consumer.key], its clock at now, accepts the case's proof for consumer.request. Both judge time before they reach a rail; the file's valid case passes that point.".into(),
        "Generated by stipendex/tests/vectors.rs (cargo test -p stipendex --test vectors -- --ignored regenerate); regenerating reproduces this file byte for byte.".into(),
    ]
    .into_iter()
    .collect()
}

fn capitalized(kind: &str) -> String {
    let mut c = kind.chars();
    c.next()
        .map(|f| f.to_uppercase().chain(c).collect())
        .unwrap_or_default()
}

fn file(kind: &str, cases: Vec<Case>) -> VectorFile {
    VectorFile {
        object: kind.into(),
        about: about(kind),
        now: NOW,
        keys: keys_json(),
        cases,
    }
}

fn mandate_file(w: &World) -> VectorFile {
    let k = &w.k;
    let m = w.mandate.object();
    let mut cases = standard_cases(
        m,
        &k.principal,
        "principal",
        &k.other,
        |m| m.limits[0].per_call = Some(amount("500.00")),
        &Foreign {
            kind: "quote",
            jws: w.quote.jws().into(),
            signer: "receiver",
        },
    );
    let wallet_pay = Consumer {
        check: "wallet.pay".into(),
        expect: "expired".into(),
        key: "wallet".into(),
        receiver_id: None,
        mandate: None,
        quote: Some(w.quote.jws().into()),
        request: None,
    };
    let mut expired = m.clone();
    expired.id = "m_vector-mandate-expired".into();
    (expired.iat, expired.nbf, expired.exp) = (NOW - 60 * DAY, NOW - 60 * DAY, NOW - 30 * DAY);
    let mut c = case(
        "expired",
        "valid",
        Some("principal"),
        "Valid from now-60d until now-30d. The parser accepts it (it does not read the clock); the wallet refuses to pay under it at `now` with `expired` (consumer).",
        Signed::sign(expired, &k.principal).unwrap().jws().into(),
    );
    c.consumer = Some(wallet_pay.clone());
    cases.push(c);
    let mut future = m.clone();
    future.id = "m_vector-mandate-future".into();
    (future.nbf, future.exp) = (NOW + DAY, NOW + 31 * DAY);
    let mut c = case(
        "not_yet_valid",
        "valid",
        Some("principal"),
        "Valid from now+1d. The parser accepts it; the wallet refuses to pay under it at `now` with `not_yet_valid` (consumer).",
        Signed::sign(future, &k.principal).unwrap().jws().into(),
    );
    c.consumer = Some(Consumer {
        expect: "not_yet_valid".into(),
        ..wallet_pay
    });
    cases.push(c);
    let text = serde_json::to_string(m).unwrap();
    let broken = replace_once(
        &text,
        &format!(r#""exp":{}"#, m.exp),
        &format!(r#""exp":{}"#, m.nbf),
    );
    cases.push(case(
        "exp_not_after_nbf",
        "malformed",
        Some("principal"),
        "Validly signed; exp equals nbf, which the mandate's own rules refuse.",
        jws::sign(&k.principal, broken.as_bytes()),
    ));
    file("mandate", cases)
}

fn quote_file(w: &World) -> VectorFile {
    let k = &w.k;
    let q = w.quote.object();
    let mut cases = standard_cases(
        q,
        &k.receiver,
        "receiver",
        &k.other,
        |q| q.rails[0].offer.payee = "acct-mallory".into(),
        &Foreign {
            kind: "receipt",
            jws: w.receipt.jws().into(),
            signer: "receiver",
        },
    );
    let mut c = case(
        "expired",
        "valid",
        Some("receiver"),
        "Payable from now-600 until now-480. The parser accepts it; the wallet refuses to pay it at `now` with `expired` (consumer, under the valid mandate of mandate.json).",
        w.expired_quote.jws().into(),
    );
    c.consumer = Some(Consumer {
        check: "wallet.pay".into(),
        expect: "expired".into(),
        key: "wallet".into(),
        receiver_id: None,
        mandate: Some(w.mandate.jws().into()),
        quote: None,
        request: None,
    });
    cases.push(c);
    let text = serde_json::to_string(q).unwrap();
    let broken = replace_once(
        &text,
        r#""amount":{"amount":"2.5","asset""#,
        r#""amount":{"amount":"2","asset""#,
    );
    cases.push(case(
        "offer_amount_differs",
        "malformed",
        Some("receiver"),
        "Validly signed; the ledger offer asks 2.00 USD while the quote asks 2.50 USD.",
        jws::sign(&k.receiver, broken.as_bytes()),
    ));
    file("quote", cases)
}

fn confirmation_file(w: &World) -> VectorFile {
    let k = &w.k;
    let c = w.confirmation.object();
    let mut cases = standard_cases(
        c,
        &k.wallet,
        "wallet",
        &k.other,
        |c| c.total = amount("25.00"),
        &Foreign {
            kind: "quote",
            jws: w.quote.jws().into(),
            signer: "receiver",
        },
    );
    let mut old = c.clone();
    old.id = "c_vector-confirmation-old".into();
    old.iat = NOW - 365 * DAY;
    cases.push(case(
        "old",
        "valid",
        Some("wallet"),
        "Answered a year before `now`. A confirmation has no validity window (iat only: when the human answered), so the parser accepts it and no consumer refuses it for its age: what expires is the quote it binds (wallet.pay and receiver.accept refuse an expired quote with `expired`: see quote.json and proof.json).",
        Signed::sign(old, &k.wallet).unwrap().jws().into(),
    ));
    let text = serde_json::to_string(c).unwrap();
    cases.push(case(
        "total_too_precise",
        "malformed",
        Some("wallet"),
        "Validly signed; the total 2.505 has more decimals than USD's 2.",
        jws::sign(
            &k.wallet,
            replace_once(&text, r#""total":"2.5""#, r#""total":"2.505""#).as_bytes(),
        ),
    ));
    file("confirmation", cases)
}

fn proof_file(w: &World) -> VectorFile {
    let k = &w.k;
    let p = w.proof.object();
    let mut cases = standard_cases(
        p,
        &k.wallet,
        "wallet",
        &k.other,
        |p| p.payment.payer = "acct-mallory".into(),
        &Foreign {
            kind: "confirmation",
            jws: w.confirmation.jws().into(),
            signer: "wallet",
        },
    );
    let conf = Signed::sign(
        confirmation(
            k,
            "c_vector-confirmation-expired",
            &w.mandate,
            &w.expired_quote,
        ),
        &k.wallet,
    )
    .unwrap();
    let late = Signed::sign(
        proof(
            k,
            "p_vector-proof-expired",
            &w.mandate,
            &w.expired_quote,
            Some(&conf),
            NOW - 80_100,
        ),
        &k.wallet,
    )
    .unwrap();
    let mut c = case(
        "expired",
        "valid",
        Some("wallet"),
        "Pays (at now-80100) the quote q_vector-quote-expired, payable until now-80000. The parser accepts it; the receiver refuses it at `now` with `expired` (consumer), before asking the rail: a proof paid in time is honoured after its quote's expiry only within 12 hours (`LATE_PROOF_GRACE`).",
        late.jws().into(),
    );
    c.consumer = Some(Consumer {
        check: "receiver.accept".into(),
        expect: "expired".into(),
        key: "receiver".into(),
        receiver_id: Some("search".into()),
        mandate: None,
        quote: None,
        request: Some(request_json()),
    });
    cases.push(c);
    let mut other = p.clone();
    other.id = "p_vector-proof-mismatch".into();
    other.quote = Some(w.expired_quote.digest().clone());
    let text = serde_json::to_string(&other).unwrap();
    cases.push(case(
        "quote_digest_mismatch",
        "mismatch",
        Some("wallet"),
        "Validly signed; its `quote` digest is not the digest of the quote_jws it carries.",
        jws::sign(&k.wallet, text.as_bytes()),
    ));
    file("proof", cases)
}

fn receipt_file(w: &World) -> VectorFile {
    let k = &w.k;
    let r = w.receipt.object();
    let mut cases = standard_cases(
        r,
        &k.receiver,
        "receiver",
        &k.other,
        |r| r.reference = "t_vector-2".into(),
        &Foreign {
            kind: "quote",
            jws: w.quote.jws().into(),
            signer: "receiver",
        },
    );
    let mut old = r.clone();
    old.id = "r_vector-receipt-old".into();
    old.iat = NOW - 365 * DAY;
    cases.push(case(
        "old",
        "valid",
        Some("receiver"),
        "Issued a year before `now`. A receipt has no validity window (iat only): the parser accepts it and no consumer refuses it for its age (it is audit evidence, kept as long as the chain).",
        Signed::sign(old, &k.receiver).unwrap().jws().into(),
    ));
    let text = serde_json::to_string(r).unwrap();
    cases.push(case(
        "amount_too_precise",
        "malformed",
        Some("receiver"),
        "Validly signed; the amount 2.505 has more decimals than USD's 2.",
        jws::sign(
            &k.receiver,
            replace_once(&text, r#""amount":"2.5""#, r#""amount":"2.505""#).as_bytes(),
        ),
    ));
    file("receipt", cases)
}

/// What to change in a chain.
#[derive(Default)]
struct Twist {
    mandate_by_other: bool,
    no_confirmation: bool,
    confirmation_by_other: bool,
    quote_by_stranger: bool,
    proof_iat: Option<u64>,
    receipt_amount: Option<&'static str>,
}

/// mandate, confirmation (unless `no_confirmation`), quote, proof, receipt: each binding the
/// previous ones, with one twist.
fn chain(k: &Keys, t: &Twist) -> Vec<String> {
    let mut m = mandate(k);
    let mut m_key = &k.principal;
    if t.mandate_by_other {
        m.principal.key = k.other.public();
        m_key = &k.other;
    }
    let m = Signed::sign(m, m_key).unwrap();
    let mut q = quote(k, "q_vector-quote-1", NOW - 60, NOW + 60);
    let mut q_key = &k.receiver;
    if t.quote_by_stranger {
        q.receiver = Party {
            id: "stranger".into(),
            key: k.other.public(),
        };
        q_key = &k.other;
    }
    let q = Signed::sign(q, q_key).unwrap();
    let c = (!t.no_confirmation).then(|| {
        let mut c = confirmation(k, "c_vector-confirmation-1", &m, &q);
        let mut c_key = &k.wallet;
        if t.confirmation_by_other {
            c.wallet = k.other.public();
            c_key = &k.other;
        }
        Signed::sign(c, c_key).unwrap()
    });
    let p = Signed::sign(
        proof(
            k,
            "p_vector-proof-1",
            &m,
            &q,
            c.as_ref(),
            t.proof_iat.unwrap_or(NOW - 40),
        ),
        &k.wallet,
    )
    .unwrap();
    let mut r = receipt("r_vector-receipt-1", &q, &p);
    if let Some(a) = t.receipt_amount {
        r.amount = amount(a);
    }
    let r = Signed::sign(r, q_key).unwrap();
    let mut out = vec![m.jws().to_owned()];
    out.extend(c.map(|c| c.jws().to_owned()));
    out.extend([q.jws().to_owned(), p.jws().to_owned(), r.jws().to_owned()]);
    out
}

fn chain_case(name: &str, link: Option<&str>, note: &str, objects: Vec<String>) -> ChainCase {
    ChainCase {
        name: name.into(),
        expect: if link.is_some() {
            "broken_chain"
        } else {
            "valid"
        }
        .into(),
        link: link.map(str::to_owned),
        note: note.into(),
        objects,
    }
}

fn chain_file(k: &Keys) -> ChainFile {
    let valid = chain(k, &Twist::default());
    let mut reordered = valid.clone();
    reordered.reverse();
    let mut tampered = valid.clone();
    {
        let (h, p, s) = split(&tampered[0]);
        let text = String::from_utf8(URL_SAFE_NO_PAD.decode(&p).unwrap()).unwrap();
        let text = replace_once(&text, r#""per_call":"5""#, r#""per_call":"500""#);
        tampered[0] = format!("{h}.{}.{s}", b64(text.as_bytes()));
    }
    let mut duplicate = valid.clone();
    duplicate.push(valid[2].clone());
    let mut no_proof = valid.clone();
    no_proof.remove(3);
    let cases = vec![
        chain_case(
            "valid",
            None,
            "mandate, confirmation, quote, proof, receipt: one service payment of 2.50 USD, confirmed by a human (the mandate's confirm_above is 1.00).",
            valid.clone(),
        ),
        chain_case(
            "valid_reversed",
            None,
            "The valid chain in reverse order: objects may come in any order.",
            reordered,
        ),
        chain_case(
            "valid_without_receipt",
            None,
            "The valid chain before the receiver answered: the receipt is optional.",
            valid[..4].to_vec(),
        ),
        chain_case(
            "mandate_tampered",
            Some("mandate"),
            "The mandate's per_call limit was raised after signing: its signature fails.",
            tampered,
        ),
        chain_case(
            "mandate_not_by_trusted_principal",
            Some("mandate"),
            "The mandate is validly signed by a key other than the trust anchor `principal`; every other object binds it.",
            chain(
                k,
                &Twist {
                    mandate_by_other: true,
                    ..Twist::default()
                },
            ),
        ),
        chain_case(
            "confirmation_not_by_the_wallet",
            Some("confirmation"),
            "The confirmation is validly signed by a key other than the mandate's wallet key; the proof binds it.",
            chain(
                k,
                &Twist {
                    confirmation_by_other: true,
                    ..Twist::default()
                },
            ),
        ),
        chain_case(
            "quote_receiver_not_allowed",
            Some("quote"),
            "The quote (and the receipt) come from receiver `stranger`, which the mandate does not allow; confirmation and proof bind that quote.",
            chain(
                k,
                &Twist {
                    quote_by_stranger: true,
                    ..Twist::default()
                },
            ),
        ),
        chain_case(
            "duplicate_quote",
            Some("quote"),
            "The valid chain with its quote given twice.",
            duplicate,
        ),
        chain_case(
            "proof_after_quote_expired",
            Some("proof"),
            "The proof was made at now+120, after the quote expired (now+60).",
            chain(
                k,
                &Twist {
                    proof_iat: Some(NOW + 120),
                    ..Twist::default()
                },
            ),
        ),
        chain_case(
            "proof_before_quote_issued",
            Some("proof"),
            "The proof says it was made at now-120, before the quote was issued (now-60).",
            chain(
                k,
                &Twist {
                    proof_iat: Some(NOW - 120),
                    ..Twist::default()
                },
            ),
        ),
        chain_case(
            "proof_without_required_confirmation",
            Some("proof"),
            "No confirmation, and the proof binds none: 2.50 is above the mandate's confirm_above (1.00).",
            chain(
                k,
                &Twist {
                    no_confirmation: true,
                    ..Twist::default()
                },
            ),
        ),
        chain_case(
            "proof_missing",
            Some("proof"),
            "The valid chain without its proof.",
            no_proof,
        ),
        chain_case(
            "receipt_above_quote",
            Some("receipt"),
            "The receipt takes 3.00 for a 2.50 quote.",
            chain(
                k,
                &Twist {
                    receipt_amount: Some("3.00"),
                    ..Twist::default()
                },
            ),
        ),
    ];
    ChainFile {
        about: vec![
            "Stipendex test vectors: audit chains (mandate, confirmation, quote, proof, receipt) for stipendex::chain::verify_chain.".into(),
            "principal: the trust anchor every case is verified with (verify_chain(objects, Some(principal))).".into(),
            "cases[].expect: `valid`, or `broken_chain` with cases[].link, the link verify_chain names (Error::Broken { link }). Each broken case changes one thing of the valid chain: one object tampered with, left out or given twice, or one object validly signed with one fault (then the objects after it are re-signed to bind it, so the named link is the only fault).".into(),
            "keys: each a 32-byte Ed25519 seed (hex) and its public key `ed25519:<base64url>`. now: the instant the objects were made around (Unix seconds); verify_chain does not read the clock.".into(),
            "Generated by stipendex/tests/vectors.rs (cargo test -p stipendex --test vectors -- --ignored regenerate); regenerating reproduces this file byte for byte.".into(),
        ],
        now: NOW,
        keys: keys_json(),
        principal: k.principal.public().to_string(),
        cases,
    }
}

// ---------------------------------------------------------------------------------------------
// `tests/vectors/tab-chain.json`: a tab's chain, as the wallet journals it, and splices of it.
// ---------------------------------------------------------------------------------------------

/// `tests/vectors/tab-chain.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TabChainFile {
    about: Vec<String>,
    now: u64,
    keys: BTreeMap<String, Key>,
    /// The trust anchor every case is verified with (`verify_tab_chain(lines, Some(principal))`).
    principal: String,
    cases: Vec<TabChainCase>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TabChainCase {
    name: String,
    /// `valid` or `broken_chain`.
    expect: String,
    /// For `broken_chain`: the link `verify_tab_chain` names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    link: Option<String>,
    note: String,
    /// The chain's lines in journal order: compact JWS objects and the calls' result lines
    /// (`{"tab_call": {"voucher": …, "result": …}}`).
    lines: Vec<String>,
}

/// The origin the vectors' tab serves.
const TAB_ORIGIN: &str = "https://search.example";

/// A call of `GET /search?q=<q>` at the tab's origin, in the clear.
fn tab_resource(q: &str) -> Resource {
    Resource {
        origin: TAB_ORIGIN.into(),
        method: "GET".into(),
        path: "/search".into(),
        query: Some(format!("q={q}")),
    }
}

/// The vectors' mandate, allowing tabs of up to 2.00 USD.
fn tab_mandate(k: &Keys) -> Mandate {
    let mut m = mandate(k);
    m.id = "m_vector-tab-mandate-1".into();
    m.limits[0].tab_cap = Some(amount("2.00"));
    m.limits[0].open_tabs = Some(1);
    m
}

/// One tab of the receiver `search`: a cap of 1.00 USD held over the ledger, `GET /search` at
/// 0.05 a call, one lane.
fn tab(k: &Keys) -> Tab {
    let cap = usd("1.00");
    Tab {
        stipendex: Tag::current("tab"),
        id: "t_vector-tab-1".into(),
        receiver: Party {
            id: "search".into(),
            key: k.receiver.public(),
        },
        origin: TAB_ORIGIN.into(),
        iat: NOW - 60,
        exp: NOW + 3600,
        asset: Asset::usd(),
        cap: cap.amount(),
        prices: vec![TabPrice {
            method: "GET".into(),
            pattern: "/search".into(),
            amount: amount("0.05"),
        }],
        lanes: 1,
        rails: vec![RailOffer {
            rail: "ledger".into(),
            offer: Offer {
                rail: RailId::new("ledger"),
                id: "o_t_vector-tab-1".into(),
                amount: cap,
                payee: "acct-shop".into(),
                mode: PaymentMode::Hold,
                expires_at: ms(NOW + 3600),
                details: Value::Null,
            },
        }],
    }
}

/// One splice of the valid tab chain, each re-signed by its signer.
#[derive(Default)]
struct TabTwist {
    /// The tab receipt's `cap` (and its `asset`, if given), not the tab's.
    receipt_cap: Option<(&'static str, Option<Asset>)>,
    /// The first voucher's `request`: the request digest of another call than its `resource`.
    first_request_of: Option<Resource>,
    /// The first voucher's `tab` id (its `tab_digest` still binds the tab).
    first_voucher_tab: Option<&'static str>,
    /// A change to the tab receipt before it is signed (its tab id, rail, totals, time).
    receipt_edit: Option<fn(&mut TabReceipt)>,
    /// The tab prices the MCP tool `search`, and the vouchers pay `tools/call search` with
    /// arguments (which the request digest covers and the resource does not carry).
    over_mcp: bool,
}

/// mandate, tab, proof (the hold), two vouchers each followed by its result line, tab receipt:
/// each binding the previous ones, with one twist.
fn tab_chain(k: &Keys, t: &TabTwist) -> Vec<String> {
    let m = Signed::sign(tab_mandate(k), &k.principal).unwrap();
    let mut tab = tab(k);
    if t.over_mcp {
        tab.id = "t_vector-tab-mcp-1".into();
        tab.prices[0].method = "tools/call".into();
        tab.prices[0].pattern = "search".into();
        tab.rails[0].offer.id = "o_t_vector-tab-mcp-1".into();
    }
    let tab = Signed::sign(tab, &k.receiver).unwrap();
    let offer = &tab.object().rails[0].offer;
    let proof = Signed::sign(
        Proof {
            stipendex: Tag::current("proof"),
            id: "p_vector-tab-hold-1".into(),
            wallet: k.wallet.public(),
            mandate: m.digest().clone(),
            quote: None,
            quote_jws: None,
            tab: Some(tab.digest().clone()),
            tab_jws: Some(tab.jws().to_owned()),
            challenge: None,
            confirmation: None,
            confirmation_jws: None,
            iat: NOW - 50,
            mode: PaymentMode::Hold,
            rail: "ledger".into(),
            asset: Asset::usd(),
            amount: offer.amount.amount(),
            payment: Payment {
                rail: RailId::new("ledger"),
                offer_id: offer.id.clone(),
                mode: PaymentMode::Hold,
                payer: "acct-agent".into(),
                amount: offer.amount.clone(),
                proof: json!({"hold": "h_vector-tab-1"}),
            },
        },
        &k.wallet,
    )
    .unwrap();
    let mut lines = vec![
        m.jws().to_owned(),
        tab.jws().to_owned(),
        proof.jws().to_owned(),
    ];
    let mut tree = CallTree::new();
    let mut last = None;
    for (seq, q) in [(1u64, "rust"), (2, "tokio")] {
        let (resource, mut request) = if t.over_mcp {
            // Over MCP: the arguments are in the digest, not in the resource.
            let args = json!({"q": q});
            let r =
                stipendex::mcp::request(Some(TAB_ORIGIN), "tools/call", "search", args.as_object());
            (r.resource().unwrap(), r.digest())
        } else {
            // The request digest a wallet signs and a receiver checks: the one function.
            let resource = tab_resource(q);
            let request = Request::from_resource(&resource).digest();
            (resource, request)
        };
        if seq == 1
            && let Some(other) = &t.first_request_of
        {
            request = Request::from_resource(other).digest();
        }
        let price = amount("0.05");
        let v = Signed::sign(
            Voucher {
                stipendex: Tag::current("voucher"),
                id: format!("v_vector-voucher-{seq}"),
                wallet: k.wallet.public(),
                tab: match t.first_voucher_tab {
                    Some(other) if seq == 1 => other.into(),
                    _ => tab.object().id.clone(),
                },
                tab_digest: tab.digest().clone(),
                lane: 0,
                seq,
                asset: Asset::usd(),
                amount: price,
                cumulative: amount(if seq == 1 { "0.05" } else { "0.10" }),
                resource,
                request,
                iat: NOW - 40 + seq,
            },
            &k.wallet,
        )
        .unwrap();
        let result = Digest::of(format!("result {seq}").as_bytes());
        tree.push(v.digest(), &result);
        lines.push(v.jws().to_owned());
        lines.push(stipendex::chain::result_line(v.digest(), &result));
        last = Some(v);
    }
    let last = last.unwrap();
    let (cap, asset) = match &t.receipt_cap {
        Some((cap, asset)) => (amount(cap), asset.clone().unwrap_or_else(Asset::usd)),
        None => (tab.object().cap, tab.object().asset.clone()),
    };
    let mut receipt = TabReceipt {
        stipendex: Tag::current("tab-receipt"),
        id: "tr_vector-tab-receipt-1".into(),
        receiver: tab.object().receiver.clone(),
        tab: tab.object().id.clone(),
        tab_digest: tab.digest().clone(),
        proof: proof.digest().clone(),
        iat: NOW - 20,
        asset,
        cap,
        captured: last.object().cumulative,
        lanes: vec![LaneEnd {
            lane: 0,
            seq: last.object().seq,
            cumulative: last.object().cumulative,
            voucher: last.digest().clone(),
        }],
        calls: 2,
        root: tab_root(&[tree.root()]),
        rail: "ledger".into(),
        reference: "c_vector-tab-capture-1".into(),
    };
    if let Some(edit) = t.receipt_edit {
        edit(&mut receipt);
    }
    let receipt = Signed::sign(receipt, &k.receiver).unwrap();
    lines.push(receipt.jws().to_owned());
    lines
}

fn tab_chain_case(name: &str, link: Option<&str>, note: &str, lines: Vec<String>) -> TabChainCase {
    TabChainCase {
        name: name.into(),
        expect: if link.is_some() {
            "broken_chain"
        } else {
            "valid"
        }
        .into(),
        link: link.map(str::to_owned),
        note: note.into(),
        lines,
    }
}

fn tab_chain_file(k: &Keys) -> TabChainFile {
    let cases = vec![
        tab_chain_case(
            "valid",
            None,
            "mandate (tab_cap 2.00), tab (cap 1.00 USD, GET /search at 0.05, one lane), the hold's proof, two vouchers each with its result, the tab receipt capturing 0.10 with the root over both calls.",
            tab_chain(k, &TabTwist::default()),
        ),
        tab_chain_case(
            "valid_over_mcp",
            None,
            "As valid, for the MCP tool `search` (tools/call at 0.05): each voucher's request digest covers the call's arguments ({\"q\": …}), which its resource {origin, method, path: name} does not carry, so it is not recomputed from the resource (docs/stipendex-profile.md §6b).",
            tab_chain(
                k,
                &TabTwist {
                    over_mcp: true,
                    ..TabTwist::default()
                },
            ),
        ),
        tab_chain_case(
            "tab_receipt_with_another_cap",
            Some("tab-receipt"),
            "The tab receipt, signed by the tab's receiver and binding the tab and the hold, says the cap is 2.00 USD; the tab's is 1.00 USD.",
            tab_chain(
                k,
                &TabTwist {
                    receipt_cap: Some(("2.00", None)),
                    ..TabTwist::default()
                },
            ),
        ),
        tab_chain_case(
            "tab_receipt_with_its_cap_in_another_asset",
            Some("tab-receipt"),
            "The tab receipt says the cap is 1.00 EUR; the tab's is 1.00 USD.",
            tab_chain(
                k,
                &TabTwist {
                    receipt_cap: Some(("1.00", Some(Asset::new("EUR", 2).unwrap()))),
                    ..TabTwist::default()
                },
            ),
        ),
        tab_chain_case(
            "voucher_whose_request_is_not_its_resource_digest",
            Some("voucher"),
            "The first voucher names GET /search?q=rust as its resource, but its request is the digest of GET /search?q=other; its result line and the receipt bind it as signed.",
            tab_chain(
                k,
                &TabTwist {
                    first_request_of: Some(tab_resource("other")),
                    ..TabTwist::default()
                },
            ),
        ),
        tab_chain_case(
            "voucher_naming_another_tab",
            Some("voucher"),
            "The first voucher binds the tab by digest but names another tab's id (t_vector-tab-2).",
            tab_chain(
                k,
                &TabTwist {
                    first_voucher_tab: Some("t_vector-tab-2"),
                    ..TabTwist::default()
                },
            ),
        ),
        tab_chain_case(
            "tab_receipt_naming_another_tab",
            Some("tab-receipt"),
            "The tab receipt binds the tab by digest but names another tab's id (t_vector-tab-2).",
            tab_chain(
                k,
                &TabTwist {
                    receipt_edit: Some(|r| r.tab = "t_vector-tab-2".into()),
                    ..TabTwist::default()
                },
            ),
        ),
        tab_chain_case(
            "tab_receipt_over_another_rail",
            Some("tab-receipt"),
            "The tab receipt says it captured over stripe; the hold's proof is over ledger.",
            tab_chain(
                k,
                &TabTwist {
                    receipt_edit: Some(|r| r.rail = "stripe".into()),
                    ..TabTwist::default()
                },
            ),
        ),
        tab_chain_case(
            "tab_receipt_issued_before_its_tab",
            Some("tab-receipt"),
            "The tab receipt is dated before the tab was issued.",
            tab_chain(
                k,
                &TabTwist {
                    receipt_edit: Some(|r| r.iat = NOW - 3600),
                    ..TabTwist::default()
                },
            ),
        ),
    ];
    TabChainFile {
        about: vec![
            "Stipendex test vectors: a tab's audit chain (mandate, tab, the hold's proof, vouchers with their result lines, tab receipt), in journal order, for stipendex::chain::verify_tab_chain and `stipendex verify-chain` (docs/stipendex-profile.md §4b).".into(),
            "principal: the trust anchor every case is verified with (verify_tab_chain(lines, Some(principal))).".into(),
            "cases[].expect: `valid`, or `broken_chain` with cases[].link, the link the verifier names (Error::Broken { link }). Each broken case is the valid chain with one object validly signed with one fault; the lines after it are re-made to bind it, so the named link is the only fault.".into(),
            "keys: each a 32-byte Ed25519 seed (hex) and its public key `ed25519:<base64url>`. now: the instant the objects were made around (Unix seconds); the verifier does not read the clock.".into(),
            "Generated by stipendex/tests/vectors.rs (cargo test -p stipendex --test vectors -- --ignored regenerate); regenerating reproduces this file byte for byte.".into(),
        ],
        now: NOW,
        keys: keys_json(),
        principal: k.principal.public().to_string(),
        cases,
    }
}

fn pretty<T: Serialize>(v: &T) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap();
    s.push('\n');
    s
}

/// Every vector file: name and content.
fn generate() -> Vec<(String, String)> {
    let w = world();
    let mut out: Vec<(String, String)> = [
        mandate_file(&w),
        quote_file(&w),
        confirmation_file(&w),
        proof_file(&w),
        receipt_file(&w),
    ]
    .iter()
    .map(|f| (format!("{}.json", f.object), pretty(f)))
    .collect();
    out.push(("chain.json".into(), pretty(&chain_file(&w.k))));
    out.push(("tab-chain.json".into(), pretty(&tab_chain_file(&w.k))));
    out
}

fn vectors_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vectors")
}

#[test]
#[ignore = "writes tests/vectors/*.json: run on purpose, after a deliberate change"]
fn regenerate() {
    let dir = vectors_dir();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, content) in generate() {
        std::fs::write(dir.join(&name), content).unwrap();
        eprintln!("wrote {}", dir.join(&name).display());
    }
}

#[test]
fn vectors_are_reproducible() {
    let dir = vectors_dir();
    let generated = generate();
    for (name, content) in &generated {
        let on_disk = std::fs::read_to_string(dir.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}; run the ignored test `regenerate`"));
        assert!(
            &on_disk == content,
            "{name} differs from what the generator writes: regenerate it (see the top of tests/vectors.rs) or find what made signing non-deterministic"
        );
    }
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".json"))
        .collect();
    names.sort();
    let mut expected: Vec<String> = generated.into_iter().map(|(n, _)| n).collect();
    expected.sort();
    assert_eq!(
        names, expected,
        "a vector file the generator does not write"
    );
}

// ---------------------------------------------------------------------------------------------
// The checker: reads the files.
// ---------------------------------------------------------------------------------------------

fn code<T>(r: Result<T, Error>) -> String {
    match r {
        Ok(_) => "valid".into(),
        Err(e) => e.code().into(),
    }
}

fn parse_as(object: &str, jws: &str) -> String {
    match object {
        "mandate" => code(Signed::<Mandate>::parse(jws)),
        "quote" => code(Signed::<Quote>::parse(jws)),
        "confirmation" => code(Signed::<Confirmation>::parse(jws)),
        "proof" => code(Signed::<Proof>::parse(jws)),
        "receipt" => code(Signed::<Receipt>::parse(jws)),
        other => panic!("no object type {other}"),
    }
}

/// A receiving rail the consumer check never reaches (the receiver judges the quote's time
/// before it asks the rail); if it were reached, its error would show.
struct StubRail;

impl stipendex::Rail for StubRail {
    fn id(&self) -> RailId {
        RailId::new("ledger")
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::pay_only(Finality::Immediate, vec![Asset::usd()])
    }
}

#[async_trait::async_trait]
impl stipendex::RailReceiver for StubRail {
    async fn offer(&self, _: &Charge) -> RailResult<Offer> {
        Err(RailError::InvalidInput(
            "the vectors' stub rail makes no offer".into(),
        ))
    }
    async fn verify(&self, _: &Offer, _: &Payment) -> RailResult<Verified> {
        Err(RailError::InvalidInput(
            "the vectors' stub rail verifies nothing".into(),
        ))
    }
}

/// Runs `c` on `jws` (the case's object) at `now`; the error code, or `valid`.
async fn consume(f: &VectorFile, c: &Consumer, jws: &str) -> String {
    let key = SecretKey::from_hex(&f.keys[&c.key].seed).unwrap();
    let clock: SharedClock = Arc::new(ManualClock::at(ms(f.now)));
    match c.check.as_str() {
        "wallet.pay" => {
            let (mandate, quote) = match f.object.as_str() {
                "mandate" => (jws, c.quote.as_deref().unwrap()),
                "quote" => (c.mandate.as_deref().unwrap(), jws),
                other => panic!("wallet.pay of a {other}"),
            };
            let wallet = Wallet::builder(key, Signed::parse(mandate).unwrap())
                .clock(clock)
                .build()
                .unwrap();
            code(wallet.pay(&Signed::parse(quote).unwrap()).await)
        }
        "receiver.accept" => {
            assert_eq!(f.object, "proof");
            let receiver =
                stipendex::receiver::Receiver::builder(c.receiver_id.clone().unwrap(), key)
                    .rail("stub", ReceiverHandle::pay_only(StubRail))
                    .clock(clock)
                    .build()
                    .unwrap();
            let r = c.request.as_ref().unwrap();
            let mut req = Request::new(r["method"].as_str().unwrap(), r["name"].as_str().unwrap())
                .with_params(r["params"].clone());
            req.origin = r["origin"].as_str().map(str::to_owned);
            code(receiver.accept(&req, jws).await)
        }
        other => panic!("no consumer check {other}"),
    }
}

fn read<T: for<'de> Deserialize<'de>>(name: &str) -> T {
    let text = std::fs::read_to_string(vectors_dir().join(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

const OBJECTS: [&str; 5] = ["mandate", "quote", "confirmation", "proof", "receipt"];

#[tokio::test]
async fn every_case_gives_its_outcome() {
    for object in OBJECTS {
        let f: VectorFile = read(&format!("{object}.json"));
        assert_eq!(f.object, object);
        for (name, key) in &f.keys {
            let k = SecretKey::from_hex(&key.seed).unwrap();
            assert_eq!(k.public().to_string(), key.public, "{object}: key {name}");
        }
        let valid = f
            .cases
            .iter()
            .find(|c| c.name == "valid")
            .expect("a valid case");
        for c in &f.cases {
            let got = parse_as(object, &c.jws);
            assert_eq!(got, c.expect, "{object}/{}: {}", c.name, c.note);
            if let Some(consumer) = &c.consumer {
                let got = consume(&f, consumer, &c.jws).await;
                assert_eq!(
                    got, consumer.expect,
                    "{object}/{} (consumer {}): {}",
                    c.name, consumer.check, c.note
                );
                // The valid case passes the same check's time test and goes on to the rail
                // (none in the wallet; the stub in the receiver): time is the reason.
                let control = consume(&f, consumer, &valid.jws).await;
                let beyond_time = match consumer.check.as_str() {
                    "wallet.pay" => "no_rail",
                    _ => "invalid_input",
                };
                assert_eq!(
                    control, beyond_time,
                    "{object}/valid through {}",
                    consumer.check
                );
            }
        }
        // Every required kind of case is there.
        for expect in [
            "valid",
            "bad_signature",
            "untrusted",
            "unsupported_version",
            "wrong_type",
            "malformed",
        ] {
            assert!(
                f.cases.iter().any(|c| c.expect == expect),
                "{object}: no {expect} case"
            );
        }
    }
}

#[test]
fn chain_cases_break_where_they_say() {
    let f: ChainFile = read("chain.json");
    let anchor = stipendex::envelope::PublicKey::parse(&f.principal).unwrap();
    for c in &f.cases {
        let objects: Vec<&str> = c.objects.iter().map(String::as_str).collect();
        match (
            c.expect.as_str(),
            stipendex::chain::verify_chain(&objects, Some(&anchor)),
        ) {
            ("valid", Ok(_)) => {}
            ("broken_chain", Err(Error::Broken { link, why })) => {
                assert_eq!(Some(link), c.link.as_deref(), "{}: {why}", c.name);
            }
            (expect, got) => panic!("{}: expected {expect}, got {got:?}", c.name),
        }
    }
    assert!(f.cases.iter().any(|c| c.name == "valid"));
    for link in ["mandate", "confirmation", "quote", "proof", "receipt"] {
        assert!(
            f.cases.iter().any(|c| c.link.as_deref() == Some(link)),
            "no case breaks the {link}"
        );
    }
}

/// How the verifier judged a case of `tab-chain.json` (verified as an auditor does, against
/// the file's principal): `Ok(root_checked)`, or the link it names (the error's code when it
/// is not a broken link) and its message.
fn verify_tab_case(f: &TabChainFile, c: &TabChainCase) -> Result<bool, (&'static str, String)> {
    let anchor = stipendex::envelope::PublicKey::parse(&f.principal).unwrap();
    match stipendex::chain::verify_tab_chain(c.lines.iter().map(String::as_str), Some(&anchor)) {
        Ok(chain) => Ok(chain.root_checked),
        Err(e @ Error::Broken { link, .. }) => Err((link, e.to_string())),
        Err(e) => Err((e.code(), e.to_string())),
    }
}

/// The case `name` of `tab-chain.json`, refused: the link named and the message.
fn tab_refusal(name: &str) -> (&'static str, String) {
    let f: TabChainFile = read("tab-chain.json");
    let c = f.cases.iter().find(|c| c.name == name).unwrap();
    match verify_tab_case(&f, c) {
        Err(refused) => refused,
        Ok(_) => panic!("{name}: expected a broken chain; the verifier accepted it"),
    }
}

#[test]
fn tab_chain_cases_break_where_they_say() {
    let f: TabChainFile = read("tab-chain.json");
    for c in &f.cases {
        match (c.expect.as_str(), verify_tab_case(&f, c)) {
            ("valid", Ok(root_checked)) => assert!(root_checked, "{}", c.name),
            ("broken_chain", Err((link, why))) => {
                assert_eq!(Some(link), c.link.as_deref(), "{}: {why}", c.name);
            }
            (expect, got) => panic!(
                "{}: expected {expect}, got {}",
                c.name,
                got.map_or_else(|(_, e)| e, |_| "valid (the verifier accepted it)".into())
            ),
        }
    }
    assert!(f.cases.iter().any(|c| c.name == "valid"));
    assert!(f.cases.iter().any(|c| c.name == "valid_over_mcp"));
}

#[test]
fn tab_receipt_with_another_cap_is_refused() {
    let (link, e) = tab_refusal("tab_receipt_with_another_cap");
    assert_eq!(link, "tab-receipt", "{e}");
    assert!(
        e.contains("cap") && e.contains('2') && e.contains('1'),
        "{e}"
    );
    let (link, e) = tab_refusal("tab_receipt_with_its_cap_in_another_asset");
    assert_eq!(link, "tab-receipt", "{e}");
    assert!(
        e.contains("cap") && e.contains("EUR") && e.contains("USD"),
        "{e}"
    );
}

#[test]
fn voucher_whose_request_is_not_its_resource_digest_is_refused() {
    let (link, e) = tab_refusal("voucher_whose_request_is_not_its_resource_digest");
    assert_eq!(link, "voucher", "{e}");
    assert!(
        e.contains("v_vector-voucher-1") && e.contains("request") && e.contains("resource"),
        "{e}"
    );
}
