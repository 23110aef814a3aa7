//! The ledger as a payment rail (`ledger`; the hosted `account` rail runs on it): pay = transfer, hold = pending
//! transfer, capture = post, void, refund = reversal, verify = look the transfer up and bind it
//! to the offer (amount, payee, offer id) — once.
//!
//! Offer ids are bound into each transfer's `user_data` (the first 16 bytes of
//! `SHA-256("stipendex-ledger/offer" || offer id)`); transfer ids are derived from the caller's
//! operation id, so a retried operation is the same transfer and never a second one.

use std::time::Duration;

use async_trait::async_trait;
use rail_core::{
    Amount, Asset, Binding, Capabilities, Captured, Charge, Finality, HoldPayer, HoldReceiver,
    Money, Offer, OpId, Payer, Payment, PaymentMode, PaymentState, Rail, RailError, RailId,
    RailReason, RailResult, Receiver, RefundReceiver, Refunded, ReplayGuard, Verified, Voided,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::ledger::Ledger;
use crate::types::{
    AccountId, Created, Transfer, TransferError, TransferId, TransferKind, TransferRequest,
    TransferStatus,
};

/// The rail's name.
pub const RAIL: &str = "ledger";

/// The ledger rail's proof of payment: the transfer id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerProof {
    /// The transfer (single or pending) that pays the offer.
    pub transfer_id: TransferId,
}

/// The ledger rail's offer details.
///
/// Hold offers say how long the payer must hold the funds, in milliseconds (`hold_ms`).
/// Offers written before milliseconds carried whole seconds (`hold_secs`): still read, never
/// written. An offer carrying both must have them agree.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerOfferDetails {
    /// How long a hold must last, in milliseconds (hold offers only; never 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_ms: Option<u64>,
    /// The same in whole seconds, as older offers said it (read only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_secs: Option<u64>,
}

/// How long a hold lasts when a hold offer names no duration.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(3600);

/// The longest hold a [`LedgerPayer`] agrees to by default.
pub const DEFAULT_MAX_HOLD: Duration = Duration::from_secs(6 * 3600);

impl LedgerOfferDetails {
    /// The hold duration the offer asks for, in milliseconds: `hold_ms`, else `hold_secs` ×
    /// 1000, else [`DEFAULT_HOLD`]. Not checked against any limit here (0 included).
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] when `hold_secs` does not fit in milliseconds, or the two
    /// fields disagree.
    pub fn hold_duration_ms(&self) -> RailResult<u64> {
        let from_secs = self
            .hold_secs
            .map(|s| {
                s.checked_mul(1000).ok_or_else(|| {
                    RailError::InvalidInput(format!(
                        "offer details: hold_secs {s} does not fit in milliseconds"
                    ))
                })
            })
            .transpose()?;
        match (self.hold_ms, from_secs) {
            (Some(ms), Some(s)) if ms != s => Err(RailError::InvalidInput(format!(
                "offer details: hold_ms {ms} and hold_secs {} disagree",
                self.hold_secs.unwrap_or_default()
            ))),
            (Some(ms), _) | (None, Some(ms)) => Ok(ms),
            (None, None) => Ok(millis(DEFAULT_HOLD)),
        }
    }
}

/// A duration in whole milliseconds (rounded down), saturating at `u64::MAX` (584 million
/// years: only ever a limit, never an amount of time anything lasts).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Why the ledger rail refused a hold: on the payer's side the duration an offer asks for, on
/// the receiver's side the hold presented. Reaches callers as [`RailError::Rail`] with
/// [`HoldRefusal::code`] as the reason's code (not retryable).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HoldRefusal {
    /// A hold without a timeout: 0 ms means "never expires" on the ledger, which would lock
    /// the payer's funds until the receiver acts.
    #[error("{0} is 0 ms: a hold must have a timeout (0 means it never expires)")]
    NoTimeout(&'static str),
    /// The offer asks for a longer hold than this payer agrees to.
    #[error("the offer asks for a {asked_ms} ms hold, above this payer's maximum of {max_ms} ms")]
    TooLong {
        /// What the offer asks.
        asked_ms: u64,
        /// The payer's cap ([`LedgerPayer::with_max_hold`]).
        max_ms: u64,
    },
    /// The hold is shorter than the offer asked.
    #[error("the hold lasts {hold_ms} ms, the offer asks for {asked_ms} ms")]
    TooShort {
        /// The hold's timeout.
        hold_ms: u64,
        /// What the offer asked.
        asked_ms: u64,
    },
    /// Too little of the hold is left for the receiver to capture it.
    #[error("the hold has {left_ms} ms left, {required_ms} ms required")]
    TooLittleLeft {
        /// Time left before the hold lapses, by the ledger's time.
        left_ms: i64,
        /// What the receiver requires ([`LedgerReceiver::with_min_hold_left`]).
        required_ms: u64,
    },
}

