//! Ledger data: accounts, transfer requests, stored transfers (journal entries) and the
//! TigerBeetle-style result codes.

use std::fmt;
use std::str::FromStr;

use rail_core::{Asset, Timestamp};
use serde::{Deserialize, Serialize};

/// The top bit of a 128-bit id: set only on ids the ledger writes itself (hold expiries).
pub const RESERVED_BIT: u128 = 1 << 127;

macro_rules! id128 {
    ($name:ident, $what:literal) => {
        #[doc = concat!("A client-chosen 128-bit ", $what, " id (never zero); text form: 32 lowercase hex digits.")]
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(into = "String", try_from = "String")]
        pub struct $name(pub u128);

        impl $name {
            /// A random id (never zero, never in the ledger's reserved range).
            #[must_use]
            pub fn random() -> Self {
                $name((rand::random::<u128>() | 1) & !RESERVED_BIT)
            }
            /// Whether the id is in the range the ledger keeps for entries it writes itself
            /// (the top bit set); such ids are refused in requests.
            #[must_use]
            pub fn is_reserved(self) -> bool {
                self.0 & RESERVED_BIT != 0
            }
            /// Big-endian bytes (the stored form).
            #[must_use]
            pub fn to_bytes(self) -> [u8; 16] {
                self.0.to_be_bytes()
            }
            /// From big-endian bytes.
            #[must_use]
            pub fn from_bytes(b: [u8; 16]) -> Self {
                $name(u128::from_be_bytes(b))
            }
            pub(crate) fn from_slice(b: &[u8]) -> Option<Self> {
                <[u8; 16]>::try_from(b).ok().map(Self::from_bytes)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:032x}", self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:032x})", stringify!($name), self.0)
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                if s.len() != 32 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                    return Err(format!("{} must be 32 lowercase hex digits", $what));
                }
                u128::from_str_radix(s, 16).map($name).map_err(|e| e.to_string())
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.to_string()
            }
        }
    };
}

id128!(AccountId, "account");
id128!(TransferId, "transfer");

/// An account: one asset, four balance counters (TigerBeetle's model).
///
/// For a customer's funds account, the balance is `credits_posted - debits_posted` and what can
/// still be spent is that minus `debits_pending`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    /// The id.
    pub id: AccountId,
    /// The one asset the account holds.
    pub asset: Asset,
    /// Refuse debits (posted + pending) above credits posted.
    pub no_overdraft: bool,
    /// Debits held by pending transfers.
    pub debits_pending: u64,
    /// Debits posted.
    pub debits_posted: u64,
    /// Credits held by pending transfers.
    pub credits_pending: u64,
    /// Credits posted.
    pub credits_posted: u64,
    /// When it was created.
    pub created_at: Timestamp,
}

impl Account {
    /// `credits_posted - debits_posted` (may be negative for accounts without `no_overdraft`).
    #[must_use]
    pub fn posted_balance(&self) -> i128 {
        i128::from(self.credits_posted) - i128::from(self.debits_posted)
    }

    /// What can still be debited: the posted balance minus pending debits.
    #[must_use]
    pub fn available(&self) -> i128 {
        self.posted_balance() - i128::from(self.debits_pending)
    }
}

/// A new account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewAccount {
    /// Client-chosen id (idempotent).
    pub id: AccountId,
    /// Its asset.
    pub asset: Asset,
    /// Refuse overdrafts.
    pub no_overdraft: bool,
}

/// What a transfer does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferKind {
    /// Moves money now.
    Single,
    /// Holds money (two-phase, first phase).
    Pending,
    /// Posts (part of) a pending transfer; the rest is released.
    PostPending,
    /// Releases a pending transfer.
    VoidPending,
    /// Releases a pending transfer whose timeout passed (written by the ledger itself).
    ExpirePending,
    /// Sends (part of) a posted transfer back (refund; never more than was posted in total).
    Reversal,
}

