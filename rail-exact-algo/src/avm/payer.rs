//! The paying side of the AVM scheme ([`AvmPayer`], a payer of the shared x402 client): builds
//! the asset transfer — or, when the entry offers `extra.feePayer`, the two-transaction group
//! whose first member is the fee payer's unsigned zero self-payment carrying both fees — and
//! signs only its own transaction, as the SDK's client does
//! (`mechanisms/avm/exact/client.py:77-213`): `fv` = the last round, `lv` = `fv` + 1000, a note
//! unique to the payment, the fee payer's fee 2 × `min-fee`, the transfer's 0.
//!
//! What it pays is bounded by an [`AvmPolicy`]: which assets, how much of each, which network
//! (its algod's), the most it pays in fees itself.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use ed25519_dalek::SigningKey;
use serde_json::Value;
use x402_transport::wire::PaymentRequired;

use super::scheme::{LABEL, RAIL};
use super::wire::{
    Envelope, Payload, Requirements, SCHEME, USDC_DECIMALS, USDC_MAINNET, USDC_TESTNET, same,
};
use crate::address::Address;
use crate::algod::{AlgodClient, SuggestedParams};
use crate::txn::{AxferTxn, PayTxn, SignedTxn, Transaction, group_id};

/// Why an [`AvmPayer`] did not pay.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AvmPayError {
    /// Not an entry its policy lets it pay (the sentence says why).
    #[error("{0}")]
    Refused(String),
    /// The account holds none of the asset (never opted in).
    #[error("{account} has not opted in to ASA {asset}")]
    NotOptedIn {
        /// The paying account.
        account: String,
        /// The asset.
        asset: u64,
    },
    /// The account holds too little of the asset.
    #[error("{account} holds {have} base units of ASA {asset}; the payment needs {need}")]
    Insufficient {
        /// The paying account.
        account: String,
        /// The asset.
        asset: u64,
        /// What it holds.
        have: u64,
        /// What the payment needs.
        need: u64,
    },
    /// The account's holding is frozen.
    #[error("{account}'s holding of ASA {asset} is frozen")]
    Frozen {
        /// The paying account.
        account: String,
        /// The asset.
        asset: u64,
    },
    /// algod did not answer as it should.
    #[error("algod: {0}")]
    Algod(String),
}

impl AvmPayError {
    /// As a rail error.
    #[must_use]
    pub fn to_rail_error(&self) -> rail_core::RailError {
        use rail_core::{RailError, RailReason};
        match self {
            AvmPayError::Refused(m) => RailError::InvalidInput(m.clone()),
            AvmPayError::NotOptedIn { .. } | AvmPayError::Insufficient { .. } => {
                RailError::InsufficientFunds(self.to_string())
            }
            AvmPayError::Frozen { .. } => {
                RailError::Declined(RailReason::new("asset_frozen", self.to_string()))
            }
            AvmPayError::Algod(m) => RailError::Unavailable(RailReason::new("algod", m.clone())),
        }
    }
}

/// What an [`AvmPayer`] may pay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AvmPolicy {
    /// The assets it pays in, each with the most it pays in one payment (base units).
    pub max_amounts: BTreeMap<u64, u64>,
    /// The most it pays in fees itself, µALGO (a lone transfer's fee; 0 in a fee-payer group).
    pub max_fee: u64,
}

impl AvmPolicy {
    /// USDC (testnet's and mainnet's ids) up to `max` base units a payment, fees up to
    /// 0.002 ALGO.
    #[must_use]
    pub fn usdc(max: u64) -> Self {
        AvmPolicy {
            max_amounts: BTreeMap::from([(USDC_TESTNET, max), (USDC_MAINNET, max)]),
            max_fee: 2_000,
        }
    }
}

/// Pays AVM `exact` entries from one Algorand account (see the module docs).
#[derive(Clone)]
pub struct AvmPayer {
    key: SigningKey,
    address: Address,
    algod: AlgodClient,
    policy: AvmPolicy,
    network: String,
    genesis_hash: [u8; 32],
    clock: rail_core::SharedClock,
}

