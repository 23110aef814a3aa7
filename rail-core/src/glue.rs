//! What every rail's implementation of the [`crate::rail`] traits repeats, written once: the
//! records a rail hands out ([`offer`], [`payment`], [`verified`]), the checks a payer or a
//! receiver makes before touching its rail ([`check_rail`], [`check_rail_and_mode`],
//! [`check_asset`], [`check_payer_limit`], [`check_charge`]), the refusals of the rails that
//! settle through a facilitator ([`served_already`], [`settlement_unknown`]), and
//! [`NothingToFind`] for payers whose retry is its own look-up.
//!
//! Plain functions: each builds or checks one thing and says which error it returns, with
//! the message the rails have always given (callers and tests compare them).

use std::fmt::Display;

use async_trait::async_trait;
use serde::Serialize;

use crate::clock::Timestamp;
use crate::error::{Binding, RailError, RailReason, RailResult};
use crate::money::{Asset, Money};
use crate::rail::{Capabilities, Finality, PayEffect};
use crate::types::{Charge, Offer, OpId, Payment, PaymentMode, PaymentState, RailId, Verified};

/// What a rail can do whose `pay` moves the money and which holds, captures part of a hold,
/// refunds and refunds in part, in one `asset` (a ledger, a card processor).
#[must_use]
pub fn full_capabilities(finality: Finality, asset: &Asset) -> Capabilities {
    Capabilities {
        pay: true,
        pay_effect: PayEffect::Moves,
        hold: true,
        partial_capture: true,
        refund: true,
        partial_refund: true,
        finality,
        assets: vec![asset.clone()],
    }
}

/// `value` as JSON, for an [`Offer`]'s `details` or a [`Payment`]'s `proof`.
///
/// # Errors
/// [`RailError::InvalidInput`] with serde's message when `value` does not serialize.
pub fn to_json<T: Serialize + ?Sized>(value: &T) -> RailResult<serde_json::Value> {
    serde_json::to_value(value).map_err(|e| RailError::InvalidInput(e.to_string()))
}

/// A receiver's offer on `rail` for `charge` (its amount and mode), under `id`, paying
/// `payee`, live until `expires_at`, carrying `details` (the rail's requirements).
///
/// # Errors
/// As [`to_json`], for `details`.
pub fn offer<D: Serialize + ?Sized>(
    rail: &str,
    id: String,
    charge: &Charge,
    payee: String,
    expires_at: Timestamp,
    details: &D,
) -> RailResult<Offer> {
    Ok(Offer {
        rail: RailId::new(rail),
        id,
        amount: charge.amount.clone(),
        payee,
        mode: charge.mode,
        expires_at,
        details: to_json(details)?,
    })
}

/// A payer's payment on `rail` of `offer` (its id and amount), made in `mode` by `payer`,
/// carrying `proof` (the rail's evidence).
///
/// # Errors
/// As [`to_json`], for `proof`.
pub fn payment<P: Serialize + ?Sized>(
    rail: &str,
    offer: &Offer,
    mode: PaymentMode,
    payer: String,
    proof: &P,
) -> RailResult<Payment> {
    Ok(Payment {
        rail: RailId::new(rail),
        offer_id: offer.id.clone(),
        mode,
        payer,
        amount: offer.amount.clone(),
        proof: to_json(proof)?,
    })
}

/// A receiver's answer to a verification on `rail` of a payment for `offer` (its id): the
/// rail's `payment_ref`, who paid, what was paid and in what `state`.
#[must_use]
pub fn verified(
    rail: &str,
    offer: &Offer,
    payment_ref: String,
    payer: String,
    amount: Money,
    state: PaymentState,
) -> Verified {
    Verified {
        rail: RailId::new(rail),
        offer_id: offer.id.clone(),
        payment_ref,
        payer,
        amount,
        state,
    }
}

/// For a payer: `offer` is for `rail`.
///
/// # Errors
/// [`RailError::Mismatch`] on [`Binding::Rail`] (expected `rail`).
pub fn check_rail(offer: &Offer, rail: &str) -> RailResult<()> {
    if offer.rail.as_str() != rail {
        return Err(RailError::mismatch(Binding::Rail, rail, &offer.rail));
    }
    Ok(())
}

/// For a payer: `offer` is for `rail` and asks for `mode` (checked in that order). Pay-only
/// rails use [`Offer::check_pay_only`] instead.
///
/// # Errors
/// As [`check_rail`]; then [`RailError::Mismatch`] on [`Binding::Mode`] (expected `mode`).
pub fn check_rail_and_mode(offer: &Offer, rail: &str, mode: PaymentMode) -> RailResult<()> {
    check_rail(offer, rail)?;
    if offer.mode != mode {
        return Err(RailError::mismatch(Binding::Mode, mode, offer.mode));
    }
    Ok(())
}

/// `money` is in `asset`, the one asset the caller's account or wallet holds.
///
/// # Errors
/// [`RailError::Mismatch`] on [`Binding::Asset`] (expected `asset`, found `money`'s).
pub fn check_asset(asset: &Asset, money: &Money) -> RailResult<()> {
    if money.asset() != asset {
        return Err(RailError::mismatch(Binding::Asset, asset, money.asset()));
    }
    Ok(())
}

