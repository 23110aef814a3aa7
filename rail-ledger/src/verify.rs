//! Journal verification: replays the journal, entry by entry in `seq` order, against the
//! stored accounts, head and statuses, and checks the ledger's rules on the way.
//!
//! The backends stream what they read through a [`Verifier`]: first the stored accounts, then
//! the entries, then the stored status rows. What it keeps is bounded by the accounts, the
//! holds and the reversed transfers, never by the number of entries.

use std::collections::HashMap;

use rail_core::Timestamp;

use crate::engine::entry_hash;
use crate::types::{Account, AccountId, Transfer, TransferId, TransferKind, TransferStatus};

/// Most problems a report lists (verification goes on to the end, counting entries).
pub const MAX_PROBLEMS: usize = 100;

/// One problem found by [`crate::Ledger::verify_journal`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The journal position (0 = not tied to one entry).
    pub seq: i64,
    /// What is wrong.
    pub what: String,
}

/// The result of replaying the journal.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct VerifyReport {
    /// Entries read.
    pub entries: u64,
    /// Accounts checked.
    pub accounts: u64,
    /// Everything that does not add up (at most [`MAX_PROBLEMS`]); empty = intact.
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    /// True when nothing was found.
    #[must_use]
    pub fn is_intact(&self) -> bool {
        self.problems.is_empty()
    }
}

/// An account as the replay sees it.
struct Acc {
    /// Debits pending, debits posted, credits pending, credits posted, as replayed so far.
    counters: [u64; 4],
    no_overdraft: bool,
    /// The stored counters (`None`: the account is not in the accounts table).
    stored: Option<[u64; 4]>,
}

/// What the replay keeps of a hold.
struct Hold {
    debit: AccountId,
    credit: AccountId,
    amount: u64,
    expires_at: Option<Timestamp>,
    /// The entry that first posted, voided or expired it.
    resolved_by: Option<i64>,
    /// What its status row must say (the latest resolution).
    status: TransferStatus,
    status_seen: bool,
}

/// Replays entries (in `seq` order) against the stored accounts, head and statuses.
pub(crate) struct Verifier {
    report: VerifyReport,
    expect_seq: i64,
    prev_hash: [u8; 32],
    accounts: HashMap<AccountId, Acc>,
    holds: HashMap<TransferId, Hold>,
    /// Reversed amount per reversed posting transfer, and whether its status row was seen.
    reversed: HashMap<TransferId, (u64, bool)>,
    /// The anchored entry (seq, hash), and whether it was reached.
    anchor: Option<(i64, [u8; 32])>,
    anchor_seen: bool,
}

fn counters(a: &Account) -> [u64; 4] {
    [
        a.debits_pending,
        a.debits_posted,
        a.credits_pending,
        a.credits_posted,
    ]
}

fn describe(st: TransferStatus) -> String {
    match st {
        TransferStatus::Posted { amount } => format!("posted ({amount})"),
        TransferStatus::Settled { reversed } => format!("settled ({reversed} reversed)"),
        other => other.name().to_owned(),
    }
}

fn when(t: Option<Timestamp>) -> String {
    t.map_or_else(|| "none".to_owned(), |t| t.to_string())
}

impl Verifier {
    /// A verifier; with an `anchor` (seq, hash), the entry at that seq must hash to it.
    pub(crate) fn new(anchor: Option<(i64, [u8; 32])>) -> Self {
        Verifier {
            report: VerifyReport::default(),
            expect_seq: 1,
            prev_hash: [0; 32],
            accounts: HashMap::new(),
            holds: HashMap::new(),
            reversed: HashMap::new(),
            anchor,
            anchor_seen: false,
        }
    }

    fn problem(&mut self, seq: i64, what: String) {
        if self.report.problems.len() < MAX_PROBLEMS {
            self.report.problems.push(Problem { seq, what });
        }
    }

    /// A stored account (all of them, before any entry).
    pub(crate) fn account(&mut self, a: &Account) {
        self.report.accounts += 1;
        self.accounts.insert(
            a.id,
            Acc {
                counters: [0; 4],
                no_overdraft: a.no_overdraft,
                stored: Some(counters(a)),
            },
        );
    }

