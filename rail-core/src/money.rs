//! Exact money: [`Amount`] (a non-negative decimal), [`Asset`] (a code and its scale) and
//! [`Money`] (an amount of one asset that is exactly representable in that asset's minor units).
//!
//! There is no float anywhere in this module, including the serde paths: amounts travel as
//! decimal strings (`"0.0042"`) and a JSON number is refused. Every conversion is checked; a
//! conversion that would lose a digit is [`MoneyError::Lossy`], never a rounding.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest number of fractional digits an [`Amount`] or an [`Asset`] may carry.
///
/// 30 leaves room for 8 integer digits at full precision inside a `u128` and is far above any
/// real asset (ETH wei uses 18).
pub const MAX_SCALE: u8 = 30;

/// Why an amount could not be parsed, built or converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MoneyError {
    /// The text is not a plain non-negative decimal (`0`, `12`, `0.0042`).
    #[error("not a decimal amount: {input:?} ({why})")]
    Syntax {
        /// The text as given (truncated to 64 characters).
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// More fractional digits than [`MAX_SCALE`] or than the asset allows.
    #[error("amount {amount} has more than {scale} fractional digits")]
    TooPrecise {
        /// The amount, as text.
        amount: String,
        /// The scale it had to fit.
        scale: u8,
    },
    /// Converting would drop non-zero digits.
    #[error("converting {amount} to {scale} decimal places would lose digits")]
    Lossy {
        /// The amount, as text.
        amount: String,
        /// The target scale.
        scale: u8,
    },
    /// The result does not fit the target integer type.
    #[error("amount overflows {target}")]
    Overflow {
        /// What it had to fit (`u128`, `i64`, …).
        target: &'static str,
    },
    /// A subtraction would go below zero.
    #[error("amount would go negative")]
    Negative,
    /// Two amounts of different assets were combined.
    #[error("asset mismatch: {left} vs {right}")]
    AssetMismatch {
        /// The left-hand asset code.
        left: String,
        /// The right-hand asset code.
        right: String,
    },
    /// An asset code or scale is not acceptable.
    #[error("invalid asset: {0}")]
    InvalidAsset(String),
}

impl MoneyError {
    fn syntax(input: &str, why: &'static str) -> Self {
        MoneyError::Syntax {
            input: input.chars().take(64).collect(),
            why,
        }
    }
}

fn pow10(exp: u8) -> Option<u128> {
    10u128.checked_pow(u32::from(exp))
}

/// A non-negative exact decimal: `units × 10^-scale`, always kept in lowest terms
/// (no trailing fractional zeros), so equal values compare and hash equal.
///
/// ```
/// use rail_core::money::Amount;
/// let a: Amount = "0.0042".parse()?;
/// assert_eq!(a.to_minor(6)?, 4200);           // exact
/// assert!(a.to_minor(3).is_err());             // 0.0042 has no 3-decimal form: an error, not 0.004
/// assert_eq!("1.50".parse::<Amount>()?, "1.5".parse::<Amount>()?);
/// # Ok::<(), rail_core::money::MoneyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Amount {
    units: u128,
    scale: u8,
}

impl Default for Amount {
    /// Zero.
    fn default() -> Self {
        Amount::ZERO
    }
}

impl Amount {
    /// Zero.
    pub const ZERO: Amount = Amount { units: 0, scale: 0 };

    /// `units × 10^-scale`, reduced to lowest terms.
    ///
    /// # Errors
    /// [`MoneyError::TooPrecise`] when `scale > MAX_SCALE`.
    pub fn from_minor(units: u128, scale: u8) -> Result<Self, MoneyError> {
        if scale > MAX_SCALE {
            return Err(MoneyError::TooPrecise {
                amount: units.to_string(),
                scale: MAX_SCALE,
            });
        }
        Ok(Self::normalized(units, scale))
    }

    /// A whole number of units.
    #[must_use]
    pub fn from_whole(units: u64) -> Self {
        Amount {
            units: u128::from(units),
            scale: 0,
        }
    }

    fn normalized(mut units: u128, mut scale: u8) -> Self {
        if units == 0 {
            return Amount::ZERO;
        }
        while scale > 0 && units.is_multiple_of(10) {
            units /= 10;
            scale -= 1;
        }
        Amount { units, scale }
    }

