//! The configuration reference, `docs/configuration.md`, checked against the code so that it
//! cannot drift from it (issue 46) — and the examples of `docs/going-live.md` with it.
//!
//! - Every ```` ```toml ```` block of both files says on its first line what file it is
//!   (`# registry`, `# wallet.toml`, `# gateway.toml`, `# serve-mcp`, `# prices`) and is read by
//!   the real parser of that file, through the same entry points the commands use:
//!   [`stipendex::Registry::from_toml`] for `[store]` and each `[rails.*]`,
//!   [`crate::wallet_config::load`] for a wallet, [`crate::gateway::config::Config::read`] for
//!   a gateway, [`crate::serve_mcp::receiver`] for `serve-mcp`, `stipendex proxy`'s own reading
//!   of `[upstream]`, [`stipendex::receiver::price_file::from_toml`] for prices. What needs a
//!   secret or the network is stood in for (see [`check_rail`], [`check_wallet`]).
//! - Every key a section accepts is in that section's table of the reference, and the tables
//!   name no other key. The keys a section accepts are not listed here by hand: they are read
//!   from serde's refusal of an unknown field (`deny_unknown_fields`), by giving the section
//!   the key `__probe` through the same entry points — "unknown field `__probe`, expected one
//!   of `a`, `b`, …". The facilitator's flags are read from its clap definition.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{CommandFactory, Parser};
use stipendex::envelope::{Mandate, Party, PublicKey, SecretKey, Signed};
use stipendex::{Env, Registry};
use toml::{Table, Value};

use crate::{Cli, CliError};

/// The key every section is given to make it list the keys it accepts.
const PROBE: &str = "__probe";

/// The environment variable the test leaves unset on purpose (a registry then stops at it).
const UNSET: &str = "STIPENDEX_DOCS_UNSET";

/// How long a configuration may take to be read: it never reaches the network here.
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The documents.

/// One Markdown file of `docs/`.
struct Doc {
    name: &'static str,
    text: String,
}

impl Doc {
    fn read(name: &'static str) -> Doc {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs")
            .join(name);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        Doc { name, text }
    }

    /// Its lines, each with whether it is inside a fenced code block (fences included).
    fn lines(&self) -> Vec<(&str, bool)> {
        let mut fenced = false;
        self.text
            .lines()
            .map(|l| {
                let fence = l.trim_start().starts_with("```");
                let inside = fenced || fence;
                if fence {
                    fenced = !fenced;
                }
                (l, inside)
            })
            .collect()
    }

    /// The lines of the section under the heading `heading` (exactly that line), up to the
    /// next heading of the same or a higher level.
    fn section(&self, heading: &str) -> Result<Vec<&str>, String> {
        let lines = self.lines();
        let level = |l: &str| l.chars().take_while(|c| *c == '#').count();
        let start = lines
            .iter()
            .position(|(l, fenced)| !fenced && l.trim_end() == heading)
            .ok_or_else(|| format!("{}: no heading `{heading}`", self.name))?;
        let own = level(heading);
        let body = lines
            .iter()
            .skip(start + 1)
            .take_while(|(l, fenced)| *fenced || !(l.starts_with('#') && level(l) <= own))
            .map(|(l, _)| *l)
            .collect();
        Ok(body)
    }

    /// The ```` ```toml ```` blocks: (line of the fence, the text inside).
    fn toml_blocks(&self) -> Vec<(usize, String)> {
        let mut blocks = Vec::new();
        let mut open: Option<(usize, String)> = None;
        for (i, l) in self.text.lines().enumerate() {
            match &mut open {
                None if l.trim() == "```toml" => open = Some((i + 1, String::new())),
                None => {}
                Some(_) if l.trim() == "```" => blocks.extend(open.take()),
                Some((_, body)) => {
                    body.push_str(l);
                    body.push('\n');
                }
            }
        }
        blocks
    }
}

/// The keys the tables of a section document: the first cell of each row, "| `key` | …".
fn documented(section: &[&str]) -> BTreeSet<String> {
    section
        .iter()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(key, _)| key.to_owned())
        .collect()
}

/// Every `` `…` `` span of `text`.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

// ---------------------------------------------------------------------------------------------
// The keys the code accepts, from serde's refusal of the probe.

/// The fields listed by serde's refusal of the probe key in `message` ("unknown field
/// `__probe`, expected one of `a`, `b`" / "expected `a` or `b`" / "expected `a`" / "there are
/// no fields"), if the message is that refusal.
fn listed(message: &str) -> Option<BTreeSet<String>> {
    let at = message.find(&format!("unknown field `{PROBE}`, "))?;
    let rest = message.get(at..)?.split_once(", ")?.1;
    let rest = rest.lines().next().unwrap_or_default();
    if rest.starts_with("there are no fields") {
        return Some(BTreeSet::new());
    }
    let expected = rest.strip_prefix("expected ")?;
    Some(quoted(expected).into_iter().map(str::to_owned).collect())
}

