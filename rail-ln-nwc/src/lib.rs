//! # rail-ln-nwc (not implemented yet)
//!
//! This crate will hold Lightning payments through Nostr Wallet Connect (NIP-47): BOLT11
//! invoices checked before paying, preimage-verified receipts, hold invoices, NIP-44
//! encryption, and an NWC wallet-service devnet over a real relay.
//!
//! Nothing here works yet: it has no public items, so nothing can be mistaken for a working rail.