impl TransferKind {
    pub(crate) fn code(self) -> i16 {
        match self {
            TransferKind::Single => 1,
            TransferKind::Pending => 2,
            TransferKind::PostPending => 3,
            TransferKind::VoidPending => 4,
            TransferKind::ExpirePending => 5,
            TransferKind::Reversal => 6,
        }
    }

    pub(crate) fn from_code(c: i16) -> Option<Self> {
        Some(match c {
            1 => TransferKind::Single,
            2 => TransferKind::Pending,
            3 => TransferKind::PostPending,
            4 => TransferKind::VoidPending,
            5 => TransferKind::ExpirePending,
            6 => TransferKind::Reversal,
            _ => return None,
        })
    }

    /// Whether this kind moves posted money (and may therefore be reversed).
    #[must_use]
    pub fn is_posting(self) -> bool {
        matches!(self, TransferKind::Single | TransferKind::PostPending)
    }
}

/// A transfer request. Ids are client-chosen and idempotent: the same request again answers
/// [`Created::Exists`]; the same id with other fields is
/// [`TransferError::ExistsWithDifferentFields`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TransferRequest {
    /// Move `amount` from `debit` to `credit` now.
    Single {
        /// Transfer id.
        id: TransferId,
        /// Account debited.
        debit: AccountId,
        /// Account credited.
        credit: AccountId,
        /// Minor units.
        amount: u64,
        /// Caller data (the rail binds the offer id here).
        user_data: u128,
    },
    /// Hold `amount` from `debit` for `credit`, for `timeout_ms` (0 = until posted or voided).
    ///
    /// A timeout of 0 keeps TigerBeetle's meaning (no timeout) for direct ledger users who
    /// resolve every hold themselves. The rail never creates such a hold, and its receiver
    /// refuses one ([`crate::HoldRefusal::NoTimeout`]): a payment hold must lapse on its own.
    Pending {
        /// Transfer id.
        id: TransferId,
        /// Account debited.
        debit: AccountId,
        /// Account credited.
        credit: AccountId,
        /// Minor units.
        amount: u64,
        /// Caller data.
        user_data: u128,
        /// Milliseconds until the hold lapses; 0 = no timeout.
        timeout_ms: u64,
    },
    /// Post `amount` (≤ the pending amount) of pending transfer `pending_id`.
    Post {
        /// Transfer id.
        id: TransferId,
        /// The pending transfer.
        pending_id: TransferId,
        /// Minor units to post; the rest is released.
        amount: u64,
    },
    /// Void pending transfer `pending_id`.
    Void {
        /// Transfer id.
        id: TransferId,
        /// The pending transfer.
        pending_id: TransferId,
    },
    /// Send `amount` of posted transfer `of` back from its credit to its debit account.
    Reverse {
        /// Transfer id.
        id: TransferId,
        /// The posted transfer (single or post).
        of: TransferId,
        /// Minor units.
        amount: u64,
    },
}

impl TransferRequest {
    /// The request's transfer id.
    #[must_use]
    pub fn id(&self) -> TransferId {
        match self {
            TransferRequest::Single { id, .. }
            | TransferRequest::Pending { id, .. }
            | TransferRequest::Post { id, .. }
            | TransferRequest::Void { id, .. }
            | TransferRequest::Reverse { id, .. } => *id,
        }
    }

    /// Whether `stored` is the transfer this request made: the ledger's idempotency rule (the
    /// same id with these fields is answered by `stored`; with others it is
    /// [`crate::TransferError::ExistsWithDifferentFields`]). Lets a caller that finds a
    /// transfer under its id tell its own earlier request from another.
    #[must_use]
    pub fn made(&self, stored: &Transfer) -> bool {
        match *self {
            TransferRequest::Single {
                amount, user_data, ..
            } => {
                stored.kind == TransferKind::Single
                    && self.accounts() == Some((stored.debit, stored.credit))
                    && (stored.amount, stored.user_data) == (amount, user_data)
            }
            TransferRequest::Pending {
                amount,
                user_data,
                timeout_ms,
                ..
            } => {
                stored.kind == TransferKind::Pending
                    && self.accounts() == Some((stored.debit, stored.credit))
                    && (stored.amount, stored.user_data, stored.timeout_ms)
                        == (amount, user_data, timeout_ms)
            }
            TransferRequest::Post {
                pending_id, amount, ..
            } => {
                stored.kind == TransferKind::PostPending
                    && stored.reference == Some(pending_id)
                    && stored.amount == amount
            }
            TransferRequest::Void { pending_id, .. } => {
                stored.kind == TransferKind::VoidPending && stored.reference == Some(pending_id)
            }
            TransferRequest::Reverse { of, amount, .. } => {
                stored.kind == TransferKind::Reversal
                    && stored.reference == Some(of)
                    && stored.amount == amount
            }
        }
    }

