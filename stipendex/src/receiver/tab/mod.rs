//! Tab sessions at the receiver (`docs/stipendex-profile.md` §4b): one hold, many paid calls,
//! one settlement.
//!
//! 1. [`Receiver::offer_tab`]: beside a Quote, a signed [`Tab`] for the request's capability —
//!    its cap, end, lanes, the fixed prices it covers, and a hold offer from every rail that can
//!    hold *and* capture part of a hold;
//! 2. [`Receiver::open_tab`]: the wallet's hold Proof, verified on its rail once;
//! 3. per call, [`Receiver::tab_call`] with the wallet's [`Voucher`] (the lane's next sequence,
//!    the call's price, the tab's cap never passed; one compare-and-set of the tab's record
//!    before the work), then [`Receiver::tab_answered`];
//! 4. [`Receiver::close_tab`] (the wallet's signed request) or [`Receiver::close_due`] (the
//!    receiver's own, before the hold lapses): capture exactly the lanes' last cumulatives, or
//!    void the hold, and sign the [`TabReceipt`].

mod record;

use std::time::Duration;

use rail_core::clock::rfc3339;
use rail_core::{Charge, Money, OpId, PaymentState, RailError};

use super::{
    ANSWER_GONE, Answer, Delivery, MAX_KEPT_ANSWER, Price, Receiver, Request, checkout_capable,
};
use crate::Error;
use crate::envelope::{
    Confirmation, Digest, LaneEnd, Proof, Signed, Tab, TabClose, TabPrice, TabReceipt, Tag,
    Voucher, new_id, tab_root,
};
pub(crate) use record::Records;
use record::{Durable, Lane, LaneAnswer, Pending, Slot, TabHead, TabRecord};

/// How many times a voucher applied to a copy of its tab that another instance's write made
/// stale is applied again (to the record read afresh) before the wallet is told to send it
/// again (`in_progress`). Each stale copy means another instance wrote the tab meanwhile, so
/// the instances together always move on; this keeps one wallet's call from starving.
const REAPPLY: u32 = 4;

/// How a receiver offers tabs ([`super::Builder::tabs`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TabTerms {
    /// The cap held when a tab opens; its asset picks the fixed prices the tab covers.
    pub cap: Money,
    /// How long a tab lasts at most (default one hour).
    pub ttl: Duration,
    /// How many lanes (parallel calls) a tab has (default 8, at most [`crate::envelope::MAX_LANES`]).
    pub lanes: u16,
    /// How long before the hold lapses the tab ends, so the receiver captures in time
    /// (default 5 minutes).
    pub margin: Duration,
}

impl TabTerms {
    /// Tabs of `cap`, one hour, 8 lanes, a 5-minute capture margin.
    #[must_use]
    pub fn new(cap: Money) -> Self {
        TabTerms {
            cap,
            ttl: Duration::from_secs(3600),
            lanes: 8,
            margin: Duration::from_secs(300),
        }
    }

    /// With a TTL.
    #[must_use]
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// With `lanes` lanes.
    #[must_use]
    pub fn lanes(mut self, lanes: u16) -> Self {
        self.lanes = lanes;
        self
    }

    /// With a capture margin.
    #[must_use]
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }
}

/// A tab the receiver opened.
#[derive(Clone, Debug)]
pub struct Opened {
    /// The tab.
    pub tab: Signed<Tab>,
    /// No voucher is accepted at or after this (Unix seconds): the earlier of the tab's `exp`
    /// and the hold's lapse less the capture margin.
    pub end: u64,
}

/// What [`Receiver::tab_call`] found for a voucher.
#[derive(Debug)]
pub enum TabCall {
    /// A new call, paid by its voucher: run it, then [`Receiver::tab_answered`].
    Run(Box<Serving>),
    /// The same voucher again after its call was answered: the kept answer.
    Answered {
        /// The voucher, by digest.
        voucher: Digest,
        /// Its answer.
        answer: Box<Answer>,
    },
    /// The price hook waived the call: run it for free; the voucher is not counted (say so to
    /// the wallet, which signs the lane's next voucher with the same sequence).
    Waived {
        /// The voucher, by digest.
        voucher: Digest,
    },
}

/// A call paid by a voucher, being served.
#[derive(Debug)]
#[must_use = "hand it to Receiver::tab_answered"]
pub struct Serving {
    /// The voucher.
    pub voucher: Signed<Voucher>,
    /// The call's price (the voucher's increment).
    pub price: Money,
    /// [`Delivery::Again`] when an instance accepted this voucher and stopped before its
    /// answer was kept: run it again only if the request is idempotent.
    pub delivery: Delivery,
    /// The lane as it was before this voucher (a first delivery), to take the voucher back if
    /// the call never reaches the service ([`Receiver::tab_undelivered`]).
    before: Option<Box<Lane>>,
}

fn voucher_err(code: &'static str, why: String) -> Error {
    Error::Voucher { code, why }
}

/// The rail operation of a tab's capture or void: the receiver's own id, never the wallet's.
fn tab_op(what: &str, tab: &str) -> Result<OpId, Error> {
    OpId::new(format!("{what}-{tab}")).map_err(Error::Payment)
}

impl Receiver {
    /// The tab offered beside the Quote of `req`: `None` when the receiver offers no tabs
    /// ([`super::Builder::tabs`]), when `req` is not priced at a fixed price in the tab's asset,
    /// or when it has no origin.
    ///
    /// # Errors
    /// [`Error::NoRail`] (no rail can hold the cap) and the other errors of a Quote's offers.
    pub async fn offer_tab(&self, req: &Request) -> Result<Option<Signed<Tab>>, Error> {
        self.offer_tab_on(self.decide(req), req).await
    }

