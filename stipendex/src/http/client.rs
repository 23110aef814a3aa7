//! The wallet's side of the HTTP binding: a reqwest client that pays 402s with the wallet.

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{PAYMENT, RECEIPT};
use crate::Error;
use crate::envelope::{Quote, Receipt, Resource, Signed};
use crate::wallet::{ChallengePaid, Paid, Source, Wallet};
use x402_transport::client::{self as x402, ClientError};
use x402_transport::wire;

/// A paid (or free) response: status, headers, body, and the checked Receipt if it was paid.
#[derive(Debug)]
pub struct Response {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body.
    pub body: bytes::Bytes,
    /// The payment, if the request was paid.
    pub paid: Option<Paid>,
    /// The receiver's Receipt (checked: signed by the Quote's receiver, binding the Proof).
    pub receipt: Option<Signed<Receipt>>,
    /// The unsigned x402 challenge paid instead, if the 402 carried no Quote.
    pub x402: Option<ChallengePaid>,
    /// The server's `PAYMENT-RESPONSE` (or v1 `X-PAYMENT-RESPONSE`), decoded, after an x402
    /// payment.
    pub settlement: Option<Value>,
}

/// A reqwest client that hands a 402's Quote to the wallet and retries once with the Proof; a
/// 402 without a Quote is an x402 challenge, paid under the same mandate with the wallet's
/// scheme payers and delivered by the x402 client (`PAYMENT-SIGNATURE`, or `X-PAYMENT` for v1;
/// the same payment sent again while its outcome is unknown: no answer, 502, 503 or 504).
///
/// The origin binding: every URL is parsed once (the `url` crate, which reqwest connects
/// with); an unpaid request's redirects are followed hop by hop, and a 402 is paid only for the
/// request that got it — a Quote must name exactly that origin, method, path and query
/// ([`Wallet::pay_for`]), a challenge is allowlisted by that origin. A payment header never
/// follows a redirect: a 3xx answer to a paid request is returned as it is.
#[derive(Clone, Debug)]
pub struct Client {
    wallet: Wallet,
    /// Follows unpaid redirects and delivers the wallet's x402 payments (it has no payer: the
    /// wallet decides and signs); its HTTP client follows no redirect.
    x402: x402::Client,
}

impl Client {
    /// A client paying with `wallet`, on the HTTP client `http` builds (with redirects turned
    /// off, whatever `http` says; [`super::reqwest_builder`] gives the workspace's defaults).
    ///
    /// # Errors
    /// [`Error::Config`] if the HTTP client cannot be built.
    pub fn new(http: reqwest::ClientBuilder, wallet: Wallet) -> Result<Self, Error> {
        let x402 = x402::Client::new(http).map_err(|e| Error::Config(e.to_string()))?;
        Ok(Client { wallet, x402 })
    }

    /// The wallet.
    #[must_use]
    pub fn wallet(&self) -> &Wallet {
        &self.wallet
    }

    /// `GET url`, paying a 402 under the wallet's mandate.
    ///
    /// # Errors
    /// The wallet's refusals ([`Error::Denied`], [`Error::LimitExceeded`], …), a 402 without a
    /// Quote ([`Error::Malformed`]), [`Error::Payment`] for transport failures, and a Receipt
    /// that does not check ([`Error::Broken`]).
    pub async fn get(&self, url: &str) -> Result<Response, Error> {
        Box::pin(self.send(Method::GET, url)).await
    }

