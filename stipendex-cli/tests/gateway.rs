//! `stipendex gateway` end to end, as a process, in front of a small HTTP service that knows
//! nothing of payments (a test server here), paid by the Stipendex wallet's client
//! (`stipendex fetch`) over the `ledger` rail on SQLite: free routes pass untouched, priced ones
//! answer 402 until paid and are forwarded once; the attacks of the wallet issues replayed
//! against the gateway; the faults of the upstream; the configuration's refusals.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::needless_pass_by_value,
    missing_docs
)]

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path as UrlPath, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use rail_ledger::{AccountId, Ledger};
use serde_json::{Value, json};
use stipendex::Asset;
use stipendex::envelope::{Limits, Mandate, SecretKey, Signed};
use stipendex_test_kit as kit;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// What the upstream saw: each request's method, path and query, and headers.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(String, String, HeaderMap)>>>);

impl Seen {
    fn count(&self, path: &str) -> usize {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, p, _)| p.split('?').next() == Some(path))
            .count()
    }
    fn last(&self, path: &str) -> HeaderMap {
        self.0
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|(_, p, _)| p.split('?').next() == Some(path))
            .map(|(_, _, h)| h.clone())
            .expect("the upstream saw the request")
    }
}

async fn record(State(seen): State<Seen>, req: Request, next: axum::middleware::Next) -> Response {
    let pq = req
        .uri()
        .path_and_query()
        .map(ToString::to_string)
        .unwrap_or_default();
    seen.0
        .lock()
        .unwrap()
        .push((req.method().to_string(), pq, req.headers().clone()));
    next.run(req).await
}

/// The service behind the gateway: it knows nothing of payments.
async fn upstream() -> (String, Seen, tokio::task::JoinHandle<()>) {
    upstream_at("127.0.0.1:0", Seen::default()).await
}

/// The service at `addr` (again, after it went down).
async fn upstream_at(addr: &str, seen: Seen) -> (String, Seen, tokio::task::JoinHandle<()>) {
    let app = Router::new()
        .route("/free", get(|| async { "free for all" }))
        .route(
            "/api/forecast/{city}",
            get(|UrlPath(city): UrlPath<String>| async move {
                axum::Json(json!({"city": city, "forecast": "sunny"}))
            }),
        )
        .route(
            "/api/order",
            post(|body: String| async move {
                // A checkout: the service names what the work cost.
                (
                    [("x-stipendex-final-amount", "3.20")],
                    format!("ordered {body}"),
                )
            }),
        )
        .route(
            "/api/broken",
            get(|| async { (StatusCode::INTERNAL_SERVER_ERROR, "the service failed") }),
        )
        .route(
            "/api/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(5)).await;
                "too late"
            }),
        )
        .route(
            "/api/slowish/{n}",
            get(|UrlPath(n): UrlPath<u32>| async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                format!("result {n}")
            }),
        )
        .route(
            "/api/upload",
            post(|body: axum::body::Bytes| async move { format!("{} bytes", body.len()) }),
        )
        .route(
            "/events",
            get(|| async {
                let stream = futures::stream::iter(0..3).then(|i| async move {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    Ok::<_, std::convert::Infallible>(format!("data: tick {i}\n\n"))
                });
                (
                    [("content-type", "text/event-stream")],
                    axum::body::Body::from_stream(stream),
                )
            }),
        )
        .layer(axum::middleware::from_fn_with_state(seen.clone(), record));
    let (base, task) = serve_at(addr, app).await;
    (base, seen, task)
}

/// Serves `app` at `addr` (port 0: any free one): its base URL and its task.
async fn serve_at(addr: &str, app: Router) -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, task)
}

/// Serves `app` on a free port on loopback: its base URL.
async fn serve(app: Router) -> String {
    serve_at("127.0.0.1:0", app).await.0
}

use futures::StreamExt as _;

/// A free port on loopback (the gateway's origin must be known before it starts).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A fresh key, written as hex to `path`.
fn key_file(path: &Path) -> SecretKey {
    let key = SecretKey::generate();
    std::fs::write(path, key.to_hex().as_str()).unwrap();
    key
}

/// The posted balance of `account` in `ledger`, in cents.
async fn posted(ledger: &Ledger, account: AccountId) -> i128 {
    ledger
        .account(account)
        .await
        .unwrap()
        .unwrap()
        .posted_balance()
}

/// The shop's side: a ledger with a funded agent, the gateway's and the wallet's files.
struct Setup {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    ledger: Ledger,
    agent: AccountId,
    shop: AccountId,
    origin: String,
    port: u16,
    /// Where operations (`/healthz`, `/readyz`, `/metrics`) are served: `[gateway] ops_listen`.
    ops: String,
}

const SECRET: &str = "s3cret-only-the-gateway-knows";

/// A mandate for `wallet` signed by a fresh principal: `limits` as (asset, per call, total,
/// confirm above) and `receiver` (its key pinned) allowed at `origin`.
fn mandate(
    wallet: &SecretKey,
    receiver: &str,
    receiver_key: &SecretKey,
    origin: &str,
    limits: &[(Asset, &str, &str, Option<&str>)],
) -> Signed<Mandate> {
    let principal = SecretKey::generate();
    let mut m = kit::mandate(&principal, wallet.public()).from(kit::now() - 60);
    for (asset, per_call, total, confirm_above) in limits {
        m = m.limits(Limits {
            confirm_above: confirm_above.map(kit::amount),
            // Tabs up to 1.00 (the gateway offers them only where `[receiver.tabs]` is set).
            tab_cap: Some(kit::amount("1.00")),
            open_tabs: Some(2),
            ..kit::limits(asset.clone(), *per_call, *total)
        });
    }
    m.allow(kit::receiver(
        receiver,
        receiver_key.public(),
        vec![origin.into()],
    ))
    .sign()
}

/// The HTTP upstream's prices.
const HTTP_PRICES: &str = r#"[[price]]
kind = "route"
method = "GET"
pattern = "/api/slowish/{n}"
amount = "0.05"
asset = "USD"

[[price]]
kind = "route"
method = "GET"
pattern = "/api/forecast/{city}"
amount = "0.05"
asset = "USD"
description = "one forecast"

[[price]]
kind = "route"
method = "POST"
pattern = "/api/order"
estimate = "3.00"
tolerance = "0.50"
asset = "USD"
description = "one order"

[[price]]
kind = "route"
method = "GET"
pattern = "/api/broken"
amount = "0.05"
asset = "USD"

[[price]]
kind = "route"
method = "POST"
pattern = "/api/slow"
estimate = "1.00"
tolerance = "0.50"
asset = "USD"

[[price]]
kind = "route"
method = "POST"
pattern = "/api/upload"
amount = "0.01"
asset = "USD"
"#;

impl Setup {
    /// In front of the HTTP service at `upstream`, `extra` in `[gateway]`.
    async fn new(upstream: &str, extra: &str) -> Self {
        Self::with(&format!("url = \"{upstream}\""), HTTP_PRICES, extra).await
    }

    /// `upstream` as the `[upstream]` lines, `prices` as the `[[price]]` entries.
    async fn with(upstream: &str, prices: &str, extra: &str) -> Self {
        Self::with_receiver(upstream, prices, extra, "").await
    }

    /// In front of the HTTP service at `upstream` priced by `prices`, `receiver_extra` after
    /// the `[receiver]` section.
    async fn priced(upstream: &str, prices: &str, receiver_extra: &str) -> Self {
        Self::with_receiver(&format!("url = \"{upstream}\""), prices, "", receiver_extra).await
    }

    /// As [`Setup::with`], `receiver_extra` after the `[receiver]` section (`[receiver.tabs]`).
    async fn with_receiver(
        upstream: &str,
        prices: &str,
        extra: &str,
        receiver_extra: &str,
    ) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let (ledger, ledger_url, agent, shop) = common::funded_ledger(&dir, 10_000).await;
        let port = free_port();
        let origin = format!("http://127.0.0.1:{port}");
        let ops_port = free_port();
        let ops = format!("http://127.0.0.1:{ops_port}");
        let shop_key = key_file(&dir.join("shop.key"));
        std::fs::write(
            dir.join("gateway.toml"),
            format!(
                r#"[store]
url = "sqlite://{store}"

[rails.house]
kind = "ledger"
url = "{ledger_url}"
payee_account = "{shop}"

[receiver]
id = "weather-co"
key_file = "shop.key"
origins = ["{origin}"]
{receiver_extra}

[gateway]
upstream_timeout_secs = 1
max_body_bytes = 4096
ops_listen = "127.0.0.1:{ops_port}"
{extra}

[upstream]
{upstream}
secret_header = "X-Gateway-Secret"
secret_env = "GATEWAY_TEST_SECRET"

{prices}"#,
                store = dir.join("gateway.db").display()
            ),
        )
        .unwrap();

