//! A tab's durable records at the receiver (namespace `stipendex/<who>/tabs`, as the receiver's
//! other records): its head (`<id>/head`: the hold's Proof, which carries the tab, the rail's
//! verdict, the end), written once; its record (`<id>`: every lane's last voucher by digest,
//! whether its answer is kept, its Merkle state, the total, and — once closed — the Receipt),
//! written per voucher and small; and each lane's last answer under a key of its own
//! (`<id>/answer/<lane>`, overwritten by the lane's next answer, naming the call it answers).
//! O(lanes) whatever the number of calls, and a write carries only the answers given since the
//! last one: a voucher's write is the small record plus, at most, the answers that ride on it —
//! never every lane's kept answer again.
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
//! voucher): each is written under its lane's key **before** the record that says it is kept,
//! so a record never names an answer that was not written; a replay checks that the lane's
//! answer names the very call (sequence and voucher) before it is served. Answers count
//! against the instance's bound on kept answers ([`crate::receiver::keep`]) from the moment
//! they are given; past it the oldest are dropped, and the same voucher again is refused
//! `answer_gone`.

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
use crate::receiver::keep::{Keep, Reserved, Space};

/// The state name of an open tab's record.
const OPEN: &str = "tab-open";
/// The state name of a closed tab's record.
const CLOSED: &str = "tab-closed";
/// The state name of a lane's kept answer.
const LANE_ANSWER: &str = "tab-answer";
/// How long past the tab's end a lane's answer is kept (no voucher is served after it).
const ANSWER_PAST_END: u64 = 60;

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
    /// The last call's answer was written under the lane's answer key, for the same voucher
    /// again (it may have been dropped since, to keep within the bound on kept answers).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub kept: bool,
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

/// A lane's last answer, under `<id>/answer/<lane>`: the call it answers, and the answer.
#[derive(Serialize, Deserialize)]
pub(crate) struct LaneAnswer {
    /// The call's sequence.
    pub seq: u64,
    /// The call's voucher.
    pub voucher: Digest,
    /// The answer.
    pub answer: Answer,
}

/// A lane's answer given at this instance, waiting for the tab's next write.
#[derive(Debug)]
pub(crate) struct Pending {
    /// The call's sequence.
    pub seq: u64,
    /// The [`LaneAnswer`] to write (JSON).
    pub value: Arc<str>,
    /// Its room in the instance's bound (taken by the write that carries it).
    pub room: Option<Reserved>,
}

impl Pending {
    /// The answer, for the same voucher again before it is written.
    pub(crate) fn answer(&self) -> Option<Answer> {
        serde_json::from_str::<LaneAnswer>(&self.value)
            .ok()
            .map(|a| a.answer)
    }
}

/// One lane's answer to write: (lane, sequence, value, room).
type ToWrite = (u16, u64, Arc<str>, Reserved);

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
    /// Answers were recorded since the last write.
    pub dirty: bool,
    /// Bumped by every answer recorded (a write clears `dirty` only if none came meanwhile).
    pub answers_seen: u64,
    /// Calls this instance is serving now: (lane, seq).
    pub serving: HashSet<(u16, u64)>,
    /// Answers given here and not yet written, by lane.
    pub pending: HashMap<u16, Pending>,
    /// The token of each lane's answer key as this instance last wrote it.
    pub answer_tokens: HashMap<u16, i64>,
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
            dirty: false,
            answers_seen: 0,
            serving: HashSet::new(),
            pending: HashMap::new(),
            answer_tokens: HashMap::new(),
        })
    }

    /// The answers waiting to be written that are still their lane's last call's (the others
    /// are dropped), their rooms taken: what the next write carries.
    fn answers_to_write(&mut self) -> Vec<ToWrite> {
        let lanes = &self.rec.lanes;
        self.pending.retain(|lane, p| {
            lanes
                .get(usize::from(*lane))
                .is_some_and(|l| l.seq == p.seq && l.answered && !l.kept)
        });
        self.pending
            .iter_mut()
            .filter_map(|(lane, p)| {
                let room = p.room.take()?;
                Some((*lane, p.seq, p.value.clone(), room))
            })
            .collect()
    }

    /// The answers of `done` were written (`Some(token)`) or not: written ones are kept (the
    /// record says so from now on), and none waits any more.
    fn answers_written(&mut self, done: &[(u16, u64, Option<i64>)]) {
        for &(lane, seq, token) in done {
            if self.pending.get(&lane).is_some_and(|p| p.seq == seq) {
                self.pending.remove(&lane);
            }
            let Some(token) = token else { continue };
            self.answer_tokens.insert(lane, token);
            if let Some(l) = self.rec.lanes.get_mut(usize::from(lane))
                && l.seq == seq
                && l.answered
            {
                l.kept = true;
            }
        }
    }
}

