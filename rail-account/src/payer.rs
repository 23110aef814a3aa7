//! The payer side: pays and holds from the client's account at the facilitator.

use async_trait::async_trait;
use rail_core::{
    Asset, Binding, Capabilities, HoldPayer, Offer, OpId, Payer, Payment, PaymentMode, Rail,
    RailError, RailId, RailResult,
};

use crate::api::{self, AccountOfferDetails, PayAnswer, PayRequest};
use crate::client::AccountClient;
use crate::{RAIL, capabilities};

/// What the facilitator did with a payment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Submitted {
    /// Paid (or held): hand the payment to the receiver.
    Paid(Payment),
    /// Waiting for an operator's review; the funds are reserved. Submit the same operation
    /// again later to learn the decision.
    PendingReview {
        /// The payment at the facilitator.
        payment_ref: String,
        /// Why it waits.
        reason: String,
    },
}

/// Pays offers of the `account` rail from one account.
#[derive(Clone, Debug)]
pub struct AccountPayer {
    client: AccountClient,
    asset: Asset,
}

impl AccountPayer {
    /// A payer spending from `client`'s account, which holds `asset`.
    #[must_use]
    pub fn new(client: AccountClient, asset: Asset) -> Self {
        AccountPayer { client, asset }
    }

    /// The client.
    #[must_use]
    pub fn client(&self) -> &AccountClient {
        &self.client
    }

    /// Pays (or holds, by `mode`) `offer` under operation `op`, telling a payment held for
    /// review apart from one made. The same `op` again answers the same payment, or the
    /// review's decision once taken.
    ///
    /// # Errors
    /// The checks of [`Payer::accepts`]; the facilitator's refusal (`insufficient_funds`,
    /// `offer_expired`, `idempotency_conflict`, `declined` for a payment rejected in review);
    /// [`RailError::Unavailable`] when no instance answers.
    pub async fn submit(
        &self,
        op: &OpId,
        offer: &Offer,
        mode: PaymentMode,
    ) -> RailResult<Submitted> {
        self.accepts(offer)?;
        if offer.mode != mode {
            return Err(RailError::mismatch(Binding::Mode, mode, offer.mode));
        }
        // The offer's time is the facilitator's to judge: a payment made under `op` before
        // the offer's end is answered after it (an approval, or an answer lost in transit),
        // and a new one is refused there (`offer_expired`).
        let answer = self
            .client
            .post::<_, PayAnswer>(
                api::PAYMENTS,
                &PayRequest {
                    offer: offer.clone(),
                },
                op.as_str(),
            )
            .await?;
        Ok(match answer.body {
            PayAnswer::Paid { payment } => {
                if payment.offer_id != offer.id
                    || payment.amount != offer.amount
                    || payment.mode != mode
                {
                    return Err(RailError::Rail {
                        reason: rail_core::RailReason::new(
                            "bad_answer",
                            "the facilitator answered a payment for another offer",
                        ),
                        retryable: false,
                    });
                }
                Submitted::Paid(payment)
            }
            PayAnswer::PendingReview {
                payment_ref,
                reason,
            } => Submitted::PendingReview {
                payment_ref,
                reason,
            },
        })
    }

    async fn send(&self, op: &OpId, offer: &Offer, mode: PaymentMode) -> RailResult<Payment> {
        match self.submit(op, offer, mode).await? {
            Submitted::Paid(p) => Ok(p),
            Submitted::PendingReview {
                payment_ref,
                reason,
            } => Err(RailError::PendingReview {
                payment_ref,
                reason,
            }),
        }
    }
}

impl Rail for AccountPayer {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities(&self.asset)
    }
}

#[async_trait]
impl Payer for AccountPayer {
    /// Pays; a payment held for review is [`RailError::PendingReview`] (retryable: the same
    /// `op` again reports the decision).
    async fn pay(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.send(op, offer, PaymentMode::Capture).await
    }

    fn accepts(&self, offer: &Offer) -> RailResult<()> {
        rail_core::glue::check_rail(offer, RAIL)?;
        self.capabilities().check_asset(&offer.amount)?;
        let details: AccountOfferDetails = offer.details_as()?;
        if details.network != self.client.network() {
            return Err(RailError::WrongNetwork {
                expected: self.client.network().to_owned(),
                actual: details.network,
            });
        }
        Ok(())
    }
}

#[async_trait]
impl HoldPayer for AccountPayer {
    async fn hold(&self, op: &OpId, offer: &Offer) -> RailResult<Payment> {
        self.send(op, offer, PaymentMode::Hold).await
    }
}

/// The facilitator applies an operation id once and answers it again: paying again *is* the
/// look-up.
impl rail_core::glue::NothingToFind for AccountPayer {}
