//! [`Remote`]: a facilitator reached over HTTP — this workspace's (EVM or Algorand), or one
//! built with an x402 SDK.
//!
//! Only a 200 — or a 400 of the same shape, the reference facilitator's answer to an invalid
//! request — with a body of the documented shape is an answer; anything else (a timeout, an
//! HTML 502, a 503 even with a `success: true` body, a truncated or oversized body, a
//! settlement that claims success without a transaction) is [`RemoteError::NotAnAnswer`] or
//! [`RemoteError::Unanswered`]: for a settlement, an unknown outcome — present the same payment
//! again; it settles once. A 401 or 403 is [`RemoteError::Refused`]: the caller's credentials.

use reqwest::StatusCode;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{FacilitatorRequest, SettleResponse, Supported, VerifyResponse};

/// The most of a facilitator's answer read.
pub const MAX_ANSWER: usize = 64 * 1024;

/// No answer from a facilitator.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RemoteError {
    /// Not reached, or no answer in time: reqwest's error without its URL, and its innermost
    /// cause (`settle: error sending request (Connection refused (os error 111))`).
    #[error("{0}")]
    Unanswered(String),
    /// A 401 or 403: the facilitator refused the request's credentials (or wants some).
    #[error("the facilitator refused the request's credentials ({0})")]
    Refused(StatusCode),
    /// An answer that is not one: another status, a body not of the documented shape, too
    /// long, or a success without a transaction.
    #[error("{0}")]
    NotAnAnswer(String),
}

/// A facilitator at a base URL (its routes are `{base}/supported`, `/verify`, `/settle`).
#[derive(Clone, Debug)]
pub struct Remote {
    http: reqwest::Client,
    base: String,
}

impl Remote {
    /// The facilitator at `base` (`http://127.0.0.1:4021`), called with `http` (its timeouts,
    /// its TLS).
    #[must_use]
    pub fn new(http: reqwest::Client, base: &str) -> Self {
        Remote {
            http,
            base: base.trim_end_matches('/').to_owned(),
        }
    }

    /// The base URL, as configured (it may hold credentials: show it redacted).
    #[must_use]
    pub fn base(&self) -> &str {
        &self.base
    }

    /// The full URL of `path` (`settle`): what an `Authorization` is made for.
    #[must_use]
    pub fn url_of(&self, path: &str) -> String {
        format!("{}/{path}", self.base)
    }

    /// `GET /supported`, with `authorization` if given.
    ///
    /// # Errors
    /// [`RemoteError`].
    pub async fn supported(
        &self,
        authorization: Option<HeaderValue>,
    ) -> Result<Supported, RemoteError> {
        let req = self.http.get(self.url_of("supported"));
        send(with(req, authorization), "supported").await
    }

    /// `POST /verify` of `payload` against `requirements`.
    ///
    /// # Errors
    /// [`RemoteError`].
    pub async fn verify<P: Serialize, R: Serialize>(
        &self,
        payload: &P,
        requirements: &R,
        authorization: Option<HeaderValue>,
    ) -> Result<VerifyResponse, RemoteError> {
        self.post("verify", payload, requirements, authorization)
            .await
    }

    /// `POST /settle` of `payload` against `requirements`; a success without a transaction is
    /// not an answer.
    ///
    /// # Errors
    /// [`RemoteError`].
    pub async fn settle<P: Serialize, R: Serialize>(
        &self,
        payload: &P,
        requirements: &R,
        authorization: Option<HeaderValue>,
    ) -> Result<SettleResponse, RemoteError> {
        let answer: SettleResponse = self
            .post("settle", payload, requirements, authorization)
            .await?;
        if answer.success && answer.transaction.is_empty() {
            return Err(RemoteError::NotAnAnswer(
                "settle: success without a transaction".into(),
            ));
        }
        Ok(answer)
    }

    async fn post<P: Serialize, R: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        payload: &P,
        requirements: &R,
        authorization: Option<HeaderValue>,
    ) -> Result<T, RemoteError> {
        let body = FacilitatorRequest {
            x402_version: 2u8,
            payment_payload: payload,
            payment_requirements: requirements,
        };
        let req = self.http.post(self.url_of(path)).json(&body);
        send(with(req, authorization), path).await
    }
}

fn with(
    req: reqwest::RequestBuilder,
    authorization: Option<HeaderValue>,
) -> reqwest::RequestBuilder {
    match authorization {
        Some(mut v) => {
            v.set_sensitive(true);
            req.header(AUTHORIZATION, v)
        }
        None => req,
    }
}

async fn send<T: DeserializeOwned>(
    req: reqwest::RequestBuilder,
    what: &str,
) -> Result<T, RemoteError> {
    let mut resp = req.send().await.map_err(|e| unanswered(what, e))?;
    let status = resp.status();
    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
        return Err(RemoteError::Refused(status));
    }
    let too_long = || {
        RemoteError::NotAnAnswer(format!(
            "{what}: http {status}, the answer is longer than {MAX_ANSWER} bytes"
        ))
    };
    if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
        return Err(too_long());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| unanswered(what, e))? {
        if body.len() + chunk.len() > MAX_ANSWER {
            return Err(too_long());
        }
        body.extend_from_slice(&chunk);
    }
    // The reference facilitator answers a refused verify/settle with 200 (or 400 with the
    // same body, for an invalid request); anything else is not an answer.
    if !(status.is_success() || status == StatusCode::BAD_REQUEST) {
        return Err(RemoteError::NotAnAnswer(format!("{what}: http {status}")));
    }
    serde_json::from_slice(&body).map_err(|e| {
        RemoteError::NotAnAnswer(format!("{what}: http {status}, body not understood: {e}"))
    })
}

/// No answer to the call `what`: reqwest's error without its URL, and its innermost cause.
fn unanswered(what: &str, e: reqwest::Error) -> RemoteError {
    let e = e.without_url();
    let mut cause = None;
    let mut next = std::error::Error::source(&e);
    while let Some(c) = next {
        cause = Some(c.to_string());
        next = c.source();
    }
    RemoteError::Unanswered(match cause {
        Some(c) => format!("{what}: {e} ({c})"),
        None => format!("{what}: {e}"),
    })
}
