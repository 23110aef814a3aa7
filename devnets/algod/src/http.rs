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

use crate::chain::{CONSENSUS_VERSION, Devnet, DevnetConfig, MIN_FEE, NOT_FOUND};

impl Devnet {
    /// The REST API as an axum router.
    pub fn router(&self) -> Router {
        let authed = Router::new()
            .route("/v2/transactions", post(submit_route))
            .route("/v2/transactions/params", get(params_route))
            .route("/v2/transactions/pending/{txid}", get(pending_route))
            .route("/v2/status", get(status_route))
            .route("/v2/status/wait-for-block-after/{round}", get(wait_route))
            .route("/v2/accounts/{address}", get(account_route))
            .route("/devnet/advance/{n}", post(advance_route))
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
