//! The AVM scheme's facilitator: checks a group ([`super::verify::check`]), signs its fee
//! payer's transactions, simulates the group where algod offers it, submits it and waits for
//! it — once per group across every instance sharing a key store ([`SettlementBook`], keyed by
//! network and group id).
//!
//! What the SDK's facilitator does (`mechanisms/avm/exact/facilitator.py`), with three
//! differences, each a fix:
//! - `verify` signs the fee payer's transactions *before* simulating, with empty signatures
//!   **not** allowed: a group with a member nobody signed fails here, not at submission
//!   (x402-avm's reference signer simulates with `allow_empty_signatures`, research §5.4);
//! - a group is submitted at most once (the write-ahead record), and an answer lost after the
//!   submission is recovered by following the recorded transaction, never by a second send;
//! - the settle answer names the payment transaction (`paymentGroup[paymentIndex]`), as the
//!   spec says (the SDK's reference signer answers the group's first transaction).
//!
//! Where algod has no `simulate` (a 404), `verify` checks the rules, the window and the fee
//! payer's balance only; the chain's own verdict comes at settlement.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ed25519_dalek::SigningKey;
use rail_core::keys::{Opened, Settling};
use rail_core::{KeyStore, RailError, SettlementBook};
use serde::{Deserialize, Serialize};

use super::verify::{self, AvmPayment, Expect, Violation};
use super::wire::{Envelope, MAX_FEE_PAYER_FEE, Requirements, SCHEME, Spelling, code};
use crate::address::Address;
use crate::algod::{AlgodClient, AlgodError};
use crate::txn::{Member, SignedTxn};

/// The environment variable the facilitator's fee payer key is read from: a 32-byte hex
/// Ed25519 seed.
pub const FEE_PAYER_KEY_ENV: &str = "AVM_FEE_PAYER_KEY";

/// The fee payer's key. Its `Debug` shows the address only.
#[derive(Clone)]
pub struct FeePayer {
    key: SigningKey,
    address: Address,
}

impl fmt::Debug for FeePayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FeePayer")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl FeePayer {
    /// A fee payer with `key`.
    #[must_use]
    pub fn new(key: SigningKey) -> Self {
        let address = Address(key.verifying_key().to_bytes());
        FeePayer { key, address }
    }

    /// Reads [`FEE_PAYER_KEY_ENV`]; `Ok(None)` when it is not set.
    ///
    /// # Errors
    /// A sentence naming the variable when it is not a 32-byte hex key (the value is never
    /// echoed).
    pub fn from_env() -> Result<Option<Self>, String> {
        match std::env::var(FEE_PAYER_KEY_ENV) {
            Err(_) => Ok(None),
            Ok(v) => {
                let bytes: [u8; 32] = hex::decode(v.trim())
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| {
                        format!("{FEE_PAYER_KEY_ENV} is not a 32-byte hex Ed25519 seed")
                    })?;
                Ok(Some(FeePayer::new(SigningKey::from_bytes(&bytes))))
            }
        }
    }

    /// Its address.
    #[must_use]
    pub fn address(&self) -> Address {
        self.address
    }
}

/// Why a facilitator call did not succeed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AvmError {
    /// Refused for certain; nothing was sent (or the chain refused it): pay anew.
    #[error("{code}: {detail}")]
    Refused {
        /// The code.
        code: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The outcome is unknown (algod or the store did not answer): present the same payment
    /// again.
    #[error("outcome unknown: {0}")]
    Unknown(String),
}

impl From<Violation> for AvmError {
    fn from(v: Violation) -> Self {
        AvmError::Refused {
            code: v.code,
            detail: v.detail,
        }
    }
}

fn storage(e: &RailError) -> AvmError {
    AvmError::Unknown(format!("settlement record: {e}"))
}

/// What was sent for a group, as the settlement record keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentGroup {
    /// Base64 of the signed group as submitted.
    pub group: String,
    /// The payment transaction's id.
    pub txid: String,
    /// Who paid.
    pub payer: String,
    /// The earliest last-valid round.
    pub last_valid: u64,
    /// The round it was confirmed in, once settled.
    #[serde(default)]
    pub confirmed_round: Option<u64>,
}

/// A settled group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The payment transaction's id.
    pub txid: String,
    /// Who paid.
    pub payer: String,
    /// The round it was confirmed in.
    pub confirmed_round: Option<u64>,
}

