//! Tab sessions (this project's definition; `docs/stipendex-profile.md` §4b): one hold, many
//! paid calls, one settlement.
//!
//! - [`Tab`] (`tab/0.1`, signed by the receiver): the offer of a session — a cap held once, an
//!   end, the per-call price of each route pattern it covers, its origin, its lanes, and the
//!   rails that can hold the cap and capture part of it.
//! - [`Voucher`] (`voucher/0.1`, signed by the wallet): one call inside the tab — its lane and
//!   sequence number, the lane's cumulative amount, the call's increment, its resource in the
//!   clear and its request digest.
//! - [`TabClose`] (`tab-close/0.1`, signed by the wallet): the wallet asks the receiver to close.
//! - [`TabReceipt`] (`tab-receipt/0.1`, signed by the receiver): what was captured — exactly the
//!   sum of the last vouchers of the lanes — and the Merkle root over every call's
//!   (voucher, result) pair ([`CallTree`]).

use rail_core::{Amount, Asset, Money, PaymentMode};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::key::PublicKey;
use super::mandate::Party;
use super::quote::{RailOffer, Resource};
use super::signed::{Digest, Identity, Object, Tag, money};
use crate::Error;

/// The most lanes a tab may have (parallel calls of one wallet inside one tab).
pub const MAX_LANES: u16 = 64;

/// The per-call price of the calls matching one pattern.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabPrice {
    /// The method (`GET`, `tools/call`).
    pub method: String,
    /// The pattern, in the one syntax (`/api/forecast/{city}`, `search_*`).
    pub pattern: String,
    /// The price of one call.
    pub amount: Amount,
}

/// A receiver's offer of a tab session, signed by the receiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tab {
    /// `tab/0.1`.
    pub stipendex: Tag,
    /// `t_…`, unique per receiver; a tab is opened at most once.
    pub id: String,
    /// The receiver (the signer).
    pub receiver: Party,
    /// The origin the tab's calls are served at (`https://host[:port]`).
    pub origin: String,
    /// Issued at (Unix seconds).
    pub iat: u64,
    /// The tab's end (Unix seconds): no voucher is accepted at or after it; the receiver closes
    /// before it.
    pub exp: u64,
    /// The asset of every amount.
    pub asset: Asset,
    /// The most the tab may capture: held in full when it opens.
    pub cap: Amount,
    /// The calls it covers and their prices.
    pub prices: Vec<TabPrice>,
    /// How many lanes (parallel sequences of vouchers) it allows.
    pub lanes: u16,
    /// The rails that can hold the cap and capture part of it, each with its hold offer.
    pub rails: Vec<RailOffer>,
}

impl Tab {
    /// The cap as money.
    ///
    /// # Errors
    /// [`Error::Malformed`].
    pub fn cap(&self) -> Result<Money, Error> {
        money(&self.asset, self.cap, "tab cap")
    }

    /// The price of one call of `method` on `name` inside the tab: the most specific of its
    /// patterns that matches (the one pricing rule, [`crate::receiver::Receiver::decide`]'s),
    /// with the pattern; `None` if the tab does not cover the call.
    #[must_use]
    pub fn price_of(&self, method: &str, name: &str) -> Option<(&TabPrice, Money)> {
        let caps = self.pricing();
        let hit = crate::receiver::matching(&caps, &crate::receiver::Request::new(method, name))?;
        let p = self
            .prices
            .iter()
            .find(|p| p.method == hit.method() && p.pattern == hit.name())?;
        let m = Money::new(self.asset.clone(), p.amount).ok()?;
        Some((p, m))
    }

    /// The tab's prices as priced capabilities (for [`crate::receiver::Receiver::decide`]'s
    /// one matching rule); a price that does not fit the asset is left out (a checked tab has
    /// none).
    #[must_use]
    pub fn pricing(&self) -> Vec<crate::receiver::PricedCapability> {
        self.prices
            .iter()
            .filter_map(|p| {
                let m = Money::new(self.asset.clone(), p.amount).ok()?;
                Some(crate::receiver::PricedCapability::fixed(
                    p.method.clone(),
                    &p.pattern,
                    m,
                ))
            })
            .collect()
    }

    /// The offer of rail kind `rail`, if the tab accepts it.
    #[must_use]
    pub fn offer(&self, rail: &str) -> Option<&rail_core::Offer> {
        RailOffer::find(&self.rails, rail)
    }
}

