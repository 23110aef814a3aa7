//! The host's side of the MCP binding (feature `mcp-client`): [`PayingClient`], which pays
//! what an MCP server asks for under the wallet's mandate and retries — the model sees the
//! result, never the payment error.

use std::time::Duration;

use rmcp::model::{
    CallToolResult, CancelledNotificationParam, ClientRequest, ErrorCode, JsonObject,
    ProgressToken, RequestMetaObject, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RoleClient, ServiceError};
use rmcp::{ErrorData, Peer};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::{PAYMENT, PAYMENT_REQUIRED, PAYMENTS, RECEIPT, TAB, TAB_CALL, TAB_CLOSE, VOUCHER};
use crate::Error;
use crate::envelope::{Digest, Quote, Receipt, Resource, Signed, TabReceipt};
use crate::receiver::Request;
use crate::wallet::{
    ChallengePaid, Confirmer, Demand, OpenTabs, Paid, Reply, Required, Settlement, Source, TabHold,
    VoucherReply, Wallet,
};

/// How many times a paid retry is sent again while the server says the payment's outcome is
/// not known yet (`retryable`), before the call gives up (the payment stays the wallet's to
/// resume: the same Proof is presented next time).
const SAME_PROOF_TRIES: usize = 4;
/// The longest wait between two of those tries.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(2);

/// What was paid for a call.
#[derive(Debug)]
pub enum Payment {
    /// A Stipendex Quote: the wallet's Proof, and the server's Receipt (checked: it binds the
    /// result received) if it sent one.
    Stipendex {
        /// The payment.
        paid: Box<Paid>,
        /// The Receipt.
        receipt: Option<Box<Signed<Receipt>>>,
    },
    /// A call inside a tab, paid by a voucher.
    Tab {
        /// The tab's id.
        tab: String,
        /// The voucher, by digest.
        voucher: Digest,
        /// The digest of the result received (the call's leaf in the tab's tree).
        result: Digest,
        /// What the call cost.
        amount: rail_core::Money,
    },
    /// An x402 challenge (`isError` + `accepts`): the signed payment and the server's
    /// settlement (`_meta["x402/payment-response"]`, unsigned).
    X402 {
        /// The payment.
        paid: Box<ChallengePaid>,
        /// The settlement.
        settlement: Option<Value>,
    },
}

/// A call's answer: the server's result, and what was paid for it.
#[derive(Debug)]
pub struct Answered {
    /// The result (the paid retry's, when a payment was made).
    pub result: ServerResult,
    /// The payment, if the call needed one.
    pub payment: Option<Payment>,
}

/// Why a call has no result.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The server answered with a JSON-RPC error (not a payment request): pass it on.
    #[error("the server answered {}: {}", .0.code.0, .0.message)]
    Server(ErrorData),
    /// The payment was not made, or the server refused it: the wallet's or the server's
    /// reason, with its stable code ([`Error::code`]).
    #[error("not paid ({code}): {0}", code = .0.code())]
    NotPaid(Error),
    /// The server could not be reached, or its answer could not be read.
    #[error("the MCP server cannot be reached: {0}")]
    Transport(String),
}

impl CallError {
    /// The sentence a model reads in place of the result: a mandate's denial names the rule
    /// ("not allowed by your mandate: receiver search-co is not in mandate m_…'s allowlist").
    #[must_use]
    pub fn for_the_model(&self) -> String {
        match self {
            CallError::NotPaid(Error::Denied(why)) => format!("not allowed by your mandate: {why}"),
            CallError::NotPaid(Error::NotConfirmed(why)) => {
                format!("the payment was not confirmed: {why}")
            }
            other => other.to_string(),
        }
    }
}

