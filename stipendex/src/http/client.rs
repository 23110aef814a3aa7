//! The wallet's side of the HTTP binding: a reqwest client that pays 402s with the wallet.

use reqwest::header::HeaderValue;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{PAYMENT, RECEIPT};
use crate::Error;
use crate::envelope::{Quote, Receipt, Signed};
use crate::wallet::{Paid, Wallet};

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
}

/// A reqwest client that hands a 402's Quote to the wallet and retries once with the Proof.
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
        let body: Value = first.json().await.map_err(|e| transport(&e))?;
        let quote = body.get("quote").ok_or_else(|| {
            Error::Malformed(format!("the 402 of {url} carries no Stipendex quote"))
        })?;
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
            let body: Value = second.json().await.unwrap_or(Value::Null);
            let code = body
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("refused");
            let message = body.get("message").and_then(Value::as_str).unwrap_or("");
            return Err(Error::Payment(rail_core::RailError::Declined(
                rail_core::RailReason::new(
                    code,
                    format!("the receiver refused the proof: {message}"),
                ),
            )));
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
    })
}
