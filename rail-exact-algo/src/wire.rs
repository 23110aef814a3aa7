//! The exact-algo wire format (`docs/exact-algo.md` §2): the 402 body, the `PAYMENT-SIGNATURE`
//! envelope and the `PAYMENT-RESPONSE` receipt, as plain serde types with strict decoding of what
//! payers send.

use data_encoding::{BASE64, BASE64_NOPAD, BASE64URL_NOPAD};
use serde::{Deserialize, Serialize};

use crate::txn::{SignedPay, TxnError};

/// `docs/exact-algo.md` §4.1: the amount is too small (re-read the 402 body and pay again).
pub const UNDERPAID: &str = "underpaid";
/// `docs/exact-algo.md` §4.1: the wrong receiver (use `payTo` exactly).
pub const RECEIVER_MISMATCH: &str = "receiver mismatch";
/// `docs/exact-algo.md` §4.1: no such challenge, or it expired (request a fresh 402).
pub const UNKNOWN_OR_EXPIRED_PAYMENT_ID: &str = "unknown or expired paymentId";
/// `docs/exact-algo.md` §4.1: single use violated (request a fresh 402).
pub const PAYMENT_ID_ALREADY_USED: &str = "paymentId already used";
/// `docs/exact-algo.md` §4.1: `last_valid_round` passed (sign again).
pub const TRANSACTION_EXPIRED: &str = "transaction expired";
/// `docs/exact-algo.md` §4.1: the network rejected it (check the wallet and retry).
pub const SETTLEMENT_FAILED: &str = "settlement failed";

/// The scheme's six error codes (`docs/exact-algo.md` §4.1), in its order: every refusal's
/// `error` is one of them.
pub const SEED_ERRORS: [&str; 6] = [
    UNDERPAID,
    RECEIVER_MISMATCH,
    UNKNOWN_OR_EXPIRED_PAYMENT_ID,
    PAYMENT_ID_ALREADY_USED,
    TRANSACTION_EXPIRED,
    SETTLEMENT_FAILED,
];

/// How a refusal goes on the wire (`docs/exact-algo.md` §4): `error`, always one of the six
/// codes ([`SEED_ERRORS`]), so a client written to `docs/exact-algo.md` recognises every
/// refusal; and `reason`, this receiver's finer stable code, sent beside it when it says more
/// than the six-code `error` (`fee too high` under `settlement failed`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ErrorCode {
    /// One of the six codes (`docs/exact-algo.md` §4.1): the 402 body's (or MCP
    /// `structuredContent`'s) `error`.
    pub error: &'static str,
    /// The finer code (`reason`); `None` when the six-code `error` is all there is to say.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<&'static str>,
}

impl ErrorCode {
    /// A case one of the six codes names itself (`docs/exact-algo.md` §4.1).
    #[must_use]
    pub const fn seed(error: &'static str) -> Self {
        ErrorCode {
            error,
            reason: None,
        }
    }

    /// A finer case `reason`, sent under the six-code `error` (`docs/exact-algo.md` §4.2).
    #[must_use]
    pub const fn finer(error: &'static str, reason: &'static str) -> Self {
        ErrorCode {
            error,
            reason: Some(reason),
        }
    }

    /// The finer code if there is one, else the six-code `error`.
    #[must_use]
    pub fn most_specific(&self) -> &'static str {
        self.reason.unwrap_or(self.error)
    }
}

/// The `network` of a chain: `algorand:` + the first 32 characters of the base64url genesis
/// hash (CAIP-2; testnet: `algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe`). This is what a receiver
/// sends; [`normalize_network`] also reads the whole-hash spelling some x402 SDKs use.
#[must_use]
pub fn network_id(genesis_hash: &[u8; 32]) -> String {
    let b = BASE64URL_NOPAD.encode(genesis_hash);
    format!("algorand:{}", b.get(..32).unwrap_or(&b))
}

/// The CAIP-2 form ([`network_id`]) of an Algorand `network`, in either spelling:
///
/// - `algorand:` + a 32-character reference, the CAIP-2 form (`docs/exact-algo.md` §2.5). Written
///   in the standard base64 alphabet it is the same reference: `+` reads as `-`, `/` as `_`;
/// - `algorand:` + the whole genesis hash, as some x402 SDKs spell it
///   (`algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=`), in standard base64 or
///   base64url, with or without padding; it must decode (canonically) to exactly 32 bytes.
///
/// `None` for anything else (another namespace, another length, a character outside the
/// alphabets, the two alphabets mixed, a hash that is not 32 bytes).
#[must_use]
pub fn normalize_network(network: &str) -> Option<String> {
    let reference = network.strip_prefix("algorand:")?;
    let standard = reference.contains(['+', '/']);
    let url = reference.contains(['-', '_']);
    if standard && url {
        return None;
    }
    if reference.len() == 32 {
        let ok = reference
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'-' | b'_'));
        return ok.then(|| format!("algorand:{}", reference.replace('+', "-").replace('/', "_")));
    }
    let standard_form = reference.replace('-', "+").replace('_', "/");
    let decoded = match standard_form.len() {
        44 => BASE64.decode(standard_form.as_bytes()).ok()?,
        43 => BASE64_NOPAD.decode(standard_form.as_bytes()).ok()?,
        _ => return None,
    };
    let genesis_hash: [u8; 32] = decoded.try_into().ok()?;
    Some(network_id(&genesis_hash))
}

