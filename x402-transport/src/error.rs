//! The crate's error: what can go wrong while a receiver is configured.

/// A configuration error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A scheme cannot ask for this amount.
    #[error("{scheme} cannot ask for {amount}: {why}")]
    Price {
        /// The scheme's label.
        scheme: String,
        /// The amount, in atomic units.
        amount: u128,
        /// Why not.
        why: String,
    },
    /// A route or tool was priced with no way to pay.
    #[error("{0} is priced with no scheme to pay it")]
    NoScheme(String),
}
