//! # rail-x402 — x402 v2 `exact` on EVM (EIP-3009)
//!
//! Pay and get paid with x402 v2 (`specs/x402-specification-v2.md`,
//! `specs/transports-v2/http.md`, `specs/schemes/exact/scheme_exact_evm.md`), byte-compatible
//! with the reference SDK `@x402/*` 2.27.0 (checked both ways on anvil with Circle's
//! FiatTokenV2_2: `tests/interop.rs`).
//!
//! | module | what |
//! | --- | --- |
//! | [`wire`], [`fields`], [`v1`] | v2 (and v1) types and header codecs; what payers send is decoded strictly |
//! | [`eip3009`] | EIP-712 `TransferWithAuthorization` hashing, signer recovery (high-`s` refused) |
//! | [`verify`] | offline verification in the reference order, reference `invalidReason` strings |
//! | [`payer`] | choose an option by [`payer::Policy`] (never the first blindly), sign the authorization |
//! | [`client`] | the shared x402 client with this rail's payer ([`client::client`]) and its answers in this rail's types ([`client::EvmFetched`]) |
//! | [`facilitator`] | [`facilitator::X402Facilitator`]: [`facilitator::LocalFacilitator`] (chain checks, settlement with one nonce sequence, write-ahead [`facilitator::X402SettlementBook`]) and [`facilitator::RemoteFacilitator`] (HTTP) |
//! | [`server`] | the facilitator HTTP API (`/verify`, `/settle`, `/supported`, `/health`) |
//! | [`scheme`] | [`ExactEvm`]: this rail as an [`x402_transport::Scheme`], for the shared paywall, MCP adapter and client |
//! | [`mcp`] | the MCP binding (`transports-v2/mcp.md`): the shared adapter in this scheme ([`ExactEvm::mcp_paywall`]) and the client side's helpers |
//! | [`rail`] | the rail-core traits ([`rail::X402RailPayer`], [`rail::X402Receiver`]) |
//! | [`rpc`], [`evm`] | JSON-RPC client, FiatToken ABI, EIP-1559 transactions, local signer |
//! | [`token`] | the token a receiver prices in (the served-once record is the transport's, [`x402_transport::ServedOnce`]) |
//!
//! The test doubles (an in-memory token behind the facilitator API, the anvil localnet helper)
//! and the `x402` tool (`x402 facilitator`, `x402 serve`, `x402 pay`, `x402 load`) are the
//! `x402-devnet` crate (`devnets/x402`).
//!
//! v1 (`X-PAYMENT`, JSON 402 body, `X-PAYMENT-RESPONSE`) is spoken beside v2 by the client and,
//! opt-in ([`ExactEvm::accept_v1`]), by the paywall; a v2 exchange is never downgraded.
//!
//! Contract wallets (ERC-1271) pay and are verified: a signature that does not recover `from`
//! is checked with the wallet's `isValidSignature` when `from` has code, and settled through
//! FiatTokenV2_2's `bytes` overload ([`payer::X402Payer::for_wallet`] on the paying side).
//! Not supported: counterfactual wallets (ERC-6492) and Permit2 — refused as
//! `invalid_exact_evm_signature`.
//!
//! ## Features
//!
//! A default build is what a wallet needs (payer, client, verification, local and remote
//! facilitators): no HTTP server, no MCP, no SQL driver, no devnet, no command-line tool (those are `x402-devnet`'s).
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `paywall` | [`ExactEvm::paywall`] (the shared axum paywall in this scheme) and [`server`] (the facilitator HTTP API): axum, tower |
//! | `mcp` | [`mcp`]: the adapter for rmcp servers |
//! | `postgres` | `rail_core::keys::sql::PgKeyStore`: served-once and settlement records shared by instances |
//!
//! ## Example
//! Decode the specification's example `PAYMENT-SIGNATURE` header and verify it offline against
//! the route's requirements, at a time inside its validity window (offline verification is
//! not a payment: only a settled one is, see [`ExactEvm::paywall`] and [`facilitator`]):
//!
//! ```
//! use rail_x402::verify::{verify_exact_evm, verify_response};
//! use rail_x402::wire::{Extra, PaymentPayload, PaymentRequirements};
//!
//! let header = "eyJ4NDAyVmVyc2lvbiI6MiwicmVzb3VyY2UiOnsidXJsIjoiaHR0cHM6Ly9hcGkuZXhhbXBsZS5jb20vcHJlbWl1bS1kYXRhIiwiZGVzY3JpcHRpb24iOiJBY2Nlc3MgdG8gcHJlbWl1bSBtYXJrZXQgZGF0YSIsIm1pbWVUeXBlIjoiYXBwbGljYXRpb24vanNvbiJ9LCJhY2NlcHRlZCI6eyJzY2hlbWUiOiJleGFjdCIsIm5ldHdvcmsiOiJlaXAxNTU6ODQ1MzIiLCJhbW91bnQiOiIxMDAwMCIsImFzc2V0IjoiMHgwMzZDYkQ1Mzg0MmM1NDI2NjM0ZTc5Mjk1NDFlQzIzMThmM2RDRjdlIiwicGF5VG8iOiIweDIwOTY5M0JjNmFmYzBDNTMyOGJBMzZGYUYwM0M1MTRFRjMxMjI4N0MiLCJtYXhUaW1lb3V0U2Vjb25kcyI6NjAsImV4dHJhIjp7Im5hbWUiOiJVU0RDIiwidmVyc2lvbiI6IjIifX0sInBheWxvYWQiOnsic2lnbmF0dXJlIjoiMHgyZDZhNzU4OGQ2YWNjYTUwNWNiZjBkOWE0YTIyN2UwYzUyYzZjMzQwMDhjOGU4OTg2YTEyODMyNTk3NjQxNzM2MDhhMmNlNjQ5NjY0MmUzNzdkNmRhOGRiYmY1ODM2ZTliZDE1MDkyZjllY2FiMDVkZWQzZDYyOTNhZjE0OGI1NzFjIiwiYXV0aG9yaXphdGlvbiI6eyJmcm9tIjoiMHg4NTdiMDY1MTlFOTFlM0E1NDUzODc5MWJEYmIwRTIyMzczZTM2YjY2IiwidG8iOiIweDIwOTY5M0JjNmFmYzBDNTMyOGJBMzZGYUYwM0M1MTRFRjMxMjI4N0MiLCJ2YWx1ZSI6IjEwMDAwIiwidmFsaWRBZnRlciI6IjE3NDA2NzIwODkiLCJ2YWxpZEJlZm9yZSI6IjE3NDA2NzIxNTQiLCJub25jZSI6IjB4ZjM3NDY2MTNjMmQ5MjBiNWZkYWJjMDg1NmYyYWViMmQ0Zjg4ZWU2MDM3YjhjYzVkMDRhNzFhNDQ2MmYxMzQ4MCJ9fX0=";
//! let payload = PaymentPayload::from_header(header)?;
//!
//! // The route's own requirements (what the server advertised).
//! let route = PaymentRequirements {
//!     scheme: "exact".into(),
//!     network: "eip155:84532".into(),
//!     amount: 10_000u64.into(),
//!     asset: "0x036CbD53842c5426634e7929541eC2318f3dCF7e".into(),
//!     pay_to: "0x209693Bc6afc0C5328bA36FaF03C514EF312287C".into(),
//!     max_timeout_seconds: 60,
//!     extra: Some(Extra::eip712("USDC", "2")),
//! };
//!
//! let now = 1_740_672_100; // inside [validAfter, validBefore - 6]
//! let checked = verify_exact_evm(&payload, &route, now)?;
//! assert_eq!(
//!     checked.payer.to_checksum(None),
//!     "0x857b06519E91e3A54538791bDbb0E22373e36b66"
//! );
//!
//! // Too late: the reference reason code.
//! let late = verify_exact_evm(&payload, &route, now + 3600);
//! assert_eq!(
//!     verify_response(&payload, &late).invalid_reason.as_deref(),
//!     Some("invalid_exact_evm_payload_authorization_valid_before")
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod client;
pub mod eip3009;
pub mod evm;
pub mod facilitator;
pub mod fields;
#[cfg(feature = "mcp")]
pub mod mcp;
pub mod payer;
pub mod rail;
pub mod rpc;
pub mod scheme;
#[cfg(feature = "paywall")]
pub mod server;
pub mod token;
pub mod v1;
pub mod verify;
pub mod wire;

pub use scheme::ExactEvm;
pub use token::Token;
pub use x402_transport::SettleWhen;
