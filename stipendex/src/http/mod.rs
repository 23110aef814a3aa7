//! The HTTP binding (feature `http`): Stipendex over HTTP 402, on the x402 transport's
//! paywall, so one route is payable by Stipendex wallets and by plain x402 wallets.
//!
//! ```text
//! GET /api/search?q=…                         -> 402  {"quote": {"stipendex": "quote/0.1", "jws": …}, x402 members…}
//!                                                     PAYMENT-REQUIRED: base64(x402 v2 PaymentRequired)   (if the route also takes x402)
//! GET /api/search?q=…  Stipendex-Payment: b64url(Proof JWS)
//!                                             -> 200  Stipendex-Receipt: b64url(Receipt JWS)
//! GET /api/search?q=…  PAYMENT-SIGNATURE: …   -> the x402 paywall's answer (200 + PAYMENT-RESPONSE)
//! GET /.well-known/stipendex.json             -> the receiver's descriptor
//! ```
//!
//! - [`Binding`] (server): an axum middleware around a [`crate::receiver::Receiver`] and,
//!   optionally, an x402 [`x402_transport::paywall::Paywall`] pricing the same paths in x402
//!   schemes. The 402's JSON body carries `quote` *and* the x402 members of the paywall's
//!   body (v2's `x402Version`, `accepts`, `resource`, `error`; with a v1 scheme on the route
//!   the body is x402 v1's, as v1 clients read the body), and `PAYMENT-REQUIRED` carries x402
//!   v2: a Stipendex wallet reads `quote`, an x402 client reads what it always reads.
//! - [`Client`]: a reqwest client that hands a 402's Quote to the [`crate::wallet::Wallet`]
//!   and retries once with the Proof, then checks and journals the Receipt.

mod client;
mod server;

pub use client::{Client, Response, TabCallPaid};
pub use server::{Binding, FinalAmount, Outcome, TAB_CLOSE, WELL_KNOWN};

/// A reqwest client with the workspace's one TLS provider (rustls on ring) installed, as the
/// binding's [`Client`] expects.
///
/// # Errors
/// [`crate::Error::Config`] if the client cannot be built.
pub fn reqwest_client(timeout: std::time::Duration) -> Result<reqwest::Client, crate::Error> {
    reqwest_builder(timeout)
        .build()
        .map_err(|e| crate::Error::Config(format!("cannot build an HTTP client: {e}")))
}

/// The builder behind [`reqwest_client`] (TLS provider installed, timeouts set), for
/// [`Client::new`], which turns redirects off.
pub fn reqwest_builder(timeout: std::time::Duration) -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(std::time::Duration::from_secs(5))
}

/// The retry header: `base64url(Proof JWS)`.
pub const PAYMENT: &str = "stipendex-payment";
/// The success header: `base64url(Receipt JWS)`.
pub const RECEIPT: &str = "stipendex-receipt";
/// A call inside a tab: `base64url(Voucher JWS)`.
pub const VOUCHER: &str = "stipendex-voucher";
/// Opens the tab a voucher is for (with the first voucher): `base64url(hold Proof JWS)`.
pub const TAB: &str = "stipendex-tab";
/// The answer to a call inside a tab: `voucher=<digest>; result=<digest>` (SHA-256 of the
/// body), the call's leaf in the tab's Merkle tree.
pub const TAB_CALL: &str = "stipendex-tab-call";
