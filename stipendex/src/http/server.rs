//! The receiver's side of the HTTP binding.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request as HttpRequest, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rail_core::Money;
use serde_json::{Map, Value, json};
use x402_transport::paywall::{Paywall, PricedRoute, resource_url};
use x402_transport::wire;

use super::{PAYMENT, RECEIPT, TAB, TAB_CALL, VOUCHER};
use crate::Error;
use crate::envelope::{Digest, Tab};
use crate::receiver::{
    ANSWER_GONE, Answer, Gone, OUTCOME_UNKNOWN, PricedCapability, Ran, Receiver, Request, Seal,
    Served, Tender, Work, X402Payment,
};

/// Where the receiver's descriptor is served.
pub const WELL_KNOWN: &str = "/.well-known/stipendex.json";

/// Where a wallet closes its tab: `POST` with the [`crate::envelope::TabClose`]'s compact JWS as
/// the body; the answer is `{"receipt": {"stipendex": "tab-receipt/0.1", "jws": …}}`.
pub const TAB_CLOSE: &str = "/.well-known/stipendex/tab-close";

/// The largest tab close request read.
const MAX_CLOSE_BODY: usize = 16 * 1024;

/// A checkout handler's final amount: put it in the response's extensions and the binding
/// captures that much of the hold (never above the Quote or the Confirmation). Without it a
/// checkout is captured for its estimate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalAmount(pub Money);

pub use crate::receiver::Outcome;

/// Put in a priced request's extensions by the binding before the request reaches its work,
/// when the request is a checkout: the asset its final amount ([`FinalAmount`]) is named in.
/// The work learns it from the binding's one decision, without deciding again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkout(pub rail_core::Asset);

/// Put in a response's extensions by paid work that never reached the service behind it (a
/// gateway whose upstream refused the connection: not a byte of the request was sent). The
/// binding keeps nothing of such an answer and charges nothing for it: a Proof's claim is
/// released (the same Proof again runs the request), a voucher is taken back (and the answer
/// says `uncounted`); the client gets `503 upstream_unavailable`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Undelivered;

/// An IP network (`10.0.0.0/8`, `fd00::/8`) or one address (`192.0.2.1`): a trusted proxy.
/// An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) is matched as the IPv4 address it maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    prefix: u8,
}

impl IpNet {
    /// The network of `addr`'s first `prefix` bits.
    ///
    /// # Errors
    /// [`Error::Config`] if `prefix` is longer than the address (32 bits, or 128).
    pub fn new(addr: IpAddr, prefix: u8) -> Result<Self, Error> {
        let addr = canonical_ip(addr);
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(Error::Config(format!(
                "{addr}/{prefix} is not a network: an {} prefix is at most {max} bits",
                if addr.is_ipv4() { "IPv4" } else { "IPv6" }
            )));
        }
        Ok(IpNet { addr, prefix })
    }

    /// Whether `ip` is in this network.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, canonical_ip(ip)) {
            (IpAddr::V4(n), IpAddr::V4(i)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(n) & mask == u32::from(i) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(i)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(n) & mask == u128::from(i) & mask
            }
            _ => false,
        }
    }
}

impl std::str::FromStr for IpNet {
    type Err = Error;

    /// `10.0.0.0/8`, `fd00::/8`, or one address (`192.0.2.1`: a `/32`, or `/128`).
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = || {
            Error::Config(format!(
                "{s:?} is not an IP address or a network such as \"10.0.0.0/8\""
            ))
        };
        let (addr, prefix) = match s.trim().split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s.trim(), None),
        };
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let prefix = match prefix {
            Some(p) => p.trim().parse::<u8>().map_err(|_| bad())?,
            None if canonical_ip(addr).is_ipv4() => 32,
            None => 128,
        };
        IpNet::new(addr, prefix)
    }
}

/// The TCP peers whose `X-Forwarded-For` the binding believes (default: none). Behind such a
/// proxy a client is told apart by the address the proxy vouches for ([`client_key`]), not by
/// the proxy's own.
#[derive(Clone, Default)]
pub struct TrustedProxies(Option<Arc<dyn Fn(IpAddr) -> bool + Send + Sync>>);

impl TrustedProxies {
    /// The peers in `nets`.
    #[must_use]
    pub fn nets(nets: Vec<IpNet>) -> Self {
        if nets.is_empty() {
            return TrustedProxies(None);
        }
        TrustedProxies(Some(Arc::new(move |ip| {
            nets.iter().any(|n| n.contains(ip))
        })))
    }

    /// The peers `trusts` says are proxies (for a caller that keeps its own list, such as the
    /// gateway's `[gateway] trusted_proxies`).
    #[must_use]
    pub fn matching(trusts: impl Fn(IpAddr) -> bool + Send + Sync + 'static) -> Self {
        TrustedProxies(Some(Arc::new(trusts)))
    }

    /// Whether `ip` is a trusted proxy.
    #[must_use]
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.0.as_ref().is_some_and(|t| t(canonical_ip(ip)))
    }
}

impl std::fmt::Debug for TrustedProxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "TrustedProxies(some)"
        } else {
            "TrustedProxies(none)"
        })
    }
}

/// The HTTP binding of a receiver: an axum middleware (see the module docs).
#[derive(Clone)]
pub struct Binding {
    receiver: Receiver,
    x402: Option<Paywall>,
    max_answer: u64,
    trusted: TrustedProxies,
}

