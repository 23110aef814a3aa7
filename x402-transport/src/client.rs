//! The paying HTTP client for every scheme: a small wrapper around `reqwest` that answers a 402
//! by paying within its payers' policies and retrying once.
//!
//! - The 402 is read from `PAYMENT-REQUIRED` (v2). Without it, the JSON body is read: a v2 body
//!   (exact-algo's clients read the body, `docs/exact-algo.md` §6) or a v1 one (`x402Version: 1`,
//!   paid only by a payer that speaks v1, with `X-PAYMENT`). Anything else is returned as it came.
//! - A client holds several [`SchemePayer`]s in its order of preference; the first payer that
//!   accepts some entry pays the cheapest entry it accepts. Nothing is paid blindly: each payer
//!   checks an entry against its own policy (scheme, network, asset, limit).
//! - One payment per request: if the paid retry gets no answer (timeout, connection reset) or
//!   a 502/503/504 (outcome unknown), the **same** payment is sent again, up to
//!   [`Client::with_retries`] times, honouring `Retry-After`. A second payment is never made
//!   for one request; if the outcome is still unknown, [`ClientError::OutcomeUnknown`] hands
//!   the payment back for [`Client::resend`].
//!
//! Its steps are public for a caller that decides payments itself (an agent wallet under a
//! mandate): [`read_402`] reads the requirement, [`choose`] picks a payer and entry under the
//! payers' policies and a [`PayPolicy`] of the caller's, [`sign`] makes the payment, and
//! [`Client::resend`] delivers it with the rules above.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::wire::{self, PaymentRequired, PaymentRequiredV1};

/// What a scheme's payer brings to the shared client.
#[async_trait]
pub trait SchemePayer: Send + Sync + fmt::Debug {
    /// A label for logs (`exact-evm`, `exact-algo`).
    fn label(&self) -> &str;

    /// The rail kind this payer pays over (`x402`, `exact-algo`, `exact-avm`): the name a
    /// mandate's `rails` lists, so a wallet pays a challenge only over a rail its mandate allows.
    fn rail(&self) -> &str;

    /// Why this payer will not pay `entry` (an `accepts[]` entry), or `None` if it will: the
    /// scheme, network and asset are its own and the amount is within its policy.
    fn refusal(&self, entry: &Value) -> Option<String>;

    /// The amount `entry` asks, in atomic units (the cheapest acceptable entry is paid).
    fn amount(&self, entry: &Value) -> Option<u128>;

    /// The asset `entry` is paid in (code and decimals), so a wallet can hold the amount
    /// against its limits: `None` if this payer does not know it (the entry is then not paid
    /// by a wallet that enforces limits).
    fn asset(&self, _entry: &Value) -> Option<rail_core::Asset> {
        None
    }

    /// Signs a payment for `entry` of `required`: the envelope whose base64 is the
    /// `PAYMENT-SIGNATURE` value.
    ///
    /// # Errors
    /// Why it could not (policy, balance, signing), as a sentence.
    async fn pay(&self, required: &PaymentRequired, entry: &Value) -> Result<Value, String>;

    /// Signs a v1 payment for the v1 402 `required` (`X-PAYMENT`): `None` when the payer does
    /// not speak v1.
    async fn pay_v1(&self, _required: &PaymentRequiredV1) -> Option<Result<Value, String>> {
        None
    }
}

/// The most of a 402's body a client reads: a payment requirement is a small JSON document,
/// and a server that sends more is not one to pay.
pub const MAX_402_BODY: usize = 256 * 1024;

/// The most of any other response body a client reads (a paid resource included): 16 MiB.
pub const MAX_BODY: usize = 16 * 1024 * 1024;

/// Reads the body of a 402, at most [`MAX_402_BODY`] bytes (a longer one is refused before it
/// is all read).
///
/// # Errors
/// [`ClientError::Header`] for a longer body; [`ClientError::Http`] if it cannot be read.
pub async fn read_402_body(resp: reqwest::Response) -> Result<Vec<u8>, ClientError> {
    read_body(resp, MAX_402_BODY).await.map_err(|e| match e {
        ClientError::TooLarge(_) => {
            ClientError::Header(format!("the 402's body is over {MAX_402_BODY} bytes"))
        }
        e => e,
    })
}

