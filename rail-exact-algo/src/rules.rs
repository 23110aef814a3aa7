//! The payment rules of exact-algo (`docs/exact-algo.md` §3), checked on a decoded signed
//! payment.
//!
//! The chain accepts underpaid, wrong-receiver, close-to, rekey and replayed payments without
//! complaint: every rule here is the verifier's job. The signature is checked first, before any
//! rule looks at the payload. The paymentId lifecycle (issued → pending → settled) is not a
//! property of the transaction and lives with the receiver's replay guard.

use crate::address::Address;
use crate::txn::{SignedPay, TxnError};
use crate::wire::{
    ErrorCode, RECEIVER_MISMATCH, SETTLEMENT_FAILED, TRANSACTION_EXPIRED, UNDERPAID,
    UNKNOWN_OR_EXPIRED_PAYMENT_ID,
};

/// The most a payer can be asked to pay in fees (`docs/exact-algo.md` §3.8), in microALGO.
pub const MAX_FEE: u64 = 2_000;
/// The protocol's minimum balance of an account, in microALGO (0.1 ALGO).
pub const MIN_BALANCE: u64 = 100_000;
/// The longest validity window Algorand allows, in rounds.
pub const MAX_WINDOW: u64 = 1_000;

/// What one challenge (one `accepts[]` entry) asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// `payTo`.
    pub pay_to: Address,
    /// `maxAmountRequired`, microALGO.
    pub amount: u64,
    /// `extra.paymentId`: the note must be exactly these ASCII bytes.
    pub payment_id: String,
    /// `extra.minFeeMicroAlgo`.
    pub min_fee: u64,
    /// The genesis hash of our network.
    pub genesis_hash: [u8; 32],
}

/// What algod says right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainView {
    /// The last committed round.
    pub round: u64,
    /// The sender account's `auth-addr` (set when the account was rekeyed).
    pub auth_addr: Option<Address>,
}

/// A broken rule. [`Violation::code`] is the error code (`docs/exact-algo.md` §4.1) it is
/// sent under, [`Violation::reason`] the rule's own finer code (§4.2).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// The signature does not verify.
    #[error("bad signature")]
    BadSignature,
    /// `sgnr` is present but is not the account's authorized address.
    #[error("signer {signer} is not the account's authorized address")]
    UnauthorizedSigner {
        /// Who signed.
        signer: Address,
    },
    /// Part of an atomic group.
    #[error("grouped transactions are not accepted")]
    Grouped,
    /// Paid to someone else.
    #[error("receiver mismatch: expected {expected}, got {actual}")]
    ReceiverMismatch {
        /// `payTo`.
        expected: Address,
        /// The transaction's receiver.
        actual: Address,
    },
    /// Less than required.
    #[error("underpaid: {actual} < {required} microALGO")]
    Underpaid {
        /// Required.
        required: u64,
        /// Paid.
        actual: u64,
    },
    /// The note is not exactly the paymentId.
    #[error("note is not the paymentId")]
    NoteMismatch,
    /// Fee above the cap.
    #[error("fee {fee} above {MAX_FEE} microALGO")]
    FeeTooHigh {
        /// The fee.
        fee: u64,
    },
    /// Fee below the network minimum.
    #[error("fee {fee} below the minimum {min}")]
    FeeTooLow {
        /// The fee.
        fee: u64,
        /// The minimum.
        min: u64,
    },
    /// A rekey (account takeover).
    #[error("rekey is not allowed")]
    Rekey,
    /// A close-to (balance sweep).
    #[error("close-remainder-to is not allowed")]
    CloseTo,
    /// Another network's genesis hash.
    #[error("wrong network (genesis hash)")]
    WrongNetwork,
    /// `last_valid` has passed.
    #[error("transaction expired: last valid round {last_valid} < current round {round}")]
    Expired {
        /// `lv`.
        last_valid: u64,
        /// Now.
        round: u64,
    },
    /// `first_valid` is still ahead.
    #[error("transaction not yet valid: first valid round {first_valid} > current round {round}")]
    NotYetValid {
        /// `fv`.
        first_valid: u64,
        /// Now.
        round: u64,
    },
    /// The window is longer than the protocol allows, or inverted.
    #[error("validity window {first_valid}..{last_valid} is not 0..={MAX_WINDOW} rounds")]
    BadWindow {
        /// `fv`.
        first_valid: u64,
        /// `lv`.
        last_valid: u64,
    },
}