impl std::fmt::Debug for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Binding")
            .field("receiver", &self.receiver)
            .field("x402", &self.x402.is_some())
            .field("trusted_proxies", &self.trusted)
            .finish()
    }
}

impl Binding {
    /// The binding of `receiver`, which must name its public origins
    /// ([`crate::receiver::Builder::origin`]): its Quotes name the origin they were served at,
    /// and wallets pay only there.
    ///
    /// # Errors
    /// [`Error::Config`] if the receiver has no origin.
    pub fn new(receiver: Receiver) -> Result<Self, Error> {
        if receiver.origins().is_empty() {
            return Err(Error::Config(format!(
                "receiver {} has no public origin: name the origins it is reached at with Receiver::builder(…).origin(\"https://host[:port]\")",
                receiver.party().id
            )));
        }
        Ok(Binding {
            receiver,
            x402: None,
            max_answer: super::spool::DEFAULT_MAX_ANSWER,
            trusted: TrustedProxies::default(),
        })
    }

    /// The proxies in front of the server (default: none). A request whose TCP peer is one of
    /// them comes from the right-most `X-Forwarded-For` address that is not itself a trusted
    /// proxy; from any other peer, `X-Forwarded-For` is ignored ([`client_key`]). The client
    /// is what the receiver's per-client limits count (Quotes with costly offers). The peer is
    /// known when the server runs with `into_make_service_with_connect_info::<SocketAddr>()`.
    #[must_use]
    pub fn trusted_proxies(mut self, trusted: TrustedProxies) -> Self {
        self.trusted = trusted;
        self
    }

    /// The largest paid answer delivered (default [`super::DEFAULT_MAX_ANSWER`], 1 GiB). A paid
    /// answer is read whole before its Receipt is signed (past 1 MiB into a temporary file, so
    /// memory stays bounded); a larger one is not delivered and its payment is given back (a
    /// hold voided, a service payment refunded where its rail refunds, else the Proof left
    /// usable; a voucher not counted).
    #[must_use]
    pub fn max_answer(mut self, bytes: u64) -> Self {
        self.max_answer = bytes;
        self
    }

    /// Also offers the x402 schemes `paywall` prices: a 402 carries both the Quote and the x402
    /// challenge, and an x402 payment at the list price is served by the receiver's engine under
    /// the receiver's one served-once record, as a Proof is (decision 0038: the same payment
    /// again gets the kept answer; the paywall's own record is not used here). The paywall
    /// gives the routes, their schemes and when they settle. The receiver decides alone
    /// what is priced ([`Receiver::decide`]); the paywall's route declared with the same
    /// pattern as the capability decided is the one offered.
    ///
    /// # Errors
    /// [`Error::Config`] if a paywall route has no receiver capability of the same pattern
    /// (it would be free here: price it on the receiver too).
    pub fn with_x402(mut self, paywall: Paywall) -> Result<Self, Error> {
        for r in paywall.routes() {
            if !self
                .receiver
                .capabilities()
                .iter()
                .any(|c| c.name() == r.pattern())
            {
                return Err(Error::Config(format!(
                    "the x402 route {} has no Stipendex price of the same pattern: price it on the receiver too (PricedCapability::fixed(\"GET\", \"{}\", …))",
                    r.pattern(),
                    r.pattern()
                )));
            }
        }
        self.x402 = Some(paywall);
        Ok(self)
    }

    /// The x402 route offered for a request decided to fall under `cap`, on `path`.
    fn x402_route(&self, cap: &PricedCapability, path: &str) -> Option<(&Paywall, &PricedRoute)> {
        let p = self.x402.as_ref()?;
        p.route_named(cap.name())
            .filter(|r| r.applies(path))
            .map(|r| (p, r))
    }

    /// The receiver.
    #[must_use]
    pub fn receiver(&self) -> &Receiver {
        &self.receiver
    }

    /// Puts the binding in front of every route of `router` (the top-level router: prices
    /// match the full path) and serves `/.well-known/stipendex.json`.
    ///
    /// A receiver that offers tabs gets a task (on the current Tokio runtime, ending with the
    /// receiver) that writes the tabs' answers and closes the tabs whose end has come, every
    /// second ([`Receiver::spawn_tab_keeper`]).
    pub fn apply<S: Clone + Send + Sync + 'static>(&self, router: Router<S>) -> Router<S> {
        self.receiver
            .spawn_tab_keeper(std::time::Duration::from_secs(1));
        router.layer(axum::middleware::from_fn_with_state(
            Arc::new(self.clone()),
            middleware,
        ))
    }
}

/// The most `X-Forwarded-For` entries read, right to left: past them the last trusted proxy
/// reached stands for the client.
const MAX_FORWARDED_HOPS: usize = 16;

/// An IPv4-mapped IPv6 address (`::ffff:192.0.2.1`) as the IPv4 address it maps; any other as is.
fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 @ IpAddr::V4(_) => v4,
    }
}

/// The client `ip` counts as: an IPv4 address itself (`192.0.2.1`), an IPv6 address its /64
/// (`2001:db8:1:2::/64`: one end site holds a whole /64, so its 2^64 addresses are one client).
fn key_of(ip: IpAddr) -> String {
    match canonical_ip(ip) {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let net = std::net::Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX));
            format!("{net}/64")
        }
    }
}

/// One `X-Forwarded-For` entry's address: `192.0.2.1`, `2001:db8::1`, or with a port
/// (`192.0.2.1:4711`, `[2001:db8::1]:4711`) or brackets as some proxies write it.
fn forwarded_ip(entry: &str) -> Option<IpAddr> {
    entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|s| s.ip()))
        .or_else(|| {
            entry
                .strip_prefix('[')
                .and_then(|e| e.strip_suffix(']'))
                .and_then(|e| e.parse::<IpAddr>().ok())
        })
}