        let wallet_key = key_file(&dir.join("wallet.key"));
        let m = mandate(
            &wallet_key,
            "weather-co",
            &shop_key,
            &origin,
            &[
                (Asset::usd(), "5.00", "50.00", Some("10.00")),
                (Asset::algo(), "0.01", "1", None),
                (Asset::usdc(), "0.01", "1.00", None),
            ],
        );
        std::fs::write(dir.join("wallet.jws"), m.jws()).unwrap();
        let principal = m.object().principal.key;
        std::fs::write(
            dir.join("wallet.toml"),
            format!(
                "[wallet]\nkey_file = \"wallet.key\"\nmandate = \"wallet.jws\"\nprincipal = \"{principal}\"\njournal = \"chains\"\nconfirm = \"terminal\"\n\n[store]\nurl = \"sqlite://{}\"\n\n[rails.house]\nkind = \"ledger\"\nurl = \"{ledger_url}\"\npayer_account = \"{agent}\"\n",
                dir.join("wallet.db").display()
            ),
        )
        .unwrap();
        Setup {
            _tmp: tmp,
            dir,
            ledger,
            agent,
            shop,
            origin,
            port,
            ops,
        }
    }

    /// Starts the gateway and waits for its "Listening on" line.
    async fn gateway(&self) -> Child {
        start_gateway(&self.dir.join("gateway.toml"), self.port).await
    }

    /// `stipendex fetch` with the wallet, its human answering yes to a confirmation:
    /// (exit success, stdout, stderr).
    async fn fetch(&self, args: &[&str]) -> (bool, String, String) {
        use tokio::io::AsyncWriteExt as _;
        let mut child = Command::new(env!("CARGO_BIN_EXE_stipendex"))
            .arg("fetch")
            .arg("--config")
            .arg(self.dir.join("wallet.toml"))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"y\n").await.unwrap();
        drop(stdin);
        let out = child.wait_with_output().await.unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// [`Setup::fetch`], which must succeed: (stdout, stderr).
    async fn fetch_ok(&self, args: &[&str]) -> (String, String) {
        let (ok, out, err) = self.fetch(args).await;
        assert!(ok, "{err}");
        (out, err)
    }

    /// `stipendex fetch url` with the wallet, `var` set in its environment and no human: its
    /// output.
    async fn fetch_with(&self, url: &str, var: &str, value: &str) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_stipendex"))
            .arg("fetch")
            .arg("--config")
            .arg(self.dir.join("wallet.toml"))
            .arg(url)
            .env(var, value)
            .stdin(Stdio::null())
            .output()
            .await
            .unwrap()
    }

    /// The agent's balance in cents, and what is held.
    async fn agent(&self) -> (i128, u64) {
        let a = self.ledger.account(self.agent).await.unwrap().unwrap();
        (a.posted_balance(), a.debits_pending)
    }

    async fn shop(&self) -> i128 {
        posted(&self.ledger, self.shop).await
    }

    /// The text of `file` in the setup's folder.
    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap()
    }

    /// Writes `text` to `file` in the setup's folder.
    fn write(&self, file: &str, text: &str) {
        std::fs::write(self.dir.join(file), text).unwrap();
    }

    /// Adds the gateway's rail `section` (a `[rails.…]` table) before its `[receiver]`.
    fn add_gateway_rail(&self, section: &str) {
        let config = self.read("gateway.toml");
        let receiver = format!("{section}\n[receiver]");
        self.write("gateway.toml", &config.replace("[receiver]", &receiver));
    }

    /// Adds the wallet's rail `section` (a `[rails.…]` table) at the end of `wallet.toml`.
    fn add_wallet_rail(&self, section: &str) {
        let toml = self.read("wallet.toml");
        self.write("wallet.toml", &format!("{toml}\n{section}"));
    }

    /// The wallet's key and mandate, from its files.
    fn wallet(&self) -> (SecretKey, Signed<Mandate>) {
        let key = SecretKey::from_hex(self.read("wallet.key").trim()).unwrap();
        let mandate = Signed::parse(self.read("wallet.jws").trim()).unwrap();
        (key, mandate)
    }

    /// A Quote for `method url`, paid with the wallet: the Proof's header.
    async fn paid_proof(&self, method: &str, url: &str) -> String {
        pay(self, &quote_of(method, url).await).await
    }

    /// `GET path` on the operations address.
    async fn ops_get(&self, path: &str) -> reqwest::Response {
        http_get(&format!("{}{path}", self.ops)).await
    }

    /// The gateway's metrics, from its operations address.
    async fn metrics(&self) -> String {
        self.ops_get("/metrics").await.text().await.unwrap()
    }
}

/// The test upstream, and a gateway in front of it (`extra` in `[gateway]`) started: the
/// setup, what the upstream saw, the upstream's task and the gateway.
async fn started(extra: &str) -> (Setup, Seen, tokio::task::JoinHandle<()>, Child) {
    let (up, seen, task) = upstream().await;
    let s = Setup::new(&up, extra).await;
    let gw = s.gateway().await;
    (s, seen, task, gw)
}

/// `stipendex gateway --config config --listen listen`, the upstream's secret in its
/// environment.
fn gateway_command(config: &Path, listen: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_stipendex"));
    cmd.arg("gateway")
        .arg("--config")
        .arg(config)
        .arg("--listen")
        .arg(listen)
        .env("GATEWAY_TEST_SECRET", SECRET);
    cmd
}

/// Runs the gateway on `config` to its exit (a refusal to start): whether it succeeded, and
/// its stderr.
async fn run_gateway(config: &Path, listen: &str) -> (bool, String) {
    let out = gateway_command(config, listen).output().await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.success(), err)
}

/// The lines of `err` that the CLI says as itself (`stipendex: …`).
fn said_by_cli(err: &str) -> Vec<&str> {
    err.lines()
        .filter(|l| l.starts_with("stipendex:"))
        .collect()
}

/// What follows "Listening on " in the first line of `lines` that says it, waiting at most
/// `secs`: `None` if the output ended first or the time ran out.
async fn listening(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    secs: u64,
) -> Option<String> {
    tokio::time::timeout(Duration::from_secs(secs), async {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(rest) = line.strip_prefix("Listening on ") {
                return Some(rest.trim().to_owned());
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
}

async fn start_gateway(config: &Path, port: u16) -> Child {
    start_gateway_logging(config, port, "info", None).await
}

/// [`start_gateway`] with `RUST_LOG=log`, its log lines kept in `kept` when given.
async fn start_gateway_logging(
    config: &Path,
    port: u16,
    log: &str,
    kept: Option<Arc<Mutex<Vec<String>>>>,
) -> Child {
    let mut child = gateway_command(config, &format!("127.0.0.1:{port}"))
        .env("RUST_LOG", log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    if listening(&mut lines, 30).await.is_none() {
        let out = child.wait_with_output().await.unwrap();
        panic!(
            "the gateway did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Its log (a line per request) is drained: a full pipe would stall the gateway.
    if let Some(mut err) = child.stderr.take() {
        match kept {
            None => {
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut err, &mut tokio::io::sink()).await;
                });
            }
            Some(kept) => {
                tokio::spawn(async move {
                    let mut lines = BufReader::new(err).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        kept.lock().unwrap().push(line);
                    }
                });
            }
        }
    }
    child
}

fn http() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `GET url`.
async fn http_get(url: &str) -> reqwest::Response {
    http().get(url).send().await.unwrap()
}

/// `GET url` paid with the Proof header `proof`.
async fn get_paid(url: &str, proof: &str) -> reqwest::Response {
    http()
        .get(url)
        .header("stipendex-payment", proof)
        .send()
        .await
        .unwrap()
}

/// The JSON body of `GET url`.
async fn get_json(url: &str) -> Value {
    http_get(url).await.json().await.unwrap()
}

/// The body of the answer to `method url`, which must be a 402.
async fn challenge(method: &str, url: &str) -> Value {
    let r = http()
        .request(method.parse().unwrap(), url)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402, "{method} {url}");
    r.json().await.unwrap()
}

/// `metrics` count two accepted payments over the `house` rail, and Quotes.
fn assert_two_payments_and_quotes(metrics: &str) {
    assert!(
        metrics.contains("stipendex_gateway_payments_total{rail=\"house\",outcome=\"accepted\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("stipendex_gateway_quotes_total"),
        "{metrics}"
    );
}

#[tokio::test]
async fn the_gateway_sells_an_unaware_api_to_the_stipendex_wallet() {
    let (s, seen, _task, _gw) = started("").await;
    let base = s.origin.clone();

    // A free route passes untouched, with the forwarding headers and the shared secret, and
    // without anything the client claimed about itself.
    let r = http()
        .get(format!("{base}/free?x=1"))
        .header("x-forwarded-for", "6.6.6.6")
        .header("x-gateway-secret", "guessed")
        .header("x-stipendex-final-amount", "0.01")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "free for all");
    let h = seen.last("/free");
    assert_eq!(h["x-forwarded-for"], "127.0.0.1");
    assert_eq!(h["x-gateway-secret"], SECRET);
    assert_eq!(h["x-forwarded-host"], format!("127.0.0.1:{}", s.port));
    assert!(!h.contains_key("x-stipendex-final-amount"));

    // A priced route answers 402 with a signed Quote; the upstream never sees it.
    let body = challenge("GET", &format!("{base}/api/forecast/paris")).await;
    assert!(body["quote"]["jws"].is_string(), "{body}");
    assert_eq!(seen.count("/api/forecast/paris"), 0);

    // The wallet's client pays it: forwarded once, answered with a Receipt.
    let before = s.agent().await;
    let (out, err) = s.fetch_ok(&[&format!("{base}/api/forecast/paris")]).await;
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!({"city": "paris", "forecast": "sunny"})
    );
    assert!(err.contains("paid"), "{err}");
    assert_eq!(seen.count("/api/forecast/paris"), 1);
    let h = seen.last("/api/forecast/paris");
    assert!(
        !h.contains_key("stipendex-payment"),
        "the payment reached the upstream"
    );
    assert_eq!(s.agent().await.0, before.0 - 5);
    assert_eq!(s.shop().await, 5);

    // A checkout: held at the Quote's maximum, captured for the upstream's final amount; the
    // final-amount header never reaches the client.
    let (out, _) = s
        .fetch_ok(&[
            "-X",
            "POST",
            "-d",
            "two pizzas",
            &format!("{base}/api/order"),
        ])
        .await;
    assert_eq!(out, "ordered two pizzas");
    assert_eq!(s.agent().await, (before.0 - 5 - 320, 0));
    assert_eq!(seen.count("/api/order"), 1);

    // Server-sent events on a free route stream through as they come.
    let started = std::time::Instant::now();
    let r = http_get(&format!("{base}/events")).await;
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let mut stream = r.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("tick 0"));
    assert!(
        started.elapsed() < Duration::from_millis(550),
        "the first event waited for the stream's end"
    );
    let mut rest = Vec::new();
    while let Some(c) = stream.next().await {
        rest.extend_from_slice(&c.unwrap());
    }
    assert!(String::from_utf8_lossy(&rest).contains("tick 2"));

    // Operations, on their own address.
    assert_eq!(s.ops_get("/healthz").await.status(), 200);
    let r = s.ops_get("/readyz").await;
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    let agent = get_json(&format!("{base}/.well-known/agent.json")).await;
    assert_eq!(agent["name"], "weather-co");
    assert_eq!(agent["endpoints"]["web"], base);
    assert_eq!(agent["payments"]["stipendex"]["rails"], json!(["ledger"]));
    let d = get_json(&format!("{base}/.well-known/stipendex.json")).await;
    assert_eq!(d["id"], "weather-co");
    let metrics = s.metrics().await;
    assert_two_payments_and_quotes(&metrics);
    assert!(
        metrics.contains("stipendex_gateway_upstream_seconds_count"),
        "{metrics}"
    );
}

