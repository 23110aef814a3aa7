//! Where a wallet keeps its audit chains (I5): every object of a payment, in chain order —
//! and, from before the rail is asked until the Proof is signed, the payment as pending.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::Error;
use crate::envelope::{Mandate, Resource, Signed};

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

/// Keeps each chain in a file `<dir>/<chain>.jws`, one compact JWS per line (the input of
/// `stipendex verify-chain`), and each pending payment in `<dir>/<chain>.pending` (JSON,
/// written to a temporary file and renamed into place, so it is whole or absent).
///
/// A process that makes payments holds an exclusive lock on a file of its own under
/// `<dir>/.holders/` for as long as it runs (the operating system releases it when the process
/// ends, however it ends): another process finds a payment it left and takes it over at once.
#[derive(Clone, Debug)]
pub struct DirJournal {
    dir: PathBuf,
    holder: std::sync::Arc<std::sync::OnceLock<Option<(String, std::fs::File)>>>,
}

impl DirJournal {
    /// Keeps chains under `dir` (created if missing).
    ///
    /// # Errors
    /// [`Error::Io`].
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            path: dir.display().to_string(),
            source,
        })?;
        Ok(DirJournal {
            dir,
            holder: std::sync::Arc::default(),
        })
    }

    /// The file of chain `chain`.
    #[must_use]
    pub fn path(&self, chain: &str) -> PathBuf {
        self.dir.join(format!("{chain}.jws"))
    }

    /// The mark of the mandate of id `id` (`<dir>/.mandates/<id>`).
    fn mark_path(&self, id: &str) -> Result<PathBuf, Error> {
        crate::envelope::check_id(id, "m_")
            .map_err(|e| Error::Malformed(format!("mandate id: {e}")))?;
        Ok(self.dir.join(".mandates").join(id))
    }
}

fn io(path: &std::path::Path, e: impl std::fmt::Display) -> Error {
    Error::Storage(format!("{}: {e}", path.display()))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Storage(format!("journal task: {e}")))?
}

/// This process's lock file under `dir`, locked (`None` if it cannot be made: payments are then
/// taken over after their lease, as without a holder).
fn lock_holder(dir: &std::path::Path) -> Option<(String, std::fs::File)> {
    let holders = dir.join(".holders");
    std::fs::create_dir_all(&holders).ok()?;
    // Locks of processes that ended are removed on the way.
    if let Ok(entries) = std::fs::read_dir(&holders) {
        for e in entries.flatten() {
            let path = e.path();
            if let Ok(f) = std::fs::File::open(&path)
                && f.try_lock().is_ok()
            {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let name = format!(
        "{}-{}.lock",
        std::process::id(),
        hex::encode(rand::random::<[u8; 4]>())
    );
    let path = holders.join(name);
    let file = std::fs::File::create(&path).ok()?;
    file.lock().ok()?;
    Some((path.display().to_string(), file))
}

#[async_trait]
impl Journal for DirJournal {
    fn holder(&self) -> Option<String> {
        self.holder
            .get_or_init(|| lock_holder(&self.dir))
            .as_ref()
            .map(|(path, _)| path.clone())
    }

    fn holder_alive(&self, holder: &str) -> bool {
        if self.holder().as_deref() == Some(holder) {
            return true;
        }
        let path = std::path::Path::new(holder);
        // Only this journal's own lock files are looked at.
        if path.parent() != Some(self.dir.join(".holders").as_path()) {
            return true;
        }
        match std::fs::File::open(path) {
            Ok(f) => f.try_lock().is_err(),
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        }
    }

    async fn record(&self, chain: &str, jws: &str) -> Result<(), Error> {
        use std::io::Write as _;
        let path = self.path(chain);
        let jws = jws.trim().to_owned();
        blocking(move || {
            match std::fs::read_to_string(&path) {
                Ok(text) if text.lines().any(|l| l.trim() == jws) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(&path, e)),
            }
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(format!("{jws}\n").as_bytes()))
                .map_err(|e| io(&path, e))
        })
        .await
    }

    async fn append(&self, chain: &str, jws: &str) -> Result<(), Error> {
        use std::io::Write as _;
        let path = self.path(chain);
        let line = format!("{}\n", jws.trim());
        blocking(move || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(line.as_bytes()))
                .map_err(|e| io(&path, e))
        })
        .await
    }

    async fn begin(&self, pending: &Pending) -> Result<(), Error> {
        use std::io::Write as _;
        let path = self.dir.join(format!("{}.pending", pending.chain));
        let tmp = self.dir.join(format!("{}.pending.tmp", pending.chain));
        let text = serde_json::to_string_pretty(pending).map_err(|e| io(&path, e))?;
        blocking(move || {
            std::fs::File::create(&tmp)
                .and_then(|mut f| {
                    f.write_all(text.as_bytes())?;
                    f.sync_all()
                })
                .and_then(|()| std::fs::rename(&tmp, &path))
                .map_err(|e| io(&path, e))
        })
        .await
    }

    async fn end(&self, chain: &str) -> Result<(), Error> {
        let path = self.dir.join(format!("{chain}.pending"));
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&path, e)),
        })
        .await
    }

    async fn pending(&self) -> Result<Vec<Pending>, Error> {
        let dir = self.dir.clone();
        blocking(move || {
            let mut out = Vec::new();
            for entry in std::fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
                let path = entry.map_err(|e| io(&dir, e))?.path();
                if path.extension().is_some_and(|x| x == "pending") {
                    let text = std::fs::read_to_string(&path).map_err(|e| io(&path, e))?;
                    out.push(serde_json::from_str::<Pending>(&text).map_err(|e| io(&path, e))?);
                }
            }
            out.sort_by_key(|p| p.since);
            Ok(out)
        })
        .await
    }

    async fn has_mandate(&self, mandate: &Signed<Mandate>) -> Result<Option<bool>, Error> {
        let mark = self.mark_path(&mandate.object().id)?;
        let dir = self.dir.clone();
        let jws = mandate.jws().to_owned();
        let this = self.clone();
        let found = blocking(move || {
            if mark.exists() {
                return Ok(true);
            }
            // No mark (a journal written before marks were kept): its chains say.
            for entry in std::fs::read_dir(&dir).map_err(|e| io(&dir, e))? {
                let path = entry.map_err(|e| io(&dir, e))?.path();
                if path.extension().is_some_and(|x| x == "jws")
                    && let Ok(text) = std::fs::read_to_string(&path)
                    && text.lines().any(|l| l.trim() == jws)
                {
                    return Ok(true);
                }
            }
            Ok(false)
        })
        .await?;
        if found {
            this.mark_mandate(mandate).await?;
        }
        Ok(Some(found))
    }

    async fn mark_mandate(&self, mandate: &Signed<Mandate>) -> Result<(), Error> {
        let mark = self.mark_path(&mandate.object().id)?;
        let digest = mandate.digest().as_str().to_owned();
        blocking(move || {
            if let Some(parent) = mark.parent() {
                std::fs::create_dir_all(parent).map_err(|e| io(parent, e))?;
            }
            std::fs::write(&mark, format!("{digest}\n")).map_err(|e| io(&mark, e))
        })
        .await
    }

    async fn pending_of(&self, chain: &str) -> Result<Option<Pending>, Error> {
        let path = self.dir.join(format!("{chain}.pending"));
        blocking(move || match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .map(Some)
                .map_err(|e| io(&path, e)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io(&path, e)),
        })
        .await
    }
}
