//! Accounts: registration and funding (operator's side), who signs a request (every request),
//! and an account's own view of itself.

use std::sync::Arc;
use std::time::Instant;

use rail_account::api::AccountView;
use rail_account::auth::{self, RequestParts, SignedRequest};
use rail_account::{AccountPublicKey, AuthError};
use rail_core::KeyStore;
use rail_core::keys::Write;
use rail_core::{Asset, Money, OpId, RailError, RailResult};
use rail_ledger::{
    AccountId, Created, NewAccount as LedgerAccount, TransferRequest, op_transfer_id,
};
use sha2::{Digest, Sha256};

use super::{Cached, Facilitator, NS_NONCES, money, units};
use crate::store::AccountRecord;

/// An account to open (operator's side).
#[derive(Clone, Debug)]
pub struct NewAccount {
    /// Its id; a random one when `None`.
    pub id: Option<AccountId>,
    /// The key that signs its requests.
    pub key: AccountPublicKey,
    /// The one asset it holds.
    pub asset: Asset,
    /// Payments above this wait for an operator's review.
    pub review_above: Option<Money>,
    /// A name for operators.
    pub label: String,
}

/// The treasury of `asset`: the account money enters the facilitator from (it may go below
/// zero: what it owes is what the facilitator's accounts hold).
#[must_use]
pub fn treasury_id(asset: &Asset) -> AccountId {
    let h = Sha256::new()
        .chain_update(b"stipendex-facilitator/treasury/")
        .chain_update(asset.code().as_bytes())
        .finalize();
    let mut b = [0u8; 16];
    b.copy_from_slice(h.get(..16).unwrap_or(&[0; 16]));
    AccountId((u128::from_be_bytes(b) | 1) & !rail_ledger::RESERVED_BIT)
}

/// A request whose signature and nonce were checked ([`Facilitator::authenticate`]). Answer
/// the request only after [`Authenticated::durable`].
#[derive(Debug)]
#[must_use = "answer the request only after Authenticated::durable"]
pub struct Authenticated {
    /// The account that signed it.
    pub id: AccountId,
    /// The handle its nonce was written through.
    nonces: Arc<dyn KeyStore>,
}

impl Authenticated {
    /// Makes the request's nonce durable (free when a durable write of the same file came
    /// after it): before the request is answered, so that a replay after a power loss is
    /// still refused.
    ///
    /// # Errors
    /// [`RailError::Storage`] when the store cannot make it durable: answer that the service
    /// is unavailable.
    pub async fn durable(&self) -> RailResult<()> {
        self.nonces.sync().await
    }
}

impl Facilitator {
    /// Opens an account (or, for an existing id, replaces its key, threshold and label; its
    /// asset cannot change).
    ///
    /// # Errors
    /// [`RailError::InvalidInput`] for a threshold in another asset or an id that exists with
    /// another asset; [`RailError::Storage`].
    pub async fn create_account(&self, new: NewAccount) -> RailResult<AccountRecord> {
        let review_above = new
            .review_above
            .as_ref()
            .map(|m| {
                if m.asset() != &new.asset {
                    return Err(RailError::InvalidInput(format!(
                        "the review threshold is in {}, the account holds {}",
                        m.asset(),
                        new.asset
                    )));
                }
                m.minor_i64().map_err(RailError::from)
            })
            .transpose()?;
        let id = new.id.unwrap_or_else(AccountId::random);
        self.ledger
            .create_account(LedgerAccount {
                id,
                asset: new.asset.clone(),
                no_overdraft: true,
            })
            .await?;
        let record = AccountRecord {
            id: id.to_string(),
            public_key: new.key.to_string(),
            review_above,
            label: new.label,
            created_at: self.clock.now(),
        };
        self.pool.put_account(&record).await?;
        self.forget(id);
        Ok(record)
    }

    /// Credits `amount` to `account` from the treasury, once per `reference` (the same
    /// reference again does nothing more).
    ///
    /// # Errors
    /// [`RailError::NotFound`] for an unknown account; [`RailError::IdempotencyConflict`] for
    /// a reference used with another amount; [`RailError::Storage`].
    pub async fn fund(
        &self,
        account: AccountId,
        amount: &Money,
        reference: &str,
    ) -> RailResult<Created> {
        let treasury = treasury_id(amount.asset());
        self.ledger
            .create_account(LedgerAccount {
                id: treasury,
                asset: amount.asset().clone(),
                no_overdraft: false,
            })
            .await?;
        let op = OpId::new(format!("fund/{account}/{reference}"))?;
        Ok(self
            .ledger
            .transfer(TransferRequest::Single {
                id: op_transfer_id(treasury, "fund", &op),
                debit: treasury,
                credit: account,
                amount: units(amount)?,
                user_data: 0,
            })
            .await?)
    }

