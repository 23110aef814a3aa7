//! NIP-47 (Nostr Wallet Connect) as of 2026: event kinds, the connection URI, and the JSON of
//! requests, responses and notifications — our own types, because `nostr::nips::nip47` 0.44
//! speaks NIP-04 only and refuses unknown methods and error codes, where the NIP asks clients to
//! tolerate them.
//!
//! Kinds: 13194 info (replaceable; content = supported methods, space separated; tags
//! `encryption` = `nip44_v2 nip04`, `notifications`), 23194 request, 23195 response, 23197
//! notification (NIP-44), 23196 legacy notification (NIP-04). A request carries `p` (the wallet
//! service), `encryption` (`nip44_v2` or `nip04`) and optionally `expiration`; a response `p`
//! (the client) and `e` (the request id).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Info event kind.
pub const KIND_INFO: u16 = 13194;
/// Request kind.
pub const KIND_REQUEST: u16 = 23194;
/// Response kind.
pub const KIND_RESPONSE: u16 = 23195;
/// Notification kind (NIP-44).
pub const KIND_NOTIFICATION: u16 = 23197;
/// Legacy notification kind (NIP-04).
pub const KIND_NOTIFICATION_NIP04: u16 = 23196;

/// A payload encryption.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Encryption {
    /// NIP-44 version 2 (preferred).
    Nip44V2,
    /// NIP-04 (legacy).
    Nip04,
}

impl Encryption {
    /// The tag value: `nip44_v2` or `nip04`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Encryption::Nip44V2 => "nip44_v2",
            Encryption::Nip04 => "nip04",
        }
    }

    /// Parses a tag value (unknown values are `None`, not an error).
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "nip44_v2" => Some(Encryption::Nip44V2),
            "nip04" => Some(Encryption::Nip04),
            _ => None,
        }
    }
}

/// A NIP-47 error code. Unknown codes are kept, not refused.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// `RATE_LIMITED`
    RateLimited,
    /// `NOT_IMPLEMENTED`
    NotImplemented,
    /// `INSUFFICIENT_BALANCE`
    InsufficientBalance,
    /// `QUOTA_EXCEEDED`
    QuotaExceeded,
    /// `RESTRICTED`
    Restricted,
    /// `UNAUTHORIZED`
    Unauthorized,
    /// `INTERNAL`
    Internal,
    /// `UNSUPPORTED_ENCRYPTION`
    UnsupportedEncryption,
    /// `PAYMENT_FAILED`
    PaymentFailed,
    /// `NOT_FOUND`
    NotFound,
    /// `OTHER`
    Other,
    /// A code this version does not know.
    Unknown(String),
}

impl ErrorCode {
    /// The wire string.
    #[must_use]
    pub fn as_str(&self) -> &str {
        match self {
            ErrorCode::RateLimited => "RATE_LIMITED",
            ErrorCode::NotImplemented => "NOT_IMPLEMENTED",
            ErrorCode::InsufficientBalance => "INSUFFICIENT_BALANCE",
            ErrorCode::QuotaExceeded => "QUOTA_EXCEEDED",
            ErrorCode::Restricted => "RESTRICTED",
            ErrorCode::Unauthorized => "UNAUTHORIZED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::UnsupportedEncryption => "UNSUPPORTED_ENCRYPTION",
            ErrorCode::PaymentFailed => "PAYMENT_FAILED",
            ErrorCode::NotFound => "NOT_FOUND",
            ErrorCode::Other => "OTHER",
            ErrorCode::Unknown(s) => s,
        }
    }

    /// Whether a retry later may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, ErrorCode::RateLimited | ErrorCode::Internal)
    }
}

impl From<&str> for ErrorCode {
    fn from(s: &str) -> Self {
        match s {
            "RATE_LIMITED" => ErrorCode::RateLimited,
            "NOT_IMPLEMENTED" => ErrorCode::NotImplemented,
            "INSUFFICIENT_BALANCE" => ErrorCode::InsufficientBalance,
            "QUOTA_EXCEEDED" => ErrorCode::QuotaExceeded,
            "RESTRICTED" => ErrorCode::Restricted,
            "UNAUTHORIZED" => ErrorCode::Unauthorized,
            "INTERNAL" => ErrorCode::Internal,
            "UNSUPPORTED_ENCRYPTION" => ErrorCode::UnsupportedEncryption,
            "PAYMENT_FAILED" => ErrorCode::PaymentFailed,
            "NOT_FOUND" => ErrorCode::NotFound,
            "OTHER" => ErrorCode::Other,
            other => ErrorCode::Unknown(other.to_owned()),
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorCode {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorCode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(ErrorCode::from(s.as_str()))
    }
}

/// A request's content (before encryption).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// The method (`pay_invoice`, …); unknown methods are answered `NOT_IMPLEMENTED`.
    pub method: String,
    /// Its parameters.
    #[serde(default)]
    pub params: Value,
}

/// The error of a response.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// The code.
    pub code: ErrorCode,
    /// A human-readable message.
    #[serde(default)]
    pub message: String,
}

