//! # toy-rail
//!
//! A small, honest, in-memory payment rail named `toy`, written against `rail-core` alone, as a
//! rail outside this workspace would be. Its own `cargo test` runs the whole conformance suite
//! (`tests/conformance.rs`): that file is what a rail author copies.
//!
//! A [`ToyBank`] keeps accounts (balances in minor units of one asset) behind a mutex, on an
//! injected clock. A [`ToyPayer`] pays and holds offers from one account; a [`ToyReceiver`]
//! makes offers to one account, verifies payments (once: a second verify is
//! [`RailError::Replayed`]), captures or voids holds, and refunds. Every operation id is
//! idempotent: the same id with the same request returns the first result, with another request
//! it is [`RailError::IdempotencyConflict`].
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use rail_core::{Asset, Charge, Money, OpId, Payer, RailReceiver, SystemClock};
//! use toy_rail::ToyBank;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let bank = ToyBank::new(Asset::usd(), Arc::new(SystemClock));
//! bank.open("alice", 1_000)?; // $10.00
//! bank.open("shop", 0)?;
//! let (alice, shop) = (bank.payer("alice"), bank.receiver("shop"));
//!
//! let price = Money::parse(Asset::usd(), "1.25")?;
//! let offer = shop.offer(&Charge::capture(price, Duration::from_secs(60))).await?;
//! let payment = alice.pay(&OpId::random(), &offer).await?;
//! let verified = shop.verify(&offer, &payment).await?;
//! assert_eq!(verified.amount, offer.amount);
//! assert_eq!((bank.balance("alice")?, bank.balance("shop")?), (875, 125));
//! // Single use: the same payment again is a replay.
//! assert_eq!(shop.verify(&offer, &payment).await.unwrap_err().code(), "replayed");
//! # Ok(()) }
//! ```

use std::any::Any;
use std::collections::HashMap;
use std::fmt::Display;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rail_core::{
    Asset, Binding, Capabilities, Captured, Charge, Finality, HoldPayer, HoldReceiver, Money,
    MoneyError, Offer, OpId, Payer, Payment, PaymentMode, PaymentState, Rail, RailError, RailId,
    RailReceiver, RailResult, RefundReceiver, Refunded, SharedClock, Timestamp, Verified, Voided,
};
use serde::Deserialize;

/// The rail's name: the `rail` tag of its offers and payments.
pub const RAIL: &str = "toy";

/// How long a hold stays capturable; after it the held money returns to the payer.
pub const HOLD_LIFETIME: Duration = Duration::from_secs(600);

/// The proof in a toy [`Payment`]: the bank's reference of the transfer.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Proof {
    transfer: String,
}

/// Where a transfer stands.
#[derive(Clone, Copy)]
enum Stage {
    /// The payee has the money (paid, or the captured part of a hold); `refundable` of it may
    /// still go back.
    Settled { refundable: u64 },
    /// The money sits in the bank's escrow until `until`.
    Held { until: Timestamp },
    /// Voided or lapsed: the money went back.
    Closed(&'static str),
}

impl Stage {
    /// The refusal of `op` in this stage.
    fn refuse(self, op: &'static str) -> RailError {
        let state = match self {
            Stage::Settled { .. } => "settled",
            Stage::Held { .. } => "held",
            Stage::Closed(why) => why,
        };
        RailError::InvalidState {
            op,
            state: state.into(),
        }
    }
}

/// What moved for one offer.
struct Transfer {
    offer_id: String,
    payer: String,
    payee: String,
    amount: u64,
    mode: PaymentMode,
    stage: Stage,
    verified: bool,
}

#[derive(Default)]
struct State {
    accounts: HashMap<String, u64>,
    /// Held money, out of the payer's reach and not yet the payee's.
    escrow: u64,
    /// All money ever opened: no balance can exceed it, so credits cannot overflow.
    supply: u64,
    offers: HashMap<String, Offer>,
    transfers: HashMap<String, Transfer>,
    /// Operation id → (what was asked, what it returned).
    ops: HashMap<String, (String, Box<dyn Any + Send>)>,
}

impl State {
    fn slot(&mut self, who: Option<&str>) -> RailResult<&mut u64> {
        match who {
            None => Ok(&mut self.escrow),
            Some(a) => self
                .accounts
                .get_mut(a)
                .ok_or_else(|| not_found("account", a)),
        }
    }

