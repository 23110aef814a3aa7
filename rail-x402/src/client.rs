//! The paying HTTP client for `exact` on EVM: the shared x402 client
//! ([`x402_transport::client::Client`]) with one [`X402Payer`], answering in this rail's types.
//! It pays within the payer's [`Policy`](crate::payer::Policy) and retries once.
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

use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use x402_transport::client::{Client, ClientError as TransportError, Sent};

use crate::payer::X402Payer;
use crate::wire::{PaymentPayload, PaymentRequired, SettleResponse};

/// Why a paid request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No answer (and, after a payment was made, none after every retry of it).
    #[error("http: {0}")]
    Http(String),
    /// The 402 did not decode.
    #[error("402: {0}")]
    Header(String),
    /// The policy allows none of the options, or signing failed.
    #[error("{0}")]
    Payer(String),
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

impl From<TransportError> for ClientError {
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::Http(m) => ClientError::Http(m),
            TransportError::Header(m) => ClientError::Header(m),
            e @ TransportError::NothingPayable(_) => ClientError::Payer(e.to_string()),
            TransportError::Payer(m) => ClientError::Payer(m),
            TransportError::OutcomeUnknown { payment, detail } if payment.v1 => {
                ClientError::OutcomeUnknownV1 {
                    header: x402_transport::wire::encode_base64_json(&payment.envelope)
                        .unwrap_or_default(),
                    detail,
                }
            }
            TransportError::OutcomeUnknown { payment, detail } => {
                match serde_json::from_value::<PaymentPayload>(payment.envelope) {
                    Ok(p) => ClientError::OutcomeUnknown {
                        payment: Box::new(p),
                        detail,
                    },
                    Err(e) => ClientError::Payer(format!("a payment this payer did not sign: {e}")),
                }
            }
            other => ClientError::Http(other.to_string()),
        }
    }
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
    /// The payment sent, if one was (a v2 one).
    pub payment: Option<PaymentPayload>,
    /// The decoded `PAYMENT-RESPONSE` (or v1 `X-PAYMENT-RESPONSE`), if the server sent one.
    pub settlement: Option<SettleResponse>,
    /// The 402 that asked for the payment.
    pub payment_required: Option<PaymentRequired>,
}

impl Paid {
    fn from_transport(p: x402_transport::client::Paid) -> Self {
        let v1 = p.payment.as_ref().is_some_and(|s| s.v1);
        let settlement = p.response.and_then(|r| {
            if v1 {
                serde_json::from_value::<crate::v1::SettleResponseV1>(r)
                    .ok()
                    .map(|s| SettleResponse {
                        success: s.success,
                        error_reason: s.error_reason,
                        error_message: None,
                        transaction: s.transaction,
                        network: s.network,
                        payer: s.payer,
                    })
            } else {
                serde_json::from_value(r).ok()
            }
        });
        Paid {
            status: p.status,
            headers: p.headers,
            body: p.body,
            payment: p
                .payment
                .filter(|s| !s.v1)
                .and_then(|s| serde_json::from_value(s.envelope).ok()),
            settlement,
            payment_required: p.payment_required.and_then(|r| {
                crate::wire::payment_required_from_value_mixed(serde_json::to_value(r).ok()?).ok()
            }),
        }
    }
}

/// A reqwest client that pays 402s in one token.
#[derive(Clone, Debug)]
pub struct X402Client {
    inner: Client,
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
        let http = crate::rpc::http_client(Duration::from_secs(30))
            .map_err(|e| ClientError::Http(e.to_string()))?;
        Ok(Self::build(http, payer, 3))
    }

    fn build(http: reqwest::Client, payer: X402Payer, retries: u32) -> Self {
        Self {
            inner: Client::new(http.clone())
                .with_payer(Arc::new(payer.clone()))
                .with_retries(retries),
            http,
            payer,
            retries,
        }
    }

    /// With another reqwest client (timeouts, proxies).
    #[must_use]
    pub fn with_http(self, http: reqwest::Client) -> Self {
        Self::build(http, self.payer, self.retries)
    }

    /// How many times the same payment is resent when its outcome is unknown.
    #[must_use]
    pub fn with_retries(self, retries: u32) -> Self {
        Self::build(self.http, self.payer, retries)
    }

    /// The payer.
    #[must_use]
    pub const fn payer(&self) -> &X402Payer {
        &self.payer
    }

    /// The shared client underneath.
    #[must_use]
    pub const fn transport(&self) -> &Client {
        &self.inner
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
        Ok(Paid::from_transport(
            self.inner.send(method, url, body).await?,
        ))
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
        let sent = Sent {
            label: crate::scheme::LABEL.into(),
            envelope: serde_json::to_value(&payment)
                .map_err(|e| ClientError::Payer(e.to_string()))?,
            v1: false,
        };
        Ok(Paid::from_transport(
            self.inner.resend(method, url, body, sent).await?,
        ))
    }
}