/// Who a request comes from, as the receiver's per-client limits count it: the TCP `peer`,
/// unless it is a trusted proxy; then the right-most `X-Forwarded-For` address that is not
/// itself a trusted proxy (what the nearest proxy vouches for: entries further left are the
/// client's own words). IPv4-mapped IPv6 counts as IPv4, IPv6 by its /64 (`key_of`).
///
/// From an untrusted peer `X-Forwarded-For` is ignored (anyone can write it). An entry that is
/// no address (garbage, `unknown`) ends the walk, and the last trusted address reached stands
/// for the client, as it does when every entry is a trusted proxy or after
/// `MAX_FORWARDED_HOPS` of them: never a string the client chose. `None` without a peer.
#[must_use]
pub fn client_key(
    peer: Option<IpAddr>,
    headers: &HeaderMap,
    trusted: &TrustedProxies,
) -> Option<String> {
    let mut client = canonical_ip(peer?);
    if !trusted.trusts(client) {
        return Some(key_of(client));
    }
    let mut values = headers.get_all("x-forwarded-for").iter().rev();
    let mut hops = 0;
    'walk: for value in values.by_ref() {
        let Ok(value) = value.to_str() else {
            break;
        };
        for entry in value.rsplit(',').map(str::trim).filter(|e| !e.is_empty()) {
            hops += 1;
            let Some(ip) = forwarded_ip(entry).map(canonical_ip) else {
                break 'walk;
            };
            client = ip;
            if !trusted.trusts(ip) || hops >= MAX_FORWARDED_HOPS {
                break 'walk;
            }
        }
    }
    Some(key_of(client))
}

/// The Stipendex view of an HTTP request: the configured origin its `Host` designates, the
/// method, the path, the query as an object (a repeated key becomes an array), which the
/// Quote's request digest covers, and the client ([`client_key`]).
fn request_of(b: &Binding, req: &HttpRequest) -> Request {
    let receiver = &b.receiver;
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| {
            req.uri()
                .authority()
                .map(axum::http::uri::Authority::as_str)
        });
    Request {
        origin: receiver.origin_for(host).map(str::to_owned),
        method: req.method().as_str().to_owned(),
        name: req.uri().path().to_owned(),
        params: crate::receiver::query_params(req.uri().query()),
        query: req.uri().query().map(str::to_owned),
        // Known when the server runs with `ConnectInfo`: its quotes with costly offers are
        // limited per client.
        client: client_key(
            req.extensions()
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|c| c.0.ip()),
            req.headers(),
            &b.trusted,
        ),
    }
}

fn rejected_response(message: &str) -> Response {
    let mut r = json_response(
        StatusCode::FORBIDDEN,
        &json!({"error": "rejected", "message": message}),
    );
    r.extensions_mut().insert(Outcome::Rejected);
    r
}

fn json_response(status: StatusCode, body: &Value) -> Response {
    let mut h = HeaderMap::new();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    (status, h, axum::Json(body.clone())).into_response()
}

/// Why a request is refused before any decision (`400 bad_request`): a method in lower case
/// (`get` is `GET` to many servers, and no priced route's method), or a path that could mean
/// another path to the service behind ([`rail_core::route::canonical_path`]: an encoded `/` or
/// `\`, a `;`, a control character, an invalid escape, a `.`, `..` or empty segment, an escape
/// of an escape). Each could be priced under one spelling and served under another.
fn refused_spelling(req: &HttpRequest) -> Option<String> {
    let method = req.method().as_str();
    if method.bytes().any(|b| b.is_ascii_lowercase()) {
        return Some(format!(
            "the method {method} is not in upper case: send {}",
            method.to_ascii_uppercase()
        ));
    }
    rail_core::route::canonical_path(req.uri().path())
        .err()
        .map(|why| format!("{why}: request the resource by its canonical path"))
}

async fn middleware(State(b): State<Arc<Binding>>, req: HttpRequest, next: Next) -> Response {
    if req.uri().path() == WELL_KNOWN && req.method() == Method::GET {
        return axum::Json(b.receiver.descriptor()).into_response();
    }
    if req.uri().path() == TAB_CLOSE {
        return close_tab(&b, req).await;
    }
    if let Some(message) = refused_spelling(&req) {
        return json_response(
            StatusCode::BAD_REQUEST,
            &json!({"error": "bad_request", "message": message}),
        );
    }
    if req.method() == Method::OPTIONS {
        // Never forwarded to a priced handler: answered here with what is priced.
        let methods = b.receiver.methods_priced(req.uri().path());
        if methods.is_empty() {
            return next.run(req).await;
        }
        let mut allow: Vec<&str> = methods;
        if allow.contains(&"GET") && !allow.contains(&"HEAD") {
            allow.push("HEAD");
        }
        allow.push("OPTIONS");
        let mut h = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&allow.join(", ")) {
            h.insert(header::ALLOW, v);
        }
        return (StatusCode::NO_CONTENT, h).into_response();
    }
    // The one decision: matching needs only the method and path; the query is read for
    // priced requests only.
    let probe = Request::new(req.method().as_str(), req.uri().path());
    let Some(cap) = b.receiver.decide(&probe) else {
        return next.run(req).await;
    };
    let sreq = request_of(&b, &req);
    let x402 = b.x402_route(cap, req.uri().path());
    let mut payment = payment_of(req.headers(), read_proof(req.headers()));
    let voucher = matches!(payment, Tender::Voucher { .. });
    let mut seen = Seen::of(&req, x402);
    // An x402 payment on a route also priced in x402 (a HEAD is never charged): the engine
    // asks the hook once, and serves the payment only at the list price the hook kept.
    if let Some(pay) = x402_payment(x402, &req, &seen) {
        seen.x402_paid = true;
        payment = Tender::X402 {
            payment: Box::new(pay),
            beside: Box::new(payment),
        };
    }
    let mut req = req;
    if let crate::receiver::Price::Estimate { estimate, .. } = &cap.price {
        req.extensions_mut()
            .insert(Checkout(estimate.asset().clone()));
    }
    let work = HttpWork {
        next: Some((req, next)),
        max_answer: b.max_answer,
        kept: None,
    };
    // The engine runs every step; what is left here is encoding its answer.
    let served = b.receiver.serve(cap, &sreq, payment, work).await;
    respond(served, &seen, voucher).await
}

