//! The wallet's side of the HTTP binding: a reqwest client that pays 402s with the wallet.

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::Value;

use super::{PAYMENT, RECEIPT, TAB, TAB_CALL, TAB_CLOSE, VOUCHER};
use crate::Error;
use crate::envelope::{Digest, Quote, Receipt, Resource, Signed, TabReceipt};
use crate::receiver::Request;
use crate::wallet::{
    ChallengePaid, Demand, OpenTabs, Paid, Reply, Settlement, Source, TabHold, VoucherReply, Wallet,
};
use x402_transport::client::{self as x402, ClientError};
use x402_transport::wire;

/// A paid (or free) response: status, headers, body, and the checked Receipt if it was paid.
#[derive(Debug)]
pub struct Response {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: reqwest::header::HeaderMap,
    /// The body.
    pub body: bytes::Bytes,
    /// The payment, if the request was paid.
    pub paid: Option<Paid>,
    /// The receiver's Receipt (checked: signed by the Quote's receiver, binding the Proof).
    pub receipt: Option<Signed<Receipt>>,
    /// The unsigned x402 challenge paid instead, if the 402 carried no Quote.
    pub x402: Option<ChallengePaid>,
    /// The server's `PAYMENT-RESPONSE` (or v1 `X-PAYMENT-RESPONSE`), decoded, after an x402
    /// payment.
    pub settlement: Option<Value>,
    /// The call inside a tab that paid it, if one did.
    pub tab_call: Option<TabCallPaid>,
}

/// A call paid by a voucher inside a tab.
#[derive(Clone, Debug)]
pub struct TabCallPaid {
    /// The tab's id.
    pub tab: String,
    /// The voucher, by digest.
    pub voucher: Digest,
    /// The digest of the body received: the call's leaf in the tab's Merkle tree (checked
    /// against the receiver's `Stipendex-Tab-Call`).
    pub result: Digest,
    /// What the call cost.
    pub amount: rail_core::Money,
}

/// A reqwest client that hands a 402's Quote to the wallet and retries once with the Proof; a
/// 402 without a Quote is an x402 challenge, paid under the same mandate with the wallet's
/// scheme payers and delivered by the x402 client (`PAYMENT-SIGNATURE`, or `X-PAYMENT` for v1;
/// the same payment sent again while its outcome is unknown: no answer, 502, 503 or 504).
///
/// The origin binding: every URL is parsed once (the `url` crate, which reqwest connects
/// with); an unpaid request's redirects are followed hop by hop, and a 402 is paid only for the
/// request that got it — a Quote must name exactly that origin, method, path and query
/// ([`Wallet::pay_for`]), a challenge is allowlisted by that origin. A payment header never
/// follows a redirect: a 3xx answer to a paid request is returned as it is.
#[derive(Clone, Debug)]
pub struct Client {
    wallet: Wallet,
    /// Follows unpaid redirects and delivers the wallet's x402 payments (it has no payer: the
    /// wallet decides and signs); its HTTP client follows no redirect.
    x402: x402::Client,
    /// The tabs this client holds.
    tabs: OpenTabs,
}

impl Client {
    /// A client paying with `wallet`, on the HTTP client `http` builds (with redirects turned
    /// off, whatever `http` says; [`super::reqwest_builder`] gives the workspace's defaults).
    ///
    /// # Errors
    /// [`Error::Config`] if the HTTP client cannot be built.
    pub fn new(http: reqwest::ClientBuilder, wallet: Wallet) -> Result<Self, Error> {
        let x402 = x402::Client::new(http).map_err(|e| Error::Config(e.to_string()))?;
        Ok(Client {
            wallet,
            x402,
            tabs: OpenTabs::default(),
        })
    }

    /// The wallet.
    #[must_use]
    pub fn wallet(&self) -> &Wallet {
        &self.wallet
    }

