//! `stipendex proxy`: MCP proxy mode for a host that knows nothing of payments.
//!
//! ```text
//! stipendex proxy --config wallet.toml [--server https://search.example] -- <server command…>
//! stipendex proxy --config wallet.toml --url https://search.example/mcp
//! ```
//!
//! The host starts this command as its MCP server (stdio). The proxy connects to the real
//! server — a command it starts, or a Streamable HTTP URL — forwards everything both ways and
//! pays what the server asks for (a Stipendex Quote, an x402 challenge) under the wallet's
//! mandate. Confirmations go to the host's user by MCP elicitation.
//!
//! The configuration is `stipendex fetch`'s (the registry's TOML and `[wallet]`), and
//! optionally an `[upstream]` with the defaults of the command line:
//!
//! ```toml
//! [upstream]
//! server = "https://search.example"     # the identity of a stdio server (its Quotes name it)
//! command = ["stipendex", "serve-mcp", "--config", "shop.toml"]   # or url = "https://…/mcp"
//! ```
//!
//! The mandate pins the receiver at that identity (`--origin ID=https://search.example`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Deserialize;
use stipendex::mcp::proxy::{Proxy, Upstream};

use crate::{CliError, files, msg};

/// `stipendex proxy`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The wallet's configuration (registry TOML with `[wallet]`, optionally `[upstream]`).
    #[arg(long, default_value = "wallet.toml")]
    config: PathBuf,
    /// The real server's Streamable HTTP URL (instead of a command).
    #[arg(long)]
    url: Option<String>,
    /// The identity the host knows the server by (an origin, `https://host[:port]`): what its
    /// Quotes must name and the mandate pins. Defaults to the URL's origin.
    #[arg(long)]
    server: Option<String>,
    /// The real server's command and arguments, after `--`.
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamSection {
    server: Option<String>,
    url: Option<String>,
    command: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
struct File {
    upstream: Option<UpstreamSection>,
}

fn upstream_of(a: &Args, path: &Path) -> Result<(Upstream, Option<String>), CliError> {
    let text = files::read(path)?;
    let file: File =
        toml::from_str(&text).map_err(|e| msg(stipendex::registry::toml_error(path, &text, &e)))?;
    let section = file.upstream.unwrap_or_default();
    let server = a.server.clone().or(section.server);
    let command = if a.command.is_empty() {
        section.command.unwrap_or_default()
    } else {
        a.command.clone()
    };
    let url = a.url.clone().or(section.url);
    let upstream = match (url, command.split_first()) {
        (Some(_), Some(_)) => {
            return Err(msg(
                "give the real server either as --url or as a command after --, not both",
            ));
        }
        (Some(url), None) => Upstream::Url(url),
        (None, Some((program, args))) => Upstream::Command {
            program: program.clone(),
            args: args.to_vec(),
        },
        (None, None) => {
            return Err(msg(
                "name the real MCP server: `stipendex proxy --config FILE -- <command…>` or `--url URL`",
            ));
        }
    };
    Ok((upstream, server))
}

/// Runs `stipendex proxy` over stdio until the host goes away.
pub(crate) async fn run(a: Args) -> Result<ExitCode, CliError> {
    let (upstream, server) = upstream_of(&a, &a.config)?;
    let loaded = crate::wallet_config::load(&a.config).await?;
    if loaded.journal.is_none() {
        tracing::warn!("[wallet] journal = false: the proxy's payments keep no audit trail");
    }
    let wallet = loaded.wallet;
    let proxy = Proxy::new(wallet, upstream, server.as_deref())?;
    proxy.serve(rmcp::transport::stdio()).await?;
    Ok(ExitCode::SUCCESS)
}
