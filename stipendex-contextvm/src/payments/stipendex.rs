//! The `stipendex` payment method: CEP-8 carrying Stipendex objects, so every rail of the
//! registry (the ledger, hosted accounts, x402 on EVM, exact-algo, Stripe, Lightning) is
//! reachable from a ContextVM server. CEP-8 lets a PMI define its settlement surface
//! ("PMI boundaries": `pay_req` is PMI-defined); this one is:
//!
//! - `payment_required`: `pmi` `"stipendex"`, `pay_req` the server's signed **Quote** (compact
//!   JWS) for this very request — its resource is `nostr:<server key>` + the method and the
//!   tool/prompt name (resource URI), its request digest covers the arguments; `amount` is the
//!   price in minor units of the Quote's asset (the Quote is authoritative);
//! - the client's wallet pays it on a rail of the Quote under its mandate and sends the
//!   **Proof** back as the JSON-RPC notification `notifications/stipendex/proof`
//!   `{"proof": <Proof JWS>}`, tagged `["e", <request event id>]`, sealed like the request;
//! - the server serves the Proof through the receiver engine ([`Receiver::serve_proof`]: the
//!   Quote is its own and unexpired, for this request, the payment verified on its rail and
//!   used once, the request delivered at most once), forwards the request, then settles and
//!   puts the **Receipt** on the answer's `_meta["stipendex/receipt"]` — the MCP binding's key
//!   and result digest ([`stipendex::mcp::canonical_result`]); a failed call's hold is voided.
//!
//! The wallet side ([`StipendexHandler`]) pays only a Quote naming the server it talks to
//! (`nostr:<its key>`, pinned in the mandate's receiver entry) for the request it sent (the
//! request digest): a Quote relayed from another server or another call is not paid.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use nostr::{EventId, PublicKey};
use rail_core::Money;
use serde_json::{Map, Value, json};
use stipendex::envelope::{Digest, Quote, Receipt, Signed};
use stipendex::receiver::{
    Accepted, Answer, OUTCOME_UNKNOWN, Price, Ran, Receiver, Request, Seal, Served, Work,
};
use stipendex::wallet::{Demand, Paid, Reply, Settlement, Wallet};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::notify::PaymentRequired;
use super::server::{Deadline, Pending, Processor, request_of};
use crate::Error;
use crate::transport::client::{PaidRequest, PaymentHook};
use crate::transport::server::Held;

/// The payment method identifier.
pub const PMI_STIPENDEX: &str = "stipendex";
/// The client's notification carrying the Proof (`params: {"proof": <JWS>}`, tagged `e`).
pub const PROOF: &str = "notifications/stipendex/proof";
/// The largest Proof read (a Proof embeds its Quote and perhaps a Confirmation).
const MAX_PROOF: usize = 64 * 1024;
/// The most requests waiting for a Proof at once.
const MAX_WAITING: usize = 10_000;
/// The most admitted requests waiting for their answer (to settle and receipt it).
const MAX_PAYING: usize = 10_000;
/// How long an admitted request's payment waits for its answer before it may be let go (its
/// session went away, or the MCP server never answered). Let go, the Proof's claim lapses and
/// the same Proof presented again is recovered by the receiver.
const PAYING_KEEP: std::time::Duration = std::time::Duration::from_secs(3600);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn payment_err(e: impl std::fmt::Display) -> Error {
    Error::Payment(e.to_string())
}

/// The Stipendex request of `message` sent to the ContextVM server `server`: its origin is
/// `nostr:<server key>`.
fn request_to(server: &PublicKey, message: &Value) -> Option<Request> {
    let mut req = request_of(message)?;
    req.origin = stipendex::origin::nostr(&server.to_hex());
    Some(req)
}

struct Waiting {
    client: PublicKey,
    request: Request,
    proof: Option<oneshot::Sender<String>>,
    received: Option<oneshot::Receiver<String>>,
}

/// The server's side of the `stipendex` method (see the module's documentation).
pub struct StipendexProcessor {
    receiver: Receiver,
    server: PublicKey,
    waiting: Mutex<HashMap<EventId, Waiting>>,
    /// Admitted requests by their event, since when: at most [`MAX_PAYING`].
    paying: Mutex<HashMap<EventId, (Instant, InFlight)>>,
}

/// An admitted request on its way to its answer: where the answer goes, and the engine's run
/// of the paid request ([`Receiver::serve_proof`]) that settles and seals it.
struct InFlight {
    answer: oneshot::Sender<Value>,
    served: tokio::task::JoinHandle<Served<Value>>,
}

impl std::fmt::Debug for StipendexProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StipendexProcessor")
            .field("receiver", &self.receiver)
            .field("server", &self.server.to_hex())
            .finish_non_exhaustive()
    }
}