impl Object for Tab {
    const KIND: &'static str = "tab";
    const PREFIX: &'static str = "t_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.receiver.key)
    }
    fn check(&self) -> Result<(), Error> {
        let bad = |why: String| Err(Error::Malformed(format!("tab {}: {why}", self.id)));
        let cap = self.cap()?;
        if cap.amount().is_zero() {
            return bad("a cap of zero".into());
        }
        if self.exp <= self.iat {
            return bad(format!(
                "it ends ({}) before it is issued ({})",
                rail_core::clock::rfc3339(self.exp),
                rail_core::clock::rfc3339(self.iat)
            ));
        }
        if self.lanes == 0 || self.lanes > MAX_LANES {
            return bad(format!("{} lanes: 1 to {MAX_LANES}", self.lanes));
        }
        if self.prices.is_empty() {
            return bad("it prices no call".into());
        }
        for p in &self.prices {
            let price = money(
                &self.asset,
                p.amount,
                format_args!("tab {} price of {}", self.id, p.pattern),
            )?;
            if price.amount().is_zero() || price.amount() > cap.amount() {
                return bad(format!(
                    "the price of {} {} must be above zero and at most the cap",
                    p.method, p.pattern
                ));
            }
        }
        if crate::origin::parse(&self.origin).ok().as_deref() != Some(self.origin.as_str()) {
            return bad(format!(
                "{:?} is not an origin (scheme://host[:port])",
                self.origin
            ));
        }
        if self.rails.is_empty() {
            return bad("it accepts no rail".into());
        }
        for r in &self.rails {
            if r.offer.mode != PaymentMode::Hold || r.offer.amount != cap {
                return bad(format!(
                    "the {} offer must hold exactly the cap ({cap})",
                    r.rail
                ));
            }
        }
        Ok(())
    }
}

/// One call inside a tab, signed by the wallet: lane `lane`'s call number `seq` (from 1),
/// adding `amount` to the lane, whose cumulative is then `cumulative`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Voucher {
    /// `voucher/0.1`.
    pub stipendex: Tag,
    /// `v_…`, unique per wallet.
    pub id: String,
    /// The wallet (the signer; the key of the hold's Proof).
    pub wallet: PublicKey,
    /// The tab's id.
    pub tab: String,
    /// The tab, by digest.
    pub tab_digest: Digest,
    /// The lane (below the tab's `lanes`).
    pub lane: u16,
    /// The call's number in its lane, from 1, each exactly one above the last.
    pub seq: u64,
    /// The asset (the tab's).
    pub asset: Asset,
    /// This call's price.
    pub amount: Amount,
    /// The lane's total after this call.
    pub cumulative: Amount,
    /// The call, in the clear.
    pub resource: Resource,
    /// The call's request digest (as a Quote's).
    pub request: Digest,
    /// Issued at (Unix seconds).
    pub iat: u64,
}

impl Voucher {
    /// The increment as money.
    ///
    /// # Errors
    /// [`Error::Malformed`].
    pub fn money(&self) -> Result<Money, Error> {
        money(&self.asset, self.amount, "voucher amount")
    }

    /// The lane's cumulative as money.
    ///
    /// # Errors
    /// [`Error::Malformed`].
    pub fn cumulative(&self) -> Result<Money, Error> {
        money(&self.asset, self.cumulative, "voucher cumulative")
    }
}

impl Object for Voucher {
    const KIND: &'static str = "voucher";
    const PREFIX: &'static str = "v_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.wallet)
    }
    fn check(&self) -> Result<(), Error> {
        let (amount, cumulative) = (self.money()?, self.cumulative()?);
        let bad = |why: &str| Err(Error::Malformed(format!("voucher {}: {why}", self.id)));
        if self.seq == 0 {
            return bad("sequence numbers start at 1");
        }
        if self.lane >= MAX_LANES {
            return bad("no tab has that many lanes");
        }
        if amount.amount().is_zero() {
            return bad("a call of zero");
        }
        if cumulative.amount() < amount.amount() {
            return bad("the lane's cumulative is below this call's price");
        }
        if self.seq == 1 && cumulative != amount {
            return bad("a lane's first call is its cumulative");
        }
        Ok(())
    }
}

/// The wallet's request that the receiver close a tab (only the receiver can capture or void).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabClose {
    /// `tab-close/0.1`.
    pub stipendex: Tag,
    /// `tc_…`.
    pub id: String,
    /// The wallet (the signer).
    pub wallet: PublicKey,
    /// The tab's id.
    pub tab: String,
    /// The tab, by digest.
    pub tab_digest: Digest,
    /// Issued at (Unix seconds).
    pub iat: u64,
}

