//! The Receipt: "received and executed", signed by the receiver.

use rail_core::{Amount, Asset, Money};
use serde::{Deserialize, Serialize};

use super::mandate::Party;
use super::signed::{Digest, Identity, Object, Tag, money};
use crate::Error;

/// The receiver's statement that it was paid and did the work: the final amount, a digest of
/// the result, and the Proof it answers, by digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    /// `receipt/0.1`.
    pub stipendex: Tag,
    /// `r_…`, unique per receiver.
    pub id: String,
    /// The receiver (the signer; the Quote's receiver).
    pub receiver: Party,
    /// The Quote's id.
    pub quote_id: String,
    /// The Proof answered, by digest.
    pub proof: Digest,
    /// Issued at (Unix seconds).
    pub iat: u64,
    /// The asset.
    pub asset: Asset,
    /// The final amount taken (the Quote's amount, or the captured part of a hold).
    pub amount: Amount,
    /// The digest of the result delivered (its bytes), if there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Digest>,
    /// The rail kind.
    pub rail: String,
    /// The rail's reference of the settled money (a transfer id, a capture, a transaction id).
    pub reference: String,
}

impl Receipt {
    /// The final amount as money.
    ///
    /// # Errors
    /// [`Error::Malformed`].
    pub fn money(&self) -> Result<Money, Error> {
        money(&self.asset, self.amount, "receipt amount")
    }
}

impl Object for Receipt {
    const KIND: &'static str = "receipt";
    const PREFIX: &'static str = "r_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.receiver.key)
    }
    fn check(&self) -> Result<(), Error> {
        self.money().map(|_| ())
    }
}
