//! `kind = "stripe"`: Stripe PaymentIntents (a hold is a manual-capture intent).

use rail_core::payer::Idempotent;
use rail_core::{Asset, PayerHandle, RailError, RailReason, ReceiverHandle};
use rail_stripe::{StripeHttp, StripePayer, StripeReceiver};
use serde::Deserialize;

use super::config::{money, secret, section};
use super::{Ctx, Sides};
use crate::Error;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Section {
    /// Stripe's API (`https://api.stripe.com`, or an emulator's URL).
    #[serde(default = "api")]
    api_base: String,
    /// The currency (`usd`).
    #[serde(default = "usd")]
    currency: String,
    /// Payer: the payment method it pays with (`pm_…`).
    payment_method: Option<String>,
    /// Payer: the most one payment may be (`"20.00"`).
    max_amount: Option<String>,
    /// Receiver: the environment variable holding the account's secret key.
    secret_key_env: Option<String>,
    /// Receiver: the account's publishable key (sent to payers in offers).
    publishable_key: Option<String>,
    /// Receiver: the payee name its intents carry.
    payee: Option<String>,
}

fn api() -> String {
    "https://api.stripe.com".into()
}

fn usd() -> String {
    "usd".into()
}

pub(super) async fn build(ctx: &Ctx<'_>) -> Result<Sides, Error> {
    let s: Section = section(ctx.name, ctx.table)?;
    if s.currency != "usd" {
        return Err(Error::Config(format!(
            "rails.{}.currency: only usd is supported so far",
            ctx.name
        )));
    }
    let asset = Asset::usd();
    let payer = match &s.payment_method {
        Some(pm) => {
            let max = s.max_amount.as_deref().ok_or_else(|| {
                Error::Config(format!("rails.{}: a payer needs `max_amount`", ctx.name))
            })?;
            let max = money(ctx.name, "max_amount", &asset, max)?;
            let p = StripePayer::new(&s.api_base, pm.clone(), max, ctx.clock.clone())
                .map_err(|e| ctx.rail_err(e))?;
            Some(PayerHandle::with_holds(Idempotent::new(p, ctx.store()?)))
        }
        None => None,
    };
    let receiver = match (&s.secret_key_env, &s.publishable_key, &s.payee) {
        (Some(var), Some(pk), Some(payee)) => {
            let key = secret(ctx.env, ctx.name, var)?;
            let api = StripeHttp::new(&s.api_base, key).map_err(|e| {
                ctx.rail_err(RailError::Unavailable(RailReason::new(
                    "stripe",
                    e.to_string(),
                )))
            })?;
            Some(ReceiverHandle::full(StripeReceiver::new(
                api,
                pk.clone(),
                payee.clone(),
                asset,
                ctx.store()?,
                ctx.clock.clone(),
            )))
        }
        (None, None, None) => None,
        _ => {
            return Err(Error::Config(format!(
                "rails.{}: a receiver needs `secret_key_env`, `publishable_key` and `payee`",
                ctx.name
            )));
        }
    };
    Ok((payer, receiver).into())
}
