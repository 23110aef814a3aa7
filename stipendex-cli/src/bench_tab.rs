//! `stipendex bench tabs`: paid calls inside tab sessions beside the per-call path, over the
//! ledger rail on embedded SQLite (the wallet's and the receiver's records in SQLite too, durable
//! commits), HTTP on 127.0.0.1, client and server in this one process.
//!
//! 1. the per-call path (quote, pay, receipt) at 8 clients;
//! 2. tabs, one per client, at 8 and at 64 clients;
//! 3. one tab of 8 lanes shared by 64 clients.
//!
//! Each tab phase opens its tabs before the clock starts (one 402 and one hold per tab) and
//! closes them after; it prints calls per second, p50, p99, errors, and the process's CPU time
//! per call beside the cost of one Ed25519 signature and one verification on this machine (a
//! call inside a tab costs the wallet one signature and the receiver one verification): the
//! distance to the signature-bound limit.

// Timings and rates, never money: floats are fine here.
#![allow(clippy::float_arithmetic, clippy::cast_precision_loss)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use rail_core::Money;
use rail_core::keys::sql::SqliteKeyStore;
use stipendex::envelope::SecretKey;
use stipendex::http::{Binding, Client};
use stipendex::receiver::{PricedCapability, Receiver, TabTerms};

use crate::bench_common::{Fixture, fixture, load, percentiles};
use crate::{CliError, msg};

/// The process's CPU time (user + system), from `/proc/self/stat` (Linux; `None` elsewhere).
fn cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}

/// One Ed25519 signature and one verification, each, on this machine (µs).
fn signature_costs() -> (f64, f64) {
    let key = SecretKey::generate();
    let message = [7u8; 400];
    let n = 2_000;
    let t = Instant::now();
    let mut sig = [0u8; 64];
    for _ in 0..n {
        sig = key.sign(&message);
    }
    let sign = t.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    let public = key.public();
    let t = Instant::now();
    for _ in 0..n {
        let _ = public.verify(&message, &sig);
    }
    let verify = t.elapsed().as_secs_f64() * 1e6 / f64::from(n);
    (sign, verify)
}

/// Runs `seconds` of calls by `clients` concurrent agents, agent `i` using `client_of(i)`;
/// prints one line.
#[allow(clippy::print_stdout)]
async fn phase(
    label: &str,
    clients: usize,
    seconds: u64,
    url: &str,
    client_of: &(dyn Fn(usize) -> Client + Sync),
    tabbed: bool,
) -> f64 {
    // Agent `i` keeps client `i` (its tab) for the whole phase.
    let agents: Arc<Vec<Client>> = Arc::new((0..clients).map(client_of).collect());
    let u = url.to_owned();
    let cpu0 = cpu();
    // Each call a request of its own (`q=bench-<n>`): identical requests of one wallet wait
    // for each other (one payment per request), which is not what a phase measures.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (ok, bad, mut lat) = load(clients, seconds, move |i| {
        let n = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (agents, u) = (agents.clone(), format!("{u}-{n}"));
        async move {
            let Some(c) = agents.get(i) else { return false };
            matches!(c.get(&u).await, Ok(r) if r.status.as_u16() == 200
                && (if tabbed { r.tab_call.is_some() } else { r.receipt.is_some() }))
        }
    })
    .await;
    let cpu_us = match (cpu0, cpu()) {
        (Some(a), Some(b)) if ok > 0 => {
            format!(
                "{:>6.0}",
                b.saturating_sub(a).as_secs_f64() * 1e6 / ok as f64
            )
        }
        _ => "   n/a".into(),
    };
    let (p50, p99) = percentiles(&mut lat);
    let rate = ok as f64 / seconds as f64;
    println!(
        "{label:<34} {rate:>8.0} /s   p50 {p50:>6.2} ms   p99 {p99:>6.2} ms   CPU {cpu_us} µs/call   ({ok} ok, {bad} errors)"
    );
    rate
}

