//! # rail-x402 — in progress, not a working rail
//!
//! The offline, security-critical core of x402 **v2** `exact` on EVM chains with EIP-3009
//! (`transferWithAuthorization`) tokens such as USDC, written against the x402 specification
//! (`specs/x402-specification-v2.md`, `specs/transports-v2/http.md`,
//! `specs/schemes/exact/scheme_exact_evm.md`) and the reference SDK `@x402/evm` 2.27.0.
//!
//! ## What works
//! - [`wire`]: the v2 types (`PaymentRequired`, `PaymentRequirements`, `PaymentPayload` with the
//!   exact-EVM payload, `SettleResponse`, `VerifyResponse`) and the `PAYMENT-REQUIRED`,
//!   `PAYMENT-SIGNATURE` and `PAYMENT-RESPONSE` header codecs (base64 JSON). What payers send
//!   is decoded strictly: unknown fields, JSON numbers for amounts and non-canonical spellings
//!   of signed values are refused (see [`fields`]). The specification's example headers
//!   decode and re-encode byte for byte.
//! - [`v1`]: the v1 types (`X-PAYMENT`, `X-PAYMENT-RESPONSE`, `maxAmountRequired`, network
//!   names), separate from v2, with no conversion either way.
//! - [`eip3009`]: the EIP-712 domain and `TransferWithAuthorization` hashing (with
//!   `alloy-sol-types`) and signer recovery from 65-byte signatures (`v` 27/28 or 0/1,
//!   `bytes` or `(v, r, s)`, high-`s` refused). Checked against the signature in the x402
//!   specification's own example and against digests computed with `eth-account`.
//! - [`verify`]: offline verification in the reference order, failing with the reference
//!   `invalidReason` codes.
//!
//! ## What does not work yet
//! Nothing here pays, settles or talks to a chain, so a passing [`verify::verify_exact_evm`] is
//! **not** a payment and must not release a paid response. Missing: the payer (signing and
//! choosing requirements), the chain checks (balance, nonce, asset deployed, simulation —
//! [`verify::ChainView`] is only a trait), settlement and its replay-safe bookkeeping, the
//! facilitator client and server (`/verify`, `/settle`, `/supported`), the axum layer, the
//! reqwest client, the MCP binding, smart-wallet signatures (ERC-1271 / ERC-6492), Permit2,
//! v1 verification, anvil localnet tests and the conformance suite.
//!
//! ## Example
//! Decode the specification's example `PAYMENT-SIGNATURE` header and verify it offline against
//! the route's requirements, at a time inside its validity window:
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
pub mod http;
pub mod localnet;
pub mod mock;
pub mod payer;
pub mod rail;
pub mod rpc;
pub mod server;
pub mod v1;
pub mod verify;
pub mod wire;
