//! A small algod v2 REST client: the six calls exact-algo needs, with strict response parsing.
//!
//! Field names and shapes are those of go-algorand's `daemon/algod/api/algod.oas2.json`;
//! errors are algod's `{"message": …}` bodies, kept verbatim in [`AlgodError::Http`]. The API
//! token travels in `X-Algo-API-Token` and never appears in `Debug` output or logs.

use std::fmt;
use std::time::Duration;

use data_encoding::BASE64;
use serde::Deserialize;

use crate::address::Address;

/// Why an algod call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AlgodError {
    /// algod answered with an error status; `message` is its `message` field (or the body).
    #[error("algod {status}: {message}")]
    Http {
        /// The HTTP status.
        status: u16,
        /// algod's message, verbatim.
        message: String,
    },
    /// algod could not be reached, or the connection broke.
    #[error("algod unreachable: {0}")]
    Transport(String),
    /// algod answered something that is not the documented shape.
    #[error("unexpected algod answer: {0}")]
    Decode(String),
    /// The transaction was not confirmed before its last valid round.
    #[error("transaction {txid} not confirmed by round {round}")]
    NotConfirmed {
        /// The transaction.
        txid: String,
        /// The last round waited for.
        round: u64,
    },
    /// The node dropped the transaction from its pool with this error.
    #[error("transaction {txid} rejected by the pool: {message}")]
    PoolError {
        /// The transaction.
        txid: String,
        /// `pool-error`.
        message: String,
    },
}

impl AlgodError {
    /// Whether the same call may succeed later (transport failures and 5xx).
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            AlgodError::Transport(_) => true,
            AlgodError::Http { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }

    /// algod's own message (the part receivers show a payer for `settlement failed`).
    #[must_use]
    pub fn message(&self) -> String {
        match self {
            AlgodError::Http { message, .. } | AlgodError::PoolError { message, .. } => {
                message.clone()
            }
            other => other.to_string(),
        }
    }
}

/// `GET /v2/transactions/params`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SuggestedParams {
    /// `fee`: suggested fee per byte (0 when the network is not congested).
    pub fee_per_byte: u64,
    /// `min-fee`.
    pub min_fee: u64,
    /// `genesis-id`.
    pub genesis_id: String,
    /// `genesis-hash`.
    pub genesis_hash: [u8; 32],
    /// `last-round`.
    pub last_round: u64,
    /// `consensus-version`.
    pub consensus_version: String,
}

/// The parts of `GET /v2/accounts/{address}` exact-algo reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccountInfo {
    /// `address`.
    pub address: Address,
    /// `amount`, µALGO.
    pub amount: u64,
    /// `min-balance`, µALGO.
    pub min_balance: u64,
    /// `auth-addr`: set when the account was rekeyed.
    pub auth_addr: Option<Address>,
    /// `round`: the round this is as of.
    pub round: u64,
}

/// The parts of `GET /v2/transactions/pending/{txid}` exact-algo reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PendingInfo {
    /// `confirmed-round`, once confirmed.
    pub confirmed_round: Option<u64>,
    /// `pool-error`: non-empty when the node dropped the transaction.
    pub pool_error: String,
}

