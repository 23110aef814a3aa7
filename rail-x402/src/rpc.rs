//! A small Ethereum JSON-RPC client (over `reqwest`) with the calls the rail makes, and the
//! token reads of [`ChainView`].
//!
//! Shapes follow the Ethereum execution API (`ethereum/execution-apis`): quantities are
//! `0x`-prefixed minimal hex, data is `0x` hex, errors are `{code, message, data?}`. A revert in
//! `eth_call` / `eth_estimateGas` is code `3` with the revert data in `data` (geth, anvil);
//! [`RpcError::Reverted`] carries the decoded `Error(string)` reason
//! (e.g. `FiatTokenV2: invalid signature`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use alloy_primitives::{Address, B256, Bytes, U256};
use alloy_sol_types::{SolCall, SolError, SolEvent};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::evm::IFiatToken;
use crate::verify::ChainView;

/// Why a JSON-RPC call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum RpcError {
    /// No answer (connection refused, timeout, TLS): the outcome of a write is unknown.
    #[error("rpc transport: {0}")]
    Transport(String),
    /// An HTTP status other than 200.
    #[error("rpc http {status}: {body}")]
    Http {
        /// Status code.
        status: u16,
        /// The first bytes of the body.
        body: String,
    },
    /// The call reverted (code 3, or a message starting "execution reverted").
    #[error("execution reverted: {reason}")]
    Reverted {
        /// The decoded `Error(string)` reason, or the raw revert data in hex.
        reason: String,
    },
    /// A JSON-RPC error object.
    #[error("rpc error {code}: {message}")]
    Rpc {
        /// `error.code`.
        code: i64,
        /// `error.message`.
        message: String,
    },
    /// The answer did not have the expected shape.
    #[error("rpc answer: {0}")]
    Decode(String),
}

impl RpcError {
    /// Whether the call may be retried as is (no answer, or a server-side failure).
    #[must_use]
    pub const fn is_transient(&self) -> bool {
        match self {
            Self::Transport(_) => true,
            Self::Http { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

/// A transaction receipt (the fields the rail reads).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// Transaction hash.
    pub transaction_hash: B256,
    /// `status == 1`.
    pub success: bool,
    /// Block the transaction is in.
    pub block_number: u64,
    /// Gas used.
    pub gas_used: u64,
    /// The logs emitted.
    pub logs: Vec<Log>,
    /// The contract a creation transaction deployed.
    pub contract_address: Option<Address>,
}

/// One log entry of a receipt.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
pub struct Log {
    /// The emitting contract.
    pub address: Address,
    /// Indexed topics.
    pub topics: Vec<B256>,
    /// Unindexed data.
    pub data: Bytes,
}

impl Receipt {
    /// Whether `token` logged `Transfer(from, to, value)` in this transaction.
    #[must_use]
    pub fn has_transfer(&self, token: Address, from: Address, to: Address, value: U256) -> bool {
        let want = [
            IFiatToken::Transfer::SIGNATURE_HASH,
            from.into_word(),
            to.into_word(),
        ];
        self.logs.iter().any(|l| {
            l.address == token
                && l.topics.as_slice() == want.as_slice()
                && l.data.as_ref() == value.to_be_bytes::<32>().as_slice()
        })
    }
}

/// An Ethereum JSON-RPC endpoint. `Debug` shows the endpoint's scheme and host only: hosted
/// providers put API keys in the path or query.
#[derive(Clone)]
pub struct RpcClient {
    http: reqwest::Client,
    url: Arc<str>,
    id: Arc<AtomicU64>,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("url", &redact_url(&self.url))
            .finish_non_exhaustive()
    }
}

/// `scheme://host[:port]/…` of `url`: no user info, path or query (where API keys live).
#[must_use]
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    let hidden = authority.len() < rest.len() || host.len() < authority.len();
    format!("{scheme}://{host}{}", if hidden { "/…" } else { "" })
}

/// An HTTP client with the workspace's one rustls provider (ring).
///
/// # Errors
/// [`RpcError::Transport`] if the client cannot be built.
pub fn http_client(timeout: Duration) -> Result<reqwest::Client, RpcError> {
    http_builder(timeout)
        .build()
        .map_err(|e| RpcError::Transport(e.to_string()))
}

/// The builder behind [`http_client`] (the TLS provider installed), for a client that adds its
/// own settings (the x402 client turns redirects off).
pub fn http_builder(timeout: Duration) -> reqwest::ClientBuilder {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
}

fn quantity(v: &Value) -> Result<u64, RpcError> {
    let s = v
        .as_str()
        .ok_or_else(|| RpcError::Decode(format!("expected a hex quantity, got {v}")))?;
    let body = s
        .strip_prefix("0x")
        .ok_or_else(|| RpcError::Decode(format!("quantity {s:?} lacks 0x")))?;
    u64::from_str_radix(body, 16).map_err(|_| RpcError::Decode(format!("bad quantity {s:?}")))
}

fn quantity_u128(v: &Value) -> Result<u128, RpcError> {
    let s = v
        .as_str()
        .and_then(|s| s.strip_prefix("0x"))
        .ok_or_else(|| RpcError::Decode(format!("expected a hex quantity, got {v}")))?;
    u128::from_str_radix(s, 16).map_err(|_| RpcError::Decode(format!("bad quantity {s:?}")))
}

fn data(v: &Value) -> Result<Bytes, RpcError> {
    let s = v
        .as_str()
        .ok_or_else(|| RpcError::Decode(format!("expected hex data, got {v}")))?;
    s.parse::<Bytes>()
        .map_err(|_| RpcError::Decode(format!("bad hex data {s:?}")))
}

/// The reason in revert data: `Error(string)`, `Panic(uint256)`, or the hex itself.
#[must_use]
pub fn revert_reason(revert: &[u8]) -> String {
    if let Ok(e) = alloy_sol_types::Revert::abi_decode(revert) {
        return e.reason;
    }
    if let Ok(p) = alloy_sol_types::Panic::abi_decode(revert) {
        return format!("panic {}", p.code);
    }
    if revert.is_empty() {
        "no reason".into()
    } else {
        format!("0x{}", hex::encode(revert))
    }
}

#[derive(Deserialize)]
struct ErrorObject {
    code: i64,
    message: String,
    #[serde(default)]
    data: Option<Value>,
}

impl RpcClient {
    /// A client for `url` with a 10 s per-request timeout.
    ///
    /// # Errors
    /// [`RpcError::Transport`] if the HTTP client cannot be built.
    pub fn new(url: &str) -> Result<Self, RpcError> {
        Self::with_timeout(url, Duration::from_secs(10))
    }

