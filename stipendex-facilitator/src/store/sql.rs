//! The SQL of [`super`]: the same statements on SQLite and PostgreSQL.

use rail_core::{RailError, RailResult, Timestamp};
use sqlx::Row as _;

use super::{AccountRecord, ReviewRecord, ReviewState};

fn storage(e: &sqlx::Error) -> RailError {
    RailError::Storage(e.to_string())
}

const ACCOUNTS: &str = "CREATE TABLE IF NOT EXISTS facilitator_accounts (
    id TEXT PRIMARY KEY, public_key TEXT NOT NULL, review_above BIGINT,
    label TEXT NOT NULL, created_at BIGINT NOT NULL)";
const REVIEWS: &str = "CREATE TABLE IF NOT EXISTS facilitator_reviews (
    payment_id TEXT PRIMARY KEY, payer TEXT NOT NULL, payee TEXT NOT NULL,
    amount BIGINT NOT NULL, asset TEXT NOT NULL, mode TEXT NOT NULL, offer_id TEXT NOT NULL,
    offer_expires_at BIGINT NOT NULL, reason TEXT NOT NULL, state TEXT NOT NULL, created_at BIGINT NOT NULL,
    decided_at BIGINT, decided_by TEXT, note TEXT)";
const REVIEWS_INDEX: &str = "CREATE INDEX IF NOT EXISTS facilitator_reviews_state ON facilitator_reviews (state, created_at)";

const UPSERT_ACCOUNT: &str =
    "INSERT INTO facilitator_accounts (id, public_key, review_above, label, created_at)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (id) DO UPDATE SET public_key = EXCLUDED.public_key,
        review_above = EXCLUDED.review_above, label = EXCLUDED.label";