/// An algod endpoint.
#[derive(Clone)]
pub struct AlgodClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl fmt::Debug for AlgodClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlgodClient")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct ParamsBody {
    consensus_version: String,
    fee: u64,
    genesis_hash: String,
    genesis_id: String,
    last_round: u64,
    min_fee: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct AccountBody {
    address: String,
    amount: u64,
    #[serde(default)]
    min_balance: u64,
    #[serde(default)]
    auth_addr: Option<String>,
    round: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct PendingBody {
    #[serde(default)]
    confirmed_round: Option<u64>,
    #[serde(default)]
    pool_error: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct StatusBody {
    last_round: u64,
}

#[derive(Deserialize)]
struct TxIdBody {
    #[serde(rename = "txId")]
    tx_id: String,
}

#[derive(Deserialize)]
struct AssetBody {
    params: AssetParams,
}

#[derive(Deserialize)]
struct AssetParams {
    total: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct HoldingBody {
    asset_holding: Holding,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct Holding {
    #[serde(default)]
    amount: u64,
    #[serde(default)]
    is_frozen: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct SimulateBody {
    txn_groups: Vec<SimulateGroup>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct SimulateGroup {
    #[serde(default)]
    failure_message: Option<String>,
    #[serde(default)]
    failed_at: Option<Vec<u64>>,
}

#[derive(Deserialize)]
struct ErrorBody {
    message: String,
}

/// A reqwest client on rustls with the `ring` provider (the one the workspace already uses),
/// so no second crypto provider is compiled in.
///
/// # Errors
/// [`AlgodError::Transport`] if the TLS stack cannot be set up.
pub fn http_client(timeout: Duration) -> Result<reqwest::Client, AlgodError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| AlgodError::Transport(e.to_string()))
}

impl AlgodClient {
    /// A client for the algod at `base` (`http://127.0.0.1:4001`), with an API token if the
    /// node wants one.
    ///
    /// # Errors
    /// [`AlgodError::Transport`] if the HTTP client cannot be built.
    pub fn new(base: &str, token: Option<String>) -> Result<Self, AlgodError> {
        Ok(AlgodClient {
            // wait-for-block-after may hold a request for up to one minute.
            http: http_client(Duration::from_secs(75))?,
            base: base.trim_end_matches('/').to_owned(),
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// The base URL.
    #[must_use]
    pub fn base(&self) -> &str {
        &self.base
    }

    fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.header("X-Algo-API-Token", t),
            None => r,
        }
    }

    async fn send<T: for<'de> Deserialize<'de>>(
        &self,
        r: reqwest::RequestBuilder,
    ) -> Result<T, AlgodError> {
        let resp = r
            .send()
            .await
            .map_err(|e| AlgodError::Transport(e.without_url().to_string()))?;
        let status = resp.status();
        let body = resp
            .bytes()
            .await
            .map_err(|e| AlgodError::Transport(e.without_url().to_string()))?;
        if !status.is_success() {
            let message = serde_json::from_slice::<ErrorBody>(&body).map_or_else(
                |_| String::from_utf8_lossy(&body).trim().to_owned(),
                |e| e.message,
            );
            return Err(AlgodError::Http {
                status: status.as_u16(),
                message,
            });
        }
        serde_json::from_slice(&body).map_err(|e| AlgodError::Decode(e.to_string()))
    }

    /// `GET /v2/transactions/params`.
    ///
    /// # Errors
    /// [`AlgodError`].
    pub async fn params(&self) -> Result<SuggestedParams, AlgodError> {
        let b: ParamsBody = self
            .send(self.req(reqwest::Method::GET, "/v2/transactions/params"))
            .await?;
        let gh = BASE64
            .decode(b.genesis_hash.as_bytes())
            .ok()
            .and_then(|v| <[u8; 32]>::try_from(v).ok())
            .ok_or_else(|| AlgodError::Decode("genesis-hash is not 32 bytes of base64".into()))?;
        Ok(SuggestedParams {
            fee_per_byte: b.fee,
            min_fee: b.min_fee,
            genesis_id: b.genesis_id,
            genesis_hash: gh,
            last_round: b.last_round,
            consensus_version: b.consensus_version,
        })
    }

    /// `GET /v2/status`: the last committed round.
    ///
    /// # Errors
    /// [`AlgodError`].
    pub async fn last_round(&self) -> Result<u64, AlgodError> {
        let b: StatusBody = self
            .send(self.req(reqwest::Method::GET, "/v2/status"))
            .await?;
        Ok(b.last_round)
    }

    /// `GET /v2/status/wait-for-block-after/{round}`: returns the last round once it is past
    /// `round` (or after algod's one-minute cap).
    ///
    /// # Errors
    /// [`AlgodError`].
    pub async fn wait_for_block_after(&self, round: u64) -> Result<u64, AlgodError> {
        let b: StatusBody = self
            .send(self.req(
                reqwest::Method::GET,
                &format!("/v2/status/wait-for-block-after/{round}"),
            ))
            .await?;
        Ok(b.last_round)
    }

    /// `GET /v2/accounts/{address}`.
    ///
    /// # Errors
    /// [`AlgodError`].
    pub async fn account(&self, a: &Address) -> Result<AccountInfo, AlgodError> {
        let b: AccountBody = self
            .send(self.req(reqwest::Method::GET, &format!("/v2/accounts/{a}")))
            .await?;
        let address: Address = b
            .address
            .parse()
            .map_err(|e| AlgodError::Decode(format!("address: {e}")))?;
        if address != *a {
            return Err(AlgodError::Decode(format!(
                "asked for account {a}, algod answered for {address}"
            )));
        }
        let auth_addr = match b.auth_addr {
            None => None,
            Some(s) => Some(
                s.parse()
                    .map_err(|e| AlgodError::Decode(format!("auth-addr: {e}")))?,
            ),
        };
        Ok(AccountInfo {
            address,
            amount: b.amount,
            min_balance: b.min_balance,
            auth_addr,
            round: b.round,
        })
    }

    /// `GET /v2/assets/{asset}`: the asset's total supply, in base units.
    ///
    /// # Errors
    /// [`AlgodError`] (a 404 when there is no such asset).
    pub async fn asset_total(&self, asset: u64) -> Result<u64, AlgodError> {
        let b: AssetBody = self
            .send(self.req(reqwest::Method::GET, &format!("/v2/assets/{asset}")))
            .await?;
        Ok(b.params.total)
    }

    /// `GET /v2/accounts/{address}/assets/{asset}`: the holding's amount and whether it is
    /// frozen; `None` when the account has not opted in (algod's 404).
    ///
    /// # Errors
    /// [`AlgodError`].
    pub async fn asset_holding(
        &self,
        a: &Address,
        asset: u64,
    ) -> Result<Option<(u64, bool)>, AlgodError> {
        let r: Result<HoldingBody, _> = self
            .send(self.req(
                reqwest::Method::GET,
                &format!("/v2/accounts/{a}/assets/{asset}"),
            ))
            .await;
        match r {
            Ok(b) => Ok(Some((b.asset_holding.amount, b.asset_holding.is_frozen))),
            Err(AlgodError::Http { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `POST /v2/transactions` with `application/x-binary` signed transaction bytes; returns
    /// the first transaction's id as algod computed it.
    ///
    /// # Errors
    /// [`AlgodError::Http`] with algod's refusal (400), or a transport error.
    pub async fn submit(&self, signed: &[u8]) -> Result<String, AlgodError> {
        let b: TxIdBody = self
            .send(
                self.req(reqwest::Method::POST, "/v2/transactions")
                    .header("Content-Type", "application/x-binary")
                    .body(signed.to_vec()),
            )
            .await?;
        Ok(b.tx_id)
    }

    /// `POST /v2/transactions/simulate` of one group (`members`: each element's canonical
    /// encoding, signed or bare), with `allow-empty-signatures` as given. `Ok(None)`: the group
    /// would succeed; `Ok(Some((index, message)))`: it would fail there, with the evaluator's
    /// message. Which algod offers simulate: 3.16 and later (a 404 means it does not).
    ///
    /// # Errors
    /// [`AlgodError`]; a 404 when the node has no simulate endpoint.
    pub async fn simulate(
        &self,
        members: &[crate::txn::Member],
        allow_empty_signatures: bool,
    ) -> Result<Option<(usize, String)>, AlgodError> {
        use crate::msgpack::{self, Value};
        use std::collections::BTreeMap;
        let txns = members
            .iter()
            .map(|m| match m {
                crate::txn::Member::Signed(s) => msgpack::decode(&s.encode()),
                crate::txn::Member::Unsigned(t) => msgpack::decode(&t.encode())
                    .map(|t| Value::Map(BTreeMap::from([("txn".to_owned(), t)]))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| AlgodError::Decode(format!("a group member: {e}")))?;
        let mut req = BTreeMap::new();
        if allow_empty_signatures {
            req.insert("allow-empty-signatures".to_owned(), Value::True);
        }
        req.insert(
            "txn-groups".to_owned(),
            Value::Array(vec![Value::Map(BTreeMap::from([(
                "txns".to_owned(),
                Value::Array(txns),
            )]))]),
        );
        let b: SimulateBody = self
            .send(
                self.req(reqwest::Method::POST, "/v2/transactions/simulate")
                    .header("Content-Type", "application/msgpack")
                    .body(msgpack::encode(&Value::Map(req))),
            )
            .await?;
        let Some(group) = b.txn_groups.into_iter().next() else {
            return Err(AlgodError::Decode("simulate answered no group".into()));
        };
        Ok(group.failure_message.filter(|m| !m.is_empty()).map(|m| {
            let at = group
                .failed_at
                .and_then(|f| f.first().copied())
                .and_then(|i| usize::try_from(i).ok())
                .unwrap_or(0);
            (at, m)
        }))
    }

    /// `GET /v2/transactions/pending/{txid}`.
    ///
    /// # Errors
    /// [`AlgodError`] (404 when algod knows nothing of the transaction).
    pub async fn pending(&self, txid: &str) -> Result<PendingInfo, AlgodError> {
        let b: PendingBody = self
            .send(self.req(
                reqwest::Method::GET,
                &format!("/v2/transactions/pending/{txid}"),
            ))
            .await?;
        Ok(PendingInfo {
            confirmed_round: b.confirmed_round.filter(|r| *r > 0),
            pool_error: b.pool_error,
        })
    }

    /// Waits until `txid` is confirmed, giving up once the chain has passed `last_valid`
    /// (after that it can never be). Returns the confirmed round.
    ///
    /// # Errors
    /// [`AlgodError::PoolError`], [`AlgodError::NotConfirmed`], or a transport error.
    pub async fn wait_for_confirmation(
        &self,
        txid: &str,
        last_valid: u64,
    ) -> Result<u64, AlgodError> {
        let mut round = self.last_round().await?;
        loop {
            let p = self.pending(txid).await?;
            if let Some(r) = p.confirmed_round {
                return Ok(r);
            }
            if !p.pool_error.is_empty() {
                return Err(AlgodError::PoolError {
                    txid: txid.to_owned(),
                    message: p.pool_error,
                });
            }
            if round > last_valid {
                return Err(AlgodError::NotConfirmed {
                    txid: txid.to_owned(),
                    round,
                });
            }
            round = self.wait_for_block_after(round).await?.max(round + 1);
        }
    }
}
