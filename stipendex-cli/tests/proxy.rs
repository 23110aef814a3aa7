//! `stipendex proxy` in front of `stipendex serve-mcp`, both as processes, driven by MCP hosts
//! that know nothing of payments: an rmcp host here, and the independent clients of
//! `scripts/mcp-clients` (the TypeScript SDK, npm `@modelcontextprotocol/sdk`, and the Python
//! SDK, PyPI `mcp`) — over the `ledger` rail on SQLite.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::needless_pass_by_value,
    missing_docs
)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rail_ledger::{AccountId, Ledger};
use rmcp::model::{CallToolRequestParams, ClientCapabilities, ClientConfig, ElicitResult};
use rmcp::service::{RequestContext, RoleClient};
use rmcp::transport::TokioChildProcess;
use rmcp::{ClientHandler, ErrorData, ServiceExt};
use serde_json::{Value, json};
use stipendex::Asset;
use stipendex::envelope::{Allow, SecretKey, Signed};

/// The shop's identity over stdio (its `[receiver] origins`, the proxy's `--server`).
const SHOP: &str = "https://shop.example";

/// A ledger with a funded agent and a shop; the shop's and the wallet's configuration files.
struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    ledger: Ledger,
    agent: AccountId,
}

impl Setup {
    async fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let (ledger, ledger_url, agent, shop) = common::funded_ledger(&dir, 10_000).await;

        let shop_key = SecretKey::generate();
        std::fs::write(dir.join("shop.key"), shop_key.to_hex().as_str()).unwrap();
        std::fs::write(
            dir.join("shop.toml"),
            format!(
                r#"[store]
url = "sqlite://{store}"

[rails.house]
kind = "ledger"
url = "{ledger_url}"
payee_account = "{shop}"

[receiver]
id = "shop"
key_file = "shop.key"
origins = ["{SHOP}"]

[[price]]
kind = "tool"
pattern = "search"
amount = "0.05"
asset = "USD"
description = "one web search"

[[price]]
kind = "tool"
pattern = "render"
estimate = "3.00"
tolerance = "0.50"
asset = "USD"
description = "one rendered document"

[[price]]
kind = "resource"
pattern = "reports://*"
amount = "0.10"
asset = "USD"
"#,
                store = dir.join("shop.db").display()
            ),
        )
        .unwrap();

        let (principal, wallet_key) = common::wallet_keys(&dir);
        let mandate = |allow: bool| {
            let mut m = common::draft(&principal, &wallet_key);
            let mut limits = common::limits("5.00", "20.00");
            limits.confirm_above = Some("1.00".parse().unwrap());
            m.limits.push(limits);
            if allow {
                m.allow.push(common::allow_shop(&shop_key, SHOP));
            }
            Signed::sign(m, &principal).unwrap()
        };
        for (name, allow) in [("wallet", true), ("stranger", false)] {
            std::fs::write(dir.join(format!("{name}.jws")), mandate(allow).jws()).unwrap();
            std::fs::write(
                dir.join(format!("{name}.toml")),
                common::wallet_toml(
                    &format!("{name}.jws"),
                    &principal,
                    &format!("journal = \"chains-{name}\"\n"),
                    &format!("sqlite://{}", dir.join(format!("{name}.db")).display()),
                    &format!(
                        "{}\n[upstream]\nserver = \"{SHOP}\"\n",
                        common::payer_rail(&ledger_url, agent)
                    ),
                ),
            )
            .unwrap();
        }
        Setup {
            _tmp: tmp,
            dir,
            ledger,
            agent,
        }
    }

    /// The command a host starts: the proxy (with `wallet`'s configuration) in front of the
    /// example server.
    fn command(&self, wallet: &str) -> Vec<String> {
        let bin = env!("CARGO_BIN_EXE_stipendex").to_owned();
        vec![
            bin.clone(),
            "proxy".into(),
            "--config".into(),
            self.dir
                .join(format!("{wallet}.toml"))
                .display()
                .to_string(),
            "--".into(),
            bin,
            "serve-mcp".into(),
            "--config".into(),
            self.dir.join("shop.toml").display().to_string(),
        ]
    }

    /// The agent's balance in cents, and what is held.
    async fn balance(&self) -> (i128, u64) {
        let a = self.ledger.account(self.agent).await.unwrap().unwrap();
        (a.posted_balance(), a.debits_pending)
    }

    fn chains(&self, wallet: &str) -> usize {
        common::count_jws(&self.dir.join(format!("chains-{wallet}")))
    }
}