/// One request as written on the wire (no client normalises its path).
async fn raw(base: &str, method: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let host = base.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(host).await.unwrap();
    s.write_all(
        format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.unwrap();
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// The quote of `method url` and the request it was for.
async fn quote_of(method: &str, url: &str) -> Value {
    challenge(method, url).await["quote"].clone()
}

/// Pays `quote` with the wallet of `s` (in process, on the same files): the Proof's header.
async fn pay(s: &Setup, quote: &Value) -> String {
    let registry = stipendex::Registry::from_file(s.dir.join("wallet.toml"))
        .await
        .unwrap();
    let (key, m) = s.wallet();
    let yes =
        stipendex::wallet::Callback::new(|_| stipendex::wallet::Answer::Yes { by: "test".into() });
    let mut b = stipendex::wallet::Wallet::builder(key, m)
        .registry(&registry)
        .confirmer(Arc::new(yes));
    if let Some(store) = registry.store() {
        b = b.store(store.clone());
    }
    let wallet = b.build().unwrap();
    let q: Signed<stipendex::envelope::Quote> = serde_json::from_value(quote.clone()).unwrap();
    let sent = q.object().resource.clone().unwrap();
    wallet.pay_for(&q, &sent).await.unwrap().proof.to_header()
}

/// The Python upstream `tests/upstreams/wsgi_upstream.py` (stdlib `wsgiref`: it routes on the
/// percent-decoded PATH_INFO, as every WSGI framework does; `--lenient` also as Express, ASP.NET
/// and Tomcat do by default), on a free port: its base URL, and the process (killed on drop).
async fn wsgi_upstream(lenient: bool) -> (String, Child) {
    wsgi_upstream_at(lenient, 0).await
}

/// As [`wsgi_upstream`], on `port` (0: any free one).
async fn wsgi_upstream_at(lenient: bool, port: u16) -> (String, Child) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstreams/wsgi_upstream.py");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg("--port").arg(port.to_string());
    if lenient {
        cmd.arg("--lenient");
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python3 runs the WSGI upstream");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the WSGI upstream starts")
        .unwrap()
        .unwrap();
    let port = line.strip_prefix("listening ").expect("listening PORT");
    (format!("http://127.0.0.1:{port}"), child)
}

/// Every way of spelling `/api/forecast/paris` that some server routes as that path (or that
/// could name another path to one): the gateway answers each 400 (refused before any decision)
/// or 402 (priced as the route), never the priced content unpaid.
const SPELLINGS: &[(&str, &str)] = &[
    ("GET", "/api/forecast/paris"),
    ("GET", "/api/forecast%2Fparis"),
    ("GET", "/api%2Fforecast%2Fparis"),
    ("GET", "/api%2fforecast/paris"),
    ("GET", "/API/forecast/paris"),
    ("GET", "/api/Forecast/paris"),
    ("GET", "/api/FORECAST/PARIS"),
    ("GET", "/api/forecast/paris/"),
    ("GET", "/API/Forecast/paris/"),
    ("GET", "/api/forecast/paris;x=1"),
    ("GET", "/api;v=2/forecast/paris"),
    ("GET", "/api/forecast;/paris"),
    ("GET", "/api/forecast/paris%3B"),
    ("GET", "/api%5Cforecast%5Cparis"),
    ("GET", "/api/forecast/paris%00"),
    ("GET", "/api/forecast/paris%0d%0a"),
    ("GET", "/api/forecast/%zz/../paris"),
    ("GET", "/api/forecast/paris%"),
    ("GET", "/api//forecast/paris"),
    ("GET", "/api/./forecast/paris"),
    ("GET", "/api/x/%2e%2e/forecast/paris"),
    ("GET", "/api/forecast/%252Fparis"),
    ("GET", "/api/forecast/%70aris"),
    ("get", "/api/forecast/paris"),
    ("Get", "/api/forecast/paris"),
    ("HEAD", "/API/forecast/paris/"),
];

/// The WSGI upstream's priced routes: a forecast, and n MiB of `x`.
const FORECAST: &str = "[[price]]\nkind = \"route\"\nmethod = \"GET\"\npattern = \"/api/forecast/{city}\"\namount = \"0.05\"\nasset = \"USD\"\n\n[[price]]\nkind = \"route\"\nmethod = \"GET\"\npattern = \"/api/big/{n}\"\namount = \"0.05\"\nasset = \"USD\"\n";

/// `[receiver.tabs]`: tabs of 1.00 USD.
const TABS: &str = "\n[receiver.tabs]\ncap = \"1.00\"\nasset = \"USD\"\nlanes = 4\n";

#[tokio::test]
async fn no_spelling_of_a_priced_path_is_served_unpaid_by_a_wsgi_or_a_lenient_upstream() {
    for lenient in [false, true] {
        let (up, _upstream) = wsgi_upstream(lenient).await;
        // The attack is real: the upstream itself serves these spellings as the priced route.
        for path in ["/api/forecast%2Fparis", "/api%2Fforecast%2Fparis"] {
            let (status, text) = raw(&up, "GET", path).await;
            assert_eq!(status, 200, "the upstream serves {path}: {text}");
            assert!(text.contains("PRICED CONTENT"));
        }
        if lenient {
            let (status, _) = raw(&up, "GET", "/API/forecast/paris/").await;
            assert_eq!(status, 200);
        }
        let s = Setup::priced(&up, FORECAST, "").await;
        let _gw = s.gateway().await;
        for (method, path) in SPELLINGS {
            let (status, text) = raw(&s.origin, method, path).await;
            assert!(
                status == 400 || status == 402,
                "{method} {path} (lenient upstream: {lenient}) answered {status}: {text}"
            );
            assert!(!text.contains("PRICED CONTENT"), "{method} {path}: {text}");
        }
        // What is free stays free, and the canonical path is sold.
        let (status, _) = raw(&s.origin, "GET", "/free").await;
        assert_eq!(status, 200);
        let (out, _) = s
            .fetch_ok(&[&format!("{}/api/forecast/paris", s.origin)])
            .await;
        assert!(out.contains("PRICED CONTENT"), "{out}");
        if lenient {
            // A lenient spelling is priced as its route: paid, and served.
            let (out, _) = s
                .fetch_ok(&[&format!("{}/Api/Forecast/paris/", s.origin)])
                .await;
            assert!(out.contains("PRICED CONTENT"), "{out}");
        }
    }

    // `path_matching = "strict"`, for an upstream known to route exactly: another case is
    // another path (here the strict WSGI upstream's 404), forwarded free.
    let (up, _upstream) = wsgi_upstream(false).await;
    let s = Setup::with(
        &format!("url = \"{up}\""),
        FORECAST,
        "path_matching = \"strict\"",
    )
    .await;
    let _gw = s.gateway().await;
    let (status, text) = raw(&s.origin, "GET", "/API/forecast/paris").await;
    assert_eq!(status, 404, "{text}");
    let (status, _) = raw(&s.origin, "GET", "/api/forecast/paris").await;
    assert_eq!(status, 402);
    let (status, _) = raw(&s.origin, "GET", "/api/forecast%2Fparis").await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn the_attacks_of_the_wallet_issues_fail_at_the_gateway() {
    let (s, seen, _task, _gw) = started("").await;
    let base = s.origin.clone();

    // HEAD of a priced route: never charged, never forwarded.
    let r = http()
        .head(format!("{base}/api/forecast/paris"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402);
    assert_eq!(seen.count("/api/forecast/paris"), 0);

    // Another spelling of a priced path is priced the same; a non-canonical one is refused.
    let r = http_get(&format!("{base}/api/forecast/%70aris")).await;
    assert_eq!(r.status(), 402);
    for path in [
        "/api//forecast/paris",
        "/api/x/../forecast/paris",
        "/api/x/%2e%2e/forecast/paris",
        "/api/forecast/./paris",
    ] {
        let (status, text) = raw(&base, "GET", path).await;
        assert_eq!(status, 400, "{path}: {text}");
    }
    assert_eq!(
        seen.0.lock().unwrap().len(),
        0,
        "the upstream saw an unpaid request"
    );

    // A Quote relayed from another request (another city) pays nothing here.
    let proof = s
        .paid_proof("GET", &format!("{base}/api/forecast/rome"))
        .await;
    let r = get_paid(&format!("{base}/api/forecast/paris"), &proof).await;
    assert_eq!(r.status(), 402);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "mismatch", "{body}");
    assert_eq!(seen.count("/api/forecast/paris"), 0);

    // The Proof for its own request: forwarded once; the same Proof again (a lost answer)
    // gets the kept answer, not a second forward.
    let first = get_paid(&format!("{base}/api/forecast/rome"), &proof).await;
    assert_eq!(first.status(), 200);
    let receipt = first.headers()["stipendex-receipt"].clone();
    let first = first.text().await.unwrap();
    let again = get_paid(&format!("{base}/api/forecast/rome"), &proof).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["stipendex-receipt"], receipt);
    assert_eq!(again.text().await.unwrap(), first);
    assert_eq!(seen.count("/api/forecast/rome"), 1);

    // Another method on the same path is not priced: it passes as any free request does
    // (the upstream answers it), and the payment header never reaches the upstream.
    let r = http()
        .post(format!("{base}/api/forecast/rome"))
        .header("stipendex-payment", &proof)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert!(!r.headers().contains_key("stipendex-receipt"));
    assert!(
        !seen
            .last("/api/forecast/rome")
            .contains_key("stipendex-payment")
    );

    // An oversized body is refused before anything is paid or forwarded.
    let r = http()
        .post(format!("{base}/api/upload"))
        .body(vec![b'x'; 10_000])
        .send()
        .await
        .unwrap();
    assert!(r.status() == 413 || r.status() == 402, "{}", r.status());
    let proof = s.paid_proof("POST", &format!("{base}/api/upload")).await;
    let r = http()
        .post(format!("{base}/api/upload"))
        .header("stipendex-payment", &proof)
        .body(vec![b'x'; 10_000])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // A chunked body without a length is counted as it streams.
    let chunks = futures::stream::iter((0..10).map(|_| Ok::<_, std::io::Error>(vec![b'y'; 1000])));
    let r = http()
        .post(format!("{base}/api/upload"))
        .header("stipendex-payment", &proof)
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
}

#[tokio::test]
async fn upstream_faults_cost_the_payer_nothing_or_what_the_profile_says() {
    let (up, seen, task) = upstream().await;
    let s = Setup::new(&up, "").await;
    let _gw = s.gateway().await;
    let base = s.origin.clone();
    let start = s.agent().await;

    // A service payment whose work fails after it (500): the documented outcome — charged,
    // the failure is the answer, kept: the same Proof again gets it again, no second forward.
    let broken = format!("{base}/api/broken");
    let proof = s.paid_proof("GET", &broken).await;
    for _ in 0..2 {
        let r = get_paid(&broken, &proof).await;
        assert_eq!(r.status(), 500);
        assert!(!r.headers().contains_key("stipendex-receipt"));
        assert_eq!(r.text().await.unwrap(), "the service failed");
    }
    assert_eq!(seen.count("/api/broken"), 1);
    assert_eq!(s.agent().await.0, start.0 - 5);

    // A slow upstream: the checkout times out (504) and its hold is voided.
    let (ok, _, err) = s.fetch(&["-X", "POST", &format!("{base}/api/slow")]).await;
    assert!(!ok);
    assert!(err.contains("504"), "{err}");
    assert_eq!(s.agent().await, (start.0 - 5, 0), "the hold was not voided");

    // The upstream down: a paid request is refused before its payment is taken.
    task.abort();
    let _ = task.await;
    tokio::time::sleep(Duration::from_millis(2100)).await; // past the last forward's vouching
    let oslo = format!("{base}/api/forecast/oslo");
    let proof = s.paid_proof("GET", &oslo).await;
    let r = get_paid(&oslo, &proof).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"], "upstream_unavailable");
    assert_eq!(s.ops_get("/readyz").await.status(), 503);
    // Nothing was taken at the gateway: the Proof is not consumed (the ledger moved the money
    // when the wallet paid; a rail that moves it at verification moved nothing). Once the
    // service is back, the same Proof is served — the payment is not lost, nor paid twice.
    assert_eq!(seen.count("/api/forecast/oslo"), 0);
    let paid_once = s.agent().await.0;
    assert_eq!(paid_once, start.0 - 10);
    let (_up, seen, _task) = upstream_at(up.trim_start_matches("http://"), seen).await;
    let r = get_paid(&oslo, &proof).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("stipendex-receipt"));
    assert_eq!(seen.count("/api/forecast/oslo"), 1);
    assert_eq!(s.agent().await.0, paid_once);
}

