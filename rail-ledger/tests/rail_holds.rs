//! Holds on the ledger rail: what a payer agrees to hold, what a receiver accepts as a hold.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]

use std::sync::Arc;
use std::time::Duration;

use rail_core::{
    Asset, Charge, HoldPayer, HoldReceiver, ManualClock, MemoryKeyStore, Money, Offer, OpId,
    Payment, PaymentMode, RailError, RailId, RailReceiver, ReplayGuard, SharedClock, Timestamp,
};
use rail_ledger::{
    AccountId, Ledger, LedgerPayer, LedgerReceiver, NewAccount, RAIL, TransferId, TransferRequest,
    offer_binding, op_transfer_id,
};
use serde_json::json;

struct World {
    ledger: Ledger,
    clock: ManualClock,
    payer: AccountId,
    shop: AccountId,
    _dir: tempfile::TempDir,
}

const FUNDED: u64 = 10_000;

async fn world() -> World {
    let clock = ManualClock::at(Timestamp(1_700_000_000_000));
    let shared: SharedClock = Arc::new(clock.clone());
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/ledger.db", dir.path().display());
    let ledger = Ledger::sqlite_with_clock(&url, shared).await.unwrap();
    let (bank, payer, shop) = (
        AccountId::random(),
        AccountId::random(),
        AccountId::random(),
    );
    for (id, no_overdraft) in [(bank, false), (payer, true), (shop, true)] {
        ledger
            .create_account(NewAccount {
                id,
                asset: Asset::usd(),
                no_overdraft,
            })
            .await
            .unwrap();
    }
    ledger
        .transfer(TransferRequest::Single {
            id: TransferId::random(),
            debit: bank,
            credit: payer,
            amount: FUNDED,
            user_data: 0,
        })
        .await
        .unwrap();
    World {
        ledger,
        clock,
        payer,
        shop,
        _dir: dir,
    }
}

impl World {
    fn receiver(&self) -> LedgerReceiver {
        let guard = ReplayGuard::new(
            Arc::new(MemoryKeyStore::with_clock(Arc::new(self.clock.clone()))),
            "offers",
        );
        LedgerReceiver::new(self.ledger.clone(), self.shop, Asset::usd(), guard)
    }

    fn payer(&self) -> LedgerPayer {
        LedgerPayer::new(self.ledger.clone(), self.payer, Asset::usd())
    }

    async fn available(&self) -> i128 {
        self.ledger
            .account(self.payer)
            .await
            .unwrap()
            .unwrap()
            .available()
    }
}

fn usd(minor: u128) -> Money {
    Money::from_minor(Asset::usd(), minor).unwrap()
}

/// The rail's own code of a refusal (`RailError::Rail { reason }`), else the generic code.
fn code(e: &RailError) -> String {
    e.rail_reason()
        .map_or_else(|| e.code().to_owned(), |r| r.code.clone())
}

async fn hold_offer(receiver: &LedgerReceiver) -> Offer {
    receiver
        .offer(&Charge::hold(usd(200), Duration::from_secs(60)))
        .await
        .unwrap()
}

