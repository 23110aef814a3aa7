//! `stipendex bench mcp`: the MCP binding's cost over the ledger rail on embedded SQLite, the
//! server on Streamable HTTP (127.0.0.1), one connection per client:
//!
//! 1. the same tool unpriced (the baseline: rmcp over HTTP);
//! 2. unpaid calls of the priced tool, each answered -32402 with a fresh signed Quote;
//! 3. paid calls through `PayingClient` (quote → wallet pay → retry with the Proof → admit →
//!    run → Receipt checked);
//! 4. and 5. the unpriced and the paid tool through the proxy (one proxy per host, the host on
//!    an in-memory pipe, as on stdio).

// Timings and rates, never money: floats are fine here.
#![allow(clippy::float_arithmetic, clippy::cast_precision_loss)]

use std::sync::Arc;
use std::time::Duration;

use rail_core::Money;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use stipendex::mcp::PaidServer;
use stipendex::mcp::client::PayingClient;
use stipendex::mcp::proxy::{Proxy, Upstream};
use stipendex::receiver::PricedCapability;

use crate::bench_common::{load, percentiles};
use crate::{CliError, msg};

/// One tool, `search` (priced) and `search_free` (not), doing the same work.
#[derive(Clone, Copy)]
struct Bench;

impl ServerHandler for Bench {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(CallToolResult::success(vec![ContentBlock::text(format!(
            "results for {}",
            request.name
        ))])
        .into())
    }
}

fn call(name: &str) -> CallToolRequestParams {
    let mut p = CallToolRequestParams::new(name.to_owned());
    p.arguments = serde_json::json!({"q": "bench"}).as_object().cloned();
    p
}

#[allow(clippy::print_stdout)]
fn row(what: &str, seconds: u64, ok: usize, bad: usize, lat: &mut [Duration]) -> f64 {
    let (p50, p99) = percentiles(lat);
    println!(
        "{what:<34} {:>8.0} /s   p50 {p50:>6.2} ms   p99 {p99:>6.2} ms   ({ok} ok, {bad} errors)",
        ok as f64 / seconds as f64
    );
    p50
}

