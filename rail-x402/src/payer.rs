//! The payer: choose one of a 402's `accepts` by policy, and sign its EIP-3009
//! authorization.
//!
//! Signing follows `@x402/evm`'s client (`exact/client/eip3009.ts`): a random 32-byte nonce,
//! `validAfter = now - 600` (clock skew), `validBefore = now + maxTimeoutSeconds`, the token
//! domain `{extra.name, extra.version, chainId, asset}`, `to = payTo`, `value = amount`.
//! What is chosen is never "the first option": only `exact` on an allowed network, for an
//! allowed asset, at most the policy's maximum, the cheapest of those.

use alloy_primitives::{Address, B256, U256};

use crate::eip3009::{SignatureError, TokenDomain, TransferWithAuthorization};
use crate::evm::LocalSigner;
use crate::verify::{eip155_chain_id, unix_secs};
use crate::wire::{
    Eip3009Authorization, ExactEvmPayload, PaymentPayload, PaymentRequired, PaymentRequirements,
    SCHEME_EXACT, V2,
};

/// Seconds `validAfter` is set in the past, as the reference client does.
pub const VALID_AFTER_SKEW_SECONDS: u64 = 600;
/// The longest `maxTimeoutSeconds` the payer signs for (an authorization is a bearer
/// instrument until it expires).
pub const MAX_VALIDITY_SECONDS: u64 = 3600;

/// What the payer may pay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// `(CAIP-2 network, token)` pairs the payer pays in; nothing else.
    pub assets: Vec<(String, Address)>,
    /// Most the payer pays for one request, in the token's atomic units.
    pub max_amount: U256,
}

impl Policy {
    /// Pays `token` on `network`, at most `max_amount` atomic units per request.
    #[must_use]
    pub fn new(network: impl Into<String>, token: Address, max_amount: U256) -> Self {
        Self {
            assets: vec![(network.into(), token)],
            max_amount,
        }
    }

    /// Why `r` is not payable under this policy, if it is not.
    #[must_use]
    pub fn refusal(&self, r: &PaymentRequirements) -> Option<String> {
        if r.scheme != SCHEME_EXACT {
            return Some(format!("scheme {:?} is not exact", r.scheme));
        }
        if eip155_chain_id(&r.network).is_none() {
            return Some(format!("network {} is not eip155", r.network));
        }
        let Ok(asset) = r.asset.parse::<Address>() else {
            return Some(format!("asset {:?} is not an address", r.asset));
        };
        if !self
            .assets
            .iter()
            .any(|(n, a)| *n == r.network && *a == asset)
        {
            return Some(format!(
                "{} on {} is not an allowed asset",
                r.asset, r.network
            ));
        }
        if r.pay_to.parse::<Address>().is_err() {
            return Some(format!("payTo {:?} is not an address", r.pay_to));
        }
        let amount = r.amount.value();
        if amount.is_zero() {
            return Some("amount is zero".into());
        }
        if amount > self.max_amount {
            return Some(format!(
                "amount {amount} is above the maximum {}",
                self.max_amount
            ));
        }
        if r.max_timeout_seconds > MAX_VALIDITY_SECONDS {
            return Some(format!(
                "maxTimeoutSeconds {} is above {MAX_VALIDITY_SECONDS}",
                r.max_timeout_seconds
            ));
        }
        match &r.extra {
            Some(e)
                if e.name.as_deref().is_some_and(|n| !n.is_empty())
                    && e.version.as_deref().is_some_and(|v| !v.is_empty()) =>
            {
                None
            }
            _ => Some("extra.name / extra.version (EIP-712 domain) missing".into()),
        }
    }

    /// The cheapest payable option of `required`.
    ///
    /// # Errors
    /// [`PayerError::NothingPayable`] with each option's refusal.
    pub fn choose<'a>(
        &self,
        required: &'a PaymentRequired,
    ) -> Result<&'a PaymentRequirements, PayerError> {
        let mut refusals = Vec::new();
        let mut best: Option<&PaymentRequirements> = None;
        for r in &required.accepts {
            match self.refusal(r) {
                Some(why) => refusals.push(why),
                None => {
                    if best.is_none_or(|b| r.amount.value() < b.amount.value()) {
                        best = Some(r);
                    }
                }
            }
        }
        best.ok_or(PayerError::NothingPayable(refusals))
    }
}

/// Why the payer did not pay.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PayerError {
    /// No option is allowed by the policy (one reason per option).
    #[error("no payable option: {}", .0.join("; "))]
    NothingPayable(Vec<String>),
    /// Signing failed.
    #[error("signing: {0}")]
    Signing(#[from] SignatureError),
}

