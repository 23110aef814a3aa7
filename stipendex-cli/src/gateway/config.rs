//! The gateway's configuration: the registry's TOML (`[store]`, `[rails.*]`), `[receiver]`,
//! `[gateway]`, `[upstream]` and the pricing file's `[[price]]` entries — read and checked
//! at start, each refusal one sentence naming the field.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use serde::Deserialize;
use stipendex::receiver::PricedCapability;
use stipendex::receiver::price_file;

use crate::{CliError, files, msg};

pub(crate) use stipendex::gateway::{FINAL_AMOUNT, OnFailure, Resolve, Upstream};

/// The gateway, as configured.
#[derive(Debug)]
pub(crate) struct Config {
    /// The configuration file (the registry reads it again).
    pub(crate) path: PathBuf,
    pub(crate) listen: SocketAddr,
    /// Where operations (`/healthz`, `/readyz`, `/metrics`) are served: `[gateway] ops_listen`,
    /// never the public `listen`; `None` (unset) serves them nowhere.
    pub(crate) ops_listen: Option<SocketAddr>,
    pub(crate) receiver_id: String,
    pub(crate) receiver_key: stipendex::envelope::SecretKey,
    pub(crate) origins: Vec<String>,
    pub(crate) quote_ttl: Option<Duration>,
    /// The tab sessions offered, if any.
    pub(crate) tabs: Option<stipendex::receiver::TabTerms>,
    pub(crate) upstream: Upstream,
    pub(crate) secret: Option<(HeaderName, HeaderValue)>,
    pub(crate) final_amount: HeaderName,
    pub(crate) timeout: Duration,
    pub(crate) max_body: usize,
    pub(crate) claim_lease: Duration,
    pub(crate) trusted: Vec<stipendex::http::IpNet>,
    pub(crate) resolve: Option<Resolve>,
    pub(crate) prices: Vec<PricedCapability>,
    pub(crate) mcp_path: String,
    pub(crate) shutdown_grace: Duration,
    /// How request paths are matched against the priced patterns.
    pub(crate) path_matching: stipendex::receiver::PathMatching,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReceiverSection {
    id: String,
    key_file: Option<PathBuf>,
    key_env: Option<String>,
    #[serde(default)]
    origins: Vec<String>,
    quote_ttl_secs: Option<u64>,
    tabs: Option<TabsSection>,
}

/// `[receiver.tabs]`: tab sessions offered beside the Quotes (`docs/stipendex-profile.md` §4b).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TabsSection {
    /// The cap held per tab (a decimal in `asset`).
    cap: String,
    /// The asset code of the cap; the fixed prices in it are the ones a tab covers.
    asset: String,
    ttl_secs: Option<u64>,
    lanes: Option<u16>,
    margin_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GatewaySection {
    listen: Option<String>,
    ops_listen: Option<String>,
    #[serde(default)]
    trusted_proxies: Vec<String>,
    max_body_bytes: Option<usize>,
    upstream_timeout_secs: Option<u64>,
    claim_lease_secs: Option<u64>,
    resolve_url: Option<String>,
    resolve_timeout_ms: Option<u64>,
    resolve_failure: Option<OnFailure>,
    mcp_path: Option<String>,
    shutdown_grace_secs: Option<u64>,
    path_matching: Option<PathMatchingKey>,
}

/// `[gateway] path_matching`.
#[derive(Clone, Copy, Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum PathMatchingKey {
    Lenient,
    Strict,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpstreamSection {
    url: Option<String>,
    mcp_url: Option<String>,
    command: Option<Vec<String>>,
    secret_header: Option<String>,
    secret_env: Option<String>,
    final_amount_header: Option<String>,
}

#[derive(Debug, Deserialize)]
struct File {
    receiver: Option<toml::Table>,
    gateway: Option<toml::Table>,
    upstream: Option<toml::Table>,
}

/// Refuses a secret written into section `name` (`field` present) with the `_env` to use.
fn no_secret(name: &str, table: &toml::Table, fields: &[&str]) -> Result<(), CliError> {
    for f in fields {
        if table.contains_key(*f) {
            return Err(msg(format!(
                "[{name}] {f}: secrets are read from the environment only; write `{f}_env = \"VARIABLE\"` instead"
            )));
        }
    }
    Ok(())
}

/// The file's `[receiver]` alone, read from its text (where an error has a line and column).
#[derive(Deserialize)]
#[allow(dead_code)] // read for its error only
struct AtReceiver<T> {
    receiver: T,
}

/// The file's `[gateway]` alone, read from its text.
#[derive(Deserialize)]
#[allow(dead_code)] // read for its error only
struct AtGateway<T> {
    gateway: T,
}

/// The file's `[upstream]` alone, read from its text.
#[derive(Deserialize)]
#[allow(dead_code)] // read for its error only
struct AtUpstream<T> {
    upstream: T,
}

/// Section `name` (the table `t`, read from `text` of the file at `path`) as a `T`; an error
/// names the file, line and column of what is wrong, on one line.
fn section<T: serde::de::DeserializeOwned>(
    path: &Path,
    text: &str,
    name: &str,
    t: toml::Table,
) -> Result<T, CliError> {
    T::deserialize(toml::Value::Table(t)).map_err(|e| {
        // Read again from the text, the error carries its place in the file.
        let located = match name {
            "receiver" => toml::from_str::<AtReceiver<T>>(text).err(),
            "gateway" => toml::from_str::<AtGateway<T>>(text).err(),
            "upstream" => toml::from_str::<AtUpstream<T>>(text).err(),
            _ => None,
        };
        match located {
            Some(l) => msg(stipendex::registry::toml_error(path, text, &l)),
            None => msg(format!(
                "{}: [{name}]: {}",
                path.display(),
                e.message().split_whitespace().collect::<Vec<_>>().join(" ")
            )),
        }
    })
}

/// Why a path pattern can never match a request the gateway forwards (a request path with an
/// empty, `.` or `..` segment is refused before any price applies), if it cannot.
fn cannot_match(pattern: &str) -> Option<&'static str> {
    let segments: Vec<&str> = pattern.split('/').collect();
    let last = segments.len().saturating_sub(1);
    if pattern.contains(['?', '#']) {
        return Some("it holds a query or a fragment: a pattern matches the path only");
    }
    for (i, s) in segments.iter().enumerate() {
        if s.is_empty() && i != 0 && i != last {
            return Some("it has an empty segment (`//`), which no forwarded path has");
        }
        if *s == "." || *s == ".." {
            return Some("it has a `.` or `..` segment, which no forwarded path has");
        }
        if i != last && (s.starts_with("{*") || s.contains('*')) {
            return Some("`*` and `{*rest}` may only end a pattern");
        }
        if s.matches('{').count() != s.matches('}').count() || *s == "{}" {
            return Some("a `{` without its `}` (or an empty `{}`)");
        }
    }
    None
}

