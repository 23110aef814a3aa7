//! The paying HTTP client for `exact` on EVM is the shared x402 client
//! ([`x402_transport::client::Client`]) with an [`X402Payer`] ([`client`] builds it); [`EvmFetched`]
//! reads its answers in this rail's types. It pays within the payer's
//! [`Policy`](crate::payer::Policy) and retries once.
//!
//! - The 402 is read from `PAYMENT-REQUIRED` (v2). A 402 without it is returned as is: the
//!   client never downgrades to v1 or guesses.
//! - One payment per request: if the paid retry gets no answer (timeout, connection reset) or
//!   a 502/503/504 (outcome unknown), the **same** signed payment is sent again, up to
//!   [`Client::with_retries`] times, honouring `Retry-After`. A second signature is never
//!   made for one request; if the outcome is still unknown, [`ClientError::OutcomeUnknown`]
//!   hands the payment back for [`Client::resend`].
//! - The result says what was paid ([`EvmFetched::payment`]) and what the server answered
//!   ([`EvmFetched::settlement`], from `PAYMENT-RESPONSE`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use rail_x402::client::{EvmFetched, client};
//! use rail_x402::evm::LocalSigner;
//! use rail_x402::payer::{Policy, X402Payer};
//!
//! let signer = LocalSigner::from_hex(&std::env::var("X402_PAYER_KEY")?)?;
//! let usdc = "0x036CbD53842c5426634e7929541eC2318f3dCF7e".parse()?;
//! let payer = X402Payer::new(signer, Policy::new("eip155:84532", usdc, alloy_primitives::U256::from(10_000u64)));
//! let paid = EvmFetched::from(client(payer)?.get("http://127.0.0.1:8402/weather").await?);
//! println!("{} {:?}", paid.status, paid.settlement.map(|s| s.transaction));
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
pub use x402_transport::client::{Client, ClientError, Sent};

use crate::payer::X402Payer;
use crate::wire::{PaymentPayload, PaymentRequired, SettleResponse};

/// The answer to a (possibly paid) request.
#[derive(Debug)]
pub struct EvmFetched {
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

impl From<x402_transport::client::Fetched> for EvmFetched {
    fn from(p: x402_transport::client::Fetched) -> Self {
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
        EvmFetched {
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

/// The shared x402 client paying with `payer` alone: 30 s per request (on this crate's
/// HTTP client, with its TLS provider), 3 resends of a payment whose outcome is unknown.
/// Read its answers in this rail's types with [`EvmFetched::from`].
///
/// # Errors
/// [`ClientError::Http`] if the HTTP client cannot be built.
pub fn client(payer: X402Payer) -> Result<Client, ClientError> {
    Ok(Client::new(crate::rpc::http_builder(Duration::from_secs(30)))?.with_payer(Arc::new(payer)))
}
