//! ContextVM for Stipendex: MCP over Nostr with CEP-8 payments (issue 28; being built).
//!
//! What the ContextVM TypeScript SDK 0.11.14 puts on the wire is in
//! `docs/research/contextvm-sdk-0.11.14.md`, read from its code; this crate follows the code
//! where the later specification differs. So far: [`transport::wire`], the events — MCP
//! messages as kind 25910 events and the SDK's single-layer gift wrap (kinds 1059 and 21059) —
//! and [`payments::notify`], CEP-8's three notifications.
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
