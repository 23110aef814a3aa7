//! The Stipendex layer end to end over the ledger rail on SQLite: a receiver quotes, the wallet
//! pays under its mandate, the receiver accepts and signs a receipt, the chain verifies — and
//! every refusal the mandate and the protocol require.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{quote, usd, world};
use stipendex::envelope::{Period, SecretKey};
use stipendex::receiver::{Decision, Gate, Price, PricedCapability, Receiver, Request};
use stipendex::wallet::{chain_name, revoke};
use stipendex::{Amount, Error};

#[tokio::test]
async fn service_payment_end_to_end_and_the_chain_verifies() {
    let w = world().await;
    let wallet = w.wallet(w.mandate(|_| {}), true);
    let receiver = w.receiver();
    let req = Request::new("GET", "/search").with_params(serde_json::json!({"q": "rust"}));
    assert!(matches!(
        receiver.gate(&Request::new("GET", "/free")).await.unwrap(),
        Gate::Free
    ));
    let q = quote(&receiver, &req).await;
    let paid = wallet.pay(&q).await.unwrap();
    assert!(paid.fresh && paid.confirmation.is_none());
    let accepted = receiver.accept(&req, paid.proof.jws()).await.unwrap();
    assert_eq!(accepted.verified.amount, usd("0.05"));
    let receipt = receiver.receipt(&accepted, b"results").unwrap();
    wallet.receipt(&paid, receipt.jws()).await.unwrap();

    let chain = w.journal.chain(&chain_name("search", &q.object().id));
    assert_eq!(chain.len(), 4, "mandate, quote, proof, receipt");
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    let verified = stipendex::chain::verify_chain(&refs, Some(&w.principal.public())).unwrap();
    assert_eq!(
        verified.receipt.unwrap().object().amount,
        "0.05".parse::<Amount>().unwrap()
    );

    // I2: the same quote again returns the same proof and charges nothing; the receiver
    // refuses the proof the second time.
    let again = wallet.pay(&q).await.unwrap();
    assert!(!again.fresh);
    assert_eq!(again.proof.jws(), paid.proof.jws());
    let replay = receiver.accept(&req, paid.proof.jws()).await.unwrap_err();
    assert_eq!(replay.code(), "quote_used", "{replay}");

    // A tampered chain names its broken link.
    let mut tampered = refs.clone();
    let forged = receiver.receipt(&accepted, b"other results").unwrap();
    tampered[3] = forged.jws();
    assert!(
        stipendex::chain::verify_chain(&tampered, None).is_ok(),
        "a second receipt for the same proof is still a valid receipt"
    );
    let mut flipped = refs[2].to_owned().into_bytes();
    let n = flipped.len() - 5;
    flipped[n] = if flipped[n] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    tampered[2] = &flipped;
    let err = stipendex::chain::verify_chain(&tampered, None).unwrap_err();
    assert!(matches!(err, Error::Broken { link: "proof", .. }), "{err}");
}

/// The house rail's payer, noting at each payment whether everything the wallet had committed
/// to its store was durable by then.
struct Watched {
    inner: Arc<dyn rail_core::Payer>,
    db: rail_core::sqlite::SqliteDb,
    durable_when_asked: std::sync::Mutex<Vec<bool>>,
}

impl std::fmt::Debug for Watched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Watched")
    }
}

impl rail_core::Rail for Watched {
    fn id(&self) -> rail_core::RailId {
        self.inner.id()
    }
    fn capabilities(&self) -> rail_core::Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait::async_trait]
impl rail_core::Payer for Watched {
    async fn pay(
        &self,
        op: &rail_core::OpId,
        offer: &rail_core::Offer,
    ) -> rail_core::RailResult<rail_core::Payment> {
        let durable = self.db.durable_through() >= self.db.last_commit();
        self.durable_when_asked.lock().unwrap().push(durable);
        self.inner.pay(op, offer).await
    }
}

/// The wallet's records of a paid call (its claims and counts, answered before they are on
/// disk) are durable before the rail is asked and before its Proof is returned — here with the
/// journal outside the store, so that no journal write makes them durable on the way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paid_calls_records_are_durable_before_the_rail_is_asked_and_before_its_proof_returns() {
    let w = world().await;
    let db = rail_core::sqlite::SqliteDb::open_here(&w._dir.path().join("wallet.db")).unwrap();
    let watched = Arc::new(Watched {
        inner: w.registry.payer("house").unwrap().payer.clone(),
        db: db.clone(),
        durable_when_asked: std::sync::Mutex::default(),
    });
    let wallet = stipendex::wallet::Wallet::builder(w.wallet_key.clone(), w.mandate(|_| {}))
        .rail(
            "house",
            rail_core::PayerHandle {
                payer: watched.clone(),
                hold_payer: None,
            },
        )
        .store(w.store.clone())
        .journal(w.journal.clone())
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let receiver = w.receiver();
    for i in 0..3 {
        let req = Request::new("GET", "/search").with_params(serde_json::json!({ "q": i }));
        let q = quote(&receiver, &req).await;
        let paid = wallet.pay(&q).await.unwrap();
        assert!(paid.fresh);
        assert!(
            db.durable_through() >= db.last_commit(),
            "a Proof was returned before the wallet's records of it were durable"
        );
        receiver.accept(&req, paid.proof.jws()).await.unwrap();
    }
    assert_eq!(
        *watched.durable_when_asked.lock().unwrap(),
        vec![true; 3],
        "the rail was asked while the wallet's records were not yet durable"
    );
}

