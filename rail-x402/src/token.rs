//! The token a receiver prices in: an EIP-3009 contract and its EIP-712 domain.

use alloy_primitives::Address;

/// The token a paywall is priced in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// CAIP-2 network.
    pub network: String,
    /// Contract address.
    pub address: Address,
    /// EIP-712 domain name (`name()` of the token, "USD Coin" / "USDC").
    pub name: String,
    /// EIP-712 domain version (`version()`, "2" for USDC).
    pub version: String,
}

impl Token {
    /// A token.
    #[must_use]
    pub fn new(network: &str, address: Address, name: &str, version: &str) -> Self {
        Self {
            network: network.to_owned(),
            address,
            name: name.to_owned(),
            version: version.to_owned(),
        }
    }
}