/// A hostile (or careless) offer's hold duration: 0 used to mean "never expires" (a duration
/// under one second truncated to it), and any length was accepted. The payer refuses both,
/// with a typed reason, before anything is written.
#[tokio::test]
async fn payer_refuses_holds_without_timeout_and_caps_their_length() {
    let w = world().await;
    let r = w.receiver();
    let payer = w.payer();
    let base = hold_offer(&r).await;
    let with = |details: serde_json::Value| Offer {
        details,
        ..base.clone()
    };
    for (details, want) in [
        (json!({"hold_secs": 0}), "hold_without_timeout"),
        (json!({"hold_ms": 0}), "hold_without_timeout"),
        (json!({"hold_secs": 1_000_000_000u64}), "hold_too_long"),
        (json!({"hold_ms": 6 * 3_600_000 + 1}), "hold_too_long"),
    ] {
        let op = OpId::random();
        let e = payer
            .hold(&op, &with(details.clone()))
            .await
            .expect_err(&format!("{details} must be refused"));
        assert_eq!(code(&e), want, "{details}: {e}");
        assert!(!e.is_retryable());
        assert_eq!(w.available().await, i128::from(FUNDED), "{details}");
        assert!(
            w.ledger
                .lookup_transfer(op_transfer_id(w.payer, "hold", &op))
                .await
                .unwrap()
                .is_none(),
            "{details}: nothing may be written"
        );
    }
    let e = payer
        .hold(
            &OpId::random(),
            &with(json!({"hold_secs": 1_000_000_000u64})),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("1000000000000 ms") && e.to_string().contains("21600000 ms"),
        "the refusal names the asked and the allowed length: {e}"
    );
    // The cap is the payer's to choose.
    let strict = w.payer().with_max_hold(Duration::from_secs(60));
    let e = strict
        .hold(&OpId::random(), &with(json!({"hold_ms": 60_001})))
        .await
        .unwrap_err();
    assert_eq!(code(&e), "hold_too_long");
    strict
        .hold(&OpId::random(), &with(json!({"hold_ms": 60_000})))
        .await
        .unwrap();
    // Durations below one second are durations, not "forever".
    let op = OpId::random();
    payer
        .hold(&op, &with(json!({"hold_ms": 500})))
        .await
        .unwrap();
    let (t, _) = w
        .ledger
        .lookup_transfer(op_transfer_id(w.payer, "hold", &op))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(t.timeout_ms, 500);
    // Offers from before milliseconds (whole seconds) are still read; fields that disagree
    // are refused.
    let op = OpId::random();
    payer
        .hold(&op, &with(json!({"hold_secs": 2})))
        .await
        .unwrap();
    let (t, _) = w
        .ledger
        .lookup_transfer(op_transfer_id(w.payer, "hold", &op))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(t.timeout_ms, 2_000);
    let e = payer
        .hold(
            &OpId::random(),
            &with(json!({"hold_ms": 1_000, "hold_secs": 2})),
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), "invalid_input", "{e}");
}

/// The receiver expresses hold durations in milliseconds and never offers a hold without a
/// timeout.
#[tokio::test]
async fn receiver_offers_millisecond_holds_never_zero() {
    let w = world().await;
    // A sub-second hold duration survives the offer (it used to become 0 = forever).
    let r = w
        .receiver()
        .with_hold_duration(Duration::from_millis(1_500));
    let offer = hold_offer(&r).await;
    assert_eq!(offer.details, json!({"hold_ms": 1_500}));
    let payment = w.payer().hold(&OpId::random(), &offer).await.unwrap();
    r.verify(&offer, &payment).await.unwrap();
    // A duration that rounds to 0 ms is no duration: the receiver offers no such hold.
    for d in [Duration::ZERO, Duration::from_micros(999)] {
        let e = w
            .receiver()
            .with_hold_duration(d)
            .offer(&Charge::hold(usd(200), Duration::from_secs(60)))
            .await
            .unwrap_err();
        assert_eq!(code(&e), "hold_without_timeout", "{d:?}: {e}");
    }
}

/// A hold without a timeout (0 = never expires on the ledger) is not a hold this rail accepts.
#[tokio::test]
async fn receiver_refuses_holds_without_timeout() {
    let w = world().await;
    // A payer (not this rail's) places a hold without timeout, bound to the offer.
    let r = w.receiver();
    let offer = hold_offer(&r).await;
    let id = TransferId::random();
    w.ledger
        .transfer(TransferRequest::Pending {
            id,
            debit: w.payer,
            credit: w.shop,
            amount: 200,
            user_data: offer_binding(&offer.id),
            timeout_ms: 0,
        })
        .await
        .unwrap();
    let payment = Payment {
        rail: RailId::new(RAIL),
        offer_id: offer.id.clone(),
        mode: PaymentMode::Hold,
        payer: w.payer.to_string(),
        amount: offer.amount.clone(),
        proof: json!({"transfer_id": id.to_string()}),
    };
    let e = r.verify(&offer, &payment).await.unwrap_err();
    assert_eq!(code(&e), "hold_without_timeout", "{e}");
}