/// Whether a listener at `ops` would take connections meant for the one at `listen` (or fail
/// to bind beside it): the same port (not `0`, a free one each) on the same address, or on
/// every address of either.
fn shares_listener(ops: SocketAddr, listen: SocketAddr) -> bool {
    ops.port() != 0
        && ops.port() == listen.port()
        && (ops.ip() == listen.ip() || ops.ip().is_unspecified() || listen.ip().is_unspecified())
}

impl Config {
    /// Reads and checks the configuration at `path`; `listen` overrides `[gateway] listen`.
    pub(crate) fn read(path: &Path, listen: Option<SocketAddr>) -> Result<Config, CliError> {
        let text = files::read(path)?;
        let file: File = toml::from_str(&text)
            .map_err(|e| msg(stipendex::registry::toml_error(path, &text, &e)))?;
        let r = file.receiver.ok_or_else(|| {
            msg(format!(
                "{} has no [receiver] section: add one with the receiver's id, key_env and origins",
                path.display()
            ))
        })?;
        no_secret("receiver", &r, &["key", "secret_key"])?;
        let r: ReceiverSection = section(path, &text, "receiver", r)?;
        let g: GatewaySection = match file.gateway {
            Some(g) => section(path, &text, "gateway", g)?,
            None => GatewaySection::default(),
        };
        let u = file.upstream.ok_or_else(|| {
            msg(format!(
                "{} has no [upstream] section: name the API (url = \"http://127.0.0.1:8080\") or the MCP server (mcp_url, or command = [...])",
                path.display()
            ))
        })?;
        no_secret("upstream", &u, &["secret", "token", "password"])?;
        let u: UpstreamSection = section(path, &text, "upstream", u)?;

        let dir = path.parent().unwrap_or(Path::new("."));
        let receiver_key =
            files::key_of("receiver", dir, r.key_file.as_deref(), r.key_env.as_deref())?;
        if r.origins.is_empty() {
            return Err(msg(
                "[receiver] origins is empty: name the public origins clients reach the gateway at (origins = [\"https://api.example\"]); Quotes are bound to them",
            ));
        }
        let mut origins = Vec::new();
        for o in &r.origins {
            origins.push(stipendex::origin::parse(o).map_err(|e| {
                msg(format!(
                    "[receiver] origins: {o:?} is not an origin ({e}): write scheme://host[:port]"
                ))
            })?);
        }

        let upstream = match (&u.url, &u.mcp_url, &u.command) {
            (Some(url), None, None) => {
                let parsed = url::Url::parse(url)
                    .ok()
                    .filter(|p| matches!(p.scheme(), "http" | "https") && p.host().is_some())
                    .ok_or_else(|| {
                        msg(format!(
                            "[upstream] url = {url:?} is not an http(s) URL: write the API's base, such as \"http://127.0.0.1:8080\""
                        ))
                    })?;
                if parsed.query().is_some() || parsed.fragment().is_some() {
                    return Err(msg(
                        "[upstream] url has a query or a fragment: give the API's base URL only",
                    ));
                }
                Upstream::Http(parsed)
            }
            (None, Some(url), None) => {
                stipendex::origin::of_url(url).map_err(|e| {
                    msg(format!(
                        "[upstream] mcp_url = {url:?} is not an http(s) URL ({e})"
                    ))
                })?;
                Upstream::McpUrl(url.clone())
            }
            (None, None, Some(cmd)) if !cmd.is_empty() => Upstream::McpCommand(cmd.clone()),
            (None, None, Some(_)) => {
                return Err(msg(
                    "[upstream] command is empty: give the MCP server's program and its arguments",
                ));
            }
            (None, None, None) => {
                return Err(msg(
                    "[upstream] names no upstream: give url (an HTTP API), mcp_url (an MCP server over Streamable HTTP) or command (an MCP server over stdio)",
                ));
            }
            _ => {
                return Err(msg(
                    "[upstream] names more than one upstream: give exactly one of url, mcp_url and command",
                ));
            }
        };

        let secret = match (&u.secret_header, &u.secret_env) {
            (None, None) => None,
            (Some(h), Some(var)) => {
                let name = HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                    msg(format!(
                        "[upstream] secret_header = {h:?} is not a header name"
                    ))
                })?;
                let v = std::env::var(var).ok().filter(|v| !v.trim().is_empty()).ok_or_else(|| {
                    msg(format!(
                        "[upstream] secret_env names {var}, which is not set: export the shared secret there"
                    ))
                })?;
                let mut value = HeaderValue::from_str(v.trim()).map_err(|_| {
                    msg(format!(
                        "{var} is not a valid header value: use visible ASCII"
                    ))
                })?;
                value.set_sensitive(true);
                Some((name, value))
            }
            _ => {
                return Err(msg(
                    "[upstream] a shared secret needs both secret_header (its name) and secret_env (the variable holding it)",
                ));
            }
        };
        let final_amount = match &u.final_amount_header {
            None => HeaderName::from_static(FINAL_AMOUNT),
            Some(h) => HeaderName::from_bytes(h.as_bytes()).map_err(|_| {
                msg(format!(
                    "[upstream] final_amount_header = {h:?} is not a header name"
                ))
            })?,
        };

        let listen = match (listen, &g.listen) {
            (Some(l), _) => l,
            (None, Some(l)) => l.parse().map_err(|_| {
                msg(format!(
                    "[gateway] listen = {l:?} is not an address: write host:port, such as \"127.0.0.1:8402\""
                ))
            })?,
            (None, None) => SocketAddr::from(([127, 0, 0, 1], 8402)),
        };
        let ops_listen = match &g.ops_listen {
            None => None,
            Some(o) => Some(o.parse::<SocketAddr>().map_err(|_| {
                msg(format!(
                    "[gateway] ops_listen = {o:?} is not an address: write host:port, such as \"127.0.0.1:9402\""
                ))
            })?),
        };
        if let Some(ops) = ops_listen
            && shares_listener(ops, listen)
        {
            return Err(msg(format!(
                "[gateway] ops_listen = \"{ops}\" is the public listen address ({listen}): give operations their own port, such as \"127.0.0.1:{}\"",
                if listen.port() == 9402 { 9403 } else { 9402 }
            )));
        }
        let trusted = g
            .trusted_proxies
            .iter()
            .map(|t| {
                t.parse::<stipendex::http::IpNet>().map_err(|_| {
                    msg(format!(
                        "[gateway] trusted_proxies: {t:?} is not an IP address or a network such as \"10.0.0.0/8\""
                    ))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let resolve = match &g.resolve_url {
            None => None,
            Some(u) => {
                let url = url::Url::parse(u)
                    .ok()
                    .filter(|p| matches!(p.scheme(), "http" | "https"))
                    .ok_or_else(|| {
                        msg(format!(
                            "[gateway] resolve_url = {u:?} is not an http(s) URL"
                        ))
                    })?;
                Some(Resolve {
                    url,
                    timeout: Duration::from_millis(g.resolve_timeout_ms.unwrap_or(2000).max(1)),
                    on_failure: g.resolve_failure.unwrap_or(OnFailure::Reject),
                })
            }
        };
        let mcp_path = g.mcp_path.unwrap_or_else(|| "/mcp".into());
        if !mcp_path.starts_with('/') {
            return Err(msg(format!(
                "[gateway] mcp_path = {mcp_path:?} is not a path: it starts with /"
            )));
        }

        let prices = price_file::from_toml(&text)?;
        if prices.is_empty() {
            return Err(msg(format!(
                "{} prices nothing: add [[price]] entries (kind, pattern, amount, asset)",
                path.display()
            )));
        }
        for (i, p) in prices.iter().enumerate() {
            let route = !matches!(p.method(), "tools/call" | "resources/read" | "prompts/get");
            let at = format!("[[price]] entry {} ({})", i + 1, p.name());
            if route && upstream.is_mcp() {
                return Err(msg(format!(
                    "{at}: a route can never match: the upstream is an MCP server; price its tools, resources and prompts"
                )));
            }
            if !route && !upstream.is_mcp() {
                return Err(msg(format!(
                    "{at}: an MCP price can never match: the upstream is an HTTP API; price its routes (kind = \"route\")"
                )));
            }
            if route && let Some(why) = cannot_match(p.name()) {
                return Err(msg(format!("{at}: the pattern can never match: {why}")));
            }
        }

        let tabs = match &r.tabs {
            None => None,
            Some(t) => {
                let asset = stipendex::Asset::by_code(&t.asset).ok_or_else(|| {
                    msg(format!(
                        "[receiver.tabs] asset = {:?} is not an asset this build knows (USD, USDC, ALGO, BTC…)",
                        t.asset
                    ))
                })?;
                let cap = stipendex::Money::parse(asset, &t.cap).map_err(|e| {
                    msg(format!(
                        "[receiver.tabs] cap = {:?} is not an amount in {}: {e}",
                        t.cap, t.asset
                    ))
                })?;
                let mut terms = stipendex::receiver::TabTerms::new(cap);
                if let Some(s) = t.ttl_secs {
                    terms = terms.ttl(Duration::from_secs(s));
                }
                if let Some(l) = t.lanes {
                    terms = terms.lanes(l);
                }
                if let Some(m) = t.margin_secs {
                    terms = terms.margin(Duration::from_secs(m));
                }
                Some(terms)
            }
        };

        Ok(Config {
            path: path.to_path_buf(),
            listen,
            ops_listen,
            receiver_id: r.id,
            receiver_key,
            origins,
            quote_ttl: r.quote_ttl_secs.map(Duration::from_secs),
            tabs,
            upstream,
            secret,
            final_amount,
            timeout: Duration::from_secs(g.upstream_timeout_secs.unwrap_or(30).max(1)),
            max_body: g.max_body_bytes.unwrap_or(10 * 1024 * 1024),
            claim_lease: Duration::from_secs(g.claim_lease_secs.unwrap_or(60).max(1)),
            trusted,
            resolve,
            prices,
            mcp_path,
            shutdown_grace: Duration::from_secs(g.shutdown_grace_secs.unwrap_or(30)),
            path_matching: match g.path_matching {
                None | Some(PathMatchingKey::Lenient) => stipendex::receiver::PathMatching::Lenient,
                Some(PathMatchingKey::Strict) => stipendex::receiver::PathMatching::Strict,
            },
        })
    }

    /// How the gateway forwards, as the facade takes it.
    pub(crate) fn settings(&self) -> stipendex::gateway::Settings {
        let mut s = stipendex::gateway::Settings::new(self.upstream.clone());
        s.secret.clone_from(&self.secret);
        s.final_amount = self.final_amount.clone();
        s.timeout = self.timeout;
        s.max_body = self.max_body;
        s.trusted.clone_from(&self.trusted);
        s.mcp_path.clone_from(&self.mcp_path);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_never_share_the_public_listener() {
        let at = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(shares_listener(at("127.0.0.1:8402"), at("127.0.0.1:8402")));
        assert!(shares_listener(at("0.0.0.0:8402"), at("127.0.0.1:8402")));
        assert!(shares_listener(at("127.0.0.1:8402"), at("0.0.0.0:8402")));
        assert!(shares_listener(at("[::]:8402"), at("10.0.0.1:8402")));
        assert!(!shares_listener(at("127.0.0.1:9402"), at("0.0.0.0:8402")));
        assert!(!shares_listener(at("127.0.0.1:8402"), at("10.0.0.1:8402")));
        assert!(!shares_listener(at("127.0.0.1:0"), at("127.0.0.1:0")));
    }

    #[test]
    fn patterns_that_cannot_match_are_named() {
        assert!(cannot_match("/api/posts/{id}").is_none());
        assert!(cannot_match("/files/{*path}").is_none());
        assert!(cannot_match("/api/*").is_none());
        assert!(cannot_match("/api//x").is_some());
        assert!(cannot_match("/api/../x").is_some());
        assert!(cannot_match("/api/*/x").is_some());
        assert!(cannot_match("/api/{*rest}/x").is_some());
        assert!(cannot_match("/api?x=1").is_some());
        assert!(cannot_match("/api/{id").is_some());
    }
}
