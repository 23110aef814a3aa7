//! The wallet's engine: one way in for every demand a binding reads off the wire, and one way
//! out for what came back — the twin of the receiver's [`crate::receiver::Receiver::serve`].
//!
//! A binding (the HTTP client, the MCP client, ContextVM's client) only parses and encodes: it
//! reads a [`Demand`] from the receiver's answer (a Quote, perhaps with a tab beside it; an x402
//! challenge; a CEP-8 offer), hands it to [`Wallet::settle_demand`], sends the [`Settlement`]
//! back in its own encoding, and tells the wallet what came back ([`Wallet::proof_reply`]). A
//! call inside an open tab is paid by [`Wallet::voucher`] and its answer told to
//! [`Wallet::voucher_reply`]. The steps —
//! allowlist, mandate, limits, confirmation, rail, audit chain, and after the answer the
//! Receipt's check, the kept Proof, the tab's lane — are the wallet's, each written once.

use serde_json::Value;

use super::{Confirmer, Paid, TabHold, TabVoucher, Wallet};
use crate::Error;
use crate::envelope::{Digest, Receipt, Resource, Signed, Tab};
use rail_core::Offer;

/// A demand for payment, as a binding read it.
#[derive(Debug)]
#[non_exhaustive]
pub enum Demand<'a> {
    /// A signed Quote that came back for the request `sent`, and the tab the receiver offered
    /// beside it (as it came: it is read here, and an unreadable one is ignored).
    Quote {
        /// The Quote.
        quote: &'a Signed<crate::envelope::Quote>,
        /// The request that got it (origin, method, path and query).
        sent: &'a Resource,
        /// A tab offered beside the Quote.
        tab: Option<&'a Value>,
    },
    /// An unsigned x402 challenge from `source`.
    #[cfg(feature = "challenges")]
    Challenge {
        /// Where it came from.
        source: &'a super::Source,
        /// The payment requirement.
        required: &'a super::Required,
    },
    /// A ContextVM server's CEP-8 payment request (`server`: its Nostr key, hex) as a rail
    /// offer, with the request's params as seen (`entry`).
    Offer {
        /// The server.
        server: &'a str,
        /// The offer.
        offer: &'a Offer,
        /// The CEP-8 params, recorded as seen.
        entry: Value,
    },
}

/// What the wallet gives a binding to send back for a [`Demand`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Settlement {
    /// The Quote paid: present the Proof ([`Paid::proof`]) with the request again.
    Proof(Box<Paid>),
    /// The tab offered beside the Quote, opened: the call goes by its first voucher
    /// ([`Wallet::voucher`]) with the tab's hold Proof.
    Tab(TabHold),
    /// The x402 challenge signed: send the payment with the request again.
    #[cfg(feature = "challenges")]
    X402(Box<super::ChallengePaid>),
    /// The CEP-8 offer paid on its rail.
    Offer(Box<super::OfferPaid>),
}

impl Settlement {
    /// The error a binding returns for a settlement of a demand it never makes (a CEP-8 offer
    /// over HTTP): a bug of the binding, never the receiver's doing; nothing is sent.
    #[must_use]
    pub fn unexpected(&self) -> Error {
        let what = match self {
            Settlement::Proof(_) => "a Quote's Proof",
            Settlement::Tab(_) => "an opened tab",
            #[cfg(feature = "challenges")]
            Settlement::X402(_) => "an x402 payment",
            Settlement::Offer(_) => "a CEP-8 offer's payment",
        };
        Error::Mismatch(format!(
            "the wallet settled {what} for a demand this binding does not make"
        ))
    }
}

/// What came back for a request presented with a Proof, as the binding read it.
#[derive(Clone, Copy, Debug)]
pub enum Reply<'a> {
    /// No answer the wallet can keep: a transport failure, an answer that broke off, or one
    /// that may not be the receiver's (an HTTP server error without a Receipt). The payment
    /// is kept with its Proof, which the same request asked again presents at once.
    Lost,
    /// The receiver refused the Proof: the payment is no longer kept for this request.
    Refused,
    /// An answer without a Receipt: the receiver's, kept by it as this Proof's answer.
    Unreceipted,
    /// An answer with its Receipt (a compact JWS), over the delivered bytes (`len` of them,
    /// digest `digest`).
    Receipted {
        /// The Receipt.
        receipt: &'a str,
        /// The digest of the bytes delivered.
        digest: &'a Digest,
        /// How many bytes were delivered.
        len: u64,
    },
}

/// What came back for a call paid by a voucher, as the binding read it.
#[derive(Clone, Copy, Debug)]
pub enum VoucherReply<'a> {
    /// The receiver did not count the voucher (refused or waived by its price hook, or the
    /// call never reached the service): the lane is given back.
    Uncounted,
    /// The call's result, `result` its digest; `named` is whether the receiver's tab-call
    /// answer names this voucher and this result (a mismatch is logged, the result kept).
    Counted {
        /// The digest of the result received.
        result: &'a Digest,
        /// Whether the receiver's answer names this voucher and result.
        named: bool,
    },
}

