//! The paying HTTP client: a small wrapper around `reqwest` that answers a 402 by paying
//! within the payer's [`Policy`](crate::payer::Policy) and retrying once.
//!
//! - The 402 is read from `PAYMENT-REQUIRED` (v2). A 402 without it is returned as is: the
//!   client never downgrades to v1 or guesses.
//! - One payment per request: if the paid retry gets no answer (timeout, connection reset) or
//!   a 502/503/504 (outcome unknown), the **same** signed payment is sent again, up to
//!   [`X402Client::with_retries`] times, honouring `Retry-After`. A second signature is never
//!   made for one request; if the outcome is still unknown, [`ClientError::OutcomeUnknown`]
//!   hands the payment back for [`X402Client::resend`].
//! - The result says what was paid ([`Paid::payment`]) and what the server answered
//!   ([`Paid::settlement`], from `PAYMENT-RESPONSE`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use rail_x402::client::X402Client;
//! use rail_x402::evm::LocalSigner;
//! use rail_x402::payer::{Policy, X402Payer};
//!
//! let signer = LocalSigner::from_hex(&std::env::var("X402_PAYER_KEY")?)?;
//! let usdc = "0x036CbD53842c5426634e7929541eC2318f3dCF7e".parse()?;
//! let payer = X402Payer::new(signer, Policy::new("eip155:84532", usdc, alloy_primitives::U256::from(10_000u64)));
//! let client = X402Client::new(payer)?;
//! let paid = client.get("http://127.0.0.1:8402/weather").await?;
//! println!("{} {:?}", paid.status, paid.settlement.map(|s| s.transaction));
//! # Ok(()) }
//! ```

use std::time::Duration;

use reqwest::{Method, StatusCode};

use crate::payer::{PayerError, X402Payer};
use crate::wire::{HeaderError, PaymentPayload, PaymentRequired, SettleResponse};