    /// [`Receiver::offer_tab`] for `req`, decided to fall under `cap`.
    pub(crate) async fn offer_tab_on(
        &self,
        cap: Option<&super::PricedCapability>,
        req: &Request,
    ) -> Result<Option<Signed<Tab>>, Error> {
        let me = &self.0;
        let Some(terms) = &me.tab_terms else {
            return Ok(None);
        };
        let Some(origin) = &req.origin else {
            return Ok(None);
        };
        let covered = |p: &Price| match p {
            Price::Fixed(m) => {
                m.asset() == terms.cap.asset()
                    && m.amount() <= terms.cap.amount()
                    && !m.amount().is_zero()
            }
            Price::Estimate { .. } => false,
        };
        match cap {
            Some(c) if covered(&c.price) => {}
            _ => return Ok(None),
        }
        let prices: Vec<TabPrice> = me
            .capabilities
            .iter()
            .filter(|c| covered(&c.price))
            .filter_map(|c| match &c.price {
                Price::Fixed(m) => Some(TabPrice {
                    method: c.method().to_owned(),
                    pattern: c.name().to_owned(),
                    amount: m.amount(),
                }),
                Price::Estimate { .. } => None,
            })
            .collect();
        let id = new_id("t_");
        let mut charge = Charge::hold(terms.cap.clone(), terms.ttl.saturating_add(terms.margin));
        charge.description = format!("tab of up to {}", terms.cap);
        charge.reference = Some(id.clone());
        let rails = self.rail_offers(req, &charge).await?;
        let now = super::now_secs(&me.clock);
        let tab = Tab {
            stipendex: Tag::current("tab"),
            id,
            receiver: me.party.clone(),
            origin: origin.clone(),
            iat: now,
            exp: now.saturating_add(terms.ttl.as_secs()),
            asset: terms.cap.asset().clone(),
            cap: terms.cap.amount(),
            prices,
            lanes: terms.lanes,
            rails,
        };
        Signed::sign(tab, &me.key).map(Some)
    }

    /// [`Receiver::offer_tab`] beside `quote`, the Quote made for `req`: none when the price
    /// hook priced the request otherwise than its list price, which the tab lists (a voucher at
    /// the tab's price would be refused as `wrong_price`: the wallet pays the Quote instead).
    ///
    /// # Errors
    /// As [`Receiver::offer_tab`].
    pub async fn offer_tab_beside(
        &self,
        req: &Request,
        quote: &Signed<crate::envelope::Quote>,
    ) -> Result<Option<Signed<Tab>>, Error> {
        self.offer_tab_beside_on(self.decide(req), req, quote).await
    }

    /// [`Receiver::offer_tab_beside`] for `req`, decided to fall under `cap`.
    pub(crate) async fn offer_tab_beside_on(
        &self,
        cap: Option<&super::PricedCapability>,
        req: &Request,
        quote: &Signed<crate::envelope::Quote>,
    ) -> Result<Option<Signed<Tab>>, Error> {
        let Some(Price::Fixed(listed)) = cap.map(|c| &c.price) else {
            return Ok(None);
        };
        let q = quote.object();
        if &q.asset != listed.asset() || q.amount != Some(listed.amount()) {
            return Ok(None);
        }
        self.offer_tab_on(cap, req).await
    }

