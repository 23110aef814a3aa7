//! The signed objects of Stipendex: [`Mandate`], [`Quote`], [`Confirmation`], [`Proof`],
//! [`Receipt`].
//!
//! Each is a typed struct, serialised as JSON and signed as a compact JWS with Ed25519
//! (`alg: EdDSA`); a [`Signed`] exists only for a JWS that verified under the key its object
//! declares. Every object carries `stipendex: "<type>/<version>"` (an unknown major version is
//! refused), an id with its type's prefix (`m_ q_ c_ p_ r_`), and amounts as decimal strings.
//! Objects bind each other by [`Digest`] (SHA-256 of the compact JWS), which makes the chain
//! mandate → (confirmation) → quote → proof → receipt verifiable offline ([`crate::chain`]).
//!
//! ```
//! use stipendex::envelope::{Party, Profile, Quote, RailOffer, SecretKey, Signed, Tag, new_id};
//! use stipendex::{Asset, Money, Offer, PaymentMode};
//!
//! let receiver = SecretKey::generate();
//! let price = Money::parse(Asset::usd(), "0.05")?;
//! let offer = Offer {
//!     rail: stipendex::rail_core::RailId::new("ledger"), id: "o1".into(), amount: price.clone(), payee: "shop".into(),
//!     mode: PaymentMode::Capture, expires_at: stipendex::Timestamp(1_000_000),
//!     details: serde_json::Value::Null,
//! };
//! let quote = Quote {
//!     stipendex: Tag::current("quote"), id: new_id("q_"),
//!     receiver: Party { id: "search".into(), key: receiver.public() },
//!     iat: 900, exp: 1000, profile: Profile::Service, asset: Asset::usd(),
//!     amount: Some(price.amount()), estimate: None, tolerance: None,
//!     capability: None, request: None, resource: None, description: None,
//!     rails: vec![RailOffer { rail: "ledger".into(), offer }],
//! };
//! let signed = Signed::sign(quote, &receiver)?;
//! let parsed = Signed::<Quote>::parse(signed.jws())?;    // verifies the signature
//! assert_eq!(parsed.object().amount, Some(price.amount()));
//! assert_eq!(parsed.digest(), signed.digest());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod confirmation;
pub mod jws;
mod key;
mod mandate;
mod proof;
mod quote;
mod receipt;
mod revocation;
mod signed;
pub mod tab;
mod vouched;

pub use confirmation::Confirmation;
pub use key::{PublicKey, SecretKey};
pub use mandate::{Allow, Limits, Mandate, Party, Period};
pub use proof::{Challenge, ChallengeSource, Proof};
pub use quote::{Capability, Profile, Quote, RailOffer, Resource};
pub use receipt::Receipt;
pub use revocation::Revocation;
pub use signed::{Digest, Identity, MAJOR, MINOR, Object, Signed, Tag, check_id, new_id};
pub use tab::{
    CallTree, LaneEnd, MAX_LANES, Tab, TabClose, TabPrice, TabReceipt, Voucher, tab_root,
};
pub(crate) use vouched::Vouched;