/// The fields of a refusal that must be the probe's.
fn probed(what: &str, result: Result<(), String>) -> Result<BTreeSet<String>, String> {
    match result {
        Err(e) => listed(&e).ok_or_else(|| {
            format!("{what}: the probe was refused for another reason than itself: {e}")
        }),
        Ok(()) => Err(format!(
            "{what}: the key `{PROBE}` was accepted: the section no longer refuses unknown keys"
        )),
    }
}

/// A temporary folder for the files one check writes.
fn folder() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("cannot make a temporary folder: {e}"))
}

/// Writes `text` as `name` in `dir` and returns its path.
fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    path
}

/// `fut`, unless it takes longer than [`PATIENCE`] (it would be waiting on the network).
async fn patiently<T>(what: &str, fut: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(PATIENCE, fut).await.map_err(|_| {
        format!("{what}: not read within {PATIENCE:?}: it waits on the network or a database")
    })
}

/// The registry of `text` (environment: every variable set but those in `unset`), as a
/// result of its refusal.
async fn registry(text: &str, env: &DocEnv) -> Result<Result<Registry, stipendex::Error>, String> {
    patiently("the registry", Box::pin(Registry::from_toml(text, env))).await
}

/// The keys the registry accepts in the section `text` ends with (the probe's).
async fn registry_keys(what: &str, text: &str) -> Result<BTreeSet<String>, String> {
    let got = registry(text, &DocEnv::default()).await?;
    probed(what, got.map(drop).map_err(|e| e.to_string()))
}

/// The keys `[wallet]` accepts (read by the wallet's `load`).
async fn wallet_keys() -> Result<BTreeSet<String>, String> {
    let dir = folder();
    let path = write(
        dir.path(),
        "wallet.toml",
        &format!("[wallet]\n{PROBE} = 0\n"),
    );
    let got = patiently("[wallet]", Box::pin(crate::wallet_config::load(&path))).await?;
    probed("[wallet]", got.map(drop).map_err(|e| e.to_string()))
}

/// The keys `stipendex proxy`'s `[upstream]` accepts.
async fn proxy_keys() -> Result<BTreeSet<String>, String> {
    let dir = folder();
    let path = write(
        dir.path(),
        "wallet.toml",
        &format!("[upstream]\n{PROBE} = 0\n"),
    );
    probed("proxy [upstream]", proxy_upstream(&path).await)
}

/// `stipendex proxy --config PATH --url … -- …` as far as it reads its file's `[upstream]`:
/// given both a URL and a command, it refuses them together right after reading the file,
/// before it opens the wallet or serves.
async fn proxy_upstream(path: &Path) -> Result<(), String> {
    let config = path.display().to_string();
    let args = [
        "stipendex",
        "proxy",
        "--config",
        &config,
        "--url",
        "http://127.0.0.1:9/mcp",
        "--",
        "true",
    ];
    let cli = Cli::try_parse_from(args).map_err(|e| format!("stipendex proxy: {e}"))?;
    match patiently("stipendex proxy", Box::pin(crate::run(cli))).await? {
        Err(e) if e.to_string().contains("not both") => Ok(()),
        Err(e) => Err(e.to_string()),
        Ok(_) => Err("stipendex proxy ran: it should have refused both a URL and a command".into()),
    }
}

/// The keys one section of the gateway's file accepts: `text` is the file up to the probed
/// section, whose last line is the probe.
fn gateway_keys(what: &str, text: &str) -> Result<BTreeSet<String>, String> {
    let dir = folder();
    let path = write(dir.path(), "gateway.toml", text);
    let got = crate::gateway::config::Config::read(&path, None);
    probed(what, got.map(drop).map_err(|e| e.to_string()))
}

/// The keys `serve-mcp`'s `[receiver]` accepts.
async fn serve_mcp_keys() -> Result<BTreeSet<String>, String> {
    let dir = folder();
    let path = write(
        dir.path(),
        "shop.toml",
        &format!("[receiver]\n{PROBE} = 0\n"),
    );
    let got = patiently(
        "serve-mcp",
        Box::pin(crate::serve_mcp::receiver(&path, None)),
    )
    .await?;
    probed(
        "serve-mcp [receiver]",
        got.map(drop).map_err(|e| e.to_string()),
    )
}

/// The keys a `[[price]]` entry accepts.
fn price_keys() -> Result<BTreeSet<String>, String> {
    let got = stipendex::receiver::price_file::from_toml(&format!("[[price]]\n{PROBE} = 0\n"));
    probed("[[price]]", got.map(drop).map_err(|e| e.to_string()))
}

/// The keys a `[rails.*]` section of `kind` accepts, `kind` included.
async fn rail_keys(kind: &str) -> Result<BTreeSet<String>, String> {
    let text = format!("[rails.probe]\nkind = \"{kind}\"\n{PROBE} = 0\n");
    let mut keys = registry_keys(&format!("rails of kind {kind}"), &text).await?;
    keys.insert("kind".into());
    Ok(keys)
}

