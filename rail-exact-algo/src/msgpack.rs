//! The subset of MessagePack that Algorand transactions use, read strictly and written
//! canonically (go-algorand's `codec` canonical form).
//!
//! Canonical means: map keys are strings in ascending byte order with no duplicates, integers in
//! their shortest encoding, byte strings as `bin`, text as `str`, and zero values omitted (a
//! field that is present is never zero or empty). The reader refuses anything else — floats,
//! extension types, signed integers, `nil`, non-minimal lengths, trailing bytes — because a
//! verifier that accepts two encodings of one transaction can be fooled about what was signed.

use std::collections::BTreeMap;

/// A decoded value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// An unsigned integer.
    UInt(u64),
    /// A byte string (`bin`).
    Bin(Vec<u8>),
    /// A text string (`str`).
    Str(String),
    /// A map with string keys.
    Map(BTreeMap<String, Value>),
    /// An array.
    Array(Vec<Value>),
    /// `true` (canonical form omits `false`).
    True,
    /// `false`: only in a request document ([`decode_document`]), never in a transaction.
    False,
}

/// A decoded value borrowing its strings and byte strings from the input (no copies): what
/// the transaction decoders read, strictly, before they build their own types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueRef<'a> {
    /// An unsigned integer.
    UInt(u64),
    /// A byte string (`bin`).
    Bin(&'a [u8]),
    /// A text string (`str`).
    Str(&'a str),
    /// A map with string keys, in ascending order.
    Map(MapRef<'a>),
    /// An array.
    Array(Vec<ValueRef<'a>>),
    /// `true`.
    True,
    /// `false` (only in a request document).
    False,
}

/// A decoded map: its entries in strictly ascending key order (as the decoder checked).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MapRef<'a>(Vec<(&'a str, ValueRef<'a>)>);

impl<'a> MapRef<'a> {
    /// The value of `k`.
    #[must_use]
    pub fn get(&self, k: &str) -> Option<&ValueRef<'a>> {
        self.0
            .binary_search_by(|(key, _)| key.as_bytes().cmp(k.as_bytes()))
            .ok()
            .and_then(|i| self.0.get(i))
            .map(|(_, v)| v)
    }

    /// Whether `k` is present.
    #[must_use]
    pub fn contains_key(&self, k: &str) -> bool {
        self.get(k).is_some()
    }

    /// The keys, ascending.
    pub fn keys(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.0.iter().map(|(k, _)| *k)
    }

    /// How many entries.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Takes the value of `k` out.
    pub fn remove(&mut self, k: &str) -> Option<ValueRef<'a>> {
        let i = self
            .0
            .binary_search_by(|(key, _)| key.as_bytes().cmp(k.as_bytes()))
            .ok()?;
        Some(self.0.remove(i).1)
    }
}

impl ValueRef<'_> {
    fn is_zero(&self) -> bool {
        match self {
            ValueRef::UInt(0) | ValueRef::False => true,
            ValueRef::Bin(b) => b.is_empty(),
            ValueRef::Str(s) => s.is_empty(),
            ValueRef::Map(m) => m.is_empty(),
            ValueRef::Array(a) => a.is_empty(),
            ValueRef::UInt(_) | ValueRef::True => false,
        }
    }

    /// An owned copy.
    #[must_use]
    pub fn to_owned_value(&self) -> Value {
        match self {
            ValueRef::UInt(n) => Value::UInt(*n),
            ValueRef::Bin(b) => Value::Bin(b.to_vec()),
            ValueRef::Str(s) => Value::Str((*s).to_owned()),
            ValueRef::Map(m) => Value::Map(
                m.0.iter()
                    .map(|(k, v)| ((*k).to_owned(), v.to_owned_value()))
                    .collect(),
            ),
            ValueRef::Array(a) => Value::Array(a.iter().map(ValueRef::to_owned_value).collect()),
            ValueRef::True => Value::True,
            ValueRef::False => Value::False,
        }
    }
}

