//! Strict decoding of a payment group and every rule of the scheme that needs no chain
//! ([`check`]): what the spec (`specs/schemes/exact/scheme_exact_algo.md`, "Verification") and
//! the SDK's facilitator (`mechanisms/avm/exact/facilitator.py:112-352`) check, in an order that
//! verifies every signature before believing anything a signed member says.
//!
//! Where this is stricter than the SDK (each documented in the README of the scheme): every
//! rekey is refused (the SDK lets a pair of rekeys that undo each other through); clawback
//! transfers (`asnd`) and every type but `pay` and `axfer` are refused; every transaction from
//! the fee payer must be its zero self-payment (the SDK checks only the first); the fee payer's
//! transactions may cost it [`MAX_FEE_PAYER_FEE`] in total, not each; a single transaction must
//! carry no group id.
//!
//! What the fee payer signs and pays for (stricter than the spec, the SDK and `@x402/avm`,
//! which all let a group carry more):
//! - a group is the transfer that pays the offer and, when the facilitator pays the fees, the
//!   fee payer's **one** fee transaction — nothing else (`…_unexpected_transaction`): the
//!   pooled fee never pays for a payer's other transactions, nor for anyone else's;
//! - that fee transaction is a zero self-payment with no close-to and no rekey (as the SDK
//!   checks), **no lease** (a lease would lock on the fee payer's account for the window), a
//!   note of at most [`MAX_FEE_PAYER_NOTE`] bytes (the SDKs write `x402-fee-payer-<time>`,
//!   28–35 bytes), and a fee of at most [`MAX_FEE_PER_MEMBER`] per member of the group
//!   (`@x402/avm`'s bound), within [`MAX_FEE_PAYER_FEE`] and the facilitator's own cap.

use super::wire::{MAX_FEE_PAYER_FEE, MAX_GROUP, Payload, code};
pub use super::wire::{MAX_FEE_PAYER_NOTE, MAX_FEE_PER_MEMBER};
use crate::address::Address;
use crate::txn::{Member, SignedTxn, Transaction, TxnError, group_id_of};

/// What a payment must be, from the receiver's requirements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expect {
    /// The chain's genesis hash.
    pub genesis_hash: [u8; 32],
    /// The chain's genesis id (a member that names another is refused).
    pub genesis_id: String,
    /// The ASA.
    pub asset: u64,
    /// The exact amount, base units.
    pub amount: u64,
    /// Who is paid.
    pub pay_to: Address,
    /// The facilitator's fee payer, when it pays the fees.
    pub fee_payer: Option<Address>,
    /// The most the fee payer's transactions may cost it, µALGO.
    pub max_fee: u64,
}

/// A group that passed [`check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AvmPayment {
    /// The members, in order.
    pub members: Vec<Member>,
    /// Which member pays.
    pub index: usize,
    /// Who pays (the payment's sender).
    pub payer: Address,
    /// The payment transaction's id.
    pub txid: String,
    /// The group id (`None` for a lone transfer).
    pub group: Option<[u8; 32]>,
    /// The earliest last-valid round of the members: after it the group can never settle.
    pub last_valid: u64,
    /// What the fee payer pays in fees, µALGO.
    pub fee_payer_fee: u64,
}

impl AvmPayment {
    /// The payment's single-use identity on `network`: the group id, or the lone transfer's id.
    #[must_use]
    pub fn key(&self, network: &str) -> String {
        let network = crate::wire::normalize_network(network).unwrap_or_else(|| network.into());
        match self.group {
            Some(g) => format!("{network}:group:{}", data_encoding::BASE32_NOPAD.encode(&g)),
            None => format!("{network}:txn:{}", self.txid),
        }
    }

    /// The members the fee payer must sign (unsigned members; [`check`] made sure they are
    /// all its own).
    #[must_use]
    pub fn unsigned(&self) -> Vec<usize> {
        self.members
            .iter()
            .enumerate()
            .filter(|(_, m)| matches!(m, Member::Unsigned(_)))
            .map(|(i, _)| i)
            .collect()
    }

    /// The group as submitted: signed members as they came, unsigned ones (the fee payer's,
    /// [`check`] made sure) signed with `fee_payer`. `None` when a member is unsigned and there
    /// is no key to sign it.
    #[must_use]
    pub fn signed_by(
        &self,
        fee_payer: Option<&ed25519_dalek::SigningKey>,
    ) -> Option<Vec<SignedTxn>> {
        self.members
            .iter()
            .map(|m| match m {
                Member::Signed(s) => Some(s.clone()),
                Member::Unsigned(t) => fee_payer.map(|k| SignedTxn::sign(t.clone(), k, None)),
            })
            .collect()
    }
}

/// Why a group is refused: the SDK's code and a sentence.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct Violation {
    /// The code (`invalid_exact_avm_payload_…`).
    pub code: &'static str,
    /// What was wrong.
    pub detail: String,
}