/// The receiver's records of a presentation (its claim and the rail's verdict, answered before
/// they are on disk) are durable before the paid work is handed its request, and its kept
/// answer and the Proof's use before the answer leaves; a repeat gets the kept answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_presentations_records_are_durable_before_its_work_runs_and_before_its_answer_leaves() {
    use stipendex::receiver::{Admitted, Answer, Delivery, Presented};
    let w = world().await;
    let file = w._dir.path().join("records.db");
    let store: Arc<dyn stipendex::KeyStore> = Arc::new(
        rail_core::keys::sql::SqliteKeyStore::open(&file)
            .await
            .unwrap()
            .with_clock(Arc::new(w.clock.clone())),
    );
    let db = rail_core::sqlite::SqliteDb::open_here(&file).unwrap();
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .store(store)
        .price(PricedCapability::fixed("GET", "/search", usd("0.05")))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let wallet = w.wallet(w.mandate(|_| {}), true);
    let req = Request::new("GET", "/search").with_params(serde_json::json!({"q": "disk"}));
    let q = quote(&receiver, &req).await;
    let paid = wallet.pay(&q).await.unwrap();
    let Presented::Admitted(Admitted::Run(paying)) =
        receiver.present(&req, paid.proof.jws()).await.unwrap()
    else {
        panic!("a new proof was not run");
    };
    assert!(matches!(
        receiver.deliver(&paying).await.unwrap(),
        Delivery::First
    ));
    assert!(
        db.durable_through() >= db.last_commit(),
        "the work was handed its request before the presentation's records were durable"
    );
    let answer = Answer {
        status: 200,
        content_type: Some("text/plain".into()),
        body: b"results".to_vec(),
        receipt: None,
        headers: Vec::new(),
    };
    receiver.answered(*paying, Some(&answer)).await.unwrap();
    assert!(
        db.durable_through() >= db.last_commit(),
        "the answer left before its kept copy and the Proof's use were durable"
    );
    match receiver.present(&req, paid.proof.jws()).await.unwrap() {
        Presented::Admitted(Admitted::Answered { answer: kept, .. }) => {
            assert_eq!(kept.body, b"results");
        }
        _ => panic!("a repeat did not get the kept answer"),
    }
}

#[tokio::test]
async fn a_quote_the_receiver_signed_but_altered_inside_a_signed_proof_is_refused() {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use stipendex::envelope::{Digest, Proof, Signed};
    // The receiver reads its own recent Quotes without verifying them again: one whose payload
    // was changed after it signed it (a lower price, the receiver's signature kept) is not one
    // of them, and its signature is checked — whoever signed the Proof around it.
    let w = world().await;
    let receiver = w.receiver();
    let wallet = w.wallet(w.mandate(|_| {}), true);
    let req = Request::new("GET", "/search").with_params(serde_json::json!({"q": "disk"}));
    let q = quote(&receiver, &req).await;
    let paid = wallet.pay(&q).await.unwrap();
    let parts: Vec<&str> = q.jws().split('.').collect();
    let payload = String::from_utf8(URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    let cheaper = payload.replacen("\"amount\":\"0.05\"", "\"amount\":\"0.01\"", 1);
    assert_ne!(
        cheaper, payload,
        "the quote's amount was not found: {payload}"
    );
    let altered = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(cheaper.as_bytes()),
        parts[2]
    );
    let forged = Signed::sign(
        Proof {
            quote: Some(Digest::of(altered.as_bytes())),
            quote_jws: Some(altered),
            ..paid.proof.object().clone()
        },
        &w.wallet_key,
    )
    .unwrap();
    let err = receiver.present(&req, forged.jws()).await.unwrap_err();
    assert_eq!(err.code(), "bad_signature", "{err}");
    // The honest Proof of the same payment is still taken.
    assert!(receiver.present(&req, paid.proof.jws()).await.is_ok());
}

#[tokio::test]
async fn a_receiver_outside_the_allowlist_is_denied_and_escalated() {
    let w = world().await;
    let wallet = w.wallet(w.mandate(|_| {}), true);
    let stranger = w.receiver_with("stranger", &SecretKey::generate());
    let q = quote(&stranger, &Request::new("GET", "/search")).await;
    let err = wallet.pay(&q).await.unwrap_err();
    assert_eq!(err.code(), "denied", "{err}");
    assert_eq!(w.denied.load(Ordering::SeqCst), 1);
    // The right id with another key is denied too (the key is pinned).
    let impostor = w.receiver_with("search", &SecretKey::generate());
    let q = quote(&impostor, &Request::new("GET", "/search")).await;
    assert_eq!(wallet.pay(&q).await.unwrap_err().code(), "denied");
}

#[tokio::test]
async fn limits_refuse_and_count_nothing() {
    let w = world().await;
    let wallet = w.wallet(
        w.mandate(|m| {
            m.limits[0].per_call = Some("2.00".parse().unwrap());
            m.limits[0].confirm_above = None;
        }),
        true,
    );
    let receiver = w.receiver();
    let q = quote(&receiver, &Request::new("GET", "/report")).await;
    let err = wallet.pay(&q).await.unwrap_err();
    assert_eq!(err.code(), "limit_exceeded", "{err}");
    assert!(err.to_string().contains("per_payment"), "{err}");
    // Nothing was counted: a payment within the limit still goes through.
    let q = quote(&receiver, &Request::new("GET", "/search")).await;
    wallet.pay(&q).await.unwrap();
}

#[tokio::test]
async fn above_the_threshold_a_human_confirms_or_nothing_moves() {
    let w = world().await;
    let receiver = w.receiver();
    let req = Request::new("GET", "/report");
    let no = w.wallet(w.mandate(|_| {}), false);
    let q = quote(&receiver, &req).await;
    let err = no.pay(&q).await.unwrap_err();
    assert_eq!(err.code(), "not_confirmed", "{err}");
    assert_eq!(w.asked.load(Ordering::SeqCst), 1);

    let yes = w.wallet(w.mandate(|_| {}), true);
    let q = quote(&receiver, &req).await;
    let paid = yes.pay(&q).await.unwrap();
    let c = paid.confirmation.as_ref().expect("a confirmation");
    assert_eq!(c.object().total, "2.50".parse::<Amount>().unwrap());
    let accepted = receiver.accept(&req, paid.proof.jws()).await.unwrap();
    let receipt = receiver.receipt(&accepted, b"report").unwrap();
    yes.receipt(&paid, receipt.jws()).await.unwrap();
    let chain = w.journal.chain(&chain_name("search", &q.object().id));
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    let v = stipendex::chain::verify_chain(&refs, None).unwrap();
    assert!(v.confirmation.is_some());
}

