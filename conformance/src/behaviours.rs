//! The behaviours: one plain `async fn` each, taking the rail through a [`Harness`]. A behaviour
//! runs only where the rail claims the capability it [`Needs`]; a claimed capability that fails
//! is a failure, never a skip.

use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use rail_core::{
    Charge, Money, Offer, OpId, PayEffect, Payment, PaymentMode, PaymentState, RailError, Verified,
};
use serde_json::json;

use crate::harness::{Balances, Harness};

/// A behaviour's verdict: `Ok` or what went wrong.
pub type Verdict = Result<(), String>;

/// The capability a behaviour needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Runs for every rail.
    Nothing,
    /// `pay` / `verify`.
    Pay,
    /// `hold` / `capture` / `void`.
    Hold,
    /// Partial capture.
    PartialCapture,
    /// Refunds.
    Refund,
    /// Partial refunds.
    PartialRefund,
}

/// A named behaviour, run on a harness of type `H`: [`Harness`] for the rail suite; a suite
/// built on this one (the Stipendex protocol behaviours of `stipendex-conformance`) runs on an
/// extension trait of [`Harness`] with the same report.
pub struct Behaviour<H: ?Sized = dyn Harness> {
    /// Its name, as printed.
    pub name: &'static str,
    /// What it checks, in one line.
    pub about: &'static str,
    /// The capability it needs.
    pub needs: Needs,
    /// The behaviour.
    pub run: for<'a> fn(&'a H) -> BoxFuture<'a, Verdict>,
}

impl<H: ?Sized> Clone for Behaviour<H> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<H: ?Sized> Copy for Behaviour<H> {}

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

fn ok<T>(what: &str, r: Result<T, RailError>) -> Result<T, String> {
    r.map_err(|e| format!("{what} failed: {e} (code {})", e.code()))
}

/// Expects an error whose code is one of `codes`.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, RailError>, codes: &[&str]) -> Verdict {
    match r {
        Ok(v) => Err(format!(
            "{what} was accepted ({v:?}); expected one of {codes:?}"
        )),
        Err(e) if codes.contains(&e.code()) => Ok(()),
        Err(e) => Err(format!(
            "{what}: expected one of {codes:?}, got {} ({e})",
            e.code()
        )),
    }
}

fn units(m: &Money) -> i128 {
    i128::try_from(m.minor_units()).unwrap_or(i128::MAX)
}

fn price(h: &dyn Harness, minor: u128) -> Result<Money, String> {
    Money::from_minor(h.asset(), minor).map_err(|e| e.to_string())
}

const TTL: Duration = Duration::from_secs(120);

async fn offer(h: &dyn Harness, minor: u128, mode: PaymentMode) -> Result<Offer, String> {
    let amount = price(h, minor)?;
    let charge = match mode {
        PaymentMode::Capture => Charge::capture(amount, TTL),
        PaymentMode::Hold => Charge::hold(amount, TTL),
    };
    ok("offer", h.rail().receiver.offer(&charge).await)
}

async fn balances(h: &dyn Harness) -> Result<Balances, String> {
    ok("balances", h.balances().await)
}

async fn unchanged(h: &dyn Harness, before: Balances, what: &str) -> Verdict {
    let after = balances(h).await?;
    ensure!(
        after == before,
        "{what} changed balances: {before:?} -> {after:?}"
    );
    Ok(())
}

async fn paid(h: &dyn Harness, minor: u128) -> Result<(Offer, Payment), String> {
    let o = offer(h, minor, PaymentMode::Capture).await?;
    let p = ok("pay", h.rail().payer.pay(&OpId::random(), &o).await)?;
    Ok((o, p))
}

async fn held(h: &dyn Harness, minor: u128) -> Result<(Offer, Verified), String> {
    let (payer, receiver) = ok("holds", h.rail().holds())?;
    let o = offer(h, minor, PaymentMode::Hold).await?;
    let p = ok("hold", payer.hold(&OpId::random(), &o).await)?;
    let v = ok("verify hold", receiver.verify(&o, &p).await)?;
    ensure!(
        matches!(v.state, PaymentState::Held { .. }),
        "a verified hold must be Held, got {:?}",
        v.state
    );
    Ok((o, v))
}

fn op() -> OpId {
    OpId::random()
}

// ------------------------------------------------------------------------------------------

