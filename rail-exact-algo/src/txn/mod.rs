//! Signed native payment transactions: strict decoding, canonical encoding, transaction id and
//! signature check.
//!
//! A signed transaction is the canonical MessagePack map `{sig, txn, sgnr?}`; the signature is
//! Ed25519 over `"TX" || canonical(txn)` by the sender, or by `sgnr` when the account is rekeyed.
//! Decoding refuses every field a native payment does not have (so nothing a decoder would
//! silently drop can change what was signed), multisig and logic signatures, zero values that
//! canonical form omits, and any byte sequence that does not re-encode to itself.

#[cfg(test)]
use std::collections::BTreeMap;

use data_encoding::BASE32_NOPAD;
use ed25519_dalek::{Signature, VerifyingKey};
use sha2::{Digest, Sha512_256};

use crate::address::Address;
#[cfg(test)]
use crate::msgpack::Value;
use crate::msgpack::{self, MapRef, MsgpackError, ValueRef};

mod axfer;
pub mod batch;
mod group;

pub use axfer::AxferTxn;
pub use group::{Header, MAX_GROUP, Member, SignedTxn, Transaction, group_id, group_id_of};

/// The fields of a native `pay` transaction (`type = "pay"`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayTxn {
    /// `snd`: who pays (and, unless rekeyed, signs).
    pub sender: Address,
    /// `rcv`: who is paid.
    pub receiver: Address,
    /// `amt`: microALGO.
    pub amount: u64,
    /// `fee`: microALGO.
    pub fee: u64,
    /// `fv`: first valid round.
    pub first_valid: u64,
    /// `lv`: last valid round.
    pub last_valid: u64,
    /// `gen`: genesis id (`mainnet-v1.0`, …), may be empty.
    pub genesis_id: String,
    /// `gh`: genesis hash.
    pub genesis_hash: [u8; 32],
    /// `note`: up to 1 KiB.
    pub note: Vec<u8>,
    /// `close`: close the sender's account to this address (a sweep).
    pub close_to: Option<Address>,
    /// `rekey`: hand the sender's signing authority to this address.
    pub rekey_to: Option<Address>,
    /// `grp`: group id (the transaction belongs to an atomic group).
    pub group: Option<[u8; 32]>,
    /// `lx`: lease.
    pub lease: Option<[u8; 32]>,
}

/// A signed payment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignedPay {
    /// The transaction.
    pub txn: PayTxn,
    /// `sig`: Ed25519 signature.
    pub sig: [u8; 64],
    /// `sgnr`: the authorizing address when it differs from the sender (rekeyed account).
    pub auth: Option<Address>,
}

