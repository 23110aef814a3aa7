//! A ContextVM world on nwc-devnet: its relay carries the MCP messages and the NWC traffic; a
//! `shop` wallet is paid, `agent` wallets pay.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    dead_code,
    missing_docs,
    unreachable_pub
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lightning_invoice::Currency;
use nostr::Keys;
use nwc_devnet::{Devnet, DevnetConfig, WalletSpec};
use rail_core::{Asset, Money, ReceiverHandle, SystemClock};
use rail_ln_nwc::client::{ClientOptions as NwcOptions, NwcClient};
use rail_ln_nwc::rail::{NwcPayer, NwcReceiver};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData, JsonObject,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleClient, RoleServer, RunningService};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::{Value, json};
use stipendex::envelope::SecretKey;
use stipendex::receiver::{PricedCapability, Receiver, ResolvePrice};
use stipendex_contextvm::payments::{LightningHandler, NwcProcessor, ServerPayments};
use stipendex_contextvm::transport::client::{ClientOptions, ClientTransport, PaymentHook};
use stipendex_contextvm::transport::server::{Server, ServerOptions};
use stipendex_test_kit as kit;

/// The tools: `echo` (free), `search` (10 sats), `secret` and `prepaid` (priced; the hook
/// rejects or waives them in some tests), `slow` (free, answers after 3 s).
#[derive(Clone, Default)]
pub struct Tools {
    pub runs: Arc<AtomicUsize>,
}