impl HoldRefusal {
    /// The stable machine code.
    #[must_use]
    pub fn code(&self) -> &'static str {
        match self {
            HoldRefusal::NoTimeout(_) => "hold_without_timeout",
            HoldRefusal::TooLong { .. } => "hold_too_long",
            HoldRefusal::TooShort { .. } => "hold_too_short",
            HoldRefusal::TooLittleLeft { .. } => "hold_time_left_too_short",
        }
    }
}

impl From<HoldRefusal> for RailError {
    fn from(h: HoldRefusal) -> Self {
        RailError::Rail {
            reason: RailReason::new(h.code(), h.to_string()),
            retryable: false,
        }
    }
}

/// `user_data` binding a transfer to an offer id.
#[must_use]
pub fn offer_binding(offer_id: &str) -> u128 {
    let h = Sha256::new()
        .chain_update(b"stipendex-ledger/offer")
        .chain_update(offer_id.as_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(h.get(..16).unwrap_or(&[0; 16]));
    u128::from_be_bytes(b)
}

/// The transfer id of operation `op` by `account` doing `what`.
#[must_use]
pub fn op_transfer_id(account: AccountId, what: &str, op: &OpId) -> TransferId {
    let h = Sha256::new()
        .chain_update(b"stipendex-ledger/op")
        .chain_update(account.to_bytes())
        .chain_update(what.as_bytes())
        .chain_update([0u8])
        .chain_update(op.as_str().as_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(h.get(..16).unwrap_or(&[0; 16]));
    TransferId((u128::from_be_bytes(b) | 1) & !crate::types::RESERVED_BIT)
}

fn capabilities(asset: &Asset) -> Capabilities {
    Capabilities {
        pay: true,
        pay_effect: rail_core::PayEffect::Moves,
        hold: true,
        partial_capture: true,
        refund: true,
        partial_refund: true,
        finality: Finality::Immediate,
        assets: vec![asset.clone()],
    }
}

fn minor(money: &Money) -> RailResult<u64> {
    let v = money.minor_i64()?;
    u64::try_from(v).map_err(|_| RailError::InvalidInput("negative amount".into()))
}

fn money(asset: &Asset, units: u64) -> RailResult<Money> {
    Ok(Money::from_minor(asset.clone(), u128::from(units))?)
}

fn amount_of(asset: &Asset, units: u64) -> Amount {
    money(asset, units).map_or(Amount::ZERO, |m| m.amount())
}

/// Applies one transfer for operation `op` (which asked for `requested`) and maps a refusal
/// to the rail error the caller sees: a reused operation id is an idempotency conflict
/// naming `op`, a capture or refund above what is left says both amounts.
async fn apply(
    ledger: &Ledger,
    op: &OpId,
    req: TransferRequest,
    asset: &Asset,
    requested: Amount,
) -> RailResult<Created> {
    let exceeds = |what: &'static str, available: u64| RailError::ExceedsAvailable {
        op: what,
        requested,
        available: amount_of(asset, available),
    };
    ledger.transfer(req).await.map_err(|e| match e {
        crate::LedgerError::Refused(TransferError::ExistsWithDifferentFields) => {
            RailError::IdempotencyConflict {
                op_id: op.to_string(),
            }
        }
        crate::LedgerError::Refused(TransferError::ExceedsPendingAmount { pending }) => {
            exceeds("capture", pending)
        }
        crate::LedgerError::Refused(TransferError::ExceedsReversible { available }) => {
            exceeds("refund", available)
        }
        other => other.into(),
    })
}

/// Checks a hold presented for an offer that asked for `asked_ms`: it has a timeout, lasts at
/// least what was asked, has not lapsed by `now` (the clock the ledger expires holds by) and
/// has `min_left` still to run (by default half of `asked_ms`), so that it can still be
/// captured. Shared by [`LedgerReceiver`] and services that verify ledger holds for others.
///
/// # Errors
/// A [`HoldRefusal`] (as [`RailError::Rail`]), or [`RailError::InvalidState`] (`expired`).
pub fn check_hold_terms(
    t: &Transfer,
    asked_ms: u64,
    now: rail_core::Timestamp,
    min_left: Option<Duration>,
) -> RailResult<()> {
    if t.timeout_ms == 0 {
        return Err(HoldRefusal::NoTimeout("the hold's timeout").into());
    }
    if t.timeout_ms < asked_ms {
        return Err(HoldRefusal::TooShort {
            hold_ms: t.timeout_ms,
            asked_ms,
        }
        .into());
    }
    let left_ms = t
        .expires_at()
        .map_or(i64::MAX, |e| e.0.saturating_sub(now.0));
    if left_ms <= 0 {
        return Err(RailError::InvalidState {
            op: "verify",
            state: "expired".into(),
        });
    }
    let required_ms = min_left.map_or(asked_ms / 2, millis);
    if u64::try_from(left_ms).is_ok_and(|left| left < required_ms) {
        return Err(HoldRefusal::TooLittleLeft {
            left_ms,
            required_ms,
        }
        .into());
    }
    Ok(())
}

fn parse_account(s: &str, what: &str) -> RailResult<AccountId> {
    s.parse()
        .map_err(|e| RailError::InvalidInput(format!("{what}: {e}")))
}

/// The payer side: spends from one account.
///
/// A hold lasts what the offer asks (`hold_ms`), within limits the payer keeps: never without
/// a timeout (the ledger reads 0 as "never expires"), never longer than
/// [`LedgerPayer::with_max_hold`] (default [`DEFAULT_MAX_HOLD`]). Offers outside them are
/// refused with a [`HoldRefusal`] before anything is written.
#[derive(Clone, Debug)]
pub struct LedgerPayer {
    ledger: Ledger,
    account: AccountId,
    asset: Asset,
    max_hold: Duration,
}

impl LedgerPayer {
    /// A payer spending from `account`, which holds `asset`.
    #[must_use]
    pub fn new(ledger: Ledger, account: AccountId, asset: Asset) -> Self {
        LedgerPayer {
            ledger,
            account,
            asset,
            max_hold: DEFAULT_MAX_HOLD,
        }
    }

    /// The longest hold this payer agrees to (default [`DEFAULT_MAX_HOLD`], 6 h): offers
    /// asking for more are refused ([`HoldRefusal::TooLong`]).
    #[must_use]
    pub fn with_max_hold(mut self, max: Duration) -> Self {
        self.max_hold = max;
        self
    }

    fn request(&self, op: &OpId, offer: &Offer, mode: PaymentMode) -> RailResult<TransferRequest> {
        if offer.rail.as_str() != RAIL {
            return Err(RailError::mismatch(Binding::Rail, RAIL, &offer.rail));
        }
        if offer.mode != mode {
            return Err(RailError::mismatch(Binding::Mode, mode, offer.mode));
        }
        if offer.amount.asset() != &self.asset {
            return Err(RailError::mismatch(
                Binding::Asset,
                &self.asset,
                offer.amount.asset(),
            ));
        }
        let credit = parse_account(&offer.payee, "offer payee")?;
        let amount = minor(&offer.amount)?;
        let user_data = offer_binding(&offer.id);
        Ok(match mode {
            PaymentMode::Capture => TransferRequest::Single {
                id: op_transfer_id(self.account, "pay", op),
                debit: self.account,
                credit,
                amount,
                user_data,
            },
            PaymentMode::Hold => {
                let details: LedgerOfferDetails = offer.details_as()?;
                let asked_ms = details.hold_duration_ms()?;
                if asked_ms == 0 {
                    return Err(HoldRefusal::NoTimeout("the offer's hold duration").into());
                }
                let max_ms = millis(self.max_hold);
                if asked_ms > max_ms {
                    return Err(HoldRefusal::TooLong { asked_ms, max_ms }.into());
                }
                TransferRequest::Pending {
                    id: op_transfer_id(self.account, "hold", op),
                    debit: self.account,
                    credit,
                    amount,
                    user_data,
                    timeout_ms: asked_ms,
                }
            }
        })
    }

    async fn send(&self, op: &OpId, offer: &Offer, mode: PaymentMode) -> RailResult<Payment> {
        let req = self.request(op, offer, mode)?;
        let id = if let Err(expired) = offer.check_live(self.ledger.clock().now()) {
            // A payment made under `op` while the offer was live is answered, not refused:
            // the retry of an attempt whose answer was lost (a crash, a timeout) can come
            // after the offer's end, and its money moved. Nothing new is paid.
            match self.ledger.lookup_transfer(req.id()).await? {
                Some((t, _)) if req.made(&t) => t.id,
                _ => return Err(expired),
            }
        } else {
            apply(&self.ledger, op, req, &self.asset, offer.amount.amount())
                .await?
                .transfer()
                .id
        };
        Ok(Payment {
            rail: RailId::new(RAIL),
            offer_id: offer.id.clone(),
            mode,
            payer: self.account.to_string(),
            amount: offer.amount.clone(),
            proof: serde_json::to_value(LedgerProof { transfer_id: id })
                .map_err(|e| RailError::InvalidInput(e.to_string()))?,
        })
    }
}

impl Rail for LedgerPayer {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities(&self.asset)
    }
}

