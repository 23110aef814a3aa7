//! # rail-exact-algo (not implemented yet)
//!
//! This crate will hold the native-ALGO `exact-algo` scheme (an x402-style envelope settling
//! native ALGO on Algorand): the payer, a strict verifier of signed `pay` transactions,
//! settlement through algod, HTTP and MCP surfaces, and an algod-compatible devnet.
//!
//! Nothing here works yet: it has no public items, so nothing can be mistaken for a working rail.
