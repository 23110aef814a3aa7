//! Transactions of either kind this crate reads (`pay`, `axfer`), signed or not, and atomic
//! groups: the group id is SHA-512/256 of `"TG" || canonical({"txlist": [txid bytes…]})`, each
//! txid over the transaction without its `grp` (go-algorand `crypto.Digest(TxGroup)`; checked
//! against py-algorand-sdk's `calculate_group_id`).

use std::collections::BTreeMap;

use sha2::{Digest, Sha512_256};

use super::axfer::AxferTxn;
use super::{
    PayTxn, TxnError, canonical_signed, decode_frames, encoded, sign_bytes, signed_encoding,
    signed_parts, tagged, txid, verify_by,
};
use crate::address::Address;
use crate::msgpack::{self, MapRef, Value, ValueRef};

/// The most transactions an atomic group may hold.
pub const MAX_GROUP: usize = 16;

/// A transaction this crate reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transaction {
    /// A native payment.
    Pay(PayTxn),
    /// An asset transfer.
    Axfer(AxferTxn),
}

impl Transaction {
    fn from_map(m: &MapRef<'_>) -> Result<Self, TxnError> {
        match m.get("type") {
            Some(ValueRef::Str("pay")) => PayTxn::from_map(m).map(Transaction::Pay),
            Some(ValueRef::Str("axfer")) => AxferTxn::from_map(m).map(Transaction::Axfer),
            Some(ValueRef::Str(t)) => Err(TxnError::WrongType((*t).to_owned())),
            Some(_) => Err(TxnError::FieldType("type")),
            None => Err(TxnError::MissingField("type")),
        }
    }

    /// The canonical encoding.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        encoded(|out| self.write_as(out, true))
    }

    fn write_as(&self, out: &mut Vec<u8>, with_group: bool) {
        match self {
            Transaction::Pay(t) => t.write(out, with_group),
            Transaction::Axfer(t) => t.write(out, with_group),
        }
    }

    /// `"TX" || canonical(txn)`.
    #[must_use]
    pub fn signing_bytes(&self) -> Vec<u8> {
        tagged(|out| self.write_as(out, true))
    }

    /// The transaction id.
    #[must_use]
    pub fn id(&self) -> String {
        txid(&self.signing_bytes())
    }

    /// The sender.
    #[must_use]
    pub fn sender(&self) -> Address {
        self.header().sender
    }

    /// The fields every transaction has, whatever its type.
    #[must_use]
    pub fn header(&self) -> Header<'_> {
        /// The header of a transaction of either type (the same field names in both).
        macro_rules! header_of {
            ($t:expr) => {
                Header {
                    sender: $t.sender,
                    fee: $t.fee,
                    first_valid: $t.first_valid,
                    last_valid: $t.last_valid,
                    genesis_id: &$t.genesis_id,
                    genesis_hash: $t.genesis_hash,
                    note: &$t.note,
                    rekey_to: $t.rekey_to,
                    group: $t.group,
                    lease: $t.lease,
                }
            };
        }
        match self {
            Transaction::Pay(t) => header_of!(t),
            Transaction::Axfer(t) => header_of!(t),
        }
    }

    /// The wire name of its type (`pay`, `axfer`).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Transaction::Pay(_) => "pay",
            Transaction::Axfer(_) => "axfer",
        }
    }

    /// The group id it carries.
    #[must_use]
    pub fn group(&self) -> Option<[u8; 32]> {
        self.header().group
    }

    /// The same transaction with group id `group`.
    #[must_use]
    pub fn with_group(mut self, group: Option<[u8; 32]>) -> Self {
        match &mut self {
            Transaction::Pay(t) => t.group = group,
            Transaction::Axfer(t) => t.group = group,
        }
        self
    }

    /// Decodes an unsigned transaction (the bare transaction map, as SDKs encode one) strictly.
    ///
    /// # Errors
    /// [`TxnError`] naming the first problem.
    pub fn decode(bytes: &[u8]) -> Result<Self, TxnError> {
        let ValueRef::Map(m) = msgpack::decode_ref(bytes)? else {
            return Err(TxnError::NotAMap("transaction"));
        };
        let t = Transaction::from_map(&m)?;
        if t.encode() != bytes {
            return Err(TxnError::NonCanonical);
        }
        Ok(t)
    }
}

