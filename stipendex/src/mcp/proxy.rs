//! Proxy mode (feature `mcp-client`): a host that knows nothing of payments connects to the
//! proxy as its MCP server; the proxy connects to the real server (a child process over stdio,
//! or a Streamable HTTP URL), forwards everything both ways and pays what the server asks for
//! under the wallet's mandate.
//!
//! - Host → server: every request, with its `_meta` (the progress token mapped: rmcp numbers
//!   the proxy's own), and every notification but `initialized` and `cancelled` (a host's
//!   cancellation cancels the proxy's call, the first request or its paid retry alike).
//! - Server → host: every request (elicitation, sampling, roots, ping), with its `_meta` but
//!   for Stipendex's keys, and notification (progress mapped back to the host's token,
//!   logging, list changes).
//! - Whose dialog the user answers (issue 48): the wallet's confirmation starts
//!   `[Stipendex wallet]` and carries `_meta["stipendex/origin"] = "wallet"` ([`super::ORIGIN`]);
//!   a server's elicitation is forwarded with its message labelled `[from MCP server "<name>"
//!   at <identity>]` (the name it declared, the identity the proxy knows it by) and without any
//!   `stipendex/` key; one that reads like the wallet's (its prefix, "Confirm the payment",
//!   lookalike letters included) is answered with an error and never shown.
//! - A `-32402` Quote, or an x402 `isError` challenge, is paid by [`PayingClient`] and the call
//!   sent again; the host sees the result. A payment the wallet refuses is a tool error the
//!   model can read ("not allowed by your mandate: …"), or for a resource or prompt a JSON-RPC
//!   error with that sentence. Confirmations go to the host's user by MCP elicitation
//!   ([`super::Elicit`]); a host that cannot elicit is never paid for silently.
//!
//! The host's `initialize` is answered with the server's own `initialize` result: the proxy
//! connects to the server on the host's `initialize`, with the host's client capabilities (plus
//! `experimental["stipendex/payments"]`), so the server asks the host for what the host offers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use rmcp::model::JsonRpcMessage;
use rmcp::model::{
    CallToolResult, ClientConfig, ClientNotification, ClientRequest, ClientResult, ContentBlock,
    ElicitRequestParams, ErrorCode, GetMeta as _, InitializeRequestParams, ProgressToken,
    ProtocolVersion, RequestMetaObject, ServerConfig, ServerNotification, ServerRequest,
    ServerResult,
};
use rmcp::service::{
    NotificationContext, RequestContext, RoleClient, RoleServer, RunningService, Service,
    ServiceExt,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess, Transport};
use rmcp::{ErrorData, Peer};
use serde_json::json;
use std::future::Future;

use super::client::{Call, CallError, PayingClient};
use super::{Elicit, PAYMENTS};
use crate::Error;
use crate::wallet::{Wallet, printable};

/// Where the real server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Upstream {
    /// A command started as a child process, spoken to over its stdio.
    Command {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// A Streamable HTTP endpoint.
    Url(String),
}

