//! The facilitator over HTTP, with the account rail's client: payments, single-use
//! verification, holds, refunds, the review queue, request signing, health and metrics.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::time::Duration;

use common::{NETWORK, Party, World, usd};
use rail_account::api::{self, AccountView, PaymentStatus, PaymentView};
use rail_account::auth;
use rail_account::{AccountClient, AccountKey, AccountPayer, AccountReceiver, Submitted};
use rail_core::{
    Charge, Clock, HoldPayer, HoldReceiver, OpId, Payer, PaymentMode, RailError, RailReceiver,
    RefundReceiver,
};
use stipendex_facilitator::store::ReviewState;

#[tokio::test]
async fn pay_verify_once_and_refund() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = capture_offer(&receiver, "2.50", 60).await;
    let op = OpId::random();
    let payment = payer.pay(&op, &offer).await.unwrap();
    // The same operation again is the same payment: nothing more is paid.
    assert_eq!(payer.pay(&op, &offer).await.unwrap(), payment);
    assert_eq!(w.balance(&w.payer).await, 9_750);
    let v = receiver.verify(&offer, &payment).await.unwrap();
    assert_eq!(v.amount, usd("2.50"));
    let again = receiver.verify(&offer, &payment).await.unwrap_err();
    assert!(matches!(again, RailError::Replayed { .. }), "{again}");
    let r = receiver
        .refund(&OpId::random(), &v.payment_ref, &usd("1.00"))
        .await
        .unwrap();
    assert_eq!(r.amount, usd("1.00"));
    assert_eq!(w.balance(&w.payer).await, 9_850);
    let view: PaymentView = w
        .client(&w.payer)
        .get(&api::payment(&v.payment_ref))
        .await
        .unwrap()
        .body;
    assert_eq!(view.status, PaymentStatus::Settled);
    assert_eq!(view.refunded, Some(usd("1.00")));
    // A stranger does not see it.
    let stranger = Party::new();
    stranger.register(&w.fac, None).await;
    let e = w
        .client(&stranger)
        .get::<PaymentView>(&api::payment(&v.payment_ref))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "not_found");
}

/// A verification whose answer was lost (issue 24): recovered under the caller's same
/// operation (`verify_as`, from another instance too) it is answered the same; under another
/// operation, or by a plain `verify`, the payment is `replayed`. Paid once.
#[tokio::test]
async fn a_verification_recovered_under_its_operation_is_answered_the_same() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = capture_offer(&receiver, "2.50", 60).await;
    let payment = payer.pay(&OpId::random(), &offer).await.unwrap();
    let op = OpId::new("verify-1").unwrap();
    let first = receiver.verify_as(&op, &offer, &payment).await.unwrap();
    // Its answer is lost; the caller recovers at another instance of the receiver.
    let again = w.receiver().verify_as(&op, &offer, &payment).await.unwrap();
    assert_eq!(again, first);
    for e in [
        receiver
            .verify_as(&OpId::new("verify-2").unwrap(), &offer, &payment)
            .await
            .unwrap_err(),
        receiver.verify(&offer, &payment).await.unwrap_err(),
    ] {
        assert!(matches!(e, RailError::Replayed { .. }), "{e}");
    }
    assert_eq!(w.balance(&w.payer).await, 9_750);
    assert_eq!(w.balance(&w.payee).await, 250);
}