/// Reads a response body of at most `max` bytes: a longer one is refused before it is all
/// read (by its `Content-Length`, or as soon as it passes `max`).
///
/// # Errors
/// [`ClientError::TooLarge`] for a longer body; [`ClientError::Http`] if it cannot be read.
pub async fn read_body(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, ClientError> {
    let too_long = || ClientError::TooLarge(format!("the response body is over {max} bytes"));
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(too_long());
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| ClientError::Http(describe_http_error(&e)))?
    {
        if body.len() + chunk.len() > max {
            return Err(too_long());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A caller's say over which entries may be paid, beside each payer's own policy (a wallet's
/// allowlist and limits, say). [`choose`] skips what it refuses.
pub trait PayPolicy: Send + Sync + fmt::Debug {
    /// Why `payer` must not pay `entry`, or `None` if it may.
    fn refusal(&self, payer: &dyn SchemePayer, entry: &Value) -> Option<String>;
}

/// An x402 payment requirement, as it came.
#[derive(Clone, Debug)]
pub enum Required {
    /// x402 v2 (`PAYMENT-REQUIRED`, or a v2 body).
    V2(PaymentRequired),
    /// x402 v1 (the JSON body of a v1 402); answered with `X-PAYMENT`.
    V1(PaymentRequiredV1),
}

impl Required {
    /// Reads an x402 payment requirement from JSON (`x402Version` 1 or 2).
    ///
    /// # Errors
    /// [`ClientError::Header`] if it is not one.
    pub fn from_value(v: Value) -> Result<Self, ClientError> {
        match v.get("x402Version").and_then(Value::as_u64) {
            Some(1) => serde_json::from_value(v)
                .map(Required::V1)
                .map_err(|e| ClientError::Header(format!("an x402 v1 402: {e}"))),
            Some(2) => serde_json::from_value(v)
                .map(Required::V2)
                .map_err(|e| ClientError::Header(format!("an x402 v2 402: {e}"))),
            _ => Err(ClientError::Header(
                "not an x402 payment requirement (no x402Version 1 or 2)".into(),
            )),
        }
    }

    /// Reads the payment requirement of an MCP tool result (`isError: true`), looked for in
    /// the x402 MCP convention's order: `structuredContent`, its `x402/error.data`, then the
    /// first text content parsed as JSON. `None` if the result asks no payment.
    #[must_use]
    pub fn from_mcp_result(result: &Value) -> Option<Self> {
        Self::from_value(wire::payment_required_in_tool_result(result)?).ok()
    }

    /// The entries as JSON.
    #[must_use]
    pub fn entries(&self) -> Vec<Value> {
        match self {
            Required::V2(r) => r.entries(),
            Required::V1(r) => r.entries(),
        }
    }
}

/// Reads a 402: the `PAYMENT-REQUIRED` header (x402 v2) if there is one, else the JSON body (a v2
/// body, as exact-algo's clients read it (`docs/exact-algo.md` §6), or a v1 one). `Ok(None)` for a
/// body that is no x402 payment requirement (the 402 is then not x402's).
///
/// # Errors
/// [`ClientError::Header`] for a `PAYMENT-REQUIRED` header, or a body naming an x402 version,
/// that does not decode.
pub fn read_402(header: Option<&str>, body: &[u8]) -> Result<Option<Required>, ClientError> {
    if let Some(h) = header {
        return PaymentRequired::from_header(h)
            .map(|r| Some(Required::V2(r)))
            .map_err(|e| ClientError::Header(format!("PAYMENT-REQUIRED: {e}")));
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Ok(None);
    };
    match v.get("x402Version").and_then(Value::as_u64) {
        Some(1 | 2) => Required::from_value(v).map(Some),
        _ => Ok(None),
    }
}

/// The payer and entry to pay: the first payer of `payers` (in order) that accepts one of
/// `entries` — its own policy ([`SchemePayer::refusal`]) and `policy`, if given — with the
/// cheapest entry it accepts.
///
/// # Errors
/// [`ClientError::NothingPayable`] with every refusal.
pub fn choose<'a>(
    payers: &'a [Arc<dyn SchemePayer>],
    entries: &[Value],
    policy: Option<&dyn PayPolicy>,
) -> Result<(&'a Arc<dyn SchemePayer>, Value), ClientError> {
    let mut refusals = Vec::new();
    for payer in payers {
        let mut best: Option<(&Value, u128)> = None;
        for entry in entries {
            let refused = payer
                .refusal(entry)
                .or_else(|| policy.and_then(|p| p.refusal(payer.as_ref(), entry)));
            match refused {
                Some(why) => refusals.push(format!("{}: {why}", payer.label())),
                None => {
                    let amount = payer.amount(entry).unwrap_or(u128::MAX);
                    if best.is_none_or(|(_, b)| amount < b) {
                        best = Some((entry, amount));
                    }
                }
            }
        }
        if let Some((entry, _)) = best {
            return Ok((payer, entry.clone()));
        }
    }
    if payers.is_empty() {
        refusals.push("no scheme payer".into());
    }
    Err(ClientError::NothingPayable(refusals))
}

/// `payer`'s payment for `entry` of `required` (for v1, a 402 narrowed to that one entry).
///
/// # Errors
/// [`ClientError::Payer`] when the payer cannot sign it (or speaks no v1, for a v1 402).
pub async fn sign(
    payer: &dyn SchemePayer,
    required: &Required,
    entry: &Value,
) -> Result<Sent, ClientError> {
    let (envelope, v1) = match required {
        Required::V2(r) => (
            payer.pay(r, entry).await.map_err(ClientError::Payer)?,
            false,
        ),
        Required::V1(r) => {
            let only = PaymentRequiredV1 {
                x402_version: wire::V1::default(),
                error: r.error.clone(),
                accepts: vec![wire::entry(entry).map_err(|e| ClientError::Payer(e.to_string()))?],
            };
            match payer.pay_v1(&only).await {
                Some(r) => (r.map_err(ClientError::Payer)?, true),
                None => {
                    return Err(ClientError::Payer(format!(
                        "{} does not speak x402 v1",
                        payer.label()
                    )));
                }
            }
        }
    };
    Ok(Sent {
        label: payer.label().to_owned(),
        envelope,
        v1,
    })
}

/// A payment the client sent.
#[derive(Clone, Debug, PartialEq)]
pub struct Sent {
    /// The payer's label.
    pub label: String,
    /// The envelope.
    pub envelope: Value,
    /// Whether it is a v1 payment (`X-PAYMENT`).
    pub v1: bool,
}

impl Sent {
    /// The header value: base64 of the envelope's JSON.
    ///
    /// # Errors
    /// [`ClientError::Payer`] if the envelope does not serialize.
    pub fn header_value(&self) -> Result<String, ClientError> {
        wire::encode_base64_json(&self.envelope).map_err(|e| ClientError::Payer(e.to_string()))
    }

    /// The header it travels in: `PAYMENT-SIGNATURE`, or `X-PAYMENT` for v1.
    #[must_use]
    pub const fn header_name(&self) -> &'static str {
        if self.v1 {
            wire::X_PAYMENT
        } else {
            wire::PAYMENT_SIGNATURE
        }
    }
}

/// What went wrong with an HTTP request, as one sentence a person can act on — where it
/// went and why it got no answer — in place of reqwest's own `error sending request`:
///
/// - `could not connect to 127.0.0.1:8080 (connection refused)`
/// - `could not resolve shop.invalid (…)`
/// - `timed out waiting for 127.0.0.1:8080` ([`describe_http_error_after`] says how long)
/// - `too many redirects (the last to http://…)`
/// - `127.0.0.1:8080 did not answer (connection closed before message completed)`
///
/// The URL's path and query are not repeated (they may carry a secret), except for a redirect,
/// whose target is the point.
#[must_use]
pub fn describe_http_error(e: &reqwest::Error) -> String {
    describe(e, None)
}

/// As [`describe_http_error`], for a request that had waited `waited` when it failed: a
/// timeout says how long (`timed out after 30 s waiting for 127.0.0.1:8080`).
#[must_use]
pub fn describe_http_error_after(e: &reqwest::Error, waited: Duration) -> String {
    describe(e, Some(waited))
}

fn describe(e: &reqwest::Error, waited: Option<Duration>) -> String {
    let at = e.url().map_or_else(|| "the server".to_owned(), authority);
    let cause = cause(e);
    let because = |what: String| match &cause {
        Some(c) => format!("{what} ({c})"),
        None => what,
    };
    if e.is_timeout() {
        let doing = if e.is_connect() {
            "connecting to"
        } else {
            "waiting for"
        };
        return match waited {
            Some(d) => format!("timed out after {} {doing} {at}", seconds(d)),
            None => format!("timed out {doing} {at}"),
        };
    }
    if e.is_dns() {
        let host = e
            .url()
            .and_then(reqwest::Url::host_str)
            .unwrap_or("the server's name");
        return because(format!("could not resolve {host}"));
    }
    if e.is_connect() {
        return because(format!("could not connect to {at}"));
    }
    if e.is_redirect() {
        return match e.url() {
            Some(u) => format!("too many redirects (the last to {u})"),
            None => "too many redirects".to_owned(),
        };
    }
    if e.is_body() || e.is_decode() {
        return because(format!("the answer from {at} could not be read"));
    }
    if e.is_builder() {
        return because(format!("a request to {at} could not be made"));
    }
    because(format!("{at} did not answer"))
}

/// `host:port` of `url` (the scheme's port when it names none).
fn authority(url: &reqwest::Url) -> String {
    match (url.host_str(), url.port_or_known_default()) {
        (Some(h), Some(p)) => format!("{h}:{p}"),
        (Some(h), None) => h.to_owned(),
        (None, _) => url.origin().ascii_serialization(),
    }
}

/// Why, in a few words: the I/O error under `e` by its kind (`connection refused`), else the
/// innermost cause's own words; `None` when reqwest says nothing more.
fn cause(e: &reqwest::Error) -> Option<String> {
    let mut innermost: Option<&(dyn std::error::Error + 'static)> = None;
    let mut io: Option<&std::io::Error> = None;
    let mut next = std::error::Error::source(e);
    while let Some(s) = next {
        if io.is_none() {
            io = s.downcast_ref::<std::io::Error>();
        }
        innermost = Some(s);
        next = s.source();
    }
    let kind = io.and_then(|io| {
        use std::io::ErrorKind as K;
        Some(match io.kind() {
            K::ConnectionRefused => "connection refused",
            K::ConnectionReset => "connection reset",
            K::ConnectionAborted => "connection aborted",
            K::NotConnected => "not connected",
            K::AddrNotAvailable => "address not available",
            K::HostUnreachable => "host unreachable",
            K::NetworkUnreachable => "network unreachable",
            K::TimedOut => "timed out",
            K::UnexpectedEof => "the connection closed early",
            _ => return None,
        })
    });
    if let Some(k) = kind {
        return Some(k.to_owned());
    }
    innermost.map(|s| {
        let text = s.to_string();
        // `Connection refused (os error 111)`: the number says nothing to a person.
        let text = match text.find(" (os error ") {
            Some(i) => text.get(..i).unwrap_or(&text).to_owned(),
            None => text,
        };
        let mut chars = text.chars();
        match chars.next() {
            Some(c) => c.to_lowercase().chain(chars).collect(),
            None => text,
        }
    })
}

/// `30 s`, `1.5 s`, `250 ms`.
fn seconds(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else if d.subsec_millis() >= 100 && d < Duration::from_secs(10) {
        format!("{}.{} s", d.as_secs(), d.subsec_millis() / 100)
    } else {
        format!("{} s", d.as_secs())
    }
}

/// Why a paid request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// No answer (and, before any payment was made): one sentence saying where the request
    /// went and why it got none ([`describe_http_error`]).
    #[error("{0}")]
    Http(String),
    /// The 402's `PAYMENT-REQUIRED` header did not decode.
    #[error("402 header: {0}")]
    Header(String),
    /// No payer accepts any entry of the 402 (one reason per payer and entry).
    #[error("no payable option: {}", .0.join("; "))]
    NothingPayable(Vec<String>),
    /// The chosen payer could not sign.
    #[error("payer: {0}")]
    Payer(String),
    /// A response body longer than the client reads.
    #[error("{0}")]
    TooLarge(String),
    /// A payment was sent and no answer said what became of it, after every resend. It may
    /// have been settled: present **this** payment again ([`Client::resend`]), do not pay anew.
    #[error("payment outcome unknown ({detail}); resend the same payment")]
    OutcomeUnknown {
        /// The payment.
        payment: Box<Sent>,
        /// The last error.
        detail: String,
    },
}

/// The answer to a (possibly paid) request.
#[derive(Debug)]
pub struct Fetched {
    /// Final status.
    pub status: StatusCode,
    /// Final headers.
    pub headers: reqwest::header::HeaderMap,
    /// Final body.
    pub body: Vec<u8>,
    /// The payment sent, if one was.
    pub payment: Option<Sent>,
    /// The decoded `PAYMENT-RESPONSE` (or v1 `X-PAYMENT-RESPONSE`), if the server sent one.
    pub response: Option<Value>,
    /// The 402 that asked for the payment (v2).
    pub payment_required: Option<PaymentRequired>,
}

/// A reqwest client that pays 402s with its payers.
#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    payers: Vec<Arc<dyn SchemePayer>>,
    policy: Option<Arc<dyn PayPolicy>>,
    retries: u32,
}

/// Statuses after which a payment's outcome is unknown (send the same payment again).
fn unknown_status(s: StatusCode) -> bool {
    matches!(
        s,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The most redirects an unpaid request follows (a paid one follows none).
pub const MAX_REDIRECTS: usize = 10;

/// An unpaid request after its redirects: the answer, and the request that got it (where it
/// went, with which method and body) — the one a payment is then sent with.
#[derive(Debug)]
pub struct Reached {
    /// The answer.
    pub response: reqwest::Response,
    /// The URL answered (after redirects).
    pub url: reqwest::Url,
    /// The method answered (a 303, or a 301/302 after a POST, turns it into a GET).
    pub method: Method,
    /// The body sent (dropped with the method change).
    pub body: Option<Vec<u8>>,
}

impl Client {
    /// A client with no payer yet and 3 resends of a payment whose outcome is unknown, on the
    /// HTTP client `http` builds — with redirects turned off, whatever `http` says: the client
    /// follows an unpaid request's redirects itself, and a payment header never follows one
    /// (a 3xx answer to a paid request is returned as it is).
    ///
    /// # Errors
    /// [`ClientError::Http`] if the HTTP client cannot be built.
    pub fn new(http: reqwest::ClientBuilder) -> Result<Self, ClientError> {
        let http = http
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ClientError::Http(format!("cannot build the HTTP client: {e}")))?;
        Ok(Client {
            http,
            payers: Vec::new(),
            policy: None,
            retries: 3,
        })
    }

    /// The HTTP client (it follows no redirect).
    #[must_use]
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// Sends an unpaid request, following up to [`MAX_REDIRECTS`] redirects as a browser
    /// does (307 and 308 keep the method and body; 303, and 301/302 after a POST, become a
    /// GET without body), each hop a new request with `headers` and no payment.
    ///
    /// # Errors
    /// [`ClientError::Http`]: no answer, a redirect without a usable `Location`, or too many.
    pub async fn reach(
        &self,
        method: Method,
        url: reqwest::Url,
        headers: &HeaderMap,
        body: Option<Vec<u8>>,
    ) -> Result<Reached, ClientError> {
        let (mut method, mut url, mut body) = (method, url, body);
        for _ in 0..=MAX_REDIRECTS {
            let started = std::time::Instant::now();
            let response = self
                .request(&method, url.as_str(), headers, body.as_ref())
                .send()
                .await
                .map_err(|e| ClientError::Http(describe_http_error_after(&e, started.elapsed())))?;
            let status = response.status();
            if !status.is_redirection() || status == StatusCode::NOT_MODIFIED {
                return Ok(Reached {
                    response,
                    url,
                    method,
                    body,
                });
            }
            let next = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .and_then(|l| url.join(l).ok())
                .filter(|u| matches!(u.scheme(), "http" | "https"))
                .ok_or_else(|| {
                    ClientError::Http(format!(
                        "{status} from {} without a usable http(s) Location",
                        url.origin().ascii_serialization()
                    ))
                })?;
            let to_get = status == StatusCode::SEE_OTHER && method != Method::HEAD
                || matches!(status, StatusCode::MOVED_PERMANENTLY | StatusCode::FOUND)
                    && method == Method::POST;
            if to_get {
                method = Method::GET;
                body = None;
            }
            tracing::debug!(from = %url.origin().ascii_serialization(), to = %next.origin().ascii_serialization(), status = status.as_u16(), "following a redirect (unpaid)");
            url = next;
        }
        Err(ClientError::Http(format!(
            "more than {MAX_REDIRECTS} redirects (the last to {url})"
        )))
    }

    /// Pays only what `policy` allows, beside each payer's own policy.
    #[must_use]
    pub fn with_policy(mut self, policy: Arc<dyn PayPolicy>) -> Self {
        self.policy = Some(policy);
        self
    }

    /// Also pays with `payer` (after the payers added before it).
    #[must_use]
    pub fn with_payer(mut self, payer: Arc<dyn SchemePayer>) -> Self {
        self.payers.push(payer);
        self
    }

    /// How many times the same payment is resent while its outcome is unknown.
    #[must_use]
    pub const fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// `GET url`, paying if asked.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn get(&self, url: &str) -> Result<Fetched, ClientError> {
        self.send(Method::GET, url, None).await
    }

    fn request(
        &self,
        method: &Method,
        url: &str,
        headers: &HeaderMap,
        body: Option<&Vec<u8>>,
    ) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method.clone(), url)
            .headers(headers.clone());
        if let Some(b) = body {
            r = r.body(b.clone());
        }
        r
    }

    /// The payer and entry to pay for `required` ([`choose`] over this client's payers and
    /// policy).
    ///
    /// # Errors
    /// [`ClientError::NothingPayable`] with every refusal.
    pub fn choose(
        &self,
        required: &PaymentRequired,
    ) -> Result<(&Arc<dyn SchemePayer>, Value), ClientError> {
        choose(&self.payers, &required.entries(), self.policy.as_deref())
    }

    /// A request with an optional body, paying if asked.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Fetched, ClientError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| ClientError::Http(format!("{url:?} is not a URL: {e}")))?;
        let none = HeaderMap::new();
        let Reached {
            response: first,
            url,
            method,
            body,
        } = self.reach(method, parsed, &none, body).await?;
        if first.status() != StatusCode::PAYMENT_REQUIRED {
            return finish(first, None, None).await;
        }
        let header = first
            .headers()
            .get(wire::PAYMENT_REQUIRED)
            .and_then(|h| h.to_str().ok())
            .map(str::to_owned);
        let (status, headers) = (first.status(), first.headers().clone());
        let raw = read_402_body(first).await?;
        let (required, sent) = match read_402(header.as_deref(), &raw)? {
            Some(Required::V2(required)) => {
                let sent = self.pay(&required).await?;
                (Some(required), sent)
            }
            Some(Required::V1(required)) => (None, self.pay_v1(&required).await?),
            None => {
                return Ok(Fetched {
                    status,
                    headers,
                    body: raw,
                    payment: None,
                    response: None,
                    payment_required: None,
                });
            }
        };
        self.deliver(&method, url.as_str(), &none, body.as_ref(), sent, required)
            .await
    }

    async fn pay(&self, required: &PaymentRequired) -> Result<Sent, ClientError> {
        let (payer, entry) = self.choose(required)?;
        let envelope = payer
            .pay(required, &entry)
            .await
            .map_err(ClientError::Payer)?;
        tracing::info!(payer = payer.label(), network = ?entry.get("network"), "x402: paying");
        Ok(Sent {
            label: payer.label().to_owned(),
            envelope,
            v1: false,
        })
    }

    async fn pay_v1(&self, required: &PaymentRequiredV1) -> Result<Sent, ClientError> {
        let mut refusals = Vec::new();
        for payer in &self.payers {
            match payer.pay_v1(required).await {
                Some(Ok(envelope)) => {
                    tracing::info!(payer = payer.label(), "x402: paying (v1)");
                    return Ok(Sent {
                        label: payer.label().to_owned(),
                        envelope,
                        v1: true,
                    });
                }
                Some(Err(why)) => refusals.push(format!("{}: {why}", payer.label())),
                None => refusals.push(format!("{}: speaks no x402 v1", payer.label())),
            }
        }
        Err(ClientError::NothingPayable(refusals))
    }

    /// Sends a payment again (after [`ClientError::OutcomeUnknown`]): the same payment, never
    /// a new one — if it was settled, the server serves it (once).
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn resend(
        &self,
        method: Method,
        url: &str,
        body: Option<Vec<u8>>,
        payment: Sent,
    ) -> Result<Fetched, ClientError> {
        self.resend_with(method, url, &HeaderMap::new(), body, payment)
            .await
    }

    /// As [`Client::resend`], with the request's own `headers`.
    ///
    /// # Errors
    /// [`ClientError`].
    pub async fn resend_with(
        &self,
        method: Method,
        url: &str,
        headers: &HeaderMap,
        body: Option<Vec<u8>>,
        payment: Sent,
    ) -> Result<Fetched, ClientError> {
        self.deliver(&method, url, headers, body.as_ref(), payment, None)
            .await
    }

    /// Presents `payment`, resending the same bytes while the outcome is unknown: no answer,
    /// or a 502 / 503 / 504 (a proxy's or the server's "try again").
    async fn deliver(
        &self,
        method: &Method,
        url: &str,
        headers: &HeaderMap,
        body: Option<&Vec<u8>>,
        payment: Sent,
        required: Option<PaymentRequired>,
    ) -> Result<Fetched, ClientError> {
        let value = payment.header_value()?;
        let mut attempt = 0;
        loop {
            let started = std::time::Instant::now();
            let sent = self
                .request(method, url, headers, body)
                .header(payment.header_name(), &value)
                .send()
                .await;
            match sent {
                Ok(resp) if unknown_status(resp.status()) && attempt < self.retries => {
                    let wait = resp
                        .headers()
                        .get(reqwest::header::RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(1)
                        .min(10);
                    tracing::warn!(
                        attempt,
                        wait,
                        status = resp.status().as_u16(),
                        "x402: outcome unknown; resending the same payment"
                    );
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                }
                Ok(resp) if unknown_status(resp.status()) => {
                    return Err(ClientError::OutcomeUnknown {
                        payment: Box::new(payment),
                        detail: format!("http {}", resp.status()),
                    });
                }
                Ok(resp) => return finish(resp, Some(payment), required).await,
                Err(e) if attempt < self.retries => {
                    let error = describe_http_error_after(&e, started.elapsed());
                    tracing::warn!(attempt, %error, "x402: no answer; resending the same payment");
                    tokio::time::sleep(Duration::from_millis(200 << attempt.min(5))).await;
                }
                Err(e) => {
                    return Err(ClientError::OutcomeUnknown {
                        payment: Box::new(payment),
                        detail: describe_http_error_after(&e, started.elapsed()),
                    });
                }
            }
            attempt += 1;
        }
    }
}

