//! Request signing: every call to the facilitator is signed by the account that makes it.
//!
//! The signature is Ed25519 over a canonical text of the request:
//!
//! ```text
//! stipendex-facilitator/v1
//! <the facilitator's network name>
//! <METHOD>
//! <path and query, as sent>
//! <account id>
//! <timestamp: milliseconds since the epoch>
//! <nonce: 16 random bytes, base64url>
//! <Idempotency-Key, or nothing>
//! <SHA-256 of the body, lowercase hex>
//! ```
//!
//! and travels in four headers ([`ACCOUNT`], [`TIMESTAMP`], [`NONCE`], [`SIGNATURE`]). The
//! facilitator refuses a request whose timestamp is more than its replay window away from its
//! own clock ([`DEFAULT_WINDOW`], 5 minutes), and a nonce it has seen within that window: a
//! captured request cannot be sent again, and an old one cannot be sent at all.

mod check;
mod sign;

use std::time::Duration;

pub use check::{SignedRequest, check};
pub use sign::{AccountKey, AccountPublicKey, Signature, nonce};

/// The header naming the signing account (32 lowercase hex digits).
pub const ACCOUNT: &str = "stipendex-account";
/// The header carrying the request's time, milliseconds since the epoch.
pub const TIMESTAMP: &str = "stipendex-timestamp";
/// The header carrying the request's nonce (base64url of 16 random bytes).
pub const NONCE: &str = "stipendex-nonce";
/// The header carrying the Ed25519 signature (base64url, 64 bytes).
pub const SIGNATURE: &str = "stipendex-signature";
/// The idempotency key of a mutating call: the same key and body apply once.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// How far a request's timestamp may be from the facilitator's clock, either way.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// The first line of every signed text: the protocol and its version.
pub const DOMAIN: &str = "stipendex-facilitator/v1";

/// What a request says, apart from its signing headers, and the facilitator it is for.
#[derive(Clone, Copy, Debug)]
pub struct RequestParts<'a> {
    /// The facilitator's network name (the checking facilitator's own): a request signed for
    /// one facilitator is refused by every other.
    pub network: &'a str,
    /// `GET`, `POST`, …
    pub method: &'a str,
    /// The path and query as sent (`/v1/payments?x=1`).
    pub path_and_query: &'a str,
    /// The idempotency key, if the call carries one.
    pub idempotency_key: Option<&'a str>,
    /// The raw body (empty for none).
    pub body: &'a [u8],
}

/// One request as it is signed.
#[derive(Clone, Copy, Debug)]
pub struct Canonical<'a> {
    /// The facilitator's network name.
    pub network: &'a str,
    /// `GET`, `POST`, …
    pub method: &'a str,
    /// The path and query as sent (`/v1/payments?x=1`).
    pub path_and_query: &'a str,
    /// The signing account.
    pub account: &'a str,
    /// Milliseconds since the epoch.
    pub timestamp_ms: i64,
    /// The nonce header's value.
    pub nonce: &'a str,
    /// The idempotency key, if the call carries one.
    pub idempotency_key: Option<&'a str>,
    /// The raw body (empty for none).
    pub body: &'a [u8],
}

impl Canonical<'_> {
    /// The exact bytes that are signed.
    #[must_use]
    pub fn to_bytes(&self) -> Vec<u8> {
        use sha2::{Digest, Sha256};
        let body = hex::encode(Sha256::digest(self.body));
        format!(
            "{DOMAIN}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{body}",
            self.network,
            self.method,
            self.path_and_query,
            self.account,
            self.timestamp_ms,
            self.nonce,
            self.idempotency_key.unwrap_or(""),
        )
        .into_bytes()
    }
}

/// Why a request's signature was refused. Nothing is done for a refused request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    /// A signing header is missing.
    #[error("the request is not signed: header {0} is missing")]
    Missing(&'static str),
    /// A signing header cannot be read.
    #[error("the request's {0} header is malformed: {1}")]
    Malformed(&'static str, String),
    /// The account is not known to the facilitator (or is disabled).
    #[error("account {0} is not known to this facilitator")]
    UnknownAccount(String),
    /// The signature does not verify under the account's key.
    #[error("the request's signature does not verify under account {0}'s key")]
    BadSignature(String),
    /// The timestamp is outside the replay window.
    #[error(
        "the request's timestamp is {skew_ms} ms from the facilitator's clock (window {window_ms} ms): check the clock and sign again"
    )]
    Stale {
        /// Request time minus facilitator time.
        skew_ms: i64,
        /// The window, either way.
        window_ms: i64,
    },
    /// The nonce was used before within the window: a replayed request.
    #[error("this signed request was already received (nonce {0}): sign each request anew")]
    Replayed(String),
    /// A key cannot be read.
    #[error("{0}")]
    Key(String),
    /// The facilitator cannot check the request now (its database does not answer): send it
    /// again, signed anew.
    #[error("the request cannot be checked now: {0}")]
    Unavailable(String),
}

impl AuthError {
    /// The stable machine code put on the wire.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            AuthError::Missing(_) | AuthError::Malformed(..) => "unauthenticated",
            AuthError::UnknownAccount(_) => "unknown_account",
            AuthError::BadSignature(_) => "bad_request_signature",
            AuthError::Stale { .. } => "stale_request",
            AuthError::Replayed(_) => "replayed_request",
            AuthError::Key(_) => "bad_key",
            AuthError::Unavailable(_) => "unavailable",
        }
    }

    /// Whether the same request, signed anew, may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, AuthError::Unavailable(_))
    }
}
