//! What a binding trades with the receiver's engine ([`Receiver::serve`]): what a request
//! carries to pay ([`Tender`], an x402 payment read as an [`X402Payment`]), the work it hands
//! over ([`Work`], which answers [`Ran`] and seals with [`Seal`]) and what the engine answers
//! ([`Served`]). Plain data and one trait: the engine's steps are `serve.rs` and `x402.rs`.

use std::future::Future;
#[cfg(feature = "challenges")]
use std::sync::Arc;

use rail_core::Money;
#[cfg(feature = "challenges")]
use rail_core::Timestamp;
#[cfg(feature = "challenges")]
use x402_transport::{Accept, Failure, Presented, Price, Refusal, Scheme, SettleWhen};

#[cfg(doc)]
use super::Receiver;
use super::{Answer, Gone, Outcome};
use crate::Error;
use crate::envelope::{Digest, Quote, Receipt, Signed, Tab};

/// What a priced request carries to pay, as its binding read it.
#[derive(Clone, Debug)]
pub enum Tender {
    /// Nothing: the request is quoted (or waived, or refused).
    None,
    /// A Proof (compact JWS) paying a Quote.
    Proof(String),
    /// A voucher (compact JWS) paying a call inside a tab, with the hold Proof that opens the
    /// tab when this is its first call.
    Voucher {
        /// The voucher.
        voucher: String,
        /// The tab's hold Proof, sent with the tab's first call.
        open: Option<String>,
    },
    /// A payment is present but cannot be read (why, shown to the payer beside a fresh Quote).
    Malformed(String),
    /// An x402 payment (its header or `_meta` key), on a request its binding also prices in
    /// x402 schemes, and what else the request presents (`beside`). The x402 route is priced
    /// at the list price: the engine serves the payment ([`Receiver::serve`]: decision 0038)
    /// only when the price hook keeps that price for this request; otherwise it is set aside
    /// (nothing is settled) and the request goes on as `beside` says, under the same one
    /// decision of the hook.
    #[cfg(feature = "challenges")]
    X402 {
        /// The x402 payment.
        payment: Box<X402Payment>,
        /// What else the request presents.
        beside: Box<Tender>,
    },
}

impl Tender {
    /// Whether anything is presented to pay (and so the guard runs).
    #[must_use]
    pub fn presented(&self) -> bool {
        !matches!(self, Tender::None)
    }

    /// The digest of the voucher presented, if one is: what a binding names when it says the
    /// voucher was not counted.
    #[must_use]
    pub fn voucher_digest(&self) -> Option<Digest> {
        match self {
            Tender::Voucher { voucher, .. } => Some(Digest::of(voucher.trim().as_bytes())),
            #[cfg(feature = "challenges")]
            Tender::X402 { beside, .. } => beside.voucher_digest(),
            _ => None,
        }
    }
}

/// What the work made of a paid request ([`Work::run_paid`]).
#[derive(Debug)]
pub enum Ran<T> {
    /// An answer. `ok`: a success, which is settled and receipted (a failure voids a hold and
    /// is kept as the answer: a service payment is not refunded). `result` is the digest the
    /// Receipt binds; `final_amount` what a checkout captures (its estimate when `None`).
    Answered {
        /// The binding's answer.
        out: T,
        /// A success.
        ok: bool,
        /// The digest of the result delivered.
        result: Digest,
        /// A checkout's final amount.
        final_amount: Option<Money>,
    },
    /// An answer that is not a result to bind (an MCP input request, a task): a Proof's hold
    /// is voided and nothing is kept; a tab's call stays paid.
    Unbound(T),
    /// Nothing reached the service (why): the payment stays usable, nothing is kept.
    Undelivered(String),
    /// The request was handed over and its answer never came back (the session that would
    /// carry it went away): it may have run, so nothing is kept and the claim lapses; the same
    /// Proof again is answered as after a stopped instance (`outcome_unknown` unless
    /// idempotent).
    Lost,
    /// The service answered, but its answer cannot be delivered whole (why): the payment is
    /// given back (or the Proof left usable), a voucher is not counted.
    Undeliverable(String),
}

