//! [`PgJournal`]: the chains and the pending payments as tables of the wallet's PostgreSQL
//! store, each of the journal's steps one statement (one round trip, one commit).

use async_trait::async_trait;
use sqlx::postgres::PgPool;

use super::{Journal, Pending, Then, by_chain, digest, resource_key, storage};
use crate::Error;
use crate::envelope::{Mandate, Resource, Signed};

/// The journal's tables, made under an advisory lock (several processes may open one
/// database at once). `proof` is the Proof a pending payment holds, for
/// [`Then::EndIfProof`] without reading its body.
const SCHEMA: [&str; 5] = [
    "SELECT pg_advisory_xact_lock(7262897412)",
    "CREATE TABLE IF NOT EXISTS stipendex_chain (
        seq    BIGSERIAL PRIMARY KEY,
        chain  TEXT NOT NULL,
        digest BYTEA NOT NULL,
        jws    TEXT NOT NULL,
        UNIQUE (chain, digest))",
    "CREATE TABLE IF NOT EXISTS stipendex_pending (
        chain    TEXT PRIMARY KEY,
        since    BIGINT NOT NULL,
        body     TEXT NOT NULL,
        resource TEXT,
        request  TEXT,
        proof    TEXT)",
    "CREATE INDEX IF NOT EXISTS stipendex_pending_resource
        ON stipendex_pending (resource, request) WHERE resource IS NOT NULL",
    "CREATE TABLE IF NOT EXISTS stipendex_mandate (
        id     TEXT PRIMARY KEY,
        digest TEXT NOT NULL)",
];

/// The objects of a step, in order (`$1` the chain, `$2` their digests, `$3` the objects): a
/// chain keeps one copy of each, in its first place. A macro, so that each statement below is
/// one literal.
macro_rules! objects {
    () => {
        "INSERT INTO stipendex_chain (chain, digest, jws)
        SELECT $1, o.digest, o.jws
        FROM unnest($2::bytea[], $3::text[]) WITH ORDINALITY AS o (digest, jws, n)
        ORDER BY o.n
        ON CONFLICT (chain, digest) DO NOTHING"
    };
}

/// Keep: the objects alone.
const KEEP: &str = objects!();

/// Pending: the objects, then the chain's pending payment (`$4`…`$8`).
const PENDING: &str = concat!(
    "WITH objects AS (",
    objects!(),
    ") INSERT INTO stipendex_pending (chain, since, body, resource, request, proof)
    VALUES ($1, $4, $5, $6, $7, $8)
    ON CONFLICT (chain) DO UPDATE SET since = EXCLUDED.since, body = EXCLUDED.body,
        resource = EXCLUDED.resource, request = EXCLUDED.request, proof = EXCLUDED.proof"
);

/// End (`$4` NULL) or end if it holds the Proof `$4`: the objects, then the pending payment.
const END: &str = concat!(
    "WITH objects AS (",
    objects!(),
    ") DELETE FROM stipendex_pending WHERE chain = $1 AND ($4::text IS NULL OR proof = $4)"
);

/// The pending payments of one resource, less those recorded for another request of it.
const PENDING_FOR_REQUEST: &str = "SELECT body FROM stipendex_pending
    WHERE resource = $1 AND (request IS NULL OR request = $2) ORDER BY since, chain";

/// Keeps the chains and the pending payments in tables of a PostgreSQL database — in practice
/// the wallet's own `[store]` (`[wallet] journal = "store"`), on the store's pool. Each of the
/// journal's steps ([`Journal::record_then`]: the chain's objects and the pending payment's
/// next state) is one statement: one round trip and one commit, all of it or none, where a
/// [`super::DirJournal`] writes, `fsync`s and renames a file per record.
///
/// It names no holder ([`Journal::holder`]): a payment left pending by a process that ended
/// is taken over once its lease lapses.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), stipendex::Error> {
/// use stipendex::wallet::{Journal, PgJournal};
/// let journal = PgJournal::new(pool).await?;
/// journal.record("q_1-0a0b0c0d", "eyJ…").await?;
/// assert_eq!(journal.chain("q_1-0a0b0c0d").await?.len(), 1);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PgJournal {
    pool: PgPool,
}

