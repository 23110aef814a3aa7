//! The scheme trait: what one x402 scheme (`exact` on EVM with EIP-3009, the native-ALGO
//! exact-algo of `docs/exact-algo.md`, …) brings to the shared transport.
//!
//! The transport owns everything both schemes do alike: routes and tool prices, the 402 body and
//! its `PAYMENT-REQUIRED` header, reading `PAYMENT-SIGNATURE` / `X-PAYMENT` /
//! `_meta["x402/payment"]`, the served-once record, settle-before and settle-after, receipts,
//! and how a refusal or an unknown outcome is answered. A [`Scheme`] does what only it knows:
//!
//! 1. [`Scheme::requirements`]: its `accepts[]` entry for a price (it may issue single-use
//!    state, such as exact-algo's paymentId);
//! 2. [`Scheme::check`]: strict decoding and every verdict that needs no effect (signature
//!    first), giving the payment's single-use [`Verified::key`];
//! 3. [`Scheme::verify`] (settle-after only): the online checks that move nothing;
//! 4. [`Scheme::settle`]: move the money, idempotently for the same payment, and answer a
//!    receipt ([`Settled`]).
//!
//! Every method is object safe: a route holds `Arc<dyn Scheme>`s, so one route can offer several
//! schemes and a client picks among them.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use rail_core::Timestamp;
use serde_json::Value;

/// What a scheme is, as the transport and clients see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchemeInfo {
    /// The scheme's name on the wire (`exact`).
    pub scheme: String,
    /// The network it settles on, in its canonical spelling (CAIP-2: `eip155:84532`,
    /// `algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDe`).
    pub network: String,
    /// A label unique among schemes (`exact-evm`, `exact-algo`): several schemes may share
    /// `scheme` and `network` (the official `exact` on Algorand and exact-algo do).
    pub label: String,
    /// The x402 v1 network name, when the scheme also speaks v1 (`X-PAYMENT`).
    pub v1_network: Option<String>,
}

/// One price of one resource in one scheme.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Price {
    /// The resource as a scheme binds a payment to it: the request path (`/api/posts/1`) or the
    /// MCP tool's name.
    pub resource: String,
    /// The resource's URL (`http://host/api/posts/1`, `mcp://tool/post_read`).
    pub url: String,
    /// What it is, for humans and agents.
    pub description: String,
    /// The amount, in atomic units of the scheme's asset (µALGO, USDC's 10⁻⁶).
    pub amount: u128,
}

/// A payment as the payer presented it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Presented {
    /// `PAYMENT-SIGNATURE` (v2), or `_meta["x402/payment"]` as a string: base64 of the
    /// envelope's JSON.
    Header(String),
    /// `X-PAYMENT` (v1): base64 of the v1 envelope's JSON.
    V1Header(String),
    /// `_meta["x402/payment"]` as a JSON object.
    Object(Value),
}

impl Presented {
    /// The envelope as JSON, leniently (for choosing a scheme only; each scheme decodes what
    /// it accepts strictly): `None` if it is not base64 of JSON.
    #[must_use]
    pub fn peek(&self) -> Option<Value> {
        match self {
            Presented::Header(h) | Presented::V1Header(h) => {
                crate::wire::decode_base64_json::<Value>(h).ok()
            }
            Presented::Object(v) => Some(v.clone()),
        }
    }

    /// Whether this is a v1 payment.
    #[must_use]
    pub const fn is_v1(&self) -> bool {
        matches!(self, Presented::V1Header(_))
    }
}

/// A payment that passed a scheme's [`Scheme::check`].
#[derive(Clone)]
pub struct Verified {
    /// The payment's single-use identity (EVM: network, token, payer and nonce; exact-algo:
    /// network and paymentId). The transport serves each key at most once.
    pub key: String,
    /// The payer, when known before settlement.
    pub payer: Option<String>,
    /// The scheme's own decoded payment, for its [`Scheme::verify`] and [`Scheme::settle`].
    pub payment: Arc<dyn Any + Send + Sync>,
}

impl fmt::Debug for Verified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verified")
            .field("key", &self.key)
            .field("payer", &self.payer)
            .finish_non_exhaustive()
    }
}

impl Verified {
    /// The scheme's decoded payment as `T`.
    ///
    /// # Errors
    /// [`Failure::Unknown`] if it is not a `T` (a `Verified` handed to another scheme: a bug
    /// in the caller, answered as an internal error, never as a payment).
    pub fn payment<T: Any + Send + Sync>(&self) -> Result<&T, Failure> {
        self.payment.downcast_ref::<T>().ok_or_else(|| {
            Failure::internal("a payment was handed to a scheme that did not check it")
        })
    }
}