/// `stipendex bench tabs`.
#[allow(clippy::print_stdout)]
pub(crate) async fn run(dir: &Path, seconds: u64) -> Result<(), CliError> {
    let Fixture {
        listener,
        base,
        wallet,
        shop,
        shop_key,
        stage,
    } = fixture(dir).await?;
    let usd = |s: &str| Money::parse(stipendex::Asset::usd(), s).map_err(|e| msg(e.to_string()));
    let store = |name: &str| {
        let path = dir.join(name);
        async move {
            SqliteKeyStore::open(&path)
                .await
                .map(Arc::new)
                .map_err(|e| msg(format!("the receiver's store: {e}")))
        }
    };
    // Two receivers of bench-shop on one origin: the per-call route and the tab route.
    let per_call = shop
        .store(store("shop-calls.db").await?)
        .price(PricedCapability::fixed(
            "GET",
            "/calls/search",
            usd("0.01")?,
        ))
        .build()?;
    let kind = stage.payer.payer.id().as_str().to_owned();
    let tabs = Receiver::builder("bench-shop", shop_key)
        .origin(&base)
        .rail(&kind, stage.receiver.clone())
        .store(store("shop-tabs.db").await?)
        .price(PricedCapability::fixed("GET", "/tabs/search", usd("0.01")?))
        .tabs(TabTerms::new(usd("1000.00")?).lanes(8))
        .build()?;
    let app = Router::new()
        .merge(
            Binding::new(per_call)?
                .apply(Router::new().route("/calls/search", get(|| async { "results" }))),
        )
        .merge(
            Binding::new(tabs)?
                .apply(Router::new().route("/tabs/search", get(|| async { "results" }))),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let (sign, verify) = signature_costs();
    println!(
        "stipendex bench tabs: ledger rail on SQLite (durable commits), wallet and receiver records in SQLite, HTTP on 127.0.0.1, {seconds} s per phase"
    );
    println!(
        "one Ed25519 signature {sign:.1} µs, one verification {verify:.1} µs on this machine; a call inside a tab costs 1 signature (wallet) + 1 verification (receiver)"
    );
    let new_client = |_: usize| {
        Client::new(
            stipendex::http::reqwest_builder(Duration::from_secs(30)),
            wallet.clone(),
        )
        .unwrap_or_else(|_| unreachable!("the bench's HTTP client builds"))
    };
    let calls_url = format!("{base}/calls/search?q=bench");
    let tabs_url = format!("{base}/tabs/search?q=bench");
    let per_call_rate = phase(
        "per call (quote, pay, receipt), 8",
        8,
        seconds,
        &calls_url,
        &new_client,
        false,
    )
    .await;

    let mut best = 0.0f64;
    for (label, clients, shared) in [
        ("tabs, 8 clients, 8 tabs", 8, false),
        ("tabs, 64 clients, 64 tabs", 64, false),
        ("tabs, 64 clients, one tab of 8 lanes", 64, true),
    ] {
        // Each tab opened before the clock starts: one 402 and one hold per tab.
        let opened: Vec<Client> = (0..if shared { 1 } else { clients })
            .map(new_client)
            .collect();
        for c in &opened {
            let r = c
                .get(&tabs_url)
                .await
                .map_err(|e| msg(format!("opening a tab: {e}")))?;
            if r.tab_call.is_none() {
                return Err(msg("the bench's tab did not open"));
            }
        }
        let by = |i: usize| {
            opened
                .get(if shared { 0 } else { i })
                .cloned()
                .unwrap_or_else(|| unreachable!("one client per agent"))
        };
        let rate = phase(label, clients, seconds, &tabs_url, &by, true).await;
        best = best.max(rate);
        let t = Instant::now();
        let mut calls = 0;
        for c in &opened {
            for r in c
                .close_tabs()
                .await
                .map_err(|e| msg(format!("closing a tab: {e}")))?
            {
                calls += r.object().calls;
            }
        }
        println!(
            "   closed {} tab(s), {calls} calls captured, in {:.0} ms",
            opened.len(),
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    println!(
        "tabs / per call: {:.1}x; the signature-bound limit on 2 cores is about {:.0} calls/s",
        best / per_call_rate.max(1.0),
        2e6 / (sign + verify)
    );
    Ok(())
}
