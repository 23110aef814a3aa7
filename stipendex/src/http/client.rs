//! The wallet's side of the HTTP binding: a reqwest client that pays 402s with the wallet.

use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{PAYMENT, RECEIPT};
use crate::Error;
use crate::envelope::{Quote, Receipt, Signed};
use crate::wallet::{ChallengePaid, Paid, Required, Source, Wallet};
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
/// scheme payers (retried once with `PAYMENT-SIGNATURE`, or `X-PAYMENT` for v1).
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    wallet: Wallet,
}

impl Client {
    /// A client paying with `wallet`.
    #[must_use]
    pub fn new(http: reqwest::Client, wallet: Wallet) -> Self {
        Client { http, wallet }
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
        let first = self
            .http
            .request(method.clone(), url)
            .send()
            .await
            .map_err(|e| transport(&e))?;
        if first.status() != StatusCode::PAYMENT_REQUIRED {
            return read(first, None, None).await;
        }
        let header = first
            .headers()
            .get(wire::PAYMENT_REQUIRED)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = first.bytes().await.map_err(|e| transport(&e))?;
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let Some(quote) = body.get("quote") else {
            // No Quote: an x402 challenge, paid under the same mandate.
            let required = Required::from_http(header.as_deref(), &bytes)?;
            return Box::pin(self.pay_x402(method, url, &required)).await;
        };
        let quote: Signed<Quote> = serde_json::from_value(quote.clone())
            .map_err(|e| Error::Malformed(format!("the 402's quote: {e}")))?;
        let paid = Box::pin(self.wallet.pay(&quote)).await?;
        let header = HeaderValue::from_str(&paid.proof.to_header())
            .map_err(|e| Error::Malformed(format!("the proof header: {e}")))?;
        let second = self
            .http
            .request(method, url)
            .header(PAYMENT, header)
            .send()
            .await
            .map_err(|e| transport(&e))?;
        if second.status() == StatusCode::PAYMENT_REQUIRED {
            return Err(refusal(second, "the receiver refused the proof").await);
        }
        let receipt = match second.headers().get(RECEIPT).map(|v| v.to_str()) {
            Some(Ok(v)) => {
                let jws = String::from_utf8(
                    base64::Engine::decode(
                        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                        v.trim(),
                    )
                    .map_err(|_| Error::Malformed("Stipendex-Receipt is not base64url".into()))?,
                )
                .map_err(|_| Error::Malformed("Stipendex-Receipt is not a JWS".into()))?;
                Some(self.wallet.receipt(&paid, &jws).await?)
            }
            Some(Err(_)) => return Err(Error::Malformed("Stipendex-Receipt is not ASCII".into())),
            None => None,
        };
        read(second, Some(paid), receipt).await
    }

    async fn pay_x402(
        &self,
        method: Method,
        url: &str,
        required: &Required,
    ) -> Result<Response, Error> {
        let paid = self
            .wallet
            .pay_challenge(&Source::http(url)?, required)
            .await?;
        let value = HeaderValue::from_str(&paid.value)
            .map_err(|e| Error::Malformed(format!("the payment header: {e}")))?;
        let second = self
            .http
            .request(method, url)
            .header(paid.header, value)
            .send()
            .await
            .map_err(|e| transport(&e))?;
        if second.status() == StatusCode::PAYMENT_REQUIRED {
            return Err(refusal(second, "the server refused the x402 payment").await);
        }
        let settlement = [wire::PAYMENT_RESPONSE, wire::X_PAYMENT_RESPONSE]
            .iter()
            .find_map(|h| second.headers().get(*h))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| wire::decode_base64_json::<Value>(v).ok());
        let mut r = read(second, None, None).await?;
        r.x402 = Some(paid);
        r.settlement = settlement;
        Ok(r)
    }
}

/// A paid retry answered 402 again: the refusal's code (`error`) and message, as a decline.
async fn refusal(r: reqwest::Response, what: &str) -> Error {
    let body: Value = r.json().await.unwrap_or(Value::Null);
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

fn transport(e: &reqwest::Error) -> Error {
    Error::Payment(rail_core::RailError::Unavailable(
        rail_core::RailReason::new("http", e.to_string()),
    ))
}

async fn read(
    r: reqwest::Response,
    paid: Option<Paid>,
    receipt: Option<Signed<Receipt>>,
) -> Result<Response, Error> {
    let status = r.status();
    let headers = r.headers().clone();
    let body = r.bytes().await.map_err(|e| transport(&e))?;
    Ok(Response {
        status,
        headers,
        body,
        paid,
        receipt,
        x402: None,
        settlement: None,
    })
}