impl fmt::Debug for AvmPayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AvmPayer")
            .field("address", &self.address)
            .field("network", &self.network)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
}

impl AvmPayer {
    /// A payer with `key` on `algod`'s chain (its genesis is read once).
    ///
    /// # Errors
    /// A sentence if algod cannot be reached.
    pub async fn connect(
        key: SigningKey,
        algod: AlgodClient,
        policy: AvmPolicy,
    ) -> Result<Self, String> {
        let params = algod
            .params()
            .await
            .map_err(|e| format!("algod at {} did not answer: {e}", algod.base()))?;
        Ok(AvmPayer {
            address: Address(key.verifying_key().to_bytes()),
            key,
            network: crate::wire::network_id(&params.genesis_hash),
            genesis_hash: params.genesis_hash,
            algod,
            policy,
            clock: std::sync::Arc::new(rail_core::SystemClock),
        })
    }

    /// The clock offers are judged live by (the rail-core payer; default: the system's).
    #[must_use]
    pub fn with_clock(mut self, clock: rail_core::SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Its clock.
    #[must_use]
    pub fn clock(&self) -> &rail_core::SharedClock {
        &self.clock
    }

    /// The paying account.
    #[must_use]
    pub fn address(&self) -> Address {
        self.address
    }

    fn entry(entry: &Value) -> Result<Requirements, String> {
        serde_json::from_value(entry.clone()).map_err(|_| "not an AVM exact entry".to_owned())
    }

    /// Why this payer will not pay `r`, or `None`.
    #[must_use]
    pub fn refusal_of(&self, r: &Requirements) -> Option<String> {
        if r.scheme != SCHEME {
            return Some(format!("scheme {:?} is not exact", r.scheme));
        }
        if !same(&r.network, &self.network) {
            return Some(format!(
                "{} is not this payer's network ({})",
                r.network, self.network
            ));
        }
        let Ok(asset) = r.asset.parse::<u64>() else {
            return Some(format!("asset {:?} is not an ASA id", r.asset));
        };
        let Some(max) = self.policy.max_amounts.get(&asset) else {
            return Some(format!("ASA {asset} is not an asset this payer pays in"));
        };
        let Ok(amount) = r.amount.parse::<u64>() else {
            return Some(format!(
                "amount {:?} is not a whole number of base units",
                r.amount
            ));
        };
        if amount == 0 {
            return Some("an amount of zero is not a payment".into());
        }
        if amount > *max {
            return Some(format!(
                "{amount} base units of ASA {asset} is over this payer's limit of {max}"
            ));
        }
        if r.pay_to.parse::<Address>().is_err() {
            return Some(format!("payTo {:?} is not an Algorand address", r.pay_to));
        }
        if let Some(fp) = &r.extra.fee_payer
            && fp.parse::<Address>().is_err()
        {
            return Some(format!("feePayer {fp:?} is not an Algorand address"));
        }
        None
    }

    /// Builds and signs the group for `r` (checked by [`AvmPayer::refusal_of`] first), its
    /// transfer's note `x402-payment-<nanoseconds>` as the SDK writes it.
    ///
    /// # Errors
    /// [`AvmPayError`]: the policy's refusal, algod unreachable, the account not opted in to
    /// the asset, holding too little of it or frozen, a fee over the policy.
    pub async fn payload(&self, r: &Requirements) -> Result<Payload, AvmPayError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        self.payload_with_note(r, &nanos.to_string()).await
    }

