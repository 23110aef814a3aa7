//! The receiver side: offers payment into the client's account; the facilitator verifies
//! (once), captures, voids and refunds.

use std::time::Duration;

use async_trait::async_trait;
use rail_core::{
    Asset, Capabilities, Captured, Charge, HoldReceiver, Money, Offer, OpId, Payment, PaymentMode,
    Rail, RailError, RailId, RailReceiver, RailResult, RefundReceiver, Refunded, Verified, Voided,
    glue,
};

use crate::api::{
    self, AccountOfferDetails, AccountProof, CaptureRequest, RedeemRequest, RefundRequest,
    VoidRequest,
};
use crate::client::AccountClient;
use crate::{RAIL, capabilities};

/// How long a hold must last when the receiver does not say.
pub const DEFAULT_HOLD: Duration = Duration::from_secs(3600);

/// Receives `account`-rail payments into one account.
///
/// `verify` checks a payment against the [`Offer`] it is given: pass the receiver's own offer
/// (kept in its store, or inside a Stipendex Quote whose signature was checked first), never an
/// offer the payer sent back unverified. The facilitator keeps each offer single-use for
/// every instance of the receiver: no local store is needed.
#[derive(Clone, Debug)]
pub struct AccountReceiver {
    client: AccountClient,
    asset: Asset,
    hold_for: Duration,
}

impl AccountReceiver {
    /// A receiver paid into `client`'s account, which holds `asset`.
    #[must_use]
    pub fn new(client: AccountClient, asset: Asset) -> Self {
        AccountReceiver {
            client,
            asset,
            hold_for: DEFAULT_HOLD,
        }
    }

    /// How long payers must hold funds for hold offers (default [`DEFAULT_HOLD`]).
    #[must_use]
    pub fn with_hold_duration(mut self, d: Duration) -> Self {
        self.hold_for = d;
        self
    }

    /// The client.
    #[must_use]
    pub fn client(&self) -> &AccountClient {
        &self.client
    }

    fn check_asset(&self, m: &Money) -> RailResult<()> {
        glue::check_asset(&self.asset, m)
    }
}

impl Rail for AccountReceiver {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities(&self.asset)
    }
}

#[async_trait]
impl RailReceiver for AccountReceiver {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        glue::check_charge(&self.capabilities(), charge)?;
        // The facilitator keeps amounts in a signed 64-bit counter: refuse larger ones now.
        charge.amount.minor_i64()?;
        let hold_ms = match charge.mode {
            PaymentMode::Hold => {
                let ms = u64::try_from(self.hold_for.as_millis()).unwrap_or(u64::MAX);
                if ms == 0 {
                    return Err(RailError::InvalidInput(
                        "this receiver's hold duration is 0 ms: a hold must have a timeout".into(),
                    ));
                }
                Some(ms)
            }
            PaymentMode::Capture => None,
        };
        glue::offer(
            RAIL,
            format!("q_{}", hex::encode(rand::random::<[u8; 16]>())),
            charge,
            self.client.account().to_owned(),
            self.client.clock().now().plus(charge.ttl),
            &AccountOfferDetails {
                network: self.client.network().to_owned(),
                hold_ms,
            },
        )
    }

    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        // An expired offer is refused here; `verify_as` lets the facilitator judge a payment
        // made in time and presented late.
        offer.check_live(self.client.clock().now())?;
        // One key per verification: its retries are answered the same, another verification
        // of the same offer is `replayed`.
        let key = format!("redeem_{}", hex::encode(rand::random::<[u8; 16]>()));
        self.redeem(&key, offer, payment).await
    }

    /// Redeems under a key derived from `op`: the caller's retry of this verification after a
    /// lost answer (from any instance) is answered the same by the facilitator; a payment
    /// redeemed under another key is `replayed`. A payment made while the offer was live is
    /// redeemed after its end, within [`rail_core::LATE_PROOF_GRACE`].
    async fn verify_as(&self, op: &OpId, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        self.redeem(&redeem_key(op), offer, payment).await
    }
}

impl AccountReceiver {
    async fn redeem(&self, key: &str, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        // What can be refused without a call is refused here.
        payment.check_envelope(offer)?;
        let proof: AccountProof = payment.proof_as()?;
        crate::check_id(&proof.payment_id).map_err(|_| {
            RailError::MalformedPayment("proof: payment_id is not 32 hex digits".into())
        })?;
        let answer = self
            .client
            .post::<_, Verified>(
                &api::payment_action(&proof.payment_id, "redeem"),
                &RedeemRequest {
                    offer: offer.clone(),
                    payment: payment.clone(),
                },
                key,
            )
            .await?;
        Ok(answer.body)
    }
}

#[async_trait]
impl HoldReceiver for AccountReceiver {
    async fn capture(&self, op: &OpId, held: &Verified, amount: &Money) -> RailResult<Captured> {
        self.check_asset(amount)?;
        let answer = self
            .client
            .post::<_, Captured>(
                &api::payment_action(&held.payment_ref, "capture"),
                &CaptureRequest {
                    held: held.clone(),
                    amount: amount.clone(),
                },
                op.as_str(),
            )
            .await?;
        Ok(answer.body)
    }

    async fn void(&self, op: &OpId, held: &Verified) -> RailResult<Voided> {
        let answer = self
            .client
            .post::<_, Voided>(
                &api::payment_action(&held.payment_ref, "void"),
                &VoidRequest { held: held.clone() },
                op.as_str(),
            )
            .await?;
        Ok(answer.body)
    }
}

#[async_trait]
impl RefundReceiver for AccountReceiver {
    async fn refund(&self, op: &OpId, payment_ref: &str, amount: &Money) -> RailResult<Refunded> {
        self.check_asset(amount)?;
        crate::check_id(payment_ref)
            .map_err(|_| RailError::NotFound(format!("payment {payment_ref:?}")))?;
        let answer = self
            .client
            .post::<_, Refunded>(
                &api::payment_action(payment_ref, "refund"),
                &RefundRequest {
                    amount: amount.clone(),
                },
                op.as_str(),
            )
            .await?;
        Ok(answer.body)
    }
}

/// The facilitator's idempotency key for the caller's verification `op`.
fn redeem_key(op: &OpId) -> String {
    use sha2::Digest as _;
    let h = sha2::Sha256::digest(op.as_str().as_bytes());
    format!("redeem_{}", hex::encode(h.get(..16).unwrap_or_default()))
}