#[async_trait]
impl Payer for LedgerPayer {
    async fn pay(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.send(op, offer, PaymentMode::Capture).await
    }
}

#[async_trait]
impl HoldPayer for LedgerPayer {
    async fn hold(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.send(op, offer, PaymentMode::Hold).await
    }
}

/// The ledger is idempotent by transfer id, and a payment's id derives from its operation id:
/// paying again *is* the look-up (the ledger answers the transfer the earlier attempt made).
#[async_trait]
impl rail_core::payer::FindPayment for LedgerPayer {
    async fn find_payment(
        &self,
        _op: &OpId,
        _offer: &Offer,
        _mode: PaymentMode,
    ) -> RailResult<Option<Payment>> {
        Ok(None)
    }
}

/// The receiver side: offers payment into one account, verifies once, captures, voids, refunds.
///
/// `verify` checks a payment against the [`Offer`] it is given: pass the receiver's own offer
/// (kept in its store, or inside a Stipendex Quote whose signature was checked first), never an
/// offer the payer sent back unverified.
#[derive(Clone, Debug)]
pub struct LedgerReceiver {
    ledger: Ledger,
    account: AccountId,
    asset: Asset,
    guard: ReplayGuard,
    hold_for: Duration,
    min_hold_left: Option<Duration>,
}

