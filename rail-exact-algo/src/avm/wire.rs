//! The AVM scheme's wire: its `accepts[]` entry ([`Requirements`]), the payment envelope
//! ([`Envelope`] around [`Payload`]), the facilitator's answers ([`VerifyResponse`],
//! [`SettleResponse`], [`Supported`]), the network ids and the error codes.
//!
//! Shapes follow the x402-avm SDK 2.0.2 (`x402/schemas/payments.py`, `responses.py`,
//! `mechanisms/avm/types.py`; research `docs/research/x402-avm-2.0.2.md` §2–§3, §5.5, §7.1):
//! `asset` and `amount` are decimal strings, `maxTimeoutSeconds` is always present, `extra` is
//! always an object, a settle answer always carries `transaction` and `network`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::wire::{normalize_network, same_network};

/// The scheme's name.
pub const SCHEME: &str = "exact";
/// Algorand testnet, spelled with its whole genesis hash as x402-avm spells it (the Python SDK
/// accepts no other spelling: `mechanisms/avm/utils.py:60-82`).
pub const TESTNET: &str = "algorand:SGO1GKSzyE7IEPItTxCByw9x8FmnrCDexi9/cOUJOiI=";
/// Algorand mainnet, whole-hash spelling.
pub const MAINNET: &str = "algorand:wGHE2Pwdvd7S12BL5FaOP20EGYesN73ktiC1qzkkit8=";
/// USDC on testnet (ASA id).
pub const USDC_TESTNET: u64 = 10_458_941;
/// USDC on mainnet (ASA id).
pub const USDC_MAINNET: u64 = 31_566_704;
/// USDC's decimals.
pub const USDC_DECIMALS: u32 = 6;
/// The most a fee payer's transactions may cost it in one group, µALGO (the SDK's
/// `MAX_REASONABLE_FEE`, `mechanisms/avm/constants.py:21`).
pub const MAX_FEE_PAYER_FEE: u64 = 16_000;
/// The most the fee payer's transaction may cost it per member of the group, µALGO
/// (`@x402/avm`'s `maxReasonableGroupFee`: five times the minimum fee, room for congestion).
/// A group of the transfer and the fee transaction may so cost it at most 10 000.
pub const MAX_FEE_PER_MEMBER: u64 = 5_000;
/// The longest note the fee payer's transaction may carry, bytes. The SDKs write
/// `x402-fee-payer-<time>`: 34–35 bytes with nanoseconds (x402-avm, Python), 28 with
/// milliseconds (`@x402/avm`); the spec's example has none. The fee payer signs it, so a payer
/// may not put more of its own words on chain under the fee payer's name.
pub const MAX_FEE_PAYER_NOTE: usize = 64;
/// The most transactions in a group (`MaxTxGroupSize`).
pub use crate::txn::MAX_GROUP;

/// The error codes, as the SDK names them (`mechanisms/avm/constants.py:100-128`).
pub mod code {
    /// Not `exact`.
    pub const UNSUPPORTED_SCHEME: &str = "unsupported_scheme";
    /// The payment names another network.
    pub const NETWORK_MISMATCH: &str = "network_mismatch";
    /// The payload is not the scheme's.
    pub const INVALID_PAYLOAD: &str = "invalid_exact_avm_payload";
    /// `paymentIndex` outside the group.
    pub const INVALID_PAYMENT_INDEX: &str = "invalid_exact_avm_payload_payment_index";
    /// More than 16 transactions.
    pub const GROUP_TOO_LARGE: &str = "invalid_exact_avm_payload_group_too_large";
    /// No transactions.
    pub const EMPTY_GROUP: &str = "invalid_exact_avm_payload_empty_group";
    /// A member is not base64 of a transaction this scheme reads.
    pub const GROUP_DECODE_FAILED: &str = "invalid_exact_avm_payload_group_decode_failed";
    /// A transaction type no member may have.
    pub const BLOCKED_TXN_TYPE: &str = "invalid_exact_avm_payload_blocked_transaction_type";
    /// The payment is not an asset transfer of the asset asked for.
    pub const ASSET_ID_MISMATCH: &str = "invalid_exact_avm_payload_asset_id_mismatch";
    /// The payment pays someone else.
    pub const RECIPIENT_MISMATCH: &str = "invalid_exact_avm_payload_recipient_mismatch";
    /// The payment's amount is not the price (the SDK requires equality).
    pub const AMOUNT_INSUFFICIENT: &str = "invalid_exact_avm_payload_amount_insufficient";
    /// Members of one group carry different group ids.
    pub const GROUP_ID_MISMATCH: &str = "invalid_exact_avm_payload_group_id_mismatch";
    /// A group without a group id.
    pub const MISSING_GROUP_ID: &str = "invalid_exact_avm_payload_missing_group_id";
    /// A member nobody will sign.
    pub const MISSING_SIGNATURE: &str = "invalid_exact_avm_payload_missing_signature";
    /// A signature that does not verify.
    pub const INVALID_SIGNATURE: &str = "invalid_exact_avm_payload_invalid_signature";
    /// `extra.feePayer` offered but the group has no transaction from it.
    pub const FEE_PAYER_MISSING: &str = "invalid_exact_avm_payload_missing_fee_payer";
    /// `extra.feePayer` is not this facilitator's.
    pub const FEE_PAYER_NOT_MANAGED: &str = "fee_payer_not_managed_by_facilitator";
    /// The fee payer's transaction is not a zero self-payment within the fee cap, without a
    /// lease, with a note of at most [`super::MAX_FEE_PAYER_NOTE`] bytes.
    pub const FEE_PAYER_INVALID_TXN: &str =
        "invalid_exact_avm_payload_fee_payer_transaction_invalid";
    /// The payment is sent by the fee payer.
    pub const FEE_PAYER_TRANSFERRING: &str =
        "invalid_exact_avm_payload_fee_payer_transferring_funds";
    /// The fee payer's transaction moves ALGO.
    pub const FEE_PAYER_HAS_AMOUNT: &str = "invalid_exact_avm_payload_fee_payer_has_amount";
    /// The fee payer's transaction closes its account.
    pub const FEE_PAYER_HAS_CLOSE: &str = "invalid_exact_avm_payload_fee_payer_has_close_to";
    /// The fee payer's transaction rekeys its account.
    pub const FEE_PAYER_HAS_REKEY: &str = "invalid_exact_avm_payload_fee_payer_has_rekey_to";
    /// The chain would refuse the group (or the fee payer could not sign).
    pub const SIMULATION_FAILED: &str = "transaction_simulation_failed";
    /// The submission failed.
    pub const TRANSACTION_FAILED: &str = "transaction_failed";
    /// A member rekeys its sender.
    pub const REKEY_DETECTED: &str = "invalid_exact_avm_payload_rekey_detected";
    /// A member closes an account or a holding.
    pub const CLOSE_TO_DETECTED: &str = "invalid_exact_avm_payload_close_to_detected";
    /// A member is for another chain.
    pub const GENESIS_HASH_MISMATCH: &str = "invalid_exact_avm_payload_genesis_hash_mismatch";
    /// The group's validity window has passed (this project's, beside the SDK's codes: the
    /// SDK leaves it to the chain).
    pub const EXPIRED: &str = "invalid_exact_avm_payload_expired";
    /// This group was already settled (served once).
    pub const ALREADY_SETTLED: &str = "invalid_exact_avm_payload_already_settled";
    /// A member that is neither the transfer that pays nor the fee payer's one fee
    /// transaction (this project's, beside the SDK's codes: the SDK and the spec let a group
    /// carry more; here the fee payer would pay for them).
    pub const UNEXPECTED_TRANSACTION: &str = "invalid_exact_avm_payload_unexpected_transaction";
}

