//! The example receiver app (the `exact-algo-receiver` binary, and the surfaces' tests): a
//! small board whose index is free and whose post bodies cost a fixed price, over HTTP and MCP.
//!
//! | path | price |
//! |---|---|
//! | `GET /llms.txt`, `GET /.well-known/exact-algo.json` | free |
//! | `GET /api/posts` | free index |
//! | `GET /api/posts/{id}` | `price` µALGO: the post body |
//! | `POST /mcp` | tools `board_index` and `payment_instructions` (free), `post_read` (`price`) |

use axum::Router;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use std::sync::Arc;

use x402_transport::Accepts;
use x402_transport::paywall::Paywall;

use crate::http::{ServiceInfo, discovery_router, prices, scheme_document};
use crate::mcp::{McpServer, Tool};
use crate::receiver::ExactAlgoReceiver;
use crate::scheme::ExactAlgo;

/// One post of the demo board.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Post {
    /// Its id (decimal, as in the path).
    pub id: &'static str,
    /// The title (free).
    pub title: &'static str,
    /// The body (paid).
    pub body: &'static str,
}

/// The demo board.
pub const POSTS: &[Post] = &[
    Post {
        id: "1",
        title: "exact-algo in one paragraph",
        body: "A 402 names payTo, maxAmountRequired and a single-use paymentId; the payer signs one native ALGO payment with the paymentId as its note and sends it back in PAYMENT-SIGNATURE. The server checks every rule, submits it, and answers 200 with PAYMENT-RESPONSE.",
    },
    Post {
        id: "2",
        title: "Why native ALGO",
        body: "No ASA opt-in, no USDC to acquire, and no issuer freeze address that could lock an escrow: native ALGO has no external authority.",
    },
    Post {
        id: "3",
        title: "Replays",
        body: "Every paymentId is single use and bound to the resource, amount and payee it was issued for; a second use is refused as 'paymentId already used'.",
    },
];

/// The post with id `id`, exactly as written (no numeric parsing: `01` is not `1`).
#[must_use]
pub fn find_post(id: &str) -> Option<&'static Post> {
    POSTS.iter().find(|p| p.id == id)
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn index_entry(p: &Post, price: u64) -> Value {
    json!({
        "id": p.id,
        "title": p.title,
        "sha256": sha256_hex(p.body),
        "state": "published",
        "path": format!("/api/posts/{}", p.id),
        "price": {"maxAmountRequired": price.to_string(), "asset": "ALGO", "unit": "microALGO"},
    })
}

fn full_post(p: &Post) -> Value {
    json!({"id": p.id, "title": p.title, "body": p.body, "sha256": sha256_hex(p.body)})
}

/// The board index.
#[must_use]
pub fn board_index(price: u64) -> Value {
    json!({"posts": POSTS.iter().map(|p| index_entry(p, price)).collect::<Vec<_>>()})
}

async fn post_route(Path(id): Path<String>) -> Response {
    match find_post(&id) {
        Some(p) => axum::Json(full_post(p)).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            axum::Json(json!({"error": "no such post"})),
        )
            .into_response(),
    }
}

fn post_id_arg(args: &Value) -> Result<&'static Post, String> {
    let id = match args.get("post_id") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        _ => return Err("post_id must be a string".into()),
    };
    find_post(&id).ok_or_else(|| format!("no such post: {id}"))
}

/// The example app: the paywalled board, its discovery documents and its MCP endpoint, each
/// post body costing `price` µALGO.
pub fn example_app(receiver: &ExactAlgoReceiver, price: u64) -> Router {
    let algo = Arc::new(ExactAlgo::new(receiver.clone()));
    let paywall = Paywall::new()
        .with_served(receiver.served().clone())
        .route_when(
            "/api/posts/{id}",
            "read post body",
            Accepts::default().or_priced(algo, u128::from(price)),
            Arc::new(|segments: &[String]| {
                segments.last().is_some_and(|id| find_post(id).is_some())
            }),
        );
    let mcp = McpServer::new(receiver.clone(), "exact-algo-board", env!("CARGO_PKG_VERSION"))
        .tool(Tool::new(
            "board_index",
            "List the posts: id, title, sha256 of the body, state and price. Free.",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
            move |_| async move { Ok(board_index(price)) },
        ))
        .tool(
            Tool::new(
                "post_read",
                "Read a post body (paid, native ALGO via exact-algo).",
                json!({"type": "object",
                       "properties": {"post_id": {"type": "string", "description": "the post id from board_index"}},
                       "required": ["post_id"], "additionalProperties": false}),
                |args| async move { post_id_arg(&args).map(|p| json!({"post": full_post(p)})) },
            )
            .priced(price)
            .with_check(|args| post_id_arg(args).map(|_| ())),
        );
    let info = ServiceInfo {
        name: "exact-algo board (example)".into(),
        summary: "A small board: the index is free, each post body costs a fixed price in native ALGO, over HTTP (GET /api/posts/{id}) and MCP (post_read).".into(),
        docs_url: None,
        mcp_endpoint: Some("/mcp".into()),
    };
    let routes = prices(&paywall);
    let tools = mcp.prices();
    let mcp = mcp.with_scheme_document(scheme_document(receiver, &routes, &tools, Some("/mcp")));
    let api = Router::new()
        .route(
            "/api/posts",
            get(move || async move { axum::Json(board_index(price)) }),
        )
        .route("/api/posts/{id}", get(post_route));
    paywall
        .apply(api)
        .merge(discovery_router(&info, receiver, &routes, &tools))
        .merge(mcp.router())
}