    /// Moves `n` minor units from `from` to `to` (`None`: the escrow), all or nothing.
    fn shift(&mut self, from: Option<&str>, to: Option<&str>, n: u64) -> RailResult<()> {
        if from == to {
            return Err(RailError::InvalidInput("paying oneself".into()));
        }
        let left = self.slot(from)?.checked_sub(n).ok_or_else(|| {
            RailError::InsufficientFunds(format!("{} cannot cover {n}", from.unwrap_or("escrow")))
        })?;
        let right = self.slot(to)?.checked_add(n);
        let right = right.ok_or(MoneyError::Overflow { target: "u64" })?;
        *self.slot(from)? = left;
        *self.slot(to)? = right;
        Ok(())
    }

    /// Returns lapsed holds to their payers.
    fn sweep(&mut self, now: Timestamp) -> RailResult<()> {
        let lapsed: Vec<(String, String, u64)> = self
            .transfers
            .iter()
            .filter(|(_, t)| matches!(t.stage, Stage::Held { until } if until <= now))
            .map(|(id, t)| (id.clone(), t.payer.clone(), t.amount))
            .collect();
        for (id, payer, amount) in lapsed {
            self.shift(None, Some(&payer), amount)?;
            if let Some(t) = self.transfers.get_mut(&id) {
                t.stage = Stage::Closed("lapsed");
            }
        }
        Ok(())
    }

    /// The transfer `id` if it was paid to `payee` (another receiver's payments do not exist
    /// for this one).
    fn owned(&mut self, id: &str, payee: &str) -> RailResult<&mut Transfer> {
        let t = self.transfers.get_mut(id).filter(|t| t.payee == payee);
        t.ok_or_else(|| not_found("payment", id))
    }
}

fn not_found(what: &str, id: &str) -> RailError {
    RailError::NotFound(format!("{what} {id}"))
}

/// `Ok` when `want == got`, else a mismatch on `binding`.
fn same<T: PartialEq + Display + ?Sized>(b: Binding, want: &T, got: &T) -> RailResult<()> {
    (want == got)
        .then_some(())
        .ok_or_else(|| RailError::mismatch(b, want, got))
}

/// Minor units of `m`, exactly; beyond a SQL `BIGINT` (`i64::MAX`) the toy refuses the amount.
fn units(m: &Money) -> RailResult<u64> {
    Ok(m.minor_i64()?.unsigned_abs())
}

/// An in-memory bank of one asset; clones share the same accounts.
#[derive(Clone)]
pub struct ToyBank {
    state: Arc<Mutex<State>>,
    clock: SharedClock,
    asset: Asset,
}

impl ToyBank {
    /// An empty bank of `asset`, telling time (offer and hold expiry) by `clock`.
    #[must_use]
    pub fn new(asset: Asset, clock: SharedClock) -> Self {
        ToyBank {
            state: Arc::default(),
            clock,
            asset,
        }
    }

    /// Opens `account` with `balance` minor units.
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] if it exists; [`RailError::Money`] if the bank's total money
    /// would overflow.
    pub fn open(&self, account: &str, balance: u64) -> RailResult<()> {
        self.with(|s, _| {
            if s.accounts.contains_key(account) {
                return Err(RailError::InvalidInput(format!("account {account} exists")));
            }
            let supply = s.supply.checked_add(balance);
            s.supply = supply.ok_or(MoneyError::Overflow { target: "u64" })?;
            s.accounts.insert(account.to_owned(), balance);
            Ok(())
        })
    }

    /// What `account` can spend now, in minor units (held money is not spendable).
    ///
    /// # Errors
    /// [`RailError::NotFound`] for an unknown account.
    pub fn balance(&self, account: &str) -> RailResult<u64> {
        self.with(|s, _| s.slot(Some(account)).map(|b| *b))
    }

    /// The payer side for `account`.
    #[must_use]
    pub fn payer(&self, account: &str) -> ToyPayer {
        ToyPayer {
            bank: self.clone(),
            account: account.to_owned(),
        }
    }

    /// The receiver side for `account`: offers are payable to it.
    #[must_use]
    pub fn receiver(&self, account: &str) -> ToyReceiver {
        ToyReceiver {
            bank: self.clone(),
            account: account.to_owned(),
        }
    }

    /// Runs `f` on the state, lapsed holds released first.
    fn with<T>(&self, f: impl FnOnce(&mut State, Timestamp) -> RailResult<T>) -> RailResult<T> {
        let poisoned = |_| RailError::Storage("toy bank poisoned".into());
        let mut s = self.state.lock().map_err(poisoned)?;
        let now = self.clock.now();
        s.sweep(now)?;
        f(&mut s, now)
    }

