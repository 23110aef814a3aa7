//! Offline verification of an exact-EVM (EIP-3009) payment against the route's requirements.
//!
//! [`verify_exact_evm`] runs the checks that need no chain, in the order of `verifyEIP3009` in
//! `@x402/evm` 2.27.0 (`exact/facilitator/eip3009.ts`), and fails with the same `invalidReason`
//! strings ([`VerifyError::reason`]):
//!
//! | step | check | reason |
//! | --- | --- | --- |
//! | 1 | `accepted.scheme` and the requirements' scheme are `"exact"` | `invalid_exact_evm_scheme` |
//! | 2 | `extra.name` and `extra.version` are present and non-empty | `invalid_exact_evm_missing_eip712_domain` |
//! | 3 | `asset` is an address *(reference: `getAddress` throws)* | `invalid_payment_requirements` |
//! | 4 | `accepted.network` equals the requirements' network | `invalid_exact_evm_network_mismatch` |
//! | 5 | the network is `eip155:<chain id>` *(reference: throws)* | `invalid_network` |
//! | 6 | the 65-byte signature recovers `authorization.from` | `invalid_exact_evm_signature` |
//! | 7 | `authorization.to` equals `payTo` (case-insensitive) | `invalid_exact_evm_recipient_mismatch` |
//! | 8 | `validBefore >= now + 6` (6 s for block time) | `invalid_exact_evm_payload_authorization_valid_before` |
//! | 9 | `validAfter <= now` | `invalid_exact_evm_payload_authorization_valid_after` |
//! | 10 | `value == amount`, exactly | `invalid_exact_evm_payload_authorization_value_mismatch` |
//! | 11 | `accepted` equals the requirements (asset, amount, payTo, maxTimeoutSeconds, extra ⊆) | `invalid_exact_evm_accepted_mismatch` *(not a reference code)* |
//! | 12 | `validBefore <= now + maxTimeoutSeconds + 120` | `invalid_exact_evm_valid_before_beyond_max_timeout` *(not a reference code)* |
//!
//! Step 11 is not in the reference facilitator: the reference *resource server* refuses such a
//! payload before calling verify ("No matching payment requirements", see
//! [`find_matching_requirements`]). It is checked here so that verification alone covers every
//! byte of `accepted`; the reason string is this crate's own.
//!
//! Where the reference goes on chain, this module stops: the asset is a deployed contract
//! (`asset_not_deployed_contract`), balance (`invalid_exact_evm_insufficient_balance`), nonce
//! unused (`invalid_exact_evm_nonce_already_used`) and the `transferWithAuthorization`
//! simulation (`invalid_exact_evm_transaction_simulation_failed`) are for a [`ChainView`]
//! implementation. Contract-wallet signatures (ERC-1271) need the chain too: see
//! [`verify_exact_evm_as`] with [`SignerKind::Contract`]; counterfactual wallets (ERC-6492) are
//! refused as `invalid_exact_evm_signature`.
//!
//! A successful result is therefore *not* a payment: it must not release a paid response.

use std::future::Future;
use std::time::{SystemTime, UNIX_EPOCH};

use alloy_primitives::{Address, B256, U256};

use crate::eip3009::{EcdsaSignature, SignatureError, TokenDomain, TransferWithAuthorization};
use crate::wire::{PaymentPayload, PaymentRequirements, SCHEME_EXACT, VerifyResponse};

