//! The rail on a real chain: anvil running Circle's FiatTokenV2_2 (`scripts/x402/localnet.mjs`,
//! started by `scripts/test-all`). Every test makes its own payer and settler accounts.
//! Without the localnet: SKIPPED on a developer's machine, a failure in CI.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use alloy_primitives::{Address, B256, U256};
use axum::Router;
use axum::http::StatusCode;
use axum::routing::get;
use rail_core::MemoryKeyStore;
use rail_core::keys::KeyStore;
use rail_x402::client::{EvmFetched, client};
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{LocalFacilitator, SettleConfig, X402Facilitator, X402SettlementBook};
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::verify::reasons;
use rail_x402::wire::{PaymentPayload, PaymentRequired, SettleResponse};
use rail_x402::{ExactEvm, SettleWhen};
use x402_devnet::anvil::Localnet;
use x402_transport::paywall::Paywall;
use x402_transport::wire::PAYMENT_SIGNATURE;

const CHEAP: u64 = 1_000;
const DEAR: u64 = 5_000;

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

struct Fixture {
    net: Localnet,
    facilitator: Arc<LocalFacilitator>,
    pay_to: Address,
    store: Arc<dyn KeyStore>,
    hits: Arc<AtomicUsize>,
}

async fn fixture() -> Option<Fixture> {
    let net = Localnet::from_env().await?;
    let store: Arc<dyn KeyStore> = Arc::new(MemoryKeyStore::default());
    let facilitator = facilitator(&net, store.clone(), SettleConfig::default()).await;
    Some(Fixture {
        net,
        facilitator: Arc::new(facilitator),
        pay_to: LocalSigner::random().address(),
        store,
        hits: Arc::new(AtomicUsize::new(0)),
    })
}

async fn facilitator(
    net: &Localnet,
    store: Arc<dyn KeyStore>,
    config: SettleConfig,
) -> LocalFacilitator {
    let settler = net.funded_settler().await.unwrap();
    LocalFacilitator::connect(net.rpc.clone(), settler, X402SettlementBook::new(store))
        .await
        .unwrap()
        .with_config(config)
}

impl Fixture {
    fn evm(&self, f: Arc<dyn X402Facilitator>) -> ExactEvm {
        ExactEvm::new(f, self.net.token.clone(), self.pay_to)
    }

    fn routes(&self, evm: &ExactEvm) -> Paywall {
        evm.paywall(&[
            ("/cheap", CHEAP.into(), "cheap"),
            ("/dear", DEAR.into(), "dear"),
            ("/broken", CHEAP.into(), "a handler that fails"),
        ])
        .unwrap()
        .with_store(self.store.clone())
    }

    fn paywall(&self, f: Arc<dyn X402Facilitator>) -> Paywall {
        self.routes(&self.evm(f))
    }

    async fn serve(&self, paywall: &Paywall) -> String {
        let hits = self.hits.clone();
        let app = paywall.apply(
            Router::new()
                .route(
                    "/cheap",
                    get(move || {
                        let hits = hits.clone();
                        async move {
                            hits.fetch_add(1, Ordering::SeqCst);
                            "cheap content"
                        }
                    }),
                )
                .route("/dear", get(|| async { "dear content" }))
                .route(
                    "/broken",
                    get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "boom") }),
                ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    fn payer(&self, key: LocalSigner) -> X402Payer {
        X402Payer::new(
            key,
            Policy::new(
                &self.net.token.network,
                self.net.token.address,
                U256::from(DEAR),
            ),
        )
    }

    async fn balances(&self, payer: Address) -> (U256, U256) {
        (
            self.net.balance(payer).await.unwrap(),
            self.net.balance(self.pay_to).await.unwrap(),
        )
    }
}

async fn challenge(url: &str) -> PaymentRequired {
    let r = rail_x402::rpc::http_client(Duration::from_secs(10))
        .unwrap()
        .get(url)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402);
    let h = r.headers()["payment-required"].to_str().unwrap().to_owned();
    let pr = PaymentRequired::from_header(&h).unwrap();
    let body: PaymentRequired = r.json().await.unwrap();
    assert_eq!(body, pr, "body and header carry the same PaymentRequired");
    pr
}

async fn send(url: &str, payload: &PaymentPayload) -> reqwest::Response {
    rail_x402::rpc::http_client(Duration::from_secs(10))
        .unwrap()
        .get(url)
        .header(PAYMENT_SIGNATURE, payload.to_header().unwrap())
        .send()
        .await
        .unwrap()
}

