//! What `conformance bench ledger`'s two loads share — ours on the ledger ([`crate::bench`]) and
//! pgledger's ([`crate::pgledger`]): the load's parameters, a phase's figures, the clients'
//! sequence of transfers and the gathering of their figures. Both import it, and pgledger
//! imports nothing of bench (bench calls pgledger: the arrow runs one way).

use std::time::Instant;

use stipendex_app::measure::pct;

/// Load parameters.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// `sqlite` or `postgres`.
    pub backend: String,
    /// Accounts transfers move between.
    pub accounts: usize,
    /// Concurrent clients.
    pub clients: usize,
    /// Seconds per phase (transfers, then hold+capture).
    pub seconds: u64,
    /// Transfers per client request.
    pub batch: usize,
    /// A pgledger checkout whose SQL runs the same transfer load right after ours
    /// ([`crate::pgledger`]; PostgreSQL only).
    pub versus_pgledger: Option<std::path::PathBuf>,
}

/// Measured figures of one phase.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    /// Operations completed (transfers, or hold+capture pairs).
    pub ops: u64,
    /// Requests refused by the ledger (no-overdraft), counted apart.
    pub refused: u64,
    /// Operations per second.
    pub per_sec: u64,
    /// Median request latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile request latency, microseconds.
    pub p99_us: u64,
}

/// The next of a client's pseudo-random transfers among `len` (≥ 2) accounts, from its state
/// `n`: (debit index, a different credit index, an amount of 1 to 100).
pub(crate) fn pick(n: &mut usize, len: usize) -> (usize, usize, u64) {
    *n = n
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    let d = (*n >> 33) % len;
    let k = 1 + (*n >> 17) % (len - 1);
    (d, (d + k) % len, 1 + (*n >> 7) as u64 % 100)
}

/// The figures of a phase whose clients (each returning its operations, refusals and request
/// latencies in microseconds) started at `start`.
pub(crate) async fn gather(
    tasks: Vec<tokio::task::JoinHandle<(u64, u64, Vec<u64>)>>,
    start: Instant,
) -> Phase {
    let mut all = Vec::new();
    let mut p = Phase::default();
    for t in tasks {
        if let Ok((ops, refused, lat)) = t.await {
            p.ops += ops;
            p.refused += refused;
            all.extend(lat);
        }
    }
    let ms = u64::try_from(start.elapsed().as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    all.sort_unstable();
    p.per_sec = p.ops * 1000 / ms;
    p.p50_us = pct(&all, 50);
    p.p99_us = pct(&all, 99);
    p
}
