//! The ledger rail's receiver side: [`LedgerReceiver`] offers payment into one account, verifies
//! once, captures, voids and refunds.

use std::time::Duration;

use async_trait::async_trait;
use rail_core::{
    Amount, Asset, Binding, Capabilities, Captured, Charge, HoldReceiver, Money, Offer, OpId,
    Payment, PaymentMode, PaymentState, Rail, RailError, RailId, RailReceiver, RailResult,
    RefundReceiver, Refunded, ReplayGuard, Verified, Voided, glue,
};

use crate::ledger::Ledger;
use crate::types::{
    AccountId, Created, Transfer, TransferId, TransferKind, TransferRequest, TransferStatus,
};

use super::{
    DEFAULT_HOLD, HoldRefusal, LedgerOfferDetails, LedgerProof, RAIL, apply, capabilities,
    check_hold_terms, minor, money, offer_binding, op_transfer_id, parse_account,
};

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

    /// Checks the transfer against the offer; nothing is consumed here. `late`: a transfer
    /// made while the offer was live is accepted after its end ([`RailReceiver::verify_as`]).
    async fn check(&self, offer: &Offer, payment: &Payment, late: bool) -> RailResult<Verified> {
        payment.check_envelope(offer)?;
        if offer.payee != self.account.to_string() {
            return Err(RailError::mismatch(
                Binding::Payee,
                self.account,
                &offer.payee,
            ));
        }
        let now = self.ledger.clock().now();
        if !late {
            offer.check_live(now)?;
        }
        let proof: LedgerProof = payment.proof_as()?;
        let payer = parse_account(&payment.payer, "payment payer")
            .map_err(|e| RailError::MalformedPayment(e.to_string()))?;
        let (t, status) = self.lookup(proof.transfer_id).await?;
        if late {
            offer.check_paid_in_time(t.timestamp, now)?;
        }
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
        Ok(glue::verified(
            RAIL,
            offer,
            t.id.to_string(),
            t.debit.to_string(),
            paid,
            state,
        ))
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
impl RailReceiver for LedgerReceiver {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        glue::check_charge(&self.capabilities(), charge)?;
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
        glue::offer(
            RAIL,
            format!("q_{}", hex::encode(rand::random::<[u8; 16]>())),
            charge,
            self.account.to_string(),
            self.ledger.clock().now().plus(charge.ttl),
            &LedgerOfferDetails {
                hold_ms,
                hold_secs: None,
            },
        )
    }

    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        self.consume(None, offer, payment, false).await
    }

    /// A transfer made while the offer was live is verified after its end (within
    /// [`rail_core::LATE_PROOF_GRACE`]); the offer's single-use mark still refuses a replay —
    /// but the same `op` again (a verification whose answer was lost, recovered here or at
    /// another instance) gets that verification's answer.
    async fn verify_as(&self, op: &OpId, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        self.consume(Some(op), offer, payment, true).await
    }
}

/// How long a verification holds its offer's single-use mark before another instance may take
/// it over: a verification is one ledger read and one write, so an instance that died holding it
/// delays its payer this long at most.
const VERIFY_LEASE: Duration = Duration::from_secs(10);

/// What the offer's single-use mark keeps of a verification under an operation id.
#[derive(serde::Serialize, serde::Deserialize)]
struct Consumed {
    op: String,
    verified: Verified,
}

impl LedgerReceiver {
    async fn consume(
        &self,
        op: Option<&OpId>,
        offer: &Offer,
        payment: &Payment,
        late: bool,
    ) -> RailResult<Verified> {
        // Cheap, side-effect-free checks first; then reserve the offer, check the ledger, commit.
        payment.check_envelope(offer)?;
        let _: LedgerProof = payment.proof_as()?;
        // The mark's reservation needs no fsync of its own: its durable commit (or its
        // release) ends it, and nothing acts on the check before.
        let reservation = match self.guard.reserve_for_check(&offer.id, VERIFY_LEASE).await {
            Ok(r) => r,
            Err(RailError::Replayed { key }) => {
                // Consumed: by this very operation (its answer again), or by another (a replay).
                // Reserved and not finished: a verification under way, or stopped mid-way by an
                // instance that died; a caller with an operation id (its answer may have been
                // lost with that instance) is told to come back, and gets the verification
                // once the lease lapses. Without an id it cannot be the same caller: a replay.
                if let Some(op) = op
                    && let Some(seen) = self.guard.seen(&offer.id).await?
                {
                    if seen.record.state == rail_core::keys::RESERVED {
                        return Err(RailError::InProgress {
                            op_id: op.as_str().to_owned(),
                        });
                    }
                    if seen.record.state == rail_core::keys::COMMITTED
                        && let Some(c) = seen
                            .record
                            .value
                            .as_deref()
                            .and_then(|v| serde_json::from_str::<Consumed>(v).ok())
                        && c.op == op.as_str()
                    {
                        return Ok(c.verified);
                    }
                }
                return Err(RailError::Replayed { key });
            }
            Err(e) => return Err(e),
        };
        match self.check(offer, payment, late).await {
            Ok(v) => {
                let keep =
                    offer.retention(self.ledger.clock().now(), Duration::from_secs(24 * 3600));
                let value = match op {
                    Some(op) => Some(
                        serde_json::to_string(&Consumed {
                            op: op.as_str().to_owned(),
                            verified: v.clone(),
                        })
                        .map_err(|e| RailError::Storage(e.to_string()))?,
                    ),
                    None => None,
                };
                reservation
                    .finish_with(rail_core::keys::COMMITTED, value, Some(keep))
                    .await?;
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
        glue::check_asset(&self.asset, amount)?;
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
        glue::check_asset(&self.asset, amount)?;
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