/// Whether `a` and `b` name the same Algorand network, whichever spelling each uses (see
/// [`normalize_network`]). `false` when either is not an Algorand network.
#[must_use]
pub fn same_network(a: &str, b: &str) -> bool {
    match (normalize_network(a), normalize_network(b)) {
        (Some(a), Some(b)) => a == b,
        _ => false,
    }
}

/// `extra` of a challenge.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Extra {
    /// 32 hex digits, single use; the payment's note must be exactly this.
    pub payment_id: String,
    /// The network's minimum fee, microALGO.
    pub min_fee_micro_algo: u64,
}

/// One entry of `accepts`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Accept {
    /// Always `exact`.
    pub scheme: String,
    /// See [`network_id`].
    pub network: String,
    /// Always `ALGO`.
    pub asset: String,
    /// microALGO, as a decimal string.
    pub max_amount_required: String,
    /// The paid resource.
    pub resource: String,
    /// What it is.
    pub description: String,
    /// The receiving address.
    pub pay_to: String,
    /// How long the challenge stays payable.
    pub max_timeout_seconds: u64,
    /// paymentId and minimum fee.
    pub extra: Extra,
}

/// The 402 body.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentRequired {
    /// 2.
    pub x402_version: u32,
    /// `payment required`, or why a payment was refused: one of the six codes
    /// ([`SEED_ERRORS`], `docs/exact-algo.md` §4.1).
    pub error: String,
    /// The finer reason a payment was refused ([`ErrorCode::reason`]), when there is one;
    /// absent from the JSON otherwise (the plain body of `docs/exact-algo.md` §2.1 is
    /// unchanged).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// What would be accepted.
    pub accepts: Vec<Accept>,
}

/// `payload` of the envelope.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Payload {
    /// The signed transaction, base64 of its msgpack.
    pub txn: String,
}

/// The `PAYMENT-SIGNATURE` envelope (base64 of this JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Envelope {
    /// 2.
    pub x402_version: u32,
    /// `exact`.
    pub scheme: String,
    /// See [`network_id`].
    pub network: String,
    /// The payment.
    pub payload: Payload,
}

/// The `PAYMENT-RESPONSE` receipt (base64 of this JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PaymentResponse {
    /// Settled.
    pub success: bool,
    /// The transaction id.
    pub transaction: String,
    /// See [`network_id`].
    pub network: String,
    /// The paying address.
    pub payer: String,
    /// microALGO paid, as a decimal string.
    pub amount: String,
    /// The round it was confirmed in.
    pub confirmed_round: u64,
}

/// Why a `PAYMENT-SIGNATURE` header is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The header is not one visible-ASCII value (two headers, or bytes outside ASCII).
    #[error("PAYMENT-SIGNATURE is not one visible-ASCII header value")]
    Header,
    /// Not base64.
    #[error("header is not base64")]
    Base64,
    /// Not the envelope JSON (or it has unknown fields).
    #[error("envelope is not valid: {0}")]
    Json(String),
    /// Another protocol version.
    #[error("x402Version {0} is not 2")]
    Version(u32),
    /// Another scheme.
    #[error("scheme {0:?} is not exact")]
    Scheme(String),
    /// Another network.
    #[error("wrong network: {0}")]
    Network(String),
    /// The transaction is not base64.
    #[error("payload.txn is not base64")]
    TxnBase64,
    /// The transaction is not an acceptable signed payment.
    #[error(transparent)]
    Txn(#[from] TxnError),
}

/// Decodes a `PAYMENT-SIGNATURE` header for network `network`: base64 → JSON → base64 →
/// strict msgpack. The envelope's `network` may spell `network` either way
/// ([`same_network`]). Nothing is trusted before the signature and rules are checked.
///
/// # Errors
/// [`WireError`] naming the first problem.
pub fn decode_payment_header(
    header: &str,
    network: &str,
) -> Result<(Envelope, SignedPay), WireError> {
    let json = BASE64
        .decode(header.trim().as_bytes())
        .map_err(|_| WireError::Base64)?;
    let env: Envelope =
        serde_json::from_slice(&json).map_err(|e| WireError::Json(e.to_string()))?;
    if env.x402_version != 2 {
        return Err(WireError::Version(env.x402_version));
    }
    if env.scheme != "exact" {
        return Err(WireError::Scheme(env.scheme));
    }
    // The receiver's own spelling costs nothing; another is normalised.
    if env.network != network && !same_network(&env.network, network) {
        return Err(WireError::Network(env.network));
    }
    let raw = BASE64
        .decode(env.payload.txn.as_bytes())
        .map_err(|_| WireError::TxnBase64)?;
    let signed = SignedPay::decode(&raw)?;
    Ok((env, signed))
}

