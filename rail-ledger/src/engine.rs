//! The ledger's state machine: pure, synchronous, shared by every backend.
//!
//! A backend loads a [`Snapshot`] of what a batch touches (inside a transaction that holds the
//! journal head), calls [`apply_batch`], writes the [`Changes`] and commits. Requests in a batch
//! are applied one after another, each fully checked before it changes anything, so a refused
//! request leaves no trace and never disturbs the others. One exception, by design: a post or
//! void that finds its hold lapsed but not yet expired first writes the hold's expiry entry
//! (the release that was due anyway), then is refused with `pending_transfer_expired`.

use std::collections::{BTreeSet, HashMap};

use rail_core::Timestamp;
use sha2::{Digest, Sha256};

use crate::types::{
    Account, AccountCreated, AccountId, Created, NewAccount, SideBalances, Transfer, TransferError,
    TransferId, TransferKind, TransferRequest, TransferStatus,
};

/// Largest value any counter may hold (the storage type is SQL `BIGINT`).
pub const MAX_COUNTER: u64 = i64::MAX as u64;

/// One request in a batch.
#[derive(Clone, Debug)]
pub(crate) enum Command {
    CreateAccount(NewAccount),
    Transfer(TransferRequest),
}

/// The answer to one [`Command`].
#[derive(Clone, Debug)]
pub(crate) enum Outcome {
    Account(Result<AccountCreated, TransferError>),
    Transfer(Result<Created, TransferError>),
}

/// What a batch may read: loaded by the backend.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    pub(crate) accounts: HashMap<AccountId, Account>,
    pub(crate) transfers: HashMap<TransferId, Transfer>,
    pub(crate) statuses: HashMap<TransferId, TransferStatus>,
    /// Pending transfers whose timeout passed, to expire first.
    pub(crate) due: Vec<TransferId>,
    pub(crate) head_seq: i64,
    pub(crate) head_hash: [u8; 32],
}

/// What a batch wrote: stored by the backend.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    pub(crate) new_accounts: Vec<AccountId>,
    pub(crate) new_transfers: Vec<Transfer>,
    pub(crate) statuses: BTreeSet<TransferId>,
    pub(crate) accounts: BTreeSet<AccountId>,
    /// Holds the expiry index called due that had not lapsed by their own entry: not
    /// released; their status rows (and so their index entries) are rewritten.
    pub(crate) repaired: Vec<TransferId>,
}

impl Changes {
    /// Nothing to write (no account, no entry, no status row).
    pub(crate) fn is_empty(&self) -> bool {
        self.new_accounts.is_empty() && self.new_transfers.is_empty() && self.statuses.is_empty()
    }
}

/// Ids a batch needs loaded before it runs.
#[derive(Debug, Default)]
pub(crate) struct Needs {
    pub(crate) transfers: BTreeSet<TransferId>,
    pub(crate) accounts: BTreeSet<AccountId>,
}

pub(crate) fn needs(cmds: &[Command]) -> Needs {
    let mut n = Needs::default();
    for c in cmds {
        match c {
            Command::CreateAccount(a) => {
                n.accounts.insert(a.id);
            }
            Command::Transfer(t) => {
                n.transfers.insert(t.id());
                if let Some(r) = t.referenced() {
                    n.transfers.insert(r);
                }
                if let Some((d, c)) = t.accounts() {
                    n.accounts.insert(d);
                    n.accounts.insert(c);
                }
            }
        }
    }
    n
}