impl Object for TabClose {
    const KIND: &'static str = "tab-close";
    const PREFIX: &'static str = "tc_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.wallet)
    }
}

/// The last voucher of one lane, as the closing Receipt names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaneEnd {
    /// The lane.
    pub lane: u16,
    /// Its last sequence number.
    pub seq: u64,
    /// Its cumulative.
    pub cumulative: Amount,
    /// Its last voucher, by digest.
    pub voucher: Digest,
}

/// The tab's closing Receipt, signed by the receiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TabReceipt {
    /// `tab-receipt/0.1`.
    pub stipendex: Tag,
    /// `tr_…`.
    pub id: String,
    /// The receiver (the signer).
    pub receiver: Party,
    /// The tab's id.
    pub tab: String,
    /// The tab, by digest.
    pub tab_digest: Digest,
    /// The hold's Proof, by digest.
    pub proof: Digest,
    /// Issued at (Unix seconds).
    pub iat: u64,
    /// The asset.
    pub asset: Asset,
    /// The tab's cap.
    pub cap: Amount,
    /// What was captured: the sum of the lanes' last cumulatives (zero: the hold was voided).
    pub captured: Amount,
    /// The last voucher of every lane that had a call, by lane.
    pub lanes: Vec<LaneEnd>,
    /// How many calls were served.
    pub calls: u64,
    /// The Merkle root over every call's (voucher, result) pair: [`tab_root`] over the lanes'
    /// [`CallTree`]s.
    pub root: Digest,
    /// The rail kind.
    pub rail: String,
    /// The rail's reference of the capture (or of the void).
    pub reference: String,
}

impl Object for TabReceipt {
    const KIND: &'static str = "tab-receipt";
    const PREFIX: &'static str = "tr_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.receiver.key)
    }
    fn check(&self) -> Result<(), Error> {
        let of = |a: Amount, what: &str| money(&self.asset, a, format_args!("tab receipt {what}"));
        let (cap, captured) = (of(self.cap, "cap")?, of(self.captured, "captured")?);
        let mut sum = Money::zero(self.asset.clone());
        let mut last: Option<u16> = None;
        for l in &self.lanes {
            if last.is_some_and(|p| p >= l.lane) {
                return Err(Error::Malformed(
                    "tab receipt: lanes are listed once each, in order".into(),
                ));
            }
            last = Some(l.lane);
            sum = sum
                .checked_add(&of(l.cumulative, "lane")?)
                .map_err(|e| Error::Malformed(format!("tab receipt: {e}")))?;
        }
        if sum != captured {
            return Err(Error::Malformed(format!(
                "tab receipt: captured {captured}, but the lanes' last vouchers add up to {sum}"
            )));
        }
        if captured.amount() > cap.amount() {
            return Err(Error::Malformed(format!(
                "tab receipt: captured {captured}, above the cap {cap}"
            )));
        }
        let least: u64 = self.lanes.iter().map(|l| l.seq).sum();
        if self.calls != least {
            return Err(Error::Malformed(format!(
                "tab receipt: {} calls, but the lanes' sequence numbers add up to {least}",
                self.calls
            )));
        }
        Ok(())
    }
}

/// The Merkle tree over one lane's calls, in sequence order, built as they come (RFC 6962's
/// tree hash: a leaf is SHA-256(0x00 ‖ voucher ‖ result), a node SHA-256(0x01 ‖ left ‖ right),
/// the left subtree the largest power of two): memory is logarithmic in the number of calls, so
/// a tab of millions of calls is summed as it streams. A lane's calls are strictly sequential,
/// so the wallet and the receiver build the same tree; the tab's root joins the lanes' roots
/// ([`tab_root`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "TreeState", from = "TreeState")]
pub struct CallTree {
    /// Perfect subtrees not yet joined, largest first: (leaves, hash).
    stack: Vec<(u64, [u8; 32])>,
    calls: u64,
}

impl CallTree {
    /// An empty tree.
    #[must_use]
    pub fn new() -> Self {
        CallTree::default()
    }

    /// Adds the call paid by `voucher` (a digest) and answered with `result` (a digest).
    pub fn push(&mut self, voucher: &Digest, result: &Digest) {
        let mut h = Sha256::new();
        h.update([0u8]);
        h.update(voucher.hash());
        h.update(result.hash());
        self.push_leaf(h.finalize().into());
    }

