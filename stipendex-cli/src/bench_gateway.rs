//! `stipendex bench gateway`: the gateway beside the upstream it fronts, on the same machine —
//! the ledger rail on embedded SQLite, everything on 127.0.0.1:
//! - a free request, to the upstream directly and through the gateway (the gateway's added
//!   latency);
//! - a priced request unpaid (402 with a signed Quote) and paid end to end (quote, wallet pay,
//!   retry, verify, forward, Receipt), beside the upstream answering the same path directly;
//! - where the x402 localnet and the reference SDK are installed (`X402_RPC_URL`,
//!   `scripts/x402`), the reference x402 express paywall (`@x402/express`, `ref-server.mjs`):
//!   its unpaid 402 and its free route.

// Timings and rates, never money: floats are fine here.
#![allow(clippy::float_arithmetic, clippy::cast_precision_loss)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::Router;
use axum::extract::Path as UrlPath;
use axum::routing::get;
use rail_core::Money;
use serde_json::json;
use stipendex::http::Client;
use stipendex::receiver::PricedCapability;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::bench_common::{Fixture, fixture, load, percentiles};
use crate::{CliError, msg};
use stipendex::gateway::{Gateway, Parts, Settings, Upstream};

/// One measured phase.
struct Row {
    what: String,
    clients: usize,
    rate: f64,
    p50: f64,
    p99: f64,
    errors: usize,
}

#[allow(clippy::print_stdout)]
fn print(r: &Row) {
    println!(
        "{:<44} {:>3} clients {:>9.0} /s   p50 {:>7.3} ms   p99 {:>7.3} ms{}",
        r.what,
        r.clients,
        r.rate,
        r.p50,
        r.p99,
        if r.errors > 0 {
            format!("   ({} errors)", r.errors)
        } else {
            String::new()
        }
    );
}

/// `GET url` from `clients` clients for `seconds`, a success being `status`.
async fn get_phase(
    http: &reqwest::Client,
    what: &str,
    url: &str,
    status: u16,
    clients: usize,
    seconds: u64,
) -> Row {
    let (h, u) = (http.clone(), url.to_owned());
    let (ok, bad, mut lat) = load(clients, seconds, move |_| {
        let (h, u) = (h.clone(), u.clone());
        async move {
            match h.get(&u).send().await {
                Ok(r) if r.status().as_u16() == status => r.bytes().await.is_ok(),
                _ => false,
            }
        }
    })
    .await;
    let (p50, p99) = percentiles(&mut lat);
    let row = Row {
        what: what.to_owned(),
        clients,
        rate: ok as f64 / seconds as f64,
        p50,
        p99,
        errors: bad,
    };
    print(&row);
    row
}