    /// Opens the tab whose hold Proof is `proof` (compact JWS): the tab must be this
    /// receiver's, not ended, and held in full on a rail it accepts, which verifies the hold
    /// once. The same Proof again answers the same; another Proof for an opened tab is refused.
    ///
    /// # Errors
    /// [`Error::Untrusted`] (another receiver's tab), [`Error::Expired`], [`Error::NoRail`],
    /// [`Error::Mismatch`], [`Error::QuoteUsed`] (the tab was opened by another Proof),
    /// [`Error::Payment`] (the rail refused the hold), [`Error::Storage`].
    pub async fn open_tab(&self, proof: &str) -> Result<Opened, Error> {
        let me = &self.0;
        let proof = Signed::<Proof>::parse(proof)?;
        let p = proof.object();
        let Some(tab_jws) = &p.tab_jws else {
            return Err(Error::Mismatch(
                "the proof does not hold a tab: present it as a payment, not a tab opening".into(),
            ));
        };
        let tab = Signed::<Tab>::parse(tab_jws)?;
        let t = tab.object();
        if t.receiver != me.party {
            return Err(Error::Untrusted(format!(
                "the proof holds a tab of {} ({}), not of this receiver",
                t.receiver.id, t.receiver.key
            )));
        }
        let now = super::now_secs(&me.clock);
        if now >= t.exp {
            return Err(Error::Expired {
                what: "tab",
                id: t.id.clone(),
                why: format!("it ended at {}, and it is {}", rfc3339(t.exp), rfc3339(now)),
            });
        }
        if p.money()? != t.cap()? {
            return Err(Error::Mismatch(format!(
                "the proof holds {} {}, tab {} caps at {} {}",
                p.amount, p.asset, t.id, t.cap, t.asset
            )));
        }
        if let Some(jws) = &p.confirmation_jws {
            let c = Signed::<Confirmation>::parse(jws)?;
            let co = c.object();
            if co.wallet != p.wallet || &co.quote != tab.digest() || co.mandate != p.mandate {
                return Err(Error::Mismatch(
                    "the confirmation is not the proof's wallet's, under its mandate, for this tab"
                        .into(),
                ));
            }
        }
        let Some(offer) = t.offer(&p.rail) else {
            return Err(Error::NoRail(format!(
                "the proof holds over {}, which tab {} does not accept",
                p.rail, t.id
            )));
        };
        let Some(rail) = me
            .rails
            .iter()
            .find(|r| r.handle.receiver.id().as_str() == p.rail && checkout_capable(r))
        else {
            return Err(Error::NoRail(format!(
                "this receiver has no {} rail that holds and captures part of a hold",
                p.rail
            )));
        };
        // Nothing is kept for a tab until its hold is verified: a refused opening (a bogus
        // payment, another wallet's tab, a made-up one) leaves no entry behind, whoever sends it
        // and however often. An opened tab answers from this instance's copy or the store.
        if let Some(entry) = me.tabs.existing(&t.id) {
            let guard = entry.state.lock().await;
            if let Some(s) = guard.as_ref() {
                return opened_again(s, &proof);
            }
        }
        if let Some(s) = me.tabs.load(&t.id).await? {
            return opened_again(&s, &proof);
        }
        let op = super::answers::verify_op(proof.digest().as_str())?;
        let verified = rail
            .handle
            .receiver
            .verify_as(&op, offer, &p.payment)
            .await
            .map_err(|e| match e {
                RailError::Replayed { .. } => Error::QuoteUsed(t.id.clone()),
                e => Error::Payment(e),
            })?;
        let margin = me.tab_terms.as_ref().map_or(Duration::ZERO, |m| m.margin);
        let lapse = match &verified.state {
            PaymentState::Held {
                expires_at: Some(at),
                ..
            } => u64::try_from(at.unix_seconds()).unwrap_or(0),
            _ => u64::MAX,
        };
        let end = t.exp.min(lapse.saturating_sub(margin.as_secs()));
        let holds = rail
            .handle
            .hold_receiver
            .clone()
            .ok_or_else(|| Error::NoRail(format!("rail {} cannot hold", rail.name)))?;
        if end <= now {
            // Held, but it lapses before a call could be captured: give it back.
            if let Err(e) = holds.void(&tab_op("void", &t.id)?, &verified).await {
                tracing::warn!(tab = %t.id, error = %e, "could not void a hold that lapses too soon");
            }
            return Err(Error::Expired {
                what: "tab",
                id: t.id.clone(),
                why: format!(
                    "its hold lapses at {}, within the {} s capture margin",
                    rfc3339(lapse),
                    margin.as_secs()
                ),
            });
        }
        let head = TabHead {
            proof: proof.jws().to_owned(),
            rail: rail.name.clone(),
            verified,
            end,
        };
        let rec = TabRecord {
            lanes: vec![Lane::default(); usize::from(t.lanes)],
            ..TabRecord::default()
        };
        let entry = me.tabs.entry(&t.id);
        let mut guard = entry.state.lock().await;
        let created = match guard.as_ref() {
            Some(s) => Err(opened_again(s, &proof)),
            None => match me.tabs.create(&t.id, &head, &rec).await {
                Ok(Ok(s)) => {
                    tracing::info!(tab = %t.id, rail = %rail.name, cap = %t.cap, end, "tab opened");
                    *guard = Some(s);
                    entry.new_copy();
                    Ok(Opened {
                        tab: tab.clone(),
                        end,
                    })
                }
                Ok(Err(s)) => {
                    let out = opened_again(&s, &proof);
                    *guard = Some(s);
                    entry.new_copy();
                    Err(out)
                }
                Err(e) => {
                    drop(guard);
                    me.tabs.forget_idle(&t.id);
                    return Err(e);
                }
            },
        };
        match created {
            Ok(opened) | Err(Ok(opened)) => Ok(opened),
            Err(Err(e)) => {
                // Another Proof opened the tab meanwhile: this one's hold is not the tab's, so
                // it is given back (under an operation of its own, not the tab's void).
                drop(guard);
                let op = OpId::new(format!("void-{}", op.as_str())).map_err(Error::Payment)?;
                if let Err(v) = holds.void(&op, &head.verified).await {
                    tracing::warn!(tab = %t.id, error = %v, "could not void the hold of a second opening");
                }
                Err(e)
            }
        }
    }

    /// A call of `req` paid by `voucher` (compact JWS) inside an open tab. A new voucher (the
    /// lane's next sequence, the call's price, the cap not passed, before the tab's end) is
    /// recorded before the call runs; the same voucher again gets the lane's kept answer, or
    /// `answer_gone` when it is not kept any more (not run again, nothing more charged).
    ///
    /// # Errors
    /// [`Error::TabClosed`]; [`Error::Voucher`] naming the rule broken (`answer_gone`,
    /// `voucher_replayed`,
    /// `voucher_out_of_order`, `equivocation` — the tab is then closed —, `above_cap`,
    /// `wrong_price`, `bad_cumulative`, `not_covered`); [`Error::Mismatch`] (another tab,
    /// request or wallet); [`Error::Payment`] with [`RailError::InProgress`] while the same
    /// voucher is being served, or when other instances kept writing the tab while this one
    /// applied it (it was applied again, up to four more times, to the record read afresh):
    /// the same voucher again is checked afresh; [`Error::Storage`].
    pub async fn tab_call(&self, req: &Request, voucher: &str) -> Result<TabCall, Error> {
        self.tab_call_on(self.decide(req), req, voucher).await
    }