/// A plain MCP host (no payment code): answers elicitation yes or no.
#[derive(Clone)]
struct Host {
    accept: bool,
    asked: Arc<Mutex<Vec<String>>>,
}

impl ClientHandler for Host {
    fn get_info(&self) -> ClientConfig {
        let mut c = ClientConfig::default();
        c.capabilities = ClientCapabilities::builder().enable_elicitation().build();
        c
    }

    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _c: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        if let rmcp::model::ElicitRequestParams::FormElicitationParams { message, .. } = &request {
            self.asked.lock().unwrap().push(message.clone());
        }
        Ok(if self.accept {
            ElicitResult::new(rmcp::model::ElicitationAction::Accept)
                .with_content(json!({"confirm": true}))
        } else {
            ElicitResult::new(rmcp::model::ElicitationAction::Decline)
        })
    }
}

fn call(name: &str, args: Value) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(name.to_owned());
    p.arguments = args.as_object().cloned();
    p
}

fn child(command: &[String]) -> TokioChildProcess {
    let mut cmd = tokio::process::Command::new(&command[0]);
    cmd.args(&command[1..]).env_remove("RUST_LOG");
    TokioChildProcess::new(cmd).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_proxy_pays_the_example_server_for_a_host_that_knows_nothing_of_payments() {
    let s = Setup::new().await;
    let (before, _) = s.balance().await;
    let host = Host {
        accept: true,
        asked: Arc::default(),
    };
    let client = host
        .clone()
        .serve(child(&s.command("wallet")))
        .await
        .unwrap();

    // The server's own initialize, its prices as hints.
    let info = client.peer().peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "stipendex-example");
    let tools = client.list_all_tools().await.unwrap();
    let search = tools.iter().find(|t| t.name == "search").unwrap();
    assert_eq!(
        search.meta.as_ref().unwrap().0["stipendex/pricing"],
        json!({"model": "per_call", "estimate": "0.05 USD"})
    );

    // Free, then paid: the host sees results only.
    let r = client
        .call_tool(call("echo", json!({"text": "hi"})))
        .await
        .unwrap();
    assert_eq!(r.content[0].as_text().unwrap().text, "hi");
    let r = client
        .call_tool(call("search", json!({"query": "rust"})))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(r.structured_content.as_ref().unwrap()["query"], "rust");
    assert_eq!(
        r.meta.as_ref().unwrap().0["stipendex/receipt"]["stipendex"],
        "receipt/0.1"
    );
    assert_eq!(s.balance().await.0, before - 5);

    // A checkout: the host's user is asked by elicitation, then it is held and captured.
    let r = client
        .call_tool(call("render", json!({"text": "page"})))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(host.asked.lock().unwrap().len(), 1);
    assert_eq!(s.balance().await, (before - 5 - 300, 0));
    // A failing checkout: asked, held, voided.
    let r = client
        .call_tool(call("render", json!({"text": "page", "fail": true})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true));
    assert_eq!(s.balance().await, (before - 5 - 300, 0));

    // The priced resource.
    let r = client
        .read_resource(rmcp::model::ReadResourceRequestParams::new(
            "reports://daily",
        ))
        .await
        .unwrap();
    assert!(serde_json::to_string(&r).unwrap().contains("daily report"));
    assert_eq!(s.balance().await.0, before - 5 - 300 - 10);
    assert_eq!(s.chains("wallet"), 4, "one audit chain per payment");
    client.cancel().await.unwrap();

    // A wallet whose mandate does not allow the shop: the model reads why, nothing moves.
    let client = ().serve(child(&s.command("stranger"))).await.unwrap();
    let r = client
        .call_tool(call("search", json!({"query": "rust"})))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(true));
    let text = &r.content[0].as_text().unwrap().text;
    assert!(text.starts_with("not allowed by your mandate: "), "{text}");
    assert_eq!(s.balance().await.0, before - 5 - 300 - 10);
    client.cancel().await.unwrap();
}

