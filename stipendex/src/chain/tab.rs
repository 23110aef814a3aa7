//! A tab's audit chain, verified as it streams: mandate → (confirmation) → tab → hold Proof →
//! vouchers (and the results the wallet received) → the tab's closing Receipt and its root.
//!
//! The wallet journals a tab's chain in this order ([`crate::wallet::Wallet::open_tab`],
//! [`crate::wallet::Wallet::voucher`], [`crate::wallet::Wallet::tab_result`],
//! [`crate::wallet::Wallet::tab_closed`]); [`TabVerifier`] takes its lines one by one and keeps
//! O(lanes) state, so a tab of millions of calls is checked in one pass:
//!
//! | link | checked |
//! |---|---|
//! | `mandate`, `confirmation` | as in a payment's chain; the confirmation binds the tab and consents to its cap |
//! | `tab` | signed by its receiver; the receiver (id and key) allowlisted, at an origin the entry pins; issued while the mandate was valid |
//! | `proof` | signed by the mandate's wallet; binds the mandate, the tab and the confirmation; holds exactly the cap over a rail the tab offers and the mandate allows; the cap within the mandate's `tab_cap`; confirmed where the mandate requires it |
//! | `voucher` | signed by the wallet; for this tab (digest and id); its lane's next sequence (a gap or a repeat breaks it); its cumulative the last plus its amount (never down); its amount the tab's price of its call and within the per-call limit; at the tab's origin; for a call over HTTP, its `request` the request digest of its `resource` ([`Request::from_resource`], [`Request::digest`]; over MCP the digest also covers the arguments, which the resource does not carry); the lanes together never above the cap |
//! | `tab-receipt` | signed by the tab's receiver; binds the tab (digest and id) and the proof; over the proof's rail; issued after the tab; its `cap` (and `asset`) the tab's (its `captured` and `calls` are its lanes' sums: checked when it is parsed); each lane's capture at a voucher the wallet signed (never beyond its last); the root over every call's (voucher, result) when the receiver's lanes end where the wallet's do |

use std::collections::VecDeque;

use rail_core::Amount;
use rail_core::clock::rfc3339;
use serde::Deserialize;

use super::{broken, check_proof_under, claimed_kind};
use crate::Error;
use crate::envelope::{
    CallTree, Confirmation, Digest, Mandate, Proof, PublicKey, Resource, Signed, Tab, TabReceipt,
    Voucher, jws, tab_root,
};
use crate::receiver::Request;
use crate::receiver::price_file::Kind;

/// A tab's chain that verified.
#[derive(Clone, Debug)]
pub struct TabChain {
    /// The mandate.
    pub mandate: Signed<Mandate>,
    /// The confirmation, if a human confirmed the cap.
    pub confirmation: Option<Signed<Confirmation>>,
    /// The tab.
    pub tab: Signed<Tab>,
    /// The hold's Proof.
    pub proof: Signed<Proof>,
    /// How many vouchers the wallet signed.
    pub vouchers: u64,
    /// What they add up to.
    pub spent: Amount,
    /// The closing Receipt, if the tab was closed.
    pub receipt: Option<Signed<TabReceipt>>,
    /// Whether the Receipt's root was recomputed and matched (the receiver's lanes end where
    /// the wallet's do); `false` without a Receipt or when some vouchers never reached it.
    pub root_checked: bool,
}

/// A line the wallet journals after a call's answer: its result,
/// `{"tab_call": {"voucher": "sha256:…", "result": "sha256:…"}}`, or that the receiver did not
/// count the voucher, `{"tab_uncounted": {"voucher": "sha256:…"}}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultLine {
    tab_call: Option<CallResult>,
    tab_uncounted: Option<Uncounted>,
}

#[derive(Deserialize)]
struct Uncounted {
    voucher: Digest,
}

#[derive(Deserialize)]
struct CallResult {
    voucher: Digest,
    result: Digest,
}

/// The journal line of a call's result.
#[must_use]
pub fn result_line(voucher: &Digest, result: &Digest) -> String {
    serde_json::json!({"tab_call": {"voucher": voucher.as_str(), "result": result.as_str()}})
        .to_string()
}