/// Issue 48: a same-host reverse proxy reaches the public listener from 127.0.0.1, so the
/// public listener serves no operations at all, whoever asks: `/metrics` (and `/healthz`,
/// `/readyz`) there is a path like any other unpriced one, passed to the upstream.
#[tokio::test]
async fn metrics_are_not_served_on_the_public_listener_even_from_loopback() {
    let (s, seen, _task, _gw) = started("").await;
    // Something to count, so that metrics would show if they were served.
    let r = http_get(&format!("{}/free", s.origin)).await;
    assert_eq!(r.status(), 200);
    for path in ["/metrics", "/healthz", "/readyz"] {
        // As a reverse proxy on the same host forwards a client's request: from loopback.
        let r = http()
            .get(format!("{}{path}", s.origin))
            .header("x-forwarded-for", "203.0.113.7")
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body = r.text().await.unwrap();
        assert!(
            !body.contains("stipendex_gateway_") && !body.contains("\"status\""),
            "{path} served on the public listener: {body}"
        );
        // The upstream's own answer (it has no such route), as for any unpriced path.
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(seen.count(path), 1, "{path} was not passed to the upstream");
    }
}

/// Issue 48: `[gateway] ops_listen` serves `/healthz`, `/readyz` and `/metrics` (to whoever
/// reaches that address: it is the operator's to keep private), and nothing else — not the
/// paid API, not the upstream.
#[tokio::test]
async fn operations_are_served_on_ops_listen() {
    let (s, seen, _task, _gw) = started("").await;
    let r = http_get(&format!("{}/free", s.origin)).await;
    assert_eq!(r.status(), 200);

    let r = s.ops_get("/healthz").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"status": "ok"}));
    let r = s.ops_get("/readyz").await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap()["status"], "ready");
    let r = s.ops_get("/metrics").await;
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let metrics = r.text().await.unwrap();
    assert!(
        metrics
            .contains("stipendex_gateway_requests_total{outcome=\"forwarded\",status=\"200\"} 1"),
        "{metrics}"
    );
    // Operations are not counted as the public's requests, nor passed to the upstream.
    assert_eq!(seen.count("/healthz"), 0);
    assert_eq!(seen.count("/metrics"), 0);
    // The operations address is not a second way into the API.
    for path in [
        "/free",
        "/api/forecast/paris",
        "/.well-known/stipendex.json",
    ] {
        let r = s.ops_get(path).await;
        assert_eq!(r.status(), 404, "{path} on the operations address");
    }
    assert_eq!(seen.count("/free"), 1);
}

/// Issue 48: operations on the public address are refused at start, with the fix in the
/// sentence — whether `ops_listen` repeats `[gateway] listen` or the `--listen` override.
#[tokio::test]
async fn ops_listen_equal_to_listen_is_refused_at_start() {
    let (up, _seen, _task) = upstream().await;
    let s = Setup::new(&up, "").await;
    let good = s.read("gateway.toml");
    let path = s.dir.join("same.toml");
    let listen = format!("127.0.0.1:{}", s.port);
    let ops_line = good
        .lines()
        .find(|l| l.starts_with("ops_listen"))
        .unwrap()
        .to_owned();
    std::fs::write(
        &path,
        good.replace(&ops_line, &format!("ops_listen = \"127.0.0.1:{}\"", s.port)),
    )
    .unwrap();
    let (ok, err) = run_gateway(&path, &listen).await;
    assert!(!ok, "started: {err}");
    let said = said_by_cli(&err);
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].contains("[gateway] ops_listen")
            && said[0].contains("public")
            && said[0].contains("own"),
        "{err}"
    );
    // The same port on every interface is the public listener too.
    std::fs::write(
        &path,
        good.replace(&ops_line, &format!("ops_listen = \"0.0.0.0:{}\"", s.port)),
    )
    .unwrap();
    let (ok, err) = run_gateway(&path, &listen).await;
    assert!(!ok, "started: {err}");
    assert!(err.contains("[gateway] ops_listen"), "{err}");
}

/// The configuration's refusals: one sentence naming the field, a non-zero exit, at start.
#[tokio::test]
async fn bad_configuration_is_refused_at_start_naming_the_field() {
    let (up, _seen, _task) = upstream().await;
    let s = Setup::new(&up, "").await;
    let good = s.read("gateway.toml");
    let cases: BTreeMap<&str, (String, &str)> = BTreeMap::from([
        (
            "unknown rail kind",
            (
                good.replace("kind = \"ledger\"", "kind = \"paypal\""),
                "paypal",
            ),
        ),
        (
            "a secret in the file",
            (
                good.replace("key_file = \"shop.key\"", "key = \"00\""),
                "[receiver] key: secrets are read from the environment only",
            ),
        ),
        (
            "an upstream secret in the file",
            (
                good.replace("secret_env = \"GATEWAY_TEST_SECRET\"", "secret = \"x\""),
                "[upstream] secret: secrets are read from the environment only",
            ),
        ),
        (
            "an asset no rail carries",
            (
                good.replacen(
                    "asset = \"USD\"\ndescription = \"one forecast\"",
                    "asset = \"ALGO\"\ndescription = \"one forecast\"",
                    1,
                ),
                "no configured rail receives ALGO",
            ),
        ),
        (
            "a pattern that cannot match",
            (
                good.replace("/api/forecast/{city}", "/api//forecast/{city}"),
                "can never match",
            ),
        ),
        (
            "an MCP price on an HTTP upstream",
            (
                format!(
                    "{good}\n[[price]]\nkind = \"tool\"\npattern = \"search\"\namount = \"0.01\"\nasset = \"USD\"\n"
                ),
                "an MCP price can never match",
            ),
        ),
        (
            "no public origin",
            (
                good.replace(&format!("origins = [\"{}\"]", s.origin), "origins = []"),
                "[receiver] origins is empty",
            ),
        ),
    ]);
    for (what, (text, expected)) in cases {
        let path = s.dir.join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let (ok, err) = run_gateway(&path, "127.0.0.1:0").await;
        assert!(!ok, "{what}: started");
        assert!(err.contains(expected), "{what}: {err}");
        let said = said_by_cli(&err);
        assert_eq!(said.len(), 1, "{what}: {err}");
        assert!(said[0].contains(expected), "{what}: {err}");
    }
}

/// The independent clients' harness and the payment-unaware Python server.
fn mcp_scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/mcp-clients")
}

fn venv_python() -> PathBuf {
    Path::new(
        &std::env::var("MCP_CLIENTS_VENV").unwrap_or_else(|_| "/var/tmp/mcp-clients-venv".into()),
    )
    .join("bin/python")
}

/// Whether the TypeScript SDK and the Python SDK are installed: a failure in CI, a visible
/// skip elsewhere.
fn mcp_sdks_installed() -> bool {
    let ok = mcp_scripts()
        .join("node_modules/@modelcontextprotocol/sdk")
        .is_dir()
        && venv_python().exists();
    if !ok {
        let why = "the MCP SDKs are not installed: run scripts/mcp-clients/install.sh (scripts/setup-localnets does)";
        assert!(std::env::var("CI").is_err(), "{why}");
        eprintln!("SKIPPED: {why}");
    }
    ok
}

/// The JSON-RPC message `body` posted to the MCP endpoint `endpoint`.
async fn mcp_post(endpoint: &str, body: &Value) -> reqwest::Response {
    http()
        .post(endpoint)
        .header("accept", "application/json, text/event-stream")
        .json(body)
        .send()
        .await
        .unwrap()
}

const MCP_PRICES: &str = r#"[[price]]
kind = "tool"
pattern = "forecast"
amount = "0.05"
asset = "USD"
description = "one forecast"

[[price]]
kind = "tool"
pattern = "fail"
amount = "0.02"
asset = "USD"

[[price]]
kind = "resource"
pattern = "reports://*"
amount = "0.10"
asset = "USD"
"#;

/// A host on the TypeScript MCP SDK (npm `@modelcontextprotocol/sdk`) starts `stipendex proxy`
/// as its server; the proxy pays `stipendex gateway`'s Streamable HTTP endpoint, which sells a
/// payment-unaware server written with the Python SDK (`mcp`'s MCPServer, formerly FastMCP)
/// started over stdio — no line of payment code on either end.
#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_sdk_host_pays_a_python_sdk_server_through_proxy_and_gateway() {
    typescript_host_pays_python_server(false).await;
}

/// The same with the Python server reached over Streamable HTTP (`[upstream] mcp_url`); once
/// it stops, a call is refused before anything is paid.
#[tokio::test(flavor = "multi_thread")]
async fn the_typescript_sdk_host_pays_a_python_sdk_server_over_streamable_http() {
    typescript_host_pays_python_server(true).await;
}

