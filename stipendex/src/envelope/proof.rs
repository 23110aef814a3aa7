//! The Proof: the wallet's proof of a payment or hold for one Quote.

use rail_core::{Amount, Asset, Money, Payment, PaymentMode};
use serde::{Deserialize, Serialize};

use super::key::PublicKey;
use super::signed::{Digest, Identity, Object, Tag, money};
use crate::Error;

/// Where an unsigned challenge came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChallengeSource {
    /// An HTTP 402 (x402 v2 or v1).
    Http,
    /// An MCP tool result with `isError` (the x402 MCP convention, exact-algo's:
    /// `docs/exact-algo.md` §5).
    Mcp,
    /// A ContextVM server's CEP-8 payment request (`origin`: the server's Nostr key, hex;
    /// `entry`: the `payment_required` params; `pay_to`: the rail payee, for Lightning the
    /// invoice's node key).
    Contextvm,
}

/// An unsigned challenge a wallet paid (it has no signature to bind: the audit records what the
/// wallet saw and the mandate entry that allowed it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Challenge {
    /// HTTP, MCP or ContextVM.
    pub source: ChallengeSource,
    /// The HTTP origin (`https://host[:port]`), the MCP server's identity, or the ContextVM
    /// server's Nostr key (hex).
    pub origin: String,
    /// The `payTo` paid.
    pub pay_to: String,
    /// The `accepts[]` entry paid, as received.
    pub entry: serde_json::Value,
}

impl Challenge {
    /// The digest a Confirmation binds for a challenge: SHA-256 of the entry as JSON with
    /// sorted keys.
    #[must_use]
    pub fn digest(&self) -> Digest {
        Digest::of(self.entry.to_string().as_bytes())
    }
}

/// Proof of payment (or of a hold) for one Quote, signed by the wallet. It carries the Quote it
/// pays (so a receiver needs no record of the Quotes it issued) and the rail's payment — or,
/// for an unsigned x402 challenge, the challenge instead of a Quote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proof {
    /// `proof/0.1`.
    pub stipendex: Tag,
    /// `p_…`, unique per wallet.
    pub id: String,
    /// The wallet (the signer).
    pub wallet: PublicKey,
    /// The Mandate it was paid under.
    pub mandate: Digest,
    /// The Quote paid, by digest (absent for an unsigned challenge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quote: Option<Digest>,
    /// The Quote paid: its compact JWS (its digest is `quote`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quote_jws: Option<String>,
    /// The tab held, by digest (a tab's hold Proof: `docs/stipendex-profile.md` §4b).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tab: Option<Digest>,
    /// The tab held: its compact JWS (its digest is `tab`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tab_jws: Option<String>,
    /// The unsigned challenge paid instead of a Quote (an x402 402 or MCP `isError` result),
    /// as the wallet saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub challenge: Option<Challenge>,
    /// The Confirmation, by digest, if a human confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<Digest>,
    /// The Confirmation's compact JWS (its digest is `confirmation`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_jws: Option<String>,
    /// Issued at (Unix seconds).
    pub iat: u64,
    /// Capture (service) or hold (checkout).
    pub mode: PaymentMode,
    /// The rail kind paid over.
    pub rail: String,
    /// The asset.
    pub asset: Asset,
    /// The amount paid or held.
    pub amount: Amount,
    /// The rail's payment (its proof: a transfer, a signed authorisation, a preimage…).
    pub payment: Payment,
}

impl Proof {
    /// The amount as money.
    ///
    /// # Errors
    /// [`Error::Malformed`].
    pub fn money(&self) -> Result<Money, Error> {
        money(&self.asset, self.amount, "proof amount")
    }
}

impl Object for Proof {
    const KIND: &'static str = "proof";
    const PREFIX: &'static str = "p_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.wallet)
    }
    fn check(&self) -> Result<(), Error> {
        let money = self.money()?;
        let bound = |d: &Digest, jws: &str| &Digest::of(jws.trim().as_bytes()) == d;
        match (
            (&self.quote, &self.quote_jws),
            (&self.tab, &self.tab_jws),
            &self.challenge,
        ) {
            ((Some(d), Some(jws)), (None, None), None) if bound(d, jws) => {}
            ((Some(_), Some(_)), (None, None), None) => {
                return Err(Error::Mismatch(
                    "the proof's quote digest is not the digest of the quote it carries".into(),
                ));
            }
            ((None, None), (Some(d), Some(jws)), None) if bound(d, jws) => {
                if self.mode != PaymentMode::Hold {
                    return Err(Error::Malformed("a tab's proof holds its cap".into()));
                }
            }
            ((None, None), (Some(_), Some(_)), None) => {
                return Err(Error::Mismatch(
                    "the proof's tab digest is not the digest of the tab it carries".into(),
                ));
            }
            ((None, None), (None, None), Some(_)) => {}
            _ => {
                return Err(Error::Malformed(
                    "a proof pays one of a quote (quote and quote_jws), a tab (tab and tab_jws) or a challenge".into(),
                ));
            }
        }
        match (&self.confirmation, &self.confirmation_jws) {
            (None, None) => {}
            (Some(d), Some(jws)) if &Digest::of(jws.trim().as_bytes()) == d => {}
            _ => {
                return Err(Error::Mismatch(
                    "the proof's confirmation digest is not the digest of the confirmation it carries"
                        .into(),
                ));
            }
        }
        if self.payment.rail.as_str() != self.rail
            || self.payment.mode != self.mode
            || self.payment.amount != money
        {
            return Err(Error::Mismatch(format!(
                "the proof says {} {} in {} mode over {}, its payment {} {} in {} mode over {}",
                self.amount,
                self.asset,
                self.mode,
                self.rail,
                self.payment.amount.amount(),
                self.payment.amount.asset(),
                self.payment.mode,
                self.payment.rail
            )));
        }
        Ok(())
    }
}
