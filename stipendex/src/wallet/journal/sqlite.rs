//! [`SqliteJournal`]: the chains and the pending payments as tables of the wallet's own SQLite
//! store, so a payment's journal records join the commits of its spend records.

use std::path::Path;

use async_trait::async_trait;
use rail_core::sqlite::SqliteDb;
use rusqlite::{OptionalExtension as _, params};

use super::holders::Holders;
use super::{Journal, Pending, Then, by_chain, digest, resource_key, storage};
use crate::Error;
use crate::envelope::{Mandate, Resource, Signed};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS stipendex_chain (
    seq    INTEGER PRIMARY KEY,
    chain  TEXT NOT NULL,
    digest BLOB NOT NULL,
    jws    TEXT NOT NULL,
    UNIQUE (chain, digest)
);
CREATE TABLE IF NOT EXISTS stipendex_pending (
    chain    TEXT PRIMARY KEY,
    since    INTEGER NOT NULL,
    body     TEXT NOT NULL,
    resource TEXT,
    request  TEXT
);
CREATE INDEX IF NOT EXISTS stipendex_pending_resource
    ON stipendex_pending (resource) WHERE resource IS NOT NULL;
CREATE TABLE IF NOT EXISTS stipendex_mandate (
    id     TEXT PRIMARY KEY,
    digest TEXT NOT NULL
);
";

const INSERT: &str =
    "INSERT OR IGNORE INTO stipendex_chain (chain, digest, jws) VALUES (?1, ?2, ?3)";
const SET_PENDING: &str =
    "INSERT OR REPLACE INTO stipendex_pending (chain, since, body, resource, request)
    VALUES (?1, ?2, ?3, ?4, ?5)";
/// The pending payments of one resource, less those recorded for another request of it (a
/// row an earlier release wrote has no `request`: kept, and told apart by its body).
const PENDING_FOR_REQUEST: &str = "SELECT body FROM stipendex_pending
    WHERE resource = ?1 AND (request IS NULL OR request = ?2) ORDER BY since, chain";
const END: &str = "DELETE FROM stipendex_pending WHERE chain = ?1";
const PENDING_OF: &str = "SELECT body FROM stipendex_pending WHERE chain = ?1";

/// [`Then`], owned, for the writer.
enum Step {
    Keep,
    /// Since, the record, its resource's key, its request's digest.
    Pending(i64, String, Option<String>, Option<String>),
    End,
    EndIfProof(String),
}

/// Keeps the chains and the pending payments in tables of a SQLite file — in practice the
/// wallet's own store (`[wallet] journal = "store"`), whose writer it shares
/// ([`rail_core::sqlite::SqliteDb`] runs one writer per file in a process): its rows join the
/// batches of the spend records, so concurrent payments' journal and spend records are made
/// durable by shared commits, where a [`super::DirJournal`] adds a file, an fsync and a rename
/// per payment. One payment's steps still follow each other (its pending record before the
/// rail is asked, its chain after): [`Journal::record_then`] makes the chain's objects and the
/// pending payment's next state one step.
///
/// `stipendex verify-chain` reads the chains of such a file as it reads chain files.
///
/// The process's holder lock is a file in `<dir>/.<file name>.holders/` beside the database
/// (the operating system releases it when the process ends, however it ends), as for a
/// [`super::DirJournal`].
///
/// ```no_run
/// # async fn demo() -> Result<(), stipendex::Error> {
/// use stipendex::wallet::{Journal, SqliteJournal};
/// let journal = SqliteJournal::open(std::path::Path::new("wallet.db")).await?;
/// journal.record("q_1-0a0b0c0d", "eyJ…").await?;
/// assert_eq!(journal.chain("q_1-0a0b0c0d")?.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqliteJournal {
    db: SqliteDb,
    holders: Holders,
}

impl std::fmt::Debug for SqliteJournal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteJournal")
            .field("path", &self.db.path())
            .finish_non_exhaustive()
    }
}

/// A read-only connection to `path` (no WAL file is made for it where none is).
fn read_only(path: &Path) -> Result<rusqlite::Connection, Error> {
    rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| Error::Storage(format!("{}: {e}", path.display())))
}

/// Whether the database behind `c` has the journal's chain table.
fn has_chain_table(c: &rusqlite::Connection) -> Result<bool, Error> {
    c.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'stipendex_chain'",
        [],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
    .map_err(storage)
}