async fn typescript_host_pays_python_server(over_http: bool) {
    if !mcp_sdks_installed() {
        return;
    }
    let calls = tempfile::NamedTempFile::new().unwrap();
    let mut python = None;
    let upstream = if over_http {
        let port = free_port();
        python = Some(
            Command::new(venv_python())
                .arg(mcp_scripts().join("weather_server.py"))
                .arg("--http")
                .arg(port.to_string())
                .env("WEATHER_CALLS_FILE", calls.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap(),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the Python server did not listen"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        format!("mcp_url = \"http://127.0.0.1:{port}/mcp\"")
    } else {
        format!(
            "command = [\"{}\", \"{}\"]",
            venv_python().display(),
            mcp_scripts().join("weather_server.py").display()
        )
    };
    let s = Setup::with(&upstream, MCP_PRICES, "").await;
    let mut gw = gateway_command(
        &s.dir.join("gateway.toml"),
        &format!("127.0.0.1:{}", s.port),
    )
    .env("WEATHER_CALLS_FILE", calls.path())
    .env("RUST_LOG", "warn,rmcp=error")
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit())
    .kill_on_drop(true)
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(gw.stdout.take().unwrap()).lines();
    listening(&mut lines, 60).await.expect("the gateway exited");
    let before = s.agent().await.0;
    let endpoint = format!("{}/mcp", s.origin);

    // Unpaid, straight at the gateway: the -32402 Quote; the upstream never ran.
    let r = mcp_post(
        &endpoint,
        &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "forecast", "arguments": {"city": "paris"},
                       "_meta": {"stipendex/payments": {"version": "0.1"}}}}),
    )
    .await;
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32402, "{body}");
    assert!(std::fs::read_to_string(calls.path()).unwrap().is_empty());

    let steps = json!([
        {"op": "info"},
        {"op": "list_tools"},
        {"op": "call_tool", "name": "echo", "arguments": {"text": "hi"}},
        {"op": "call_tool", "name": "forecast", "arguments": {"city": "paris"}},
        {"op": "read_resource", "uri": "reports://daily"},
        {"op": "get_prompt", "name": "brief", "arguments": {"topic": "rain"}},
        {"op": "call_tool", "name": "fail", "arguments": {"message": "no luck"}},
    ]);
    let root = mcp_scripts();
    let out = Command::new("node")
        .arg(root.join("client.mjs"))
        .arg("--stdio")
        .arg(env!("CARGO_BIN_EXE_stipendex"))
        .arg("proxy")
        .arg("--config")
        .arg(s.dir.join("wallet.toml"))
        .arg("--url")
        .arg(&endpoint)
        .env("MCP_STEPS", steps.to_string())
        .env("ELICIT", "accept")
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap();
    let step = |i: usize| &report["steps"][i];
    assert_eq!(
        step(0)["result"]["serverInfo"]["name"],
        "weather-server",
        "{report}"
    );
    let tools = step(1)["result"].as_array().unwrap();
    let forecast = tools.iter().find(|t| t["name"] == "forecast").unwrap();
    assert_eq!(
        forecast["_meta"]["stipendex/pricing"]["estimate"], "0.05 USD",
        "{report}"
    );
    assert_eq!(step(2)["result"]["content"][0]["text"], "hi", "{report}");
    let paid = &step(3)["result"];
    assert_eq!(paid["content"][0]["text"], "sunny in paris", "{report}");
    assert_eq!(
        paid["_meta"]["stipendex/receipt"]["stipendex"], "receipt/0.1",
        "{report}"
    );
    assert!(
        step(4)["result"]["contents"][0]["text"]
            .as_str()
            .unwrap()
            .contains("daily report"),
        "{report}"
    );
    assert!(
        step(5)["result"]["messages"][0]["content"]["text"]
            .as_str()
            .unwrap_or_default()
            .contains("rain"),
        "{report}"
    );
    // A paid tool that fails: its service payment is not refunded (the profile's rule), no
    // Receipt, and the failure is the kept answer.
    assert_eq!(step(6)["result"]["isError"], true, "{report}");
    assert_eq!(s.agent().await.0, before - 5 - 10 - 2);
    let ran = std::fs::read_to_string(calls.path()).unwrap();
    assert_eq!(
        ran.lines().collect::<Vec<_>>(),
        ["forecast paris", "report daily", "fail no luck"],
        "each paid call reached the server once"
    );
    assert_two_payments_and_quotes(&s.metrics().await);

    if let Some(mut p) = python {
        // The server stops: nothing reaches the gate, nothing is paid.
        p.start_kill().unwrap();
        let _ = p.wait().await;
        tokio::time::sleep(Duration::from_millis(2100)).await; // past the last check's vouching
        let r = mcp_post(
            &endpoint,
            &json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                "params": {"name": "forecast", "arguments": {"city": "oslo"}}}),
        )
        .await;
        assert_eq!(r.status(), 503);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"], "upstream_unavailable");
        assert_eq!(s.ops_get("/readyz").await.status(), 503);
    }
}

/// Two gateway instances on one PostgreSQL (store and ledger) behind one public origin; instance
/// A is killed (SIGKILL) a quarter of the way into a burst of paid requests that fail over to
/// B with the same Proofs. Every request is answered once with its Receipt (none lost), every
/// Proof is accepted once (the shop is paid exactly once per request), and the upstream ran a
/// request twice only if A was killed while forwarding it (a GET: idempotent).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_postgres_lose_and_double_nothing_when_one_is_killed_mid_burst() {
    const N: u32 = 40;
    const PUBLIC: &str = "http://gateway.test";
    let url = test_kit::localnet::postgres_url();
    let schema = format!("gw_{:016x}", rand::random::<u64>());
    let ledger = match tokio::time::timeout(
        Duration::from_secs(5),
        Ledger::postgres(&url, Some(&schema)),
    )
    .await
    {
        Ok(Ok(l)) => l,
        Ok(Err(e)) => return test_kit::localnet::missing("PostgreSQL", &e.to_string()),
        Err(_) => return test_kit::localnet::missing("PostgreSQL", "connection timed out"),
    };
    let (agent, shop) = common::fund(&ledger, 10_000).await;
    let (up, seen, _task) = upstream().await;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let shop_key = key_file(&dir.join("shop.key"));
    let config = dir.join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            r#"[store]
url = "{url}"

[rails.house]
kind = "ledger"
url = "{url}"
schema = "{schema}"
payee_account = "{shop}"

[receiver]
id = "weather-{schema}"
key_file = "shop.key"
origins = ["{PUBLIC}"]

[gateway]
claim_lease_secs = 2

[upstream]
url = "{up}"

[[price]]
kind = "route"
method = "GET"
pattern = "/api/slowish/{{n}}"
amount = "0.05"
asset = "USD"
"#
        ),
    )
    .unwrap();
    let (pa, pb) = (free_port(), free_port());
    let mut a = start_gateway(&config, pa).await;
    let _b = start_gateway(&config, pb).await;

    // The wallet pays N Quotes ahead (the Proofs are the burst's).
    let wallet_key = SecretKey::generate();
    let m = mandate(
        &wallet_key,
        &format!("weather-{schema}"),
        &shop_key,
        PUBLIC,
        &[(Asset::usd(), "1.00", "50.00", None)],
    );
    let registry = stipendex::Registry::from_toml(
        &format!(
            "[store]\nurl = \"memory\"\n\n[rails.house]\nkind = \"ledger\"\nurl = \"{url}\"\nschema = \"{schema}\"\npayer_account = \"{agent}\"\n"
        ),
        &stipendex::ProcessEnv,
    )
    .await
    .unwrap();
    let wallet = stipendex::wallet::Wallet::builder(wallet_key, m)
        .registry(&registry)
        .build()
        .unwrap();
    let at = |port: u16, n: u32| format!("http://127.0.0.1:{port}/api/slowish/{n}");
    let mut proofs = Vec::new();
    for n in 0..N {
        let r = http()
            .get(at(if n % 2 == 0 { pa } else { pb }, n))
            .header("host", "gateway.test")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 402);
        let body: Value = r.json().await.unwrap();
        let q: Signed<stipendex::envelope::Quote> =
            serde_json::from_value(body["quote"].clone()).unwrap();
        let sent = q.object().resource.clone().unwrap();
        proofs.push(wallet.pay_for(&q, &sent).await.unwrap().proof.to_header());
    }
    let paid_before = posted(&ledger, shop).await;

    // The burst: 8 workers, even requests to A, odd to B; A dies a quarter of the way in, and
    // every request that did not get its answer goes to B with the same Proof until it does.
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<u32>();
    for n in 0..N {
        tx.send(n).unwrap();
    }
    drop(tx);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    let mut workers = Vec::new();
    for _ in 0..8 {
        let (rx, done, proofs) = (rx.clone(), done.clone(), proofs.clone());
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let Some(n) = rx.lock().await.recv().await else {
                    break;
                };
                let proof = &proofs[n as usize];
                let mut port = if n % 2 == 0 { pa } else { pb };
                let deadline = std::time::Instant::now() + Duration::from_secs(60);
                let (mut failed_over, mut waited) = (false, false);
                let answer = loop {
                    let r = http()
                        .get(at(port, n))
                        .header("host", "gateway.test")
                        .header("stipendex-payment", proof)
                        .timeout(Duration::from_secs(10))
                        .send()
                        .await;
                    match r {
                        Ok(r) if r.status() == 200 => {
                            let receipt = r.headers()["stipendex-receipt"]
                                .to_str()
                                .unwrap()
                                .to_owned();
                            break (r.text().await.unwrap(), receipt);
                        }
                        // The claim of the killed instance has not lapsed yet: the same again.
                        Ok(r) if r.status() == 503 => waited = true,
                        Ok(r) => panic!("request {n}: {} {}", r.status(), r.text().await.unwrap()),
                        // A is gone: fail over to B.
                        Err(_) => {
                            failed_over = true;
                            port = pb;
                        }
                    }
                    assert!(
                        std::time::Instant::now() < deadline,
                        "request {n} never answered"
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                };
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                out.push((n, answer, failed_over, waited));
            }
            out
        }));
    }
    while done.load(std::sync::atomic::Ordering::SeqCst) < (N / 4) as usize {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    a.start_kill().unwrap();
    let _ = a.wait().await;
    let mut answers = BTreeMap::new();
    let (mut failed_over, mut recovered) = (0, 0);
    for w in workers {
        for (n, a, f, r) in w.await.unwrap() {
            answers.insert(n, a);
            failed_over += usize::from(f);
            recovered += usize::from(r);
        }
    }
    eprintln!(
        "kill test: {failed_over} requests failed over to B, {recovered} waited for A's claim to lapse"
    );
    assert!(
        failed_over > 0,
        "A was killed after the burst: nothing was tested"
    );
    assert_eq!(answers.len(), N as usize, "a request was lost");
    let receipts: std::collections::BTreeSet<&String> = answers.values().map(|(_, r)| r).collect();
    assert_eq!(receipts.len(), N as usize, "two requests share a Receipt");
    for (n, (body, _)) in &answers {
        assert_eq!(body, &format!("result {n}"));
    }
    // Each Proof's money moved once, when the wallet paid; no instance took a payment twice
    // (a second verification would have been refused as a replay: a lost request above).
    let paid = posted(&ledger, shop).await;
    assert_eq!(paid, paid_before);
    assert_eq!(paid, i128::from(N) * 5);
    let runs: usize = (0..N)
        .map(|n| seen.count(&format!("/api/slowish/{n}")))
        .sum();
    assert!(
        runs >= N as usize && runs <= N as usize + 8,
        "the upstream ran {runs} times"
    );
}

