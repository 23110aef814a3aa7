//! x402 v1 (`X-PAYMENT`, JSON body, `X-PAYMENT-RESPONSE`) beside v2, on the in-memory token:
//! a v1 client and a v2 client pay the same route; a v2 exchange is never downgraded.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;

use alloy_primitives::{Address, U256};
use axum::Router;
use axum::routing::get;
use rail_x402::client::{EvmFetched, client};
use rail_x402::evm::LocalSigner;
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::v1::{PaymentRequiredV1, SettleResponseV1};
use rail_x402::wire::PaymentRequired;
use rail_x402::{ExactEvm, Token};
use x402_devnet::DevnetFacilitator;
use x402_transport::paywall::Paywall;

const NET: &str = "eip155:84532";

/// A reqwest client with the workspace's rustls provider installed.
fn http() -> reqwest::Client {
    rail_x402::rpc::http_client(std::time::Duration::from_secs(10)).unwrap()
}

fn token() -> Token {
    Token::new(NET, Address::repeat_byte(0x5c), "USDC", "2")
}

async fn serve(paywall: Paywall, strip_v2: bool) -> String {
    let mut app = paywall.apply(Router::new().route("/paid", get(|| async { "content" })));
    if strip_v2 {
        // A v1-only server: no PAYMENT-REQUIRED header on its 402.
        app = app.layer(axum::middleware::map_response(
            |mut r: axum::response::Response| async move {
                r.headers_mut().remove("payment-required");
                r
            },
        ));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/paid")
}

fn funded(mock: &DevnetFacilitator) -> X402Payer {
    let key = LocalSigner::random();
    mock.mint(token().address, key.address(), U256::from(10_000))
        .unwrap();
    X402Payer::new(key, Policy::new(NET, token().address, U256::from(1000)))
}

#[tokio::test]
async fn v1_and_v2_clients_pay_the_same_route() {
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let pay_to = Address::repeat_byte(0x22);
    let paywall = ExactEvm::new(mock.clone(), token(), pay_to)
        .accept_v1(None)
        .unwrap()
        .paywall(&[("/paid", 1000, "paid")])
        .unwrap();
    let url = serve(paywall, false).await;

    // The 402: v2 in the header, v1 in the body.
    let r = http().get(&url).send().await.unwrap();
    assert_eq!(r.status(), 402);
    let v2 =
        PaymentRequired::from_header(r.headers()["payment-required"].to_str().unwrap()).unwrap();
    assert_eq!(v2.accepts[0].network, NET);
    let v1: PaymentRequiredV1 = r.json().await.unwrap();
    assert_eq!(v1.accepts[0].network, "base-sepolia");
    assert_eq!(v1.accepts[0].max_amount_required.value(), U256::from(1000));

    // A v2 client uses the header: never downgraded.
    let paid = EvmFetched::from(client(funded(&mock)).unwrap().get(&url).await.unwrap());
    assert_eq!(paid.status, 200);
    assert!(paid.headers.contains_key("payment-response"));
    assert!(!paid.headers.contains_key("x-payment-response"));

    // A v1 client: X-PAYMENT in, X-PAYMENT-RESPONSE out.
    let payment = funded(&mock).pay_v1(&v1).unwrap();
    let r = http()
        .get(&url)
        .header("X-PAYMENT", payment.to_header().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let s =
        SettleResponseV1::from_header(r.headers()["x-payment-response"].to_str().unwrap()).unwrap();
    assert!(s.success);
    assert_eq!(s.network, "base-sepolia");
    assert_eq!(
        mock.balance(token().address, pay_to).unwrap(),
        U256::from(2000)
    );

    // The same v1 payment again: refused.
    let r = http()
        .get(&url)
        .header("X-PAYMENT", payment.to_header().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402);
    // A v1 payment naming another network: refused before anything else.
    let mut other = funded(&mock).pay_v1(&v1).unwrap();
    other.network = "base".into();
    let r = http()
        .get(&url)
        .header("X-PAYMENT", other.to_header().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402);
    assert_eq!(
        mock.balance(token().address, pay_to).unwrap(),
        U256::from(2000)
    );
}

#[tokio::test]
async fn our_client_pays_a_v1_only_server() {
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let pay_to = Address::repeat_byte(0x22);
    let paywall = ExactEvm::new(mock.clone(), token(), pay_to)
        .accept_v1(None)
        .unwrap()
        .paywall(&[("/paid", 1000, "paid")])
        .unwrap();
    let url = serve(paywall, true).await;
    let paid = EvmFetched::from(client(funded(&mock)).unwrap().get(&url).await.unwrap());
    assert_eq!(paid.status, 200, "{}", String::from_utf8_lossy(&paid.body));
    assert_eq!(paid.body, b"content");
    let s = paid.settlement.unwrap();
    assert!(s.success);
    assert_eq!(s.network, "base-sepolia");
    assert_eq!(
        mock.balance(token().address, pay_to).unwrap(),
        U256::from(1000)
    );
}

#[tokio::test]
async fn without_v1_an_x_payment_is_not_read() {
    let mock = Arc::new(DevnetFacilitator::new(NET));
    let paywall = ExactEvm::new(mock.clone(), token(), Address::repeat_byte(0x22))
        .paywall(&[("/paid", 1000, "paid")])
        .unwrap();
    assert!(
        ExactEvm::new(
            mock.clone(),
            Token::new("eip155:31337", Address::ZERO, "x", "1"),
            Address::ZERO
        )
        .accept_v1(None)
        .is_err(),
        "31337 has no v1 name"
    );
    let url = serve(paywall, false).await;
    let r = http().get(&url).send().await.unwrap();
    let body: PaymentRequired = r.json().await.unwrap();
    let v1 = rail_x402::v1::v1_body(&body, "base-sepolia");
    let payment = funded(&mock).pay_v1(&v1).unwrap();
    let r = http()
        .get(&url)
        .header("X-PAYMENT", payment.to_header().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402);
    assert_eq!(
        mock.balance(token().address, Address::repeat_byte(0x22))
            .unwrap(),
        U256::ZERO
    );
}
