//! The paying HTTP client for every scheme: a small wrapper around `reqwest` that answers a 402
//! by paying within its payers' policies and retrying once.
//!
//! - The 402 is read from `PAYMENT-REQUIRED` (v2). Without it, the JSON body is read: a v2
//!   body (the exact-algo seed's clients read the body) or a v1 one (`x402Version: 1`, paid
//!   only by a payer that speaks v1, with `X-PAYMENT`). Anything else is returned as it came.
//! - A client holds several [`SchemePayer`]s in its order of preference; the first payer that
//!   accepts some entry pays the cheapest entry it accepts. Nothing is paid blindly: each payer
//!   checks an entry against its own policy (scheme, network, asset, limit).
//! - One payment per request: if the paid retry gets no answer (timeout, connection reset) or
//!   a 502/503/504 (outcome unknown), the **same** payment is sent again, up to
//!   [`Client::with_retries`] times, honouring `Retry-After`. A second payment is never made
//!   for one request; if the outcome is still unknown, [`ClientError::OutcomeUnknown`] hands
//!   the payment back for [`Client::resend`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::wire::{self, PaymentRequired, PaymentRequiredV1};

/// What a scheme's payer brings to the shared client.
#[async_trait]
pub trait SchemePayer: Send + Sync + fmt::Debug {
    /// A label for logs (`exact-evm`, `exact-algo`).
    fn label(&self) -> &str;

    /// Why this payer will not pay `entry` (an `accepts[]` entry), or `None` if it will: the
    /// scheme, network and asset are its own and the amount is within its policy.
    fn refusal(&self, entry: &Value) -> Option<String>;

    /// The amount `entry` asks, in atomic units (the cheapest acceptable entry is paid).
    fn amount(&self, entry: &Value) -> Option<u128>;

    /// The asset `entry` is paid in (code and decimals), so a wallet can hold the amount
    /// against its limits: `None` if this payer does not know it (the entry is then not paid
    /// by a wallet that enforces limits).
    fn asset(&self, _entry: &Value) -> Option<rail_core::Asset> {
        None
    }

    /// Signs a payment for `entry` of `required`: the envelope whose base64 is the
    /// `PAYMENT-SIGNATURE` value.
    ///
    /// # Errors
    /// Why it could not (policy, balance, signing), as a sentence.
    async fn pay(&self, required: &PaymentRequired, entry: &Value) -> Result<Value, String>;

    /// Signs a v1 payment for the v1 402 `required` (`X-PAYMENT`): `None` when the payer does
    /// not speak v1.
    async fn pay_v1(&self, _required: &PaymentRequiredV1) -> Option<Result<Value, String>> {
        None
    }
}

/// A payment the client sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Sent {
    /// The payer's label.
    pub label: String,
    /// The envelope.
    pub envelope: Value,
    /// Whether it is a v1 payment (`X-PAYMENT`).
    pub v1: bool,
}

impl Sent {
    fn header_value(&self) -> Result<String, ClientError> {
        wire::encode_base64_json(&self.envelope).map_err(|e| ClientError::Payer(e.to_string()))
    }

    const fn header_name(&self) -> &'static str {
        if self.v1 {
            wire::X_PAYMENT
        } else {
            wire::PAYMENT_SIGNATURE
        }
    }
}

/// Why a paid request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No answer (and, before any payment was made).
    #[error("http: {0}")]
    Http(String),
    /// The 402's `PAYMENT-REQUIRED` header did not decode.
    #[error("402 header: {0}")]
    Header(String),
    /// No payer accepts any entry of the 402 (one reason per payer and entry).
    #[error("no payable option: {}", .0.join("; "))]
    NothingPayable(Vec<String>),
    /// The chosen payer could not sign.
    #[error("payer: {0}")]
    Payer(String),
    /// A payment was sent and no answer said what became of it, after every resend. It may
    /// have been settled: present **this** payment again ([`Client::resend`]), do not pay anew.
    #[error("payment outcome unknown ({detail}); resend the same payment")]
    OutcomeUnknown {
        /// The payment.
        payment: Box<Sent>,
        /// The last error.
        detail: String,
    },
}