/// Why bytes are not canonical MessagePack of the accepted subset.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MsgpackError {
    /// The input ended early.
    #[error("truncated at byte {0}")]
    Truncated(usize),
    /// A type outside the subset (float, ext, nil, negative integer, …).
    #[error("type byte 0x{byte:02x} at {at} is not allowed")]
    Unsupported {
        /// The type byte.
        byte: u8,
        /// Its offset.
        at: usize,
    },
    /// A length or integer not in its shortest form.
    #[error("non-minimal encoding at byte {0}")]
    NonMinimal(usize),
    /// Map keys out of order or repeated.
    #[error("map keys not strictly ascending at byte {0}")]
    KeyOrder(usize),
    /// A zero or empty value present (canonical form omits it).
    #[error("zero value present for key {0:?}")]
    ZeroValue(String),
    /// A map key that is not a string.
    #[error("map key at byte {0} is not a string")]
    KeyType(usize),
    /// Text that is not UTF-8.
    #[error("string at byte {0} is not UTF-8")]
    Utf8(usize),
    /// Bytes after the value.
    #[error("{0} trailing bytes")]
    Trailing(usize),
    /// Nesting deeper than the subset needs.
    #[error("nesting too deep")]
    TooDeep,
}

const MAX_DEPTH: usize = 8;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Zero values and `false` allowed ([`decode_document`]).
    lenient: bool,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], MsgpackError> {
        let end = self
            .pos
            .checked_add(n)
            .ok_or(MsgpackError::Truncated(self.pos))?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or(MsgpackError::Truncated(self.pos))?;
        self.pos = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, MsgpackError> {
        Ok(self.take(1)?.first().copied().unwrap_or(0))
    }

    fn be(&mut self, n: usize) -> Result<u64, MsgpackError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    /// A length with its minimal-form floor: `min` is the smallest value this width may carry.
    fn len(&mut self, width: usize, min: u64, at: usize) -> Result<usize, MsgpackError> {
        let v = self.be(width)?;
        if v < min {
            return Err(MsgpackError::NonMinimal(at));
        }
        usize::try_from(v).map_err(|_| MsgpackError::Truncated(at))
    }

    fn value(&mut self, depth: usize) -> Result<ValueRef<'a>, MsgpackError> {
        if depth > MAX_DEPTH {
            return Err(MsgpackError::TooDeep);
        }
        let at = self.pos;
        let b = self.byte()?;
        match b {
            0x00..=0x7f => Ok(ValueRef::UInt(u64::from(b))),
            0xcc => {
                let v = self.be(1)?;
                if v < 0x80 {
                    Err(MsgpackError::NonMinimal(at))
                } else {
                    Ok(ValueRef::UInt(v))
                }
            }
            0xcd => {
                let v = self.be(2)?;
                if v <= 0xff {
                    Err(MsgpackError::NonMinimal(at))
                } else {
                    Ok(ValueRef::UInt(v))
                }
            }
            0xce => {
                let v = self.be(4)?;
                if v <= 0xffff {
                    Err(MsgpackError::NonMinimal(at))
                } else {
                    Ok(ValueRef::UInt(v))
                }
            }
            0xcf => {
                let v = self.be(8)?;
                if v <= 0xffff_ffff {
                    Err(MsgpackError::NonMinimal(at))
                } else {
                    Ok(ValueRef::UInt(v))
                }
            }
            0xc3 => Ok(ValueRef::True),
            0xc2 if self.lenient => Ok(ValueRef::False),
            0xa0..=0xbf => self.str(usize::from(b & 0x1f), at),
            0xd9 => {
                let n = self.len(1, 32, at)?;
                self.str(n, at)
            }
            0xda => {
                let n = self.len(2, 0x100, at)?;
                self.str(n, at)
            }
            0xdb => {
                let n = self.len(4, 0x1_0000, at)?;
                self.str(n, at)
            }
            0xc4 => {
                let n = self.len(1, 0, at)?;
                Ok(ValueRef::Bin(self.take(n)?))
            }
            0xc5 => {
                let n = self.len(2, 0x100, at)?;
                Ok(ValueRef::Bin(self.take(n)?))
            }
            0xc6 => {
                let n = self.len(4, 0x1_0000, at)?;
                Ok(ValueRef::Bin(self.take(n)?))
            }
            0x90..=0x9f => self.array(usize::from(b & 0x0f), depth),
            0xdc => {
                let n = self.len(2, 16, at)?;
                self.array(n, depth)
            }
            0xdd => {
                let n = self.len(4, 0x1_0000, at)?;
                self.array(n, depth)
            }
            0x80..=0x8f => self.map(usize::from(b & 0x0f), depth),
            0xde => {
                let n = self.len(2, 16, at)?;
                self.map(n, depth)
            }
            0xdf => {
                let n = self.len(4, 0x1_0000, at)?;
                self.map(n, depth)
            }
            _ => Err(MsgpackError::Unsupported { byte: b, at }),
        }
    }

    fn str(&mut self, n: usize, at: usize) -> Result<ValueRef<'a>, MsgpackError> {
        let s = self.take(n)?;
        std::str::from_utf8(s)
            .map(ValueRef::Str)
            .map_err(|_| MsgpackError::Utf8(at))
    }

    fn array(&mut self, n: usize, depth: usize) -> Result<ValueRef<'a>, MsgpackError> {
        let mut v = Vec::new();
        for _ in 0..n {
            v.push(self.value(depth + 1)?);
        }
        Ok(ValueRef::Array(v))
    }

    fn map(&mut self, n: usize, depth: usize) -> Result<ValueRef<'a>, MsgpackError> {
        // No more entries than bytes left: a hostile length cannot reserve memory.
        let mut m: Vec<(&'a str, ValueRef<'a>)> =
            Vec::with_capacity(n.min(self.buf.len().saturating_sub(self.pos)));
        for _ in 0..n {
            let at = self.pos;
            let ValueRef::Str(k) = self.value(depth + 1)? else {
                return Err(MsgpackError::KeyType(at));
            };
            if m.last().is_some_and(|(l, _)| l.as_bytes() >= k.as_bytes()) {
                return Err(MsgpackError::KeyOrder(at));
            }
            let v = self.value(depth + 1)?;
            if v.is_zero() && !self.lenient {
                return Err(MsgpackError::ZeroValue(k.to_owned()));
            }
            m.push((k, v));
        }
        Ok(ValueRef::Map(MapRef(m)))
    }
}