async fn refused_with(resp: reqwest::Response) -> String {
    assert_eq!(resp.status(), 402, "a refused payment is a 402");
    let pr: PaymentRequired = resp.json().await.unwrap();
    pr.error.unwrap_or_default()
}

#[tokio::test]
async fn pays_settles_and_serves_once() {
    let Some(fx) = fixture().await else { return };
    let url = fx.serve(&fx.paywall(fx.facilitator.clone())).await;
    let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
    let from = key.address();
    let client = client(fx.payer(key)).unwrap();

    let paid = EvmFetched::from(client.get(&format!("{url}/cheap")).await.unwrap());
    assert_eq!(paid.status, 200);
    assert_eq!(paid.body, b"cheap content");
    assert_eq!(
        paid.headers["cache-control"].to_str().unwrap(),
        "private, no-store"
    );
    let settlement = paid.settlement.clone().unwrap();
    assert!(settlement.success);
    assert_eq!(settlement.network, fx.net.token.network);
    let receipt = fx
        .net
        .rpc
        .receipt(settlement.transaction.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(receipt.success);
    assert_eq!(
        fx.balances(from).await,
        (U256::from(9_000), U256::from(CHEAP))
    );

    // The same payment again: refused, nothing moves, the handler does not run.
    let again = send(&format!("{url}/cheap"), paid.payment.as_ref().unwrap()).await;
    assert_eq!(refused_with(again).await, reasons::NONCE_ALREADY_USED);
    assert_eq!(
        fx.balances(from).await,
        (U256::from(9_000), U256::from(CHEAP))
    );
    assert_eq!(fx.hits.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn unpaid_head_and_malformed_requests_are_never_charged() {
    let Some(fx) = fixture().await else { return };
    let url = fx.serve(&fx.paywall(fx.facilitator.clone())).await;
    let pr = challenge(&format!("{url}/cheap")).await;
    assert_eq!(pr.accepts.len(), 1);
    assert_eq!(pr.accepts[0].amount.value(), U256::from(CHEAP));
    assert_eq!(pr.resource.as_ref().unwrap().url, format!("{url}/cheap"));

    let http = rail_x402::rpc::http_client(Duration::from_secs(10)).unwrap();
    let head = http.head(format!("{url}/cheap")).send().await.unwrap();
    assert_eq!(head.status(), 402);
    assert!(head.headers().contains_key("payment-required"));

    for bad in ["%%%", "bm90IGpzb24=", "eyJ4NDAyVmVyc2lvbiI6MX0="] {
        let r = http
            .get(format!("{url}/cheap"))
            .header(PAYMENT_SIGNATURE, bad)
            .send()
            .await
            .unwrap();
        let reason = refused_with(r).await;
        assert!(
            reason == "invalid_payload" || reason == "invalid_x402_version",
            "{bad}: {reason}"
        );
    }
    // Free routes pass untouched.
    assert_eq!(fx.hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_cheap_payment_never_unlocks_a_dear_route() {
    let Some(fx) = fixture().await else { return };
    let url = fx.serve(&fx.paywall(fx.facilitator.clone())).await;
    let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
    let from = key.address();
    let payer = fx.payer(key);
    let cheap = challenge(&format!("{url}/cheap")).await;
    let payment = payer.pay(&cheap).unwrap();
    let r = send(&format!("{url}/dear"), &payment).await;
    assert_eq!(refused_with(r).await, reasons::NO_MATCHING_REQUIREMENTS);
    assert_eq!(fx.balances(from).await, (U256::from(10_000), U256::ZERO));
}

/// Every way a payment can be wrong, against the real token: each gets the reference
/// reason in a 402, and nothing moves.
#[tokio::test]
async fn tampered_payments_are_refused_with_reference_reasons() {
    let Some(fx) = fixture().await else { return };
    let url = fx.serve(&fx.paywall(fx.facilitator.clone())).await;
    let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
    let from = key.address();
    let payer = fx.payer(key.clone());
    let pr = challenge(&format!("{url}/cheap")).await;
    let route = pr.accepts[0].clone();
    let t = now();
    let nonce = || B256::from(rand::random::<[u8; 32]>());

    // Sign other requirements, then claim the route's: what a forger or a buggy client sends.
    let signed_as = |edit: &dyn Fn(&mut rail_x402::wire::PaymentRequirements)| {
        let mut other = route.clone();
        edit(&mut other);
        let lax = X402Payer::new(
            key.clone(),
            Policy::new(&other.network, other.asset.parse().unwrap(), U256::MAX),
        );
        let mut p = lax.sign(&pr, &other, t, nonce()).unwrap();
        p.accepted = route.clone();
        p
    };

    let mut cases: Vec<(&str, PaymentPayload, &str)> = vec![
        (
            "wrong chain id",
            signed_as(&|r| r.network = "eip155:1".into()),
            reasons::INVALID_SIGNATURE,
        ),
        (
            "wrong domain name",
            signed_as(&|r| r.extra = Some(rail_x402::wire::Extra::eip712("USDC", "2"))),
            reasons::INVALID_SIGNATURE,
        ),
        (
            "wrong domain version",
            signed_as(&|r| r.extra = Some(rail_x402::wire::Extra::eip712("USD Coin", "1"))),
            reasons::INVALID_SIGNATURE,
        ),
        (
            "value below the amount",
            signed_as(&|r| r.amount = (CHEAP - 1).into()),
            reasons::AUTHORIZATION_VALUE_MISMATCH,
        ),
        (
            "value above the amount",
            signed_as(&|r| r.amount = (CHEAP + 1).into()),
            reasons::AUTHORIZATION_VALUE_MISMATCH,
        ),
        (
            "expired window",
            payer.sign(&pr, &route, t - 3_600, nonce()).unwrap(),
            reasons::VALID_BEFORE_EXPIRED,
        ),
        (
            "window not yet open",
            payer.sign(&pr, &route, t + 3_600, nonce()).unwrap(),
            reasons::VALID_AFTER_IN_FUTURE,
        ),
    ];
    // Signed by another key, claiming to be from the payer.
    let other = fx.payer(LocalSigner::random());
    let mut forged = other.sign(&pr, &route, t, nonce()).unwrap();
    forged.payload.authorization.from = from.into();
    cases.push((
        "signature by another key",
        forged,
        reasons::INVALID_SIGNATURE,
    ));
    // No balance.
    let broke = fx.payer(fx.net.funded_payer(U256::ZERO).await.unwrap());
    cases.push((
        "insufficient balance",
        broke.sign(&pr, &route, t, nonce()).unwrap(),
        reasons::INSUFFICIENT_BALANCE,
    ));

    for (what, payload, reason) in cases {
        // The facilitator's own verdict…
        let v = fx.facilitator.verify(&payload, &route).await.unwrap();
        assert!(!v.is_valid, "{what}");
        assert_eq!(v.invalid_reason.as_deref(), Some(reason), "{what}");
        // …and the server's.
        let r = send(&format!("{url}/cheap"), &payload).await;
        assert_eq!(refused_with(r).await, reason, "{what}");
    }
    assert_eq!(fx.balances(from).await, (U256::from(10_000), U256::ZERO));
    assert_eq!(fx.hits.load(Ordering::SeqCst), 0);

    // Nonce reuse: a second authorization with a used nonce.
    let n = nonce();
    let first = payer.sign(&pr, &route, t, n).unwrap();
    assert_eq!(send(&format!("{url}/cheap"), &first).await.status(), 200);
    let reuse = payer.sign(&pr, &route, t + 1, n).unwrap();
    assert_ne!(reuse, first);
    let v = fx.facilitator.verify(&reuse, &route).await.unwrap();
    assert_eq!(
        v.invalid_reason.as_deref(),
        Some(reasons::NONCE_ALREADY_USED)
    );
    assert_eq!(
        refused_with(send(&format!("{url}/cheap"), &reuse).await).await,
        reasons::NONCE_ALREADY_USED
    );
    assert_eq!(
        fx.balances(from).await,
        (U256::from(9_000), U256::from(CHEAP))
    );
}

#[tokio::test]
async fn a_reverted_settlement_serves_nothing_and_charges_nothing() {
    let Some(fx) = fixture().await else { return };
    // A gas limit too low for transferWithAuthorization: the transaction reverts on chain.
    let starved = facilitator(
        &fx.net,
        fx.store.clone(),
        SettleConfig {
            gas_limit: 30_000,
            ..SettleConfig::default()
        },
    )
    .await;
    let url = fx.serve(&fx.paywall(Arc::new(starved))).await;
    let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
    let from = key.address();
    let payer = fx.payer(key);
    let pr = challenge(&format!("{url}/cheap")).await;
    let payment = payer.pay(&pr).unwrap();
    let r = send(&format!("{url}/cheap"), &payment).await;
    let settle =
        SettleResponse::from_header(r.headers()["payment-response"].to_str().unwrap()).unwrap();
    assert!(!settle.success);
    assert!(
        !settle.transaction.is_empty(),
        "the reverted transaction is named"
    );
    assert_eq!(refused_with(r).await, reasons::TRANSACTION_FAILED);
    assert_eq!(fx.hits.load(Ordering::SeqCst), 0);
    assert_eq!(fx.balances(from).await, (U256::from(10_000), U256::ZERO));

    // The authorization is still good: a working facilitator settles it once.
    let url2 = fx.serve(&fx.paywall(fx.facilitator.clone())).await;
    assert_eq!(send(&format!("{url2}/cheap"), &payment).await.status(), 200);
    assert_eq!(
        fx.balances(from).await,
        (U256::from(9_000), U256::from(CHEAP))
    );
}

#[tokio::test]
async fn settle_after_does_not_charge_a_failing_handler() {
    let Some(fx) = fixture().await else { return };
    let paywall = fx.paywall(fx.facilitator.clone()).settle(SettleWhen::After);
    let url = fx.serve(&paywall).await;
    let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
    let from = key.address();
    let client = client(fx.payer(key)).unwrap();
    let broken = EvmFetched::from(client.get(&format!("{url}/broken")).await.unwrap());
    assert_eq!(broken.status, 500);
    assert!(broken.settlement.is_none());
    assert_eq!(fx.balances(from).await, (U256::from(10_000), U256::ZERO));
    let ok = EvmFetched::from(client.get(&format!("{url}/cheap")).await.unwrap());
    assert_eq!(ok.status, 200);
    assert!(ok.settlement.unwrap().success);
    assert_eq!(
        fx.balances(from).await,
        (U256::from(9_000), U256::from(CHEAP))
    );
}

/// A crash between settling and answering: the payment settled on chain, the payer never got
/// the content. Presenting the same payment again serves it, without a second transaction.
#[tokio::test]
async fn a_crash_after_settling_never_settles_twice() {
    let Some(fx) = fixture().await else { return };
    let url = fx.serve(&fx.paywall(fx.facilitator.clone())).await;
    let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
    let from = key.address();
    let payer = fx.payer(key);
    let pr = challenge(&format!("{url}/cheap")).await;
    let payment = payer.pay(&pr).unwrap();
    // The settlement happens, the answer is lost.
    let first = fx
        .facilitator
        .settle(&payment, &pr.accepts[0])
        .await
        .unwrap();
    assert!(first.success);
    let settler_nonce = fx
        .net
        .rpc
        .transaction_count(fx.facilitator.address(), "latest")
        .await
        .unwrap();
    // The payer retries the same payment: served, with the same transaction.
    let r = send(&format!("{url}/cheap"), &payment).await;
    assert_eq!(r.status(), 200);
    let again =
        SettleResponse::from_header(r.headers()["payment-response"].to_str().unwrap()).unwrap();
    assert_eq!(again.transaction, first.transaction);
    assert_eq!(
        fx.net
            .rpc
            .transaction_count(fx.facilitator.address(), "latest")
            .await
            .unwrap(),
        settler_nonce,
        "no second transaction"
    );
    assert_eq!(
        fx.balances(from).await,
        (U256::from(9_000), U256::from(CHEAP))
    );
    // And only once.
    assert_eq!(
        refused_with(send(&format!("{url}/cheap"), &payment).await).await,
        reasons::NONCE_ALREADY_USED
    );
}

/// Two server instances (and two settlers) sharing PostgreSQL: one payment sent to both at
/// once is served by exactly one and settled by exactly one transaction.
#[tokio::test]
async fn two_instances_sharing_postgres_serve_a_payment_once() {
    let Some(fx) = fixture().await else { return };
    let pool = match sqlx::postgres::PgPoolOptions::new()
        .max_connections(4)
        .connect(&test_kit::localnet::postgres_url())
        .await
    {
        Ok(p) => p,
        Err(e) => {
            test_kit::localnet::missing("postgres", &e.to_string());
            return;
        }
    };
    let pg: Arc<dyn KeyStore> =
        Arc::new(rail_core::keys::sql::PgKeyStore::new(pool).await.unwrap());
    let a = facilitator(&fx.net, pg.clone(), SettleConfig::default()).await;
    let b = facilitator(&fx.net, pg.clone(), SettleConfig::default()).await;
    let url_a = fx
        .serve(&fx.paywall(Arc::new(a)).with_store(pg.clone()))
        .await;
    let url_b = fx.serve(&fx.paywall(Arc::new(b)).with_store(pg)).await;
    for _ in 0..3 {
        let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
        let from = key.address();
        let payer = fx.payer(key);
        let pr = challenge(&format!("{url_a}/cheap")).await;
        let payment = payer.pay(&pr).unwrap();
        let (ua, ub) = (format!("{url_a}/cheap"), format!("{url_b}/cheap"));
        let (ra, rb) = tokio::join!(send(&ua, &payment), send(&ub, &payment));
        let mut statuses = [ra.status().as_u16(), rb.status().as_u16()];
        statuses.sort_unstable();
        assert!(
            statuses == [200, 402] || statuses == [200, 503],
            "exactly one serves: {statuses:?}"
        );
        assert_eq!(fx.net.balance(from).await.unwrap(), U256::from(9_000));
    }
}

/// Many concurrent settles through one settling key: every one lands, with no nonce error and
/// no wasted transaction.
#[tokio::test]
async fn concurrent_settles_share_one_nonce_sequence() {
    let Some(fx) = fixture().await else { return };
    let url = fx.serve(&fx.paywall(fx.facilitator.clone())).await;
    let start_nonce = fx
        .net
        .rpc
        .transaction_count(fx.facilitator.address(), "latest")
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let key = fx.net.funded_payer(U256::from(CHEAP)).await.unwrap();
        let client = client(fx.payer(key)).unwrap();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            client.get(&format!("{url}/cheap")).await.unwrap().status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let end_nonce = fx
        .net
        .rpc
        .transaction_count(fx.facilitator.address(), "latest")
        .await
        .unwrap();
    assert_eq!(end_nonce - start_nonce, 16, "one transaction per payment");
    assert_eq!(
        fx.net.balance(fx.pay_to).await.unwrap(),
        U256::from(16 * CHEAP)
    );
}

/// Our facilitator server over HTTP, used by a paywall through `RemoteFacilitator`.
#[tokio::test]
async fn remote_facilitator_round_trip() {
    let Some(fx) = fixture().await else { return };
    let app = rail_x402::server::router(fx.facilitator.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let remote = rail_x402::facilitator::RemoteFacilitator::new(
        &format!("http://{addr}"),
        Duration::from_secs(10),
    )
    .unwrap();
    let supported = remote.supported().await.unwrap();
    assert_eq!(supported.kinds[0].network, fx.net.token.network);
    let url = fx.serve(&fx.paywall(Arc::new(remote))).await;
    let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
    let from = key.address();
    let paid = EvmFetched::from(
        client(fx.payer(key))
            .unwrap()
            .get(&format!("{url}/cheap"))
            .await
            .unwrap(),
    );
    assert_eq!(paid.status, 200);
    assert_eq!(
        fx.balances(from).await,
        (U256::from(9_000), U256::from(CHEAP))
    );
    // A garbage body is a 400 with a reason, not a 5xx.
    let r = rail_x402::rpc::http_client(Duration::from_secs(10))
        .unwrap()
        .post(format!("http://{addr}/settle"))
        .body("{\"x402Version\":2}")
        .header("content-type", "application/json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

/// A contract wallet pays (ERC-1271): `from` is the wallet, the owner's key signs, the token
/// checks the signature with the wallet's `isValidSignature`. The wallet is
/// `tests/data/OwnedWallet.sol`, compiled by `scripts/x402/compile-wallet.sh`.
#[tokio::test]
async fn a_contract_wallet_pays_with_erc1271() {
    let Some(fx) = fixture().await else { return };
    let url = fx.serve(&fx.paywall(fx.facilitator.clone())).await;
    let owner = LocalSigner::random();
    let creation = format!(
        "0x{}{}",
        include_str!("data/OwnedWallet.bin").trim(),
        hex::encode(owner.address().into_word())
    );
    let wallet = fx
        .net
        .deploy(&creation.parse().unwrap())
        .await
        .expect("deploy the wallet");
    fx.net.mint(wallet, U256::from(10_000)).await.unwrap();
    let policy = Policy::new(
        &fx.net.token.network,
        fx.net.token.address,
        U256::from(DEAR),
    );
    let payer = X402Payer::for_wallet(owner, wallet, policy.clone());
    let paid = EvmFetched::from(
        client(payer)
            .unwrap()
            .get(&format!("{url}/cheap"))
            .await
            .unwrap(),
    );
    assert_eq!(paid.status, 200, "{}", String::from_utf8_lossy(&paid.body));
    assert_eq!(
        paid.settlement.unwrap().payer.unwrap().to_lowercase(),
        wallet.to_string().to_lowercase()
    );
    assert_eq!(
        fx.balances(wallet).await,
        (U256::from(9_000), U256::from(CHEAP))
    );

    // A key the wallet does not know: refused by its ERC-1271 check, nothing moves.
    let stranger = X402Payer::for_wallet(LocalSigner::random(), wallet, policy);
    let pr = challenge(&format!("{url}/cheap")).await;
    let forged = stranger.pay(&pr).unwrap();
    let v = fx
        .facilitator
        .verify(&forged, &pr.accepts[0])
        .await
        .unwrap();
    assert_eq!(
        v.invalid_reason.as_deref(),
        Some(reasons::INVALID_SIGNATURE)
    );
    assert_eq!(
        refused_with(send(&format!("{url}/cheap"), &forged).await).await,
        reasons::INVALID_SIGNATURE
    );
    assert_eq!(
        fx.balances(wallet).await,
        (U256::from(9_000), U256::from(CHEAP))
    );
}

/// A payment settled just before it expired, whose answer was lost: presented again after
/// expiry, the recorded settlement decides (served once), not the clock.
#[tokio::test]
async fn a_lost_answer_is_served_after_the_authorization_expired() {
    let Some(fx) = fixture().await else { return };
    let paywall = fx.routes(&fx.evm(fx.facilitator.clone()).max_timeout_seconds(10));
    let url = fx.serve(&paywall).await;
    let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
    let from = key.address();
    let pr = challenge(&format!("{url}/cheap")).await;
    let payment = fx.payer(key).pay(&pr).unwrap();
    assert!(
        fx.facilitator
            .settle(&payment, &pr.accepts[0])
            .await
            .unwrap()
            .success
    );
    // validBefore = now + 10; the reference's 6 s grace makes it expired after ~4 s.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let v = fx
        .facilitator
        .verify(&payment, &pr.accepts[0])
        .await
        .unwrap();
    assert_eq!(
        v.invalid_reason.as_deref(),
        Some(reasons::VALID_BEFORE_EXPIRED)
    );
    let r = send(&format!("{url}/cheap"), &payment).await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        fx.balances(from).await,
        (U256::from(9_000), U256::from(CHEAP))
    );
    assert_eq!(
        refused_with(send(&format!("{url}/cheap"), &payment).await).await,
        reasons::NONCE_ALREADY_USED
    );
    // Never settled, and expired: refused as expired.
    let pr2 = challenge(&format!("{url}/cheap")).await;
    let late = fx
        .payer(fx.net.funded_payer(U256::from(1_000)).await.unwrap())
        .sign(
            &pr2,
            &pr2.accepts[0],
            now() - 30,
            B256::from(rand::random::<[u8; 32]>()),
        )
        .unwrap();
    assert_eq!(
        refused_with(send(&format!("{url}/cheap"), &late).await).await,
        reasons::VALID_BEFORE_EXPIRED
    );
}

/// With a confirmation depth, a settlement counts only once its block is that deep.
#[tokio::test]
async fn settlement_waits_for_its_confirmation_depth() {
    let Some(fx) = fixture().await else { return };
    let deep = Arc::new(
        facilitator(
            &fx.net,
            fx.store.clone(),
            SettleConfig {
                confirmations: 200,
                ..SettleConfig::default()
            },
        )
        .await,
    );
    let key = fx.net.funded_payer(U256::from(1_000)).await.unwrap();
    let pay_to = LocalSigner::random().address();
    let req = rail_x402::wire::PaymentRequirements {
        scheme: "exact".into(),
        network: fx.net.token.network.clone(),
        amount: 1_000u64.into(),
        asset: fx.net.token.address.to_checksum(None),
        pay_to: pay_to.to_checksum(None),
        max_timeout_seconds: 60,
        extra: Some(rail_x402::wire::Extra::eip712(
            &fx.net.token.name,
            &fx.net.token.version,
        )),
    };
    let pr = PaymentRequired {
        x402_version: rail_x402::wire::V2::default(),
        error: None,
        reason: None,
        resource: Some(rail_x402::wire::ResourceInfo::new("test:/deep")),
        accepts: vec![req.clone()],
        extensions: None,
    };
    let payment = fx.payer(key).pay(&pr).unwrap();
    let settling = tokio::spawn({
        let (deep, payment, req) = (deep.clone(), payment.clone(), req.clone());
        async move { deep.settle(&payment, &req).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!settling.is_finished(), "answered before 200 confirmations");
    fx.net
        .rpc
        .request("anvil_mine", serde_json::json!(["0xc8"]))
        .await
        .unwrap();
    let s = settling.await.unwrap().unwrap();
    assert!(s.success, "{s:?}");
    assert_eq!(fx.net.balance(pay_to).await.unwrap(), U256::from(1_000));
}

/// A JSON-RPC proxy to the localnet that loses every `eth_sendRawTransaction`: the settler
/// behind it writes its transaction ahead and never gets it to the node (as one that died
/// between the two would).
async fn proxy_losing_broadcasts(upstream: String) -> String {
    use axum::body::Bytes;
    use axum::routing::post;
    let client = reqwest::Client::new();
    let app = Router::new().route(
        "/",
        post(move |body: Bytes| {
            let (client, upstream) = (client.clone(), upstream.clone());
            async move {
                if String::from_utf8_lossy(&body).contains("eth_sendRawTransaction") {
                    return (StatusCode::BAD_GATEWAY, Vec::new());
                }
                let answer = client
                    .post(&upstream)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .unwrap();
                (StatusCode::OK, answer.bytes().await.unwrap().to_vec())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// A settler wrote its transaction ahead and the transaction never reached the node. The next
/// settler sharing the store recovers it: it finds no receipt, sees the nonce still open, sends
/// the very same transaction again, and the payment settles once (before, the record stayed in
/// flight and every later settle of that authorization answered 503 for ever).
#[tokio::test]
async fn a_dead_settlers_transaction_is_sent_again_not_followed_for_ever() {
    let Some(fx) = fixture().await else { return };
    let settler = fx.net.funded_settler().await.unwrap();
    let lossy_rpc =
        rail_x402::rpc::RpcClient::new(&proxy_losing_broadcasts(fx.net.rpc.url().to_owned()).await)
            .unwrap();
    let dying = LocalFacilitator::connect(
        lossy_rpc,
        settler.clone(),
        X402SettlementBook::new(fx.store.clone()),
    )
    .await
    .unwrap();
    let key = fx.net.funded_payer(U256::from(10_000)).await.unwrap();
    let from = key.address();
    let url = fx.serve(&fx.paywall(fx.facilitator.clone())).await;
    let pr = challenge(&format!("{url}/cheap")).await;
    let payment = fx.payer(key).pay(&pr).unwrap();
    let nonce_before = fx
        .net
        .rpc
        .transaction_count(settler.address(), "latest")
        .await
        .unwrap();
    assert!(
        dying.settle(&payment, &pr.accepts[0]).await.is_err(),
        "the broadcast was lost: the outcome is unknown"
    );
    let recovering = LocalFacilitator::connect(
        fx.net.rpc.clone(),
        settler.clone(),
        X402SettlementBook::new(fx.store.clone()),
    )
    .await
    .unwrap();
    let mut answer = None;
    for _ in 0..20 {
        match recovering.settle(&payment, &pr.accepts[0]).await {
            Ok(a) => {
                answer = Some(a);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let answer = answer.expect("the recovered settlement completes");
    // Answered as a settlement made earlier (the reference's reply to a second /settle, naming
    // the transaction), which the paywalls serve once.
    assert!(
        rail_x402::facilitator::settled_transaction(&answer).is_some(),
        "{answer:?}"
    );
    assert_eq!(
        fx.net
            .rpc
            .transaction_count(settler.address(), "latest")
            .await
            .unwrap(),
        nonce_before + 1,
        "exactly the written-ahead transaction was mined"
    );
    assert_eq!(
        fx.balances(from).await,
        (U256::from(10_000 - CHEAP), U256::from(CHEAP))
    );
}