    /// The next journal entry.
    pub(crate) fn entry(&mut self, t: &Transfer) {
        self.report.entries += 1;
        if t.seq != self.expect_seq {
            self.problem(
                t.seq,
                format!("expected entry {}, found {}", self.expect_seq, t.seq),
            );
        }
        self.expect_seq = t.seq.saturating_add(1);
        if t.prev_hash != self.prev_hash {
            self.problem(t.seq, "previous-hash link broken".into());
        }
        if entry_hash(t) != t.hash {
            self.problem(t.seq, "entry hash does not match its content".into());
        }
        self.prev_hash = t.hash;
        if let Some((seq, hash)) = self.anchor
            && t.seq == seq
        {
            self.anchor_seen = true;
            if t.hash != hash {
                self.problem(
                    t.seq,
                    format!(
                        "entry {seq} does not hash to the anchored hash: the journal was \
                         rewritten at or before the anchor"
                    ),
                );
            }
        }
        self.balances(t);
        match (t.kind, t.reference) {
            (TransferKind::Single, _) => {}
            (TransferKind::Pending, _) => {
                self.holds.insert(
                    t.id,
                    Hold {
                        debit: t.debit,
                        credit: t.credit,
                        amount: t.amount,
                        expires_at: t.expires_at(),
                        resolved_by: None,
                        status: TransferStatus::Pending,
                        status_seen: false,
                    },
                );
            }
            (
                TransferKind::PostPending | TransferKind::VoidPending | TransferKind::ExpirePending,
                Some(r),
            ) => self.resolution(t, r),
            (TransferKind::Reversal, Some(r)) => {
                if self.holds.contains_key(&r) {
                    self.problem(
                        t.seq,
                        format!(
                            "entry {} reverses hold {r}: only posted transfers can be",
                            t.seq
                        ),
                    );
                } else {
                    let e = self.reversed.entry(r).or_insert((0, false));
                    e.0 = e.0.saturating_add(t.amount);
                }
            }
            (_, None) => self.problem(t.seq, "entry lacks its reference".into()),
        }
        if matches!(
            t.kind,
            TransferKind::Single | TransferKind::Pending | TransferKind::Reversal
        ) {
            self.overdraft(t);
        }
    }

    /// Balances before must continue each account's history; after = before ± the amount.
    fn balances(&mut self, t: &Transfer) {
        let (pend_add, pend_sub, post_add) = match t.kind {
            TransferKind::Single | TransferKind::Reversal => (0, 0, t.amount),
            TransferKind::Pending => (t.amount, 0, 0),
            TransferKind::PostPending => {
                let held = t
                    .reference
                    .and_then(|r| self.holds.get(&r))
                    .map_or(0, |h| h.amount);
                (0, held, t.amount)
            }
            TransferKind::VoidPending | TransferKind::ExpirePending => (0, t.amount, 0),
        };
        for (acc, side, idx) in [
            (t.debit, t.debit_side, 0usize),
            (t.credit, t.credit_side, 2),
        ] {
            let a = self.accounts.entry(acc).or_insert(Acc {
                counters: [0; 4],
                no_overdraft: false,
                stored: None,
            });
            let c = &mut a.counters;
            let (pend, post) = (
                c.get(idx).copied().unwrap_or(0),
                c.get(idx + 1).copied().unwrap_or(0),
            );
            let ok_before = side.pending_before == pend && side.posted_before == post;
            let exp_pending = pend
                .checked_add(pend_add)
                .and_then(|v| v.checked_sub(pend_sub));
            let exp_posted = post.checked_add(post_add);
            let ok_after =
                Some(side.pending_after) == exp_pending && Some(side.posted_after) == exp_posted;
            if let Some(slot) = c.get_mut(idx) {
                *slot = side.pending_after;
            }
            if let Some(slot) = c.get_mut(idx + 1) {
                *slot = side.posted_after;
            }
            if !ok_before {
                self.problem(
                    t.seq,
                    format!("account {acc}: balances before do not continue its history"),
                );
            }
            if !ok_after {
                self.problem(
                    t.seq,
                    format!("account {acc}: balances after do not follow from the amount"),
                );
            }
        }
    }

