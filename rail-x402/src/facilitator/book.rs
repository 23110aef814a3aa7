//! The write-ahead [`X402SettlementBook`]: one record per authorization, the signed transaction
//! written before it is broadcast, so no two settlers send a transaction for the same one.

use std::sync::Arc;
use std::time::Duration;

use alloy_primitives::{Address, B256};
use rail_core::RailError;
use rail_core::keys::KeyStore;
use serde::{Deserialize, Serialize};

use super::FacilitatorError;

/// A settler's lease on an authorization (renewed while it sends and waits for the receipt).
pub const SETTLE_LEASE: Duration = Duration::from_secs(90);
/// How long a settled authorization is remembered: longer than any validity window we accept.
pub const SETTLED_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

/// The write-ahead settlement record, one per `(chain, token, authorizer, nonce)`, on
/// rail-core's typed [`rail_core::SettlementBook`] (so settlers sharing PostgreSQL agree): the
/// signed transaction (its hash and raw bytes) is written **before** it is broadcast, and the
/// record is settled after its receipt. A settler that finds a record never broadcasts a second
/// transaction for the same authorization: it follows the recorded one. A record in flight
/// never lapses by time: a settler that died is recovered by the next one, which follows what
/// it wrote ahead.
#[derive(Clone, Debug)]
pub struct X402SettlementBook {
    book: rail_core::SettlementBook<Sent>,
}

/// What a settler wrote ahead: the signed transaction and its account nonce, so a recoverer
/// can send the very same transaction again, or know it can never be mined.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Sent {
    /// The raw signed transaction, hex.
    pub(super) raw: String,
    /// Its nonce on the settling account.
    pub(super) nonce: u64,
}

/// A settlement held by this settler.
pub(super) type Settling = rail_core::keys::Settling<Sent>;

/// What the book says about an authorization.
#[derive(Debug)]
pub(super) enum Entry {
    /// Nobody is on it: this caller owns it (write the tx ahead, then send).
    Fresh(Settling),
    /// A transaction was written ahead (maybe sent, maybe not) by a live settler.
    Submitted(B256),
    /// A settler died after writing this transaction ahead; this caller follows it.
    Recover(Settling, B256, Sent),
    /// Settled by this transaction.
    Settled(B256),
    /// Held, no transaction written yet (a settler is verifying).
    Busy,
}

fn tx_hash(rail_id: &str) -> Result<B256, FacilitatorError> {
    rail_id
        .parse()
        .map_err(|_| FacilitatorError::Store(format!("settlement record names {rail_id:?}")))
}

fn store_err(e: &RailError) -> FacilitatorError {
    FacilitatorError::Store(e.to_string())
}

impl X402SettlementBook {
    /// A book in `store`.
    pub fn new(store: Arc<dyn KeyStore>) -> Self {
        Self {
            book: rail_core::SettlementBook::new(store, "x402/settlement", SETTLED_RETENTION)
                .with_lease(SETTLE_LEASE),
        }
    }

    pub(super) fn key(chain_id: u64, token: Address, from: Address, nonce: B256) -> String {
        format!("{chain_id}:{token:#x}:{from:#x}:{nonce:#x}")
    }

    pub(super) async fn open(&self, key: &str) -> Result<Entry, FacilitatorError> {
        use rail_core::keys::Opened;
        Ok(
            match self.book.open(key).await.map_err(|e| store_err(&e))? {
                Opened::Fresh(s) | Opened::Recover(s, None) => Entry::Fresh(s),
                Opened::Recover(s, Some(previous)) => {
                    Entry::Recover(s, tx_hash(&previous.rail_id)?, previous.sent)
                }
                Opened::InFlight {
                    settlement: Some(s),
                    ..
                } => Entry::Submitted(tx_hash(&s.rail_id)?),
                Opened::Settled(s) => Entry::Settled(tx_hash(&s.rail_id)?),
                // Nothing written ahead yet by a live settler (a conflict is not produced: this
                // book opens without a fingerprint).
                Opened::InFlight {
                    settlement: None, ..
                }
                | Opened::Conflict => Entry::Busy,
            },
        )
    }

    /// The transaction recorded for `key` (written ahead or settled), if any.
    pub(super) async fn recorded(&self, key: &str) -> Result<Option<B256>, FacilitatorError> {
        match self.book.get(key).await.map_err(|e| store_err(&e))? {
            Some(s) => tx_hash(&s.rail_id).map(Some),
            None => Ok(None),
        }
    }
}