/// The x402 payment a request on the x402 route `x402` presents, read for the engine: `None`
/// when it presents none (or is a `HEAD`, which only shows what a `GET` costs).
fn x402_payment(
    x402: Option<(&Paywall, &PricedRoute)>,
    req: &HttpRequest,
    seen: &Seen<'_>,
) -> Option<X402Payment> {
    let (paywall, route) = x402?;
    if req.method() == Method::HEAD {
        return None;
    }
    X402Payment::read(
        route.accepts().as_slice(),
        x402_transport::paywall::presented(route, req.headers()),
        (&seen.path, &seen.url, route.description()),
        paywall
            .settle_when()
            .for_method(Some(req.method().as_str())),
        paywall.clock().now(),
    )
}

/// What a priced request presents to pay, from its headers: a voucher (with the tab's
/// opening), a Proof, nothing, or a payment that cannot be read.
fn payment_of(h: &HeaderMap, proof: Result<Option<String>, String>) -> Tender {
    match read_tab_headers(h) {
        Ok(None) => {}
        Ok(Some((voucher, open))) => return Tender::Voucher { voucher, open },
        Err(why) => return Tender::Malformed(why),
    }
    match proof {
        Ok(None) => Tender::None,
        Ok(Some(p)) => match decode_header(&p) {
            Ok(jws) => Tender::Proof(jws),
            Err(e) => Tender::Malformed(e.to_string()),
        },
        Err(why) => Tender::Malformed(why),
    }
}

/// The request behind the binding: the next layer (the handler, or the gateway's forward).
struct HttpWork {
    next: Option<(HttpRequest, Next)>,
    max_answer: u64,
    /// The paid answer's body, when it is small enough to keep.
    kept: Option<Vec<u8>>,
}

impl HttpWork {
    async fn run(&mut self) -> Response {
        match self.next.take() {
            Some((req, next)) => next.run(req).await,
            None => json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({"error": "internal", "message": "the request was already run"}),
            ),
        }
    }

    fn keep(&mut self, resp: &Response, receipt: Option<String>) -> Option<Answer> {
        let body = self.kept.take()?;
        Some(Answer {
            status: resp.status().as_u16(),
            content_type: resp
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            body,
            receipt,
            headers: Vec::new(),
        })
    }
}

impl Work for HttpWork {
    type Out = Response;

    async fn run_free(&mut self) -> Response {
        self.run().await
    }

    /// The handler's answer, read whole (spooled to a temporary file past what is kept in
    /// memory): a success is a 2xx, or a 3xx the work chose (a redirect to what was paid for,
    /// such as a presigned download); a checkout names its final amount ([`FinalAmount`]).
    async fn run_paid(&mut self) -> Ran<Response> {
        let resp = self.run().await;
        if resp.extensions().get::<Undelivered>().is_some() {
            return Ran::Undelivered(
                "the service behind this receiver could not be reached".into(),
            );
        }
        let (mut parts, body) = resp.into_parts();
        let final_amount = parts
            .extensions
            .remove::<FinalAmount>()
            .map(|FinalAmount(m)| m);
        let ok = parts.status.is_success() || parts.status.is_redirection();
        match super::spool::read(body, self.max_answer).await {
            Ok(spooled) => {
                self.kept = spooled.in_memory().map(|b| b.to_vec());
                let result = spooled.digest.clone();
                Ran::Answered {
                    out: Response::from_parts(parts, spooled.into_body()),
                    ok,
                    result,
                    final_amount,
                }
            }
            Err(e) => Ran::Undeliverable(e.to_string()),
        }
    }

