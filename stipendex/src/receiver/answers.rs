//! A Proof is used once at the receiver, and its answer is kept: the same Proof presented again
//! for the same request (the first answer was lost on the way) gets the kept answer again, not
//! `quote_used` and not a second run.
//!
//! An x402 payment served by the engine (`super::x402`) is claimed in the same records under
//! `x402:<payment key>`, fingerprinted by its envelope: one record for every way to pay
//! (decision 0038).
//!
//! Two records per Proof, in the receiver's store (shared by its instances, so any instance
//! answers the repeat):
//! - **its use** ([`rail_core::keys::Idempotency`], namespace `stipendex/<receiver>/proofs`,
//!   keyed by the Quote, fingerprinted by the Proof): held while the request runs, then kept for
//!   24 hours. A use whose outcome stays unknown (the rail's answer was "try again", or the
//!   instance stopped) is recovered by the same Proof until its Quote's grace ends, and
//!   forgotten [`CLAIM_MARGIN`] after (`claim_until`): past the grace the Proof is refused
//!   before it is claimed. A second Proof for the same Quote is `quote_used`; the same Proof while the first
//!   presentation still runs is `in_progress` (retryable).
//! - **its answer** (namespace `stipendex/<receiver>/answers`): status, content type, body (at
//!   most [`MAX_KEPT_ANSWER`] bytes) and Receipt, kept for the Quote's remaining life plus
//!   [`ANSWER_MARGIN`], within the instance's bound on kept answers ([`super::keep`]: oldest
//!   first, a record losing its body before it is removed). A repeat whose answer is not there
//!   any more (too large, dropped for the bound, past its retention) is [`Gone`]: answered
//!   once, receipted, not run again (`answer_gone` over HTTP, with the Receipt when its record
//!   still holds it).
//! - **its verification** (namespace `stipendex/<receiver>/verified`): the rail's verdict,
//!   written as soon as the rail gave it. A presentation that recovers a lapsed claim takes the
//!   verdict from here instead of asking the rail again (most rails answer a second
//!   verification of a consumed payment `replayed`: the payer would have paid for nothing).
//! - **its delivery** (namespace `stipendex/<receiver>/started`): written once, just before the
//!   paid work is handed its request ([`Answers::start`]). A presentation that recovers a lapsed
//!   claim (the instance serving it died) finds it and knows the work may have run: a binding
//!   runs it again only when the request is idempotent.

use std::sync::Arc;
use std::time::Duration;

use rail_core::keys::{Idempotency, Lease, ReplayGuard, Write};
use rail_core::{KeyStore, OpId, RailError, Verified};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

pub use super::answer_record::Answer;
pub(crate) use super::answer_record::who;
use super::answer_record::{ANSWER_STATE, Dropped, Kept};
use super::keep::{Keep, Space};
use crate::Error;

/// The largest answer body the receiver keeps for a repeat: a larger answer is served once,
/// and a repeat of its Proof is [`Gone`] (its record keeps the status and Receipt).
pub const MAX_KEPT_ANSWER: usize = 1024 * 1024;

/// The code of a repeat whose kept answer is gone ([`Gone`]; a voucher's, over a tab).
pub const ANSWER_GONE: &str = "answer_gone";

/// How long an answer is kept after its Quote's expiry: the wallet's time to notice the lost
/// answer and present the same Proof again.
pub const ANSWER_MARGIN: Duration = Duration::from_secs(10 * 60);

/// How long after the receiver starts refusing a Proof by itself (its Quote's expiry plus
/// [`rail_core::LATE_PROOF_GRACE`]) a claim of it left in flight is kept: an unknown outcome
/// (the rail did not answer, the instance stopped) is recovered by the same Proof until then,
/// and forgotten after — so Proofs refused as "try again" leave nothing for ever. The margin
/// covers a store whose clock runs ahead of the receiver's.
pub const CLAIM_MARGIN: Duration = Duration::from_secs(10 * 60);

/// How long past its Quote's expiry a Proof's use is remembered (and a rail's answer to a
/// recovered verification may be the same).
const USE_MARGIN: Duration = Duration::from_secs(24 * 3600);