/// The independent clients' harness (`scripts/mcp-clients`), by language.
fn harness(lang: &str) -> Option<(String, Vec<String>)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/mcp-clients");
    match lang {
        "typescript" => {
            let script = root.join("client.mjs");
            let sdk = root.join("node_modules/@modelcontextprotocol/sdk");
            (script.exists() && sdk.exists())
                .then(|| ("node".to_owned(), vec![script.display().to_string()]))
        }
        _ => {
            let venv = std::env::var("MCP_CLIENTS_VENV")
                .unwrap_or_else(|_| "/var/tmp/mcp-clients-venv".into());
            let python = Path::new(&venv).join("bin/python");
            let script = root.join("client.py");
            (script.exists() && python.exists()).then(|| {
                (
                    python.display().to_string(),
                    vec![script.display().to_string()],
                )
            })
        }
    }
}

/// Runs one independent client against `command` with `steps`: its JSON report, or `None`
/// (with a visible message) where the harness is not installed — a failure in CI.
async fn drive(lang: &str, command: &[String], steps: &Value, elicit: &str) -> Option<Value> {
    drive_with(lang, command, steps, elicit, &[]).await
}

/// [`drive`] with `env` set for the client and the command it starts.
async fn drive_with(
    lang: &str,
    command: &[String],
    steps: &Value,
    elicit: &str,
    env: &[(&str, &str)],
) -> Option<Value> {
    let Some((program, mut args)) = harness(lang) else {
        let why = format!(
            "the {lang} MCP client is not installed: run scripts/mcp-clients/install.sh (scripts/setup-localnets does)"
        );
        assert!(std::env::var("CI").is_err(), "{why}");
        eprintln!("SKIPPED: {why}");
        return None;
    };
    args.push("--stdio".into());
    args.extend(command.iter().cloned());
    let out = tokio::process::Command::new(program)
        .args(&args)
        .env("MCP_STEPS", steps.to_string())
        .env("ELICIT", elicit)
        .envs(env.iter().copied())
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{lang} client failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}")))
}