/// The `invalidReason` strings, as `@x402/evm` 2.27.0 spells them
/// (`exact/facilitator/errors.ts`), plus the specification's generic codes.
pub mod reasons {
    /// Scheme is not `exact`.
    pub const INVALID_SCHEME: &str = "invalid_exact_evm_scheme";
    /// `accepted.network` differs from the requirements' network.
    pub const NETWORK_MISMATCH: &str = "invalid_exact_evm_network_mismatch";
    /// `extra.name` / `extra.version` missing.
    pub const MISSING_EIP712_DOMAIN: &str = "invalid_exact_evm_missing_eip712_domain";
    /// `authorization.to` is not `payTo`.
    pub const RECIPIENT_MISMATCH: &str = "invalid_exact_evm_recipient_mismatch";
    /// The signature does not recover `authorization.from`.
    pub const INVALID_SIGNATURE: &str = "invalid_exact_evm_signature";
    /// `validBefore` is past (or within the 6 s block-time grace).
    pub const VALID_BEFORE_EXPIRED: &str = "invalid_exact_evm_payload_authorization_valid_before";
    /// `validAfter` is in the future.
    pub const VALID_AFTER_IN_FUTURE: &str = "invalid_exact_evm_payload_authorization_valid_after";
    /// `value` differs from `amount`.
    pub const AUTHORIZATION_VALUE_MISMATCH: &str =
        "invalid_exact_evm_payload_authorization_value_mismatch";
    /// Specification §9: the requirements object is invalid.
    pub const INVALID_PAYMENT_REQUIREMENTS: &str = "invalid_payment_requirements";
    /// Specification §9: the network is not supported.
    pub const INVALID_NETWORK: &str = "invalid_network";
    /// This crate's own: `accepted` differs from the requirements it claims to accept.
    pub const ACCEPTED_MISMATCH: &str = "invalid_exact_evm_accepted_mismatch";
    /// This crate's own: `validBefore` is beyond `now + maxTimeoutSeconds` (+ slack).
    pub const VALID_BEFORE_TOO_FAR: &str = "invalid_exact_evm_valid_before_beyond_max_timeout";
    /// The asset does not answer as an EIP-3009 token (`@x402/evm`'s code).
    pub const EIP3009_NOT_SUPPORTED: &str = "invalid_exact_evm_eip3009_not_supported";
    /// Chain check, not done offline: the payer's balance is below `amount`.
    pub const INSUFFICIENT_BALANCE: &str = "invalid_exact_evm_insufficient_balance";
    /// Chain check, not done offline: the nonce was used.
    pub const NONCE_ALREADY_USED: &str = "invalid_exact_evm_nonce_already_used";
    /// Chain check, not done offline: simulating `transferWithAuthorization` failed.
    pub const SIMULATION_FAILED: &str = "invalid_exact_evm_transaction_simulation_failed";
    /// Chain check: the asset has no code.
    pub const ASSET_NOT_DEPLOYED: &str = "asset_not_deployed_contract";
    /// Settlement: the transaction reverted or could not be sent.
    pub const TRANSACTION_FAILED: &str = "invalid_exact_evm_transaction_failed";
    /// Settlement: the receipt lacks the expected `Transfer(from, to, value)` log.
    pub const TRANSFER_EVENT_MISMATCH: &str = "invalid_exact_evm_transfer_event_mismatch";
    /// Settlement: broadcast, but no receipt yet (not terminal; retry the same payment).
    pub const SETTLEMENT_PENDING: &str = "settlement_pending";
    /// The facilitator could not be reached or answered nonsense (this crate's own).
    pub const FACILITATOR_UNAVAILABLE: &str = "facilitator_unavailable";
    /// Specification §9: the payload could not be decoded.
    pub const INVALID_PAYLOAD: &str = "invalid_payload";
    /// The payment matches none of the route's requirements: the `error` text of the
    /// reference resource server's 402 (`@x402/core` `x402HTTPResourceServer`).
    pub const NO_MATCHING_REQUIREMENTS: &str = "No matching payment requirements";
}

/// Clock skew allowed past `now + maxTimeoutSeconds` for `validBefore` (step 12).
pub const VALID_BEFORE_SLACK_SECONDS: u64 = 120;

/// Seconds of slack the reference requires before `validBefore` (one block).
pub const VALID_BEFORE_GRACE_SECONDS: u64 = 6;

