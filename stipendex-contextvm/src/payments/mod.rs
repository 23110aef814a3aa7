//! CEP-8 payments: the lifecycle's notifications ([`notify`]), the server's middleware and
//! processors ([`server`]: [`ServerPayments`], [`Processor`]), and Lightning through the
//! `ln-nwc` rail ([`nwc`]: [`NwcProcessor`]).

pub mod client;
pub mod notify;
pub mod nwc;
pub mod server;

pub use client::{LightningHandler, WalletHandler};
pub use nwc::NwcProcessor;
pub use server::{Processor, ServerPayments};