    /// True for zero.
    #[must_use]
    pub const fn is_zero(&self) -> bool {
        self.units == 0
    }

    /// The number of fractional digits this value needs (0 for whole numbers).
    #[must_use]
    pub const fn scale(&self) -> u8 {
        self.scale
    }

    /// The value in minor units of `scale` decimals: exact, or an error.
    ///
    /// # Errors
    /// [`MoneyError::Lossy`] if the value has more fractional digits than `scale`;
    /// [`MoneyError::Overflow`] if the result exceeds `u128`.
    pub fn to_minor(&self, scale: u8) -> Result<u128, MoneyError> {
        if self.scale > scale {
            return Err(MoneyError::Lossy {
                amount: self.to_string(),
                scale,
            });
        }
        pow10(scale - self.scale)
            .and_then(|f| self.units.checked_mul(f))
            .ok_or(MoneyError::Overflow { target: "u128" })
    }

    /// Like [`Amount::to_minor`], narrowed to `u64`.
    ///
    /// # Errors
    /// As [`Amount::to_minor`], plus [`MoneyError::Overflow`] above `u64::MAX`.
    pub fn to_minor_u64(&self, scale: u8) -> Result<u64, MoneyError> {
        u64::try_from(self.to_minor(scale)?).map_err(|_| MoneyError::Overflow { target: "u64" })
    }

    /// Like [`Amount::to_minor`], narrowed to `i64` (the range of SQL `BIGINT`).
    ///
    /// # Errors
    /// As [`Amount::to_minor`], plus [`MoneyError::Overflow`] above `i64::MAX`.
    pub fn to_minor_i64(&self, scale: u8) -> Result<i64, MoneyError> {
        i64::try_from(self.to_minor(scale)?).map_err(|_| MoneyError::Overflow { target: "i64" })
    }

    /// Both values brought to a common scale, or `None` if that overflows.
    fn aligned(self, other: Amount) -> Option<(u128, u128, u8)> {
        let scale = self.scale.max(other.scale);
        let a = self.units.checked_mul(pow10(scale - self.scale)?)?;
        let b = other.units.checked_mul(pow10(scale - other.scale)?)?;
        Some((a, b, scale))
    }

    /// `self + other`.
    ///
    /// # Errors
    /// [`MoneyError::Overflow`] when the sum does not fit.
    pub fn checked_add(self, other: Amount) -> Result<Amount, MoneyError> {
        let (a, b, scale) = self
            .aligned(other)
            .ok_or(MoneyError::Overflow { target: "u128" })?;
        a.checked_add(b)
            .map(|u| Amount::normalized(u, scale))
            .ok_or(MoneyError::Overflow { target: "u128" })
    }

    /// `self - other`.
    ///
    /// # Errors
    /// [`MoneyError::Negative`] when `other > self`; [`MoneyError::Overflow`] when the
    /// operands cannot be aligned.
    pub fn checked_sub(self, other: Amount) -> Result<Amount, MoneyError> {
        let (a, b, scale) = self
            .aligned(other)
            .ok_or(MoneyError::Overflow { target: "u128" })?;
        a.checked_sub(b)
            .map(|u| Amount::normalized(u, scale))
            .ok_or(MoneyError::Negative)
    }
}

impl Ord for Amount {
    fn cmp(&self, other: &Self) -> Ordering {
        if let Some((a, b, _)) = self.aligned(*other) {
            return a.cmp(&b);
        }
        // Aligning overflowed: the side that needed scaling up has a huge integer part,
        // so compare integer parts first, then the remainders digit by digit.
        let int = |x: &Amount| x.units / pow10(x.scale).unwrap_or(u128::MAX);
        int(self).cmp(&int(other)).then_with(|| {
            // Equal integer parts that still overflow cannot happen for scale <= MAX_SCALE
            // with the integer part < 10^8; fall back to the string form, which is exact.
            self.to_string().cmp(&other.to_string())
        })
    }
}

impl PartialOrd for Amount {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let digits = self.units.to_string();
        let scale = usize::from(self.scale);
        if scale == 0 {
            return f.write_str(&digits);
        }
        if digits.len() <= scale {
            write!(f, "0.{}{}", "0".repeat(scale - digits.len()), digits)
        } else {
            let (int, frac) = digits.split_at(digits.len() - scale);
            write!(f, "{int}.{frac}")
        }
    }
}

