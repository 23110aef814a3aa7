//! Served-once under concurrency and lost answers (in-memory token): a copy of a payment in
//! flight is told to retry (503), never refused for good; a copy presented while the paid
//! handler runs is refused, never served; a payment settled by a request whose answer was lost
//! is served once, in either settlement mode and over MCP.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use alloy_primitives::{Address, U256};
use async_trait::async_trait;
use axum::Router;
use axum::routing::get;
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{FacilitatorError, SupportedResponse, X402Facilitator};
use rail_x402::mcp::{payment_meta, payment_required_of};
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::verify::reasons;
use rail_x402::wire::{
    PaymentPayload, PaymentRequired, PaymentRequirements, SettleResponse, VerifyResponse,
};
use rail_x402::{ExactEvm, SettleWhen, Token};
use rmcp::model::{CallToolResult, ContentBlock};
use x402_devnet::DevnetFacilitator;
use x402_transport::wire::PAYMENT_SIGNATURE;

const NET: &str = "eip155:84532";

fn token() -> Token {
    Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2")
}

fn http() -> reqwest::Client {
    rail_x402::rpc::http_client(Duration::from_secs(10)).unwrap()
}

/// The in-memory token, with a slow settle.
#[derive(Debug)]
struct Slow(Arc<DevnetFacilitator>, Duration);

#[async_trait]
impl X402Facilitator for Slow {
    async fn verify(
        &self,
        p: &PaymentPayload,
        r: &PaymentRequirements,
    ) -> Result<VerifyResponse, FacilitatorError> {
        self.0.verify(p, r).await
    }
    async fn settle(
        &self,
        p: &PaymentPayload,
        r: &PaymentRequirements,
    ) -> Result<SettleResponse, FacilitatorError> {
        tokio::time::sleep(self.1).await;
        self.0.settle(p, r).await
    }
    async fn supported(&self) -> Result<SupportedResponse, FacilitatorError> {
        self.0.supported().await
    }
}

struct Fx {
    mock: Arc<DevnetFacilitator>,
    pay_to: Address,
    hits: Arc<AtomicUsize>,
}

impl Fx {
    fn new() -> Self {
        Self {
            mock: Arc::new(DevnetFacilitator::new(NET)),
            pay_to: Address::repeat_byte(0x22),
            hits: Arc::new(AtomicUsize::new(0)),
        }
    }

    async fn serve(
        &self,
        f: Arc<dyn X402Facilitator>,
        when: SettleWhen,
        handler_delay: Duration,
    ) -> String {
        let hits = self.hits.clone();
        let paywall = ExactEvm::new(f, token(), self.pay_to)
            .paywall(&[("/paid", 1000, "paid")])
            .unwrap()
            .settle(when);
        let app = paywall.apply(Router::new().route(
            "/paid",
            get(move || {
                let hits = hits.clone();
                async move {
                    tokio::time::sleep(handler_delay).await;
                    hits.fetch_add(1, Ordering::SeqCst);
                    "content"
                }
            }),
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}/paid")
    }

    async fn payment(&self, url: &str) -> PaymentPayload {
        let r = http().get(url).send().await.unwrap();
        let pr = PaymentRequired::from_header(r.headers()["payment-required"].to_str().unwrap())
            .unwrap();
        let key = LocalSigner::random();
        self.mock
            .mint(token().address, key.address(), U256::from(5000))
            .unwrap();
        X402Payer::new(key, Policy::new(NET, token().address, U256::from(1000)))
            .pay(&pr)
            .unwrap()
    }

    fn received(&self) -> U256 {
        self.mock.balance(token().address, self.pay_to).unwrap()
    }
}

async fn send(url: &str, p: &PaymentPayload) -> (u16, String) {
    let r = http()
        .get(url)
        .header(PAYMENT_SIGNATURE, p.to_header().unwrap())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.text().await.unwrap())
}

