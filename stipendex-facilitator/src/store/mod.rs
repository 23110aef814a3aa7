//! The facilitator's own records beside the ledger: who may sign for each account (its public
//! key) and its review threshold; the review queue. One set of SQL statements serves SQLite
//! (one instance) and PostgreSQL (several instances on one database).
//!
//! The ledger is the truth about money; a review row only says what an operator decided, and
//! every decision is applied to the ledger first (post or void the held payment) and recorded
//! after, so a decision interrupted half-way is finished by taking it again.

mod sql;

use rail_core::{RailError, RailResult, Timestamp};
use serde::{Deserialize, Serialize};

pub use sql::Pool;

/// An account as the facilitator knows it (its money is in the ledger).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountRecord {
    /// The ledger account (32 hex digits).
    pub id: String,
    /// Its public key, `ed25519:<base64url>`.
    pub public_key: String,
    /// Payments above this many minor units wait for review; `None` = never.
    pub review_above: Option<i64>,
    /// A name for operators.
    pub label: String,
    /// When it was registered.
    pub created_at: Timestamp,
}

/// An operator's decision on a payment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReviewState {
    /// Waiting.
    Pending,
    /// Approved: a payment was posted, a hold may be verified.
    Approved,
    /// Rejected: the held funds were released.
    Rejected,
    /// The hold lapsed before a decision.
    Expired,
}

impl ReviewState {
    /// The stored name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewState::Pending => "pending",
            ReviewState::Approved => "approved",
            ReviewState::Rejected => "rejected",
            ReviewState::Expired => "expired",
        }
    }

    /// Reads a stored name.
    ///
    /// # Errors
    /// [`RailError::Storage`] for an unknown name.
    pub fn parse(s: &str) -> RailResult<Self> {
        Ok(match s {
            "pending" => ReviewState::Pending,
            "approved" => ReviewState::Approved,
            "rejected" => ReviewState::Rejected,
            "expired" => ReviewState::Expired,
            other => {
                return Err(RailError::Storage(format!(
                    "unknown review state {other:?}"
                )));
            }
        })
    }
}

/// One payment in the review queue.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewRecord {
    /// The held payment (ledger transfer id).
    pub payment_id: String,
    /// Who pays.
    pub payer: String,
    /// Who is paid.
    pub payee: String,
    /// How much, in minor units of `asset`.
    pub amount: i64,
    /// The asset's code.
    pub asset: String,
    /// `capture` (a payment) or `hold`.
    pub mode: String,
    /// The offer it pays.
    pub offer_id: String,
    /// When that offer expires (after it, the payment cannot be verified).
    pub offer_expires_at: Timestamp,
    /// Why it waits.
    pub reason: String,
    /// The decision.
    pub state: ReviewState,
    /// When it entered the queue.
    pub created_at: Timestamp,
    /// When it was decided.
    pub decided_at: Option<Timestamp>,
    /// Who decided.
    pub decided_by: Option<String>,
    /// The operator's note.
    pub note: Option<String>,
}

impl ReviewRecord {
    /// Whether this review and `other` are for the same payment: payer, payee, amount, asset,
    /// mode and offer (the queue's state, reason and times aside).
    #[must_use]
    pub fn is_for(&self, other: &ReviewRecord) -> bool {
        (
            &self.payment_id,
            &self.payer,
            &self.payee,
            self.amount,
            &self.asset,
            &self.mode,
            &self.offer_id,
        ) == (
            &other.payment_id,
            &other.payer,
            &other.payee,
            other.amount,
            &other.asset,
            &other.mode,
            &other.offer_id,
        )
    }
}