/// Each section of the reference with the keys the code accepts in it.
async fn accepted() -> Result<Vec<(&'static str, String, BTreeSet<String>)>, String> {
    const MD: &str = "configuration.md";
    let receiver = "[receiver]\nid = \"probe\"\n";
    let mut out = vec![
        (MD, "### `[wallet]`".to_owned(), wallet_keys().await?),
        (
            MD,
            "### `[upstream]` (`stipendex proxy` only)".to_owned(),
            proxy_keys().await?,
        ),
        (
            MD,
            "### `[store]`".to_owned(),
            registry_keys("[store]", &format!("[store]\n{PROBE} = 0\n")).await?,
        ),
        (
            MD,
            "### `[receiver]`".to_owned(),
            gateway_keys("gateway [receiver]", &format!("[receiver]\n{PROBE} = 0\n"))?,
        ),
        (
            MD,
            "### `[receiver.tabs]`".to_owned(),
            gateway_keys(
                "gateway [receiver.tabs]",
                &format!("{receiver}[receiver.tabs]\n{PROBE} = 0\n"),
            )?,
        ),
        (
            MD,
            "### `[gateway]`".to_owned(),
            gateway_keys("[gateway]", &format!("{receiver}[gateway]\n{PROBE} = 0\n"))?,
        ),
        (
            MD,
            "### `[upstream]`".to_owned(),
            gateway_keys(
                "gateway [upstream]",
                &format!("{receiver}[upstream]\n{PROBE} = 0\n"),
            )?,
        ),
        (MD, "## Prices (`[[price]]`)".to_owned(), price_keys()?),
        (
            MD,
            "## Example MCP server (`serve-mcp`)".to_owned(),
            serve_mcp_keys().await?,
        ),
    ];
    for (kind, _) in stipendex::registry::KINDS {
        let doc = Doc::read(MD);
        let heading = doc
            .lines()
            .iter()
            .find(|(l, fenced)| !fenced && l.starts_with(&format!("### `{kind}`")))
            .map(|(l, _)| l.trim_end().to_owned())
            .ok_or_else(|| {
                format!("{MD}: no heading \"### `{kind}`…\" for the rail kind {kind}")
            })?;
        out.push((MD, heading, rail_keys(kind).await?));
    }
    Ok(out)
}

/// The top-level tables the registry's file accepts.
async fn top_level_tables() -> Result<BTreeSet<String>, String> {
    registry_keys("the registry's file", &format!("{PROBE} = 0\n")).await
}

// ---------------------------------------------------------------------------------------------
// Reading the examples.

/// The environment the registry reads secrets from here: every variable is set (to 64 hex
/// digits, a key every rail takes) but those in `unset`.
#[derive(Default)]
struct DocEnv {
    unset: BTreeSet<String>,
}

impl Env for DocEnv {
    fn var(&self, name: &str) -> Option<String> {
        (!self.unset.contains(name)).then(|| "11".repeat(32))
    }
}

/// What file a block is, by the marker on its first line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Registry,
    Wallet,
    Gateway,
    ServeMcp,
    Prices,
}

impl Kind {
    /// The markers, as written on a block's first line.
    const MARKERS: &[(&str, Kind)] = &[
        ("# registry", Kind::Registry),
        ("# wallet.toml", Kind::Wallet),
        ("# gateway.toml", Kind::Gateway),
        ("# serve-mcp", Kind::ServeMcp),
        ("# prices", Kind::Prices),
    ];

    fn of(block: &str) -> Option<Kind> {
        let first = block.lines().next()?.trim_end();
        Kind::MARKERS
            .iter()
            .find(|(m, _)| first == *m || first.starts_with(&format!("{m} ")))
            .map(|(_, k)| *k)
    }

    /// The top-level tables such a file may hold.
    fn tables(self) -> &'static [&'static str] {
        match self {
            Kind::Registry => &["store", "rails"],
            Kind::Wallet => &["store", "rails", "wallet", "upstream"],
            Kind::Gateway => &["store", "rails", "receiver", "gateway", "upstream", "price"],
            Kind::ServeMcp => &["store", "rails", "receiver", "price"],
            Kind::Prices => &["price"],
        }
    }
}