    fn seal(&mut self, out: &mut Response, seal: Seal<'_>) -> Option<Answer> {
        let private = |r: &mut Response| {
            r.headers_mut().insert(
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, no-store"),
            );
        };
        match seal {
            Seal::Receipt(r) => {
                if let Ok(v) = HeaderValue::from_str(&r.to_header()) {
                    out.headers_mut()
                        .insert(HeaderName::from_static(RECEIPT), v);
                }
                private(out);
                self.keep(out, Some(r.jws().to_owned()))
            }
            Seal::Failed => self.keep(out, None),
            Seal::TabCall { voucher, result } => {
                let kept = self.keep(out, None);
                private(out);
                set_tab_call(out, voucher, result);
                kept
            }
            Seal::Uncounted(voucher) => {
                out.extensions_mut().remove::<FinalAmount>();
                set_uncounted(out, voucher);
                None
            }
            // Settle-after, the work failed: nothing was charged, the answer goes as it is.
            Seal::X402(None) => None,
            Seal::X402(Some(x)) => {
                let value = match wire::encode_base64_json(&x.header_value) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::error!(error = %e, "x402: cannot encode the settlement header");
                        return self.keep(out, None);
                    }
                };
                if let Ok(v) = HeaderValue::from_str(&value) {
                    out.headers_mut()
                        .insert(HeaderName::from_static(x.header), v);
                }
                private(out);
                let mut kept = self.keep(out, None)?;
                kept.headers.push((x.header.to_owned(), value));
                Some(kept)
            }
        }
    }

    fn outcome_unknown() -> (Answer, Digest) {
        let answer = Answer::json(
            StatusCode::CONFLICT.as_u16(),
            &json!({"error": "outcome_unknown", "message": OUTCOME_UNKNOWN}),
            None,
        );
        let result = Digest::of(&answer.body);
        (answer, result)
    }
}

/// A 503 saying what cannot be done now, and what to do.
fn unavailable(e: &Error, then: &str) -> Response {
    x402_transport::paywall::unavailable_response(e.code(), None, &format!("{e}: {then}"))
}

/// The engine's answer as an HTTP response. `voucher`: the request was paid inside a tab.
async fn respond(served: Served<Response>, seen: &Seen<'_>, voucher: bool) -> Response {
    let again = if voucher {
        "send the same Stipendex-Voucher again"
    } else if seen.x402_paid {
        // The x402 payment (`PAYMENT-SIGNATURE` or v1's `X-PAYMENT`), or what came beside it.
        "send the same payment again"
    } else {
        "send the same Stipendex-Payment again"
    };
    match served {
        Served::Free { out, .. } => out,
        Served::Ran { mut out, outcome } => {
            if let Some(o) = outcome {
                out.extensions_mut().insert(o);
            }
            out
        }
        Served::Quote {
            quote,
            tab,
            refusal,
            list_price,
        } => quoted(seen, list_price, &quote, tab.map(|t| *t), refusal).await,
        Served::Rejected { message, uncounted } => {
            let mut r = rejected_response(&message);
            if let Some(v) = uncounted {
                set_uncounted(&mut r, &v);
            }
            r
        }
        Served::NotPriced => json_response(
            StatusCode::CONFLICT,
            &json!({"error": "not_priced", "message": "this request needs no payment now: send it without Stipendex-Payment"}),
        ),
        Served::CannotQuote(e) => quote_failed(&e),
        Served::Replayed {
            answer,
            voucher: None,
            ..
        } => replay(&answer),
        Served::Replayed {
            answer,
            voucher: Some(v),
            amount,
            ..
        } => {
            let mut resp = replay(&answer);
            set_tab_call(&mut resp, &v, &Digest::of(&answer.body));
            resp.extensions_mut().remove::<Outcome>();
            if let Some(amount) = amount {
                resp.extensions_mut().insert(Outcome::TabCall {
                    amount,
                    replayed: true,
                });
            }
            resp
        }
        Served::Gone(g) => gone(&g),
        Served::OutcomeUnknown {
            answer, tab_call, ..
        } => {
            let mut resp = replay(&answer);
            if let Some((v, result)) = tab_call {
                set_tab_call(&mut resp, &v, &result);
            }
            resp
        }
        Served::Retry {
            error,
            unavailable: true,
            uncounted,
        } => {
            let mut r = unavailable(
                &error,
                "nothing was charged; send the same payment again later",
            );
            if let Some(v) = uncounted {
                set_uncounted(&mut r, &v);
            }
            r
        }
        Served::Retry { error, .. } => match &error {
            // A Proof's payment not known yet: the rail's own words.
            Error::Payment(r) if !voucher => x402_transport::paywall::unavailable_response(
                r.code(),
                None,
                &format!("{r}: {again}"),
            ),
            e => unavailable(e, again),
        },
        Served::Undelivered { uncounted, .. } => {
            let message = if voucher {
                format!("the service behind this receiver could not be reached: {again}")
            } else {
                format!(
                    "the service behind this receiver could not be reached: nothing was kept; {again}"
                )
            };
            let mut r = x402_transport::paywall::unavailable_response(
                "upstream_unavailable",
                None,
                &message,
            );
            if let Some(v) = uncounted {
                set_uncounted(&mut r, &v);
            }
            r
        }
        Served::Undeliverable {
            why,
            given_back,
            uncounted,
        } => {
            let message = if voucher {
                format!("{why}: the voucher was not counted")
            } else if given_back {
                format!("{why}: the payment was given back")
            } else {
                format!("{why}: nothing was kept; {again}")
            };
            let mut r = json_response(
                StatusCode::BAD_GATEWAY,
                &json!({"error": "answer_undeliverable", "message": message}),
            );
            if let Some(v) = uncounted {
                set_uncounted(&mut r, &v);
            }
            r
        }
        Served::Unsettled(e) => json_response(
            StatusCode::BAD_GATEWAY,
            &json!({"error": e.code(), "message": e.to_string()}),
        ),
        // x402's own codec: a 402 with a fresh challenge naming the refusal, or a 503.
        Served::X402Failed(f) => match seen.x402 {
            Some((p, route)) => {
                p.failure_response(
                    route,
                    &seen.path,
                    &seen.url,
                    f.failure,
                    f.presented.as_ref(),
                    Some(f.scheme.as_ref()),
                )
                .await
            }
            None => json_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                &json!({"error": "internal", "message": "an x402 answer on a route without x402"}),
            ),
        },
        // `Served` is non-exhaustive for users outside this crate; every variant is above.
        #[allow(unreachable_patterns)]
        _ => json_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            &json!({"error": "internal", "message": "unexpected answer"}),
        ),
    }
}

