//! Where a wallet keeps its audit chains (I5): every object of a payment, in chain order —
//! and, from before the rail is asked until the Proof is signed, the payment as pending.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::Error;
use crate::envelope::{Mandate, Resource, Signed};

mod dir;
mod holders;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;

pub use dir::DirJournal;
#[cfg(feature = "postgres")]
pub use postgres::PgJournal;
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteJournal;

/// A payment the wallet started and has not finished: written before the rail is asked, ended
/// once its Proof is journaled (or the rail refused it for certain). A payment whose outcome
/// is unknown, or held for review, stays pending until [`super::Wallet::resume`] finishes it.
///
/// A payment made for a request sent over a transport stays after its Proof is signed, with
/// the Proof (`proof`), until the request's answer comes back ([`super::Wallet::answered`], or
/// its Receipt): the same request asked again presents that Proof, and is never paid twice for
/// an answer that was lost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pending {
    /// The chain it belongs to ([`chain_name`]).
    pub chain: String,
    /// The Quote paid (compact JWS).
    pub quote: String,
    /// The human's Confirmation (compact JWS), if one was needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation: Option<String>,
    /// The wallet's rail (its name) paying it.
    pub rail: String,
    /// The rail operation id: asked again, the rail answers this payment.
    pub op: String,
    /// When the payment started (Unix seconds).
    pub since: u64,
    /// The request it pays for, when paid over HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<Resource>,
    /// The digest of the request the Quote prices (its `request`), when it names one: the
    /// payments pending for a resource are told apart by it without reading their Quotes
    /// (an MCP tool's calls share one resource). Absent in records of earlier releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<crate::envelope::Digest>,
    /// The rail was asked and its outcome is not known (no answer, or held for review): no
    /// call is paying it now. `false` while the first attempt runs.
    #[serde(default)]
    pub unknown: bool,
    /// Paid: the Proof (compact JWS), its answer not received yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<String>,
    /// Who is making the payment now ([`Journal::holder`]): gone, the payment is taken over at
    /// once instead of after its lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
}

/// Keeps the signed objects of each payment, and its payments pending. A chain is named by
/// the Quote it pays; its objects arrive in chain order (mandate, confirmation, quote, proof,
/// receipt).
///
/// Contract: recording an object a chain already holds keeps one copy (a payment recovered
/// after a crash records its chain again); a pending payment is durable once
/// [`Journal::begin`] returns (the wallet does not ask the rail before).
#[async_trait]
pub trait Journal: Send + Sync {
    /// Appends the compact JWS `jws` to chain `chain`, unless the chain holds it already.
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn record(&self, chain: &str, jws: &str) -> Result<(), Error>;

    /// Appends `jws`, an object new by construction (a tab's voucher), to chain `chain`
    /// without looking for it first: a tab's chain grows by one voucher per call.
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn append(&self, chain: &str, jws: &str) -> Result<(), Error> {
        self.record(chain, jws).await
    }

    /// [`Journal::append`] for a line nothing acts on (an audit line: the result a tab's call
    /// was answered with), answered before it is durable where the journal can: its next
    /// durable write makes it durable, and a power loss before may lose it, leaving the chain
    /// without it as a failed append would. The default is [`Journal::append`].
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn append_deferred(&self, chain: &str, line: &str) -> Result<(), Error> {
        self.append(chain, line).await
    }

    /// Records `objects` in chain `chain` (each as [`Journal::record`], in order), then does
    /// `then` to the chain's pending payment. A journal that can makes it one durable step (a
    /// [`SqliteJournal`] writes it in one transaction: all of it, or none); the default does it
    /// one by one, in that order, and stops at the first error.
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn record_then(
        &self,
        chain: &str,
        objects: &[&str],
        then: Then<'_>,
    ) -> Result<(), Error> {
        for jws in objects {
            self.record(chain, jws).await?;
        }
        match then {
            Then::Keep => Ok(()),
            Then::Pending(p) => self.begin(p).await,
            Then::End => self.end(chain).await,
            Then::EndIfProof(proof) => match self.pending_of(chain).await? {
                Some(p) if p.proof.as_deref() == Some(proof) => self.end(chain).await,
                _ => Ok(()),
            },
        }
    }

    /// Writes `pending` (replacing an earlier record of its chain).
    ///
    /// # Errors
    /// [`Error::Storage`]: the wallet then pays nothing.
    async fn begin(&self, pending: &Pending) -> Result<(), Error>;

    /// The payment of chain `chain` is no longer pending.
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn end(&self, chain: &str) -> Result<(), Error>;