impl StipendexProcessor {
    /// Quotes and admits for `receiver`, the ContextVM server whose Nostr key is `server`
    /// (the Quotes' origin).
    #[must_use]
    pub fn new(receiver: Receiver, server: PublicKey) -> Self {
        StipendexProcessor {
            receiver,
            server,
            waiting: Mutex::new(HashMap::new()),
            paying: Mutex::new(HashMap::new()),
        }
    }
}

impl StipendexProcessor {
    /// Keeps `paying` until request `e` is answered. Past [`MAX_PAYING`], those waiting longer
    /// than [`PAYING_KEEP`] are let go, then the oldest.
    fn keep_paying(&self, e: EventId, paying: InFlight) {
        let mut all = lock(&self.paying);
        if all.len() >= MAX_PAYING {
            let now = Instant::now();
            all.retain(|_, (since, _)| now.saturating_duration_since(*since) < PAYING_KEEP);
            if all.len() >= MAX_PAYING
                && let Some(oldest) = all
                    .iter()
                    .min_by_key(|(_, (since, _))| *since)
                    .map(|(k, _)| *k)
            {
                tracing::warn!(request = %oldest, "contextvm stipendex: too many admitted requests unanswered; the oldest is let go");
                all.remove(&oldest);
            }
        }
        all.insert(e, (Instant::now(), paying));
    }
}

#[async_trait]
impl Processor for StipendexProcessor {
    fn pmi(&self) -> &str {
        PMI_STIPENDEX
    }

    fn unit(&self) -> &str {
        "minor-units"
    }

    /// Counted by the receiver itself: [`Receiver::quote`] counts a Quote with costly offers
    /// against the client's limit (the request names the client's key).
    fn offers_cost(&self) -> bool {
        false
    }

    fn amount(&self, price: &Money) -> Result<u64, Error> {
        u64::try_from(price.minor_units()).map_err(|e| Error::Refused(e.to_string()))
    }

    async fn require(
        &self,
        price: &Money,
        description: Option<&str>,
        _ttl: std::time::Duration,
        held: &Held,
    ) -> Result<Pending, Error> {
        let mut request = request_to(&self.server, &held.message)
            .ok_or_else(|| Error::Refused("not a priced MCP request".into()))?;
        request.client = Some(held.client.to_hex());
        if lock(&self.waiting).len() >= MAX_WAITING {
            return Err(Error::Payment("too many payments waiting".into()));
        }
        let quote = self
            .receiver
            .quote(
                &request,
                &Price::Fixed(price.clone()),
                description.map(str::to_owned),
            )
            .await
            .map_err(payment_err)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let (tx, rx) = oneshot::channel();
        {
            let mut waiting = lock(&self.waiting);
            if waiting.len() >= MAX_WAITING {
                return Err(Error::Payment("too many payments waiting".into()));
            }
            waiting.insert(
                held.event_id,
                Waiting {
                    client: held.client,
                    request,
                    proof: Some(tx),
                    received: Some(rx),
                },
            );
        }
        Ok(Pending {
            required: PaymentRequired {
                amount: self.amount(price)?,
                pay_req: quote.jws().to_owned(),
                pmi: PMI_STIPENDEX.to_owned(),
                description: description.map(str::to_owned),
                ttl: Some(quote.object().exp.saturating_sub(now).max(1)),
                meta: None,
            },
            state: json!({"request": held.event_id.to_hex()}),
        })
    }

    async fn verify(
        &self,
        pending: &Pending,
        deadline: &Deadline,
    ) -> Result<Option<Map<String, Value>>, Error> {
        let e = pending
            .state
            .get("request")
            .and_then(Value::as_str)
            .and_then(|h| EventId::from_hex(h).ok())
            .ok_or_else(|| Error::Payment("a payment request of no request".into()))?;
        let mut received = lock(&self.waiting)
            .get_mut(&e)
            .and_then(|w| w.received.take())
            .ok_or_else(|| Error::Payment("no payment is awaited for this request".into()))?;
        // Until the deadline; a withdrawn payment request takes a Proof already delivered.
        let proof = tokio::select! {
            p = &mut received => p.ok(),
            () = deadline.reached() => received.try_recv().ok(),
        };
        let waiting = lock(&self.waiting).remove(&e);
        let (Some(proof), Some(waiting)) = (proof, waiting) else {
            return Err(Error::Payment("no Proof in time".into()));
        };
        // The engine runs the paid request: it admits the Proof, delivers at most once, and
        // waits (under the Proof's claim) for the answer that `answered` hands it, then
        // settles and seals it. This waits until the payment is accepted or refused.
        let (accepted_tx, accepted_rx) = oneshot::channel();
        let (answer_tx, answer_rx) = oneshot::channel();
        let receiver = self.receiver.clone();
        let request = waiting.request;
        let served = tokio::spawn(async move {
            let work = CvmWork {
                accepted: Some(accepted_tx),
                answer: Some(answer_rx),
            };
            receiver.serve_proof(&request, &proof, work).await
        });
        match accepted_rx.await {
            Ok(quote) => {
                self.keep_paying(
                    e,
                    InFlight {
                        answer: answer_tx,
                        served,
                    },
                );
                let mut meta = Map::new();
                meta.insert("stipendex/quote".into(), Value::String(quote));
                Ok(Some(meta))
            }
            // Not accepted: the engine's answer says why.
            Err(_) => Err(match served.await {
                Ok(served) => refusal(served),
                Err(e) => payment_err(format!("the payment could not be checked: {e}")),
            }),
        }
    }

