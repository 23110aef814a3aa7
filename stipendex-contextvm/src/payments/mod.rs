//! CEP-8 payments (being built): the lifecycle's notifications ([`notify`]) and the pricing
//! tags, as the ContextVM SDK 0.11.14 writes them.

pub mod notify;