    /// The account's key, asset and threshold, from memory if read in the last few seconds.
    pub(crate) async fn account(&self, id: AccountId) -> Result<Cached, AuthError> {
        if let Some(c) = self
            .cache
            .lock()
            .ok()
            .and_then(|m| m.get(&id).cloned())
            .filter(|c| c.until > Instant::now())
        {
            return Ok(c);
        }
        let unknown = || AuthError::UnknownAccount(id.to_string());
        let storage = |e: RailError| AuthError::Unavailable(format!("account {id}: {e}"));
        let record = self
            .pool
            .account(&id.to_string())
            .await
            .map_err(storage)?
            .ok_or_else(unknown)?;
        let ledger = self
            .ledger
            .account(id)
            .await
            .map_err(|e| storage(e.into()))?
            .ok_or_else(unknown)?;
        let key = AccountPublicKey::parse(&record.public_key)?;
        let cached = Cached {
            key,
            key_text: record.public_key,
            asset: ledger.asset,
            review_above: record.review_above.and_then(|v| u64::try_from(v).ok()),
            until: Instant::now() + self.config.account_cache,
        };
        if let Ok(mut m) = self.cache.lock() {
            if m.len() > 100_000 {
                m.clear();
            }
            m.insert(id, cached.clone());
        }
        Ok(cached)
    }

    fn forget(&self, id: AccountId) {
        if let Ok(mut m) = self.cache.lock() {
            m.remove(&id);
        }
    }

    /// Who signed this request: its time within the window, its signature under the
    /// account's key, then its nonce never seen before (recorded for every instance).
    ///
    /// The nonce is written through the key store's deferred handle (committed: every
    /// instance refuses it at once; not yet `fsync`ed): answer the request only once
    /// [`Authenticated::durable`] has returned. The request's own durable write in the same
    /// file (a payment's transfer: the ledger and the key store share one file and one writer)
    /// comes after the nonce and makes it durable with it, so a paying request costs one
    /// `fsync`, not two; a request that writes nothing durable pays for the nonce's.
    ///
    /// # Errors
    /// An [`AuthError`]; nothing is done for the request.
    pub async fn authenticate(
        &self,
        signed: &SignedRequest,
        parts: &RequestParts<'_>,
    ) -> Result<Authenticated, AuthError> {
        let id: AccountId = signed
            .account
            .parse()
            .map_err(|e: String| AuthError::Malformed(auth::ACCOUNT, e))?;
        let account = self.account(id).await?;
        auth::check(
            signed,
            &account.key,
            parts,
            self.clock.now(),
            self.config.window,
        )?;
        let key = format!("{id}/{}", signed.nonce);
        // Kept while the request could be accepted by any instance: its time may be a window
        // ahead of this one's clock, and other instances' clocks a window further.
        let mut w = Write::finished(
            rand::random(),
            "seen",
            Some(self.config.window.saturating_mul(3)),
        );
        w.fingerprint = Vec::new();
        let nonces = rail_core::keys::deferred(&self.keys);
        match nonces.insert_if_absent(NS_NONCES, &key, &w).await {
            Ok(None) => Ok(Authenticated { id, nonces }),
            Ok(Some(_)) => Err(AuthError::Replayed(signed.nonce.clone())),
            Err(e) => Err(AuthError::Unavailable(format!("nonce: {e}"))),
        }
    }