/// The facilitator of one chain (see the module docs).
#[derive(Clone)]
pub struct AvmFacilitator {
    algod: AlgodClient,
    genesis_hash: [u8; 32],
    genesis_id: String,
    fee_payer: Option<FeePayer>,
    /// The fee payer groups are checked against: the key's address, or (for checks in front of
    /// a remote facilitator) the address it advertises.
    fee_payer_address: Option<Address>,
    book: SettlementBook<SentGroup>,
    max_fee: u64,
    spelling: Spelling,
}

impl fmt::Debug for AvmFacilitator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AvmFacilitator")
            .field("network", &self.network())
            .field("fee_payer", &self.fee_payer)
            .finish_non_exhaustive()
    }
}

impl AvmFacilitator {
    /// A facilitator for `algod`'s chain (its genesis is read once), paying fees from
    /// `fee_payer` when given, recording settlements in `store` (shared by every instance that
    /// settles the same payments).
    ///
    /// # Errors
    /// [`AlgodError`] if algod cannot be reached.
    pub async fn connect(
        algod: AlgodClient,
        fee_payer: Option<FeePayer>,
        store: Arc<dyn KeyStore>,
    ) -> Result<Self, AlgodError> {
        let params = algod.params().await?;
        Ok(AvmFacilitator {
            algod,
            genesis_hash: params.genesis_hash,
            genesis_id: params.genesis_id,
            fee_payer_address: fee_payer.as_ref().map(FeePayer::address),
            fee_payer,
            // Longer than any group's validity window (1000 rounds, under an hour).
            book: SettlementBook::new(store, "exact-avm:settled", Duration::from_secs(2 * 3600)),
            max_fee: MAX_FEE_PAYER_FEE,
            spelling: Spelling::default(),
        })
    }

    /// Caps what the fee payer's transactions may cost it per group (at most the SDK's 16 000).
    #[must_use]
    pub fn with_max_fee(mut self, max_fee: u64) -> Self {
        self.max_fee = max_fee.min(MAX_FEE_PAYER_FEE);
        self
    }

    /// How `/supported` spells the network.
    #[must_use]
    pub fn with_spelling(mut self, spelling: Spelling) -> Self {
        self.spelling = spelling;
        self
    }

    /// The network, as this facilitator spells it.
    #[must_use]
    pub fn network(&self) -> String {
        self.spelling.network(&self.genesis_hash)
    }

    /// The genesis hash.
    #[must_use]
    pub fn genesis_hash(&self) -> [u8; 32] {
        self.genesis_hash
    }

    /// The genesis id.
    #[must_use]
    pub fn genesis_id(&self) -> &str {
        &self.genesis_id
    }

    /// The fee payer's address, when it pays fees.
    #[must_use]
    pub fn fee_payer(&self) -> Option<Address> {
        self.fee_payer_address
    }

    /// Checks groups for a fee payer whose key another facilitator holds (`address`, as its
    /// `/supported` advertises it): this one keeps no key, so it can check, not settle, groups
    /// with fee-payer members.
    #[must_use]
    pub fn checking_for(mut self, address: Option<Address>) -> Self {
        self.fee_payer = None;
        self.fee_payer_address = address;
        self
    }

    /// The algod client.
    #[must_use]
    pub fn algod(&self) -> &AlgodClient {
        &self.algod
    }

    /// What a payment for `req` must be.
    ///
    /// # Errors
    /// A [`Violation`] when `req` is not this facilitator's to settle (another scheme or
    /// network, a fee payer it does not hold, an unreadable asset, amount or address).
    pub fn expect(&self, req: &Requirements) -> Result<Expect, Violation> {
        let bad = |code: &'static str, detail: String| Violation { code, detail };
        if req.scheme != SCHEME {
            return Err(bad(
                code::UNSUPPORTED_SCHEME,
                format!("scheme {:?}", req.scheme),
            ));
        }
        if !super::wire::same(&req.network, &self.network()) {
            return Err(bad(
                code::NETWORK_MISMATCH,
                format!("{} is not {}", req.network, self.network()),
            ));
        }
        let fee_payer = match req.extra.fee_payer.as_deref() {
            None => None,
            Some(fp) => {
                let fp: Address = fp.parse().map_err(|_| {
                    bad(
                        code::FEE_PAYER_NOT_MANAGED,
                        format!("feePayer {fp:?} is not an address"),
                    )
                })?;
                if Some(fp) != self.fee_payer() {
                    return Err(bad(
                        code::FEE_PAYER_NOT_MANAGED,
                        format!("{fp} is not this facilitator's fee payer"),
                    ));
                }
                Some(fp)
            }
        };
        Ok(Expect {
            genesis_hash: self.genesis_hash,
            genesis_id: self.genesis_id.clone(),
            asset: req.asset.parse().map_err(|_| {
                bad(
                    code::ASSET_ID_MISMATCH,
                    format!("asset {:?} is not an ASA id", req.asset),
                )
            })?,
            amount: req.amount.parse().map_err(|_| {
                bad(
                    code::AMOUNT_INSUFFICIENT,
                    format!("amount {:?} is not a u64", req.amount),
                )
            })?,
            pay_to: req.pay_to.parse().map_err(|_| {
                bad(
                    code::RECIPIENT_MISMATCH,
                    format!("payTo {:?} is not an address", req.pay_to),
                )
            })?,
            fee_payer,
            max_fee: self.max_fee,
        })
    }

