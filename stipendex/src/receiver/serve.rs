//! The receiver engine: one entry, [`Receiver::serve`], runs every step of a priced request in
//! one order, whatever its transport. A binding (HTTP, MCP, ContextVM, the gateway) only
//! parses what the request carries to pay ([`Tender`]), hands over its work ([`Work`]) and
//! encodes what the engine answers ([`Served`]); it holds no step of its own.
//!
//! The order, each step once:
//! 1. the guard ([`Receiver::guard`]) when a payment of any kind is presented;
//! 2. by what is presented: nothing → the price hook (once) and its waiver, refusal or Quote
//!    (with the tab offered beside it); a Proof → claim, verify on its rail, the kept answer of
//!    a repeat ([`Receiver::present`]); a voucher → the tab's opening, then the call inside the
//!    tab (the hook once, [`Receiver::tab_call`]); a payment that cannot be read → a fresh
//!    Quote saying why;
//! 3. delivery at most once per Proof or voucher ([`Receiver::deliver`]);
//! 4. the work, while the claim is kept alive;
//! 5. settle (a Receipt), capture, or void; give back what cannot be delivered;
//! 6. keep the answer for a repeat (bounded), and release the claim.
//!
//! See `docs/architecture.md` ("The receiver engine") and decision 0037.

use std::future::Future;

use rail_core::Money;

use super::{
    Admitted, Answer, Delivery, Gate, Gone, Outcome, Presented, PricedCapability, Receiver,
    Request, TabCall, idempotent,
};
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
        payment: Box<super::x402::X402Payment>,
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
/// [`Work::seal`] only after `run_paid` answered ([`Ran::Answered`]) or after `run_free` inside
/// a tab; neither is called when the engine answers by itself (a Quote, a refusal, a kept
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
    X402Failed(Box<super::x402::X402Failure>),
    /// The Proof was refused; no fresh Quote is made ([`Receiver::serve_proof`]).
    Refused(Error),
}

impl Receiver {
    /// Serves `req`, decided to fall under `cap` ([`Receiver::decide`], asked once by the
    /// binding), paid by `payment`: every step of the module's order, once. The binding
    /// encodes what comes back; `work` runs at most once.
    pub async fn serve<W: Work>(
        &self,
        cap: &PricedCapability,
        req: &Request,
        payment: Tender,
        mut work: W,
    ) -> Served<W::Out> {
        if payment.presented()
            && let Err(error) = self.guard().await
        {
            return Served::Retry {
                error,
                unavailable: true,
                uncounted: payment.voucher_digest(),
            };
        }
        let (payment, decided) = match payment {
            #[cfg(feature = "challenges")]
            Tender::X402 { payment, beside } => {
                let decision = self.resolve(cap, req).await;
                if cap.list_price_kept(&decision) {
                    return self.serve_x402(req, *payment, work).await;
                }
                (*beside, Some(decision))
            }
            p => (p, None),
        };
        match payment {
            Tender::None => match self.gate_decided(cap, req, decided).await {
                Ok(Gate::Free | Gate::Waived) => Served::Free {
                    out: work.run_free().await,
                    uncounted: None,
                },
                Ok(Gate::Rejected(message)) => Served::Rejected {
                    message,
                    uncounted: None,
                },
                Ok(Gate::Quote(q)) => self.quoted(cap, req, q, None).await,
                Err(e) => Served::CannotQuote(e),
            },
            Tender::Malformed(why) => self.challenge(cap, req, "malformed".into(), why).await,
            Tender::Proof(jws) => self.proof(Some(cap), req, &jws, work).await,
            // Nested x402 payments are not a thing a binding reads.
            #[cfg(feature = "challenges")]
            Tender::X402 { .. } => Served::NotPriced,
            Tender::Voucher { voucher, open } => {
                self.serve_voucher(cap, req, &voucher, open.as_deref(), work)
                    .await
            }
        }
    }

