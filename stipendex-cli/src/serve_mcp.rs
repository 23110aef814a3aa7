//! `stipendex serve-mcp`: an example paid MCP server behind the Stipendex gate, over any rail
//! of the registry — one free tool, one fixed-price tool, one checkout tool and one priced
//! resource, priced by the configuration's `[[price]]` entries.
//!
//! ```toml
//! [store]
//! url = "sqlite://shop.db"          # claims and kept answers (PostgreSQL for several instances)
//!
//! [rails.house]                       # any rail of the registry (the receiving side is used)
//! kind = "ledger"
//! url = "sqlite://ledger.db"
//! asset = "USD"
//! payee_account = "…"
//!
//! [receiver]
//! id = "search-co"
//! key_env = "STIPENDEX_RECEIVER_KEY"  # or key_file = "receiver.key" (64 hex digits)
//! origins = ["https://search.example"] # the server's identity: its Streamable HTTP origin,
//!                                      # or over stdio the identity hosts configure for it
//!
//! [[price]]
//! kind = "tool"
//! pattern = "search"
//! amount = "0.05"
//! asset = "USD"
//! description = "one web search"
//! ```
//!
//! The tools: `echo` (free unless priced), `search` (a fixed price), `render` (a checkout: the
//! hold is captured for its estimate; `{"fail": true}` makes it fail and the hold is voided);
//! the resources `reports://daily` (priced) and `public://readme`; the prompt `brief`.
//! Over stdio by default; `--listen ADDR` serves Streamable HTTP at `/mcp` (stateless).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, GetPromptResult, Implementation, JsonObject, ListPromptsResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, Prompt, PromptMessage,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, Role, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use stipendex::Registry;
use stipendex::mcp::PaidServer;
use stipendex::receiver::{Receiver, price_file};

use crate::{CliError, files, msg};