#[tokio::test]
async fn a_revoked_mandate_pays_nothing_from_then_on() {
    let w = world().await;
    let mandate = w.mandate(|_| {});
    let wallet = w.wallet(mandate.clone(), true);
    let receiver = w.receiver();
    let q = quote(&receiver, &Request::new("GET", "/search")).await;
    wallet.pay(&q).await.unwrap();
    let revocation = revoke(&mandate, &w.principal, w.now()).unwrap();
    stipendex::wallet::Revocations::new(w.store.clone())
        .record(&revocation)
        .await
        .unwrap();
    let q = quote(&receiver, &Request::new("GET", "/search")).await;
    let err = wallet.pay(&q).await.unwrap_err();
    assert_eq!(err.code(), "revoked", "{err}");
}

#[tokio::test]
async fn expired_quotes_and_quotes_for_other_requests_are_refused() {
    let w = world().await;
    let wallet = w.wallet(w.mandate(|_| {}), true);
    let receiver = w.receiver();
    let req = Request::new("GET", "/search").with_params(serde_json::json!({"q": "a"}));
    let q = quote(&receiver, &req).await;
    // Paid for request A, presented for request B.
    let paid = wallet.pay(&q).await.unwrap();
    let other = Request::new("GET", "/search").with_params(serde_json::json!({"q": "b"}));
    assert_eq!(
        receiver
            .accept(&other, paid.proof.jws())
            .await
            .unwrap_err()
            .code(),
        "mismatch"
    );
    // A quote past its TTL is not paid.
    let q = quote(&receiver, &req).await;
    w.clock.advance(Duration::from_secs(121));
    assert_eq!(wallet.pay(&q).await.unwrap_err().code(), "expired");
}

#[tokio::test]
async fn checkout_holds_then_captures_never_above_quote_or_confirmation() {
    let w = world().await;
    let wallet = w.wallet(w.mandate(|_| {}), true);
    let receiver = w.receiver();
    let req = Request::new("POST", "/order");
    let q = quote(&receiver, &req).await;
    assert_eq!(q.object().rails[0].offer.amount, usd("3.50"));
    let paid = wallet.pay(&q).await.unwrap();
    assert!(
        paid.confirmation.is_some(),
        "a checkout is always confirmed"
    );
    let accepted = receiver.accept(&req, paid.proof.jws()).await.unwrap();
    let err = receiver
        .capture(&accepted, &usd("3.51"), b"")
        .await
        .unwrap_err();
    assert_eq!(err.code(), "capture_above", "{err}");
    let (captured, receipt) = receiver
        .capture(&accepted, &usd("3.20"), b"order 42")
        .await
        .unwrap();
    assert_eq!(captured.captured, usd("3.20"));
    assert_eq!(captured.released, usd("0.30"));
    wallet.receipt(&paid, receipt.jws()).await.unwrap();
    let chain = w.journal.chain(&chain_name("search", &q.object().id));
    let refs: Vec<&str> = chain.iter().map(String::as_str).collect();
    stipendex::chain::verify_chain(&refs, Some(&w.principal.public())).unwrap();
}

#[tokio::test]
async fn the_hook_rejects_without_charging_or_waives() {
    let w = world().await;
    let hook = |_: &PricedCapability, req: &Request| match req.client.as_deref() {
        Some("blocked") => Decision::reject("access denied"),
        Some("subscriber") => Decision::Waive,
        _ => Decision::quote(Price::Fixed(usd("0.07"))),
    };
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .price(PricedCapability::fixed("GET", "/search", usd("0.05")))
        .resolve_price(Arc::new(hook))
        .build()
        .unwrap();
    let mut req = Request::new("GET", "/search");
    req.client = Some("blocked".into());
    assert!(
        matches!(receiver.gate(&req).await.unwrap(), Gate::Rejected(m) if m == "access denied")
    );
    req.client = Some("subscriber".into());
    assert!(matches!(receiver.gate(&req).await.unwrap(), Gate::Waived));
    req.client = None;
    let q = quote(&receiver, &req).await;
    assert_eq!(q.object().amount, Some("0.07".parse().unwrap()));
}

/// A wallet whose mandate allows 0.50 a day: ten calls of `/search`.
fn ten_calls_a_day(w: &common::World) -> stipendex::wallet::Wallet {
    w.wallet(
        w.mandate(|m| {
            m.limits[0].per_period = Some(Period {
                seconds: 86_400,
                amount: "0.50".parse().unwrap(),
            });
        }),
        true,
    )
}

#[tokio::test]
async fn fifty_concurrent_payments_against_a_limit_of_ten_pay_exactly_ten() {
    let w = world().await;
    let wallet = ten_calls_a_day(&w);
    let receiver = w.receiver();
    let mut quotes = Vec::new();
    for _ in 0..50 {
        quotes.push(quote(&receiver, &Request::new("GET", "/search")).await);
    }
    let outcomes = futures::future::join_all(quotes.iter().map(|q| wallet.pay(q))).await;
    let paid = outcomes.iter().filter(|o| o.is_ok()).count();
    let refused = outcomes
        .iter()
        .filter(|o| matches!(o, Err(e) if e.code() == "limit_exceeded"))
        .count();
    assert_eq!(
        (paid, refused),
        (10, 40),
        "{:?}",
        outcomes
            .iter()
            .filter_map(|o| o.as_ref().err())
            .map(ToString::to_string)
            .collect::<Vec<_>>()
    );
    // Durable: a new wallet on the same store (a restart) sees the limit spent.
    let restarted = w.wallet(wallet.mandate().clone(), true);
    let q = quote(&receiver, &Request::new("GET", "/search")).await;
    assert_eq!(
        restarted.pay(&q).await.unwrap_err().code(),
        "limit_exceeded"
    );
}