/// The rail operation of verifying the Proof of digest `proof`.
pub(crate) fn verify_op(proof: &str) -> Result<OpId, Error> {
    let h = Sha256::digest(proof.as_bytes());
    OpId::new(format!(
        "verify-{}",
        hex::encode(h.get(..16).unwrap_or_default())
    ))
    .map_err(Error::Payment)
}

/// The use record's result: which Proof used the Quote, and whether its answer was kept.
#[derive(Serialize, Deserialize)]
struct Used {
    kept: bool,
}

/// The verification record: which Proof, and the rail's verdict.
#[derive(Serialize, Deserialize)]
struct Recorded {
    proof: String,
    verified: Verified,
}

/// A Proof presented again, for the same request, after it was answered and receipted, whose
/// answer is not kept any more: too large to keep, dropped to keep the instance's kept answers
/// within their bound, or past its retention. It is not run again and nothing more is charged
/// ([`super::Receiver::present`]; over HTTP `410` with `"error": "answer_gone"` and the
/// Receipt).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gone {
    /// The Quote's id (`x402:<payment key>` for an x402 payment).
    pub quote: String,
    /// The answer's status, if its record is still kept.
    pub status: Option<u16>,
    /// The Receipt the answer carried (compact JWS), if its record is still kept and the work
    /// succeeded.
    pub receipt: Option<String>,
    /// Why, in one sentence.
    pub message: String,
}

impl Gone {
    /// `quote`'s repeat (`what` names the payment: "the proof of quote <id>").
    fn of(quote: &str, what: &str, k: Option<(&Answer, Dropped)>) -> Self {
        let why = match k {
            Some((_, d)) if !d.bound => format!(
                "its answer ({} bytes) is larger than the {MAX_KEPT_ANSWER} bytes a receiver keeps",
                d.bytes
            ),
            Some((_, d)) => format!(
                "its answer ({} bytes) was dropped, oldest first, to keep this receiver's kept answers within their bound",
                d.bytes
            ),
            None => "its answer is no longer kept (past its retention, or dropped to keep this receiver's kept answers within their bound)".to_owned(),
        };
        Gone {
            quote: quote.to_owned(),
            status: k.map(|(a, _)| a.status),
            receipt: k.and_then(|(a, _)| a.receipt.clone()),
            message: format!(
                "{what} was answered and {why}: it is not run again and nothing more is charged{}",
                if k.is_some_and(|(a, _)| a.receipt.is_some()) {
                    "; its Receipt is attached"
                } else {
                    ""
                }
            ),
        }
    }
}

/// What the use record said of a Proof.
pub(crate) enum Use {
    /// First presentation (or the recovery of one that died): verify, run, then keep.
    Run {
        /// The claim.
        lease: Lease,
        /// An earlier presentation held the claim and stopped.
        recovered: bool,
    },
    /// Presented before and answered: the kept answer.
    Answered(Box<Answer>),
    /// Presented before and answered, and its answer is not kept any more.
    Gone(Box<Gone>),
    /// Presented before, and no answer was kept for it (through [`super::Receiver::accept`]).
    Used,
}

/// The receiver's records of used Proofs and their answers.
#[derive(Clone, Debug)]
pub(crate) struct Answers {
    store: Arc<dyn KeyStore>,
    uses_ns: String,
    lease: Duration,
    answers_ns: String,
    verified_ns: String,
    started: ReplayGuard,
    started_ns: String,
    retain: Duration,
    keep: Arc<Keep>,
}

impl Answers {
    /// The records of `receiver`, whose Quotes live `ttl`, its answers kept within `keep`.
    pub(crate) fn new(
        store: Arc<dyn KeyStore>,
        receiver: &str,
        ttl: Duration,
        lease: Duration,
        keep: Arc<Keep>,
    ) -> Self {
        let who = who(receiver);
        // A use is remembered as long as a rail answers a recovered verification the same
        // (the facilitator: the offer's life plus 24 hours), so a repeat never runs twice.
        let retain = ttl.saturating_add(USE_MARGIN).saturating_add(ANSWER_MARGIN);
        Answers {
            uses_ns: format!("stipendex/{who}/proofs"),
            lease,
            answers_ns: format!("stipendex/{who}/answers"),
            verified_ns: format!("stipendex/{who}/verified"),
            started: ReplayGuard::new(store.clone(), format!("stipendex/{who}/started")),
            started_ns: format!("stipendex/{who}/started"),
            retain,
            store,
            keep,
        }
    }

