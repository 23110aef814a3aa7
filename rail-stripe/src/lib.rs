//! # rail-stripe
//!
//! Stripe PaymentIntents as a Stipendex rail ([`rail`]): pay (automatic capture), hold
//! (manual capture), partial capture, void (cancel) and refunds, every mutating call with an
//! `Idempotency-Key` derived from the operation id, errors mapped from Stripe's `type`, `code`,
//! `decline_code` with the request id kept ([`client`]), exact currency conversion
//! ([`currency`]), webhook signatures ([`webhook`]). Its test double, a stateful emulator of the Stripe API
//! subset it uses (binary `stripe-emulator`), is the `stripe-emulator` crate (`devnets/stripe-emulator`).
//!
//! ## Features
//!
//! None: a library build carries the rail only (`cargo run -p stripe-emulator` runs the emulator).
//!
//! ## Example
//!
//! Against the emulator (`stripe-emulator`, a dev-dependency):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use std::time::Duration;
//! use rail_core::{Asset, Charge, HoldPayer, HoldReceiver, MemoryKeyStore, Money, OpId, RailReceiver, SystemClock};
//! use rail_stripe::{StripeHttp, StripePayer, StripeReceiver};
//! use stripe_emulator::{Emulator, EmulatorConfig};
//!
//! // The emulator stands in for https://api.stripe.com.
//! let stripe = Emulator::spawn(EmulatorConfig::default(), "127.0.0.1:0".parse()?).await?;
//! let (store, clock) = (Arc::new(MemoryKeyStore::default()), Arc::new(SystemClock));
//! let receiver = StripeReceiver::new(
//!     StripeHttp::new(&stripe.url, "sk_test_emulator")?, "pk_test_emulator", "shop",
//!     Asset::usd(), store.clone(), clock.clone(),
//! );
//! let usd = |s| Money::parse(Asset::usd(), s);
//! let payer = StripePayer::new(&stripe.url, "pm_card_visa", usd("50.00")?, clock)?;
//!
//! // A hold of $10.00, captured for $6.50: $3.50 goes back to the card.
//! let offer = receiver.offer(&Charge::hold(usd("10.00")?, Duration::from_secs(600))).await?;
//! let held = receiver.verify(&offer, &payer.hold(&OpId::random(), &offer).await?).await?;
//! let captured = receiver.capture(&OpId::random(), &held, &usd("6.50")?).await?;
//! assert_eq!(captured.released, usd("3.50")?);
//! assert_eq!(stripe.emulator.balance("usd"), 650);
//! # Ok(())
//! # }
//! ```

pub mod client;
pub mod currency;
pub mod rail;
pub mod webhook;

pub use client::{StripeFailure, StripeHttp};
pub use rail::{OfferDetails, RAIL, StripePayer, StripeProof, StripeReceiver};