    /// Runs `f` once per operation id: a repeat of `request` gets the first result again, another
    /// request under the same id is a conflict. Failures are not recorded.
    fn once<T: Clone + Send + 'static>(
        &self,
        op: &OpId,
        request: String,
        f: impl FnOnce(&mut State, Timestamp) -> RailResult<T>,
    ) -> RailResult<T> {
        self.with(|s, now| {
            if let Some((asked, done)) = s.ops.get(op.as_str()) {
                return match done.downcast_ref::<T>() {
                    Some(done) if *asked == request => Ok(done.clone()),
                    _ => Err(RailError::IdempotencyConflict {
                        op_id: op.to_string(),
                    }),
                };
            }
            let out = f(s, now)?;
            s.ops
                .insert(op.to_string(), (request, Box::new(out.clone())));
            Ok(out)
        })
    }

    fn money(&self, n: u64) -> RailResult<Money> {
        Ok(Money::from_minor(self.asset.clone(), u128::from(n))?)
    }

    fn exceeds(&self, op: &'static str, asked: &Money, available: u64) -> RailError {
        match self.money(available) {
            Ok(m) => RailError::ExceedsAvailable {
                op,
                requested: asked.amount(),
                available: m.amount(),
            },
            Err(e) => e,
        }
    }

    /// The minor units of `m`, refused unless it is a positive amount of this bank's asset.
    fn units(&self, m: &Money) -> RailResult<u64> {
        self.capabilities().check_asset(m)?;
        match units(m)? {
            0 => Err(RailError::InvalidInput("a zero amount".into())),
            n => Ok(n),
        }
    }
}

impl Rail for ToyBank {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            pay: true,
            pay_effect: rail_core::PayEffect::Moves,
            hold: true,
            partial_capture: true,
            refund: true,
            partial_refund: true,
            finality: Finality::Immediate,
            assets: vec![self.asset.clone()],
        }
    }
}

/// Pays offers from one account of a [`ToyBank`].
pub struct ToyPayer {
    bank: ToyBank,
    account: String,
}

impl ToyPayer {
    fn send(&self, op: &OpId, offer: &Offer, mode: PaymentMode) -> RailResult<Payment> {
        self.bank.once(op, format!("{mode} {offer:?}"), |s, now| {
            same(Binding::Rail, &self.bank.id(), &offer.rail)?;
            same(Binding::Mode, &mode, &offer.mode)?;
            offer.check_live(now)?;
            let n = self.bank.units(&offer.amount)?;
            // Never pay one offer twice.
            if s.transfers.values().any(|t| t.offer_id == offer.id) {
                return Err(RailError::Replayed {
                    key: offer.id.clone(),
                });
            }
            // A payment goes to the payee, a hold to the escrow.
            let (to, stage) = match mode {
                PaymentMode::Capture => {
                    (Some(offer.payee.as_str()), Stage::Settled { refundable: n })
                }
                PaymentMode::Hold => (
                    None,
                    Stage::Held {
                        until: now.plus(HOLD_LIFETIME),
                    },
                ),
            };
            s.shift(Some(&self.account), to, n)?;
            let transfer = format!("t{}", s.transfers.len() + 1);
            let record = Transfer {
                offer_id: offer.id.clone(),
                payer: self.account.clone(),
                payee: offer.payee.clone(),
                amount: n,
                mode,
                stage,
                verified: false,
            };
            s.transfers.insert(transfer.clone(), record);
            Ok(Payment {
                rail: self.bank.id(),
                offer_id: offer.id.clone(),
                mode,
                payer: self.account.clone(),
                amount: offer.amount.clone(),
                proof: serde_json::json!({ "transfer": transfer }),
            })
        })
    }
}

impl Rail for ToyPayer {
    fn id(&self) -> RailId {
        self.bank.id()
    }
    fn capabilities(&self) -> Capabilities {
        self.bank.capabilities()
    }
}

#[async_trait]
impl Payer for ToyPayer {
    async fn pay(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.send(op, offer, PaymentMode::Capture)
    }
}

#[async_trait]
impl HoldPayer for ToyPayer {
    async fn hold(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.send(op, offer, PaymentMode::Hold)
    }
}

/// Makes offers payable to one account of a [`ToyBank`] and settles what is paid for them.
pub struct ToyReceiver {
    bank: ToyBank,
    account: String,
}

impl Rail for ToyReceiver {
    fn id(&self) -> RailId {
        self.bank.id()
    }
    fn capabilities(&self) -> Capabilities {
        self.bank.capabilities()
    }
}

