//! Quotes whose offers cost something (a Stripe PaymentIntent, a Lightning invoice) are limited
//! per client: an unpaid request must not make the receiver create objects without end.
//!
//! A fixed window per client, in memory (per instance: a fleet of `n` instances admits up to
//! `n` times the limit). Clients are told apart by [`super::Request::client`] (the HTTP binding
//! sets the peer's IP address when the server is run with `ConnectInfo`); requests without one
//! share one window.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The default: 60 Quotes with costly offers per client per minute.
pub const DEFAULT_COSTLY_QUOTES: (u32, Duration) = (60, Duration::from_secs(60));

/// How many clients' windows are kept before stale ones are swept.
const SWEEP_AT: usize = 10_000;

#[derive(Debug)]
pub(crate) struct Limiter {
    max: u32,
    per_ms: i64,
    windows: Mutex<HashMap<String, (i64, u32)>>,
}

impl Limiter {
    pub(crate) fn new(max: u32, per: Duration) -> Self {
        Limiter {
            max,
            per_ms: i64::try_from(per.as_millis()).unwrap_or(i64::MAX).max(1),
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one costly Quote for `client` at `now_ms`: `Ok` if within the limit, else the
    /// milliseconds until its window ends.
    pub(crate) fn admit(&self, client: &str, now_ms: i64) -> Result<(), i64> {
        let Ok(mut w) = self.windows.lock() else {
            return Ok(());
        };
        if w.len() >= SWEEP_AT {
            let per = self.per_ms;
            w.retain(|_, (start, _)| now_ms.saturating_sub(*start) < per);
        }
        let entry = w.entry(client.to_owned()).or_insert((now_ms, 0));
        if now_ms.saturating_sub(entry.0) >= self.per_ms {
            *entry = (now_ms, 0);
        }
        if entry.1 >= self.max {
            return Err(entry.0.saturating_add(self.per_ms).saturating_sub(now_ms));
        }
        entry.1 = entry.1.saturating_add(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_window_admits_its_limit_per_client_then_resets() {
        let l = Limiter::new(2, Duration::from_secs(60));
        assert!(l.admit("a", 0).is_ok());
        assert!(l.admit("a", 1).is_ok());
        assert_eq!(l.admit("a", 2), Err(59_998));
        assert!(l.admit("b", 2).is_ok(), "another client has its own window");
        assert!(l.admit("a", 60_000).is_ok(), "a new window");
    }
}