fn x402_scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/x402")
}

/// A hex secp256k1 key and its signer.
fn evm_key() -> (String, rail_x402::evm::LocalSigner) {
    let hex_key = format!("0x{}", hex::encode(rand::random::<[u8; 32]>()));
    let s = rail_x402::evm::LocalSigner::from_hex(&hex_key).unwrap();
    (hex_key, s)
}

/// The gateway's x402 side on the anvil localnet (FiatTokenV2_2), settled by the reference
/// facilitator (`@x402/core` + `@x402/evm`): one route paid by the reference client
/// (`@x402/fetch`), by rail-x402's client and by the Stipendex wallet over its x402 rail
/// (`stipendex fetch`: a Quote, its offer paid by an EIP-3009 authorization) — each request
/// forwarded once, each payment on chain once.
#[tokio::test(flavor = "multi_thread")]
async fn x402_clients_and_the_stipendex_wallet_pay_the_gateway_on_anvil() {
    use alloy_primitives::U256;
    let Some(net) = x402_devnet::anvil::Localnet::from_env().await else {
        return;
    };
    let node_ok = x402_scripts().join("node_modules/@x402/fetch").is_dir();
    if !node_ok {
        return test_kit::localnet::missing(
            "x402 reference SDK",
            "scripts/x402/node_modules missing (run scripts/x402/install.sh)",
        );
    }
    // The reference facilitator, with its own funded settler.
    let (settler_key, settler) = evm_key();
    net.set_eth(settler.address(), U256::from(10u64).pow(U256::from(20u64)))
        .await
        .unwrap();
    let mut f = Command::new("node");
    f.arg(x402_scripts().join("ref-facilitator.mjs"))
        .current_dir(x402_scripts())
        .env("PORT", "0")
        .env("X402_RPC_URL", net.rpc.url())
        .env("X402_TOKEN", net.token.address.to_checksum(None))
        .env("X402_CHAIN_ID", net.chain_id.to_string())
        .env("X402_FACILITATOR_KEY", &settler_key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut facilitator = f.spawn().unwrap();
    let mut lines = BufReader::new(facilitator.stdout.take().unwrap()).lines();
    let furl = listening(&mut lines, 30)
        .await
        .expect("the reference facilitator exited");

    let (up, seen, _task) = upstream().await;
    let pay_to = rail_x402::evm::LocalSigner::random().address();
    let var = |k: &str| std::env::var(k).unwrap();
    let rail = format!(
        "network = \"{}\"\ntoken = \"{}\"\ntoken_name = \"{}\"\ntoken_version = \"{}\"\n",
        net.token.network,
        net.token.address.to_checksum(None),
        var("X402_TOKEN_NAME"),
        var("X402_TOKEN_VERSION"),
    );
    let s = Setup::priced(
        &up,
        "[[price]]\nkind = \"route\"\nmethod = \"GET\"\npattern = \"/api/forecast/{city}\"\namount = \"0.001\"\nasset = \"USDC\"\ndescription = \"one forecast\"\n",
        "",
    )
    .await;
    // The gateway receives over x402 (the ledger rail stays: it carries USD, priced nowhere).
    s.add_gateway_rail(&format!(
        "[rails.usdc]\nkind = \"x402\"\n{rail}pay_to = \"{}\"\nfacilitator_url = \"{furl}\"\n",
        pay_to.to_checksum(None)
    ));
    // The Stipendex wallet pays over its x402 rail.
    let (wallet_hex, wallet_signer) = evm_key();
    net.mint(wallet_signer.address(), U256::from(5000))
        .await
        .unwrap();
    s.add_wallet_rail(&format!(
        "[rails.usdc]\nkind = \"x402\"\n{rail}payer_key_env = \"GATEWAY_TEST_EVM_KEY\"\nmax_amount = \"0.01\"\nrpc_url = \"{}\"\n",
        net.rpc.url()
    ));
    let _gw = s.gateway().await;
    let base = s.origin.clone();

    // The unpaid 402 speaks both: the Quote offers the x402 rail, and x402's challenge.
    let r = http_get(&format!("{base}/api/forecast/paris")).await;
    assert_eq!(r.status(), 402);
    assert!(r.headers().contains_key("payment-required"));
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["accepts"][0]["amount"], "1000", "{body}");
    assert!(body["quote"]["jws"].is_string(), "{body}");

    // The reference client (@x402/fetch).
    let (ref_hex, ref_signer) = evm_key();
    net.mint(ref_signer.address(), U256::from(5000))
        .await
        .unwrap();
    let out = Command::new("node")
        .arg(x402_scripts().join("ref-pay.mjs"))
        .arg(format!("{base}/api/forecast/paris"))
        .current_dir(x402_scripts())
        .env("X402_PAYER_KEY", ref_hex)
        .env("X402_TOKEN", net.token.address.to_checksum(None))
        .env("X402_CHAIN_ID", net.chain_id.to_string())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ref-pay: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(line["status"], 200, "{line}");
    assert_eq!(line["body"]["city"], "paris", "{line}");
    assert_eq!(line["paymentResponse"]["success"], true, "{line}");
    assert_eq!(net.balance(pay_to).await.unwrap(), U256::from(1000));
    assert_eq!(seen.count("/api/forecast/paris"), 1);

    // rail-x402's client.
    let key = net.funded_payer(U256::from(5000)).await.unwrap();
    let client = rail_x402::client::client(rail_x402::payer::X402Payer::new(
        key,
        rail_x402::payer::Policy::new(&net.token.network, net.token.address, U256::from(1000)),
    ))
    .unwrap();
    let paid = rail_x402::client::EvmFetched::from(
        client
            .get(&format!("{base}/api/forecast/rome"))
            .await
            .unwrap(),
    );
    assert_eq!(paid.status, 200, "{}", String::from_utf8_lossy(&paid.body));
    assert!(paid.settlement.unwrap().success);
    assert_eq!(net.balance(pay_to).await.unwrap(), U256::from(2000));
    assert_eq!(seen.count("/api/forecast/rome"), 1);

    // The Stipendex wallet over its x402 rail: a Quote, a Proof, a Receipt.
    let out = s
        .fetch_with(
            &format!("{base}/api/forecast/oslo"),
            "GATEWAY_TEST_EVM_KEY",
            &wallet_hex,
        )
        .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("receipt"), "{err}");
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["city"],
        "oslo"
    );
    assert_eq!(net.balance(pay_to).await.unwrap(), U256::from(3000));
    assert_eq!(
        net.balance(wallet_signer.address()).await.unwrap(),
        U256::from(4000)
    );
    assert_eq!(seen.count("/api/forecast/oslo"), 1);
}

/// Dynamic prices without Rust: `resolve_url` decides per request — a waiver, a refusal, a
/// price of its own — and an endpoint that does not answer in time is a refusal (nothing
/// charged, nothing forwarded).
#[tokio::test]
async fn resolve_url_quotes_rejects_and_waives_and_fails_closed() {
    let asked = Arc::new(Mutex::new(Vec::<Value>::new()));
    let log = asked.clone();
    let pricing = Router::new().route(
        "/price",
        post(move |axum::Json(q): axum::Json<Value>| {
            let log = log.clone();
            async move {
                let city = q["request"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .rsplit('/')
                    .next()
                    .unwrap_or_default()
                    .to_owned();
                log.lock().unwrap().push(q);
                match city.as_str() {
                    // A waiver drowned in padding: 1 MiB, far above what the gateway reads.
                    "huge" => axum::Json(json!({"decision": "waive", "padding": "x".repeat(1 << 20)})),
                    "free" => axum::Json(json!({"decision": "waive"})),
                    "blocked" => axum::Json(json!({"decision": "reject", "message": "not sold in your region"})),
                    "dear" => axum::Json(json!({"decision": "quote", "amount": "0.20", "description": "a dear forecast"})),
                    "slow" => {
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        axum::Json(json!({"decision": "waive"}))
                    }
                    _ => axum::Json(json!({"decision": "quote", "amount": "0.05"})),
                }
            }
        }),
    );
    let purl = format!("{}/price", serve(pricing).await);
    let (s, seen, _task, _gw) = started(&format!(
        "resolve_url = \"{purl}\"\nresolve_timeout_ms = 300"
    ))
    .await;
    let base = s.origin.clone();

    let r = http_get(&format!("{base}/api/forecast/free")).await;
    assert_eq!(r.status(), 200, "waived: forwarded without payment");
    assert_eq!(seen.count("/api/forecast/free"), 1);
    let sent = asked.lock().unwrap()[0].clone();
    assert_eq!(sent["capability"]["pattern"], "/api/forecast/{city}");
    assert_eq!(sent["capability"]["price"]["amount"], "0.05");
    assert_eq!(sent["request"]["method"], "GET");

    let r = http_get(&format!("{base}/api/forecast/blocked")).await;
    assert_eq!(r.status(), 403);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["message"], "not sold in your region");
    assert_eq!(seen.count("/api/forecast/blocked"), 0);

    let q = quote_of("GET", &format!("{base}/api/forecast/dear")).await;
    let quote: Signed<stipendex::envelope::Quote> = serde_json::from_value(q).unwrap();
    assert_eq!(quote.object().amount.unwrap().to_string(), "0.2");

    let r = http_get(&format!("{base}/api/forecast/slow")).await;
    assert_eq!(
        r.status(),
        403,
        "an endpoint that does not answer in time refuses"
    );
    assert_eq!(seen.count("/api/forecast/slow"), 0);

    let r = http_get(&format!("{base}/api/forecast/huge")).await;
    assert_eq!(
        r.status(),
        403,
        "an oversized answer refuses (read no further than its limit)"
    );
    assert_eq!(seen.count("/api/forecast/huge"), 0);

    let before = s.agent().await.0;
    s.fetch_ok(&[&format!("{base}/api/forecast/dear")]).await;
    assert_eq!(s.agent().await.0, before - 20);
}