#[tokio::test]
async fn holds_capture_in_part_and_void() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = hold_offer(&receiver, "3.00", 60).await;
    let held = payer.hold(&OpId::random(), &offer).await.unwrap();
    assert_eq!(w.available(&w.payer).await, 9_700);
    let v = receiver.verify(&offer, &held).await.unwrap();
    let c = receiver
        .capture(&OpId::random(), &v, &usd("1.25"))
        .await
        .unwrap();
    assert_eq!(c.captured, usd("1.25"));
    assert_eq!(c.released, usd("1.75"));
    assert_eq!(w.balance(&w.payee).await, 125);
    let offer = hold_offer(&receiver, "1.00", 60).await;
    let held = payer.hold(&OpId::random(), &offer).await.unwrap();
    let v = receiver.verify(&offer, &held).await.unwrap();
    receiver.void(&OpId::random(), &v).await.unwrap();
    assert_eq!(w.available(&w.payer).await, 10_000 - 125);
    let e = receiver
        .capture(&OpId::random(), &v, &usd("1.00"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_state", "{e}");
}

#[tokio::test]
async fn refusals_are_typed_and_change_nothing() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    // Expired offer.
    let offer = capture_offer(&receiver, "1.00", 5).await;
    w.clock.advance(Duration::from_secs(6));
    let e = payer.pay(&OpId::random(), &offer).await.unwrap_err();
    assert!(matches!(e, RailError::OfferExpired { .. }), "{e}");
    // Another facilitator's offer: refused before any call.
    let mut other = capture_offer(&receiver, "1.00", 60).await;
    other.details = serde_json::json!({"network": "elsewhere"});
    let e = payer.pay(&OpId::random(), &other).await.unwrap_err();
    assert!(matches!(e, RailError::WrongNetwork { .. }), "{e}");
    // Too much.
    let big = capture_offer(&receiver, "4.99", 60).await;
    let poor = Party::new();
    poor.register(&w.fac, None).await;
    let poor_payer = AccountPayer::new(w.client(&poor), rail_core::Asset::usd());
    let e = poor_payer.pay(&OpId::random(), &big).await.unwrap_err();
    assert_eq!(e.code(), "insufficient_funds", "{e}");
    // Same operation id, other offer.
    let op = OpId::random();
    let a = capture_offer(&receiver, "1.00", 60).await;
    let b = capture_offer(&receiver, "2.00", 60).await;
    payer.pay(&op, &a).await.unwrap();
    let e = payer.pay(&op, &b).await.unwrap_err();
    assert!(matches!(e, RailError::IdempotencyConflict { .. }), "{e}");
    // A payment presented for another offer, or with its amount changed.
    let p = payer.pay(&OpId::random(), &b).await.unwrap();
    let e = receiver.verify(&a, &p).await.unwrap_err();
    assert_eq!(e.code(), "offer_mismatch", "{e}");
    let mut forged = p.clone();
    forged.amount = usd("1.00");
    let mut offer_b_cheap = b.clone();
    offer_b_cheap.amount = usd("1.00");
    let e = receiver.verify(&offer_b_cheap, &forged).await.unwrap_err();
    assert_eq!(e.code(), "amount_mismatch", "{e}");
    // Nothing moved but the two good payments.
    assert_eq!(w.balance(&w.payer).await, 10_000 - 300);
    assert_eq!(w.balance(&poor).await, 0);
}