/// `stipendex serve-mcp`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The server's configuration: the registry's TOML, `[receiver]` and `[[price]]`.
    #[arg(long)]
    config: PathBuf,
    /// Serve Streamable HTTP at `http://ADDR/mcp` instead of stdio.
    #[arg(long)]
    listen: Option<SocketAddr>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReceiverSection {
    id: String,
    key_file: Option<PathBuf>,
    key_env: Option<String>,
    #[serde(default)]
    origins: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct File {
    receiver: Option<ReceiverSection>,
}

/// The receiver the configuration at `path` describes, serving at `listening` (its origin is
/// the default identity over HTTP).
pub(crate) async fn receiver(
    path: &Path,
    listening: Option<SocketAddr>,
) -> Result<(Receiver, Option<Arc<dyn rail_core::KeyStore>>), CliError> {
    let text = files::read(path)?;
    let file: File =
        toml::from_str(&text).map_err(|e| msg(stipendex::registry::toml_error(path, &text, &e)))?;
    let r = file.receiver.ok_or_else(|| {
        msg(format!(
            "{} has no [receiver] section: add one with the receiver's id, key_env and origins",
            path.display()
        ))
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let key = files::key_of("receiver", dir, r.key_file.as_deref(), r.key_env.as_deref())?;
    let prices = price_file::from_toml(&text)?;
    if prices.is_empty() {
        return Err(msg(format!(
            "{} prices nothing: add [[price]] entries (kind, pattern, amount, asset)",
            path.display()
        )));
    }
    let registry = Registry::from_file(path).await?;
    // The gateway's start-up checks: a price no rail receives is refused, a priced tool the
    // server does not list is warned.
    crate::checks::prices_payable(path, &crate::checks::receiving_assets(&registry), &prices)?;
    if let Some(w) = crate::checks::unlisted_warning(&prices, &Example::tool_names()) {
        warn(&w);
    }
    let mut b = Receiver::builder(&r.id, key).registry(&registry);
    if let Some(store) = registry.store() {
        b = b.store(store.clone());
    }
    let mut origins = r.origins.clone();
    if origins.is_empty()
        && let Some(addr) = listening
    {
        origins.push(format!("http://{addr}"));
    }
    if origins.is_empty() {
        return Err(msg(
            "[receiver] origins is empty: over stdio name the identity hosts know this server by (origins = [\"https://search.example\"])",
        ));
    }
    for o in &origins {
        b = b.origin(o);
    }
    for p in prices {
        b = b.price(p);
    }
    Ok((b.build()?, registry.store().cloned()))
}

/// A start-up warning, one line on standard error (over stdio, standard output is the MCP
/// channel).
#[allow(clippy::print_stderr)]
fn warn(what: &str) {
    eprintln!("stipendex serve-mcp: warning: {what}");
}

/// Runs `stipendex serve-mcp`.
pub(crate) async fn run(a: Args) -> Result<ExitCode, CliError> {
    let (receiver, store) = receiver(&a.config, a.listen).await?;
    // Records kept after payment (claims, kept answers, settled marks) expire; the store is
    // swept of them while the server runs.
    let _purge = store.map(crate::upkeep::purge_expired_every_minute);
    let origins = receiver.descriptor().origins.clone();
    let server = PaidServer::new(Example, receiver)?;
    match a.listen {
        None => {
            let running = Box::pin(server.serve(rmcp::transport::stdio()))
                .await
                .map_err(|e| msg(format!("the MCP host did not initialize over stdio: {e}")))?;
            let _ = running.waiting().await;
        }
        Some(addr) => {
            let app = stipendex::mcp::streamable_http("/mcp", move || Ok(server.clone()));
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| msg(format!("cannot listen on {addr}: {e}")))?;
            let bound = listener
                .local_addr()
                .map_err(|e| msg(format!("cannot listen on {addr}: {e}")))?;
            if let Some(w) = crate::checks::listen_warning(bound, &origins) {
                warn(&w);
            }
            eprintln!("stipendex serve-mcp: Streamable HTTP at http://{bound}/mcp");
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .map_err(|e| msg(format!("the server stopped: {e}")))?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The example server's tools, resources and prompt (the gate prices them).
#[derive(Clone, Copy, Debug)]
struct Example;

fn schema(v: &Value) -> Arc<JsonObject> {
    Arc::new(v.as_object().cloned().unwrap_or_default())
}

fn arg<'a>(request: &'a CallToolRequestParams, name: &str) -> Option<&'a Value> {
    request.arguments.as_ref().and_then(|a| a.get(name))
}

impl Example {
    /// Its tools, as `tools/list` answers them.
    fn tools() -> Vec<Tool> {
        let text = json!({"type": "object", "properties": {"text": {"type": "string"}}});
        vec![
            Tool::new("echo", "Says the text back.", schema(&text)),
            Tool::new(
                "search",
                "Searches the (example) web for a query.",
                schema(
                    &json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}),
                ),
            ),
            Tool::new(
                "render",
                "Renders the text as a document (checkout: held, then captured). {\"fail\": true} fails.",
                schema(
                    &json!({"type": "object", "properties": {"text": {"type": "string"}, "fail": {"type": "boolean"}}}),
                ),
            ),
        ]
    }

    /// The names of its tools (what `[[price]]` tool patterns are checked against).
    fn tool_names() -> Vec<String> {
        Example::tools()
            .into_iter()
            .map(|t| t.name.into_owned())
            .collect()
    }
}

impl ServerHandler for Example {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_prompts()
                .build(),
        )
        .with_server_info(Implementation::new(
            "stipendex-example",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "An example paid MCP server: priced tools answer -32402 with a signed Stipendex Quote \
             (tools/list shows _meta[\"stipendex/pricing\"]); pay it and call again with \
             _meta[\"stipendex/payment\"].",
        )
    }

    async fn list_tools(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(Example::tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let text = arg(&request, "text")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let r = match request.name.as_ref() {
            "echo" => CallToolResult::success(vec![ContentBlock::text(text.to_owned())]),
            "search" => {
                let query = arg(&request, "query")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                // Progress, for a host that asked for it (the proxy carries it over).
                if let Some(token) = context.meta.get_progress_token() {
                    let _ = context
                        .peer
                        .notify_progress(
                            rmcp::model::ProgressNotificationParam::new(token, 1.0)
                                .with_total(1.0)
                                .with_message("searched"),
                        )
                        .await;
                }
                CallToolResult::structured(json!({
                    "query": query,
                    "results": [
                        {"title": format!("{query}: the first result"), "url": "https://example.invalid/1"},
                        {"title": format!("{query}: the second result"), "url": "https://example.invalid/2"},
                    ]
                }))
            }
            "render" if arg(&request, "fail").and_then(Value::as_bool) == Some(true) => {
                CallToolResult::error(vec![ContentBlock::text(
                    "the renderer failed; the hold is voided",
                )])
            }
            "render" => CallToolResult::success(vec![ContentBlock::text(format!(
                "# {}\n\n(rendered)",
                text.to_uppercase()
            ))]),
            other => {
                return Err(ErrorData::invalid_params(
                    format!("unknown tool: {other}"),
                    None,
                ));
            }
        };
        Ok(r.into())
    }

    async fn list_resources(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new("reports://daily", "the daily report"),
            Resource::new("public://readme", "how to pay this server"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let text = match request.uri.as_str() {
            "reports://daily" => "The daily report: all systems nominal.",
            "public://readme" => {
                "Priced tools answer -32402 with a signed Quote; see tools/list for prices."
            }
            other => {
                return Err(ErrorData::resource_not_found(
                    format!("no resource {other}"),
                    None,
                ));
            }
        };
        Ok(ReadResourceResult::new(vec![ResourceContents::text(text, request.uri.clone())]).into())
    }

    async fn list_prompts(
        &self,
        _r: Option<PaginatedRequestParams>,
        _c: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        Ok(ListPromptsResult::with_all_items(vec![Prompt::new(
            "brief",
            Some("A research brief on a topic."),
            None,
        )]))
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        _c: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        Ok(GetPromptResult::new(vec![PromptMessage::new_text(
            Role::User,
            format!("Write a research brief ({}).", request.name),
        )])
        .into())
    }
}
