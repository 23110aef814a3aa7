//! A tab's durable records at the receiver (namespace `stipendex/<who>/tabs`, as the receiver's
//! other records): its head (`<id>/head`: the hold's Proof, which carries the tab, the rail's
//! verdict, the end), written once, and its record (`<id>`: every lane's last voucher by
//! digest, its kept answer and its Merkle state, the total, and — once closed — the Receipt),
//! written per voucher and small. O(lanes) whatever the number of calls.
//!
//! **Group commit per tab.** Vouchers are checked and applied to this instance's copy of the
//! record under a short lock ([`Entry::state`]); making them durable is one compare-and-set of
//! the whole record (its token changes with every write) by whichever caller holds the tab's
//! writer lock ([`Entry::writer`]), and that write covers every voucher applied before it — so
//! the lanes of one tab share writes, as the key store's own group commit makes different tabs
//! share commits. A write that fails (another instance wrote the tab, or the store failed)
//! drops this instance's copy and bumps the tab's generation: every voucher not yet durable is
//! answered retryable, and is checked again against the record as read afresh. Answers ride on
//! the next write (losing one costs the kept answer, never money: the call was paid by its
//! voucher).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rail_core::keys::Write;
use rail_core::{Amount, KeyStore, RailError, Verified};
use serde::{Deserialize, Serialize};

use crate::Error;
use crate::envelope::{CallTree, Digest, Proof, PublicKey, Signed, Tab};
use crate::receiver::Answer;

/// The state name of an open tab's record.
const OPEN: &str = "tab-open";
/// The state name of a closed tab's record.
const CLOSED: &str = "tab-closed";

/// One lane of a tab.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct Lane {
    /// Its last sequence number (0: no call yet).
    pub seq: u64,
    /// Its cumulative after the last voucher.
    pub cumulative: Amount,
    /// The last voucher, by digest.
    pub voucher: Option<Digest>,
    /// When the last voucher was accepted (Unix seconds).
    pub accepted_at: u64,
    /// Whether the last voucher's call was answered (its leaf is in `tree`).
    pub answered: bool,
    /// The last call's answer, kept for the same voucher again.
    pub answer: Option<Answer>,
    /// The lane's calls so far.
    pub tree: CallTree,
}

/// What never changes once a tab is open (key `<id>/head`, written once: the record written
/// per voucher stays small).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct TabHead {
    /// The hold's Proof (compact JWS; it carries the tab).
    pub proof: String,
    /// The receiver's rail (its name) holding the cap.
    pub rail: String,
    /// The rail's verdict on the hold.
    pub verified: Verified,
    /// No voucher is accepted at or after this (Unix seconds): the earlier of the tab's end
    /// and the hold's lapse less the capture margin.
    pub end: u64,
}

/// What changes with the calls (key `<id>`, one compare-and-set per write).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct TabRecord {
    /// The lanes, by number.
    pub lanes: Vec<Lane>,
    /// The sum of the lanes' cumulatives.
    pub total: Amount,
    /// Being closed: no voucher is accepted (set, durably, before the capture, so the total
    /// captured is final).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closing: bool,
    /// Vouchers refused as equivocation (compact JWS), kept as evidence.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
    /// The closing Receipt (compact JWS), once closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closed: Option<String>,
}

/// This instance's copy of a tab's record.
#[derive(Debug)]
pub(crate) struct Slot {
    /// What never changes.
    pub head: TabHead,
    /// The tab (its signature checked when the record was read).
    pub tab: Signed<Tab>,
    /// The key of the wallet that opened it (its hold Proof's).
    pub wallet: PublicKey,
    /// The record's token in the store (the version last written or read).
    pub token: i64,
    /// The record, with every voucher applied (durable or not) and the answers given.
    pub rec: TabRecord,
    /// Bumped by every change that must be written before it is relied on (a voucher).
    pub version: u64,
    /// The version the store holds.
    pub durable: u64,
    /// Answers were recorded since the last write.
    pub dirty: bool,
    /// Calls this instance is serving now: (lane, seq).
    pub serving: HashSet<(u16, u64)>,
}