/// A response's content (after decryption).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    /// The method this answers; must equal the request's.
    pub result_type: String,
    /// Set on failure.
    #[serde(default)]
    pub error: Option<ErrorBody>,
    /// Set on success.
    #[serde(default)]
    pub result: Option<Value>,
}

/// A notification's content (after decryption).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    /// `payment_received`, `payment_sent`, `hold_invoice_accepted`, or one this version does
    /// not know.
    pub notification_type: String,
    /// What happened.
    pub notification: Value,
}

/// `pay_invoice` parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayInvoiceParams {
    /// The BOLT11 invoice.
    pub invoice: String,
    /// msat, for an invoice without an amount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<u64>,
}

/// `pay_invoice` result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayInvoiceResult {
    /// Hex preimage.
    pub preimage: String,
    /// msat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fees_paid: Option<u64>,
}

/// `make_invoice` parameters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MakeInvoiceParams {
    /// msat.
    pub amount: u64,
    /// The invoice's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<u64>,
}

/// `make_hold_invoice` parameters: the receiver chooses the payment hash and keeps the preimage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MakeHoldInvoiceParams {
    /// msat.
    pub amount: u64,
    /// Hex SHA-256 of the receiver's preimage.
    pub payment_hash: String,
    /// The invoice's description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry: Option<u64>,
    /// The final CLTV delta.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_cltv_expiry_delta: Option<u32>,
}

/// The state of a transaction.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TxState {
    /// Not paid yet.
    Pending,
    /// A hold invoice whose payment is held, waiting for settle or cancel.
    Accepted,
    /// Paid (the preimage is known).
    Settled,
    /// Lapsed unpaid.
    Expired,
    /// Failed or canceled.
    Failed,
    /// A state this version does not know.
    #[serde(other)]
    Unknown,
}

/// An invoice or payment (`make_invoice`, `make_hold_invoice`, `lookup_invoice`,
/// `list_transactions`, notifications).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transaction {
    /// `incoming` or `outgoing`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its state (wallets that predate the field omit it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TxState>,
    /// The BOLT11 invoice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub invoice: Option<String>,
    /// The description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Hex preimage, once paid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preimage: Option<String>,
    /// Hex payment hash.
    pub payment_hash: String,
    /// msat.
    pub amount: u64,
    /// msat.
    #[serde(default)]
    pub fees_paid: u64,
    /// Unix seconds.
    #[serde(default)]
    pub created_at: u64,
    /// Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<u64>,
    /// Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settled_at: Option<u64>,
}

/// `get_balance` result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Balance {
    /// msat.
    pub balance: u64,
}

/// `get_info` result (the parts the rail reads).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetInfo {
    /// The node alias.
    #[serde(default)]
    pub alias: String,
    /// The node's public key (hex): invoices of this wallet are signed by it.
    #[serde(default)]
    pub pubkey: String,
    /// `mainnet`, `testnet`, `signet` or `regtest`.
    #[serde(default)]
    pub network: String,
    /// The supported methods.
    #[serde(default)]
    pub methods: Vec<String>,
    /// The supported notifications.
    #[serde(default)]
    pub notifications: Vec<String>,
}

/// Why a connection URI does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UriError {
    /// Not `nostr+walletconnect://…`.
    #[error("not a nostr+walletconnect URI")]
    Scheme,
    /// The wallet public key is not 32 bytes of hex.
    #[error("wallet public key is not 64 hex digits")]
    PublicKey,
    /// No relay.
    #[error("no relay")]
    NoRelay,
    /// No secret, or not 32 bytes of hex.
    #[error("secret is missing or not 64 hex digits")]
    Secret,
}