/// The id of the ledger's own expiry entry for a pending transfer.
pub(crate) fn expiry_id(pending: TransferId) -> TransferId {
    let h = Sha256::new()
        .chain_update(b"stipendex-ledger/expire")
        .chain_update(pending.to_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(h.get(..16).unwrap_or(&[0u8; 16]));
    // In the reserved range: no client request can take this id first.
    TransferId(u128::from_be_bytes(b) | crate::types::RESERVED_BIT)
}

/// The hash of a journal entry: SHA-256 over a domain tag, the previous hash and every field.
#[must_use]
pub fn entry_hash(t: &Transfer) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"stipendex-ledger/entry/v1");
    h.update(t.prev_hash);
    h.update(t.seq.to_be_bytes());
    h.update(t.id.to_bytes());
    h.update(t.kind.code().to_be_bytes());
    h.update(t.debit.to_bytes());
    h.update(t.credit.to_bytes());
    h.update(t.amount.to_be_bytes());
    h.update(t.reference.map_or(0, |r| r.0).to_be_bytes());
    h.update(t.user_data.to_be_bytes());
    h.update(t.timeout_ms.to_be_bytes());
    h.update(t.timestamp.0.to_be_bytes());
    for s in [t.debit_side, t.credit_side] {
        for v in [
            s.pending_before,
            s.pending_after,
            s.posted_before,
            s.posted_after,
        ] {
            h.update(v.to_be_bytes());
        }
    }
    h.finalize().into()
}

fn add(a: u64, b: u64) -> Result<u64, TransferError> {
    a.checked_add(b)
        .filter(|&v| v <= MAX_COUNTER)
        .ok_or(TransferError::Overflow)
}

/// Applies `cmds` in order to `snap` at time `now`.
pub(crate) fn apply_batch(
    snap: &mut Snapshot,
    cmds: &[Command],
    now: Timestamp,
) -> (Vec<Outcome>, Changes) {
    let mut ch = Changes::default();
    for id in std::mem::take(&mut snap.due) {
        expire(snap, &mut ch, id, now);
    }
    let outcomes = cmds
        .iter()
        .map(|c| match c {
            Command::CreateAccount(a) => Outcome::Account(create_account(snap, &mut ch, a, now)),
            Command::Transfer(t) => Outcome::Transfer(transfer(snap, &mut ch, t, now)),
        })
        .collect();
    (outcomes, ch)
}

fn create_account(
    snap: &mut Snapshot,
    ch: &mut Changes,
    a: &NewAccount,
    now: Timestamp,
) -> Result<AccountCreated, TransferError> {
    if a.id.0 == 0 {
        return Err(TransferError::IdMustNotBeZero);
    }
    if let Some(existing) = snap.accounts.get(&a.id) {
        return if existing.asset == a.asset && existing.no_overdraft == a.no_overdraft {
            Ok(AccountCreated::Exists(existing.clone()))
        } else {
            Err(TransferError::AccountExistsWithDifferentFields)
        };
    }
    let acc = Account {
        id: a.id,
        asset: a.asset.clone(),
        no_overdraft: a.no_overdraft,
        debits_pending: 0,
        debits_posted: 0,
        credits_pending: 0,
        credits_posted: 0,
        created_at: now,
    };
    snap.accounts.insert(a.id, acc.clone());
    ch.new_accounts.push(a.id);
    Ok(AccountCreated::Created(acc))
}

/// The accounts of a validated movement, with the counter deltas to apply.
struct Movement {
    id: TransferId,
    kind: TransferKind,
    debit: AccountId,
    credit: AccountId,
    amount: u64,
    reference: Option<TransferId>,
    user_data: u128,
    timeout_ms: u64,
    /// (pending delta, posted delta) applied to the debit account's debits and the credit
    /// account's credits: pending may go down (release), posted only up.
    pending_add: u64,
    pending_sub: u64,
    posted_add: u64,
}