/// Why bytes are not an acceptable signed native payment.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// Not canonical MessagePack of the accepted subset.
    #[error("malformed msgpack: {0}")]
    Msgpack(#[from] MsgpackError),
    /// The structure is not a map where one is required.
    #[error("{0} must be a map")]
    NotAMap(&'static str),
    /// A field a native payment does not have.
    #[error("unknown field {0:?}")]
    UnknownField(String),
    /// A required field is missing.
    #[error("missing field {0}")]
    MissingField(&'static str),
    /// A field of the wrong type or size.
    #[error("field {0} has the wrong type or size")]
    FieldType(&'static str),
    /// Not a transaction of the type expected (`pay`, or `axfer` where asset transfers are
    /// read).
    #[error("transaction type {0:?} is not accepted here")]
    WrongType(String),
    /// A multisig signature (not accepted).
    #[error("multisig transactions are not accepted")]
    Multisig,
    /// A logic signature (not accepted).
    #[error("logic-signature transactions are not accepted")]
    LogicSig,
    /// The bytes are not the canonical encoding of what they decode to.
    #[error("non-canonical encoding")]
    NonCanonical,
    /// The note exceeds 1 KiB.
    #[error("note longer than 1024 bytes")]
    NoteTooLong,
    /// The signature does not verify (or the key is not a valid point).
    #[error("signature does not verify")]
    BadSignature,
}

const PAY_FIELDS: &[&str] = &[
    "amt", "close", "fee", "fv", "gen", "gh", "grp", "lv", "lx", "note", "rcv", "rekey", "snd",
    "type",
];

fn uint(m: &MapRef<'_>, k: &'static str) -> Result<u64, TxnError> {
    match m.get(k) {
        None => Ok(0),
        Some(ValueRef::UInt(n)) => Ok(*n),
        Some(_) => Err(TxnError::FieldType(k)),
    }
}

fn bytes32(m: &MapRef<'_>, k: &'static str) -> Result<Option<[u8; 32]>, TxnError> {
    match m.get(k) {
        None => Ok(None),
        Some(ValueRef::Bin(b)) => {
            let a: [u8; 32] = (*b).try_into().map_err(|_| TxnError::FieldType(k))?;
            if a == [0; 32] {
                // Canonical form omits a zero fixed-size field.
                return Err(TxnError::Msgpack(MsgpackError::ZeroValue(k.to_owned())));
            }
            Ok(Some(a))
        }
        Some(_) => Err(TxnError::FieldType(k)),
    }
}

fn addr(m: &MapRef<'_>, k: &'static str) -> Result<Option<Address>, TxnError> {
    Ok(bytes32(m, k)?.map(Address))
}

/// `note` (at most 1 KiB; absent is empty).
fn note(m: &MapRef<'_>) -> Result<Vec<u8>, TxnError> {
    let note = match m.get("note") {
        None => Vec::new(),
        Some(ValueRef::Bin(b)) => b.to_vec(),
        Some(_) => return Err(TxnError::FieldType("note")),
    };
    if note.len() > 1024 {
        return Err(TxnError::NoteTooLong);
    }
    Ok(note)
}

/// `gen` (absent is empty).
fn genesis_id(m: &MapRef<'_>) -> Result<String, TxnError> {
    match m.get("gen") {
        None => Ok(String::new()),
        Some(ValueRef::Str(s)) => Ok((*s).to_owned()),
        Some(_) => Err(TxnError::FieldType("gen")),
    }
}

/// Checks `type` is `want` and every key is one of `fields`.
fn typed(m: &MapRef<'_>, want: &str, fields: &[&str]) -> Result<(), TxnError> {
    match m.get("type") {
        Some(ValueRef::Str(t)) if *t == want => {}
        Some(ValueRef::Str(t)) => return Err(TxnError::WrongType((*t).to_owned())),
        Some(_) => return Err(TxnError::FieldType("type")),
        None => return Err(TxnError::MissingField("type")),
    }
    // Both ascending (the decoder checked the keys' order; `fields` is written sorted): one
    // merge walk instead of a search per key.
    debug_assert!(
        fields.is_sorted(),
        "a transaction type's fields are listed sorted"
    );
    let mut allowed = fields.iter().peekable();
    for k in m.keys() {
        while allowed.next_if(|f| f.as_bytes() < k.as_bytes()).is_some() {}
        if allowed.next_if(|f| **f == k).is_none() {
            return Err(TxnError::UnknownField(k.to_owned()));
        }
    }
    Ok(())
}

/// The signed envelope `{sig, txn, sgnr?}` read strictly (single signature only): the
/// transaction's map, the signature and `sgnr`.
#[allow(clippy::type_complexity)]
fn signed_parts(bytes: &[u8]) -> Result<(MapRef<'_>, [u8; 64], Option<Address>), TxnError> {
    let ValueRef::Map(m) = msgpack::decode_ref(bytes)? else {
        return Err(TxnError::NotAMap("signed transaction"));
    };
    signed_parts_of(m)
}

/// As [`signed_parts`], of a map already decoded.
#[allow(clippy::type_complexity)]
fn signed_parts_of(mut m: MapRef<'_>) -> Result<(MapRef<'_>, [u8; 64], Option<Address>), TxnError> {
    if m.contains_key("msig") {
        return Err(TxnError::Multisig);
    }
    if m.contains_key("lsig") {
        return Err(TxnError::LogicSig);
    }
    if let Some(k) = m.keys().find(|k| !["sig", "sgnr", "txn"].contains(k)) {
        return Err(TxnError::UnknownField(k.to_owned()));
    }
    let sig: [u8; 64] = match m.get("sig") {
        Some(ValueRef::Bin(b)) => (*b).try_into().map_err(|_| TxnError::FieldType("sig"))?,
        Some(_) => return Err(TxnError::FieldType("sig")),
        None => return Err(TxnError::MissingField("sig")),
    };
    let auth = addr(&m, "sgnr")?;
    let Some(ValueRef::Map(t)) = m.remove("txn") else {
        return Err(TxnError::NotAMap("txn"));
    };
    Ok((t, sig, auth))
}

/// The canonical signed envelope `{sgnr?, sig, txn}` around `txn`, the transaction's own
/// canonical encoding.
fn signed_encoding(txn: &[u8], sig: &[u8; 64], auth: Option<Address>) -> Vec<u8> {
    use msgpack::Field;
    let mut out = Vec::with_capacity(txn.len() + 80);
    msgpack::write_map(
        &mut out,
        &[
            ("sgnr", auth.as_ref().map(|a| Field::Bin(&a.0))),
            ("sig", Some(Field::Bin(sig))),
            ("txn", Some(Field::Raw(txn))),
        ],
    );
    out
}

/// An optional address as a field to write.
fn opt_addr(a: &Option<Address>) -> Option<msgpack::Field<'_>> {
    a.as_ref().map(|a| msgpack::Field::Bin(&a.0))
}

/// An optional 32-byte value as a field to write.
fn opt_b32(a: &Option<[u8; 32]>) -> Option<msgpack::Field<'_>> {
    a.as_ref().map(|a| msgpack::Field::Bin(a))
}

/// The canonical encoding `write` writes (a transaction's fields, field by field).
fn encoded(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write(&mut out);
    out
}

/// The bytes a signature covers: `"TX" ||` the canonical encoding `write` writes.
fn tagged(write: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = Vec::with_capacity(258);
    b.extend_from_slice(b"TX");
    write(&mut b);
    b
}

/// A transaction id: base32 (no padding) of SHA-512/256 over the signing bytes.
fn txid(signing_bytes: &[u8]) -> String {
    BASE32_NOPAD.encode(&Sha512_256::digest(signing_bytes))
}

/// Ed25519 signature by `key` over `signing_bytes`.
fn sign_bytes(key: &ed25519_dalek::SigningKey, signing_bytes: &[u8]) -> [u8; 64] {
    use ed25519_dalek::Signer;
    key.sign(signing_bytes).to_bytes()
}

/// A signed transaction's parts read strictly from `parts` (what [`signed_parts`] or
/// [`signed_parts_of`] read), the transaction by `read`: the whole must re-encode to `bytes`.
fn canonical_signed<T>(
    parts: (MapRef<'_>, [u8; 64], Option<Address>),
    bytes: &[u8],
    read: fn(&MapRef<'_>) -> Result<T, TxnError>,
    encode: fn(&T) -> Vec<u8>,
) -> Result<(T, [u8; 64], Option<Address>), TxnError> {
    let (t, sig, auth) = parts;
    let txn = read(&t)?;
    if signed_encoding(&encode(&txn), &sig, auth) != bytes {
        return Err(TxnError::NonCanonical);
    }
    Ok((txn, sig, auth))
}

/// Each of a stream of concatenated msgpack values (the body of `POST /v2/transactions`),
/// decoded by `decode`.
fn decode_frames<T>(
    bytes: &[u8],
    decode: fn(&[u8]) -> Result<T, TxnError>,
) -> Result<Vec<T>, TxnError> {
    msgpack::frames(bytes)?.into_iter().map(decode).collect()
}

/// Ed25519 `verify_strict` of `sig` by `signer` over `signing_bytes`.
fn verify_by(signer: Address, signing_bytes: &[u8], sig: &[u8; 64]) -> Result<(), TxnError> {
    let key = VerifyingKey::from_bytes(&signer.0).map_err(|_| TxnError::BadSignature)?;
    key.verify_strict(signing_bytes, &Signature::from_bytes(sig))
        .map_err(|_| TxnError::BadSignature)
}

impl PayTxn {
    pub(super) fn from_map(m: &MapRef<'_>) -> Result<Self, TxnError> {
        typed(m, "pay", PAY_FIELDS)?;
        let note = note(m)?;
        let genesis_id = genesis_id(m)?;
        Ok(PayTxn {
            sender: addr(m, "snd")?.ok_or(TxnError::MissingField("snd"))?,
            // A zero receiver is omitted on the wire; it is still a (useless) receiver.
            receiver: addr(m, "rcv")?.unwrap_or(Address([0; 32])),
            amount: uint(m, "amt")?,
            fee: uint(m, "fee")?,
            first_valid: uint(m, "fv")?,
            last_valid: uint(m, "lv")?,
            genesis_id,
            genesis_hash: bytes32(m, "gh")?.ok_or(TxnError::MissingField("gh"))?,
            note,
            close_to: addr(m, "close")?,
            rekey_to: addr(m, "rekey")?,
            group: bytes32(m, "grp")?,
            lease: bytes32(m, "lx")?,
        })
    }

    /// The canonical encoding of the transaction (what is signed, after the `"TX"` tag).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        encoded(|out| self.write(out, true))
    }

    /// Writes the canonical encoding to `out`, field by field (no intermediate tree); without
    /// `grp` when `with_group` is false (what a group id is computed over).
    pub(super) fn write(&self, out: &mut Vec<u8>, with_group: bool) {
        use msgpack::Field;
        msgpack::write_map(
            out,
            &[
                ("amt", Some(Field::UInt(self.amount))),
                ("close", opt_addr(&self.close_to)),
                ("fee", Some(Field::UInt(self.fee))),
                ("fv", Some(Field::UInt(self.first_valid))),
                ("gen", Some(Field::Str(&self.genesis_id))),
                ("gh", Some(Field::Bin(&self.genesis_hash))),
                ("grp", opt_b32(&self.group).filter(|_| with_group)),
                ("lv", Some(Field::UInt(self.last_valid))),
                ("lx", opt_b32(&self.lease)),
                ("note", Some(Field::Bin(&self.note))),
                (
                    "rcv",
                    (!self.receiver.is_zero()).then_some(Field::Bin(&self.receiver.0)),
                ),
                ("rekey", opt_addr(&self.rekey_to)),
                ("snd", Some(Field::Bin(&self.sender.0))),
                ("type", Some(Field::Str("pay"))),
            ],
        );
    }

    /// The bytes the signature covers: `"TX" || canonical(txn)`.
    #[must_use]
    pub fn signing_bytes(&self) -> Vec<u8> {
        tagged(|out| self.write(out, true))
    }

    /// Signs the transaction with `key` (the sender's key, or the key the account was rekeyed
    /// to, in which case `auth` must name that key's address).
    #[must_use]
    pub fn sign(self, key: &ed25519_dalek::SigningKey, auth: Option<Address>) -> SignedPay {
        let sig = sign_bytes(key, &self.signing_bytes());
        SignedPay {
            txn: self,
            sig,
            auth,
        }
    }

    /// The transaction id: base32 (no padding) of SHA-512/256 over the signing bytes.
    #[must_use]
    pub fn id(&self) -> String {
        txid(&self.signing_bytes())
    }
}

impl SignedPay {
    /// Decodes a signed native payment strictly (see the module docs).
    ///
    /// # Errors
    /// [`TxnError`] naming the first problem.
    pub fn decode(bytes: &[u8]) -> Result<Self, TxnError> {
        let (txn, sig, auth) = canonical_signed(
            signed_parts(bytes)?,
            bytes,
            PayTxn::from_map,
            PayTxn::encode,
        )?;
        Ok(SignedPay { txn, sig, auth })
    }

    /// Decodes a stream of concatenated signed payments (the body of `POST /v2/transactions`),
    /// each one as strictly as [`SignedPay::decode`].
    ///
    /// # Errors
    /// [`TxnError`] naming the first problem.
    pub fn decode_stream(bytes: &[u8]) -> Result<Vec<Self>, TxnError> {
        decode_frames(bytes, SignedPay::decode)
    }

    /// The canonical encoding of the signed transaction (what `POST /v2/transactions` takes).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        signed_encoding(&self.txn.encode(), &self.sig, self.auth)
    }

    /// The address whose key must have signed: `sgnr` if present, else the sender. (Whether
    /// `sgnr` is really the account's authorized address is a question for algod.)
    #[must_use]
    pub fn signer(&self) -> Address {
        self.auth.unwrap_or(self.txn.sender)
    }

    /// Checks the signature with Ed25519 `verify_strict` (no malleable or small-order keys).
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

    /// The signed payment used as the signing test of the Go, Python and JavaScript Algorand
    /// SDKs (go-algorand-sdk `TestMakePaymentTxn`, py-algorand-sdk `test_sign`): mnemonic
    /// "advice pudding treat …", fee 4/byte (1176), amount 1000, rounds 12466–13466,
    /// devnet-v33.0, a note and a close-to address.
    const GOLDEN: &str = "gqNzaWfEQPhUAZ3xkDDcc8FvOVo6UinzmKBCqs0woYSfodlmBMfQvGbeUx3Srxy3dyJDzv7rLm26BRv9FnL2/AuT7NYfiAWjdHhui6NhbXTNA+ilY2xvc2XEIEDpNJKIJWTLzpxZpptnVCaJ6aHDoqnqW2Wm6KRCH/xXo2ZlZc0EmKJmds0wsqNnZW6sZGV2bmV0LXYzMy4womdoxCAmCyAJoJOohot5WHIvpeVG7eftF+TYXEx4r7BFJpDt0qJsds00mqRub3RlxAjqABVHQ2y/lqNyY3bEIHts4k/rW6zAsWTinCIsV/X2PcOH1DkEglhBHF/hD3wCo3NuZMQg5/D4TQaBHfnzHI2HixFV9GcdUaGFwgCQhmf0SVhwaKGkdHlwZaNwYXk=";
    const GOLDEN_TXID: &str = "5FJDJD5LMZC3EHUYYJNH5I23U4X6H2KXABNDGPIL557ZMJ33GZHQ";

    fn golden() -> Vec<u8> {
        BASE64.decode(GOLDEN.as_bytes()).unwrap()
    }

    #[test]
    fn decodes_the_sdk_golden_payment_exactly() {
        let s = SignedPay::decode(&golden()).unwrap();
        let t = &s.txn;
        assert_eq!(
            t.sender.to_string(),
            "47YPQTIGQEO7T4Y4RWDYWEKV6RTR2UNBQXBABEEGM72ESWDQNCQ52OPASU"
        );
        assert_eq!(
            t.receiver.to_string(),
            "PNWOET7LLOWMBMLE4KOCELCX6X3D3Q4H2Q4QJASYIEOF7YIPPQBG3YQ5YI"
        );
        assert_eq!(
            t.close_to.unwrap().to_string(),
            "IDUTJEUIEVSMXTU4LGTJWZ2UE2E6TIODUKU6UW3FU3UKIQQ77RLUBBBFLA"
        );
        assert_eq!(
            (t.amount, t.fee, t.first_valid, t.last_valid),
            (1000, 1176, 12466, 13466)
        );
        assert_eq!(t.genesis_id, "devnet-v33.0");
        assert_eq!(
            BASE64.encode(&t.genesis_hash),
            "JgsgCaCTqIaLeVhyL6XlRu3n7Rfk2FxMeK+wRSaQ7dI="
        );
        assert_eq!(BASE64.encode(&t.note), "6gAVR0Nsv5Y=");
        assert_eq!(t.id(), GOLDEN_TXID);
        assert_eq!(s.encode(), golden());
        s.verify_signature().unwrap();
    }

    #[test]
    fn any_flipped_bit_is_refused_or_fails_the_signature() {
        let g = golden();
        for i in 0..g.len() {
            for bit in [0x01u8, 0x80] {
                let mut b = g.clone();
                b[i] ^= bit;
                let ok = SignedPay::decode(&b).and_then(|s| s.verify_signature());
                assert!(
                    ok.is_err(),
                    "flipping bit {bit:#x} of byte {i} was accepted"
                );
            }
        }
    }

    #[test]
    fn refuses_what_a_payment_must_not_carry() {
        let s = SignedPay::decode(&golden()).unwrap();
        // An extra field inside txn.
        let Value::Map(mut outer) = msgpack::decode(&golden()).unwrap() else {
            panic!()
        };
        let Some(Value::Map(mut txn)) = outer.remove("txn") else {
            panic!()
        };
        txn.insert("apid".into(), Value::UInt(7));
        outer.insert("txn".into(), Value::Map(txn));
        let bytes = msgpack::encode(&Value::Map(outer.clone()));
        assert_eq!(
            SignedPay::decode(&bytes),
            Err(TxnError::UnknownField("apid".into()))
        );
        // Multisig, logic signatures, unknown outer fields.
        for (k, e) in [
            ("msig", TxnError::Multisig),
            ("lsig", TxnError::LogicSig),
            ("hgi", TxnError::UnknownField("hgi".into())),
        ] {
            let mut o = outer.clone();
            o.insert(k.into(), Value::True);
            assert_eq!(SignedPay::decode(&msgpack::encode(&Value::Map(o))), Err(e));
        }
        // Another transaction type.
        let mut other = msgpack::decode(&s.txn.encode()).unwrap();
        if let Value::Map(m) = &mut other {
            m.insert("type".into(), Value::Str("axfer".into()));
        }
        let mut o = BTreeMap::new();
        o.insert("sig".to_owned(), Value::Bin(s.sig.to_vec()));
        o.insert("txn".to_owned(), other);
        assert_eq!(
            SignedPay::decode(&msgpack::encode(&Value::Map(o))),
            Err(TxnError::WrongType("axfer".into()))
        );
    }

    #[test]
    fn signs_and_verifies_a_fresh_payment() {
        use ed25519_dalek::{Signer, SigningKey};
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let sender = Address(key.verifying_key().to_bytes());
        let txn = PayTxn {
            sender,
            receiver: "PNWOET7LLOWMBMLE4KOCELCX6X3D3Q4H2Q4QJASYIEOF7YIPPQBG3YQ5YI"
                .parse()
                .unwrap(),
            amount: 1000,
            fee: 1000,
            first_valid: 100,
            last_valid: 1100,
            genesis_id: "testnet-v1.0".into(),
            genesis_hash: [9; 32],
            note: b"0123456789abcdef0123456789abcdef".to_vec(),
            close_to: None,
            rekey_to: None,
            group: None,
            lease: None,
        };
        let sig = key.sign(&txn.signing_bytes()).to_bytes();
        let signed = SignedPay {
            txn,
            sig,
            auth: None,
        };
        let back = SignedPay::decode(&signed.encode()).unwrap();
        assert_eq!(back, signed);
        back.verify_signature().unwrap();
        let mut forged = back.clone();
        forged.txn.amount = 1;
        assert_eq!(forged.verify_signature(), Err(TxnError::BadSignature));
    }

    #[test]
    fn addresses_round_trip_and_refuse_bad_checksums() {
        let a: Address = "PNWOET7LLOWMBMLE4KOCELCX6X3D3Q4H2Q4QJASYIEOF7YIPPQBG3YQ5YI"
            .parse()
            .unwrap();
        assert_eq!(
            a.to_string(),
            "PNWOET7LLOWMBMLE4KOCELCX6X3D3Q4H2Q4QJASYIEOF7YIPPQBG3YQ5YI"
        );
        assert!(
            "PNWOET7LLOWMBMLE4KOCELCX6X3D3Q4H2Q4QJASYIEOF7YIPPQBG3YQ5YA"
                .parse::<Address>()
                .is_err()
        );
        assert!(
            "pnwoet7llowmbmle4kocelcx6x3d3q4h2q4qjasyieof7yippqbg3yq5yi"
                .parse::<Address>()
                .is_err()
        );
        assert!("PNWOET".parse::<Address>().is_err());
    }
}
