//! The facade's one error type: the registry's, the envelope's, the wallet's and the
//! receiver's, each variant with a stable [`Error::code`].

use rail_core::RailError;

/// Why a [`crate::Registry`] could not be built, a signed object was refused, or a wallet or a
/// receiver said no.
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
    /// The gateway cannot start (its upstream's client, an MCP upstream's session, an x402
    /// price): the whole sentence.
    #[error("{0}")]
    Gateway(String),
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
    /// A kind no build knows; the message lists the kinds this build carries
    /// ([`crate::registry::compiled_kinds`]).
    #[error(
        "rail `{name}` has an unknown kind `{kind}`: use one of {}",
        kinds_here()
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
    /// A signed object (or its JWS) does not parse, or breaks one of its own rules.
    #[error("malformed: {0}")]
    Malformed(String),
    /// A signature does not verify.
    #[error("bad signature: {0}")]
    BadSignature(String),
    /// An object of another type was given where one type was expected.
    #[error("expected a {expected}, got a {found}")]
    WrongType {
        /// The type expected.
        expected: String,
        /// The type found.
        found: String,
    },
    /// An object of a major version this build does not know (a wallet must refuse it).
    #[error("unsupported version {tag}: this build reads major version 0 only")]
    UnsupportedVersion {
        /// The object's tag (`quote/1.0`).
        tag: String,
    },
    /// A valid signature by a key that is not the one expected (not pinned, not the mandate's
    /// wallet, not the trusted principal).
    #[error("untrusted: {0}")]
    Untrusted(String),
    /// Two objects that should bind each other do not (a digest, an id, an amount).
    #[error("mismatch: {0}")]
    Mismatch(String),
    /// An object past the end of its validity window (times in RFC 3339, UTC).
    #[error("{what} {id} is not valid now: {why}")]
    Expired {
        /// `quote`, `mandate`, …
        what: &'static str,
        /// Its id.
        id: String,
        /// Why, its times in RFC 3339 (`it expired at 2026-12-06T13:33:18Z, and it is
        /// 2026-12-06T13:35:00Z: ask the principal for a new mandate`).
        why: String,
    },
    /// An object whose validity window has not begun (a mandate whose `nbf` is still ahead of
    /// this machine's clock). Like [`Error::Expired`], nothing was paid; unlike it, the same
    /// object is good later.
    #[error("{what} {id} is not valid yet: {why}")]
    NotYetValid {
        /// `mandate`, …
        what: &'static str,
        /// Its id.
        id: String,
        /// Why, its times in RFC 3339 (`it is valid from 2026-12-06T13:33:18Z, and it is
        /// 2026-12-06T13:30:00Z on this machine: …`).
        why: String,
    },
    /// I4: the receiver is not in the mandate's allowlist. The human was told; this is never
    /// a soft pass.
    #[error("denied: {0}")]
    Denied(String),
    /// The mandate was revoked.
    #[error("mandate {0} was revoked")]
    Revoked(String),
    /// A mandate limit refuses the payment; nothing was paid.
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    /// The payment needs a human's confirmation and did not get it.
    #[error("not confirmed: {0}")]
    NotConfirmed(String),
    /// No rail is accepted by the Quote, allowed by the mandate and held by the wallet.
    #[error("no rail can pay: {0}")]
    NoRail(String),
    /// A Quote was already paid (wallet), or already used (receiver).
    #[error("quote {0} was already used")]
    QuoteUsed(String),
    /// Too many Quotes with costly offers for this client now: retry later.
    #[error("rate limited: {why}")]
    RateLimited {
        /// Why.
        why: String,
        /// When to retry, in seconds.
        retry_after: u64,
    },
    /// No payment of that chain is pending in the wallet's journal.
    #[error("no pending payment {0}: `stipendex wallet pending` lists them")]
    NotPending(String),
    /// I3: a capture above the Quote or above what was confirmed.
    #[error("capture refused: {0}")]
    CaptureAbove(String),
    /// The receiver refused the request without charging (`resolve_price` rejected it).
    #[error("rejected: {0}")]
    Rejected(String),
    /// A link of an audit chain is broken ([`crate::chain::verify_chain`]).
    #[error("broken chain at the {link}: {why}")]
    Broken {
        /// The first broken link (`mandate`, `confirmation`, `quote`, `proof`, `receipt`).
        link: &'static str,
        /// Why.
        why: String,
    },
    /// The rail refused or failed.
    #[error("rail: {0}")]
    Payment(RailError),
    /// The store of spend records, revocations or used quotes failed.
    #[error("storage: {0}")]
    Storage(String),
    /// The tab is not open here: unknown, closed, or past its end.
    #[error("tab {tab} is not open: {why}")]
    TabClosed {
        /// The tab's id.
        tab: String,
        /// Why.
        why: String,
    },
    /// A voucher the receiver refuses; `code` says which rule it broke (`voucher_replayed`,
    /// `voucher_out_of_order`, `equivocation`, `above_cap`, `wrong_price`, `not_covered`).
    #[error("voucher refused ({code}): {why}")]
    Voucher {
        /// The rule broken.
        code: &'static str,
        /// Why.
        why: String,
    },
    /// The wallet's spend records (its store) and its audit journal do not belong together:
    /// one has seen the mandate pay and the other has not. Paying on would count its limits
    /// from zero, or leave payments without their chains; nothing is paid.
    #[error("records apart: {0}")]
    RecordsApart(String),
    /// The work behind the receiver cannot be done now (its upstream is unreachable): no
    /// payment was taken; send the same one again later.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// An HTTP request got no answer (the network): one sentence saying where it went and why
    /// (`could not connect to 127.0.0.1:8080 (connection refused)`), and, when a payment was
    /// made before it, that the payment is kept for the same request asked again. Retryable,
    /// with the code of the rail's own `unavailable`.
    #[error("{0}")]
    Network(String),
    /// The rail is configured, but not that side of it.
    #[error("rail `{name}` has no {side} side configured")]
    NoSide {
        /// The rail's name.
        name: String,
        /// `payer` or `receiver`.
        side: &'static str,
    },
}