/// A hold presented just before it lapses used to verify (only its original duration was
/// checked), and its capture then failed. Verify now requires the time left on the hold, by
/// the ledger's clock, to cover the receiver's minimum (by default half the asked duration),
/// and says how much was left and how much is required.
#[tokio::test]
async fn verify_requires_time_left_on_the_hold() {
    let w = world().await;
    let r = w.receiver().with_hold_duration(Duration::from_secs(600));
    let charge = Charge::hold(usd(200), Duration::from_secs(3_600));
    let offer = r.offer(&charge).await.unwrap();
    let payment = w.payer().hold(&OpId::random(), &offer).await.unwrap();
    w.clock.advance(Duration::from_secs(590));
    let e = r.verify(&offer, &payment).await.unwrap_err();
    assert_eq!(code(&e), "hold_time_left_too_short", "{e}");
    assert!(
        e.to_string().contains("10000 ms left") && e.to_string().contains("300000 ms required"),
        "the refusal says what is left and what is required: {e}"
    );
    // The refusal consumed nothing: a receiver content with 5 s left takes the same payment
    // and captures it in time.
    let lenient = w
        .receiver()
        .with_hold_duration(Duration::from_secs(600))
        .with_min_hold_left(Duration::from_secs(5));
    let v = lenient.verify(&offer, &payment).await.unwrap();
    lenient
        .capture(&OpId::random(), &v, &usd(200))
        .await
        .unwrap();

    // Exactly the required time left verifies.
    let offer = r.offer(&charge).await.unwrap();
    let payment = w.payer().hold(&OpId::random(), &offer).await.unwrap();
    w.clock.advance(Duration::from_secs(300));
    r.verify(&offer, &payment).await.unwrap();

    // A minimum no hold of the offered length could meet is a misconfiguration, refused when
    // offering rather than at every verification.
    let e = w
        .receiver()
        .with_hold_duration(Duration::from_secs(60))
        .with_min_hold_left(Duration::from_secs(61))
        .offer(&charge)
        .await
        .unwrap_err();
    assert_eq!(code(&e), "invalid_input", "{e}");
}

/// A payment (or hold) made while its offer was live is answered again after the offer's end:
/// the retry of an attempt whose answer was lost must learn that the money moved, not be told
/// the offer expired. A new payment of the ended offer is refused, and nothing moves.
#[tokio::test]
async fn a_payment_made_in_time_is_answered_after_the_offers_end() {
    use rail_core::Payer as _;
    let w = world().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = receiver
        .offer(&Charge::capture(usd(300), Duration::from_secs(60)))
        .await
        .unwrap();
    let held = hold_offer(&receiver).await;
    let (op, hold_op) = (OpId::random(), OpId::random());
    let paid = payer.pay(&op, &offer).await.unwrap();
    let hold = payer.hold(&hold_op, &held).await.unwrap();
    assert_eq!(w.available().await, i128::from(FUNDED) - 500);

    w.clock.advance(Duration::from_secs(61));
    assert_eq!(payer.pay(&op, &offer).await.unwrap(), paid);
    assert_eq!(payer.hold(&hold_op, &held).await.unwrap(), hold);
    for e in [
        payer.pay(&OpId::random(), &offer).await.unwrap_err(),
        payer.hold(&OpId::random(), &held).await.unwrap_err(),
        // The operation id of the payment, presented for the hold's offer: not that payment.
        payer.hold(&op, &held).await.unwrap_err(),
    ] {
        assert_eq!(e.code(), "offer_expired", "{e}");
    }
    assert_eq!(
        w.available().await,
        i128::from(FUNDED) - 500,
        "nothing more moved"
    );
}