    /// [`Receiver::tab_call`] for `req`, decided to fall under `cap`.
    pub(crate) async fn tab_call_on(
        &self,
        cap: Option<&super::PricedCapability>,
        req: &Request,
        voucher: &str,
    ) -> Result<TabCall, Error> {
        let me = &self.0;
        let v = Signed::<Voucher>::parse(voucher)?;
        let vo = v.object();
        // The price hook runs for every call inside a tab, as for every priced request: it is
        // authorisation as much as pricing. A refusal or a waiver takes nothing (the voucher is
        // not counted); a price other than the tab's is `wrong_price` (the wallet pays the
        // Quote instead).
        let hook = match cap {
            Some(cap) => match me.resolve.resolve(cap, req).await {
                super::Decision::Reject { message } => return Err(Error::Rejected(message)),
                super::Decision::Waive => {
                    return Ok(TabCall::Waived {
                        voucher: v.digest().clone(),
                    });
                }
                super::Decision::Quote { price, .. } => Some(price),
            },
            None => None,
        };
        // A voucher applied to a copy another instance's write made stale is applied again to
        // the record read afresh, a few times, before the wallet is told to send it again.
        let mut reread = 0;
        loop {
            let entry = me.tabs.entry(&vo.tab);
            let accepted = {
                let mut guard = entry.state.lock().await;
                let mut fresh = false;
                if guard.is_none() {
                    *guard = me.tabs.load(&vo.tab).await?;
                    entry.new_copy();
                    fresh = true;
                }
                let now = super::now_secs(&me.clock);
                let step = match guard.as_mut() {
                    None => Err(Error::TabClosed {
                        tab: vo.tab.clone(),
                        why: "this receiver has not opened it".into(),
                    }),
                    Some(s) => self.check_voucher(s, &v, (cap, req), now, hook.as_ref()),
                };
                // A refusal is final only against the record as the store holds it: this
                // instance's copy may be behind another instance's writes (a sequence it has not
                // seen, a tab it has not opened). Read it again and check again.
                // A copy the store still holds as it is (no other instance wrote since) is current:
                // its refusal stands, and its answers not yet written are kept.
                let current = match guard.as_ref() {
                    Some(s) if step.is_err() && !fresh => {
                        me.tabs.unchanged(&vo.tab, s.token).await?
                    }
                    _ => false,
                };
                let step = match step {
                    Err(_) if !fresh && !current => {
                        *guard = me.tabs.load(&vo.tab).await?;
                        entry.new_copy();
                        match guard.as_mut() {
                            None => Err(Error::TabClosed {
                                tab: vo.tab.clone(),
                                why: "this receiver has not opened it".into(),
                            }),
                            Some(s) => self.check_voucher(s, &v, (cap, req), now, hook.as_ref()),
                        }
                    }
                    other => other,
                };
                if guard.is_none() {
                    // No such tab here: nothing of it is kept (a flood of vouchers naming made-up
                    // tabs, each signed by a key of its own, must not grow this instance's memory).
                    drop(guard);
                    me.tabs.forget(&vo.tab);
                    return Err(step.err().unwrap_or_else(|| Error::TabClosed {
                        tab: vo.tab.clone(),
                        why: "this receiver has not opened it".into(),
                    }));
                }
                let Some(s) = guard.as_mut() else {
                    return Err(Error::TabClosed {
                        tab: vo.tab.clone(),
                        why: "this receiver has not opened it".into(),
                    });
                };
                match step? {
                    Step::Answered => {
                        // Its answer: waiting here for its write, else as the lane's key holds it
                        // (written here or at another instance), if it answers this very call.
                        let waiting = s
                            .pending
                            .get(&vo.lane)
                            .filter(|p| p.seq == vo.seq)
                            .and_then(Pending::answer);
                        let answer = match waiting {
                            Some(a) => Some(a),
                            None => {
                                me.tabs
                                    .read_answer(&vo.tab, vo.lane, vo.seq, v.digest())
                                    .await?
                            }
                        };
                        let Some(answer) = answer else {
                            tracing::info!(tab = %vo.tab, lane = vo.lane, seq = vo.seq, "the same voucher again: its answer is no longer kept (answer_gone)");
                            return Err(voucher_err(
                                ANSWER_GONE,
                                format!(
                                    "lane {} sequence {} of tab {} was answered and its answer is no longer kept (too large, dropped to keep this receiver's kept answers within their bound, or lost with an instance that stopped): it is not run again and nothing more is charged",
                                    vo.lane, vo.seq, vo.tab
                                ),
                            ));
                        };
                        return Ok(TabCall::Answered {
                            voucher: v.digest().clone(),
                            answer: Box::new(answer),
                        });
                    }
                    Step::Again => {
                        s.serving.insert((vo.lane, vo.seq));
                        return Ok(TabCall::Run(Box::new(Serving {
                            price: vo.money()?,
                            voucher: v.clone(),
                            delivery: Delivery::Again,
                            before: None,
                        })));
                    }
                    Step::Equivocation => {
                        s.rec.evidence.push(v.jws().to_owned());
                        s.version += 1;
                        let (version, generation) = (s.version, entry.generation());
                        drop(guard);
                        if let Err(e) = me.tabs.durable(&vo.tab, &entry, version, generation).await
                        {
                            tracing::warn!(tab = %vo.tab, error = %e, "could not keep an equivocating voucher as evidence");
                        }
                        tracing::warn!(tab = %vo.tab, lane = vo.lane, seq = vo.seq, "equivocating voucher: kept as evidence, the tab is closed");
                        if let Err(e) = self.settle_tab(&vo.tab).await {
                            tracing::error!(tab = %vo.tab, error = %e, "could not close a tab after equivocation");
                        }
                        return Err(voucher_err(
                            "equivocation",
                            format!(
                                "lane {} already has another voucher with sequence {}: the tab is closed",
                                vo.lane, vo.seq
                            ),
                        ));
                    }
                    Step::Accept { lane, total } => {
                        let mut before = None;
                        if let Some(l) = s.rec.lanes.get_mut(usize::from(vo.lane)) {
                            before = Some(Box::new(std::mem::replace(l, *lane)));
                        }
                        s.rec.total = total;
                        s.version += 1;
                        s.serving.insert((vo.lane, vo.seq));
                        (s.version, entry.generation(), before)
                    }
                }
            };
            let (version, generation, before) = accepted;
            // Durable before the call runs: one write of the tab's record, shared with every
            // voucher of the tab applied meanwhile.
            match me
                .tabs
                .durable_or_reread(&vo.tab, &entry, version, generation)
                .await?
            {
                Durable::Written => {
                    return Ok(TabCall::Run(Box::new(Serving {
                        price: vo.money()?,
                        voucher: v.clone(),
                        delivery: Delivery::First,
                        before,
                    })));
                }
                Durable::Reread if reread < REAPPLY => reread += 1,
                Durable::Reread => return Err(record::reread(&vo.tab)),
            }
        }
    }

