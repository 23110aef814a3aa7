//! The MCP binding (`transports-v2/mcp.md`) over the in-memory token (mock tier) and, when the
//! localnet is there, over anvil's FiatTokenV2_2.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use alloy_primitives::{Address, U256};
use async_trait::async_trait;
use rail_core::MemoryKeyStore;
use rail_x402::evm::LocalSigner;
use rail_x402::facilitator::{
    FacilitatorError, LocalFacilitator, SupportedResponse, X402Facilitator, X402SettlementBook,
};
use rail_x402::mcp::{PAYMENT_RESPONSE_META, payment_meta, payment_required_of};
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::verify::reasons;
use rail_x402::wire::{PaymentPayload, PaymentRequirements, SettleResponse, VerifyResponse};
use rail_x402::{ExactEvm, Token};
use rmcp::model::{CallToolRequestParams, CallToolResult, ContentBlock};
use serde_json::{Value, json};
use x402_devnet::DevnetFacilitator;
use x402_devnet::anvil::Localnet;

const PRICE: u64 = 10_000;

fn token() -> Token {
    Token::new("eip155:84532", Address::repeat_byte(0x5c), "USDC", "2")
}

fn params(payment: Option<&PaymentPayload>) -> CallToolRequestParams {
    let mut v = json!({"name": "financial_analysis", "arguments": {"ticker": "AAPL"}});
    if let Some(p) = payment {
        v["_meta"] = serde_json::to_value(payment_meta(p)).unwrap();
    }
    serde_json::from_value(v).unwrap()
}

struct Tool(Arc<AtomicUsize>);
impl Tool {
    fn ok(&self) -> impl Future<Output = CallToolResult> + Send + 'static {
        let n = self.0.clone();
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            CallToolResult::success(vec![ContentBlock::text("Strong fundamentals")])
        }
    }
}

fn text(r: &CallToolResult) -> String {
    match &r.content[0] {
        ContentBlock::Text(t) => t.text.clone(),
        _ => panic!("not text"),
    }
}

