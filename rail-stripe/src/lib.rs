//! # rail-stripe
//!
//! Stripe PaymentIntents as a Stipendex rail ([`rail`]): pay (automatic capture), hold
//! (manual capture), partial capture, void (cancel) and refunds, every mutating call with an
//! `Idempotency-Key` derived from the operation id, errors mapped from Stripe's `type`, `code`,
//! `decline_code` with the request id kept ([`client`]), exact currency conversion
//! ([`currency`]), webhook signatures ([`webhook`]) — and a stateful emulator of the Stripe API
//! subset it uses ([`emulator`], binary `stripe-emulator`).

pub mod client;
pub mod currency;
pub mod emulator;
pub mod rail;
pub mod webhook;

pub use client::{StripeFailure, StripeHttp};
pub use emulator::{Emulator, EmulatorConfig, RunningEmulator};
pub use rail::{OfferDetails, Proof, RAIL, StripePayer, StripeReceiver};