/// One header's value (at most one, visible ASCII).
fn one_header(h: &HeaderMap, name: &str) -> Result<Option<String>, String> {
    let mut values = h.get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => v
            .to_str()
            .map(|s| Some(s.to_owned()))
            .map_err(|_| format!("the {name} header is not visible ASCII")),
        (Some(_), Some(_)) => Err(format!("the {name} header is sent twice")),
    }
}

/// The voucher (and the hold Proof opening its tab, with the first call) of a call inside a
/// tab, decoded.
fn read_tab_headers(h: &HeaderMap) -> Result<Option<(String, Option<String>)>, String> {
    let decode = |v: String| decode_header(&v).map_err(|e| e.to_string());
    let voucher = one_header(h, VOUCHER)?;
    let open = one_header(h, TAB)?;
    if h.contains_key(PAYMENT) && voucher.is_some() {
        return Err(
            "a call is paid by a Stipendex-Payment or a Stipendex-Voucher, not both".into(),
        );
    }
    match (voucher, open) {
        (None, None) => Ok(None),
        (None, Some(_)) => Err("Stipendex-Tab opens a tab with a call's Stipendex-Voucher".into()),
        (Some(v), open) => Ok(Some((decode(v)?, open.map(decode).transpose()?))),
    }
}

/// `Stipendex-Tab-Call: voucher=<digest>; uncounted`: the voucher was not counted (the wallet
/// gives its lane back).
fn set_uncounted(resp: &mut Response, voucher: &Digest) {
    let v = format!("voucher={}; {}", voucher.as_str(), super::UNCOUNTED);
    if let Ok(v) = HeaderValue::from_str(&v) {
        resp.headers_mut()
            .insert(HeaderName::from_static(TAB_CALL), v);
    }
}

fn set_tab_call(resp: &mut Response, voucher: &Digest, result: &Digest) {
    let v = format!("voucher={}; result={}", voucher.as_str(), result.as_str());
    if let Ok(v) = HeaderValue::from_str(&v) {
        resp.headers_mut()
            .insert(HeaderName::from_static(TAB_CALL), v);
    }
}

/// `POST` [`TAB_CLOSE`]: the wallet's signed close request; the closing Receipt.
async fn close_tab(b: &Binding, req: HttpRequest) -> Response {
    if req.method() != Method::POST {
        let mut r = json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"error": "method_not_allowed", "message": "POST the tab-close request (its compact JWS) here"}),
        );
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("POST"));
        return r;
    }
    let Ok(body) = axum::body::to_bytes(req.into_body(), MAX_CLOSE_BODY).await else {
        return json_response(
            StatusCode::PAYLOAD_TOO_LARGE,
            &json!({"error": "too_large", "message": format!("a tab-close request is at most {MAX_CLOSE_BODY} bytes")}),
        );
    };
    let Ok(jws) = std::str::from_utf8(&body) else {
        return json_response(
            StatusCode::BAD_REQUEST,
            &json!({"error": "malformed", "message": "the body is not a compact JWS"}),
        );
    };
    match b.receiver.close_tab(jws.trim()).await {
        Ok(receipt) => json_response(StatusCode::OK, &json!({"receipt": receipt})),
        Err(e) => {
            let status = match &e {
                Error::TabClosed { .. } => StatusCode::NOT_FOUND,
                Error::Storage(_) => StatusCode::SERVICE_UNAVAILABLE,
                Error::Payment(r) if r.is_retryable() => StatusCode::SERVICE_UNAVAILABLE,
                Error::Payment(_) => StatusCode::BAD_GATEWAY,
                _ => StatusCode::BAD_REQUEST,
            };
            json_response(
                status,
                &json!({"error": e.code(), "message": e.to_string()}),
            )
        }
    }
}

/// The kept answer of a Proof presented again.
fn replay(answer: &Answer) -> Response {
    use base64::Engine as _;
    let status = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::OK);
    let mut resp = Response::new(Body::from(answer.body.clone()));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    if let Some(v) = answer
        .content_type
        .as_deref()
        .and_then(|c| HeaderValue::from_str(c).ok())
    {
        h.insert(header::CONTENT_TYPE, v);
    }
    if let Some(r) = &answer.receipt {
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(r.as_bytes());
        if let Ok(v) = HeaderValue::from_str(&encoded) {
            h.insert(HeaderName::from_static(RECEIPT), v);
        }
    }
    for (name, value) in &answer.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            h.insert(n, v);
        }
    }
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    resp.extensions_mut().insert(Outcome::Replayed);
    resp
}

/// A Proof presented again whose kept answer is gone: `410 Gone`, `{"error": "answer_gone",
/// "message", "quote", "receipt"}` — the Receipt (`{"stipendex": "receipt/0.1", "jws"}`) when
/// its record still holds it. Not a `402`: nothing is to be paid again. The Receipt rides in
/// the body, not in `Stipendex-Receipt` (it binds the answer's body, not this one).
fn gone(g: &Gone) -> Response {
    let mut body = Map::new();
    body.insert("error".into(), Value::from(ANSWER_GONE));
    body.insert("message".into(), Value::from(g.message.as_str()));
    body.insert("quote".into(), Value::from(g.quote.as_str()));
    if let Some(r) = g
        .receipt
        .as_deref()
        .and_then(|jws| crate::envelope::Signed::<crate::envelope::Receipt>::parse(jws).ok())
        .and_then(|r| serde_json::to_value(r).ok())
    {
        body.insert("receipt".into(), r);
    }
    let mut resp = json_response(StatusCode::GONE, &Value::Object(body));
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-store"),
    );
    resp.extensions_mut().insert(Outcome::AnswerGone);
    resp
}