/// The reference x402 express paywall (and its facilitator), where installed: its URL.
async fn reference() -> Option<(Vec<tokio::process::Child>, String)> {
    let scripts = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/x402");
    let (Ok(rpc), Ok(key), Ok(pay_to)) = (
        std::env::var("X402_RPC_URL"),
        std::env::var("X402_FACILITATOR_KEY"),
        std::env::var("X402_PAY_TO"),
    ) else {
        return None;
    };
    if !scripts.join("node_modules/@x402/express").is_dir() {
        return None;
    }
    let start = |script: &str, env: Vec<(&str, String)>| {
        let mut c = tokio::process::Command::new("node");
        c.arg(scripts.join(script))
            .current_dir(&scripts)
            .env("PORT", "0")
            .envs(env)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true);
        c.spawn().ok()
    };
    async fn listening(child: &mut tokio::process::Child) -> Option<String> {
        let mut lines = BufReader::new(child.stdout.take()?).lines();
        tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(Some(l)) = lines.next_line().await {
                if let Some(u) = l.strip_prefix("Listening on ") {
                    return Some(u.trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
    }
    let token = std::env::var("X402_TOKEN").unwrap_or_default();
    let chain = std::env::var("X402_CHAIN_ID").unwrap_or_else(|_| "31337".into());
    let mut f = start(
        "ref-facilitator.mjs",
        vec![
            ("X402_RPC_URL", rpc.clone()),
            ("X402_TOKEN", token.clone()),
            ("X402_CHAIN_ID", chain.clone()),
            ("X402_FACILITATOR_KEY", key),
        ],
    )?;
    let furl = listening(&mut f).await?;
    let mut s = start(
        "ref-server.mjs",
        vec![
            ("X402_RPC_URL", rpc),
            ("X402_TOKEN", token),
            ("X402_CHAIN_ID", chain),
            ("X402_FACILITATOR_URL", furl),
            ("X402_PAY_TO", pay_to),
        ],
    )?;
    let surl = listening(&mut s).await?;
    Some((vec![f, s], surl))
}

/// Runs `stipendex bench gateway`.
#[allow(clippy::print_stdout)]
pub(crate) async fn run(dir: &Path, seconds: u64) -> Result<(), CliError> {
    let Fixture {
        listener,
        base,
        wallet,
        shop,
        ..
    } = fixture(dir).await?;
    // The upstream: knows nothing of payments.
    let upstream = Router::new()
        .route("/free", get(|| async { axum::Json(json!({"ok": true})) }))
        .route(
            "/api/forecast/{city}",
            get(|UrlPath(city): UrlPath<String>| async move {
                axum::Json(json!({"city": city, "forecast": "sunny"}))
            }),
        );
    let up_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| msg(e.to_string()))?;
    let up = format!(
        "http://{}",
        up_listener.local_addr().map_err(|e| msg(e.to_string()))?
    );
    tokio::spawn(async move {
        let _ = axum::serve(up_listener, upstream).await;
    });
    let price = Money::parse(stipendex::Asset::usd(), "0.01").map_err(|e| msg(e.to_string()))?;
    let cap = PricedCapability::fixed("GET", "/api/forecast/{city}", price);
    let receiver = shop.price(cap.clone()).build()?;
    let upstream = Upstream::Http(url::Url::parse(&up).map_err(|e| msg(e.to_string()))?);
    let router = Gateway::assemble(Settings::new(upstream), Parts::new(receiver))
        .await?
        .router();
    tokio::spawn(async move {
        let _ = axum::serve(
            listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await;
    });
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(256)
        .build()
        .map_err(|e| msg(e.to_string()))?;
    println!(
        "stipendex bench gateway: ledger rail on SQLite, 127.0.0.1, {seconds} s per phase, the same machine for the upstream, the gateway and the clients"
    );
    // Warm both paths (connections, caches), then measure them in turn, twice: the added
    // latency is taken from the two runs' mean p50 and p99 (one run alone swings with the
    // machine).
    for u in [format!("{up}/free"), format!("{base}/free")] {
        let h = http.clone();
        let _ = load(8, 1, move |_| {
            let (h, u) = (h.clone(), u.clone());
            async move { h.get(&u).send().await.is_ok() }
        })
        .await;
    }
    let mut direct = Vec::new();
    let mut via = Vec::new();
    for _ in 0..2 {
        direct.push(
            get_phase(
                &http,
                "free request, upstream directly",
                &format!("{up}/free"),
                200,
                8,
                seconds,
            )
            .await,
        );
        via.push(
            get_phase(
                &http,
                "free request, through the gateway",
                &format!("{base}/free"),
                200,
                8,
                seconds,
            )
            .await,
        );
    }
    let mean = |rows: &[Row], f: fn(&Row) -> f64| {
        rows.iter().map(f).sum::<f64>() / rows.len().max(1) as f64
    };
    println!(
        "{:<44}             added p50 {:>7.3} ms   p99 {:>7.3} ms",
        "gateway's added latency (free, 8 clients)",
        mean(&via, |r| r.p50) - mean(&direct, |r| r.p50),
        mean(&via, |r| r.p99) - mean(&direct, |r| r.p99)
    );
    let client = Client::new(
        stipendex::http::reqwest_builder(Duration::from_secs(30)),
        wallet,
    )?;
    for clients in [8, 64] {
        get_phase(
            &http,
            "priced path, upstream directly (no payment)",
            &format!("{up}/api/forecast/paris"),
            200,
            clients,
            seconds,
        )
        .await;
        get_phase(
            &http,
            "unpaid: 402 with a signed Quote",
            &format!("{base}/api/forecast/paris"),
            402,
            clients,
            seconds,
        )
        .await;
        let (c, u) = (client.clone(), format!("{base}/api/forecast/paris"));
        let why: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>> =
            std::sync::Arc::default();
        let w = why.clone();
        // Each paid call a request of its own: identical requests of one wallet wait for each
        // other (one payment per request), which is not what this phase measures.
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (ok, bad, mut lat) = load(clients, seconds, move |_| {
            let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (c, u, w) = (c.clone(), format!("{u}?n={n}"), w.clone());
            async move {
                let failed = match c.get(&u).await {
                    Ok(r) if r.status.as_u16() == 200 && r.receipt.is_some() => return true,
                    Ok(r) => format!("status {}", r.status),
                    Err(e) => e.to_string().chars().take(120).collect(),
                };
                if let Ok(mut m) = w.lock() {
                    *m.entry(failed).or_default() += 1;
                }
                false
            }
        })
        .await;
        if let Ok(m) = why.lock() {
            for (reason, n) in m.iter() {
                println!("    {n} × {reason}");
            }
        }
        let (p50, p99) = percentiles(&mut lat);
        print(&Row {
            what: "paid: quote, pay, forward, Receipt".into(),
            clients,
            rate: ok as f64 / seconds as f64,
            p50,
            p99,
            errors: bad,
        });
    }
    match reference().await {
        None => println!(
            "reference x402 express paywall: not measured (needs the x402 localnet's variables and scripts/x402/install.sh)"
        ),
        Some((_children, surl)) => {
            get_phase(
                &http,
                "reference express: free route (/health)",
                &format!("{surl}/health"),
                200,
                8,
                seconds,
            )
            .await;
            for clients in [8, 64] {
                get_phase(
                    &http,
                    "reference express: unpaid 402 (/weather)",
                    &format!("{surl}/weather"),
                    402,
                    clients,
                    seconds,
                )
                .await;
            }
        }
    }
    Ok(())
}
