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
mod spool;

pub use client::{Client, Response, TabCallPaid};
pub use server::{
    Binding, Checkout, FinalAmount, IpNet, Outcome, TAB_CLOSE, TrustedProxies, Undelivered,
    WELL_KNOWN, client_key,
};
pub use spool::DEFAULT_MAX_ANSWER;

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

/// The `Stipendex-Tab-Call` parameter that says a voucher was not counted (a call refused or
/// waived by the price hook, or one that never reached the service): `voucher=<digest>;
/// uncounted`. The wallet gives the lane back and signs its next voucher with the same
/// sequence and cumulative.
pub const UNCOUNTED: &str = "uncounted";

/// Every request header that presents a payment, of every way to pay: a Proof, a voucher, a
/// tab's opening, an x402 v2 or v1 payload. The binding's guard ([`crate::receiver::Receiver::guard`])
/// runs for a priced request that carries any of them, and a gateway never forwards them.
pub const PAYMENT_HEADERS: &[&str] = &[
    PAYMENT,
    VOUCHER,
    TAB,
    x402_transport::wire::PAYMENT_SIGNATURE,
    x402_transport::wire::X_PAYMENT,
];

/// Every response header that speaks for a payment (a Receipt, a tab call's leaf, an x402
/// settlement or challenge): only the binding writes them; a gateway drops an upstream's.
pub const PAYMENT_RESPONSE_HEADERS: &[&str] = &[
    RECEIPT,
    TAB_CALL,
    x402_transport::wire::PAYMENT_RESPONSE,
    x402_transport::wire::X_PAYMENT_RESPONSE,
    x402_transport::wire::PAYMENT_REQUIRED,
];

/// Whether `headers` present a payment of any kind ([`PAYMENT_HEADERS`]).
#[must_use]
pub fn presents_payment(headers: &axum::http::HeaderMap) -> bool {
    PAYMENT_HEADERS.iter().any(|h| headers.contains_key(*h))
}