    /// The bound its answers are kept within (shared with the tabs').
    pub(crate) fn bound(&self) -> &Arc<Keep> {
        &self.keep
    }

    /// The use records of one presentation, through a deferred handle of the store where it
    /// has one ([`KeyStore::deferred`]): its claim and its rail's verdict are made durable by
    /// the delivery mark ([`Answers::start`], a durable write of the same store) before the
    /// work runs, and its kept answer and its use by [`Answers::keep`] before the answer
    /// leaves.
    fn handle(&self) -> Arc<dyn KeyStore> {
        rail_core::keys::deferred(&self.store)
    }

    /// The use records written through `store` (a presentation's handle).
    fn uses_on(&self, store: Arc<dyn KeyStore>) -> Idempotency {
        Idempotency::new(store, self.uses_ns.clone()).with_windows(self.lease, self.retain)
    }

    fn key(quote_id: &str) -> Result<OpId, Error> {
        let h = Sha256::digest(quote_id.as_bytes());
        OpId::new(format!(
            "q-{}",
            hex::encode(h.get(..16).unwrap_or_default())
        ))
        .map_err(Error::Payment)
    }

    /// Claims quote `quote_id` for the Proof of digest `proof`, presented for the request of
    /// digest `request`. `refused_in` is how long until the receiver refuses this Proof by
    /// itself (its Quote's grace ends): a claim left in flight — its rail's answer unknown, or
    /// its instance stopped — is forgotten [`CLAIM_MARGIN`] after that, never kept for ever.
    pub(crate) async fn claim(
        &self,
        quote_id: &str,
        proof: &str,
        request: &str,
        refused_in: Duration,
    ) -> Result<Use, Error> {
        let what = format!("the proof of quote {quote_id}");
        self.claim_as(quote_id, &what, proof, request, refused_in)
            .await
    }

    /// [`Answers::claim`] for any payment used once: `quote_id` its identity (a Quote's id, or
    /// `x402:` and an x402 payment's key), `what` how a message names it, `proof` the digest of
    /// what was presented (a second, different one for the same identity is refused as
    /// [`Error::QuoteUsed`]).
    pub(crate) async fn claim_as(
        &self,
        quote_id: &str,
        what: &str,
        proof: &str,
        request: &str,
        refused_in: Duration,
    ) -> Result<Use, Error> {
        let op = Self::key(quote_id)?;
        let fp = rail_core::keys::fingerprint(proof).map_err(Error::Payment)?;
        let end = refused_in.saturating_add(CLAIM_MARGIN);
        let handle = self.handle();
        match self
            .uses_on(handle.clone())
            .begin_until::<Used>(&op, &fp, end)
            .await
        {
            Ok(rail_core::keys::Begin::Fresh(lease)) => Ok(Use::Run {
                lease,
                recovered: false,
            }),
            Ok(rail_core::keys::Begin::Recover(lease)) => Ok(Use::Run {
                lease,
                recovered: true,
            }),
            Ok(rail_core::keys::Begin::Replay(used)) => {
                // Used by another presentation, whose records may not be durable yet: this
                // claim attempt committed after them, so its handle's sync covers them.
                handle
                    .sync()
                    .await
                    .map_err(|e| Error::Storage(e.to_string()))?;
                if !used.kept {
                    return Ok(Use::Used);
                }
                let kept = match self.store.get(&self.answers_ns, op.as_str()).await {
                    Ok(Some(seen)) => seen
                        .record
                        .value
                        .and_then(|v| serde_json::from_str::<Kept>(&v).ok()),
                    Ok(None) => None,
                    Err(e) => return Err(Error::Storage(e.to_string())),
                };
                match kept {
                    Some(k) if k.request != request => Err(Error::Mismatch(format!(
                        "{what} was answered for another request"
                    ))),
                    Some(Kept {
                        answer,
                        dropped: None,
                        ..
                    }) => Ok(Use::Answered(Box::new(answer))),
                    Some(Kept {
                        answer,
                        dropped: Some(d),
                        ..
                    }) => Ok(Use::Gone(Box::new(Gone::of(
                        quote_id,
                        what,
                        Some((&answer, d)),
                    )))),
                    None => Ok(Use::Gone(Box::new(Gone::of(quote_id, what, None)))),
                }
            }
            Err(RailError::IdempotencyConflict { .. }) => {
                Err(Error::QuoteUsed(quote_id.to_owned()))
            }
            Err(RailError::Storage(s)) => Err(Error::Storage(s)),
            Err(e) => Err(Error::Payment(e)),
        }
    }