/// One call through [`PayingClient::call`].
pub struct Call<'a> {
    /// The request (`tools/call`, `resources/read`, `prompts/get` are paid for; any other is
    /// sent as it is).
    pub request: ClientRequest,
    /// The caller's own `_meta` for it (rmcp sets the progress token of each message it
    /// sends: see `on_sent`).
    pub meta: RequestMetaObject,
    /// Who confirms a payment above the mandate's threshold for this call (MCP elicitation to
    /// the host's user, a terminal, a refusal).
    pub confirmer: &'a dyn Confirmer,
    /// Cancels the call (the original request and its paid retry alike).
    pub cancel: CancellationToken,
    /// Told the progress token of every message sent for this call (the first request and
    /// the paid retry), so a proxy can route the server's progress back to its caller.
    pub on_sent: Option<&'a (dyn Fn(&ProgressToken) + Send + Sync)>,
}

/// An rmcp client's peer that pays: a `-32402` error's Quote (Stipendex) and an `isError` result
/// with x402 `accepts` are handed to the wallet under its mandate, and the call is sent again
/// with the payment in `_meta`.
#[derive(Clone)]
pub struct PayingClient {
    peer: Peer<RoleClient>,
    wallet: Wallet,
    server: String,
    tabs: OpenTabs,
}

impl std::fmt::Debug for PayingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PayingClient")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

/// What a paid call is, for the wallet's origin binding: the Quote must name exactly this.
struct Target {
    sent: Resource,
    digest: crate::envelope::Digest,
    request: Request,
}

fn target(server: &str, request: &ClientRequest) -> Option<Target> {
    let (method, name, args): (&str, String, Option<JsonObject>) = match request {
        ClientRequest::CallToolRequest(r) => (
            "tools/call",
            r.params.name.to_string(),
            r.params.arguments.clone(),
        ),
        ClientRequest::ReadResourceRequest(r) => ("resources/read", r.params.uri.clone(), None),
        ClientRequest::GetPromptRequest(r) => (
            "prompts/get",
            r.params.name.clone(),
            r.params.arguments.clone(),
        ),
        _ => return None,
    };
    let req = super::request(Some(server), method, &name, args.as_ref());
    let digest = req.digest();
    req.resource().map(|sent| Target {
        sent,
        digest,
        request: req,
    })
}

impl PayingClient {
    /// A paying client of the server `peer` is connected to, known to the host as `server`:
    /// the origin of its Streamable HTTP URL (`https://host[:port]/mcp` → `https://host[:port]`),
    /// or for a stdio server the identity the host configured for it (an origin). Never the
    /// name the server declares about itself: Quotes must name this identity, and the mandate
    /// must pin it for the receiver.
    ///
    /// # Errors
    /// [`Error::Malformed`] if `server` is not an http(s) URL or origin.
    pub fn new(peer: Peer<RoleClient>, wallet: Wallet, server: &str) -> Result<Self, Error> {
        Ok(PayingClient {
            peer,
            wallet,
            server: crate::origin::of_url(server)?,
            tabs: OpenTabs::default(),
        })
    }

    /// The server's identity (an origin).
    #[must_use]
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The wallet.
    #[must_use]
    pub fn wallet(&self) -> &Wallet {
        &self.wallet
    }

