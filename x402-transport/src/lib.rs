//! # x402-transport — one x402 transport for every scheme
//!
//! x402 v2's envelope — a 402 whose `accepts[]` lists ways to pay, a `PAYMENT-SIGNATURE` retry, a
//! `PAYMENT-RESPONSE` receipt, and the same over MCP (`_meta["x402/payment"]`) — is shared by
//! schemes that settle in very different ways: `exact` on EVM signs an EIP-3009 authorization a
//! facilitator submits (`rail-x402`); exact-algo's payer (`docs/exact-algo.md`) signs a native
//! Algorand payment the receiver submits (`rail-exact-algo`). This crate is everything they do
//! alike, written once; a scheme plugs in through [`Scheme`].
//!
//! | module | what |
//! | --- | --- |
//! | [`scheme`] | the [`Scheme`] trait and the plain data it trades in ([`Price`], [`Presented`], [`Verified`], [`Settled`], [`Refusal`], [`Failure`]); [`Accepts`]: the ways one resource can be paid |
//! | [`wire`] | header names, base64-of-JSON codecs, the 402 body ([`wire::PaymentRequired`]) |
//! | [`facilitator`] | the facilitator protocol's messages ([`facilitator::FacilitatorRequest`], [`facilitator::VerifyResponse`]) |
//! | [`served`] | the served-once record ([`ServedOnce`]), shared by every surface and receiver |
//! | [`settle`] | one payment through check → served-once → settle before or after the paid work |
//! | [`client`] | the paying reqwest client ([`client::Client`]) and the payer side of a scheme ([`client::SchemePayer`]) |
//! | [`paywall`] | the axum paywall (feature `paywall`) |
//! | [`mcp`] | the MCP adapter for rmcp servers (feature `mcp`) |
//!
//! A receiver offering two schemes on one route (any [`Scheme`] implementations, here handed
//! in):
//!
//! ```
//! # #[cfg(feature = "paywall")]
//! # fn demo(evm: std::sync::Arc<dyn x402_transport::Scheme>, algo: std::sync::Arc<dyn x402_transport::Scheme>)
//! #     -> Result<(), x402_transport::Error> {
//! use axum::{Router, routing::get};
//! use x402_transport::Accepts;
//! use x402_transport::paywall::Paywall;
//!
//! // 0.001 USDC (6 decimals) or 0.001 ALGO (µALGO): the payer picks.
//! let accepts = Accepts::one(evm, 1_000)?.or(algo, 1_000)?;
//! let paywall = Paywall::new().route("/weather", "Today's weather", accepts);
//! let app: Router = paywall.apply(Router::new().route("/weather", get(|| async { "sunny" })));
//! # let _ = app;
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod error;
pub mod facilitator;
#[cfg(feature = "mcp")]
pub mod mcp;
#[cfg(feature = "paywall")]
pub mod paywall;
pub mod scheme;
pub mod served;
pub mod settle;
pub mod wire;

pub use error::Error;
pub use scheme::{
    Accept, Accepts, Busy, Failure, Presented, Price, Refusal, Scheme, SchemeInfo, Settled,
    Verdict, Verified,
};
pub use served::ServedOnce;
pub use settle::SettleWhen;