impl LedgerReceiver {
    /// A receiver paid into `account` (holding `asset`); `guard` makes each offer single-use
    /// (share its store between receiver instances).
    #[must_use]
    pub fn new(ledger: Ledger, account: AccountId, asset: Asset, guard: ReplayGuard) -> Self {
        LedgerReceiver {
            ledger,
            account,
            asset,
            guard,
            hold_for: DEFAULT_HOLD,
            min_hold_left: None,
        }
    }

    /// How long payers must hold funds for hold offers (default [`DEFAULT_HOLD`], one hour),
    /// offered in whole milliseconds. A duration under one millisecond is no duration: hold
    /// offers are then refused ([`HoldRefusal::NoTimeout`]).
    #[must_use]
    pub fn with_hold_duration(mut self, d: Duration) -> Self {
        self.hold_for = d;
        self
    }

    /// How much of a hold must be left, by the ledger's time ([`Ledger::now`]), when it is
    /// presented for verification. By default half the duration the offer asks for: a hold
    /// presented in the first half of its life verifies, one presented just before it lapses
    /// is refused ([`HoldRefusal::TooLittleLeft`]) rather than failing at capture. It may not
    /// exceed the hold duration offered (offers are refused then).
    #[must_use]
    pub fn with_min_hold_left(mut self, d: Duration) -> Self {
        self.min_hold_left = Some(d);
        self
    }

    /// The account paid into.
    #[must_use]
    pub fn account(&self) -> AccountId {
        self.account
    }

    async fn lookup(&self, id: TransferId) -> RailResult<(Transfer, Option<TransferStatus>)> {
        self.ledger
            .lookup_transfer(id)
            .await?
            .ok_or_else(|| RailError::NotFound(format!("transfer {id}")))
    }