/// A settled payment.
#[derive(Clone, Debug, PartialEq)]
pub struct Settled {
    /// The transaction that moved the money.
    pub transaction: String,
    /// The `PAYMENT-RESPONSE` JSON (and `_meta["x402/payment-response"]` over MCP).
    pub response: Value,
    /// What an MCP tool result carries as `structuredContent.receipt`, if the scheme has one
    /// (exact-algo's, `docs/exact-algo.md` §5).
    pub receipt: Option<Value>,
}

/// Why a payment is refused for certain: nothing was charged, and the payer may pay anew.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal {
    /// The code on the wire (the 402 body's `error`).
    pub error: String,
    /// A finer code, sent in its own field (`reason`), when the scheme has one beyond `error`.
    pub reason: Option<String>,
    /// What happened, for logs and the MCP `detail`.
    pub detail: String,
    /// A failed settlement's `PAYMENT-RESPONSE` JSON, when there is one.
    pub response: Option<Value>,
}

impl Refusal {
    /// A refusal with `error` as its code and `detail` as its text.
    #[must_use]
    pub fn new(error: impl Into<String>, detail: impl Into<String>) -> Self {
        Refusal {
            error: error.into(),
            reason: None,
            detail: detail.into(),
            response: None,
        }
    }

    /// With a finer code.
    #[must_use]
    pub fn with_reason(mut self, reason: Option<String>) -> Self {
        self.reason = reason;
        self
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Some(r) => write!(f, "{} ({r}): {}", self.error, self.detail),
            None => write!(f, "{}: {}", self.error, self.detail),
        }
    }
}

/// Why a payment did not settle.
#[derive(Clone, Debug, PartialEq)]
pub enum Failure {
    /// Refused for certain (nothing moved).
    Refused(Refusal),
    /// No usable answer: the outcome is unknown. Nothing is served; the payer must present the
    /// **same** payment again (it settles at most once), never a new one.
    Unknown {
        /// The code on the wire (the 503 body's `error`).
        error: String,
        /// A finer code, if any.
        reason: Option<String>,
        /// What happened.
        detail: String,
    },
}

impl Failure {
    /// An internal error (a bug, or a value that does not serialize), never the payment's
    /// fault: `error` is `internal error`, without a finer reason.
    #[must_use]
    pub fn internal(detail: impl Into<String>) -> Self {
        Failure::Unknown {
            error: "internal error".into(),
            reason: None,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Refused(r) => write!(f, "refused: {r}"),
            Failure::Unknown { error, detail, .. } => {
                write!(f, "outcome unknown: {error}: {detail}")
            }
        }
    }
}

impl From<Refusal> for Failure {
    fn from(r: Refusal) -> Self {
        Failure::Refused(r)
    }
}

/// Why the transport cannot go on with a payment now (the outcome is unknown: 503, send the
/// same payment again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// Another request holds the payment's served-once record right now.
    InFlight,
    /// The served-once store failed.
    Store,
}

/// The online verdict of a settle-after verification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Valid now: the paid work may run, and settles after it.
    Valid,
    /// Already used on chain, perhaps by an earlier request of this payer whose answer was
    /// lost: settle (which recognises its own settlement) before any paid work runs.
    MaybeSettled,
}

/// One x402 scheme on one network, for one payee (see the module docs).
#[async_trait]
pub trait Scheme: Send + Sync + fmt::Debug {
    /// What the scheme is.
    fn info(&self) -> &SchemeInfo;

    /// Whether `network`, as a payer spelled it, names this scheme's chain (default: equal to
    /// [`SchemeInfo::network`]; Algorand accepts both spellings of a genesis hash).
    fn is_network(&self, network: &str) -> bool {
        network == self.info().network
    }

    /// Whether `amount` (atomic units) is a price this scheme can ask for. Checked when a
    /// route or tool is priced, so a bad price fails at start-up, not at the first request.
    ///
    /// # Errors
    /// Why not, as a sentence.
    fn check_amount(&self, amount: u128) -> Result<(), String> {
        if amount == 0 {
            return Err("a price of zero is not a payment".into());
        }
        Ok(())
    }

    /// Whether a payment envelope (decoded JSON) is this scheme's, by its shape, scheme and
    /// network. Used only to choose among the schemes of one route.
    fn claims(&self, envelope: &Value) -> bool;

    /// The `accepts[]` entry for `price`. It may issue single-use state.
    ///
    /// # Errors
    /// [`Failure::Unknown`] if it cannot be issued now (a store is down): answered 503.
    async fn requirements(&self, price: &Price) -> Result<crate::wire::Entry, Failure>;

    /// The v1 `accepts[]` entry for `entry` (this scheme's v2 entry) when it speaks v1.
    fn v1_requirements(
        &self,
        _entry: &serde_json::value::RawValue,
        _price: &Price,
    ) -> Option<crate::wire::Entry> {
        None
    }