#[tokio::test]
async fn payments_above_the_threshold_wait_for_review() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = capture_offer(&receiver, "7.00", 3600).await;
    let op = OpId::random();
    let Submitted::PendingReview { payment_ref, .. } = payer
        .submit(&op, &offer, PaymentMode::Capture)
        .await
        .unwrap()
    else {
        panic!("a payment above 5.00 must wait for review");
    };
    // The trait reports the pending state, typed and retryable.
    let e = payer.pay(&op, &offer).await.unwrap_err();
    assert!(
        matches!(e, RailError::PendingReview { .. }) && e.is_retryable(),
        "{e}"
    );
    assert_eq!(w.available(&w.payer).await, 9_300, "the funds are reserved");
    assert_eq!(w.balance(&w.payee).await, 0);
    let queue = w.fac.reviews(Some(ReviewState::Pending), 10).await.unwrap();
    assert_eq!(queue.len(), 1);
    assert_eq!(queue[0].payment_id, payment_ref);
    w.fac
        .approve(&payment_ref, "ops@test", Some("known customer"))
        .await
        .unwrap();
    let payment = payer.pay(&op, &offer).await.unwrap();
    let v = receiver.verify(&offer, &payment).await.unwrap();
    assert_eq!(v.amount, usd("7.00"));
    assert_eq!(w.balance(&w.payee).await, 700);
    // A refund of a reviewed payment goes back from the transfer that settled it.
    receiver
        .refund(&OpId::random(), &v.payment_ref, &usd("2.00"))
        .await
        .unwrap();
    assert_eq!(w.balance(&w.payer).await, 10_000 - 500);

    // Rejected: the funds come back, the payer is told it was declined.
    let offer = capture_offer(&receiver, "6.00", 3600).await;
    let op = OpId::random();
    let e = payer.pay(&op, &offer).await.unwrap_err();
    let RailError::PendingReview { payment_ref, .. } = e else {
        panic!("{e}")
    };
    w.fac
        .reject(&payment_ref, "ops@test", Some("unusual"))
        .await
        .unwrap();
    let e = payer.pay(&op, &offer).await.unwrap_err();
    assert_eq!(e.code(), "declined", "{e}");
    assert_eq!(w.available(&w.payer).await, 9_500);
    assert!(
        w.fac.approve(&payment_ref, "ops@test", None).await.is_err(),
        "a rejected payment stays rejected"
    );

    // Approved too late to be presented before its offer ends: refused, the funds released.
    let offer = capture_offer(&receiver, "8.00", 90).await;
    let op = OpId::random();
    let RailError::PendingReview { payment_ref, .. } = payer.pay(&op, &offer).await.unwrap_err()
    else {
        panic!("above the threshold")
    };
    w.clock.advance(Duration::from_secs(45));
    let e = w
        .fac
        .approve(&payment_ref, "ops@test", None)
        .await
        .unwrap_err();
    assert_eq!(e.code(), "invalid_state", "{e}");
    assert_eq!(w.available(&w.payer).await, 9_500);
    assert_eq!(w.balance(&w.payee).await, 500);
    // The hold never outlives its offer.
    let (t, _) = w
        .fac
        .ledger()
        .lookup_transfer(payment_ref.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(t.timeout_ms <= 90_000, "{}", t.timeout_ms);
}

#[tokio::test]
async fn unsigned_stale_replayed_and_forged_requests_are_refused() {
    let w = World::sqlite().await;
    let http = reqwest::Client::new();
    let url = format!("{}{}", w.url, api::ACCOUNT);
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthenticated");

    // A signed request, sent twice: the second is a replay.
    let ts = w.clock.now().0;
    let nonce = auth::nonce();
    let account = w.payer.id.to_string();
    let sig = w.payer.key.sign(&auth::Canonical {
        network: NETWORK,
        method: "GET",
        path_and_query: api::ACCOUNT,
        account: &account,
        timestamp_ms: ts,
        nonce: &nonce,
        idempotency_key: None,
        body: b"",
    });
    let send = || {
        http.get(&url)
            .header(auth::ACCOUNT, &account)
            .header(auth::TIMESTAMP, ts.to_string())
            .header(auth::NONCE, &nonce)
            .header(auth::SIGNATURE, sig.to_string())
            .send()
    };
    let first = send().await.unwrap();
    assert_eq!(first.status(), 200);
    let view: AccountView = first.json().await.unwrap();
    assert_eq!(view.available, usd("100.00"));
    let again: serde_json::Value = send().await.unwrap().json().await.unwrap();
    assert_eq!(again["error"]["code"], "replayed_request");

    // Signed by another key.
    let impostor = AccountClient::new([w.url.clone()], &account, AccountKey::generate(), NETWORK)
        .unwrap()
        .with_clock(std::sync::Arc::new(w.clock.clone()));
    let e = impostor.get::<AccountView>(api::ACCOUNT).await.unwrap_err();
    assert_eq!(e.rail_reason().unwrap().code, "bad_request_signature");
    // Signed too long ago (the client's clock is 10 minutes behind).
    let late = rail_core::ManualClock::at(rail_core::Timestamp(ts - 600_000));
    let stale = w.client(&w.payer).with_clock(std::sync::Arc::new(late));
    let e = stale.get::<AccountView>(api::ACCOUNT).await.unwrap_err();
    assert_eq!(e.rail_reason().unwrap().code, "stale_request");
    // A body changed after signing.
    let e = http
        .post(format!("{}{}", w.url, api::PAYMENTS))
        .header(auth::ACCOUNT, &account)
        .header(auth::TIMESTAMP, ts.to_string())
        .header(auth::NONCE, auth::nonce())
        .header(auth::SIGNATURE, sig.to_string())
        .header(auth::IDEMPOTENCY_KEY, "op_x")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(e.status(), 401);
    assert_eq!(w.balance(&w.payer).await, 10_000);
}