    /// The peer.
    #[must_use]
    pub fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// `tools/call` `name` with `arguments`, paying under the mandate with the wallet's own
    /// confirmer.
    ///
    /// # Errors
    /// As [`PayingClient::call`].
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Option<JsonObject>,
    ) -> Result<(CallToolResult, Option<Payment>), CallError> {
        let mut params = rmcp::model::CallToolRequestParams::new(name.to_owned());
        params.arguments = arguments;
        let request = ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params));
        let answered = self
            .call(Call {
                request,
                meta: RequestMetaObject::default(),
                confirmer: self.wallet.confirmer(),
                cancel: CancellationToken::new(),
                on_sent: None,
            })
            .await?;
        match answered.result {
            ServerResult::CallToolResult(r) => Ok((r, answered.payment)),
            other => Err(CallError::Transport(format!(
                "the answer to tools/call is not a tool result: {other:?}"
            ))),
        }
    }

    /// Sends `call.request`; a payment it is asked for is made under the mandate (a Quote for
    /// exactly this call at this server, or an x402 challenge allowlisted for this server), and
    /// the request is sent again with it. A Receipt is checked against the result received.
    ///
    /// # Errors
    /// [`CallError::Server`] (the server's own error), [`CallError::NotPaid`] (the wallet
    /// refused — a denial, a limit, no confirmation — or the server refused the payment),
    /// [`CallError::Transport`].
    pub async fn call(&self, call: Call<'_>) -> Result<Answered, CallError> {
        let target = target(&self.server, &call.request);
        let mut meta = call.meta.clone();
        if target.is_some() {
            meta.0
                .0
                .insert(PAYMENTS.into(), Value::Object(super::payments_marker()));
        }
        // A call an open tab covers is paid by a voucher at once: no -32402 round trip.
        if let Some(t) = &target
            && let Some((hold, opened)) = self.tabs.covering(&t.sent, self.wallet.now())
        {
            match Box::pin(self.call_in_tab(&call, meta.clone(), t, &hold, opened)).await? {
                Ok(answered) => return Ok(answered),
                Err(()) => Box::pin(self.retire(&hold)).await,
            }
        }
        let first = self.send(&call, meta.clone()).await;
        let Some(target) = target else {
            return first.map(|result| Answered {
                result,
                payment: None,
            });
        };
        match first {
            Err(CallError::Server(e)) if e.code == ErrorCode(PAYMENT_REQUIRED) => {
                let quote = quote_of(&e).map_err(CallError::NotPaid)?;
                let q = quote.object();
                // The wallet pins the resource (origin, method, name); the arguments are in
                // the request digest, which only the call itself can check.
                if q.request.as_ref() != Some(&target.digest) {
                    return Err(CallError::NotPaid(Error::Denied(format!(
                        "quote {} of {} prices another call than the one sent ({} {} with these arguments): a quote relayed from another call is not paid",
                        q.id, q.receiver.id, target.sent.method, target.sent.path
                    ))));
                }
                let confirmer = confirmer_of(&call)?;
                // A tab beside the Quote, where the mandate allows tabs in its asset: opened,
                // and this call paid by its first voucher.
                let demand = Demand::Quote {
                    quote: &quote,
                    sent: &target.sent,
                    tab: e.data.as_ref().and_then(|d| d.get("tab")),
                };
                let settled = Box::pin(self.wallet.settle_demand(demand, &confirmer))
                    .await
                    .map_err(CallError::NotPaid)?;
                match settled {
                    Settlement::Proof(paid) => self.present(&call, meta, *paid).await,
                    Settlement::Tab(hold) => {
                        self.tabs.add(hold.clone());
                        match Box::pin(self.call_in_tab(&call, meta, &target, &hold, false)).await?
                        {
                            Ok(answered) => Ok(answered),
                            Err(()) => {
                                Box::pin(self.retire(&hold)).await;
                                Err(CallError::NotPaid(Error::Payment(
                                    rail_core::RailError::Declined(rail_core::RailReason::new(
                                        "tab_refused",
                                        "the server refused the tab it offered; call again",
                                    )),
                                )))
                            }
                        }
                    }
                    other => Err(CallError::NotPaid(other.unexpected())),
                }
            }
            Ok(ServerResult::CallToolResult(r)) if r.is_error == Some(true) => {
                let json =
                    serde_json::to_value(&r).map_err(|e| CallError::Transport(e.to_string()))?;
                match Required::from_mcp_result(&json) {
                    Some(required) => self.pay_x402(&call, meta, &required).await,
                    None => Ok(Answered {
                        result: ServerResult::CallToolResult(r),
                        payment: None,
                    }),
                }
            }
            other => other.map(|result| Answered {
                result,
                payment: None,
            }),
        }
    }

    /// Sends the call again with the Proof of `paid`, and tells the wallet what came back.
    async fn present(
        &self,
        call: &Call<'_>,
        mut meta: RequestMetaObject,
        paid: crate::wallet::Paid,
    ) -> Result<Answered, CallError> {
        let wallet = &self.wallet;
        meta.0.0.insert(
            PAYMENT.into(),
            serde_json::to_value(&paid.proof).map_err(|e| CallError::Transport(e.to_string()))?,
        );
        // Once paid, the Proof is kept until the call's answer comes back: a retryable failure
        // or a lost answer leaves it for the same call asked again (`Wallet::pay_sent`).
        let sent = self.send_paid(call, meta).await;
        let result = match sent {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                wallet
                    .proof_reply(&paid, Reply::Refused)
                    .await
                    .map_err(CallError::NotPaid)?;
                return Err(CallError::NotPaid(refusal(&e)));
            }
            Err(e) => {
                // No answer (a transport failure, retries run out): kept for the same call
                // again.
                wallet
                    .proof_reply(&paid, Reply::Lost)
                    .await
                    .map_err(CallError::NotPaid)?;
                return Err(e);
            }
        };
        let found = receipt_in(&result);
        let reply = match &found {
            None => Reply::Unreceipted,
            Some((jws, digest, len)) => Reply::Receipted {
                receipt: jws,
                digest,
                len: *len,
            },
        };
        let receipt = wallet
            .proof_reply(&paid, reply)
            .await
            .map_err(CallError::NotPaid)?
            .map(Box::new);
        Ok(Answered {
            result,
            payment: Some(Payment::Stipendex {
                paid: Box::new(paid),
                receipt,
            }),
        })
    }

    /// Sends the call with a voucher of `hold` (and its hold Proof if the tab is not yet
    /// `opened` at the server). `Ok(Err(()))`: the server answered -32402 (the tab is over or
    /// refused), or the wallet will sign no more in it; the caller retires it.
    async fn call_in_tab(
        &self,
        call: &Call<'_>,
        mut meta: RequestMetaObject,
        target: &Target,
        hold: &TabHold,
        opened: bool,
    ) -> Result<Result<Answered, ()>, CallError> {
        let v = match self.wallet.voucher(hold, &target.request).await {
            Ok(v) => v,
            Err(Error::Voucher { .. } | Error::Expired { .. } | Error::NotYetValid { .. }) => {
                return Ok(Err(()));
            }
            // The mandate was revoked: the tab is closed, and the call refused.
            Err(e @ Error::Revoked(_)) => {
                Box::pin(self.retire(hold)).await;
                return Err(CallError::NotPaid(e));
            }
            Err(e) => return Err(CallError::NotPaid(e)),
        };
        let bad = |e: serde_json::Error| CallError::Transport(e.to_string());
        meta.0.0.insert(
            VOUCHER.into(),
            serde_json::to_value(&v.voucher).map_err(bad)?,
        );
        if !opened {
            meta.0
                .0
                .insert(TAB.into(), serde_json::to_value(hold.proof()).map_err(bad)?);
        }
        let not_counted = |said: Option<Digest>| said.as_ref() == Some(v.voucher.digest());
        let result = match self.send_paid(call, meta).await {
            Ok(Ok(r)) => r,
            // This very voucher was counted before (its first answer was lost on the way) and
            // the server no longer keeps that answer: paying the call again would pay it
            // twice, so the refusal is the call's answer and the tab stays open.
            Ok(Err(e)) if refusal_code(&e) == Some(ANSWER_GONE) => {
                return Err(CallError::NotPaid(refusal(&e)));
            }
            Ok(Err(e)) => {
                tracing::info!(tab = %hold.tab().object().id, error = %refusal(&e), "the tab is over at this server");
                return Ok(Err(()));
            }
            // Not counted (refused by the price hook, or the call never reached the service):
            // the lane is given back; the error is the call's answer.
            Err(CallError::Server(e)) if not_counted(super::uncounted_in(e.data.as_ref())) => {
                let uncounted = VoucherReply::Uncounted;
                self.wallet.voucher_reply(hold, &v, uncounted).await;
                return Err(CallError::Server(e));
            }
            Err(e) => return Err(e),
        };
        self.tabs.opened(hold);
        let value = serde_json::to_value(&result).unwrap_or(Value::Null);
        if not_counted(super::uncounted_in(value.get("_meta"))) {
            // Waived by the price hook: served free, the lane given back.
            let uncounted = VoucherReply::Uncounted;
            self.wallet.voucher_reply(hold, &v, uncounted).await;
            return Ok(Ok(Answered {
                result,
                payment: None,
            }));
        }
        let digest = super::result_digest(&value);
        let said = value.get("_meta").and_then(|m| m.get(TAB_CALL));
        let expected =
            serde_json::json!({"voucher": v.voucher.digest().as_str(), "result": digest.as_str()});
        let reply = VoucherReply::Counted {
            result: &digest,
            named: said == Some(&expected),
        };
        self.wallet.voucher_reply(hold, &v, reply).await;
        let o = v.voucher.object();
        Ok(Ok(Answered {
            result,
            payment: Some(Payment::Tab {
                tab: o.tab.clone(),
                voucher: v.voucher.digest().clone(),
                result: digest,
                amount: o.money().map_err(CallError::NotPaid)?,
            }),
        }))
    }

    /// Stops using `hold` and closes it (errors logged: the server closes it at its end).
    async fn retire(&self, hold: &TabHold) {
        self.tabs.remove(hold);
        if let Err(e) = self.close(hold).await {
            tracing::warn!(tab = %hold.tab().object().id, error = %e, "could not close a tab");
        }
    }

    /// Closes every tab this client holds at its server: each captures exactly the last
    /// vouchers and signs the closing Receipt, which the wallet checks before giving the rest
    /// of the cap back to the mandate's limits.
    ///
    /// # Errors
    /// The first failure (the other tabs are closed still; a tab that could not be closed is
    /// kept, and the server closes it at its end).
    pub async fn close_tabs(&self) -> Result<Vec<Signed<TabReceipt>>, CallError> {
        self.tabs
            .close_all(|h| async move { self.close(&h).await })
            .await
    }

    /// Closes `hold` at the server (`stipendex/tab-close`).
    ///
    /// # Errors
    /// [`CallError::Server`] (the server's refusal), [`CallError::NotPaid`] (the wallet's
    /// checks of the Receipt), [`CallError::Transport`].
    pub async fn close(&self, hold: &TabHold) -> Result<Signed<TabReceipt>, CallError> {
        let close = self
            .wallet
            .close_request(hold)
            .map_err(CallError::NotPaid)?;
        let request = ClientRequest::CustomRequest(rmcp::model::CustomRequest::new(
            TAB_CLOSE,
            Some(serde_json::json!({"close": close})),
        ));
        let answer = self.peer.send_request(request).await.map_err(|e| match e {
            ServiceError::McpError(e) => CallError::Server(e),
            e => transport(&e),
        })?;
        let ServerResult::CustomResult(r) = answer else {
            return Err(CallError::Transport(format!(
                "the answer to {TAB_CLOSE} is not its result: {answer:?}"
            )));
        };
        let receipt: Signed<TabReceipt> =
            serde_json::from_value(r.0.get("receipt").cloned().unwrap_or(Value::Null))
                .map_err(|e| CallError::Transport(format!("the tab's receipt: {e}")))?;
        self.wallet
            .tab_closed(hold, receipt.jws())
            .await
            .map_err(CallError::NotPaid)
    }

    async fn pay_x402(
        &self,
        call: &Call<'_>,
        mut meta: RequestMetaObject,
        required: &Required,
    ) -> Result<Answered, CallError> {
        let source = Source::mcp(&self.server);
        let demand = Demand::Challenge {
            source: &source,
            required,
        };
        let confirmer = confirmer_of(call)?;
        let paid = match self
            .wallet
            .settle_demand(demand, &confirmer)
            .await
            .map_err(CallError::NotPaid)?
        {
            Settlement::X402(paid) => *paid,
            other => return Err(CallError::NotPaid(other.unexpected())),
        };
        meta.0.0.remove(PAYMENTS);
        meta.0
            .0
            .insert(ChallengePaid::MCP_META.into(), paid.envelope.clone());
        let result = self.send(call, meta).await?;
        let settlement = match &result {
            ServerResult::CallToolResult(r) => {
                if r.is_error == Some(true) {
                    let json = serde_json::to_value(r).unwrap_or(Value::Null);
                    if Required::from_mcp_result(&json).is_some() {
                        return Err(CallError::NotPaid(Error::Payment(
                            rail_core::RailError::Declined(rail_core::RailReason::new(
                                "refused",
                                "the server refused the x402 payment",
                            )),
                        )));
                    }
                }
                r.meta
                    .as_ref()
                    .and_then(|m| m.0.get(x402_transport::wire::PAYMENT_RESPONSE_META))
                    .cloned()
            }
            _ => None,
        };
        Ok(Answered {
            result,
            payment: Some(Payment::X402 {
                paid: Box::new(paid),
                settlement,
            }),
        })
    }

    /// A paid message (`meta` holds the payment): sent again, the same, while the server says
    /// the payment's outcome is not known yet (`retryable`), up to [`SAME_PROOF_TRIES`];
    /// `Ok(Err(e))` when the server refuses the payment (-32402 again).
    async fn send_paid(
        &self,
        call: &Call<'_>,
        meta: RequestMetaObject,
    ) -> Result<Result<ServerResult, ErrorData>, CallError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.send(call, meta.clone()).await {
                Err(CallError::Server(e)) if e.code == ErrorCode(PAYMENT_REQUIRED) => {
                    return Ok(Err(e));
                }
                Err(CallError::Server(e))
                    if retryable(&e).is_some() && tries < SAME_PROOF_TRIES =>
                {
                    let wait = retryable(&e).unwrap_or(MAX_RETRY_WAIT).min(MAX_RETRY_WAIT);
                    tokio::select! {
                        () = tokio::time::sleep(wait) => {}
                        () = call.cancel.cancelled() => {
                            return Err(CallError::Transport("cancelled".into()));
                        }
                    }
                }
                other => return other.map(Ok),
            }
        }
    }

    /// One message: `call.request` with `meta`, cancelled with the call.
    async fn send(
        &self,
        call: &Call<'_>,
        meta: RequestMetaObject,
    ) -> Result<ServerResult, CallError> {
        let handle = self
            .peer
            .send_request_with_option(
                call.request.clone(),
                PeerRequestOptions::no_options().with_meta(meta),
            )
            .await
            .map_err(|e| transport(&e))?;
        if let Some(f) = call.on_sent {
            f(&handle.progress_token);
        }
        let id = handle.id.clone();
        tokio::select! {
            r = handle.await_response() => r.map_err(|e| match e {
                ServiceError::McpError(e) => CallError::Server(e),
                e => transport(&e),
            }),
            () = call.cancel.cancelled() => {
                let _ = self
                    .peer
                    .notify_cancelled(CancelledNotificationParam::new(Some(id), Some("cancelled by the caller".into())))
                    .await;
                Err(CallError::Transport("cancelled".into()))
            }
        }
    }
}

