//! A Proof's claim at the receiver (issue 47): a Proof whose rail answered "try again" leaves
//! its claim in flight, to be recovered by the same Proof — and that claim ends. Proofs refused
//! that way, by the hundred, leave nothing past their Quotes' grace; the honest payer among
//! them is served when the rail is back.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::{quote, world};
use sha2::{Digest as _, Sha256};
use stipendex::rail_core::{
    self, Capabilities, Charge, OpId, Payment, RailError, RailId, RailReason, RailResult,
    ReceiverHandle, Verified,
};
use stipendex::receiver::{Admitted, CLAIM_MARGIN, Presented, Receiver, Request};
use stipendex::{KeyStore, MemoryKeyStore, Offer, RailReceiver};

/// The shop's rail, in front of the real ledger rail: while `down`, every verification is
/// answered "try again" (`Unavailable`, as a processor that timed out) without reaching it.
struct Flaky {
    inner: Arc<dyn RailReceiver>,
    down: AtomicBool,
    verified: AtomicUsize,
}

impl stipendex::Rail for Flaky {
    fn id(&self) -> RailId {
        self.inner.id()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
}

#[async_trait::async_trait]
impl RailReceiver for Flaky {
    async fn offer(&self, charge: &Charge) -> RailResult<Offer> {
        self.inner.offer(charge).await
    }
    async fn verify(&self, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        self.inner.verify(offer, payment).await
    }
    async fn verify_as(&self, op: &OpId, offer: &Offer, payment: &Payment) -> RailResult<Verified> {
        if self.down.load(Ordering::SeqCst) {
            return Err(RailError::Unavailable(RailReason::new(
                "timeout",
                "the ledger did not answer in time",
            )));
        }
        self.verified.fetch_add(1, Ordering::SeqCst);
        self.inner.verify_as(op, offer, payment).await
    }
}

/// Where the receiver `search` keeps the claim of quote `id` (its module's layout).
fn claim_key(id: &str) -> (String, String) {
    let who = hex::encode(&Sha256::digest(b"search")[..8]);
    let key = hex::encode(&Sha256::digest(id.as_bytes())[..16]);
    (format!("stipendex/{who}/proofs"), format!("q-{key}"))
}

#[tokio::test]
async fn proofs_refused_try_again_leave_claims_that_end_and_the_payer_is_served_when_the_rail_is_back()
 {
    const N: usize = 120;
    let w = world().await;
    let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::with_clock(Arc::new(w.clock.clone())));
    let flaky = Arc::new(Flaky {
        inner: w.registry.receiver("house").unwrap().receiver.clone(),
        down: AtomicBool::new(true),
        verified: AtomicUsize::new(0),
    });
    let receiver = Receiver::builder("search", w.receiver_key.clone())
        .rail(
            "house",
            ReceiverHandle {
                receiver: flaky.clone(),
                hold_receiver: None,
                refunds: None,
            },
        )
        .store(store.clone())
        .price(stipendex::receiver::PricedCapability::fixed(
            "GET",
            "/search",
            common::usd("0.05"),
        ))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap();
    let wallet = w.wallet(w.mandate(|_| {}), true);

    // N payments, each refused "try again": each leaves its claim, in flight, with an end.
    let mut paid = Vec::new();
    for i in 0..N {
        let req = Request::new("GET", "/search").with_params(serde_json::json!({ "q": i }));
        let q = quote(&receiver, &req).await;
        let p = wallet.pay(&q).await.unwrap();
        let err = receiver.present(&req, p.proof.jws()).await.unwrap_err();
        assert_eq!(err.code(), "unavailable", "{err}");
        let (ns, key) = claim_key(&q.object().id);
        let seen = store
            .get(&ns, &key)
            .await
            .unwrap()
            .expect("a claim is kept");
        assert!(seen.record.lease_until.is_some(), "in flight");
        let end = seen.record.expires_at.expect("the claim has an end");
        let refused_from = q.object().exp + rail_core::LATE_PROOF_GRACE.as_secs();
        assert_eq!(
            u64::try_from(end.0 / 1000).unwrap(),
            refused_from + CLAIM_MARGIN.as_secs(),
            "the claim ends a margin after the receiver refuses its Proof by itself"
        );
        paid.push((req, q, p));
    }
    assert_eq!(flaky.verified.load(Ordering::SeqCst), 0);

    // The rail is back: the first payer presents the same Proof again and is served (its
    // claim recovered, its payment verified once).
    flaky.down.store(false, Ordering::SeqCst);
    let (req, q, p) = &paid[0];
    let Presented::Admitted(Admitted::Run(paying)) =
        receiver.present(req, p.proof.jws()).await.unwrap()
    else {
        panic!("the same Proof was not run when the rail came back")
    };
    receiver.answered(*paying, None).await.unwrap();
    assert_eq!(flaky.verified.load(Ordering::SeqCst), 1);
    let again = receiver.present(req, p.proof.jws()).await.unwrap_err();
    assert_eq!(again.code(), "quote_used", "{again}");
    let (ns, key) = claim_key(&q.object().id);
    let used = store.get(&ns, &key).await.unwrap().unwrap();
    assert!(used.record.lease_until.is_none(), "finished");

    // Past the grace and the margin, every claim left "try again" is gone; the used one is
    // still remembered (its retention is longer).
    let last = paid.iter().map(|(_, q, _)| q.object().exp).max().unwrap();
    let past = last + rail_core::LATE_PROOF_GRACE.as_secs() + CLAIM_MARGIN.as_secs() + 1;
    w.clock.advance(Duration::from_secs(past - w.now()));
    let purged = store.purge_expired().await.unwrap();
    assert!(purged >= u64::try_from(N - 1).unwrap(), "purged {purged}");
    for (_, q, _) in &paid[1..] {
        let (ns, key) = claim_key(&q.object().id);
        assert!(store.get(&ns, &key).await.unwrap().is_none());
    }
    assert!(store.get(&ns, &key).await.unwrap().is_some());

    // Such a Proof now is refused as expired before it is claimed: nothing is written again.
    let (req, q, p) = &paid[1];
    let err = receiver.present(req, p.proof.jws()).await.unwrap_err();
    assert_eq!(err.code(), "expired", "{err}");
    let (ns, key) = claim_key(&q.object().id);
    assert!(store.get(&ns, &key).await.unwrap().is_none());

    // An honest payer is still served.
    let req = Request::new("GET", "/search").with_params(serde_json::json!({ "q": "later" }));
    let q = quote(&receiver, &req).await;
    let p = wallet.pay(&q).await.unwrap();
    let accepted = receiver.accept(&req, p.proof.jws()).await.unwrap();
    assert_eq!(accepted.verified.amount, common::usd("0.05"));
}
