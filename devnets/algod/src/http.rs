//! The devnet's algod REST API (axum) over [`crate::chain::Devnet`]: the routes, the token
//! check, and a background server ([`Devnet::spawn`]).

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use data_encoding::BASE64;
use serde_json::json;
use subtle::ConstantTimeEq;

use rail_exact_algo::address::Address;
use rail_exact_algo::msgpack::{self, Value};
use rail_exact_algo::txn::Member;

use crate::chain::{CONSENSUS_VERSION, Devnet, DevnetConfig, MIN_FEE, NOT_FOUND, Simulated};

/// The largest simulate request read (algod's limit on a request body is 10 MB; a group of 16
/// transactions is far below this).
const MAX_SIMULATE_BODY: usize = 1 << 20;

impl Devnet {
    /// The REST API as an axum router.
    pub fn router(&self) -> Router {
        let authed = Router::new()
            .route("/v2/transactions", post(submit_route))
            .route("/v2/transactions/params", get(params_route))
            .route("/v2/transactions/simulate", post(simulate_route))
            .route("/v2/assets/{id}", get(asset_route))
            .route(
                "/v2/accounts/{address}/assets/{id}",
                get(account_asset_route),
            )
            .route("/v2/transactions/pending/{txid}", get(pending_route))
            .route("/v2/status", get(status_route))
            .route("/v2/status/wait-for-block-after/{round}", get(wait_route))
            .route("/v2/accounts/{address}", get(account_route))
            .route("/devnet/advance/{n}", post(advance_route))
            .route(
                "/devnet/freeze/{address}/{asset}/{frozen}",
                post(freeze_route),
            )
            .route_layer(axum::middleware::from_fn_with_state(
                self.clone(),
                require_token,
            ));
        Router::new()
            .route("/health", get(|| async { StatusCode::OK }))
            .route("/versions", get(versions_route))
            .merge(authed)
            .with_state(self.clone())
    }

    /// Serves the API on `addr` (port 0 picks a free port) in the background, with the block
    /// timer if configured.
    ///
    /// # Errors
    /// The bind error.
    pub async fn spawn(cfg: DevnetConfig, addr: SocketAddr) -> std::io::Result<RunningDevnet> {
        let devnet = Devnet::new(cfg);
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let local = listener.local_addr()?;
        let app = devnet.router();
        let server = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "algod devnet server stopped");
            }
        });
        let ticker = devnet.inner.cfg.block_time.map(|every| {
            let d = devnet.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.tick().await;
                loop {
                    tick.tick().await;
                    d.advance(1);
                }
            })
        });
        Ok(RunningDevnet {
            url: format!("http://{local}"),
            devnet,
            tasks: [Some(server), ticker].into_iter().flatten().collect(),
        })
    }
}

/// A devnet serving HTTP; stops when dropped.
#[derive(Debug)]
pub struct RunningDevnet {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The ledger behind it (to fund accounts, advance rounds and read balances in tests).
    pub devnet: Devnet,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for RunningDevnet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn error(status: StatusCode, message: &str) -> Response {
    (status, axum::Json(json!({ "message": message }))).into_response()
}

async fn require_token(
    State(d): State<Devnet>,
    headers: HeaderMap,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if let Some(token) = &d.inner.cfg.token {
        let given = headers
            .get("x-algo-api-token")
            .map(axum::http::HeaderValue::as_bytes)
            .unwrap_or_default();
        if !bool::from(given.ct_eq(token.as_bytes())) {
            return error(StatusCode::UNAUTHORIZED, "Invalid API Token");
        }
    }
    next.run(req).await
}

async fn submit_route(State(d): State<Devnet>, body: Bytes) -> Response {
    match d.submit(&body) {
        Ok(txid) => axum::Json(json!({ "txId": txid })).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, &e.message),
    }
}

async fn params_route(State(d): State<Devnet>) -> Response {
    axum::Json(json!({
        "consensus-version": CONSENSUS_VERSION,
        "fee": 0,
        "genesis-hash": BASE64.encode(&d.genesis_hash()),
        "genesis-id": d.genesis_id(),
        "last-round": d.round(),
        "min-fee": MIN_FEE,
    }))
    .into_response()
}

async fn pending_route(State(d): State<Devnet>, Path(txid): Path<String>) -> Response {
    match d.pending_json(&txid) {
        Some(body) => axum::Json(body).into_response(),
        None => error(StatusCode::NOT_FOUND, NOT_FOUND),
    }
}

async fn status_route(State(d): State<Devnet>) -> Response {
    axum::Json(d.status_json()).into_response()
}

async fn wait_route(State(d): State<Devnet>, Path(round): Path<String>) -> Response {
    let Ok(round) = round.parse::<u64>() else {
        return error(StatusCode::BAD_REQUEST, "invalid round");
    };
    let mut rx = d.inner.rounds.subscribe();
    // algod answers after at most one minute even if no block came.
    let _ = tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|r| *r > round)).await;
    axum::Json(d.status_json()).into_response()
}

async fn account_route(State(d): State<Devnet>, Path(address): Path<String>) -> Response {
    match address.parse::<Address>() {
        Ok(a) => axum::Json(d.account_json(&a)).into_response(),
        Err(_) => error(StatusCode::BAD_REQUEST, "failed to parse the address"),
    }
}

