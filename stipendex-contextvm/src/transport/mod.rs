//! ContextVM's transport: MCP JSON-RPC messages between a server key and client keys over Nostr
//! relays — [`wire`] (the events), [`relay`] (the relays), [`server`] (an rmcp server per
//! client key), [`client`] (an rmcp client transport to one server) and [`announce`] (public
//! announcements).

pub mod announce;
pub mod client;
pub mod relay;
pub mod server;
pub mod wire;

/// Which messages a peer reads and how it sends (CEP-4; the SDK's `EncryptionMode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Encryption {
    /// Reads plain messages and gift wraps; a server answers each client as it wrote, a client
    /// always wraps (the SDK's default).
    #[default]
    Optional,
    /// Gift wraps only: a plain message is dropped.
    Required,
    /// Plain messages only: a gift wrap is dropped.
    Disabled,
}

/// What a server says about itself on the first message to each client (its common tags).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerInfo {
    /// Its name.
    pub name: Option<String>,
    /// What it does.
    pub about: Option<String>,
    /// Its web site.
    pub website: Option<String>,
    /// A picture's URL.
    pub picture: Option<String>,
}