impl SqliteJournal {
    /// Opens (or creates) the journal's tables in the SQLite file at `path`.
    ///
    /// # Errors
    /// [`Error::Storage`] if the file cannot be opened or its tables made.
    pub async fn open(path: &Path) -> Result<Self, Error> {
        Self::on(SqliteDb::open(path).map_err(storage)?).await
    }

    /// The journal's tables in `db` (made if missing).
    ///
    /// # Errors
    /// [`Error::Storage`] if the tables cannot be made.
    pub async fn on(db: SqliteDb) -> Result<Self, Error> {
        db.write(|c| {
            c.execute_batch(SCHEMA)?;
            // A file an earlier release made: its pending payments had no request column.
            rail_core::sqlite::add_column_if_missing(c, "stipendex_pending", "request", "TEXT")
        })
        .await
        .map_err(storage)?;
        let path = db.path();
        let name = path.file_name().map_or_else(
            || "journal".to_owned(),
            |n| n.to_string_lossy().into_owned(),
        );
        let holders = path
            .parent()
            .unwrap_or(Path::new("."))
            .join(format!(".{name}.holders"));
        Ok(SqliteJournal {
            db,
            holders: Holders::in_folder(holders),
        })
    }

    /// Whether the file at `path` holds a journal's tables (read only; nothing is made).
    ///
    /// # Errors
    /// [`Error::Storage`] if the file cannot be read as a SQLite database.
    pub fn holds_chains(path: &Path) -> Result<bool, Error> {
        has_chain_table(&read_only(path)?)
    }

    /// Every chain of the journal in the file at `path`, read only (`stipendex verify-chain`
    /// on a wallet's store): `(name, objects in order)`, chains in first-recorded order.
    ///
    /// # Errors
    /// [`Error::Storage`] if the file cannot be read or holds no journal.
    pub fn read_chains(path: &Path) -> Result<Vec<(String, Vec<String>)>, Error> {
        let c = read_only(path)?;
        if !has_chain_table(&c)? {
            return Err(Error::Storage(format!(
                "{} holds no wallet journal (no stipendex_chain table)",
                path.display()
            )));
        }
        let mut s = c
            .prepare("SELECT chain, jws FROM stipendex_chain ORDER BY seq")
            .map_err(storage)?;
        let rows = s
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(storage)?;
        let rows = rows
            .collect::<rusqlite::Result<Vec<(String, String)>>>()
            .map_err(storage)?;
        Ok(by_chain(rows))
    }

    /// The objects of chain `chain`, in the order they were recorded.
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub fn chain(&self, chain: &str) -> Result<Vec<String>, Error> {
        self.db
            .read(|c| {
                let mut s = c.prepare_cached(
                    "SELECT jws FROM stipendex_chain WHERE chain = ?1 ORDER BY seq",
                )?;
                let rows = s.query_map([chain], |r| r.get::<_, String>(0))?;
                rows.collect()
            })
            .map_err(storage)
    }

    /// The names of the chains, in first-recorded order.
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub fn names(&self) -> Result<Vec<String>, Error> {
        self.db
            .read(|c| {
                let mut s = c.prepare(
                    "SELECT chain FROM stipendex_chain GROUP BY chain ORDER BY min(seq)",
                )?;
                let rows = s.query_map([], |r| r.get::<_, String>(0))?;
                rows.collect()
            })
            .map_err(storage)
    }

    /// The pending payments `sql` selects (their `body`), bound to `params`.
    fn pendings(&self, sql: &str, params: &[&str]) -> Result<Vec<Pending>, Error> {
        let bodies = self
            .db
            .read(|c| {
                c.prepare_cached(sql)?
                    .query_map(rusqlite::params_from_iter(params), |r| {
                        r.get::<_, String>(0)
                    })?
                    .collect::<rusqlite::Result<Vec<String>>>()
            })
            .map_err(storage)?;
        bodies
            .iter()
            .map(|b| serde_json::from_str(b).map_err(storage))
            .collect()
    }