    /// Strict decoding and every verdict that needs no effect, the signature first, against
    /// `price` at `now`. Verdicts that only time may change (an expired authorization) are left
    /// to [`Scheme::settle`], which recognises a payment settled before it expired.
    ///
    /// # Errors
    /// A [`Refusal`] (answered with a fresh 402), or [`Failure::Unknown`] (503).
    async fn check(
        &self,
        presented: &Presented,
        price: &Price,
        now: Timestamp,
    ) -> Result<Verified, Failure>;

    /// Settle-after only: the online checks that move nothing (balance, nonce, simulation),
    /// before the paid work runs. Default: nothing more to check.
    ///
    /// # Errors
    /// A [`Failure`].
    async fn verify(&self, _payment: &Verified, _price: &Price) -> Result<Verdict, Failure> {
        Ok(Verdict::Valid)
    }

    /// Moves the money for a checked payment, idempotently: the same payment settled again
    /// answers its first settlement, never a second transfer.
    ///
    /// # Errors
    /// A [`Failure`].
    async fn settle(&self, payment: &Verified, price: &Price) -> Result<Settled, Failure>;

    /// How a payment that was already served is refused (EVM:
    /// `invalid_exact_evm_nonce_already_used`; exact-algo: `paymentId already used`).
    fn replayed(&self) -> Refusal;

    /// How an unreadable payment header (sent twice, or not visible ASCII) is refused: x402's
    /// `invalid_payload` by default.
    fn malformed(&self, detail: &str) -> Refusal {
        Refusal::new("invalid_payload", detail)
    }

    /// How an unknown outcome the transport meets (`why`: a payment in flight elsewhere, the
    /// served-once store down) is answered: a 503 whose `error` is x402's
    /// `facilitator_unavailable` by default.
    fn unavailable(&self, _why: Busy, detail: &str) -> Failure {
        Failure::Unknown {
            error: "facilitator_unavailable".into(),
            reason: None,
            detail: detail.to_owned(),
        }
    }

    /// The v1 `X-PAYMENT-RESPONSE` JSON for a v2 `PAYMENT-RESPONSE` JSON (v1 schemes only).
    fn v1_response(&self, response: &Value) -> Value {
        response.clone()
    }

    /// Extra members of a payment-required MCP `structuredContent` (exact-algo's
    /// `how_to_pay`), if any.
    fn mcp_hints(&self) -> Option<(String, Value)> {
        None
    }

    /// The `error` of a 402 for a request that carried no payment (x402's reference says `Payment
    /// required`; exact-algo `payment required`, `docs/exact-algo.md` §2.1). A route offering
    /// several schemes uses its first scheme's.
    fn required_error(&self) -> &str {
        crate::wire::PAYMENT_REQUIRED_ERROR
    }

    /// Whether the 402 body carries the v2 `resource` object. x402 v2 requires it; the exact-algo
    /// body has none (`docs/exact-algo.md` §2.1; a route mixing both has it).
    fn wants_resource(&self) -> bool {
        true
    }
}

/// One way a resource can be paid: a scheme and the amount it asks.
#[derive(Clone, Debug)]
pub struct Accept {
    /// The scheme.
    pub scheme: Arc<dyn Scheme>,
    /// Atomic units of the scheme's asset.
    pub amount: u128,
}

/// The ways one resource can be paid, in the receiver's order of preference.
#[derive(Clone, Debug, Default)]
pub struct Accepts(pub(crate) Vec<Accept>);

impl Accepts {
    /// Paid in `scheme` at `amount` atomic units only.
    ///
    /// # Errors
    /// [`crate::Error::Price`] if the scheme cannot ask for `amount`.
    pub fn one(scheme: Arc<dyn Scheme>, amount: u128) -> Result<Self, crate::Error> {
        Accepts::default().or(scheme, amount)
    }

    /// Also payable in `scheme` at `amount` atomic units.
    ///
    /// # Errors
    /// [`crate::Error::Price`] if the scheme cannot ask for `amount`.
    pub fn or(mut self, scheme: Arc<dyn Scheme>, amount: u128) -> Result<Self, crate::Error> {
        scheme
            .check_amount(amount)
            .map_err(|why| crate::Error::Price {
                scheme: scheme.info().label.clone(),
                amount,
                why,
            })?;
        self.0.push(Accept { scheme, amount });
        Ok(self)
    }

    /// Also payable in `scheme` at `amount`, an amount the caller already knows the scheme
    /// can ask for (checked where it was configured).
    #[must_use]
    pub fn or_priced(mut self, scheme: Arc<dyn Scheme>, amount: u128) -> Self {
        self.0.push(Accept { scheme, amount });
        self
    }

    /// The ways to pay, in order.
    #[must_use]
    pub fn as_slice(&self) -> &[Accept] {
        &self.0
    }

    /// Whether there is none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
