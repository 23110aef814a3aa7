//! The ledger rail's payer side: [`LedgerPayer`] spends from one account.

use std::time::Duration;

use async_trait::async_trait;
use rail_core::{
    Asset, Capabilities, HoldPayer, Offer, OpId, Payer, Payment, PaymentMode, Rail, RailId,
    RailResult, glue,
};

use crate::ledger::Ledger;
use crate::types::{AccountId, TransferRequest};

use super::{
    DEFAULT_MAX_HOLD, HoldRefusal, LedgerOfferDetails, LedgerProof, RAIL, apply, capabilities,
    millis, minor, offer_binding, op_transfer_id, parse_account,
};

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
        glue::check_rail_and_mode(offer, RAIL, mode)?;
        glue::check_asset(&self.asset, &offer.amount)?;
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
        glue::payment(
            RAIL,
            offer,
            mode,
            self.account.to_string(),
            &LedgerProof { transfer_id: id },
        )
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
impl glue::NothingToFind for LedgerPayer {}