/// One tab at this instance: its copy, the lock writers take, and its generation: every copy
/// put in `state` (read from the store, or made at the opening) has a generation of its own,
/// so a voucher applied to one copy is never taken as written by a write of another.
#[derive(Debug, Default)]
pub(crate) struct Entry {
    pub state: tokio::sync::Mutex<Option<Slot>>,
    pub writer: tokio::sync::Mutex<()>,
    generation: AtomicU64,
    /// The writes of copies that succeeded: for each of the last [`GENERATIONS_KEPT`]
    /// generations written, the highest version written (oldest first).
    written: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl Entry {
    /// The current generation.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// A new copy goes in `state` (or the copy there is dropped): a new generation. Call it
    /// with the state lock held, whenever the copy is replaced.
    pub(crate) fn new_copy(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
    }

    /// The copy of `generation` was written up to `version`.
    fn wrote(&self, generation: u64, version: u64) {
        let mut w = self
            .written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match w.iter_mut().find(|(g, _)| *g == generation) {
            Some((_, v)) => *v = (*v).max(version),
            None => {
                w.push((generation, version));
                w.sort_unstable();
                if w.len() > GENERATIONS_KEPT {
                    w.remove(0);
                }
            }
        }
    }

    /// Whether a write of the copy of `generation` covered its `version` (the copy may have
    /// been dropped or replaced since). A generation older than the last
    /// [`GENERATIONS_KEPT`] written answers `false`: its voucher is applied again, and found
    /// counted.
    fn covered(&self, generation: u64, version: u64) -> bool {
        self.written
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .any(|&(g, v)| g == generation && v >= version)
    }
}

/// How many generations of a tab's copies [`Entry`] remembers the writes of: a voucher's call
/// waits for the tab's writer lock at most while that many copies are read and written.
const GENERATIONS_KEPT: usize = 8;

/// The receiver's tab records and this instance's copies of them.
#[derive(Debug)]
pub(crate) struct Records {
    store: Arc<dyn KeyStore>,
    ns: String,
    entries: Mutex<HashMap<String, Arc<Entry>>>,
    keep: Arc<Keep>,
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

/// The key of lane `lane`'s last answer in tab `id`.
pub(crate) fn answer_key(id: &str, lane: u16) -> String {
    format!("{id}/answer/{lane}")
}

/// The call a lane's answer record answers (read without decoding the answer's body).
#[derive(Deserialize)]
struct LaneSeq {
    seq: u64,
}

/// How long a record is kept after its tab closed (the wallet may ask for its Receipt again).
pub(crate) const KEEP_CLOSED: Duration = Duration::from_secs(7 * 24 * 3600);

impl Records {
    pub(crate) fn new(store: Arc<dyn KeyStore>, receiver: &str, keep: Arc<Keep>) -> Self {
        Records {
            store,
            ns: format!("stipendex/{}/tabs", crate::receiver::answers::who(receiver)),
            entries: Mutex::new(HashMap::new()),
            keep,
        }
    }

    /// The bound the lanes' answers are kept within (shared with the Proofs' answers).
    pub(crate) fn keep(&self) -> &Arc<Keep> {
        &self.keep
    }