/// The proxy: a wallet, the real server, and the identity the host knows that server by.
#[derive(Clone)]
pub struct Proxy {
    wallet: Wallet,
    upstream: Upstream,
    server: String,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy")
            .field("upstream", &self.upstream)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Proxy {
    /// A proxy to `upstream` paying with `wallet`. The server's identity — what its Quotes
    /// must name and the mandate must pin — is the origin of its URL, or for a command the
    /// `identity` configured for it (an origin such as `https://search.example`), which a
    /// command must have: the name a server declares about itself is never trusted.
    ///
    /// # Errors
    /// [`Error::Config`] for a command without an identity; [`Error::Malformed`] for an
    /// identity or URL that is not http(s).
    pub fn new(wallet: Wallet, upstream: Upstream, identity: Option<&str>) -> Result<Self, Error> {
        let server = match (&upstream, identity) {
            (_, Some(id)) => crate::origin::of_url(id)?,
            (Upstream::Url(url), None) => crate::origin::of_url(url)?,
            (Upstream::Command { program, .. }, None) => {
                return Err(Error::Config(format!(
                    "the server command {program} needs an identity: the origin its Quotes name and your mandate pins (`server = \"https://…\"` in [upstream])"
                )));
            }
        };
        Ok(Proxy {
            wallet,
            upstream,
            server,
        })
    }

    /// The server's identity.
    #[must_use]
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Serves one host over `transport` (stdio: `rmcp::transport::stdio()`) until it goes
    /// away; the server is connected on the host's `initialize` and dropped (a child process
    /// killed) with it.
    ///
    /// # Errors
    /// [`Error::Config`] if the host never initialized.
    pub async fn serve<T, E, A>(self, transport: T) -> Result<(), Error>
    where
        T: rmcp::transport::IntoTransport<RoleServer, E, A>,
        E: std::error::Error + Send + Sync + 'static,
    {
        let shared = Arc::new(Shared {
            proxy: self,
            host: OnceLock::new(),
            upstream: tokio::sync::OnceCell::new(),
            progress: Arc::new(Mutex::new(HashMap::new())),
            inflight: Arc::default(),
        });
        let running = ProxyServer(shared.clone())
            .serve(transport)
            .await
            .map_err(|e| {
                Error::Config(format!("the host did not initialize the MCP session: {e}"))
            })?;
        let _ = running.waiting().await;
        // The host is gone: the tabs the session opened are closed while the server is still
        // connected, so their unused caps are released now.
        if let Some(c) = shared.upstream.get() {
            match c.client.close_tabs().await {
                Ok(receipts) => {
                    for r in receipts {
                        let r = r.object();
                        tracing::info!(tab = %r.tab, calls = r.calls, captured = %r.captured, cap = %r.cap, "tab closed at the end of the session");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "a tab could not be closed; the server closes it at its end");
                }
            }
        }
        Ok(())
    }
}

type Progress = Arc<Mutex<HashMap<ProgressToken, ProgressToken>>>;

struct Shared {
    proxy: Proxy,
    host: OnceLock<Peer<RoleServer>>,
    upstream: tokio::sync::OnceCell<Connected>,
    /// The proxy's progress token of a message sent upstream → the host's token of the call.
    progress: Progress,
    /// Progress notifications received from the server and not yet forwarded to the host.
    inflight: Arc<Inflight>,
}

struct Connected {
    client: PayingClient,
    /// Kept so the connection (and a child process) lives as long as the proxy.
    _running: RunningService<RoleClient, UpstreamHandler>,
}

#[derive(Clone)]
struct ProxyServer(Arc<Shared>);

/// The proxy's side toward the real server: forwards the server's requests and notifications
/// to the host.
struct UpstreamHandler {
    info: ClientConfig,
    shared: std::sync::Weak<Shared>,
}

/// The HTTP client of a Streamable HTTP upstream: the workspace's TLS provider, a connect
/// timeout, and no total timeout (a call's answer may stream for as long as the call runs).
fn http_client() -> Result<reqwest::Client, Error> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .build()
        .map_err(|e| Error::Config(format!("cannot build an HTTP client: {e}")))
}

/// The server's `initialize` result, as the proxy answers the host's.
fn initialize_result(info: &rmcp::model::ServerPeerInfo) -> ServerConfig {
    let mut r = ServerConfig::new(info.capabilities.clone())
        .with_protocol_version(info.protocol_version.clone());
    if let Some(i) = &info.server_info {
        r = r.with_server_info(i.clone());
    }
    if let Some(text) = &info.instructions {
        r = r.with_instructions(text.clone());
    }
    r.meta.clone_from(&info.meta);
    r
}

/// Progress notifications received and not yet forwarded, by the proxy's token.
#[derive(Default)]
struct Inflight {
    counts: Mutex<HashMap<ProgressToken, usize>>,
    changed: tokio::sync::Notify,
}

/// How long an answer waits for its call's progress to be forwarded first.
const PROGRESS_FLUSH: std::time::Duration = std::time::Duration::from_secs(2);

impl Inflight {
    fn begin(&self, token: &ProgressToken) {
        if let Ok(mut c) = self.counts.lock() {
            *c.entry(token.clone()).or_default() += 1;
        }
    }

    fn end(&self, token: &ProgressToken) {
        if let Ok(mut c) = self.counts.lock()
            && let Some(n) = c.get_mut(token)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.remove(token);
            }
        }
        self.changed.notify_waiters();
    }

    fn pending(&self, tokens: &[ProgressToken]) -> bool {
        self.counts
            .lock()
            .map(|c| tokens.iter().any(|t| c.contains_key(t)))
            .unwrap_or(false)
    }

    /// Waits (at most [`PROGRESS_FLUSH`]) until no progress of `tokens` is left to forward.
    async fn drained(&self, tokens: &[ProgressToken]) {
        let wait = async {
            loop {
                let changed = self.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if !self.pending(tokens) {
                    return;
                }
                changed.await;
            }
        };
        let _ = tokio::time::timeout(PROGRESS_FLUSH, wait).await;
    }
}