fn schema() -> Arc<JsonObject> {
    Arc::new(
        json!({"type": "object", "properties": {"q": {"type": "string"}}})
            .as_object()
            .unwrap()
            .clone(),
    )
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(vec![
            Tool::new("echo", "free", schema()),
            Tool::new("search", "10 sats", schema()),
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.runs.fetch_add(1, Ordering::SeqCst);
        if request.name == "slow" {
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        let q = request
            .arguments
            .as_ref()
            .and_then(|a| a.get("q"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Ok(
            CallToolResult::success(vec![ContentBlock::text(format!("{}: {q}", request.name))])
                .into(),
        )
    }
}

pub fn sats(n: u128) -> Money {
    Money::from_minor(Asset::btc(), n * 1000).unwrap()
}

pub struct World {
    pub devnet: Devnet,
    pub shop: Arc<NwcClient>,
    pub shop_receiver: NwcReceiver,
}

pub async fn world() -> World {
    let devnet = Devnet::start(DevnetConfig::default()).await.unwrap();
    let shop = devnet
        .create_wallet(WalletSpec::new("shop", 0))
        .await
        .unwrap();
    let shop = Arc::new(
        NwcClient::connect(&shop.uri, NwcOptions::default())
            .await
            .unwrap(),
    );
    let shop_receiver = NwcReceiver::new(
        shop.clone(),
        [7; 32],
        Arc::new(rail_core::MemoryKeyStore::default()),
        Arc::new(SystemClock),
    )
    .await
    .unwrap();
    World {
        devnet,
        shop,
        shop_receiver,
    }
}

impl World {
    pub fn url(&self) -> String {
        self.devnet.relay_url().to_owned()
    }

    /// The shop's receiver: `search`, `secret`, `prepaid` at 10 sats, `hook` deciding.
    pub fn receiver(&self, hook: Option<Arc<dyn ResolvePrice>>) -> Receiver {
        let mut b = Receiver::builder("shop", SecretKey::generate())
            .rail(
                "ln-nwc",
                ReceiverHandle::with_holds(self.shop_receiver.clone()),
            )
            .price(PricedCapability::fixed("tools/call", "search", sats(10)).describe("a search"))
            .price(PricedCapability::fixed("tools/call", "secret", sats(10)))
            .price(PricedCapability::fixed("tools/call", "prepaid", sats(10)));
        if let Some(h) = hook {
            b = b.resolve_price(h);
        }
        b.build().unwrap()
    }

    pub fn payments(&self, hook: Option<Arc<dyn ResolvePrice>>) -> ServerPayments {
        let processor = NwcProcessor::new(self.shop_receiver.clone(), self.shop.clone());
        ServerPayments::new(self.receiver(hook), vec![Arc::new(processor)]).unwrap()
    }

    pub async fn server(&self, tools: Tools, payments: Option<ServerPayments>) -> Server {
        Server::start(
            Keys::generate(),
            ServerOptions::new(vec![self.url()]),
            move || tools.clone(),
            payments.map(|p| Arc::new(p) as _),
        )
        .await
        .unwrap()
    }

    /// A funded agent wallet and a handler paying from it (at most 1 000 sats a payment).
    pub async fn agent(&self, name: &str) -> Arc<dyn PaymentHook> {
        let w = self
            .devnet
            .create_wallet(WalletSpec::new(name, 1_000_000))
            .await
            .unwrap();
        let c = Arc::new(
            NwcClient::connect(&w.uri, NwcOptions::default())
                .await
                .unwrap(),
        );
        let payer = NwcPayer::new(c, Currency::Regtest, sats(1000), Arc::new(SystemClock));
        Arc::new(LightningHandler::new(Arc::new(payer)))
    }

    pub async fn client(
        &self,
        server: &Server,
        hook: Option<Arc<dyn PaymentHook>>,
    ) -> RunningService<RoleClient, ()> {
        let t = ClientTransport::connect(
            Keys::generate(),
            ClientOptions::new(vec![self.url()], server.public_key()),
            hook,
        )
        .await
        .unwrap();
        tokio::time::timeout(Duration::from_secs(10), ().serve(t))
            .await
            .expect("initialize in time")
            .unwrap()
    }
}

pub fn call(name: &str, q: &str) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(name.to_owned());
    p.arguments = Some(json!({"q": q}).as_object().unwrap().clone());
    p
}

pub fn text(r: &CallToolResult) -> String {
    r.content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default()
}

/// Wraps a handler: counts the payment requests it saw, keeps the last one, and runs `before`
/// (a relay restart) before paying; `pay: false` declines to pay without saying so (the
/// request then waits for the server's TTL).
pub struct Watch {
    pub inner: Arc<dyn PaymentHook>,
    pub seen: AtomicUsize,
    pub last: std::sync::Mutex<Option<stipendex_contextvm::payments::notify::PaymentRequired>>,
    pub pay: bool,
    pub before: Option<Box<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>>,
}

impl Watch {
    pub fn new(inner: Arc<dyn PaymentHook>) -> Self {
        Watch {
            inner,
            seen: AtomicUsize::new(0),
            last: std::sync::Mutex::new(None),
            pay: true,
            before: None,
        }
    }
}

#[async_trait::async_trait]
impl PaymentHook for Watch {
    fn pmis(&self) -> Vec<String> {
        self.inner.pmis()
    }

    async fn pay(
        &self,
        request: &stipendex_contextvm::transport::client::PaidRequest,
        required: &stipendex_contextvm::payments::notify::PaymentRequired,
    ) -> Result<Option<Value>, String> {
        self.seen.fetch_add(1, Ordering::SeqCst);
        *self.last.lock().unwrap() = Some(required.clone());
        if let Some(b) = &self.before {
            b().await;
        }
        if self.pay {
            self.inner.pay(request, required).await
        } else {
            Ok(None)
        }
    }
}

/// A Stipendex wallet paying from a funded devnet wallet over its `ln-nwc` rail, under a
/// mandate allowing `servers` (Nostr keys, hex), at most `per_call` sats a payment and
/// `total` sats in all, confirming nothing.
pub async fn stipendex_wallet(
    w: &World,
    name: &str,
    servers: &[String],
    per_call: u128,
    total: u128,
) -> (
    stipendex::wallet::Wallet,
    Arc<stipendex::wallet::MemoryJournal>,
) {
    let dw = w
        .devnet
        .create_wallet(WalletSpec::new(name, 1_000_000))
        .await
        .unwrap();
    let c = Arc::new(
        NwcClient::connect(&dw.uri, NwcOptions::default())
            .await
            .unwrap(),
    );
    let payer = NwcPayer::new(c, Currency::Regtest, sats(10_000), Arc::new(SystemClock));
    let principal = SecretKey::generate();
    let key = SecretKey::generate();
    let mandate = kit::mandate(&principal, key.public())
        .id_of_principal("principal")
        .limits(kit::limits(
            Asset::btc(),
            sats(per_call).amount(),
            sats(total).amount(),
        ))
        .allow_all(servers.iter().map(|s| kit::contextvm(s)))
        .sign();
    kit::journaled(stipendex::wallet::Wallet::builder(key, mandate).rail(
        "lightning",
        rail_core::PayerHandle::with_holds(rail_core::payer::Idempotent::new(
            payer,
            Arc::new(rail_core::MemoryKeyStore::default()),
        )),
    ))
}
