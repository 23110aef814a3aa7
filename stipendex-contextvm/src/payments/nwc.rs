//! `bitcoin-lightning-bolt11` through this project's `ln-nwc` rail: [`NwcProcessor`] makes each
//! payment request an invoice of the server's own wallet ([`NwcReceiver`]'s offer) and sees it
//! paid by that wallet — its `payment_received` notification, else `lookup_invoice` — never by
//! the payer's word (CEP-8 clients do not send the preimage). The preimage the wallet reports is
//! then checked by the rail's own `verify`: SHA-256 of the preimage is the invoice's payment
//! hash (constant time), the wallet's record is settled for the amount, the offer was live, and
//! the payment hash is marked used once in the rail's single-use store — so the same payment
//! never admits two requests, even across server instances sharing that store.
//!
//! A payment that arrives after the request's TTL is refused: the invoice's own expiry is the
//! TTL, so a wallet will not pay it late, and the rail's `verify` refuses a settlement after the
//! offer's end. Lightning cannot give a late payment back without an invoice from the payer,
//! which CEP-8 does not carry; the invoice's expiry is what prevents it.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rail_core::{Asset, Charge, Money, Offer, Payment, PaymentMode, RailReceiver as _};
use rail_ln_nwc::client::NwcClient;
use rail_ln_nwc::nip47::{Notification, TxState};
use rail_ln_nwc::rail::{NwcReceiver, OfferDetails};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::notify::{PMI_BOLT11, PaymentRequired};
use super::server::{Deadline, Pending, Processor};
use crate::Error;
use crate::transport::server::Held;

/// How often the wallet is asked when no notification came.
const POLL: Duration = Duration::from_millis(1500);
/// How long one look-up may take before it is asked again.
const LOOKUP_BOUND: Duration = Duration::from_secs(3);

/// The processor of `bitcoin-lightning-bolt11` (see the module's documentation).
#[derive(Clone, Debug)]
pub struct NwcProcessor {
    receiver: NwcReceiver,
    client: Arc<NwcClient>,
    poll: Duration,
}

#[derive(Serialize, Deserialize)]
struct State {
    offer: Offer,
    client: String,
}

fn payment_err(e: impl std::fmt::Display) -> Error {
    Error::Payment(e.to_string())
}

impl NwcProcessor {
    /// Paid into the wallet `receiver` makes invoices of, watched through `client` (the same
    /// NWC connection).
    #[must_use]
    pub fn new(receiver: NwcReceiver, client: Arc<NwcClient>) -> Self {
        NwcProcessor {
            receiver,
            client,
            poll: POLL,
        }
    }

    /// How often the wallet is asked when no notification came (default 1.5 s, the SDK's).
    #[must_use]
    pub fn poll(mut self, every: Duration) -> Self {
        self.poll = every;
        self
    }

    /// The preimage the wallet reports for `hash`, once it says the invoice is settled. A
    /// look-up that fails for a passing reason (no answer in time, a relay down, the invoice
    /// not found yet) is asked again until the deadline: a relay restart mid-payment never turns
    /// a paid invoice into a refusal. When the server withdraws the payment request, one last
    /// look-up is made (a payment made just before is still accepted), then the wait ends.
    async fn settled(&self, hash: &str, deadline: &Deadline) -> Result<String, Error> {
        let mut notes = self.client.notifications();
        let end = deadline.instant();
        loop {
            if Instant::now() >= end {
                return Err(Error::Payment("not paid in time".into()));
            }
            let last = deadline.released();
            // One look-up at a time, bounded (a request lost in a relay restart is asked again
            // soon), raced with the wallet's notification.
            let bound = (Instant::now() + LOOKUP_BOUND).min(end);
            let lookup = tokio::time::timeout_at(bound, self.client.lookup_invoice(hash));
            let found = tokio::select! {
                r = lookup => r,
                p = received(&mut notes, hash) => return Ok(p),
            };
            match found {
                Err(_) => {
                    tracing::debug!("contextvm nwc: look-up unanswered; asking again");
                }
                Ok(Ok(tx)) => match tx.state {
                    Some(TxState::Settled) => {
                        if let Some(p) = tx.preimage {
                            return Ok(p);
                        }
                    }
                    Some(TxState::Expired | TxState::Failed) => {
                        return Err(Error::Payment(format!("the invoice is {:?}", tx.state)));
                    }
                    _ => {}
                },
                Ok(Err(e)) if e.is_retryable() || e.code() == "NOT_FOUND" => {
                    tracing::debug!(error = %e, "contextvm nwc: look-up failed; asking again");
                }
                Ok(Err(e)) => return Err(payment_err(e)),
            }
            if last {
                return Err(Error::Payment(
                    "the payment request was withdrawn before it was paid".into(),
                ));
            }
            let next = (Instant::now() + self.poll).min(end);
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = deadline.withdrawn() => {}
                p = received(&mut notes, hash) => return Ok(p),
            }
        }
    }
}

/// The preimage of the first `payment_received` notification for `hash` (pending forever when
/// the notifications end: the look-ups go on).
async fn received(
    notes: &mut tokio::sync::broadcast::Receiver<Notification>,
    hash: &str,
) -> String {
    loop {
        match notes.recv().await {
            Ok(n)
                if n.notification_type == "payment_received"
                    && n.notification.get("payment_hash").and_then(Value::as_str) == Some(hash) =>
            {
                if let Some(p) = n.notification.get("preimage").and_then(Value::as_str) {
                    return p.to_owned();
                }
            }
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => std::future::pending::<()>().await,
        }
    }
}

#[async_trait]
impl Processor for NwcProcessor {
    fn pmi(&self) -> &str {
        PMI_BOLT11
    }