fn is_zero(v: &Value) -> bool {
    match v {
        Value::UInt(0) | Value::False => true,
        // Fixed-size fields (addresses, hashes) that are all zero are omitted too; that rule
        // needs the field's type and lives in the transaction decoder.
        Value::Bin(b) => b.is_empty(),
        Value::Str(s) => s.is_empty(),
        Value::Map(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::UInt(_) | Value::True => false,
    }
}

/// Decodes exactly one canonical value from `bytes`.
///
/// # Errors
/// [`MsgpackError`] for anything outside the canonical subset, or trailing bytes.
pub fn decode(bytes: &[u8]) -> Result<Value, MsgpackError> {
    decode_ref(bytes).map(|v| v.to_owned_value())
}

/// As [`decode`], borrowing from `bytes` ([`ValueRef`]): no copies of keys, strings or bins.
///
/// # Errors
/// [`MsgpackError`] for anything outside the canonical subset, or trailing bytes.
pub fn decode_ref(bytes: &[u8]) -> Result<ValueRef<'_>, MsgpackError> {
    let mut r = Reader {
        buf: bytes,
        pos: 0,
        lenient: false,
    };
    let v = r.value(0)?;
    if r.pos != bytes.len() {
        return Err(MsgpackError::Trailing(bytes.len() - r.pos));
    }
    Ok(v)
}