/// The server's transport, counting each progress notification as it arrives — in order,
/// before the answer that follows it — so the answer can wait for it to be forwarded.
struct Ordered<T> {
    inner: T,
    inflight: Arc<Inflight>,
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Ordered<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let m = self.inner.receive().await;
        if let Some(JsonRpcMessage::Notification(n)) = &m
            && let ServerNotification::ProgressNotification(p) = &n.notification
        {
            self.inflight.begin(&p.params.progress_token);
        }
        m
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

fn upstream_error(e: &str) -> ErrorData {
    ErrorData::internal_error(format!("the MCP server behind the proxy: {e}"), None)
}

impl Shared {
    /// The connection to the real server, made once, with the host's `initialize` parameters
    /// when it sent them.
    async fn connect(
        self: &Arc<Self>,
        params: Option<InitializeRequestParams>,
    ) -> Result<&Connected, ErrorData> {
        self.upstream
            .get_or_try_init(|| async {
                let mut info = params.unwrap_or_default();
                info.capabilities
                    .experimental
                    .get_or_insert_with(Default::default)
                    .insert(PAYMENTS.to_owned(), super::payments_marker());
                let handler = UpstreamHandler {
                    info,
                    shared: Arc::downgrade(self),
                };
                let running = match &self.proxy.upstream {
                    Upstream::Command { program, args } => {
                        let mut cmd = tokio::process::Command::new(program);
                        cmd.args(args);
                        let child = TokioChildProcess::new(cmd)
                            .map_err(|e| upstream_error(&format!("cannot start {program}: {e}")))?;
                        handler
                            .serve(Ordered {
                                inner: child,
                                inflight: self.inflight.clone(),
                            })
                            .await
                    }
                    Upstream::Url(url) => {
                        let transport = StreamableHttpClientTransport::with_client(
                            http_client().map_err(|e| upstream_error(&e.to_string()))?,
                            StreamableHttpClientTransportConfig::with_uri(url.as_str()),
                        );
                        handler
                            .serve(Ordered {
                                inner: transport,
                                inflight: self.inflight.clone(),
                            })
                            .await
                    }
                }
                .map_err(|e| upstream_error(&format!("cannot initialize: {e}")))?;
                let client = PayingClient::new(
                    running.peer().clone(),
                    self.proxy.wallet.clone(),
                    &self.proxy.server,
                )
                .map_err(|e| upstream_error(&e.to_string()))?;
                Ok(Connected {
                    client,
                    _running: running,
                })
            })
            .await
    }
}

impl Service<RoleServer> for ProxyServer {
    async fn handle_request(
        &self,
        request: ClientRequest,
        context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        let shared = &self.0;
        // The proxy speaks the session lifecycle (`initialize`): it asks the host's user by
        // elicitation mid-call, which the 2026-07-28 inline lifecycle forbids. A discovery
        // probe is refused so the host falls back to `initialize`.
        if matches!(request, ClientRequest::DiscoverRequest(_)) {
            return Err(ErrorData::new(
                ErrorCode::METHOD_NOT_FOUND,
                "server/discover: this proxy speaks the initialize lifecycle",
                None,
            ));
        }
        let _ = shared.host.set(context.peer.clone());
        if let ClientRequest::InitializeRequest(r) = request {
            let up = shared.connect(Some(r.params)).await?;
            let info = up
                .client
                .peer()
                .peer_info()
                .ok_or_else(|| upstream_error("it sent no initialize result"))?;
            return Ok(ServerResult::InitializeResult(initialize_result(&info)));
        }
        let up = shared.connect(None).await?;
        let is_tool = matches!(request, ClientRequest::CallToolRequest(_));
        // The host's own `_meta`, but for the lifecycle keys rmcp sets per connection; its
        // progress token is the host's, mapped from each token the proxy's messages carry.
        let mut meta = context.meta.clone();
        let host_token = meta.get_progress_token();
        meta.0
            .0
            .retain(|k, _| k != "progressToken" && !k.starts_with("io.modelcontextprotocol/"));
        let sent: Mutex<Vec<ProgressToken>> = Mutex::new(Vec::new());
        let record = |t: &ProgressToken| {
            if let Some(host) = &host_token
                && let Ok(mut map) = shared.progress.lock()
            {
                map.insert(t.clone(), host.clone());
                if let Ok(mut s) = sent.lock() {
                    s.push(t.clone());
                }
            }
        };
        let confirmer = Elicit::new(context.peer.clone());
        let answered = up
            .client
            .call(Call {
                request,
                meta,
                confirmer: &confirmer,
                cancel: context.ct.clone(),
                on_sent: Some(&record),
            })
            .await;
        // The server's progress for this call reaches the host before its answer (rmcp hands
        // each notification to a task of its own: the order is restored here).
        let tokens: Vec<ProgressToken> = sent.lock().map(|s| s.clone()).unwrap_or_default();
        if !tokens.is_empty() {
            shared.inflight.drained(&tokens).await;
        }
        if let Ok(mut map) = shared.progress.lock() {
            for t in &tokens {
                map.remove(t);
            }
        }
        match answered {
            Ok(a) => Ok(a.result),
            Err(CallError::Server(e)) => Err(e),
            Err(e @ CallError::NotPaid(_)) if is_tool => {
                // The model reads why: a tool error, not a protocol error.
                let mut r = CallToolResult::error(vec![ContentBlock::text(e.for_the_model())]);
                if let CallError::NotPaid(inner) = &e {
                    r.structured_content = Some(
                        json!({"stipendex/error": {"code": inner.code(), "message": e.for_the_model()}}),
                    );
                }
                Ok(ServerResult::CallToolResult(r))
            }
            Err(e @ CallError::NotPaid(_)) => Err(ErrorData::new(
                ErrorCode::INVALID_REQUEST,
                e.for_the_model(),
                match &e {
                    CallError::NotPaid(inner) => Some(json!({"error": inner.code()})),
                    _ => None,
                },
            )),
            Err(e) => Err(upstream_error(&e.to_string())),
        }
    }

