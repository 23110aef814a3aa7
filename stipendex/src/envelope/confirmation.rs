//! The Confirmation: a human's recorded consent to a total and a tolerance.

use rail_core::{Amount, Asset, Money};
use serde::{Deserialize, Serialize};

use super::key::PublicKey;
use super::signed::{Digest, Identity, Object, Tag, money};
use crate::Error;

/// A human's consent to pay up to `total + tolerance` for one Quote under one Mandate, recorded
/// and signed by the wallet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Confirmation {
    /// `confirmation/0.1`.
    pub stipendex: Tag,
    /// `c_…`, unique per wallet.
    pub id: String,
    /// The wallet (the signer).
    pub wallet: PublicKey,
    /// The Mandate the payment is made under.
    pub mandate: Digest,
    /// The Quote consented to.
    pub quote: Digest,
    /// The Quote's id.
    pub quote_id: String,
    /// The receiver (its id, or the origin / server of an unsigned challenge).
    pub receiver: String,
    /// The asset.
    pub asset: Asset,
    /// The total shown to the human.
    pub total: Amount,
    /// How far above the total the human accepted (zero for a fixed amount).
    pub tolerance: Amount,
    /// When the human answered (Unix seconds).
    pub iat: u64,
    /// Who or what answered (`terminal`, `callback`, `flag`).
    pub by: String,
}

impl Confirmation {
    /// The most the human consented to: total + tolerance.
    ///
    /// # Errors
    /// [`Error::Malformed`].
    pub fn max(&self) -> Result<Money, Error> {
        let max = self
            .total
            .checked_add(self.tolerance)
            .map_err(|e| Error::Malformed(format!("total + tolerance: {e}")))?;
        money(
            &self.asset,
            max,
            format_args!("confirmed amount {max} {}", self.asset),
        )
    }
}

impl Object for Confirmation {
    const KIND: &'static str = "confirmation";
    const PREFIX: &'static str = "c_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.wallet)
    }
    fn check(&self) -> Result<(), Error> {
        self.max().map(|_| ())
    }
}
