//! The HTTP client of a facilitator: signs every request, sends mutating calls with an
//! idempotency key, and fails over between the facilitator's instances.
//!
//! **Retries.** A call that got no answer (connection refused or reset, timeout) or a
//! retryable refusal (`unavailable`, `storage_error`, `in_progress`) is sent again, signed
//! anew (a fresh nonce and time) but with the *same* idempotency key, to the next instance in
//! the list, a few times with a short pause. An instance that did not answer is skipped by
//! every call for a few seconds ([`DOWN_FOR`]). The facilitator applies a key once, so a request
//! that was applied before its answer was lost is answered the same and never applied twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use rail_core::{RailError, RailReason, RailResult, SharedClock, SystemClock};
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::api::{ErrorBody, WireError};
use crate::auth::{self, AccountKey, Canonical};

/// How a facilitator answered a call that succeeded.
#[derive(Debug)]
pub struct Answer<T> {
    /// The HTTP status (200, 201, 202).
    pub status: u16,
    /// The decoded body.
    pub body: T,
}

/// A signed client of one facilitator (one or more instances of it), for one account.
#[derive(Clone)]
pub struct AccountClient {
    http: reqwest::Client,
    bases: Arc<[String]>,
    next: Arc<AtomicUsize>,
    down: Arc<[AtomicU64]>,
    epoch: std::time::Instant,
    account: String,
    key: AccountKey,
    network: String,
    clock: SharedClock,
    attempts: usize,
}

impl std::fmt::Debug for AccountClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccountClient")
            .field("bases", &self.bases)
            .field("account", &self.account)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

/// How long an instance that did not answer is skipped.
pub const DOWN_FOR: Duration = Duration::from_secs(5);

/// The default time a call may take, answer included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