/// The fields every transaction has (go-algorand's `transactions.Header`), borrowed from a
/// [`Transaction`] of either type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header<'a> {
    /// `snd`.
    pub sender: Address,
    /// `fee`, microALGO.
    pub fee: u64,
    /// `fv`.
    pub first_valid: u64,
    /// `lv`.
    pub last_valid: u64,
    /// `gen` (may be empty).
    pub genesis_id: &'a str,
    /// `gh`.
    pub genesis_hash: [u8; 32],
    /// `note`.
    pub note: &'a [u8],
    /// `rekey`.
    pub rekey_to: Option<Address>,
    /// `grp`.
    pub group: Option<[u8; 32]>,
    /// `lx`.
    pub lease: Option<[u8; 32]>,
}

/// One element of a group as a payer hands it over: signed (`{sig, txn}`), or left for someone
/// else to sign — the bare transaction map, as SDKs encode an unsigned transaction, or
/// `{txn}` without a signature (what a simulate request carries; x402-avm's decoder accepts
/// both, `mechanisms/avm/utils.py:209-248`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Member {
    /// Signed by its sender (or `sgnr`).
    Signed(SignedTxn),
    /// Not signed yet.
    Unsigned(Transaction),
}

impl Member {
    /// Decodes one element strictly: each of the three forms must be canonical.
    ///
    /// # Errors
    /// [`TxnError`] naming the first problem.
    pub fn decode(bytes: &[u8]) -> Result<Self, TxnError> {
        // One strict decode; each form is then checked canonical by re-encoding.
        let ValueRef::Map(mut m) = msgpack::decode_ref(bytes)? else {
            return Err(TxnError::NotAMap("transaction"));
        };
        if m.contains_key("sig") || m.contains_key("msig") || m.contains_key("lsig") {
            let parts = super::signed_parts_of(m)?;
            return SignedTxn::canonical(parts, bytes).map(Member::Signed);
        }
        let wrapped = m.contains_key("txn");
        if wrapped {
            if m.len() != 1 {
                let stray = m.keys().find(|k| *k != "txn").unwrap_or_default();
                return Err(TxnError::UnknownField(stray.to_owned()));
            }
            let Some(ValueRef::Map(t)) = m.remove("txn") else {
                return Err(TxnError::NotAMap("txn"));
            };
            m = t;
        }
        let txn = Transaction::from_map(&m)?;
        let encoded = txn.encode();
        // The whole was read strictly; the transaction must be its canonical self.
        let canonical = if wrapped {
            bytes.ends_with(&encoded)
        } else {
            encoded == bytes
        };
        if !canonical {
            return Err(TxnError::NonCanonical);
        }
        Ok(Member::Unsigned(txn))
    }

    /// The transaction.
    #[must_use]
    pub fn txn(&self) -> &Transaction {
        match self {
            Member::Signed(s) => &s.txn,
            Member::Unsigned(t) => t,
        }
    }

    /// The canonical encoding in the element's own form (an unsigned one as the bare map).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Member::Signed(s) => s.encode(),
            Member::Unsigned(t) => t.encode(),
        }
    }
}

/// The id of the atomic group `txns` (each taken without its `grp`).
#[must_use]
pub fn group_id(txns: &[Transaction]) -> [u8; 32] {
    group_id_of(txns.iter())
}

/// [`group_id`] of borrowed transactions (no copies).
pub fn group_id_of<'a>(txns: impl Iterator<Item = &'a Transaction>) -> [u8; 32] {
    // {"txlist": [bin32, …]}: a fixmap of one, the key, an array of 32-byte bins.
    let mut b = Vec::with_capacity(2 + 8 + 3 + 34 * MAX_GROUP);
    b.extend_from_slice(b"TG");
    let mut ids = Vec::new();
    let mut bare = Vec::with_capacity(258);
    for t in txns {
        bare.clear();
        bare.extend_from_slice(b"TX");
        t.write_as(&mut bare, false);
        ids.push(Value::Bin(Sha512_256::digest(&bare).to_vec()));
    }
    let mut m = BTreeMap::new();
    m.insert("txlist".to_owned(), Value::Array(ids));
    b.extend_from_slice(&msgpack::encode(&Value::Map(m)));
    Sha512_256::digest(&b).into()
}