    /// A Quote for `req` (with the tab offered beside it), after `refusal`.
    async fn quoted<T>(
        &self,
        cap: &PricedCapability,
        req: &Request,
        quote: Box<Signed<Quote>>,
        refusal: Option<(String, String)>,
    ) -> Served<T> {
        let tab = match self.offer_tab_beside_on(Some(cap), req, &quote).await {
            Ok(t) => t.map(Box::new),
            Err(e) => {
                tracing::warn!(error = %e, "stipendex: cannot offer a tab now; quoting without it");
                None
            }
        };
        Served::Quote {
            list_price: cap.quoted_at_list_price(quote.object()),
            quote,
            tab,
            refusal,
        }
    }

    /// A payment was refused (`code`, `message`): a fresh Quote saying why — or the hook's
    /// refusal, or "not priced now".
    async fn challenge<T>(
        &self,
        cap: &PricedCapability,
        req: &Request,
        code: String,
        message: String,
    ) -> Served<T> {
        match self.gate_on(cap, req).await {
            Ok(Gate::Quote(q)) => self.quoted(cap, req, q, Some((code, message))).await,
            Ok(Gate::Rejected(message)) => Served::Rejected {
                message,
                uncounted: None,
            },
            Ok(Gate::Free | Gate::Waived) => Served::NotPriced,
            Err(e) => Served::CannotQuote(e),
        }
    }

    async fn refused<T>(&self, cap: &PricedCapability, req: &Request, e: &Error) -> Served<T> {
        self.challenge(cap, req, e.code().to_owned(), e.to_string())
            .await
    }

    /// [`Receiver::serve`] for a request paid by the Proof `jws` whose payment request was not
    /// a Quote answered by this engine (ContextVM's CEP-8 flow: the Quote went out as a
    /// `payment_required` notification and the Proof came back as another): the guard has run,
    /// and a refused Proof is [`Served::Refused`], without a fresh Quote (nor the price hook
    /// asked again).
    pub async fn serve_proof<W: Work>(&self, req: &Request, jws: &str, work: W) -> Served<W::Out> {
        self.proof(None, req, jws, work).await
    }