/// The journal line of a voucher the receiver said it did not count (the price hook refused
/// or waived its call, or the call never reached the service): the lane went back to its state
/// before it, and its next voucher carries the same sequence.
#[must_use]
pub fn uncounted_line(voucher: &Digest) -> String {
    serde_json::json!({"tab_uncounted": {"voucher": voucher.as_str()}}).to_string()
}

/// The most recent vouchers of a lane kept to check a Receipt that ends a little before the
/// wallet's last (vouchers sent and never received).
const RECENT: usize = 8;

/// One lane as the verifier has seen it.
#[derive(Clone, Debug, Default)]
struct Lane {
    seq: u64,
    cumulative: Amount,
    /// The last voucher, awaiting its result (its leaf is added with the result, or with an
    /// empty result when the next voucher or the Receipt comes first).
    pending: Option<Digest>,
    tree: CallTree,
    /// (seq, cumulative, voucher digest) of the latest vouchers.
    recent: VecDeque<(u64, Amount, Digest)>,
    /// The last voucher's amount (to give it back if it was not counted).
    last_amount: Amount,
}

impl Lane {
    fn close_pending(&mut self, result: &Digest) {
        if let Some(v) = self.pending.take() {
            self.tree.push(&v, result);
        }
    }
}

/// Verifies a tab's chain one object (or result line) at a time.
#[derive(Debug)]
pub struct TabVerifier {
    principal: Option<PublicKey>,
    revocations: Vec<Signed<crate::envelope::Revocation>>,
    /// When the mandate was revoked, by a revocation given.
    revoked_at: Option<u64>,
    n: usize,
    mandate: Option<Signed<Mandate>>,
    confirmation: Option<Signed<Confirmation>>,
    tab: Option<Signed<Tab>>,
    proof: Option<Signed<Proof>>,
    lanes: Vec<Lane>,
    vouchers: u64,
    spent: Amount,
    receipt: Option<Signed<TabReceipt>>,
    root_checked: bool,
}

impl TabVerifier {
    /// A verifier; `principal`, if given, is the trust anchor the mandate must be signed by.
    #[must_use]
    pub fn new(principal: Option<&PublicKey>) -> Self {
        TabVerifier {
            principal: principal.copied(),
            revocations: Vec::new(),
            revoked_at: None,
            n: 0,
            mandate: None,
            confirmation: None,
            tab: None,
            proof: None,
            lanes: Vec::new(),
            vouchers: 0,
            spent: Amount::ZERO,
            receipt: None,
            root_checked: false,
        }
    }

    /// Also checks the chain against `revocations` (the principal's, as an auditor holds
    /// them): a hold or a voucher signed at or after its mandate's revocation breaks it.
    #[must_use]
    pub fn with_revocations(mut self, revocations: &[Signed<crate::envelope::Revocation>]) -> Self {
        self.revocations = revocations.to_vec();
        self
    }