    /// A post, void or expiry of hold `r`: at most one per hold, within what it held, between
    /// its accounts, an expiry only once the hold lapsed, a post or void only before.
    fn resolution(&mut self, t: &Transfer, r: TransferId) {
        let (seq, ts) = (t.seq, t.timestamp);
        let verb = match t.kind {
            TransferKind::PostPending => "posts",
            TransferKind::VoidPending => "voids",
            _ => "expires",
        };
        let Some(h) = self.holds.get_mut(&r) else {
            self.problem(
                seq,
                format!("entry {seq} {verb} {r}, which is not a hold earlier in the journal"),
            );
            return;
        };
        let mut found = Vec::new();
        if let Some(first) = h.resolved_by {
            found.push(format!(
                "entry {seq} resolves hold {r} again: it was {} by entry {first}",
                h.status.name()
            ));
        }
        if (t.debit, t.credit) != (h.debit, h.credit) {
            found.push(format!(
                "entry {seq} {verb} hold {r} between other accounts than the hold's"
            ));
        }
        match t.kind {
            TransferKind::PostPending if t.amount > h.amount => found.push(format!(
                "entry {seq} posts {} of hold {r}, which held {}",
                t.amount, h.amount
            )),
            TransferKind::VoidPending | TransferKind::ExpirePending if t.amount != h.amount => {
                found.push(format!(
                    "entry {seq} releases {} of hold {r}, which held {}",
                    t.amount, h.amount
                ));
            }
            _ => {}
        }
        match (t.kind, h.expires_at) {
            (TransferKind::ExpirePending, None) => {
                found.push(format!(
                    "entry {seq} expires hold {r}, which has no timeout"
                ));
            }
            (TransferKind::ExpirePending, Some(e)) if ts < e => found.push(format!(
                "entry {seq} expires hold {r} at {ts}, before it lapses at {e}"
            )),
            (TransferKind::PostPending | TransferKind::VoidPending, Some(e)) if ts >= e => found
                .push(format!(
                    "entry {seq} {verb} hold {r} at {ts}, after it lapsed at {e}"
                )),
            _ => {}
        }
        h.resolved_by.get_or_insert(seq);
        h.status = match t.kind {
            TransferKind::PostPending => TransferStatus::Posted { amount: t.amount },
            TransferKind::VoidPending => TransferStatus::Voided,
            _ => TransferStatus::Expired,
        };
        for what in found {
            self.problem(seq, what);
        }
    }

    /// A no-overdraft account's debits (pending and posted) may not exceed its posted credits.
    fn overdraft(&mut self, t: &Transfer) {
        let Some(a) = self.accounts.get(&t.debit) else {
            return;
        };
        let [dp, dpo, _, cpo] = a.counters;
        if a.no_overdraft && dp.checked_add(dpo).is_none_or(|d| d > cpo) {
            self.problem(
                t.seq,
                format!(
                    "entry {} overdraws no-overdraft account {}: debits {dp} pending + {dpo} \
                     posted exceed its {cpo} credits posted",
                    t.seq, t.debit
                ),
            );
        }
    }

    /// A stored status row (all of them, after the entries), with its expiry index column.
    pub(crate) fn status(
        &mut self,
        id: TransferId,
        st: TransferStatus,
        expires_at: Option<Timestamp>,
    ) {
        let mut found = Vec::new();
        if let Some(h) = self.holds.get_mut(&id) {
            h.status_seen = true;
            if st != h.status {
                found.push(format!(
                    "hold {id}: stored status {} differs from the journal's {}",
                    describe(st),
                    describe(h.status)
                ));
            }
            if expires_at != h.expires_at {
                found.push(format!(
                    "hold {id}: the expiry index says {}, the hold's own expiry is {}",
                    when(expires_at),
                    when(h.expires_at)
                ));
            }
        } else if let Some((reversed, seen)) = self.reversed.get_mut(&id) {
            *seen = true;
            let want = TransferStatus::Settled {
                reversed: *reversed,
            };
            if st != want || expires_at.is_some() {
                found.push(format!(
                    "transfer {id}: stored status {} differs from the journal's {}",
                    describe(st),
                    describe(want)
                ));
            }
        } else {
            found.push(format!(
                "status row for {id} ({}), which the journal does not explain",
                describe(st)
            ));
        }
        for what in found {
            self.problem(0, what);
        }
    }

    /// The end: the stored head, then what was never matched.
    pub(crate) fn finish(mut self, head: (i64, [u8; 32])) -> VerifyReport {
        let last = self.expect_seq - 1;
        if head.0 != last || head.1 != self.prev_hash {
            self.problem(
                0,
                format!(
                    "journal head says entry {} but the journal ends at {last}",
                    head.0
                ),
            );
        }
        if let Some((seq, hash)) = self.anchor
            && !self.anchor_seen
        {
            if seq == 0 {
                if hash != [0; 32] {
                    self.problem(
                        0,
                        "the anchor names entry 0 with a hash other than zero".into(),
                    );
                }
            } else {
                self.problem(
                    0,
                    format!(
                        "the journal ends at entry {last}, before the anchored entry {seq}: \
                         entries up to the anchor were removed"
                    ),
                );
            }
        }
        let mut found = Vec::new();
        for (id, a) in &self.accounts {
            match a.stored {
                Some(s) if s != a.counters => {
                    found.push(format!(
                        "account {id}: stored balances differ from the journal"
                    ));
                }
                Some(_) => {}
                None => found.push(format!(
                    "account {id} appears in the journal but not in the accounts"
                )),
            }
        }
        for (id, h) in &self.holds {
            if !h.status_seen {
                found.push(format!("hold {id} has no status row"));
            }
        }
        for (id, (_, seen)) in &self.reversed {
            if !seen {
                found.push(format!("reversed transfer {id} has no status row"));
            }
        }
        found.sort();
        for what in found {
            self.problem(0, what);
        }
        self.report
    }
}
