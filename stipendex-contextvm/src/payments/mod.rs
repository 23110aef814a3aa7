//! CEP-8 payments: the lifecycle's notifications ([`notify`]), the server's middleware and
//! processors ([`server`]: [`ServerPayments`], [`Processor`]), and Lightning through the
//! `ln-nwc` rail ([`nwc`]: [`NwcProcessor`]), and the `stipendex` method carrying a Quote and a
//! Proof, so every rail of the registry is reachable ([`stipendex`]).

pub mod client;
mod deadline;
mod limits;
pub mod notify;
pub mod nwc;
pub mod server;
pub mod stipendex;

pub use client::{LightningHandler, WalletHandler};
pub use nwc::NwcProcessor;
pub use server::{Processor, ServerPayments};
pub use stipendex::{StipendexHandler, StipendexProcessor};
