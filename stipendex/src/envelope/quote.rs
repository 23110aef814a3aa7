//! The Quote: a receiver's signed, single-use offer.

use rail_core::{Amount, Asset, Money, Offer, PaymentMode};
use serde::{Deserialize, Serialize};

use super::mandate::Party;
use super::signed::{Digest, Identity, Object, Tag, money};
use crate::Error;

/// The profile of a Quote.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// A fixed amount, paid (captured) at once.
    Service,
    /// An estimate and a tolerance: held, captured once the receiver knows the final amount
    /// (never above estimate + tolerance); a human Confirmation is mandatory.
    Checkout,
}

/// What is priced: a method and a name (`tools/call` + `web_search`, `GET` + `/api/search`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capability {
    /// The method.
    pub method: String,
    /// The name.
    pub name: String,
}

/// The request a Quote was issued for, in the clear: the inputs of its request digest, so a
/// wallet can check that the Quote it is handed prices the request *it* sent, where it sent
/// it (a Quote relayed from another origin, or for another path or query, is refused).
///
/// Over HTTP: the origin the receiver serves the request at (from the receiver's
/// configuration, never from the `Host` header), the method, the path and the query exactly as
/// received (percent-encoding kept).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resource {
    /// `https://host[:port]`: scheme and host in lower case, the default port dropped.
    pub origin: String,
    /// The method (`GET`).
    pub method: String,
    /// The path, as received (`/api/search`).
    pub path: String,
    /// The query, as received, without `?` (absent when the request had none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
}

/// One rail a Quote accepts, with that rail's offer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RailOffer {
    /// The rail kind (`ledger`, `x402`, `exact-algo`, `stripe`, `ln-nwc`, `account`).
    pub rail: String,
    /// The rail's offer (rail-specific requirements: an invoice, a payTo, a PaymentIntent…).
    pub offer: Offer,
}

impl RailOffer {
    /// The offer of rail kind `rail` among `rails` (a Quote's or a Tab's), if there is one.
    #[must_use]
    pub fn find<'a>(rails: &'a [RailOffer], rail: &str) -> Option<&'a Offer> {
        rails.iter().find(|r| r.rail == rail).map(|r| &r.offer)
    }
}

/// A receiver's single-use, time-bounded offer, signed by the receiver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quote {
    /// `quote/0.1`.
    pub stipendex: Tag,
    /// `q_…`, unique per receiver; a Quote is paid at most once.
    pub id: String,
    /// The receiver (the signer).
    pub receiver: Party,
    /// Issued at (Unix seconds).
    pub iat: u64,
    /// Not payable at or after (Unix seconds).
    pub exp: u64,
    /// Service (fixed amount) or checkout (estimate + tolerance).
    pub profile: Profile,
    /// The asset of every amount of the Quote.
    pub asset: Asset,
    /// The amount (service profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub amount: Option<Amount>,
    /// The estimate (checkout profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Amount>,
    /// How far above the estimate the final amount may go (checkout profile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<Amount>,
    /// What is priced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability: Option<Capability>,
    /// The digest of the request priced (its origin, method, name and arguments), so the Quote
    /// pays for that request only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Digest>,
    /// The request priced, in the clear (over HTTP). A Quote without it (a 0.1 issuer before
    /// origin binding, or an in-process Quote) is not payable by the HTTP client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<Resource>,
    /// What the payment is for, in the receiver's words.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The rails accepted, each with its offer (at least one).
    pub rails: Vec<RailOffer>,
}

impl Quote {
    /// The most this Quote can cost: its amount, or estimate + tolerance.
    ///
    /// # Errors
    /// [`Error::Malformed`] if the amounts do not fit the asset.
    pub fn max(&self) -> Result<Money, Error> {
        let amount = match (self.profile, self.amount, self.estimate, self.tolerance) {
            (Profile::Service, Some(a), None, None) => a,
            (Profile::Checkout, None, Some(e), Some(t)) => e
                .checked_add(t)
                .map_err(|e| Error::Malformed(format!("estimate + tolerance: {e}")))?,
            _ => {
                return Err(Error::Malformed(
                    "a service quote has `amount` only; a checkout quote has `estimate` and `tolerance` only"
                        .into(),
                ));
            }
        };
        self.money(amount)
    }

    /// The amount the payer is asked for now: the amount, or the estimate (checkout).
    ///
    /// # Errors
    /// [`Error::Malformed`].
    pub fn price(&self) -> Result<Money, Error> {
        self.money(self.amount.or(self.estimate).unwrap_or(Amount::ZERO))
    }

    /// `amount` in the Quote's asset.
    ///
    /// # Errors
    /// [`Error::Malformed`] if it is more precise than the asset.
    pub fn money(&self, amount: Amount) -> Result<Money, Error> {
        money(
            &self.asset,
            amount,
            format_args!("quote amount {amount} {}", self.asset),
        )
    }

    /// The offer of rail kind `rail`, if the Quote accepts it.
    #[must_use]
    pub fn offer(&self, rail: &str) -> Option<&Offer> {
        RailOffer::find(&self.rails, rail)
    }
}

impl Object for Quote {
    const KIND: &'static str = "quote";
    const PREFIX: &'static str = "q_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.receiver.key)
    }
    fn check(&self) -> Result<(), Error> {
        let max = self.max()?;
        self.price()?;
        if self.exp <= self.iat {
            return Err(Error::Malformed(
                "a quote's exp must be after its iat".into(),
            ));
        }
        if self.rails.is_empty() {
            return Err(Error::Malformed("a quote accepts at least one rail".into()));
        }
        let mode = match self.profile {
            Profile::Service => PaymentMode::Capture,
            Profile::Checkout => PaymentMode::Hold,
        };
        for r in &self.rails {
            if r.offer.rail.as_str() != r.rail {
                return Err(Error::Malformed(format!(
                    "the quote's {} entry holds an offer of rail {}",
                    r.rail, r.offer.rail
                )));
            }
            if r.offer.amount != max || r.offer.mode != mode {
                return Err(Error::Malformed(format!(
                    "the quote's {} offer is {} {} in {} mode; the quote asks {max} in {mode} mode",
                    r.rail,
                    r.offer.amount.amount(),
                    r.offer.amount.asset(),
                    r.offer.mode
                )));
            }
        }
        Ok(())
    }
}
