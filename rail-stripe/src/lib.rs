//! # rail-stripe (not implemented yet)
//!
//! This crate will hold the Stripe rail: PaymentIntents with manual capture as holds, partial
//! capture, cancel as void, refunds, webhook verification, and a stateful Stripe API test double.
//!
//! Nothing here works yet: it has no public items, so nothing can be mistaken for a working rail.
