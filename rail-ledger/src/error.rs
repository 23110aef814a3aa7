//! The ledger's error type.

use rail_core::{RailError, RailReason};

use crate::types::TransferError;

/// An error from the ledger.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The request was refused; nothing was written.
    #[error("refused: {0}")]
    Refused(#[from] TransferError),
    /// The database failed; the whole batch was rolled back. Retry with the same ids.
    #[error("storage: {0}")]
    Storage(String),
    /// Stored data does not decode (tampering or a schema mismatch).
    #[error("corrupt ledger data: {0}")]
    Corrupt(String),
    /// The ledger was shut down.
    #[error("ledger is closed")]
    Closed,
    /// A journal anchor was refused (its MAC, its key, or its form).
    #[error("journal anchor: {0}")]
    Anchor(#[from] crate::anchor::AnchorError),
}

impl From<LedgerError> for RailError {
    fn from(e: LedgerError) -> Self {
        match e {
            LedgerError::Refused(t) => t.into(),
            LedgerError::Storage(s) => RailError::Storage(s),
            LedgerError::Corrupt(s) => RailError::Rail {
                reason: RailReason::new("corrupt", s),
                retryable: false,
            },
            LedgerError::Closed => {
                RailError::Unavailable(RailReason::new("closed", "ledger is closed"))
            }
            LedgerError::Anchor(a) => RailError::InvalidInput(a.to_string()),
        }
    }
}

impl TransferError {
    /// The stable snake_case code (TigerBeetle's names where it has one).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            TransferError::IdMustNotBeZero => "id_must_not_be_zero",
            TransferError::IdReserved => "id_reserved",
            TransferError::TimeoutTooLarge => "timeout_too_large",
            TransferError::AmountMustNotBeZero => "amount_must_not_be_zero",
            TransferError::AccountsMustBeDifferent => "accounts_must_be_different",
            TransferError::DebitAccountNotFound => "debit_account_not_found",
            TransferError::CreditAccountNotFound => "credit_account_not_found",
            TransferError::AssetMismatch => "accounts_must_have_the_same_ledger",
            TransferError::ExceedsCredits { .. } => "exceeds_credits",
            TransferError::Overflow => "overflows_debits_or_credits",
            TransferError::ExistsWithDifferentFields => "exists_with_different_fields",
            TransferError::ReferenceNotFound => "pending_transfer_not_found",
            TransferError::NotPending => "pending_transfer_not_pending",
            TransferError::AlreadyPosted => "pending_transfer_already_posted",
            TransferError::AlreadyVoided => "pending_transfer_already_voided",
            TransferError::PendingExpired => "pending_transfer_expired",
            TransferError::ExceedsPendingAmount { .. } => "exceeds_pending_transfer_amount",
            TransferError::CannotReverse => "cannot_reverse",
            TransferError::ExceedsReversible { .. } => "exceeds_reversible_amount",
            TransferError::AccountExistsWithDifferentFields => {
                "account_exists_with_different_fields"
            }
        }
    }
}

impl From<TransferError> for RailError {
    fn from(t: TransferError) -> Self {
        let reason = RailReason::new(t.code(), t.to_string());
        match t {
            TransferError::ExceedsCredits { .. } => {
                RailError::InsufficientFunds(reason.to_string())
            }
            TransferError::ExistsWithDifferentFields => RailError::IdempotencyConflict {
                op_id: reason.message,
            },
            TransferError::AlreadyPosted => RailError::InvalidState {
                op: "capture or void",
                state: "captured".into(),
            },
            TransferError::AlreadyVoided => RailError::InvalidState {
                op: "capture or void",
                state: "voided".into(),
            },
            TransferError::PendingExpired => RailError::InvalidState {
                op: "capture or void",
                state: "expired".into(),
            },
            TransferError::NotPending | TransferError::CannotReverse => RailError::InvalidState {
                op: "this operation",
                state: "not in a state that allows it".into(),
            },
            TransferError::ReferenceNotFound
            | TransferError::DebitAccountNotFound
            | TransferError::CreditAccountNotFound => RailError::NotFound(reason.to_string()),
            TransferError::Overflow => RailError::Money(rail_core::MoneyError::Overflow {
                target: "ledger counter (i64)",
            }),
            TransferError::IdMustNotBeZero
            | TransferError::IdReserved
            | TransferError::TimeoutTooLarge
            | TransferError::AmountMustNotBeZero
            | TransferError::AccountsMustBeDifferent
            | TransferError::AssetMismatch
            | TransferError::AccountExistsWithDifferentFields => {
                RailError::InvalidInput(reason.to_string())
            }
            _ => RailError::Rail {
                reason,
                retryable: false,
            },
        }
    }
}

impl From<RailError> for LedgerError {
    /// A store's failure under the ledger (the SQLite writer's commit): a storage error.
    fn from(e: RailError) -> Self {
        match e {
            RailError::Storage(s) => LedgerError::Storage(s),
            other => LedgerError::Storage(other.to_string()),
        }
    }
}