/// exact-algo on the gateway, on an algod devnet in process: its discovery documents
/// (`/llms.txt`, `/.well-known/exact-algo.json`, `docs/exact-algo.md` §7) with the gateway's
/// prices, and the Stipendex wallet paying a route over it (a payment on chain, verified by
/// the gateway before the forward).
#[tokio::test(flavor = "multi_thread")]
async fn exact_algo_is_offered_with_its_discovery_documents() {
    let payer = ed25519_dalek::SigningKey::from_bytes(&rand::random::<[u8; 32]>());
    let addr =
        |k: &ed25519_dalek::SigningKey| rail_exact_algo::Address(k.verifying_key().to_bytes());
    let treasury = addr(&ed25519_dalek::SigningKey::from_bytes(&rand::random::<
        [u8; 32],
    >()));
    let net = algod_devnet::Devnet::spawn(
        algod_devnet::DevnetConfig {
            accounts: vec![(addr(&payer), 50_000_000), (treasury, 1_000_000)],
            ..algod_devnet::DevnetConfig::default()
        },
        std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
    )
    .await
    .unwrap();
    let (up, seen, _task) = upstream().await;
    let s = Setup::priced(
        &up,
        "[[price]]\nkind = \"route\"\nmethod = \"GET\"\npattern = \"/api/forecast/{city}\"\namount = \"0.002\"\nasset = \"ALGO\"\ndescription = \"one forecast\"\n",
        "",
    )
    .await;
    s.add_gateway_rail(&format!(
        "[rails.chain]\nkind = \"exact-algo\"\nalgod_url = \"{}\"\npay_to = \"{treasury}\"\n",
        net.url
    ));
    s.add_wallet_rail(&format!(
        "[rails.chain]\nkind = \"exact-algo\"\nalgod_url = \"{}\"\npayer_key_env = \"GATEWAY_TEST_ALGO_KEY\"\nmax_amount = \"0.01\"\n",
        net.url
    ));
    let _gw = s.gateway().await;
    let base = s.origin.clone();

    let txt = http_get(&format!("{base}/llms.txt")).await;
    assert_eq!(txt.status(), 200);
    let txt = txt.text().await.unwrap();
    assert!(
        txt.contains("exact-algo") && txt.contains("/api/forecast/{city}"),
        "{txt}"
    );
    let doc = get_json(&format!("{base}/.well-known/exact-algo.json")).await;
    assert!(doc.to_string().contains("/api/forecast/{city}"), "{doc}");
    assert!(doc.to_string().contains("2000"), "{doc}");
    let agent = get_json(&format!("{base}/.well-known/agent.json")).await;
    assert_eq!(agent["payments"]["x402"]["supported"], true, "{agent}");
    assert_eq!(
        agent["payments"]["x402"]["schemes"][0]["label"], "exact-algo",
        "{agent}"
    );

    // The 402 offers exact-algo both ways; the wallet pays the Quote's offer on chain.
    let body = challenge("GET", &format!("{base}/api/forecast/lima")).await;
    assert!(
        body["accepts"].is_array() && body["quote"]["jws"].is_string(),
        "{body}"
    );
    let out = s
        .fetch_with(
            &format!("{base}/api/forecast/lima"),
            "GATEWAY_TEST_ALGO_KEY",
            &hex::encode(payer.to_bytes()),
        )
        .await;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["city"],
        "lima"
    );
    assert_eq!(seen.count("/api/forecast/lima"), 1);
}

/// `SIGTERM`: the gateway stops taking connections and lets a paid request in flight finish —
/// forwarded, answered with its Receipt — before it exits.
#[tokio::test]
async fn sigterm_lets_a_paid_request_in_flight_finish() {
    let (s, seen, _task, mut gw) = started("").await;
    let base = s.origin.clone();
    let url = format!("{base}/api/slowish/7");
    let proof = s.paid_proof("GET", &url).await;
    let inflight = tokio::spawn(async move {
        let r = get_paid(&url, &proof).await;
        (
            r.status().as_u16(),
            r.headers().contains_key("stipendex-receipt"),
        )
    });
    // The request is at the upstream (which answers 150 ms later) when the signal comes.
    while seen.count("/api/slowish/7") == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pid = gw.id().unwrap();
    assert!(
        std::process::Command::new("kill")
            .arg("-TERM")
            .arg(pid.to_string())
            .status()
            .unwrap()
            .success()
    );
    assert_eq!(inflight.await.unwrap(), (200, true));
    let exit = tokio::time::timeout(Duration::from_secs(10), gw.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(exit.success(), "{exit:?}");
    assert_eq!(seen.count("/api/slowish/7"), 1);
    assert!(
        http().get(format!("{base}/free")).send().await.is_err(),
        "the gateway still takes connections"
    );
}

/// Behind a trusted proxy (its address in `trusted_proxies`), the client's `X-Forwarded-*` are
/// kept and the peer appended; the shared secret and the payment headers are still the
/// gateway's alone.
#[tokio::test]
async fn forwarded_headers_of_a_trusted_proxy_are_kept_and_extended() {
    let (s, seen, _task, _gw) = started("trusted_proxies = [\"127.0.0.0/8\"]").await;
    let r = http()
        .get(format!("{}/free", s.origin))
        .header("x-forwarded-for", "203.0.113.7")
        .header("x-forwarded-proto", "https")
        .header("x-forwarded-host", "api.example")
        .header("x-gateway-secret", "guessed")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let h = seen.last("/free");
    assert_eq!(h["x-forwarded-for"], "203.0.113.7, 127.0.0.1");
    assert_eq!(h["x-forwarded-proto"], "https");
    assert_eq!(h["x-forwarded-host"], "api.example");
    assert_eq!(h["x-gateway-secret"], SECRET);
}

#[tokio::test]
async fn tabs_through_the_gateway_pay_many_calls_with_one_hold() {
    let (up, seen, _task) = upstream().await;
    let s = Setup::priced(&up, HTTP_PRICES, TABS).await;
    let _gw = s.gateway().await;
    let base = s.origin.clone();

    // The 402 carries a tab beside the Quote.
    let body = challenge("GET", &format!("{base}/api/forecast/paris")).await;
    assert!(
        body["quote"]["jws"].is_string() && body["tab"]["jws"].is_string(),
        "{body}"
    );

    // `stipendex fetch` opens a tab for its one call and closes it before it exits.
    let before = s.agent().await;
    let (out, err) = s.fetch_ok(&[&format!("{base}/api/forecast/rome")]).await;
    assert!(out.contains("rome"), "{out}");
    assert!(
        err.contains(": 1 call, captured 0.05 of cap 1.00 USD"),
        "{err}"
    );
    assert_eq!(s.agent().await, (before.0 - 5, 0));

    // A wallet in one process: one 402, then every call straight through the gateway with a
    // voucher; the upstream sees each call once and never a payment header.
    let client = in_process_client(&s).await;
    let before = s.agent().await;
    for city in ["oslo", "lima", "pune", "kiev", "doha"] {
        let r = client
            .get(&format!("{base}/api/forecast/{city}"))
            .await
            .unwrap();
        assert_eq!(r.status, 200);
        assert!(r.tab_call.is_some());
        let h = seen.last(&format!("/api/forecast/{city}"));
        for p in ["stipendex-voucher", "stipendex-tab", "stipendex-payment"] {
            assert!(!h.contains_key(p), "{p} reached the upstream");
        }
    }
    // While the tab is open its cap is held.
    assert_eq!(s.agent().await.1, 100);
    let receipts = client.close_tabs().await.unwrap();
    assert_eq!(receipts[0].object().calls, 5);
    assert_eq!(receipts[0].object().captured, "0.25".parse().unwrap());
    assert_eq!(s.agent().await, (before.0 - 25, 0));
}

/// The wallet of `s` in this process (its key and mandate; the ledger's payer side; spend
/// records in memory): a client whose tabs stay open across calls.
async fn in_process_client(s: &Setup) -> stipendex::http::Client {
    let (wallet_key, mandate) = s.wallet();
    let registry = stipendex::Registry::from_toml(
        &format!(
            "[store]\nurl = \"memory\"\n[rails.house]\nkind = \"ledger\"\nurl = \"sqlite://{}\"\npayer_account = \"{}\"\n",
            s.dir.join("ledger.db").display(),
            s.agent
        ),
        &BTreeMap::<String, String>::new(),
    )
    .await
    .unwrap();
    let wallet = stipendex::wallet::Wallet::builder(wallet_key, mandate)
        .registry(&registry)
        .build()
        .unwrap();
    stipendex::http::Client::new(
        stipendex::http::reqwest_builder(Duration::from_secs(10)),
        wallet,
    )
    .unwrap()
}

/// Issue 44: nothing is charged for a call the upstream never got, whatever paid for it. A
/// voucher while the upstream is down is not counted — whether the gateway knew it was down (its
/// guard, before the voucher is looked at) or found out at the forward (the connection refused:
/// the voucher taken back) — and the wallet's next voucher reuses its sequence; a Proof is
/// refused before it is claimed and works once the upstream is back; the tab's close captures
/// the calls served, and only those.
#[tokio::test]
async fn a_call_the_upstream_never_got_is_charged_to_nobody_whatever_paid_for_it() {
    let port = free_port();
    let (up, mut upstream) = wsgi_upstream_at(false, port).await;
    let s = Setup::priced(&up, FORECAST, TABS).await;
    let _gw = s.gateway().await;
    let base = s.origin.clone();
    let client = in_process_client(&s).await;
    let before = s.agent().await.0;
    let call = |city: &str| {
        let (client, url) = (&client, format!("{base}/api/forecast/{city}"));
        async move { client.get(&url).await.unwrap() }
    };
    let r = call("oslo").await;
    assert_eq!(r.status, 200);
    assert!(r.tab_call.is_some(), "the tab is open and paid this call");

    // The upstream stops. A forward went through less than 2 s ago, so the gateway counts it
    // up: the voucher's call is forwarded, the connection refused — the voucher taken back.
    upstream.kill().await.unwrap();
    let r = call("lima").await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert!(r.tab_call.is_none(), "not charged");
    assert!(
        r.headers["stipendex-tab-call"]
            .to_str()
            .unwrap()
            .ends_with("; uncounted")
    );
    // Later the gateway knows it is down: refused by its guard before the voucher is counted.
    tokio::time::sleep(Duration::from_millis(2200)).await;
    let r = call("pune").await;
    assert_eq!(r.status, 503);
    assert!(r.tab_call.is_none(), "not charged");
    // A Proof: refused before it is claimed.
    let rome = format!("{base}/api/forecast/rome");
    let proof = s.paid_proof("GET", &rome).await;
    let r = get_paid(&rome, &proof).await;
    assert_eq!(r.status(), 503);

    // The upstream is back: the tab goes on at the sequence not counted, and the same Proof is
    // served once.
    let (_, _upstream) = wsgi_upstream_at(false, port).await;
    let r = call("kiev").await;
    assert_eq!(r.status, 200);
    assert!(r.tab_call.is_some());
    let r = get_paid(&rome, &proof).await;
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("stipendex-receipt"));
    let receipts = client.close_tabs().await.unwrap();
    assert_eq!(
        (receipts[0].object().calls, receipts[0].object().captured),
        (2, "0.10".parse().unwrap()),
        "the two calls served, nothing for the two the upstream never got"
    );
    assert_eq!(s.agent().await, (before - 15, 0));
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// One refused tab opening, as an outsider makes it: a fresh tab from a 402, sent back with a
/// throwaway key, a bogus hold and a voucher.
async fn bogus_tab_opening(http: &reqwest::Client, base: &str) {
    use stipendex::envelope::{Digest, Proof, Tab, Tag, Voucher, new_id};
    let url = format!("{base}/api/forecast/paris");
    let r = http.get(&url).send().await.unwrap();
    assert_eq!(r.status(), 402);
    let body: Value = r.json().await.unwrap();
    let tab: Signed<Tab> = serde_json::from_value(body["tab"].clone()).unwrap();
    let t = tab.object();
    let offer = &t.rails[0].offer;
    let key = SecretKey::generate();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let proof = Signed::sign(
        Proof {
            stipendex: Tag::current("proof"),
            id: new_id("p_"),
            wallet: key.public(),
            mandate: Digest::of(b"no mandate"),
            quote: None,
            quote_jws: None,
            tab: Some(tab.digest().clone()),
            tab_jws: Some(tab.jws().to_owned()),
            challenge: None,
            confirmation: None,
            confirmation_jws: None,
            iat: now,
            mode: rail_core::PaymentMode::Hold,
            rail: offer.rail.as_str().to_owned(),
            asset: t.asset.clone(),
            amount: t.cap,
            payment: rail_core::Payment {
                rail: offer.rail.clone(),
                offer_id: offer.id.clone(),
                mode: rail_core::PaymentMode::Hold,
                payer: AccountId::random().to_string(),
                amount: offer.amount.clone(),
                proof: json!({"transfer": AccountId::random().to_string()}),
            },
        },
        &key,
    )
    .unwrap();
    let resource = stipendex::envelope::Resource {
        origin: base.to_owned(),
        method: "GET".into(),
        path: "/api/forecast/paris".into(),
        query: None,
    };
    let voucher = Signed::sign(
        Voucher {
            stipendex: Tag::current("voucher"),
            id: new_id("v_"),
            wallet: key.public(),
            tab: t.id.clone(),
            tab_digest: tab.digest().clone(),
            lane: 0,
            seq: 1,
            asset: t.asset.clone(),
            amount: "0.05".parse().unwrap(),
            cumulative: "0.05".parse().unwrap(),
            request: stipendex::receiver::Request::from_resource(&resource).digest(),
            resource,
            iat: now,
        },
        &key,
    )
    .unwrap();
    let r = http
        .get(&url)
        .header("stipendex-voucher", voucher.to_header())
        .header("stipendex-tab", proof.to_header())
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body = r.text().await.unwrap_or_default();
    assert_eq!(status, 402, "refused, with a fresh Quote: {body}");
}

/// Issue 44: refused tab openings leave nothing behind: 8,000 of them, from one client, grow
/// the gateway's resident memory by at most 4 MiB (it grew by about 13 MB before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_thousand_refused_tab_openings_leave_the_gateway_no_bigger() {
    let (up, _upstream) = wsgi_upstream(false).await;
    let s = Setup::priced(&up, FORECAST, TABS).await;
    // Records in memory: what is measured is what stays in memory, and a refused hold's
    // reservation (written and removed by the ledger rail) costs no fsync here.
    let text = s.read("gateway.toml");
    let store = text
        .lines()
        .find(|l| l.starts_with("url = \"sqlite://"))
        .unwrap();
    s.write("gateway.toml", &text.replacen(store, "url = \"memory\"", 1));
    let gw = s.gateway().await;
    let pid = gw.id().unwrap();
    let http = http();
    let run = |n: usize| {
        let (http, base) = (http.clone(), s.origin.clone());
        async move {
            futures::stream::iter(0..n)
                .for_each_concurrent(32, |_| {
                    let (http, base) = (http.clone(), base.clone());
                    async move { bogus_tab_opening(&http, &base).await }
                })
                .await;
        }
    };
    run(500).await; // the allocator's pools and the connections, warmed
    let before = rss_kib(pid);
    run(8000).await;
    let after = rss_kib(pid);
    eprintln!("refused tab openings: the gateway's RSS {before} KiB, then {after} KiB after 8,000");
    assert!(
        after.saturating_sub(before) <= 4 * 1024,
        "8,000 refused tab openings grew the gateway from {before} KiB to {after} KiB"
    );
}