/// The confirmer a payment of `call` asks, whatever it pays (a Quote, the tab beside it, an
/// x402 challenge). A call cancelled before its payment pays nothing: checked here, before the
/// wallet is asked, and after the human answered (a host that cancels while its dialog is
/// open).
#[allow(clippy::result_large_err)] // the call's own error type, as its async callers return
fn confirmer_of<'a>(call: &'a Call<'_>) -> Result<UnlessCancelled<'a>, CallError> {
    if call.cancel.is_cancelled() {
        return Err(CallError::Transport("cancelled".into()));
    }
    Ok(UnlessCancelled {
        inner: call.confirmer,
        cancel: &call.cancel,
    })
}

/// The call's confirmer, whose yes is a no once the call was cancelled (a host that cancels
/// while its confirmation dialog is open gets no payment made).
struct UnlessCancelled<'a> {
    inner: &'a dyn Confirmer,
    cancel: &'a CancellationToken,
}

#[async_trait::async_trait]
impl Confirmer for UnlessCancelled<'_> {
    async fn confirm(&self, ask: &crate::wallet::Ask) -> crate::wallet::Answer {
        let answer = tokio::select! {
            a = self.inner.confirm(ask) => a,
            () = self.cancel.cancelled() => crate::wallet::Answer::No {
                why: "the call was cancelled while its payment waited for confirmation".into(),
            },
        };
        if self.cancel.is_cancelled() {
            return crate::wallet::Answer::No {
                why: "the call was cancelled while its payment waited for confirmation".into(),
            };
        }
        answer
    }

    async fn escalate(&self, denial: &crate::wallet::Denial) {
        self.inner.escalate(denial).await;
    }
}

