//! A paid ContextVM tool, end to end on one machine: an MCP server over Nostr selling `search`
//! for 10 sats (CEP-8, Lightning through its own NWC wallet), and an agent whose Stipendex
//! wallet pays it under a mandate — the relay and the Lightning wallets are nwc-devnet's, in
//! process.
//!
//! ```text
//! cargo run -p stipendex-contextvm --example paid_tool
//! ```
#![allow(clippy::print_stdout)]

use std::sync::Arc;

use lightning_invoice::Currency;
use nostr::Keys;
use nwc_devnet::{Devnet, DevnetConfig, WalletSpec};
use rail_core::payer::Idempotent;
use rail_core::{Asset, MemoryKeyStore, Money, PayerHandle, ReceiverHandle, SystemClock};
use rail_ln_nwc::client::{ClientOptions as NwcOptions, NwcClient};
use rail_ln_nwc::rail::{NwcPayer, NwcReceiver};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ServerHandler, ServiceExt};
use stipendex::envelope::{Allow, Limits, Mandate, Party, SecretKey, Signed};
use stipendex::receiver::{PricedCapability, Receiver};
use stipendex::wallet::{MemoryJournal, Wallet};
use stipendex_contextvm::payments::{NwcProcessor, ServerPayments, WalletHandler};
use stipendex_contextvm::transport::client::{ClientOptions, ClientTransport};
use stipendex_contextvm::transport::server::{Server, ServerOptions};

/// The MCP server: `echo` is free, `search` is sold (the price lives in the Receiver).
#[derive(Clone)]
struct Shop;

impl ServerHandler for Shop {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = Arc::new(
            serde_json::json!({"type": "object", "properties": {"q": {"type": "string"}}})
                .as_object()
                .cloned()
                .unwrap_or_default(),
        );
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("echo", "free", schema.clone()),
            Tool::new("search", "10 sats", schema),
        ]))
    }

    async fn call_tool(
        &self,
        r: CallToolRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let q = r
            .arguments
            .as_ref()
            .and_then(|a| a.get("q"))
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_owned();
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("{}: {q}", r.name))]).into())
    }
}

fn sats(n: u128) -> Result<Money, rail_core::MoneyError> {
    Money::from_minor(Asset::btc(), n * 1000)
}

fn call(name: &str, q: &str) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(name.to_owned());
    p.arguments = serde_json::json!({"q": q}).as_object().cloned();
    p
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // A relay, an NWC wallet service and two Lightning wallets, in process.
    let devnet = Devnet::start(DevnetConfig::default()).await?;
    let relay = devnet.relay_url().to_owned();
    let shop_wallet = devnet.create_wallet(WalletSpec::new("shop", 0)).await?;
    let agent_wallet = devnet
        .create_wallet(WalletSpec::new("agent", 1_000_000))
        .await?;
    println!("relay {relay} (nwc-devnet, in process)");

    // The server: its Nostr key (from the environment in production), the price of `search`,
    // and Lightning through its own wallet.
    let shop_nwc = Arc::new(NwcClient::connect(&shop_wallet.uri, NwcOptions::default()).await?);
    let clock = Arc::new(SystemClock);
    let store = Arc::new(MemoryKeyStore::default());
    // The seed derives hold preimages: keep it secret and stable (from the environment).
    let ln = NwcReceiver::new(shop_nwc.clone(), rand::random(), store, clock.clone()).await?;
    let receiver = Receiver::builder("shop", SecretKey::generate())
        .rail("ln-nwc", ReceiverHandle::with_holds(ln.clone()))
        .price(PricedCapability::fixed("tools/call", "search", sats(10)?).describe("a search"))
        .build()?;
    let payments = ServerPayments::new(receiver, vec![Arc::new(NwcProcessor::new(ln, shop_nwc))])?;
    let server = Server::start(
        Keys::generate(),
        ServerOptions::new(vec![relay.clone()]),
        || Shop,
        Some(Arc::new(payments)),
    )
    .await?;
    let server_key = server.public_key().to_hex();
    println!("server {server_key}: echo (free), search (10 sats, bitcoin-lightning-bolt11)");

    // The agent: a wallet under its principal's mandate — this server only, 100 sats a call.
    let principal = SecretKey::generate();
    let key = SecretKey::generate();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let mut mandate = Mandate::draft(
        Party {
            id: "principal".into(),
            key: principal.public(),
        },
        key.public(),
        now,
        86_400,
    );
    mandate.limits.push(Limits {
        asset: Asset::btc(),
        per_call: Some(sats(100)?.amount()),
        per_period: None,
        total: Some(sats(1000)?.amount()),
        per_receiver: None,
        confirm_above: None,
        tab_cap: None,
        open_tabs: None,
    });
    mandate.allow.push(Allow::Contextvm {
        server: server_key.clone(),
    });
    let mandate = Signed::sign(mandate, &principal)?;
    let agent_nwc = Arc::new(NwcClient::connect(&agent_wallet.uri, NwcOptions::default()).await?);
    let payer = NwcPayer::new(agent_nwc, Currency::Regtest, sats(1000)?, clock);
    let journal = Arc::new(MemoryJournal::default());
    let wallet = Wallet::builder(key, mandate)
        .rail(
            "lightning",
            PayerHandle::with_holds(Idempotent::new(payer, Arc::new(MemoryKeyStore::default()))),
        )
        .journal(journal.clone())
        .build()?;

    let transport = ClientTransport::connect(
        Keys::generate(),
        ClientOptions::new(vec![relay], server.public_key()),
        Some(Arc::new(WalletHandler::new(wallet))),
    )
    .await?;
    let client = ().serve(transport).await?;
    for (tool, q) in [("echo", "hello"), ("search", "rust")] {
        let r = client.call_tool(call(tool, q)).await?;
        let text = r
            .content
            .first()
            .and_then(|c| c.as_text())
            .map(|t| t.text.clone())
            .unwrap_or_default();
        println!("{tool} -> {text:?}");
    }
    println!(
        "shop has {} sats, agent {} sats; audit chains: {}",
        devnet.balance_msat("shop")? / 1000,
        devnet.balance_msat("agent")? / 1000,
        journal.names().join(", ")
    );
    client.cancel().await?;
    server.shutdown().await;
    devnet.shutdown().await;
    Ok(())
}
