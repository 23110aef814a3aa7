//! Free and paid calls per second through one relay, this crate's server and client beside the
//! ContextVM TypeScript SDK 0.11.14's (`scripts/contextvm`, when installed), on nwc-devnet in
//! process (the relay and the Lightning wallets), on this machine.
//!
//! ```text
//! cargo run --release -p stipendex-contextvm --example bench -- [SECONDS] [CONCURRENCY]
//! ```
//! Prints one markdown table: calls/s, p50 and p99 latency, errors, for each client → server
//! pair and each call (a free `echo`, a `search` paid 10 sats by Lightning, CEP-8 transparent;
//! and a `search` paid 0.01 USD by the `stipendex` method over the embedded ledger).
// Latencies and rates are timings, not money: floats are fine here.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    clippy::float_arithmetic,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss,
    clippy::indexing_slicing
)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lightning_invoice::Currency;
use nostr::Keys;
use nwc_devnet::{Devnet, DevnetConfig, WalletSpec};
use rail_core::{Asset, MemoryKeyStore, Money, ReceiverHandle, SystemClock};
use rail_ln_nwc::client::{ClientOptions as NwcOptions, NwcClient};
use rail_ln_nwc::rail::{NwcPayer, NwcReceiver};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    ServerCapabilities, ServerConfig,
};
use rmcp::service::{RequestContext, RoleClient, RoleServer, RunningService};
use rmcp::{ServerHandler, ServiceExt};
use serde_json::Value;
use stipendex::envelope::SecretKey;
use stipendex::receiver::{PricedCapability, Receiver};
use stipendex_contextvm::payments::{LightningHandler, NwcProcessor, ServerPayments};
use stipendex_contextvm::transport::client::{ClientOptions, ClientTransport};
use stipendex_contextvm::transport::server::{Server, ServerOptions};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Clone)]
struct Shop;

impl ServerHandler for Shop {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        r: CallToolRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text(format!("{}: q", r.name))]).into())
    }
}

fn sats(n: u128) -> Res<Money> {
    Ok(Money::from_minor(Asset::btc(), n * 1000)?)
}

/// One row: calls, errors, per second, p50, p99 (ms).
struct Row {
    client: &'static str,
    server: &'static str,
    call: &'static str,
    calls: u64,
    errors: u64,
    per_sec: f64,
    p50: f64,
    p99: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted.get(i).copied().unwrap_or(f64::NAN)
}