    /// Every offline check of `envelope` against `req`: the envelope's version, scheme and
    /// network, then [`verify::check`].
    ///
    /// # Errors
    /// A [`Violation`].
    pub fn check(&self, envelope: &Envelope, req: &Requirements) -> Result<AvmPayment, Violation> {
        let expect = self.expect(req)?;
        if envelope.x402_version != 2 {
            return Err(Violation {
                code: code::INVALID_PAYLOAD,
                detail: format!("x402Version {} (this scheme is v2)", envelope.x402_version),
            });
        }
        if envelope.accepted.scheme != SCHEME {
            return Err(Violation {
                code: code::UNSUPPORTED_SCHEME,
                detail: format!("the payment is for scheme {:?}", envelope.accepted.scheme),
            });
        }
        if !super::wire::same(&envelope.accepted.network, &req.network) {
            return Err(Violation {
                code: code::NETWORK_MISMATCH,
                detail: format!("the payment is for {}", envelope.accepted.network),
            });
        }
        verify::check(&envelope.payload, &expect)
    }

    fn sign_all(&self, p: &AvmPayment) -> Result<Vec<SignedTxn>, AvmError> {
        p.signed_by(self.fee_payer.as_ref().map(|fp| &fp.key))
            .ok_or_else(|| AvmError::Refused {
                code: code::MISSING_SIGNATURE,
                detail: "a member is unsigned and this facilitator pays no fees".into(),
            })
    }

    /// The online checks that move nothing: the window, then a simulation of the group with
    /// the fee payer's transactions signed (empty signatures not allowed). `Ok(true)`: valid
    /// now; `Ok(false)`: already on chain (perhaps this payer's earlier request, whose answer
    /// was lost: settling recognises it).
    ///
    /// # Errors
    /// [`AvmError::Refused`] (`transaction_simulation_failed` with the chain's message, or
    /// `…_expired`); [`AvmError::Unknown`] when algod does not answer.
    pub async fn verify(&self, p: &AvmPayment) -> Result<bool, AvmError> {
        let round = self
            .algod
            .last_round()
            .await
            .map_err(|e| AvmError::Unknown(e.to_string()))?;
        if round >= p.last_valid {
            return Err(AvmError::Refused {
                code: code::EXPIRED,
                detail: format!(
                    "the group was valid until round {}; the chain is at {round}",
                    p.last_valid
                ),
            });
        }
        let signed: Vec<Member> = self.sign_all(p)?.into_iter().map(Member::Signed).collect();
        match self.algod.simulate(&signed, false).await {
            // Valid; or no simulate on this node (a 404): the rules and the window stand.
            Ok(None) | Err(AlgodError::Http { status: 404, .. }) => Ok(true),
            Ok(Some((_, message))) if message.contains("transaction already in ledger") => {
                Ok(false)
            }
            Ok(Some((at, message))) => Err(AvmError::Refused {
                code: code::SIMULATION_FAILED,
                detail: format!("Simulation failed at member {at}: {message}"),
            }),
            Err(e) if e.is_retryable() => Err(AvmError::Unknown(e.to_string())),
            Err(e) => Err(AvmError::Refused {
                code: code::SIMULATION_FAILED,
                detail: format!("Simulation failed: {}", e.message()),
            }),
        }
    }