    /// Checks the transfer against the offer; nothing is consumed here.
    async fn check(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        payment.check_envelope(offer)?;
        if offer.payee != self.account.to_string() {
            return Err(RailError::mismatch(
                Binding::Payee,
                self.account,
                &offer.payee,
            ));
        }
        offer.check_live(self.ledger.clock().now())?;
        let proof: LedgerProof = payment.proof_as()?;
        let payer = parse_account(&payment.payer, "payment payer")
            .map_err(|e| RailError::MalformedPayment(e.to_string()))?;
        let (t, status) = self.lookup(proof.transfer_id).await?;
        let (want_kind, want_status) = match offer.mode {
            PaymentMode::Capture => (
                TransferKind::Single,
                TransferStatus::Settled { reversed: 0 },
            ),
            PaymentMode::Hold => (TransferKind::Pending, TransferStatus::Pending),
        };
        if t.kind != want_kind {
            return Err(RailError::mismatch(
                Binding::Mode,
                offer.mode,
                format!("{:?}", t.kind),
            ));
        }
        if t.credit != self.account {
            return Err(RailError::mismatch(Binding::Payee, self.account, t.credit));
        }
        if t.user_data != offer_binding(&offer.id) {
            return Err(RailError::mismatch(
                Binding::Offer,
                &offer.id,
                "a transfer for another offer",
            ));
        }
        let paid = money(&self.asset, t.amount)?;
        if paid != offer.amount {
            return Err(RailError::mismatch(Binding::Amount, &offer.amount, &paid));
        }
        if t.debit != payer {
            return Err(RailError::mismatch(Binding::Payer, &payment.payer, t.debit));
        }
        if offer.mode == PaymentMode::Hold {
            let asked_ms = offer
                .details_as::<LedgerOfferDetails>()?
                .hold_duration_ms()?;
            // What is left, by the clock the ledger expires holds by.
            let now = self.ledger.now().await?;
            check_hold_terms(&t, asked_ms, now, self.min_hold_left)?;
        }
        if status != Some(want_status) {
            return Err(RailError::InvalidState {
                op: "verify",
                state: status.map_or("unknown", TransferStatus::name).into(),
            });
        }
        let state = match offer.mode {
            PaymentMode::Capture => PaymentState::Settled,
            PaymentMode::Hold => PaymentState::Held {
                capturable: paid.clone(),
                expires_at: t.expires_at(),
            },
        };
        Ok(Verified {
            rail: RailId::new(RAIL),
            offer_id: offer.id.clone(),
            payment_ref: t.id.to_string(),
            payer: t.debit.to_string(),
            amount: paid,
            state,
        })
    }

    fn transfer_id(s: &str) -> RailResult<TransferId> {
        s.parse()
            .map_err(|e| RailError::InvalidInput(format!("payment reference: {e}")))
    }

    /// Applies `req`, the operation `op` asking for `requested`.
    async fn run(&self, op: &OpId, req: TransferRequest, requested: Amount) -> RailResult<Created> {
        apply(&self.ledger, op, req, &self.asset, requested).await
    }

    async fn own_pending(&self, held: &Verified) -> RailResult<Transfer> {
        let id = Self::transfer_id(&held.payment_ref)?;
        let (t, _) = self.lookup(id).await?;
        if t.credit != self.account
            || t.kind != TransferKind::Pending
            || t.user_data != offer_binding(&held.offer_id)
        {
            return Err(RailError::NotFound(format!("hold {id} for this receiver")));
        }
        Ok(t)
    }
}

impl Rail for LedgerReceiver {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities(&self.asset)
    }
}