#[async_trait]
impl RailReceiver for ToyReceiver {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        self.bank.units(&charge.amount)?;
        self.bank.with(|s, now| {
            let offer = Offer {
                rail: self.bank.id(),
                id: format!("offer-{}", s.offers.len() + 1),
                amount: charge.amount.clone(),
                payee: self.account.clone(),
                mode: charge.mode,
                expires_at: now.plus(charge.ttl),
                details: serde_json::json!({ "reference": charge.reference }),
            };
            s.offers.insert(offer.id.clone(), offer.clone());
            Ok(offer)
        })
    }

    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        payment.check_envelope(offer)?;
        let Proof { transfer } = payment.proof_as()?;
        self.bank.with(|s, now| {
            // What moved, as the bank recorded it, against the offer as this bank issued it (the
            // presented copy only names it).
            let issued = s.offers.get(&offer.id);
            let issued = issued.ok_or_else(|| not_found("offer", &offer.id))?;
            let t = s.transfers.get_mut(&transfer);
            let t = t.ok_or_else(|| not_found("transfer", &transfer))?;
            same(Binding::Amount, &issued.amount, &offer.amount)?;
            same(Binding::Payee, &self.account, &issued.payee)?;
            same(Binding::Offer, &issued.id, &t.offer_id)?;
            same(Binding::Payee, &issued.payee, &t.payee)?;
            same(Binding::Payer, &t.payer, &payment.payer)?;
            same(Binding::Mode, &issued.mode, &t.mode)?;
            same(Binding::Amount, &units(&issued.amount)?, &t.amount)?;
            issued.check_live(now)?;
            if t.verified {
                return Err(RailError::Replayed {
                    key: offer.id.clone(),
                });
            }
            let state = match t.stage {
                Stage::Settled { .. } => PaymentState::Settled,
                Stage::Held { until } => PaymentState::Held {
                    capturable: offer.amount.clone(),
                    expires_at: Some(until),
                },
                Stage::Closed(_) => return Err(t.stage.refuse("verify")),
            };
            t.verified = true;
            Ok(Verified {
                rail: self.bank.id(),
                offer_id: offer.id.clone(),
                payment_ref: transfer,
                payer: t.payer.clone(),
                amount: offer.amount.clone(),
                state,
            })
        })
    }
}

#[async_trait]
impl HoldReceiver for ToyReceiver {
    async fn capture(&self, op: &OpId, held: &Verified, amount: &Money) -> RailResult<Captured> {
        let id = &held.payment_ref;
        self.bank
            .once(op, format!("capture {id} {amount}"), |s, _| {
                let n = self.bank.units(amount)?;
                let t = s.owned(id, &self.account)?;
                if !matches!(t.stage, Stage::Held { .. }) || !t.verified {
                    return Err(t.stage.refuse("capture"));
                }
                let rest = t
                    .amount
                    .checked_sub(n)
                    .ok_or_else(|| self.bank.exceeds("capture", amount, t.amount))?;
                let payer = t.payer.clone();
                s.shift(None, Some(&self.account), n)?;
                s.shift(None, Some(&payer), rest)?;
                s.owned(id, &self.account)?.stage = Stage::Settled { refundable: n };
                // One capture per hold: the capture keeps the hold's reference.
                Ok(Captured {
                    payment_ref: id.clone(),
                    capture_ref: id.clone(),
                    captured: amount.clone(),
                    released: self.bank.money(rest)?,
                })
            })
    }

    async fn void(&self, op: &OpId, held: &Verified) -> RailResult<Voided> {
        let id = &held.payment_ref;
        self.bank.once(op, format!("void {id}"), |s, _| {
            let t = s.owned(id, &self.account)?;
            if !matches!(t.stage, Stage::Held { .. }) {
                return Err(t.stage.refuse("void"));
            }
            let (payer, n) = (t.payer.clone(), t.amount);
            s.shift(None, Some(&payer), n)?;
            s.owned(id, &self.account)?.stage = Stage::Closed("voided");
            Ok(Voided {
                payment_ref: id.clone(),
                released: self.bank.money(n)?,
            })
        })
    }
}

#[async_trait]
impl RefundReceiver for ToyReceiver {
    async fn refund(&self, op: &OpId, payment_ref: &str, amount: &Money) -> RailResult<Refunded> {
        self.bank
            .once(op, format!("refund {payment_ref} {amount}"), |s, _| {
                let n = self.bank.units(amount)?;
                let t = s.owned(payment_ref, &self.account)?;
                let Stage::Settled { refundable } = t.stage else {
                    return Err(t.stage.refuse("refund"));
                };
                let left = refundable
                    .checked_sub(n)
                    .ok_or_else(|| self.bank.exceeds("refund", amount, refundable))?;
                let payer = t.payer.clone();
                s.shift(Some(&self.account), Some(&payer), n)?;
                s.owned(payment_ref, &self.account)?.stage = Stage::Settled { refundable: left };
                Ok(Refunded {
                    payment_ref: payment_ref.to_owned(),
                    refund_ref: format!("{payment_ref}/refund-{left}"), // `left` only falls
                    amount: amount.clone(),
                })
            })
    }
}