async fn independent_client_pays_through_the_proxy(lang: &str) {
    let s = Setup::new().await;
    let (before, _) = s.balance().await;
    let steps = json!([
        {"op": "info"},
        {"op": "list_tools"},
        {"op": "call_tool", "name": "echo", "arguments": {"text": "hi"}},
        {"op": "call_tool", "name": "search", "arguments": {"query": "rust"}, "progress": true},
        {"op": "call_tool", "name": "render", "arguments": {"text": "page"}},
        {"op": "read_resource", "uri": "reports://daily"},
    ]);
    let Some(report) = drive(lang, &s.command("wallet"), &steps, "accept").await else {
        return;
    };
    let step = |i: usize| &report["steps"][i];
    assert_eq!(
        step(0)["result"]["capabilities"]["experimental"]["stipendex/payments"]["version"],
        "0.1",
        "{report}"
    );
    let tools = step(1)["result"].as_array().unwrap();
    let search = tools.iter().find(|t| t["name"] == "search").unwrap();
    assert_eq!(search["_meta"]["stipendex/pricing"]["estimate"], "0.05 USD");
    assert_eq!(step(2)["result"]["content"][0]["text"], "hi", "{report}");
    let paid = &step(3)["result"];
    assert_eq!(paid["structuredContent"]["query"], "rust", "{report}");
    assert_eq!(
        paid["_meta"]["stipendex/receipt"]["stipendex"],
        "receipt/0.1"
    );
    assert!(
        !step(3)["progress"].as_array().unwrap().is_empty(),
        "progress reached the host: {report}"
    );
    assert_ne!(step(4)["result"]["isError"], true, "{report}");
    assert_eq!(
        report["elicitations"].as_array().unwrap().len(),
        1,
        "{report}"
    );
    assert!(
        step(5)["result"]["contents"][0]["text"]
            .as_str()
            .unwrap()
            .contains("daily report"),
        "{report}"
    );
    assert_eq!(s.balance().await, (before - 5 - 300 - 10, 0));

    // Declined, and a host that cannot elicit: nothing paid, the model reads why.
    for (elicit, word) in [("decline", "declined"), ("none", "cannot ask its user")] {
        let steps = json!([{"op": "call_tool", "name": "render", "arguments": {"text": "x"}}]);
        let report = drive(lang, &s.command("wallet"), &steps, elicit)
            .await
            .unwrap();
        let r = &report["steps"][0]["result"];
        assert_eq!(r["isError"], true, "{report}");
        assert!(
            r["content"][0]["text"].as_str().unwrap().contains(word),
            "{report}"
        );
    }
    assert_eq!(s.balance().await, (before - 5 - 300 - 10, 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_sdk_host_pays_through_the_proxy() {
    independent_client_pays_through_the_proxy("typescript").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_host_pays_through_the_proxy() {
    independent_client_pays_through_the_proxy("python").await;
}

/// The algod devnet with a funded payer and the shop's treasury; the shop priced in ALGO over
/// exact-algo (a rail that cannot hold: no checkout), the board's x402 MCP endpoint beside it,
/// and a wallet paying both over the same rail.
struct AlgoSetup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    net: algod_devnet::RunningDevnet,
    treasury: rail_exact_algo::Address,
    payer_hex: String,
    board: String,
}

fn algo_addr(k: &ed25519_dalek::SigningKey) -> rail_exact_algo::Address {
    rail_exact_algo::Address(k.verifying_key().to_bytes())
}

impl AlgoSetup {
    async fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let payer = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
        let treasury = algo_addr(&ed25519_dalek::SigningKey::from_bytes(&rand::random::<
            [u8; 32],
        >()));
        let net = algod_devnet::Devnet::spawn(
            algod_devnet::DevnetConfig {
                accounts: vec![(algo_addr(&payer), 50_000_000), (treasury, 1_000_000)],
                ..algod_devnet::DevnetConfig::default()
            },
            std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        )
        .await
        .unwrap();
        // The board: x402's MCP convention (isError + accepts) on its own origin.
        let algod = rail_exact_algo::AlgodClient::new(&net.url, None).unwrap();
        let board_receiver = rail_exact_algo::ExactAlgoReceiver::connect(
            algod,
            treasury,
            Arc::new(rail_core::MemoryKeyStore::default()),
            Arc::new(rail_core::SystemClock),
        )
        .await
        .unwrap();
        let app = algod_devnet::example::example_app(&board_receiver, 2_000);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let board = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

        let shop_key = SecretKey::generate();
        std::fs::write(dir.join("shop.key"), shop_key.to_hex().as_str()).unwrap();
        std::fs::write(
            dir.join("shop.toml"),
            format!(
                r#"[store]
url = "sqlite://{store}"

[rails.chain]
kind = "exact-algo"
algod_url = "{algod}"
pay_to = "{treasury}"

[receiver]
id = "shop"
key_file = "shop.key"
origins = ["{SHOP}"]

[[price]]
kind = "tool"
pattern = "search"
amount = "0.002"
asset = "ALGO"
description = "one web search"

[[price]]
kind = "resource"
pattern = "reports://*"
amount = "0.001"
asset = "ALGO"
"#,
                store = dir.join("shop.db").display(),
                algod = net.url,
            ),
        )
        .unwrap();
        let (principal, wallet_key) = common::wallet_keys(&dir);
        let mut m = common::draft(&principal, &wallet_key);
        m.limits
            .push(common::limits_in(Asset::algo(), "0.01", Some("1")));
        m.allow.push(common::allow_shop(&shop_key, SHOP));
        m.allow.push(Allow::X402Mcp {
            server: board.clone(),
            pay_to: treasury.to_string(),
        });
        common::sign_to(&dir, "wallet.jws", m, &principal);
        std::fs::write(
            dir.join("wallet.toml"),
            common::wallet_toml(
                "wallet.jws",
                &principal,
                "journal = \"chains-wallet\"\n",
                &format!("sqlite://{}", dir.join("wallet.db").display()),
                &format!(
                    "[rails.chain]\nkind = \"exact-algo\"\nalgod_url = \"{}\"\npayer_key_env = \"ALGO_PAYER_KEY\"\nmax_amount = \"0.01\"\n",
                    net.url,
                ),
            ),
        )
        .unwrap();
        AlgoSetup {
            _tmp: tmp,
            dir,
            net,
            treasury,
            payer_hex: hex::encode(payer.to_bytes()),
            board,
        }
    }

    fn proxy(&self) -> Vec<String> {
        let bin = env!("CARGO_BIN_EXE_stipendex").to_owned();
        vec![
            bin,
            "proxy".into(),
            "--config".into(),
            self.dir.join("wallet.toml").display().to_string(),
        ]
    }

    fn to_shop(&self) -> Vec<String> {
        let bin = env!("CARGO_BIN_EXE_stipendex").to_owned();
        let mut c = self.proxy();
        c.extend([
            "--server".into(),
            SHOP.into(),
            "--".into(),
            bin,
            "serve-mcp".into(),
            "--config".into(),
            self.dir.join("shop.toml").display().to_string(),
        ]);
        c
    }

    fn to_board(&self) -> Vec<String> {
        let mut c = self.proxy();
        c.extend(["--url".into(), format!("{}/mcp", self.board)]);
        c
    }
}

async fn independent_client_pays_on_chain(lang: &str) {
    let s = AlgoSetup::new().await;
    let env = [("ALGO_PAYER_KEY", s.payer_hex.as_str())];
    let before = s.net.devnet.balance(&s.treasury);

    // The example server, a Stipendex Quote paid over exact-algo.
    let steps = json!([
        {"op": "call_tool", "name": "search", "arguments": {"query": "algorand"}},
        {"op": "read_resource", "uri": "reports://daily"},
    ]);
    let Some(report) = drive_with(lang, &s.to_shop(), &steps, "none", &env).await else {
        return;
    };
    let paid = &report["steps"][0]["result"];
    assert_eq!(paid["structuredContent"]["query"], "algorand", "{report}");
    assert_eq!(
        paid["_meta"]["stipendex/receipt"]["stipendex"],
        "receipt/0.1"
    );
    assert!(
        report["steps"][1]["result"]["contents"][0]["text"]
            .as_str()
            .unwrap()
            .contains("daily report"),
        "{report}"
    );
    assert_eq!(s.net.devnet.balance(&s.treasury), before + 2_000 + 1_000);

    // The board's MCP endpoint: x402's convention (isError + accepts), paid by the proxy as an
    // x402 challenge allowlisted by the board's identity and payTo.
    let steps = json!([
        {"op": "call_tool", "name": "board_index", "arguments": {}},
        {"op": "call_tool", "name": "post_read", "arguments": {"post_id": "1"}},
    ]);
    let report = drive_with(lang, &s.to_board(), &steps, "none", &env)
        .await
        .unwrap();
    assert_ne!(report["steps"][0]["result"]["isError"], true, "{report}");
    let post = &report["steps"][1]["result"];
    assert_ne!(post["isError"], true, "{report}");
    assert!(
        post["structuredContent"]["post"]["body"].is_string(),
        "{report}"
    );
    assert!(
        post["_meta"]["x402/payment-response"].is_object(),
        "{report}"
    );
    assert_eq!(s.net.devnet.balance(&s.treasury), before + 3_000 + 2_000);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_sdk_host_pays_over_exact_algo_through_the_proxy() {
    independent_client_pays_on_chain("typescript").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_host_pays_over_exact_algo_through_the_proxy() {
    independent_client_pays_on_chain("python").await;
}

/// Issue 45, through the proxy: an honest shop over Streamable HTTP whose work is away right
/// after the wallet paid (its guard answers the paid retry "retryable", as a shop whose link to
/// its facilitator dropped) until the proxy gives up; the host — which knows nothing of
/// payments and cannot send "the same payment again" — repeats the call. The proxy presents the
/// Proof it kept: served once, paid once. A call after that pays its own Quote.
#[tokio::test(flavor = "multi_thread")]
async fn over_the_proxy_a_call_repeated_after_its_answer_was_lost_is_not_paid_again() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use rmcp::model::{
        CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, PaginatedRequestParams,
        ServerCapabilities, ServerConfig, Tool,
    };
    use rmcp::service::RoleServer;
    use stipendex::receiver::{PricedCapability, Receiver};

    /// The work behind the gate, away or not (`stipendex::receiver::Ready`).
    #[derive(Default)]
    struct Away(AtomicBool);

    #[async_trait::async_trait]
    impl stipendex::receiver::Ready for Away {
        async fn ready(&self) -> Result<(), String> {
            if self.0.load(Ordering::SeqCst) {
                Err("the search index is unreachable".into())
            } else {
                Ok(())
            }
        }
    }

    /// One paid tool; each run counted.
    #[derive(Clone, Default)]
    struct Shop {
        runs: Arc<AtomicUsize>,
    }

    impl rmcp::ServerHandler for Shop {
        fn get_info(&self) -> ServerConfig {
            ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
        }

        async fn list_tools(
            &self,
            _r: Option<PaginatedRequestParams>,
            _c: RequestContext<RoleServer>,
        ) -> Result<ListToolsResult, ErrorData> {
            let schema = json!({"type": "object", "properties": {"query": {"type": "string"}}});
            Ok(ListToolsResult::with_all_items(vec![Tool::new(
                "search",
                "one web search",
                Arc::new(schema.as_object().cloned().unwrap()),
            )]))
        }

        async fn call_tool(
            &self,
            request: CallToolRequestParams,
            _c: RequestContext<RoleServer>,
        ) -> Result<CallToolResponse, ErrorData> {
            self.runs.fetch_add(1, Ordering::SeqCst);
            let query = request
                .arguments
                .as_ref()
                .and_then(|a| a.get("query"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            Ok(CallToolResult::success(vec![ContentBlock::text(format!("found: {query}"))]).into())
        }
    }

    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let (ledger, ledger_url, agent, shop_account) = common::funded_ledger(dir, 10_000).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());

    // The shop, in this process, served over Streamable HTTP at BASE/mcp.
    let rails = stipendex::Registry::from_toml(
        &common::payee_rails(&dir.join("shop.db"), &ledger_url, shop_account),
        &stipendex::ProcessEnv,
    )
    .await
    .unwrap();
    let shop_key = SecretKey::generate();
    let away = Arc::new(Away::default());
    let receiver = Receiver::builder("shop", shop_key.clone())
        .origin(&base)
        .registry(&rails)
        .price(PricedCapability::fixed(
            "tools/call",
            "search",
            stipendex::Money::parse(Asset::usd(), "2.00").unwrap(),
        ))
        .ready(away.clone())
        .build()
        .unwrap();
    let shop = Shop::default();
    let server = stipendex::mcp::PaidServer::new(shop.clone(), receiver).unwrap();
    let app = stipendex::mcp::streamable_http("/mcp", move || Ok(server.clone()));
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap();
    });

    // The wallet: the principal's mandate pins the shop at its origin.
    common::write_wallet(
        dir,
        common::limits("5.00", "20.00"),
        vec![common::allow_shop(&shop_key, &base)],
        "",
        "sqlite://wallet.db",
        &common::payer_rail(&ledger_url, agent),
    );
    let paid = || async {
        let a = ledger.account(agent).await.unwrap().unwrap();
        (a.debits_posted, a.debits_pending)
    };
    let chains = || common::count_jws(&dir.join("chains"));
    let before = paid().await.0;

    // A plain host starts the proxy, which talks to the shop at its URL.
    let bin = env!("CARGO_BIN_EXE_stipendex").to_owned();
    let command = vec![
        bin,
        "proxy".into(),
        "--config".into(),
        dir.join("wallet.toml").display().to_string(),
        "--url".into(),
        format!("{base}/mcp"),
    ];
    let client = ().serve(child(&command)).await.unwrap();

    // The shop's work is away right after the wallet paid: every retry of the same Proof is
    // answered "retry" until the proxy gives up. The host gets no result; one payment was made.
    away.0.store(true, Ordering::SeqCst);
    let started = std::time::Instant::now();
    match client
        .call_tool(call("search", json!({"query": "lost"})))
        .await
    {
        Ok(r) => assert_eq!(r.is_error, Some(true), "answered while away: {r:?}"),
        Err(e) => assert!(e.to_string().contains("unavailable"), "{e}"),
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the proxy gave up in {:?}",
        started.elapsed()
    );
    assert_eq!(paid().await, (before + 200, 0), "paid once");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 0, "the work never ran");
    assert_eq!(chains(), 1);

    // The host repeats the call: the kept Proof is presented, the fresh Quote is not paid.
    away.0.store(false, Ordering::SeqCst);
    let r = client
        .call_tool(call("search", json!({"query": "lost"})))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(r.content[0].as_text().unwrap().text, "found: lost");
    assert_eq!(
        r.meta.as_ref().unwrap().0["stipendex/receipt"]["stipendex"],
        "receipt/0.1"
    );
    assert_eq!(paid().await, (before + 200, 0), "still paid once");
    assert_eq!(shop.runs.load(Ordering::SeqCst), 1, "served once");
    assert_eq!(chains(), 1, "no second payment's chain");

    // Answered now, the Proof is spent: the same call asked again is a new call, paid anew.
    let r = client
        .call_tool(call("search", json!({"query": "lost"})))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert_eq!(paid().await, (before + 400, 0));
    assert_eq!(shop.runs.load(Ordering::SeqCst), 2);
    assert_eq!(chains(), 2);
    client.cancel().await.unwrap();
}
