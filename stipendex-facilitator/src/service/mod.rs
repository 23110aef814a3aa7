//! The facilitator's operations, independent of HTTP: each takes the authenticated account
//! (`caller`) and the request, and answers or refuses with a typed error.
//!
//! **Nothing is applied twice.** Every operation that moves money is a ledger transfer whose
//! id derives from the caller's account and its idempotency key: the same request again is
//! answered by the transfer the first one made (even on another instance, even after the
//! first instance died before answering), and the same key with other content is refused
//! (`idempotency_conflict`). Verifying a payment ("redeem") writes one record per offer,
//! fingerprinted by its key, after the checks: the same key is answered the same, another key
//! is `replayed`.

mod accounts;
mod open;
mod pay;
mod redeem;
mod review;
mod settle;
mod view;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rail_account::AccountPublicKey;
use rail_core::{Asset, KeyStore, Money, RailError, RailResult, SharedClock};
use rail_ledger::{AccountId, Ledger};

use crate::config::Config;
use crate::store::Pool;

pub use accounts::{Authenticated, NewAccount, treasury_id};
pub use open::open;
pub use pay::payment_id;

/// How many ended reviews one sweep closes at most.
const SWEEP_REVIEWS: i64 = 1000;

/// Key-store namespace of seen request nonces.
pub(crate) const NS_NONCES: &str = "facilitator/nonces";
/// Key-store namespace of redeemed offers.
pub(crate) const NS_REDEEMED: &str = "facilitator/redeemed";

/// One facilitator instance: the ledger, the records beside it, the settings.
#[derive(Clone)]
pub struct Facilitator {
    pub(crate) ledger: Ledger,
    pub(crate) pool: Pool,
    pub(crate) keys: Arc<dyn KeyStore>,
    pub(crate) clock: SharedClock,
    pub(crate) config: Arc<Config>,
    pub(crate) cache: Arc<Mutex<HashMap<AccountId, Cached>>>,
}

impl std::fmt::Debug for Facilitator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Facilitator")
            .field("network", &self.config.network)
            .field("instance", &self.config.instance)
            .field("backend", &self.pool.backend())
            .finish_non_exhaustive()
    }
}

/// An account as an instance keeps it in memory for a few seconds.
#[derive(Clone, Debug)]
pub(crate) struct Cached {
    pub(crate) key: AccountPublicKey,
    pub(crate) key_text: String,
    pub(crate) asset: Asset,
    pub(crate) review_above: Option<u64>,
    pub(crate) until: std::time::Instant,
}

impl Facilitator {
    /// An instance over `ledger`, with its records in `pool` and single-use records in
    /// `keys`, judged by `clock`.
    #[must_use]
    pub fn new(
        ledger: Ledger,
        pool: Pool,
        keys: Arc<dyn KeyStore>,
        clock: SharedClock,
        config: Config,
    ) -> Self {
        Facilitator {
            ledger,
            pool,
            keys,
            clock,
            config: Arc::new(config),
            cache: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The ledger.
    #[must_use]
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The records beside the ledger.
    #[must_use]
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The single-use records (nonces, redeemed offers).
    #[must_use]
    pub fn keys(&self) -> &Arc<dyn KeyStore> {
        &self.keys
    }

    /// The clock requests and offers are judged by.
    #[must_use]
    pub fn clock(&self) -> &SharedClock {
        &self.clock
    }

    /// Forgets expired nonces and redeemed offers, releases lapsed holds and the holds of
    /// reviews still undecided when their offer ended. Run it every minute or so on one
    /// instance or all (each step is applied once, whoever takes it).
    ///
    /// # Errors
    /// [`RailError::Storage`].
    pub async fn sweep(&self) -> RailResult<u64> {
        self.ledger.expire_pending().await?;
        let reviews = self.expire_reviews(SWEEP_REVIEWS).await?;
        Ok(reviews + self.keys.purge_expired().await?)
    }
}

/// An account look-up that failed, as a rail error: an unknown account is `not_found`, a
/// database that did not answer is `unavailable` (retryable).
pub(crate) fn account_error(e: rail_account::AuthError) -> RailError {
    match e {
        rail_account::AuthError::Unavailable(why) => {
            RailError::Unavailable(rail_core::RailReason::new("unavailable", why))
        }
        other => RailError::NotFound(other.to_string()),
    }
}

/// Minor units of `m` as the ledger counts them.
pub(crate) fn units(m: &Money) -> RailResult<u64> {
    let v = m.minor_i64()?;
    u64::try_from(v).map_err(|_| RailError::InvalidInput("negative amount".into()))
}

/// `units` of `asset` as money.
pub(crate) fn money(asset: &Asset, units: u64) -> RailResult<Money> {
    Ok(Money::from_minor(asset.clone(), u128::from(units))?)
}

/// Reads an id from the wire.
pub(crate) fn parse_id<T: std::str::FromStr>(s: &str, what: &str) -> RailResult<T>
where
    T::Err: std::fmt::Display,
{
    s.parse()
        .map_err(|e| RailError::InvalidInput(format!("{what}: {e}")))
}
