//! # x402-devnet
//!
//! The x402 rail's (`rail-x402`) test doubles and local tooling, apart from the rail so that no
//! library build carries them:
//!
//! | module | what |
//! | --- | --- |
//! | [`facilitator`] | [`DevnetFacilitator`]: an in-memory EIP-3009 token behind the facilitator API (unit tests, the suite's mock tier; no chain, no node) |
//! | [`anvil`] | [`anvil::Localnet`]: the anvil + FiatTokenV2_2 localnet started by `scripts/x402/localnet.mjs`, described by `X402_*` variables |
//!
//! and the `x402` binary: a facilitator (`x402 facilitator`), an example paid API
//! (`x402 serve`), a payer (`x402 pay`) and a load generator (`x402 load`).
//!
//! ```
//! # fn main() -> Result<(), rail_x402::facilitator::FacilitatorError> {
//! use alloy_primitives::{Address, U256};
//! use x402_devnet::DevnetFacilitator;
//!
//! let (token, payer) = (Address::repeat_byte(1), Address::repeat_byte(2));
//! let facilitator = DevnetFacilitator::new("eip155:84532");
//! facilitator.mint(token, payer, U256::from(1_000_000u64))?;
//! assert_eq!(facilitator.balance(token, payer)?, U256::from(1_000_000u64));
//! # Ok(()) }
//! ```

pub mod anvil;
pub mod facilitator;

pub use facilitator::DevnetFacilitator;