    fn delivered(&self, client: &PublicKey, request: EventId, message: &Value) -> bool {
        if message.get("method").and_then(Value::as_str) != Some(PROOF) {
            return false;
        }
        let Some(proof) = message
            .pointer("/params/proof")
            .and_then(Value::as_str)
            .filter(|p| p.len() <= MAX_PROOF)
        else {
            return true;
        };
        let mut waiting = lock(&self.waiting);
        if let Some(w) = waiting.get_mut(&request).filter(|w| w.client == *client)
            && let Some(tx) = w.proof.take()
        {
            let _ = tx.send(proof.to_owned());
        }
        true
    }

    async fn answered(&self, request: EventId, message: &mut Value) {
        let Some((_, inflight)) = lock(&self.paying).remove(&request) else {
            return;
        };
        let id = message.get("id").cloned();
        if inflight.answer.send(std::mem::take(message)).is_err() {
            return;
        }
        *message = match inflight.served.await {
            Ok(Served::Ran { out, .. }) => out,
            Ok(Served::Unsettled(e)) => json!({"jsonrpc": "2.0", "id": id, "error": {
                "code": -32603,
                "message": format!("the call ran but its payment could not be settled: {e}"),
            }}),
            other => {
                tracing::error!(served = ?other.map(|_| ()), "contextvm stipendex: an answered call came back without its answer");
                json!({"jsonrpc": "2.0", "id": id, "error": {
                    "code": -32603,
                    "message": "the call's answer was lost on its way",
                }})
            }
        };
    }
}

/// A paid call's work: the request goes on to the MCP server once the payment is accepted
/// (`verify` returns and the server forwards it); its answer comes back through `answered`.
struct CvmWork {
    /// Told the Quote's id when the payment is accepted.
    accepted: Option<oneshot::Sender<String>>,
    /// The call's answer (the whole JSON-RPC message).
    answer: Option<oneshot::Receiver<Value>>,
}

impl Work for CvmWork {
    type Out = Value;

    /// Never called: every call served here is paid.
    async fn run_free(&mut self) -> Value {
        Value::Null
    }

    fn accepted(&mut self, accepted: &Accepted) {
        if let Some(tx) = self.accepted.take() {
            let _ = tx.send(accepted.quote.object().id.clone());
        }
    }

    async fn run_paid(&mut self) -> Ran<Value> {
        let Some(answer) = self.answer.take() else {
            return Ran::Lost;
        };
        // Dropped unanswered (its session went away, or let go past `MAX_PAYING`): it was
        // handed to the server and may have run.
        let Ok(message) = answer.await else {
            return Ran::Lost;
        };
        let failed = message.get("error").is_some()
            || message
                .pointer("/result/isError")
                .and_then(Value::as_bool)
                .unwrap_or(false);
        let result = message.get("result").cloned().unwrap_or(Value::Null);
        Ran::Answered {
            result: stipendex::mcp::result_digest(&result),
            out: message,
            ok: !failed,
            final_amount: None,
        }
    }

    fn seal(&mut self, message: &mut Value, seal: Seal<'_>) -> Option<Answer> {
        match seal {
            Seal::Receipt(receipt) => {
                if let Some(r) = message.get_mut("result") {
                    stipendex::mcp::set_meta(r, stipendex::mcp::RECEIPT, json!(receipt));
                }
                Some(Answer::json(200, message, Some(receipt.jws().to_owned())))
            }
            // Nothing to receipt (a checkout's hold was given back); the failure is kept.
            Seal::Failed => Some(Answer::json(500, message, None)),
            // No tab and no x402 payment is served over ContextVM (CEP-8 pays by Proof).
            Seal::TabCall { .. } | Seal::Uncounted(_) | Seal::X402(_) => None,
        }
    }

    fn outcome_unknown() -> (Answer, stipendex::envelope::Digest) {
        let answer = Answer::json(
            409,
            &json!({"error": "outcome_unknown", "message": OUTCOME_UNKNOWN}),
            None,
        );
        let digest = stipendex::envelope::Digest::of(&answer.body);
        (answer, digest)
    }
}