#[tokio::test]
async fn health_and_metrics() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = capture_offer(&receiver, "0.10", 60).await;
    let p = payer.pay(&OpId::random(), &offer).await.unwrap();
    receiver.verify(&offer, &p).await.unwrap();
    let _ = receiver.verify(&offer, &p).await;
    let h: api::Health = reqwest::get(format!("{}{}", w.url, api::HEALTH))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(h.status, "ok");
    assert_eq!(h.network, NETWORK);
    assert_eq!(h.backend, "sqlite");
    let text = reqwest::get(format!("{}{}", w.url, api::METRICS))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains(r#"stipendex_facilitator_requests_total{instance="test-1",method="POST",route="/v1/payments",status="201"} 1"#), "{text}");
    assert!(
        text.contains(
            r#"stipendex_facilitator_refusals_total{instance="test-1",code="replayed"} 1"#
        ),
        "{text}"
    );
    assert!(text.contains(r#"stipendex_facilitator_request_duration_seconds_count{instance="test-1",route="/v1/payments/{id}/redeem"} 2"#), "{text}");
}

#[tokio::test]
async fn a_hold_in_review_cannot_be_captured_or_verified_before_approval() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = hold_offer(&receiver, "9.00", 600).await;
    let op = OpId::random();
    let Submitted::PendingReview { payment_ref, .. } =
        payer.submit(&op, &offer, PaymentMode::Hold).await.unwrap()
    else {
        panic!("a hold above 5.00 waits for review");
    };
    // The payee knows the payment id and builds the "verified" hold itself.
    let forged = rail_core::Verified {
        rail: rail_core::RailId::new("account"),
        offer_id: offer.id.clone(),
        payment_ref: payment_ref.clone(),
        payer: w.payer.id.to_string(),
        amount: usd("9.00"),
        state: rail_core::PaymentState::Held {
            capturable: usd("9.00"),
            expires_at: None,
        },
    };
    let e = receiver
        .capture(&OpId::random(), &forged, &usd("9.00"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), "pending_review", "{e}");
    let payment = rail_core::Payment {
        rail: rail_core::RailId::new("account"),
        offer_id: offer.id.clone(),
        mode: PaymentMode::Hold,
        payer: w.payer.id.to_string(),
        amount: usd("9.00"),
        proof: serde_json::json!({"payment_id": payment_ref}),
    };
    let e = receiver.verify(&offer, &payment).await.unwrap_err();
    assert_eq!(e.code(), "pending_review", "{e}");
    assert_eq!(w.balance(&w.payee).await, 0);
    // Approved, the hold is the payee's to verify and capture.
    w.fac.approve(&payment_ref, "ops", None).await.unwrap();
    let held = payer.hold(&op, &offer).await.unwrap();
    let v = receiver.verify(&offer, &held).await.unwrap();
    receiver
        .capture(&OpId::random(), &v, &usd("4.00"))
        .await
        .unwrap();
    assert_eq!(w.balance(&w.payee).await, 400);
}

#[tokio::test]
async fn an_approval_interrupted_after_the_ledger_is_finished_not_contradicted() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = capture_offer(&receiver, "6.00", 600).await;
    let op = OpId::random();
    let RailError::PendingReview { payment_ref, .. } = payer.pay(&op, &offer).await.unwrap_err()
    else {
        panic!("above the threshold")
    };
    // The approval's ledger step, and then the operator's process dies before recording it.
    approval_cut_short(&w, &payment_ref).await;
    // The payer is paid, not told it is pending; a rejection now is refused.
    let payment = payer.pay(&op, &offer).await.unwrap();
    receiver.verify(&offer, &payment).await.unwrap();
    let e = w.fac.reject(&payment_ref, "ops", None).await.unwrap_err();
    assert_eq!(e.code(), "invalid_state", "{e}");
    let r = w.fac.approve(&payment_ref, "ops", None).await.unwrap();
    assert_eq!(r.state, ReviewState::Approved);
    assert_eq!(w.balance(&w.payee).await, 600);
}

