//! Public announcements (CEP-6), as the SDK 0.11.14 publishes them
//! (`docs/research/contextvm-sdk-0.11.14.md` §1.6): the server's `initialize` result (kind
//! 11316, with its common tags — name, encryption support, `pmi` — and the `cap` pricing tags),
//! then its tools, resources, resource templates and prompts lists (kinds 11317–11320, with the
//! `cap` tags), each in the clear, signed by the server's key, in the replaceable range without
//! a `d` tag. The lists come from an MCP session the server opens with its own service, in
//! memory, as the SDK does with its internal `initialize`.

use futures::future::BoxFuture;
use nostr::{Event, EventBuilder, Keys, Kind, Tag};
use rmcp::service::{RoleClient, RoleServer, TxJsonRpcMessage};
use rmcp::{ServerHandler, ServiceExt as _};
use serde_json::{Value, json};

use crate::Error;

/// The server's announcement kind (its `initialize` result).
pub const SERVER: u16 = 11316;
/// The tools list.
pub const TOOLS: u16 = 11317;
/// The resources list.
pub const RESOURCES: u16 = 11318;
/// The resource templates list.
pub const RESOURCE_TEMPLATES: u16 = 11319;
/// The prompts list.
pub const PROMPTS: u16 = 11320;

/// What a service says about itself: its `initialize` result and the lists its capabilities
/// offer (as `{"tools": […]}` and so on).
#[derive(Clone, Debug, PartialEq)]
pub struct Announced {
    /// The `initialize` result.
    pub initialize: Value,
    /// The lists, by announcement kind.
    pub lists: Vec<(u16, Value)>,
}

/// Runs the announcement of one service made by a factory.
pub(crate) type Announcer = dyn Fn() -> BoxFuture<'static, Result<Announced, Error>> + Send + Sync;

fn mcp(e: impl std::fmt::Display) -> Error {
    Error::Refused(format!("the MCP service would not announce itself: {e}"))
}

/// Opens an in-memory MCP session with `handler` and reads what it announces.
pub(crate) async fn read<S: ServerHandler>(handler: S) -> Result<Announced, Error> {
    let (to_client, from_server) =
        futures::channel::mpsc::unbounded::<TxJsonRpcMessage<RoleServer>>();
    let (to_server, from_client) =
        futures::channel::mpsc::unbounded::<TxJsonRpcMessage<RoleClient>>();
    let server = tokio::spawn(async move {
        if let Ok(running) = handler.serve((to_client, from_client)).await {
            let _ = running.waiting().await;
        }
    });
    let out = async {
        let client = ().serve((to_server, from_server)).await.map_err(mcp)?;
        let info = client.peer_info().ok_or_else(|| mcp("no initialize result"))?;
        let initialize = serde_json::to_value(&*info).map_err(mcp)?;
        let caps = &info.capabilities;
        let mut lists = Vec::new();
        if caps.tools.is_some() {
            lists.push((TOOLS, json!({"tools": client.list_all_tools().await.map_err(mcp)?})));
        }
        if caps.resources.is_some() {
            lists.push((
                RESOURCES,
                json!({"resources": client.list_all_resources().await.map_err(mcp)?}),
            ));
            lists.push((
                RESOURCE_TEMPLATES,
                json!({"resourceTemplates": client.list_all_resource_templates().await.map_err(mcp)?}),
            ));
        }
        if caps.prompts.is_some() {
            lists.push((
                PROMPTS,
                json!({"prompts": client.list_all_prompts().await.map_err(mcp)?}),
            ));
        }
        let _ = client.cancel().await;
        Ok(Announced { initialize, lists })
    }
    .await;
    server.abort();
    out
}

/// The signed announcement events: kind 11316 with `common` and `cap` tags, the lists with
/// `cap` tags.
///
/// # Errors
/// [`Error::Nostr`] if an event cannot be signed.
pub fn events(
    keys: &Keys,
    announced: &Announced,
    common: &[Tag],
    cap: &[Tag],
) -> Result<Vec<Event>, Error> {
    let sign = |kind: u16, content: &Value, tags: Vec<Tag>| {
        EventBuilder::new(Kind::from(kind), content.to_string())
            .tags(tags)
            .sign_with_keys(keys)
            .map_err(|e| Error::Nostr(e.to_string()))
    };
    let mut out = vec![sign(
        SERVER,
        &announced.initialize,
        common.iter().chain(cap).cloned().collect(),
    )?];
    for (kind, list) in &announced.lists {
        out.push(sign(*kind, list, cap.to_vec())?);
    }
    Ok(out)
}