/// The wallet counts the limits beside the operation's claim, in one commit: many calls paying
/// one Quote at once make one payment, counted once (the calls that lose the claim give their
/// count back), and a replay of the paid Quote counts nothing.
#[tokio::test]
async fn one_quote_paid_by_many_calls_at_once_is_paid_and_counted_once() {
    let w = world().await;
    let wallet = ten_calls_a_day(&w);
    let receiver = w.receiver();
    let q = quote(&receiver, &Request::new("GET", "/search")).await;
    let outcomes = futures::future::join_all((0..16).map(|_| wallet.pay(&q))).await;
    let proofs: std::collections::BTreeSet<String> = outcomes
        .iter()
        .filter_map(|o| o.as_ref().ok())
        .map(|p| p.proof.jws().to_owned())
        .collect();
    assert_eq!(proofs.len(), 1, "one payment, one Proof: {outcomes:?}");
    for o in &outcomes {
        if let Err(e) = o {
            assert_eq!(e.code(), "in_progress", "{e}");
        }
    }
    // Paid again: its Proof, nothing counted.
    let again = wallet.pay(&q).await.unwrap();
    assert!(proofs.contains(again.proof.jws()));
    // Counted once: the limit (ten calls) admits nine more, and not a tenth.
    for _ in 0..9 {
        let q = quote(&receiver, &Request::new("GET", "/search")).await;
        wallet.pay(&q).await.unwrap();
    }
    let q = quote(&receiver, &Request::new("GET", "/search")).await;
    assert_eq!(wallet.pay(&q).await.unwrap_err().code(), "limit_exceeded");
}

/// A fleet of wallets sharing one mandate through PostgreSQL: two wallet instances (as two
/// hosts would run), 50 concurrent payments between them against a limit that admits 10.
#[tokio::test]
async fn a_fleet_sharing_one_mandate_on_postgres_pays_exactly_the_limit() {
    let url = test_kit::localnet::postgres_url();
    let store = match tokio::time::timeout(
        Duration::from_secs(5),
        rail_core::keys::sql::PgKeyStore::connect(&url),
    )
    .await
    {
        Ok(Ok(s)) => s,
        other => {
            let why = match other {
                Ok(Err(e)) => e.to_string(),
                _ => "connection timed out".into(),
            };
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "PostgreSQL at {url} is required in CI: {why}"
            );
            println!("SKIPPED: PostgreSQL at {url} is not reachable ({why})");
            return;
        }
    };
    let w = world().await;
    let store: Arc<dyn stipendex::KeyStore> = Arc::new(store);
    let mandate = w.mandate(|m| {
        m.limits[0].per_period = Some(Period {
            seconds: 86_400,
            amount: "0.50".parse().unwrap(),
        });
        m.limits[0].confirm_above = None;
    });
    let host = |_: usize| {
        stipendex::wallet::Wallet::builder(w.wallet_key.clone(), mandate.clone())
            .registry(&w.registry)
            .store(store.clone())
            .build()
            .unwrap()
    };
    let (a, b) = (host(0), host(1));
    let receiver = w.receiver();
    let mut quotes = Vec::new();
    for _ in 0..50 {
        quotes.push(quote(&receiver, &Request::new("GET", "/search")).await);
    }
    let outcomes = futures::future::join_all(
        quotes
            .iter()
            .enumerate()
            .map(|(i, q)| if i % 2 == 0 { a.pay(q) } else { b.pay(q) }),
    )
    .await;
    let paid = outcomes.iter().filter(|o| o.is_ok()).count();
    let refused = outcomes
        .iter()
        .filter(|o| matches!(o, Err(e) if e.code() == "limit_exceeded"))
        .count();
    assert_eq!((paid, refused), (10, 40));
}

/// A receiving rail whose offers fail (a card processor that is down).
struct Down;

impl stipendex::Rail for Down {
    fn id(&self) -> stipendex::rail_core::RailId {
        stipendex::rail_core::RailId::new("stripe")
    }
    fn capabilities(&self) -> stipendex::rail_core::Capabilities {
        stipendex::rail_core::Capabilities::pay_only(
            stipendex::rail_core::Finality::Immediate,
            vec![stipendex::Asset::usd()],
        )
    }
}

#[async_trait::async_trait]
impl stipendex::RailReceiver for Down {
    async fn offer(
        &self,
        _: &stipendex::Charge,
    ) -> stipendex::rail_core::RailResult<stipendex::Offer> {
        Err(stipendex::rail_core::RailError::Unavailable(
            stipendex::rail_core::RailReason::new("stripe", "the processor is down"),
        ))
    }
    async fn verify(
        &self,
        _: &stipendex::Offer,
        _: &stipendex::rail_core::Payment,
    ) -> stipendex::rail_core::RailResult<stipendex::rail_core::Verified> {
        Err(stipendex::rail_core::RailError::InvalidInput("down".into()))
    }
}

/// A rail that cannot make an offer drops out of the Quote; the others stand (issue 24). Only
/// when every rail fails does quoting fail.
#[tokio::test]
async fn a_rail_that_cannot_offer_drops_out_of_the_quote() {
    let w = world().await;
    let price = PricedCapability::fixed("GET", "/search", usd("0.05"));
    let down = || stipendex::rail_core::ReceiverHandle::pay_only(Down);
    let both = Receiver::builder("search", w.receiver_key.clone())
        .rail("card", down())
        .registry(&w.registry)
        .price(price.clone())
        .build()
        .unwrap();
    let q = quote(&both, &Request::new("GET", "/search")).await;
    let rails: Vec<&str> = q.object().rails.iter().map(|r| r.rail.as_str()).collect();
    assert_eq!(rails, ["ledger"]);
    let only_down = Receiver::builder("search", w.receiver_key.clone())
        .rail("card", down())
        .price(price)
        .build()
        .unwrap();
    let err = only_down
        .gate(&Request::new("GET", "/search"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), "unavailable", "{err}");
}

/// The wallet does not pay a Quote too close to its expiry (issue 24): it would be refused by
/// the receiver after the money moved. Refused as expired, nothing counted; a fresh one pays.
#[tokio::test]
async fn a_quote_about_to_expire_is_not_paid() {
    let w = world().await;
    let receiver = w.receiver();
    let wallet = w.wallet(w.mandate(|_| {}), true);
    let req = Request::new("GET", "/search");
    let q = quote(&receiver, &req).await;
    w.clock
        .advance(Duration::from_secs(q.object().exp - q.object().iat - 3));
    let err = wallet.pay(&q).await.unwrap_err();
    assert_eq!(err.code(), "expired", "{err}");
    assert!(err.to_string().contains("fresh quote"), "{err}");
    let fresh = quote(&receiver, &req).await;
    wallet.pay(&fresh).await.unwrap();
}

