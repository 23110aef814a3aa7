//! A tab's durable record at the receiver: one record per tab (namespace
//! `stipendex/<who>/tabs`, as the receiver's other records, keyed by the tab's id) holding the tab, its hold, every lane's
//! last voucher and Merkle state, and — once closed — its Receipt. Each accepted voucher is one
//! compare-and-set of the record (its token changes with every write), so instances sharing the
//! store never both accept a sequence number; answers ride on the next write ([`Slot`]).
//!
//! O(lanes) whatever the number of calls: a lane keeps its last voucher, its last answer and its
//! [`CallTree`]'s O(log n) stack.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rail_core::keys::Write;
use rail_core::{Amount, KeyStore, RailError, Verified};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::envelope::{CallTree, Proof, PublicKey, Signed, Tab};
use crate::receiver::Answer;

/// The state name of an open tab's record.
const OPEN: &str = "tab-open";
/// The state name of a closed tab's record.
const CLOSED: &str = "tab-closed";

/// One lane of a tab.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Lane {
    /// Its last sequence number (0: no call yet).
    pub seq: u64,
    /// Its cumulative after the last voucher.
    pub cumulative: Amount,
    /// The last voucher (compact JWS).
    pub voucher: Option<String>,
    /// When the last voucher was accepted (the store's Unix seconds).
    pub accepted_at: u64,
    /// Whether the last voucher's call was answered (its leaf is in `tree`).
    pub answered: bool,
    /// The last call's answer, kept for the same voucher again.
    pub answer: Option<Answer>,
    /// The lane's calls so far.
    pub tree: CallTree,
}

impl Default for Lane {
    fn default() -> Self {
        Lane {
            seq: 0,
            cumulative: Amount::ZERO,
            voucher: None,
            accepted_at: 0,
            answered: false,
            answer: None,
            tree: CallTree::new(),
        }
    }
}

/// What the receiver keeps of a tab.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TabRecord {
    /// The tab (compact JWS).
    pub tab: String,
    /// The hold's Proof (compact JWS).
    pub proof: String,
    /// The receiver's rail (its name) holding the cap.
    pub rail: String,
    /// The rail's verdict on the hold.
    pub verified: Verified,
    /// No voucher is accepted at or after this (Unix seconds): the earlier of the tab's end
    /// and the hold's lapse less the capture margin.
    pub end: u64,
    /// The lanes, by number.
    pub lanes: Vec<Lane>,
    /// The sum of the lanes' cumulatives.
    pub total: Amount,
    /// Vouchers refused as equivocation (compact JWS), kept as evidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// The closing Receipt (compact JWS), once closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<String>,
}

/// A record as this instance last read or wrote it, with the answers given since, which the
/// next write carries (a lost one only costs the kept answer: the call was paid by its voucher).
#[derive(Debug)]
pub(crate) struct Slot {
    /// The tab (its signature checked when the record was read).
    pub tab: Signed<Tab>,
    /// The key of the wallet that opened it (its hold Proof's).
    pub wallet: PublicKey,
    /// The record's token in the store.
    pub token: i64,
    /// The record (answers given since the last write included).
    pub rec: TabRecord,
    /// Answers given since the last write: (lane, seq, answer, result digest).
    pub unwritten: Vec<(u16, u64, Answer, crate::envelope::Digest)>,
    /// Calls this instance is serving now: (lane, seq).
    pub serving: HashSet<(u16, u64)>,
}

/// The receiver's tab records and this instance's cache of them.
#[derive(Debug)]
pub(crate) struct Records {
    store: Arc<dyn KeyStore>,
    ns: String,
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Option<Slot>>>>>,
}

fn storage(e: RailError) -> Error {
    match e {
        RailError::Storage(s) => Error::Storage(s),
        e => Error::Payment(e),
    }
}

fn decode(value: Option<&str>) -> Result<TabRecord, Error> {
    serde_json::from_str(value.unwrap_or("null"))
        .map_err(|e| Error::Storage(format!("a tab record cannot be read: {e}")))
}