    /// The pending payments, oldest first.
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn pending(&self) -> Result<Vec<Pending>, Error>;

    /// The pending payment of chain `chain`, if there is one.
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn pending_of(&self, chain: &str) -> Result<Option<Pending>, Error> {
        Ok(self.pending().await?.into_iter().find(|p| p.chain == chain))
    }

    /// The pending payments made for a request of resource `sent`, oldest first (what
    /// [`Journal::pending_for_request`] filters by default). The default filters
    /// [`Journal::pending`]; a journal that can answers it without reading the others.
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn pending_for(&self, sent: &Resource) -> Result<Vec<Pending>, Error> {
        let mut all = self.pending().await?;
        all.retain(|p| p.resource.as_ref() == Some(sent));
        Ok(all)
    }

    /// [`Journal::pending_for`], less the payments recorded for another request of that
    /// resource (their [`Pending::request`] another digest than `request`): what
    /// [`super::Wallet::pay_sent`] reads, so an MCP tool's calls (one resource) do not each
    /// read every other call's pending payment. A payment recorded without a digest is kept.
    /// The default filters [`Journal::pending_for`].
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn pending_for_request(
        &self,
        sent: &Resource,
        request: Option<&crate::envelope::Digest>,
    ) -> Result<Vec<Pending>, Error> {
        let mut all = self.pending_for(sent).await?;
        if let Some(r) = request {
            all.retain(|p| p.request.as_ref().is_none_or(|d| d == r));
        }
        Ok(all)
    }

    /// Whether this journal holds chains of `mandate`: `Some(true)` or `Some(false)` for a
    /// journal that outlives the process (a [`DirJournal`]), `None` for one that cannot say
    /// (it keeps nothing across processes). The wallet compares it with its store's records
    /// ([`super::Wallet::check_records`]).
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn has_mandate(&self, mandate: &Signed<Mandate>) -> Result<Option<bool>, Error> {
        let _ = mandate;
        Ok(None)
    }

    /// Marks `mandate` as one whose chains this journal keeps.
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn mark_mandate(&self, mandate: &Signed<Mandate>) -> Result<(), Error> {
        let _ = mandate;
        Ok(())
    }

    /// This process's name in the pending payments it makes, if the journal can tell later
    /// whether the process is still there ([`Journal::holder_alive`]); `None` (the default):
    /// a payment left by a process that ended is taken over once it is abandoned.
    fn holder(&self) -> Option<String> {
        None
    }

    /// Whether the process named `holder` ([`Journal::holder`]) is still running. Contract:
    /// `false` only when it certainly is not (its lock is free); when unsure, `true`.
    fn holder_alive(&self, holder: &str) -> bool {
        let _ = holder;
        true
    }

    /// The SQLite file whose commits this journal's writes join, if it lives in one: a durable
    /// write of the journal then makes the deferred writes of a store in the same file
    /// ([`rail_core::KeyStore::file`]) made before it durable. `None` (the default): it shares
    /// no commits.
    fn file(&self) -> Option<&std::path::Path> {
        None
    }
}

/// What [`Journal::record_then`] does to the chain's pending payment once the objects are
/// recorded.
#[derive(Clone, Copy, Debug)]
pub enum Then<'a> {
    /// Nothing.
    Keep,
    /// Makes this the chain's pending payment ([`Journal::begin`]).
    Pending(&'a Pending),
    /// Ends it ([`Journal::end`]).
    End,
    /// Ends it if it holds this Proof (compact JWS): a request answered; a payment of the
    /// chain made since is kept.
    EndIfProof(&'a str),
}

/// Pending payments in memory, by chain.
#[derive(Debug, Default)]
struct PendingMap(Mutex<BTreeMap<String, Pending>>);

impl PendingMap {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<String, Pending>>, Error> {
        self.0
            .lock()
            .map_err(|_| Error::Storage("journal lock poisoned".into()))
    }
    fn begin(&self, p: &Pending) -> Result<(), Error> {
        self.lock()?.insert(p.chain.clone(), p.clone());
        Ok(())
    }
    fn end(&self, chain: &str) -> Result<(), Error> {
        self.lock()?.remove(chain);
        Ok(())
    }
    /// The pending payment of `chain` alone (not a copy of every one).
    fn get(&self, chain: &str) -> Result<Option<Pending>, Error> {
        Ok(self.lock()?.get(chain).cloned())
    }
    fn all(&self) -> Result<Vec<Pending>, Error> {
        let mut v: Vec<Pending> = self.lock()?.values().cloned().collect();
        v.sort_by_key(|p| p.since);
        Ok(v)
    }
}

/// A store journal's error.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn storage(e: impl std::fmt::Display) -> Error {
    Error::Storage(format!("journal: {e}"))
}

