//! The example receiver app (the `exact-algo-receiver` binary, and the surfaces' tests): a
//! small board whose index is free and whose post bodies cost a fixed price, over HTTP and MCP.
//!
//! | path | price |
//! |---|---|
//! | `GET /llms.txt`, `GET /.well-known/exact-algo.json` | free |
//! | `GET /api/posts` | free index |
//! | `GET /api/posts/{id}` | `price` µALGO: the post body |
//! | `POST /mcp` | tools `board_index` and `payment_instructions` (free), `post_read` (`price`): an rmcp server over Streamable HTTP, stateless, JSON answers |

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

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ErrorData, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use x402_transport::mcp::McpPaywall;

use rail_exact_algo::http::{ServiceInfo, discovery_router, prices, scheme_document};
use rail_exact_algo::mcp::{
    PAYMENT_INSTRUCTIONS, payment_instructions, payment_instructions_tool, price_meta, schema,
};
use rail_exact_algo::receiver::{ExactAlgoReceiver, Price};
use rail_exact_algo::scheme::ExactAlgo;

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

/// The board's MCP server (rmcp): `board_index` and `payment_instructions` free, `post_read`
/// priced through the shared MCP adapter.
#[derive(Clone, Debug)]
pub struct BoardServer {
    paywall: McpPaywall,
    price: u64,
    network: String,
    instructions: Value,
}

impl rmcp::ServerHandler for BoardServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "exact-algo-board",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Paid tools answer an unpaid call with isError and the payment requirement in \
                 structuredContent; pay it in native ALGO (exact-algo) and retry the same call \
                 with params._meta[\"x402/payment\"]. Call payment_instructions for the scheme.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut post_read = Tool::new(
            "post_read",
            "Read a post body (paid, native ALGO via exact-algo).",
            schema(json!({"type": "object",
                "properties": {"post_id": {"type": "string", "description": "the post id from board_index"}},
                "required": ["post_id"], "additionalProperties": false})),
        );
        post_read.meta = Some(price_meta(&self.network, self.price));
        Ok(ListToolsResult::with_all_items(vec![
            payment_instructions_tool(),
            Tool::new(
                "board_index",
                "List the posts: id, title, sha256 of the body, state and price. Free.",
                schema(json!({"type": "object", "properties": {}, "additionalProperties": false})),
            ),
            post_read,
        ]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = Value::Object(request.arguments.clone().unwrap_or_default());
        let result = match request.name.as_ref() {
            "board_index" => CallToolResult::structured(board_index(self.price)),
            PAYMENT_INSTRUCTIONS => payment_instructions(self.instructions.clone()),
            "post_read" => match post_id_arg(&args) {
                // A call that cannot succeed asks for no payment.
                Err(e) => CallToolResult::structured_error(json!({"error": e})),
                Ok(post) => {
                    self.paywall
                        .call("post_read", Some(&context.meta.0.0), || async move {
                            CallToolResult::structured(json!({"post": full_post(post)}))
                        })
                        .await
                }
            },
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool: {other}"),
                    None,
                ));
            }
        };
        Ok(result.into())
    }
}

/// The example app: the paywalled board, its discovery documents and its MCP endpoint, each
/// post body costing `price` µALGO, payments served once across HTTP and MCP.
pub fn example_app(receiver: &ExactAlgoReceiver, price: u64) -> Router {
    let algo = Arc::new(ExactAlgo::new(receiver.clone()));
    let paywall = Paywall::new()
        .with_served(receiver.served().clone())
        .route_when(
            "/api/posts/{id}",
            "read post body",
            Accepts::default().or_priced(algo.clone(), u128::from(price)),
            Arc::new(|segments: &[String]| {
                segments.last().is_some_and(|id| find_post(id).is_some())
            }),
        );
    let tools = vec![Price {
        resource: "post_read".into(),
        description: "Read a post body (paid, native ALGO via exact-algo).".into(),
        amount: price,
    }];
    let board = BoardServer {
        // Settled before the tool runs (`docs/exact-algo.md` §5: the fee settles in the call):
        // exact-algo checks its paymentId and rules while settling.
        paywall: McpPaywall::new()
            .with_served(receiver.served().clone())
            .with_clock(receiver.clock().clone())
            .settle(x402_transport::SettleWhen::Before)
            .tool(
                "post_read",
                "Read a post body (paid, native ALGO via exact-algo).",
                Accepts::default().or_priced(algo, u128::from(price)),
            ),
        price,
        network: receiver.network().to_owned(),
        instructions: Value::Null,
    };
    let info = ServiceInfo {
        name: "exact-algo board (example)".into(),
        summary: "A small board: the index is free, each post body costs a fixed price in native ALGO, over HTTP (GET /api/posts/{id}) and MCP (post_read).".into(),
        docs_url: None,
        mcp_endpoint: Some("/mcp".into()),
    };
    let routes = prices(&paywall);
    let board = BoardServer {
        instructions: scheme_document(receiver, &routes, &tools, Some("/mcp")),
        ..board
    };
    let api = Router::new()
        .route(
            "/api/posts",
            get(move || async move { axum::Json(board_index(price)) }),
        )
        .route("/api/posts/{id}", get(post_route));
    paywall
        .apply(api)
        .merge(discovery_router(&info, receiver, &routes, &tools))
        .merge(x402_transport::mcp::streamable_http("/mcp", move || {
            Ok(board.clone())
        }))
}