impl Slot {
    /// A slot for `rec` at `token`. The record was written by this receiver after checking its
    /// objects; their signatures are checked again here (a store is not trusted blindly), once
    /// per read, not per call.
    fn new(head: TabHead, token: i64, rec: TabRecord) -> Result<Self, Error> {
        let proof = Signed::<Proof>::parse(&head.proof)?;
        let wallet = proof.object().wallet;
        let Some(tab_jws) = &proof.object().tab_jws else {
            return Err(Error::Storage(
                "a tab's record holds a proof of no tab".into(),
            ));
        };
        let tab = Signed::<Tab>::parse(tab_jws)?;
        Ok(Slot {
            head,
            tab,
            wallet,
            token,
            rec,
            version: 0,
            durable: 0,
            dirty: false,
            serving: HashSet::new(),
        })
    }
}

/// One tab at this instance: its copy, the lock writers take, and its generation (bumped when
/// the copy is dropped after a failed write).
#[derive(Debug, Default)]
pub(crate) struct Entry {
    pub state: tokio::sync::Mutex<Option<Slot>>,
    pub writer: tokio::sync::Mutex<()>,
    pub generation: AtomicU64,
}

impl Entry {
    /// The current generation.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }
}

/// The receiver's tab records and this instance's copies of them.
#[derive(Debug)]
pub(crate) struct Records {
    store: Arc<dyn KeyStore>,
    ns: String,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
}

fn storage(e: RailError) -> Error {
    match e {
        RailError::Storage(s) => Error::Storage(s),
        e => Error::Payment(e),
    }
}

fn decode<T: serde::de::DeserializeOwned>(value: Option<&str>) -> Result<T, Error> {
    serde_json::from_str(value.unwrap_or("null"))
        .map_err(|e| Error::Storage(format!("a tab record cannot be read: {e}")))
}

fn head_key(id: &str) -> String {
    format!("{id}/head")
}

/// How long a record is kept after its tab closed (the wallet may ask for its Receipt again).
pub(crate) const KEEP_CLOSED: Duration = Duration::from_secs(7 * 24 * 3600);

