//! Tab sessions in the wallet (`docs/stipendex-profile.md` §4b): the tab checked like a Quote,
//! its whole cap counted and held once; then one signed voucher per call, each lane's sequence
//! persisted before the voucher leaves; at the close, the Receipt checked against the wallet's
//! own lanes and the uncaptured rest of the cap given back to the limits.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rail_core::clock::rfc3339;
use rail_core::keys::{Begin, Write, fingerprint};
use rail_core::{Amount, Money, OpId, PaymentMode, RailError};
use serde::{Deserialize, Serialize};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{
    Ask, Confirmer, PaidFor, PaidRecord, Wallet, WalletRail, Why, above_threshold, chain_name,
    deny, limits_in, now_secs, op_for, outcome_unknown, rail_allowed,
};
use crate::Error;
use crate::envelope::{
    Allow, Confirmation, Digest, Proof, Resource, Signed, Tab, TabClose, TabReceipt, Tag, Voucher,
    new_id,
};
use crate::receiver::Request;

/// A tab the wallet holds: the tab, its hold Proof, and its lanes. Cheap to clone.
#[derive(Clone)]
pub struct TabHold(Arc<HoldInner>);

struct HoldInner {
    tab: Signed<Tab>,
    /// The tab's prices, parsed once (a call's price is looked up on every call).
    pricing: Vec<crate::receiver::PricedCapability>,
    proof: Signed<Proof>,
    confirmation: Option<Signed<Confirmation>>,
    rail: String,
    op: OpId,
    /// Each lane's state and its record's token in the store.
    lanes: Mutex<Vec<(LaneState, Option<i64>)>>,
    free: Mutex<VecDeque<u16>>,
    permits: Arc<Semaphore>,
}

impl std::fmt::Debug for TabHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TabHold")
            .field("tab", &self.0.tab.object().id)
            .field("rail", &self.0.rail)
            .finish_non_exhaustive()
    }
}

impl TabHold {
    /// The tab.
    #[must_use]
    pub fn tab(&self) -> &Signed<Tab> {
        &self.0.tab
    }

    /// The hold's Proof, to present to the receiver to open the tab.
    #[must_use]
    pub fn proof(&self) -> &Signed<Proof> {
        &self.0.proof
    }

    /// The wallet's rail (its name) holding the cap.
    #[must_use]
    pub fn rail(&self) -> &str {
        &self.0.rail
    }

    /// The tab's price of one call of `method` on `name` (the most specific of its patterns,
    /// as the receiver decides); `None` if the tab does not cover it.
    #[must_use]
    pub fn price_of(&self, method: &str, name: &str) -> Option<Money> {
        let hit = crate::receiver::matching(
            &self.0.pricing,
            &crate::receiver::Request::new(method, name),
        )?;
        match &hit.price {
            crate::receiver::Price::Fixed(m) => Some(m.clone()),
            crate::receiver::Price::Estimate { .. } => None,
        }
    }

    /// Whether `other` holds the same tab.
    #[must_use]
    pub fn same(&self, other: &TabHold) -> bool {
        self.0.tab.digest() == other.0.tab.digest()
    }

    /// What the wallet's vouchers add up to so far (every lane's cumulative).
    ///
    /// # Errors
    /// [`Error::Malformed`] (cannot happen for a tab the wallet checked).
    pub fn spent(&self) -> Result<Money, Error> {
        let t = self.0.tab.object();
        let mut sum = Money::zero(t.asset.clone());
        for (l, _) in lock(&self.0.lanes).iter() {
            let m = Money::new(t.asset.clone(), l.cumulative)
                .map_err(|e| Error::Malformed(format!("lane cumulative: {e}")))?;
            sum = sum
                .checked_add(&m)
                .map_err(|e| Error::Malformed(e.to_string()))?;
        }
        Ok(sum)
    }
}

/// The tabs a client (HTTP or MCP) holds, and whether each was opened at its receiver: what
/// both bindings' clients consult before a call, so a call an open tab covers is paid by a
/// voucher at once. Cheap to clone; clones share.
#[derive(Clone, Debug, Default)]
pub struct OpenTabs(Arc<Mutex<Vec<(TabHold, bool)>>>);

impl OpenTabs {
    /// The open tab at `sent`'s origin that covers it and has not ended by `now` (Unix
    /// seconds), and whether it was opened at its receiver.
    #[must_use]
    pub fn covering(&self, sent: &Resource, now: u64) -> Option<(TabHold, bool)> {
        lock(&self.0)
            .iter()
            .find(|(h, _)| {
                let t = h.tab().object();
                t.origin == sent.origin
                    && now < t.exp
                    && h.price_of(&sent.method, &sent.path).is_some()
            })
            .cloned()
    }

