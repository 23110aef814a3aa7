//! One payment through the transport, whatever its scheme: choose the scheme it is for, check
//! it, reserve its served-once record, then settle before the paid work (default) or verify,
//! run and settle after it. The HTTP paywall, the MCP adapter and the rails' receivers all go
//! through here, so the order of these steps is written once.

use std::future::Future;

use rail_core::Timestamp;
use rail_core::keys::Reservation;

use crate::scheme::{Accept, Busy, Failure, Presented, Price, Refusal, Settled, Verdict, Verified};
use crate::served::{self, ServedOnce, Taken};
use crate::wire::{self, Entry, PaymentRequired, ResourceInfo};

/// The builders a priced surface (the HTTP paywall, the MCP adapter) has over its fields
/// `served`, `clock` and `settle_when`: `with_store`, `with_served`, `with_clock` and `settle`
/// (documented with `$settle_doc`, which names the surface's default), and the getters
/// `settle_when` and `clock`.
#[cfg(any(feature = "paywall", feature = "mcp"))]
macro_rules! surface_builders {
    ($settle_doc:literal) => {
        /// Served payments kept in `store` (PostgreSQL for several instances; the HTTP
        /// paywall, the MCP adapter and the rails' receivers on the same store share the
        /// record, so one payment is served once across them).
        #[must_use]
        pub fn with_store(mut self, store: std::sync::Arc<dyn rail_core::keys::KeyStore>) -> Self {
            self.served = $crate::served::ServedOnce::new(store);
            self
        }

        /// Served payments kept in `served` (a receiver's record, shared with its other
        /// surfaces).
        #[must_use]
        pub fn with_served(mut self, served: $crate::served::ServedOnce) -> Self {
            self.served = served;
            self
        }

        /// Judges payments' validity windows by `clock` instead of the host's clock.
        #[must_use]
        pub fn with_clock(mut self, clock: rail_core::SharedClock) -> Self {
            self.clock = clock;
            self
        }

        #[doc = $settle_doc]
        #[must_use]
        pub const fn settle(mut self, when: $crate::settle::SettleWhen) -> Self {
            self.settle_when = when;
            self
        }

        /// When it settles, as configured ([`SettleWhen::for_method`] says it for one
        /// request).
        #[must_use]
        pub fn settle_when(&self) -> $crate::settle::SettleWhen {
            self.settle_when
        }

        /// The clock it judges payments' validity windows by.
        #[must_use]
        pub fn clock(&self) -> &rail_core::SharedClock {
            &self.clock
        }
    };
}
#[cfg(any(feature = "paywall", feature = "mcp"))]
pub(crate) use surface_builders;

/// When a payment settles relative to the paid work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SettleWhen {
    /// Settle, then run the paid work (the content never exists unpaid).
    #[default]
    Before,
    /// Verify, run the paid work, settle only if it succeeded (no charge for failed work;
    /// a failed settlement withholds the work's output).
    After,
    /// [`SettleWhen::After`] for a safe request (HTTP `GET`, `HEAD`, `OPTIONS`, `TRACE`: work
    /// that changes nothing, so withholding its output when settlement fails costs the seller
    /// nothing), [`SettleWhen::Before`] for every other (a `POST`, a tool call): work with
    /// effects is never done for a payment that then fails to settle.
    AfterIfSafe,
}

impl SettleWhen {
    /// When to settle a request of `method` (an HTTP method; `None` for an MCP tool call,
    /// which is not safe).
    #[must_use]
    pub fn for_method(self, method: Option<&str>) -> SettleWhen {
        match self {
            SettleWhen::AfterIfSafe => match method {
                Some("GET" | "HEAD" | "OPTIONS" | "TRACE") => SettleWhen::After,
                _ => SettleWhen::Before,
            },
            w => w,
        }
    }
}

/// The [`Accept`] a presented payment is for: the only one, or the first whose scheme
/// [`claims`](crate::Scheme::claims) the envelope (a v1 payment only by a scheme that speaks
/// v1), or else the first (whose check then names what is wrong).
#[must_use]
pub fn choose<'a>(accepts: &'a [Accept], presented: &Presented) -> Option<&'a Accept> {
    if let [only] = accepts {
        return Some(only);
    }
    let envelope = presented.peek();
    envelope
        .as_ref()
        .and_then(|env| {
            accepts.iter().find(|a| {
                (!presented.is_v1() || a.scheme.info().v1_network.is_some()) && a.scheme.claims(env)
            })
        })
        .or_else(|| accepts.first())
}