/// Runs the MCP bench in `dir`.
#[allow(clippy::print_stdout, clippy::too_many_lines)]
pub(crate) async fn run(
    dir: &std::path::Path,
    concurrency: usize,
    seconds: u64,
) -> Result<(), CliError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let crate::bench_common::Fixture {
        listener,
        base,
        wallet,
        shop,
        ..
    } = crate::bench_common::fixture(dir).await?;
    let usd = |s: &str| Money::parse(stipendex::Asset::usd(), s).map_err(|e| msg(e.to_string()));
    let receiver = shop
        .price(PricedCapability::fixed(
            "tools/call",
            "search",
            usd("0.01")?,
        ))
        .build()?;
    let server = PaidServer::new(Bench, receiver)?;
    let app = stipendex::mcp::streamable_http("/mcp", move || Ok(server.clone()));
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    let url = format!("{base}/mcp");
    println!(
        "stipendex bench mcp: ledger rail on SQLite, Streamable HTTP on 127.0.0.1, {concurrency} clients, {seconds} s per phase"
    );

    // One rmcp client per concurrent caller, over Streamable HTTP.
    let http = || {
        reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| msg(e.to_string()))
    };
    let mut direct = Vec::new();
    for _ in 0..concurrency {
        let t = rmcp::transport::StreamableHttpClientTransport::with_client(
            http()?,
            rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig::with_uri(
                url.as_str(),
            ),
        );
        let c = ().serve(t).await.map_err(|e| msg(e.to_string()))?;
        direct.push(Arc::new(c));
    }
    let pick = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let next = {
        let pick = pick.clone();
        move |n: usize| pick.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n
    };

    // 1. Unpriced.
    let d = direct.clone();
    let n = next.clone();
    let (ok, bad, mut lat) = load(concurrency, seconds, move |_| {
        let c = d.get(n(d.len())).cloned();
        async move {
            match c {
                Some(c) => c.call_tool(call("search_free")).await.is_ok(),
                None => false,
            }
        }
    })
    .await;
    let base50 = row("unpriced call", seconds, ok, bad, &mut lat);

    // 2. Unpaid calls of the priced tool: -32402 with a signed Quote.
    let d = direct.clone();
    let n = next.clone();
    let (ok, bad, mut lat) = load(concurrency, seconds, move |_| {
        let c = d.get(n(d.len())).cloned();
        async move {
            let Some(c) = c else { return false };
            matches!(
                c.call_tool(call("search")).await,
                Err(rmcp::service::ServiceError::McpError(e)) if e.code.0 == stipendex::mcp::PAYMENT_REQUIRED
            )
        }
    })
    .await;
    let quote50 = row("unpaid call (-32402 + quote)", seconds, ok, bad, &mut lat);

    // 3. Paid calls, end to end.
    let mut paying: Vec<Arc<PayingClient>> = Vec::new();
    for c in &direct {
        paying.push(Arc::new(PayingClient::new(
            c.peer().clone(),
            wallet.clone(),
            &base,
        )?));
    }
    let p = paying.clone();
    let n = next.clone();
    // Each paid call a request of its own (`q=bench-<n>`): identical requests of one wallet
    // wait for each other (one payment per request), which is not what this phase measures.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (ok, bad, mut lat) = load(concurrency, seconds, move |_| {
        let c = p.get(n(p.len())).cloned();
        let k = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let args = serde_json::json!({"q": format!("bench-{k}")}).as_object().cloned();
        async move {
            let Some(c) = c else { return false };
            matches!(c.call_tool("search", args).await, Ok((r, Some(_))) if r.is_error != Some(true))
        }
    })
    .await;
    let paid50 = row(
        "paid call (quote, pay, receipt)",
        seconds,
        ok,
        bad,
        &mut lat,
    );

    // 4. and 5. Through the proxy: one per host, the host on an in-memory pipe.
    let mut hosts = Vec::new();
    for _ in 0..concurrency {
        let proxy = Proxy::new(wallet.clone(), Upstream::Url(url.clone()), None)?;
        let (proxy_io, host_io) = tokio::io::duplex(1 << 20);
        tokio::spawn(async move {
            let _ = proxy.serve(proxy_io).await;
        });
        let host = ().serve(host_io).await.map_err(|e| msg(e.to_string()))?;
        hosts.push(Arc::new(host));
    }
    let h = hosts.clone();
    let n = next.clone();
    let (ok, bad, mut lat) = load(concurrency, seconds, move |_| {
        let c = h.get(n(h.len())).cloned();
        async move {
            match c {
                Some(c) => c.call_tool(call("search_free")).await.is_ok(),
                None => false,
            }
        }
    })
    .await;
    let proxy_free50 = row(
        "unpriced call through the proxy",
        seconds,
        ok,
        bad,
        &mut lat,
    );
    let h = hosts.clone();
    let n = next.clone();
    // A request of its own per call, as in the direct phase: identical requests of one wallet
    // wait for each other (100 ms at a time), which made this row's p99 about a second.
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (ok, bad, mut lat) = load(concurrency, seconds, move |_| {
        let c = h.get(n(h.len())).cloned();
        let k = calls.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut params = call("search");
        params.arguments = serde_json::json!({"q": format!("proxy-{k}")})
            .as_object()
            .cloned();
        async move {
            let Some(c) = c else { return false };
            matches!(c.call_tool(params).await, Ok(r) if r.is_error != Some(true) && r.meta.is_some())
        }
    })
    .await;
    let proxy_paid50 = row("paid call through the proxy", seconds, ok, bad, &mut lat);

    println!(
        "gate's quote over the unpriced call:  p50 +{:.2} ms; a paid call over the unpriced one: p50 +{:.2} ms",
        quote50 - base50,
        paid50 - base50
    );
    println!(
        "the proxy's hop: unpriced p50 +{:.2} ms; paid p50 +{:.2} ms",
        proxy_free50 - base50,
        proxy_paid50 - paid50
    );
    Ok(())
}