impl fmt::Debug for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Amount({self})")
    }
}

impl FromStr for Amount {
    type Err = MoneyError;

    /// Parses the strict grammar `0 | [1-9][0-9]*` optionally followed by `.` and one or more
    /// digits. Signs, exponents, spaces, leading zeros, `1.` and `.5` are refused.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (int, frac) = match s.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (s, None),
        };
        if int.is_empty() {
            return Err(MoneyError::syntax(s, "missing integer part"));
        }
        if !int.bytes().all(|b| b.is_ascii_digit()) {
            return Err(MoneyError::syntax(s, "integer part must be ASCII digits"));
        }
        if int.len() > 1 && int.starts_with('0') {
            return Err(MoneyError::syntax(s, "leading zero"));
        }
        let frac = frac.unwrap_or("");
        if s.contains('.') && frac.is_empty() {
            return Err(MoneyError::syntax(s, "missing fractional digits after '.'"));
        }
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return Err(MoneyError::syntax(
                s,
                "fractional part must be ASCII digits",
            ));
        }
        let frac = frac.trim_end_matches('0');
        let scale = u8::try_from(frac.len())
            .ok()
            .filter(|&n| n <= MAX_SCALE)
            .ok_or_else(|| MoneyError::TooPrecise {
                amount: s.chars().take(64).collect(),
                scale: MAX_SCALE,
            })?;
        let mut units: u128 = 0;
        for b in int.bytes().chain(frac.bytes()) {
            units = units
                .checked_mul(10)
                .and_then(|u| u.checked_add(u128::from(b - b'0')))
                .ok_or(MoneyError::Overflow { target: "u128" })?;
        }
        Ok(Amount::normalized(units, scale))
    }
}

impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Amount {
    /// Only a JSON string is accepted: a JSON number may already have been through a float.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = Amount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal string such as \"0.0042\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Amount, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(V)
    }
}

/// An asset: a short code (`USD`, `USDC`, `ALGO`, `BTC`) and the number of decimals of its
/// minor unit (USD 2 = cents, USDC 6, ALGO 6 = µALGO, BTC 11 = millisatoshi).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "AssetRepr", into = "AssetRepr")]
pub struct Asset {
    code: String,
    scale: u8,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AssetRepr {
    code: String,
    scale: u8,
}

impl TryFrom<AssetRepr> for Asset {
    type Error = MoneyError;
    fn try_from(r: AssetRepr) -> Result<Self, Self::Error> {
        Asset::new(&r.code, r.scale)
    }
}

impl From<Asset> for AssetRepr {
    fn from(a: Asset) -> Self {
        AssetRepr {
            code: a.code,
            scale: a.scale,
        }
    }
}

impl Asset {
    /// A new asset.
    ///
    /// # Errors
    /// [`MoneyError::InvalidAsset`] unless the code is 1–16 of `A-Z 0-9 . _ -` and
    /// `scale <= MAX_SCALE`.
    pub fn new(code: &str, scale: u8) -> Result<Self, MoneyError> {
        let ok_code = !code.is_empty()
            && code.len() <= 16
            && code
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b"._-".contains(&b));
        if !ok_code {
            return Err(MoneyError::InvalidAsset(format!(
                "code {:?} must be 1-16 characters of A-Z 0-9 . _ -",
                code.chars().take(32).collect::<String>()
            )));
        }
        if scale > MAX_SCALE {
            return Err(MoneyError::InvalidAsset(format!(
                "scale {scale} exceeds {MAX_SCALE}"
            )));
        }
        Ok(Asset {
            code: code.to_owned(),
            scale,
        })
    }

    fn known(code: &'static str, scale: u8) -> Self {
        Asset {
            code: code.to_owned(),
            scale,
        }
    }