/// A payer with a local key.
#[derive(Clone, Debug)]
pub struct X402Payer {
    signer: LocalSigner,
    policy: Policy,
    /// The paying account when it is a contract wallet the signer owns (ERC-1271).
    wallet: Option<Address>,
    /// What validity windows are written from (the host's clock unless one is injected).
    clock: rail_core::SharedClock,
}

impl X402Payer {
    /// Pays with `signer` within `policy`.
    #[must_use]
    pub fn new(signer: LocalSigner, policy: Policy) -> Self {
        Self {
            signer,
            policy,
            wallet: None,
            clock: std::sync::Arc::new(rail_core::SystemClock),
        }
    }

    /// Writes validity windows from `clock` instead of the host's clock.
    #[must_use]
    pub fn with_clock(mut self, clock: rail_core::SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Pays from the contract wallet `wallet`, whose ERC-1271 `isValidSignature` accepts
    /// `signer`'s signatures of the EIP-712 digest (`from` = the wallet).
    #[must_use]
    pub fn for_wallet(signer: LocalSigner, wallet: Address, policy: Policy) -> Self {
        Self {
            wallet: Some(wallet),
            ..Self::new(signer, policy)
        }
    }

    /// The paying address (`from`): the wallet, if any, else the signer's own.
    #[must_use]
    pub fn address(&self) -> Address {
        self.wallet.unwrap_or_else(|| self.signer.address())
    }

    /// The policy.
    #[must_use]
    pub const fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Chooses an option of `required` and signs it now.
    ///
    /// # Errors
    /// [`PayerError`].
    pub fn pay(&self, required: &PaymentRequired) -> Result<PaymentPayload, PayerError> {
        let chosen = self.policy.choose(required)?;
        self.sign(
            required,
            chosen,
            unix_secs(self.clock.now()),
            B256::from(rand::random::<[u8; 32]>()),
        )
    }

    /// Pays a **v1** 402 (a JSON body with `x402Version: 1`): the same policy over the v1
    /// options (network names mapped to `eip155:<id>` through [`crate::v1::EVM_NETWORKS`]),
    /// the same EIP-3009 authorization, sent as a v1 `PaymentPayloadV1`.
    ///
    /// # Errors
    /// [`PayerError`].
    pub fn pay_v1(
        &self,
        required: &crate::v1::PaymentRequiredV1,
    ) -> Result<crate::v1::PaymentPayloadV1, PayerError> {
        let mut refusals = Vec::new();
        let mut best: Option<(&crate::v1::PaymentRequirementsV1, PaymentRequirements)> = None;
        for r in &required.accepts {
            let Some(chain) = crate::v1::network_chain_id(&r.network) else {
                refusals.push(format!("v1 network {:?} is unknown", r.network));
                continue;
            };
            let as_v2 = PaymentRequirements {
                scheme: r.scheme.clone(),
                network: format!("eip155:{chain}"),
                amount: r.max_amount_required,
                asset: r.asset.clone(),
                pay_to: r.pay_to.clone(),
                max_timeout_seconds: r.max_timeout_seconds,
                extra: r.extra.clone(),
            };
            match self.policy.refusal(&as_v2) {
                Some(why) => refusals.push(why),
                None => {
                    if best
                        .as_ref()
                        .is_none_or(|(_, b)| as_v2.amount.value() < b.amount.value())
                    {
                        best = Some((r, as_v2));
                    }
                }
            }
        }
        let (chosen, as_v2) = best.ok_or(PayerError::NothingPayable(refusals))?;
        let wrapper = PaymentRequired {
            x402_version: V2::default(),
            error: None,
            reason: None,
            resource: Some(crate::wire::ResourceInfo::new(chosen.resource.clone())),
            accepts: vec![as_v2.clone()],
            extensions: None,
        };
        let signed = self.sign(
            &wrapper,
            &as_v2,
            unix_secs(self.clock.now()),
            B256::from(rand::random::<[u8; 32]>()),
        )?;
        Ok(crate::v1::PaymentPayloadV1 {
            x402_version: crate::v1::V1::default(),
            scheme: chosen.scheme.clone(),
            network: chosen.network.clone(),
            payload: signed.payload,
        })
    }

    /// Signs `accepted` (one of `required.accepts`) at time `now` with `nonce`.
    ///
    /// # Errors
    /// [`PayerError`]: `accepted` is checked against the policy again.
    pub fn sign(
        &self,
        required: &PaymentRequired,
        accepted: &PaymentRequirements,
        now: u64,
        nonce: B256,
    ) -> Result<PaymentPayload, PayerError> {
        if let Some(why) = self.policy.refusal(accepted) {
            return Err(PayerError::NothingPayable(vec![why]));
        }
        // `refusal` accepted these; a failed parse is still an error, never a default (a
        // zero address or chain id would sign for something else).
        let bad = |what: &str| PayerError::NothingPayable(vec![format!("{what} does not parse")]);
        let chain_id = eip155_chain_id(&accepted.network).ok_or_else(|| bad("network"))?;
        let asset: Address = accepted.asset.parse().map_err(|_| bad("asset"))?;
        let pay_to: Address = accepted.pay_to.parse().map_err(|_| bad("payTo"))?;
        let extra = accepted.extra.clone().ok_or_else(|| bad("extra"))?;
        let domain = TokenDomain {
            name: extra.name.ok_or_else(|| bad("extra.name"))?,
            version: extra.version.ok_or_else(|| bad("extra.version"))?,
            chain_id,
            verifying_contract: asset,
        };
        let message = TransferWithAuthorization {
            from: self.address(),
            to: pay_to,
            value: accepted.amount.value(),
            validAfter: U256::from(now.saturating_sub(VALID_AFTER_SKEW_SECONDS)),
            validBefore: U256::from(now.saturating_add(accepted.max_timeout_seconds)),
            nonce,
        };
        let signature = self.signer.sign_hash(&message.signing_hash(&domain))?;
        Ok(PaymentPayload {
            x402_version: V2::default(),
            resource: required.resource.clone(),
            accepted: accepted.clone(),
            payload: ExactEvmPayload {
                signature: signature.to_bytes().to_vec().into(),
                authorization: Eip3009Authorization {
                    from: message.from.into(),
                    to: message.to.into(),
                    value: message.value.into(),
                    valid_after: message.validAfter.into(),
                    valid_before: message.validBefore.into(),
                    nonce: message.nonce.into(),
                },
            },
            extensions: required.extensions.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verify::verify_exact_evm;
    use crate::wire::{Extra, ResourceInfo};

    fn req(amount: u64, network: &str, asset: Address) -> PaymentRequirements {
        PaymentRequirements {
            scheme: "exact".into(),
            network: network.into(),
            amount: amount.into(),
            asset: asset.to_checksum(None),
            pay_to: Address::repeat_byte(0x22).to_checksum(None),
            max_timeout_seconds: 60,
            extra: Some(Extra::eip712("USD Coin", "2")),
        }
    }

    fn required(accepts: Vec<PaymentRequirements>) -> PaymentRequired {
        PaymentRequired {
            x402_version: V2::default(),
            error: None,
            reason: None,
            resource: Some(ResourceInfo::new("http://x/weather")),
            accepts,
            extensions: None,
        }
    }

    #[test]
    fn chooses_the_cheapest_allowed_never_the_first() {
        let usdc = Address::repeat_byte(0x11);
        let other = Address::repeat_byte(0x33);
        let policy = Policy::new("eip155:31337", usdc, U256::from(5000));
        let r = required(vec![
            req(10, "eip155:1", usdc),       // wrong network
            req(10, "eip155:31337", other),  // wrong asset
            req(9000, "eip155:31337", usdc), // too dear
            req(3000, "eip155:31337", usdc),
            req(2000, "eip155:31337", usdc),
        ]);
        assert_eq!(policy.choose(&r).unwrap().amount.value(), U256::from(2000));
        let none = required(vec![req(10, "eip155:1", usdc)]);
        assert!(matches!(
            policy.choose(&none),
            Err(PayerError::NothingPayable(v)) if v.len() == 1
        ));
    }

    #[test]
    fn signed_payment_verifies() {
        let usdc = Address::repeat_byte(0x11);
        let payer = X402Payer::new(
            LocalSigner::random(),
            Policy::new("eip155:31337", usdc, U256::from(5000)),
        );
        let r = required(vec![req(1000, "eip155:31337", usdc)]);
        let now = 1_800_000_000;
        let p = payer
            .sign(&r, &r.accepts[0], now, B256::repeat_byte(7))
            .unwrap();
        let ok = verify_exact_evm(&p, &r.accepts[0], now).unwrap();
        assert_eq!(ok.payer, payer.address());
        // Round trip through the header, as it travels.
        let back = PaymentPayload::from_header(&p.to_header().unwrap()).unwrap();
        assert_eq!(back, p);
    }
}
