//! Revocations: the principal withdraws a mandate; the wallet reads its store on every payment,
//! so a revocation written there is honoured at once.

use std::sync::Arc;

use rail_core::KeyStore;
use rail_core::keys::Write;

use crate::Error;
use crate::envelope::{Mandate, Revocation, SecretKey, Signed, Tag, new_id};

const NS: &str = "stipendex/revoked";

/// The revocations in a wallet's store.
#[derive(Clone, Debug)]
pub struct Revocations {
    store: Arc<dyn KeyStore>,
}

impl Revocations {
    /// The revocations kept in `store`.
    #[must_use]
    pub fn new(store: Arc<dyn KeyStore>) -> Self {
        Revocations { store }
    }

    /// Whether mandate `mandate_id` was revoked.
    ///
    /// # Errors
    /// [`Error::Storage`] (the wallet then refuses to pay: a revocation it cannot read might
    /// be there).
    pub async fn is_revoked(&self, mandate_id: &str) -> Result<bool, Error> {
        self.store
            .get(NS, mandate_id)
            .await
            .map(|r| r.is_some())
            .map_err(|e| Error::Storage(e.to_string()))
    }

    /// Records `revocation` (kept for ever; revoking twice is harmless).
    ///
    /// # Errors
    /// [`Error::Storage`].
    pub async fn record(&self, revocation: &Signed<Revocation>) -> Result<(), Error> {
        let w = Write {
            token: rand::random::<i64>(),
            state: "revoked".into(),
            fingerprint: Vec::new(),
            value: Some(revocation.jws().to_owned()),
            retain: None,
            lease: None,
        };
        self.store
            .insert_if_absent(NS, &revocation.object().mandate_id, &w)
            .await
            .map(|_| ())
            .map_err(|e| Error::Storage(e.to_string()))
    }
}

/// The principal's Revocation of `mandate`, signed with `principal` (the mandate's signer).
///
/// # Errors
/// [`Error::Untrusted`] if `principal` did not sign the mandate.
pub fn revoke(
    mandate: &Signed<Mandate>,
    principal: &SecretKey,
    now: u64,
) -> Result<Signed<Revocation>, Error> {
    Signed::sign(
        Revocation {
            stipendex: Tag::current("revocation"),
            id: new_id("v_"),
            principal: mandate.object().principal.key,
            mandate_id: mandate.object().id.clone(),
            mandate: mandate.digest().clone(),
            iat: now,
        },
        principal,
    )
}
