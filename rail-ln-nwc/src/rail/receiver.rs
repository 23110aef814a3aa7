//! The receiver side: [`NwcReceiver`] makes invoices (hold invoices for a hold) whose preimage
//! it derives, verifies a payment by its preimage and the wallet's look-up, and settles or
//! cancels a hold.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rail_core::keys::KeyStore;
use rail_core::{
    Asset, Binding, Capabilities, Captured, Charge, HoldReceiver, Idempotency, Money, Offer, OpId,
    Payment, PaymentMode, PaymentState, Rail, RailError, RailId, RailReason, RailReceiver,
    RailResult, ReplayGuard, SharedClock, Verified, Voided, glue,
};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{NwcProof, OfferDetails, RAIL, capabilities, msat, preimage_matches, rail_error};
use crate::client::NwcClient;
use crate::nip47::{MakeHoldInvoiceParams, MakeInvoiceParams, TxState};

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The receiver.
#[derive(Clone)]
pub struct NwcReceiver {
    client: Arc<NwcClient>,
    node: String,
    seed: [u8; 32],
    guard: ReplayGuard,
    idem: Idempotency,
    clock: SharedClock,
    settle_wait: Duration,
}

impl std::fmt::Debug for NwcReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NwcReceiver")
            .field("node", &self.node)
            .field("seed", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl NwcReceiver {
    /// A receiver paid into the wallet behind `client`. `seed` derives hold preimages (keep it
    /// secret and stable); `store` keeps single-use marks: share it between instances.
    ///
    /// # Errors
    /// The wallet's `get_info` failing.
    pub async fn new(
        client: Arc<NwcClient>,
        seed: [u8; 32],
        store: Arc<dyn KeyStore>,
        clock: SharedClock,
    ) -> RailResult<Self> {
        let info = client.get_info().await.map_err(|e| rail_error(&e))?;
        Ok(NwcReceiver {
            client,
            node: info.pubkey.to_ascii_lowercase(),
            seed,
            guard: ReplayGuard::new(store.clone(), "ln-nwc/verified"),
            idem: Idempotency::new(store, "ln-nwc/receiver")
                .with_windows(Duration::from_secs(60), Duration::from_secs(24 * 3600)),
            clock,
            settle_wait: Duration::from_secs(10),
        })
    }

    /// The wallet's node public key (hex): the offers' payee.
    #[must_use]
    pub fn node(&self) -> &str {
        &self.node
    }

    fn preimage(&self, offer_id: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"stipendex ln-nwc hold preimage");
        h.update(self.seed);
        h.update(offer_id.as_bytes());
        h.finalize().into()
    }

    /// For a hold offer refused as expired: if the payer's wallet accepted its HTLC (waiting
    /// up to the settle wait for it) and it was not verified in time, cancels the hold
    /// invoice so the payer's funds are released at once. A plain invoice paid late cannot be
    /// given back (Lightning needs an invoice from the payer for that).
    async fn release_expired_hold(&self, offer: &Offer) {
        if offer.mode != PaymentMode::Hold || offer.payee != self.node {
            return;
        }
        let Ok(details) = offer.details_as::<OfferDetails>() else {
            return;
        };
        if details.payment_hash != self.hold_hash(&offer.id) {
            return;
        }
        if !matches!(self.guard.state(&details.payment_hash).await, Ok(None)) {
            return;
        }
        let deadline = tokio::time::Instant::now() + self.settle_wait;
        loop {
            match self.lookup(&details.payment_hash).await.map(|t| t.state) {
                Ok(Some(TxState::Accepted)) => break,
                Ok(Some(TxState::Pending) | None) if tokio::time::Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => return,
            }
        }
        match self.client.cancel_hold_invoice(&details.payment_hash).await {
            Ok(()) => {
                tracing::info!(hash = %details.payment_hash, "nwc: expired offer's hold released");
            }
            Err(e) => {
                tracing::warn!(hash = %details.payment_hash, error = %e, "nwc: could not release an expired offer's hold");
            }
        }
    }

    /// The payment hash of this receiver's hold for `offer_id`.
    fn hold_hash(&self, offer_id: &str) -> String {
        sha256_hex(&self.preimage(offer_id))
    }

    async fn lookup(&self, hash: &str) -> RailResult<crate::nip47::Transaction> {
        self.client
            .lookup_invoice(hash)
            .await
            .map_err(|e| rail_error(&e))
    }
}

impl Rail for NwcReceiver {
    fn id(&self) -> RailId {
        RailId::new(RAIL)
    }
    fn capabilities(&self) -> Capabilities {
        capabilities()
    }
}