/// Why a payment failed offline verification.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// Step 1.
    #[error("scheme is not exact (accepted {accepted:?}, required {required:?})")]
    InvalidScheme {
        /// `accepted.scheme`.
        accepted: String,
        /// The requirements' scheme.
        required: String,
    },
    /// Step 2.
    #[error("requirements lack the EIP-712 domain name/version in extra")]
    MissingEip712Domain,
    /// Step 3 (and `payTo` at step 7): a requirement field this scheme cannot use.
    #[error("invalid payment requirements: {0}")]
    InvalidRequirements(&'static str),
    /// Step 4.
    #[error("network mismatch: accepted {accepted}, required {required}")]
    NetworkMismatch {
        /// `accepted.network`.
        accepted: String,
        /// The requirements' network.
        required: String,
    },
    /// Step 5.
    #[error("network {0:?} is not eip155:<chain id>")]
    UnsupportedNetwork(String),
    /// Step 6.
    #[error("invalid signature: {0}")]
    InvalidSignature(#[from] SignatureError),
    /// Step 7.
    #[error("authorization.to {to} is not payTo {pay_to}")]
    RecipientMismatch {
        /// `authorization.to`.
        to: Address,
        /// `payTo`.
        pay_to: Address,
    },
    /// Step 8.
    #[error("authorization expired: validBefore {valid_before} < now {now} + 6")]
    ValidBeforeExpired {
        /// `validBefore`.
        valid_before: U256,
        /// Verification time.
        now: u64,
    },
    /// Step 9.
    #[error("authorization not yet valid: validAfter {valid_after} > now {now}")]
    ValidAfterInFuture {
        /// `validAfter`.
        valid_after: U256,
        /// Verification time.
        now: u64,
    },
    /// Step 10.
    #[error("authorization value {value} is not the required amount {amount}")]
    ValueMismatch {
        /// `authorization.value`.
        value: U256,
        /// The required amount.
        amount: U256,
    },
    /// Step 11.
    #[error("accepted.{0} differs from the requirements")]
    AcceptedMismatch(&'static str),
    /// Step 12: `validBefore` is later than `now + maxTimeoutSeconds` (+ slack).
    #[error("authorization valid until {valid_before}, beyond the {latest} the requirements allow")]
    ValidBeforeTooFar {
        /// `validBefore`.
        valid_before: U256,
        /// The latest acceptable.
        latest: U256,
    },
}

impl VerifyError {
    /// The `invalidReason` code for this failure (see [`reasons`]).
    #[must_use]
    pub const fn reason(&self) -> &'static str {
        match self {
            Self::InvalidScheme { .. } => reasons::INVALID_SCHEME,
            Self::MissingEip712Domain => reasons::MISSING_EIP712_DOMAIN,
            Self::InvalidRequirements(_) => reasons::INVALID_PAYMENT_REQUIREMENTS,
            Self::NetworkMismatch { .. } => reasons::NETWORK_MISMATCH,
            Self::UnsupportedNetwork(_) => reasons::INVALID_NETWORK,
            Self::InvalidSignature(_) => reasons::INVALID_SIGNATURE,
            Self::RecipientMismatch { .. } => reasons::RECIPIENT_MISMATCH,
            Self::ValidBeforeExpired { .. } => reasons::VALID_BEFORE_EXPIRED,
            Self::ValidAfterInFuture { .. } => reasons::VALID_AFTER_IN_FUTURE,
            Self::ValueMismatch { .. } => reasons::AUTHORIZATION_VALUE_MISMATCH,
            Self::AcceptedMismatch(_) => reasons::ACCEPTED_MISMATCH,
            Self::ValidBeforeTooFar { .. } => reasons::VALID_BEFORE_TOO_FAR,
        }
    }
}

/// Who signed, as far as offline verification can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayerSignature {
    /// An externally owned account: the signature recovers `authorization.from`.
    Eoa(EcdsaSignature),
    /// A contract wallet (`from` has code): the signature is whatever its ERC-1271
    /// `isValidSignature` accepts. **Not checked offline**: the chain must answer
    /// `0x1626ba7e` before anything is settled (as `LocalFacilitator` does).
    Contract(Vec<u8>),
}

/// How [`verify_exact_evm_as`] treats the signature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignerKind {
    /// ECDSA recovery must give `authorization.from`.
    Eoa,
    /// `authorization.from` is a contract wallet (the caller has seen its code): the signature
    /// is left to ERC-1271 on chain; every other check still runs.
    Contract,
}

/// What offline verification established. Not yet a payment: balance, nonce and simulation
/// are unchecked, and nothing is settled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OfflineVerified {
    /// The signer, equal to `authorization.from`.
    pub payer: Address,
    /// The token domain the signature is over.
    pub domain: TokenDomain,
    /// The signed message.
    pub authorization: TransferWithAuthorization,
    /// The signature: an EOA's (low-`s`; [`EcdsaSignature::v`] gives 27/28 for settlement), or
    /// a contract wallet's bytes, checked on chain (ERC-1271).
    pub signature: PayerSignature,
    /// The EIP-712 digest that was signed.
    pub signing_hash: B256,
}

/// The chain id of a CAIP-2 `eip155:<id>` network (canonical decimal, at most 2^53 - 1 as the
/// reference's `Number.isSafeInteger` allows).
#[must_use]
pub fn eip155_chain_id(network: &str) -> Option<u64> {
    const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;
    let id = network.strip_prefix("eip155:")?;
    let canonical = !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit())
        && (id == "0" || !id.starts_with('0'));
    if !canonical {
        return None;
    }
    id.parse::<u64>().ok().filter(|n| *n <= MAX_SAFE_INTEGER)
}

