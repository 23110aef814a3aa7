//! [`DirJournal`]: each chain in a file of its own, each pending payment in a file of its own.

use std::path::PathBuf;
#[cfg(test)]
use std::sync::Arc;

use async_trait::async_trait;

use super::holders::Holders;
use super::{Journal, Pending};
use crate::Error;
use crate::envelope::{Mandate, Signed};

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
    holders: Holders,
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
            holders: Holders::in_folder(dir.join(".holders")),
            dir,
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

pub(super) fn io(path: &std::path::Path, e: impl std::fmt::Display) -> Error {
    Error::Storage(format!("{}: {e}", path.display()))
}

pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Storage(format!("journal task: {e}")))?
}

#[async_trait]
impl Journal for DirJournal {
    fn holder(&self) -> Option<String> {
        self.holders.mine()
    }

    fn holder_alive(&self, holder: &str) -> bool {
        self.holders.alive(holder)
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
                    let text = match std::fs::read_to_string(&path) {
                        Ok(t) => t,
                        // Ended by another call between the listing and the read: no longer
                        // pending.
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(io(&path, e)),
                    };
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pending(chain: &str) -> Pending {
        Pending {
            chain: chain.into(),
            quote: "q".into(),
            confirmation: None,
            rail: "house".into(),
            op: format!("op-{chain}"),
            since: 1,
            resource: None,
            request: None,
            unknown: false,
            proof: None,
            holder: None,
        }
    }

    /// Found by the bench (64 concurrent paid requests, the journal in a folder): a payment
    /// ended between the folder's listing and the read of its file made `pending` fail, and
    /// with it every concurrent request looking for an earlier payment of its own.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn pending_is_read_while_other_payments_begin_and_end() {
        let dir = tempfile::tempdir().unwrap();
        let j = Arc::new(DirJournal::new(dir.path()).unwrap());
        let churn = {
            let j = j.clone();
            tokio::spawn(async move {
                for round in 0..100 {
                    for i in 0..16 {
                        let c = format!("c{round}-{i}");
                        j.begin(&pending(&c)).await.unwrap();
                        j.end(&c).await.unwrap();
                    }
                }
            })
        };
        while !churn.is_finished() {
            j.pending().await.unwrap();
        }
        churn.await.unwrap();
        assert!(j.pending().await.unwrap().is_empty());
    }
}