    async fn handle_notification(
        &self,
        notification: ClientNotification,
        _context: NotificationContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        match notification {
            // The proxy's own connection sent its `initialized`; a cancellation cancels the
            // proxy's call (rmcp cancels its token), which cancels what it sent.
            ClientNotification::InitializedNotification(_)
            | ClientNotification::CancelledNotification(_) => Ok(()),
            other => {
                if let Some(up) = self.0.upstream.get() {
                    up.client
                        .peer()
                        .send_notification(other)
                        .await
                        .map_err(|e| upstream_error(&e.to_string()))?;
                }
                Ok(())
            }
        }
    }

    fn supported_protocol_versions(&self) -> std::borrow::Cow<'static, [ProtocolVersion]> {
        std::borrow::Cow::Borrowed(ProtocolVersion::known_up_to(&ProtocolVersion::V_2025_11_25))
    }

    fn get_info(&self) -> ServerConfig {
        self.0
            .upstream
            .get()
            .and_then(|up| up.client.peer().peer_info())
            .map(|i| initialize_result(&i))
            .unwrap_or_default()
    }
}

/// Whether a `_meta` key of the server's request is forwarded to the host: not a key of
/// Stipendex's (`stipendex/…`: the wallet's mark [`super::ORIGIN`] above all), nor one rmcp
/// sets per connection (the progress token, `io.modelcontextprotocol/…`).
fn forwards_meta(key: &str) -> bool {
    !(key.starts_with("stipendex/")
        || key == "progressToken"
        || key.starts_with("io.modelcontextprotocol/"))
}

/// The most characters of a server's declared name a forwarded dialog's label shows.
const SERVER_NAME_MAX: usize = 64;

/// The label a forwarded dialog's message starts with: `[from MCP server "<name>" at
/// <identity>]` — the name the server declared in `initialize` (bounded, escaped), the
/// identity the proxy knows it by (the origin of its URL, or the configured identity).
fn label(name: Option<&str>, identity: &str) -> String {
    match name.filter(|n| !n.is_empty()) {
        Some(n) => format!(
            "[from MCP server \"{}\" at {}]",
            crate::wallet::bounded(n, SERVER_NAME_MAX, true),
            printable(identity)
        ),
        None => format!("[from MCP server at {}]", printable(identity)),
    }
}