/// The price of `resource` in `accept`.
#[must_use]
pub fn price(accept: &Accept, resource: &str, url: &str, description: &str) -> Price {
    Price {
        resource: resource.to_owned(),
        url: url.to_owned(),
        description: description.to_owned(),
        amount: accept.amount,
    }
}

/// The 402 for one resource, from every scheme that can pay it.
#[derive(Debug)]
pub struct Challenge {
    /// The v2 body: a fresh entry per scheme, in the resource's order; `error` the refusal's
    /// code, or the first scheme's unpaid text; `resource` when a scheme wants it.
    pub required: PaymentRequired,
    /// The v1 entries of the schemes that speak v1.
    pub v1: Vec<Entry>,
    /// The schemes' MCP hints (exact-algo's `how_to_pay`).
    pub hints: serde_json::Map<String, serde_json::Value>,
}

/// Builds the [`Challenge`] for `resource` (`url` its URL, `description` what it is), paid in
/// any of `accepts`, answering `refusal` if there is one. The paywall and the MCP adapter both
/// answer with it.
///
/// # Errors
/// [`Failure::Unknown`] if a scheme cannot issue its challenge now.
pub async fn challenge(
    accepts: &[Accept],
    resource: &str,
    url: &str,
    description: &str,
    refusal: Option<&Refusal>,
) -> Result<Challenge, Failure> {
    let mut entries = Vec::with_capacity(accepts.len());
    let mut v1 = Vec::new();
    let mut hints = serde_json::Map::new();
    for a in accepts {
        let p = price(a, resource, url, description);
        let entry = a.scheme.requirements(&p).await?;
        if let Some(e) = a.scheme.v1_requirements(&entry, &p) {
            v1.push(e);
        }
        if let Some((k, v)) = a.scheme.mcp_hints() {
            hints.insert(k, v);
        }
        entries.push(entry);
    }
    let error = match refusal {
        Some(r) => r.error.clone(),
        None => accepts
            .first()
            .map_or(wire::PAYMENT_REQUIRED_ERROR, |a| a.scheme.required_error())
            .to_owned(),
    };
    let resource = accepts
        .iter()
        .any(|a| a.scheme.wants_resource())
        .then(|| ResourceInfo {
            description: Some(description.to_owned()),
            ..ResourceInfo::new(url)
        });
    Ok(Challenge {
        required: PaymentRequired {
            x402_version: wire::V2::default(),
            error: Some(error),
            reason: refusal.and_then(|r| r.reason.clone()),
            resource,
            accepts: entries,
            extensions: None,
        },
        v1,
        hints,
    })
}

/// The header a settled payment's answer carries over HTTP, and its JSON: `PAYMENT-RESPONSE`
/// with the settlement, or `X-PAYMENT-RESPONSE` with the scheme's v1 form when the payment
/// came as v1's `X-PAYMENT`.
#[must_use]
pub fn response_header(
    settled: &Settled,
    presented: &Presented,
    scheme: &dyn crate::Scheme,
) -> (&'static str, serde_json::Value) {
    if presented.is_v1() {
        (
            wire::X_PAYMENT_RESPONSE,
            scheme.v1_response(&settled.response),
        )
    } else {
        (wire::PAYMENT_RESPONSE, settled.response.clone())
    }
}

/// A checked payment holding its served-once record.
#[derive(Debug)]
#[must_use = "a taken payment must end as served or released"]
pub struct Taken402<'a> {
    /// The way it pays.
    pub accept: &'a Accept,
    /// Its price.
    pub price: Price,
    /// What its scheme checked.
    pub verified: Verified,
    serving: Reservation,
}

/// Checks `presented` against `accept` at `now` and reserves its served-once record.
///
/// # Errors
/// A [`Failure`]: a refusal (answer a fresh 402) or an unknown outcome (503, same payment).
pub async fn take<'a>(
    accept: &'a Accept,
    price: Price,
    presented: &Presented,
    served: &ServedOnce,
    now: Timestamp,
) -> Result<Taken402<'a>, Failure> {
    let verified = accept.scheme.check(presented, &price, now).await?;
    let serving = match served.reserve(&verified.key).await {
        Ok(r) => r,
        Err(Taken::Used) => return Err(Failure::Refused(accept.scheme.replayed())),
        Err(e @ Taken::InFlight) => {
            return Err(accept
                .scheme
                .unavailable(Busy::InFlight, &format!("{e}; retry the same payment")));
        }
        Err(e @ Taken::Store(_)) => {
            return Err(accept.scheme.unavailable(Busy::Store, &e.to_string()));
        }
    };
    Ok(Taken402 {
        accept,
        price,
        verified,
        serving,
    })
}