async fn advance_route(State(d): State<Devnet>, Path(n): Path<u64>) -> Response {
    d.advance(n.min(10_000));
    axum::Json(d.status_json()).into_response()
}

async fn versions_route(State(d): State<Devnet>) -> Response {
    axum::Json(json!({
        "build": {"branch": "stipendex-devnet", "build_number": 0, "channel": "dev",
                  "commit_hash": "", "major": 0, "minor": 1},
        "genesis_hash_b64": BASE64.encode(&d.genesis_hash()),
        "genesis_id": d.genesis_id(),
        "versions": ["v2"],
    }))
    .into_response()
}

/// `POST /v2/transactions/simulate`: a msgpack `SimulateRequest` (`txn-groups[0].txns` as
/// `{sig?, txn}` elements, `allow-empty-signatures`), answered in JSON with
/// `txn-groups[0].failure-message` and `failed-at` when the group would fail (go-algorand
/// `daemon/algod/api/server/v2/handlers.go` `SimulateTransaction`). One group only.
async fn simulate_route(State(d): State<Devnet>, body: Bytes) -> Response {
    if body.len() > MAX_SIMULATE_BODY {
        return error(StatusCode::BAD_REQUEST, "simulate request too large");
    }
    let (members, allow_empty) = match read_simulate_request(&body) {
        Ok(r) => r,
        Err(m) => return error(StatusCode::BAD_REQUEST, &m),
    };
    match d.simulate(&members, allow_empty) {
        Ok(sim) => axum::Json(simulate_json(&members, &sim, allow_empty)).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, &e.message),
    }
}

fn read_simulate_request(body: &[u8]) -> Result<(Vec<Member>, bool), String> {
    let Value::Map(req) = msgpack::decode_document(body).map_err(|e| e.to_string())? else {
        return Err("a simulate request is a map".into());
    };
    let allow_empty = matches!(req.get("allow-empty-signatures"), Some(Value::True));
    let Some(Value::Array(groups)) = req.get("txn-groups") else {
        return Err("txn-groups missing".into());
    };
    let [Value::Map(group)] = groups.as_slice() else {
        return Err("expected exactly one transaction group".into());
    };
    let Some(Value::Array(txns)) = group.get("txns") else {
        return Err("txns missing".into());
    };
    txns.iter()
        .map(|t| Member::decode(&msgpack::encode(t)).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()
        .map(|m| (m, allow_empty))
}

fn simulate_json(members: &[Member], sim: &Simulated, allow_empty: bool) -> serde_json::Value {
    let results: Vec<_> = members
        .iter()
        .map(|m| {
            let txn = match m {
                Member::Signed(s) => crate::chain::signed_json(s),
                Member::Unsigned(t) => json!({"txn": crate::chain::txn_json(t)}),
            };
            json!({"txn-result": {"pool-error": "", "txn": txn}})
        })
        .collect();
    let mut group = json!({"txn-results": results});
    if let (Some((at, message)), Some(obj)) = (&sim.failure, group.as_object_mut()) {
        obj.insert("failure-message".into(), json!(message));
        obj.insert("failed-at".into(), json!([at]));
    }
    let mut out = json!({
        "version": 2,
        "last-round": sim.last_round,
        "txn-groups": [group],
    });
    if let (true, Some(obj)) = (allow_empty, out.as_object_mut()) {
        obj.insert(
            "eval-overrides".into(),
            json!({"allow-empty-signatures": true}),
        );
    }
    out
}

async fn asset_route(State(d): State<Devnet>, Path(id): Path<String>) -> Response {
    let Ok(id) = id.parse::<u64>() else {
        return error(StatusCode::BAD_REQUEST, "failed to parse the asset id");
    };
    match d.asset_info_json(id) {
        Some(body) => axum::Json(body).into_response(),
        None => error(StatusCode::NOT_FOUND, "asset does not exist"),
    }
}

async fn account_asset_route(
    State(d): State<Devnet>,
    Path((address, id)): Path<(String, String)>,
) -> Response {
    let (Ok(a), Ok(id)) = (address.parse::<Address>(), id.parse::<u64>()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "failed to parse the address or asset id",
        );
    };
    match d.account_asset_json(&a, id) {
        Some(body) => axum::Json(body).into_response(),
        None => error(StatusCode::NOT_FOUND, "account asset info not found"),
    }
}

/// `POST /devnet/freeze/{address}/{asset}/{true|false}`: what the asset's freeze address does
/// with an `afrz` transaction, as a devnet control (like `/devnet/advance`).
async fn freeze_route(
    State(d): State<Devnet>,
    Path((address, asset, frozen)): Path<(String, String, String)>,
) -> Response {
    let (Ok(a), Ok(asset), Ok(frozen)) = (
        address.parse::<Address>(),
        asset.parse::<u64>(),
        frozen.parse::<bool>(),
    ) else {
        return error(
            StatusCode::BAD_REQUEST,
            "expected /devnet/freeze/ADDRESS/ASSET/true|false",
        );
    };
    match d.set_frozen(&a, asset, frozen) {
        Ok(()) => StatusCode::OK.into_response(),
        Err(m) => error(StatusCode::NOT_FOUND, &m),
    }
}