    /// The call paid by `serving` never reached the service (nothing was sent: the connection
    /// was refused): its voucher is taken back. The lane returns to its state before it — made
    /// durable before this returns — so the wallet's next voucher on the lane carries the same
    /// sequence and cumulative, and nothing is charged for it.
    ///
    /// # Errors
    /// [`Error::Storage`] when the lane cannot be given back (it moved on, the tab is closing,
    /// or the write failed): the voucher then stays counted, its call unanswered (the same
    /// voucher again runs it, as after a stop).
    pub async fn tab_undelivered(&self, serving: Serving) -> Result<(), Error> {
        let me = &self.0;
        let vo = serving.voucher.object();
        let entry = me.tabs.entry(&vo.tab);
        let (version, generation) = {
            let mut guard = entry.state.lock().await;
            let Some(s) = guard.as_mut() else {
                return Err(Error::Storage(format!(
                    "tab {} was read again meanwhile: its voucher stays counted",
                    vo.tab
                )));
            };
            s.serving.remove(&(vo.lane, vo.seq));
            let Some(before) = serving.before else {
                return Err(Error::Storage(
                    "a call delivered again is not taken back".into(),
                ));
            };
            if s.rec.closing || s.rec.closed.is_some() {
                return Err(Error::Storage(format!(
                    "tab {} is closing with this voucher counted",
                    vo.tab
                )));
            }
            let total = s.rec.total.checked_sub(vo.amount).ok();
            let Some(l) = s.rec.lanes.get_mut(usize::from(vo.lane)) else {
                return Err(Error::Storage("no such lane".into()));
            };
            let last = l.voucher.as_ref() == Some(serving.voucher.digest());
            let (true, false, Some(total)) = (last && l.seq == vo.seq, l.answered, total) else {
                return Err(Error::Storage(format!(
                    "lane {} of tab {} moved on: its voucher stays counted",
                    vo.lane, vo.tab
                )));
            };
            *l = *before;
            s.rec.total = total;
            s.version += 1;
            (s.version, entry.generation())
        };
        me.tabs
            .durable(&vo.tab, &entry, version, generation)
            .await?;
        tracing::info!(tab = %vo.tab, lane = vo.lane, seq = vo.seq, "a call that never reached the service: its voucher is taken back");
        Ok(())
    }

    /// The call paid by `serving` was answered with `answer`, whose result digest is `result`
    /// (over HTTP the body's, over MCP the canonical result's): its (voucher, result) leaf joins
    /// the lane's tree and the answer is kept for the same voucher again — at most
    /// [`MAX_KEPT_ANSWER`] bytes of body, within the instance's bound on kept answers (room is
    /// made now: older kept answers may be dropped, oldest first). The answer is written under
    /// its lane's own key with the tab's next write (the next voucher, [`Receiver::flush_tabs`],
    /// or the close), before the record: an instance that stops before loses the kept answer,
    /// never the payment.
    pub async fn tab_answered(&self, serving: Serving, answer: Answer, result: &Digest) {
        let me = &self.0;
        let vo = serving.voucher.object();
        let kept = if answer.status != 0 && answer.body.len() <= MAX_KEPT_ANSWER {
            let value = serde_json::to_string(&LaneAnswer {
                seq: vo.seq,
                voucher: serving.voucher.digest().clone(),
                answer,
            });
            match value {
                Ok(v) => match me.tabs.keep().reserve(v.len() as u64).await {
                    Some(room) => Some((v, room)),
                    None => {
                        tracing::warn!(tab = %vo.tab, lane = vo.lane, seq = vo.seq, "no room to keep a call's answer; the same voucher again is answer_gone");
                        None
                    }
                },
                Err(e) => {
                    tracing::warn!(tab = %vo.tab, error = %e, "could not encode a call's answer; the same voucher again is answer_gone");
                    None
                }
            }
        } else {
            None
        };
        let entry = me.tabs.entry(&vo.tab);
        let mut guard = entry.state.lock().await;
        if let Some(s) = guard.as_mut() {
            s.serving.remove(&(vo.lane, vo.seq));
            if record_answer(s, vo.lane, vo.seq, result, kept) {
                s.dirty = true;
                s.answers_seen = s.answers_seen.wrapping_add(1);
            }
        }
    }

    /// Writes the answers given since each cached tab's last write (call it now and then: the
    /// HTTP binding does every second).
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub async fn flush_tabs(&self) -> Result<(), Error> {
        let me = &self.0;
        for id in me.tabs.cached() {
            let entry = me.tabs.entry(&id);
            let _w = entry.writer.lock().await;
            let mut guard = entry.state.lock().await;
            let Some(s) = guard.as_mut() else { continue };
            if !s.dirty || s.rec.closed.is_some() {
                continue;
            }
            if !me.tabs.put(&id, &entry, s).await? {
                // Another instance wrote it: these answers are dropped (the calls stay paid),
                // and the record is read again on the next voucher.
                *guard = None;
                entry.new_copy();
            }
        }
        Ok(())
    }

