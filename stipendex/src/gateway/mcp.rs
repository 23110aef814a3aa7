//! The MCP upstream: a payment-unaware MCP server (a command over stdio, or a Streamable HTTP
//! URL) behind the Stipendex MCP gate ([`crate::mcp::PaidServer`]). The gateway serves
//! Streamable HTTP at `[gateway] mcp_path` (stateless, JSON answers) and forwards every host
//! request to one session with the upstream, opened at start:
//! - `tools/call`, `resources/read` and `prompts/get` of what `[[price]]` prices are quoted
//!   (-32402, or x402's `isError` for a host that does not speak Stipendex where an x402-style
//!   rail is configured), paid, forwarded once and receipted;
//! - `tools/list` and `resources/list` carry the pricing hints; every other request
//!   (`completion/complete`, `logging/setLevel`, subscriptions, `ping`) is forwarded as it is,
//!   with the host's `_meta` minus payment keys.
//!
//! Left out, because a stateless endpoint has no channel back to a host between its requests:
//! the upstream's own requests to the host (sampling, elicitation, roots — the gateway's
//! session declares none of those capabilities) and its notifications (progress, logging,
//! list changes).

use std::sync::Arc;

#[allow(deprecated)] // resources/subscribe: forwarded for hosts of the session lifecycle
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResponse, CancelledNotificationParam,
    ClientCapabilities, ClientConfig, ClientRequest, CompleteRequest, CompleteRequestParams,
    CompleteResult, GetPromptRequest, GetPromptRequestParams, GetPromptResponse, Implementation,
    ListPromptsResult, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ReadResourceRequest, ReadResourceRequestParams, ReadResourceResponse,
    RequestOptionalParam, ServerConfig, ServerResult, SubscribeRequest, SubscribeRequestParams,
    UnsubscribeRequest, UnsubscribeRequestParams,
};
use rmcp::service::{
    PeerRequestOptions, RequestContext, RoleClient, RoleServer, RunningService, ServiceError,
};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, ErrorData, Peer, ServerHandler, ServiceExt};
use serde::de::DeserializeOwned;

use super::Upstream;
use crate::Error;

fn msg(s: impl Into<String>) -> Error {
    Error::Gateway(s.into())
}

/// The gateway's side of its session with the upstream: it asks nothing of the host.
#[derive(Clone)]
struct GatewayClient;

impl ClientHandler for GatewayClient {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("stipendex-gateway", env!("CARGO_PKG_VERSION")),
        )
    }
}

/// The session with the upstream.
pub(crate) struct Session {
    peer: Peer<RoleClient>,
    info: ServerConfig,
    _running: RunningService<RoleClient, GatewayClient>,
}

impl Session {
    /// Starts (a command) or reaches (a URL) the upstream and initializes the session.
    pub(crate) async fn connect(upstream: &Upstream) -> Result<Session, Error> {
        let running = match upstream {
            Upstream::McpCommand(cmd) => {
                let (program, args) = cmd
                    .split_first()
                    .ok_or_else(|| msg("[upstream] command is empty"))?;
                let mut c = tokio::process::Command::new(program);
                c.args(args);
                let child = TokioChildProcess::new(c)
                    .map_err(|e| msg(format!("[upstream] command: cannot start {program}: {e}")))?;
                GatewayClient.serve(child).await
            }
            Upstream::McpUrl(url) => {
                let _ = rustls::crypto::ring::default_provider().install_default();
                let http = reqwest::Client::builder()
                    .connect_timeout(std::time::Duration::from_secs(5))
                    .build()
                    .map_err(|e| msg(format!("cannot start the upstream's HTTP client: {e}")))?;
                let t = StreamableHttpClientTransport::with_client(
                    http,
                    StreamableHttpClientTransportConfig::with_uri(url.as_str()),
                );
                GatewayClient.serve(t).await
            }
            Upstream::Http(_) => return Err(msg("not an MCP upstream")),
        }
        .map_err(|e| {
            msg(format!(
                "the MCP upstream did not initialize: {e}; check [upstream] mcp_url or command"
            ))
        })?;
        let peer = running.peer().clone();
        let p = peer
            .peer_info()
            .ok_or_else(|| msg("the MCP upstream sent no initialize result"))?;
        let mut info = ServerConfig::new(p.capabilities.clone())
            .with_protocol_version(p.protocol_version.clone());
        if let Some(i) = &p.server_info {
            info = info.with_server_info(i.clone());
        }
        if let Some(text) = &p.instructions {
            info = info.with_instructions(text.clone());
        }
        Ok(Session {
            peer,
            info,
            _running: running,
        })
    }

    /// The names of the tools the upstream lists (every page), or `None` when it offers no
    /// tools or does not answer the listing (the listing is then not checked).
    pub(crate) async fn tool_names(&self) -> Option<Vec<String>> {
        self.info.capabilities.tools.as_ref()?;
        match self.peer.list_all_tools().await {
            Ok(tools) => Some(tools.into_iter().map(|t| t.name.into_owned()).collect()),
            Err(e) => {
                tracing::warn!(error = %e, "the MCP upstream did not list its tools: the priced tools are not checked against them");
                None
            }
        }
    }

    /// Whether the session is gone (the child exited, the URL stopped answering).
    pub(crate) fn closed(&self) -> bool {
        self.peer.is_transport_closed()
    }
}