    /// US dollars in cents (scale 2).
    #[must_use]
    pub fn usd() -> Self {
        Self::known("USD", 2)
    }
    /// USDC (scale 6).
    #[must_use]
    pub fn usdc() -> Self {
        Self::known("USDC", 6)
    }
    /// Native ALGO in microALGO (scale 6).
    #[must_use]
    pub fn algo() -> Self {
        Self::known("ALGO", 6)
    }
    /// Bitcoin in millisatoshi (scale 11), the unit of Lightning.
    #[must_use]
    pub fn btc() -> Self {
        Self::known("BTC", 11)
    }

    /// The asset this crate knows by `code` (`USD`, `USDC`, `ALGO`, `BTC`), with its scale.
    #[must_use]
    pub fn by_code(code: &str) -> Option<Self> {
        match code {
            "USD" => Some(Self::usd()),
            "USDC" => Some(Self::usdc()),
            "ALGO" => Some(Self::algo()),
            "BTC" => Some(Self::btc()),
            _ => None,
        }
    }

    /// The asset code.
    #[must_use]
    pub fn code(&self) -> &str {
        &self.code
    }

    /// Decimals of the minor unit.
    #[must_use]
    pub const fn scale(&self) -> u8 {
        self.scale
    }
}

impl fmt::Display for Asset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.code)
    }
}

/// An amount of one asset, exactly representable in that asset's minor units.
///
/// ```
/// use rail_core::money::{Asset, Money};
/// let price = Money::parse(Asset::usdc(), "0.0042")?;
/// assert_eq!(price.minor_units(), 4200);
/// assert!(Money::parse(Asset::usd(), "0.001").is_err()); // a tenth of a cent does not exist
/// # Ok::<(), rail_core::money::MoneyError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "MoneyRepr", into = "MoneyRepr")]
pub struct Money {
    asset: Asset,
    amount: Amount,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MoneyRepr {
    amount: Amount,
    asset: Asset,
}

impl TryFrom<MoneyRepr> for Money {
    type Error = MoneyError;
    fn try_from(r: MoneyRepr) -> Result<Self, Self::Error> {
        Money::new(r.asset, r.amount)
    }
}

impl From<Money> for MoneyRepr {
    fn from(m: Money) -> Self {
        MoneyRepr {
            amount: m.amount,
            asset: m.asset,
        }
    }
}

impl Money {
    /// `amount` of `asset`.
    ///
    /// # Errors
    /// [`MoneyError::TooPrecise`] if the amount has more decimals than the asset;
    /// [`MoneyError::Overflow`] if its minor units exceed `u128`.
    pub fn new(asset: Asset, amount: Amount) -> Result<Self, MoneyError> {
        if amount.scale() > asset.scale() {
            return Err(MoneyError::TooPrecise {
                amount: amount.to_string(),
                scale: asset.scale(),
            });
        }
        amount.to_minor(asset.scale())?;
        Ok(Money { asset, amount })
    }

    /// Parses a decimal string as an amount of `asset`.
    ///
    /// # Errors
    /// As [`Amount::from_str`] and [`Money::new`].
    pub fn parse(asset: Asset, amount: &str) -> Result<Self, MoneyError> {
        Money::new(asset, amount.parse()?)
    }

    /// `units` minor units of `asset`.
    ///
    /// # Errors
    /// Never for a valid asset; kept fallible for symmetry with [`Money::new`].
    pub fn from_minor(asset: Asset, units: u128) -> Result<Self, MoneyError> {
        let amount = Amount::from_minor(units, asset.scale())?;
        Ok(Money { asset, amount })
    }

    /// Zero of `asset`.
    #[must_use]
    pub fn zero(asset: Asset) -> Self {
        Money {
            asset,
            amount: Amount::ZERO,
        }
    }

    /// The asset.
    #[must_use]
    pub fn asset(&self) -> &Asset {
        &self.asset
    }

    /// The decimal amount.
    #[must_use]
    pub fn amount(&self) -> Amount {
        self.amount
    }

    /// The amount written with every decimal place of its asset (`1.00` for one US dollar,
    /// where `Display` writes `1`): for people reading amounts side by side.
    ///
    /// ```
    /// use rail_core::{Asset, Money};
    /// assert_eq!(Money::parse(Asset::usd(), "1")?.to_fixed(), "1.00");
    /// assert_eq!(Money::parse(Asset::usd(), "0.05")?.to_fixed(), "0.05");
    /// # Ok::<(), rail_core::money::MoneyError>(())
    /// ```
    #[must_use]
    pub fn to_fixed(&self) -> String {
        let scale = u32::from(self.asset.scale());
        let units = self.minor_units();
        if scale == 0 {
            return units.to_string();
        }
        let base = 10u128.pow(scale);
        format!(
            "{}.{:0width$}",
            units / base,
            units % base,
            width = usize::try_from(scale).unwrap_or(0)
        )
    }

