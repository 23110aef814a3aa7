//! The payer side: [`NwcPayer`] checks an offer's BOLT11 invoice, pays it through its wallet
//! and checks the returned preimage; a hold is paid in the background.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use lightning_invoice::{Bolt11Invoice, Currency};
use rail_core::{
    Binding, Capabilities, HoldPayer, Money, Offer, OpId, Payer, Payment, PaymentMode, Rail,
    RailError, RailId, RailReason, RailResult, SharedClock, glue,
};

use super::{NwcProof, OfferDetails, RAIL, capabilities, msat, preimage_matches, rail_error};
use crate::client::{NwcClient, NwcError};
use crate::nip47::{ErrorCode, TxState};

/// The payer.
#[derive(Clone)]
pub struct NwcPayer {
    client: Arc<NwcClient>,
    currency: Currency,
    max_amount: Money,
    clock: SharedClock,
    lock: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for NwcPayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NwcPayer")
            .field("currency", &self.currency)
            .field("max_amount", &self.max_amount)
            .finish_non_exhaustive()
    }
}

impl NwcPayer {
    /// A payer paying through the wallet behind `client`, only invoices of `currency`
    /// (`Currency::Bitcoin` for mainnet), never more than `max_amount` per payment.
    #[must_use]
    pub fn new(
        client: Arc<NwcClient>,
        currency: Currency,
        max_amount: Money,
        clock: SharedClock,
    ) -> Self {
        NwcPayer {
            client,
            currency,
            max_amount,
            clock,
            lock: Arc::new(tokio::sync::Mutex::new(())),
        }
    }

    /// Checks the offer's invoice: signature, network, amount, expiry, payee, payment hash.
    fn check(&self, offer: &Offer, mode: PaymentMode) -> RailResult<(OfferDetails, u64)> {
        self.check_at(offer, mode, true)
    }

    /// As [`NwcPayer::check`]; `live`: the invoice must not have expired (a look-up of what an
    /// earlier attempt paid skips that: a payment made in time is found after the invoice's end).
    fn check_at(
        &self,
        offer: &Offer,
        mode: PaymentMode,
        live: bool,
    ) -> RailResult<(OfferDetails, u64)> {
        glue::check_rail_and_mode(offer, RAIL, mode)?;
        let want = msat(&offer.amount)?;
        glue::check_payer_limit(&offer.amount, &self.max_amount)?;
        let details: OfferDetails = offer.details_as()?;
        let inv = Bolt11Invoice::from_str(&details.invoice)
            .map_err(|e| RailError::InvalidInput(format!("invoice: {e}")))?;
        inv.check_signature()
            .map_err(|e| RailError::BadSignature(format!("invoice signature: {e}")))?;
        if inv.currency() != self.currency {
            return Err(RailError::WrongNetwork {
                expected: format!("{:?}", self.currency),
                actual: format!("{:?}", inv.currency()),
            });
        }
        let amount = inv
            .amount_milli_satoshis()
            .ok_or_else(|| RailError::InvalidInput("an invoice without an amount".into()))?;
        if amount != want {
            return Err(RailError::mismatch(Binding::Amount, want, amount));
        }
        if live && inv.is_expired() {
            return Err(RailError::OfferExpired {
                offer_id: offer.id.clone(),
                expired_at: offer.expires_at,
            });
        }
        let payee = hex::encode(inv.recover_payee_pub_key().serialize());
        if payee != offer.payee.to_ascii_lowercase() {
            return Err(RailError::mismatch(Binding::Payee, &offer.payee, payee));
        }
        let hash = hex::encode(AsRef::<[u8]>::as_ref(inv.payment_hash()));
        if hash != details.payment_hash.to_ascii_lowercase() {
            return Err(RailError::mismatch(
                Binding::Offer,
                &details.payment_hash,
                hash,
            ));
        }
        Ok((details, want))
    }
}

impl Rail for NwcPayer {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities()
    }
}

impl NwcPayer {
    /// The proof of a paid invoice, once the wallet's preimage is checked against the hash.
    fn paid(&self, offer: &Offer, details: &OfferDetails, preimage: &str) -> RailResult<Payment> {
        // A wallet that says "paid" without the preimage is not believed.
        if !preimage_matches(preimage, &details.payment_hash) {
            return Err(RailError::Rail {
                reason: RailReason::new(
                    "preimage_mismatch",
                    "the wallet's preimage does not hash to the payment hash",
                ),
                retryable: false,
            });
        }
        self.proof(
            offer,
            details,
            PaymentMode::Capture,
            Some(preimage.to_ascii_lowercase()),
        )
    }

    fn proof(
        &self,
        offer: &Offer,
        details: &OfferDetails,
        mode: PaymentMode,
        preimage: Option<String>,
    ) -> RailResult<Payment> {
        glue::payment(
            RAIL,
            offer,
            mode,
            self.client.pubkey(),
            &NwcProof {
                payment_hash: details.payment_hash.clone(),
                preimage,
            },
        )
    }
}