/// A request of the server, as the proxy forwards it to the host (issue 48):
/// - its `_meta` (the server's, kept by rmcp in `meta`) without Stipendex's keys — no wallet
///   mark ever reaches the host from the server — nor rmcp's per-connection keys;
/// - a dialog (elicitation, form or URL) labelled with the server ([`label`]);
/// - a dialog that reads like the wallet's own ([`super::elicit::imitates_wallet`]: its
///   message, its form, its URL or the server's name) refused: the server gets an error and
///   the human never sees it.
fn forwarded(
    mut request: ServerRequest,
    mut meta: RequestMetaObject,
    name: Option<&str>,
    identity: &str,
) -> Result<ServerRequest, ErrorData> {
    meta.retain(|k, _| forwards_meta(k));
    if let ServerRequest::ElicitRequest(r) = &mut request {
        let (message, shown) = match &mut r.params {
            ElicitRequestParams::FormElicitationParams {
                meta: own,
                message,
                requested_schema,
            } => {
                strip(own);
                let schema = serde_json::to_string(requested_schema).unwrap_or_default();
                let shown = format!("{message}\n{schema}");
                (message, shown)
            }
            ElicitRequestParams::UrlElicitationParams {
                meta: own,
                message,
                url,
                ..
            } => {
                strip(own);
                let shown = format!("{message}\n{url}");
                (message, shown)
            }
            _ => {
                return Err(ErrorData::invalid_params(
                    "the Stipendex proxy forwards form and URL elicitations only",
                    None,
                ));
            }
        };
        if super::elicit::imitates_wallet(&shown)
            || name.is_some_and(super::elicit::names_the_wallet)
        {
            tracing::warn!(
                server = %printable(identity),
                "refused a dialog of the MCP server that reads like the wallet's payment confirmation; the user was not shown it"
            );
            return Err(ErrorData::invalid_request(
                "refused by the Stipendex proxy: a server's dialog may not read like the wallet's payment confirmation",
                None,
            ));
        }
        *message = format!("{} {message}", label(name, identity));
    }
    request.get_meta_mut().extend(meta);
    Ok(request)
}

/// Removes Stipendex's keys from a request's own `_meta`.
fn strip(meta: &mut Option<RequestMetaObject>) {
    if let Some(m) = meta {
        m.retain(|k, _| forwards_meta(k));
    }
}

impl Service<RoleClient> for UpstreamHandler {
    async fn handle_request(
        &self,
        request: ServerRequest,
        context: RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        let shared = self
            .shared
            .upgrade()
            .ok_or_else(|| ErrorData::internal_error("the host is not connected", None))?;
        let host = shared
            .host
            .get()
            .cloned()
            .ok_or_else(|| ErrorData::internal_error("the host is not connected", None))?;
        let name = context
            .peer
            .peer_info()
            .and_then(|i| i.server_info.as_ref().map(|s| s.name.clone()));
        let request = forwarded(request, context.meta, name.as_deref(), &shared.proxy.server)?;
        host.send_request(request).await.map_err(|e| match e {
            rmcp::service::ServiceError::McpError(e) => e,
            e => ErrorData::internal_error(format!("the host: {e}"), None),
        })
    }

    async fn handle_notification(
        &self,
        notification: ServerNotification,
        _context: NotificationContext<RoleClient>,
    ) -> Result<(), ErrorData> {
        let Some(shared) = self.shared.upgrade() else {
            return Ok(());
        };
        let Some(host) = shared.host.get().cloned() else {
            return Ok(());
        };
        let notification = match notification {
            ServerNotification::ProgressNotification(mut p) => {
                let token = p.params.progress_token.clone();
                let mapped = shared
                    .progress
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&token).cloned());
                let sent = match mapped {
                    Some(t) => {
                        p.params.progress_token = t;
                        host.send_notification(ServerNotification::ProgressNotification(p))
                            .await
                    }
                    // Progress of no call the host made (or one already answered).
                    None => Ok(()),
                };
                shared.inflight.end(&token);
                return sent.map_err(|e| ErrorData::internal_error(format!("the host: {e}"), None));
            }
            // The server cancelling a request it sent: its ids are not the host's.
            ServerNotification::CancelledNotification(_) => return Ok(()),
            other => other,
        };
        host.send_notification(notification)
            .await
            .map_err(|e| ErrorData::internal_error(format!("the host: {e}"), None))
    }

    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }
}