/// A signed transaction of either kind: `{sig, txn, sgnr?}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedTxn {
    /// The transaction.
    pub txn: Transaction,
    /// `sig`.
    pub sig: [u8; 64],
    /// `sgnr`: the authorizing address when it differs from the sender.
    pub auth: Option<Address>,
}

impl SignedTxn {
    /// Signs `txn` with `key` (`auth`: the key's address when the sender is rekeyed to it).
    #[must_use]
    pub fn sign(txn: Transaction, key: &ed25519_dalek::SigningKey, auth: Option<Address>) -> Self {
        let sig = sign_bytes(key, &txn.signing_bytes());
        SignedTxn { txn, sig, auth }
    }

    /// The signed transaction of `parts`, which must re-encode to `bytes`.
    fn canonical(
        parts: (MapRef<'_>, [u8; 64], Option<Address>),
        bytes: &[u8],
    ) -> Result<Self, TxnError> {
        let (txn, sig, auth) =
            canonical_signed(parts, bytes, Transaction::from_map, Transaction::encode)?;
        Ok(SignedTxn { txn, sig, auth })
    }

    /// Decodes a signed transaction strictly (single signature only).
    ///
    /// # Errors
    /// [`TxnError`] naming the first problem.
    pub fn decode(bytes: &[u8]) -> Result<Self, TxnError> {
        SignedTxn::canonical(signed_parts(bytes)?, bytes)
    }

    /// Decodes a stream of concatenated signed transactions (the body of
    /// `POST /v2/transactions`), each as strictly as [`SignedTxn::decode`].
    ///
    /// # Errors
    /// [`TxnError`] naming the first problem.
    pub fn decode_stream(bytes: &[u8]) -> Result<Vec<Self>, TxnError> {
        decode_frames(bytes, SignedTxn::decode)
    }

    /// The address whose key must have signed: `sgnr` if present, else the sender.
    #[must_use]
    pub fn signer(&self) -> Address {
        self.auth.unwrap_or(self.txn.sender())
    }

    /// The canonical encoding.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        signed_encoding(&self.txn.encode(), &self.sig, self.auth)
    }