const GET_ACCOUNT: &str = "SELECT id, public_key, review_above, label, created_at FROM facilitator_accounts WHERE id = $1";
const LIST_ACCOUNTS: &str = "SELECT id, public_key, review_above, label, created_at FROM facilitator_accounts ORDER BY created_at, id";
const INSERT_REVIEW: &str = "INSERT INTO facilitator_reviews
    (payment_id, payer, payee, amount, asset, mode, offer_id, offer_expires_at, reason, state, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', $10) ON CONFLICT (payment_id) DO NOTHING";
const REVIEW_COLUMNS: &str =
    "payment_id, payer, payee, amount, asset, mode, offer_id, offer_expires_at, reason, state,
    created_at, decided_at, decided_by, note";
const DECIDE: &str =
    "UPDATE facilitator_reviews SET state = $1, decided_at = $2, decided_by = $3, note = $4
    WHERE payment_id = $5 AND state = 'pending'";

/// The database under the facilitator's records.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Pool {
    /// One instance on a SQLite file.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
    /// Several instances on one PostgreSQL database.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

/// Runs `$body` with `$p` bound to the concrete pool.
macro_rules! on_pool {
    ($pool:expr, $p:ident => $body:expr) => {
        match $pool {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite($p) => $body,
            #[cfg(feature = "postgres")]
            Pool::Postgres($p) => $body,
        }
    };
}

macro_rules! account_of {
    ($row:expr) => {{
        let r = $row;
        AccountRecord {
            id: r.try_get("id").map_err(|e| storage(&e))?,
            public_key: r.try_get("public_key").map_err(|e| storage(&e))?,
            review_above: r.try_get("review_above").map_err(|e| storage(&e))?,
            label: r.try_get("label").map_err(|e| storage(&e))?,
            created_at: Timestamp(r.try_get("created_at").map_err(|e| storage(&e))?),
        }
    }};
}

macro_rules! review_of {
    ($row:expr) => {{
        let r = $row;
        let state: String = r.try_get("state").map_err(|e| storage(&e))?;
        ReviewRecord {
            payment_id: r.try_get("payment_id").map_err(|e| storage(&e))?,
            payer: r.try_get("payer").map_err(|e| storage(&e))?,
            payee: r.try_get("payee").map_err(|e| storage(&e))?,
            amount: r.try_get("amount").map_err(|e| storage(&e))?,
            asset: r.try_get("asset").map_err(|e| storage(&e))?,
            mode: r.try_get("mode").map_err(|e| storage(&e))?,
            offer_id: r.try_get("offer_id").map_err(|e| storage(&e))?,
            offer_expires_at: Timestamp(r.try_get("offer_expires_at").map_err(|e| storage(&e))?),
            reason: r.try_get("reason").map_err(|e| storage(&e))?,
            state: ReviewState::parse(&state)?,
            created_at: Timestamp(r.try_get("created_at").map_err(|e| storage(&e))?),
            decided_at: r
                .try_get::<Option<i64>, _>("decided_at")
                .map_err(|e| storage(&e))?
                .map(Timestamp),
            decided_by: r.try_get("decided_by").map_err(|e| storage(&e))?,
            note: r.try_get("note").map_err(|e| storage(&e))?,
        }
    }};
}

impl Pool {
    /// `sqlite` or `postgres`.
    #[must_use]
    pub fn backend(&self) -> &'static str {
        match self {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(_) => "sqlite",
            #[cfg(feature = "postgres")]
            Pool::Postgres(_) => "postgres",
        }
    }

    /// Creates the tables if missing (PostgreSQL: serialized across instances).
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn migrate(&self) -> RailResult<()> {
        match self {
            #[cfg(feature = "sqlite")]
            Pool::Sqlite(p) => {
                for sql in [ACCOUNTS, REVIEWS, REVIEWS_INDEX] {
                    sqlx::query(sql).execute(p).await.map_err(|e| storage(&e))?;
                }
            }
            #[cfg(feature = "postgres")]
            Pool::Postgres(p) => {
                let mut tx = p.begin().await.map_err(|e| storage(&e))?;
                for sql in [
                    "SELECT pg_advisory_xact_lock(7262897412)",
                    ACCOUNTS,
                    REVIEWS,
                    REVIEWS_INDEX,
                ] {
                    sqlx::query(sql)
                        .execute(&mut *tx)
                        .await
                        .map_err(|e| storage(&e))?;
                }
                tx.commit().await.map_err(|e| storage(&e))?;
            }
        }
        Ok(())
    }

    /// Answers when the database does.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn ping(&self) -> RailResult<()> {
        on_pool!(self, p => sqlx::query("SELECT 1").execute(p).await.map(drop).map_err(|e| storage(&e)))
    }

    /// Registers an account, or replaces its key, threshold and label.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn put_account(&self, a: &AccountRecord) -> RailResult<()> {
        on_pool!(self, p => sqlx::query(UPSERT_ACCOUNT)
            .bind(&a.id)
            .bind(&a.public_key)
            .bind(a.review_above)
            .bind(&a.label)
            .bind(a.created_at.0)
            .execute(p)
            .await
            .map(drop)
            .map_err(|e| storage(&e)))
    }

    /// One account.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn account(&self, id: &str) -> RailResult<Option<AccountRecord>> {
        on_pool!(self, p => {
            let row = sqlx::query(GET_ACCOUNT).bind(id).fetch_optional(p).await.map_err(|e| storage(&e))?;
            Ok(match row { Some(r) => Some(account_of!(r)), None => None })
        })
    }

    /// Every account.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn accounts(&self) -> RailResult<Vec<AccountRecord>> {
        on_pool!(self, p => {
            let rows = sqlx::query(LIST_ACCOUNTS).fetch_all(p).await.map_err(|e| storage(&e))?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows { out.push(account_of!(r)); }
            Ok(out)
        })
    }

    /// Puts a payment in the queue (nothing if it is there already).
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn queue_review(&self, r: &ReviewRecord) -> RailResult<()> {
        on_pool!(self, p => sqlx::query(INSERT_REVIEW)
            .bind(&r.payment_id)
            .bind(&r.payer)
            .bind(&r.payee)
            .bind(r.amount)
            .bind(&r.asset)
            .bind(&r.mode)
            .bind(&r.offer_id)
            .bind(r.offer_expires_at.0)
            .bind(&r.reason)
            .bind(r.created_at.0)
            .execute(p)
            .await
            .map(drop)
            .map_err(|e| storage(&e)))
    }

    /// One payment's review, if it went to review.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn review(&self, payment_id: &str) -> RailResult<Option<ReviewRecord>> {
        let sql = format!("SELECT {REVIEW_COLUMNS} FROM facilitator_reviews WHERE payment_id = $1");
        on_pool!(self, p => {
            let row = sqlx::query(&sql).bind(payment_id).fetch_optional(p).await.map_err(|e| storage(&e))?;
            Ok(match row { Some(r) => Some(review_of!(r)), None => None })
        })
    }

    /// The queue: reviews in `state` (every state when `None`), oldest first, at most `limit`.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn reviews(
        &self,
        state: Option<ReviewState>,
        limit: i64,
    ) -> RailResult<Vec<ReviewRecord>> {
        let sql = format!(
            "SELECT {REVIEW_COLUMNS} FROM facilitator_reviews WHERE ($1 = '' OR state = $1)
             ORDER BY created_at, payment_id LIMIT $2"
        );
        let state = state.map_or("", ReviewState::as_str);
        on_pool!(self, p => {
            let rows = sqlx::query(&sql).bind(state).bind(limit).fetch_all(p).await.map_err(|e| storage(&e))?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows { out.push(review_of!(r)); }
            Ok(out)
        })
    }

    /// Pending reviews whose offer ended by `now`, the earliest ended first, at most `limit`.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn reviews_ended(&self, now: Timestamp, limit: i64) -> RailResult<Vec<ReviewRecord>> {
        let sql = format!(
            "SELECT {REVIEW_COLUMNS} FROM facilitator_reviews
             WHERE state = 'pending' AND offer_expires_at <= $1
             ORDER BY offer_expires_at, payment_id LIMIT $2"
        );
        on_pool!(self, p => {
            let rows = sqlx::query(&sql).bind(now.0).bind(limit).fetch_all(p).await.map_err(|e| storage(&e))?;
            let mut out = Vec::with_capacity(rows.len());
            for r in rows { out.push(review_of!(r)); }
            Ok(out)
        })
    }

    /// Records a decision on a pending review; `false` when it was no longer pending.
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn decide(
        &self,
        payment_id: &str,
        state: ReviewState,
        at: Timestamp,
        by: &str,
        note: Option<&str>,
    ) -> RailResult<bool> {
        on_pool!(self, p => sqlx::query(DECIDE)
            .bind(state.as_str())
            .bind(at.0)
            .bind(by)
            .bind(note)
            .bind(payment_id)
            .execute(p)
            .await
            .map(|r| r.rows_affected() == 1)
            .map_err(|e| storage(&e)))
    }
}