    /// The transfer this request refers to (pending or reversed), if any.
    #[must_use]
    pub fn referenced(&self) -> Option<TransferId> {
        match self {
            TransferRequest::Post { pending_id, .. } | TransferRequest::Void { pending_id, .. } => {
                Some(*pending_id)
            }
            TransferRequest::Reverse { of, .. } => Some(*of),
            _ => None,
        }
    }

    /// The accounts this request names directly.
    #[must_use]
    pub fn accounts(&self) -> Option<(AccountId, AccountId)> {
        match self {
            TransferRequest::Single { debit, credit, .. }
            | TransferRequest::Pending { debit, credit, .. } => Some((*debit, *credit)),
            _ => None,
        }
    }
}

/// Balance counters of one side of an entry, before and after it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SideBalances {
    /// The side's pending counter before.
    pub pending_before: u64,
    /// … after.
    pub pending_after: u64,
    /// The side's posted counter before.
    pub posted_before: u64,
    /// … after.
    pub posted_after: u64,
}

/// A stored transfer: one immutable journal entry, hash-chained to the one before it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transfer {
    /// Position in the journal (1, 2, 3, …).
    pub seq: i64,
    /// Transfer id.
    pub id: TransferId,
    /// What it does.
    pub kind: TransferKind,
    /// Account debited.
    pub debit: AccountId,
    /// Account credited.
    pub credit: AccountId,
    /// Minor units moved, held or released.
    pub amount: u64,
    /// The pending transfer posted/voided/expired, or the transfer reversed.
    pub reference: Option<TransferId>,
    /// Caller data.
    pub user_data: u128,
    /// Hold timeout (pending transfers), 0 = none.
    pub timeout_ms: u64,
    /// When the ledger applied it.
    pub timestamp: Timestamp,
    /// The debit account's debit counters around this entry.
    pub debit_side: SideBalances,
    /// The credit account's credit counters around this entry.
    pub credit_side: SideBalances,
    /// Hash of the previous entry (zeros for the first).
    pub prev_hash: [u8; 32],
    /// SHA-256 over `prev_hash` and this entry's fields.
    pub hash: [u8; 32],
}

impl Transfer {
    /// When a pending transfer lapses (`None` without timeout).
    #[must_use]
    pub fn expires_at(&self) -> Option<Timestamp> {
        (self.kind == TransferKind::Pending && self.timeout_ms > 0).then(|| {
            Timestamp(
                self.timestamp
                    .0
                    .saturating_add(i64::try_from(self.timeout_ms).unwrap_or(i64::MAX)),
            )
        })
    }
}

/// Where a pending transfer stands, or how much of a posted one has been reversed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum TransferStatus {
    /// A hold, still open.
    Pending,
    /// A hold that was posted (`amount` of it).
    Posted {
        /// Posted amount.
        amount: u64,
    },
    /// A hold that was voided.
    Voided,
    /// A hold that lapsed.
    Expired,
    /// A posting transfer, `reversed` of which has been sent back.
    Settled {
        /// Sum of reversals.
        reversed: u64,
    },
}

impl TransferStatus {
    /// The stored form. Amounts are within `BIGINT` (the store checks before writing).
    pub(crate) fn encode(self) -> (i16, i64) {
        let amt = |a: u64| i64::try_from(a).unwrap_or(i64::MAX);
        match self {
            TransferStatus::Pending => (1, 0),
            TransferStatus::Posted { amount } => (2, amt(amount)),
            TransferStatus::Voided => (3, 0),
            TransferStatus::Expired => (4, 0),
            TransferStatus::Settled { reversed } => (5, amt(reversed)),
        }
    }