/// Why a Proof presented over ContextVM was not accepted, from the engine's answer: the
/// payment notification cannot carry a kept answer, so a call paid and answered before is
/// said to be so (not run or charged again).
fn refusal(served: Served<Value>) -> Error {
    match served {
        Served::Refused(e) => payment_err(e),
        Served::Replayed { quote, .. } => payment_err(format!(
            "the Proof of quote {} paid this call once and it was answered; it is not run or charged again",
            quote.unwrap_or_default()
        )),
        Served::Gone(g) => payment_err(format!(
            "the Proof of quote {} paid this call once and it was answered; it is not run or charged again",
            g.quote
        )),
        Served::OutcomeUnknown { quote, .. } => payment_err(format!(
            "outcome_unknown: quote {}: {OUTCOME_UNKNOWN}; nothing more is charged",
            quote.unwrap_or_default()
        )),
        Served::Retry { error, .. } => payment_err(error),
        _ => payment_err("the payment was not accepted"),
    }
}

/// The client's side of the `stipendex` method: a Stipendex [`Wallet`] pays the server's Quote
/// under its mandate and the Proof goes back; the Receipt on the answer is checked against the
/// result and kept in the audit chain.
pub struct StipendexHandler {
    wallet: Wallet,
    paid: Mutex<HashMap<EventId, Paid>>,
}

impl std::fmt::Debug for StipendexHandler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StipendexHandler").finish_non_exhaustive()
    }
}

impl StipendexHandler {
    /// Pays with `wallet`.
    #[must_use]
    pub fn new(wallet: Wallet) -> Self {
        StipendexHandler {
            wallet,
            paid: Mutex::new(HashMap::new()),
        }
    }
}

#[async_trait]
impl PaymentHook for StipendexHandler {
    fn pmis(&self) -> Vec<String> {
        vec![PMI_STIPENDEX.to_owned()]
    }

    async fn pay(
        &self,
        request: &PaidRequest,
        required: &PaymentRequired,
    ) -> Result<Option<Value>, String> {
        if required.pmi != PMI_STIPENDEX {
            return Err(format!("{} is not {PMI_STIPENDEX}", required.pmi));
        }
        let quote = Signed::<Quote>::parse(&required.pay_req).map_err(|e| e.to_string())?;
        let sent = request_to(&request.server, &request.message)
            .ok_or_else(|| "the request is not a priced MCP call".to_owned())?;
        // The resource (the server's key, the method, the name) is the wallet's to pin; the
        // arguments are in the request digest, which only the call can check.
        if quote.object().request != Some(sent.digest()) {
            return Err(format!(
                "quote {} prices another call than the one sent: a quote relayed from another call is not paid",
                quote.object().id
            ));
        }
        let resource = sent
            .resource()
            .ok_or_else(|| "the request has no origin".to_owned())?;
        let demand = Demand::Quote {
            quote: &quote,
            sent: &resource,
            tab: None,
        };
        let paid = match self
            .wallet
            .settle_demand(demand, self.wallet.confirmer())
            .await
            .map_err(|e| e.to_string())?
        {
            Settlement::Proof(paid) => *paid,
            other => return Err(other.unexpected().to_string()),
        };
        let note = json!({"jsonrpc": "2.0", "method": PROOF,
                          "params": {"proof": paid.proof.jws()}});
        lock(&self.paid).insert(request.event_id, paid);
        Ok(Some(note))
    }

    fn unanswered(&self, request: &PaidRequest) {
        // The answer is lost: the payment stays kept with its Proof (until its Quote's grace
        // ends), and the same call asked again presents it instead of paying a fresh Quote.
        if let Some(paid) = lock(&self.paid).remove(&request.event_id) {
            self.wallet.unanswered_now(&paid);
        }
    }

    async fn answered(&self, request: &PaidRequest, answer: &Value) -> Result<(), String> {
        let Some(paid) = lock(&self.paid).remove(&request.event_id) else {
            return Ok(());
        };
        let Some(result) = answer.get("result") else {
            // An error: nothing was delivered, so nothing to receipt; the request is answered.
            let reply = Reply::Unreceipted;
            return self
                .wallet
                .proof_reply(&paid, reply)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string());
        };
        let receipt: Signed<Receipt> = result
            .pointer(&format!(
                "/_meta/{}",
                stipendex::mcp::RECEIPT.replace('/', "~1")
            ))
            .cloned()
            .map(serde_json::from_value)
            .transpose()
            .map_err(|e| format!("the answer's Receipt: {e}"))?
            .ok_or_else(|| "the paid answer carries no Receipt".to_owned())?;
        let delivered = stipendex::mcp::canonical_result(result);
        let reply = Reply::Receipted {
            receipt: receipt.jws(),
            digest: &Digest::of(&delivered),
            len: delivered.len() as u64,
        };
        self.wallet
            .proof_reply(&paid, reply)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