    /// A client for `url` with a per-request `timeout`.
    ///
    /// # Errors
    /// [`RpcError::Transport`] if the HTTP client cannot be built.
    pub fn with_timeout(url: &str, timeout: Duration) -> Result<Self, RpcError> {
        Ok(Self {
            http: http_client(timeout)?,
            url: url.into(),
            id: Arc::new(AtomicU64::new(1)),
        })
    }

    /// The endpoint.
    #[must_use]
    pub fn url(&self) -> &str {
        &self.url
    }

    /// One JSON-RPC call; the `result` on success.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, RpcError> {
        let id = self.id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let resp = self
            .http
            .post(&*self.url)
            .json(&body)
            .send()
            .await
            .map_err(|e| RpcError::Transport(e.without_url().to_string()))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| RpcError::Transport(e.without_url().to_string()))?;
        if !status.is_success() {
            return Err(RpcError::Http {
                status: status.as_u16(),
                body: text.chars().take(200).collect(),
            });
        }
        let mut v: Value = serde_json::from_str(&text)
            .map_err(|e| RpcError::Decode(format!("{method}: not JSON: {e}")))?;
        if let Some(err) = v.get_mut("error").map(Value::take).filter(|e| !e.is_null()) {
            let err: ErrorObject = serde_json::from_value(err)
                .map_err(|e| RpcError::Decode(format!("{method}: error object: {e}")))?;
            let revert_data = err
                .data
                .as_ref()
                .and_then(Value::as_str)
                .and_then(|s| s.parse::<Bytes>().ok());
            if err.code == 3 || err.message.starts_with("execution reverted") {
                let reason = match revert_data {
                    Some(d) => revert_reason(&d),
                    None => err
                        .message
                        .trim_start_matches("execution reverted")
                        .trim_start_matches(": ")
                        .to_owned(),
                };
                return Err(RpcError::Reverted { reason });
            }
            return Err(RpcError::Rpc {
                code: err.code,
                message: err.message,
            });
        }
        match v.get_mut("result") {
            Some(r) => Ok(r.take()),
            None => Err(RpcError::Decode(format!("{method}: no result"))),
        }
    }

    /// `eth_chainId`.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn chain_id(&self) -> Result<u64, RpcError> {
        quantity(&self.request("eth_chainId", json!([])).await?)
    }

    /// `eth_blockNumber`.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn block_number(&self) -> Result<u64, RpcError> {
        quantity(&self.request("eth_blockNumber", json!([])).await?)
    }

    /// `eth_call` at the latest block.
    ///
    /// # Errors
    /// [`RpcError::Reverted`] with the reason, or another [`RpcError`].
    pub async fn call(
        &self,
        from: Option<Address>,
        to: Address,
        input: &Bytes,
    ) -> Result<Bytes, RpcError> {
        let tx = match from {
            Some(from) => json!({"from": from, "to": to, "input": input}),
            None => json!({"to": to, "input": input}),
        };
        data(&self.request("eth_call", json!([tx, "latest"])).await?)
    }

    /// `eth_call` against the state after block `block` (to replay a mined call and read why it
    /// reverted).
    ///
    /// # Errors
    /// [`RpcError::Reverted`] with the reason, or another [`RpcError`].
    pub async fn call_at(
        &self,
        from: Address,
        to: Address,
        input: &Bytes,
        block: u64,
    ) -> Result<Bytes, RpcError> {
        let tx = json!({"from": from, "to": to, "input": input});
        data(
            &self
                .request("eth_call", json!([tx, format!("{block:#x}")]))
                .await?,
        )
    }

    /// `eth_estimateGas`.
    ///
    /// # Errors
    /// [`RpcError::Reverted`] with the reason, or another [`RpcError`].
    pub async fn estimate_gas(
        &self,
        from: Address,
        to: Address,
        input: &Bytes,
    ) -> Result<u64, RpcError> {
        quantity(
            &self
                .request(
                    "eth_estimateGas",
                    json!([{"from": from, "to": to, "input": input}]),
                )
                .await?,
        )
    }

    /// `eth_getCode` at the latest block.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn code(&self, address: Address) -> Result<Bytes, RpcError> {
        data(
            &self
                .request("eth_getCode", json!([address, "latest"]))
                .await?,
        )
    }

    /// `eth_getTransactionCount` at `block` (`"latest"` or `"pending"`).
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn transaction_count(&self, address: Address, block: &str) -> Result<u64, RpcError> {
        quantity(
            &self
                .request("eth_getTransactionCount", json!([address, block]))
                .await?,
        )
    }

    /// `(baseFeePerGas of the latest block, eth_maxPriorityFeePerGas)`.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn fees(&self) -> Result<(u128, u128), RpcError> {
        let block = self
            .request("eth_getBlockByNumber", json!(["latest", false]))
            .await?;
        let base = quantity_u128(block.get("baseFeePerGas").unwrap_or(&Value::Null))?;
        let tip = quantity_u128(&self.request("eth_maxPriorityFeePerGas", json!([])).await?)?;
        Ok((base, tip))
    }

    /// `eth_sendRawTransaction`; the transaction hash.
    ///
    /// # Errors
    /// [`RpcError`] (e.g. `nonce too low`, `insufficient funds for gas`).
    pub async fn send_raw_transaction(&self, raw: &Bytes) -> Result<B256, RpcError> {
        let v = self.request("eth_sendRawTransaction", json!([raw])).await?;
        serde_json::from_value(v).map_err(|e| RpcError::Decode(format!("tx hash: {e}")))
    }

    /// `eth_sendTransaction` from an account the node holds (anvil's dev accounts): for test
    /// set-up such as minting.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn send_transaction(
        &self,
        from: Address,
        to: Address,
        input: &Bytes,
    ) -> Result<B256, RpcError> {
        let v = self
            .request(
                "eth_sendTransaction",
                json!([{"from": from, "to": to, "input": input}]),
            )
            .await?;
        serde_json::from_value(v).map_err(|e| RpcError::Decode(format!("tx hash: {e}")))
    }

    /// `eth_sendTransaction` of a contract creation from an account the node holds (test
    /// set-up).
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn send_create(&self, from: Address, code: &Bytes) -> Result<B256, RpcError> {
        let v = self
            .request(
                "eth_sendTransaction",
                json!([{"from": from, "input": code}]),
            )
            .await?;
        serde_json::from_value(v).map_err(|e| RpcError::Decode(format!("tx hash: {e}")))
    }

    /// `eth_getTransactionReceipt`: `None` while the transaction is pending (or unknown).
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn receipt(&self, hash: B256) -> Result<Option<Receipt>, RpcError> {
        let v = self
            .request("eth_getTransactionReceipt", json!([hash]))
            .await?;
        if v.is_null() {
            return Ok(None);
        }
        let field = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
        Ok(Some(Receipt {
            transaction_hash: serde_json::from_value(field("transactionHash"))
                .map_err(|e| RpcError::Decode(format!("receipt hash: {e}")))?,
            success: quantity(&field("status"))? == 1,
            block_number: quantity(&field("blockNumber"))?,
            gas_used: quantity(&field("gasUsed"))?,
            logs: serde_json::from_value(field("logs"))
                .map_err(|e| RpcError::Decode(format!("receipt logs: {e}")))?,
            contract_address: serde_json::from_value(field("contractAddress")).unwrap_or(None),
        }))
    }

    /// Polls for a receipt, first after `first_poll`, doubling up to 1 s, until `timeout`.
    ///
    /// # Errors
    /// [`RpcError::Transport`] with "no receipt" when time is up (the transaction may still
    /// be mined: its outcome is unknown).
    pub async fn wait_receipt(
        &self,
        hash: B256,
        first_poll: Duration,
        timeout: Duration,
    ) -> Result<Receipt, RpcError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut delay = first_poll;
        loop {
            match self.receipt(hash).await {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) if e.is_transient() => {}
                Err(e) => return Err(e),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(RpcError::Transport(format!(
                    "no receipt for {hash} after {timeout:?}"
                )));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(1));
        }
    }

    /// The transaction that used `(authorizer, nonce)` on `token`, from its
    /// `AuthorizationUsed` log (`eth_getLogs` over the last `lookback_blocks` blocks): how a settler that lost its
    /// answer finds out whether the transfer happened. `None` if it did not (a cancelled
    /// authorization emits `AuthorizationCanceled` instead, and moves no money).
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn authorization_used_tx(
        &self,
        token: Address,
        authorizer: Address,
        nonce: B256,
        lookback_blocks: u64,
    ) -> Result<Option<B256>, RpcError> {
        let topic0 = IFiatToken::AuthorizationUsed::SIGNATURE_HASH;
        let latest = self.block_number().await?;
        let from_block = latest.saturating_sub(lookback_blocks);
        let v = self
            .request(
                "eth_getLogs",
                json!([{
                    "address": token,
                    "fromBlock": format!("{from_block:#x}"),
                    "toBlock": "latest",
                    "topics": [topic0, authorizer.into_word(), nonce],
                }]),
            )
            .await?;
        let logs = v
            .as_array()
            .ok_or_else(|| RpcError::Decode("eth_getLogs: not an array".into()))?;
        match logs.first().and_then(|l| l.get("transactionHash")) {
            Some(h) => serde_json::from_value(h.clone())
                .map(Some)
                .map_err(|e| RpcError::Decode(format!("log tx hash: {e}"))),
            None => Ok(None),
        }
    }

    async fn view<C: SolCall>(&self, token: Address, call: &C) -> Result<C::Return, RpcError> {
        let out = self.call(None, token, &call.abi_encode().into()).await?;
        C::abi_decode_returns(&out).map_err(|e| RpcError::Decode(format!("{}: {e}", C::SIGNATURE)))
    }

    /// The token's EIP-712 `name()` and `version()`.
    ///
    /// # Errors
    /// [`RpcError`].
    pub async fn token_domain(&self, token: Address) -> Result<(String, String), RpcError> {
        let name = self.view(token, &IFiatToken::nameCall {}).await?;
        let version = self.view(token, &IFiatToken::versionCall {}).await?;
        Ok((name, version))
    }
}

