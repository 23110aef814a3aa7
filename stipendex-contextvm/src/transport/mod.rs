//! ContextVM's transport: MCP JSON-RPC messages between a server key and client keys over Nostr
//! relays ([`wire`]: the events; the server and client transports come next).

pub mod wire;