    fn push_leaf(&mut self, leaf: [u8; 32]) {
        let mut node: (u64, [u8; 32]) = (1, leaf);
        while let Some(&(n, left)) = self.stack.last() {
            if n != node.0 {
                break;
            }
            self.stack.pop();
            node = (n * 2, join(&left, &node.1));
        }
        self.stack.push(node);
        self.calls += 1;
    }

    /// How many calls were added.
    #[must_use]
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// The root: SHA-256 of nothing for no call.
    #[must_use]
    pub fn root(&self) -> Digest {
        let mut it = self.stack.iter().rev();
        let Some(&(_, mut h)) = it.next() else {
            return Digest::of(b"");
        };
        for (_, left) in it {
            h = join(left, &h);
        }
        Digest::from_hash(h)
    }
}

/// The stored form of a [`CallTree`]: its pending subtrees as digests.
#[derive(Clone, Serialize, Deserialize)]
struct TreeState {
    stack: Vec<(u64, Digest)>,
    calls: u64,
}

impl From<CallTree> for TreeState {
    fn from(t: CallTree) -> Self {
        TreeState {
            stack: t
                .stack
                .into_iter()
                .map(|(n, h)| (n, Digest::from_hash(h)))
                .collect(),
            calls: t.calls,
        }
    }
}

impl From<TreeState> for CallTree {
    fn from(s: TreeState) -> Self {
        CallTree {
            stack: s.stack.into_iter().map(|(n, d)| (n, d.hash())).collect(),
            calls: s.calls,
        }
    }
}

/// The tab's root: RFC 6962's tree hash over its lanes' roots, lane 0 first, every lane of the
/// tab included (a lane without calls has the empty tree's root), each leaf
/// SHA-256(0x00 ‖ lane root).
#[must_use]
pub fn tab_root(lanes: &[Digest]) -> Digest {
    let mut t = CallTree::new();
    for l in lanes {
        let mut h = Sha256::new();
        h.update([0u8]);
        h.update(l.hash());
        t.push_leaf(h.finalize().into());
    }
    t.root()
}