#[tokio::test]
async fn one_idempotency_key_is_one_payment_whatever_the_mode() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let op = OpId::random();
    let a = capture_offer(&receiver, "1.00", 60).await;
    payer.pay(&op, &a).await.unwrap();
    let b = hold_offer(&receiver, "1.00", 60).await;
    let e = payer.hold(&op, &b).await.unwrap_err();
    assert!(matches!(e, RailError::IdempotencyConflict { .. }), "{e}");
    assert_eq!(w.available(&w.payer).await, 9_900);
}

#[tokio::test]
async fn a_payment_made_in_time_is_answered_after_its_offer_ends() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    // Paid in time, its answer lost: the retry after the offer's end gets the same payment.
    let offer = capture_offer(&receiver, "1.00", 60).await;
    let op = OpId::random();
    let first = payer.pay(&op, &offer).await.unwrap();
    w.clock.advance(Duration::from_secs(61));
    assert_eq!(payer.pay(&op, &offer).await.unwrap(), first);
    // A new payment of the ended offer is refused by the facilitator; nothing moves.
    let e = payer.pay(&OpId::random(), &offer).await.unwrap_err();
    assert_eq!(e.code(), "offer_expired", "{e}");
    assert_eq!(w.available(&w.payer).await, 9_900);

    // Approved in review in time, asked about after the offer's end: paid, not "expired".
    let offer = capture_offer(&receiver, "7.00", 300).await;
    let op = OpId::random();
    let RailError::PendingReview { payment_ref, .. } = payer.pay(&op, &offer).await.unwrap_err()
    else {
        panic!("above the threshold")
    };
    w.fac.approve(&payment_ref, "ops", None).await.unwrap();
    w.clock.advance(Duration::from_secs(301));
    let payment = payer.pay(&op, &offer).await.unwrap();
    assert_eq!(payment.proof["payment_id"], payment_ref.as_str());
    assert_eq!(w.balance(&w.payee).await, 800);
    assert_eq!(w.available(&w.payer).await, 9_200);
}

#[tokio::test]
async fn a_review_shows_what_its_approval_would_pay() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    // Queued for review, then refused by the ledger: the review stands for nothing...
    let op = OpId::random();
    let big = capture_offer(&receiver, "150.00", 600).await;
    let e = payer.pay(&op, &big).await.unwrap_err();
    assert_eq!(e.code(), "insufficient_funds", "{e}");
    // ...and another payment under the same key is a conflict, not a hold the review would
    // describe as the first (the operator would approve one payment and pay another).
    let other = capture_offer(&receiver, "6.00", 600).await;
    let e = payer.pay(&op, &other).await.unwrap_err();
    assert!(matches!(e, RailError::IdempotencyConflict { .. }), "{e}");
    assert_eq!(w.available(&w.payer).await, 10_000, "nothing held");
    assert!(
        w.fac
            .reviews(Some(ReviewState::Pending), 10)
            .await
            .unwrap()
            .is_empty(),
        "a review never held is not shown"
    );
    // The same payment under the same key, once funded, is the review shown.
    w.fac
        .fund(w.payer.id, &usd("100.00"), "top-up")
        .await
        .unwrap();
    let RailError::PendingReview { payment_ref, .. } = payer.pay(&op, &big).await.unwrap_err()
    else {
        panic!("above the threshold")
    };
    let queue = w.fac.reviews(Some(ReviewState::Pending), 10).await.unwrap();
    assert_eq!(queue.len(), 1);
    assert_eq!(queue[0].payment_id, payment_ref);
    assert_eq!(
        (queue[0].amount, queue[0].offer_id.as_str()),
        (15_000, big.id.as_str())
    );
}