    /// The amount in the asset's minor units (exact by construction).
    #[must_use]
    pub fn minor_units(&self) -> u128 {
        // Checked in `new`/`from_minor`: cannot fail for a constructed Money.
        self.amount
            .to_minor(self.asset.scale())
            .unwrap_or(u128::MAX)
    }

    /// The minor units as `i64` (SQL `BIGINT`).
    ///
    /// # Errors
    /// [`MoneyError::Overflow`] above `i64::MAX`.
    pub fn minor_i64(&self) -> Result<i64, MoneyError> {
        self.amount.to_minor_i64(self.asset.scale())
    }

    /// The amount in another rail's unit of `scale` decimals (for example an offer in BTC
    /// paid in msat): exact, or [`MoneyError::Lossy`].
    ///
    /// # Errors
    /// As [`Amount::to_minor`].
    pub fn to_scale(&self, scale: u8) -> Result<u128, MoneyError> {
        self.amount.to_minor(scale)
    }

    fn same_asset(&self, other: &Money) -> Result<(), MoneyError> {
        if self.asset == other.asset {
            Ok(())
        } else {
            Err(MoneyError::AssetMismatch {
                left: self.asset.code().to_owned(),
                right: other.asset.code().to_owned(),
            })
        }
    }

    /// `self + other`, same asset only.
    ///
    /// # Errors
    /// [`MoneyError::AssetMismatch`] or [`MoneyError::Overflow`].
    pub fn checked_add(&self, other: &Money) -> Result<Money, MoneyError> {
        self.same_asset(other)?;
        Money::new(self.asset.clone(), self.amount.checked_add(other.amount)?)
    }

    /// `self - other`, same asset only.
    ///
    /// # Errors
    /// [`MoneyError::AssetMismatch`] or [`MoneyError::Negative`].
    pub fn checked_sub(&self, other: &Money) -> Result<Money, MoneyError> {
        self.same_asset(other)?;
        Money::new(self.asset.clone(), self.amount.checked_sub(other.amount)?)
    }
}

impl fmt::Display for Money {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.amount, self.asset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_formats() {
        for (s, canon) in [
            ("0", "0"),
            ("0.0", "0"),
            ("12", "12"),
            ("0.0042", "0.0042"),
            ("1.50", "1.5"),
            ("100.000", "100"),
        ] {
            assert_eq!(s.parse::<Amount>().unwrap().to_string(), canon, "{s}");
        }
    }

    #[test]
    fn refuses_bad_syntax() {
        for s in [
            "", "-1", "+1", "1e3", " 1", "1 ", "01", "00.5", "1.", ".5", "1.2.3", "0x10", "1,5",
            "NaN", "inf", "١", "1.-2",
        ] {
            assert!(s.parse::<Amount>().is_err(), "{s:?} must be refused");
        }
    }

    #[test]
    fn refuses_overflow_and_precision() {
        let huge = "9".repeat(40);
        assert!(matches!(
            huge.parse::<Amount>(),
            Err(MoneyError::Overflow { .. })
        ));
        let precise = format!("0.{}1", "0".repeat(30));
        assert!(matches!(
            precise.parse::<Amount>(),
            Err(MoneyError::TooPrecise { .. })
        ));
        let max = u128::MAX.to_string().parse::<Amount>().unwrap();
        assert!(matches!(max.to_minor(1), Err(MoneyError::Overflow { .. })));
        assert!(matches!(
            max.checked_add(Amount::from_whole(1)),
            Err(MoneyError::Overflow { .. })
        ));
        let big = Amount::from_whole(u64::MAX);
        assert!(big.to_minor_i64(0).is_err());
        assert_eq!(big.to_minor_u64(0).unwrap(), u64::MAX);
    }