impl Wallet {
    /// The wallet's one way in: settles `demand` under the mandate, asking `confirmer` where a
    /// confirmation is needed and telling it of a denial (a binding passes the wallet's own,
    /// [`Wallet::confirmer`], or its call's).
    ///
    /// A Quote with a tab beside it opens the tab where the mandate has a tab policy in its
    /// asset and the wallet will open it ([`Settlement::Tab`]); otherwise — or when the tab
    /// cannot be read or opened — the Quote is paid ([`Wallet::pay_sent`]).
    ///
    /// # Errors
    /// As [`Wallet::pay_sent`], [`Wallet::pay_challenge`] and
    /// [`Wallet::pay_offer`].
    pub async fn settle_demand(
        &self,
        demand: Demand<'_>,
        confirmer: &dyn Confirmer,
    ) -> Result<Settlement, Error> {
        match demand {
            Demand::Quote { quote, sent, tab } => {
                if let Some(tab) = tab
                    && let Some(hold) = self.open_offered(tab, sent, confirmer).await
                {
                    return Ok(Settlement::Tab(hold));
                }
                Box::pin(self.pay_sent(quote, sent, confirmer))
                    .await
                    .map(|paid| Settlement::Proof(Box::new(paid)))
            }
            #[cfg(feature = "challenges")]
            Demand::Challenge { source, required } => self
                .challenge_with(source, required, confirmer)
                .await
                .map(|paid| Settlement::X402(Box::new(paid))),
            Demand::Offer {
                server,
                offer,
                entry,
            } => self
                .offer_with(server, offer, entry, confirmer)
                .await
                .map(|paid| Settlement::Offer(Box::new(paid))),
        }
    }

    /// The tab offered beside a Quote, opened; `None` (the Quote is paid instead) when it
    /// cannot be read or the wallet will not open it (no tab policy in its asset, too many
    /// open tabs, a cap above the policy…).
    async fn open_offered(
        &self,
        tab: &Value,
        sent: &Resource,
        confirmer: &dyn Confirmer,
    ) -> Option<TabHold> {
        let tab: Signed<Tab> = match serde_json::from_value(tab.clone()) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "the tab offered beside a quote cannot be read; paying the quote");
                return None;
            }
        };
        let allowed = self
            .mandate()
            .object()
            .limits_for(&tab.object().asset)
            .is_some_and(|l| l.tab_cap.is_some());
        if !allowed {
            return None;
        }
        match self.open_tab_with(&tab, sent, confirmer).await {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::info!(tab = %tab.object().id, error = %e, "not opening the tab offered; paying the quote");
                None
            }
        }
    }

    /// What came back for the request `paid` was presented with: a Receipt is checked against
    /// the bytes delivered and journaled (`Some`); the payment is kept for the same request
    /// asked again after a [`Reply::Lost`], and no longer after any other reply.
    ///
    /// # Errors
    /// The Receipt's check ([`Wallet::receipt_for_digest`]); a journal failure marking the
    /// payment answered is logged, not returned (the next request presents the same Proof,
    /// which the receiver answers with its kept answer or refuses).
    pub async fn proof_reply(
        &self,
        paid: &Paid,
        reply: Reply<'_>,
    ) -> Result<Option<Signed<Receipt>>, Error> {
        match reply {
            Reply::Lost => {
                self.unanswered_now(paid);
                Ok(None)
            }
            Reply::Refused | Reply::Unreceipted => {
                if let Err(e) = self.answered(paid).await {
                    tracing::warn!(error = %e, "could not mark a paid request answered");
                }
                Ok(None)
            }
            Reply::Receipted {
                receipt,
                digest,
                len,
            } => self
                .receipt_for_digest(paid, receipt, digest, len)
                .await
                .map(Some),
        }
    }

    /// What came back for the call `v` paid in `hold`: an uncounted voucher's lane is given
    /// back; a counted call's result is journaled in the tab's chain. Failures are logged: the
    /// lane then stays at `v` (the tab is retired at its next refusal), and a result not
    /// journaled leaves the chain without it.
    pub async fn voucher_reply(&self, hold: &TabHold, v: &TabVoucher, reply: VoucherReply<'_>) {
        let tab = &hold.tab().object().id;
        match reply {
            VoucherReply::Uncounted => {
                if let Err(e) = self.voucher_uncounted(v).await {
                    tracing::warn!(tab = %tab, error = %e, "could not give an uncounted voucher's lane back");
                }
            }
            VoucherReply::Counted { result, named } => {
                if !named {
                    tracing::warn!(tab = %tab, "the receiver's tab-call answer does not name this voucher and the result received");
                }
                if let Err(e) = self.tab_result(hold, &v.voucher, result).await {
                    tracing::warn!(tab = %tab, error = %e, "could not journal a call's result");
                }
            }
        }
    }
}