async fn capabilities_are_honest(h: &dyn Harness) -> Verdict {
    let r = h.rail();
    let c = r.capabilities();
    ensure!(c.pay, "every rail must claim pay");
    ensure!(
        c.hold == (r.hold_payer.is_some() && r.hold_receiver.is_some()),
        "claims hold={} but the hold parts are {}",
        c.hold,
        if r.hold_payer.is_some() {
            "present"
        } else {
            "absent"
        }
    );
    ensure!(
        c.refund == r.refunds.is_some(),
        "claims refund={} but the refund part disagrees",
        c.refund
    );
    ensure!(
        !c.partial_capture || c.hold,
        "partial capture claimed without hold"
    );
    ensure!(
        !c.partial_refund || c.refund,
        "partial refund claimed without refund"
    );
    ensure!(
        c.assets.contains(&h.asset()),
        "the harness asset {} is not among the claimed assets",
        h.asset()
    );
    ensure!(
        r.payer.id() == r.receiver.id(),
        "payer and receiver name different rails"
    );
    Ok(())
}

async fn pay_then_verify(h: &dyn Harness) -> Verdict {
    let before = balances(h).await?;
    let (o, p) = paid(h, 125).await?;
    ensure!(
        p.rail == o.rail && p.offer_id == o.id,
        "payment must name its rail and offer"
    );
    let v = ok("verify", h.rail().receiver.verify(&o, &p).await)?;
    ensure!(
        v.amount == o.amount,
        "verified {} for an offer of {}",
        v.amount,
        o.amount
    );
    ensure!(
        v.state == PaymentState::Settled,
        "a paid offer must verify as settled, got {:?}",
        v.state
    );
    let after = balances(h).await?;
    ensure!(
        after.payer_available == before.payer_available - 125,
        "payer debited {} instead of 125",
        before.payer_available - after.payer_available
    );
    ensure!(
        after.payee_settled == before.payee_settled + 125,
        "payee credited {} instead of 125",
        after.payee_settled - before.payee_settled
    );
    // Offers, payments and results are plain data: they survive JSON.
    let back: Offer = serde_json::from_value(serde_json::to_value(&o).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    ensure!(back == o, "offer does not survive a JSON round trip");
    let back: Payment =
        serde_json::from_value(serde_json::to_value(&p).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    ensure!(back == p, "payment does not survive a JSON round trip");
    Ok(())
}

/// Where the money moves is what the rail claims: by the time `pay` returns (the payer's money
/// is gone) or only when the receiver's `verify` settles (nothing moved before).
async fn pay_moves_money_as_claimed(h: &dyn Harness) -> Verdict {
    let effect = h.rail().capabilities().pay_effect;
    let before = balances(h).await?;
    let (o, p) = paid(h, 125).await?;
    let signed = balances(h).await?;
    match effect {
        PayEffect::Moves => ensure!(
            signed.payer_available == before.payer_available - 125,
            "the rail claims `pay` moves the money, but after pay the payer was debited {} instead of 125",
            before.payer_available - signed.payer_available
        ),
        PayEffect::SignsOnly => ensure!(
            signed == before,
            "the rail claims `pay` only signs, but money moved before verify: {before:?} → {signed:?}"
        ),
    }
    ok("verify", h.rail().receiver.verify(&o, &p).await)?;
    let after = balances(h).await?;
    ensure!(
        after.payer_available == before.payer_available - 125
            && after.payee_settled == before.payee_settled + 125,
        "after verify the price must have moved: {before:?} → {after:?}"
    );
    Ok(())
}

async fn verify_binds_offer(h: &dyn Harness) -> Verdict {
    let (a, pa) = paid(h, 100).await?;
    let b = offer(h, 100, PaymentMode::Capture).await?;
    let mut for_b = pa.clone();
    for_b.offer_id.clone_from(&b.id);
    refused(
        "a payment for offer A presented for offer B",
        h.rail().receiver.verify(&b, &for_b).await,
        &["offer_mismatch"],
    )?;
    refused(
        "a payment for offer A presented as is for offer B",
        h.rail().receiver.verify(&b, &pa).await,
        &["offer_mismatch"],
    )?;
    ok(
        "verify A after the refused attempts",
        h.rail().receiver.verify(&a, &pa).await,
    )?;
    Ok(())
}

async fn verify_binds_amount(h: &dyn Harness) -> Verdict {
    let (a, pa) = paid(h, 100).await?;
    let dear = offer(h, 200, PaymentMode::Capture).await?;
    let mut forged = pa.clone();
    forged.offer_id.clone_from(&dear.id);
    forged.amount = dear.amount.clone();
    refused(
        "a 100-unit payment dressed up for a 200-unit offer",
        h.rail().receiver.verify(&dear, &forged).await,
        &["amount_mismatch", "offer_mismatch"],
    )?;
    let mut under = pa.clone();
    under.amount = price(h, 99)?;
    refused(
        "a payment claiming another amount",
        h.rail().receiver.verify(&a, &under).await,
        &["amount_mismatch"],
    )?;
    // The same offer id at a higher price, and a payment claiming that price: only the rail's
    // own record of what moved can tell.
    let mut dearer = a.clone();
    dearer.amount = price(h, 200)?;
    let mut claimed = pa.clone();
    claimed.amount = dearer.amount.clone();
    refused(
        "a 100-unit payment claimed as 200 for the same offer id",
        h.rail().receiver.verify(&dearer, &claimed).await,
        &["amount_mismatch"],
    )?;
    ok(
        "verify the genuine payment",
        h.rail().receiver.verify(&a, &pa).await,
    )?;
    Ok(())
}

async fn verify_binds_payee(h: &dyn Harness) -> Verdict {
    let genuine = offer(h, 100, PaymentMode::Capture).await?;
    let mut diverted = genuine.clone();
    diverted.payee = h.other_payee();
    let before = balances(h).await?;
    // Either the payer sees that the offer does not hang together and refuses before paying
    // (rails where the destination is fixed by the rail's own object, as a Stripe intent), or
    // it pays the other payee and the receiver refuses the payment.
    match h.rail().payer.pay(&op(), &diverted).await {
        Err(e) if ["payee_mismatch", "offer_mismatch"].contains(&e.code()) => {}
        Err(e) => {
            return Err(format!(
                "paying a diverted offer: expected success or a payee/offer mismatch, got {} ({e})",
                e.code()
            ));
        }
        Ok(p) => refused(
            "a payment to another payee",
            h.rail().receiver.verify(&genuine, &p).await,
            &["payee_mismatch", "offer_mismatch"],
        )?,
    }
    let after = balances(h).await?;
    ensure!(
        after.payee_settled == before.payee_settled,
        "the payee's balance moved on a diverted payment"
    );
    Ok(())
}

async fn replay_refused(h: &dyn Harness) -> Verdict {
    let (o, p) = paid(h, 100).await?;
    ok("first verify", h.rail().receiver.verify(&o, &p).await)?;
    let before = balances(h).await?;
    refused(
        "the same payment again",
        h.rail().receiver.verify(&o, &p).await,
        &["replayed"],
    )?;
    // Re-serialized (a proxy, a retry from another process): still a replay.
    let copy: Payment =
        serde_json::from_str(&serde_json::to_string(&p).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    refused(
        "a copy of the payment",
        h.rail().receiver.verify(&o, &copy).await,
        &["replayed"],
    )?;
    unchanged(h, before, "a replay").await
}

async fn concurrent_verify_settles_once(h: &dyn Harness) -> Verdict {
    // Balances before paying: rails settled by the receiver move money on verify, the others
    // on pay; either way one payment verified 16 times moves the price exactly once.
    let before = balances(h).await?;
    let (o, p) = paid(h, 100).await?;
    let results = join_all((0..16).map(|_| h.rail().receiver.verify(&o, &p))).await;
    let accepted = results.iter().filter(|r| r.is_ok()).count();
    ensure!(
        accepted == 1,
        "{accepted} of 16 concurrent verifications accepted the payment"
    );
    for r in &results {
        if let Err(e) = r {
            ensure!(
                e.code() == "replayed",
                "a losing verification must say replayed, got {} ({e})",
                e.code()
            );
        }
    }
    let after = balances(h).await?;
    ensure!(
        after.payer_available == before.payer_available - 100
            && after.payee_settled == before.payee_settled + 100,
        "one payment verified 16 times concurrently moved {before:?} -> {after:?}"
    );
    Ok(())
}

async fn concurrent_pay_settles_once(h: &dyn Harness) -> Verdict {
    let o = offer(h, 100, PaymentMode::Capture).await?;
    let before = balances(h).await?;
    let id = op();
    let results = join_all((0..16).map(|_| h.rail().payer.pay(&id, &o))).await;
    let mut payments = Vec::new();
    for r in results {
        payments.push(ok("concurrent pay with one operation id", r)?);
    }
    ensure!(
        payments.windows(2).all(|w| w.first() == w.last()),
        "16 submissions of one operation produced different payments"
    );
    let first = payments.first().ok_or("no payment")?;
    // Rails settled by the receiver (exact-algo, x402) move money on verify: check the debit
    // once the payment is verified, which holds for both kinds.
    let v = join_all((0..16).map(|_| h.rail().receiver.verify(&o, first))).await;
    ensure!(
        v.iter().filter(|r| r.is_ok()).count() == 1,
        "the payment must verify exactly once"
    );
    let after = balances(h).await?;
    ensure!(
        after.payer_available == before.payer_available - 100,
        "payer debited {} for one payment submitted 16 times",
        before.payer_available - after.payer_available
    );
    Ok(())
}

async fn expired_offer_refused(h: &dyn Harness) -> Verdict {
    let o = offer(h, 100, PaymentMode::Capture).await?;
    let before = balances(h).await?;
    h.clock().advance(TTL + Duration::from_secs(1));
    refused(
        "paying an expired offer",
        h.rail().payer.pay(&op(), &o).await,
        &["offer_expired"],
    )?;
    unchanged(h, before, "paying an expired offer").await?;
    let (o2, p2) = paid(h, 100).await?;
    h.clock().advance(TTL + Duration::from_secs(1));
    refused(
        "verifying after the offer expired",
        h.rail().receiver.verify(&o2, &p2).await,
        &["offer_expired"],
    )?;
    Ok(())
}

async fn hold_then_full_capture(h: &dyn Harness) -> Verdict {
    let before = balances(h).await?;
    let (o, v) = held(h, 300).await?;
    let mid = balances(h).await?;
    ensure!(
        mid.payer_available == before.payer_available - 300,
        "a hold must reserve the payer's funds"
    );
    ensure!(
        mid.payee_settled == before.payee_settled,
        "a hold must not settle to the payee"
    );
    let (_, r) = ok("holds", h.rail().holds())?;
    let c = ok("capture", r.capture(&op(), &v, &o.amount).await)?;
    ensure!(
        c.captured == o.amount,
        "captured {} of {}",
        c.captured,
        o.amount
    );
    ensure!(
        c.released.amount().is_zero(),
        "a full capture released {}",
        c.released
    );
    let after = balances(h).await?;
    ensure!(
        after.payee_settled == before.payee_settled + 300,
        "payee got {} instead of 300",
        after.payee_settled - before.payee_settled
    );
    ensure!(
        after.payer_available == before.payer_available - 300,
        "payer paid {} instead of 300",
        before.payer_available - after.payer_available
    );
    Ok(())
}

async fn hold_then_partial_capture(h: &dyn Harness) -> Verdict {
    let before = balances(h).await?;
    let (_, v) = held(h, 300).await?;
    let (_, r) = ok("holds", h.rail().holds())?;
    let c = ok(
        "partial capture",
        r.capture(&op(), &v, &price(h, 120)?).await,
    )?;
    ensure!(
        units(&c.captured) == 120 && units(&c.released) == 180,
        "captured {} / released {}",
        c.captured,
        c.released
    );
    let after = balances(h).await?;
    ensure!(
        after.payer_available == before.payer_available - 120,
        "the uncaptured rest must return to the payer"
    );
    ensure!(
        after.payee_settled == before.payee_settled + 120,
        "payee must get exactly the captured part"
    );
    refused(
        "a second capture of the same hold",
        r.capture(&op(), &v, &price(h, 10)?).await,
        &["invalid_state"],
    )?;
    Ok(())
}

async fn capture_above_hold_refused(h: &dyn Harness) -> Verdict {
    let (_, v) = held(h, 300).await?;
    let before = balances(h).await?;
    let (_, r) = ok("holds", h.rail().holds())?;
    refused(
        "capturing more than held",
        r.capture(&op(), &v, &price(h, 301)?).await,
        &["exceeds_available"],
    )?;
    unchanged(h, before, "a refused capture").await?;
    ok(
        "a capture within the hold afterwards",
        r.capture(&op(), &v, &price(h, 300)?).await,
    )?;
    Ok(())
}

async fn void_releases(h: &dyn Harness) -> Verdict {
    let before = balances(h).await?;
    let (_, v) = held(h, 250).await?;
    let (_, r) = ok("holds", h.rail().holds())?;
    let x = ok("void", r.void(&op(), &v).await)?;
    ensure!(units(&x.released) == 250, "void released {}", x.released);
    unchanged(h, before, "hold then void").await
}

async fn capture_after_void_refused(h: &dyn Harness) -> Verdict {
    let (o, v) = held(h, 250).await?;
    let (_, r) = ok("holds", h.rail().holds())?;
    ok("void", r.void(&op(), &v).await)?;
    let before = balances(h).await?;
    refused(
        "capture after void",
        r.capture(&op(), &v, &o.amount).await,
        &["invalid_state"],
    )?;
    refused(
        "void after void (new operation)",
        r.void(&op(), &v).await,
        &["invalid_state"],
    )?;
    unchanged(h, before, "capture after void").await
}

async fn settled(h: &dyn Harness, minor: u128) -> Result<(Offer, Verified), String> {
    let (o, p) = paid(h, minor).await?;
    let v = ok("verify", h.rail().receiver.verify(&o, &p).await)?;
    Ok((o, v))
}

async fn refund_full(h: &dyn Harness) -> Verdict {
    let before = balances(h).await?;
    let (o, v) = settled(h, 400).await?;
    let r = ok("refunds", h.rail().refunder())?;
    let x = ok("refund", r.refund(&op(), &v.payment_ref, &o.amount).await)?;
    ensure!(
        x.amount == o.amount,
        "refunded {} of {}",
        x.amount,
        o.amount
    );
    unchanged(h, before, "pay then full refund").await
}

async fn refund_partial(h: &dyn Harness) -> Verdict {
    let before = balances(h).await?;
    let (_, v) = settled(h, 400).await?;
    let r = ok("refunds", h.rail().refunder())?;
    ok(
        "first partial refund",
        r.refund(&op(), &v.payment_ref, &price(h, 150)?).await,
    )?;
    ok(
        "second partial refund",
        r.refund(&op(), &v.payment_ref, &price(h, 50)?).await,
    )?;
    let after = balances(h).await?;
    ensure!(
        after.payer_available == before.payer_available - 200,
        "payer must be down exactly 200 after refunds of 150 + 50 of 400"
    );
    Ok(())
}

async fn refund_above_captured_refused(h: &dyn Harness) -> Verdict {
    let (_, v) = settled(h, 400).await?;
    let r = ok("refunds", h.rail().refunder())?;
    let before = balances(h).await?;
    refused(
        "refunding more than was paid",
        r.refund(&op(), &v.payment_ref, &price(h, 401)?).await,
        &["exceeds_available"],
    )?;
    unchanged(h, before, "a refused refund").await?;
    if h.rail().capabilities().partial_refund {
        ok(
            "refund 300",
            r.refund(&op(), &v.payment_ref, &price(h, 300)?).await,
        )?;
        refused(
            "refunds adding up to more than was paid",
            r.refund(&op(), &v.payment_ref, &price(h, 101)?).await,
            &["exceeds_available"],
        )?;
    }
    Ok(())
}

async fn idempotent_retry_same_result(h: &dyn Harness) -> Verdict {
    let o = offer(h, 100, PaymentMode::Capture).await?;
    let before = balances(h).await?;
    let id = op();
    let first = ok("pay", h.rail().payer.pay(&id, &o).await)?;
    let again = ok(
        "pay again with the same operation id",
        h.rail().payer.pay(&id, &o).await,
    )?;
    ensure!(first == again, "a retry returned a different payment");
    ok("verify", h.rail().receiver.verify(&o, &first).await)?;
    let after = balances(h).await?;
    ensure!(
        after.payer_available == before.payer_available - 100,
        "a retried payment was charged twice"
    );
    if let Ok((_, r)) = h.rail().holds() {
        let (ho, v) = held(h, 200).await?;
        let cid = op();
        let c1 = ok("capture", r.capture(&cid, &v, &ho.amount).await)?;
        let c2 = ok("capture retried", r.capture(&cid, &v, &ho.amount).await)?;
        ensure!(c1 == c2, "a retried capture returned a different result");
    }
    Ok(())
}

async fn same_op_different_content_conflicts(h: &dyn Harness) -> Verdict {
    let a = offer(h, 100, PaymentMode::Capture).await?;
    let b = offer(h, 150, PaymentMode::Capture).await?;
    let id = op();
    ok("pay A", h.rail().payer.pay(&id, &a).await)?;
    let before = balances(h).await?;
    refused(
        "the same operation id for another offer",
        h.rail().payer.pay(&id, &b).await,
        &["idempotency_conflict"],
    )?;
    unchanged(h, before, "a conflicting retry").await
}

/// Generic malformed variants of a valid payment; every one must be refused with a typed error.
fn malformed_variants(h: &dyn Harness, valid: &Payment) -> Vec<(String, Payment)> {
    let mut v: Vec<(String, Payment)> = Vec::new();
    let mut push = |name: &str, f: &dyn Fn(&mut Payment)| {
        let mut p = valid.clone();
        f(&mut p);
        v.push((name.to_owned(), p));
    };
    push("proof is null", &|p| p.proof = serde_json::Value::Null);
    push("proof is a string", &|p| p.proof = json!("paid, trust me"));
    push("proof is an empty object", &|p| p.proof = json!({}));
    push("proof is an array", &|p| p.proof = json!([p.proof.clone()]));
    push("proof has an unknown field", &|p| {
        if let Some(o) = p.proof.as_object_mut() {
            o.insert("extra".into(), json!(1));
        }
    });
    push("proof values blanked", &|p| {
        if let Some(o) = p.proof.as_object_mut() {
            for val in o.values_mut() {
                *val = json!("");
            }
        }
    });
    push("proof values are numbers", &|p| {
        if let Some(o) = p.proof.as_object_mut() {
            for val in o.values_mut() {
                *val = json!(1e308);
            }
        }
    });
    push("another rail's tag", &|p| {
        p.rail = rail_core::RailId::new(if p.rail.as_str() == "ledger" {
            "x402"
        } else {
            "ledger"
        });
    });
    push("mode flipped", &|p| {
        p.mode = match p.mode {
            PaymentMode::Capture => PaymentMode::Hold,
            PaymentMode::Hold => PaymentMode::Capture,
        };
    });
    push("offer id empty", &|p| p.offer_id = String::new());
    push("payer garbage", &|p| {
        p.payer = "\u{0}'; DROP TABLE ledger_transfers; --".into();
    });
    if let Ok(more) = Money::from_minor(h.asset(), valid.amount.minor_units() + 1) {
        push("amount raised by one unit", &|p| p.amount = more.clone());
    }
    v.extend(h.malformed(valid));
    v
}

async fn malformed_payments_refused(h: &dyn Harness) -> Verdict {
    let (o, p) = paid(h, 100).await?;
    let before = balances(h).await?;
    let variants = malformed_variants(h, &p);
    ensure!(
        variants.len() >= 8,
        "only {} malformed shapes",
        variants.len()
    );
    for (name, bad) in &variants {
        match h.rail().receiver.verify(&o, bad).await {
            Ok(v) => return Err(format!("malformed payment ({name}) was accepted: {v:?}")),
            Err(e) => ensure!(
                !e.is_retryable(),
                "malformed payment ({name}) got a retryable error {} ({e}): it must be a permanent, typed refusal",
                e.code()
            ),
        }
    }
    // Also as raw JSON that does not even decode as a payment.
    for raw in [
        json!(null),
        json!({"rail": "ledger"}),
        json!({"amount": 1.5}),
        json!([]),
    ] {
        ensure!(
            serde_json::from_value::<Payment>(raw.clone()).is_err(),
            "{raw} decoded as a payment"
        );
    }
    unchanged(h, before, "malformed payments").await?;
    ok(
        "the genuine payment after all the malformed ones",
        h.rail().receiver.verify(&o, &p).await,
    )?;
    Ok(())
}

async fn smallest_unit_exact(h: &dyn Harness) -> Verdict {
    // The smallest amount the rail carries (one minor unit, or the rail's minimum charge),
    // exactly; below a minimum, a typed refusal.
    let least = h.smallest_payable();
    let before = balances(h).await?;
    let (o, p) = paid(h, least).await?;
    let v = ok("verify", h.rail().receiver.verify(&o, &p).await)?;
    ensure!(
        units(&v.amount) == i128::try_from(least).unwrap_or(i128::MAX),
        "{least} minor units verified as {}",
        v.amount
    );
    let after = balances(h).await?;
    ensure!(
        after.payee_settled - before.payee_settled == i128::try_from(least).unwrap_or(i128::MAX),
        "the payee got {} units for {least}",
        after.payee_settled - before.payee_settled
    );
    if least > 1 {
        refused(
            "an offer below the rail's minimum",
            h.rail()
                .receiver
                .offer(&Charge::capture(price(h, least - 1)?, TTL))
                .await,
            &["invalid_input", "invalid_amount"],
        )?;
    }
    // Less than a minor unit is not money on this rail.
    let scale = h.asset().scale();
    let tiny = format!("0.{}1", "0".repeat(usize::from(scale)));
    ensure!(
        Money::parse(h.asset(), &tiny).is_err(),
        "{tiny} {} must not be representable",
        h.asset()
    );
    Ok(())
}

async fn overflow_refused(h: &dyn Harness) -> Verdict {
    let before = balances(h).await?;
    for units in [u128::from(u64::MAX), u128::MAX] {
        let huge = price(h, units)?;
        let r = h.rail().receiver.offer(&Charge::capture(huge, TTL)).await;
        refused(
            &format!("an offer of {units} minor units"),
            r,
            &["invalid_amount", "invalid_input"],
        )?;
    }
    unchanged(h, before, "refused huge offers").await
}

async fn insufficient_funds_refused(h: &dyn Harness) -> Verdict {
    let before = balances(h).await?;
    let o = offer(h, h.funded() * 4, PaymentMode::Capture).await?;
    refused(
        "paying more than the payer has",
        h.rail().payer.pay(&op(), &o).await,
        &["insufficient_funds"],
    )?;
    unchanged(h, before, "an unaffordable payment").await
}

async fn refund_after_capture(h: &dyn Harness) -> Verdict {
    if !h.rail().capabilities().hold {
        return Err(SKIP_NO_HOOK.into());
    }
    let before = balances(h).await?;
    let (_, v) = held(h, 300).await?;
    let (_, r) = ok("holds", h.rail().holds())?;
    let take = if h.rail().capabilities().partial_capture {
        200
    } else {
        300
    };
    let c = ok("capture", r.capture(&op(), &v, &price(h, take)?).await)?;
    let refunds = ok("refunds", h.rail().refunder())?;
    refused(
        "refunding more than was captured",
        refunds
            .refund(&op(), &c.capture_ref, &price(h, take + 1)?)
            .await,
        &["exceeds_available"],
    )?;
    ok(
        "refund what was captured",
        refunds.refund(&op(), &c.capture_ref, &c.captured).await,
    )?;
    unchanged(
        h,
        before,
        "hold, partial capture, full refund of the capture",
    )
    .await
}

async fn hold_expiry_releases(h: &dyn Harness) -> Verdict {
    let Some(life) = h.hold_lifetime() else {
        return Err(SKIP_NO_HOOK.into());
    };
    let before = balances(h).await?;
    let (o, v) = held(h, 300).await?;
    h.clock().advance(life + Duration::from_secs(1));
    let (_, r) = ok("holds", h.rail().holds())?;
    refused(
        "capturing a lapsed hold",
        r.capture(&op(), &v, &o.amount).await,
        &["invalid_state"],
    )?;
    refused(
        "voiding a lapsed hold",
        r.void(&op(), &v).await,
        &["invalid_state"],
    )?;
    unchanged(h, before, "a hold that lapsed").await
}

async fn foreign_payments_untouchable(h: &dyn Harness) -> Verdict {
    let Some(other) = h.other_receiver() else {
        return Err(SKIP_NO_HOOK.into());
    };
    let (_, v) = settled(h, 200).await?;
    let before = balances(h).await?;
    if let Ok(r) = other.refunder() {
        refused(
            "another receiver refunding this receiver's payment",
            r.refund(&op(), &v.payment_ref, &v.amount).await,
            &["not_found", "payee_mismatch", "invalid_state"],
        )?;
    }
    if let (Ok((_, mine)), Ok((_, theirs))) = (h.rail().holds(), other.holds()) {
        let (o, hv) = held(h, 150).await?;
        let before = balances(h).await?;
        refused(
            "another receiver capturing this receiver's hold",
            theirs.capture(&op(), &hv, &o.amount).await,
            &["not_found", "payee_mismatch", "invalid_state"],
        )?;
        refused(
            "another receiver voiding this receiver's hold",
            theirs.void(&op(), &hv).await,
            &["not_found", "payee_mismatch", "invalid_state"],
        )?;
        unchanged(h, before, "foreign capture and void attempts").await?;
        ok(
            "the owner captures its hold",
            mine.capture(&op(), &hv, &o.amount).await,
        )?;
    }
    let after = balances(h).await?;
    ensure!(
        after.payee_settled >= before.payee_settled,
        "a foreign refund moved this receiver's money"
    );
    Ok(())
}

async fn twin_receivers_settle_once(h: &dyn Harness) -> Verdict {
    let Some(twin) = h.twin_receiver() else {
        return Err(SKIP_NO_HOOK.into());
    };
    let before = balances(h).await?;
    let (o, p) = paid(h, 100).await?;
    let (mine, theirs) = futures::join!(
        h.rail().receiver.verify(&o, &p),
        twin.receiver.verify(&o, &p)
    );
    let wins = usize::from(mine.is_ok()) + usize::from(theirs.is_ok());
    ensure!(
        wins == 1,
        "{wins} of two receiver instances sharing one store accepted the same payment"
    );
    for r in [&mine, &theirs] {
        if let Err(e) = r {
            ensure!(
                e.code() == "replayed",
                "the losing instance must say replayed, got {} ({e})",
                e.code()
            );
        }
    }
    refused(
        "the same payment at the other instance afterwards",
        twin.receiver.verify(&o, &p).await,
        &["replayed"],
    )?;
    let after = balances(h).await?;
    ensure!(
        after.payee_settled == before.payee_settled + 100,
        "the payee got {} for one payment presented at two instances",
        after.payee_settled - before.payee_settled
    );
    Ok(())
}

async fn rail_specific_checks(h: &dyn Harness) -> Verdict {
    let checks = h.rail_checks().await;
    if checks.is_empty() {
        return Err(SKIP_NO_HOOK.into());
    }
    let failed: Vec<String> = checks
        .iter()
        .filter_map(|(name, v)| v.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    ensure!(
        failed.is_empty(),
        "{} of {} rail-specific checks failed: {}",
        failed.len(),
        checks.len(),
        failed.join("; ")
    );
    Ok(())
}

/// The verdict of a behaviour whose harness hook is absent: reported as a skip.
pub const SKIP_NO_HOOK: &str = "skip: the harness does not provide this hook";

/// The prefix of a verdict that skips: a behaviour that does not apply to the rail before it
/// (the harness lacks a hook, [`SKIP_NO_HOOK`], or the rail is not the kind the behaviour is
/// about) returns `Err` with a message starting with it, and is reported as skipped.
pub const SKIP: &str = "skip: ";

macro_rules! behaviours {
    ($( $f:ident : $needs:ident => $about:literal ),* $(,)?) => {
        /// Every behaviour of the rail suite, in run order.
        #[must_use]
        pub fn all() -> Vec<Behaviour> {
            vec![$(Behaviour {
                name: stringify!($f),
                about: $about,
                needs: Needs::$needs,
                run: |h| Box::pin($f(h)),
            }),*]
        }
    };
}

behaviours! {
    capabilities_are_honest: Nothing => "claimed capabilities match the parts the rail provides",
    pay_then_verify: Pay => "pay, verify once, balances move by exactly the price",
    pay_moves_money_as_claimed: Pay => "money moves in pay or in verify, as the rail claims (pay_effect)",
    verify_binds_offer: Pay => "a payment for offer A is refused for offer B",
    verify_binds_amount: Pay => "a payment is refused for an offer of another amount",
    verify_binds_payee: Pay => "a payment to someone else is refused",
    replay_refused: Pay => "a verified payment is refused the second time",
    concurrent_verify_settles_once: Pay => "16 concurrent verifications of one payment: exactly one wins",
    concurrent_pay_settles_once: Pay => "16 concurrent submissions of one operation: one charge",
    expired_offer_refused: Pay => "an expired offer is neither paid nor verified",
    idempotent_retry_same_result: Pay => "the same operation id returns the first result",
    same_op_different_content_conflicts: Pay => "the same operation id with other content conflicts",
    malformed_payments_refused: Pay => "malformed payments get typed refusals and change nothing",
    smallest_unit_exact: Pay => "one minor unit is paid and verified exactly",
    overflow_refused: Pay => "amounts beyond the rail's range are refused up front",
    insufficient_funds_refused: Pay => "paying beyond the balance is refused and changes nothing",
    hold_then_full_capture: Hold => "hold reserves, full capture settles the whole hold",
    hold_then_partial_capture: PartialCapture => "partial capture settles part, releases the rest",
    capture_above_hold_refused: Hold => "capturing more than held is refused",
    void_releases: Hold => "void returns the held funds",
    capture_after_void_refused: Hold => "capture after void is refused",
    refund_full: Refund => "a full refund returns the payment",
    refund_partial: PartialRefund => "partial refunds return parts",
    refund_above_captured_refused: Refund => "refunds never exceed what was paid",
    refund_after_capture: Refund => "a captured hold is refunded by its capture reference, never above the capture",
    hold_expiry_releases: Hold => "a lapsed hold can be neither captured nor voided; funds return",
    foreign_payments_untouchable: Pay => "one receiver cannot refund, capture or void another's payments",
    twin_receivers_settle_once: Pay => "two receiver instances sharing one store: one payment settles once",
    rail_specific_checks: Nothing => "the rail's own cases (every protocol rule and error code)",
}