/// Checks one block: parsed by the real parser of the file its marker names.
async fn check_block(block: &str) -> Result<(), String> {
    let kind = Kind::of(block).ok_or_else(|| {
        let markers: Vec<&str> = Kind::MARKERS.iter().map(|(m, _)| *m).collect();
        format!(
            "no marker on its first line: start it with one of {}",
            markers.join(", ")
        )
    })?;
    let table: Table = toml::from_str(block).map_err(|e| format!("not TOML: {}", e.message()))?;
    if let Some(other) = table.keys().find(|k| !kind.tables().contains(&k.as_str())) {
        return Err(format!(
            "marked {kind:?}, which has no `{other}` table: mark it as the file it is"
        ));
    }
    if kind != Kind::Prices {
        check_registry(&table).await?;
    }
    match kind {
        Kind::Registry => Ok(()),
        Kind::Wallet => {
            check_wallet(&table).await?;
            if table.contains_key("upstream") {
                let dir = folder();
                proxy_upstream(&write(dir.path(), "wallet.toml", block)).await?;
            }
            Ok(())
        }
        Kind::Gateway => check_gateway(&table),
        Kind::ServeMcp => check_serve_mcp(&table).await,
        Kind::Prices => {
            let prices =
                stipendex::receiver::price_file::from_toml(block).map_err(|e| e.to_string())?;
            if prices.is_empty() {
                return Err("prices nothing".into());
            }
            Ok(())
        }
    }
}

/// A string at `key` of `t`.
fn string<'a>(t: &'a Table, key: &str) -> Option<&'a str> {
    t.get(key).and_then(Value::as_str)
}

/// A table at `key` of `t`.
fn table_mut<'a>(t: &'a mut Table, key: &str) -> Option<&'a mut Table> {
    t.get_mut(key).and_then(Value::as_table_mut)
}

/// `url` with a `sqlite://` path moved into `dir` (where a relative one is read anyway when
/// the file is there); any other URL as it is.
fn relocated(url: &str, dir: &Path) -> String {
    match url.strip_prefix("sqlite://") {
        Some(path) if !path.is_empty() => {
            let inside = dir.join(path.trim_start_matches('/'));
            if let Some(parent) = inside.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            format!("sqlite://{}", inside.display())
        }
        _ => url.to_owned(),
    }
}

/// Whether `url` is a PostgreSQL URL (opening it would reach a server).
fn postgres(url: &str) -> bool {
    url.starts_with("postgres://") || url.starts_with("postgresql://")
}

/// The registry's part of a file (`[store]`, `[rails.*]`, and the file's shape), read by
/// [`Registry::from_toml`]: the file with every other section, then `[store]` alone, then each
/// rail alone.
async fn check_registry(file: &Table) -> Result<(), String> {
    let dir = folder();
    // The file's shape: the top-level tables the registry accepts (it reads two of them).
    let mut rest = file.clone();
    rest.remove("store");
    rest.remove("rails");
    registry(&emit(&rest), &DocEnv::default())
        .await?
        .map_err(|e| format!("the file: {e}"))?;
    // `[store]`, opened when it is local; a PostgreSQL URL is read by the store's URL parser.
    if let Some(store) = file.get("store") {
        let mut store = store.clone();
        let mut env = DocEnv::default();
        if let Some(s) = store.as_table_mut() {
            if let Some(var) = string(s, "url_env") {
                env.unset.insert(var.to_owned());
            }
            if let Some(url) = string(s, "url").map(str::to_owned) {
                if postgres(&url) {
                    rail_core::keys::StoreUrl::parse(&url)
                        .ok_or_else(|| format!("[store] url: {url:?} is not a store URL"))?;
                    s.insert("url".into(), "memory".into());
                } else {
                    s.insert("url".into(), relocated(&url, dir.path()).into());
                }
            }
        }
        let only = Table::from_iter([("store".to_owned(), store)]);
        match registry(&emit(&only), &env).await? {
            Ok(_) | Err(stipendex::Error::MissingEnv { .. }) => {}
            Err(e) => return Err(format!("[store]: {e}")),
        }
    }
    let rails = match file.get("rails") {
        None => return Ok(()),
        Some(Value::Table(rails)) => rails,
        Some(_) => return Err("`rails` is not a table of [rails.NAME] sections".into()),
    };
    for (name, rail) in rails {
        check_rail(name, rail, file.contains_key("store"), dir.path()).await?;
    }
    Ok(())
}