/// Why a paid request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No answer (and, after a payment was made, none after every retry of it).
    #[error("http: {0}")]
    Http(String),
    /// The 402's `PAYMENT-REQUIRED` header did not decode.
    #[error("402 header: {0}")]
    Header(#[from] HeaderError),
    /// The policy allows none of the options, or signing failed.
    #[error(transparent)]
    Payer(#[from] PayerError),
    /// A payment was sent and no answer said what became of it, after every resend. It may
    /// have been settled: present **this** payment again ([`X402Client::resend`]), do not pay
    /// anew.
    #[error("payment outcome unknown ({detail}); resend the same payment")]
    OutcomeUnknown {
        /// The signed payment.
        payment: Box<PaymentPayload>,
        /// The last error.
        detail: String,
    },
    /// As [`ClientError::OutcomeUnknown`], for a v1 payment: `header` is the `X-PAYMENT`
    /// value to present again.
    #[error("v1 payment outcome unknown ({detail}); resend the same X-PAYMENT")]
    OutcomeUnknownV1 {
        /// The `X-PAYMENT` header value.
        header: String,
        /// The last error.
        detail: String,
    },
}

/// Statuses after which a payment's outcome is unknown (retry the same payment).
fn unknown_status(s: StatusCode) -> bool {
    matches!(
        s,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The answer to a (possibly paid) request.
#[derive(Debug)]
pub struct Paid {
    /// Final status.
    pub status: StatusCode,
    /// Final headers.
    pub headers: reqwest::header::HeaderMap,
    /// Final body.
    pub body: bytes_body::Body,
    /// The payment sent, if one was.
    pub payment: Option<PaymentPayload>,
    /// The decoded `PAYMENT-RESPONSE`, if the server sent one.
    pub settlement: Option<SettleResponse>,
    /// The 402 that asked for the payment.
    pub payment_required: Option<PaymentRequired>,
}

/// The body type (bytes).
pub mod bytes_body {
    /// A response body.
    pub type Body = Vec<u8>;
}

/// A reqwest client that pays 402s.
#[derive(Clone, Debug)]
pub struct X402Client {
    http: reqwest::Client,
    payer: X402Payer,
    retries: u32,
}

impl X402Client {
    /// A client paying with `payer`, 30 s per request, 3 resends of a payment.
    ///
    /// # Errors
    /// [`ClientError::Http`] if the HTTP client cannot be built.
    pub fn new(payer: X402Payer) -> Result<Self, ClientError> {
        Ok(Self {
            http: crate::rpc::http_client(Duration::from_secs(30))
                .map_err(|e| ClientError::Http(e.to_string()))?,
            payer,
            retries: 3,
        })
    }

    /// With another reqwest client (timeouts, proxies).
    #[must_use]
    pub fn with_http(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// How many times the same payment is resent when its outcome is unknown.
    #[must_use]
    pub const fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The payer.
    #[must_use]
    pub const fn payer(&self) -> &X402Payer {
        &self.payer
    }

    /// `GET url`, paying if asked.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn get(&self, url: &str) -> Result<Paid, ClientError> {
        self.send(Method::GET, url, None).await
    }

    /// A request with an optional body, paying if asked.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Paid, ClientError> {
        let build = |payment: Option<&str>| {
            let mut r = self.http.request(method.clone(), url);
            if let Some(b) = &body {
                r = r.body(b.clone());
            }
            if let Some(p) = payment {
                r = r.header(crate::wire::PAYMENT_SIGNATURE_HEADER, p);
            }
            r
        };
        let first = build(None)
            .send()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?;
        if first.status() != StatusCode::PAYMENT_REQUIRED {
            return finish(first, None, None).await;
        }
        let Some(header) = first
            .headers()
            .get(crate::wire::PAYMENT_REQUIRED_HEADER)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned)
        else {
            // No v2 header: a v1 402 carries its requirements in a JSON body with
            // `x402Version: 1` (never consulted when the v2 header is present).
            let headers = first.headers().clone();
            let status = first.status();
            let body = first
                .bytes()
                .await
                .map_err(|e| ClientError::Http(e.to_string()))?
                .to_vec();
            return match serde_json::from_slice::<crate::v1::PaymentRequiredV1>(&body) {
                Ok(v1) => self.send_v1(&build, &v1).await,
                Err(_) => Ok(Paid {
                    status,
                    headers,
                    body,
                    payment: None,
                    settlement: None,
                    payment_required: None,
                }),
            };
        };
        let required = PaymentRequired::from_header_mixed(&header)?;
        let payment = self.payer.pay(&required)?;
        let encoded = payment.to_header()?;
        tracing::info!(payer = %self.payer.address(), amount = %payment.accepted.amount, network = %payment.accepted.network, "x402: paying");
        self.deliver(&build, payment, &encoded, Some(required))
            .await
    }

    /// Sends a signed payment again (after [`ClientError::OutcomeUnknown`]): the same
    /// authorization, never a new one — if it was settled, the server serves it (once).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn resend(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        payment: PaymentPayload,
    ) -> Result<Paid, ClientError> {
        let build = |p: Option<&str>| {
            let mut r = self.http.request(method.clone(), url);
            if let Some(b) = &body {
                r = r.body(b.clone());
            }
            if let Some(p) = p {
                r = r.header(crate::wire::PAYMENT_SIGNATURE_HEADER, p);
            }
            r
        };
        let encoded = payment.to_header()?;
        self.deliver(&build, payment, &encoded, None).await
    }

    /// Presents `payment`, resending the same bytes while the outcome is unknown: no answer,
    /// or a 502 / 503 / 504 (a proxy's or the server's "try again").
    async fn deliver(
        &self,
        build: &(dyn Fn(Option<&str>) -> reqwest::RequestBuilder + Sync),
        payment: PaymentPayload,
        encoded: &str,
        required: Option<PaymentRequired>,
    ) -> Result<Paid, ClientError> {
        let mut attempt = 0;
        loop {
            match build(Some(encoded)).send().await {
                Ok(resp) if unknown_status(resp.status()) && attempt < self.retries => {
                    let wait = resp
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(1)
                        .min(10);
                    tracing::warn!(
                        attempt,
                        wait,
                        status = resp.status().as_u16(),
                        "x402: outcome unknown; resending the same payment"
                    );
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                }
                Ok(resp) if unknown_status(resp.status()) => {
                    return Err(ClientError::OutcomeUnknown {
                        payment: Box::new(payment),
                        detail: format!("http {}", resp.status()),
                    });
                }
                Ok(resp) => return finish(resp, Some(payment), required).await,
                Err(e) if attempt < self.retries => {
                    tracing::warn!(attempt, error = %e, "x402: no answer; resending the same payment");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
                Err(e) => {
                    return Err(ClientError::OutcomeUnknown {
                        payment: Box::new(payment),
                        detail: e.to_string(),
                    });
                }
            }
            attempt += 1;
        }
    }
}

impl X402Client {
    async fn send_v1(
        &self,
        build: &(dyn Fn(Option<&str>) -> reqwest::RequestBuilder + Sync),
        required: &crate::v1::PaymentRequiredV1,
    ) -> Result<Paid, ClientError> {
        let payment = self.payer.pay_v1(required)?;
        let encoded = payment.to_header()?;
        tracing::info!(payer = %self.payer.address(), network = %payment.network, "x402: paying (v1)");
        // As for v2: the same bytes are resent while the outcome is unknown.
        let mut attempt = 0;
        let resp = loop {
            let sent = build(None)
                .header(crate::v1::X_PAYMENT_HEADER, &encoded)
                .send()
                .await;
            match sent {
                Ok(r) if unknown_status(r.status()) && attempt < self.retries => {
                    tracing::warn!(
                        attempt,
                        status = r.status().as_u16(),
                        "x402: outcome unknown; resending the same v1 payment"
                    );
                    tokio::time::sleep(Duration::from_millis(500 << attempt)).await;
                }
                Ok(r) if unknown_status(r.status()) => {
                    return Err(ClientError::OutcomeUnknownV1 {
                        header: encoded,
                        detail: format!("http {}", r.status()),
                    });
                }
                Ok(r) => break r,
                Err(e) if attempt < self.retries => {
                    tracing::warn!(attempt, error = %e, "x402: no answer; resending the same v1 payment");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
                Err(e) => {
                    return Err(ClientError::OutcomeUnknownV1 {
                        header: encoded,
                        detail: e.to_string(),
                    });
                }
            }
            attempt += 1;
        };
        let status = resp.status();
        let headers = resp.headers().clone();
        let settlement = headers
            .get(crate::v1::X_PAYMENT_RESPONSE_HEADER)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| crate::v1::SettleResponseV1::from_header(h).ok())
            .map(|s| SettleResponse {
                success: s.success,
                error_reason: s.error_reason,
                error_message: None,
                transaction: s.transaction,
                network: s.network,
                payer: s.payer,
            });
        let body = resp
            .bytes()
            .await
            .map_err(|e| ClientError::Http(e.to_string()))?
            .to_vec();
        Ok(Paid {
            status,
            headers,
            body,
            payment: None,
            settlement,
            payment_required: None,
        })
    }
}

async fn finish(
    resp: reqwest::Response,
    payment: Option<PaymentPayload>,
    payment_required: Option<PaymentRequired>,
) -> Result<Paid, ClientError> {
    let status = resp.status();
    let headers = resp.headers().clone();
    let settlement = headers
        .get(crate::wire::PAYMENT_RESPONSE_HEADER)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| SettleResponse::from_header(h).ok());
    let body = resp
        .bytes()
        .await
        .map_err(|e| ClientError::Http(e.to_string()))?
        .to_vec();
    Ok(Paid {
        status,
        headers,
        body,
        payment,
        settlement,
        payment_required,
    })
}
