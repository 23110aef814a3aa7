//! `stipendex fetch`: the wallet's HTTP client as a command (curl for agents).
//!
//! It sends one request; a 402 is paid under the mandate (a Stipendex Quote, or an x402
//! challenge where the build and the configuration have a scheme payer) and the request sent
//! again once. The body goes to stdout; one line goes to stderr: what was paid, over which
//! rail, the Receipt's id — or the refusal, one sentence naming the rule, with a non-zero exit.
//!
//! The configuration is the registry's TOML (`[store]`, `[rails.*]`) plus a `[wallet]`:
//!
//! ```toml
//! [wallet]
//! key_file = "keys/wallet.key"   # or key_env = "STIPENDEX_WALLET_KEY" (64 hex digits)
//! mandate = "mandate.jws"        # signed by the principal (`stipendex mandate sign`)
//! principal = "ed25519:…"        # optional: refuse a mandate signed by another key
//! journal = "chains"             # optional: one audit chain per payment (`verify-chain`)
//! confirm = "refuse"             # or "terminal": ask on the terminal above the threshold
//! ```
//!
//! Relative paths are read from the configuration's directory. The wallet's spend counters
//! live in the `[store]` (a `sqlite://` file keeps them across runs).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use stipendex::Registry;
use stipendex::envelope::{Mandate, PublicKey, Signed};
use stipendex::http::{Client, Response};
use stipendex::wallet::{Confirmer, DirJournal, Refuse, Terminal, Wallet};

use crate::{CliError, files, msg};