async fn finish(
    resp: reqwest::Response,
    payment: Option<Sent>,
    payment_required: Option<PaymentRequired>,
) -> Result<Fetched, ClientError> {
    let status = resp.status();
    let headers = resp.headers().clone();
    let name = match &payment {
        Some(p) if p.v1 => wire::X_PAYMENT_RESPONSE,
        _ => wire::PAYMENT_RESPONSE,
    };
    let response = headers
        .get(name)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| wire::decode_base64_json::<Value>(h).ok());
    let body = read_body(resp, MAX_BODY).await?;
    Ok(Fetched {
        status,
        headers,
        body,
        payment,
        response,
        payment_required,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use serde_json::json;

    fn header(v: &Value) -> String {
        wire::encode_base64_json(v).unwrap()
    }

    /// Whatever a server sends, `read_402` answers a typed requirement, `None` (not x402's) or
    /// a refusal — never a requirement of another version, an empty one, or a panic.
    #[test]
    fn read_402_reads_only_x402_and_refuses_the_rest() {
        let entry = json!({"scheme": "exact", "network": "eip155:1"});
        let v2 = json!({"x402Version": 2, "accepts": [entry]});
        let v1 = json!({"x402Version": 1, "accepts": [entry]});
        assert!(matches!(
            read_402(Some(&header(&v2)), b""),
            Ok(Some(Required::V2(_)))
        ));
        // The body is read only without the header; a v1 body is v1.
        assert!(matches!(
            read_402(None, v1.to_string().as_bytes()),
            Ok(Some(Required::V1(_)))
        ));
        // A v1 message in the v2 header, an empty `accepts`, garbage, an oversized header.
        for bad in [
            header(&v1),
            header(&json!({"x402Version": 2, "accepts": []})),
            "!!not base64!!".to_owned(),
            "A".repeat(wire::MAX_HEADER_LEN + 4),
        ] {
            assert!(
                matches!(read_402(Some(&bad), b""), Err(ClientError::Header(_))),
                "{bad:.40} was read"
            );
        }
        // A body that is not x402's (another version, not JSON, a Quote only) is nobody's to pay.
        for other in [
            json!({"x402Version": 3, "accepts": [entry]}).to_string(),
            "<html>pay me</html>".to_owned(),
            json!({"quote": {}}).to_string(),
        ] {
            assert!(
                matches!(read_402(None, other.as_bytes()), Ok(None)),
                "{other}"
            );
        }
        // A body naming x402 that does not decode is refused, not ignored.
        assert!(read_402(None, json!({"x402Version": 2}).to_string().as_bytes()).is_err());
    }
}