    pub(crate) fn decode(code: i16, amount: i64) -> Option<Self> {
        let amt = u64::try_from(amount).ok()?;
        Some(match code {
            1 => TransferStatus::Pending,
            2 => TransferStatus::Posted { amount: amt },
            3 => TransferStatus::Voided,
            4 => TransferStatus::Expired,
            5 => TransferStatus::Settled { reversed: amt },
            _ => return None,
        })
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            TransferStatus::Pending => "pending",
            TransferStatus::Posted { .. } => "posted",
            TransferStatus::Voided => "voided",
            TransferStatus::Expired => "expired",
            TransferStatus::Settled { .. } => "settled",
        }
    }
}

/// A successful transfer request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", content = "transfer", rename_all = "snake_case")]
pub enum Created {
    /// Applied now.
    Created(Transfer),
    /// Applied before, with the same fields: the stored transfer.
    Exists(Transfer),
}

impl Created {
    /// The transfer either way.
    #[must_use]
    pub fn transfer(&self) -> &Transfer {
        match self {
            Created::Created(t) | Created::Exists(t) => t,
        }
    }
}

/// Why a transfer request was refused. Nothing is written for a refused request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum TransferError {
    /// Ids must not be zero.
    #[error("id must not be zero")]
    IdMustNotBeZero,
    /// Ids with the top bit set are the ledger's own.
    #[error("id is in the ledger's reserved range (top bit set)")]
    IdReserved,
    /// A hold timeout beyond the storage range.
    #[error("timeout too large")]
    TimeoutTooLarge,
    /// Amounts must not be zero.
    #[error("amount must not be zero")]
    AmountMustNotBeZero,
    /// Debit and credit must differ.
    #[error("accounts must be different")]
    AccountsMustBeDifferent,
    /// No such debit account.
    #[error("debit account not found")]
    DebitAccountNotFound,
    /// No such credit account.
    #[error("credit account not found")]
    CreditAccountNotFound,
    /// The two accounts hold different assets.
    #[error("accounts must have the same asset")]
    AssetMismatch,
    /// The debit account has `no_overdraft` and not enough available.
    #[error("exceeds credits: {available} available")]
    ExceedsCredits {
        /// What the account could still spend.
        available: u64,
    },
    /// A counter would exceed `i64::MAX` (the storage range).
    #[error("amount overflows the account's counters")]
    Overflow,
    /// The id was used with other fields.
    #[error("transfer id exists with different fields")]
    ExistsWithDifferentFields,
    /// The referenced pending or posted transfer does not exist.
    #[error("referenced transfer not found")]
    ReferenceNotFound,
    /// The referenced transfer is not a pending transfer.
    #[error("referenced transfer is not pending")]
    NotPending,
    /// The pending transfer was posted already.
    #[error("pending transfer already posted")]
    AlreadyPosted,
    /// The pending transfer was voided already.
    #[error("pending transfer already voided")]
    AlreadyVoided,
    /// The pending transfer lapsed.
    #[error("pending transfer expired")]
    PendingExpired,
    /// A post above the pending amount.
    #[error("exceeds the pending amount {pending}")]
    ExceedsPendingAmount {
        /// The pending amount.
        pending: u64,
    },
    /// The reversed transfer is not a posting transfer.
    #[error("only posted transfers can be reversed")]
    CannotReverse,
    /// Reversals would exceed what was posted.
    #[error("reversal exceeds the {available} not yet reversed")]
    ExceedsReversible {
        /// What may still be reversed.
        available: u64,
    },
    /// An account id exists with another asset or flag.
    #[error("account exists with different fields")]
    AccountExistsWithDifferentFields,
}

/// Outcome of one account creation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccountCreated {
    /// Created now.
    Created(Account),
    /// Existed with the same fields.
    Exists(Account),
}