/// Decodes one value of a request document that is not itself signed (a simulate request):
/// as [`decode`], but zero values, empty maps and `false` are allowed, as SDKs write them
/// (py-algorand-sdk keeps `"exec-trace-config": {}`). Never use it for a transaction: what is
/// signed must be canonical.
///
/// # Errors
/// [`MsgpackError`] for anything outside the subset, or trailing bytes.
pub fn decode_document(bytes: &[u8]) -> Result<Value, MsgpackError> {
    let mut r = Reader {
        buf: bytes,
        pos: 0,
        lenient: true,
    };
    let v = r.value(0)?;
    if r.pos != bytes.len() {
        return Err(MsgpackError::Trailing(bytes.len() - r.pos));
    }
    Ok(v.to_owned_value())
}

/// The canonical values concatenated in `bytes` (a stream, such as a transaction group on
/// `POST /v2/transactions`), each as the slice it takes: framing only, nothing is copied.
///
/// # Errors
/// [`MsgpackError`] for anything outside the canonical subset.
pub fn frames(mut bytes: &[u8]) -> Result<Vec<&[u8]>, MsgpackError> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let mut r = Reader {
            buf: bytes,
            pos: 0,
            lenient: false,
        };
        r.value(0)?;
        let (one, rest) = bytes.split_at(r.pos.min(bytes.len()));
        out.push(one);
        bytes = rest;
    }
    Ok(out)
}

/// Encodes `v` canonically (zero values in maps are skipped).
#[must_use]
pub fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    write(&mut out, v);
    out
}