    /// The wallet asks to close its tab (`close`: a [`TabClose`], compact JWS, signed by the
    /// key that held it): captures exactly the lanes' last cumulatives (or voids the hold when
    /// no call came) and signs the closing Receipt. Closing a closed tab answers its Receipt.
    ///
    /// # Errors
    /// [`Error::TabClosed`] (unknown), [`Error::Mismatch`] (another wallet or tab),
    /// [`Error::Payment`] (the capture failed: nothing is closed; ask again), [`Error::Storage`].
    pub async fn close_tab(&self, close: &str) -> Result<Signed<TabReceipt>, Error> {
        let me = &self.0;
        let c = Signed::<TabClose>::parse(close)?;
        let co = c.object();
        let entry = me.tabs.entry(&co.tab);
        {
            let mut guard = entry.state.lock().await;
            if guard.is_none() {
                *guard = me.tabs.load(&co.tab).await?;
                entry.new_copy();
            }
            let Some(s) = guard.as_ref() else {
                drop(guard);
                me.tabs.forget(&co.tab);
                return Err(Error::TabClosed {
                    tab: co.tab.clone(),
                    why: "this receiver has not opened it".into(),
                });
            };
            if &co.tab_digest != s.tab.digest() || co.wallet != s.wallet {
                return Err(Error::Mismatch(format!(
                    "the close request is not signed by the wallet that opened tab {}",
                    co.tab
                )));
            }
        }
        self.settle_tab(&co.tab).await
    }

    /// How many tabs this instance keeps a copy of (for metrics; closed and unknown tabs are
    /// forgotten).
    #[must_use]
    pub fn tabs_cached(&self) -> usize {
        self.0.tabs.cached().len()
    }