impl Taken402<'_> {
    /// Settles (the record's lease kept alive meanwhile). On a failure the record is released:
    /// the same payment may be presented again.
    ///
    /// # Errors
    /// The scheme's [`Failure`].
    pub async fn settle(self) -> Result<SettledPayment, Failure> {
        let settled = self
            .serving
            .keep_alive(self.accept.scheme.settle(&self.verified, &self.price))
            .await;
        match settled {
            Ok(settled) => Ok(SettledPayment {
                settled,
                serving: self.serving,
                taken_over: self.accept.scheme.unavailable(
                    Busy::InFlight,
                    "this payment is being served by another request; retry the same payment",
                ),
            }),
            Err(f) => {
                served::release(self.serving).await;
                Err(f)
            }
        }
    }

    /// Settle-after: the scheme's online verdict, then (when valid) `work` under the record,
    /// then settlement if `succeeded(&output)`. `MaybeSettled` settles first (an earlier
    /// request's answer was lost) and then runs `work`. Returns the work's output with the
    /// settlement (`None`: the work failed, nothing was charged).
    ///
    /// # Errors
    /// A [`Failure`]; the work's output is then dropped (never served unsettled).
    pub async fn verify_run_settle<T, Fut>(
        self,
        work: impl FnOnce() -> Fut,
        succeeded: impl FnOnce(&T) -> bool,
    ) -> Result<(T, Option<Settled>), Failure>
    where
        Fut: Future<Output = T>,
    {
        let verdict = self
            .serving
            .keep_alive(self.accept.scheme.verify(&self.verified, &self.price))
            .await;
        match verdict {
            Ok(Verdict::Valid) => {}
            Ok(Verdict::MaybeSettled) => {
                // Settling here only looks for an earlier settlement of this payment: when
                // there is none, the payment is refused for the chain's reason, not answered
                // as a settlement this request attempted.
                let paid = self.settle().await.map_err(|f| match f {
                    Failure::Refused(mut r) => {
                        r.response = None;
                        Failure::Refused(r)
                    }
                    unknown @ Failure::Unknown { .. } => unknown,
                })?;
                return paid.run(work, succeeded).await;
            }
            Err(f) => {
                served::release(self.serving).await;
                return Err(f);
            }
        }
        if let Err(e) = served::running(&self.serving).await {
            served::release(self.serving).await;
            return Err(self
                .accept
                .scheme
                .unavailable(Busy::Store, &format!("served-once store: {e}")));
        }
        let out = self.serving.keep_alive(work()).await;
        if !succeeded(&out) {
            // Not charged: nothing was served.
            served::release(self.serving).await;
            return Ok((out, None));
        }
        let settled = self
            .serving
            .keep_alive(self.accept.scheme.settle(&self.verified, &self.price))
            .await;
        match settled {
            Ok(s) => {
                // The output is this request's own (it ran under the record): served.
                let _ = served::mark_paid(&self.serving, &s.transaction).await;
                served::commit(self.serving).await;
                Ok((out, Some(s)))
            }
            Err(f) => {
                served::release(self.serving).await;
                Err(f)
            }
        }
    }

    /// Releases the record without settling (the payer may present the payment again).
    pub async fn release(self) {
        served::release(self.serving).await;
    }
}

/// A settled payment holding its served-once record.
#[derive(Debug)]
#[must_use = "a paid payment must end as served or released"]
pub struct SettledPayment {
    /// The settlement.
    pub settled: Settled,
    serving: Reservation,
    taken_over: Failure,
}

impl SettledPayment {
    /// Records the payment as paid, runs `work` under the record (its lease kept alive), and
    /// commits it if `succeeded(&output)` (else releases it: the same payment may be presented
    /// again, and is served without a second charge).
    ///
    /// # Errors
    /// [`Failure::Unknown`] if another request took the record over (it answers the payer).
    pub async fn run<T, Fut>(
        self,
        work: impl FnOnce() -> Fut,
        succeeded: impl FnOnce(&T) -> bool,
    ) -> Result<(T, Option<Settled>), Failure>
    where
        Fut: Future<Output = T>,
    {
        if !served::mark_paid(&self.serving, &self.settled.transaction).await {
            return Err(self.taken_over);
        }
        let out = self.serving.keep_alive(work()).await;
        if succeeded(&out) {
            served::commit(self.serving).await;
        } else {
            tracing::warn!(tx = %self.settled.transaction, "x402: settled, but the paid work failed; the same payment may be presented again");
            served::release(self.serving).await;
        }
        Ok((out, Some(self.settled)))
    }

    /// Commits the record with no paid work (a rail receiver's verification).
    pub async fn served(self) -> Settled {
        served::commit(self.serving).await;
        self.settled
    }
}