/// How a binding seals a paid answer before it is sent and kept ([`Work::seal`]).
#[derive(Clone, Copy, Debug)]
pub enum Seal<'a> {
    /// Paid and settled: attach the Receipt.
    Receipt(&'a Signed<Receipt>),
    /// A failure under a Proof: no Receipt.
    Failed,
    /// A call inside a tab, counted: name the voucher and the result's digest.
    TabCall {
        /// The voucher's digest.
        voucher: &'a Digest,
        /// The result's digest.
        result: &'a Digest,
    },
    /// Run free inside a tab (the hook waived it): the voucher was not counted.
    Uncounted(&'a Digest),
    /// Paid in x402: attach its settlement (`None`: the work failed under settle-after, and
    /// nothing was charged; encode the failure as x402 answers one).
    X402(Option<&'a X402Seal>),
}

/// What an answer paid in x402 carries: x402's codec, as plain data for a binding to encode.
#[derive(Clone, Debug, PartialEq)]
pub struct X402Seal {
    /// The HTTP header naming the settlement (`PAYMENT-RESPONSE`, or v1's
    /// `X-PAYMENT-RESPONSE`).
    pub header: &'static str,
    /// Its JSON (sent as base64 of it).
    pub header_value: serde_json::Value,
    /// The settlement's JSON (`_meta["x402/payment-response"]` over MCP).
    pub response: serde_json::Value,
    /// The scheme's receipt, if it has one (an MCP result's `structuredContent.receipt`).
    pub receipt: Option<serde_json::Value>,
}

/// The work behind a priced request, as its binding runs it: the only part of a paid request
/// that is the binding's.
///
/// Contract: [`Work::run_free`] or [`Work::run_paid`] is called at most once, and
/// [`Work::seal`] only after `run_paid` answered ([`Ran::Answered`], or [`Ran::Unbound`] under
/// an x402 payment, sealed [`Seal::X402`]) or after `run_free` inside a tab; neither is called when the engine answers by itself (a Quote, a refusal, a kept
/// answer).
pub trait Work: Send {
    /// The binding's answer (an HTTP response, an MCP result).
    type Out: Send;

    /// Runs the request unpaid (not priced now, or waived by the price hook): its answer as
    /// is.
    fn run_free(&mut self) -> impl Future<Output = Self::Out> + Send;

    /// The payment was accepted and the request is about to run ([`Work::run_paid`] comes
    /// next): a binding that tells the payer so before the answer does (ContextVM's
    /// `payment_accepted`) learns it here. Default: nothing.
    fn accepted(&mut self, accepted: &super::Accepted) {
        let _ = accepted;
    }

    /// Runs the paid request: its answer read whole, to bind and keep.
    fn run_paid(&mut self) -> impl Future<Output = Ran<Self::Out>> + Send;

    /// Seals `out` as `seal` says and returns what to keep of it for a repeat of the payment
    /// (`None`: nothing can be kept, such as a body too large).
    fn seal(&mut self, out: &mut Self::Out, seal: Seal<'_>) -> Option<Answer>;

    /// The answer given (and kept) when a paid request that is not idempotent comes back
    /// after the instance that handed it to its work stopped, and the digest a tab's call binds
    /// for it.
    fn outcome_unknown() -> (Answer, Digest);
}

/// What [`Receiver::serve`] answered, for the binding to encode.
#[derive(Debug)]
#[non_exhaustive]
pub enum Served<T> {
    /// Ran unpaid (not priced now, or waived): the work's answer. `uncounted`: a voucher was
    /// presented and not counted (the hook waived the call; the answer is sealed so).
    Free {
        /// The work's answer.
        out: T,
        /// The voucher not counted.
        uncounted: Option<Digest>,
    },
    /// Paid and answered (sealed): `outcome` is [`Outcome::Paid`] when receipted,
    /// [`Outcome::TabCall`] for a call inside a tab, `None` for a failure.
    Ran {
        /// The sealed answer.
        out: T,
        /// What was paid.
        outcome: Option<Outcome>,
    },
    /// A payment is needed: the Quote (and a tab offered beside it), and why the payment
    /// presented was refused, if one was (its error code and message). `list_price`: the
    /// Quote asks the capability's list price (x402 may be offered beside it).
    Quote {
        /// The Quote.
        quote: Box<Signed<Quote>>,
        /// A tab offered beside it.
        tab: Option<Box<Signed<Tab>>>,
        /// Why the payment presented was refused.
        refusal: Option<(String, String)>,
        /// The Quote is at the list price.
        list_price: bool,
    },
    /// The price hook refused the request: nothing charged, nothing run (a voucher
    /// presented is not counted).
    Rejected {
        /// The hook's message.
        message: String,
        /// The voucher not counted.
        uncounted: Option<Digest>,
    },
    /// A payment was refused, and the request needs none now: send it without one.
    NotPriced,
    /// No Quote can be made now ([`Error::RateLimited`] with when to retry, or a rail down).
    CannotQuote(Error),
    /// The same payment again: its kept answer (`voucher`: inside a tab).
    Replayed {
        /// The kept answer.
        answer: Box<Answer>,
        /// The Quote's id, for a Proof.
        quote: Option<String>,
        /// The voucher's digest, for a call inside a tab.
        voucher: Option<Digest>,
        /// The call's price, for a call inside a tab.
        amount: Option<Money>,
    },
    /// A Proof presented again whose kept answer is gone: not run again, nothing charged.
    Gone(Box<Gone>),
    /// A non-idempotent request handed over once by an instance that stopped: not run again;
    /// this answer is kept (`voucher`, `result`: inside a tab).
    OutcomeUnknown {
        /// The answer ([`Work::outcome_unknown`]).
        answer: Box<Answer>,
        /// The Quote's id, for a Proof.
        quote: Option<String>,
        /// The voucher's digest and the answer's, for a call inside a tab.
        tab_call: Option<(Digest, Digest)>,
    },
    /// Nothing can be taken now (the guard, or the payment's outcome is not known yet):
    /// nothing was charged; send the same payment again.
    Retry {
        /// Why.
        error: Error,
        /// The guard refused (the work cannot be done now), not the payment.
        unavailable: bool,
        /// The voucher not counted.
        uncounted: Option<Digest>,
    },
    /// Nothing reached the service (the work's message): the payment stays usable.
    Undelivered {
        /// The work's message.
        why: String,
        /// The voucher not counted (taken back).
        uncounted: Option<Digest>,
    },
    /// The answer cannot be delivered whole (why): `given_back` when the payment was given
    /// back; otherwise the Proof stays usable (a voucher is not counted).
    Undeliverable {
        /// Why.
        why: String,
        /// The payment was given back.
        given_back: bool,
        /// The voucher not counted (taken back).
        uncounted: Option<Digest>,
    },
    /// The work answered but its payment could not be settled (a hold is voided).
    Unsettled(Error),
    /// The answer never came back ([`Ran::Lost`]): nothing kept, nothing more to send.
    Lost,
    /// An x402 payment was not served (refused by its scheme, or its outcome unknown): the
    /// binding answers in x402's codec. Nothing was charged, or the same payment again finds
    /// its settlement.
    #[cfg(feature = "challenges")]
    X402Failed(Box<X402Failure>),
    /// The Proof was refused; no fresh Quote is made ([`Receiver::serve_proof`]).
    Refused(Error),
}

#[cfg(feature = "challenges")]
/// An x402 payment on a request its binding also prices in x402, as the binding read it:
/// what the engine serves when the price hook keeps the list price for the request.
#[derive(Clone, Debug)]
pub struct X402Payment {
    /// The way it pays (the scheme it names, [`x402_transport::settle::choose`]).
    pub accept: Accept,
    /// The price of the resource in that scheme.
    pub price: Price,
    /// The payment presented, or why it cannot be read (answered as the scheme's refusal).
    pub presented: Result<Presented, Refusal>,
    /// When it settles for this request ([`SettleWhen::for_method`] applied).
    pub when: SettleWhen,
    /// The time its validity window is judged at.
    pub now: Timestamp,
}

#[cfg(feature = "challenges")]
impl X402Payment {
    /// The payment `presented` (as a binding read it; `None`: none) for a resource payable in
    /// `accepts` — `resource` as a scheme binds it (the request path, the tool's name), `url`
    /// its URL, `description` what it is — settling `when` for this request, judged at `now`:
    /// the way to pay is the one its envelope names ([`x402_transport::settle::choose`]).
    #[must_use]
    pub fn read(
        accepts: &[Accept],
        presented: Option<Result<Presented, Refusal>>,
        (resource, url, description): (&str, &str, &str),
        when: SettleWhen,
        now: Timestamp,
    ) -> Option<Self> {
        let presented = presented?;
        let accept = match &presented {
            Ok(p) => x402_transport::settle::choose(accepts, p),
            Err(_) => accepts.first(),
        }?
        .clone();
        let price = x402_transport::settle::price(&accept, resource, url, description);
        Some(X402Payment {
            accept,
            price,
            presented,
            when,
            now,
        })
    }
}

#[cfg(feature = "challenges")]
/// An x402 payment that was not served: the scheme's refusal (answer a fresh x402 challenge
/// naming it) or an unknown outcome (answer "send the same payment again").
#[derive(Clone, Debug)]
pub struct X402Failure {
    /// What the scheme (or the record) said.
    pub failure: Failure,
    /// The payment presented, when it could be read (a v1 payment is answered in v1).
    pub presented: Option<Presented>,
    /// The scheme it was for.
    pub scheme: Arc<dyn Scheme>,
}