    /// `GET url`, paying a 402 under the wallet's mandate.
    ///
    /// # Errors
    /// The wallet's refusals ([`Error::Denied`], [`Error::LimitExceeded`], …), a 402 without a
    /// Quote ([`Error::Malformed`]), [`Error::Network`] when a request gets no answer (saying
    /// so when a payment was made before: it is kept for the same request asked again), the
    /// rail's failures ([`Error::Payment`]), and a Receipt that does not check
    /// ([`Error::Broken`]).
    pub async fn get(&self, url: &str) -> Result<Response, Error> {
        Box::pin(self.send(Method::GET, url)).await
    }

    /// `POST url` (no body), paying a 402 under the wallet's mandate.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn post(&self, url: &str) -> Result<Response, Error> {
        Box::pin(self.send(Method::POST, url)).await
    }

    /// `method url`, paying a 402 once.
    ///
    /// # Errors
    /// As [`Client::get`].
    pub async fn send(&self, method: Method, url: &str) -> Result<Response, Error> {
        Box::pin(self.execute(method, url, HeaderMap::new(), None)).await
    }

    /// `method url` with `headers` and `body`, paying a 402 once.
    ///
    /// # Errors
    /// As [`Client::get`]; [`Error::Malformed`] if `url` is not an absolute http(s) URL.
    pub async fn execute(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Option<Vec<u8>>,
    ) -> Result<Response, Error> {
        Box::pin(self.execute_with(method, url, headers, body, &mut Sink::Memory)).await
    }

    /// As [`Client::execute`], the final answer's body written to `out` as it arrives, with no
    /// cap on its size (the [`Response`]'s `body` is then empty). A paid body is hashed as it
    /// streams and checked against the Receipt when it ends: a Receipt that does not bind it is
    /// an error after the body was written (`stipendex fetch` exits non-zero). The bodies of
    /// x402 answers are read as by [`Client::execute`] (at most 16 MiB), then written.
    ///
    /// # Errors
    /// As [`Client::execute`]; [`Error::Storage`] if `out` cannot be written.
    pub async fn execute_to(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Option<Vec<u8>>,
        out: &mut (dyn std::io::Write + Send),
    ) -> Result<Response, Error> {
        Box::pin(self.execute_with(method, url, headers, body, &mut Sink::Out(out))).await
    }

    async fn execute_with(
        &self,
        method: Method,
        url: &str,
        headers: HeaderMap,
        body: Option<Vec<u8>>,
        sink: &mut Sink<'_>,
    ) -> Result<Response, Error> {
        let url = crate::origin::parsed(url)?;
        let sent = sent_to(&method, &url);
        // A call an open tab covers is paid by a voucher at once: no 402 round trip. A tab that
        // is over (closed, ended, its cap used) is closed, and the 402's fresh offers are taken
        // below.
        if let Some((hold, opened)) = self.tabs.covering(&sent, self.wallet.now()) {
            let call = self.call_in_tab(&hold, opened, &method, &url, &headers, body.clone(), sink);
            if let Some(resp) = Box::pin(call).await? {
                return Ok(resp);
            }
        }
        let reached = self
            .x402
            .reach(method, url, &headers, body)
            .await
            .map_err(|e| unavailable(&e))?;
        let x402::Reached {
            response: first,
            url,
            method,
            body,
        } = reached;
        if first.status() != StatusCode::PAYMENT_REQUIRED {
            return read(first, sink).await;
        }
        let header = first
            .headers()
            .get(wire::PAYMENT_REQUIRED)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = x402::read_402_body(first).await.map_err(|e| match e {
            ClientError::Header(why) => Error::Malformed(why),
            e => unavailable(&e),
        })?;
        let parsed: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        // The request that got the 402 (after unpaid redirects).
        let sent = sent_to(&method, &url);
        let quote = parsed
            .get("quote")
            .map(|q| serde_json::from_value::<Signed<Quote>>(q.clone()))
            .transpose()
            .map_err(|e| Error::Malformed(format!("the 402's quote: {e}")))?;
        let (required, source);
        let demand = match &quote {
            // A tab beside the Quote, where the mandate allows tabs in its asset: opened, and
            // this call paid by its first voucher.
            Some(quote) => Demand::Quote {
                quote,
                sent: &sent,
                tab: parsed.get("tab"),
            },
            // No Quote: an x402 challenge, paid under the same mandate.
            None => {
                required = x402::read_402(header.as_deref(), &bytes)
                    .map_err(|e| Error::Malformed(e.to_string()))?
                    .ok_or_else(|| {
                        Error::Malformed(
                            "the 402 carries neither a Quote nor an x402 payment requirement"
                                .into(),
                        )
                    })?;
                source = Source::http(url.as_str())?;
                Demand::Challenge {
                    source: &source,
                    required: &required,
                }
            }
        };
        let settled = Box::pin(self.wallet.settle_demand(demand, self.wallet.confirmer())).await?;
        let (paid, quote) = match (settled, quote) {
            (Settlement::Proof(paid), Some(quote)) => (*paid, quote),
            (Settlement::Tab(hold), _) => {
                self.tabs.add(hold.clone());
                let call = self.call_in_tab(&hold, false, &method, &url, &headers, body, sink);
                return match Box::pin(call).await? {
                    Some(resp) => Ok(resp),
                    None => Err(Error::Payment(rail_core::RailError::Declined(
                        rail_core::RailReason::new(
                            "tab_refused",
                            "the receiver refused the tab it offered; ask again",
                        ),
                    ))),
                };
            }
            (Settlement::X402(paid), _) => {
                return Box::pin(self.send_x402(method, &url, &headers, body, *paid, sink)).await;
            }
            (other, _) => return Err(other.unexpected()),
        };
        let proof = HeaderValue::from_str(&paid.proof.to_header())
            .map_err(|e| Error::Malformed(format!("the proof header: {e}")))?;
        let mut retry = self
            .x402
            .http()
            .request(method, url)
            .headers(headers)
            .header(PAYMENT, proof);
        if let Some(b) = body {
            retry = retry.body(b);
        }
        // Once paid, the Proof is kept until this request's answer comes back: a transport
        // failure or a retryable answer leaves it for the same request asked again.
        let started = std::time::Instant::now();
        let second = match retry.send().await {
            Ok(r) => r,
            Err(e) => {
                self.wallet.proof_reply(&paid, Reply::Lost).await?;
                return Err(kept(
                    &x402::describe_http_error_after(&e, started.elapsed()),
                    &quote,
                ));
            }
        };
        if second.status() == StatusCode::PAYMENT_REQUIRED {
            let body = x402::read_402_body(second).await.unwrap_or_default();
            self.wallet.proof_reply(&paid, Reply::Refused).await?;
            return Err(refusal(&body, "the receiver refused the proof"));
        }
        let (status, headers) = (second.status(), second.headers().clone());
        let (body, digest, len) = match take_body(second, sink).await {
            Ok(taken) => taken,
            // The answer broke off: not received, so the payment stays kept for a retry.
            Err(Error::Network(why)) => {
                self.wallet.proof_reply(&paid, Reply::Lost).await?;
                return Err(kept(&why, &quote));
            }
            Err(e) => return Err(e),
        };
        let jws = match headers.get(RECEIPT).map(|v| v.to_str()) {
            Some(Ok(v)) => Some(
                String::from_utf8(
                    base64::Engine::decode(
                        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
                        v.trim(),
                    )
                    .map_err(|_| Error::Malformed("Stipendex-Receipt is not base64url".into()))?,
                )
                .map_err(|_| Error::Malformed("Stipendex-Receipt is not a JWS".into()))?,
            ),
            Some(Err(_)) => return Err(Error::Malformed("Stipendex-Receipt is not ASCII".into())),
            None => None,
        };
        let reply = match &jws {
            // The Receipt must bind the bytes delivered, before it is journaled as theirs.
            Some(receipt) => Reply::Receipted {
                receipt,
                digest: &digest,
                len,
            },
            // An answer without a Receipt: a failure the receiver keeps as this Proof's answer
            // — unless it is a server error (it may not have been the receiver's), after which
            // the same request presents the same Proof again.
            None if status.is_server_error() => Reply::Lost,
            None => Reply::Unreceipted,
        };
        let receipt = self.wallet.proof_reply(&paid, reply).await?;
        Ok(Response {
            paid: Some(paid),
            receipt,
            ..Response::unpaid(status, headers, body)
        })
    }

    /// Sends the call with a voucher of `hold` (and its hold Proof if the tab is not yet
    /// `opened` at the receiver). `Ok(None)`: the receiver answered 402 (the tab is over or
    /// refused), and `hold` is retired.
    #[allow(clippy::too_many_arguments)]
    async fn call_in_tab(
        &self,
        hold: &TabHold,
        opened: bool,
        method: &Method,
        url: &reqwest::Url,
        headers: &HeaderMap,
        body: Option<Vec<u8>>,
        sink: &mut Sink<'_>,
    ) -> Result<Option<Response>, Error> {
        let sent = sent_to(method, url);
        let v = match self
            .wallet
            .voucher(hold, &Request::from_resource(&sent))
            .await
        {
            Ok(v) => v,
            Err(Error::Voucher { .. } | Error::Expired { .. } | Error::NotYetValid { .. }) => {
                Box::pin(self.retire(hold)).await;
                return Ok(None);
            }
            // The mandate was revoked: the tab is closed, and the call refused.
            Err(e @ Error::Revoked(_)) => {
                Box::pin(self.retire(hold)).await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let header = |s: String| {
            HeaderValue::from_str(&s).map_err(|e| Error::Malformed(format!("a tab header: {e}")))
        };
        let mut rq = self
            .x402
            .http()
            .request(method.clone(), url.clone())
            .headers(headers.clone())
            .header(VOUCHER, header(v.voucher.to_header())?);
        if !opened {
            rq = rq.header(TAB, header(hold.proof().to_header())?);
        }
        if let Some(b) = body {
            rq = rq.body(b);
        }
        let resp = rq.send().await.map_err(|e| transport(&e))?;
        if resp.status() == StatusCode::PAYMENT_REQUIRED {
            let body = x402::read_402_body(resp).await.unwrap_or_default();
            let refused = refusal(&body, "the receiver refused the voucher");
            tracing::info!(tab = %hold.tab().object().id, error = %refused, "the tab is over here");
            Box::pin(self.retire(hold)).await;
            return Ok(None);
        }
        if !resp.status().is_server_error() {
            self.tabs.opened(hold);
        }
        let (status, headers) = (resp.status(), resp.headers().clone());
        let said = headers
            .get(TAB_CALL)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let said = said.as_deref();
        let uncounted = format!(
            "voucher={}; {}",
            v.voucher.digest().as_str(),
            super::UNCOUNTED
        );
        if said == Some(uncounted.as_str()) {
            // Not counted (refused or waived by the price hook, or the call never reached the
            // service): the lane is given back, and nothing was paid for this answer.
            self.wallet
                .voucher_reply(hold, &v, VoucherReply::Uncounted)
                .await;
            let (body, _, _) = take_body(resp, sink).await?;
            return Ok(Some(Response::unpaid(status, headers, body)));
        }
        let (body, result, _) = take_body(resp, sink).await?;
        let expected = format!(
            "voucher={}; result={}",
            v.voucher.digest().as_str(),
            result.as_str()
        );
        let named = said == Some(expected.as_str());
        let reply = VoucherReply::Counted {
            result: &result,
            named,
        };
        self.wallet.voucher_reply(hold, &v, reply).await;
        let o = v.voucher.object();
        Ok(Some(Response {
            tab_call: Some(TabCallPaid {
                tab: o.tab.clone(),
                voucher: v.voucher.digest().clone(),
                result,
                amount: o.money()?,
            }),
            ..Response::unpaid(status, headers, body)
        }))
    }

    /// Stops using `hold` and closes it (errors logged: the receiver closes it by itself at
    /// its end).
    async fn retire(&self, hold: &TabHold) {
        self.tabs.remove(hold);
        if let Err(e) = self.close(hold).await {
            tracing::warn!(tab = %hold.tab().object().id, error = %e, "could not close a tab");
        }
    }

    /// Closes every tab this client holds: each receiver captures exactly the last vouchers
    /// and signs the closing Receipt, checked by the wallet, which gives the rest of the cap
    /// back to the mandate's limits.
    ///
    /// # Errors
    /// The first failure (the other tabs are closed still; a tab that could not be closed is
    /// kept, and the receiver closes it at its end).
    pub async fn close_tabs(&self) -> Result<Vec<Signed<TabReceipt>>, Error> {
        self.tabs
            .close_all(|h| async move { self.close(&h).await })
            .await
    }

    /// Closes `hold` at its receiver: `POST {origin}/.well-known/stipendex/tab-close`.
    ///
    /// # Errors
    /// [`Error::Network`] (no answer), [`Error::Payment`] (the receiver's refusal), and the
    /// wallet's checks of the Receipt ([`Wallet::tab_closed`]).
    pub async fn close(&self, hold: &TabHold) -> Result<Signed<TabReceipt>, Error> {
        let close = self.wallet.close_request(hold)?;
        let url = format!("{}{TAB_CLOSE}", hold.tab().object().origin);
        let resp = self
            .x402
            .http()
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/jose")
            .body(close.jws().to_owned())
            .send()
            .await
            .map_err(|e| transport(&e))?;
        let status = resp.status();
        let body = read_capped(resp).await?;
        if !status.is_success() {
            return Err(refusal(&body, "the receiver did not close the tab"));
        }
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| Error::Malformed(format!("the tab-close answer: {e}")))?;
        let receipt: Signed<TabReceipt> =
            serde_json::from_value(v.get("receipt").cloned().unwrap_or(Value::Null))
                .map_err(|e| Error::Malformed(format!("the tab-close answer's receipt: {e}")))?;
        self.wallet.tab_closed(hold, receipt.jws()).await
    }

    /// Sends the request again with the x402 payment the wallet signed.
    async fn send_x402(
        &self,
        method: Method,
        url: &reqwest::Url,
        headers: &HeaderMap,
        body: Option<Vec<u8>>,
        paid: ChallengePaid,
        sink: &mut Sink<'_>,
    ) -> Result<Response, Error> {
        let answer = self
            .x402
            .resend_with(method, url.as_str(), headers, body, paid.sent())
            .await
            .map_err(|e| match e {
                ClientError::OutcomeUnknown { detail, .. } => {
                    Error::Payment(rail_core::RailError::Unavailable(rail_core::RailReason::new(
                        "outcome_unknown",
                        format!(
                            "the x402 payment was sent and its outcome is unknown ({detail}); present the same payment again"
                        ),
                    )))
                }
                e => unavailable(&e),
            })?;
        if answer.status == StatusCode::PAYMENT_REQUIRED {
            return Err(refusal(&answer.body, "the server refused the x402 payment"));
        }
        let body = match sink {
            Sink::Memory => answer.body,
            Sink::Out(out) => {
                write_out(*out, &answer.body)?;
                Vec::new()
            }
        };
        Ok(Response {
            x402: Some(paid),
            settlement: answer.response,
            ..Response::unpaid(answer.status, answer.headers, body)
        })
    }
}