fn transfer(
    snap: &mut Snapshot,
    ch: &mut Changes,
    req: &TransferRequest,
    now: Timestamp,
) -> Result<Created, TransferError> {
    let id = req.id();
    if id.0 == 0 {
        return Err(TransferError::IdMustNotBeZero);
    }
    if id.is_reserved() {
        return Err(TransferError::IdReserved);
    }
    if let Some(stored) = snap.transfers.get(&id) {
        return if req.made(stored) {
            Ok(Created::Exists(stored.clone()))
        } else {
            Err(TransferError::ExistsWithDifferentFields)
        };
    }
    let m = match *req {
        TransferRequest::Single {
            debit,
            credit,
            amount,
            user_data,
            ..
        } => check_new(snap, id, (debit, credit), amount, user_data, None)?,
        TransferRequest::Pending {
            debit,
            credit,
            amount,
            user_data,
            timeout_ms,
            ..
        } => check_new(
            snap,
            id,
            (debit, credit),
            amount,
            user_data,
            Some(timeout_ms),
        )?,
        TransferRequest::Post {
            pending_id, amount, ..
        } => {
            let p = open_pending(snap, ch, pending_id, now)?;
            if amount == 0 {
                return Err(TransferError::AmountMustNotBeZero);
            }
            if amount > p.amount {
                return Err(TransferError::ExceedsPendingAmount { pending: p.amount });
            }
            Movement {
                id,
                kind: TransferKind::PostPending,
                debit: p.debit,
                credit: p.credit,
                amount,
                reference: Some(pending_id),
                user_data: p.user_data,
                timeout_ms: 0,
                pending_add: 0,
                pending_sub: p.amount,
                posted_add: amount,
            }
        }
        TransferRequest::Void { pending_id, .. } => {
            let p = open_pending(snap, ch, pending_id, now)?;
            release(id, TransferKind::VoidPending, &p)
        }
        TransferRequest::Reverse { of, amount, .. } => {
            let o = snap
                .transfers
                .get(&of)
                .cloned()
                .ok_or(TransferError::ReferenceNotFound)?;
            if !o.kind.is_posting() {
                return Err(TransferError::CannotReverse);
            }
            let reversed = match snap.statuses.get(&of) {
                Some(TransferStatus::Settled { reversed }) => *reversed,
                _ => 0,
            };
            if amount == 0 {
                return Err(TransferError::AmountMustNotBeZero);
            }
            let left = o.amount.saturating_sub(reversed);
            if amount > left {
                return Err(TransferError::ExceedsReversible { available: left });
            }
            // Money goes back: the original credit account is debited.
            let mut m = check_new(snap, id, (o.credit, o.debit), amount, o.user_data, None)?;
            m.kind = TransferKind::Reversal;
            m.reference = Some(of);
            m
        }
    };
    let t = commit(snap, ch, &m, now);
    match *req {
        TransferRequest::Pending { .. } => set_status(snap, ch, id, TransferStatus::Pending),
        // A posting transfer gets a status row only once something of it is reversed: no row
        // means nothing reversed (one write fewer per transfer on the hot path).
        TransferRequest::Single { .. } => {}
        TransferRequest::Post {
            pending_id, amount, ..
        } => {
            set_status(snap, ch, pending_id, TransferStatus::Posted { amount });
        }
        TransferRequest::Void { pending_id, .. } => {
            set_status(snap, ch, pending_id, TransferStatus::Voided);
        }
        TransferRequest::Reverse { of, amount, .. } => {
            let reversed = match snap.statuses.get(&of) {
                Some(TransferStatus::Settled { reversed }) => *reversed,
                _ => 0,
            };
            set_status(
                snap,
                ch,
                of,
                TransferStatus::Settled {
                    reversed: reversed.saturating_add(amount),
                },
            );
        }
    }
    Ok(Created::Created(t))
}

fn set_status(snap: &mut Snapshot, ch: &mut Changes, id: TransferId, s: TransferStatus) {
    snap.statuses.insert(id, s);
    ch.statuses.insert(id);
}

fn release(id: TransferId, kind: TransferKind, p: &Transfer) -> Movement {
    Movement {
        id,
        kind,
        debit: p.debit,
        credit: p.credit,
        amount: p.amount,
        reference: Some(p.id),
        user_data: p.user_data,
        timeout_ms: 0,
        pending_add: 0,
        pending_sub: p.amount,
        posted_add: 0,
    }
}