#[tokio::test]
async fn unpaid_paid_replayed_and_failed_tool_calls() {
    let mock = Arc::new(DevnetFacilitator::new("eip155:84532"));
    let pay_to = Address::repeat_byte(0x22);
    let paywall = ExactEvm::new(mock.clone(), token(), pay_to)
        .mcp_paywall(&[(
            "financial_analysis",
            PRICE.into(),
            "Advanced financial analysis tool",
        )])
        .unwrap();
    let hits = Tool(Arc::new(AtomicUsize::new(0)));

    // Unpaid: the specification's payment-required result.
    let r = paywall.call_params(&params(None), || hits.ok()).await;
    let wire = serde_json::to_value(&r).unwrap();
    assert_eq!(wire["isError"], true);
    assert_eq!(wire["structuredContent"]["x402Version"], 2);
    assert_eq!(
        wire["structuredContent"]["resource"]["url"],
        "mcp://tool/financial_analysis"
    );
    let wrapper: Value = serde_json::from_str(&text(&r)).unwrap();
    assert_eq!(wrapper["x402/error"]["code"], 402);
    assert_eq!(wrapper["x402/error"]["data"], wire["structuredContent"]);
    let pr = payment_required_of(&r).unwrap();
    assert_eq!(hits.0.load(Ordering::SeqCst), 0);

    // Paid.
    let key = LocalSigner::random();
    mock.mint(token().address, key.address(), U256::from(3 * PRICE))
        .unwrap();
    let payer = X402Payer::new(
        key.clone(),
        Policy::new("eip155:84532", token().address, U256::from(PRICE)),
    );
    let payment = payer.pay(&pr).unwrap();
    let r = paywall
        .call_params(&params(Some(&payment)), || hits.ok())
        .await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(text(&r), "Strong fundamentals");
    let settle: SettleResponse =
        serde_json::from_value(r.meta.as_ref().unwrap().0[PAYMENT_RESPONSE_META].clone()).unwrap();
    assert!(settle.success);
    assert_eq!(
        mock.balance(token().address, pay_to).unwrap(),
        U256::from(PRICE)
    );

    // Replayed: refused, the tool does not run again.
    let r = paywall
        .call_params(&params(Some(&payment)), || hits.ok())
        .await;
    assert_eq!(
        payment_required_of(&r).unwrap().error.as_deref(),
        Some(reasons::NONCE_ALREADY_USED)
    );
    assert_eq!(hits.0.load(Ordering::SeqCst), 1);

    // A tool error is not charged.
    let payment = payer.pay(&pr).unwrap();
    let r = paywall
        .call_params(&params(Some(&payment)), || async {
            CallToolResult::error(vec![ContentBlock::text("upstream down")])
        })
        .await;
    assert_eq!(text(&r), "upstream down");
    assert_eq!(
        mock.balance(token().address, pay_to).unwrap(),
        U256::from(PRICE)
    );

    // A payment for other requirements (another amount).
    let mut cheap_pr = pr.clone();
    cheap_pr.accepts[0].amount = 1u64.into();
    let cheap = payer.pay(&cheap_pr).unwrap();
    let r = paywall
        .call_params(&params(Some(&cheap)), || hits.ok())
        .await;
    assert_eq!(
        payment_required_of(&r).unwrap().error.as_deref(),
        Some(reasons::NO_MATCHING_REQUIREMENTS)
    );
    // Garbage in _meta.
    let mut bad =
        json!({"name": "financial_analysis", "_meta": {"x402/payment": {"x402Version": 2}}});
    let r = paywall
        .call_params(&serde_json::from_value(bad.take()).unwrap(), || hits.ok())
        .await;
    assert_eq!(
        payment_required_of(&r).unwrap().error.as_deref(),
        Some(reasons::INVALID_PAYLOAD)
    );
    assert_eq!(hits.0.load(Ordering::SeqCst), 1);
}

/// Verifies, then fails every settlement: the tool runs, its output is withheld.
#[derive(Debug)]
struct FailingSettle(DevnetFacilitator);

#[async_trait]
impl X402Facilitator for FailingSettle {
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
        _r: &PaymentRequirements,
    ) -> Result<SettleResponse, FacilitatorError> {
        Ok(SettleResponse {
            success: false,
            error_reason: Some(reasons::TRANSACTION_FAILED.into()),
            error_message: Some("reverted".into()),
            transaction: String::new(),
            network: p.accepted.network.clone(),
            payer: None,
        })
    }
    async fn supported(&self) -> Result<SupportedResponse, FacilitatorError> {
        self.0.supported().await
    }
}

#[tokio::test]
async fn a_failed_settlement_withholds_the_tool_output() {
    let inner = DevnetFacilitator::new("eip155:84532");
    let key = LocalSigner::random();
    inner
        .mint(token().address, key.address(), U256::from(PRICE))
        .unwrap();
    let evm = ExactEvm::new(
        Arc::new(FailingSettle(inner)),
        token(),
        Address::repeat_byte(0x22),
    );
    let paywall = evm
        .mcp_paywall(&[("financial_analysis", PRICE.into(), "analysis")])
        .unwrap();
    let pr = evm.payment_required("mcp://tool/financial_analysis", "analysis", PRICE.into());
    let payment = X402Payer::new(
        key,
        Policy::new("eip155:84532", token().address, U256::from(PRICE)),
    )
    .pay(&pr)
    .unwrap();
    let r = paywall
        .call_params(&params(Some(&payment)), || async {
            CallToolResult::success(vec![ContentBlock::text("SECRET")])
        })
        .await;
    assert_eq!(r.is_error, Some(true));
    assert!(!text(&r).contains("SECRET"));
    let s = r.structured_content.unwrap();
    assert_eq!(s[PAYMENT_RESPONSE_META]["success"], false);
    assert_eq!(
        s[PAYMENT_RESPONSE_META]["errorReason"],
        reasons::TRANSACTION_FAILED
    );
}