    /// A request paid by a Proof; a refused one gets a fresh Quote when `cap` is given.
    async fn proof<W: Work>(
        &self,
        cap: Option<&PricedCapability>,
        req: &Request,
        jws: &str,
        mut work: W,
    ) -> Served<W::Out> {
        let paying = match self.present(req, jws).await {
            Ok(Presented::Admitted(Admitted::Run(p))) => p,
            // The same Proof again for the same request: its answer was lost on the way.
            Ok(Presented::Admitted(Admitted::Answered { answer, quote })) => {
                return Served::Replayed {
                    answer,
                    quote: Some(quote),
                    voucher: None,
                    amount: None,
                };
            }
            // ... and its kept answer is gone: answered once, not run again, not charged again.
            Ok(Presented::Gone(g)) => return Served::Gone(g),
            Err(Error::Payment(e)) if e.is_retryable() => {
                return Served::Retry {
                    error: Error::Payment(e),
                    unavailable: false,
                    uncounted: None,
                };
            }
            Err(e) => {
                return match cap {
                    Some(cap) => self.refused(cap, req, &e).await,
                    None => Served::Refused(e),
                };
            }
        };
        // At most once per Proof: a request handed over by an instance that then stopped runs
        // again only if it is idempotent.
        match self.deliver(&paying).await {
            Ok(Delivery::First) => {}
            Ok(Delivery::Again) if idempotent(&req.method) => {}
            Ok(Delivery::Again) => {
                let (answer, _) = W::outcome_unknown();
                let quote = Some(paying.accepted.quote.object().id.clone());
                if let Err(e) = self.answered(*paying, Some(&answer)).await {
                    tracing::error!(error = %e, "stipendex: cannot keep the outcome-unknown answer");
                }
                return Served::OutcomeUnknown {
                    answer: Box::new(answer),
                    quote,
                    tab_call: None,
                };
            }
            // The claim lapses by itself: the same Proof again recovers.
            Err(error) => {
                return Served::Retry {
                    error,
                    unavailable: false,
                    uncounted: None,
                };
            }
        }
        let accepted = &paying.accepted;
        work.accepted(accepted);
        let done = paying
            .keep_alive(async {
                let (mut out, ok, result, final_amount) = match work.run_paid().await {
                    Ran::Answered {
                        out,
                        ok,
                        result,
                        final_amount,
                    } => (out, ok, result, final_amount),
                    // Input required, a task: not a result this engine can receipt (a paid
                    // request completes in one round); the hold is voided, nothing is kept.
                    Ran::Unbound(out) => {
                        tracing::warn!(
                            "stipendex: a paid request did not complete in one round; its hold is voided"
                        );
                        self.void(accepted).await;
                        return Done::Kept(
                            Served::Ran {
                                out,
                                outcome: None,
                            },
                            None,
                        );
                    }
                    Ran::Undelivered(why) => return Done::Undelivered(why),
                    Ran::Lost => return Done::Lost,
                    Ran::Undeliverable(why) => {
                        tracing::error!(error = %why, "stipendex: a paid answer cannot be delivered");
                        let given_back = match self.give_back(accepted).await {
                            Ok(given) => given,
                            Err(err) => {
                                tracing::error!(error = %err, "stipendex: cannot give back the payment of an answer that cannot be delivered");
                                false
                            }
                        };
                        return Done::Undeliverable(why, given_back);
                    }
                };
                if !ok {
                    // The profile's rule: a service payment is not refunded; the same Proof
                    // again gets this same answer, not a second run.
                    self.void(accepted).await;
                    let kept = work.seal(&mut out, Seal::Failed);
                    return Done::Kept(
                        Served::Ran {
                            out,
                            outcome: None,
                        },
                        kept,
                    );
                }
                match self.settle_digest(accepted, final_amount, result).await {
                    Ok(receipt) => {
                        let kept = work.seal(&mut out, Seal::Receipt(&receipt));
                        Done::Kept(
                            Served::Ran {
                                out,
                                outcome: Some(Outcome::Paid {
                                    rail: accepted.rail.clone(),
                                    amount: accepted.verified.amount.clone(),
                                }),
                            },
                            kept,
                        )
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "stipendex: cannot settle after the work");
                        self.void(accepted).await;
                        Done::Kept(Served::Unsettled(e), None)
                    }
                }
            })
            .await;
        match done {
            Done::Kept(served, kept) => {
                if let Err(e) = self.answered(*paying, kept.as_ref()).await {
                    tracing::error!(error = %e, "stipendex: the answer was given but could not be kept for a repeat");
                }
                served
            }
            Done::Undelivered(why) => {
                // Nothing reached the service: nothing is kept, the Proof stays usable.
                self.undelivered(*paying).await;
                Served::Undelivered {
                    why,
                    uncounted: None,
                }
            }
            Done::Lost => {
                tracing::warn!(quote = %paying.accepted.quote.object().id, "a paid request's answer never came back: its claim lapses");
                drop(paying);
                Served::Lost
            }
            Done::Undeliverable(why, given_back) => {
                if given_back {
                    if let Err(e) = self.answered(*paying, None).await {
                        tracing::error!(error = %e, "stipendex: cannot mark a given-back payment's proof used");
                    }
                } else {
                    self.undelivered(*paying).await;
                }
                Served::Undeliverable {
                    why,
                    given_back,
                    uncounted: None,
                }
            }
        }
    }

    /// Voids a hold after a failure (logged when it cannot be).
    async fn void(&self, accepted: &super::Accepted) {
        if let Err(e) = self.release(accepted).await {
            tracing::error!(error = %e, "stipendex: cannot void a hold after a failed request");
        }
    }

    /// A call paid by a voucher inside a tab, opened first by `open` (its hold Proof) if given.
    async fn serve_voucher<W: Work>(
        &self,
        cap: &PricedCapability,
        req: &Request,
        voucher: &str,
        open: Option<&str>,
        mut work: W,
    ) -> Served<W::Out> {
        let retry = |error: Error| Served::Retry {
            error,
            unavailable: false,
            uncounted: None,
        };
        let retryable = |e: &Error| {
            matches!(e, Error::Storage(_)) || matches!(e, Error::Payment(r) if r.is_retryable())
        };
        if let Some(proof) = open
            && let Err(e) = self.open_tab(proof).await
        {
            return if retryable(&e) {
                retry(e)
            } else {
                self.refused(cap, req, &e).await
            };
        }
        let serving = match self.tab_call_on(Some(cap), req, voucher).await {
            Ok(TabCall::Run(s)) => s,
            Ok(TabCall::Answered { voucher, answer }) => {
                return Served::Replayed {
                    answer,
                    quote: None,
                    voucher: Some(voucher),
                    amount: Money::new(cap.price.asset().clone(), rail_core::Amount::ZERO).ok(),
                };
            }
            // The price hook waived the call: run free, the voucher not counted.
            Ok(TabCall::Waived { voucher }) => {
                let mut out = work.run_free().await;
                let _ = work.seal(&mut out, Seal::Uncounted(&voucher));
                return Served::Free {
                    out,
                    uncounted: Some(voucher),
                };
            }
            // The price hook refused the call: nothing taken, the voucher not counted.
            Err(Error::Rejected(message)) => {
                return Served::Rejected {
                    message,
                    uncounted: Some(Digest::of(voucher.trim().as_bytes())),
                };
            }
            Err(e) if retryable(&e) => return retry(e),
            Err(e) => return self.refused(cap, req, &e).await,
        };
        let voucher_digest = serving.voucher.digest().clone();
        let price = serving.price.clone();
        if serving.delivery == Delivery::Again && !idempotent(&req.method) {
            let (answer, result) = W::outcome_unknown();
            self.tab_answered(*serving, answer.clone(), &result).await;
            return Served::OutcomeUnknown {
                answer: Box::new(answer),
                quote: None,
                tab_call: Some((voucher_digest, result)),
            };
        }
        // The call was paid by its voucher: whatever it answers keeps the increment — unless
        // it never reached the service or cannot be delivered, and then the voucher is taken
        // back.
        let (mut out, result) = match work.run_paid().await {
            Ran::Answered { out, result, .. } => (out, Some(result)),
            Ran::Unbound(out) => (out, None),
            Ran::Undelivered(why) => {
                let uncounted = self.take_back(*serving, voucher_digest).await;
                return Served::Undelivered { why, uncounted };
            }
            // Handed over, its answer lost: the call stays paid (it may have run); nothing is
            // kept, so the same voucher again is `answer_gone`.
            Ran::Lost => {
                self.tab_answered(*serving, Answer::nothing(), &Digest::of(b""))
                    .await;
                return Served::Lost;
            }
            Ran::Undeliverable(why) => {
                tracing::error!(error = %why, "stipendex: a paid call's answer cannot be delivered");
                let uncounted = self.take_back(*serving, voucher_digest).await;
                return Served::Undeliverable {
                    why,
                    given_back: false,
                    uncounted,
                };
            }
        };
        let (answer, result) = match result {
            Some(result) => {
                let kept = work.seal(
                    &mut out,
                    Seal::TabCall {
                        voucher: &voucher_digest,
                        result: &result,
                    },
                );
                (kept, result)
            }
            // Input required, a task: not a result to bind; the call stays paid, its answer
            // kept as JSON `null`.
            None => (
                Some(Answer::json(200, &serde_json::Value::Null, None)),
                Digest::of(b"null"),
            ),
        };
        // A body too large to keep is answered once; the same voucher again is `answer_gone`.
        let answer = answer.unwrap_or_else(Answer::nothing);
        self.tab_answered(*serving, answer, &result).await;
        Served::Ran {
            out,
            outcome: Some(Outcome::TabCall {
                amount: price,
                replayed: false,
            }),
        }
    }

    /// Takes back the voucher of a call that was not delivered: its digest when it was
    /// (the wallet is told it was not counted).
    async fn take_back(&self, serving: super::Serving, voucher: Digest) -> Option<Digest> {
        match self.tab_undelivered(serving).await {
            Ok(()) => Some(voucher),
            Err(e) => {
                tracing::error!(error = %e, "stipendex: an undelivered call's voucher could not be taken back");
                None
            }
        }
    }
}

/// A paid request after its work, before its claim is released (one per request, on the
/// stack for a moment: not worth a box).
#[allow(clippy::large_enum_variant)]
enum Done<T> {
    /// Answered (or refused to settle), with what to keep.
    Kept(Served<T>, Option<Answer>),
    /// Nothing reached the service.
    Undelivered(String),
    /// The answer never came back.
    Lost,
    /// Not deliverable; whether the payment was given back.
    Undeliverable(String, bool),
}