impl PgJournal {
    /// The journal's tables in the database of `pool` (made if missing; the pool's
    /// `search_path` picks the schema).
    ///
    /// # Errors
    /// [`Error::Storage`] if the database cannot be reached or the tables made.
    pub async fn new(pool: PgPool) -> Result<Self, Error> {
        let mut tx = pool.begin().await.map_err(storage)?;
        for sql in SCHEMA {
            sqlx::query(sql).execute(&mut *tx).await.map_err(storage)?;
        }
        tx.commit().await.map_err(storage)?;
        Ok(PgJournal { pool })
    }

    /// Every chain of the journal in the database at `url`, read only (`stipendex
    /// verify-chain` on a wallet's PostgreSQL store): `(name, objects in order)`, chains in
    /// first-recorded order.
    ///
    /// # Errors
    /// [`Error::Storage`] if the database cannot be read or holds no journal.
    pub async fn read_chains(url: &str) -> Result<Vec<(String, Vec<String>)>, Error> {
        let pool = rail_core::keys::sql::postgres_pool(url, None)
            .await
            .map_err(storage)?;
        let present: bool = sqlx::query_scalar("SELECT to_regclass('stipendex_chain') IS NOT NULL")
            .fetch_one(&pool)
            .await
            .map_err(storage)?;
        if !present {
            return Err(Error::Storage(
                "the database holds no wallet journal (no stipendex_chain table)".into(),
            ));
        }
        let chains = PgJournal { pool: pool.clone() }.chains().await;
        pool.close().await;
        chains
    }

    /// The objects of chain `chain`, in the order they were recorded.
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub async fn chain(&self, chain: &str) -> Result<Vec<String>, Error> {
        sqlx::query_scalar("SELECT jws FROM stipendex_chain WHERE chain = $1 ORDER BY seq")
            .bind(chain)
            .fetch_all(&self.pool)
            .await
            .map_err(storage)
    }

    /// Every chain, `(name, objects in order)`, chains in first-recorded order (`stipendex
    /// verify-chain` on a wallet's PostgreSQL store).
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub async fn chains(&self) -> Result<Vec<(String, Vec<String>)>, Error> {
        let rows: Vec<(String, String)> =
            sqlx::query_as("SELECT chain, jws FROM stipendex_chain ORDER BY seq")
                .fetch_all(&self.pool)
                .await
                .map_err(storage)?;
        Ok(by_chain(rows))
    }

    /// The pending payments `sql` selects (their `body`), bound to `params`.
    async fn pendings(&self, sql: &str, params: &[&str]) -> Result<Vec<Pending>, Error> {
        let mut q = sqlx::query_scalar::<_, String>(sql);
        for p in params {
            q = q.bind(*p);
        }
        let bodies = q.fetch_all(&self.pool).await.map_err(storage)?;
        bodies
            .iter()
            .map(|b| serde_json::from_str(b).map_err(storage))
            .collect()
    }

    /// Records `objects` in `chain`, then does `then` to its pending payment: one statement.
    async fn step(&self, chain: &str, objects: &[&str], then: Then<'_>) -> Result<(), Error> {
        let jws: Vec<String> = objects.iter().map(|o| o.trim().to_owned()).collect();
        let digests: Vec<Vec<u8>> = jws.iter().map(|j| digest(j)).collect();
        let q = match then {
            Then::Keep => sqlx::query(KEEP).bind(chain).bind(digests).bind(jws),
            Then::Pending(p) => sqlx::query(PENDING)
                .bind(chain)
                .bind(digests)
                .bind(jws)
                .bind(i64::try_from(p.since).map_err(storage)?)
                .bind(serde_json::to_string(p).map_err(storage)?)
                .bind(p.resource.as_ref().map(resource_key).transpose()?)
                .bind(p.request.as_ref().map(|d| d.as_str().to_owned()))
                .bind(p.proof.clone()),
            Then::End => sqlx::query(END)
                .bind(chain)
                .bind(digests)
                .bind(jws)
                .bind(None::<String>),
            Then::EndIfProof(proof) => sqlx::query(END)
                .bind(chain)
                .bind(digests)
                .bind(jws)
                .bind(Some(proof.to_owned())),
        };
        q.execute(&self.pool).await.map(|_| ()).map_err(storage)
    }
}

#[async_trait]
impl Journal for PgJournal {
    async fn record(&self, chain: &str, jws: &str) -> Result<(), Error> {
        self.step(chain, &[jws], Then::Keep).await
    }