    /// Holds `hold` (not yet opened at its receiver).
    pub fn add(&self, hold: TabHold) {
        lock(&self.0).push((hold, false));
    }

    /// `hold` was opened at its receiver (its hold Proof need not be sent again).
    pub fn opened(&self, hold: &TabHold) {
        for (h, o) in lock(&self.0).iter_mut() {
            if h.same(hold) {
                *o = true;
            }
        }
    }

    /// Stops using `hold`.
    pub fn remove(&self, hold: &TabHold) {
        lock(&self.0).retain(|(h, _)| !h.same(hold));
    }

    /// Every tab held.
    #[must_use]
    pub fn all(&self) -> Vec<TabHold> {
        lock(&self.0).iter().map(|(h, _)| h.clone()).collect()
    }

    /// Closes every tab held with `close` (a client's way of asking its receiver), forgetting
    /// each one that closed: their Receipts, or the first failure (the others are closed still;
    /// a tab that did not close stays held, and its receiver closes it at its end).
    ///
    /// # Errors
    /// The first of `close`'s errors.
    pub async fn close_all<E, F, Fut>(&self, close: F) -> Result<Vec<Signed<TabReceipt>>, E>
    where
        F: Fn(TabHold) -> Fut,
        Fut: std::future::Future<Output = Result<Signed<TabReceipt>, E>>,
    {
        let mut out = Vec::new();
        let mut first = None;
        for h in self.all() {
            match close(h.clone()).await {
                Ok(r) => {
                    self.remove(&h);
                    out.push(r);
                }
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}

/// A lane's state, as persisted before each voucher leaves.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct LaneState {
    seq: u64,
    cumulative: Amount,
    /// The last voucher, by digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    voucher: Option<Digest>,
}

impl Default for LaneState {
    fn default() -> Self {
        LaneState {
            seq: 0,
            cumulative: Amount::ZERO,
            voucher: None,
        }
    }
}

/// What the wallet keeps of a tab it holds (to find it again after a restart).
#[derive(Serialize, Deserialize)]
struct HeldRecord {
    proof: String,
    confirmation: Option<String>,
    rail: String,
    op: String,
    /// The open-tab slot it took: (key, token).
    slot: Option<(String, i64)>,
}

/// One call's voucher, with its lane held until the call is answered (or this is dropped).
#[derive(Debug)]
pub struct TabVoucher {
    /// The voucher (send its compact JWS with the call).
    pub voucher: Signed<Voucher>,
    hold: TabHold,
    /// The lane before this voucher, and the token its record was written with: to give the
    /// lane back when the receiver says it did not count the voucher.
    before: LaneState,
    token: i64,
    _permit: OwnedSemaphorePermit,
}

impl Drop for TabVoucher {
    fn drop(&mut self) {
        lock(&self.hold.0.free).push_back(self.voucher.object().lane);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn storage(e: RailError) -> Error {
    match e {
        RailError::Storage(s) => Error::Storage(s),
        e => Error::Payment(e),
    }
}

impl Wallet {
    fn tabs_ns(&self) -> String {
        format!("stipendex/{}/tabs", self.0.mandate.object().id)
    }

    fn lanes_ns(&self) -> String {
        format!("stipendex/{}/lanes", self.0.mandate.object().id)
    }

    /// Opens `tab`, offered for the request `sent`: the receiver allowlisted with its pinned key
    /// at the tab's origin, which is where `sent` went, and the tab covering `sent`; the
    /// mandate valid, with a tab policy in the tab's asset (`tab_cap`, `open_tabs`); the
    /// **whole cap** counted against the period, total and per-receiver limits (the receiver
    /// may capture all of it); a Confirmation above the threshold; the cap held on a rail the
    /// tab accepts. Returns the hold, whose Proof opens the tab at the receiver. Opening the
    /// same tab again returns the same hold and holds nothing more.
    ///
    /// # Errors
    /// [`Error::Denied`], [`Error::Expired`], [`Error::Revoked`], [`Error::LimitExceeded`]
    /// (the cap above the mandate's `tab_cap` or limits, or too many open tabs),
    /// [`Error::NotConfirmed`], [`Error::NoRail`], [`Error::Payment`], [`Error::Storage`].
    pub async fn open_tab(&self, tab: &Signed<Tab>, sent: &Resource) -> Result<TabHold, Error> {
        self.open_tab_with(tab, sent, self.0.confirmer.as_ref())
            .await
    }

    /// [`Wallet::open_tab`] asking `confirmer`.
    ///
    /// # Errors
    /// As [`Wallet::open_tab`].
    pub async fn open_tab_with(
        &self,
        tab: &Signed<Tab>,
        sent: &Resource,
        confirmer: &dyn Confirmer,
    ) -> Result<TabHold, Error> {
        let me = &self.0;
        let t = tab.object();
        let mandate = me.mandate.object();
        let now = now_secs(&me.clock);
        let cap = t.cap()?;
        if let Err(why) = admit_tab(mandate, t, sent) {
            let receiver = t.receiver.id.clone();
            return Err(deny(confirmer, receiver, None, Some(cap.clone()), why).await);
        }
        self.check_mandate(now).await?;
        if now.saturating_add(me.min_quote_life) >= t.exp {
            return Err(Error::Expired {
                what: "tab",
                id: t.id.clone(),
                why: format!(
                    "it ends at {}, and it is {}: less than the {} s the wallet keeps to open and use it; send the request again for a fresh offer",
                    rfc3339(t.exp),
                    rfc3339(now),
                    me.min_quote_life
                ),
            });
        }
        let op = op_for(&t.receiver.id, &t.id)?;
        let fp = fingerprint(tab.digest().as_str()).map_err(Error::Payment)?;
        let lease = match me.ops.begin::<PaidRecord>(&op, &fp).await {
            Ok(Begin::Replay(_)) => return self.tab(tab).await,
            Ok(Begin::Fresh(l) | Begin::Recover(l)) => l,
            Err(RailError::IdempotencyConflict { .. }) => {
                return Err(Error::QuoteUsed(t.id.clone()));
            }
            Err(e) => return Err(storage(e)),
        };
        let out = lease
            .keep_alive(Box::pin(self.hold_tab(tab, &op, now, confirmer)))
            .await;
        match out {
            Ok((hold, rec)) => {
                let h = &hold.0;
                let paid = PaidRecord::new(&h.proof, h.confirmation.as_ref(), &h.rail);
                let w = Write {
                    token: rand::random(),
                    state: "held".into(),
                    fingerprint: Vec::new(),
                    value: serde_json::to_string(&rec).ok(),
                    retain: None,
                    lease: None,
                };
                if let Err(e) = me.store.insert_if_absent(&self.tabs_ns(), &t.id, &w).await {
                    tracing::error!(tab = %t.id, error = %e, "held, but the tab could not be stored");
                }
                if let Err(e) = me.ops.finish(lease, &paid).await {
                    tracing::error!(tab = %t.id, error = %e, "held, but the hold's Proof could not be stored");
                }
                let chain = chain_name(&t.receiver.id, &t.id);
                let objects =
                    self.chain_objects(h.confirmation.as_ref(), &[tab.jws(), h.proof.jws()]);
                self.journal_all(&chain, objects, "tab").await;
                tracing::info!(tab = %t.id, receiver = %t.receiver.id, cap = %cap, "tab held");
                Ok(hold)
            }
            Err(e) => {
                let ended = if outcome_unknown(&e) {
                    me.ops.hand_over(lease).await
                } else {
                    me.ops.abandon(lease).await
                };
                if let Err(s) = ended {
                    tracing::warn!(tab = %t.id, error = %s, "could not end a tab's lease; it lapses by itself");
                }
                Err(e)
            }
        }
    }

    /// Counts, confirms and holds the cap of `tab` under `op`; the hold and its record.
    async fn hold_tab(
        &self,
        tab: &Signed<Tab>,
        op: &OpId,
        now: u64,
        confirmer: &dyn Confirmer,
    ) -> Result<(TabHold, HeldRecord), Error> {
        let me = &self.0;
        let t = tab.object();
        let mandate = me.mandate.object();
        let cap = t.cap()?;
        let limits = limits_in(mandate, cap.asset())?;
        let Some(max_cap) = limits.tab_cap else {
            return Err(Error::LimitExceeded(format!(
                "mandate {} allows no tab in {}: it has no tab_cap",
                mandate.id,
                cap.asset()
            )));
        };
        if cap.amount() > max_cap {
            return Err(Error::LimitExceeded(format!(
                "tab {} caps at {cap}, above mandate {}'s tab_cap of {max_cap}",
                t.id, mandate.id
            )));
        }
        let (rail, offer) = self.choose_hold(t)?;
        // An open-tab slot first (one of `open_tabs`, shared by every wallet on the mandate).
        let slot = self.take_tab_slot(t, limits.open_tabs.unwrap_or(1)).await?;
        let budgets = self.budgets(limits)?;
        let counted = match budgets.reserve_cap(op, &t.receiver.id, &cap).await {
            Ok(c) => c,
            Err(e) => {
                self.free_tab_slot(&slot).await;
                return Err(e);
            }
        };
        let confirmation = if above_threshold(limits, &cap) {
            let (left_in_period, left_in_total) = budgets.left().await;
            let ask = Ask {
                why: Why::AboveThreshold,
                receiver: t.receiver.id.clone(),
                description: Some(format!("a tab of up to {cap} at {}", t.origin)),
                total: cap.clone(),
                tolerance: Amount::ZERO,
                left_in_period,
                left_in_total,
            };
            self.ask_human(&ask, tab.digest().clone(), &t.id, now, confirmer)
                .await
                .map(Some)
        } else {
            Ok(None)
        };
        let (confirmation, counted) = match counted.unless_err(confirmation).await {
            Ok(c) => c,
            Err(e) => {
                self.free_tab_slot(&slot).await;
                return Err(e);
            }
        };
        let payment = match rail.handle.hold_payer.as_ref() {
            Some(h) => h.hold(op, offer).await,
            None => Err(RailError::InvalidInput("the rail cannot hold".into())),
        };
        let payment = match payment {
            Ok(p) => {
                counted.keep().await;
                p
            }
            Err(e) => {
                if counted.after_rail_error(&e).await {
                    self.free_tab_slot(&slot).await;
                }
                return Err(Error::Payment(e));
            }
        };
        let paid_over = payment.rail.as_str().to_owned();
        let proof = self.proof_of(
            PaidFor::Tab(tab),
            confirmation.as_ref(),
            payment,
            paid_over,
            now,
        )?;
        let rec = HeldRecord {
            proof: proof.jws().to_owned(),
            confirmation: confirmation.as_ref().map(|c| c.jws().to_owned()),
            rail: rail.name.clone(),
            op: op.as_str().to_owned(),
            slot: Some(slot),
        };
        let hold = new_hold(
            tab.clone(),
            proof,
            confirmation,
            rail.name.clone(),
            op.clone(),
        );
        Ok((hold, rec))
    }

    /// The rail to hold `t`'s cap over: the first of the tab's (the receiver's order) that the
    /// mandate allows and the wallet can hold on.
    fn choose_hold<'a>(
        &'a self,
        t: &'a Tab,
    ) -> Result<(&'a WalletRail, &'a rail_core::Offer), Error> {
        let mandate = self.0.mandate.object();
        let mut why = Vec::new();
        for r in &t.rails {
            if !rail_allowed(mandate, &r.rail) {
                why.push(format!("{}: not allowed by the mandate", r.rail));
                continue;
            }
            for w in &self.0.rails {
                if w.handle.payer.id().as_str() != r.rail || r.offer.mode != PaymentMode::Hold {
                    continue;
                }
                let caps = w.handle.payer.capabilities();
                if w.handle.hold_payer.is_none() || !caps.hold || !caps.partial_capture {
                    why.push(format!(
                        "{} ({}): cannot hold and capture part of a hold (no tab on it)",
                        w.name, r.rail
                    ));
                    continue;
                }
                match w.handle.payer.accepts(&r.offer) {
                    Ok(()) => return Ok((w, &r.offer)),
                    Err(e) => why.push(format!("{} ({}): {e}", w.name, r.rail)),
                }
            }
        }
        Err(Error::NoRail(format!(
            "tab {}: no rail of this wallet can hold it ({})",
            t.id,
            if why.is_empty() {
                "the wallet has none of its rails".to_owned()
            } else {
                why.join("; ")
            }
        )))
    }

    /// Takes one of the mandate's `max` open-tab slots in the tab's asset for `t` (until the
    /// tab's end and a day, should the wallet never close it).
    async fn take_tab_slot(&self, t: &Tab, max: u32) -> Result<(String, i64), Error> {
        let me = &self.0;
        let ns = format!("{}-open", self.tabs_ns());
        let now = now_secs(&me.clock);
        let keep = Duration::from_secs(t.exp.saturating_sub(now).saturating_add(86_400));
        for i in 0..max {
            let key = format!("{}/{i}", t.asset);
            let token: i64 = rand::random();
            let mut w = Write::finished(token, "open", Some(keep));
            w.value = Some(t.id.clone());
            match me
                .store
                .insert_if_absent(&ns, &key, &w)
                .await
                .map_err(storage)?
            {
                None => return Ok((key, token)),
                Some(seen) if seen.record.value.as_deref() == Some(t.id.as_str()) => {
                    return Ok((key, seen.record.token));
                }
                Some(_) => {}
            }
        }
        Err(Error::LimitExceeded(format!(
            "mandate {} allows {max} open tab(s) in {}; close one first",
            me.mandate.object().id,
            t.asset
        )))
    }

    async fn free_tab_slot(&self, slot: &(String, i64)) {
        let ns = format!("{}-open", self.tabs_ns());
        if let Err(e) = self.0.store.remove(&ns, &slot.0, slot.1).await {
            tracing::warn!(error = %e, "could not free an open-tab slot; it lapses by itself");
        }
    }

    /// The hold of `tab`, opened before by this wallet (or another sharing its store), with its
    /// lanes as last persisted: after a restart, the tab goes on where it was.
    ///
    /// # Errors
    /// [`Error::NotPending`] if this wallet holds no such tab; [`Error::Storage`].
    pub async fn tab(&self, tab: &Signed<Tab>) -> Result<TabHold, Error> {
        let me = &self.0;
        let t = tab.object();
        let Some(seen) = me
            .store
            .get(&self.tabs_ns(), &t.id)
            .await
            .map_err(storage)?
        else {
            return Err(Error::NotPending(format!("tab {}", t.id)));
        };
        let rec: HeldRecord = serde_json::from_str(seen.record.value.as_deref().unwrap_or(""))
            .map_err(|e| Error::Storage(format!("a held tab's record cannot be read: {e}")))?;
        let proof = Signed::<Proof>::parse(&rec.proof)?;
        if proof.object().tab.as_ref() != Some(tab.digest()) {
            return Err(Error::Mismatch(format!(
                "the stored hold is not tab {}'s",
                t.id
            )));
        }
        let confirmation = rec.confirmation.as_deref().map(Signed::parse).transpose()?;
        let op = OpId::new(rec.op).map_err(Error::Payment)?;
        let hold = new_hold(tab.clone(), proof, confirmation, rec.rail, op);
        {
            let ns = self.lanes_ns();
            let mut lanes = Vec::new();
            for n in 0..t.lanes {
                let key = format!("{}/{n}", t.id);
                match me.store.get(&ns, &key).await.map_err(storage)? {
                    Some(s) => {
                        let l: LaneState = serde_json::from_str(
                            s.record.value.as_deref().unwrap_or(""),
                        )
                        .map_err(|e| Error::Storage(format!("a lane cannot be read: {e}")))?;
                        lanes.push((l, Some(s.record.token)));
                    }
                    None => lanes.push((LaneState::default(), None)),
                }
            }
            *lock(&hold.0.lanes) = lanes;
        }
        Ok(hold)
    }

    /// The voucher for the call `req` inside `hold`: waits for a free lane, prices the call at
    /// the tab's price (the most specific pattern that matches, as the receiver decides), checks
    /// the mandate's per-call limit and the tab's cap, persists the lane's next sequence, signs.
    ///
    /// # Errors
    /// [`Error::Voucher`] `not_covered` (the tab does not price the call) or `above_cap`;
    /// [`Error::Expired`] (past the tab's end, or the mandate's); [`Error::Revoked`] (the
    /// mandate); [`Error::LimitExceeded`] (per-call limit);
    /// [`Error::Mismatch`] (the call goes to another origin than the tab's); [`Error::Storage`]
    /// (nothing was signed).
    pub async fn voucher(&self, hold: &TabHold, req: &Request) -> Result<TabVoucher, Error> {
        let me = &self.0;
        let t = hold.0.tab.object();
        let now = now_secs(&me.clock);
        // No voucher under a mandate that has ended (expired, revoked): the principal's
        // authority ends there, whatever is left of the tab (the client then closes it).
        self.check_mandate(now).await?;
        if now >= t.exp {
            return Err(Error::Expired {
                what: "tab",
                id: t.id.clone(),
                why: format!("it ended at {}, and it is {}", rfc3339(t.exp), rfc3339(now)),
            });
        }
        let Some(resource) = req.resource() else {
            return Err(Error::Mismatch("a tab's call names its origin".into()));
        };
        if resource.origin != t.origin {
            return Err(Error::Mismatch(format!(
                "tab {} is for {}, not {}",
                t.id, t.origin, resource.origin
            )));
        }
        let Some(price) = hold.price_of(&req.method, &req.name) else {
            return Err(Error::Voucher {
                code: "not_covered",
                why: format!("tab {} does not cover {} {}", t.id, req.method, req.name),
            });
        };
        let mandate = me.mandate.object();
        if let Some(limits) = mandate.limits_for(price.asset()) {
            self.budgets(limits)?.check_per_call(&price)?;
        }
        let permit = hold
            .0
            .permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| Error::Storage("the tab's lanes were closed".into()))?;
        let lane = lock(&hold.0.free)
            .pop_front()
            .ok_or_else(|| Error::Storage("no free lane under a free permit".into()))?;
        // From here the lane is ours: it goes back to the free list when the TabVoucher drops.
        let guard = LaneBack {
            hold,
            lane: Some(lane),
        };
        let (state, token) = lock(&hold.0.lanes)
            .get(usize::from(lane))
            .cloned()
            .unwrap_or_default();
        let total = hold.spent()?;
        let after = total
            .checked_add(&price)
            .map_err(|e| Error::Malformed(e.to_string()))?;
        if after.amount() > t.cap {
            return Err(Error::Voucher {
                code: "above_cap",
                why: format!(
                    "tab {} has {} of its cap {} used; this call costs {}",
                    t.id,
                    total.amount(),
                    t.cap,
                    price.amount()
                ),
            });
        }
        let cumulative = state
            .cumulative
            .checked_add(price.amount())
            .map_err(|e| Error::Malformed(e.to_string()))?;
        let voucher = Signed::sign(
            Voucher {
                stipendex: Tag::current("voucher"),
                id: new_id("v_"),
                wallet: me.key.public(),
                tab: t.id.clone(),
                tab_digest: hold.0.tab.digest().clone(),
                lane,
                seq: state.seq.saturating_add(1),
                asset: t.asset.clone(),
                amount: price.amount(),
                cumulative,
                resource,
                request: req.digest(),
                iat: now,
            },
            &me.key,
        )?;
        // Persisted before it leaves: a restarted wallet never signs this sequence again.
        let next = LaneState {
            seq: voucher.object().seq,
            cumulative,
            voucher: Some(voucher.digest().clone()),
        };
        let new_token: i64 = rand::random();
        let w = Write {
            token: new_token,
            state: "lane".into(),
            fingerprint: Vec::new(),
            value: serde_json::to_string(&next).ok(),
            retain: None,
            lease: None,
        };
        let key = format!("{}/{lane}", t.id);
        let ns = self.lanes_ns();
        // Through the call's deferred handle: durable with the voucher's journal line (a
        // durable write of the same store) or at a sync, before the voucher leaves.
        let rec = self.call_records();
        let written = match token {
            Some(old) => rec
                .store
                .replace(&ns, &key, old, &w)
                .await
                .map_err(storage)?,
            None => rec
                .store
                .insert_if_absent(&ns, &key, &w)
                .await
                .map_err(storage)?
                .is_none(),
        };
        if !written {
            return Err(Error::Storage(format!(
                "lane {lane} of tab {} was written by another wallet instance: open the tab again (Wallet::tab) before calling",
                t.id
            )));
        }
        if let Some(slot) = lock(&hold.0.lanes).get_mut(usize::from(lane)) {
            *slot = (next, Some(new_token));
        }
        let chain = chain_name(&t.receiver.id, &t.id);
        // The lane is durable before the voucher is journaled (a journal ahead of the lane
        // would, after a power loss, see the same sequence signed twice) and before it leaves.
        rec.sync_for_journal().await?;
        if let Err(e) = me.journal.append(&chain, voucher.jws()).await {
            tracing::error!(chain = %chain, error = %e, "could not journal a voucher");
        }
        rec.sync().await?;
        let mut guard = guard;
        guard.lane = None; // the TabVoucher gives it back
        Ok(TabVoucher {
            voucher,
            hold: hold.clone(),
            before: state,
            token: new_token,
            _permit: permit,
        })
    }

    /// The receiver said it did not count `v` (`Stipendex-Tab-Call: voucher=…; uncounted`: the
    /// price hook refused or waived the call, or it never reached the service): the lane goes
    /// back to its state before `v` — written over `v`'s record, compare-and-set — and the
    /// journal records it, so the lane's next voucher carries `v`'s sequence and cumulative and
    /// `verify-chain` accepts that. Nothing is counted against the limits for it (the tab's cap
    /// was counted when it opened).
    ///
    /// # Errors
    /// [`Error::Storage`]: the lane stays at `v` (its next voucher is then out of order at the
    /// receiver, and the tab is retired: nothing is lost).
    pub async fn voucher_uncounted(&self, v: &TabVoucher) -> Result<(), Error> {
        let me = &self.0;
        let t = v.hold.0.tab.object();
        let lane = v.voucher.object().lane;
        let token: i64 = rand::random();
        let w = Write {
            token,
            state: "lane".into(),
            fingerprint: Vec::new(),
            value: serde_json::to_string(&v.before).ok(),
            retain: None,
            lease: None,
        };
        let written = me
            .store
            .replace(&self.lanes_ns(), &format!("{}/{lane}", t.id), v.token, &w)
            .await
            .map_err(storage)?;
        if !written {
            return Err(Error::Storage(format!(
                "lane {lane} of tab {} was written meanwhile: it stays at its last voucher",
                t.id
            )));
        }
        if let Some(slot) = lock(&v.hold.0.lanes).get_mut(usize::from(lane)) {
            *slot = (v.before.clone(), Some(token));
        }
        let chain = chain_name(&t.receiver.id, &t.id);
        if let Err(e) = me
            .journal
            .append(&chain, &crate::chain::uncounted_line(v.voucher.digest()))
            .await
        {
            tracing::error!(chain = %chain, error = %e, "could not journal an uncounted voucher");
        }
        tracing::info!(tab = %t.id, lane, seq = v.voucher.object().seq, "the receiver did not count the voucher: its lane is given back");
        Ok(())
    }

    /// Journals the result the call paid by `voucher` was answered with (the digest of the
    /// body received), so `verify-chain` recomputes the tab's root: one line after the voucher
    /// in the tab's chain ([`crate::chain::result_line`]). An audit line nothing acts on: made
    /// durable by the journal's next durable write
    /// ([`crate::wallet::Journal::append_deferred`]), not awaited to the disk.
    ///
    /// # Errors
    /// [`Error::Storage`] (the call was paid and answered; only its audit line is missing).
    pub async fn tab_result(
        &self,
        hold: &TabHold,
        voucher: &Signed<Voucher>,
        result: &Digest,
    ) -> Result<(), Error> {
        let t = hold.0.tab.object();
        self.0
            .journal
            .append_deferred(
                &chain_name(&t.receiver.id, &t.id),
                &crate::chain::result_line(voucher.digest(), result),
            )
            .await
    }

    /// The signed request that the receiver close `hold`'s tab.
    ///
    /// # Errors
    /// [`Error::Malformed`] (cannot happen).
    pub fn close_request(&self, hold: &TabHold) -> Result<Signed<TabClose>, Error> {
        let t = hold.0.tab.object();
        Signed::sign(
            TabClose {
                stipendex: Tag::current("tab-close"),
                id: new_id("tc_"),
                wallet: self.0.key.public(),
                tab: t.id.clone(),
                tab_digest: hold.0.tab.digest().clone(),
                iat: now_secs(&self.0.clock),
            },
            &self.0.key,
        )
    }

    /// The tab's closing Receipt (compact JWS): signed by the tab's receiver, for this tab and
    /// its hold, capturing no more than the cap and, lane by lane, no more than the wallet's
    /// own vouchers (the same last voucher where the sequence is the wallet's last). Then the
    /// uncaptured rest of the cap goes back to the mandate's limits (once) and the open-tab
    /// slot is freed.
    ///
    /// # Errors
    /// [`Error::Untrusted`], [`Error::Mismatch`], [`Error::CaptureAbove`] (the receiver
    /// captured more than the wallet signed: nothing is given back, keep the Receipt as
    /// evidence), [`Error::Storage`].
    pub async fn tab_closed(
        &self,
        hold: &TabHold,
        receipt: &str,
    ) -> Result<Signed<TabReceipt>, Error> {
        let me = &self.0;
        let t = hold.0.tab.object();
        let receipt = Signed::<TabReceipt>::parse(receipt)?;
        let r = receipt.object();
        if r.receiver != t.receiver {
            return Err(Error::Untrusted(format!(
                "the tab's receipt is signed by {} ({}), not by {}",
                r.receiver.id, r.receiver.key, t.receiver.id
            )));
        }
        if &r.tab_digest != hold.0.tab.digest() || &r.proof != hold.0.proof.digest() {
            return Err(Error::Mismatch(format!(
                "receipt {} is not for tab {} and its hold",
                r.id, t.id
            )));
        }
        {
            let lanes = lock(&hold.0.lanes);
            for end in &r.lanes {
                let Some((mine, _)) = lanes.get(usize::from(end.lane)) else {
                    return Err(Error::CaptureAbove(format!(
                        "receipt {} names lane {}, which the tab does not have",
                        r.id, end.lane
                    )));
                };
                let same_last = mine.voucher.as_ref() == Some(&end.voucher);
                if end.seq > mine.seq
                    || end.cumulative > mine.cumulative
                    || (end.seq == mine.seq && !same_last)
                {
                    return Err(Error::CaptureAbove(format!(
                        "receipt {} captures lane {} at sequence {} ({}), beyond the wallet's vouchers (sequence {}, {})",
                        r.id, end.lane, end.seq, end.cumulative, mine.seq, mine.cumulative
                    )));
                }
            }
        }
        let cap = t.cap()?;
        let captured =
            Money::new(t.asset.clone(), r.captured).map_err(|e| Error::Malformed(e.to_string()))?;
        let rest = cap
            .checked_sub(&captured)
            .map_err(|e| Error::CaptureAbove(format!("receipt {}: {e}", r.id)))?;
        let mandate = me.mandate.object();
        if let Some(limits) = mandate.limits_for(cap.asset()) {
            self.budgets(limits)?
                .give_back(&hold.0.op, &t.receiver.id, &rest)
                .await?;
        }
        let chain = chain_name(&t.receiver.id, &t.id);
        me.journal.record(&chain, receipt.jws()).await?;
        if let Some(seen) = me
            .store
            .get(&self.tabs_ns(), &t.id)
            .await
            .map_err(storage)?
            && let Ok(rec) =
                serde_json::from_str::<HeldRecord>(seen.record.value.as_deref().unwrap_or(""))
            && let Some(slot) = &rec.slot
        {
            self.free_tab_slot(slot).await;
        }
        tracing::info!(tab = %t.id, captured = %captured, given_back = %rest, calls = r.calls, "tab closed");
        Ok(receipt)
    }
}

/// Gives a lane back to the free list if the voucher is not made (an error on the way).
struct LaneBack<'a> {
    hold: &'a TabHold,
    lane: Option<u16>,
}

impl Drop for LaneBack<'_> {
    fn drop(&mut self) {
        if let Some(l) = self.lane.take() {
            lock(&self.hold.0.free).push_back(l);
        }
    }
}