    /// Starts, once per receiver and only if it offers tabs, a task on the current Tokio runtime
    /// that every `every` writes the tabs' answers ([`Receiver::flush_tabs`]) and closes the
    /// tabs whose end has come ([`Receiver::close_due`]); it ends when the receiver is dropped.
    /// `None` if it was started before, the receiver offers no tabs, or no runtime runs.
    pub fn spawn_tab_keeper(&self, every: Duration) -> Option<tokio::task::JoinHandle<()>> {
        use std::sync::atomic::Ordering;
        self.0.tab_terms.as_ref()?;
        let handle = tokio::runtime::Handle::try_current().ok()?;
        if self.0.keeper.swap(true, Ordering::SeqCst) {
            return None;
        }
        let weak = std::sync::Arc::downgrade(&self.0);
        Some(handle.spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(inner) = weak.upgrade() else { break };
                let r = Receiver(inner);
                if let Err(e) = r.flush_tabs().await {
                    tracing::warn!(error = %e, "could not write the tabs' answers");
                }
                if let Err(e) = r.close_due().await {
                    tracing::error!(error = %e, "could not close the tabs due");
                }
            }
        }))
    }

    /// Closes every tab this instance serves whose end has come (the receiver closes before
    /// the hold lapses, or it loses the calls it served); returns their Receipts. Call it
    /// now and then (the HTTP binding does every second).
    ///
    /// # Errors
    /// The first error met (the other tabs are still closed).
    pub async fn close_due(&self) -> Result<Vec<Signed<TabReceipt>>, Error> {
        let me = &self.0;
        let now = super::now_secs(&me.clock);
        let mut out = Vec::new();
        let mut first = None;
        for id in me.tabs.cached() {
            let entry = me.tabs.entry(&id);
            let (due, closed) = {
                let guard = entry.state.lock().await;
                (
                    guard
                        .as_ref()
                        .is_some_and(|s| s.rec.closed.is_none() && now >= s.head.end),
                    guard.as_ref().is_some_and(|s| s.rec.closed.is_some()),
                )
            };
            if !due {
                if closed {
                    me.tabs.forget(&id);
                } else {
                    // An entry with no tab read into it (what a refused request left while it
                    // was being checked) is dropped; a tab being served is not.
                    drop(entry);
                    me.tabs.forget_idle(&id);
                }
                continue;
            }
            match self.settle_tab(&id).await {
                Ok(r) => out.push(r),
                Err(e) => {
                    tracing::error!(tab = %id, error = %e, "could not close a tab at its end");
                    first.get_or_insert(e);
                }
            }
        }
        match first {
            Some(e) if out.is_empty() => Err(e),
            _ => Ok(out),
        }
    }

    /// Closes tab `id` (holding the tab's writer lock, then its state): reads the record as
    /// the store holds it, marks it closing (a compare-and-set: from then on no instance
    /// accepts a voucher, so its total is final), captures that total or voids the hold, signs
    /// the Receipt and writes it. A close that races another, or a voucher at another instance,
    /// reads again; the rail's capture is one operation per tab, of the one final total.
    async fn settle_tab(&self, id: &str) -> Result<Signed<TabReceipt>, Error> {
        let me = &self.0;
        let entry = me.tabs.entry(id);
        let _w = entry.writer.lock().await;
        let mut guard = entry.state.lock().await;
        let bump = || entry.new_copy();
        for _ in 0..8 {
            // This instance's copy is used only if the store still holds the version it read
            // (the compare-and-set marking it closing proves it, and writes the answers it
            // kept); otherwise the record is read again: another instance may have accepted
            // vouchers since.
            if guard.is_none() {
                *guard = me.tabs.load(id).await?;
                bump();
            }
            let Some(s) = guard.as_mut() else {
                return Err(Error::TabClosed {
                    tab: id.to_owned(),
                    why: "this receiver has not opened it".into(),
                });
            };
            if let Some(r) = &s.rec.closed {
                return Signed::parse(r);
            }
            if !s.rec.closing {
                // Answers of a tab being closed are not written: no voucher is served any more.
                s.pending.clear();
                s.rec.closing = true;
                s.version += 1;
                if !me.tabs.put(id, &entry, s).await? {
                    *guard = None;
                    continue;
                }
            }
            let tab = s.tab.clone();
            let t = tab.object();
            let proof = Signed::<Proof>::parse(&s.head.proof)?;
            let mut rec = s.rec.clone();
            // A call accepted and never answered (lost, or still running) joins its lane's
            // tree with no result.
            for lane in &mut rec.lanes {
                if lane.seq > 0 && !lane.answered {
                    close_lost(lane);
                }
            }
            let captured = Money::new(t.asset.clone(), rec.total)
                .map_err(|e| Error::Malformed(format!("tab total: {e}")))?;
            if captured.amount() > t.cap()?.amount() {
                return Err(Error::CaptureAbove(format!(
                    "tab {}: the vouchers add up to {captured}, above the cap {}",
                    t.id, t.cap
                )));
            }
            let holds = me
                .rails
                .iter()
                .find(|r| r.name == s.head.rail)
                .and_then(|r| r.handle.hold_receiver.clone())
                .ok_or_else(|| Error::NoRail(format!("rail {} cannot hold", s.head.rail)))?;
            let reference = if captured.amount().is_zero() {
                holds
                    .void(&tab_op("void", id)?, &s.head.verified)
                    .await
                    .map_err(Error::Payment)?;
                format!("void:{}", s.head.verified.payment_ref)
            } else {
                holds
                    .capture(&tab_op("capture", id)?, &s.head.verified, &captured)
                    .await
                    .map_err(Error::Payment)?
                    .capture_ref
            };
            let mut ends = Vec::new();
            let mut roots = Vec::new();
            for (n, lane) in rec.lanes.iter().enumerate() {
                roots.push(lane.tree.root());
                if lane.seq == 0 {
                    continue;
                }
                let Some(v) = &lane.voucher else { continue };
                ends.push(LaneEnd {
                    lane: u16::try_from(n).unwrap_or(u16::MAX),
                    seq: lane.seq,
                    cumulative: lane.cumulative,
                    voucher: v.clone(),
                });
            }
            let receipt = Signed::sign(
                TabReceipt {
                    stipendex: Tag::current("tab-receipt"),
                    id: new_id("tr_"),
                    receiver: me.party.clone(),
                    tab: t.id.clone(),
                    tab_digest: tab.digest().clone(),
                    proof: proof.digest().clone(),
                    iat: super::now_secs(&me.clock),
                    asset: t.asset.clone(),
                    cap: t.cap,
                    captured: captured.amount(),
                    calls: ends.iter().map(|l| l.seq).sum(),
                    lanes: ends,
                    root: tab_root(&roots),
                    rail: proof.object().rail.clone(),
                    reference,
                },
                &me.key,
            )?;
            rec.closed = Some(receipt.jws().to_owned());
            let before = std::mem::replace(&mut s.rec, rec);
            if me.tabs.put(id, &entry, s).await? {
                tracing::info!(tab = %id, captured = %captured, calls = receipt.object().calls, "tab closed");
                me.tabs.remove_answers(id, &s.answer_tokens).await;
                s.answer_tokens.clear();
                return Ok(receipt);
            }
            s.rec = before;
            // Another instance closed it meanwhile: read it again (its Receipt).
            *guard = None;
        }
        Err(Error::Storage(format!(
            "tab {id} kept changing under contention"
        )))
    }
}

/// What checking a voucher against a tab's record decided.
enum Step {
    /// Accept it: the lane's new state and the tab's new total.
    Accept {
        lane: Box<Lane>,
        total: rail_core::Amount,
    },
    /// The same voucher again, answered: its answer, if it is kept.
    Answered,
    /// The same voucher again, accepted by an instance that stopped before answering.
    Again,
    /// Another voucher with the lane's last sequence.
    Equivocation,
}

