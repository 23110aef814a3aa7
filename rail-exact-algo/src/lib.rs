//! # rail-exact-algo (in progress)
//!
//! The native-ALGO `exact-algo` scheme: an x402-style envelope that settles in native ALGO
//! (see `shared/seeds/avouch-exact-algo.en.md`).
//!
//! **What works today:** the security-critical core the verifier stands on —
//! - [`msgpack`]: canonical MessagePack, read strictly (non-minimal forms, unsorted or repeated
//!   keys, zero values, floats, extension types and trailing bytes are refused) and written
//!   canonically;
//! - [`address`]: Algorand addresses with checksum checks;
//! - [`txn`]: signed native payments, decoded strictly (unknown fields, multisig and logic
//!   signatures refused; the bytes must re-encode to themselves), transaction ids, and
//!   Ed25519 `verify_strict` over `"TX" || txn` — checked against the signing vector shared by
//!   the Go, Python and JavaScript Algorand SDKs;
//! - [`rules`]: the seed's payment rules (signature first, then no group, network, receiver,
//!   amount, note = paymentId, fee bounds, no rekey, no close-to, validity window and rounds,
//!   `sgnr` only as the account's auth address), each with its error code.
//!
//! - [`payment_id`]: the paymentId lifecycle (issued → pending → settled) on the rail-core
//!   replay guard, shared by receiver instances through one store.
//!
//! - [`wire`]: the 402 body, the `PAYMENT-SIGNATURE` envelope (decoded strictly: base64 → JSON
//!   with no unknown fields → version, scheme, network → base64 → strict msgpack) and the
//!   `PAYMENT-RESPONSE` receipt.
//!
//! - [`payer`], [`receiver`], [`algod`], [`devnet`], [`rail`]: signing within a policy,
//!   settlement through algod, an algod-compatible devnet, and the rail-core traits.
//! - [`http`]: the seed's HTTP flow as an axum middleware ([`http::Paywall`]) and the
//!   discovery documents (`/llms.txt`, `/.well-known/exact-algo.json`);
//! - [`mcp`]: the MCP surface (Streamable HTTP `POST /mcp`, JSON-RPC 2.0) with paid tools;
//! - [`demo`]: the example receiver app served by the `exact-algo-receiver` binary.
//!
//! ```
//! use rail_exact_algo::txn::SignedPay;
//! // Bytes that are not a canonical signed payment are refused with a typed error.
//! assert!(SignedPay::decode(&[0x80]).is_err());
//! ```

pub mod address;
pub mod algod;
pub mod demo;
pub mod devnet;
pub mod http;
pub mod mcp;
pub mod msgpack;
pub mod payer;
pub mod payment_id;
pub mod rail;
pub mod receiver;
pub mod rules;
pub mod txn;
pub mod wire;

pub use address::Address;
pub use algod::{AlgodClient, AlgodError};
pub use devnet::{Devnet, DevnetConfig, RunningDevnet};
pub use http::{Paywall, ServiceInfo, discovery_router, paywall_middleware};
pub use mcp::{McpServer, Tool};
pub use payer::{ExactAlgoPayer, PayError, Policy, SignedPayment};
pub use rail::{Proof, RAIL};
pub use receiver::{ExactAlgoReceiver, Price, Refusal, Settlement};