/// A payer's per-payment limit: `amount` is at most `max` (compared in minor units; the
/// asset is the caller's to check).
///
/// # Errors
/// [`RailError::InvalidInput`] (`"{amount} is above this payer's limit of {max}"`).
pub fn check_payer_limit(amount: &Money, max: &Money) -> RailResult<()> {
    if amount.minor_units() > max.minor_units() {
        return Err(RailError::InvalidInput(format!(
            "{amount} is above this payer's limit of {max}"
        )));
    }
    Ok(())
}

/// A receiver's charge: in an asset of `caps` and not zero.
///
/// # Errors
/// As [`Capabilities::check_asset`]; then [`RailError::InvalidInput`] (`"amount must not be
/// zero"`).
pub fn check_charge(caps: &Capabilities, charge: &Charge) -> RailResult<()> {
    caps.check_asset(&charge.amount)?;
    if charge.amount.amount().is_zero() {
        return Err(RailError::InvalidInput("amount must not be zero".into()));
    }
    Ok(())
}

/// The refusal of a payment for `offer_id` that was served already, or is being served: a
/// replay.
#[must_use]
pub fn served_already(offer_id: &str) -> RailError {
    RailError::Replayed {
        key: format!("payment for offer {offer_id}"),
    }
}

/// The answer when a facilitator's settlement ended without a verdict (`detail` says how):
/// retryable, and verifying the same payment again is the recovery.
#[must_use]
pub fn settlement_unknown(detail: impl Display) -> RailError {
    RailError::Unavailable(RailReason::new(
        "facilitator",
        format!("{detail}; verify the same payment again"),
    ))
}

/// A payer whose earlier attempt needs no look-up: paying again under the same operation id
/// answers the earlier payment (the rail is idempotent by operation id), or can never move
/// money twice (a signature whose nonce is single use). Its
/// [`crate::payer::FindPayment::find_payment`] answers `None`, so [`crate::payer::Idempotent`]
/// recovers an unknown attempt by paying again.
///
/// Implement it (empty) only when that holds; a payer that must ask its rail what an earlier
/// attempt did implements [`crate::payer::FindPayment`] itself.
pub trait NothingToFind: Send + Sync {}

#[async_trait]
impl<T: NothingToFind> crate::payer::FindPayment for T {
    async fn find_payment(
        &self,
        _op: &OpId,
        _offer: &Offer,
        _mode: PaymentMode,
    ) -> RailResult<Option<Payment>> {
        Ok(None)
    }

    fn repeat_is_safe(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::payer::FindPayment;

    fn usd(s: &str) -> Money {
        Money::parse(Asset::usd(), s).unwrap()
    }

    fn hold_offer() -> Offer {
        offer(
            "r",
            "q_1".into(),
            &Charge::hold(usd("1.50"), Duration::from_secs(60)),
            "shop".into(),
            Timestamp(1_000),
            &serde_json::json!({"k": 1}),
        )
        .unwrap()
    }

    #[test]
    fn records_carry_the_offer() {
        let o = hold_offer();
        assert_eq!(
            (o.rail.as_str(), o.mode, o.amount.clone()),
            ("r", PaymentMode::Hold, usd("1.50"))
        );
        assert_eq!(o.details, serde_json::json!({"k": 1}));
        let p = payment("r", &o, PaymentMode::Hold, "me".into(), &"proof").unwrap();
        assert_eq!(
            (p.offer_id.as_str(), p.amount.clone(), p.proof.clone()),
            ("q_1", usd("1.50"), serde_json::json!("proof"))
        );
        p.check_envelope(&o).unwrap();
        let v = verified(
            "r",
            &o,
            "ref".into(),
            "me".into(),
            usd("1.50"),
            PaymentState::Settled,
        );
        assert_eq!((v.offer_id.as_str(), v.rail.as_str()), ("q_1", "r"));
    }

    #[test]
    fn checks_refuse_in_order_with_their_messages() {
        let o = hold_offer();
        let code = |r: RailResult<()>| r.unwrap_err().code();
        let other_rail = check_rail_and_mode(&o, "other", PaymentMode::Capture);
        assert_eq!(code(other_rail), Binding::Rail.code());
        let other_mode = check_rail_and_mode(&o, "r", PaymentMode::Capture);
        assert_eq!(code(other_mode), Binding::Mode.code());
        check_rail_and_mode(&o, "r", PaymentMode::Hold).unwrap();
        assert_eq!(
            code(check_asset(&Asset::usdc(), &o.amount)),
            Binding::Asset.code()
        );
        let e = check_payer_limit(&o.amount, &usd("1.00")).unwrap_err();
        let want = format!(
            "{} is above this payer's limit of {}",
            usd("1.50"),
            usd("1.00")
        );
        assert!(
            matches!(e, RailError::InvalidInput(ref m) if *m == want),
            "{e:?}"
        );
        check_payer_limit(&o.amount, &usd("1.50")).unwrap();
        let caps = full_capabilities(Finality::Immediate, &Asset::usd());
        let zero = Charge::capture(usd("0"), Duration::from_secs(1));
        let e = check_charge(&caps, &zero).unwrap_err();
        assert!(matches!(e, RailError::InvalidInput(ref m) if m == "amount must not be zero"));
    }

    #[tokio::test]
    async fn nothing_to_find_answers_none() {
        #[derive(Debug)]
        struct Repays;
        impl NothingToFind for Repays {}
        let found = Repays
            .find_payment(&OpId::random(), &hold_offer(), PaymentMode::Hold)
            .await
            .unwrap();
        assert_eq!(found, None);
    }
}