    async fn record_then(
        &self,
        chain: &str,
        objects: &[&str],
        then: Then<'_>,
    ) -> Result<(), Error> {
        self.step(chain, objects, then).await
    }

    async fn begin(&self, pending: &Pending) -> Result<(), Error> {
        self.step(&pending.chain, &[], Then::Pending(pending)).await
    }

    async fn end(&self, chain: &str) -> Result<(), Error> {
        self.step(chain, &[], Then::End).await
    }

    async fn pending(&self) -> Result<Vec<Pending>, Error> {
        self.pendings(
            "SELECT body FROM stipendex_pending ORDER BY since, chain",
            &[],
        )
        .await
    }

    async fn pending_for(&self, sent: &Resource) -> Result<Vec<Pending>, Error> {
        self.pendings(
            "SELECT body FROM stipendex_pending WHERE resource = $1 ORDER BY since, chain",
            &[&resource_key(sent)?],
        )
        .await
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
        .await
    }

    async fn pending_of(&self, chain: &str) -> Result<Option<Pending>, Error> {
        let body: Option<String> =
            sqlx::query_scalar("SELECT body FROM stipendex_pending WHERE chain = $1")
                .bind(chain)
                .fetch_optional(&self.pool)
                .await
                .map_err(storage)?;
        body.map(|b| serde_json::from_str(&b).map_err(storage))
            .transpose()
    }

    async fn has_mandate(&self, mandate: &Signed<Mandate>) -> Result<Option<bool>, Error> {
        let found: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM stipendex_mandate WHERE id = $1")
                .bind(&mandate.object().id)
                .fetch_optional(&self.pool)
                .await
                .map_err(storage)?;
        Ok(Some(found.is_some()))
    }

