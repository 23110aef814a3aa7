//! The MCP binding inside a real rmcp server, called by a real rmcp client over an in-memory
//! stream: unpaid call → payment required → paid call with `_meta["x402/payment"]` → tool
//! output with `_meta["x402/payment-response"]` (in-memory token).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;

use alloy_primitives::{Address, U256};
use rail_x402::evm::LocalSigner;
use rail_x402::mcp::{PAYMENT_RESPONSE_META, payment_meta, payment_required_of};
use rail_x402::payer::{Policy, X402Payer};
use rail_x402::{ExactEvm, Token};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CallToolResult, ClientRequest,
    ContentBlock, ErrorData, ServerCapabilities, ServerConfig, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};
use x402_devnet::DevnetFacilitator;
use x402_transport::mcp::McpPaywall;

#[derive(Clone)]
struct PaidTools {
    paywall: McpPaywall,
}

impl ServerHandler for PaidTools {
    fn get_info(&self) -> ServerConfig {
        let mut info = ServerConfig::default();
        info.capabilities = ServerCapabilities::builder().enable_tools().build();
        info
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let result = self
            .paywall
            .call(&request.name, Some(&context.meta.0.0), || async {
                CallToolResult::success(vec![ContentBlock::text("Strong fundamentals")])
            })
            .await;
        Ok(result.into())
    }
}

#[tokio::test]
async fn an_rmcp_client_pays_an_rmcp_server() {
    let token = Token::new("eip155:84532", Address::repeat_byte(0x5c), "USDC", "2");
    let mock = Arc::new(DevnetFacilitator::new(&token.network));
    let pay_to = Address::repeat_byte(0x22);
    let paywall = ExactEvm::new(mock.clone(), token.clone(), pay_to)
        .mcp_paywall(&[(
            "financial_analysis",
            10_000,
            "Advanced financial analysis tool",
        )])
        .unwrap();
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let server = PaidTools { paywall }.serve(server_io).await.unwrap();
        let _ = server.waiting().await;
    });
    let client = ().serve(client_io).await.unwrap();

    let unpaid = client
        .call_tool(CallToolRequestParams::new("financial_analysis"))
        .await
        .unwrap();
    let pr = payment_required_of(&unpaid).expect("a payment-required result");
    assert_eq!(pr.accepts[0].amount.value(), U256::from(10_000));

    let key = LocalSigner::random();
    mock.mint(token.address, key.address(), U256::from(10_000))
        .unwrap();
    let payment = X402Payer::new(
        key,
        Policy::new(&token.network, token.address, U256::from(10_000)),
    )
    .pay(&pr)
    .unwrap();
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(CallToolRequestParams::new(
        "financial_analysis",
    )));
    let answer = client
        .peer()
        .send_request_with_option(
            request,
            PeerRequestOptions::no_options().with_meta(payment_meta(&payment)),
        )
        .await
        .unwrap()
        .await_response()
        .await
        .unwrap();
    let ServerResult::CallToolResult(paid) = answer else {
        panic!("not a tool result: {answer:?}");
    };
    assert_ne!(paid.is_error, Some(true), "{paid:?}");
    let meta = paid.meta.expect("result _meta");
    assert_eq!(meta.0[PAYMENT_RESPONSE_META]["success"], true);
    assert_eq!(
        mock.balance(token.address, pay_to).unwrap(),
        U256::from(10_000)
    );
    client.cancel().await.unwrap();
}