/// A map value borrowed for writing ([`write_map`]): what a transaction's encoder lists
/// without building a [`Value`] tree.
#[derive(Clone, Copy, Debug)]
pub enum Field<'a> {
    /// An unsigned integer (omitted when zero).
    UInt(u64),
    /// A byte string (omitted when empty).
    Bin(&'a [u8]),
    /// A text string (omitted when empty).
    Str(&'a str),
    /// A value already encoded canonically (a nested transaction), written as is.
    Raw(&'a [u8]),
}

impl Field<'_> {
    fn is_zero(&self) -> bool {
        match self {
            Field::UInt(n) => *n == 0,
            Field::Bin(b) => b.is_empty(),
            Field::Str(s) => s.is_empty(),
            Field::Raw(_) => false,
        }
    }
}

/// Writes the canonical map of `fields` to `out`: `None` and zero values are skipped; the keys
/// must be given in ascending byte order (checked in debug builds), as canonical form wants.
pub fn write_map(out: &mut Vec<u8>, fields: &[(&str, Option<Field<'_>>)]) {
    debug_assert!(
        fields.windows(2).all(|w| match w {
            [a, b] => a.0.as_bytes() < b.0.as_bytes(),
            _ => true,
        }),
        "write_map: keys out of order"
    );
    let kept = fields
        .iter()
        .filter(|(_, v)| v.is_some_and(|v| !v.is_zero()))
        .count();
    write_len(out, kept, Some((0x80, 15)), None, 0xde, 0xdf);
    for (k, v) in fields {
        let Some(v) = v.filter(|v| !v.is_zero()) else {
            continue;
        };
        write_len(out, k.len(), Some((0xa0, 31)), Some(0xd9), 0xda, 0xdb);
        out.extend_from_slice(k.as_bytes());
        match v {
            Field::UInt(n) => write(out, &Value::UInt(n)),
            Field::Bin(b) => {
                write_len(out, b.len(), None, Some(0xc4), 0xc5, 0xc6);
                out.extend_from_slice(b);
            }
            Field::Str(s) => {
                write_len(out, s.len(), Some((0xa0, 31)), Some(0xd9), 0xda, 0xdb);
                out.extend_from_slice(s.as_bytes());
            }
            Field::Raw(r) => out.extend_from_slice(r),
        }
    }
}

fn write_len(
    out: &mut Vec<u8>,
    n: usize,
    fix: Option<(u8, usize)>,
    w8: Option<u8>,
    w16: u8,
    w32: u8,
) {
    match (fix, w8) {
        (Some((base, max)), _) if n <= max => out.push(base | u8::try_from(n).unwrap_or(0)),
        (_, Some(t)) if n <= 0xff => {
            out.push(t);
            out.push(u8::try_from(n).unwrap_or(0));
        }
        _ if n <= 0xffff => {
            out.push(w16);
            out.extend_from_slice(&u16::try_from(n).unwrap_or(0).to_be_bytes());
        }
        _ => {
            out.push(w32);
            out.extend_from_slice(&u32::try_from(n).unwrap_or(u32::MAX).to_be_bytes());
        }
    }
}

fn write(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::UInt(n) => {
            let n = *n;
            if n < 0x80 {
                out.push(u8::try_from(n).unwrap_or(0));
            } else if let Ok(b) = u8::try_from(n) {
                out.extend_from_slice(&[0xcc, b]);
            } else if let Ok(s) = u16::try_from(n) {
                out.push(0xcd);
                out.extend_from_slice(&s.to_be_bytes());
            } else if let Ok(w) = u32::try_from(n) {
                out.push(0xce);
                out.extend_from_slice(&w.to_be_bytes());
            } else {
                out.push(0xcf);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        Value::True => out.push(0xc3),
        Value::False => out.push(0xc2),
        Value::Str(s) => {
            write_len(out, s.len(), Some((0xa0, 31)), Some(0xd9), 0xda, 0xdb);
            out.extend_from_slice(s.as_bytes());
        }
        Value::Bin(b) => {
            write_len(out, b.len(), None, Some(0xc4), 0xc5, 0xc6);
            out.extend_from_slice(b);
        }
        Value::Array(a) => {
            write_len(out, a.len(), Some((0x90, 15)), None, 0xdc, 0xdd);
            for x in a {
                write(out, x);
            }
        }
        Value::Map(m) => {
            let kept: Vec<(&String, &Value)> = m.iter().filter(|(_, v)| !is_zero(v)).collect();
            write_len(out, kept.len(), Some((0x80, 15)), None, 0xde, 0xdf);
            // BTreeMap<String, _> iterates in byte order of the UTF-8 keys.
            for (k, v) in kept {
                write(out, &Value::Str(k.clone()));
                write(out, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_non_canonical_forms() {
        for (bytes, why) in [
            (vec![0xcc, 0x05], "uint8 for a fixint"),
            (vec![0xcd, 0x00, 0x10], "uint16 for a small value"),
            (vec![0xca, 0, 0, 0, 0], "float32"),
            (vec![0xc0], "nil"),
            (vec![0xd0, 0xff], "int8"),
            (vec![0xc2], "false"),
            (
                vec![0x82, 0xa1, b'b', 0x01, 0xa1, b'a', 0x01],
                "unsorted keys",
            ),
            (
                vec![0x82, 0xa1, b'a', 0x01, 0xa1, b'a', 0x02],
                "duplicate keys",
            ),
            (vec![0x81, 0xa1, b'a', 0x00], "zero value present"),
            (vec![0x81, 0x01, 0x01], "integer key"),
            (vec![0xd9, 0x01, b'a'], "str8 for a fixstr"),
            (vec![0x01, 0x02], "trailing bytes"),
            (vec![0xc4, 0x05, 1, 2], "truncated bin"),
            (vec![0xd4, 0x01, 0x00], "ext type"),
        ] {
            assert!(decode(&bytes).is_err(), "{why} must be refused");
        }
    }

    #[test]
    fn round_trips() {
        let mut m = BTreeMap::new();
        m.insert("amt".to_owned(), Value::UInt(1000));
        m.insert("fee".to_owned(), Value::UInt(70_000));
        m.insert("note".to_owned(), Value::Bin(vec![1; 40]));
        m.insert("type".to_owned(), Value::Str("pay".into()));
        let v = Value::Map(m);
        assert_eq!(decode(&encode(&v)).unwrap(), v);
    }
}