/// A paid retry answered 402 again: the refusal's code (`error`) and message, as a decline.
fn refusal(body: &[u8], what: &str) -> Error {
    let body: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let code = body
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("refused");
    let message = body.get("message").and_then(Value::as_str).unwrap_or("");
    Error::Payment(rail_core::RailError::Declined(rail_core::RailReason::new(
        code,
        if message.is_empty() {
            what.to_owned()
        } else {
            format!("{what}: {message}")
        },
    )))
}

/// A failure of the x402 client's HTTP: the network's sentence as [`Error::Network`]; its
/// other failures as the rail's `unavailable`.
fn unavailable(e: &ClientError) -> Error {
    match e {
        ClientError::Http(why) => Error::Network(why.clone()),
        e => Error::Payment(rail_core::RailError::Unavailable(
            rail_core::RailReason::new("http", e.to_string()),
        )),
    }
}

/// A request that got no answer, in one sentence ([`x402::describe_http_error`]).
fn transport(e: &reqwest::Error) -> Error {
    Error::Network(x402::describe_http_error(e))
}

/// A request paid by `quote` that got no answer: the network's sentence, and what became of
/// the payment (kept with its Proof: the same request asked again presents it, and pays
/// nothing new).
fn kept(why: &str, quote: &Signed<Quote>) -> Error {
    let q = quote.object();
    Error::Network(format!(
        "{why}, after quote {} of {} was paid: the payment is kept and will be presented again when the same request is retried (nothing is paid twice)",
        q.id, q.receiver.id
    ))
}