/// The pending transfer `pid`, if it can still be posted or voided. A pending transfer whose
/// timeout has passed is expired here (an expiry entry is written) and refused.
fn open_pending(
    snap: &mut Snapshot,
    ch: &mut Changes,
    pid: TransferId,
    now: Timestamp,
) -> Result<Transfer, TransferError> {
    let p = snap
        .transfers
        .get(&pid)
        .cloned()
        .ok_or(TransferError::ReferenceNotFound)?;
    if p.kind != TransferKind::Pending {
        return Err(TransferError::NotPending);
    }
    match snap.statuses.get(&pid) {
        Some(TransferStatus::Posted { .. }) => Err(TransferError::AlreadyPosted),
        Some(TransferStatus::Voided) => Err(TransferError::AlreadyVoided),
        Some(TransferStatus::Expired) => Err(TransferError::PendingExpired),
        _ => {
            if p.expires_at().is_some_and(|e| now >= e) {
                expire(snap, ch, pid, now);
                return Err(TransferError::PendingExpired);
            }
            Ok(p)
        }
    }
}

/// Expires hold `pid` if, by its own entry (timestamp + timeout), it has lapsed at `now`.
///
/// The backends find candidates through an index (`ledger_status.expires_at`); that index is
/// only a hint. A hold the index calls due but whose own time has not come is not released:
/// its status is rewritten instead (which rewrites the index from the hold itself).
fn expire(snap: &mut Snapshot, ch: &mut Changes, pid: TransferId, now: Timestamp) {
    let Some(p) = snap.transfers.get(&pid).cloned() else {
        return;
    };
    if snap.statuses.get(&pid) != Some(&TransferStatus::Pending) {
        return;
    }
    if p.expires_at().is_none_or(|e| now < e) {
        ch.statuses.insert(pid);
        ch.repaired.push(pid);
        return;
    }
    let m = release(expiry_id(pid), TransferKind::ExpirePending, &p);
    commit(snap, ch, &m, now);
    set_status(snap, ch, pid, TransferStatus::Expired);
}

/// Checks a new transfer of `amount` between `accounts` (debit, credit): a hold with its
/// timeout (`hold: Some(timeout_ms)`) or a posting transfer (`None`, timeout 0).
fn check_new(
    snap: &Snapshot,
    id: TransferId,
    accounts: (AccountId, AccountId),
    amount: u64,
    user_data: u128,
    hold: Option<u64>,
) -> Result<Movement, TransferError> {
    let (debit, credit) = accounts;
    let (pending, timeout_ms) = (hold.is_some(), hold.unwrap_or(0));
    if amount == 0 {
        return Err(TransferError::AmountMustNotBeZero);
    }
    if timeout_ms > MAX_COUNTER {
        return Err(TransferError::TimeoutTooLarge);
    }
    if debit == credit {
        return Err(TransferError::AccountsMustBeDifferent);
    }
    let d = snap
        .accounts
        .get(&debit)
        .ok_or(TransferError::DebitAccountNotFound)?;
    let c = snap
        .accounts
        .get(&credit)
        .ok_or(TransferError::CreditAccountNotFound)?;
    if d.asset != c.asset {
        return Err(TransferError::AssetMismatch);
    }
    // Every counter must stay within storage range.
    let (dp, cp) = if pending {
        (d.debits_pending, c.credits_pending)
    } else {
        (d.debits_posted, c.credits_posted)
    };
    add(dp, amount)?;
    add(cp, amount)?;
    add(add(d.debits_pending, d.debits_posted)?, amount)?;
    add(add(c.credits_pending, c.credits_posted)?, amount)?;
    if d.no_overdraft {
        let spent = add(d.debits_pending, d.debits_posted)?;
        let available = d.credits_posted.saturating_sub(spent);
        if amount > available {
            return Err(TransferError::ExceedsCredits { available });
        }
    }
    Ok(Movement {
        id,
        kind: if pending {
            TransferKind::Pending
        } else {
            TransferKind::Single
        },
        debit,
        credit,
        amount,
        reference: None,
        user_data,
        timeout_ms,
        pending_add: if pending { amount } else { 0 },
        pending_sub: 0,
        posted_add: if pending { 0 } else { amount },
    })
}