    /// `POST url` (no body), paying a 402 under the wallet's mandate.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn post(&self, url: &str) -> Result<Response, Error> {
        Box::pin(self.send(Method::POST, url)).await
    }

    /// `method url`, paying a 402 once.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn send(&self, method: Method, url: &str) -> Result<Response, Error> {
        Box::pin(self.execute(method, url, HeaderMap::new(), None)).await
    }

    /// `method url` with `headers` and `body`, paying a 402 once.
    ///
    /// # Errors
    /// As [`Client::get`]; [`Error::Malformed`] if `url` is not an absolute http(s) URL.
    pub async fn execute(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Option<Vec<u8>>,
    ) -> Result<Response, Error> {
        let url = crate::origin::parsed(url)?;
        let reached = self
            .x402
            .reach(method, url, &headers, body)
            .await
            .map_err(|e| unavailable(&e))?;
        let x402::Reached {
            response: first,
            url,
            method,
            body,
        } = reached;
        if first.status() != StatusCode::PAYMENT_REQUIRED {
            return read(first).await;
        }
        let header = first
            .headers()
            .get(wire::PAYMENT_REQUIRED)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = x402::read_402_body(first).await.map_err(|e| match e {
            ClientError::Header(why) => Error::Malformed(why),
            e => unavailable(&e),
        })?;
        let parsed: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let Some(quote) = parsed.get("quote") else {
            // No Quote: an x402 challenge, paid under the same mandate.
            let required = x402::read_402(header.as_deref(), &bytes)
                .map_err(|e| Error::Malformed(e.to_string()))?
                .ok_or_else(|| {
                    Error::Malformed(
                        "the 402 carries neither a Quote nor an x402 payment requirement".into(),
                    )
                })?;
            return Box::pin(self.pay_x402(method, &url, &headers, body, &required)).await;
        };
        let quote: Signed<Quote> = serde_json::from_value(quote.clone())
            .map_err(|e| Error::Malformed(format!("the 402's quote: {e}")))?;
        let sent = Resource {
            origin: url.origin().ascii_serialization(),
            method: method.as_str().to_owned(),
            path: url.path().to_owned(),
            query: url.query().map(str::to_owned),
        };
        let paid = Box::pin(self.wallet.pay_sent(&quote, &sent, self.wallet.confirmer())).await?;
        let proof = HeaderValue::from_str(&paid.proof.to_header())
            .map_err(|e| Error::Malformed(format!("the proof header: {e}")))?;
        let mut retry = self
            .x402
            .http()
            .request(method, url)
            .headers(headers)
            .header(PAYMENT, proof);
        if let Some(b) = body {
            retry = retry.body(b);
        }
        let second = retry.send().await.map_err(|e| transport(&e))?;
        if second.status() == StatusCode::PAYMENT_REQUIRED {
            let body = x402::read_402_body(second).await.unwrap_or_default();
            return Err(refusal(&body, "the receiver refused the proof"));
        }
        let (status, headers) = (second.status(), second.headers().clone());
        let body = read_capped(second).await?;
        let receipt = match headers.get(RECEIPT).map(|v| v.to_str()) {
            Some(Ok(v)) => {
                let jws = String::from_utf8(
                    base64::Engine::decode(
                        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                        v.trim(),
                    )
                    .map_err(|_| Error::Malformed("Stipendex-Receipt is not base64url".into()))?,
                )
                .map_err(|_| Error::Malformed("Stipendex-Receipt is not a JWS".into()))?;
                // The Receipt must bind the bytes delivered, before it is journaled as theirs.
                Some(self.wallet.receipt_for(&paid, &jws, &body).await?)
            }
            Some(Err(_)) => return Err(Error::Malformed("Stipendex-Receipt is not ASCII".into())),
            None => None,
        };
        Ok(Response {
            status,
            headers,
            body: body.into(),
            paid: Some(paid),
            receipt,
            x402: None,
            settlement: None,
        })
    }

    async fn pay_x402(
        &self,
        method: Method,
        url: &reqwest::Url,
        headers: &HeaderMap,
        body: Option<Vec<u8>>,
        required: &x402::Required,
    ) -> Result<Response, Error> {
        let paid = self
            .wallet
            .pay_challenge(&Source::http(url.as_str())?, required)
            .await?;
        let answer = self
            .x402
            .resend_with(method, url.as_str(), headers, body, paid.sent())
            .await
            .map_err(|e| match e {
                ClientError::OutcomeUnknown { detail, .. } => {
                    Error::Payment(rail_core::RailError::Unavailable(rail_core::RailReason::new(
                        "outcome_unknown",
                        format!(
                            "the x402 payment was sent and its outcome is unknown ({detail}); present the same payment again"
                        ),
                    )))
                }
                e => Error::Payment(rail_core::RailError::Unavailable(
                    rail_core::RailReason::new("http", e.to_string()),
                )),
            })?;
        if answer.status == StatusCode::PAYMENT_REQUIRED {
            return Err(refusal(&answer.body, "the server refused the x402 payment"));
        }
        Ok(Response {
            status: answer.status,
            headers: answer.headers,
            body: answer.body.into(),
            paid: None,
            receipt: None,
            x402: Some(paid),
            settlement: answer.response,
        })
    }
}

/// A paid retry answered 402 again: the refusal's code (`error`) and message, as a decline.
fn refusal(body: &[u8], what: &str) -> Error {
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let code = body
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("refused");
    let message = body.get("message").and_then(Value::as_str).unwrap_or("");
    Error::Payment(rail_core::RailError::Declined(rail_core::RailReason::new(
        code,
        if message.is_empty() {
            what.to_owned()
        } else {
            format!("{what}: {message}")
        },
    )))
}

fn unavailable(e: &ClientError) -> Error {
    Error::Payment(rail_core::RailError::Unavailable(
        rail_core::RailReason::new("http", e.to_string()),
    ))
}

fn transport(e: &reqwest::Error) -> Error {
    Error::Payment(rail_core::RailError::Unavailable(
        rail_core::RailReason::new("http", e.to_string()),
    ))
}

/// A response body, at most [`x402::MAX_BODY`] bytes.
async fn read_capped(r: reqwest::Response) -> Result<Vec<u8>, Error> {
    x402::read_body(r, x402::MAX_BODY)
        .await
        .map_err(|e| match e {
            ClientError::TooLarge(why) => Error::Malformed(why),
            e => unavailable(&e),
        })
}

/// An unpaid answer.
async fn read(r: reqwest::Response) -> Result<Response, Error> {
    let status = r.status();
    let headers = r.headers().clone();
    let body = read_capped(r).await?;
    Ok(Response {
        status,
        headers,
        body: body.into(),
        paid: None,
        receipt: None,
        x402: None,
        settlement: None,
    })
}