    /// Keeps the rail's verdict `v` on the Proof of digest `proof` for quote `quote_id`, for a
    /// recovery of its claim (through the claim's `lease`'s handle: durable with the delivery
    /// mark). A failure is logged: only a recovery after a stop is affected.
    pub(crate) async fn record_verification(
        &self,
        lease: &Lease,
        quote_id: &str,
        proof: &str,
        v: &Verified,
    ) {
        let written = async {
            let key = Self::key(quote_id)?;
            let value = serde_json::to_string(&Recorded {
                proof: proof.to_owned(),
                verified: v.clone(),
            })
            .map_err(|e| Error::Storage(e.to_string()))?;
            let mut w = Write::finished(rand::random(), "verified", Some(self.retain));
            w.value = Some(value);
            lease
                .store()
                .insert_if_absent(&self.verified_ns, key.as_str(), &w)
                .await
                .map_err(|e| Error::Storage(e.to_string()))
        };
        if let Err(e) = written.await {
            tracing::error!(quote = %quote_id, error = %e, "could not keep a payment's verification; recovering its proof after a stop would ask the rail again");
        }
    }

    /// The rail's verdict kept for the Proof of digest `proof` (a recovered claim).
    pub(crate) async fn recorded_verification(
        &self,
        quote_id: &str,
        proof: &str,
    ) -> Result<Option<Verified>, Error> {
        let key = Self::key(quote_id)?;
        let seen = self
            .store
            .get(&self.verified_ns, key.as_str())
            .await
            .map_err(|e| Error::Storage(e.to_string()))?;
        Ok(seen
            .and_then(|s| s.record.value)
            .and_then(|v| serde_json::from_str::<Recorded>(&v).ok())
            .filter(|r| r.proof == proof)
            .map(|r| r.verified))
    }

    /// Marks the work of quote `quote_id`'s Proof as started: `true` the first time, `false`
    /// when an earlier presentation of the same Proof (at any instance sharing the store)
    /// already handed the request to its work, whose outcome is then unknown here. A durable
    /// write: the presentation's claim and verdict, written before it, are durable with it.
    pub(crate) async fn start(&self, quote_id: &str) -> Result<bool, Error> {
        let key = Self::key(quote_id)?;
        self.started
            .insert_if_absent(key.as_str(), Some(self.retain))
            .await
            .map_err(|e| Error::Storage(e.to_string()))
    }

    /// The work of quote `quote_id`'s Proof never reached the service: its delivery mark is
    /// removed, so the same Proof again runs it as the first time (even when not idempotent).
    pub(crate) async fn unstart(&self, quote_id: &str) -> Result<(), Error> {
        let key = Self::key(quote_id)?;
        let storage = |e: RailError| Error::Storage(e.to_string());
        let ns = self.started_ns.as_str();
        if let Some(seen) = self.store.get(ns, key.as_str()).await.map_err(storage)? {
            self.store
                .remove(ns, key.as_str(), seen.record.token)
                .await
                .map_err(storage)?;
        }
        Ok(())
    }