/// A handler per request (the endpoint is stateless), all on the one session.
#[derive(Clone)]
pub(crate) struct Forward(pub(crate) Arc<Session>);

fn upstream_error(e: &ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(e) => e.clone(),
        e => ErrorData::internal_error(
            format!("the MCP server behind this gateway: {e}"),
            Some(serde_json::json!({"error": "upstream_unavailable"})),
        ),
    }
}

impl Forward {
    /// Sends `req` upstream with the host's `_meta` (minus payment and per-connection keys),
    /// cancelled with the host's request.
    async fn exchange(
        &self,
        req: ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        let mut meta = context.meta.clone();
        meta.0.0.retain(|k, _| {
            k != "progressToken"
                && !k.starts_with("stipendex/")
                && !k.starts_with("x402/")
                && !k.starts_with("io.modelcontextprotocol/")
        });
        // A request that cannot be sent never reached the upstream: the gate charges nothing.
        let handle = self
            .0
            .peer
            .send_request_with_option(req, PeerRequestOptions::no_options().with_meta(meta))
            .await
            .map_err(|e| {
                crate::mcp::undelivered(format!("the MCP server behind this gateway: {e}"))
            })?;
        let id = handle.id.clone();
        let answer = tokio::select! {
            r = handle.await_response() => r.map_err(|e| upstream_error(&e))?,
            () = context.ct.cancelled() => {
                let _ = self
                    .0
                    .peer
                    .notify_cancelled(CancelledNotificationParam::new(Some(id), Some("cancelled by the host".into())))
                    .await;
                return Err(ErrorData::internal_error("cancelled by the host", None));
            }
        };
        Ok(answer)
    }

    /// As [`Forward::exchange`], the answer read as `T`.
    async fn send<T: DeserializeOwned>(
        &self,
        req: ClientRequest,
        context: &RequestContext<RoleServer>,
    ) -> Result<T, ErrorData> {
        let answer = self.exchange(req, context).await?;
        let v = serde_json::to_value(&answer)
            .map_err(|e| ErrorData::internal_error(format!("the upstream's answer: {e}"), None))?;
        serde_json::from_value(v).map_err(|e| {
            ErrorData::internal_error(
                format!("the upstream's answer is not the result asked for: {e}"),
                None,
            )
        })
    }
}

fn unexpected(r: &ServerResult) -> ErrorData {
    ErrorData::internal_error(
        format!(
            "the MCP server behind this gateway answered with another kind of result: {}",
            serde_json::to_string(r).unwrap_or_default()
        ),
        None,
    )
}

/// A list request with the host's cursor, if any.
fn listing<M: Default>(
    p: Option<PaginatedRequestParams>,
) -> RequestOptionalParam<M, PaginatedRequestParams> {
    match p {
        Some(p) => RequestOptionalParam::with_param(p),
        None => RequestOptionalParam {
            method: M::default(),
            params: None,
            extensions: rmcp::model::Extensions::default(),
        },
    }
}

impl ServerHandler for Forward {
    fn get_info(&self) -> ServerConfig {
        self.0.info.clone()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        match self
            .exchange(
                ClientRequest::CallToolRequest(CallToolRequest::new(request)),
                &context,
            )
            .await?
        {
            ServerResult::CallToolResult(r) => Ok(CallToolResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(CallToolResponse::InputRequired(r)),
            ServerResult::CreateTaskResult(r) => Ok(CallToolResponse::Task(r)),
            other => Err(unexpected(&other)),
        }
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.send(ClientRequest::ListToolsRequest(listing(request)), &context)
            .await
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        match self
            .exchange(
                ClientRequest::ReadResourceRequest(ReadResourceRequest::new(request)),
                &context,
            )
            .await?
        {
            ServerResult::ReadResourceResult(r) => Ok(ReadResourceResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(ReadResourceResponse::InputRequired(r)),
            other => Err(unexpected(&other)),
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        self.send(
            ClientRequest::ListResourcesRequest(listing(request)),
            &context,
        )
        .await
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        self.send(
            ClientRequest::ListResourceTemplatesRequest(listing(request)),
            &context,
        )
        .await
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        match self
            .exchange(
                ClientRequest::GetPromptRequest(GetPromptRequest::new(request)),
                &context,
            )
            .await?
        {
            ServerResult::GetPromptResult(r) => Ok(GetPromptResponse::Complete(r)),
            ServerResult::InputRequiredResult(r) => Ok(GetPromptResponse::InputRequired(r)),
            other => Err(unexpected(&other)),
        }
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        self.send(
            ClientRequest::ListPromptsRequest(listing(request)),
            &context,
        )
        .await
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        self.send(
            ClientRequest::CompleteRequest(CompleteRequest::new(request)),
            &context,
        )
        .await
    }

    #[allow(deprecated)]
    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _: serde_json::Value = self
            .send(
                ClientRequest::SubscribeRequest(SubscribeRequest::new(request)),
                &context,
            )
            .await?;
        Ok(())
    }

    #[allow(deprecated)]
    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _: serde_json::Value = self
            .send(
                ClientRequest::UnsubscribeRequest(UnsubscribeRequest::new(request)),
                &context,
            )
            .await?;
        Ok(())
    }
}