/// Issue 44: a paid answer of 17 MiB (more than any buffer on the way: the receiver spools it,
/// `stipendex fetch` streams it) reaches the payer whole with its Receipt, paid once — by a
/// Quote, or by a voucher inside a tab.
#[tokio::test]
async fn a_17_mib_paid_answer_reaches_fetch_whole_with_its_receipt() {
    let (up, _upstream) = wsgi_upstream(false).await;
    for tabs in ["", TABS] {
        let s = Setup::priced(&up, FORECAST, tabs).await;
        let _gw = s.gateway().await;
        let before = s.agent().await.0;
        let (out, err) = s.fetch_ok(&[&format!("{}/api/big/17", s.origin)]).await;
        assert_eq!(out.len(), 17 * 1024 * 1024, "{err}");
        assert!(out.bytes().all(|b| b == b'x'));
        if tabs.is_empty() {
            assert!(err.contains("paid 0.05 USD"), "{err}");
            assert!(err.contains("receipt"), "{err}");
        } else {
            assert!(err.contains(": 1 call, captured 0.05"), "{err}");
        }
        assert_eq!(s.agent().await, (before - 5, 0));
    }
}

/// Issue 46: `/readyz` names an x402 facilitator the gateway cannot reach (`GET
/// {facilitator_url}/supported`), and asks a facilitator at most once per 5 s however often
/// `/readyz` is asked (it cannot be used to flood the facilitator).
#[tokio::test]
async fn readyz_reports_an_unreachable_facilitator() {
    let (up, _seen, _task) = upstream().await;
    // The gateway, started with an x402 rail settled by `facilitator`.
    let with_facilitator = async |facilitator: &str| {
        let s = Setup::new(&up, "").await;
        s.add_gateway_rail(&format!(
            "[rails.usdc]\nkind = \"x402\"\nnetwork = \"eip155:84532\"\ntoken = \"0x036CbD53842c5426634e7929541eC2318f3dCF7e\"\ntoken_name = \"USDC\"\ntoken_version = \"2\"\npay_to = \"0x209693Bc6afc0C5328bA36FaF03C514EF312287C\"\nfacilitator_url = \"{facilitator}\"\n"
        ));
        let gw = s.gateway().await;
        (s, gw)
    };
    // A facilitator on a closed port.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let (s, _gw) = with_facilitator(&closed).await;
    let r = s.ops_get("/readyz").await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["status"], "not_ready", "{body}");
    let failing = body["failing"].as_array().unwrap();
    assert_eq!(failing.len(), 1, "{body}");
    let named = failing[0].as_str().unwrap();
    assert!(
        named.starts_with(&format!("facilitator {closed} unreachable: ")),
        "{body}"
    );

    // A facilitator that answers: ready, and asked once for many /readyz.
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = asked.clone();
    let app = Router::new().route(
        "/supported",
        get(move || {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {
                axum::Json(json!({"kinds": [{"x402Version": 2, "scheme": "exact", "network": "eip155:84532"}], "extensions": [], "signers": {}}))
            }
        }),
    );
    let live = serve(app).await;
    let (s, _gw) = with_facilitator(&live).await;
    for _ in 0..20 {
        let r = s.ops_get("/readyz").await;
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    }
    assert_eq!(
        asked.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "twenty /readyz within 5 s ask the facilitator once"
    );
}

/// The receiver engine behind the gateway: a request paid through it is decided once (its
/// `stipendex::decide` trace lines, one per decision) and asks the price hook (`resolve_url`)
/// once — for the Quote; the paid retry's Proof is not priced again. The forward reads a
/// checkout's asset from the binding's decision (before, it decided a second time).
#[tokio::test]
async fn through_the_gateway_a_paid_request_decides_once_and_asks_the_hook_once() {
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = asked.clone();
    let pricing = Router::new().route(
        "/price",
        post(move |axum::Json(_): axum::Json<Value>| {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { axum::Json(json!({"decision": "quote", "amount": "0.05"})) }
        }),
    );
    let purl = format!("{}/price", serve(pricing).await);
    let (up, seen, _task) = upstream().await;
    let s = Setup::new(&up, &format!("resolve_url = \"{purl}\"")).await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let _gw = start_gateway_logging(
        &s.dir.join("gateway.toml"),
        s.port,
        "info,stipendex::decide=trace",
        Some(log.clone()),
    )
    .await;
    let decided = || {
        log.lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("stipendex::decide"))
            .count()
    };
    let before = decided();
    s.fetch_ok(&[&format!("{}/api/forecast/paris", s.origin)])
        .await;
    assert_eq!(seen.count("/api/forecast/paris"), 1, "forwarded once");
    // The 402 and the paid retry: two requests, two decisions, the hook asked for the Quote.
    // The log is read from the gateway's stderr as it comes: wait for its lines (at most 5 s),
    // then a moment more for a third that must not come.
    for _ in 0..50 {
        if decided() - before >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(decided() - before, 2, "{:?}", log.lock().unwrap());
    assert_eq!(asked.load(std::sync::atomic::Ordering::SeqCst), 1);
}