#[async_trait]
impl Payer for NwcPayer {
    async fn pay(&self, _op: &OpId, offer: &Offer) -> RailResult<Payment> {
        let (details, _) = self.check(offer, PaymentMode::Capture)?;
        let _serial = self.lock.lock().await;
        offer.check_live(self.clock.now())?;
        let paid = match self.client.pay_invoice(&details.invoice, None).await {
            Ok(p) => p.preimage,
            // The answer was lost (a timeout, a relay drop): the payment may have gone through.
            // Ask the wallet before failing, so a retry does not pay twice or lose the proof.
            Err(e @ (NwcError::Timeout { .. } | NwcError::Relay(_))) => {
                match self.client.lookup_invoice(&details.payment_hash).await {
                    Ok(tx) if tx.state == Some(TxState::Settled) => tx.preimage.unwrap_or_default(),
                    // The wallet never saw the payment: the request was lost (a relay passes
                    // a request only to the subscriptions it has at that instant), and it has
                    // expired (its NIP-40 expiration is the call's timeout: it is not run
                    // late). Asked once more, now that the relays are back.
                    Err(NwcError::Wallet {
                        code: ErrorCode::NotFound,
                        ..
                    }) => {
                        offer.check_live(self.clock.now())?;
                        tracing::info!(payment_hash = %details.payment_hash, "ln-nwc: the wallet never saw the payment; asking again");
                        self.pay_again(&details).await?
                    }
                    _ => return Err(rail_error(&e)),
                }
            }
            Err(e) => return Err(rail_error(&e)),
        };
        self.paid(offer, &details, &paid)
    }
}

impl NwcPayer {
    /// The second and last `pay_invoice` of [`Payer::pay`], after the wallet said it never saw
    /// the first. Whatever goes wrong is looked up before it is believed: a first request that
    /// reached the wallet after all makes the second fail ("already paid", "in flight") while
    /// it pays — paid, that is the preimage; in flight, the outcome is unknown (retryable: the
    /// operation stays held for the next attempt), never a refusal.
    async fn pay_again(&self, details: &OfferDetails) -> RailResult<String> {
        let e = match self.client.pay_invoice(&details.invoice, None).await {
            Ok(p) => return Ok(p.preimage),
            Err(e) => e,
        };
        match self.client.lookup_invoice(&details.payment_hash).await {
            Ok(tx) if tx.state == Some(TxState::Settled) => Ok(tx.preimage.unwrap_or_default()),
            Ok(tx) if matches!(tx.state, Some(TxState::Pending | TxState::Accepted)) => {
                Err(RailError::Unavailable(RailReason::new(
                    "payment_in_flight",
                    "the wallet reports the payment in flight; retry later",
                )))
            }
            _ => Err(rail_error(&e)),
        }
    }
}

#[async_trait]
impl HoldPayer for NwcPayer {
    async fn hold(&self, _op: &OpId, offer: &Offer) -> RailResult<Payment> {
        let (details, _) = self.check(offer, PaymentMode::Hold)?;
        let _serial = self.lock.lock().await;
        offer.check_live(self.clock.now())?;
        // The wallet answers a hold payment only when the receiver settles or cancels: send it
        // and let it finish in the background.
        let client = self.client.clone();
        let (invoice, hash) = (details.invoice.clone(), details.payment_hash.clone());
        tokio::spawn(async move {
            match client.pay_invoice(&invoice, None).await {
                Ok(p) if preimage_matches(&p.preimage, &hash) => {
                    tracing::info!(payment_hash = %hash, "ln-nwc: hold settled");
                }
                Ok(_) => {
                    tracing::warn!(payment_hash = %hash, "ln-nwc: hold answered with a wrong preimage");
                }
                Err(e) => {
                    tracing::info!(payment_hash = %hash, error = %e, "ln-nwc: hold ended without settlement");
                }
            }
        });
        self.proof(offer, &details, PaymentMode::Hold, None)
    }
}

/// An earlier attempt whose outcome is unknown is looked up in the wallet: a paid invoice is
/// returned with its preimage (even past the offer's time), a held one as the hold it is; an
/// invoice the wallet never paid is paid now.
#[async_trait]
impl rail_core::payer::FindPayment for NwcPayer {
    async fn find_payment(
        &self,
        _op: &OpId,
        offer: &Offer,
        mode: PaymentMode,
    ) -> RailResult<Option<Payment>> {
        let (details, _) = self.check_at(offer, mode, false)?;
        let tx = match self.client.lookup_invoice(&details.payment_hash).await {
            Ok(tx) => tx,
            Err(NwcError::Wallet {
                code: ErrorCode::NotFound,
                ..
            }) => return Ok(None),
            Err(e) => return Err(rail_error(&e)),
        };
        match (mode, tx.state) {
            (PaymentMode::Capture, Some(TxState::Settled)) => self
                .paid(offer, &details, tx.preimage.as_deref().unwrap_or_default())
                .map(Some),
            (PaymentMode::Hold, Some(TxState::Accepted | TxState::Settled)) => self
                .proof(offer, &details, PaymentMode::Hold, None)
                .map(Some),
            // Over for certain: nothing moved, pay now.
            (_, Some(TxState::Failed | TxState::Expired)) => Ok(None),
            // Still in flight (or a state this version does not know): cannot tell yet, so the
            // operation stays held for the next attempt rather than paying a second time.
            (_, state) => Err(RailError::Unavailable(RailReason::new(
                "payment_in_flight",
                format!("the wallet reports the earlier payment as {state:?}; retry later"),
            ))),
        }
    }
}