/// Parses an address in any letter case (as viem's non-strict `getAddress` does).
fn parse_address_any_case(s: &str) -> Option<Address> {
    let body = s.strip_prefix("0x")?;
    if body.len() != 40 || !body.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    body.parse().ok()
}

/// Verifies `payload` against the route's `requirements` at Unix time `now` (seconds),
/// offline. See the module docs for the steps and what is left to the chain.
///
/// # Errors
/// The first failing step, as a [`VerifyError`].
pub fn verify_exact_evm(
    payload: &PaymentPayload,
    requirements: &PaymentRequirements,
    now: u64,
) -> Result<OfflineVerified, VerifyError> {
    verify_exact_evm_as(payload, requirements, now, SignerKind::Eoa)
}

/// [`verify_exact_evm`] for a payer of the given kind. With [`SignerKind::Contract`] the
/// result's signature is [`PayerSignature::Contract`] and must be checked on chain.
///
/// # Errors
/// The first failing step, as a [`VerifyError`].
pub fn verify_exact_evm_as(
    payload: &PaymentPayload,
    requirements: &PaymentRequirements,
    now: u64,
    kind: SignerKind,
) -> Result<OfflineVerified, VerifyError> {
    let accepted = &payload.accepted;
    let auth = &payload.payload.authorization;

    // 1. scheme
    if accepted.scheme != SCHEME_EXACT || requirements.scheme != SCHEME_EXACT {
        return Err(VerifyError::InvalidScheme {
            accepted: accepted.scheme.clone(),
            required: requirements.scheme.clone(),
        });
    }

    // 2. EIP-712 domain name/version
    let (Some(name), Some(version)) = requirements
        .extra
        .as_ref()
        .map_or((None, None), |e| (e.name.as_deref(), e.version.as_deref()))
    else {
        return Err(VerifyError::MissingEip712Domain);
    };
    if name.is_empty() || version.is_empty() {
        return Err(VerifyError::MissingEip712Domain);
    }

    // 3. asset address
    let asset = parse_address_any_case(&requirements.asset).ok_or(
        VerifyError::InvalidRequirements("asset is not an EVM address"),
    )?;

    // 4. network
    if accepted.network != requirements.network {
        return Err(VerifyError::NetworkMismatch {
            accepted: accepted.network.clone(),
            required: requirements.network.clone(),
        });
    }

    // 5. chain id
    let chain_id = eip155_chain_id(&requirements.network)
        .ok_or_else(|| VerifyError::UnsupportedNetwork(requirements.network.clone()))?;

    // 6. signature recovers `from`
    let domain = TokenDomain {
        name: name.to_owned(),
        version: version.to_owned(),
        chain_id,
        verifying_contract: asset,
    };
    let message = TransferWithAuthorization::from(auth);
    let signing_hash = message.signing_hash(&domain);
    let signature = match kind {
        SignerKind::Eoa => {
            let signature = EcdsaSignature::from_bytes(payload.payload.signature.as_slice())?;
            let recovered = signature.recover(&signing_hash)?;
            if recovered != message.from {
                return Err(SignatureError::SignerMismatch {
                    recovered,
                    expected: message.from,
                }
                .into());
            }
            PayerSignature::Eoa(signature)
        }
        SignerKind::Contract => {
            if payload.payload.signature.is_empty() {
                return Err(SignatureError::Length(0).into());
            }
            PayerSignature::Contract(payload.payload.signature.as_slice().to_vec())
        }
    };

    // 7. recipient
    let pay_to = parse_address_any_case(&requirements.pay_to).ok_or(
        VerifyError::InvalidRequirements("payTo is not an EVM address"),
    )?;
    if message.to != pay_to {
        return Err(VerifyError::RecipientMismatch {
            to: message.to,
            pay_to,
        });
    }

    // 8–9. time window
    if message.validBefore < U256::from(now).saturating_add(U256::from(VALID_BEFORE_GRACE_SECONDS))
    {
        return Err(VerifyError::ValidBeforeExpired {
            valid_before: message.validBefore,
            now,
        });
    }
    if message.validAfter > U256::from(now) {
        return Err(VerifyError::ValidAfterInFuture {
            valid_after: message.validAfter,
            now,
        });
    }

    // 10. exact amount
    let amount = requirements.amount.value();
    if message.value != amount {
        return Err(VerifyError::ValueMismatch {
            value: message.value,
            amount,
        });
    }

    // 11. `accepted` is the requirements (asset first, as the issue lists it)
    if let Some(field) = accepted_mismatch(accepted, requirements) {
        return Err(VerifyError::AcceptedMismatch(field));
    }

    // 12. the authorization does not outlive what was asked (this crate's own): a payment is
    // a bearer instrument until `validBefore`, and served-once records must outlive it.
    let latest = U256::from(now)
        .saturating_add(U256::from(requirements.max_timeout_seconds))
        .saturating_add(U256::from(VALID_BEFORE_SLACK_SECONDS));
    if message.validBefore > latest {
        return Err(VerifyError::ValidBeforeTooFar {
            valid_before: message.validBefore,
            latest,
        });
    }

    Ok(OfflineVerified {
        payer: message.from,
        domain,
        authorization: message,
        signature,
        signing_hash,
    })
}

