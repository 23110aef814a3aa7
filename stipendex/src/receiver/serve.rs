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

use rail_core::Money;

use super::binding::{Ran, Seal, Served, Tender, Work};
use super::{
    Admitted, Answer, Delivery, Gate, Outcome, Presented, PricedCapability, Receiver, Request,
    TabCall, idempotent,
};
use crate::Error;
use crate::envelope::{Digest, Quote, Signed};

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
                    return self.serve_x402(cap, req, *payment, work).await;
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