/// The answer to a (possibly paid) request.
#[derive(Debug)]
pub struct Paid {
    /// Final status.
    pub status: StatusCode,
    /// Final headers.
    pub headers: reqwest::header::HeaderMap,
    /// Final body.
    pub body: Vec<u8>,
    /// The payment sent, if one was.
    pub payment: Option<Sent>,
    /// The decoded `PAYMENT-RESPONSE` (or v1 `X-PAYMENT-RESPONSE`), if the server sent one.
    pub response: Option<Value>,
    /// The 402 that asked for the payment (v2).
    pub payment_required: Option<PaymentRequired>,
}

/// A reqwest client that pays 402s with its payers.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    payers: Vec<Arc<dyn SchemePayer>>,
    retries: u32,
}

/// Statuses after which a payment's outcome is unknown (send the same payment again).
fn unknown_status(s: StatusCode) -> bool {
    matches!(
        s,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

impl Client {
    /// A client on `http` with no payer yet; 3 resends of a payment whose outcome is unknown.
    #[must_use]
    pub fn new(http: reqwest::Client) -> Self {
        Client {
            http,
            payers: Vec::new(),
            retries: 3,
        }
    }

    /// Also pays with `payer` (after the payers added before it).
    #[must_use]
    pub fn with_payer(mut self, payer: Arc<dyn SchemePayer>) -> Self {
        self.payers.push(payer);
        self
    }

    /// How many times the same payment is resent while its outcome is unknown.
    #[must_use]
    pub const fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// `GET url`, paying if asked.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn get(&self, url: &str) -> Result<Paid, ClientError> {
        self.send(Method::GET, url, None).await
    }

    fn request(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Vec<u8>>,
    ) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method.clone(), url);
        if let Some(b) = body {
            r = r.body(b.clone());
        }
        r
    }

    /// The payer and entry to pay: the first payer (in order) that accepts an entry, with the
    /// cheapest entry it accepts.
    ///
    /// # Errors
    /// [`ClientError::NothingPayable`] with every refusal.
    pub fn choose(
        &self,
        required: &PaymentRequired,
    ) -> Result<(&Arc<dyn SchemePayer>, Value), ClientError> {
        let entries = required.entries();
        let mut refusals = Vec::new();
        for payer in &self.payers {
            let mut best: Option<(&Value, u128)> = None;
            for entry in &entries {
                match payer.refusal(entry) {
                    Some(why) => refusals.push(format!("{}: {why}", payer.label())),
                    None => {
                        let amount = payer.amount(entry).unwrap_or(u128::MAX);
                        if best.is_none_or(|(_, b)| amount < b) {
                            best = Some((entry, amount));
                        }
                    }
                }
            }
            if let Some((entry, _)) = best {
                return Ok((payer, entry.clone()));
            }
        }
        if self.payers.is_empty() {
            refusals.push("the client has no payer".into());
        }
        Err(ClientError::NothingPayable(refusals))
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
        let first = self
            .request(&method, url, body.as_ref())
            .send()
            .await
            .map_err(|e| ClientError::Http(e.without_url().to_string()))?;
        if first.status() != StatusCode::PAYMENT_REQUIRED {
            return finish(first, None, None).await;
        }
        let header = first
            .headers()
            .get(wire::PAYMENT_REQUIRED)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned);
        let (required, sent) = match header {
            Some(h) => {
                let required = PaymentRequired::from_header(&h)
                    .map_err(|e| ClientError::Header(e.to_string()))?;
                let sent = self.pay(&required).await?;
                (Some(required), sent)
            }
            None => {
                // No v2 header: the JSON body (a v2 body, or a v1 one).
                let (status, headers) = (first.status(), first.headers().clone());
                let raw = first
                    .bytes()
                    .await
                    .map_err(|e| ClientError::Http(e.without_url().to_string()))?
                    .to_vec();
                let version = serde_json::from_slice::<Value>(&raw)
                    .ok()
                    .and_then(|v| v.get("x402Version").and_then(Value::as_u64));
                match version {
                    Some(2) => {
                        let required: PaymentRequired = serde_json::from_slice(&raw)
                            .map_err(|e| ClientError::Header(e.to_string()))?;
                        let sent = self.pay(&required).await?;
                        (Some(required), sent)
                    }
                    Some(1) => {
                        let required: PaymentRequiredV1 = serde_json::from_slice(&raw)
                            .map_err(|e| ClientError::Header(e.to_string()))?;
                        (None, self.pay_v1(&required).await?)
                    }
                    _ => {
                        return Ok(Paid {
                            status,
                            headers,
                            body: raw,
                            payment: None,
                            response: None,
                            payment_required: None,
                        });
                    }
                }
            }
        };
        self.deliver(&method, url, body.as_ref(), sent, required)
            .await
    }

    async fn pay(&self, required: &PaymentRequired) -> Result<Sent, ClientError> {
        let (payer, entry) = self.choose(required)?;
        let envelope = payer
            .pay(required, &entry)
            .await
            .map_err(ClientError::Payer)?;
        tracing::info!(payer = payer.label(), network = ?entry.get("network"), "x402: paying");
        Ok(Sent {
            label: payer.label().to_owned(),
            envelope,
            v1: false,
        })
    }

    async fn pay_v1(&self, required: &PaymentRequiredV1) -> Result<Sent, ClientError> {
        let mut refusals = Vec::new();
        for payer in &self.payers {
            match payer.pay_v1(required).await {
                Some(Ok(envelope)) => {
                    tracing::info!(payer = payer.label(), "x402: paying (v1)");
                    return Ok(Sent {
                        label: payer.label().to_owned(),
                        envelope,
                        v1: true,
                    });
                }
                Some(Err(why)) => refusals.push(format!("{}: {why}", payer.label())),
                None => refusals.push(format!("{}: speaks no x402 v1", payer.label())),
            }
        }
        Err(ClientError::NothingPayable(refusals))
    }

    /// Sends a payment again (after [`ClientError::OutcomeUnknown`]): the same payment, never
    /// a new one — if it was settled, the server serves it (once).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn resend(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        payment: Sent,
    ) -> Result<Paid, ClientError> {
        self.deliver(&method, url, body.as_ref(), payment, None)
            .await
    }

    /// Presents `payment`, resending the same bytes while the outcome is unknown: no answer,
    /// or a 502 / 503 / 504 (a proxy's or the server's "try again").
    async fn deliver(
        &self,
        method: &Method,
        url: &str,
        body: Option<&Vec<u8>>,
        payment: Sent,
        required: Option<PaymentRequired>,
    ) -> Result<Paid, ClientError> {
        let value = payment.header_value()?;
        let mut attempt = 0;
        loop {
            let sent = self
                .request(method, url, body)
                .header(payment.header_name(), &value)
                .send()
                .await;
            match sent {
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
                    tracing::warn!(attempt, error = %e.without_url(), "x402: no answer; resending the same payment");
                    tokio::time::sleep(Duration::from_millis(200 << attempt.min(5))).await;
                }
                Err(e) => {
                    return Err(ClientError::OutcomeUnknown {
                        payment: Box::new(payment),
                        detail: e.without_url().to_string(),
                    });
                }
            }
            attempt += 1;
        }
    }
}

async fn finish(
    resp: reqwest::Response,
    payment: Option<Sent>,
    payment_required: Option<PaymentRequired>,
) -> Result<Paid, ClientError> {
    let status = resp.status();
    let headers = resp.headers().clone();
    let name = match &payment {
        Some(p) if p.v1 => wire::X_PAYMENT_RESPONSE,
        _ => wire::PAYMENT_RESPONSE,
    };
    let response = headers
        .get(name)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| wire::decode_base64_json::<Value>(h).ok());
    let body = resp
        .bytes()
        .await
        .map_err(|e| ClientError::Http(e.without_url().to_string()))?
        .to_vec();
    Ok(Paid {
        status,
        headers,
        body,
        payment,
        response,
        payment_required,
    })
}