fn new_hold(
    tab: Signed<Tab>,
    proof: Signed<Proof>,
    confirmation: Option<Signed<Confirmation>>,
    rail: String,
    op: OpId,
) -> TabHold {
    let n = tab.object().lanes;
    let pricing = tab.object().pricing();
    TabHold(Arc::new(HoldInner {
        pricing,
        lanes: Mutex::new(vec![(LaneState::default(), None); usize::from(n)]),
        free: Mutex::new((0..n).collect()),
        permits: Arc::new(Semaphore::new(usize::from(n))),
        tab,
        proof,
        confirmation,
        rail,
        op,
    }))
}

/// Step 1 of a tab: the receiver allowlisted (id and pinned key) at the tab's origin, which is
/// the origin of the request that was offered the tab, and the tab covers that request.
fn admit_tab(mandate: &crate::envelope::Mandate, t: &Tab, sent: &Resource) -> Result<(), String> {
    let origins: Vec<&String> = mandate
        .allow
        .iter()
        .filter_map(|a| match a {
            Allow::Receiver { id, key, origins }
                if id == &t.receiver.id && key == &t.receiver.key =>
            {
                Some(origins)
            }
            _ => None,
        })
        .flatten()
        .collect();
    if !mandate
        .allow
        .iter()
        .any(|a| matches!(a, Allow::Receiver { id, key, .. } if id == &t.receiver.id && key == &t.receiver.key))
    {
        return Err(format!(
            "receiver {} (key {}) is not in mandate {}'s allowlist",
            t.receiver.id, t.receiver.key, mandate.id
        ));
    }
    if t.origin != sent.origin {
        return Err(format!(
            "tab {} of {} names origin {}, but the request that was offered it went to {}: if {} is this receiver, add \"{}\" to [receiver] origins",
            t.id, t.receiver.id, t.origin, sent.origin, sent.origin, sent.origin
        ));
    }
    if !origins.iter().any(|o| **o == sent.origin) {
        return Err(format!(
            "receiver {} is not allowlisted at {}",
            t.receiver.id, sent.origin
        ));
    }
    if t.price_of(&sent.method, &sent.path).is_none() {
        return Err(format!(
            "tab {} does not cover {} {}, the request that was offered it",
            t.id, sent.method, sent.path
        ));
    }
    Ok(())
}