impl Error {
    /// A stable machine code (`denied`, `limit_exceeded`, `bad_signature`, …).
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io",
            Error::Config(_) => "config",
            Error::Gateway(_) => "gateway",
            Error::NotCompiled { .. } => "not_compiled",
            Error::UnknownKind { .. } => "unknown_kind",
            Error::MissingEnv { .. } => "missing_env",
            Error::BadSecret { .. } => "bad_secret",
            Error::Rail { .. } => "rail_start",
            Error::NoSuchRail(_) => "no_such_rail",
            Error::NoSide { .. } => "no_side",
            Error::Malformed(_) => "malformed",
            Error::BadSignature(_) => "bad_signature",
            Error::WrongType { .. } => "wrong_type",
            Error::UnsupportedVersion { .. } => "unsupported_version",
            Error::Untrusted(_) => "untrusted",
            Error::Mismatch(_) => "mismatch",
            Error::Expired { .. } => "expired",
            Error::NotYetValid { .. } => "not_yet_valid",
            Error::Denied(_) => "denied",
            Error::Revoked(_) => "revoked",
            Error::LimitExceeded(_) => "limit_exceeded",
            Error::NotConfirmed(_) => "not_confirmed",
            Error::NoRail(_) => "no_rail",
            Error::QuoteUsed(_) => "quote_used",
            Error::NotPending(_) => "not_pending",
            Error::RateLimited { .. } => "rate_limited",
            Error::CaptureAbove(_) => "capture_above",
            Error::Rejected(_) => "rejected",
            Error::Broken { .. } => "broken_chain",
            Error::Payment(e) => e.code(),
            Error::Storage(_) => "storage",
            Error::TabClosed { .. } => "tab_closed",
            Error::Voucher { code, .. } => code,
            Error::Unavailable(_) => "upstream_unavailable",
            Error::Network(_) => "unavailable",
            Error::RecordsApart(_) => "records_apart",
        }
    }
}

/// The kinds this build carries, for a message: `ledger, x402` (or a sentence if none).
fn kinds_here() -> String {
    let kinds = crate::registry::compiled_kinds();
    if kinds.is_empty() {
        "none (this build carries no rail: enable a rail's cargo feature of stipendex)".into()
    } else {
        kinds.join(", ")
    }
}