impl Slot {
    /// A slot for `rec` at `token`. The record was written by this receiver after checking its
    /// objects; their signatures are checked again here (a store is not trusted blindly), once
    /// per read, not per call.
    fn new(token: i64, rec: TabRecord) -> Result<Self, Error> {
        let tab = Signed::<Tab>::parse(&rec.tab)?;
        let wallet = Signed::<Proof>::parse(&rec.proof)?.object().wallet;
        Ok(Slot {
            tab,
            wallet,
            token,
            rec,
            unwritten: Vec::new(),
            serving: HashSet::new(),
        })
    }
}

/// How long a record is kept after its tab closed (the wallet may ask for its Receipt again).
pub(crate) const KEEP_CLOSED: Duration = Duration::from_secs(7 * 24 * 3600);

impl Records {
    pub(crate) fn new(store: Arc<dyn KeyStore>, receiver: &str) -> Self {
        Records {
            store,
            ns: format!("stipendex/{}/tabs", crate::receiver::answers::who(receiver)),
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The cache slot of tab `id` (locked by its user for the whole read-check-write).
    pub(crate) fn slot(&self, id: &str) -> Arc<tokio::sync::Mutex<Option<Slot>>> {
        let mut m = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.entry(id.to_owned()).or_default().clone()
    }

    /// Forgets the cache of tab `id` (closed).
    pub(crate) fn forget(&self, id: &str) {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(id);
    }

    /// The ids of the tabs this instance has cached (to close the due ones).
    pub(crate) fn cached(&self) -> Vec<String> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// Reads tab `id` from the store into a fresh slot; `None` if there is no such record.
    pub(crate) async fn load(&self, id: &str) -> Result<Option<Slot>, Error> {
        let Some(seen) = self.store.get(&self.ns, id).await.map_err(storage)? else {
            return Ok(None);
        };
        Slot::new(seen.record.token, decode(seen.record.value.as_deref())?).map(Some)
    }

    /// Creates tab `id`'s record: `Ok(slot)` when created, `Err(slot)` with the record already
    /// there.
    pub(crate) async fn create(
        &self,
        id: &str,
        rec: &TabRecord,
    ) -> Result<Result<Slot, Slot>, Error> {
        let token = rand::random::<i64>();
        let w = write(token, rec, None)?;
        match self
            .store
            .insert_if_absent(&self.ns, id, &w)
            .await
            .map_err(storage)?
        {
            None => Ok(Ok(Slot::new(token, rec.clone())?)),
            Some(seen) => Ok(Err(Slot::new(
                seen.record.token,
                decode(seen.record.value.as_deref())?,
            )?)),
        }
    }

    /// Writes `rec` over the slot's record if the store still holds the version the slot read
    /// (compare-and-set); `false` if another instance wrote since (reload, check again).
    pub(crate) async fn put(
        &self,
        id: &str,
        slot: &mut Slot,
        rec: TabRecord,
    ) -> Result<bool, Error> {
        let token = rand::random::<i64>();
        let retain = rec.closed.as_ref().map(|_| KEEP_CLOSED);
        let w = write(token, &rec, retain)?;
        if self
            .store
            .replace(&self.ns, id, slot.token, &w)
            .await
            .map_err(storage)?
        {
            slot.token = token;
            slot.rec = rec;
            slot.unwritten.clear();
            Ok(true)
        } else {
            Ok(false)
        }
    }
}

fn write(token: i64, rec: &TabRecord, retain: Option<Duration>) -> Result<Write, Error> {
    let value = serde_json::to_string(rec)
        .map_err(|e| Error::Storage(format!("a tab record cannot be written: {e}")))?;
    let state = if rec.closed.is_some() { CLOSED } else { OPEN };
    Ok(Write {
        token,
        state: state.to_owned(),
        fingerprint: Vec::new(),
        value: Some(value),
        // An open tab's record has no retention: time alone never frees it (its hold does not
        // vanish either); a closed one is kept a week for its Receipt.
        retain,
        lease: None,
    })
}