impl ChainView for RpcClient {
    type Error = RpcError;

    async fn balance_of(&self, asset: Address, owner: Address) -> Result<U256, RpcError> {
        self.view(asset, &IFiatToken::balanceOfCall { account: owner })
            .await
    }

    async fn authorization_state(
        &self,
        asset: Address,
        authorizer: Address,
        nonce: B256,
    ) -> Result<bool, RpcError> {
        self.view(
            asset,
            &IFiatToken::authorizationStateCall { authorizer, nonce },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revert_reasons() {
        // Error("FiatTokenV2: invalid signature"), as a FiatToken reverts.
        let data = alloy_sol_types::Revert::from("FiatTokenV2: invalid signature").abi_encode();
        assert_eq!(revert_reason(&data), "FiatTokenV2: invalid signature");
        assert_eq!(revert_reason(&[]), "no reason");
        assert_eq!(revert_reason(&[0xde, 0xad]), "0xdead");
    }

    #[test]
    fn urls_are_redacted() {
        assert_eq!(
            redact_url("https://base-mainnet.g.alchemy.com/v2/SECRETKEY"),
            "https://base-mainnet.g.alchemy.com/…"
        );
        assert_eq!(
            redact_url("https://user:pw@node:8545"),
            "https://node:8545/…"
        );
        assert_eq!(redact_url("http://127.0.0.1:8545"), "http://127.0.0.1:8545");
        let rpc = RpcClient::new("https://x.io/v3/SECRETKEY?k=SECRET").unwrap();
        assert!(!format!("{rpc:?}").contains("SECRET"));
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity(&json!("0x7a69")).unwrap(), 31337);
        assert!(quantity(&json!("7a69")).is_err());
        assert!(quantity(&json!(31337)).is_err());
        assert_eq!(quantity_u128(&json!("0x3b9aca00")).unwrap(), 1_000_000_000);
    }
}