    /// The caller's own account.
    ///
    /// # Errors
    /// [`RailError::NotFound`]; [`RailError::Storage`].
    pub async fn account_view(&self, caller: AccountId) -> RailResult<AccountView> {
        let a = self
            .ledger
            .account(caller)
            .await?
            .ok_or_else(|| RailError::NotFound(format!("account {caller}")))?;
        let cached = self.account(caller).await.map_err(super::account_error)?;
        let nonneg = |v: i128, what: &str| {
            u64::try_from(v).map_err(|_| {
                RailError::Storage(format!("account {caller}: {what} is {v}, below zero"))
            })
        };
        Ok(AccountView {
            id: caller.to_string(),
            key: cached.key_text,
            balance: money(&a.asset, nonneg(a.posted_balance(), "the balance")?)?,
            held: money(&a.asset, a.debits_pending)?,
            available: money(&a.asset, nonneg(a.available(), "what is available")?)?,
            review_above: cached
                .review_above
                .map(|v| money(&a.asset, v))
                .transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rail_account::AccountKey;
    use rail_account::auth::{self, Canonical, RequestParts, SignedRequest};
    use rail_core::{Asset, Clock as _, ManualClock, SharedClock};

    use super::*;
    use crate::config::Config;

    const NETWORK: &str = "facilitator.test";

    /// The signing headers of a `GET /v1/account` by `account`, signed by `key` at `ts`.
    fn signed(account: &str, key: &AccountKey, ts: i64) -> SignedRequest {
        let nonce = auth::nonce();
        let sig = key
            .sign(&Canonical {
                network: NETWORK,
                method: "GET",
                path_and_query: "/v1/account",
                account,
                timestamp_ms: ts,
                nonce: &nonce,
                idempotency_key: None,
                body: b"",
            })
            .to_string();
        let ts = ts.to_string();
        SignedRequest::read(|name| match name {
            auth::ACCOUNT => Some(account),
            auth::TIMESTAMP => Some(ts.as_str()),
            auth::NONCE => Some(nonce.as_str()),
            auth::SIGNATURE => Some(sig.as_str()),
            _ => None,
        })
        .unwrap()
    }

    fn parts() -> RequestParts<'static> {
        RequestParts {
            network: NETWORK,
            method: "GET",
            path_and_query: "/v1/account",
            idempotency_key: None,
            body: b"",
        }
    }

    /// A facilitator on SQLite in a fresh folder, its clock, and one account ("honest") with
    /// its key.
    async fn honest() -> (
        tempfile::TempDir,
        ManualClock,
        Facilitator,
        AccountKey,
        crate::store::AccountRecord,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::starting_now();
        let shared: SharedClock = Arc::new(clock.clone());
        let fac = crate::open(
            &format!("sqlite://{}/fac.db", dir.path().display()),
            None,
            Config::new(NETWORK),
            Some(shared),
        )
        .await
        .unwrap();
        let key = AccountKey::generate();
        let real = fac
            .create_account(NewAccount {
                id: None,
                key: key.public(),
                asset: Asset::usd(),
                review_above: None,
                label: "honest".into(),
            })
            .await
            .unwrap();
        (dir, clock, fac, key, real)
    }

    /// Issue #47: an account is looked up before its request's signature is checked. 5,000
    /// requests naming accounts that do not exist and 500 naming a real one with a forged
    /// signature: the accounts kept in memory are at most the real ones, no nonce of theirs
    /// is recorded, and the real account's own signed request is still served.
    #[tokio::test]
    async fn unauthenticated_requests_keep_no_account_and_no_nonce() {
        let (_dir, clock, fac, key, real) = honest().await;
        let ts = clock.now().0;
        for _ in 0..5_000 {
            let unknown = AccountId::random().to_string();
            let r = signed(&unknown, &AccountKey::generate(), ts);
            let e = fac.authenticate(&r, &parts()).await.unwrap_err();
            assert_eq!(e.code(), "unknown_account", "{e}");
        }
        let mut forged = Vec::new();
        for _ in 0..500 {
            let r = signed(&real.id, &AccountKey::generate(), ts);
            assert!(fac.authenticate(&r, &parts()).await.is_err());
            forged.push(r.nonce);
        }
        assert!(fac.cache.lock().unwrap().len() <= 1);
        for nonce in forged {
            let key = format!("{}/{nonce}", real.id);
            assert!(fac.keys.get(NS_NONCES, &key).await.unwrap().is_none());
        }
        let ok = signed(&real.id, &key, ts);
        assert_eq!(
            fac.authenticate(&ok, &parts())
                .await
                .unwrap()
                .id
                .to_string(),
            real.id
        );
    }

    /// A request's nonce is committed at once (a replay is refused) and durable only once the
    /// request is answered ([`Authenticated::durable`]), or with the next durable write of the
    /// file it shares with the ledger.
    #[tokio::test]
    async fn a_nonce_is_refused_again_at_once_and_durable_before_the_answer() {
        let (dir, clock, fac, key, real) = honest().await;
        let db = rail_core::sqlite::SqliteDb::open_here(&dir.path().join("fac.db")).unwrap();
        let ok = signed(&real.id, &key, clock.now().0);
        let a = fac.authenticate(&ok, &parts()).await.unwrap();
        assert!(
            db.durable_through() < db.last_commit(),
            "no fsync of its own yet"
        );
        let again = fac.authenticate(&ok, &parts()).await.unwrap_err();
        assert_eq!(again.code(), "replayed_request", "{again}");
        a.durable().await.unwrap();
        assert!(db.durable_through() >= db.last_commit());
    }
}
