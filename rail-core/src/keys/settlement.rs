//! The typed write-ahead settlement record: before a settler sends anything that moves money
//! it records what it is about to send and that thing's id on the rail (a transaction hash, an
//! intent id, a payment hash); after the rail answers it records the outcome. A settler that
//! finds a record never sends a second thing for the same key: it follows the recorded one.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{RailError, RailResult};

use super::guard::{Claim, ReplayGuard, Reservation};
use super::store::{KeyRecord, KeyStore};

/// Where a settlement stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettlementState {
    /// Written ahead: about to be sent, or sent with its answer not yet seen.
    Submitted,
    /// The rail confirmed it.
    Settled,
}

impl SettlementState {
    fn name(self) -> &'static str {
        match self {
            SettlementState::Submitted => "submitted",
            SettlementState::Settled => "settled",
        }
    }
}

/// One settlement: what was sent (`sent`, the rail's own data) and its id on the rail.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settlement<T> {
    /// Where it stands.
    pub state: SettlementState,
    /// Its id on the rail (transaction hash, intent id, payment hash).
    pub rail_id: String,
    /// What was sent (or what it paid for), as the rail needs it to follow up.
    pub sent: T,
}

/// Write-ahead settlement records in one namespace, shareable across instances (PostgreSQL).
#[derive(Debug)]
pub struct SettlementBook<T> {
    guard: ReplayGuard,
    lease: Duration,
    retain: Duration,
    _t: PhantomData<fn() -> T>,
}

impl<T> Clone for SettlementBook<T> {
    fn clone(&self) -> Self {
        SettlementBook {
            guard: self.guard.clone(),
            lease: self.lease,
            retain: self.retain,
            _t: PhantomData,
        }
    }
}

/// What [`SettlementBook::open`] found for a key.
#[derive(Debug)]
#[must_use = "a settlement must be followed up"]
pub enum Opened<T> {
    /// Nobody settled this key: write ahead ([`Settling::submitting`]), then send.
    Fresh(Settling<T>),
    /// A settler died mid-way; this caller now holds the key. `previous` is what it wrote ahead
    /// (`None`: it wrote nothing, so it sent nothing): follow that on the rail before acting.
    Recover(Settling<T>, Option<Settlement<T>>),
    /// A live settler is on it.
    InFlight {
        /// What it wrote ahead, if anything yet.
        settlement: Option<Settlement<T>>,
        /// When its lease runs out unless renewed.
        retry_after: Duration,
    },
    /// Settled.
    Settled(Settlement<T>),
    /// Held or settled for other content ([`SettlementBook::open_as`]): nothing was taken over.
    Conflict,
}

/// A settlement held by this caller.
#[derive(Debug)]
#[must_use = "a settlement must end as settled, failed or unknown"]
pub struct Settling<T> {
    reservation: Reservation,
    retain: Duration,
    _t: PhantomData<fn() -> T>,
}

fn decode<T: DeserializeOwned>(rec: &KeyRecord) -> RailResult<Option<Settlement<T>>> {
    rec.value
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| RailError::Storage(format!("settlement record: {e}")))
}

fn encode<T: Serialize>(s: &Settlement<T>) -> RailResult<String> {
    serde_json::to_string(s).map_err(|e| RailError::Storage(format!("settlement record: {e}")))
}

impl<T: Serialize + DeserializeOwned> SettlementBook<T> {
    /// A book in namespace `ns` of `store`: a settler's lease is 60 s (renewed while it works),
    /// a settled record is kept for `retain` — longer than the paid-for thing can be presented.
    pub fn new(store: Arc<dyn KeyStore>, ns: impl Into<String>, retain: Duration) -> Self {
        SettlementBook {
            guard: ReplayGuard::new(store, ns),
            lease: Duration::from_secs(60),
            retain,
            _t: PhantomData,
        }
    }

    /// Sets the settler's lease.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Opens the record of `key`.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn open(&self, key: &str) -> RailResult<Opened<T>> {
        self.open_as(key, Vec::new()).await
    }

    /// As [`SettlementBook::open`], for content with digest `fingerprint` (what the settlement
    /// is for): a record for other content is [`Opened::Conflict`], never taken over.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn open_as(&self, key: &str, fingerprint: Vec<u8>) -> RailResult<Opened<T>> {
        let settling = |reservation| Settling {
            reservation,
            retain: self.retain,
            _t: PhantomData,
        };
        Ok(
            match self.guard.claim_as(key, self.lease, fingerprint).await? {
                Claim::Fresh(r) => Opened::Fresh(settling(r)),
                Claim::Recover {
                    reservation,
                    previous,
                } => Opened::Recover(settling(reservation), decode(&previous)?),
                Claim::Busy { retry_after, .. } => {
                    let settlement = match self.guard.seen(key).await? {
                        Some(seen) => decode(&seen.record)?,
                        None => None,
                    };
                    Opened::InFlight {
                        settlement,
                        retry_after,
                    }
                }
                Claim::Conflict(_) => Opened::Conflict,
                Claim::Finished(rec) => match decode(&rec)? {
                    Some(s) => Opened::Settled(s),
                    None => {
                        return Err(RailError::Storage(format!(
                            "settlement {key} finished without a record"
                        )));
                    }
                },
            },
        )
    }

    /// The record of `key`, if any (read only).
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn get(&self, key: &str) -> RailResult<Option<Settlement<T>>> {
        match self.guard.seen(key).await? {
            Some(seen) => decode(&seen.record),
            None => Ok(None),
        }
    }
}

impl<T: Serialize> Settling<T> {
    /// Writes ahead what is about to be sent: call it **before** sending. From here on a
    /// recoverer follows `rail_id` instead of sending anything else.
    ///
    /// # Errors
    /// [`RailError::Replayed`] if the key was lost to a recoverer (do not send);
    /// [`RailError::Storage`] (do not send).
    pub async fn submitting(&self, rail_id: &str, sent: T) -> RailResult<()> {
        let s = Settlement {
            state: SettlementState::Submitted,
            rail_id: rail_id.to_owned(),
            sent,
        };
        self.reservation
            .advance(SettlementState::Submitted.name(), Some(encode(&s)?))
            .await
    }

    /// Runs `work` (the send, the receipt wait) while keeping the key's lease alive.
    pub async fn keep_alive<F: std::future::Future>(&self, work: F) -> F::Output {
        self.reservation.keep_alive(work).await
    }

    /// The rail confirmed `rail_id`: the key is settled, kept for the book's retention.
    ///
    /// # Errors
    /// [`RailError::Storage`]; [`RailError::Replayed`] if the key was lost to a recoverer.
    pub async fn settled(self, rail_id: &str, sent: T) -> RailResult<()> {
        let s = Settlement {
            state: SettlementState::Settled,
            rail_id: rail_id.to_owned(),
            sent,
        };
        self.reservation
            .finish_with(
                SettlementState::Settled.name(),
                Some(encode(&s)?),
                Some(self.retain),
            )
            .await
    }

    /// Nothing was sent, or the rail refused it for certain: the key is free again.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn failed(self) -> RailResult<()> {
        self.reservation.release().await
    }

    /// The outcome is unknown (sent, no answer): the record stays, and the next opener
    /// recovers by following what was written ahead.
    ///
    /// # Errors
    /// [`RailError::Storage`] (the lease then lapses by itself).
    pub async fn unknown(self) -> RailResult<()> {
        self.reservation.hand_over().await
    }
}