#[tokio::test]
async fn a_copy_in_flight_is_told_to_retry_not_refused() {
    let fx = Fx::new();
    let slow = Arc::new(Slow(fx.mock.clone(), Duration::from_millis(400)));
    let url = fx.serve(slow, SettleWhen::Before, Duration::ZERO).await;
    let p = fx.payment(&url).await;
    let first = tokio::spawn({
        let (url, p) = (url.clone(), p.clone());
        async move { send(&url, &p).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = send(&url, &p).await;
    assert_eq!(
        status, 503,
        "a copy while the first settles: retry, not a final refusal"
    );
    assert_eq!(first.await.unwrap().0, 200);
    let (status, body) = send(&url, &p).await;
    assert_eq!(status, 402);
    assert!(body.contains(reasons::NONCE_ALREADY_USED));
    assert_eq!(fx.hits.load(Ordering::SeqCst), 1);
    assert_eq!(fx.received(), U256::from(1000));
}

#[tokio::test]
async fn a_copy_presented_while_the_handler_runs_is_not_served() {
    for when in [SettleWhen::Before, SettleWhen::After] {
        let fx = Fx::new();
        let url = fx
            .serve(fx.mock.clone(), when, Duration::from_millis(400))
            .await;
        let p = fx.payment(&url).await;
        let first = tokio::spawn({
            let (url, p) = (url.clone(), p.clone());
            async move { send(&url, &p).await }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (status, _) = send(&url, &p).await;
        assert!(status == 402 || status == 503, "{when:?}: {status}");
        assert_eq!(first.await.unwrap().0, 200);
        assert_eq!(fx.hits.load(Ordering::SeqCst), 1, "{when:?}");
        assert_eq!(fx.received(), U256::from(1000), "{when:?}");
    }
}

#[tokio::test]
async fn a_payment_whose_answer_was_lost_is_served_once() {
    for when in [SettleWhen::Before, SettleWhen::After] {
        let fx = Fx::new();
        let url = fx.serve(fx.mock.clone(), when, Duration::ZERO).await;
        let p = fx.payment(&url).await;
        // Settled, answer lost (the request that settled it died before serving).
        assert!(fx.mock.settle(&p, &p.accepted).await.unwrap().success);
        let (status, body) = send(&url, &p).await;
        assert_eq!(status, 200, "{when:?}: {body}");
        let (status, _) = send(&url, &p).await;
        assert_eq!(status, 402, "{when:?}");
        assert_eq!(fx.hits.load(Ordering::SeqCst), 1, "{when:?}");
        assert_eq!(fx.received(), U256::from(1000), "{when:?}");
    }
}

#[tokio::test]
async fn mcp_serves_a_lost_answer_once() {
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let evm = ExactEvm::new(mock.clone(), token(), Address::repeat_byte(0x22));
    let paywall = evm.mcp_paywall(&[("t", 1000, "t")]).unwrap();
    let pr = evm.payment_required("mcp://tool/t", "t", 1000);
    let key = LocalSigner::random();
    mock.mint(token().address, key.address(), U256::from(1000))
        .unwrap();
    let p = X402Payer::new(key, Policy::new(NET, token().address, U256::from(1000)))
        .pay(&pr)
        .unwrap();
    assert!(mock.settle(&p, &p.accepted).await.unwrap().success);
    let meta = payment_meta(&p);
    let call = || {
        paywall.call("t", Some(&meta.0.0), || async {
            CallToolResult::success(vec![ContentBlock::text("out")])
        })
    };
    let r = call().await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let r = call().await;
    assert_eq!(
        payment_required_of(&r).unwrap().error.as_deref(),
        Some(reasons::NONCE_ALREADY_USED)
    );
}

/// Fails its first settle as "unavailable" (outcome unknown), then settles.
#[derive(Debug)]
struct FlakyOnce(Arc<DevnetFacilitator>, AtomicUsize);

#[async_trait]
impl X402Facilitator for FlakyOnce {
    async fn verify(
        &self,
        p: &PaymentPayload,
        r: &PaymentRequirements,
    ) -> Result<VerifyResponse, FacilitatorError> {
        self.0.verify(p, r).await
    }
    async fn settle(
        &self,
        p: &PaymentPayload,
        r: &PaymentRequirements,
    ) -> Result<SettleResponse, FacilitatorError> {
        if self.1.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(FacilitatorError::Unavailable("connection reset".into()));
        }
        self.0.settle(p, r).await
    }
    async fn supported(&self) -> Result<SupportedResponse, FacilitatorError> {
        self.0.supported().await
    }
}

#[tokio::test]
async fn the_client_hands_back_an_unknown_payment_and_resends_it() {
    let fx = Fx::new();
    let flaky = Arc::new(FlakyOnce(fx.mock.clone(), AtomicUsize::new(0)));
    let url = fx.serve(flaky, SettleWhen::Before, Duration::ZERO).await;
    let key = LocalSigner::random();
    fx.mock
        .mint(token().address, key.address(), U256::from(5000))
        .unwrap();
    let client = rail_x402::client::client(X402Payer::new(
        key.clone(),
        Policy::new(NET, token().address, U256::from(1000)),
    ))
    .unwrap()
    .with_retries(0);
    let err = client.get(&url).await.unwrap_err();
    let rail_x402::client::ClientError::OutcomeUnknown { payment, .. } = err else {
        panic!("expected an unknown outcome, got {err}");
    };
    assert_eq!(fx.received(), U256::ZERO);
    let paid = client
        .resend(reqwest::Method::GET, &url, None, *payment)
        .await
        .unwrap();
    assert_eq!(paid.status, 200);
    assert_eq!(fx.received(), U256::from(1000));
    assert_eq!(
        fx.mock.balance(token().address, key.address()).unwrap(),
        U256::from(4000),
        "one payment, not two"
    );
}

/// A v1 payment whose first answer was "unknown" (503) is resent as the same bytes and
/// settled once.
#[tokio::test]
async fn a_v1_payment_is_resent_not_resigned() {
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let pay_to = Address::repeat_byte(0x22);
    let flaky = Arc::new(FlakyOnce(mock.clone(), AtomicUsize::new(0)));
    let paywall = ExactEvm::new(flaky, token(), pay_to)
        .accept_v1(None)
        .unwrap()
        .paywall(&[("/paid", 1000, "paid")])
        .unwrap();
    let app = paywall
        .apply(Router::new().route("/paid", get(|| async { "content" })))
        .layer(axum::middleware::map_response(
            |mut r: axum::response::Response| async move {
                // A v1-only server: no v2 header.
                r.headers_mut().remove("payment-required");
                r
            },
        ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let key = LocalSigner::random();
    mock.mint(token().address, key.address(), U256::from(5000))
        .unwrap();
    let client = rail_x402::client::client(X402Payer::new(
        key.clone(),
        Policy::new(NET, token().address, U256::from(1000)),
    ))
    .unwrap();
    let paid = client.get(&format!("http://{addr}/paid")).await.unwrap();
    assert_eq!(paid.status, 200);
    assert_eq!(
        mock.balance(token().address, pay_to).unwrap(),
        U256::from(1000)
    );
    assert_eq!(
        mock.balance(token().address, key.address()).unwrap(),
        U256::from(4000),
        "one payment"
    );
}

/// A price of nothing is a configuration error, answered where the route or tool is declared
/// (the transport's one price check), never a panic and never a free route.
#[test]
fn a_route_or_tool_priced_at_zero_is_refused_where_it_is_declared() {
    let evm = ExactEvm::new(
        Arc::new(DevnetFacilitator::new(NET)),
        token(),
        Address::repeat_byte(0x22),
    );
    let e = evm
        .paywall(&[("/free", 1000, "ok"), ("/paid", 0, "zero")])
        .err()
        .map(|e| e.to_string());
    assert!(e.is_some_and(|e| e.contains("zero")));
    assert!(evm.mcp_paywall(&[("t", 0, "zero")]).is_err());
    assert!(evm.accepts(0).is_err() && evm.accepts(1).is_ok());
}