/// Encodes a JSON value as a header (base64 of its JSON).
///
/// # Errors
/// Only if `value` does not serialize (never for the types here).
pub fn header<T: Serialize>(value: &T) -> Result<String, serde_json::Error> {
    Ok(BASE64.encode(&serde_json::to_vec(value)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TESTNET_GH: &str = "SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=";
    const GOLDEN: &str = "gqNzaWfEQPhUAZ3xkDDcc8FvOVo6UinzmKBCqs0woYSfodlmBMfQvGbeUx3Srxy3dyJDzv7rLm26BRv9FnL2/AuT7NYfiAWjdHhui6NhbXTNA+ilY2xvc2XEIEDpNJKIJWTLzpxZpptnVCaJ6aHDoqnqW2Wm6KRCH/xXo2ZlZc0EmKJmds0wsqNnZW6sZGV2bmV0LXYzMy4womdoxCAmCyAJoJOohot5WHIvpeVG7eftF+TYXEx4r7BFJpDt0qJsds00mqRub3RlxAjqABVHQ2y/lqNyY3bEIHts4k/rW6zAsWTinCIsV/X2PcOH1DkEglhBHF/hD3wCo3NuZMQg5/D4TQaBHfnzHI2HixFV9GcdUaGFwgCQhmf0SVhwaKGkdHlwZaNwYXk=";

    #[test]
    fn network_id_matches_the_seed() {
        let gh: [u8; 32] = BASE64
            .decode(TESTNET_GH.as_bytes())
            .unwrap()
            .try_into()
            .unwrap();
        assert_eq!(network_id(&gh), "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe");
    }

    const TESTNET: &str = "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe";
    const MAINNET: &str = "algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73k";
    const BETANET: &str = "algorand:mFgazF-2uRS1tMiL9dsj01hJGySEmPN2";

    #[test]
    fn both_spellings_of_a_network_normalize_to_caip2() {
        let n = |s: &str| normalize_network(s);
        for (spelling, caip2) in [
            // CAIP-2 (the spelling receivers send, `docs/exact-algo.md` §2.5) maps to itself.
            (TESTNET, TESTNET),
            (MAINNET, MAINNET),
            (BETANET, BETANET),
            // The whole hash in standard base64, padded (x402 SDKs).
            (
                "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=",
                TESTNET,
            ),
            (
                "algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73ktiC1qzkkit8=",
                MAINNET,
            ),
            (
                "algorand:mFgazF+2uRS1tMiL9dsj01hJGySEmPN28B/TjjvpVW0=",
                BETANET,
            ),
            // …unpadded, and in base64url with or without padding.
            (
                "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI",
                TESTNET,
            ),
            (
                "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9_cOUJOiI",
                TESTNET,
            ),
            (
                "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9_cOUJOiI=",
                TESTNET,
            ),
            (
                "algorand:mFgazF-2uRS1tMiL9dsj01hJGySEmPN28B_TjjvpVW0",
                BETANET,
            ),
            // A 32-character reference in the standard alphabet is the same reference.
            ("algorand:mFgazF+2uRS1tMiL9dsj01hJGySEmPN2", BETANET),
        ] {
            assert_eq!(n(spelling).as_deref(), Some(caip2), "{spelling}");
        }
        for not_algorand in [
            "",
            "algorand:",
            "algorand",
            "eip155:1",
            "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
            "Algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe",
            "algorand-testnet",
            "SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=",
            // Wrong lengths: 31 and 33 characters, a 24-byte and a 33-byte hash.
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCD",
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDex",
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/",
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiIA",
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiIAAA==",
            // Garbage: outside the alphabets, padding in a reference, mixed alphabets,
            // non-canonical trailing bits, misplaced padding.
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8Fmnr!De",
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCD=",
            "algorand:mFgazF+2uRS1tMiL9dsj01hJGySEmPN28B_TjjvpVW0=",
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiJ=",
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOi=I",
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe xi9/cOUJOiI=",
        ] {
            assert_eq!(n(not_algorand), None, "{not_algorand:?}");
        }
    }

    #[test]
    fn same_network_reads_either_spelling() {
        assert!(same_network(
            TESTNET,
            "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI="
        ));
        assert!(same_network(
            "algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73ktiC1qzkkit8=",
            MAINNET
        ));
        assert!(same_network(TESTNET, TESTNET));
        assert!(!same_network(TESTNET, MAINNET));
        assert!(!same_network(
            TESTNET,
            "algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73ktiC1qzkkit8="
        ));
        // Not an Algorand network: never the same as anything, itself included.
        assert!(!same_network("eip155:1", "eip155:1"));
        assert!(!same_network(TESTNET, "algorand:testnet"));
    }

    #[test]
    fn a_refusal_reason_is_only_on_the_wire_when_there_is_one() {
        let seed_only = PaymentRequired {
            x402_version: 2,
            error: "paymentId already used".into(),
            reason: None,
            accepts: Vec::new(),
        };
        assert_eq!(
            serde_json::to_string(&seed_only).unwrap(),
            r#"{"x402Version":2,"error":"paymentId already used","accepts":[]}"#
        );
        let finer = PaymentRequired {
            error: "settlement failed".into(),
            reason: Some("fee too high".into()),
            ..seed_only
        };
        let json = serde_json::to_string(&finer).unwrap();
        assert_eq!(
            json,
            r#"{"x402Version":2,"error":"settlement failed","reason":"fee too high","accepts":[]}"#
        );
        assert_eq!(
            serde_json::from_str::<PaymentRequired>(&json).unwrap(),
            finer
        );
    }

    #[test]
    fn the_seed_402_body_parses_as_is() {
        let body = r#"{"x402Version":2,"error":"payment required","accepts":[{"scheme":"exact",
            "network":"algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe","asset":"ALGO",
            "maxAmountRequired":"1000","resource":"/api/posts/1","description":"read post body",
            "payTo":"PNWOET7LLOWMBMLE4KOCELCX6X3D3Q4H2Q4QJASYIEOF7YIPPQBG3YQ5YI",
            "maxTimeoutSeconds":120,"extra":{"paymentId":"0123456789abcdef0123456789abcdef",
            "minFeeMicroAlgo":1000}}]}"#;
        let p: PaymentRequired = serde_json::from_str(body).unwrap();
        assert_eq!(p.accepts[0].extra.payment_id.len(), 32);
        assert_eq!(p.accepts[0].max_amount_required, "1000");
        assert_eq!(p.reason, None);
    }

    #[test]
    fn envelopes_decode_strictly() {
        let net = "algorand:JgsgCaCTqIaLeVhyL6XlRu3n7Rfk2FxM";
        let env = |v: u32, scheme: &str, network: &str, txn: &str| {
            header(&serde_json::json!({"x402Version": v, "scheme": scheme, "network": network, "payload": {"txn": txn}})).unwrap()
        };
        let (_, s) = decode_payment_header(&env(2, "exact", net, GOLDEN), net).unwrap();
        assert_eq!(s.txn.amount, 1000);
        assert_eq!(
            decode_payment_header(&env(1, "exact", net, GOLDEN), net).unwrap_err(),
            WireError::Version(1)
        );
        assert!(matches!(
            decode_payment_header(&env(2, "upto", net, GOLDEN), net),
            Err(WireError::Scheme(_))
        ));
        assert!(matches!(
            decode_payment_header(&env(2, "exact", "algorand:other", GOLDEN), net),
            Err(WireError::Network(_))
        ));
        // The same network spelled with the whole genesis hash (x402 SDKs) is this network.
        let whole = "algorand:JgsgCaCTqIaLeVhyL6XlRu3n7Rfk2FxMeK+wRSaQ7dI=";
        assert_eq!(normalize_network(whole).as_deref(), Some(net));
        let (e, s) = decode_payment_header(&env(2, "exact", whole, GOLDEN), net).unwrap();
        assert_eq!((e.network.as_str(), s.txn.amount), (whole, 1000));
        assert!(matches!(
            decode_payment_header(
                &env(
                    2,
                    "exact",
                    "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=",
                    GOLDEN
                ),
                net
            ),
            Err(WireError::Network(_))
        ));
        assert_eq!(
            decode_payment_header(&env(2, "exact", net, "!!"), net).unwrap_err(),
            WireError::TxnBase64
        );
        assert_eq!(
            decode_payment_header("not base64 at all", net).unwrap_err(),
            WireError::Base64
        );
        let extra = header(&serde_json::json!({"x402Version": 2, "scheme": "exact", "network": net, "payload": {"txn": GOLDEN, "sig": "x"}})).unwrap();
        assert!(matches!(
            decode_payment_header(&extra, net),
            Err(WireError::Json(_))
        ));
        assert!(matches!(
            decode_payment_header(&env(2, "exact", net, "gA=="), net),
            Err(WireError::Txn(_))
        ));
    }
}