#[async_trait]
impl RailReceiver for NwcReceiver {
    /// Every offer is an object at the processor or the wallet: quoting is rate-limited.
    fn offers_cost(&self) -> bool {
        true
    }

    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        let amount = msat(&charge.amount)?;
        if amount == 0 {
            return Err(RailError::InvalidInput("a zero-amount invoice".into()));
        }
        let offer_id = format!("off_{}", hex::encode(rand::random::<[u8; 12]>()));
        let expiry = Some(charge.ttl.as_secs().max(1));
        let description = Some(if charge.description.is_empty() {
            format!("stipendex {offer_id}")
        } else {
            charge.description.clone()
        });
        let tx = match charge.mode {
            PaymentMode::Capture => self
                .client
                .make_invoice(&MakeInvoiceParams {
                    amount,
                    description,
                    expiry,
                })
                .await
                .map_err(|e| rail_error(&e))?,
            PaymentMode::Hold => self
                .client
                .make_hold_invoice(&MakeHoldInvoiceParams {
                    amount,
                    payment_hash: self.hold_hash(&offer_id),
                    description,
                    expiry,
                    min_cltv_expiry_delta: None,
                })
                .await
                .map_err(|e| rail_error(&e))?,
        };
        let invoice = tx.invoice.ok_or_else(|| RailError::Rail {
            reason: RailReason::new("nwc", "the wallet returned no invoice"),
            retryable: false,
        })?;
        glue::offer(
            RAIL,
            offer_id,
            charge,
            self.node.clone(),
            self.clock.now().plus(charge.ttl),
            &OfferDetails {
                invoice,
                payment_hash: tx.payment_hash.to_ascii_lowercase(),
            },
        )
    }

    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        self.check(offer, payment, false).await
    }

    /// A settled invoice whose wallet reports it settled while the offer was live
    /// (`settled_at`, to the second NIP-47 gives) is verified after the offer's end, within
    /// [`rail_core::LATE_PROOF_GRACE`]; the payment hash's mark still refuses a replay. A hold
    /// is never verified late (it is released instead).
    async fn verify_as(
        &self,
        _op: &OpId,
        offer: &Offer,
        payment: &Payment,
    ) -> RailResult<Verified> {
        self.check(offer, payment, offer.mode == PaymentMode::Capture)
            .await
    }
}

impl NwcReceiver {
    async fn check(&self, offer: &Offer, payment: &Payment, late: bool) -> RailResult<Verified> {
        payment.check_envelope(offer)?;
        if late {
            // Judged below, by when the invoice was settled.
        } else if let Err(expired) = offer.check_live(self.clock.now()) {
            // Refused; a hold the payer's wallet accepted for this offer is released now
            // rather than left locked until the invoice's own expiry.
            self.release_expired_hold(offer).await;
            return Err(expired);
        }
        if offer.payee != self.node {
            return Err(RailError::mismatch(
                Binding::Payee,
                &self.node,
                &offer.payee,
            ));
        }
        // Lightning does not say who paid: the payer field can only be checked for shape (a
        // NWC client's public key).
        if payment.payer.len() != 64 || !payment.payer.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(RailError::MalformedPayment(
                "payer is not a NWC client public key".into(),
            ));
        }
        let proof: NwcProof = payment.proof_as()?;
        let details: OfferDetails = offer.details_as()?;
        if !bool::from(
            proof
                .payment_hash
                .as_bytes()
                .ct_eq(details.payment_hash.as_bytes()),
        ) {
            return Err(RailError::mismatch(
                Binding::Offer,
                &details.payment_hash,
                &proof.payment_hash,
            ));
        }
        let want = msat(&offer.amount)?;
        let state = match offer.mode {
            PaymentMode::Capture => {
                // The preimage is the proof; the wallet's word alone is not.
                let preimage = proof
                    .preimage
                    .as_deref()
                    .ok_or_else(|| RailError::MalformedPayment("no preimage".into()))?;
                if !preimage_matches(preimage, &details.payment_hash) {
                    return Err(RailError::BadSignature(
                        "the preimage does not hash to the invoice's payment hash".into(),
                    ));
                }
                let tx = self.lookup(&details.payment_hash).await?;
                if tx.amount != want {
                    return Err(RailError::mismatch(Binding::Amount, want, tx.amount));
                }
                if tx.state.as_ref().is_some_and(|s| *s != TxState::Settled) {
                    return Err(RailError::InvalidState {
                        op: "verify",
                        state: format!("invoice {:?} for {} msat", tx.state, tx.amount),
                    });
                }
                if late {
                    // Without `settled_at` the wallet does not say the payment was in time.
                    let settled = tx
                        .settled_at
                        .and_then(|s| i64::try_from(s).ok())
                        .map_or(offer.expires_at, |s| {
                            rail_core::Timestamp(s.saturating_mul(1000))
                        });
                    offer.check_paid_in_time(settled, self.clock.now())?;
                }
                PaymentState::Settled
            }
            PaymentMode::Hold => {
                if details.payment_hash != self.hold_hash(&offer.id) {
                    return Err(RailError::NotFound(format!(
                        "hold {} of this receiver",
                        details.payment_hash
                    )));
                }
                // The payer's pay_invoice is in flight; wait for the wallet to hold the HTLC.
                let deadline = tokio::time::Instant::now() + self.settle_wait;
                loop {
                    let tx = self.lookup(&details.payment_hash).await?;
                    match tx.state {
                        Some(TxState::Accepted) if tx.amount == want => break,
                        Some(TxState::Accepted) => {
                            return Err(RailError::mismatch(Binding::Amount, want, tx.amount));
                        }
                        Some(TxState::Pending) | None if tokio::time::Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        other => {
                            return Err(RailError::InvalidState {
                                op: "verify",
                                state: format!("hold invoice {other:?} for {} msat", tx.amount),
                            });
                        }
                    }
                }
                PaymentState::Held {
                    capturable: offer.amount.clone(),
                    expires_at: Some(offer.expires_at),
                }
            }
        };
        // Single use for as long as the payment could be presented: after the offer's life it
        // is refused as expired. A hold's mark outlives any HTLC it could stand for (the longest
        // CLTV a route may carry, 2016 blocks, about 14 days): a late replay must never make
        // `release_expired_hold` cancel a hold that was verified in time.
        let margin = match offer.mode {
            PaymentMode::Capture => MARK_MARGIN,
            PaymentMode::Hold => HOLD_MARK_MARGIN,
        };
        self.guard
            .reserve(&details.payment_hash, Duration::from_secs(30))
            .await?
            .commit(Some(offer.retention(self.clock.now(), margin)))
            .await?;
        Ok(glue::verified(
            RAIL,
            offer,
            details.payment_hash,
            payment.payer.clone(),
            offer.amount.clone(),
            state,
        ))
    }
}