#[async_trait]
impl Receiver for LedgerReceiver {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        self.capabilities().check_asset(&charge.amount)?;
        if charge.amount.amount().is_zero() {
            return Err(RailError::InvalidInput("amount must not be zero".into()));
        }
        // Refuse what the ledger cannot carry now, not at payment time.
        let units = minor(&charge.amount)?;
        if units > crate::engine::MAX_COUNTER {
            return Err(RailError::Money(rail_core::MoneyError::Overflow {
                target: "i64",
            }));
        }
        let hold_ms = match charge.mode {
            PaymentMode::Hold => {
                let ms = u64::try_from(self.hold_for.as_millis()).map_err(|_| {
                    RailError::InvalidInput(format!(
                        "hold duration {:?} does not fit in milliseconds",
                        self.hold_for
                    ))
                })?;
                if ms == 0 {
                    return Err(HoldRefusal::NoTimeout("this receiver's hold duration").into());
                }
                if self.min_hold_left.is_some_and(|m| m > self.hold_for) {
                    return Err(RailError::InvalidInput(format!(
                        "this receiver requires {:?} left on holds it asks to last {:?}: no hold could verify",
                        self.min_hold_left.unwrap_or_default(),
                        self.hold_for
                    )));
                }
                Some(ms)
            }
            PaymentMode::Capture => None,
        };
        Ok(Offer {
            rail: RailId::new(RAIL),
            id: format!("q_{}", hex::encode(rand::random::<[u8; 16]>())),
            amount: charge.amount.clone(),
            payee: self.account.to_string(),
            mode: charge.mode,
            expires_at: self.ledger.clock().now().plus(charge.ttl),
            details: serde_json::to_value(LedgerOfferDetails {
                hold_ms,
                hold_secs: None,
            })
            .map_err(|e| RailError::InvalidInput(e.to_string()))?,
        })
    }

    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        // Cheap, side-effect-free checks first; then reserve the offer, check the ledger, commit.
        payment.check_envelope(offer)?;
        let _: LedgerProof = payment.proof_as()?;
        let reservation = self
            .guard
            .reserve(&offer.id, Duration::from_secs(30))
            .await?;
        match self.check(offer, payment).await {
            Ok(v) => {
                let keep =
                    offer.retention(self.ledger.clock().now(), Duration::from_secs(24 * 3600));
                reservation.commit(Some(keep)).await?;
                Ok(v)
            }
            Err(e) => {
                // The refusal is the answer; a failed release only delays the offer's reuse
                // until the reservation lapses.
                if let Err(release) = reservation.release().await {
                    tracing::warn!(offer = %offer.id, error = %release, "could not release an offer reservation");
                }
                Err(e)
            }
        }
    }
}

#[async_trait]
impl HoldReceiver for LedgerReceiver {
    async fn capture(&self, op: &OpId, held: &Verified, amount: &Money) -> RailResult<Captured> {
        if amount.asset() != &self.asset {
            return Err(RailError::mismatch(
                Binding::Asset,
                &self.asset,
                amount.asset(),
            ));
        }
        let p = self.own_pending(held).await?;
        let units = minor(amount)?;
        let created = self
            .run(
                op,
                TransferRequest::Post {
                    id: op_transfer_id(self.account, "capture", op),
                    pending_id: p.id,
                    amount: units,
                },
                amount.amount(),
            )
            .await?;
        let t = created.transfer();
        Ok(Captured {
            payment_ref: p.id.to_string(),
            capture_ref: t.id.to_string(),
            captured: money(&self.asset, t.amount)?,
            released: money(&self.asset, p.amount.saturating_sub(t.amount))?,
        })
    }

    async fn void(&self, op: &OpId, held: &Verified) -> RailResult<Voided> {
        let p = self.own_pending(held).await?;
        self.run(
            op,
            TransferRequest::Void {
                id: op_transfer_id(self.account, "void", op),
                pending_id: p.id,
            },
            Amount::ZERO,
        )
        .await?;
        Ok(Voided {
            payment_ref: p.id.to_string(),
            released: money(&self.asset, p.amount)?,
        })
    }
}

#[async_trait]
impl RefundReceiver for LedgerReceiver {
    async fn refund(&self, op: &OpId, payment_ref: &str, amount: &Money) -> RailResult<Refunded> {
        if amount.asset() != &self.asset {
            return Err(RailError::mismatch(
                Binding::Asset,
                &self.asset,
                amount.asset(),
            ));
        }
        let id = Self::transfer_id(payment_ref)?;
        let (t, _) = self.lookup(id).await?;
        if t.credit != self.account || !t.kind.is_posting() {
            return Err(RailError::NotFound(format!(
                "settled payment {id} to this receiver"
            )));
        }
        let units = minor(amount)?;
        let created = self
            .run(
                op,
                TransferRequest::Reverse {
                    id: op_transfer_id(self.account, "refund", op),
                    of: id,
                    amount: units,
                },
                amount.amount(),
            )
            .await?;
        Ok(Refunded {
            payment_ref: id.to_string(),
            refund_ref: created.transfer().id.to_string(),
            amount: money(&self.asset, created.transfer().amount)?,
        })
    }
}