/// One `[rails.NAME]`, built by the registry as far as it goes without the network: every
/// `*_env` variable is set to 64 hex digits (but a URL's), a `[store]` is in memory, a
/// `sqlite://` ledger is in a temporary folder. Where a kind would reach the network at start
/// it is stopped just before: `exact-avm` asks algod for its genesis first (its
/// `algod_token_env` is left unset, so it stops after reading its section); `exact-algo`
/// reaches algod when its sides open on the store (it is built without `[store]`, so it
/// stops at the first side that needs one, after reading the section, its amounts and its
/// networks); `ln-nwc` connects to its wallet's relay with the URI its variable holds (64 hex
/// digits are no such URI: it stops there, after its network and amounts).
async fn check_rail(name: &str, rail: &Value, has_store: bool, dir: &Path) -> Result<(), String> {
    let at = format!("[rails.{name}]");
    let Some(table) = rail.as_table() else {
        return Err(format!("{at} is not a table"));
    };
    let kind = string(table, "kind").unwrap_or_default();
    let mut table = table.clone();
    let mut env = DocEnv::default();
    if let Some(var) = string(&table, "url_env") {
        env.unset.insert(var.to_owned());
    }
    let mut store = has_store;
    match kind {
        "ledger" => match string(&table, "url").map(str::to_owned) {
            Some(url) if postgres(&url) && !table.contains_key("url_env") => {
                rail_core::keys::StoreUrl::parse(&url)
                    .ok_or_else(|| format!("{at} url: {url:?} is not a ledger URL"))?;
                table.remove("url");
                table.insert("url_env".into(), UNSET.into());
                env.unset.insert(UNSET.into());
            }
            Some(url) => {
                table.insert("url".into(), relocated(&url, dir).into());
            }
            None => {}
        },
        "exact-avm" => match table.get("algod_token_env") {
            Some(Value::String(var)) => {
                env.unset.insert(var.clone());
            }
            Some(_) => {}
            None => {
                table.insert("algod_token_env".into(), UNSET.into());
                env.unset.insert(UNSET.into());
            }
        },
        "exact-algo" => store = false,
        _ => {}
    }
    let mut file = Table::new();
    if store {
        let memory = Table::from_iter([("url".to_owned(), Value::from("memory"))]);
        file.insert("store".into(), memory.into());
    }
    let rails = Table::from_iter([(name.to_owned(), Value::Table(table))]);
    file.insert("rails".into(), rails.into());
    match registry(&emit(&file), &env).await? {
        Ok(_) | Err(stipendex::Error::MissingEnv { .. } | stipendex::Error::BadSecret { .. }) => {
            Ok(())
        }
        Err(stipendex::Error::Config(m))
            if kind == "exact-algo" && has_store && m.contains("keeps single-use records") =>
        {
            Ok(())
        }
        Err(e) => Err(format!("{at}: {e}")),
    }
}

/// The registry's part of a whole file kept to what opens without the network, for a command
/// that builds its registry itself (from the process environment): a `[store]` that is not a
/// relative `sqlite://` path is in memory, and the rails that reach the network at start
/// (`exact-algo`, `exact-avm`, `ln-nwc`, a ledger not on a relative `sqlite://` path) are left
/// out ([`check_registry`] reads them). Returns whether a rail was left out.
fn local(file: &mut Table) -> bool {
    let relative =
        |u: &str| u == "memory" || u.starts_with("sqlite://") && !u.starts_with("sqlite:///");
    if let Some(store) = table_mut(file, "store")
        && !string(store, "url").is_some_and(relative)
    {
        store.clear();
        store.insert("url".into(), "memory".into());
    }
    let mut dropped = false;
    if let Some(rails) = table_mut(file, "rails") {
        rails.retain(|_, r| {
            let keep = r.as_table().is_some_and(|t| match string(t, "kind") {
                Some("exact-algo" | "exact-avm" | "ln-nwc") => false,
                Some("ledger") => string(t, "url").is_some_and(relative),
                _ => true,
            });
            dropped |= !keep;
            keep
        });
    }
    dropped
}

/// Whether a command building its own registry refused `e` for a reason the test accepts: a
/// secret it reads from the process environment (unset here), or — when [`local`] left rails
/// out — a price or a receiver left with no rail.
fn excused(e: &CliError, dropped: bool) -> bool {
    if let CliError::Stipendex(e) = e
        && matches!(
            **e,
            stipendex::Error::MissingEnv { .. } | stipendex::Error::BadSecret { .. }
        )
    {
        return true;
    }
    let text = e.to_string();
    dropped
        && [
            "has no rail that receives",
            "no configured rail receives",
            "has no rail to be paid over",
        ]
        .iter()
        .any(|m| text.contains(m))
}

/// A path named by a file in `dir`, as the commands read it: a relative one beside the file;
/// an absolute one is moved into `dir` (the returned value replaces it).
fn beside(dir: &Path, named: &str) -> (PathBuf, String) {
    let path = Path::new(named);
    let (at, value) = if path.is_relative() {
        (dir.join(path), named.to_owned())
    } else {
        let inside = dir.join(named.trim_start_matches('/'));
        let value = inside.display().to_string();
        (inside, value)
    };
    if let Some(parent) = at.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    (at, value)
}

/// Gives the section `section` of `file` a real key where it names one: a `key_env` becomes a
/// `key_file` (the test cannot set variables), a `key_file` is written. Returns the key.
fn give_key(file: &mut Table, section: &str, dir: &Path) -> SecretKey {
    let key = SecretKey::generate();
    let Some(s) = table_mut(file, section) else {
        return key;
    };
    let named = match (s.get("key_file"), s.get("key_env")) {
        (Some(Value::String(f)), None) => f.clone(),
        (None, Some(Value::String(_))) => {
            s.remove("key_env");
            format!("{section}.key")
        }
        // Both, neither, or of the wrong type: the command refuses it as it is.
        _ => return key,
    };
    let (path, value) = beside(dir, &named);
    crate::files::write_secret(&path, &key)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    s.insert("key_file".into(), value.into());
    key
}

