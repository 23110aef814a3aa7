//! x402's own `exact` scheme on Algorand (AVM): payment in an ASA such as USDC, as one signed
//! asset transfer or as an atomic group whose first member is the facilitator's fee payment
//! (`payload.paymentGroup` + `paymentIndex`; `extra.feePayer`). The spec is
//! `specs/schemes/exact/scheme_exact_algo.md` of the x402 repository; the peer implementation
//! is the x402-avm SDK (PyPI 2.0.2; research `docs/research/x402-avm-2.0.2.md`).
//!
//! | module | what |
//! |---|---|
//! | [`wire`] | the entry, the envelope, the facilitator's answers, network ids, error codes |
//! | [`verify`] | strict decoding of a group and every rule that needs no chain |
//! | [`facilitator`] | [`AvmFacilitator`]: fee payer signing, simulate, submit once per group |
//! | [`scheme`] | [`ExactAvm`]: the scheme for the shared x402 transport (paywall, MCP, client) |
//! | [`payer`] | [`AvmPayer`]: builds and signs the group within an [`AvmPolicy`] |
//! | [`rail`] | the rail-core traits: [`AvmPayer`] is a `Payer`, [`AvmReceiver`] a `RailReceiver` (rail `exact-avm`) |
//! | [`remote`] | [`RemoteFacilitator`]: a facilitator over HTTP (this crate's, or the SDK's) |
//! | `server` (feature `paywall`) | the facilitator's HTTP routes: `/supported`, `/verify`, `/settle` |
//!
//! It is the same `scheme` and `network` as exact-algo (`docs/exact-algo.md` §9); a route may offer
//! both (and `exact` on EVM), and a payment goes to the one whose shape it has.

pub mod facilitator;
pub mod payer;
pub mod rail;
pub mod remote;
pub mod scheme;
#[cfg(feature = "paywall")]
pub mod server;
pub mod verify;
pub mod wire;

pub use facilitator::{AvmError, AvmFacilitator, FEE_PAYER_KEY_ENV, FeePayer};
pub use payer::{AvmPayError, AvmPayer, AvmPolicy};
pub use rail::AvmReceiver;
pub use remote::RemoteFacilitator;
pub use scheme::{ExactAvm, LABEL};
pub use verify::{AvmPayment, Expect, Violation};
pub use wire::{Envelope, Payload, Requirements, Spelling};
