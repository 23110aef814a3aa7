//! Money ↔ Stripe amounts: an integer in the currency's smallest unit as Stripe defines it.
//!
//! Stripe's rules (docs, "Supported currencies → Zero-decimal and three-decimal currencies"):
//! zero-decimal currencies (JPY, KRW, …) are sent as whole units; three-decimal currencies
//! (BHD, JOD, KWD, OMR, TND) as thousandths whose last digit must be 0; every other currency in
//! hundredths. A conversion that would lose anything is an error, never a rounding.

use rail_core::{Asset, Money, RailError, RailResult};

/// Stripe's zero-decimal currencies.
pub const ZERO_DECIMAL: &[&str] = &[
    "BIF", "CLP", "DJF", "GNF", "JPY", "KMF", "KRW", "MGA", "PYG", "RWF", "UGX", "VND", "VUV",
    "XAF", "XOF", "XPF",
];
/// Stripe's three-decimal currencies.
pub const THREE_DECIMAL: &[&str] = &["BHD", "JOD", "KWD", "OMR", "TND"];

/// Stripe's exponent for a currency code.
#[must_use]
pub fn exponent(code: &str) -> u8 {
    let c = code.to_ascii_uppercase();
    if ZERO_DECIMAL.contains(&c.as_str()) {
        0
    } else if THREE_DECIMAL.contains(&c.as_str()) {
        3
    } else {
        2
    }
}

/// The Stripe amount for `m` (checked: the asset's scale must be Stripe's exponent, the value
/// must fit, and three-decimal amounts must end in 0).
///
/// # Errors
/// [`RailError::InvalidInput`] naming what does not hold.
pub fn to_stripe(m: &Money) -> RailResult<i64> {
    let code = m.asset().code();
    let e = exponent(code);
    if m.asset().scale() != e {
        return Err(RailError::InvalidInput(format!(
            "asset {code} has scale {}, Stripe uses {e} decimals for it",
            m.asset().scale()
        )));
    }
    let n = i64::try_from(m.minor_units())
        .map_err(|_| RailError::InvalidInput(format!("{m} does not fit a Stripe amount")))?;
    if e == 3 && n % 10 != 0 {
        return Err(RailError::InvalidInput(format!(
            "{m}: Stripe requires three-decimal amounts to end in 0"
        )));
    }
    Ok(n)
}

/// `n` of Stripe's smallest unit of `asset` as money.
///
/// # Errors
/// [`RailError::InvalidInput`] for a negative amount or a scale that is not Stripe's.
pub fn from_stripe(asset: &Asset, n: i64) -> RailResult<Money> {
    if asset.scale() != exponent(asset.code()) {
        return Err(RailError::InvalidInput(format!(
            "asset {} has scale {}, Stripe uses {}",
            asset.code(),
            asset.scale(),
            exponent(asset.code())
        )));
    }
    let n = u128::try_from(n)
        .map_err(|_| RailError::InvalidInput(format!("negative Stripe amount {n}")))?;
    Ok(Money::from_minor(asset.clone(), n)?)
}

/// Stripe's lowercase currency code.
#[must_use]
pub fn code(asset: &Asset) -> String {
    asset.code().to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn asset(code: &str) -> Asset {
        Asset::new(code, exponent(code)).unwrap()
    }

    #[test]
    fn exponents_and_rules() {
        assert_eq!(
            to_stripe(&Money::parse(asset("USD"), "12.34").unwrap()).unwrap(),
            1234
        );
        assert_eq!(
            to_stripe(&Money::parse(asset("JPY"), "500").unwrap()).unwrap(),
            500
        );
        assert_eq!(
            to_stripe(&Money::parse(asset("KWD"), "5.120").unwrap()).unwrap(),
            5120
        );
        assert!(to_stripe(&Money::parse(asset("KWD"), "5.123").unwrap()).is_err());
        // JPY at scale 2 is not Stripe's JPY.
        let wrong = Asset::new("JPY", 2).unwrap();
        assert!(to_stripe(&Money::parse(wrong, "5.00").unwrap()).is_err());
        assert!(from_stripe(&asset("USD"), -1).is_err());
    }

    proptest! {
        #[test]
        fn round_trips_or_refuses(n in 0i64..i64::MAX, which in 0usize..4) {
            let a = asset(["USD", "JPY", "KWD", "EUR"][which]);
            let m = from_stripe(&a, n).unwrap();
            match to_stripe(&m) {
                Ok(back) => prop_assert_eq!(back, n),
                Err(_) => prop_assert!(a.code() == "KWD" && n % 10 != 0),
            }
        }
    }
}
