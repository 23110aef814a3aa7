//! # rail-ln-nwc
//!
//! Lightning over Nostr Wallet Connect (NIP-47) as a Stipendex rail (in progress): the NIP-47
//! wire types ([`nip47`]).

pub mod client;
pub mod devnet;
pub mod nip47;
pub mod rail;
pub mod wire;