    /// Signs the fee payer's transactions, submits the group and waits for it — at most once
    /// per group, whoever asks: a group already settled answers its settlement, one in flight
    /// elsewhere is [`AvmError::Unknown`], one whose earlier submission's answer was lost is
    /// followed on chain.
    ///
    /// # Errors
    /// [`AvmError`].
    pub async fn settle(&self, p: &AvmPayment, network: &str) -> Result<Settled, AvmError> {
        let key = p.key(network);
        match self.book.open(&key).await.map_err(|e| storage(&e))? {
            Opened::Settled(s) => Ok(settled(&s.sent)),
            Opened::InFlight { .. } => Err(AvmError::Unknown(
                "this group is being settled by another request".into(),
            )),
            Opened::Conflict => Err(AvmError::Unknown("settlement record conflict".into())),
            Opened::Recover(s, Some(previous)) => {
                // Sent before, answer lost: follow that, never send anything else.
                let sent = previous.sent;
                let bytes = data_encoding::BASE64
                    .decode(sent.group.as_bytes())
                    .map_err(|e| AvmError::Unknown(format!("settlement record: {e}")))?;
                self.finish(s, sent, &bytes).await
            }
            Opened::Fresh(s) | Opened::Recover(s, None) => {
                let signed = match self.sign_all(p) {
                    Ok(g) => g,
                    Err(e) => {
                        s.failed().await.map_err(|e| storage(&e))?;
                        return Err(e);
                    }
                };
                let bytes: Vec<u8> = signed.iter().flat_map(SignedTxn::encode).collect();
                let sent = SentGroup {
                    group: data_encoding::BASE64.encode(&bytes),
                    txid: p.txid.clone(),
                    payer: p.payer.to_string(),
                    last_valid: p.last_valid,
                    confirmed_round: None,
                };
                s.submitting(&p.txid, sent.clone())
                    .await
                    .map_err(|e| storage(&e))?;
                self.finish(s, sent, &bytes).await
            }
        }
    }

    async fn finish(
        &self,
        s: Settling<SentGroup>,
        mut sent: SentGroup,
        bytes: &[u8],
    ) -> Result<Settled, AvmError> {
        let outcome = s.keep_alive(self.submit_and_wait(&sent, bytes)).await;
        match outcome {
            Ok(round) => {
                sent.confirmed_round = Some(round);
                let txid = sent.txid.clone();
                s.settled(&txid, sent.clone())
                    .await
                    .map_err(|e| storage(&e))?;
                Ok(settled(&sent))
            }
            Err(e @ AvmError::Refused { .. }) => {
                s.failed().await.map_err(|e| storage(&e))?;
                Err(e)
            }
            Err(e) => {
                // The record stays: the next attempt follows the same group.
                let _ = s.unknown().await;
                Err(e)
            }
        }
    }

    /// Submits (again, harmlessly: the same bytes have the same ids) and waits until the
    /// payment is confirmed or can no longer be.
    async fn submit_and_wait(&self, sent: &SentGroup, bytes: &[u8]) -> Result<u64, AvmError> {
        if let Ok(p) = self.algod.pending(&sent.txid).await
            && let Some(r) = p.confirmed_round
        {
            return Ok(r);
        }
        match self.algod.submit(bytes).await {
            Ok(_) => {}
            Err(e) if e.message().contains("transaction already in ledger") => {}
            Err(e @ AlgodError::Http { status: 400, .. }) => {
                // Refused by the pool. If the window has passed it can never land: certain.
                return Err(AvmError::Refused {
                    code: if e.message().contains("txn dead") {
                        code::EXPIRED
                    } else {
                        code::TRANSACTION_FAILED
                    },
                    detail: e.message(),
                });
            }
            Err(e) => return Err(AvmError::Unknown(e.to_string())),
        }
        self.algod
            .wait_for_confirmation(&sent.txid, sent.last_valid)
            .await
            .map_err(|e| match e {
                AlgodError::PoolError { message, .. } => AvmError::Refused {
                    code: code::TRANSACTION_FAILED,
                    detail: message,
                },
                AlgodError::NotConfirmed { .. } => AvmError::Refused {
                    code: code::EXPIRED,
                    detail: e.to_string(),
                },
                e => AvmError::Unknown(e.to_string()),
            })
    }
}

fn settled(s: &SentGroup) -> Settled {
    Settled {
        txid: s.txid.clone(),
        payer: s.payer.clone(),
        confirmed_round: s.confirmed_round,
    }
}