/// `concurrency` calls of `tool` in flight on one rmcp client for `seconds`.
async fn drive(
    client: Arc<RunningService<RoleClient, ()>>,
    tool: &str,
    seconds: u64,
    concurrency: usize,
) -> (u64, u64, f64, Vec<f64>) {
    let end = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (client, tool) = (client.clone(), tool.to_owned());
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut errors) = (Vec::new(), 0u64);
            while Instant::now() < end {
                let mut p = CallToolRequestParams::new(tool.clone());
                p.arguments = serde_json::json!({"q": "q"}).as_object().cloned();
                let t = Instant::now();
                match tokio::time::timeout(Duration::from_secs(30), client.call_tool(p)).await {
                    Ok(Ok(_)) => lat.push(t.elapsed().as_secs_f64() * 1000.0),
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let (mut lat, mut errors) = (Vec::new(), 0);
    for t in tasks {
        if let Ok((l, e)) = t.await {
            lat.extend(l);
            errors += e;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    lat.sort_by(f64::total_cmp);
    (lat.len() as u64, errors, elapsed, lat)
}

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/contextvm")
}

fn sdk_installed() -> bool {
    Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
        && scripts()
            .join("node_modules/@contextvm/sdk/package.json")
            .is_file()
}

struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The SDK's server on `relay`, paid into `nwc`: its key and the process.
fn sdk_server(relay: &str, nwc: &str) -> Res<(String, Kill)> {
    let mut child = Command::new("node")
        .arg(scripts().join("server.mjs"))
        .args(["--relay", relay, "--nwc", nwc])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let kill = Kill(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let v: Value = serde_json::from_str(&line)?;
    let pk = v["pubkey"].as_str().ok_or("no pubkey line")?.to_owned();
    Ok((pk, kill))
}

/// The SDK's client benchmark (`client.mjs --bench`) against `server`.
fn sdk_bench(relay: &str, server: &str, nwc: &str, tool: &str, s: u64, c: usize) -> Res<Value> {
    let out = Command::new("node")
        .arg(scripts().join("client.mjs"))
        .args([
            "--relay", relay, "--server", server, "--nwc", nwc, "--tool", tool,
        ])
        .args(["--args", r#"{"q":"q"}"#, "--bench", &s.to_string()])
        .args(["--concurrency", &c.to_string()])
        .env("CVM_TIMEOUT_MS", "30000")
        .stderr(Stdio::inherit())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let last = text.lines().last().ok_or("no output")?;
    Ok(serde_json::from_str(last)?)
}

fn sdk_row(client: &'static str, server: &'static str, call: &'static str, v: &Value) -> Row {
    Row {
        client,
        server,
        call,
        calls: v["calls"].as_u64().unwrap_or(0),
        errors: v["errors"].as_u64().unwrap_or(0),
        per_sec: v["per_sec"].as_f64().unwrap_or(f64::NAN),
        p50: v["p50_ms"].as_f64().unwrap_or(f64::NAN),
        p99: v["p99_ms"].as_f64().unwrap_or(f64::NAN),
    }
}

/// The `stipendex` payment method over the embedded ledger (SQLite, durable commits): a Quote, a
/// Proof, a Receipt per paid call, this crate's client and server.
async fn stipendex_method(relay: &str, seconds: u64, concurrency: usize) -> Res<Row> {
    use stipendex::envelope::{Allow, Limits, Mandate, Party, Signed};
    use stipendex::ledger::{AccountId, Ledger, NewAccount, TransferId, TransferRequest};
    use stipendex_contextvm::payments::{StipendexHandler, StipendexProcessor};

    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}/ledger.db", dir.path().display());
    let ledger = Ledger::sqlite(&url).await?;
    let (bank, agent, shop) = (
        AccountId::random(),
        AccountId::random(),
        AccountId::random(),
    );
    for (id, no_overdraft) in [(bank, false), (agent, true), (shop, true)] {
        ledger
            .create_account(NewAccount {
                id,
                asset: Asset::usd(),
                no_overdraft,
            })
            .await?;
    }
    ledger
        .transfer(TransferRequest::Single {
            id: TransferId::random(),
            debit: bank,
            credit: agent,
            amount: 1_000_000_000,
            user_data: 0,
        })
        .await?;
    let config = format!(
        "[store]\nurl = \"memory\"\n[rails.house]\nkind = \"ledger\"\nurl = \"{url}\"\nasset = \"USD\"\npayer_account = \"{agent}\"\npayee_account = \"{shop}\"\n"
    );
    let registry = stipendex::Registry::from_toml(
        &config,
        &std::collections::BTreeMap::<String, String>::new(),
    )
    .await?;
    let receiver_key = SecretKey::generate();
    let receiver = Receiver::builder("shop", receiver_key.clone())
        .registry(&registry)
        .price(PricedCapability::fixed(
            "tools/call",
            "search",
            Money::parse(Asset::usd(), "0.01")?,
        ))
        .build()?;
    let keys = Keys::generate();
    let payments = ServerPayments::new(
        receiver.clone(),
        vec![Arc::new(StipendexProcessor::new(
            receiver,
            keys.public_key(),
        ))],
    )?
    .max_pending(100_000)
    .max_pending_per_client(100_000)
    .payment_requests_per_client(u32::MAX, Duration::from_secs(1))
    .payment_requests(u32::MAX, Duration::from_secs(1));
    let server = Server::start(
        keys.clone(),
        ServerOptions::new(vec![relay.to_owned()]),
        || Shop,
        Some(Arc::new(payments)),
    )
    .await?;
    let principal = SecretKey::generate();
    let wallet_key = SecretKey::generate();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let mut m = Mandate::draft(
        Party {
            id: "principal".into(),
            key: principal.public(),
        },
        wallet_key.public(),
        now,
        86_400,
    );
    m.limits.push(Limits {
        asset: Asset::usd(),
        per_call: Some("1.00".parse()?),
        per_period: None,
        total: None,
        per_receiver: None,
        confirm_above: None,
        tab_cap: None,
        open_tabs: None,
    });
    m.allow.push(Allow::Receiver {
        id: "shop".into(),
        key: receiver_key.public(),
        origins: vec![format!("nostr:{}", keys.public_key().to_hex())],
    });
    let wallet = stipendex::wallet::Wallet::builder(wallet_key, Signed::sign(m, &principal)?)
        .registry(&registry)
        .build()?;
    let t = ClientTransport::connect(
        Keys::generate(),
        ClientOptions::new(vec![relay.to_owned()], keys.public_key()),
        Some(Arc::new(StipendexHandler::new(wallet))),
    )
    .await?;
    let client = Arc::new(().serve(t).await?);
    let (calls, errors, secs, lat) = drive(client, "search", seconds, concurrency).await;
    server.shutdown().await;
    Ok(Row {
        client: "stipendex-contextvm",
        server: "stipendex-contextvm",
        call: "paid (stipendex, ledger)",
        calls,
        errors,
        per_sec: calls as f64 / secs,
        p50: percentile(&lat, 0.5),
        p99: percentile(&lat, 0.99),
    })
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let mut args = std::env::args().skip(1);
    let seconds: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(5);
    let concurrency: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);

    let devnet = Devnet::start(DevnetConfig::default()).await?;
    let relay = devnet.relay_url().to_owned();
    let shop = devnet.create_wallet(WalletSpec::new("shop", 0)).await?;
    let sdk_shop = devnet.create_wallet(WalletSpec::new("sdk-shop", 0)).await?;
    let agent = devnet
        .create_wallet(WalletSpec::new("agent", 100_000_000_000))
        .await?;
    let sdk_agent = devnet
        .create_wallet(WalletSpec::new("sdk-agent", 100_000_000_000))
        .await?;

    let shop_nwc = Arc::new(NwcClient::connect(&shop.uri, NwcOptions::default()).await?);
    let ln = NwcReceiver::new(
        shop_nwc.clone(),
        rand::random(),
        Arc::new(MemoryKeyStore::default()),
        Arc::new(SystemClock),
    )
    .await?;
    let receiver = Receiver::builder("shop", SecretKey::generate())
        .rail("ln-nwc", ReceiverHandle::with_holds(ln.clone()))
        .price(PricedCapability::fixed("tools/call", "search", sats(10)?))
        .build()?;
    let payments = ServerPayments::new(receiver, vec![Arc::new(NwcProcessor::new(ln, shop_nwc))])?
        .max_pending(100_000)
        .max_pending_per_client(100_000)
        .payment_requests_per_client(u32::MAX, Duration::from_secs(1))
        .payment_requests(u32::MAX, Duration::from_secs(1));
    let server = Server::start(
        Keys::generate(),
        ServerOptions::new(vec![relay.clone()]),
        || Shop,
        Some(Arc::new(payments)),
    )
    .await?;

    let connect = |server_pk: nostr::PublicKey| {
        let (relay, uri) = (relay.clone(), agent.uri.clone());
        async move {
            let nwc = Arc::new(NwcClient::connect(&uri, NwcOptions::default()).await?);
            let payer = NwcPayer::new(nwc, Currency::Regtest, sats(1000)?, Arc::new(SystemClock));
            let t = ClientTransport::connect(
                Keys::generate(),
                ClientOptions::new(vec![relay], server_pk),
                Some(Arc::new(LightningHandler::new(Arc::new(payer)))),
            )
            .await?;
            Res::Ok(Arc::new(().serve(t).await?))
        }
    };

    let mut rows = Vec::new();
    let ours = connect(server.public_key()).await?;
    for (call, tool) in [("free", "echo"), ("paid", "search")] {
        let (calls, errors, secs, lat) = drive(ours.clone(), tool, seconds, concurrency).await;
        rows.push(Row {
            client: "stipendex-contextvm",
            server: "stipendex-contextvm",
            call,
            calls,
            errors,
            per_sec: calls as f64 / secs,
            p50: percentile(&lat, 0.5),
            p99: percentile(&lat, 0.99),
        });
    }

    rows.push(stipendex_method(&relay, seconds, concurrency).await?);

    if sdk_installed() {
        let (sdk_pk, _sdk) = {
            let (r, n) = (relay.clone(), sdk_shop.uri.to_string());
            tokio::task::spawn_blocking(move || sdk_server(&r, &n))
                .await?
                .map_err(|e| e.to_string())?
        };
        let ours_to_sdk = connect(nostr::PublicKey::from_hex(&sdk_pk)?).await?;
        for (call, tool) in [("free", "echo"), ("paid", "search")] {
            let (calls, errors, secs, lat) =
                drive(ours_to_sdk.clone(), tool, seconds, concurrency).await;
            rows.push(Row {
                client: "stipendex-contextvm",
                server: "SDK 0.11.14",
                call,
                calls,
                errors,
                per_sec: calls as f64 / secs,
                p50: percentile(&lat, 0.5),
                p99: percentile(&lat, 0.99),
            });
        }
        for (server_name, pk) in [
            ("SDK 0.11.14", sdk_pk.clone()),
            ("stipendex-contextvm", server.public_key().to_hex()),
        ] {
            for (call, tool) in [("free", "echo"), ("paid", "search")] {
                let (r, p, n, t) = (
                    relay.clone(),
                    pk.clone(),
                    sdk_agent.uri.to_string(),
                    tool.to_owned(),
                );
                let v = tokio::task::spawn_blocking(move || {
                    sdk_bench(&r, &p, &n, &t, seconds, concurrency).map_err(|e| e.to_string())
                })
                .await??;
                rows.push(sdk_row("SDK 0.11.14", server_name, call, &v));
            }
        }
    } else {
        eprintln!("the SDK is not installed (scripts/contextvm/install.sh): our rows only");
    }

    println!(
        "{seconds} s per row, {concurrency} calls in flight, one relay (nwc-devnet in process)\n"
    );
    println!("| client | server | call | calls/s | p50 ms | p99 ms | calls | errors |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {} | {} |",
            r.client, r.server, r.call, r.per_sec, r.p50, r.p99, r.calls, r.errors
        );
    }
    server.shutdown().await;
    Ok(())
}