/// A wallet's file, loaded by [`crate::wallet_config::load`] in a temporary folder: its key is
/// written, its mandate is one signed for that key by a new principal, and `principal` (once
/// read as a public key) names that principal; its registry is kept [`local`].
async fn check_wallet(file: &Table) -> Result<(), String> {
    let dir = folder();
    let dir = dir.path();
    let mut file = file.clone();
    let dropped = local(&mut file);
    let wallet = give_key(&mut file, "wallet", dir);
    let principal = SecretKey::generate();
    if let Some(w) = table_mut(&mut file, "wallet") {
        if let Some(named) = string(w, "mandate").map(str::to_owned) {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let m = Mandate::draft(
                Party {
                    id: "principal".into(),
                    key: principal.public(),
                },
                wallet.public(),
                now.saturating_sub(60),
                86_400,
            );
            let signed = Signed::sign(m, &principal).map_err(|e| e.to_string())?;
            let (path, value) = beside(dir, &named);
            std::fs::write(&path, format!("{}\n", signed.jws()))
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
            w.insert("mandate".into(), value.into());
        }
        if let Some(p) = string(w, "principal") {
            PublicKey::parse(p)
                .map_err(|e| format!("[wallet] principal {p:?} is not a public key: {e}"))?;
            w.insert("principal".into(), principal.public().to_string().into());
        }
        if let Some(j) = string(w, "journal").map(str::to_owned) {
            w.insert("journal".into(), beside(dir, &j).1.into());
        }
    }
    let path = write(dir, "wallet.toml", &emit(&file));
    match patiently("the wallet", Box::pin(crate::wallet_config::load(&path))).await? {
        Ok(_) => Ok(()),
        Err(e) if excused(&e, dropped) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

/// A gateway's file, read and checked by [`crate::gateway::config::Config::read`] (which does
/// not build the registry): its receiver's key is written, and `secret_env` names a variable
/// this process has.
fn check_gateway(file: &Table) -> Result<(), String> {
    let dir = folder();
    let dir = dir.path();
    let mut file = file.clone();
    give_key(&mut file, "receiver", dir);
    if let Some(u) = table_mut(&mut file, "upstream")
        && u.get("secret_env").is_some_and(Value::is_str)
    {
        let set = std::env::vars()
            .find(|(_, v)| !v.is_empty() && v.bytes().all(|b| b.is_ascii_graphic()))
            .map(|(k, _)| k)
            .ok_or("no environment variable can stand for secret_env")?;
        u.insert("secret_env".into(), set.into());
    }
    let path = write(dir, "gateway.toml", &emit(&file));
    crate::gateway::config::Config::read(&path, None)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// `serve-mcp`'s file, read by [`crate::serve_mcp::receiver`] as far as its receiver: its key
/// is written, its registry is kept [`local`].
async fn check_serve_mcp(file: &Table) -> Result<(), String> {
    let dir = folder();
    let dir = dir.path();
    let mut file = file.clone();
    let dropped = local(&mut file);
    give_key(&mut file, "receiver", dir);
    let path = write(dir, "shop.toml", &emit(&file));
    match patiently(
        "serve-mcp",
        Box::pin(crate::serve_mcp::receiver(&path, None)),
    )
    .await?
    {
        Ok(_) => Ok(()),
        Err(e) if excused(&e, dropped) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

// ---------------------------------------------------------------------------------------------
// TOML out (this build of `toml` parses only).

/// `t` as a TOML document.
fn emit(t: &Table) -> String {
    let mut out = String::new();
    emit_table(&mut out, &[], t);
    out
}

fn emit_table(out: &mut String, path: &[&str], t: &Table) {
    let section = |v: &Value| match v {
        Value::Table(_) => true,
        Value::Array(a) => !a.is_empty() && a.iter().all(Value::is_table),
        _ => false,
    };
    for (k, v) in t.iter().filter(|(_, v)| !section(v)) {
        out.push_str(&format!("{} = {}\n", key(k), inline(v)));
    }
    for (k, v) in t.iter().filter(|(_, v)| section(v)) {
        let mut p = path.to_vec();
        p.push(k);
        let header: Vec<String> = p.iter().map(|k| key(k)).collect();
        match v {
            Value::Table(sub) => {
                out.push_str(&format!("\n[{}]\n", header.join(".")));
                emit_table(out, &p, sub);
            }
            Value::Array(items) => {
                for item in items.iter().filter_map(Value::as_table) {
                    out.push_str(&format!("\n[[{}]]\n", header.join(".")));
                    emit_table(out, &p, item);
                }
            }
            _ => {}
        }
    }
}

fn key(k: &str) -> String {
    let bare = !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare {
        k.to_owned()
    } else {
        string_literal(k)
    }
}

fn string_literal(s: &str) -> String {
    // A JSON string is a TOML basic string.
    serde_json::to_string(s).unwrap_or_default()
}

fn inline(v: &Value) -> String {
    match v {
        Value::String(s) => string_literal(s),
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => format!("{f:?}"),
        Value::Boolean(b) => b.to_string(),
        Value::Datetime(d) => d.to_string(),
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(inline).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Table(t) => {
            let items: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{} = {}", key(k), inline(v)))
                .collect();
            format!("{{ {} }}", items.join(", "))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The checks, over the documents' text (the tests below give them the files; the self-test
// gives them broken copies).

/// Every ```` ```toml ```` block of `docs`, each a failure if its parser refuses it.
async fn example_failures(docs: &[Doc]) -> Vec<String> {
    let mut failures = Vec::new();
    let mut count = 0;
    for doc in docs {
        for (line, block) in doc.toml_blocks() {
            count += 1;
            if let Err(e) = check_block(&block).await {
                failures.push(format!("{} line {line}: {e}", doc.name));
            }
        }
    }
    if count == 0 {
        failures.push("no ```toml block at all".into());
    }
    failures
}

/// Every key accepted but not documented in its section, and every key documented there but
/// not accepted; the registry's top-level tables; the `*_env` keys' table.
async fn key_failures(md: &Doc) -> Vec<String> {
    let mut failures = Vec::new();
    let sections = match accepted().await {
        Ok(s) => s,
        Err(e) => return vec![e],
    };
    let mut env_keys = BTreeSet::new();
    for (_, heading, keys) in &sections {
        env_keys.extend(keys.iter().filter(|k| k.ends_with("_env")).cloned());
        let lines = match md.section(heading) {
            Ok(l) => l,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        let docs = documented(&lines);
        for k in keys.difference(&docs) {
            failures.push(format!(
                "{heading}: the code accepts `{k}`, the table does not name it"
            ));
        }
        for k in docs.difference(keys) {
            failures.push(format!(
                "{heading}: the table names `{k}`, which the code refuses"
            ));
        }
    }
    // The registry's top-level tables, as the overview lists them.
    match top_level_tables().await {
        Ok(tables) => {
            let text = md.text.replace('\n', " ");
            let listed: BTreeSet<String> = text
                .split_once("the registry accepts the top-level tables")
                .and_then(|(_, rest)| rest.split_once('('))
                .map(|(list, _)| quoted(list).into_iter().map(str::to_owned).collect())
                .unwrap_or_default();
            if listed != tables {
                failures.push(format!(
                    "\"the registry accepts the top-level tables …\" lists {listed:?}; the registry accepts {tables:?}"
                ));
            }
        }
        Err(e) => failures.push(e),
    }
    // Every `*_env` key in the table of variables named by a file, and no other.
    match md.section("### Named by a configuration file (`*_env`)") {
        Ok(lines) => {
            let named: BTreeSet<String> = lines
                .iter()
                .filter(|l| l.starts_with("| `"))
                .filter_map(|l| l.split('|').nth(1))
                .flat_map(quoted)
                .filter(|k| k.ends_with("_env"))
                .map(str::to_owned)
                .collect();
            for k in env_keys.difference(&named) {
                failures.push(format!(
                    "`*_env` table: the code accepts `{k}`, the table does not name it"
                ));
            }
            for k in named.difference(&env_keys) {
                failures.push(format!(
                    "`*_env` table: the table names `{k}`, which no section accepts"
                ));
            }
        }
        Err(e) => failures.push(e),
    }
    failures
}

/// The facilitator's flags (clap) against its chapter: each flag and variable is named there,
/// and every flag the chapter's tables name exists.
fn facilitator_failures(md: &Doc) -> Vec<String> {
    fn walk(
        c: &clap::Command,
        flags: &mut BTreeSet<String>,
        names: &mut BTreeSet<String>,
        envs: &mut BTreeSet<String>,
    ) {
        for a in c.get_arguments() {
            if let Some(long) = a.get_long().filter(|l| !matches!(*l, "help" | "version")) {
                flags.insert(long.to_owned());
                names.insert(long.to_owned());
                names.extend(
                    a.get_all_aliases()
                        .unwrap_or_default()
                        .into_iter()
                        .map(str::to_owned),
                );
            }
            if let Some(env) = a.get_env() {
                envs.insert(env.to_string_lossy().into_owned());
            }
        }
        for sub in c.get_subcommands() {
            walk(sub, flags, names, envs);
        }
    }
    let cli = Cli::command();
    let Some(f) = cli.find_subcommand("facilitator") else {
        return vec!["no `facilitator` subcommand".into()];
    };
    let (mut flags, mut names, mut envs) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    walk(f, &mut flags, &mut names, &mut envs);
    let lines = match md.section("## Hosted facilitator") {
        Ok(l) => l,
        Err(e) => return vec![e],
    };
    let first_cells: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('|').nth(1))
        .collect();
    let documented: BTreeSet<String> = first_cells
        .iter()
        .flat_map(|c| c.split(|ch: char| ch.is_whitespace() || ch == '`' || ch == ','))
        .filter_map(|w| w.strip_prefix("--"))
        .map(str::to_owned)
        .collect();
    let cells = first_cells.join(" ");
    let mut failures = Vec::new();
    for f in flags.difference(&documented) {
        failures.push(format!(
            "## Hosted facilitator: the flag `--{f}` is not in a table"
        ));
    }
    for f in documented.difference(&names) {
        failures.push(format!(
            "## Hosted facilitator: the table names `--{f}`, which no subcommand takes"
        ));
    }
    for e in envs.iter().filter(|e| !cells.contains(&format!("`{e}`"))) {
        failures.push(format!(
            "## Hosted facilitator: the variable `{e}` is not in a table"
        ));
    }
    failures
}

fn report(what: &str, failures: &[String]) {
    assert!(failures.is_empty(), "{what}:\n- {}", failures.join("\n- "));
}

#[tokio::test]
async fn every_toml_example_is_read_by_the_real_parser_of_its_file() {
    let docs = [Doc::read("configuration.md"), Doc::read("going-live.md")];
    report("examples the code refuses", &example_failures(&docs).await);
}

#[tokio::test]
async fn every_key_the_code_accepts_is_documented_and_no_other() {
    let md = Doc::read("configuration.md");
    report("keys out of step with the code", &key_failures(&md).await);
}

#[test]
fn every_facilitator_flag_is_documented_and_no_other() {
    let md = Doc::read("configuration.md");
    report(
        "facilitator flags out of step with the code",
        &facilitator_failures(&md),
    );
}

#[tokio::test]
async fn the_key_lists_come_from_the_code() {
    // A sample of each way the keys are read, against what the code is known to accept.
    let wallet = wallet_keys().await.unwrap();
    assert!(
        [
            "key_file",
            "key_env",
            "mandate",
            "principal",
            "journal",
            "confirm"
        ]
        .iter()
        .all(|k| wallet.contains(*k)),
        "{wallet:?}"
    );
    assert_eq!(
        registry_keys("[store]", &format!("[store]\n{PROBE} = 0\n"))
            .await
            .unwrap(),
        BTreeSet::from(["url".to_owned(), "url_env".to_owned()])
    );
    assert!(rail_keys("ledger").await.unwrap().contains("payee_account"));
    assert!(
        rail_keys("stripe")
            .await
            .unwrap()
            .contains("publishable_key")
    );
    assert!(price_keys().unwrap().contains("tolerance"));
    assert!(proxy_keys().await.unwrap().contains("server"));
    assert!(serve_mcp_keys().await.unwrap().contains("origins"));
    assert_eq!(
        listed("x: unknown field `__probe`, expected `a`"),
        Some(BTreeSet::from(["a".to_owned()]))
    );
    assert_eq!(
        listed("unknown field `__probe`, there are no fields"),
        Some(BTreeSet::new())
    );
    assert_eq!(listed("missing field `a`"), None);
    // Every kind is in this build: stipendex-cli enables them all (`scripts/check-lean`).
    for (kind, _) in stipendex::registry::KINDS {
        assert!(rail_keys(kind).await.unwrap().contains("kind"), "{kind}");
    }
}

#[tokio::test]
async fn a_broken_reference_is_caught() {
    let md = Doc::read("configuration.md");
    // A key renamed in a table: the code's key is undocumented, the table's is refused.
    let renamed = Doc {
        name: md.name,
        text: md.text.replacen("| `principal` |", "| `principals` |", 1),
    };
    let failures = key_failures(&renamed).await;
    assert!(
        failures.iter().any(|f| f.contains("accepts `principal`")),
        "{failures:?}"
    );
    assert!(
        failures.iter().any(|f| f.contains("names `principals`")),
        "{failures:?}"
    );
    // An example with a key no section takes, one with a wrong type, one without its marker,
    // one whose wallet names no principal, one priced by an amount too precise.
    for (from, to, why) in [
        (
            "payer_account = \"0000000000000000000000000000a11c\"",
            "payer_acount = \"0000000000000000000000000000a11c\"",
            "payer_acount",
        ),
        (
            "quote_ttl_secs = 120",
            "quote_ttl_secs = \"120\"",
            "expected u64",
        ),
        ("# wallet.toml\n", "", "no marker"),
        (
            "principal = \"ed25519:0EqyMnQrtKs6E2i9RhXk5tAiSrcaAWuvhSCjMsl3hzc\"",
            "",
            "principal is not set",
        ),
        ("amount = \"0.02\"", "amount = \"0.021\"", "0.021"),
        ("confirm = \"terminal\"", "confirm = \"always\"", "always"),
    ] {
        assert!(
            md.text.contains(from),
            "the reference no longer holds {from:?}"
        );
        let broken = Doc {
            name: md.name,
            text: md.text.replacen(from, to, 1),
        };
        let failures = example_failures(&[broken]).await;
        assert!(
            failures.iter().any(|f| f.contains(why)),
            "{why}: {failures:?}"
        );
    }
}