    /// As [`AvmPayer::payload`], the transfer's note `x402-payment-<tag>` (the fee payer's
    /// `x402-fee-payer-<tag>`): the rail-core payer binds a payment to its offer this way.
    ///
    /// # Errors
    /// [`AvmPayError`].
    pub async fn payload_with_note(
        &self,
        r: &Requirements,
        tag: &str,
    ) -> Result<Payload, AvmPayError> {
        if let Some(why) = self.refusal_of(r) {
            return Err(AvmPayError::Refused(why));
        }
        let bad = |m: &str| AvmPayError::Refused(m.to_owned());
        let asset: u64 = r.asset.parse().map_err(|_| bad("bad asset"))?;
        let amount: u64 = r.amount.parse().map_err(|_| bad("bad amount"))?;
        let pay_to: Address = r.pay_to.parse().map_err(|_| bad("bad payTo"))?;
        let fee_payer: Option<Address> = match &r.extra.fee_payer {
            Some(fp) => Some(fp.parse().map_err(|_| bad("bad feePayer"))?),
            None => None,
        };
        let account = self.address.to_string();
        let held = self
            .algod
            .asset_holding(&self.address, asset)
            .await
            .map_err(|e| AvmPayError::Algod(e.to_string()))?;
        match held {
            None => return Err(AvmPayError::NotOptedIn { account, asset }),
            Some((have, _)) if have < amount => {
                return Err(AvmPayError::Insufficient {
                    account,
                    asset,
                    have,
                    need: amount,
                });
            }
            Some((_, true)) => return Err(AvmPayError::Frozen { account, asset }),
            Some(_) => {}
        }
        let sp = self
            .algod
            .params()
            .await
            .map_err(|e| AvmPayError::Algod(e.to_string()))?;
        if sp.genesis_hash != self.genesis_hash {
            return Err(AvmPayError::Algod(
                "algod's chain changed under this payer".into(),
            ));
        }
        let nanos = tag;
        let mut transfer = AxferTxn {
            sender: self.address,
            asset,
            amount,
            receiver: pay_to,
            asset_sender: None,
            close_to: None,
            fee: 0,
            first_valid: sp.last_round,
            last_valid: sp.last_round.saturating_add(1000),
            genesis_id: sp.genesis_id.clone(),
            genesis_hash: sp.genesis_hash,
            note: format!("x402-payment-{nanos}").into_bytes(),
            rekey_to: None,
            group: None,
            lease: None,
        };
        let Some(fp) = fee_payer else {
            transfer.fee = lone_fee(&sp, &transfer);
            if transfer.fee > self.policy.max_fee {
                return Err(AvmPayError::Refused(format!(
                    "the fee would be {} µALGO; this payer pays at most {}",
                    transfer.fee, self.policy.max_fee
                )));
            }
            let signed = SignedTxn::sign(Transaction::Axfer(transfer), &self.key, None);
            return Ok(Payload {
                payment_group: vec![data_encoding::BASE64.encode(&signed.encode())],
                payment_index: 0,
            });
        };
        let fee_txn = PayTxn {
            sender: fp,
            receiver: fp,
            amount: 0,
            fee: sp.min_fee.max(1000).saturating_mul(2),
            first_valid: sp.last_round,
            last_valid: sp.last_round.saturating_add(1000),
            genesis_id: sp.genesis_id.clone(),
            genesis_hash: sp.genesis_hash,
            note: fee_payer_note(nanos),
            close_to: None,
            rekey_to: None,
            group: None,
            lease: None,
        };
        let txns = vec![Transaction::Pay(fee_txn), Transaction::Axfer(transfer)];
        let gid = group_id(&txns);
        let mut txns = txns.into_iter().map(|t| t.with_group(Some(gid)));
        let (Some(fee_txn), Some(transfer)) = (txns.next(), txns.next()) else {
            return Err(AvmPayError::Refused(
                "internal error: a group of two".into(),
            ));
        };
        let signed = SignedTxn::sign(transfer, &self.key, None);
        Ok(Payload {
            payment_group: vec![
                data_encoding::BASE64.encode(&fee_txn.encode()),
                data_encoding::BASE64.encode(&signed.encode()),
            ],
            payment_index: 1,
        })
    }
}

