//! An x402 payment at the list price, served by the engine ([`Receiver::serve`]) under the
//! same served-once record as a Proof (decision 0038): the scheme's offline check (nothing is
//! claimed before it passes), the claim keyed by the payment's single-use identity and
//! fingerprinted by the envelope presented, settlement before the work or verification before
//! and settlement after it ([`SettleWhen`]), delivery at most once, the work, and the answer
//! kept with its `PAYMENT-RESPONSE`. The same envelope again — its answer lost on the way — gets
//! the kept answer, never a second settlement nor a second run; another envelope for the same
//! payment is refused as used.
//!
//! What stays the binding's: reading the payment ([`X402Payment`]) and encoding the scheme's
//! refusals ([`X402Failure`]) and the settlement ([`super::Seal::X402`]) in its own x402 codec.

use std::time::Duration;

use sha2::{Digest as _, Sha256};
use x402_transport::served::{self, Taken};
use x402_transport::settle::response_header;
use x402_transport::{Busy, Failure, Presented, Scheme, SettleWhen, Settled, Verdict};

use super::answers::{ANSWER_MARGIN, Use};
use super::binding::{Ran, Seal, Served, Work, X402Failure, X402Payment, X402Seal};
use super::{Outcome, Price, PricedCapability, Receiver, Request, idempotent};
use crate::Error;

/// How long a claim of an x402 payment left in flight (its settlement's outcome unknown, or
/// its instance stopped) is recovered by the same envelope: the longest validity a payer
/// signs (x402's EVM payers an hour at most; an Algorand transaction lives at most 1,000
/// rounds). Past it the claim is forgotten; the payment's served-once mark (kept
/// [`x402_transport::served::SERVED_RETENTION`]) still refuses a payment that was served.
pub const X402_CLAIM_WINDOW: Duration = Duration::from_secs(3600);

/// The record's identity of an x402 payment whose single-use key is `key`.
fn record_id(key: &str) -> String {
    format!("x402:{key}")
}

/// The digest of the envelope presented: the same bytes again are the same presentation.
fn fingerprint(p: &Presented) -> String {
    hex::encode(match p {
        Presented::Header(h) | Presented::V1Header(h) => Sha256::digest(h.as_bytes()),
        Presented::Object(v) => Sha256::digest(v.to_string().as_bytes()),
    })
}

/// What an answer paid by `settled` carries (its header, its `_meta`, its receipt).
fn seal_of(settled: &Settled, presented: &Presented, scheme: &dyn Scheme) -> X402Seal {
    let (header, header_value) = response_header(settled, presented, scheme);
    X402Seal {
        header,
        header_value,
        response: settled.response.clone(),
        receipt: settled.receipt.clone(),
    }
}

