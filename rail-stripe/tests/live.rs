#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    missing_docs
)]
//! The live tier: the rail against Stripe's test mode, when `STRIPE_SECRET_KEY` (an
//! `sk_test_…` key) and `STRIPE_PUBLISHABLE_KEY` (`pk_test_…`) are set. Stripe is not reachable
//! from the project's machines, so this is skipped there with a visible message; it never runs
//! with a live-mode key.

use std::sync::Arc;
use std::time::Duration;

use rail_core::payer::Idempotent;
use rail_core::{
    Asset, Charge, HoldPayer, HoldReceiver, MemoryKeyStore, Money, OpId, Payer, RailReceiver,
    RefundReceiver, SystemClock,
};
use rail_stripe::client::STRIPE_API;
use rail_stripe::{StripeHttp, StripePayer, StripeReceiver};

#[tokio::test]
async fn pay_hold_capture_refund_against_stripe_test_mode() {
    let (Ok(sk), Ok(pk)) = (
        std::env::var("STRIPE_SECRET_KEY"),
        std::env::var("STRIPE_PUBLISHABLE_KEY"),
    ) else {
        eprintln!(
            "SKIPPED: live Stripe tier (set STRIPE_SECRET_KEY=sk_test_… and STRIPE_PUBLISHABLE_KEY=pk_test_… to run it)"
        );
        return;
    };
    assert!(
        sk.starts_with("sk_test_") && pk.starts_with("pk_test_"),
        "the live tier runs only with test-mode keys"
    );
    let (store, clock) = (Arc::new(MemoryKeyStore::default()), Arc::new(SystemClock));
    let receiver = StripeReceiver::new(
        StripeHttp::new(STRIPE_API, sk).unwrap(),
        pk,
        "stipendex-live-test",
        Asset::usd(),
        store.clone(),
        clock.clone(),
    );
    let usd = |s| Money::parse(Asset::usd(), s).unwrap();
    let payer = Idempotent::new(
        StripePayer::new(STRIPE_API, "pm_card_visa", usd("20.00"), clock).unwrap(),
        store,
    );
    let ttl = Duration::from_secs(600);

    let offer = receiver
        .offer(&Charge::capture(usd("1.00"), ttl))
        .await
        .unwrap();
    let paid = payer.pay(&OpId::random(), &offer).await.unwrap();
    let v = receiver.verify(&offer, &paid).await.unwrap();
    assert!(
        receiver.verify(&offer, &paid).await.is_err(),
        "a replay must be refused"
    );
    receiver
        .refund(&OpId::random(), &v.payment_ref, &usd("0.40"))
        .await
        .unwrap();

    let offer = receiver
        .offer(&Charge::hold(usd("2.00"), ttl))
        .await
        .unwrap();
    let held = payer.hold(&OpId::random(), &offer).await.unwrap();
    let h = receiver.verify(&offer, &held).await.unwrap();
    let c = receiver
        .capture(&OpId::random(), &h, &usd("1.50"))
        .await
        .unwrap();
    assert_eq!(c.released, usd("0.50"));
}