/// Applies a checked movement: updates both accounts, appends the journal entry.
fn commit(snap: &mut Snapshot, ch: &mut Changes, m: &Movement, now: Timestamp) -> Transfer {
    let side = |pending: u64, posted: u64| SideBalances {
        pending_before: pending,
        // Checked by the caller: releases never exceed what is pending, additions stay in range.
        pending_after: pending
            .saturating_add(m.pending_add)
            .saturating_sub(m.pending_sub),
        posted_before: posted,
        posted_after: posted.saturating_add(m.posted_add),
    };
    let mut debit_side = SideBalances::default();
    let mut credit_side = SideBalances::default();
    if let Some(d) = snap.accounts.get_mut(&m.debit) {
        debit_side = side(d.debits_pending, d.debits_posted);
        d.debits_pending = debit_side.pending_after;
        d.debits_posted = debit_side.posted_after;
    }
    if let Some(c) = snap.accounts.get_mut(&m.credit) {
        credit_side = side(c.credits_pending, c.credits_posted);
        c.credits_pending = credit_side.pending_after;
        c.credits_posted = credit_side.posted_after;
    }
    ch.accounts.insert(m.debit);
    ch.accounts.insert(m.credit);
    snap.head_seq += 1;
    let mut t = Transfer {
        seq: snap.head_seq,
        id: m.id,
        kind: m.kind,
        debit: m.debit,
        credit: m.credit,
        amount: m.amount,
        reference: m.reference,
        user_data: m.user_data,
        timeout_ms: m.timeout_ms,
        timestamp: now,
        debit_side,
        credit_side,
        prev_hash: snap.head_hash,
        hash: [0; 32],
    };
    t.hash = entry_hash(&t);
    snap.head_hash = t.hash;
    snap.transfers.insert(t.id, t.clone());
    ch.new_transfers.push(t.clone());
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use rail_core::Asset;

    fn snap_with(accounts: &[(u128, bool)]) -> Snapshot {
        let mut s = Snapshot::default();
        for &(id, nod) in accounts {
            s.accounts.insert(
                AccountId(id),
                Account {
                    id: AccountId(id),
                    asset: Asset::usd(),
                    no_overdraft: nod,
                    debits_pending: 0,
                    debits_posted: 0,
                    credits_pending: 0,
                    credits_posted: 0,
                    created_at: Timestamp(0),
                },
            );
        }
        s
    }

    fn single(id: u128, d: u128, c: u128, amount: u64) -> Command {
        Command::Transfer(TransferRequest::Single {
            id: TransferId(id),
            debit: AccountId(d),
            credit: AccountId(c),
            amount,
            user_data: 0,
        })
    }

    #[test]
    fn refused_requests_change_nothing_and_do_not_disturb_the_batch() {
        let mut s = snap_with(&[(1, false), (2, true), (3, false)]);
        let cmds = vec![
            single(10, 1, 2, 100),         // fund 2
            single(11, 2, 3, 101),         // overdraft: refused
            single(12, 2, 3, 60),          // fine
            single(12, 2, 3, 61),          // same id, other amount
            single(12, 2, 3, 60),          // same id, same fields
            single(13, 2, 2, 1),           // same account
            single(14, 2, 3, MAX_COUNTER), // beyond any counter
        ];
        let (out, ch) = apply_batch(&mut s, &cmds, Timestamp(5));
        let codes: Vec<String> = out
            .iter()
            .map(|o| match o {
                Outcome::Transfer(Ok(Created::Created(_))) => "created".into(),
                Outcome::Transfer(Ok(Created::Exists(_))) => "exists".into(),
                Outcome::Transfer(Err(e)) => format!("{e:?}"),
                Outcome::Account(_) => unreachable!(),
            })
            .collect();
        assert_eq!(
            codes,
            [
                "created",
                "ExceedsCredits { available: 100 }",
                "created",
                "ExistsWithDifferentFields",
                "exists",
                "AccountsMustBeDifferent",
                "Overflow"
            ]
        );
        assert_eq!(ch.new_transfers.len(), 2);
        assert_eq!(s.accounts[&AccountId(2)].available(), 40);
        assert_eq!(s.head_seq, 2);
    }

    #[test]
    fn reserved_ids_and_huge_timeouts_are_refused() {
        let mut s = snap_with(&[(1, false), (2, false)]);
        let pending = TransferId(5);
        let cmds = vec![
            // A client cannot take the id the ledger will give the hold's expiry.
            Command::Transfer(TransferRequest::Single {
                id: expiry_id(pending),
                debit: AccountId(1),
                credit: AccountId(2),
                amount: 1,
                user_data: 0,
            }),
            Command::Transfer(TransferRequest::Pending {
                id: pending,
                debit: AccountId(1),
                credit: AccountId(2),
                amount: 1,
                user_data: 0,
                timeout_ms: u64::MAX,
            }),
        ];
        let (out, ch) = apply_batch(&mut s, &cmds, Timestamp(0));
        assert!(matches!(
            out[0],
            Outcome::Transfer(Err(TransferError::IdReserved))
        ));
        assert!(matches!(
            out[1],
            Outcome::Transfer(Err(TransferError::TimeoutTooLarge))
        ));
        assert!(ch.is_empty());
        assert!(!TransferId::random().is_reserved());
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            Single(u8, u8, u64),
            Pending(u8, u8, u64, u64),
            Post(u8, u64),
            Void(u8),
            Reverse(u8, u64),
            /// Resubmit an earlier request (same id, same fields).
            Retry(u8),
            Advance(u64),
            /// Spend an account's whole available balance plus `extra` (0, 1 or 2): the
            /// boundary of no-overdraft.
            Drain(u8, u8, u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0u8..5, 0u8..5, 0u64..400).prop_map(|(d, c, a)| Op::Single(d, c, a)),
                (0u8..5, 0u8..5, 0u64..400, 0u64..3).prop_map(|(d, c, a, t)| Op::Pending(
                    d,
                    c,
                    a,
                    t * 1000
                )),
                (any::<u8>(), 0u64..400).prop_map(|(p, a)| Op::Post(p, a)),
                any::<u8>().prop_map(Op::Void),
                (any::<u8>(), 0u64..400).prop_map(|(p, a)| Op::Reverse(p, a)),
                any::<u8>().prop_map(Op::Retry),
                (0u64..2500).prop_map(Op::Advance),
                (1u8..5, 0u8..5, 0u64..3).prop_map(|(d, c, x)| Op::Drain(d, c, x)),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(200))]
            /// Any sequence of requests, in any batch split: money is neither created nor
            /// destroyed, no no-overdraft account is overdrawn, no id is applied twice, and the
            /// journal replays to exactly the stored balances and statuses.
            #[test]
            fn ledger_invariants_hold(ops in proptest::collection::vec(op(), 1..80), split in 1usize..9) {
                // Account 0 is the bank (may go negative); 1-4 refuse overdrafts.
                let mut s = snap_with(&[(10, false), (11, true), (12, true), (13, true), (14, true)]);
                let acc = |i: u8| AccountId(10 + u128::from(i % 5));
                let mut now = Timestamp(0);
                let mut sent: Vec<TransferRequest> = Vec::new();
                let mut holds: Vec<TransferId> = Vec::new();
                let mut postings: Vec<TransferId> = Vec::new();
                let mut journal: Vec<Transfer> = Vec::new();
                let mut next = 1u128;
                let mut fresh = || { next += 1; TransferId(next) };
                // Fund the customer accounts.
                let funding: Vec<Command> = (1..5u8).map(|i| single(1000 + u128::from(i), 10, 10 + u128::from(i), 500)).collect();
                let (_, ch) = apply_batch(&mut s, &funding, now);
                journal.extend(ch.new_transfers);
                let mut batch: Vec<Command> = Vec::new();
                for (k, o) in ops.into_iter().enumerate() {
                    let req = match o {
                        Op::Single(d, c, a) => Some(TransferRequest::Single { id: fresh(), debit: acc(d), credit: acc(c), amount: a, user_data: 0 }),
                        Op::Pending(d, c, a, t) => Some(TransferRequest::Pending { id: fresh(), debit: acc(d), credit: acc(c), amount: a, user_data: 0, timeout_ms: t }),
                        Op::Post(p, a) => holds.get(usize::from(p) % holds.len().max(1)).map(|h| TransferRequest::Post { id: fresh(), pending_id: *h, amount: a }),
                        Op::Void(p) => holds.get(usize::from(p) % holds.len().max(1)).map(|h| TransferRequest::Void { id: fresh(), pending_id: *h }),
                        Op::Reverse(p, a) => postings.get(usize::from(p) % postings.len().max(1)).map(|t| TransferRequest::Reverse { id: fresh(), of: *t, amount: a }),
                        Op::Retry(p) => sent.get(usize::from(p) % sent.len().max(1)).cloned(),
                        Op::Advance(ms) => { now = Timestamp(now.0 + i64::try_from(ms).unwrap()); None }
                        Op::Drain(d, c, extra) => {
                            // Available as of the requests applied so far (the open batch may
                            // change it: the boundary is still probed most of the time).
                            let avail = s.accounts.get(&acc(d)).map_or(0, |a| u64::try_from(a.available().max(0)).unwrap());
                            Some(TransferRequest::Single { id: fresh(), debit: acc(d), credit: acc(c), amount: avail + extra, user_data: 0 })
                        }
                    };
                    if let Some(r) = req {
                        match &r {
                            TransferRequest::Pending { id, .. } => holds.push(*id),
                            TransferRequest::Single { id, .. } | TransferRequest::Post { id, .. } => postings.push(*id),
                            _ => {}
                        }
                        sent.push(r.clone());
                        batch.push(Command::Transfer(r));
                    }
                    if batch.len() >= split || k % 7 == 6 {
                        let (_, ch) = apply_batch(&mut s, &batch, now);
                        journal.extend(ch.new_transfers);
                        batch.clear();
                    }
                }
                let (_, ch) = apply_batch(&mut s, &batch, now);
                journal.extend(ch.new_transfers);

                let mut posted = 0i128;
                let (mut dp, mut cp) = (0u128, 0u128);
                for a in s.accounts.values() {
                    posted += a.posted_balance();
                    dp += u128::from(a.debits_pending);
                    cp += u128::from(a.credits_pending);
                    if a.no_overdraft {
                        prop_assert!(a.debits_posted + a.debits_pending <= a.credits_posted, "overdrawn: {a:?}");
                    }
                }
                prop_assert_eq!(posted, 0, "posted money created or destroyed");
                prop_assert_eq!(dp, cp, "pending debits and credits disagree");
                let mut ids = std::collections::HashSet::new();
                for t in &journal {
                    prop_assert!(ids.insert(t.id), "id applied twice: {:?}", t.id);
                }
                // The journal satisfies every rule the verifier checks (one resolution per
                // hold, posts within and before the hold's time, expiries after it, no
                // overdraft) and replays to exactly the stored balances and statuses.
                let mut v = crate::verify::Verifier::new(journal.last().map(|t| (t.seq, t.hash)));
                for a in s.accounts.values() {
                    v.account(a);
                }
                for t in &journal {
                    v.entry(t);
                }
                for (id, st) in &s.statuses {
                    v.status(*id, *st, s.transfers.get(id).and_then(Transfer::expires_at));
                }
                let report = v.finish((s.head_seq, s.head_hash));
                prop_assert!(report.is_intact(), "{:?}", report.problems);
            }
        }
    }

    #[test]
    fn overflow_is_refused() {
        let mut s = snap_with(&[(1, false), (2, false)]);
        let (out, _) = apply_batch(
            &mut s,
            &[single(1, 1, 2, MAX_COUNTER), single(2, 1, 2, 1)],
            Timestamp(0),
        );
        assert!(matches!(out[0], Outcome::Transfer(Ok(_))));
        assert!(matches!(
            out[1],
            Outcome::Transfer(Err(TransferError::Overflow))
        ));
    }
}
