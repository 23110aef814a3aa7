//! The facade's one error type.

use rail_core::RailError;

/// Why a [`crate::Registry`] could not be built or could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The configuration file could not be read.
    #[error("cannot read the configuration {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration is not valid TOML or a field is wrong; the message names the field.
    #[error("configuration: {0}")]
    Config(String),
    /// A rail of a kind this build does not carry.
    #[error(
        "rail `{name}` is of kind `{kind}`, which this build does not include: enable the cargo feature `{feature}` of stipendex"
    )]
    NotCompiled {
        /// The rail's name in the configuration.
        name: String,
        /// Its kind.
        kind: String,
        /// The cargo feature that carries it.
        feature: &'static str,
    },
    /// A kind no build knows.
    #[error(
        "rail `{name}` has an unknown kind `{kind}`: use one of ledger, x402, exact-algo, stripe, ln-nwc"
    )]
    UnknownKind {
        /// The rail's name.
        name: String,
        /// The kind given.
        kind: String,
    },
    /// A secret's environment variable is not set.
    #[error("rail `{name}` needs the environment variable {var}, which is not set")]
    MissingEnv {
        /// The rail's name (or `store`).
        name: String,
        /// The variable.
        var: String,
    },
    /// A secret's environment variable is set but its value is unusable (the value is never
    /// repeated in the message).
    #[error("rail `{name}`: {var} {why}")]
    BadSecret {
        /// The rail's name.
        name: String,
        /// The variable.
        var: String,
        /// What is wrong with it (`is not a 32-byte hex key`).
        why: String,
    },
    /// The rail's parts could not be created (a database, a node, a wallet that does not answer).
    #[error("rail `{name}` could not start: {source}")]
    Rail {
        /// The rail's name (or `store`).
        name: String,
        /// The rail's error.
        source: RailError,
    },
    /// No rail of that name is configured.
    #[error("no rail named `{0}` is configured")]
    NoSuchRail(String),
    /// The rail is configured, but not that side of it.
    #[error("rail `{name}` has no {side} side configured")]
    NoSide {
        /// The rail's name.
        name: String,
        /// `payer` or `receiver`.
        side: &'static str,
    },
}