/// The fee payer's note for `tag`: `x402-fee-payer-<tag>` as the SDK writes it, or, for a tag
/// too long for the facilitator's bound ([`super::verify::MAX_FEE_PAYER_NOTE`]), the tag's
/// SHA-512/256 cut to 16 bytes, hex, in its place.
fn fee_payer_note(tag: &str) -> Vec<u8> {
    use sha2::Digest;
    const PREFIX: &str = "x402-fee-payer-";
    if PREFIX.len() + tag.len() <= super::verify::MAX_FEE_PAYER_NOTE {
        return format!("{PREFIX}{tag}").into_bytes();
    }
    let digest = sha2::Sha512_256::digest(tag.as_bytes());
    let short = digest.get(..16).unwrap_or_default();
    format!("{PREFIX}{}", hex::encode(short)).into_bytes()
}

/// A lone transfer's fee: the larger of `min-fee` and size × fee-per-byte (algosdk's
/// `estimate_size` counts a 64-byte signature and its envelope: 75 bytes).
fn lone_fee(sp: &SuggestedParams, t: &AxferTxn) -> u64 {
    let size = u64::try_from(Transaction::Axfer(t.clone()).encode().len()).unwrap_or(u64::MAX);
    sp.min_fee
        .max(size.saturating_add(75).saturating_mul(sp.fee_per_byte))
}

#[async_trait]
impl x402_transport::client::SchemePayer for AvmPayer {
    fn label(&self) -> &str {
        LABEL
    }

    fn rail(&self) -> &str {
        RAIL
    }

    fn refusal(&self, entry: &Value) -> Option<String> {
        match Self::entry(entry) {
            Ok(r) => self.refusal_of(&r),
            Err(e) => Some(e),
        }
    }

    fn amount(&self, entry: &Value) -> Option<u128> {
        Self::entry(entry)
            .ok()?
            .amount
            .parse::<u64>()
            .ok()
            .map(u128::from)
    }

    /// USDC (either network's id) as `USDC`, 6 decimals; another ASA is not known.
    fn asset(&self, entry: &Value) -> Option<rail_core::Asset> {
        let r = Self::entry(entry).ok()?;
        let id: u64 = r.asset.parse().ok()?;
        ((id == USDC_TESTNET || id == USDC_MAINNET)
            && r.extra.decimals.unwrap_or(USDC_DECIMALS) == USDC_DECIMALS)
            .then(rail_core::Asset::usdc)
    }

    async fn pay(&self, required: &PaymentRequired, entry: &Value) -> Result<Value, String> {
        let r = Self::entry(entry)?;
        let payload = self.payload(&r).await.map_err(|e| e.to_string())?;
        let envelope = Envelope {
            x402_version: 2,
            payload,
            accepted: r,
            resource: required
                .resource
                .as_ref()
                .and_then(|res| serde_json::to_value(res).ok()),
            extensions: None,
        };
        let mut v = serde_json::to_value(&envelope).map_err(|e| e.to_string())?;
        // `accepted` is the entry exactly as offered (members this crate does not know kept).
        if let Some(obj) = v.as_object_mut() {
            obj.insert("accepted".into(), entry.clone());
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::fee_payer_note;
    use crate::avm::verify::MAX_FEE_PAYER_NOTE;

    #[test]
    fn the_fee_payer_note_stays_within_the_facilitators_bound() {
        // An offer id of this crate's receivers (32 hex digits) and nanoseconds: as is.
        assert_eq!(
            fee_payer_note("0123456789abcdef0123456789abcdef"),
            b"x402-fee-payer-0123456789abcdef0123456789abcdef"
        );
        assert_eq!(
            fee_payer_note("1786944043683123456"),
            b"x402-fee-payer-1786944043683123456"
        );
        // A long tag: shortened, still distinct per tag.
        let long = "x".repeat(200);
        let note = fee_payer_note(&long);
        assert!(note.len() <= MAX_FEE_PAYER_NOTE, "{}", note.len());
        assert!(note.starts_with(b"x402-fee-payer-"));
        assert_ne!(note, fee_payer_note(&"y".repeat(200)));
    }
}