    async fn mark_mandate(&self, mandate: &Signed<Mandate>) -> Result<(), Error> {
        sqlx::query(
            "INSERT INTO stipendex_mandate (id, digest) VALUES ($1, $2)
            ON CONFLICT (id) DO UPDATE SET digest = EXCLUDED.digest",
        )
        .bind(&mandate.object().id)
        .bind(mandate.digest().as_str())
        .execute(&self.pool)
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

    /// A journal in a fresh schema of the test database, and the schema's name (dropped by
    /// [`done`]); `None` (skipped, loudly in CI) without PostgreSQL.
    async fn journal() -> Option<(PgJournal, String)> {
        let url = test_kit::localnet::postgres_url();
        let admin = match rail_core::keys::sql::postgres_pool(&url, None).await {
            Ok(p) => p,
            Err(e) => {
                test_kit::localnet::missing("PostgreSQL", &e.to_string());
                return None;
            }
        };
        let schema = format!("journal_{}", hex::encode(rand::random::<[u8; 6]>()));
        sqlx::query(&format!("CREATE SCHEMA {schema}"))
            .execute(&admin)
            .await
            .unwrap();
        let pool = rail_core::keys::sql::postgres_pool(&url, Some(&schema))
            .await
            .unwrap();
        Some((PgJournal::new(pool).await.unwrap(), schema))
    }

    async fn done(j: PgJournal, schema: &str) {
        let _ = sqlx::query(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&j.pool)
            .await;
    }

    #[tokio::test]
    async fn a_chain_keeps_each_object_once_in_the_order_recorded() {
        let Some((j, schema)) = journal().await else {
            return;
        };
        j.record("c1", "a").await.unwrap();
        j.record("c2", "x").await.unwrap();
        j.record_then("c1", &["b", "a", "c"], Then::Keep)
            .await
            .unwrap();
        // Recorded again after a crash: one copy, in its first place.
        j.record("c1", "a").await.unwrap();
        j.append("c1", " d\n").await.unwrap();
        assert_eq!(j.chain("c1").await.unwrap(), ["a", "b", "c", "d"]);
        assert_eq!(
            j.chains().await.unwrap(),
            [
                (
                    "c1".to_owned(),
                    vec!["a".into(), "b".into(), "c".into(), "d".into()]
                ),
                ("c2".to_owned(), vec!["x".to_owned()]),
            ]
        );
        done(j, &schema).await;
    }

    #[tokio::test]
    async fn record_then_sets_or_ends_the_pending_payment_as_told() {
        let Some((j, schema)) = journal().await else {
            return;
        };
        let p = pending("c", 1);
        j.record_then("c", &["quote"], Then::Pending(&p))
            .await
            .unwrap();
        assert_eq!(j.pending_of("c").await.unwrap(), Some(p.clone()));
        let mut paid = p.clone();
        paid.proof = Some("proof-1".into());
        j.record_then("c", &["proof-1"], Then::Pending(&paid))
            .await
            .unwrap();
        // Another Proof's answer leaves it; its own ends it.
        j.record_then("c", &["receipt-0"], Then::EndIfProof("proof-0"))
            .await
            .unwrap();
        assert_eq!(j.pending().await.unwrap(), [paid]);
        j.record_then("c", &["receipt-1"], Then::EndIfProof("proof-1"))
            .await
            .unwrap();
        assert!(j.pending().await.unwrap().is_empty());
        j.begin(&pending("d", 2)).await.unwrap();
        j.begin(&pending("e", 1)).await.unwrap();
        assert_eq!(
            j.pending()
                .await
                .unwrap()
                .into_iter()
                .map(|p| p.chain)
                .collect::<Vec<_>>(),
            ["e", "d"],
            "oldest first"
        );
        j.end("d").await.unwrap();
        j.end("d").await.unwrap();
        assert_eq!(j.pending().await.unwrap().len(), 1);
        assert_eq!(
            j.chain("c").await.unwrap(),
            ["quote", "proof-1", "receipt-0", "receipt-1"]
        );
        done(j, &schema).await;
    }

    /// An MCP tool's calls share one resource: a paid request reads only the payments of its
    /// own request and those recorded without one, oldest first.
    #[tokio::test]
    async fn pending_for_request_passes_by_the_other_requests_of_a_resource() {
        let Some((j, schema)) = journal().await else {
            return;
        };
        let tool = Resource {
            origin: "mcp://tools".into(),
            method: "tools/call".into(),
            path: "search".into(),
            query: None,
        };
        let other = Resource {
            path: "fetch".into(),
            ..tool.clone()
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
        let mut elsewhere = pending("elsewhere", 0);
        elsewhere.resource = Some(other.clone());
        j.begin(&elsewhere).await.unwrap();
        let chains = |v: Vec<Pending>| v.into_iter().map(|p| p.chain).collect::<Vec<_>>();
        assert_eq!(
            chains(j.pending_for_request(&tool, Some(&d("one"))).await.unwrap()),
            ["one-again", "old", "one"]
        );
        assert_eq!(
            chains(j.pending_for_request(&tool, None).await.unwrap()),
            ["one-again", "old", "two", "one"],
            "without a digest: every payment of the resource"
        );
        assert_eq!(chains(j.pending_for(&other).await.unwrap()), ["elsewhere"]);
        done(j, &schema).await;
    }

    /// A step is one statement: when its pending payment is refused, none of its objects stay.
    #[tokio::test]
    async fn a_step_that_fails_keeps_none_of_its_records() {
        let Some((j, schema)) = journal().await else {
            return;
        };
        sqlx::query("ALTER TABLE stipendex_pending ADD CONSTRAINT small CHECK (since < 1000)")
            .execute(&j.pool)
            .await
            .unwrap();
        let failed = j
            .record_then("c", &["quote", "proof"], Then::Pending(&pending("c", 5000)))
            .await;
        assert!(matches!(failed, Err(Error::Storage(_))), "{failed:?}");
        assert!(j.chain("c").await.unwrap().is_empty());
        assert!(j.pending().await.unwrap().is_empty());
        done(j, &schema).await;
    }

    #[tokio::test]
    async fn a_mandate_is_marked_once_and_found() {
        let Some((j, schema)) = journal().await else {
            return;
        };
        let principal = crate::envelope::SecretKey::generate();
        let m = crate::envelope::Mandate::draft(
            crate::envelope::Party {
                id: "p".into(),
                key: principal.public(),
            },
            crate::envelope::SecretKey::generate().public(),
            0,
            60,
        );
        let m = Signed::sign(m, &principal).unwrap();
        assert_eq!(j.has_mandate(&m).await.unwrap(), Some(false));
        j.mark_mandate(&m).await.unwrap();
        j.mark_mandate(&m).await.unwrap();
        assert_eq!(j.has_mandate(&m).await.unwrap(), Some(true));
        done(j, &schema).await;
    }
}