    #[test]
    fn conversion_is_exact_or_an_error() {
        let a: Amount = "0.0042".parse().unwrap();
        assert_eq!(a.to_minor(4).unwrap(), 42);
        assert_eq!(a.to_minor(6).unwrap(), 4200);
        assert!(matches!(a.to_minor(3), Err(MoneyError::Lossy { .. })));
        assert!(Money::parse(Asset::usd(), "0.001").is_err());
        assert_eq!(
            Money::parse(Asset::btc(), "0.00000000001")
                .unwrap()
                .minor_units(),
            1
        );
    }

    #[test]
    fn serde_uses_strings_only() {
        let m = Money::parse(Asset::usdc(), "1.25").unwrap();
        let j = serde_json::to_string(&m).unwrap();
        assert_eq!(j, r#"{"amount":"1.25","asset":{"code":"USDC","scale":6}}"#);
        assert_eq!(serde_json::from_str::<Money>(&j).unwrap(), m);
        assert!(
            serde_json::from_str::<Amount>("1.25").is_err(),
            "numbers are refused"
        );
        assert!(
            serde_json::from_str::<Money>(
                r#"{"amount":"0.0000001","asset":{"code":"USDC","scale":6}}"#
            )
            .is_err()
        );
        assert!(serde_json::from_str::<Asset>(r#"{"code":"usd","scale":2}"#).is_err());
    }

    #[test]
    fn ordering_and_arithmetic() {
        let a: Amount = "1.5".parse().unwrap();
        let b: Amount = "1.25".parse().unwrap();
        assert!(a > b);
        assert_eq!(a.checked_sub(b).unwrap().to_string(), "0.25");
        assert_eq!(b.checked_sub(a), Err(MoneyError::Negative));
        let usd = Money::parse(Asset::usd(), "1").unwrap();
        let usdc = Money::parse(Asset::usdc(), "1").unwrap();
        assert!(matches!(
            usd.checked_add(&usdc),
            Err(MoneyError::AssetMismatch { .. })
        ));
    }

    proptest! {
        #[test]
        fn minor_round_trip(units in any::<u128>(), scale in 0u8..=MAX_SCALE) {
            let a = Amount::from_minor(units, scale).unwrap();
            prop_assert_eq!(a.to_minor(scale).unwrap(), units);
            let text = a.to_string();
            let back: Amount = text.parse().unwrap();
            prop_assert_eq!(back, a);
        }

        #[test]
        fn display_parse_round_trip(int in 0u64.., frac in 0u64.., digits in 0usize..19) {
            let s = if digits == 0 { int.to_string() } else {
                let f = format!("{frac:019}");
                format!("{int}.{}", &f[..digits])
            };
            let a: Amount = s.parse().unwrap();
            let again: Amount = a.to_string().parse().unwrap();
            prop_assert_eq!(a, again);
        }

        #[test]
        fn lossy_conversion_is_always_an_error(units in 1u128..u128::MAX / 10, scale in 1u8..=20) {
            // A value with a non-zero last digit at `scale` cannot go to `scale - 1`.
            let units = units * 10 + 1;
            let a = Amount::from_minor(units, scale).unwrap();
            let is_lossy = matches!(a.to_minor(scale - 1), Err(MoneyError::Lossy { .. }));
            prop_assert!(is_lossy);
        }

        #[test]
        fn add_sub_inverse(a in any::<u64>(), b in any::<u64>(), sa in 0u8..12, sb in 0u8..12) {
            let x = Amount::from_minor(u128::from(a), sa).unwrap();
            let y = Amount::from_minor(u128::from(b), sb).unwrap();
            let sum = x.checked_add(y).unwrap();
            prop_assert_eq!(sum.checked_sub(y).unwrap(), x);
            prop_assert!(sum >= x && sum >= y);
        }

        #[test]
        fn ordering_matches_minor_units(a in any::<u64>(), b in any::<u64>(), s in 0u8..=18) {
            let x = Amount::from_minor(u128::from(a), s).unwrap();
            let y = Amount::from_minor(u128::from(b), s).unwrap();
            prop_assert_eq!(x.cmp(&y), a.cmp(&b));
        }

        #[test]
        fn arbitrary_text_never_panics(s in "\\PC{0,48}") {
            let _ = s.parse::<Amount>();
        }
    }
}
