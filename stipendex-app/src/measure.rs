//! What the benches print: percentiles of latencies and milliseconds without floats (shared
//! with the test runner's `conformance bench`).

/// The `p`th percentile of sorted latencies (0 for none).
#[must_use]
pub fn pct(sorted: &[u64], p: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = (sorted.len() * p / 100).min(sorted.len() - 1);
    sorted.get(idx).copied().unwrap_or(0)
}

/// Microseconds shown as milliseconds with one decimal, without floats (width and alignment
/// apply).
pub struct Ms(pub u64);

impl std::fmt::Display for Ms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&format!("{}.{}", self.0 / 1000, (self.0 % 1000) / 100))
    }
}