impl Violation {
    /// How the violation goes on the wire (`docs/exact-algo.md` §4): one of the six codes
    /// (§4.1) as `error`, this rule's own stable code as `reason` where none of the six is its
    /// own. The code is the one whose remedy ("what the payer does") fits:
    ///
    /// | reason | error | why |
    /// |---|---|---|
    /// | — | `underpaid`, `receiver mismatch`, `transaction expired` | §4.1 names them |
    /// | `bad signature`, `unauthorized signer` | `settlement failed` | the network would reject it (signature): check the wallet |
    /// | `group not allowed`, `fee too high`, `fee too low`, `rekey not allowed`, `close-to not allowed` | `settlement failed` | the wallet built something this receiver does not submit: check the wallet and retry |
    /// | `wrong network` | `settlement failed` | the wallet is on another chain: check the wallet |
    /// | `transaction not yet valid`, `validity window too long` | `transaction expired` | the rounds are wrong: sign again with current parameters |
    /// | `note mismatch` | `unknown or expired paymentId` | the note names no challenge of this request: request a fresh 402 |
    #[must_use]
    pub fn error_code(&self) -> ErrorCode {
        let failed = |reason| ErrorCode::finer(SETTLEMENT_FAILED, reason);
        match self {
            Violation::BadSignature => failed("bad signature"),
            Violation::UnauthorizedSigner { .. } => failed("unauthorized signer"),
            Violation::Grouped => failed("group not allowed"),
            Violation::ReceiverMismatch { .. } => ErrorCode::seed(RECEIVER_MISMATCH),
            Violation::Underpaid { .. } => ErrorCode::seed(UNDERPAID),
            Violation::NoteMismatch => {
                ErrorCode::finer(UNKNOWN_OR_EXPIRED_PAYMENT_ID, "note mismatch")
            }
            Violation::FeeTooHigh { .. } => failed("fee too high"),
            Violation::FeeTooLow { .. } => failed("fee too low"),
            Violation::Rekey => failed("rekey not allowed"),
            Violation::CloseTo => failed("close-to not allowed"),
            Violation::WrongNetwork => failed("wrong network"),
            Violation::Expired { .. } => ErrorCode::seed(TRANSACTION_EXPIRED),
            Violation::NotYetValid { .. } => {
                ErrorCode::finer(TRANSACTION_EXPIRED, "transaction not yet valid")
            }
            Violation::BadWindow { .. } => {
                ErrorCode::finer(TRANSACTION_EXPIRED, "validity window too long")
            }
        }
    }
}

/// `code()` and `reason()` of an error type with an `error_code()` ([`ErrorCode`]): its two
/// halves, each documented with the doc lines given.
macro_rules! code_and_reason {
    ($ty:ident, code: [$($code_doc:literal),+ $(,)?], reason: [$($reason_doc:literal),+ $(,)?]) => {
        impl $ty {
            $(#[doc = $code_doc])+
            #[must_use]
            pub fn code(&self) -> &'static str {
                self.error_code().error
            }

            $(#[doc = $reason_doc])+
            #[must_use]
            pub fn reason(&self) -> Option<&'static str> {
                self.error_code().reason
            }
        }
    };
}
pub(crate) use code_and_reason;

code_and_reason!(
    Violation,
    code: [
        " The `error` on the wire: always one of the six codes of `docs/exact-algo.md` §4.1",
        " ([`crate::wire::SEED_ERRORS`]); see [`Violation::error_code`].",
    ],
    reason: [
        " The finer `reason` sent beside [`Violation::code`] (`fee too high`), `None` for the",
        " cases one of the six codes names itself.",
    ]
);