    /// Records `objects` in `chain`, then does `then` to its pending payment: one write, one
    /// savepoint of the writer's batch (all of it, or none), answered once durable — or, with
    /// `durable` false, once committed ([`SqliteDb::write_deferred`]). Every change the journal
    /// makes is one of these.
    async fn step(
        &self,
        chain: &str,
        objects: &[&str],
        then: Then<'_>,
        durable: bool,
    ) -> Result<(), Error> {
        let chain = chain.to_owned();
        let objects: Vec<String> = objects.iter().map(|o| o.trim().to_owned()).collect();
        let then = match then {
            Then::Keep => Step::Keep,
            Then::Pending(p) => Step::Pending(
                i64::try_from(p.since).map_err(storage)?,
                serde_json::to_string(p).map_err(storage)?,
                p.resource.as_ref().map(resource_key).transpose()?,
                p.request.as_ref().map(|d| d.as_str().to_owned()),
            ),
            Then::End => Step::End,
            Then::EndIfProof(proof) => Step::EndIfProof(proof.to_owned()),
        };
        let write = move |c: &rusqlite::Connection| {
            let mut insert = c.prepare_cached(INSERT)?;
            for jws in &objects {
                insert.execute(params![chain, digest(jws), jws])?;
            }
            let end = match then {
                Step::Keep => false,
                Step::Pending(since, body, resource, request) => {
                    c.prepare_cached(SET_PENDING)?
                        .execute(params![chain, since, body, resource, request])?;
                    false
                }
                Step::End => true,
                Step::EndIfProof(proof) => c
                    .prepare_cached(PENDING_OF)?
                    .query_row([&chain], |r| r.get::<_, String>(0))
                    .optional()?
                    .and_then(|b| serde_json::from_str::<Pending>(&b).ok())
                    .is_some_and(|p| p.proof.as_deref() == Some(proof.as_str())),
            };
            if end {
                c.prepare_cached(END)?.execute([&chain])?;
            }
            Ok(())
        };
        if durable {
            self.db.write(write).await.map_err(storage)
        } else {
            self.db
                .write_deferred(write)
                .await
                .map(|((), _)| ())
                .map_err(storage)
        }
    }
}

#[async_trait]
impl Journal for SqliteJournal {
    fn file(&self) -> Option<&std::path::Path> {
        Some(self.db.path())
    }

    fn holder(&self) -> Option<String> {
        self.holders.mine()
    }

    fn holder_alive(&self, holder: &str) -> bool {
        self.holders.alive(holder)
    }

    async fn record(&self, chain: &str, jws: &str) -> Result<(), Error> {
        self.step(chain, &[jws], Then::Keep, true).await
    }

    // `append` is `record`: the unique (chain, digest) costs no lookup of the chain's rows.

    async fn append_deferred(&self, chain: &str, line: &str) -> Result<(), Error> {
        self.step(chain, &[line], Then::Keep, false).await
    }

    async fn record_then(
        &self,
        chain: &str,
        objects: &[&str],
        then: Then<'_>,
    ) -> Result<(), Error> {
        self.step(chain, objects, then, true).await
    }

    async fn begin(&self, pending: &Pending) -> Result<(), Error> {
        self.step(&pending.chain, &[], Then::Pending(pending), true)
            .await
    }

    async fn end(&self, chain: &str) -> Result<(), Error> {
        self.step(chain, &[], Then::End, true).await
    }

    async fn pending(&self) -> Result<Vec<Pending>, Error> {
        self.pendings(
            "SELECT body FROM stipendex_pending ORDER BY since, chain",
            &[],
        )
    }

    async fn pending_for(&self, sent: &Resource) -> Result<Vec<Pending>, Error> {
        self.pendings(
            "SELECT body FROM stipendex_pending WHERE resource = ?1 ORDER BY since, chain",
            &[&resource_key(sent)?],
        )
    }

    async fn pending_for_request(
        &self,
        sent: &Resource,
        request: Option<&crate::envelope::Digest>,
    ) -> Result<Vec<Pending>, Error> {
        let Some(request) = request else {
            return self.pending_for(sent).await;
        };
        self.pendings(
            PENDING_FOR_REQUEST,
            &[&resource_key(sent)?, request.as_str()],
        )
    }

    async fn pending_of(&self, chain: &str) -> Result<Option<Pending>, Error> {
        let body = self
            .db
            .read(|c| {
                c.prepare_cached(PENDING_OF)?
                    .query_row([chain], |r| r.get::<_, String>(0))
                    .optional()
            })
            .map_err(storage)?;
        body.map(|b| serde_json::from_str(&b).map_err(storage))
            .transpose()
    }