impl AccountClient {
    /// A client of the facilitator reachable at `urls` (one per instance, or one load
    /// balancer), acting for `account` (32 hex digits) with `key`, on the facilitator whose
    /// network name is `network` (offers from another facilitator are refused before any call).
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] for no URL, a URL that is not `http(s)://`, or an account
    /// id that is not 32 lowercase hex digits.
    pub fn new(
        urls: impl IntoIterator<Item = impl Into<String>>,
        account: &str,
        key: AccountKey,
        network: &str,
    ) -> RailResult<Self> {
        let bases: Vec<String> = urls
            .into_iter()
            .map(|u| u.into().trim_end_matches('/').to_owned())
            .collect();
        if bases.is_empty() {
            return Err(RailError::InvalidInput(
                "a facilitator client needs at least one URL".into(),
            ));
        }
        if let Some(bad) = bases
            .iter()
            .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
        {
            return Err(RailError::InvalidInput(format!(
                "facilitator URL {bad:?} is not http:// or https://"
            )));
        }
        crate::check_id(account)?;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(DEFAULT_TIMEOUT)
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .build()
            .map_err(|e| RailError::InvalidInput(format!("cannot build an HTTP client: {e}")))?;
        let attempts = (bases.len() * 2).max(3);
        Ok(AccountClient {
            http,
            down: bases.iter().map(|_| AtomicU64::new(0)).collect(),
            bases: bases.into(),
            next: Arc::new(AtomicUsize::new(0)),
            epoch: std::time::Instant::now(),
            account: account.to_owned(),
            key,
            network: network.to_owned(),
            clock: Arc::new(SystemClock),
            attempts,
        })
    }

    /// Signs with `clock`'s time (the facilitator checks it against its own).
    #[must_use]
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Uses `http` (timeouts, proxies) instead of the default client.
    #[must_use]
    pub fn with_http(mut self, http: reqwest::Client) -> Self {
        self.http = http;
        self
    }

    /// How many times a call is sent before its last error is returned (default: twice the
    /// number of instances, at least 3).
    #[must_use]
    pub fn with_attempts(mut self, attempts: usize) -> Self {
        self.attempts = attempts.max(1);
        self
    }

    /// The account this client acts for.
    #[must_use]
    pub fn account(&self) -> &str {
        &self.account
    }

    /// The facilitator's network name.
    #[must_use]
    pub fn network(&self) -> &str {
        &self.network
    }

    /// The clock requests are signed with.
    #[must_use]
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// `GET path`, signed.
    ///
    /// # Errors
    /// The facilitator's refusal, typed; [`RailError::Unavailable`] when no instance answers.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> RailResult<Answer<T>> {
        self.call(Method::GET, path, None, None).await
    }

    /// `POST path` with a JSON `body` and an idempotency key, signed.
    ///
    /// # Errors
    /// As [`AccountClient::get`].
    pub async fn post<B: Serialize + Sync, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        idempotency_key: &str,
    ) -> RailResult<Answer<T>> {
        let bytes = serde_json::to_vec(body)
            .map_err(|e| RailError::InvalidInput(format!("request body: {e}")))?;
        self.call(Method::POST, path, Some(bytes), Some(idempotency_key))
            .await
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
        idempotency_key: Option<&str>,
    ) -> RailResult<Answer<T>> {
        let body = body.unwrap_or_default();
        let mut last = None;
        // Each attempt goes to the next instance: a call never retries the one that failed it
        // while another is there.
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        for attempt in 0..self.attempts {
            if attempt > 0 {
                let pause = 25u64.saturating_mul(1 << attempt.min(5));
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            let (i, base) = self.base(start.wrapping_add(attempt));
            match self.once(&method, base, path, &body, idempotency_key).await {
                Ok(answer) => return Ok(answer),
                Err(e) if e.is_retryable() && !matches!(e, RailError::PendingReview { .. }) => {
                    if e.rail_reason().is_some_and(|r| r.code == "unreachable") {
                        self.mark_down(i);
                    }
                    tracing::debug!(instance = %base, path, attempt, error = %e, "facilitator call will be retried");
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            RailError::Unavailable(RailReason::new("unavailable", "no attempt was made"))
        }))
    }

    /// The instance for the `n`th try: the `n`th in turn, skipping those that did not answer
    /// in the last few seconds (unless none answered).
    fn base(&self, n: usize) -> (usize, &str) {
        let len = self.bases.len();
        let now = self.clock_ms();
        let up = (0..len).map(|k| n.wrapping_add(k) % len).find(|&i| {
            self.down
                .get(i)
                .is_none_or(|d| d.load(Ordering::Relaxed) <= now)
        });
        let i = up.unwrap_or(n % len);
        (i, self.bases.get(i).map_or("", String::as_str))
    }

    /// Skips instance `i` for [`DOWN_FOR`].
    fn mark_down(&self, i: usize) {
        if let Some(d) = self.down.get(i) {
            let until = self
                .clock_ms()
                .saturating_add(DOWN_FOR.as_millis().try_into().unwrap_or(u64::MAX));
            d.store(until, Ordering::Relaxed);
        }
    }

    /// Milliseconds on a monotonic clock (instance health is local, never signed).
    fn clock_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    async fn once<T: DeserializeOwned>(
        &self,
        method: &Method,
        base: &str,
        path: &str,
        body: &[u8],
        idempotency_key: Option<&str>,
    ) -> RailResult<Answer<T>> {
        let nonce = auth::nonce();
        let timestamp_ms = self.clock.now().0;
        let signature = self.key.sign(&Canonical {
            network: &self.network,
            method: method.as_str(),
            path_and_query: path,
            account: &self.account,
            timestamp_ms,
            nonce: &nonce,
            idempotency_key,
            body,
        });
        let mut req = self
            .http
            .request(method.clone(), format!("{base}{path}"))
            .header(auth::ACCOUNT, &self.account)
            .header(auth::TIMESTAMP, timestamp_ms.to_string())
            .header(auth::NONCE, &nonce)
            .header(auth::SIGNATURE, signature.to_string());
        if let Some(k) = idempotency_key {
            req = req.header(auth::IDEMPOTENCY_KEY, k);
        }
        if !body.is_empty() {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_vec());
        }
        let resp = req.send().await.map_err(|e| {
            RailError::Unavailable(RailReason::new(
                "unreachable",
                format!("facilitator at {base}: {}", without_url(&e)),
            ))
        })?;
        let status = resp.status();
        let bytes = resp.bytes().await.map_err(|e| {
            RailError::Unavailable(RailReason::new(
                "unreachable",
                format!(
                    "facilitator at {base}: the answer was cut: {}",
                    without_url(&e)
                ),
            ))
        })?;
        if status.is_success() {
            let body = serde_json::from_slice(&bytes).map_err(|e| RailError::Rail {
                reason: RailReason::new(
                    "bad_answer",
                    format!("facilitator at {base} answered {status} with an unreadable body: {e}"),
                ),
                retryable: false,
            })?;
            return Ok(Answer {
                status: status.as_u16(),
                body,
            });
        }
        Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(ErrorBody { error }) => error.into_rail(),
            Err(_) if is_gateway(status) => RailError::Unavailable(RailReason::new(
                "unavailable",
                format!("facilitator at {base} answered {status}"),
            )),
            Err(_) => WireError::new(
                "bad_answer",
                format!("facilitator at {base} answered {status} without an error body"),
                false,
            )
            .into_rail(),
        })
    }
}

fn is_gateway(s: StatusCode) -> bool {
    matches!(s.as_u16(), 502..=504)
}

/// reqwest's error text without the URL (it is named already).
fn without_url(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    if let Some(url) = e.url() {
        text = text
            .replace(&format!(" ({url})"), "")
            .replace(url.as_str(), "");
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}