/// A connection URI: `nostr+walletconnect://<wallet pubkey>?relay=…&relay=…&secret=…&lud16=…`.
/// `Debug` never shows the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionUri {
    /// The wallet service's public key (hex).
    pub wallet_pubkey: String,
    /// Relays (at least one).
    pub relays: Vec<String>,
    /// The client's secret key (hex).
    pub secret: String,
    /// A lightning address.
    pub lud16: Option<String>,
}

impl fmt::Debug for ConnectionUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionUri")
            .field("wallet_pubkey", &self.wallet_pubkey)
            .field("relays", &self.relays)
            .field("secret", &"<redacted>")
            .field("lud16", &self.lud16)
            .finish()
    }
}

fn is_hex32(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

impl FromStr for ConnectionUri {
    type Err = UriError;

    fn from_str(s: &str) -> Result<Self, UriError> {
        let rest = s
            .strip_prefix("nostr+walletconnect://")
            .or_else(|| s.strip_prefix("nostr+walletconnect:"))
            .ok_or(UriError::Scheme)?;
        let (pk, query) = rest.split_once('?').unwrap_or((rest, ""));
        let pk = pk.trim_end_matches('/');
        if !is_hex32(pk) {
            return Err(UriError::PublicKey);
        }
        let mut relays = Vec::new();
        let mut secret = None;
        let mut lud16 = None;
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "relay" => relays.push(v.into_owned()),
                "secret" => secret = Some(v.into_owned()),
                "lud16" if !v.is_empty() => lud16 = Some(v.into_owned()),
                _ => {}
            }
        }
        if relays.is_empty() {
            return Err(UriError::NoRelay);
        }
        let secret = secret.filter(|s| is_hex32(s)).ok_or(UriError::Secret)?;
        Ok(ConnectionUri {
            wallet_pubkey: pk.to_ascii_lowercase(),
            relays,
            secret: secret.to_ascii_lowercase(),
            lud16,
        })
    }
}

impl fmt::Display for ConnectionUri {
    /// The URI itself (it contains the secret: treat the string as one).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for r in &self.relays {
            q.append_pair("relay", r);
        }
        q.append_pair("secret", &self.secret);
        if let Some(l) = &self.lud16 {
            q.append_pair("lud16", l);
        }
        write!(
            f,
            "nostr+walletconnect://{}?{}",
            self.wallet_pubkey,
            q.finish()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nips_example_uri_parses_and_round_trips() {
        let s = "nostr+walletconnect://b889ff5b1513b641e2a139f661a661364979c5beee91842f8f0ef42ab558e9d4?relay=wss%3A%2F%2Frelay.damus.io&secret=71a8c14c1407c113601079c4302dab36460f0ccd0ad506f1f2dc73b5100e4f3c";
        let u: ConnectionUri = s.parse().unwrap();
        assert_eq!(u.relays, vec!["wss://relay.damus.io".to_owned()]);
        assert_eq!(u.to_string(), s);
        assert!(!format!("{u:?}").contains("71a8c14c"));
        let two = format!("{s}&relay=ws%3A%2F%2F127.0.0.1%3A7000&lud16=a%40b.c");
        let u: ConnectionUri = two.parse().unwrap();
        assert_eq!(u.relays.len(), 2);
        assert_eq!(u.lud16.as_deref(), Some("a@b.c"));
        for bad in [
            "http://x",
            "nostr+walletconnect://abc?relay=wss://r&secret=00",
            "nostr+walletconnect://b889ff5b1513b641e2a139f661a661364979c5beee91842f8f0ef42ab558e9d4?secret=71a8c14c1407c113601079c4302dab36460f0ccd0ad506f1f2dc73b5100e4f3c",
            "nostr+walletconnect://b889ff5b1513b641e2a139f661a661364979c5beee91842f8f0ef42ab558e9d4?relay=wss%3A%2F%2Fr",
        ] {
            assert!(bad.parse::<ConnectionUri>().is_err(), "{bad}");
        }
    }

    #[test]
    fn unknown_codes_and_states_are_tolerated() {
        let r: Response = serde_json::from_str(
            r#"{"result_type":"pay_invoice","error":{"code":"BAD_REQUEST","message":"x"},"result":null}"#,
        )
        .unwrap();
        assert_eq!(
            r.error.unwrap().code,
            ErrorCode::Unknown("BAD_REQUEST".into())
        );
        let t: Transaction = serde_json::from_str(
            r#"{"type":"incoming","state":"frozen","payment_hash":"00","amount":1}"#,
        )
        .unwrap();
        assert_eq!(t.state, Some(TxState::Unknown));
    }
}