fn join(left: &[u8; 32], right: &[u8; 32]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([1u8]);
    h.update(left);
    h.update(right);
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6962's MTH, recursively, for comparison.
    fn mth(leaves: &[[u8; 32]]) -> [u8; 32] {
        match leaves.len() {
            0 => Sha256::digest(b"").into(),
            1 => leaves[0],
            n => {
                let k = n.next_power_of_two() / 2;
                join(&mth(&leaves[..k]), &mth(&leaves[k..]))
            }
        }
    }

    #[test]
    fn the_streamed_tree_is_rfc_6962s() {
        for n in 0..40u8 {
            let mut t = CallTree::new();
            let mut leaves = Vec::new();
            for i in 0..n {
                let (v, r) = (Digest::of(&[i]), Digest::of(&[i, 1]));
                t.push(&v, &r);
                let mut h = Sha256::new();
                h.update([0u8]);
                h.update(v.hash());
                h.update(r.hash());
                leaves.push(h.finalize().into());
            }
            assert_eq!(t.root(), Digest::from_hash(mth(&leaves)), "{n} calls");
            assert_eq!(t.calls(), u64::from(n));
        }
    }

    use crate::envelope::{SecretKey, Signed, new_id};
    use rail_core::{Offer, RailId, Timestamp};

    fn usd(s: &str) -> Money {
        Money::parse(Asset::usd(), s).unwrap()
    }

    fn tab(key: &SecretKey, cap: &str, mode: PaymentMode) -> Tab {
        Tab {
            stipendex: Tag::current("tab"),
            id: new_id("t_"),
            receiver: Party {
                id: "shop".into(),
                key: key.public(),
            },
            origin: "https://shop.example".into(),
            iat: 1_000,
            exp: 4_600,
            asset: Asset::usd(),
            cap: usd(cap).amount(),
            prices: vec![TabPrice {
                method: "GET".into(),
                pattern: "/api/search".into(),
                amount: usd("0.01").amount(),
            }],
            lanes: 8,
            rails: vec![RailOffer {
                rail: "ledger".into(),
                offer: Offer {
                    rail: RailId::new("ledger"),
                    id: "o1".into(),
                    amount: usd(cap),
                    payee: "shop".into(),
                    mode,
                    expires_at: Timestamp(4_600_000),
                    details: serde_json::Value::Null,
                },
            }],
        }
    }

    fn voucher(key: &SecretKey, t: &Signed<Tab>, seq: u64, amount: &str, cum: &str) -> Voucher {
        Voucher {
            stipendex: Tag::current("voucher"),
            id: new_id("v_"),
            wallet: key.public(),
            tab: t.object().id.clone(),
            tab_digest: t.digest().clone(),
            lane: 0,
            seq,
            asset: Asset::usd(),
            amount: usd(amount).amount(),
            cumulative: usd(cum).amount(),
            resource: Resource {
                origin: "https://shop.example".into(),
                method: "GET".into(),
                path: "/api/search".into(),
                query: Some("q=1".into()),
            },
            request: Digest::of(b"request"),
            iat: 1_001,
        }
    }

    #[test]
    fn tabs_and_vouchers_sign_and_parse_and_refuse_what_breaks_their_rules() {
        let (shop, wallet) = (SecretKey::generate(), SecretKey::generate());
        let t = Signed::sign(tab(&shop, "5.00", PaymentMode::Hold), &shop).unwrap();
        let parsed = Signed::<Tab>::parse(t.jws()).unwrap();
        assert_eq!(parsed.object().cap().unwrap(), usd("5.00"));
        assert!(parsed.object().offer("ledger").is_some());
        // A tab that does not hold its cap, or holds nothing.
        assert!(Signed::sign(tab(&shop, "5.00", PaymentMode::Capture), &shop).is_err());
        assert!(Signed::sign(tab(&shop, "0", PaymentMode::Hold), &shop).is_err());
        let mut no_lanes = tab(&shop, "5.00", PaymentMode::Hold);
        no_lanes.lanes = 0;
        assert!(Signed::sign(no_lanes, &shop).is_err());
        let mut bad_origin = tab(&shop, "5.00", PaymentMode::Hold);
        bad_origin.origin = "https://shop.example/path".into();
        assert!(Signed::sign(bad_origin, &shop).is_err());

        let v = Signed::sign(voucher(&wallet, &t, 1, "0.01", "0.01"), &wallet).unwrap();
        assert_eq!(Signed::<Voucher>::parse(v.jws()).unwrap().object().seq, 1);
        assert!(Signed::sign(voucher(&wallet, &t, 2, "0.01", "0.02"), &wallet).is_ok());
        for (seq, amount, cum) in [
            (0, "0.01", "0.01"),
            (2, "0.02", "0.01"),
            (1, "0.01", "0.02"),
        ] {
            assert!(
                Signed::sign(voucher(&wallet, &t, seq, amount, cum), &wallet).is_err(),
                "{seq} {amount} {cum}"
            );
        }
    }

    #[test]
    fn a_closing_receipt_captures_exactly_the_lanes_last_vouchers() {
        let shop = SecretKey::generate();
        let end = |lane, seq, cum: &str| LaneEnd {
            lane,
            seq,
            cumulative: usd(cum).amount(),
            voucher: Digest::of(&[u8::try_from(lane).unwrap()]),
        };
        let receipt = |captured: &str, lanes: Vec<LaneEnd>, calls| TabReceipt {
            stipendex: Tag::current("tab-receipt"),
            id: new_id("tr_"),
            receiver: Party {
                id: "shop".into(),
                key: shop.public(),
            },
            tab: "t_x".into(),
            tab_digest: Digest::of(b"tab"),
            proof: Digest::of(b"proof"),
            iat: 2_000,
            asset: Asset::usd(),
            cap: usd("1.00").amount(),
            captured: usd(captured).amount(),
            lanes,
            calls,
            root: CallTree::new().root(),
            rail: "ledger".into(),
            reference: "capture-1".into(),
        };
        let ok = receipt("0.07", vec![end(0, 3, "0.03"), end(2, 4, "0.04")], 7);
        assert!(Signed::sign(ok, &shop).is_ok());
        for bad in [
            receipt("0.08", vec![end(0, 3, "0.03"), end(2, 4, "0.04")], 7), // above the vouchers
            receipt("0.07", vec![end(2, 4, "0.04"), end(0, 3, "0.03")], 7), // out of order
            receipt("0.07", vec![end(0, 3, "0.03"), end(2, 4, "0.04")], 6), // calls
            receipt("1.10", vec![end(0, 3, "0.60"), end(2, 4, "0.50")], 7), // above the cap
        ] {
            assert!(Signed::sign(bad, &shop).is_err());
        }
    }

    #[test]
    fn digests_round_trip_through_their_hash() {
        let d = Digest::of(b"x");
        assert_eq!(Digest::from_hash(d.hash()), d);
    }
}