#[async_trait]
impl HoldReceiver for NwcReceiver {
    async fn capture(&self, op: &OpId, held: &Verified, amount: &Money) -> RailResult<Captured> {
        if held.payment_ref != self.hold_hash(&held.offer_id) {
            return Err(RailError::NotFound(format!("hold {}", held.payment_ref)));
        }
        if amount != &held.amount {
            return Err(if amount.minor_units() > held.amount.minor_units() {
                RailError::ExceedsAvailable {
                    op: "capture",
                    requested: amount.amount(),
                    available: held.amount.amount(),
                }
            } else {
                RailError::InvalidInput(
                    "Lightning settles a held HTLC in full: partial capture is not possible".into(),
                )
            });
        }
        let content = ("capture", &held.payment_ref, amount.to_string());
        self.idem
            // Settling or cancelling a hold again is how a recovering attempt finds out (the
            // wallet answers what the hold became).
            .run(op, &content, |_| async {
                let tx = self.lookup(&held.payment_ref).await?;
                match tx.state {
                    Some(TxState::Accepted) => {}
                    // Only this receiver knows the preimage: a settled hold is its own earlier
                    // capture whose answer was lost.
                    Some(TxState::Settled) => {
                        return Ok(Captured {
                            payment_ref: held.payment_ref.clone(),
                            capture_ref: held.payment_ref.clone(),
                            captured: held.amount.clone(),
                            released: Money::zero(Asset::btc()),
                        });
                    }
                    other => {
                        return Err(RailError::InvalidState {
                            op: "capture",
                            state: format!("hold invoice is {other:?}"),
                        });
                    }
                }
                self.client
                    .settle_hold_invoice(&hex::encode(self.preimage(&held.offer_id)))
                    .await
                    .map_err(|e| rail_error(&e))?;
                Ok(Captured {
                    payment_ref: held.payment_ref.clone(),
                    capture_ref: held.payment_ref.clone(),
                    captured: held.amount.clone(),
                    released: Money::zero(Asset::btc()),
                })
            })
            .await
    }

    async fn void(&self, op: &OpId, held: &Verified) -> RailResult<Voided> {
        if held.payment_ref != self.hold_hash(&held.offer_id) {
            return Err(RailError::NotFound(format!("hold {}", held.payment_ref)));
        }
        let content = ("void", &held.payment_ref);
        self.idem
            // Settling or cancelling a hold again is how a recovering attempt finds out (the
            // wallet answers what the hold became).
            .run(op, &content, |_| async {
                let tx = self.lookup(&held.payment_ref).await?;
                if tx.state != Some(TxState::Accepted) {
                    return Err(RailError::InvalidState {
                        op: "void",
                        state: format!("hold invoice is {:?}", tx.state),
                    });
                }
                self.client
                    .cancel_hold_invoice(&held.payment_ref)
                    .await
                    .map_err(|e| rail_error(&e))?;
                Ok(Voided {
                    payment_ref: held.payment_ref.clone(),
                    released: held.amount.clone(),
                })
            })
            .await
    }
}

/// How long past its offer's life a verified payment's single-use mark is kept.
pub const MARK_MARGIN: Duration = Duration::from_secs(24 * 3600);
/// The same for a hold: longer than any HTLC can be held (2016 blocks ≈ 14 days), plus a day.
pub const HOLD_MARK_MARGIN: Duration = Duration::from_secs(15 * 24 * 3600);