    async fn has_mandate(&self, mandate: &Signed<Mandate>) -> Result<Option<bool>, Error> {
        let id = mandate.object().id.clone();
        let found = self
            .db
            .read(|c| {
                c.prepare_cached("SELECT 1 FROM stipendex_mandate WHERE id = ?1")?
                    .query_row([&id], |_| Ok(()))
                    .optional()
            })
            .map_err(storage)?;
        Ok(Some(found.is_some()))
    }

    async fn mark_mandate(&self, mandate: &Signed<Mandate>) -> Result<(), Error> {
        let id = mandate.object().id.clone();
        let digest = mandate.digest().as_str().to_owned();
        self.db
            .write(move |c| {
                c.prepare_cached(
                    "INSERT OR REPLACE INTO stipendex_mandate (id, digest) VALUES (?1, ?2)",
                )?
                .execute(params![id, digest])
            })
            .await
            .map(|_| ())
            .map_err(storage)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::test_pending as pending;
    use super::*;

    /// A journal in `wallet.db` of a fresh folder (kept while the folder is).
    async fn journal() -> (tempfile::TempDir, SqliteJournal) {
        let dir = tempfile::tempdir().unwrap();
        let j = SqliteJournal::open(&dir.path().join("wallet.db"))
            .await
            .unwrap();
        (dir, j)
    }

    #[tokio::test]
    async fn a_chain_keeps_each_object_once_in_the_order_recorded() {
        let (dir, j) = journal().await;
        j.record("c1", "a").await.unwrap();
        j.record("c2", "x").await.unwrap();
        j.record("c1", "b").await.unwrap();
        // Recorded again after a crash: one copy, in its first place.
        j.record("c1", "a").await.unwrap();
        j.append("c1", "c").await.unwrap();
        assert_eq!(j.chain("c1").unwrap(), ["a", "b", "c"]);
        assert_eq!(j.chain("c2").unwrap(), ["x"]);
        assert!(j.chain("none").unwrap().is_empty());
        assert_eq!(j.names().unwrap(), ["c1", "c2"]);
        let read = SqliteJournal::read_chains(&dir.path().join("wallet.db")).unwrap();
        assert_eq!(
            read,
            [
                (
                    "c1".to_owned(),
                    vec!["a".to_owned(), "b".into(), "c".into()]
                ),
                ("c2".to_owned(), vec!["x".to_owned()]),
            ]
        );
    }

    #[tokio::test]
    async fn a_deferred_line_keeps_its_place_and_is_durable_with_the_next_write() {
        let (_dir, j) = journal().await;
        j.append("tab", "voucher-1").await.unwrap();
        j.append_deferred("tab", "result-1").await.unwrap();
        // Seen at once, in its place.
        assert_eq!(j.chain("tab").unwrap(), ["voucher-1", "result-1"]);
        j.append("tab", "voucher-2").await.unwrap();
        assert_eq!(
            j.chain("tab").unwrap(),
            ["voucher-1", "result-1", "voucher-2"]
        );
        assert!(
            j.db.durable_through() >= j.db.last_commit(),
            "the next durable write left the deferred line undurable"
        );
    }

    #[tokio::test]
    async fn pending_payments_outlive_the_process_and_end_once_finished() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wallet.db");
        {
            let j = SqliteJournal::open(&path).await.unwrap();
            j.begin(&pending("late", 20)).await.unwrap();
            j.begin(&pending("early", 10)).await.unwrap();
            let mut replaced = pending("late", 20);
            replaced.unknown = true;
            j.begin(&replaced).await.unwrap();
            j.record("early", "quote").await.unwrap();
        }
        // Every handle dropped: the file is closed, its writer gone. Opened again:
        let j = SqliteJournal::open(&path).await.unwrap();
        let all = j.pending().await.unwrap();
        assert_eq!(
            all.iter().map(|p| p.chain.as_str()).collect::<Vec<_>>(),
            ["early", "late"],
            "oldest first"
        );
        assert!(
            j.pending_of("late").await.unwrap().unwrap().unknown,
            "replaced"
        );
        assert_eq!(j.chain("early").unwrap(), ["quote"]);
        j.end("early").await.unwrap();
        j.end("early").await.unwrap();
        assert_eq!(j.pending_of("early").await.unwrap(), None);
        assert_eq!(j.pending().await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn record_then_sets_or_ends_the_pending_payment_as_told() {
        let (_dir, j) = journal().await;
        j.begin(&pending("c", 1)).await.unwrap();
        let mut paid = pending("c", 1);
        paid.proof = Some("proof-1".into());
        j.record_then("c", &["m", "q", "proof-1"], Then::Pending(&paid))
            .await
            .unwrap();
        assert_eq!(j.pending_of("c").await.unwrap(), Some(paid));
        // Another request's answer does not end it; its own does.
        j.record_then("c", &["receipt-0"], Then::EndIfProof("proof-0"))
            .await
            .unwrap();
        assert!(j.pending_of("c").await.unwrap().is_some());
        j.record_then("c", &["receipt-1"], Then::EndIfProof("proof-1"))
            .await
            .unwrap();
        assert_eq!(j.pending_of("c").await.unwrap(), None);
        assert_eq!(
            j.chain("c").unwrap(),
            ["m", "q", "proof-1", "receipt-0", "receipt-1"]
        );
        j.begin(&pending("d", 2)).await.unwrap();
        j.record_then("d", &["x"], Then::End).await.unwrap();
        j.record_then("d", &["y"], Then::Keep).await.unwrap();
        assert_eq!(j.pending().await.unwrap(), []);
        assert_eq!(j.chain("d").unwrap(), ["x", "y"]);
    }

    /// A paid request looks only at the payments of its own resource (the index), as the
    /// default `pending_for` does by reading them all.
    #[tokio::test]
    async fn pending_for_finds_the_payments_of_one_resource_only() {
        let (_dir, j) = journal().await;
        let res = |path: &str| Resource {
            origin: "https://shop.example".into(),
            method: "GET".into(),
            path: path.into(),
            query: None,
        };
        for (chain, since, path) in [("a", 3, Some("/a")), ("b", 2, Some("/b")), ("c", 1, None)] {
            let mut p = pending(chain, since);
            p.resource = path.map(res);
            j.begin(&p).await.unwrap();
        }
        let mut again = pending("a2", 1);
        again.resource = Some(res("/a"));
        j.begin(&again).await.unwrap();
        let found = j.pending_for(&res("/a")).await.unwrap();
        assert_eq!(
            found.iter().map(|p| p.chain.as_str()).collect::<Vec<_>>(),
            ["a2", "a"],
            "oldest first"
        );
        let mut all = j.pending().await.unwrap();
        all.retain(|p| p.resource.as_ref() == Some(&res("/a")));
        assert_eq!(all, found, "what the default finds");
        j.end("a").await.unwrap();
        assert_eq!(j.pending_for(&res("/a")).await.unwrap().len(), 1);
        assert!(j.pending_for(&res("/none")).await.unwrap().is_empty());
    }

    /// An MCP tool's calls share one resource: a paid request reads only the payments of its
    /// own request (its digest) and those recorded without one (earlier releases), oldest
    /// first, as the default `pending_for_request` finds them by reading every payment of the
    /// resource.
    #[tokio::test]
    async fn pending_for_request_passes_by_the_other_requests_of_a_resource() {
        let (_dir, j) = journal().await;
        let tool = Resource {
            origin: "mcp://tools".into(),
            method: "tools/call".into(),
            path: "search".into(),
            query: None,
        };
        let d = |q: &str| crate::envelope::Digest::of(q.as_bytes());
        for (chain, since, request) in [
            ("one", 4, Some("one")),
            ("two", 3, Some("two")),
            ("old", 2, None),
            ("one-again", 1, Some("one")),
        ] {
            let mut p = pending(chain, since);
            p.resource = Some(tool.clone());
            p.request = request.map(d);
            j.begin(&p).await.unwrap();
        }
        let chains = |v: Vec<Pending>| v.into_iter().map(|p| p.chain).collect::<Vec<_>>();
        let found = j.pending_for_request(&tool, Some(&d("one"))).await.unwrap();
        assert_eq!(chains(found.clone()), ["one-again", "old", "one"]);
        let by_default = NoFilter(&j)
            .pending_for_request(&tool, Some(&d("one")))
            .await
            .unwrap();
        assert_eq!(found, by_default, "what the default finds");
        assert_eq!(
            chains(j.pending_for_request(&tool, None).await.unwrap()),
            ["one-again", "old", "two", "one"],
            "without a digest: every payment of the resource"
        );
    }

    /// The trait's defaults over a journal's `pending`.
    struct NoFilter<'a>(&'a SqliteJournal);

    #[async_trait]
    impl Journal for NoFilter<'_> {
        async fn record(&self, _: &str, _: &str) -> Result<(), Error> {
            unreachable!()
        }
        async fn begin(&self, _: &Pending) -> Result<(), Error> {
            unreachable!()
        }
        async fn end(&self, _: &str) -> Result<(), Error> {
            unreachable!()
        }
        async fn pending(&self) -> Result<Vec<Pending>, Error> {
            self.0.pending().await
        }
    }