/// Checks `p` against `req` as of `chain`: the signature first, then every rule of
/// `docs/exact-algo.md` §3.
///
/// # Errors
/// The first [`Violation`].
pub fn check(p: &SignedPay, req: &Requirement, chain: &ChainView) -> Result<(), Violation> {
    p.verify_signature()
        .map_err(|_: TxnError| Violation::BadSignature)?;
    if let Some(signer) = p.auth
        && chain.auth_addr != Some(signer)
    {
        return Err(Violation::UnauthorizedSigner { signer });
    }
    let t = &p.txn;
    if t.group.is_some() {
        return Err(Violation::Grouped);
    }
    if t.genesis_hash != req.genesis_hash {
        return Err(Violation::WrongNetwork);
    }
    if t.receiver != req.pay_to {
        return Err(Violation::ReceiverMismatch {
            expected: req.pay_to,
            actual: t.receiver,
        });
    }
    if t.amount < req.amount {
        return Err(Violation::Underpaid {
            required: req.amount,
            actual: t.amount,
        });
    }
    if t.note != req.payment_id.as_bytes() {
        return Err(Violation::NoteMismatch);
    }
    if t.fee > MAX_FEE {
        return Err(Violation::FeeTooHigh { fee: t.fee });
    }
    if t.fee < req.min_fee {
        return Err(Violation::FeeTooLow {
            fee: t.fee,
            min: req.min_fee,
        });
    }
    if t.rekey_to.is_some() {
        return Err(Violation::Rekey);
    }
    if t.close_to.is_some() {
        return Err(Violation::CloseTo);
    }
    if t.last_valid < t.first_valid || t.last_valid - t.first_valid > MAX_WINDOW {
        return Err(Violation::BadWindow {
            first_valid: t.first_valid,
            last_valid: t.last_valid,
        });
    }
    // The next block is `round + 1`: a transaction whose last valid round is `round` can no
    // longer be included.
    if t.last_valid <= chain.round {
        return Err(Violation::Expired {
            last_valid: t.last_valid,
            round: chain.round,
        });
    }
    if t.first_valid > chain.round.saturating_add(1) {
        return Err(Violation::NotYetValid {
            first_valid: t.first_valid,
            round: chain.round,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::PayTxn;
    use ed25519_dalek::{Signer, SigningKey};

    const PAY_TO: &str = "PNWOET7LLOWMBMLE4KOCELCX6X3D3Q4H2Q4QJASYIEOF7YIPPQBG3YQ5YI";
    const PID: &str = "0123456789abcdef0123456789abcdef";

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[3u8; 32])
    }

    fn good() -> PayTxn {
        PayTxn {
            sender: Address(key().verifying_key().to_bytes()),
            receiver: PAY_TO.parse().unwrap(),
            amount: 1000,
            fee: 1000,
            first_valid: 500,
            last_valid: 1500,
            genesis_id: "testnet-v1.0".into(),
            genesis_hash: [9; 32],
            note: PID.as_bytes().to_vec(),
            close_to: None,
            rekey_to: None,
            group: None,
            lease: None,
        }
    }

    fn sign(t: PayTxn) -> SignedPay {
        let sig = key().sign(&t.signing_bytes()).to_bytes();
        // Through the wire format and back: rules run on what a verifier would decode.
        SignedPay::decode(
            &SignedPay {
                txn: t,
                sig,
                auth: None,
            }
            .encode(),
        )
        .unwrap()
    }

    fn req() -> Requirement {
        Requirement {
            pay_to: PAY_TO.parse().unwrap(),
            amount: 1000,
            payment_id: PID.into(),
            min_fee: 1000,
            genesis_hash: [9; 32],
        }
    }

    const NOW: ChainView = ChainView {
        round: 1000,
        auth_addr: None,
    };

    #[test]
    fn a_good_payment_passes_and_overpaying_is_allowed() {
        assert_eq!(check(&sign(good()), &req(), &NOW), Ok(()));
        let more = PayTxn {
            amount: 5000,
            ..good()
        };
        assert_eq!(check(&sign(more), &req(), &NOW), Ok(()));
    }

    #[test]
    fn every_rule_is_enforced_with_its_code() {
        let other: Address = "IDUTJEUIEVSMXTU4LGTJWZ2UE2E6TIODUKU6UW3FU3UKIQQ77RLUBBBFLA"
            .parse()
            .unwrap();
        let cases: Vec<(PayTxn, &str)> = vec![
            (
                PayTxn {
                    amount: 999,
                    ..good()
                },
                "underpaid",
            ),
            (
                PayTxn {
                    receiver: other,
                    ..good()
                },
                "receiver mismatch",
            ),
            (
                PayTxn {
                    note: b"other-id".to_vec(),
                    ..good()
                },
                "note mismatch",
            ),
            (
                PayTxn {
                    note: Vec::new(),
                    ..good()
                },
                "note mismatch",
            ),
            (
                PayTxn {
                    fee: 2001,
                    ..good()
                },
                "fee too high",
            ),
            (PayTxn { fee: 999, ..good() }, "fee too low"),
            (
                PayTxn {
                    rekey_to: Some(other),
                    ..good()
                },
                "rekey not allowed",
            ),
            (
                PayTxn {
                    close_to: Some(other),
                    ..good()
                },
                "close-to not allowed",
            ),
            (
                PayTxn {
                    group: Some([1; 32]),
                    ..good()
                },
                "group not allowed",
            ),
            (
                PayTxn {
                    genesis_hash: [8; 32],
                    ..good()
                },
                "wrong network",
            ),
            (
                PayTxn {
                    first_valid: 100,
                    last_valid: 999,
                    ..good()
                },
                "transaction expired",
            ),
            (
                PayTxn {
                    first_valid: 1200,
                    last_valid: 2000,
                    ..good()
                },
                "transaction not yet valid",
            ),
            (
                PayTxn {
                    first_valid: 900,
                    last_valid: 1901,
                    ..good()
                },
                "validity window too long",
            ),
        ];
        for (t, code) in cases {
            let got = check(&sign(t.clone()), &req(), &NOW);
            let v = got.expect_err("refused");
            assert_eq!(v.error_code().most_specific(), code, "{t:?}");
            assert!(crate::wire::SEED_ERRORS.contains(&v.code()), "{v:?}");
        }
    }

    #[test]
    fn signatures_are_checked_first() {
        let mut p = sign(PayTxn {
            amount: 1,
            ..good()
        });
        p.sig[0] ^= 1;
        assert_eq!(check(&p, &req(), &NOW), Err(Violation::BadSignature));
    }

    #[test]
    fn a_rekeyed_signer_must_be_the_accounts_auth_address() {
        let t = good();
        let sig = key().sign(&t.signing_bytes()).to_bytes();
        let signer = t.sender;
        // The sender signs but names itself as sgnr: only valid if algod says so.
        let p = SignedPay {
            txn: t,
            sig,
            auth: Some(signer),
        };
        assert_eq!(
            check(&p, &req(), &NOW),
            Err(Violation::UnauthorizedSigner { signer })
        );
        let view = ChainView {
            round: 1000,
            auth_addr: Some(signer),
        };
        assert_eq!(check(&p, &req(), &view), Ok(()));
    }
}