#[tokio::test]
async fn reviews_undecided_at_their_offers_end_are_closed() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    // A hold (the receiver asks for an hour) on an offer of ten minutes, waiting for review.
    let offer = hold_offer(&receiver, "9.00", 600).await;
    let op = OpId::random();
    let Submitted::PendingReview { payment_ref, .. } =
        payer.submit(&op, &offer, PaymentMode::Hold).await.unwrap()
    else {
        panic!("a hold above 5.00 waits for review");
    };
    // And a payment whose transfer was refused after its review was queued.
    let never = OpId::random();
    let big = capture_offer(&receiver, "150.00", 600).await;
    payer.pay(&never, &big).await.unwrap_err();
    let never_id = stipendex_facilitator::payment_id(w.payer.id, &never).to_string();
    assert_eq!(w.available(&w.payer).await, 9_100);

    // The offer ends undecided: nobody can verify the hold now, so the funds come back then,
    // not when the hold itself would lapse.
    w.clock.advance(Duration::from_secs(601));
    w.fac.sweep().await.unwrap();
    assert_eq!(w.available(&w.payer).await, 10_000);
    let r = w.fac.pool().review(&payment_ref).await.unwrap().unwrap();
    assert_eq!(r.state, ReviewState::Expired);
    let e = w.fac.approve(&payment_ref, "ops", None).await.unwrap_err();
    assert_eq!(e.code(), "invalid_state", "{e}");
    let e = payer.hold(&op, &offer).await.unwrap_err();
    assert_eq!(e.code(), "declined", "{e}");
    // The review that was never held is closed once no request can still be writing it.
    let pending = |w: &World| {
        let id = never_id.clone();
        let pool = w.fac.pool().clone();
        async move { pool.review(&id).await.unwrap().unwrap().state }
    };
    assert_eq!(pending(&w).await, ReviewState::Pending);
    w.clock.advance(Duration::from_secs(601));
    w.fac.sweep().await.unwrap();
    assert_eq!(pending(&w).await, ReviewState::Expired);
}

#[tokio::test]
async fn a_payment_approved_is_refunded_even_if_the_approval_was_cut_short() {
    let w = World::sqlite().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = capture_offer(&receiver, "6.00", 600).await;
    let op = OpId::random();
    let RailError::PendingReview { payment_ref, .. } = payer.pay(&op, &offer).await.unwrap_err()
    else {
        panic!("above the threshold")
    };
    // The approval's ledger step only; the review row still says pending.
    approval_cut_short(&w, &payment_ref).await;
    receiver
        .refund(&OpId::random(), &payment_ref, &usd("1.00"))
        .await
        .unwrap();
    assert_eq!(w.balance(&w.payee).await, 500);
    assert_eq!(w.available(&w.payer).await, 9_500);
}

/// An approval of `payment_ref` that made its ledger step (the hold posted in full, under the
/// approval's own transfer id) and died before recording the decision.
async fn approval_cut_short(w: &World, payment_ref: &str) {
    let id: rail_ledger::TransferId = payment_ref.parse().unwrap();
    let (t, _) = w.fac.ledger().lookup_transfer(id).await.unwrap().unwrap();
    w.fac
        .ledger()
        .transfer(rail_ledger::TransferRequest::Post {
            id: rail_ledger::op_transfer_id(
                t.debit,
                "review-approve",
                &OpId::new(payment_ref.to_owned()).unwrap(),
            ),
            pending_id: id,
            amount: t.amount,
        })
        .await
        .unwrap();
}