    /// Checks the signature (Ed25519 `verify_strict`) by `sgnr`, or else the sender.
    ///
    /// # Errors
    /// [`TxnError::BadSignature`].
    pub fn verify_signature(&self) -> Result<(), TxnError> {
        verify_by(self.signer(), &self.txn.signing_bytes(), &self.sig)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use data_encoding::BASE64;

    // Made with py-algorand-sdk 2.12.0 (`scripts/avm_golden.py`): a fee payer's unsigned
    // zero-ALGO self-payment carrying the group's fees, and a client's asset transfer of 10 000
    // base units of ASA 10458941 (testnet USDC) with fee 0, grouped, the transfer signed with
    // the Ed25519 key of seed [7; 32].
    const AXFER_SIGNED: &str = "gqNzaWfEQMKqM3e4pa8nOc4Vv+exrRyIC1c8wuVg9PAP4xHOxmuqa4bCvq5gEmAgxshhMRs8iY4/+ZyeFukUOGB1Gz/JOgajdHhui6RhYW10zScQpGFyY3bEIHts4k/rW6zAsWTinCIsV/X2PcOH1DkEglhBHF/hD3wComZ2zQPoo2dlbqx0ZXN0bmV0LXYxLjCiZ2jEIEhjtRiks8hOyBDyLU8QgcsPcfBZp6wg3sYvf3DlCToio2dycMQg/TMztjEbHObi+T2hfdfAajEQcuMake1xObFrdwvHExGibHbNB9Ckbm90ZcQEeDQwMqNzbmTEIOpKbGPinFIKvvVQexMuxfmVR3auvr57kkIe6mkURtIspHR5cGWlYXhmZXKkeGFpZM4An5c9";
    const AXFER_TXID: &str = "OXMLAULNRHDGEG7SX2AAIZCQ3ZF2KVUTPFDBMPI2TZSLD6Q2A5ZQ";
    const FEE_UNSIGNED: &str = "iaNmZWXNB9CiZnbNA+ijZ2VurHRlc3RuZXQtdjEuMKJnaMQgSGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiKjZ3JwxCD9MzO2MRsc5uL5PaF918BqMRBy4xqR7XE5sWt3C8cTEaJsds0H0KNyY3bEIEDpNJKIJWTLzpxZpptnVCaJ6aHDoqnqW2Wm6KRCH/xXo3NuZMQgQOk0koglZMvOnFmmm2dUJonpocOiqepbZabopEIf/FekdHlwZaNwYXk=";
    const FEE_TXID: &str = "HOKV7SX52A7BVQJXCC43RXSD2GP7QY5KVWLG6BDMJ2XUQ7GMO2EA";
    const GROUP: &str = "/TMztjEbHObi+T2hfdfAajEQcuMake1xObFrdwvHExE=";

    fn b64(s: &str) -> Vec<u8> {
        BASE64.decode(s.as_bytes()).unwrap()
    }

    #[test]
    fn the_sdks_asset_transfer_group_decodes_and_reencodes_byte_for_byte() {
        let axfer = SignedTxn::decode(&b64(AXFER_SIGNED)).unwrap();
        assert_eq!(axfer.encode(), b64(AXFER_SIGNED));
        axfer.verify_signature().unwrap();
        let Transaction::Axfer(a) = &axfer.txn else {
            panic!("not an axfer")
        };
        assert_eq!((a.asset, a.amount, a.fee), (10_458_941, 10_000, 0));
        assert_eq!(
            a.receiver.to_string(),
            "PNWOET7LLOWMBMLE4KOCELCX6X3D3Q4H2Q4QJASYIEOF7YIPPQBG3YQ5YI"
        );
        assert_eq!(
            a.sender.to_string(),
            "5JFGYY7CTRJAVPXVKB5RGLWF7GKUO5VOX27HXESCD3VGSFCG2IWAKDM5YU"
        );
        assert_eq!(a.note, b"x402");
        assert_eq!(axfer.txn.id(), AXFER_TXID);

        let fee = Transaction::decode(&b64(FEE_UNSIGNED)).unwrap();
        assert_eq!(fee.encode(), b64(FEE_UNSIGNED));
        assert_eq!(fee.id(), FEE_TXID);
        let Transaction::Pay(p) = &fee else {
            panic!("not a pay")
        };
        assert_eq!((p.amount, p.fee), (0, 2000));
        assert_eq!(p.sender, p.receiver, "a zero-ALGO self-payment");

        let gid = group_id(&[fee.clone(), axfer.txn.clone()]);
        assert_eq!(BASE64.encode(&gid), GROUP);
        assert_eq!(fee.group(), Some(gid));
        assert_eq!(axfer.txn.group(), Some(gid));
    }

    #[test]
    fn a_changed_asset_transfer_fails_its_signature_and_strays_are_refused() {
        let mut axfer = SignedTxn::decode(&b64(AXFER_SIGNED)).unwrap();
        if let Transaction::Axfer(a) = &mut axfer.txn {
            a.amount += 1;
        }
        assert_eq!(axfer.verify_signature(), Err(TxnError::BadSignature));
        // An unsigned transaction is not a signed one, and the reverse.
        assert!(SignedTxn::decode(&b64(FEE_UNSIGNED)).is_err());
        assert!(Transaction::decode(&b64(AXFER_SIGNED)).is_err());
        // A field an asset transfer does not have (`rcv`; the zero `amt` is omitted).
        let Value::Map(mut t) = msgpack::decode(&b64(FEE_UNSIGNED)).unwrap() else {
            panic!()
        };
        t.insert("type".into(), Value::Str("axfer".into()));
        assert_eq!(
            Transaction::decode(&msgpack::encode(&Value::Map(t))),
            Err(TxnError::UnknownField("rcv".into()))
        );
    }
}
