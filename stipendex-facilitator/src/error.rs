//! The facilitator's error type.

use rail_account::AuthError;
use rail_account::api::WireError;
use rail_core::RailError;
use rail_ledger::HoldRefusal;

/// An error of the facilitator: a refusal to answer on the wire, or a set-up failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request's signature was refused.
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A payment operation was refused (or the ledger failed).
    #[error(transparent)]
    Rail(#[from] RailError),
    /// The request cannot be read.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The settings or the database URL are wrong.
    #[error("{0}")]
    Config(String),
}

impl Error {
    /// The wire form.
    #[must_use]
    pub fn wire(&self) -> WireError {
        match self {
            Error::Auth(a) => WireError::from_auth(a),
            Error::Rail(r) => rail_wire(r),
            Error::BadRequest(m) => WireError::new("invalid_input", m.clone(), false),
            Error::Config(m) => WireError::new("rail_error", m.clone(), false),
        }
    }
}

/// The wire form of a rail error. A hold the ledger refuses for what was asked of it
/// ([`HoldRefusal`]: no timeout, longer than allowed, …) is the caller's request refused:
/// answered under the refusal's own code (`hold_too_long`, …; 400), not as `rail_error`
/// (500, kept for the rail's own failures).
#[must_use]
pub(crate) fn rail_wire(e: &RailError) -> WireError {
    let mut w = WireError::from_rail(e);
    if let RailError::Rail { reason, .. } = e
        && is_hold_refusal(&reason.code)
    {
        w.code.clone_from(&reason.code);
    }
    w
}

/// Whether `code` is a [`HoldRefusal::code`].
fn is_hold_refusal(code: &str) -> bool {
    [
        HoldRefusal::NoTimeout(""),
        HoldRefusal::TooLong {
            asked_ms: 0,
            max_ms: 0,
        },
        HoldRefusal::TooShort {
            hold_ms: 0,
            asked_ms: 0,
        },
        HoldRefusal::TooLittleLeft {
            left_ms: 0,
            required_ms: 0,
        },
    ]
    .iter()
    .any(|h| h.code() == code)
}

impl From<rail_ledger::LedgerError> for Error {
    fn from(e: rail_ledger::LedgerError) -> Self {
        Error::Rail(e.into())
    }
}

/// The facilitator's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