    fn check_revoked(&self, link: &'static str, iat: u64) -> Result<(), Error> {
        match self.revoked_at {
            Some(at) if iat >= at => Err(broken(
                link,
                format!(
                    "signed at {}, after its mandate was revoked at {}",
                    rfc3339(iat),
                    rfc3339(at)
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Takes the chain's next line: an object (compact JWS) or a call's result line.
    ///
    /// # Errors
    /// [`Error::Broken`] naming the link (`mandate`, `confirmation`, `tab`, `proof`,
    /// `voucher`, `tab-receipt`) and why.
    pub fn push(&mut self, line: &str) -> Result<(), Error> {
        self.n += 1;
        let line = line.trim();
        if line.starts_with('{') {
            return self.result(line);
        }
        let n = self.n;
        if let Err(e) = jws::verify(line) {
            let link = claimed_kind(line).map_or("object", |k| super::link_name(&k));
            return Err(broken(link, format!("line {n} of the chain: {e}")));
        }
        match claimed_kind(line).as_deref() {
            Some("mandate") => self.mandate(line),
            Some("confirmation") => {
                let c = parse::<Confirmation>("confirmation", line)?;
                if self.confirmation.replace(c).is_some() {
                    return Err(broken("confirmation", "the chain holds two"));
                }
                Ok(())
            }
            Some("tab") => self.tab(line),
            Some("proof") => self.proof(line),
            Some("voucher") => self.voucher(line),
            Some("tab-receipt") => self.receipt(line),
            other => Err(broken(
                "object",
                format!(
                    "line {n} of the chain is a {}, not an object of a tab's chain",
                    other.unwrap_or("(no type)")
                ),
            )),
        }
    }

    fn mandate(&mut self, line: &str) -> Result<(), Error> {
        let m = parse::<Mandate>("mandate", line)?;
        if let Some(anchor) = &self.principal
            && &m.object().principal.key != anchor
        {
            return Err(broken(
                "mandate",
                format!(
                    "signed by {}, not the trusted principal {anchor}",
                    m.object().principal.key
                ),
            ));
        }
        self.revoked_at = self
            .revocations
            .iter()
            .filter(|r| {
                &r.object().mandate == m.digest()
                    && r.object().principal == m.object().principal.key
            })
            .map(|r| r.object().iat)
            .min();
        if self.mandate.replace(m).is_some() {
            return Err(broken("mandate", "the chain holds two"));
        }
        Ok(())
    }

    fn tab(&mut self, line: &str) -> Result<(), Error> {
        let tab = parse::<Tab>("tab", line)?;
        let md = self
            .mandate
            .as_ref()
            .ok_or_else(|| broken("mandate", "missing before the tab"))?
            .object();
        let t = tab.object();
        let Some(origins) = md.pinned(&t.receiver) else {
            return Err(broken(
                "tab",
                format!(
                    "receiver {} (key {}) is not in the mandate's allowlist",
                    t.receiver.id, t.receiver.key
                ),
            ));
        };
        if !origins.is_empty() && !origins.iter().any(|o| **o == t.origin) {
            return Err(broken(
                "tab",
                format!("for {}, which the mandate does not pin", t.origin),
            ));
        }
        if t.iat < md.nbf || t.iat >= md.exp {
            return Err(broken(
                "tab",
                format!(
                    "issued at {}, outside the mandate's validity ({} until {})",
                    rfc3339(t.iat),
                    rfc3339(md.nbf),
                    rfc3339(md.exp)
                ),
            ));
        }
        self.lanes = vec![Lane::default(); usize::from(t.lanes)];
        if self.tab.replace(tab).is_some() {
            return Err(broken("tab", "the chain holds two"));
        }
        Ok(())
    }

    fn proof(&mut self, line: &str) -> Result<(), Error> {
        let proof = parse::<Proof>("proof", line)?;
        let (Some(mandate), Some(tab)) = (&self.mandate, &self.tab) else {
            return Err(broken("proof", "before the mandate and the tab it holds"));
        };
        let (p, t, md) = (proof.object(), tab.object(), mandate.object());
        if p.tab.as_ref() != Some(tab.digest()) {
            return Err(broken("proof", "does not hold this tab"));
        }
        if let Some(c) = &self.confirmation {
            let co = c.object();
            if co.wallet != md.wallet
                || &co.mandate != mandate.digest()
                || &co.quote != tab.digest()
            {
                return Err(broken("confirmation", "does not bind this mandate and tab"));
            }
            let max = co
                .max()
                .map_err(|e| broken("confirmation", e.to_string()))?;
            if max.asset() != &t.asset || max.amount() < t.cap {
                return Err(broken("confirmation", "consents to less than the cap"));
            }
        }
        let held = check_proof_under(mandate, self.confirmation.as_ref(), &proof, false, false)?;
        if held.asset() != &t.asset || held.amount() != t.cap {
            return Err(broken(
                "proof",
                format!("holds {held}; the tab's cap is {} {}", t.cap, t.asset),
            ));
        }
        let limits = md.limits_for(&t.asset);
        match limits.and_then(|l| l.tab_cap) {
            Some(max) if t.cap <= max => {}
            Some(max) => {
                return Err(broken(
                    "proof",
                    format!("holds {}, above the mandate's tab_cap {max}", t.cap),
                ));
            }
            None => return Err(broken("proof", "the mandate allows no tab in this asset")),
        }
        let Some(offer) = t.offer(&p.rail) else {
            return Err(broken(
                "proof",
                format!("holds over {}, which the tab does not offer", p.rail),
            ));
        };
        if p.payment.offer_id != offer.id {
            return Err(broken(
                "proof",
                "its payment is for another offer than the tab's",
            ));
        }
        if md.rails.as_ref().is_some_and(|r| !r.contains(&p.rail)) {
            return Err(broken(
                "proof",
                format!("holds over {}, which the mandate does not allow", p.rail),
            ));
        }
        if p.iat < t.iat || p.iat >= t.exp {
            return Err(broken(
                "proof",
                format!(
                    "made at {}, outside the tab's life ({} until {})",
                    rfc3339(p.iat),
                    rfc3339(t.iat),
                    rfc3339(t.exp)
                ),
            ));
        }
        self.check_revoked("proof", p.iat)?;
        if self.proof.replace(proof).is_some() {
            return Err(broken("proof", "the chain holds two"));
        }
        Ok(())
    }

    fn voucher(&mut self, line: &str) -> Result<(), Error> {
        let v = parse::<Voucher>("voucher", line)?;
        let (Some(mandate), Some(tab), Some(_)) = (&self.mandate, &self.tab, &self.proof) else {
            return Err(broken("voucher", "before the tab's hold"));
        };
        if self.receipt.is_some() {
            return Err(broken("voucher", "after the tab's closing receipt"));
        }
        let (vo, t, md) = (v.object(), tab.object(), mandate.object());
        let at = format!("voucher {} (lane {}, sequence {})", vo.id, vo.lane, vo.seq);
        if vo.wallet != md.wallet {
            return Err(broken(
                "voucher",
                format!("{at}: not signed by the mandate's wallet"),
            ));
        }
        if &vo.tab_digest != tab.digest() || vo.tab != t.id {
            return Err(broken("voucher", format!("{at}: for another tab")));
        }
        if vo.resource.origin != t.origin {
            return Err(broken("voucher", format!("{at}: a call at another origin")));
        }
        // The request digest of its resource as the wallet signs it and the receiver checks
        // it: the one function, never a copy.
        if over_http(&vo.resource) && vo.request != Request::from_resource(&vo.resource).digest() {
            return Err(broken(
                "voucher",
                format!(
                    "{at}: its request {} is not the digest of its resource {} {}{}",
                    vo.request.as_str(),
                    vo.resource.method,
                    vo.resource.path,
                    vo.resource
                        .query
                        .as_ref()
                        .map_or_else(String::new, |q| format!("?{q}"))
                ),
            ));
        }
        match t.price_of(&vo.resource.method, &vo.resource.path) {
            Some((_, price)) if price.amount() == vo.amount && price.asset() == &vo.asset => {}
            _ => {
                return Err(broken(
                    "voucher",
                    format!("{at}: its amount is not the tab's price of its call"),
                ));
            }
        }
        if md
            .limits_for(&t.asset)
            .and_then(|l| l.per_call)
            .is_some_and(|l| vo.amount > l)
        {
            return Err(broken("voucher", format!("{at}: above the per-call limit")));
        }
        if vo.iat < t.iat || vo.iat >= t.exp {
            return Err(broken(
                "voucher",
                format!(
                    "{at}: signed at {}, outside the tab's life ({} until {})",
                    rfc3339(vo.iat),
                    rfc3339(t.iat),
                    rfc3339(t.exp)
                ),
            ));
        }
        if vo.iat < md.nbf || vo.iat >= md.exp {
            return Err(broken(
                "voucher",
                format!(
                    "{at}: signed at {}, outside its mandate's validity ({} until {})",
                    rfc3339(vo.iat),
                    rfc3339(md.nbf),
                    rfc3339(md.exp)
                ),
            ));
        }
        let iat = vo.iat;
        let lanes = t.lanes;
        self.check_revoked("voucher", iat)?;
        let Some(lane) = self.lanes.get_mut(usize::from(vo.lane)) else {
            return Err(broken(
                "voucher",
                format!("{at}: the tab has {lanes} lanes"),
            ));
        };
        if vo.seq != lane.seq + 1 {
            return Err(broken(
                "voucher",
                format!(
                    "{at}: a sequence gap or repeat (the lane was at {})",
                    lane.seq
                ),
            ));
        }
        let want = lane
            .cumulative
            .checked_add(vo.amount)
            .map_err(|e| broken("voucher", e.to_string()))?;
        if vo.cumulative != want {
            return Err(broken(
                "voucher",
                format!(
                    "{at}: its cumulative {} is not the lane's {} plus {}",
                    vo.cumulative, lane.cumulative, vo.amount
                ),
            ));
        }
        let spent = self
            .spent
            .checked_add(vo.amount)
            .map_err(|e| broken("voucher", e.to_string()))?;
        if spent > t.cap {
            return Err(broken(
                "voucher",
                format!("{at}: the lanes pass the cap {}", t.cap),
            ));
        }
        // The lane's previous call without a recorded result: its leaf has none.
        lane.close_pending(&Digest::of(b""));
        lane.seq = vo.seq;
        lane.cumulative = vo.cumulative;
        lane.last_amount = vo.amount;
        lane.pending = Some(v.digest().clone());
        lane.recent
            .push_back((vo.seq, vo.cumulative, v.digest().clone()));
        if lane.recent.len() > RECENT {
            lane.recent.pop_front();
        }
        self.spent = spent;
        self.vouchers += 1;
        Ok(())
    }

    fn result(&mut self, line: &str) -> Result<(), Error> {
        let n = self.n;
        let r: ResultLine = serde_json::from_str(line)
            .map_err(|e| broken("voucher", format!("line {n} is not a call's result: {e}")))?;
        let (voucher, result) = match (&r.tab_call, &r.tab_uncounted) {
            (Some(c), None) => (&c.voucher, Some(&c.result)),
            (None, Some(u)) => (&u.voucher, None),
            _ => {
                return Err(broken(
                    "voucher",
                    format!("line {n} is neither one call's result nor one uncounted voucher"),
                ));
            }
        };
        let lane = self
            .lanes
            .iter_mut()
            .find(|l| l.pending.as_ref() == Some(voucher))
            .ok_or_else(|| {
                broken(
                    "voucher",
                    format!(
                        "line {n}: a result for {}, which is not a lane's last voucher awaiting one",
                        voucher.as_str()
                    ),
                )
            })?;
        let Some(result) = result else {
            // Not counted by the receiver: the lane goes back to before the voucher (its
            // previous call's leaf, if it had no result, stays: the receiver's does too).
            let amount = lane.last_amount;
            lane.pending = None;
            lane.seq = lane.seq.saturating_sub(1);
            lane.cumulative = lane
                .cumulative
                .checked_sub(amount)
                .map_err(|e| broken("voucher", e.to_string()))?;
            lane.last_amount = Amount::ZERO;
            lane.recent.pop_back();
            self.spent = self
                .spent
                .checked_sub(amount)
                .map_err(|e| broken("voucher", e.to_string()))?;
            self.vouchers = self.vouchers.saturating_sub(1);
            return Ok(());
        };
        lane.close_pending(result);
        Ok(())
    }

    fn receipt(&mut self, line: &str) -> Result<(), Error> {
        let receipt = parse::<TabReceipt>("tab-receipt", line)?;
        let (Some(tab), Some(proof)) = (&self.tab, &self.proof) else {
            return Err(broken("tab-receipt", "before the tab's hold"));
        };
        let (r, t) = (receipt.object(), tab.object());
        if r.receiver != t.receiver {
            return Err(broken("tab-receipt", "not signed by the tab's receiver"));
        }
        if &r.tab_digest != tab.digest() || r.tab != t.id || &r.proof != proof.digest() {
            return Err(broken("tab-receipt", "does not bind this tab and its hold"));
        }
        let held_over = &proof.object().rail;
        if &r.rail != held_over {
            return Err(broken(
                "tab-receipt",
                format!(
                    "captures over {}, but the tab was held over {held_over}",
                    r.rail
                ),
            ));
        }
        if r.iat < t.iat {
            return Err(broken(
                "tab-receipt",
                format!(
                    "issued at {}, before its tab ({})",
                    rfc3339(r.iat),
                    rfc3339(t.iat)
                ),
            ));
        }
        if r.cap != t.cap || r.asset != t.asset {
            return Err(broken(
                "tab-receipt",
                format!(
                    "its cap is {} {}, not the tab's {} {}",
                    r.cap, r.asset, t.cap, t.asset
                ),
            ));
        }
        let mut same_ends = true;
        for end in &r.lanes {
            let Some(lane) = self.lanes.get(usize::from(end.lane)) else {
                return Err(broken(
                    "tab-receipt",
                    format!("names lane {}, which the tab has not", end.lane),
                ));
            };
            if end.seq > lane.seq {
                return Err(broken(
                    "tab-receipt",
                    format!(
                        "captures lane {} at sequence {}, beyond the wallet's last voucher ({})",
                        end.lane, end.seq, lane.seq
                    ),
                ));
            }
            let signed = lane
                .recent
                .iter()
                .any(|(s, c, d)| *s == end.seq && *c == end.cumulative && d == &end.voucher);
            if !signed {
                return Err(broken(
                    "tab-receipt",
                    format!(
                        "captures lane {} at a voucher the wallet did not sign (sequence {}, {})",
                        end.lane, end.seq, end.cumulative
                    ),
                ));
            }
            same_ends &= end.seq == lane.seq;
        }
        let lanes_with_calls = self.lanes.iter().filter(|l| l.seq > 0).count();
        same_ends &= lanes_with_calls == r.lanes.len();
        if same_ends {
            let roots: Vec<Digest> = self
                .lanes
                .iter()
                .map(|l| {
                    let mut l = l.clone();
                    l.close_pending(&Digest::of(b""));
                    l.tree.root()
                })
                .collect();
            if tab_root(&roots) != r.root {
                return Err(broken(
                    "tab-receipt",
                    "its root is not the Merkle root of the calls' vouchers and results the wallet recorded",
                ));
            }
            self.root_checked = true;
        }
        if self.receipt.replace(receipt).is_some() {
            return Err(broken("tab-receipt", "the chain holds two"));
        }
        Ok(())
    }

    /// The chain, once every line was pushed.
    ///
    /// # Errors
    /// [`Error::Broken`] if the mandate, the tab or the proof is missing.
    pub fn finish(self) -> Result<TabChain, Error> {
        Ok(TabChain {
            mandate: self.mandate.ok_or_else(|| broken("mandate", "missing"))?,
            confirmation: self.confirmation,
            tab: self.tab.ok_or_else(|| broken("tab", "missing"))?,
            proof: self.proof.ok_or_else(|| broken("proof", "missing"))?,
            vouchers: self.vouchers,
            spent: self.spent,
            receipt: self.receipt,
            root_checked: self.root_checked,
        })
    }
}

/// Whether `resource` names an HTTP call, whose request digest is the digest of the resource
/// ([`Request::from_resource`]: method, path, the query as an object, origin). Over MCP
/// (`tools/call`, `resources/read`, `prompts/get`) the digest also covers the call's
/// arguments, which the resource does not carry (`docs/stipendex-profile.md` §6b).
fn over_http(resource: &Resource) -> bool {
    ![Kind::Tool, Kind::Resource, Kind::Prompt]
        .into_iter()
        .filter_map(Kind::mcp_method)
        .any(|m| m == resource.method)
}

fn parse<T: crate::envelope::Object>(link: &'static str, line: &str) -> Result<Signed<T>, Error> {
    Signed::<T>::parse(line).map_err(|e| broken(link, e.to_string()))
}

/// Verifies a tab's chain from its lines in journal order (see [`TabVerifier`]).
///
/// # Errors
/// As [`TabVerifier::push`] and [`TabVerifier::finish`].
pub fn verify_tab_chain<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    principal: Option<&PublicKey>,
) -> Result<TabChain, Error> {
    let mut v = TabVerifier::new(principal);
    for l in lines {
        if !l.trim().is_empty() {
            v.push(l)?;
        }
    }
    v.finish()
}