/// `verify_as`'s contract: the same operation again (a verification whose answer was lost,
/// recovered by another instance) gets that verification's answer; another operation is a
/// replay.
#[tokio::test]
async fn the_same_verification_again_is_answered_another_is_a_replay() {
    use rail_core::{Payer as _, RailReceiver as _};
    let w = world().await;
    let (payer, receiver) = (w.payer(), w.receiver());
    let offer = receiver
        .offer(&Charge::capture(usd(300), Duration::from_secs(60)))
        .await
        .unwrap();
    let payment = payer.pay(&OpId::random(), &offer).await.unwrap();
    let op = OpId::random();
    let first = receiver.verify_as(&op, &offer, &payment).await.unwrap();
    assert_eq!(
        receiver.verify_as(&op, &offer, &payment).await.unwrap(),
        first
    );
    for e in [
        receiver
            .verify_as(&OpId::random(), &offer, &payment)
            .await
            .unwrap_err(),
        receiver.verify(&offer, &payment).await.unwrap_err(),
    ] {
        assert_eq!(e.code(), "replayed", "{e}");
    }
}

/// A verification stopped mid-way (its instance killed between reserving the offer and
/// committing) leaves the offer reserved: the same operation asked again meanwhile is told to
/// come back (`in_progress`, retryable), not that it is a replay, and once the lease lapses the
/// verification is taken over and answered. The payer paid once and is verified once.
#[tokio::test]
async fn a_verification_stopped_mid_way_is_in_progress_then_verified_not_a_replay() {
    use rail_core::{Payer as _, RailReceiver as _};
    let w = world().await;
    let store: Arc<dyn rail_core::KeyStore> =
        Arc::new(MemoryKeyStore::with_clock(Arc::new(w.clock.clone())));
    let receiver = LedgerReceiver::new(
        w.ledger.clone(),
        w.shop,
        Asset::usd(),
        ReplayGuard::new(store.clone(), "offers"),
    );
    let offer = receiver
        .offer(&Charge::capture(usd(300), Duration::from_secs(60)))
        .await
        .unwrap();
    let payment = w.payer().pay(&OpId::random(), &offer).await.unwrap();
    // The killed instance's reservation, never finished.
    let stopped = ReplayGuard::new(store, "offers")
        .reserve(&offer.id, Duration::from_secs(10))
        .await
        .unwrap();
    std::mem::forget(stopped);
    let op = OpId::random();
    let e = receiver.verify_as(&op, &offer, &payment).await.unwrap_err();
    assert_eq!(e.code(), "in_progress", "{e}");
    assert!(e.is_retryable(), "{e}");
    // Another verification without an operation is still refused as a replay.
    assert_eq!(
        receiver.verify(&offer, &payment).await.unwrap_err().code(),
        "replayed"
    );
    w.clock.advance(Duration::from_secs(31));
    let verified = receiver.verify_as(&op, &offer, &payment).await.unwrap();
    assert_eq!(verified.amount, usd(300));
    assert_eq!(
        receiver
            .verify_as(&OpId::random(), &offer, &payment)
            .await
            .unwrap_err()
            .code(),
        "replayed"
    );
}

/// `Ledger::history`: the entries that move an account, newest first, at most `limit`.
#[tokio::test]
async fn history_lists_an_accounts_entries_newest_first() {
    use rail_core::{Payer as _, RailReceiver as _};
    let w = world().await;
    let receiver = w.receiver();
    let offer = receiver
        .offer(&Charge::capture(usd(300), Duration::from_secs(60)))
        .await
        .unwrap();
    w.payer().pay(&OpId::random(), &offer).await.unwrap();
    let payer = w.ledger.history(w.payer, 10).await.unwrap();
    assert_eq!(payer.len(), 2, "{payer:?}");
    assert!(payer[0].seq > payer[1].seq);
    assert_eq!(
        (payer[0].debit, payer[0].credit, payer[0].amount),
        (w.payer, w.shop, 300)
    );
    assert_eq!((payer[1].credit, payer[1].amount), (w.payer, FUNDED));
    assert_eq!(w.ledger.history(w.payer, 1).await.unwrap().len(), 1);
    assert_eq!(w.ledger.history(w.shop, 10).await.unwrap().len(), 1);
    assert!(
        w.ledger
            .history(AccountId::random(), 10)
            .await
            .unwrap()
            .is_empty()
    );
}
