//! The facilitator's side: reading the signing headers and checking them.

use std::time::Duration;

use rail_core::Timestamp;

use super::{AuthError, Canonical, RequestParts, Signature};
use crate::auth::AccountPublicKey;

/// The signing headers of one request, read but not yet checked.
#[derive(Clone, Debug)]
pub struct SignedRequest {
    /// The account that claims to sign.
    pub account: String,
    /// The claimed time.
    pub timestamp_ms: i64,
    /// The nonce.
    pub nonce: String,
    /// The signature.
    pub signature: Signature,
}

impl SignedRequest {
    /// Reads the four headers through `header` (a lookup by lowercase name).
    ///
    /// # Errors
    /// [`AuthError::Missing`] or [`AuthError::Malformed`].
    pub fn read<'a>(header: impl Fn(&str) -> Option<&'a str>) -> Result<Self, AuthError> {
        let get = |name: &'static str| header(name).ok_or(AuthError::Missing(name));
        let account = get(super::ACCOUNT)?;
        if account.len() != 32
            || !account
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return Err(AuthError::Malformed(
                super::ACCOUNT,
                "an account id is 32 lowercase hex digits".into(),
            ));
        }
        let timestamp_ms = get(super::TIMESTAMP)?.parse::<i64>().map_err(|_| {
            AuthError::Malformed(super::TIMESTAMP, "milliseconds since the epoch".into())
        })?;
        let nonce = get(super::NONCE)?;
        if nonce.is_empty()
            || nonce.len() > 64
            || !nonce
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(AuthError::Malformed(
                super::NONCE,
                "1-64 base64url characters".into(),
            ));
        }
        Ok(SignedRequest {
            account: account.to_owned(),
            timestamp_ms,
            nonce: nonce.to_owned(),
            signature: Signature::parse(get(super::SIGNATURE)?)?,
        })
    }
}

/// Checks a signed request: its time within `window` of `now`, then its signature under
/// `key` over the request's `parts`. The nonce's single use is the caller's to record (it
/// needs a store shared by every instance).
///
/// # Errors
/// [`AuthError::Stale`] or [`AuthError::BadSignature`].
pub fn check(
    signed: &SignedRequest,
    key: &AccountPublicKey,
    parts: &RequestParts<'_>,
    now: Timestamp,
    window: Duration,
) -> Result<(), AuthError> {
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let skew_ms = signed.timestamp_ms.saturating_sub(now.0);
    if skew_ms.saturating_abs() > window_ms {
        return Err(AuthError::Stale { skew_ms, window_ms });
    }
    let text = Canonical {
        network: parts.network,
        method: parts.method,
        path_and_query: parts.path_and_query,
        account: &signed.account,
        timestamp_ms: signed.timestamp_ms,
        nonce: &signed.nonce,
        idempotency_key: parts.idempotency_key,
        body: parts.body,
    }
    .to_bytes();
    key.0
        .verify_strict(&text, &signed.signature.0)
        .map_err(|_| AuthError::BadSignature(signed.account.clone()))
}