/// What the 402 needs of the request (a request is not `Sync`: it is not held across awaits),
/// and the x402 route offered beside the Quote.
struct Seen<'a> {
    path: String,
    url: String,
    head: bool,
    x402: Option<(&'a Paywall, &'a PricedRoute)>,
    /// An x402 payment is presented.
    x402_paid: bool,
}

impl<'a> Seen<'a> {
    fn of(req: &HttpRequest, x402: Option<(&'a Paywall, &'a PricedRoute)>) -> Self {
        Seen {
            path: req.uri().path().to_owned(),
            url: resource_url(req),
            head: req.method() == Method::HEAD,
            x402,
            x402_paid: false,
        }
    }
}

/// The Stipendex-Payment value (one, visible ASCII), read before anything is awaited.
fn read_proof(h: &HeaderMap) -> Result<Option<String>, String> {
    let mut values = h.get_all(PAYMENT).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(v), None) => v
            .to_str()
            .map(|s| Some(s.to_owned()))
            .map_err(|_| "the Stipendex-Payment header is not visible ASCII".to_owned()),
        (Some(_), Some(_)) => Err("the Stipendex-Payment header is sent twice".to_owned()),
    }
}

fn quote_failed(e: &Error) -> Response {
    if let Error::RateLimited { retry_after, .. } = e {
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after));
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        return (
            StatusCode::TOO_MANY_REQUESTS,
            h,
            axum::Json(json!({"error": e.code(), "message": e.to_string()})),
        )
            .into_response();
    }
    tracing::error!(error = %e, "stipendex: cannot quote");
    x402_transport::paywall::unavailable_response(e.code(), None, &format!("cannot quote now: {e}"))
}

/// The 402: `{"quote": …, "tab": …}` merged with the x402 body when the route also takes
/// x402, and x402 v2's `PAYMENT-REQUIRED`.
async fn quoted(
    req: &Seen<'_>,
    list_price: bool,
    quote: &crate::envelope::Signed<crate::envelope::Quote>,
    tab: Option<crate::envelope::Signed<Tab>>,
    refusal: Option<(String, String)>,
) -> Response {
    let mut body = Map::new();
    let mut x402_header = None;
    // The x402 route is offered beside the Quote only when the Quote asks the capability's
    // list price, the price the route was built at (the hook may quote another).
    if let Some((p, route)) = req.x402.filter(|_| list_price) {
        match p.payment_required(route, &req.path, &req.url, None).await {
            Ok((v2, v1)) => {
                let members = match &v1 {
                    Some(v1) => serde_json::to_value(v1),
                    None => serde_json::to_value(&v2),
                };
                if let Ok(Value::Object(m)) = members {
                    body.extend(m);
                }
                x402_header = v2.to_header().ok();
            }
            Err(e) => {
                tracing::warn!(error = ?e, "stipendex: the x402 schemes cannot issue a challenge now; quoting Stipendex only");
            }
        }
    }
    body.insert(
        "quote".into(),
        serde_json::to_value(quote).unwrap_or(Value::Null),
    );
    if let Some(t) = tab {
        body.insert("tab".into(), serde_json::to_value(t).unwrap_or(Value::Null));
    }
    let refusal_given = refusal.is_some();
    if let Some((code, message)) = refusal {
        body.insert("error".into(), Value::String(code));
        body.insert("message".into(), Value::String(message));
    }
    let outcome = Outcome::Quoted {
        refusal: body
            .get("error")
            .filter(|_| refusal_given)
            .and_then(Value::as_str)
            .map(str::to_owned),
    };
    let mut resp = json_response(StatusCode::PAYMENT_REQUIRED, &Value::Object(body));
    resp.extensions_mut().insert(outcome);
    if let Some(hv) = x402_header.and_then(|v| HeaderValue::from_str(&v).ok()) {
        resp.headers_mut()
            .insert(HeaderName::from_static(wire::PAYMENT_REQUIRED), hv);
    }
    if req.head {
        *resp.body_mut() = Body::empty();
    }
    resp
}

fn decode_header(value: &str) -> Result<String, Error> {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(value.trim())
        .map_err(|_| Error::Malformed("Stipendex-Payment is not base64url".into()))?;
    String::from_utf8(bytes)
        .map_err(|_| Error::Malformed("Stipendex-Payment does not hold a compact JWS".into()))
}