impl Receiver {
    /// Serves `req` (decided under `cap`) paid by the x402 payment `pay`, at the list price the
    /// hook kept (the guard has run): the steps of the module's docs, each once.
    pub(super) async fn serve_x402<W: Work>(
        &self,
        cap: &PricedCapability,
        req: &Request,
        pay: X402Payment,
        mut work: W,
    ) -> Served<W::Out> {
        let X402Payment {
            accept,
            price,
            presented,
            when,
            now,
        } = pay;
        let scheme = accept.scheme;
        let failed = |failure: Failure, presented: Option<Presented>| {
            Served::X402Failed(Box::new(X402Failure {
                failure,
                presented,
                scheme: scheme.clone(),
            }))
        };
        let presented = match presented {
            Ok(p) => p,
            Err(r) => return failed(Failure::Refused(r), None),
        };
        // Offline first: nothing is claimed for a payment that does not pass.
        let verified = match scheme.check(&presented, &price, now).await {
            Ok(v) => v,
            Err(f) => return failed(f, Some(presented)),
        };
        let answers = &self.0.answers;
        let id = record_id(&verified.key);
        let what = format!("the x402 payment {}", verified.key);
        let request = req.digest();
        let lease = match answers
            .claim_as(
                &id,
                &what,
                &fingerprint(&presented),
                request.as_str(),
                X402_CLAIM_WINDOW,
            )
            .await
        {
            Ok(Use::Run { lease, .. }) => lease,
            // The same envelope again: its answer was lost on the way.
            Ok(Use::Answered(answer)) => {
                tracing::info!(payment = %verified.key, "the same x402 payment again: its kept answer");
                return Served::Replayed {
                    answer,
                    quote: None,
                    voucher: None,
                    amount: None,
                };
            }
            Ok(Use::Gone(g)) => return Served::Gone(g),
            // Served already (another envelope for the same payment, or another request).
            Ok(Use::Used) | Err(Error::QuoteUsed(_) | Error::Mismatch(_)) => {
                return failed(Failure::Refused(scheme.replayed()), Some(presented));
            }
            Err(Error::Payment(e)) if e.is_retryable() => {
                return failed(in_flight(scheme.as_ref()), Some(presented));
            }
            Err(e) => {
                let f = scheme.unavailable(Busy::Store, &format!("served-once store: {e}"));
                return failed(f, Some(presented));
            }
        };
        // The payment's served-once mark, shared with every other surface on the store (the
        // x402 rail's Proofs, a plain paywall): served there, it is not served here. Kept a week
        // (`SERVED_RETENTION`), past this record's own retention.
        let serving = match self.0.served.reserve(&verified.key).await {
            Ok(r) => r,
            Err(taken) => {
                answers.fail(lease, false).await;
                let f = match taken {
                    Taken::Used => Failure::Refused(scheme.replayed()),
                    Taken::InFlight => in_flight(scheme.as_ref()),
                    Taken::Store(e) => {
                        scheme.unavailable(Busy::Store, &format!("served-once store: {e}"))
                    }
                };
                return failed(f, Some(presented));
            }
        };
        // The claim (on a deferred handle) is durable before the chain is asked to verify or
        // settle: at no cost when the served-once mark, a durable write of the same store,
        // covered it.
        if let Err(e) = lease.store().sync().await {
            served::release(serving).await;
            answers.fail(lease, true).await;
            let f = scheme.unavailable(Busy::Store, &format!("served-once store: {e}"));
            return failed(f, Some(presented));
        }
        // Not served: both records are given up (a certain refusal, a failed or undelivered
        // work: the same payment may be presented again, in any encoding, and runs without a
        // second charge when it settled), or the claim is left to the same envelope (an
        // unknown settlement).
        let (id_of, key) = (&id, &verified.key);
        let not_served = move |lease, serving, unknown: bool| async move {
            if let Err(e) = answers.unstart(id_of).await {
                tracing::error!(payment = %key, error = %e, "could not clear an unserved x402 payment's delivery mark; its repeat may be answered outcome_unknown");
            }
            served::release(serving).await;
            answers.fail(lease, unknown).await;
        };
        let unknown = |f: &Failure| matches!(f, Failure::Unknown { .. });
        let settle_first = match when {
            SettleWhen::After => {
                let verdict = lease
                    .keep_alive(serving.keep_alive(scheme.verify(&verified, &price)))
                    .await;
                match verdict {
                    Ok(Verdict::Valid) => false,
                    Ok(Verdict::MaybeSettled) => true,
                    Err(f) => {
                        not_served(lease, serving, unknown(&f)).await;
                        return failed(f, Some(presented));
                    }
                }
            }
            _ => true,
        };
        let mut settled = None;
        if settle_first {
            let done = lease
                .keep_alive(serving.keep_alive(scheme.settle(&verified, &price)))
                .await;
            match done {
                Ok(s) => settled = Some(s),
                Err(mut f) => {
                    if when == SettleWhen::After
                        && let Failure::Refused(r) = &mut f
                    {
                        // Settling here only looked for an earlier settlement of this payment:
                        // there is none, so it is refused for the chain's reason, not answered
                        // as a settlement this request attempted.
                        r.response = None;
                    }
                    not_served(lease, serving, unknown(&f)).await;
                    return failed(f, Some(presented));
                }
            }
        }
        // Paid (settle-before) or verified (settle-after): a copy presented elsewhere while
        // the work runs is refused, not served again.
        let marked = match &settled {
            Some(s) => served::mark_paid(&serving, &s.transaction).await,
            None => served::running(&serving).await.is_ok(),
        };
        if !marked {
            not_served(lease, serving, true).await;
            return failed(in_flight(scheme.as_ref()), Some(presented));
        }
        // At most once per payment: a request handed over by an instance that then stopped
        // runs again only if it is idempotent.
        match answers.start(&id).await {
            Ok(true) => {}
            Ok(false) if idempotent(&req.method) => {}
            Ok(false) => {
                let (answer, _) = W::outcome_unknown();
                served::commit(serving).await;
                if let Err(e) = answers
                    .keep(lease, &id, request.as_str(), Some(&answer), self.keep_for())
                    .await
                {
                    tracing::error!(error = %e, "stipendex: cannot keep the outcome-unknown answer");
                }
                return Served::OutcomeUnknown {
                    answer: Box::new(answer),
                    quote: None,
                    tab_call: None,
                };
            }
            Err(e) => {
                not_served(lease, serving, true).await;
                let f = scheme.unavailable(Busy::Store, &format!("served-once store: {e}"));
                return failed(f, Some(presented));
            }
        }
        let ran = lease.keep_alive(serving.keep_alive(work.run_paid())).await;
        let (mut out, ok) = match ran {
            Ran::Answered { out, ok, .. } => (out, ok),
            Ran::Unbound(out) => (out, false),
            Ran::Undelivered(why) => {
                not_served(lease, serving, false).await;
                return Served::Undelivered {
                    why,
                    uncounted: None,
                };
            }
            // It may have run: nothing is kept, and both records lapse.
            Ran::Lost => {
                tracing::warn!(payment = %verified.key, "an x402-paid request's answer never came back: its claim lapses");
                drop((lease, serving));
                return Served::Lost;
            }
            Ran::Undeliverable(why) => {
                tracing::error!(error = %why, "stipendex: an x402-paid answer cannot be delivered");
                not_served(lease, serving, false).await;
                return Served::Undeliverable {
                    why,
                    given_back: false,
                    uncounted: None,
                };
            }
        };
        if !ok {
            // Settled before: the failure carries the settlement, and the same payment may be
            // presented again without a second charge. Settle-after: nothing was charged.
            if settled.is_some() {
                tracing::warn!(payment = %verified.key, "x402: settled, but the paid work failed; the same payment may be presented again");
            }
            let seal = settled
                .as_ref()
                .map(|s| seal_of(s, &presented, scheme.as_ref()));
            let _ = work.seal(&mut out, Seal::X402(seal.as_ref()));
            not_served(lease, serving, false).await;
            return Served::Ran { out, outcome: None };
        }
        let settled = match settled {
            Some(s) => s,
            None => {
                let done = lease
                    .keep_alive(serving.keep_alive(scheme.settle(&verified, &price)))
                    .await;
                match done {
                    Ok(s) => {
                        let _ = served::mark_paid(&serving, &s.transaction).await;
                        s
                    }
                    // The work's output is withheld: never served unsettled.
                    Err(f) => {
                        not_served(lease, serving, unknown(&f)).await;
                        return failed(f, Some(presented));
                    }
                }
            }
        };
        served::commit(serving).await;
        let seal = seal_of(&settled, &presented, scheme.as_ref());
        let kept = work.seal(&mut out, Seal::X402(Some(&seal)));
        if let Err(e) = answers
            .keep(lease, &id, request.as_str(), kept.as_ref(), self.keep_for())
            .await
        {
            tracing::error!(error = %e, "stipendex: the x402 answer was given but could not be kept for a repeat");
        }
        let outcome = match &cap.price {
            Price::Fixed(amount) => Some(Outcome::Paid {
                rail: "x402".into(),
                amount: amount.clone(),
            }),
            Price::Estimate { .. } => None,
        };
        Served::Ran { out, outcome }
    }

    /// How long an x402-paid answer is kept for a repeat: a Quote's life and the margin, as a
    /// Proof's (the payer's retry of a lost answer comes within it).
    fn keep_for(&self) -> Duration {
        self.0.ttl.saturating_add(ANSWER_MARGIN)
    }
}

/// The scheme's "being served by another request: retry the same payment" (503).
fn in_flight(scheme: &dyn Scheme) -> Failure {
    scheme.unavailable(
        Busy::InFlight,
        "this payment is being processed by another request; retry the same payment",
    )
}
