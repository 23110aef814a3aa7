//! The facilitator's error type.

use rail_account::AuthError;
use rail_account::api::WireError;
use rail_core::RailError;

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
            Error::Rail(r) => WireError::from_rail(r),
            Error::BadRequest(m) => WireError::new("invalid_input", m.clone(), false),
            Error::Config(m) => WireError::new("rail_error", m.clone(), false),
        }
    }
}

impl From<rail_ledger::LedgerError> for Error {
    fn from(e: rail_ledger::LedgerError) -> Self {
        Error::Rail(e.into())
    }
}

/// The facilitator's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;