/// The specification's own example request decodes; its authorization has long expired.
#[tokio::test]
async fn the_specification_example_request_is_read() {
    let raw = json!({
      "name": "financial_analysis",
      "arguments": {"ticker": "AAPL", "analysis_type": "deep"},
      "_meta": {"x402/payment": {
        "x402Version": 2,
        "resource": {"url": "mcp://tool/financial_analysis", "description": "Advanced financial analysis tool", "mimeType": "application/json"},
        "accepted": {"scheme": "exact", "network": "eip155:84532", "amount": "10000",
          "asset": "0x036CbD53842c5426634e7929541eC2318f3dCF7e", "payTo": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
          "maxTimeoutSeconds": 60, "extra": {"name": "USDC", "version": "2"}},
        "payload": {
          "signature": "0x2d6a7588d6acca505cbf0d9a4a227e0c52c6c34008c8e8986a1283259764173608a2ce6496642e377d6da8dbbf5836e9bd15092f9ecab05ded3d6293af148b571c",
          "authorization": {"from": "0x857b06519E91e3A54538791bDbb0E22373e36b66", "to": "0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
            "value": "10000", "validAfter": "1740672089", "validBefore": "1740672154",
            "nonce": "0xf3746613c2d920b5fdabc0856f2aeb2d4f88ee6037b8cc5d04a71a4462f13480"}}}}
    });
    let params: CallToolRequestParams = serde_json::from_value(raw).unwrap();
    let usdc = Token::new(
        "eip155:84532",
        "0x036CbD53842c5426634e7929541eC2318f3dCF7e"
            .parse()
            .unwrap(),
        "USDC",
        "2",
    );
    let paywall = ExactEvm::new(
        Arc::new(DevnetFacilitator::new("eip155:84532")),
        usdc,
        "0x209693Bc6afc0C5328bA36FaF03C514EF312287C"
            .parse()
            .unwrap(),
    )
    .mcp_paywall(&[(
        "financial_analysis",
        10_000,
        "Advanced financial analysis tool",
    )])
    .unwrap();
    let r = paywall
        .call_params(&params, || async { CallToolResult::success(vec![]) })
        .await;
    assert_eq!(
        payment_required_of(&r).unwrap().error.as_deref(),
        Some(reasons::VALID_BEFORE_EXPIRED)
    );
}

/// On the real token.
#[tokio::test]
async fn paid_tool_call_on_anvil() {
    let Some(net) = Localnet::from_env().await else {
        return;
    };
    let store = Arc::new(MemoryKeyStore::default());
    let f = LocalFacilitator::connect(
        net.rpc.clone(),
        net.funded_settler().await.unwrap(),
        X402SettlementBook::new(store.clone()),
    )
    .await
    .unwrap();
    let pay_to = LocalSigner::random().address();
    let paywall = ExactEvm::new(Arc::new(f), net.token.clone(), pay_to)
        .mcp_paywall(&[("financial_analysis", 1000, "analysis")])
        .unwrap()
        .with_store(store);
    let key = net.funded_payer(U256::from(5000)).await.unwrap();
    let payer = X402Payer::new(
        key,
        Policy::new(&net.token.network, net.token.address, U256::from(1000)),
    );
    let unpaid = paywall
        .call_params(&params(None), || async { CallToolResult::success(vec![]) })
        .await;
    let payment = payer.pay(&payment_required_of(&unpaid).unwrap()).unwrap();
    let r = paywall
        .call_params(&params(Some(&payment)), || async {
            CallToolResult::success(vec![ContentBlock::text("done")])
        })
        .await;
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let settle = &r.meta.unwrap().0[PAYMENT_RESPONSE_META];
    assert_eq!(settle["success"], true);
    assert_eq!(net.balance(pay_to).await.unwrap(), U256::from(1000));
}