/// `receiver`'s offer of `amount` USD to capture now, payable for `secs`.
async fn capture_offer(receiver: &AccountReceiver, amount: &str, secs: u64) -> rail_core::Offer {
    let charge = Charge::capture(usd(amount), Duration::from_secs(secs));
    receiver.offer(&charge).await.unwrap()
}

/// `receiver`'s offer of `amount` USD to hold, payable for `secs`.
async fn hold_offer(receiver: &AccountReceiver, amount: &str, secs: u64) -> rail_core::Offer {
    let charge = Charge::hold(usd(amount), Duration::from_secs(secs));
    receiver.offer(&charge).await.unwrap()
}

/// Issue 48: a hold the ledger refuses — a zero amount, a hold without a timeout, a hold
/// longer than the facilitator allows — is the payer's mistake: answered 400 with the
/// refusal's own code (as every other refusal of a request is), never 500, which would let
/// any account holder raise the operators' 5xx alerts at will.
#[tokio::test]
async fn a_hold_the_ledger_refuses_is_400_with_its_code_not_500() {
    let w = World::sqlite().await;
    let receiver = w.receiver();
    let with_hold_ms = |mut o: rail_core::Offer, ms: u64| {
        o.details["hold_ms"] = serde_json::json!(ms);
        o
    };
    let too_long = with_hold_ms(hold_offer(&receiver, "1.00", 60).await, 400 * 86_400_000);
    let (status, code, body) = signed_pay(&w, too_long).await;
    assert_eq!((status, code.as_str()), (400, "hold_too_long"), "{body}");
    let forever = with_hold_ms(hold_offer(&receiver, "1.00", 60).await, 0);
    let (status, code, body) = signed_pay(&w, forever).await;
    assert_eq!(
        (status, code.as_str()),
        (400, "hold_without_timeout"),
        "{body}"
    );
    let mut nothing = hold_offer(&receiver, "1.00", 60).await;
    nothing.amount = usd("0.00");
    let (status, code, body) = signed_pay(&w, nothing).await;
    assert_eq!(status, 400, "{body}");
    assert!(!code.is_empty() && code != "rail_error", "{body}");
    // Nothing was held.
    assert_eq!(w.available(&w.payer).await, 10_000);
    // The refusals are counted under their codes, not as server failures.
    let text = reqwest::get(format!("{}{}", w.url, api::METRICS))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!text.contains("status=\"500\""), "{text}");
}

/// `offer` paid by the world's payer over the wire, signed by hand: (status, error code, body).
async fn signed_pay(w: &World, offer: rail_core::Offer) -> (u16, String, serde_json::Value) {
    let account = w.payer.id.to_string();
    let body = serde_json::to_vec(&api::PayRequest { offer }).unwrap();
    let nonce = auth::nonce();
    let op = OpId::random();
    let ts = w.clock.now().0;
    let sig = w.payer.key.sign(&auth::Canonical {
        network: NETWORK,
        method: "POST",
        path_and_query: api::PAYMENTS,
        account: &account,
        timestamp_ms: ts,
        nonce: &nonce,
        idempotency_key: Some(op.as_str()),
        body: &body,
    });
    let r = reqwest::Client::new()
        .post(format!("{}{}", w.url, api::PAYMENTS))
        .header(auth::ACCOUNT, &account)
        .header(auth::TIMESTAMP, ts.to_string())
        .header(auth::NONCE, &nonce)
        .header(auth::SIGNATURE, sig.to_string())
        .header(auth::IDEMPOTENCY_KEY, op.as_str())
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let v: serde_json::Value = r.json().await.unwrap();
    (
        status,
        v["error"]["code"].as_str().unwrap_or("").to_owned(),
        v,
    )
}
