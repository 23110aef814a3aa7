//! CEP-8 on the client: [`LightningHandler`] pays `bitcoin-lightning-bolt11` payment requests
//! with any `ln-nwc` payer of this project (an [`rail_ln_nwc::rail::NwcPayer`], wrapped as the
//! registry wraps it), so the invoice is checked before anything is paid — its signature, its
//! network, its amount equal to the `amount` the server named (in satoshis), not expired — and
//! the preimage the wallet returns is checked against its payment hash. The payer's own limit
//! (`max_amount`) bounds every payment. Paying under a Stipendex mandate (limits,
//! confirmations, the audit chain) is [`WalletHandler`]'s.

use std::sync::Arc;

use async_trait::async_trait;
use lightning_invoice::Bolt11Invoice;
use rail_core::{Asset, Money, Offer, OpId, Payer, PaymentMode, RailId, Timestamp};
use rail_ln_nwc::rail::{OfferDetails, RAIL};
use stipendex::wallet::{Demand, Settlement, Wallet};

use super::notify::{PMI_BOLT11, PaymentRequired};
use crate::transport::client::{PaidRequest, PaymentHook};

/// Pays BOLT11 payment requests through an `ln-nwc` payer (see the module's documentation).
pub struct LightningHandler {
    payer: Arc<dyn Payer>,
}

impl std::fmt::Debug for LightningHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LightningHandler").finish_non_exhaustive()
    }
}

impl LightningHandler {
    /// Pays with `payer` (an `ln-nwc` payer: it checks the invoice and the preimage).
    #[must_use]
    pub fn new(payer: Arc<dyn Payer>) -> Self {
        LightningHandler { payer }
    }
}

/// The `ln-nwc` offer a CEP-8 BOLT11 payment request stands for: the invoice's payee, payment
/// hash and expiry, at the amount the server named (satoshis).
///
/// # Errors
/// A sentence naming what is wrong: not a BOLT11 invoice, an amount that does not fit.
pub fn offer_of(required: &PaymentRequired, request: &PaidRequest) -> Result<Offer, String> {
    let invoice: Bolt11Invoice = required
        .pay_req
        .trim()
        .parse()
        .map_err(|e| format!("pay_req is not a BOLT11 invoice: {e}"))?;
    let msat = u128::from(required.amount)
        .checked_mul(1000)
        .ok_or_else(|| format!("amount {} sats does not fit", required.amount))?;
    let amount = Money::from_minor(Asset::btc(), msat)
        .map_err(|e| format!("amount {} sats: {e}", required.amount))?;
    let expires = invoice
        .expires_at()
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .map(Timestamp)
        .ok_or_else(|| "the invoice's expiry is out of range".to_owned())?;
    Ok(Offer {
        rail: RailId::new(RAIL),
        id: format!("cvm_{}", request.event_id.to_hex()),
        amount,
        payee: invoice.recover_payee_pub_key().to_string(),
        mode: PaymentMode::Capture,
        expires_at: expires,
        details: serde_json::json!(OfferDetails {
            invoice: required.pay_req.trim().to_owned(),
            payment_hash: invoice.payment_hash().to_string(),
        }),
    })
}

#[async_trait]
impl PaymentHook for LightningHandler {
    fn pmis(&self) -> Vec<String> {
        vec![PMI_BOLT11.to_owned()]
    }

    async fn pay(
        &self,
        request: &PaidRequest,
        required: &PaymentRequired,
    ) -> Result<Option<serde_json::Value>, String> {
        if required.pmi != PMI_BOLT11 {
            return Err(format!("{} is not {PMI_BOLT11}", required.pmi));
        }
        let offer = offer_of(required, request)?;
        // One payment per request event: a retried `pay` is the same operation.
        let op =
            OpId::new(format!("cvm-{}", request.event_id.to_hex())).map_err(|e| e.to_string())?;
        self.payer
            .pay(&op, &offer)
            .await
            .map(|_| None)
            .map_err(|e| e.to_string())
    }
}

/// Pays BOLT11 payment requests through a Stipendex [`Wallet`] under its mandate: the server
/// must be allowlisted by its Nostr key (`Allow::Contextvm`), the mandate's limits and
/// confirmation threshold apply, the wallet's `ln-nwc` rail pays (checking the invoice and the
/// preimage), and the audit chain records a Proof holding the payment request as the wallet saw
/// it. The same payment request asked again (a lost answer, a retried request) is the same
/// payment, never a second one ([`Wallet::pay_offer`]).
#[derive(Clone, Debug)]
pub struct WalletHandler {
    wallet: Wallet,
}

impl WalletHandler {
    /// Pays with `wallet`.
    #[must_use]
    pub fn new(wallet: Wallet) -> Self {
        WalletHandler { wallet }
    }
}

#[async_trait]
impl PaymentHook for WalletHandler {
    fn pmis(&self) -> Vec<String> {
        vec![PMI_BOLT11.to_owned()]
    }

    async fn pay(
        &self,
        request: &PaidRequest,
        required: &PaymentRequired,
    ) -> Result<Option<serde_json::Value>, String> {
        if required.pmi != PMI_BOLT11 {
            return Err(format!("{} is not {PMI_BOLT11}", required.pmi));
        }
        let offer = offer_of(required, request)?;
        let entry = serde_json::to_value(required).map_err(|e| e.to_string())?;
        let server = request.server.to_hex();
        let demand = Demand::Offer {
            server: &server,
            offer: &offer,
            entry,
        };
        match self
            .wallet
            .settle_demand(demand, self.wallet.confirmer())
            .await
        {
            Ok(Settlement::Offer(_)) => Ok(None),
            Ok(other) => Err(other.unexpected().to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}