/// [`verify_exact_evm`] at the current system time.
///
/// # Errors
/// As [`verify_exact_evm`].
pub fn verify_exact_evm_now(
    payload: &PaymentPayload,
    requirements: &PaymentRequirements,
) -> Result<OfflineVerified, VerifyError> {
    verify_exact_evm(payload, requirements, unix_now())
}

/// The offline checks a server runs **before** it records anything for a payment (its
/// served-once reservation): every [`verify_exact_evm`] step whose verdict is final. Two are
/// left to the facilitator, which has the chain and the settlement records: a signature that
/// does not recover `from` (`from` may be a contract wallet, ERC-1271) and an expired window
/// (a settlement recorded before expiry still decides).
///
/// # Errors
/// The first failing final step.
pub fn precheck(
    payload: &PaymentPayload,
    requirements: &PaymentRequirements,
    now: u64,
) -> Result<(), VerifyError> {
    match verify_exact_evm(payload, requirements, now) {
        Ok(_) | Err(VerifyError::InvalidSignature(_) | VerifyError::ValidBeforeExpired { .. }) => {
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// The wall clock in Unix seconds, the time EIP-3009 windows are written in (a clock before
/// 1970 reads as 0, which no window accepts).
#[must_use]
pub fn unix_now() -> u64 {
    unix_secs_of(SystemTime::now())
}

/// An injected clock's instant as Unix seconds (0 before the epoch): what the rail's payer and
/// receiver compare validity windows with, so a test clock moves them too.
#[must_use]
pub fn unix_secs(t: rail_core::Timestamp) -> u64 {
    u64::try_from(t.0 / 1000).unwrap_or(0)
}

fn unix_secs_of(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The first field of `accepted` that does not match `required`: core fields must be equal as
/// sent (strings compared exactly, as the reference compares them), and every member of the
/// required `extra` must be in `accepted.extra` unchanged.
fn accepted_mismatch(
    accepted: &PaymentRequirements,
    required: &PaymentRequirements,
) -> Option<&'static str> {
    let extra_ok = match (&required.extra, &accepted.extra) {
        (None, _) => true,
        (Some(r), Some(a)) => r.is_subset_of(a),
        (Some(_), None) => false,
    };
    [
        ("asset", accepted.asset == required.asset),
        ("scheme", accepted.scheme == required.scheme),
        ("network", accepted.network == required.network),
        ("amount", accepted.amount == required.amount),
        ("payTo", accepted.pay_to == required.pay_to),
        (
            "maxTimeoutSeconds",
            accepted.max_timeout_seconds == required.max_timeout_seconds,
        ),
        ("extra", extra_ok),
    ]
    .into_iter()
    .find_map(|(field, ok)| (!ok).then_some(field))
}

/// The advertised requirements a v2 payload accepted, as the reference resource server finds
/// them (`findMatchingRequirements`): all core fields equal, the advertised `extra` a subset
/// of `accepted.extra`. `None` is the reference's "No matching payment requirements".
#[must_use]
pub fn find_matching_requirements<'a>(
    advertised: &'a [PaymentRequirements],
    payload: &PaymentPayload,
) -> Option<&'a PaymentRequirements> {
    advertised
        .iter()
        .find(|r| accepted_mismatch(&payload.accepted, r).is_none())
}

/// The facilitator-style answer for a verification result: `payer` is `authorization.from`
/// as sent, on failure too, as the reference reports it.
#[must_use]
pub fn verify_response(
    payload: &PaymentPayload,
    result: &Result<OfflineVerified, VerifyError>,
) -> VerifyResponse {
    let payer = Some(payload.payload.authorization.from.to_string());
    match result {
        Ok(_) => VerifyResponse {
            is_valid: true,
            invalid_reason: None,
            invalid_message: None,
            payer,
        },
        Err(e) => VerifyResponse {
            is_valid: false,
            invalid_reason: Some(e.reason().to_owned()),
            invalid_message: Some(e.to_string()),
            payer,
        },
    }
}

/// Read access to the chain for the checks offline verification cannot make.
///
/// **Not implemented against any chain in this crate yet.** After [`verify_exact_evm`], a
/// receiver must still learn, for the token at `asset`:
/// - `balance_of(asset, payer) >= amount`, else `invalid_exact_evm_insufficient_balance`;
/// - `authorization_state(asset, payer, nonce) == false` (nonce unused), else
///   `invalid_exact_evm_nonce_already_used`;
///
/// and then simulate `transferWithAuthorization` before settling. An RPC implementation
/// (alloy provider, later) and a mock for tests will implement it.
pub trait ChainView {
    /// The implementation's error (RPC, decoding…).
    type Error: std::error::Error + Send + Sync + 'static;

    /// ERC-20 `balanceOf(owner)` on `asset`.
    fn balance_of(
        &self,
        asset: Address,
        owner: Address,
    ) -> impl Future<Output = Result<U256, Self::Error>> + Send;

    /// EIP-3009 `authorizationState(authorizer, nonce)` on `asset`: `true` if used or canceled.
    fn authorization_state(
        &self,
        asset: Address,
        authorizer: Address,
        nonce: B256,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::SPEC_PAYMENT_SIGNATURE;

    const NOW: u64 = 1_740_672_100;

    fn spec() -> (PaymentPayload, PaymentRequirements) {
        let p = PaymentPayload::from_header(SPEC_PAYMENT_SIGNATURE).unwrap();
        let r = p.accepted.clone();
        (p, r)
    }

    #[test]
    fn spec_example_verifies_offline() {
        let (p, r) = spec();
        let ok = verify_exact_evm(&p, &r, NOW).unwrap();
        assert_eq!(
            ok.payer.to_checksum(None),
            "0x857b06519E91e3A54538791bDbb0E22373e36b66"
        );
        assert!(matches!(&ok.signature, PayerSignature::Eoa(s) if s.v() == 28));
        let resp = verify_response(&p, &Ok(ok));
        assert_eq!(
            serde_json::to_string(&resp).unwrap(),
            r#"{"isValid":true,"payer":"0x857b06519E91e3A54538791bDbb0E22373e36b66"}"#
        );
    }

    #[test]
    fn time_window_edges() {
        let (p, r) = spec();
        // validAfter 1740672089, validBefore 1740672154.
        assert!(verify_exact_evm(&p, &r, 1_740_672_089).is_ok());
        assert_eq!(
            verify_exact_evm(&p, &r, 1_740_672_088)
                .unwrap_err()
                .reason(),
            reasons::VALID_AFTER_IN_FUTURE
        );
        assert!(verify_exact_evm(&p, &r, 1_740_672_148).is_ok());
        assert_eq!(
            verify_exact_evm(&p, &r, 1_740_672_149)
                .unwrap_err()
                .reason(),
            reasons::VALID_BEFORE_EXPIRED
        );
        assert_eq!(
            verify_exact_evm(&p, &r, u64::MAX).unwrap_err().reason(),
            reasons::VALID_BEFORE_EXPIRED
        );
    }

    #[test]
    fn chain_ids() {
        assert_eq!(eip155_chain_id("eip155:84532"), Some(84_532));
        assert_eq!(eip155_chain_id("eip155:0"), Some(0));
        for bad in [
            "eip155:",
            "eip155:084532",
            "eip155:+1",
            "eip155:9007199254740992",
            "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
            "base-sepolia",
        ] {
            assert_eq!(eip155_chain_id(bad), None, "{bad}");
        }
        assert_eq!(
            eip155_chain_id("eip155:9007199254740991"),
            Some(9_007_199_254_740_991)
        );
    }

    #[test]
    fn matching_requirements_like_the_reference_server() {
        let (p, r) = spec();
        let mut other = r.clone();
        other.amount = 1u64.into();
        let advertised = [other, r.clone()];
        assert_eq!(find_matching_requirements(&advertised, &p), Some(&r));
        let mut lowercase_asset = r;
        lowercase_asset.asset = lowercase_asset.asset.to_ascii_lowercase();
        assert_eq!(find_matching_requirements(&[lowercase_asset], &p), None);
    }
}
