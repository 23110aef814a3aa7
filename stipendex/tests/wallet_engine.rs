//! The wallet's engine without a transport (issue 49): every binding hands the wallet a
//! [`Demand`] and tells it what came back ([`Reply`]); these tests drive the two entries the
//! way a binding does and check what the principal's money did.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]

mod common;

use std::sync::Arc;

use common::{World, pin, quote, usd, world};
use stipendex::envelope::{Mandate, Resource, Signed};
use stipendex::receiver::{PricedCapability, Receiver, Request, TabTerms};
use stipendex::wallet::{Demand, Paid, Reply, Settlement, Wallet};

const ORIGIN: &str = "https://search.example";

fn sent(q: &str) -> Resource {
    Resource {
        origin: ORIGIN.into(),
        method: "GET".into(),
        path: "/search".into(),
        query: Some(format!("q={q}")),
    }
}

fn receiver(w: &World) -> Receiver {
    Receiver::builder("search", w.receiver_key.clone())
        .registry(&w.registry)
        .origin(ORIGIN)
        .price(PricedCapability::fixed("GET", "/search", usd("0.05")))
        .tabs(TabTerms::new(usd("1.00")).lanes(2))
        .clock(Arc::new(w.clock.clone()))
        .build()
        .unwrap()
}

fn mandate(w: &World, tabs: bool) -> Signed<Mandate> {
    w.mandate(|m| {
        pin(m, ORIGIN);
        if tabs {
            m.limits[0].tab_cap = Some("1.00".parse().unwrap());
        }
    })
}

/// Settles a Quote for `sent` (with `tab` beside it) as a binding does.
async fn settle(
    wallet: &Wallet,
    q: &Signed<stipendex::envelope::Quote>,
    sent: &Resource,
    tab: Option<&serde_json::Value>,
) -> Settlement {
    let demand = Demand::Quote {
        quote: q,
        sent,
        tab,
    };
    wallet
        .settle_demand(demand, wallet.confirmer())
        .await
        .unwrap()
}

/// One request to the receiver, paid by a wallet without a tab policy.
struct Case {
    w: World,
    r: Receiver,
    wallet: Wallet,
    sent: Resource,
    req: Request,
}

impl Case {
    async fn new(q: &str) -> Case {
        let w = world().await;
        let r = receiver(&w);
        let wallet = w.wallet(mandate(&w, false), true);
        let sent = sent(q);
        let req = Request::from_resource(&sent);
        Case {
            w,
            r,
            wallet,
            sent,
            req,
        }
    }

    /// Settles a fresh Quote for the request, as a binding does: its Proof.
    async fn pay(&self) -> Paid {
        let q = quote(&self.r, &self.req).await;
        proof(settle(&self.wallet, &q, &self.sent, None).await)
    }

    async fn balance(&self) -> i128 {
        self.w.balance(self.w.agent).await.0
    }
}

fn proof(s: Settlement) -> Paid {
    match s {
        Settlement::Proof(paid) => *paid,
        other => panic!("expected a Proof, got {other:?}"),
    }
}

/// A Proof whose answer was lost is presented again for the same request — a fresh Quote for
/// it is never paid — and once the receiver answered (without a Receipt), the same request is
/// a new one and is paid anew.
#[tokio::test]
async fn a_lost_reply_keeps_the_proof_for_the_same_request_and_an_answer_ends_it() {
    let c = Case::new("rust").await;
    let start = c.balance().await;

    let first = c.pay().await;
    assert!(first.fresh);
    assert_eq!(c.balance().await, start - 5, "paid once");
    c.wallet.proof_reply(&first, Reply::Lost).await.unwrap();

    let again = c.pay().await;
    assert_eq!(again.proof.jws(), first.proof.jws(), "the same Proof again");
    assert_eq!(c.balance().await, start - 5, "nothing paid twice");

    let none = c
        .wallet
        .proof_reply(&again, Reply::Unreceipted)
        .await
        .unwrap();
    assert!(none.is_none(), "no Receipt, none checked");
    let third = c.pay().await;
    assert!(third.fresh, "answered: the same request is a new one");
    assert_ne!(third.proof.jws(), first.proof.jws());
    assert_eq!(c.balance().await, start - 10);
}

/// A refused Proof is not kept: the same request asked again pays its fresh Quote.
#[tokio::test]
async fn a_refused_proof_is_not_presented_again() {
    let c = Case::new("refused").await;
    let first = c.pay().await;
    c.wallet.proof_reply(&first, Reply::Refused).await.unwrap();
    let next = c.pay().await;
    assert!(next.fresh);
    assert_ne!(next.proof.jws(), first.proof.jws());
}

/// A tab beside the Quote is opened only where the mandate has a tab policy in its asset; an
/// unreadable tab, or one the mandate has no policy for, leaves the Quote to be paid.
#[tokio::test]
async fn a_tab_beside_the_quote_is_opened_only_where_the_mandate_allows_it() {
    let w = world().await;
    let r = receiver(&w);
    let sent = sent("tab");
    let req = Request::from_resource(&sent);

    let no_tabs = w.wallet(mandate(&w, false), true);
    let q = quote(&r, &req).await;
    let tab = r
        .offer_tab_beside(&req, &q)
        .await
        .unwrap()
        .expect("a tab offered");
    let tab = serde_json::to_value(&tab).unwrap();
    let paid = proof(settle(&no_tabs, &q, &sent, Some(&tab)).await);
    assert!(paid.fresh, "no tab policy: the Quote is paid");

    let tabs = w.wallet(mandate(&w, true), true);
    let garbage = serde_json::json!({"not": "a tab"});
    let q = quote(&r, &Request::from_resource(&sent)).await;
    let paid = proof(settle(&tabs, &q, &sent, Some(&garbage)).await);
    assert!(paid.fresh, "an unreadable tab: the Quote is paid");

    let other = self::sent("tab-2");
    let req = Request::from_resource(&other);
    let q = quote(&r, &req).await;
    let tab = r
        .offer_tab_beside(&req, &q)
        .await
        .unwrap()
        .expect("a tab offered");
    let before = w.balance(w.agent).await;
    match settle(
        &tabs,
        &q,
        &other,
        Some(&serde_json::to_value(&tab).unwrap()),
    )
    .await
    {
        Settlement::Tab(hold) => assert_eq!(hold.tab().object().id, tab.object().id),
        other => panic!("expected the tab opened, got {other:?}"),
    }
    let after = w.balance(w.agent).await;
    assert_eq!(after.0, before.0, "a tab's hold captures nothing yet");
    assert!(after.1 > before.1, "the tab's cap is held");
}
