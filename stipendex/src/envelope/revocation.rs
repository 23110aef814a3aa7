//! The Revocation: the principal withdraws a Mandate.

use serde::{Deserialize, Serialize};

use super::key::PublicKey;
use super::signed::{Digest, Identity, Object, Tag};

/// The principal's statement that a Mandate is withdrawn. A wallet that finds one for its
/// mandate in its store refuses every payment from then on. (An addition of this profile: the
/// protocol names revocation but no object for it; `docs/stipendex-profile.md` §1, Revocation.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// `revocation/0.1`.
    pub stipendex: Tag,
    /// `v_…`.
    pub id: String,
    /// The principal (the signer; the mandate's signer).
    pub principal: PublicKey,
    /// The mandate revoked, by id.
    pub mandate_id: String,
    /// The mandate revoked, by digest.
    pub mandate: Digest,
    /// When (Unix seconds).
    pub iat: u64,
}

impl Object for Revocation {
    const KIND: &'static str = "revocation";
    const PREFIX: &'static str = "v_";
    fn identity(&self) -> Identity<'_> {
        Identity::new(&self.stipendex, &self.id, &self.principal)
    }
}