fn transport(e: &ServiceError) -> CallError {
    CallError::Transport(e.to_string())
}

/// The Quote of a -32402 error.
fn quote_of(e: &ErrorData) -> Result<Signed<Quote>, Error> {
    let v = e
        .data
        .as_ref()
        .and_then(|d| d.get("quote"))
        .ok_or_else(|| Error::Malformed("the -32402 error carries no data.quote".into()))?;
    serde_json::from_value(v.clone())
        .map_err(|err| Error::Malformed(format!("data.quote is not a signed Quote: {err}")))
}

/// A paid retry answered -32402 again: the refusal's code and message, as a decline.
/// The receiver's code for a repeat whose paid answer it no longer keeps.
const ANSWER_GONE: &str = "answer_gone";

/// The stable code of a refusal's `data.error`, if any.
fn refusal_code(e: &ErrorData) -> Option<&str> {
    e.data
        .as_ref()
        .and_then(|d| d.get("error"))
        .and_then(Value::as_str)
}

fn refusal(e: &ErrorData) -> Error {
    let data = e.data.as_ref();
    let code = data
        .and_then(|d| d.get("error"))
        .and_then(Value::as_str)
        .unwrap_or("refused");
    let message = data
        .and_then(|d| d.get("message"))
        .and_then(Value::as_str)
        .unwrap_or("the server refused the proof");
    Error::Payment(rail_core::RailError::Declined(rail_core::RailReason::new(
        code,
        format!("the server refused the proof: {message}"),
    )))
}

/// Whether the server says to send the same payment again, and after how long.
fn retryable(e: &ErrorData) -> Option<Duration> {
    let d = e.data.as_ref()?;
    if d.get("retryable").and_then(Value::as_bool) != Some(true) {
        return None;
    }
    Some(Duration::from_secs(
        d.get("retryAfterSeconds")
            .and_then(Value::as_u64)
            .unwrap_or(1),
    ))
}

/// The Receipt in a result's `_meta`, and the bytes it must bind.
fn receipt_in(result: &ServerResult) -> Option<(String, Digest, u64)> {
    let v = serde_json::to_value(result).ok()?;
    let jws = v
        .get("_meta")?
        .get(RECEIPT)?
        .get("jws")?
        .as_str()?
        .to_owned();
    let delivered = super::canonical_result(&v);
    Some((jws, Digest::of(&delivered), delivered.len() as u64))
}