    /// Writes the answers of `batch` under their lanes' keys (tab `id`, ending at `end`), each
    /// over the version this instance knows (`known`), else over an older call's answer only:
    /// never over a later call's, written by another instance. Which were written, and their
    /// tokens; a failure is logged (that answer is not kept).
    async fn write_answers(
        &self,
        id: &str,
        end: u64,
        known: &HashMap<u16, i64>,
        batch: Vec<ToWrite>,
    ) -> Vec<(u16, u64, Option<i64>)> {
        let mut done = Vec::with_capacity(batch.len());
        for (lane, seq, value, room) in batch {
            let key = answer_key(id, lane);
            let until = end.saturating_add(ANSWER_PAST_END);
            let retain = Duration::from_secs(until.saturating_sub(self.keep.now()).max(1));
            let token = rand::random::<i64>();
            let mut w = Write::finished(token, LANE_ANSWER, Some(retain));
            w.value = Some(value.to_string());
            match self
                .put_answer(&key, seq, known.get(&lane).copied(), &w)
                .await
            {
                Ok(true) => {
                    room.kept(Space::Lane, &key, token, until, true, None);
                    done.push((lane, seq, Some(token)));
                }
                Ok(false) => done.push((lane, seq, None)),
                Err(e) => {
                    tracing::warn!(tab = %id, lane, seq, error = %e, "could not keep a call's answer; the same voucher again is answer_gone");
                    done.push((lane, seq, None));
                }
            }
        }
        done
    }

    /// Writes `w` (the answer of call `seq`) under `key`: over `known`, else over nothing or an
    /// older call's answer; `false` when a later (or the same) call's answer is there.
    async fn put_answer(
        &self,
        key: &str,
        seq: u64,
        known: Option<i64>,
        w: &Write,
    ) -> Result<bool, Error> {
        if let Some(t) = known
            && self
                .store
                .replace(&self.ns, key, t, w)
                .await
                .map_err(storage)?
        {
            return Ok(true);
        }
        for _ in 0..4 {
            match self.store.get(&self.ns, key).await.map_err(storage)? {
                None => {
                    if self
                        .store
                        .insert_if_absent(&self.ns, key, w)
                        .await
                        .map_err(storage)?
                        .is_none()
                    {
                        return Ok(true);
                    }
                }
                Some(seen) => {
                    let theirs = seen
                        .record
                        .value
                        .as_deref()
                        .and_then(|v| serde_json::from_str::<LaneSeq>(v).ok())
                        .map_or(0, |a| a.seq);
                    if theirs >= seq {
                        return Ok(false);
                    }
                    if self
                        .store
                        .replace(&self.ns, key, seen.record.token, w)
                        .await
                        .map_err(storage)?
                    {
                        return Ok(true);
                    }
                }
            }
        }
        Ok(false)
    }

    /// Lane `lane`'s kept answer in tab `id`, if it answers call `seq` paid by `voucher`.
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub(crate) async fn read_answer(
        &self,
        id: &str,
        lane: u16,
        seq: u64,
        voucher: &Digest,
    ) -> Result<Option<Answer>, Error> {
        let seen = self
            .store
            .get(&self.ns, &answer_key(id, lane))
            .await
            .map_err(storage)?;
        Ok(seen
            .and_then(|s| s.record.value)
            .and_then(|v| serde_json::from_str::<LaneAnswer>(&v).ok())
            .filter(|a| a.seq == seq && &a.voucher == voucher)
            .map(|a| a.answer))
    }