    /// A journal file an earlier release made (its pending table without `request`) opens
    /// with the column added, and its pending payment is still found for its request.
    #[tokio::test]
    async fn a_journal_an_earlier_release_made_gains_the_request_column() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wallet.db");
        let tool = Resource {
            origin: "mcp://tools".into(),
            method: "tools/call".into(),
            path: "search".into(),
            query: None,
        };
        {
            let c = rusqlite::Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE stipendex_pending (
                    chain TEXT PRIMARY KEY, since INTEGER NOT NULL, body TEXT NOT NULL,
                    resource TEXT)",
            )
            .unwrap();
            let mut p = pending("old", 1);
            p.resource = Some(tool.clone());
            c.execute(
                "INSERT INTO stipendex_pending VALUES ('old', 1, ?1, ?2)",
                params![
                    serde_json::to_string(&p).unwrap(),
                    resource_key(&tool).unwrap()
                ],
            )
            .unwrap();
        }
        let j = SqliteJournal::open(&path).await.unwrap();
        let d = crate::envelope::Digest::of(b"one");
        let found = j.pending_for_request(&tool, Some(&d)).await.unwrap();
        assert_eq!(
            found.len(),
            1,
            "a payment recorded without a digest is kept"
        );
        assert_eq!(found[0].chain, "old");
        let mut new = pending("new", 2);
        new.resource = Some(tool.clone());
        new.request = Some(crate::envelope::Digest::of(b"two"));
        j.begin(&new).await.unwrap();
        assert_eq!(
            j.pending_for_request(&tool, Some(&d)).await.unwrap().len(),
            1
        );
        assert_eq!(j.pending_for(&tool).await.unwrap().len(), 2);
    }

    /// One step, one commit: a step whose last statement fails keeps none of its records.
    #[tokio::test]
    async fn a_step_that_fails_keeps_none_of_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wallet.db");
        let j = SqliteJournal::open(&path).await.unwrap();
        j.begin(&pending("c", 1)).await.unwrap();
        // The pending table gone: setting the pending payment fails, after the objects.
        rail_core::sqlite::SqliteDb::open(&path)
            .unwrap()
            .write(|c| c.execute_batch("DROP TABLE stipendex_pending"))
            .await
            .unwrap();
        let e = j
            .record_then("c", &["m", "q"], Then::Pending(&pending("c", 1)))
            .await;
        assert!(matches!(e, Err(Error::Storage(_))), "{e:?}");
        assert!(
            j.chain("c").unwrap().is_empty(),
            "none of the step's objects"
        );
    }

    #[tokio::test]
    async fn a_holder_is_alive_while_its_journal_is_and_not_after() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wallet.db");
        let a = SqliteJournal::open(&path).await.unwrap();
        let b = SqliteJournal::open(&path).await.unwrap();
        let name = a.holder().unwrap();
        assert_ne!(b.holder().unwrap(), name, "one lock per journal");
        assert!(b.holder_alive(&name));
        // A path outside the journal's holders is never judged dead.
        assert!(b.holder_alive("/tmp/elsewhere.lock"));
        drop(a);
        assert!(!b.holder_alive(&name), "its lock was released with it");
    }

    #[tokio::test]
    async fn a_mandate_is_marked_and_the_file_says_it_holds_chains() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wallet.db");
        let key = crate::envelope::SecretKey::generate();
        let m = crate::envelope::Mandate::draft(
            crate::envelope::Party {
                id: "p".into(),
                key: key.public(),
            },
            key.public(),
            1,
            60,
        );
        let m = Signed::sign(m, &key).unwrap();
        let j = SqliteJournal::open(&path).await.unwrap();
        assert_eq!(j.has_mandate(&m).await.unwrap(), Some(false));
        j.mark_mandate(&m).await.unwrap();
        assert_eq!(j.has_mandate(&m).await.unwrap(), Some(true));
        assert!(SqliteJournal::holds_chains(&path).unwrap());
        let other = dir.path().join("other.db");
        rail_core::sqlite::SqliteDb::open(&other).unwrap();
        assert!(!SqliteJournal::holds_chains(&other).unwrap());
    }
}
