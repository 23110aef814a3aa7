//! The EVM localnet for tests and demos: anvil with Circle's FiatTokenV2_2, started by
//! `scripts/x402/localnet.mjs` (which `scripts/test-all` runs), described by environment
//! variables:
//!
//! | variable | meaning |
//! | --- | --- |
//! | `X402_RPC_URL` | anvil's JSON-RPC endpoint |
//! | `X402_NETWORK` | `eip155:<chain id>` |
//! | `X402_TOKEN` | the FiatTokenV2_2 contract |
//! | `X402_TOKEN_NAME`, `X402_TOKEN_VERSION` | its EIP-712 domain (`USD Coin`, `2`) |
//! | `X402_MINTER` | an unlocked anvil account configured as a minter |
//!
//! [`Localnet::from_env`] follows the project rule: missing in CI is a failure, elsewhere a
//! visible skip ([`test_kit::localnet::missing`]). Tests make their own accounts
//! ([`Localnet::funded_payer`], [`Localnet::funded_settler`]) so they never share a nonce
//! sequence or a balance.

use alloy_primitives::{Address, U256};
use alloy_sol_types::SolCall;
use serde_json::json;

use rail_x402::evm::{IFiatToken, LocalSigner};
use rail_x402::rpc::{RpcClient, RpcError};
use rail_x402::token::Token;

/// One `eth_sendTransaction` from the minter at a time in this process (anvil picks their
/// nonces; two at once can collide).
static MINTER_TX: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A running localnet.
#[derive(Clone, Debug)]
pub struct Localnet {
    /// JSON-RPC client.
    pub rpc: RpcClient,
    /// The token (network, address, EIP-712 domain).
    pub token: Token,
    /// Chain id.
    pub chain_id: u64,
    /// Unlocked minter account.
    pub minter: Address,
}

impl Localnet {
    /// The localnet described by the environment, or `None` (after reporting it missing:
    /// a panic in CI, a SKIPPED line elsewhere).
    ///
    /// # Panics
    /// In CI when the localnet is not configured or does not answer.
    pub async fn from_env() -> Option<Self> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        let (Some(url), Some(network), Some(token), Some(minter)) = (
            var("X402_RPC_URL"),
            var("X402_NETWORK"),
            var("X402_TOKEN"),
            var("X402_MINTER"),
        ) else {
            test_kit::localnet::missing(
                "x402 anvil",
                "X402_RPC_URL/X402_NETWORK/X402_TOKEN/X402_MINTER not set (scripts/x402/localnet.mjs)",
            );
            return None;
        };
        let (Ok(token), Ok(minter)) = (token.parse::<Address>(), minter.parse::<Address>()) else {
            test_kit::localnet::missing(
                "x402 anvil",
                "X402_TOKEN or X402_MINTER is not an address",
            );
            return None;
        };
        let rpc = match RpcClient::new(&url) {
            Ok(r) => r,
            Err(e) => {
                test_kit::localnet::missing("x402 anvil", &e.to_string());
                return None;
            }
        };
        let chain_id = match rpc.chain_id().await {
            Ok(c) => c,
            Err(e) => {
                test_kit::localnet::missing("x402 anvil", &format!("{url}: {e}"));
                return None;
            }
        };
        let name = var("X402_TOKEN_NAME").unwrap_or_else(|| "USD Coin".into());
        let version = var("X402_TOKEN_VERSION").unwrap_or_else(|| "2".into());
        Some(Self {
            rpc,
            token: Token::new(&network, token, &name, &version),
            chain_id,
            minter,
        })
    }

    /// Mints `amount` atomic units to `to` (from the unlocked minter) and waits for it.
    ///
    /// # Errors
    /// [`RpcError`], or a reverted mint.
    pub async fn mint(&self, to: Address, amount: U256) -> Result<(), RpcError> {
        // anvil picks the nonce of an `eth_sendTransaction`; two at once from the minter can
        // get the same one ("replacement transaction underpriced"). One mint at a time in this
        // process, and a retry for other processes.
        let _one = MINTER_TX.lock().await;
        let input = IFiatToken::mintCall { to, amount }.abi_encode().into();
        let mut attempt = 0u32;
        let hash = loop {
            match self
                .rpc
                .send_transaction(self.minter, self.token.address, &input)
                .await
            {
                Ok(h) => break h,
                Err(RpcError::Rpc { message, .. })
                    if attempt < 5
                        && (message.contains("underpriced") || message.contains("nonce")) =>
                {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e),
            }
        };
        let r = self.mined(hash).await?;
        if r.success {
            Ok(())
        } else {
            Err(RpcError::Reverted {
                reason: "mint reverted".into(),
            })
        }
    }

    async fn mined(
        &self,
        hash: alloy_primitives::B256,
    ) -> Result<rail_x402::rpc::Receipt, RpcError> {
        self.rpc
            .wait_receipt(
                hash,
                std::time::Duration::from_millis(5),
                std::time::Duration::from_secs(30),
            )
            .await
    }

    /// Deploys `creation` (creation code with its constructor arguments appended) from the
    /// minter account and returns the new contract's address.
    ///
    /// # Errors
    /// [`RpcError`], or a failed creation.
    pub async fn deploy(&self, creation: &alloy_primitives::Bytes) -> Result<Address, RpcError> {
        let _one = MINTER_TX.lock().await;
        let hash = self.rpc.send_create(self.minter, creation).await?;
        let r = self.mined(hash).await?;
        match (r.success, r.contract_address) {
            (true, Some(a)) => Ok(a),
            _ => Err(RpcError::Reverted {
                reason: "contract creation failed".into(),
            }),
        }
    }

    /// Gives `who` `wei` of native balance (`anvil_setBalance`).
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn set_eth(&self, who: Address, wei: U256) -> Result<(), RpcError> {
        self.rpc
            .request("anvil_setBalance", json!([who, wei]))
            .await
            .map(|_| ())
    }

    /// A new key holding `amount` atomic units of the token.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn funded_payer(&self, amount: U256) -> Result<LocalSigner, RpcError> {
        let s = LocalSigner::random();
        if !amount.is_zero() {
            self.mint(s.address(), amount).await?;
        }
        Ok(s)
    }

    /// A new key with 100 ETH for gas: a settler with its own nonce sequence.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn funded_settler(&self) -> Result<LocalSigner, RpcError> {
        let s = LocalSigner::random();
        self.set_eth(s.address(), U256::from(10u64).pow(U256::from(20u64)))
            .await?;
        Ok(s)
    }

    /// The token balance of `who`.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn balance(&self, who: Address) -> Result<U256, RpcError> {
        use rail_x402::verify::ChainView;
        self.rpc.balance_of(self.token.address, who).await
    }
}