    fn unit(&self) -> &str {
        "sats"
    }

    fn amount(&self, price: &Money) -> Result<u64, Error> {
        if *price.asset() != Asset::btc() {
            return Err(Error::Refused(format!(
                "{PMI_BOLT11} is paid in BTC, not {}",
                price.asset()
            )));
        }
        let sats = price
            .to_scale(8)
            .map_err(|e| Error::Refused(format!("{price:?} in whole satoshis: {e}")))?;
        u64::try_from(sats).map_err(|e| Error::Refused(e.to_string()))
    }

    async fn require(
        &self,
        price: &Money,
        description: Option<&str>,
        ttl: Duration,
        held: &Held,
    ) -> Result<Pending, Error> {
        let amount = self.amount(price)?;
        let mut charge = Charge::capture(price.clone(), ttl);
        charge.description = description.unwrap_or_default().to_owned();
        charge.reference = Some(held.event_id.to_hex());
        let offer = self.receiver.offer(&charge).await.map_err(payment_err)?;
        let details: OfferDetails = offer.details_as().map_err(payment_err)?;
        Ok(Pending {
            required: PaymentRequired {
                amount,
                pay_req: details.invoice,
                pmi: PMI_BOLT11.to_owned(),
                description: description.map(str::to_owned),
                ttl: Some(ttl.as_secs().max(1)),
                meta: None,
            },
            state: serde_json::to_value(State {
                offer,
                client: held.client.to_hex(),
            })
            .map_err(payment_err)?,
        })
    }

    async fn verify(
        &self,
        pending: &Pending,
        deadline: &Deadline,
    ) -> Result<Option<Map<String, Value>>, Error> {
        let state: State = serde_json::from_value(pending.state.clone()).map_err(payment_err)?;
        let details: OfferDetails = state.offer.details_as().map_err(payment_err)?;
        let preimage = self.settled(&details.payment_hash, deadline).await?;
        let payment = Payment {
            rail: state.offer.rail.clone(),
            offer_id: state.offer.id.clone(),
            mode: PaymentMode::Capture,
            payer: state.client,
            amount: state.offer.amount.clone(),
            proof: json!({"payment_hash": details.payment_hash, "preimage": preimage}),
        };
        self.receiver
            .verify(&state.offer, &payment)
            .await
            .map_err(payment_err)?;
        let mut meta = Map::new();
        meta.insert("payment_hash".into(), Value::String(details.payment_hash));
        Ok(Some(meta))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use lightning_invoice::Currency;
    use nwc_devnet::{Devnet, DevnetConfig, WalletSpec};
    use rail_core::{OpId, Payer as _, SystemClock};
    use rail_ln_nwc::client::ClientOptions;
    use rail_ln_nwc::rail::NwcPayer;

    use super::*;
    use crate::payments::client::offer_of;
    use crate::transport::client::PaidRequest;

    async fn wallet(devnet: &Devnet, name: &str, msat: u64) -> Arc<NwcClient> {
        let w = devnet
            .create_wallet(WalletSpec::new(name, msat))
            .await
            .unwrap();
        Arc::new(
            NwcClient::connect(&w.uri, ClientOptions::default())
                .await
                .unwrap(),
        )
    }

    /// A payment request withdrawn by the server (replaced, or the server full) stops being
    /// waited for at once — but a payment already made for it is still seen and accepted.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_withdrawn_payment_request_is_not_waited_for_but_a_payment_made_is_accepted() {
        let devnet = Devnet::start(DevnetConfig::default()).await.unwrap();
        let shop = wallet(&devnet, "shop", 0).await;
        let agent = wallet(&devnet, "agent", 1_000_000).await;
        let receiver = NwcReceiver::new(
            shop.clone(),
            [7; 32],
            Arc::new(rail_core::MemoryKeyStore::default()),
            Arc::new(SystemClock),
        )
        .await
        .unwrap();
        let processor = NwcProcessor::new(receiver, shop);
        let held = Held {
            client: nostr::Keys::generate().public_key(),
            pmis: Vec::new(),
            event_id: nostr::EventId::all_zeros(),
            interaction: None,
            message: json!({}),
            hold: 0,
        };
        let price = Money::from_minor(Asset::btc(), 10_000).unwrap();
        let far = Instant::now() + Duration::from_secs(60);
        let withdrawn = || {
            let (tx, rx) = tokio::sync::watch::channel(false);
            tx.send(true).unwrap();
            Deadline::new(far, rx)
        };

        // Unpaid: the wait ends at once, not at the deadline a minute away.
        let unpaid = processor
            .require(&price, None, Duration::from_secs(60), &held)
            .await
            .unwrap();
        let started = Instant::now();
        assert!(processor.verify(&unpaid, &withdrawn()).await.is_err());
        assert!(started.elapsed() < Duration::from_secs(10));

        // Paid just before it was withdrawn: accepted.
        let paid = processor
            .require(&price, None, Duration::from_secs(60), &held)
            .await
            .unwrap();
        let request = PaidRequest {
            server: nostr::Keys::generate().public_key(),
            event_id: nostr::EventId::all_zeros(),
            message: json!({}),
        };
        let payer = NwcPayer::new(
            agent,
            Currency::Regtest,
            Money::from_minor(Asset::btc(), 1_000_000).unwrap(),
            Arc::new(SystemClock),
        );
        let offer = offer_of(&paid.required, &request).unwrap();
        payer
            .pay(&OpId::new("withdrawn-paid").unwrap(), &offer)
            .await
            .unwrap();
        let meta = processor
            .verify(&paid, &withdrawn())
            .await
            .unwrap()
            .unwrap();
        assert!(meta.contains_key("payment_hash"));
    }
}
