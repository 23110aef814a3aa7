#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! The receiver's single-use marks are kept as long as a payment could be presented, then
//! forgotten (before, every verified payment hash was kept for ever and the store grew without
//! bound); and the payer finds what an earlier attempt paid.

use std::sync::Arc;
use std::time::Duration;

use lightning_invoice::Currency;
use nwc_devnet::{Devnet, DevnetConfig, WalletSpec};
use rail_core::keys::KeyStore;
use rail_core::{
    Asset, Charge, ManualClock, MemoryKeyStore, Money, OpId, Payer, RailReceiver, SharedClock,
};
use rail_ln_nwc::client::{ClientOptions, NwcClient};
use rail_ln_nwc::rail::{MARK_MARGIN, NwcPayer, NwcProof, NwcReceiver};

/// A devnet with a funded agent and a shop; the receiver's records in `store`.
async fn setup(store: Arc<dyn KeyStore>, clock: SharedClock) -> (Devnet, NwcReceiver, NwcPayer) {
    setup_with(store, clock, ClientOptions::default()).await
}

/// [`setup`], the payer's client with `payer_opts`.
async fn setup_with(
    store: Arc<dyn KeyStore>,
    clock: SharedClock,
    payer_opts: ClientOptions,
) -> (Devnet, NwcReceiver, NwcPayer) {
    let net = Devnet::start(DevnetConfig::default()).await.unwrap();
    let agent = net
        .create_wallet(WalletSpec::new("agent", 1_000_000))
        .await
        .unwrap();
    let shop = net.create_wallet(WalletSpec::new("shop", 0)).await.unwrap();
    let connect = |uri| async move {
        Arc::new(
            NwcClient::connect(uri, ClientOptions::default())
                .await
                .unwrap(),
        )
    };
    let receiver = NwcReceiver::new(
        connect(&shop.uri).await,
        rand::random(),
        store,
        clock.clone(),
    )
    .await
    .unwrap();
    let payer = NwcPayer::new(
        Arc::new(NwcClient::connect(&agent.uri, payer_opts).await.unwrap()),
        Currency::Regtest,
        Money::parse(Asset::btc(), "0.00001").unwrap(),
        clock,
    );
    (net, receiver, payer)
}

fn price() -> Money {
    Money::from_minor(Asset::btc(), 21_000).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_verified_payment_is_remembered_for_its_offer_life_and_a_margin() {
    let clock = ManualClock::starting_now();
    let store = Arc::new(MemoryKeyStore::with_clock(Arc::new(clock.clone())));
    let (_net, receiver, payer) = setup(store.clone(), Arc::new(clock.clone())).await;
    let ttl = Duration::from_secs(600);
    let offer = receiver
        .offer(&Charge::capture(price(), ttl))
        .await
        .unwrap();
    let payment = payer.pay(&OpId::random(), &offer).await.unwrap();
    receiver.verify(&offer, &payment).await.unwrap();
    let hash = payment.proof_as::<NwcProof>().unwrap().payment_hash;
    let mark = store.get("ln-nwc/verified", &hash).await.unwrap().unwrap();
    assert_eq!(
        mark.record.expires_at,
        Some(offer.expires_at.plus(MARK_MARGIN)),
        "kept for the offer's life and a margin, not for ever"
    );
    // Within that time a replay is refused as a replay; after it, as an expired offer — never
    // accepted.
    assert_eq!(
        receiver.verify(&offer, &payment).await.unwrap_err().code(),
        "replayed"
    );
    clock.advance(ttl + MARK_MARGIN + Duration::from_secs(1));
    assert_eq!(store.purge_expired().await.unwrap(), 1);
    assert_eq!(
        receiver.verify(&offer, &payment).await.unwrap_err().code(),
        "offer_expired"
    );
}

/// What an earlier attempt paid is found in the wallet, also after the invoice expired (before,
/// the look-up refused the expired offer and the charge that happened was reported as an
/// error); an invoice the wallet never paid is "nothing moved".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_payment_is_found_after_its_invoice_expired() {
    use rail_core::PaymentMode;
    use rail_core::payer::FindPayment;
    let (_net, receiver, payer) = setup(
        Arc::new(MemoryKeyStore::default()),
        Arc::new(rail_core::SystemClock),
    )
    .await;
    let unpaid = receiver
        .offer(&Charge::capture(price(), Duration::from_secs(600)))
        .await
        .unwrap();
    let op = OpId::random();
    assert_eq!(
        payer
            .find_payment(&op, &unpaid, PaymentMode::Capture)
            .await
            .unwrap(),
        None,
        "never paid: nothing moved"
    );
    let offer = receiver
        .offer(&Charge::capture(price(), Duration::from_secs(4)))
        .await
        .unwrap();
    let paid = payer.pay(&op, &offer).await.unwrap();
    // Past the invoice's end (BOLT11 expiry is in whole seconds), however long paying took:
    // a short TTL made paying itself race the expiry on a loaded machine.
    let now = rail_core::Clock::now(&rail_core::SystemClock);
    let left = u64::try_from(offer.expires_at.0 - now.0).unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(left + 1500)).await;
    let found = payer
        .find_payment(&op, &offer, PaymentMode::Capture)
        .await
        .unwrap();
    assert_eq!(
        found,
        Some(paid),
        "found with its preimage after the invoice expired"
    );
}

/// A payment request the wallet never saw (lost on its way, as at a relay restart) is not
/// sent again as it is (a copy could be answered "already paid" before the first is): once it
/// has timed out, and expired, the payer looks the payment up, finds the wallet never saw it,
/// and asks once more. Paid once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_request_the_wallet_missed_is_looked_up_and_asked_again_once() {
    let clock: SharedClock = Arc::new(ManualClock::starting_now());
    let quick = ClientOptions {
        timeout: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    let (net, receiver, payer) = setup_with(
        Arc::new(MemoryKeyStore::with_clock(clock.clone())),
        clock,
        quick,
    )
    .await;
    let offer = receiver
        .offer(&Charge::capture(
            Money::from_minor(Asset::btc(), 5_000).unwrap(),
            Duration::from_secs(600),
        ))
        .await
        .unwrap();
    let before = net.balance_msat("agent").unwrap();
    let taken = net.service().requests_taken();
    net.set_faults(
        "agent",
        nwc_devnet::Faults {
            miss_requests: 1,
            ..nwc_devnet::Faults::default()
        },
    )
    .unwrap();
    let paid = payer.pay(&OpId::random(), &offer).await.unwrap();
    assert_eq!(
        before - net.balance_msat("agent").unwrap(),
        5_000,
        "paid once"
    );
    assert_eq!(
        net.service().requests_taken() - taken,
        2,
        "the lookup and the second pay_invoice; the first was missed"
    );
    receiver.verify(&offer, &paid).await.unwrap();
    net.shutdown().await;
}
