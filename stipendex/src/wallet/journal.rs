//! Where a wallet keeps its audit chains (I5): every object of a payment, in chain order.

use std::path::PathBuf;
use std::sync::Mutex;

use async_trait::async_trait;
use sha2::{Digest as _, Sha256};

use crate::Error;

/// Keeps the signed objects of each payment. A chain is named by the Quote it pays; its
/// objects arrive in chain order (mandate, confirmation, quote, proof, receipt).
#[async_trait]
pub trait Journal: Send + Sync {
    /// Appends the compact JWS `jws` to chain `chain`.
    ///
    /// # Errors
    /// [`Error::Storage`].
    async fn record(&self, chain: &str, jws: &str) -> Result<(), Error>;
}

/// The name of the chain of `quote_id` from `receiver`: ids are unique per issuer only, so the
/// receiver is part of the name (`q_…-<8 hex of the receiver>`).
#[must_use]
pub fn chain_name(receiver: &str, quote_id: &str) -> String {
    let h = Sha256::digest(receiver.as_bytes());
    format!("{quote_id}-{}", hex::encode(h.get(..4).unwrap_or_default()))
}

/// Keeps nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoJournal;

#[async_trait]
impl Journal for NoJournal {
    async fn record(&self, _chain: &str, _jws: &str) -> Result<(), Error> {
        Ok(())
    }
}

/// Keeps chains in memory (tests, short-lived agents).
#[derive(Debug, Default)]
pub struct MemoryJournal(Mutex<Vec<(String, String)>>);

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
        self.0
            .lock()
            .map_err(|_| Error::Storage("journal lock poisoned".into()))?
            .push((chain.to_owned(), jws.to_owned()));
        Ok(())
    }
}

/// Keeps each chain in a file `<dir>/<chain>.jws`, one compact JWS per line: the input of
/// `stipendex verify-chain`.
#[derive(Clone, Debug)]
pub struct DirJournal {
    dir: PathBuf,
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
        Ok(DirJournal { dir })
    }

    /// The file of chain `chain`.
    #[must_use]
    pub fn path(&self, chain: &str) -> PathBuf {
        self.dir.join(format!("{chain}.jws"))
    }
}

#[async_trait]
impl Journal for DirJournal {
    async fn record(&self, chain: &str, jws: &str) -> Result<(), Error> {
        use std::io::Write as _;
        let path = self.path(chain);
        let line = format!("{jws}\n");
        let shown = path.display().to_string();
        tokio::task::spawn_blocking(move || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .and_then(|mut f| f.write_all(line.as_bytes()))
        })
        .await
        .map_err(|e| Error::Storage(format!("{shown}: {e}")))?
        .map_err(|e| Error::Storage(format!("{shown}: {e}")))
    }
}