/// A memory journal that notes, at each object recorded, whether everything the wallet had
/// committed to its store (`db`) was durable by then.
struct Watching {
    inner: stipendex::wallet::MemoryJournal,
    db: rail_core::sqlite::SqliteDb,
    durable_at_record: std::sync::Mutex<Vec<bool>>,
}

#[async_trait::async_trait]
impl stipendex::wallet::Journal for Watching {
    async fn record(&self, chain: &str, jws: &str) -> Result<(), Error> {
        let durable = self.db.durable_through() >= self.db.last_commit();
        self.durable_at_record.lock().unwrap().push(durable);
        self.inner.record(chain, jws).await
    }
    async fn begin(&self, p: &stipendex::wallet::Pending) -> Result<(), Error> {
        self.inner.begin(p).await
    }
    async fn end(&self, chain: &str) -> Result<(), Error> {
        self.inner.end(chain).await
    }
    async fn pending(&self) -> Result<Vec<stipendex::wallet::Pending>, Error> {
        self.inner.pending().await
    }
}

/// With the journal outside the store's file, a paid payment's records in the store (its
/// Proof's record, its count kept: deferred writes) are durable before the journal records its
/// chain and ends it — else a power loss could leave the journal saying "done" over a store
/// that forgot the Proof.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payments_store_records_are_durable_before_a_journal_outside_the_store_records_its_chain()
{
    let w = world().await;
    let db = rail_core::sqlite::SqliteDb::open_here(&w._dir.path().join("wallet.db")).unwrap();
    let journal = Arc::new(Watching {
        inner: stipendex::wallet::MemoryJournal::default(),
        db,
        durable_at_record: std::sync::Mutex::default(),
    });
    let wallet = stipendex::wallet::Wallet::builder(w.wallet_key.clone(), w.mandate(|_| {}))
        .registry(&w.registry)
        .store(w.store.clone())
        .journal(journal.clone())
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let receiver = w.receiver();
    let req = Request::new("GET", "/search").with_params(serde_json::json!({"q": "order"}));
    let q = quote(&receiver, &req).await;
    wallet.pay(&q).await.unwrap();
    let seen = journal.durable_at_record.lock().unwrap().clone();
    assert!(!seen.is_empty(), "the chain was not journaled");
    assert!(
        seen.iter().all(|d| *d),
        "the journal recorded the chain before the store's records were durable: {seen:?}"
    );
}

