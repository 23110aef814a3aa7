//! # rail-x402 (not implemented yet)
//!
//! This crate will hold the x402 v2 `exact` scheme on EVM chains (EIP-3009
//! `transferWithAuthorization` tokens): the payer, the verifier and settlement, a facilitator
//! client and server, an axum layer and a reqwest client, and the MCP binding.
//!
//! Nothing here works yet: it has no public items, so nothing can be mistaken for a working rail.
//! The work is tracked as its own issue and stands on `rail-core` and the conformance suite.