/// A pending payment's resource as a store journal looks it up ([`Journal::pending_for`]): its
/// JSON (a struct's fields in their fixed order).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn resource_key(r: &Resource) -> Result<String, Error> {
    serde_json::to_string(r).map_err(storage)
}

/// The digest a store journal keeps an object under (one copy per chain).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn digest(jws: &str) -> Vec<u8> {
    Sha256::digest(jws.as_bytes()).to_vec()
}

/// A pending payment of chain `chain` started at `since`, as the store journals' tests write it.
#[cfg(all(test, any(feature = "sqlite", feature = "postgres")))]
fn test_pending(chain: &str, since: u64) -> Pending {
    Pending {
        chain: chain.into(),
        quote: format!("quote-of-{chain}"),
        confirmation: None,
        rail: "house".into(),
        op: format!("op-{chain}"),
        since,
        resource: None,
        request: None,
        unknown: false,
        proof: None,
        holder: None,
    }
}

/// Rows of `(chain, object)` in the order recorded, grouped by chain: `(name, objects in
/// order)`, chains in first-recorded order (what `stipendex verify-chain` reads of a store).
#[cfg(any(feature = "sqlite", feature = "postgres"))]
fn by_chain(rows: impl IntoIterator<Item = (String, String)>) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    let mut at: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for (chain, jws) in rows {
        let i = *at.entry(chain.clone()).or_insert_with(|| {
            out.push((chain, Vec::new()));
            out.len() - 1
        });
        if let Some((_, objects)) = out.get_mut(i) {
            objects.push(jws);
        }
    }
    out
}

/// The name of the chain of `quote_id` from `receiver`: ids are unique per issuer only, so the
/// receiver is part of the name (`q_…-<8 hex of the receiver>`).
#[must_use]
pub fn chain_name(receiver: &str, quote_id: &str) -> String {
    let h = Sha256::digest(receiver.as_bytes());
    format!("{quote_id}-{}", hex::encode(h.get(..4).unwrap_or_default()))
}

/// Keeps no chain; keeps pending payments in memory only (they are lost with the process:
/// give a wallet that must resume across restarts a [`DirJournal`]).
#[derive(Debug, Default)]
pub struct NoJournal(PendingMap);

#[async_trait]
impl Journal for NoJournal {
    async fn record(&self, _chain: &str, _jws: &str) -> Result<(), Error> {
        Ok(())
    }
    async fn begin(&self, pending: &Pending) -> Result<(), Error> {
        self.0.begin(pending)
    }
    async fn end(&self, chain: &str) -> Result<(), Error> {
        self.0.end(chain)
    }
    async fn pending(&self) -> Result<Vec<Pending>, Error> {
        self.0.all()
    }
    async fn pending_of(&self, chain: &str) -> Result<Option<Pending>, Error> {
        self.0.get(chain)
    }
}

/// Keeps chains and pending payments in memory (tests, short-lived agents).
#[derive(Debug, Default)]
pub struct MemoryJournal(Mutex<Vec<(String, String)>>, PendingMap);

impl MemoryJournal {
    /// The objects of chain `chain`, in order.
    #[must_use]
    pub fn chain(&self, chain: &str) -> Vec<String> {
        self.0
            .lock()
            .map(|v| {
                v.iter()
                    .filter(|(c, _)| c == chain)
                    .map(|(_, j)| j.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The names of the chains recorded, in first-recorded order.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = Vec::new();
        if let Ok(v) = self.0.lock() {
            for (c, _) in v.iter() {
                if !names.contains(c) {
                    names.push(c.clone());
                }
            }
        }
        names
    }
}

#[async_trait]
impl Journal for MemoryJournal {
    async fn record(&self, chain: &str, jws: &str) -> Result<(), Error> {
        let mut v = self
            .0
            .lock()
            .map_err(|_| Error::Storage("journal lock poisoned".into()))?;
        if !v.iter().any(|(c, j)| c == chain && j == jws) {
            v.push((chain.to_owned(), jws.to_owned()));
        }
        Ok(())
    }
    async fn begin(&self, pending: &Pending) -> Result<(), Error> {
        self.1.begin(pending)
    }
    async fn end(&self, chain: &str) -> Result<(), Error> {
        self.1.end(chain)
    }
    async fn pending(&self) -> Result<Vec<Pending>, Error> {
        self.1.all()
    }
    async fn pending_of(&self, chain: &str) -> Result<Option<Pending>, Error> {
        self.1.get(chain)
    }
}