/// A journal whose next `record` fails once (a disk full, a crash), around a memory journal.
#[derive(Default)]
struct Flaky {
    inner: stipendex::wallet::MemoryJournal,
    fail_next: std::sync::atomic::AtomicBool,
    fail_begin: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl stipendex::wallet::Journal for Flaky {
    async fn record(&self, chain: &str, jws: &str) -> Result<(), Error> {
        if self.fail_next.swap(false, Ordering::SeqCst) {
            return Err(Error::Storage("disk full".into()));
        }
        self.inner.record(chain, jws).await
    }
    async fn begin(&self, p: &stipendex::wallet::Pending) -> Result<(), Error> {
        if self.fail_begin.load(Ordering::SeqCst) {
            return Err(Error::Storage("disk full".into()));
        }
        self.inner.begin(p).await
    }
    async fn end(&self, chain: &str) -> Result<(), Error> {
        self.inner.end(chain).await
    }
    async fn pending(&self) -> Result<Vec<stipendex::wallet::Pending>, Error> {
        self.inner.pending().await
    }
}

/// Crash recovery (issue 24): a payment whose chain could not be journaled after its Proof was
/// stored stays pending; paying the Quote again returns the same Proof and journals the chain
/// once (one mandate, one quote, one proof), which verifies. A journal that cannot take the
/// pending payment pays nothing.
#[tokio::test]
async fn a_chain_is_journaled_once_after_recovery_and_never_without_its_pending_record() {
    let w = world().await;
    let journal = Arc::new(Flaky::default());
    let wallet = stipendex::wallet::Wallet::builder(w.wallet_key.clone(), w.mandate(|_| {}))
        .registry(&w.registry)
        .store(w.store.clone())
        .journal(journal.clone())
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let receiver = w.receiver();
    // No pending record, no payment: refused, nothing counted, nothing moved.
    journal.fail_begin.store(true, Ordering::SeqCst);
    let first = Request::new("GET", "/search").with_params(serde_json::json!({"q": "first"}));
    let q = quote(&receiver, &first).await;
    let e = wallet.pay(&q).await.unwrap_err();
    assert_eq!(e.code(), "storage", "{e}");
    journal.fail_begin.store(false, Ordering::SeqCst);
    let paid = wallet.pay(&q).await.unwrap();
    receiver
        .accept(&first, paid.proof.jws())
        .await
        .expect("paid once, after the journal recovered");

    let q = quote(&receiver, &Request::new("GET", "/search")).await;
    let chain = chain_name("search", &q.object().id);
    journal.fail_next.store(true, Ordering::SeqCst);
    let paid = wallet.pay(&q).await.unwrap();
    assert!(journal.inner.chain(&chain).is_empty());
    assert_eq!(wallet.pending().await.unwrap().len(), 1, "left pending");
    let again = wallet.pay(&q).await.unwrap();
    assert_eq!(again.proof.jws(), paid.proof.jws());
    let _ = wallet.pay(&q).await.unwrap();
    let objects = journal.inner.chain(&chain);
    assert_eq!(objects.len(), 3, "mandate, quote, proof: each once");
    let refs: Vec<&str> = objects.iter().map(String::as_str).collect();
    stipendex::chain::verify_chain(&refs, Some(&w.principal.public())).unwrap();
    assert!(wallet.pending().await.unwrap().is_empty());
    assert!(matches!(
        wallet.resume(&chain).await.unwrap_err(),
        Error::NotPending(_)
    ));
}

/// A payer whose every answer is lost: the rail's outcome stays unknown. Records each
/// operation id it is asked under.
struct AlwaysUnknown(std::sync::Mutex<Vec<String>>);

impl stipendex::Rail for AlwaysUnknown {
    fn id(&self) -> stipendex::rail_core::RailId {
        stipendex::rail_core::RailId::new("ledger")
    }
    fn capabilities(&self) -> stipendex::rail_core::Capabilities {
        stipendex::rail_core::Capabilities::pay_only(
            stipendex::rail_core::Finality::Immediate,
            vec![stipendex::Asset::usd()],
        )
    }
}

#[async_trait::async_trait]
impl stipendex::Payer for AlwaysUnknown {
    async fn pay(
        &self,
        op: &stipendex::OpId,
        _: &stipendex::Offer,
    ) -> stipendex::rail_core::RailResult<stipendex::rail_core::Payment> {
        self.0.lock().unwrap().push(op.as_str().to_owned());
        Err(stipendex::rail_core::RailError::Unavailable(
            stipendex::rail_core::RailReason::new("timeout", "no answer"),
        ))
    }
}

/// A rail that stays unknown (issue 24): the payment stays pending and counted against the
/// limits (a second payment the limit cannot hold with it is refused); resuming asks the rail
/// again under the same operation id, never a new one; the agent's retry of the same Quote
/// does too.
#[tokio::test]
async fn a_payment_whose_outcome_stays_unknown_stays_pending_and_counted_and_is_never_paid_twice() {
    let w = world().await;
    let payer = Arc::new(AlwaysUnknown(std::sync::Mutex::default()));
    let wallet = stipendex::wallet::Wallet::builder(
        w.wallet_key.clone(),
        w.mandate(|m| m.limits[0].total = Some("0.08".parse().unwrap())),
    )
    .rail(
        "house",
        stipendex::PayerHandle {
            payer: payer.clone(),
            hold_payer: None,
        },
    )
    .store(w.store.clone())
    .clock(Arc::new(w.clock.clone()))
    .build()
    .unwrap();
    let receiver = w.receiver();
    let q = quote(&receiver, &Request::new("GET", "/search")).await;
    let e = wallet.pay(&q).await.unwrap_err();
    assert_eq!(e.code(), "unavailable", "{e}");
    let pending = wallet.pending().await.unwrap();
    assert_eq!(pending.len(), 1);
    let chain = pending[0].chain.clone();
    // Counted: 0.05 of the 0.08 total is taken, so another 0.05 is refused.
    let other = quote(
        &receiver,
        &Request::new("GET", "/search").with_params(serde_json::json!({"q": "other"})),
    )
    .await;
    let e = wallet.pay(&other).await.unwrap_err();
    assert_eq!(e.code(), "limit_exceeded", "{e}");
    for _ in 0..2 {
        let e = wallet.resume(&chain).await.unwrap_err();
        assert_eq!(e.code(), "unavailable", "{e}");
    }
    let e = wallet.pay(&q).await.unwrap_err();
    assert_eq!(e.code(), "unavailable", "{e}");
    assert_eq!(wallet.pending().await.unwrap().len(), 1, "still pending");
    let ops = payer.0.lock().unwrap().clone();
    assert_eq!(ops.len(), 4, "asked once, then on each resume and retry");
    assert!(ops.iter().all(|o| *o == ops[0]), "one operation: {ops:?}");
}

/// A per-call confirmer (issue 25, the host side): `pay_with` asks the confirmer of this call
/// (a host's MCP elicitation) instead of the wallet's own, and tells it of a denial; its yes is
/// signed as the Confirmation, its no pays nothing.
#[tokio::test]
async fn a_per_call_confirmer_decides_for_its_call_only() {
    use stipendex::wallet::{Answer, Callback};
    let w = world().await;
    let wallet = w.wallet(w.mandate(|_| {}), false); // its own confirmer says no
    let receiver = w.receiver();
    let asked_here = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let denied_here = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (a, d) = (asked_here.clone(), denied_here.clone());
    let per_call = Callback::new(move |_| {
        a.fetch_add(1, Ordering::SeqCst);
        Answer::Yes {
            by: "elicitation".into(),
        }
    })
    .on_denial(move |_| {
        d.fetch_add(1, Ordering::SeqCst);
    });
    let q = quote(&receiver, &Request::new("GET", "/report")).await; // above the threshold
    let paid = wallet.pay_with(&q, &per_call).await.unwrap();
    assert_eq!(paid.confirmation.unwrap().object().by, "elicitation");
    assert_eq!(asked_here.load(Ordering::SeqCst), 1);
    assert_eq!(
        w.asked.load(Ordering::SeqCst),
        0,
        "the wallet's own confirmer was asked"
    );
    // The wallet's own confirmer still decides plain `pay`: it says no.
    let q = quote(
        &receiver,
        &Request::new("GET", "/report").with_params(serde_json::json!({"n": 2})),
    )
    .await;
    assert_eq!(wallet.pay(&q).await.unwrap_err().code(), "not_confirmed");
    // A denial is told to the call's confirmer.
    let stranger = w.receiver_with("stranger", &SecretKey::generate());
    let q = quote(&stranger, &Request::new("GET", "/search")).await;
    assert_eq!(
        wallet.pay_with(&q, &per_call).await.unwrap_err().code(),
        "denied"
    );
    assert_eq!(denied_here.load(Ordering::SeqCst), 1);
    assert_eq!(w.denied.load(Ordering::SeqCst), 0);
}

/// A payer that hangs on its first payment (a rail that does not answer), then pays.
struct HangsFirst {
    inner: Arc<dyn stipendex::rail_core::Payer>,
    hung: std::sync::atomic::AtomicBool,
}

impl stipendex::rail_core::Rail for HangsFirst {
    fn id(&self) -> stipendex::rail_core::RailId {
        self.inner.id()
    }
    fn capabilities(&self) -> stipendex::rail_core::Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait::async_trait]
impl stipendex::rail_core::Payer for HangsFirst {
    async fn pay(
        &self,
        op: &stipendex::rail_core::OpId,
        offer: &stipendex::rail_core::Offer,
    ) -> stipendex::rail_core::RailResult<stipendex::rail_core::Payment> {
        if !self.hung.swap(true, Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.inner.pay(op, offer).await
    }
    fn accepts(&self, offer: &stipendex::rail_core::Offer) -> stipendex::rail_core::RailResult<()> {
        self.inner.accepts(offer)
    }
}

/// Issue 45: a payment left by a process that ended mid-payment (its rail never answered) is
/// taken over at once — its journal's holder lock is free — not after its lease: the same
/// request asked by another process resumes it under its operation and pays once, never the
/// fresh Quote it is offered beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_left_by_a_process_that_ended_is_taken_over_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let at = dir.path().to_path_buf();
    taken_over_at_once(move || {
        let at = at.clone();
        async move {
            Arc::new(stipendex::wallet::DirJournal::new(&at).unwrap())
                as Arc<dyn stipendex::wallet::Journal>
        }
    })
    .await;
}

/// The same, with the journal in the wallet's SQLite store (`journal = "store"`): its holder
/// lock beside the file is released with the "process" (its journal dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_left_by_a_process_that_ended_is_taken_over_at_once_with_the_journal_in_the_store()
 {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("wallet.db");
    taken_over_at_once(move || {
        let file = file.clone();
        async move {
            Arc::new(stipendex::wallet::SqliteJournal::open(&file).await.unwrap())
                as Arc<dyn stipendex::wallet::Journal>
        }
    })
    .await;
}

async fn taken_over_at_once<F, Fut>(journal: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Arc<dyn stipendex::wallet::Journal>>,
{
    let w = world().await;
    let receiver = w.receiver_with("search", &w.receiver_key);
    let house = w.registry.payer("house").unwrap().clone();
    let mandate = w.mandate(|m| common::pin(m, "https://search.example"));
    let hanging = Arc::new(HangsFirst {
        inner: house.payer.clone(),
        hung: std::sync::atomic::AtomicBool::new(false),
    });
    let wallet_in = |payer: Arc<dyn stipendex::rail_core::Payer>,
                     journal: Arc<dyn stipendex::wallet::Journal>| {
        stipendex::wallet::Wallet::builder(w.wallet_key.clone(), mandate.clone())
            .rail(
                "house",
                stipendex::PayerHandle {
                    payer,
                    hold_payer: None,
                },
            )
            .store(w.store.clone())
            .journal(journal)
            .clock(Arc::new(w.clock.clone()))
            .build()
            .unwrap()
    };
    let sent = stipendex::envelope::Resource {
        origin: "https://search.example".into(),
        method: "GET".into(),
        path: "/search".into(),
        query: None,
    };
    let req = Request::from_resource(&sent);
    let before = w.balance(w.agent).await.0;
    // "Process" A: its rail hangs; it is stopped mid-payment (its journal and lock dropped).
    let first = quote(&receiver, &req).await;
    let a_journal = journal().await;
    let a = wallet_in(hanging.clone(), a_journal.clone());
    let (q, s) = (first.clone(), sent.clone());
    let task = tokio::spawn(async move {
        let _ = a.pay_sent(&q, &s, &stipendex::wallet::Refuse).await;
    });
    for _ in 0..100 {
        if !a_journal.pending().await.unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    task.abort();
    let _ = task.await;
    drop(a_journal);
    // "Process" B, at once: the same request, a fresh Quote. A's payment is taken over (its
    // lease of 60 s notwithstanding) and paid once; the fresh Quote is not paid.
    let b = wallet_in(hanging, journal().await);
    let fresh = quote(&receiver, &req).await;
    let started = std::time::Instant::now();
    let paid = b
        .pay_sent(&fresh, &sent, &stipendex::wallet::Refuse)
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "taken over at once, not after the lease"
    );
    assert_eq!(
        paid.proof.object().quote.as_ref(),
        Some(first.digest()),
        "A's payment, resumed: not the fresh Quote"
    );
    assert_eq!(before - w.balance(w.agent).await.0, 5, "paid once");
}

/// Issue 50: every paid request looks through the payments pending for its resource, and an
/// MCP tool's calls share one resource. A pending payment records the digest of its request,
/// so a call of another request of the same resource passes it by without reading (and
/// verifying) its Quote: with the first payment still pending, the second pays its own Quote.
#[tokio::test]
async fn a_pending_payment_records_its_request_and_another_request_of_its_resource_pays_at_once() {
    let w = world().await;
    let receiver = w.receiver_with("search", &w.receiver_key);
    let house = w.registry.payer("house").unwrap().clone();
    let mandate = w.mandate(|m| common::pin(m, "https://search.example"));
    let journal = Arc::new(stipendex::wallet::MemoryJournal::default());
    let wallet = journaled_wallet(
        &w,
        mandate,
        stipendex::PayerHandle {
            payer: Arc::new(HangsFirst {
                inner: house.payer.clone(),
                hung: std::sync::atomic::AtomicBool::new(false),
            }),
            hold_payer: None,
        },
        journal.clone(),
    );
    let sent = search_sent();
    let with = |q: &str| Request::from_resource(&sent).with_params(serde_json::json!({ "q": q }));
    let first = quote(&receiver, &with("one")).await;
    let (a, q, s) = (wallet.clone(), first.clone(), sent.clone());
    let task = tokio::spawn(async move {
        let _ = a.pay_sent(&q, &s, &stipendex::wallet::Refuse).await;
    });
    let mut pending = Vec::new();
    for _ in 0..100 {
        pending = stipendex::wallet::Journal::pending(journal.as_ref())
            .await
            .unwrap();
        if !pending.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        pending.len(),
        1,
        "the first payment is pending (its rail hangs)"
    );
    assert!(first.object().request.is_some());
    assert_eq!(pending[0].request, first.object().request);
    // Taken for this request's, the first payment (its rail hung for good) would be waited
    // for until `pay_sent` gave up with `in_progress`: paid, and with its own Quote, the
    // second call passed it by.
    let second = quote(&receiver, &with("two")).await;
    let paid = wallet
        .pay_sent(&second, &sent, &stipendex::wallet::Refuse)
        .await
        .unwrap();
    assert_eq!(paid.proof.object().quote.as_ref(), Some(second.digest()));
    task.abort();
}

/// Issue 46: a mandate whose validity has not begun is refused with its own code
/// (`not_yet_valid`, not `expired`), and every refusal for time names its times in RFC 3339
/// (UTC), not in raw seconds; the expired mandate's says what to do.
#[tokio::test]
async fn a_mandate_not_yet_valid_has_its_own_code_and_times_people_read() {
    use stipendex::rail_core::clock::rfc3339;
    let w = world().await;
    let receiver = w.receiver();
    let req = Request::new("GET", "/search");
    let now = w.now();
    let raw = |secs: u64| secs.to_string();

    // Valid from an hour from now, for an hour.
    let (nbf, exp) = (now + 3600, now + 7200);
    let wallet = w.wallet(
        w.mandate(|m| {
            m.nbf = nbf;
            m.exp = exp;
        }),
        true,
    );
    let err = wallet.pay(&quote(&receiver, &req).await).await.unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotYetValid {
                what: "mandate",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), "not_yet_valid", "{err}");
    let msg = err.to_string();
    assert!(msg.contains(" is not valid yet: "), "{msg}");
    assert!(
        msg.contains(&rfc3339(nbf)) && msg.contains(&rfc3339(now)),
        "{msg}"
    );
    assert!(
        !msg.contains(&raw(nbf)) && !msg.contains(&raw(now)),
        "{msg}"
    );
    assert!(msg.ends_with("check this machine's clock"), "{msg}");
    assert!(w.journal.names().is_empty(), "nothing was paid");

    // Its window begun, it pays.
    w.clock.advance(Duration::from_secs(3600));
    wallet.pay(&quote(&receiver, &req).await).await.unwrap();

    // Past its end: expired, and the message says what to do.
    w.clock.advance(Duration::from_secs(3600));
    let later = w.now();
    let err = wallet.pay(&quote(&receiver, &req).await).await.unwrap_err();
    assert_eq!(err.code(), "expired", "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&rfc3339(exp)) && msg.contains(&rfc3339(later)),
        "{msg}"
    );
    assert!(!msg.contains(&raw(exp)), "{msg}");
    assert!(
        msg.ends_with("ask the principal for a new mandate"),
        "{msg}"
    );

    // A quote past its end, under a valid mandate: the wallet's refusal names its times too.
    let wallet = w.wallet(w.mandate(|_| {}), true);
    let q = quote(&receiver, &req).await;
    let q_exp = q.object().exp;
    w.clock.advance(Duration::from_secs(121));
    let err = wallet.pay(&q).await.unwrap_err();
    assert_eq!(err.code(), "expired", "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&rfc3339(q_exp)), "{msg}");
    assert!(!msg.contains(&raw(q_exp)), "{msg}");
    assert!(msg.contains("fresh quote"), "{msg}");

    // And the receiver's, for a Proof presented past the grace a late payment has.
    let q = quote(&receiver, &req).await;
    let paid = wallet.pay(&q).await.unwrap();
    w.clock
        .advance(stipendex::rail_core::LATE_PROOF_GRACE + Duration::from_secs(3600));
    let err = receiver.accept(&req, paid.proof.jws()).await.unwrap_err();
    assert_eq!(err.code(), "expired", "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&rfc3339(q.object().exp)), "{msg}");
    assert!(!msg.contains(&raw(q.object().exp)), "{msg}");
}

/// A paid payment's record whose Quote was altered on disk (its `exp` moved back, so its Proof
/// looks past the grace a receiver honours it for) is not ended by the look for earlier
/// payments of the same request: that look reads the wallet's own records without checking
/// their signatures, so it deletes nothing on their word alone.
#[tokio::test]
async fn a_pending_record_altered_on_disk_is_not_ended_by_the_look_for_earlier_payments() {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use stipendex::wallet::{Journal, MemoryJournal, Pending, chain_name};
    let w = world().await;
    let receiver = w.receiver_with("search", &w.receiver_key);
    let mandate = w.mandate(|m| common::pin(m, "https://search.example"));
    let journal = Arc::new(MemoryJournal::default());
    let house = w.registry.payer("house").unwrap().clone();
    let wallet = journaled_wallet(&w, mandate, house, journal.clone());
    let sent = search_sent();
    let req = Request::from_resource(&sent).with_params(serde_json::json!({ "q": "one" }));
    let first = quote(&receiver, &req).await;
    let parts: Vec<&str> = first.jws().split('.').collect();
    let payload = String::from_utf8(URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    let o = first.object();
    let moved = payload.replacen(
        &format!("\"exp\":{}", o.exp),
        &format!("\"exp\":{}", o.iat + 1),
        1,
    );
    assert_ne!(moved, payload, "the quote's exp was not found: {payload}");
    let altered = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(moved.as_bytes()),
        parts[2]
    );
    let chain = chain_name(&o.receiver.id, &o.id);
    journal
        .begin(&Pending {
            chain: chain.clone(),
            quote: altered,
            confirmation: None,
            rail: "house".into(),
            op: "op-of-an-altered-record".into(),
            since: w.now(),
            resource: Some(sent.clone()),
            request: o.request.clone(),
            unknown: false,
            proof: Some("a proof kept for its answer".into()),
            holder: None,
        })
        .await
        .unwrap();
    // Past the altered `exp`'s grace, within the real one's.
    w.clock
        .advance(stipendex::rail_core::LATE_PROOF_GRACE + Duration::from_secs(2));
    let second = quote(&receiver, &req).await;
    let _ = wallet
        .pay_sent(&second, &sent, &stipendex::wallet::Refuse)
        .await;
    assert!(
        journal.pending_of(&chain).await.unwrap().is_some(),
        "a record whose signature does not check was ended"
    );
}

/// A wallet under `mandate` paying with `payer` as rail `house`, journaling in `journal`.
fn journaled_wallet(
    w: &common::World,
    mandate: stipendex::envelope::Signed<stipendex::envelope::Mandate>,
    payer: stipendex::PayerHandle,
    journal: Arc<stipendex::wallet::MemoryJournal>,
) -> stipendex::wallet::Wallet {
    stipendex::wallet::Wallet::builder(w.wallet_key.clone(), mandate)
        .rail("house", payer)
        .store(w.store.clone())
        .journal(journal)
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap()
}

/// `GET https://search.example/search`, as a request is sent.
fn search_sent() -> stipendex::envelope::Resource {
    stipendex::envelope::Resource {
        origin: "https://search.example".into(),
        method: "GET".into(),
        path: "/search".into(),
        query: None,
    }
}