fn refuse(code: &'static str, detail: impl Into<String>) -> Violation {
    let detail = detail.into();
    tracing::debug!(code, %detail, "exact-avm: payment group refused");
    Violation { code, detail }
}

/// Decodes one member: standard base64 (padding optional) of a signed transaction, a bare
/// transaction, or `{txn}`.
///
/// # Errors
/// A [`Violation`] (`group_decode_failed`, or `blocked_transaction_type` for a type other than
/// `pay` and `axfer`).
pub fn decode_member(i: usize, b64: &str) -> Result<Member, Violation> {
    let bytes = data_encoding::BASE64_NOPAD
        .decode(b64.trim_end_matches('=').as_bytes())
        .map_err(|e| {
            refuse(
                code::GROUP_DECODE_FAILED,
                format!("member {i}: not base64: {e}"),
            )
        })?;
    Member::decode(&bytes).map_err(|e| match e {
        TxnError::WrongType(t) => refuse(
            code::BLOCKED_TXN_TYPE,
            format!("member {i}: a {t} transaction (only pay and axfer)"),
        ),
        e => refuse(code::GROUP_DECODE_FAILED, format!("member {i}: {e}")),
    })
}

/// Decodes the group strictly and applies every rule that needs no chain (see the module docs).
///
/// # Errors
/// The first [`Violation`].
pub fn check(payload: &Payload, expect: &Expect) -> Result<AvmPayment, Violation> {
    let group = &payload.payment_group;
    if group.is_empty() {
        return Err(refuse(code::EMPTY_GROUP, "the payment group is empty"));
    }
    if group.len() > MAX_GROUP {
        return Err(refuse(
            code::GROUP_TOO_LARGE,
            format!(
                "{} transactions; a group holds at most {MAX_GROUP}",
                group.len()
            ),
        ));
    }
    let index = payload.payment_index;
    if index >= group.len() {
        return Err(refuse(
            code::INVALID_PAYMENT_INDEX,
            format!("paymentIndex {index} is outside a group of {}", group.len()),
        ));
    }
    let members = group
        .iter()
        .enumerate()
        .map(|(i, b)| decode_member(i, b))
        .collect::<Result<Vec<_>, _>>()?;

    // Signatures first: every signed member's, then who is left to sign.
    for (i, m) in members.iter().enumerate() {
        match m {
            Member::Signed(s) => {
                if s.verify_signature().is_err() {
                    return Err(refuse(
                        code::INVALID_SIGNATURE,
                        format!("member {i}: the signature does not match its signer"),
                    ));
                }
                if Some(s.txn.sender()) == expect.fee_payer {
                    return Err(refuse(
                        code::FEE_PAYER_INVALID_TXN,
                        format!("member {i}: the fee payer's transaction comes signed"),
                    ));
                }
            }
            Member::Unsigned(t) => {
                if Some(t.sender()) != expect.fee_payer {
                    return Err(refuse(
                        code::MISSING_SIGNATURE,
                        format!("member {i}: unsigned, and not the fee payer's to sign"),
                    ));
                }
            }
        }
    }

    // One group, and this chain.
    let txns: Vec<&Transaction> = members.iter().map(Member::txn).collect();
    let gid = if txns.len() > 1 {
        let Some(first) = txns.first().and_then(|t| t.group()) else {
            return Err(refuse(code::MISSING_GROUP_ID, "the group has no group id"));
        };
        let expected = group_id_of(txns.iter().copied());
        if first != expected || txns.iter().any(|t| t.group() != Some(expected)) {
            return Err(refuse(
                code::GROUP_ID_MISMATCH,
                "the members' group ids are not this group's",
            ));
        }
        Some(expected)
    } else {
        if txns.iter().any(|t| t.group().is_some()) {
            return Err(refuse(
                code::GROUP_ID_MISMATCH,
                "a lone transaction carries a group id",
            ));
        }
        None
    };
    for (i, t) in txns.iter().enumerate() {
        let h = t.header();
        if h.genesis_hash != expect.genesis_hash
            || (!h.genesis_id.is_empty() && h.genesis_id != expect.genesis_id)
        {
            return Err(refuse(
                code::GENESIS_HASH_MISMATCH,
                format!("member {i} is for another chain"),
            ));
        }
    }

    // Nothing but the transfer and the fee payer's one fee transaction: the pooled fee pays
    // for no one else's transactions, the payer's own included.
    let mut fee_payer_txns = 0usize;
    for (i, t) in txns.iter().enumerate().filter(|(i, _)| *i != index) {
        if Some(t.sender()) != expect.fee_payer {
            return Err(refuse(
                code::UNEXPECTED_TRANSACTION,
                format!(
                    "member {i} ({} from {}) is neither the payment nor the fee payer's fee \
                     transaction; a group carries nothing else",
                    t.kind(),
                    t.sender()
                ),
            ));
        }
        fee_payer_txns += 1;
        if fee_payer_txns > 1 {
            return Err(refuse(
                code::UNEXPECTED_TRANSACTION,
                format!("member {i} is a second transaction of the fee payer's; one at most"),
            ));
        }
    }

    // The fee payer's transaction: a zero self-payment, nothing else, within the cap.
    let mut fee_payer_fee = 0u64;
    if let Some(fp) = expect.fee_payer {
        for (i, t) in txns.iter().enumerate().filter(|(_, t)| t.sender() == fp) {
            let Transaction::Pay(p) = t else {
                return Err(refuse(
                    code::FEE_PAYER_INVALID_TXN,
                    format!("member {i}: the fee payer's transaction is not a payment"),
                ));
            };
            if p.amount != 0 {
                return Err(refuse(
                    code::FEE_PAYER_HAS_AMOUNT,
                    format!(
                        "member {i}: the fee payer's transaction moves {} µALGO",
                        p.amount
                    ),
                ));
            }
            if p.close_to.is_some() {
                return Err(refuse(
                    code::FEE_PAYER_HAS_CLOSE,
                    format!("member {i}: the fee payer's transaction closes its account"),
                ));
            }
            if p.rekey_to.is_some() {
                return Err(refuse(
                    code::FEE_PAYER_HAS_REKEY,
                    format!("member {i}: the fee payer's transaction rekeys its account"),
                ));
            }
            if p.receiver != fp {
                return Err(refuse(
                    code::FEE_PAYER_INVALID_TXN,
                    format!(
                        "member {i}: the fee payer's transaction pays {}",
                        p.receiver
                    ),
                ));
            }
            if p.lease.is_some() {
                return Err(refuse(
                    code::FEE_PAYER_INVALID_TXN,
                    format!(
                        "member {i}: the fee payer's transaction carries a lease (it would lock \
                         on the fee payer's account until round {})",
                        p.last_valid
                    ),
                ));
            }
            if p.note.len() > MAX_FEE_PAYER_NOTE {
                return Err(refuse(
                    code::FEE_PAYER_INVALID_TXN,
                    format!(
                        "member {i}: the fee payer's transaction carries a {}-byte note; at most \
                         {MAX_FEE_PAYER_NOTE}",
                        p.note.len()
                    ),
                ));
            }
            fee_payer_fee = fee_payer_fee.saturating_add(p.fee);
        }
        let members = u64::try_from(txns.len()).unwrap_or(u64::MAX);
        let cap = expect
            .max_fee
            .min(MAX_FEE_PAYER_FEE)
            .min(MAX_FEE_PER_MEMBER.saturating_mul(members));
        if fee_payer_fee > cap {
            return Err(refuse(
                code::FEE_PAYER_INVALID_TXN,
                format!(
                    "the group asks the fee payer for {fee_payer_fee} µALGO in fees; at most {cap}"
                ),
            ));
        }
    }

    // Nothing closes, rekeys or claws back.
    for (i, t) in txns.iter().enumerate() {
        let (close, clawback) = match t {
            Transaction::Pay(p) => (p.close_to.is_some(), false),
            Transaction::Axfer(a) => (a.close_to.is_some(), a.asset_sender.is_some()),
        };
        if close {
            return Err(refuse(
                code::CLOSE_TO_DETECTED,
                format!("member {i} closes an account or a holding"),
            ));
        }
        if t.header().rekey_to.is_some() {
            return Err(refuse(
                code::REKEY_DETECTED,
                format!("member {i} rekeys its sender"),
            ));
        }
        if clawback {
            return Err(refuse(
                code::BLOCKED_TXN_TYPE,
                format!("member {i} is a clawback transfer"),
            ));
        }
    }

    // The payment itself.
    let Some(Transaction::Axfer(pay)) = txns.get(index).copied() else {
        return Err(refuse(
            code::ASSET_ID_MISMATCH,
            "Payment transaction must be asset transfer (axfer)",
        ));
    };
    if pay.asset != expect.asset {
        return Err(refuse(
            code::ASSET_ID_MISMATCH,
            format!("the payment is in ASA {}, not {}", pay.asset, expect.asset),
        ));
    }
    if pay.receiver != expect.pay_to {
        return Err(refuse(
            code::RECIPIENT_MISMATCH,
            format!("the payment pays {}, not {}", pay.receiver, expect.pay_to),
        ));
    }
    if pay.amount != expect.amount {
        return Err(refuse(
            code::AMOUNT_INSUFFICIENT,
            format!("Expected {}, got {}", expect.amount, pay.amount),
        ));
    }
    if Some(pay.sender) == expect.fee_payer {
        return Err(refuse(
            code::FEE_PAYER_TRANSFERRING,
            "the payment is sent by the fee payer",
        ));
    }
    let txid = txns.get(index).map(|t| t.id()).unwrap_or_default();
    let last_valid = txns
        .iter()
        .map(|t| t.header().last_valid)
        .min()
        .unwrap_or(0);
    Ok(AvmPayment {
        payer: pay.sender,
        txid,
        group: gid,
        last_valid,
        fee_payer_fee,
        index,
        members,
    })
}