impl Records {
    pub(crate) fn new(store: Arc<dyn KeyStore>, receiver: &str) -> Self {
        Records {
            store,
            ns: format!("stipendex/{}/tabs", crate::receiver::answers::who(receiver)),
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// Tab `id`'s entry at this instance.
    pub(crate) fn entry(&self, id: &str) -> Arc<Entry> {
        let mut m = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.entry(id.to_owned()).or_default().clone()
    }

    /// Tab `id`'s entry at this instance, if it has one (creates none).
    pub(crate) fn existing(&self, id: &str) -> Option<Arc<Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    /// Forgets tab `id` if nobody else holds its entry and it holds no copy of an open tab
    /// (nothing read, or closed): what a refused request or the keeper leaves is dropped, never
    /// a tab being served.
    pub(crate) fn forget_idle(&self, id: &str) {
        let mut m = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let idle = m.get(id).is_some_and(|e| {
            Arc::strong_count(e) == 1
                && e.state
                    .try_lock()
                    .is_ok_and(|s| s.as_ref().is_none_or(|s| s.rec.closed.is_some()))
        });
        if idle {
            m.remove(id);
        }
    }

    /// Forgets tab `id` (closed).
    pub(crate) fn forget(&self, id: &str) {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(id);
    }

    /// The ids of the tabs this instance has entries for.
    pub(crate) fn cached(&self) -> Vec<String> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect()
    }

    /// Whether the store still holds tab `id`'s record at `token` (no other instance wrote it
    /// since this instance's copy was read or written).
    pub(crate) async fn unchanged(&self, id: &str, token: i64) -> Result<bool, Error> {
        Ok(self
            .store
            .get(&self.ns, id)
            .await
            .map_err(storage)?
            .is_some_and(|seen| seen.record.token == token))
    }

    /// Reads tab `id` from the store into a fresh slot; `None` if there is no such record.
    pub(crate) async fn load(&self, id: &str) -> Result<Option<Slot>, Error> {
        let Some(seen) = self.store.get(&self.ns, id).await.map_err(storage)? else {
            return Ok(None);
        };
        let head = self
            .store
            .get(&self.ns, &head_key(id))
            .await
            .map_err(storage)?
            .ok_or_else(|| Error::Storage(format!("tab {id}'s record has lost its head")))?;
        Slot::new(
            decode(head.record.value.as_deref())?,
            seen.record.token,
            decode(seen.record.value.as_deref())?,
        )
        .map(Some)
    }

    /// Creates tab `id`'s record: `Ok(slot)` when created, `Err(slot)` with the record already
    /// there.
    pub(crate) async fn create(
        &self,
        id: &str,
        head: &TabHead,
        rec: &TabRecord,
    ) -> Result<Result<Slot, Slot>, Error> {
        // The head first (kept a week past the tab's end), then the record: a record never
        // exists without its head.
        let value = serde_json::to_string(head)
            .map_err(|e| Error::Storage(format!("a tab record cannot be written: {e}")))?;
        let mut w = Write::finished(rand::random::<i64>(), OPEN, None);
        w.value = Some(value);
        let now = self.store.now().await.map_err(storage)?;
        let until_end = head
            .end
            .saturating_sub(u64::try_from(now.unix_seconds()).unwrap_or(0));
        w.retain = Some(Duration::from_secs(until_end).saturating_add(KEEP_CLOSED));
        let head = match self
            .store
            .insert_if_absent(&self.ns, &head_key(id), &w)
            .await
            .map_err(storage)?
        {
            None => head.clone(),
            Some(seen) => decode(seen.record.value.as_deref())?,
        };
        let token = rand::random::<i64>();
        match self
            .store
            .insert_if_absent(&self.ns, id, &write(token, rec)?)
            .await
            .map_err(storage)?
        {
            None => Ok(Ok(Slot::new(head, token, rec.clone())?)),
            Some(seen) => Ok(Err(Slot::new(
                head,
                seen.record.token,
                decode(seen.record.value.as_deref())?,
            )?)),
        }
    }

    /// Writes the slot's record over the version it read (compare-and-set), holding the state
    /// lock across the write (the close, equivocation: rare). `false` if another instance wrote
    /// since.
    pub(crate) async fn put(&self, id: &str, slot: &mut Slot) -> Result<bool, Error> {
        let token = rand::random::<i64>();
        let w = write(token, &slot.rec)?;
        if self
            .store
            .replace(&self.ns, id, slot.token, &w)
            .await
            .map_err(storage)?
        {
            slot.token = token;
            slot.durable = slot.version;
            slot.dirty = false;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// Makes tab `id`'s copy durable at least up to `version` (a voucher applied in generation
    /// `generation`): waits for the tab's writer lock; if a write taken meanwhile covered it,
    /// done; else writes the copy as it is now (with every voucher applied since: they share
    /// this write).
    ///
    /// # Errors
    /// [`Error::Payment`] with [`RailError::InProgress`] (retryable) when the copy was dropped
    /// (a failed write, here or by another caller) before it was written: the voucher is not
    /// accepted; the same voucher again is checked afresh.
    pub(crate) async fn durable(
        &self,
        id: &str,
        entry: &Entry,
        version: u64,
        generation: u64,
    ) -> Result<(), Error> {
        let retry = || {
            Error::Payment(RailError::InProgress {
                op_id: format!("tab {id}: its record was read again; send the voucher again"),
            })
        };
        let _w = entry.writer.lock().await;
        let (w, written, old, token) = {
            let g = entry.state.lock().await;
            let Some(s) = g.as_ref() else {
                return Err(retry());
            };
            if entry.generation() != generation {
                return Err(retry());
            }
            if s.durable >= version {
                return Ok(());
            }
            let token = rand::random::<i64>();
            (write(token, &s.rec)?, s.version, s.token, token)
        };
        let ok = self.store.replace(&self.ns, id, old, &w).await;
        let mut g = entry.state.lock().await;
        match ok {
            Ok(true) => {
                if let Some(s) = g.as_mut() {
                    s.token = token;
                    s.durable = written;
                    s.dirty = false;
                }
                Ok(())
            }
            Ok(false) => {
                tracing::info!(tab = %id, "another instance wrote the tab: reading it again");
                *g = None;
                entry.generation.fetch_add(1, Ordering::SeqCst);
                Err(retry())
            }
            Err(e) => {
                *g = None;
                entry.generation.fetch_add(1, Ordering::SeqCst);
                Err(storage(e))
            }
        }
    }
}

fn write(token: i64, rec: &TabRecord) -> Result<Write, Error> {
    let value = serde_json::to_string(rec)
        .map_err(|e| Error::Storage(format!("a tab record cannot be written: {e}")))?;
    let (state, retain) = if rec.closed.is_some() {
        (CLOSED, Some(KEEP_CLOSED))
    } else {
        // An open tab's record has no retention: time alone never frees it (its hold does not
        // vanish either); a closed one is kept a week for its Receipt.
        (OPEN, None)
    };
    Ok(Write {
        token,
        state: state.to_owned(),
        fingerprint: Vec::new(),
        value: Some(value),
        retain,
        lease: None,
    })
}