impl Receiver {
    fn check_voucher(
        &self,
        s: &Slot,
        v: &Signed<Voucher>,
        (cap, req): (Option<&super::PricedCapability>, &Request),
        now: u64,
        hook: Option<&Price>,
    ) -> Result<Step, Error> {
        let vo = v.object();
        let (tab, wallet) = (&s.tab, s.wallet);
        let t = tab.object();
        if s.rec.closed.is_some() || s.rec.closing {
            return Err(Error::TabClosed {
                tab: t.id.clone(),
                why: "it was closed".into(),
            });
        }
        if &vo.tab_digest != tab.digest() {
            return Err(Error::Mismatch(format!(
                "the voucher names tab {} by another digest",
                vo.tab
            )));
        }
        if vo.wallet != wallet {
            return Err(Error::Mismatch(format!(
                "the voucher is signed by {}, not by the wallet that opened tab {}",
                vo.wallet, t.id
            )));
        }
        if now >= s.head.end {
            return Err(Error::TabClosed {
                tab: t.id.clone(),
                why: format!(
                    "it ended at {}, and it is {}",
                    rfc3339(s.head.end),
                    rfc3339(now)
                ),
            });
        }
        let Some(lane) = s.rec.lanes.get(usize::from(vo.lane)) else {
            return Err(voucher_err(
                "voucher_out_of_order",
                format!("tab {} has {} lanes, not lane {}", t.id, t.lanes, vo.lane),
            ));
        };
        if vo.request != req.digest() || req.resource().is_some_and(|r| r != vo.resource) {
            return Err(Error::Mismatch(format!(
                "the voucher pays for another request than {} {}",
                req.method, req.name
            )));
        }
        // The call's price: the receiver's one decision, at the tab's price for that pattern.
        let price = cap
            .and_then(|c| {
                t.prices
                    .iter()
                    .find(|p| p.method == c.method() && p.pattern == c.name())
            })
            .ok_or_else(|| {
                voucher_err(
                    "not_covered",
                    format!("tab {} does not cover {} {}", t.id, req.method, req.name),
                )
            })?;
        if let Some(p) = hook {
            let same =
                matches!(p, Price::Fixed(m) if m.asset() == &t.asset && m.amount() == price.amount);
            if !same {
                return Err(voucher_err(
                    "wrong_price",
                    format!(
                        "{} {} is priced otherwise now than tab {}'s {} {}: pay its Quote",
                        req.method, req.name, t.id, price.amount, t.asset
                    ),
                ));
            }
        }
        if vo.asset != t.asset || vo.amount != price.amount {
            return Err(voucher_err(
                "wrong_price",
                format!(
                    "{} {} costs {} {} in tab {}, the voucher adds {} {}",
                    req.method, req.name, price.amount, t.asset, t.id, vo.amount, vo.asset
                ),
            ));
        }
        if vo.seq == lane.seq {
            if lane.voucher.as_ref() != Some(v.digest()) {
                return Ok(Step::Equivocation);
            }
            if lane.answered {
                return Ok(Step::Answered);
            }
            let running = s.serving.contains(&(vo.lane, vo.seq))
                || now
                    < lane
                        .accepted_at
                        .saturating_add(self.0.claim_lease.as_secs());
            if running {
                return Err(Error::Payment(RailError::InProgress {
                    op_id: format!("{}/{}/{}", t.id, vo.lane, vo.seq),
                }));
            }
            return Ok(Step::Again);
        }
        if vo.seq < lane.seq {
            return Err(voucher_err(
                "voucher_replayed",
                format!(
                    "lane {} is at sequence {}; sequence {} was used",
                    vo.lane, lane.seq, vo.seq
                ),
            ));
        }
        if vo.seq != lane.seq.saturating_add(1) {
            return Err(voucher_err(
                "voucher_out_of_order",
                format!(
                    "lane {} is at sequence {}; the next is {}, not {}",
                    vo.lane,
                    lane.seq,
                    lane.seq.saturating_add(1),
                    vo.seq
                ),
            ));
        }
        let want = lane
            .cumulative
            .checked_add(vo.amount)
            .map_err(|e| Error::Malformed(format!("voucher cumulative: {e}")))?;
        if vo.cumulative != want {
            return Err(voucher_err(
                "bad_cumulative",
                format!(
                    "lane {} was at {}; with {} it is {}, not {}",
                    vo.lane, lane.cumulative, vo.amount, want, vo.cumulative
                ),
            ));
        }
        let total = s
            .rec
            .total
            .checked_add(vo.amount)
            .map_err(|e| Error::Malformed(format!("tab total: {e}")))?;
        if total > t.cap {
            return Err(voucher_err(
                "above_cap",
                format!(
                    "tab {} has {} of its cap {} {} used; this call adds {}",
                    t.id, s.rec.total, t.cap, t.asset, vo.amount
                ),
            ));
        }
        let mut next = lane.clone();
        if next.seq > 0 && !next.answered {
            close_lost(&mut next);
        }
        next.seq = vo.seq;
        next.cumulative = vo.cumulative;
        next.voucher = Some(v.digest().clone());
        next.accepted_at = now;
        next.answered = false;
        next.kept = false;
        Ok(Step::Accept {
            lane: Box::new(next),
            total,
        })
    }
}

/// The answer of an opened tab to its opening Proof presented again.
fn opened_again(s: &Slot, proof: &Signed<Proof>) -> Result<Opened, Error> {
    if Digest::of(s.head.proof.trim().as_bytes()) != *proof.digest() {
        return Err(Error::QuoteUsed(s.tab.object().id.clone()));
    }
    Ok(Opened {
        tab: s.tab.clone(),
        end: s.head.end,
    })
}

/// The lane's last call was accepted and never answered: its leaf, with no result.
fn close_lost(lane: &mut Lane) {
    if let Some(v) = &lane.voucher {
        lane.tree.push(v, &Digest::of(b""));
    }
    lane.answered = true;
}

/// Records the answer of lane `lane`'s call `seq` in the slot, if it is still the lane's last
/// call and unanswered: its leaf, and its record to keep (`kept`: a [`LaneAnswer`] and its room),
/// waiting for the tab's next write; `true` if recorded.
fn record_answer(
    s: &mut Slot,
    lane: u16,
    seq: u64,
    result: &Digest,
    kept: Option<(String, crate::receiver::keep::Reserved)>,
) -> bool {
    let Some(l) = s.rec.lanes.get_mut(usize::from(lane)) else {
        return false;
    };
    if l.seq != seq || l.answered {
        return false;
    }
    if let Some(v) = &l.voucher {
        l.tree.push(v, result);
    }
    l.answered = true;
    l.kept = false;
    if let Some((value, room)) = kept {
        s.pending.insert(
            lane,
            Pending {
                seq,
                value: value.into(),
                room: Some(room),
            },
        );
    }
    true
}