/// A response body, at most [`x402::MAX_BODY`] bytes.
async fn read_capped(r: reqwest::Response) -> Result<Vec<u8>, Error> {
    x402::read_body(r, x402::MAX_BODY)
        .await
        .map_err(|e| match e {
            ClientError::TooLarge(why) => Error::Malformed(why),
            e => unavailable(&e),
        })
}

/// Where the body of the final answer goes.
enum Sink<'a> {
    /// Into the [`Response`] (at most [`x402::MAX_BODY`] bytes).
    Memory,
    /// Written out as it arrives, with no cap; the [`Response`]'s body is empty.
    Out(&'a mut (dyn std::io::Write + Send)),
}

fn write_out(out: &mut (dyn std::io::Write + Send), bytes: &[u8]) -> Result<(), Error> {
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(|e| Error::Storage(format!("cannot write the body: {e}")))
}

/// The final answer's body, into `sink`: what is held in memory (nothing when written out),
/// the digest of every byte received, and their count.
async fn take_body(
    mut r: reqwest::Response,
    sink: &mut Sink<'_>,
) -> Result<(Vec<u8>, Digest, u64), Error> {
    use sha2::Digest as _;
    match sink {
        Sink::Memory => {
            let body = read_capped(r).await?;
            let digest = Digest::of(&body);
            let len = body.len() as u64;
            Ok((body, digest, len))
        }
        Sink::Out(out) => {
            let mut hash = sha2::Sha256::new();
            let mut len: u64 = 0;
            while let Some(chunk) = r.chunk().await.map_err(|e| transport(&e))? {
                hash.update(&chunk);
                len = len.saturating_add(chunk.len() as u64);
                out.write_all(&chunk)
                    .map_err(|e| Error::Storage(format!("cannot write the body: {e}")))?;
            }
            write_out(*out, &[])?;
            Ok((Vec::new(), Digest::from_sha256(hash.finalize().into()), len))
        }
    }
}

/// An unpaid answer.
async fn read(r: reqwest::Response, sink: &mut Sink<'_>) -> Result<Response, Error> {
    let status = r.status();
    let headers = r.headers().clone();
    let (body, _, _) = take_body(r, sink).await?;
    Ok(Response::unpaid(status, headers, body))
}

impl Response {
    /// An answer nothing paid for: `status`, `headers` and `body` alone.
    fn unpaid(status: StatusCode, headers: HeaderMap, body: Vec<u8>) -> Self {
        Response {
            status,
            headers,
            body: body.into(),
            paid: None,
            receipt: None,
            x402: None,
            settlement: None,
            tab_call: None,
        }
    }
}

/// The request sent: `method` to `url` (its origin, path and query).
fn sent_to(method: &Method, url: &reqwest::Url) -> Resource {
    Resource {
        origin: url.origin().ascii_serialization(),
        method: method.as_str().to_owned(),
        path: url.path().to_owned(),
        query: url.query().map(str::to_owned),
    }
}