    /// Removes the lanes' answers this instance wrote for tab `id` (closed: no voucher is
    /// served any more). Failures are logged: the answers go with their retention.
    pub(crate) async fn remove_answers(&self, id: &str, tokens: &HashMap<u16, i64>) {
        for (&lane, &token) in tokens {
            let key = answer_key(id, lane);
            if let Err(e) = self.store.remove(&self.ns, &key, token).await {
                tracing::debug!(tab = %id, lane, error = %e, "could not remove a closed tab's answer; it goes with its retention");
            }
            self.keep.forget(Space::Lane, &key);
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

    /// Writes the answers waiting in the slot, then its record over the version it read
    /// (compare-and-set), holding the state lock across the writes (the close, a flush). `false`
    /// if another instance wrote since. `entry` is the tab's: a write that succeeded counts for
    /// its copy's generation ([`Records::durable_or_reread`] reads it).
    pub(crate) async fn put(
        &self,
        id: &str,
        entry: &Entry,
        slot: &mut Slot,
    ) -> Result<bool, Error> {
        let batch = slot.answers_to_write();
        if !batch.is_empty() {
            let done = self
                .write_answers(id, slot.head.end, &slot.answer_tokens, batch)
                .await;
            slot.answers_written(&done);
        }
        let token = rand::random::<i64>();
        let w = write(token, &slot.rec)?;
        if self
            .store
            .replace(&self.ns, id, slot.token, &w)
            .await
            .map_err(storage)?
        {
            slot.token = token;
            slot.dirty = false;
            entry.wrote(entry.generation(), slot.version);
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
        match self
            .durable_or_reread(id, entry, version, generation)
            .await?
        {
            Durable::Written => Ok(()),
            Durable::Reread => Err(reread(id)),
        }
    }

    /// [`Records::durable`], with a dropped copy told apart as [`Durable::Reread`] (the
    /// voucher is not accepted: its caller may apply it again to the record read afresh).
    ///
    /// # Errors
    /// [`Error::Storage`] when the write failed (the copy is dropped too).
    pub(crate) async fn durable_or_reread(
        &self,
        id: &str,
        entry: &Entry,
        version: u64,
        generation: u64,
    ) -> Result<Durable, Error> {
        let _w = entry.writer.lock().await;
        // A write taken meanwhile covered this version (the copy may have been dropped or
        // replaced since): written.
        if entry.covered(generation, version) {
            return Ok(Durable::Written);
        }
        // The answers given since the last write go first, each under its lane's key, so the
        // record written next never names an answer that is not there.
        let (batch, end, known) = {
            let mut g = entry.state.lock().await;
            let Some(s) = g.as_mut() else {
                return Ok(Durable::Reread);
            };
            if entry.generation() != generation {
                return Ok(Durable::Reread);
            }
            (s.answers_to_write(), s.head.end, s.answer_tokens.clone())
        };
        let done = if batch.is_empty() {
            Vec::new()
        } else {
            self.write_answers(id, end, &known, batch).await
        };
        let (w, written, old, token, seen) = {
            let mut g = entry.state.lock().await;
            let Some(s) = g.as_mut() else {
                return Ok(Durable::Reread);
            };
            if entry.generation() != generation {
                return Ok(Durable::Reread);
            }
            s.answers_written(&done);
            let token = rand::random::<i64>();
            (
                write(token, &s.rec)?,
                s.version,
                s.token,
                token,
                s.answers_seen,
            )
        };
        let ok = self.store.replace(&self.ns, id, old, &w).await;
        let mut g = entry.state.lock().await;
        match ok {
            Ok(true) => {
                entry.wrote(generation, written);
                // The copy that was written, if it is still the one here (a copy read again
                // meanwhile keeps its own token and versions).
                if entry.generation() == generation
                    && let Some(s) = g.as_mut()
                {
                    s.token = token;
                    // An answer recorded during the write rides on the next one.
                    s.dirty = s.answers_seen != seen || !s.pending.is_empty();
                }
                Ok(Durable::Written)
            }
            Ok(false) => {
                tracing::info!(tab = %id, "another instance wrote the tab: reading it again");
                *g = None;
                entry.new_copy();
                Ok(Durable::Reread)
            }
            Err(e) => {
                *g = None;
                entry.new_copy();
                Err(storage(e))
            }
        }
    }
}

/// What [`Records::durable_or_reread`] made of a tab's copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durable {
    /// Written (by this call or by a write that covered it).
    Written,
    /// Dropped before it was written (another instance wrote the tab, or another caller here
    /// read it again): the voucher applied to it is not accepted.
    Reread,
}

/// The retryable refusal of a voucher applied to a copy of tab `id` dropped before it was
/// written: the same voucher again is checked afresh.
pub(crate) fn reread(id: &str) -> Error {
    Error::Payment(RailError::InProgress {
        op_id: format!("tab {id}: its record was read again; send the voucher again"),
    })
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