/// How a receiver spells its network in the entries it writes: both are read everywhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Spelling {
    /// `algorand:` + the whole base64 genesis hash: x402-avm (PyPI 2.0.2, npm `@x402-avm/*`).
    #[default]
    GenesisHash,
    /// `algorand:` + the first 32 characters (CAIP-2): upstream `@x402/avm` and exact-algo.
    Caip2,
}

impl Spelling {
    /// The network of `genesis_hash` in this spelling.
    #[must_use]
    pub fn network(self, genesis_hash: &[u8; 32]) -> String {
        match self {
            Spelling::GenesisHash => {
                format!("algorand:{}", data_encoding::BASE64.encode(genesis_hash))
            }
            Spelling::Caip2 => crate::wire::network_id(genesis_hash),
        }
    }
}

/// Whether `network` is an Algorand network id, in either spelling.
#[must_use]
pub fn is_algorand(network: &str) -> bool {
    normalize_network(network).is_some()
}

/// Whether two network ids name the same chain.
#[must_use]
pub fn same(a: &str, b: &str) -> bool {
    same_network(a, b)
}

/// `extra` of an entry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Extra {
    /// The asset's decimals (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decimals: Option<u32>,
    /// The facilitator's account that pays the group's fees, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fee_payer: Option<String>,
    /// The chain's genesis hash, base64 (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub genesis_hash: Option<String>,
    /// The chain's genesis id (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub genesis_id: Option<String>,
    /// The asset's name (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// One `accepts[]` entry of the scheme (x402 v2 `PaymentRequirements`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Requirements {
    /// `exact`.
    pub scheme: String,
    /// `algorand:…`.
    pub network: String,
    /// The ASA id, a decimal string.
    pub asset: String,
    /// The amount in the asset's base units, a decimal string.
    pub amount: String,
    /// Who is paid (an Algorand address).
    pub pay_to: String,
    /// How long a payment may take.
    pub max_timeout_seconds: u64,
    /// `extra` (always an object on the wire).
    #[serde(default)]
    pub extra: Extra,
}

/// The scheme's payload: the group and which member pays.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Payload {
    /// Base64 (standard, padded) of each member's msgpack, in group order.
    pub payment_group: Vec<String>,
    /// The member that pays (`axfer`).
    #[serde(default)]
    pub payment_index: usize,
}

/// A payment (x402 v2 `PaymentPayload`) of this scheme.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope {
    /// 2.
    pub x402_version: u8,
    /// The group.
    pub payload: Payload,
    /// The entry the payer chose, as it was offered.
    pub accepted: Requirements,
    /// The paid resource, echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<Value>,
    /// Extensions, echoed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extensions: Option<Value>,
}

/// `POST /verify` and `POST /settle` bodies (the version may be absent): the transport's
/// [`x402_transport::facilitator::FacilitatorRequest`] of this scheme's types.
pub type FacilitatorRequest =
    x402_transport::facilitator::FacilitatorRequest<Envelope, Requirements, Option<u8>>;

/// The answer of `/verify`: the transport's, the same for every scheme.
pub use x402_transport::facilitator::VerifyResponse;

/// The answer of `/settle` (and the `PAYMENT-RESPONSE` JSON), one kind of `/supported`, and
/// the answer of `GET /supported`: the transport's, the same for every scheme. This scheme's
/// `transaction` is the payment transaction's id (`paymentGroup[paymentIndex]`, as the spec
/// says; the Python SDK's reference signer answers the group's first), empty when nothing was
/// sent; `network` is spelled as the payment spelled it; a kind's `extra` is
/// `{"feePayer": …}` when fees are paid by the facilitator.
pub use x402_transport::facilitator::{SettleResponse, Supported, SupportedKind as Kind};