    /// The claim's work failed: a permanent refusal gives the Quote back (nothing was used), an
    /// unknown outcome leaves it to be recovered.
    pub(crate) async fn fail(&self, lease: Lease, retryable: bool) {
        let uses = self.uses_on(lease.store().clone());
        let ended = if retryable {
            uses.hand_over(lease).await
        } else {
            uses.abandon(lease).await
        };
        if let Err(e) = ended {
            tracing::warn!(error = %e, "could not end a proof's claim; it lapses by itself");
        }
    }

    /// The request ran: keeps `answer` for `keep` (within the instance's bound: its record
    /// without the body when the body is too large or cannot fit), then marks the Proof used.
    pub(crate) async fn keep(
        &self,
        lease: Lease,
        quote_id: &str,
        request: &str,
        answer: Option<&Answer>,
        keep: Duration,
    ) -> Result<(), Error> {
        let op = Self::key(quote_id)?;
        let records = lease.store().clone();
        let kept = match answer {
            Some(a) => {
                self.keep_answer(&records, &op, quote_id, request, a, keep)
                    .await
            }
            None => false,
        };
        self.uses_on(records.clone())
            .finish(lease, &Used { kept })
            .await
            .map_err(|e| Error::Storage(e.to_string()))?;
        // Both written through the claim's handle: durable before the answer leaves.
        records
            .sync()
            .await
            .map_err(|e| Error::Storage(e.to_string()))
    }

    /// Writes `a`'s record under `op` for `keep`: with its body if it fits, else without;
    /// `true` if a record is kept.
    async fn keep_answer(
        &self,
        records: &Arc<dyn KeyStore>,
        op: &OpId,
        quote_id: &str,
        request: &str,
        a: &Answer,
        keep: Duration,
    ) -> bool {
        let bytes = a.body.len() as u64;
        let record = |body: bool| {
            let dropped = (!body).then_some(Dropped {
                bytes,
                bound: a.body.len() <= MAX_KEPT_ANSWER,
            });
            let answer = if body {
                a.clone()
            } else {
                Answer {
                    body: Vec::new(),
                    ..a.clone()
                }
            };
            serde_json::to_string(&Kept {
                request: request.to_owned(),
                answer,
                dropped,
            })
        };
        let tries: &[bool] = if a.body.len() > MAX_KEPT_ANSWER {
            tracing::warn!(quote = %quote_id, bytes, "the answer is too large to keep; a repeat of its proof is answer_gone");
            &[false]
        } else {
            &[true, false]
        };
        let bare = match record(false) {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(quote = %quote_id, error = %e, "could not encode a paid answer; a repeat of its proof is quote_used");
                return false;
            }
        };
        for &body in tries {
            let value = if body {
                match record(true) {
                    Ok(v) => v,
                    Err(e) => {
                        tracing::error!(quote = %quote_id, error = %e, "could not encode a paid answer; a repeat of its proof is quote_used");
                        return false;
                    }
                }
            } else {
                bare.clone()
            };
            let Some(room) = self.keep.reserve(value.len() as u64).await else {
                if body {
                    tracing::warn!(quote = %quote_id, bytes, "the answer cannot fit in this receiver's bound on kept answers; its record is kept without it");
                }
                continue;
            };
            let token = rand::random::<i64>();
            let mut w = Write::finished(token, ANSWER_STATE, Some(keep));
            w.value = Some(value);
            return match records
                .insert_if_absent(&self.answers_ns, op.as_str(), &w)
                .await
            {
                Ok(None) => {
                    let until = self.keep.now().saturating_add(keep.as_secs());
                    let strip_to = body.then_some(bare.len() as u64);
                    room.kept(Space::Proof, op.as_str(), token, until, body, strip_to);
                    true
                }
                // An earlier presentation of the same Proof kept its answer.
                Ok(Some(_)) => true,
                Err(e) => {
                    tracing::error!(quote = %quote_id, error = %e, "could not keep a paid answer; a repeat of its proof is quote_used");
                    false
                }
            };
        }
        tracing::warn!(quote = %quote_id, "no room for a paid answer's record; a repeat of its proof is quote_used");
        false
    }
}