/// `stipendex fetch`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The wallet's configuration (registry TOML with a `[wallet]` section).
    #[arg(long, default_value = "wallet.toml")]
    config: PathBuf,
    /// The method (default GET, or POST with --data).
    #[arg(short = 'X', long = "request")]
    method: Option<String>,
    /// A request header, `Name: value` (repeatable).
    #[arg(short = 'H', long = "header")]
    headers: Vec<String>,
    /// The request body (`@FILE` reads it from FILE).
    #[arg(short = 'd', long = "data")]
    data: Option<String>,
    /// The URL (absolute, http or https).
    url: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Confirm {
    #[default]
    Refuse,
    Terminal,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WalletSection {
    key_file: Option<PathBuf>,
    key_env: Option<String>,
    mandate: PathBuf,
    principal: Option<String>,
    journal: Option<PathBuf>,
    #[serde(default)]
    confirm: Confirm,
}

#[derive(Debug, Deserialize)]
struct File {
    wallet: Option<WalletSection>,
}

/// Runs `stipendex fetch`.
///
/// # Errors
/// A configuration that does not load, a request that cannot be made, or the wallet's refusal.
#[allow(clippy::print_stderr)]
pub(crate) async fn run(a: Args) -> Result<ExitCode, CliError> {
    let method = method(&a)?;
    let headers = headers(&a.headers)?;
    let body = match &a.data {
        Some(d) => Some(match d.strip_prefix('@') {
            Some(path) => std::fs::read(path)
                .map_err(|e| msg(format!("--data @{path}: cannot read it: {e}")))?,
            None => d.clone().into_bytes(),
        }),
        None => None,
    };
    let client = client(&a.config).await?;
    // The body goes to stdout as it arrives, whatever its size; a paid one is hashed on the
    // way and checked against its Receipt when it ends.
    let mut stdout = std::io::stdout();
    let r = client
        .execute_to(method, &a.url, headers, body, &mut stdout)
        .await
        .map_err(|e| refused(&e))?;
    eprintln!("{}", summary(&r));
    // A tab opened for this request is closed before the process ends: its unused cap is
    // released now, not when the tab would end.
    match Box::pin(client.close_tabs()).await {
        Ok(receipts) => {
            for t in receipts {
                eprintln!("{}", tab_line(t.object()));
            }
        }
        Err(e) => eprintln!(
            "a tab could not be closed ({}): {e}; the receiver closes it at its end",
            e.code()
        ),
    }
    Ok(if r.status.is_success() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The refusal as one sentence naming the rule.
fn refused(e: &stipendex::Error) -> CliError {
    msg(format!("not paid ({}): {e}", e.code()))
}

/// `tab <id>: N calls, captured X of cap Y`.
pub(crate) fn tab_line(t: &stipendex::envelope::TabReceipt) -> String {
    let fixed = |a| {
        stipendex::Money::new(t.asset.clone(), a).map_or_else(|_| a.to_string(), |m| m.to_fixed())
    };
    format!(
        "tab {}: {} call{}, captured {} of cap {} {}",
        t.tab,
        t.calls,
        if t.calls == 1 { "" } else { "s" },
        fixed(t.captured),
        fixed(t.cap),
        t.asset
    )
}

/// The stderr line: what was paid, over which rail, the Receipt's id.
fn summary(r: &Response) -> String {
    let status = r.status.as_u16();
    if let Some(t) = &r.tab_call {
        return format!(
            "paid {} {} in tab {}; HTTP {status}, call {}",
            t.amount.amount(),
            t.amount.asset(),
            t.tab,
            t.voucher.as_str()
        );
    }
    if let Some(p) = &r.paid {
        let proof = p.proof.object();
        let receipt = r.receipt.as_ref().map_or_else(
            || "no receipt".to_owned(),
            |x| format!("receipt {}", x.object().id),
        );
        return format!(
            "paid {} {} over {} ({}); HTTP {status}, {receipt}",
            proof.amount, proof.asset, p.rail, proof.rail
        );
    }
    if let Some(x) = &r.x402 {
        return format!(
            "paid {} {} over x402 ({}); HTTP {status}, no receipt (x402 settlements are unsigned)",
            x.amount.amount(),
            x.amount.asset(),
            x.payer
        );
    }
    format!("nothing paid; HTTP {status}")
}

fn method(a: &Args) -> Result<Method, CliError> {
    match &a.method {
        Some(m) => Method::from_bytes(m.to_ascii_uppercase().as_bytes())
            .map_err(|_| msg(format!("-X {m:?} is not an HTTP method"))),
        None if a.data.is_some() => Ok(Method::POST),
        None => Ok(Method::GET),
    }
}

fn headers(lines: &[String]) -> Result<HeaderMap, CliError> {
    let mut h = HeaderMap::new();
    for line in lines {
        let bad = || {
            msg(format!(
                "-H {line:?} is not a header: write it as 'Name: value'"
            ))
        };
        let (name, value) = line.split_once(':').ok_or_else(bad)?;
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| bad())?;
        if [
            stipendex::http::PAYMENT,
            stipendex::http::VOUCHER,
            stipendex::http::TAB,
            "payment-signature",
            "x-payment",
        ]
        .contains(&name.as_str())
        {
            return Err(msg(format!(
                "-H {line:?}: the wallet sets payment headers itself; remove it"
            )));
        }
        let value = HeaderValue::from_str(value.trim()).map_err(|_| bad())?;
        h.append(name, value);
    }
    Ok(h)
}

/// The wallet's HTTP client from the configuration at `path`.
async fn client(path: &Path) -> Result<Client, CliError> {
    let wallet = wallet(path, false).await?;
    Ok(Client::new(
        stipendex::http::reqwest_builder(Duration::from_secs(60)),
        wallet,
    )?)
}

/// The wallet the configuration at `path` describes; with `journaled`, one that must keep its
/// payments (and pending payments) in a `[wallet] journal`.
pub(crate) async fn wallet(path: &Path, journaled: bool) -> Result<Wallet, CliError> {
    let text = files::read(path)?;
    let file: File =
        toml::from_str(&text).map_err(|e| msg(format!("{}: {}", path.display(), e.message())))?;
    let w = file.wallet.ok_or_else(|| {
        msg(format!(
            "{} has no [wallet] section: add one with the wallet's key_file and mandate",
            path.display()
        ))
    })?;
    let dir = path.parent().unwrap_or(Path::new("."));
    let at = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            dir.join(p)
        }
    };
    let key = files::key_of("wallet", dir, w.key_file.as_deref(), w.key_env.as_deref())?;
    let mandate_path = at(&w.mandate);
    let mandate = Signed::<Mandate>::parse(files::read(&mandate_path)?.trim()).map_err(|e| {
        msg(format!(
            "{} is not a signed mandate ({e}): sign one with `stipendex mandate sign`",
            mandate_path.display()
        ))
    })?;
    let registry = Registry::from_file(path).await?;
    // The registry's `[store]` (`url` or `url_env`), opened once: the spend counters and paid
    // Quotes live there with the rails' records. Without one, memory (nothing survives).
    let store: Arc<dyn rail_core::KeyStore> = registry
        .store()
        .cloned()
        .unwrap_or_else(|| Arc::new(rail_core::MemoryKeyStore::default()));
    let confirmer: Arc<dyn Confirmer> = match w.confirm {
        Confirm::Refuse => Arc::new(Refuse),
        Confirm::Terminal => Arc::new(Terminal),
    };
    let mut b = Wallet::builder(key, mandate)
        .registry(&registry)
        .store(store)
        .confirmer(confirmer);
    if let Some(p) = &w.principal {
        let p = PublicKey::parse(p).map_err(|_| {
            msg(format!(
                "[wallet] principal {p:?} is not a public key (ed25519:<base64url>)"
            ))
        })?;
        b = b.principal(p);
    }
    match &w.journal {
        Some(j) => b = b.journal(Arc::new(DirJournal::new(at(j))?)),
        None if journaled => {
            return Err(msg(format!(
                "{}: the [wallet] has no journal, so no payment is kept pending across runs: add journal = \"chains\"",
                path.display()
            )));
        }
        None => {}
    }
    Ok(b.build()?)
}
