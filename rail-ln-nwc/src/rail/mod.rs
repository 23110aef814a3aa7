//! The Lightning rail over NWC.
//!
//! - **Receiver** ([`NwcReceiver`]): `offer` makes an invoice (`make_invoice`), or for a hold a
//!   hold invoice (`make_hold_invoice`) for a payment hash whose preimage the receiver derives
//!   from its own secret and the offer id (nothing to store, nothing lost in a crash). `verify`
//!   accepts a payment only with a preimage whose SHA-256 is the invoice's payment hash (compared
//!   in constant time) and cross-checks `lookup_invoice` (state and amount): a wallet saying
//!   "settled" is never enough. A hold is verified when the receiver's wallet reports it
//!   `accepted` for the offer's amount. `capture` = `settle_hold_invoice` (the whole amount:
//!   Lightning cannot capture part of an HTLC), `void` = `cancel_hold_invoice`. Single use per
//!   payment hash.
//! - **Payer** ([`NwcPayer`]): before paying, parses and checks the BOLT11 invoice with
//!   `lightning-invoice` (signature, network, amount equal to the offer, not expired, payee =
//!   the offer's node, payment hash = the offer's), then `pay_invoice`, and checks the returned
//!   preimage against the payment hash before producing the payment.
//!
//! Amounts are msat: the rail's asset is BTC at scale 11, converted exactly.

// One file a side; this one keeps what both use (the offer and proof types, the error
// mapping, msat amounts, the preimage check).
mod payer; // NwcPayer: checks the invoice, pays it, checks the preimage
mod receiver; // NwcReceiver: offer, verify, expired holds' release, capture, void

use rail_core::{Asset, Capabilities, Finality, Money, RailError, RailReason, RailResult};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::client::NwcError;
use crate::nip47::ErrorCode;

pub use payer::NwcPayer;
pub use receiver::{HOLD_MARK_MARGIN, MARK_MARGIN, NwcReceiver};

/// The rail's name.
pub const RAIL: &str = "ln-nwc";

/// What an offer carries for the payer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfferDetails {
    /// The BOLT11 invoice.
    pub invoice: String,
    /// Its payment hash (hex).
    pub payment_hash: String,
}

/// A payment's proof.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NwcProof {
    /// The payment hash (hex).
    pub payment_hash: String,
    /// The preimage (hex); absent for a hold (the payer learns it when the receiver settles).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preimage: Option<String>,
}

fn capabilities() -> Capabilities {
    Capabilities {
        pay: true,
        pay_effect: rail_core::PayEffect::Moves,
        hold: true,
        // Settling an HTLC takes all of it.
        partial_capture: false,
        // A refund needs an invoice from the payer: not part of this rail.
        refund: false,
        partial_refund: false,
        finality: Finality::Immediate,
        assets: vec![Asset::btc()],
    }
}

/// The NWC error as a rail-core error (the NIP-47 code is kept).
#[must_use]
pub fn rail_error(e: &NwcError) -> RailError {
    match e {
        NwcError::Wallet { code, message } => {
            let reason = RailReason::new(code.as_str(), message.clone());
            match code {
                ErrorCode::InsufficientBalance | ErrorCode::QuotaExceeded => {
                    RailError::InsufficientFunds(format!("{code}: {message}"))
                }
                ErrorCode::NotFound => RailError::NotFound(format!("{code}: {message}")),
                ErrorCode::PaymentFailed => RailError::Declined(reason),
                ErrorCode::RateLimited | ErrorCode::Internal => RailError::Unavailable(reason),
                _ => RailError::Rail {
                    reason,
                    retryable: false,
                },
            }
        }
        other => RailError::Unavailable(RailReason::new("nwc", other.to_string())),
    }
}

/// 21 million BTC in msat: no amount can be more.
pub const MAX_MSAT: u64 = 21_000_000 * 100_000_000 * 1_000;

fn msat(m: &Money) -> RailResult<u64> {
    if m.asset() != &Asset::btc() {
        return Err(RailError::InvalidInput(format!(
            "asset {} is not carried by Lightning (BTC in msat)",
            m.asset()
        )));
    }
    let n = u64::try_from(m.minor_units())
        .map_err(|_| RailError::InvalidInput(format!("{m} does not fit in msat")))?;
    if n > MAX_MSAT {
        return Err(RailError::InvalidInput(format!(
            "{m} is more than the bitcoin supply"
        )));
    }
    Ok(n)
}

/// Whether `preimage_hex` hashes to `hash_hex` (constant time on the digests).
#[must_use]
pub fn preimage_matches(preimage_hex: &str, hash_hex: &str) -> bool {
    let (Ok(p), Ok(h)) = (hex::decode(preimage_hex), hex::decode(hash_hex)) else {
        return false;
    };
    p.len() == 32 && h.len() == 32 && bool::from(Sha256::digest(&p).as_slice().ct_eq(&h))
}
