//! ContextVM for Stipendex: MCP over Nostr with CEP-8 payments, interoperable with the
//! ContextVM TypeScript SDK 0.11.14 both ways.
//!
//! What the SDK puts on the wire is in `docs/research/contextvm-sdk-0.11.14.md`, read from its
//! code; this crate follows the code where the later specification differs, and builds CEP-8's
//! explicit gating (which 0.11.14 lacks) from the ContextVM documentation.
//!
//! - [`transport::wire`]: the events — kind 25910 messages, the SDK's single-layer gift wrap
//!   (kinds 1059 and 21059), capability and `pmi` tags; opening checks both signatures, the kind
//!   and the recipient.
//! - [`transport::relay`]: the relays, on `rail_ln_nwc::relays` (a subscription kept across
//!   reconnects; a send no relay accepted is an error; NIP-42 answered with the peer's key).
//! - [`transport::server`]: an rmcp service per client key; request ids rewritten to event ids
//!   and answers tagged `e`; each answer wrapped as the client wrote; a replayed or re-wrapped
//!   request runs once; a [`transport::server::Middleware`] sees every request first.
//! - [`transport::client`]: an rmcp client transport to one server, with a
//!   [`transport::client::PaymentHook`] for CEP-8 payment requests.
//! - [`payments::server`]: [`payments::ServerPayments`] — the Stipendex receiver's prices and
//!   `resolve_price` (quote, reject, waive), processors by PMI, the transparent lifecycle and
//!   explicit gating, pending payments bounded per client key and for the server, payment
//!   requests rate-limited per client key and for the server; [`payments::nwc`]: Lightning through the server's own NWC wallet;
//!   [`payments::client`]: paying through an `ln-nwc` payer or a Stipendex wallet under its
//!   mandate.
//!
//! ```
//! use nostr::Keys;
//! use stipendex_contextvm::transport::wire::{self, Wrap};
//!
//! let (client, server) = (Keys::generate(), Keys::generate());
//! let request = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
//! let inner = wire::message(&client, &server.public_key(), &request, Vec::new())?;
//! let wrapped = wire::wrap(&inner, &server.public_key(), Wrap::Ephemeral)?;
//! let opened = wire::unwrap(&server, &wrapped)?;
//! assert_eq!(opened.id, inner.id);
//! assert_eq!(wire::json_rpc(&opened)?, request);
//! # Ok::<(), stipendex_contextvm::Error>(())
//! ```

pub mod payments;
pub mod transport;

/// This crate's one error type.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An event could not be built, signed, encrypted or decrypted.
    #[error("nostr: {0}")]
    Nostr(String),
    /// A payment request could not be made, or a payment was not made or does not hold.
    #[error("payment: {0}")]
    Payment(String),
    /// No relay reachable, or none accepted an event.
    #[error("relay: {0}")]
    Relay(String),
    /// An event that is not what the protocol allows here (its kind, its tags, its signer,
    /// its content).
    #[error("refused: {0}")]
    Refused(String),
}

impl Error {
    /// A stable code for the error.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Error::Nostr(_) => "nostr",
            Error::Refused(_) => "refused",
            Error::Relay(_) => "relay",
            Error::Payment(_) => "payment",
        }
    }
}