#[cfg(test)]
mod client_key_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append("x-forwarded-for", HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn proxies() -> TrustedProxies {
        TrustedProxies::nets(vec![
            "10.0.0.0/8".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
        ])
    }

    fn key(peer: &str, headers: &HeaderMap) -> Option<String> {
        client_key(Some(peer.parse().unwrap()), headers, &proxies())
    }

    #[test]
    fn a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored() {
        let h = xff(&["198.51.100.9"]);
        assert_eq!(key("203.0.113.7", &h).as_deref(), Some("203.0.113.7"));
        let nobody = TrustedProxies::default();
        assert_eq!(
            client_key(Some("10.0.0.1".parse().unwrap()), &h, &nobody).as_deref(),
            Some("10.0.0.1"),
            "no proxy is trusted by default"
        );
    }

    #[test]
    fn behind_a_trusted_proxy_the_client_is_the_address_it_vouches_for() {
        let h = xff(&["198.51.100.9"]);
        assert_eq!(key("10.0.0.1", &h).as_deref(), Some("198.51.100.9"));
        assert_eq!(
            key("10.0.0.1", &HeaderMap::new()).as_deref(),
            Some("10.0.0.1"),
            "a trusted peer without the header is its own client"
        );
        assert_eq!(client_key(None, &h, &proxies()), None, "no peer, no client");
    }

    #[test]
    fn the_right_most_untrusted_entry_counts_not_what_the_client_wrote() {
        // The client wrote `1.1.1.1, 2.2.2.2`; the outer proxy appended the client's address,
        // the inner proxy the outer's.
        let h = xff(&["1.1.1.1, 2.2.2.2, 198.51.100.9, 10.1.2.3"]);
        assert_eq!(key("10.0.0.1", &h).as_deref(), Some("198.51.100.9"));
        // The same chain over several header lines, in order.
        let h = xff(&["1.1.1.1", "2.2.2.2, 198.51.100.9", "10.1.2.3"]);
        assert_eq!(key("10.0.0.1", &h).as_deref(), Some("198.51.100.9"));
        // Every entry a proxy: the left-most of them.
        let h = xff(&["10.9.9.9, 10.1.2.3"]);
        assert_eq!(key("10.0.0.1", &h).as_deref(), Some("10.9.9.9"));
    }

    #[test]
    fn ipv6_counts_by_its_64_and_mapped_ipv4_as_ipv4() {
        let a = key("2001:db8:1:2::1", &HeaderMap::new());
        let b = key("2001:db8:1:2:ffff:ffff:ffff:ffff", &HeaderMap::new());
        assert_eq!(a.as_deref(), Some("2001:db8:1:2::/64"));
        assert_eq!(a, b, "one /64, one client");
        assert_ne!(a, key("2001:db8:1:3::1", &HeaderMap::new()));
        assert_eq!(
            key("::ffff:203.0.113.7", &HeaderMap::new()).as_deref(),
            Some("203.0.113.7")
        );
        // A mapped proxy address is trusted as its IPv4; forwarded entries are keyed the same.
        let h = xff(&["[2001:db8:5:6::9]:4711, ::ffff:10.2.2.2"]);
        assert_eq!(
            key("::ffff:10.0.0.1", &h).as_deref(),
            Some("2001:db8:5:6::/64")
        );
        let h = xff(&["198.51.100.9:4711, fd00::1"]);
        assert_eq!(key("fd12::1", &h).as_deref(), Some("198.51.100.9"));
    }

    #[test]
    fn garbage_forwarded_for_never_becomes_a_client_key() {
        for garbage in ["unknown", "not an ip", "999.1.1.1", "1.2.3.4/8", "<script>"] {
            let h = xff(&[&format!("198.51.100.9, {garbage}")]);
            assert_eq!(
                key("10.0.0.1", &h).as_deref(),
                Some("10.0.0.1"),
                "{garbage}: the proxy that passed it stands for the client"
            );
            let h = xff(&[&format!("{garbage}, 10.3.3.3")]);
            assert_eq!(
                key("10.0.0.1", &h).as_deref(),
                Some("10.3.3.3"),
                "{garbage}"
            );
        }
        let mut h = HeaderMap::new();
        h.append(
            "x-forwarded-for",
            HeaderValue::from_bytes(b"198.51.100.9\xff").unwrap(),
        );
        assert_eq!(
            key("10.0.0.1", &h).as_deref(),
            Some("10.0.0.1"),
            "not UTF-8"
        );
        // Empty entries are skipped, not garbage.
        let h = xff(&["198.51.100.9, , "]);
        assert_eq!(key("10.0.0.1", &h).as_deref(), Some("198.51.100.9"));
    }

    #[test]
    fn a_long_chain_of_proxies_is_read_so_far_only() {
        let chain = vec!["10.0.0.2"; 100].join(", ");
        let h = xff(&[&format!("198.51.100.9, {chain}")]);
        assert_eq!(key("10.0.0.1", &h).as_deref(), Some("10.0.0.2"));
    }

    #[test]
    fn networks_parse_and_match() {
        let n: IpNet = "192.0.2.0/24".parse().unwrap();
        assert!(n.contains("192.0.2.200".parse().unwrap()));
        assert!(n.contains("::ffff:192.0.2.1".parse().unwrap()));
        assert!(!n.contains("192.0.3.1".parse().unwrap()));
        let one: IpNet = "2001:db8::1".parse().unwrap();
        assert!(one.contains("2001:db8::1".parse().unwrap()));
        assert!(!one.contains("2001:db8::2".parse().unwrap()));
        let all: IpNet = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("203.0.113.7".parse().unwrap()));
        for bad in ["10.0.0.0/33", "fd00::/129", "10.0.0", "x/8", "10.0.0.0/-1"] {
            assert!(bad.parse::<IpNet>().is_err(), "{bad}");
        }
        let t = TrustedProxies::matching(|ip| ip == IpAddr::from([127, 0, 0, 1]));
        assert!(t.trusts("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!TrustedProxies::nets(Vec::new()).trusts("127.0.0.1".parse().unwrap()));
    }
}
