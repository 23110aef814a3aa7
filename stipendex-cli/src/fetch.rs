//! `stipendex fetch`: the wallet's HTTP client as a command (curl for agents).
//!
//! It sends one request; a 402 is paid under the mandate (a Stipendex Quote, or an x402
//! challenge where the build and the configuration have a scheme payer) and the request sent
//! again once. The body goes to stdout; one line goes to stderr: what was paid, over which
//! rail, the Receipt's id — or the refusal, one sentence naming the rule, with a non-zero exit.
//!
//! The configuration is the registry's TOML (`[store]`, `[rails.*]`) plus a `[wallet]`
//! (`crate::wallet_config`: its keys, and how relative paths are read beside the file).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use stipendex::http::{Client, Response};

use crate::{CliError, msg};

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
    /// Give up after this many seconds (a payment it started stays pending, and the same
    /// request asked again finishes it — never a second payment). Default: no limit; every
    /// 10 s of waiting is reported on stderr.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<u64>,
    /// The URL (absolute, http or https).
    url: String,
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
    let (client, journal_note) = client(&a.config).await?;
    // The body goes to stdout as it arrives, whatever its size; a paid one is hashed on the
    // way and checked against its Receipt when it ends.
    let mut stdout = std::io::stdout();
    let started = std::time::Instant::now();
    let request = client.execute_to(method, &a.url, headers, body, &mut stdout);
    tokio::pin!(request);
    let mut notice = tokio::time::interval_at(
        tokio::time::Instant::now() + Duration::from_secs(10),
        Duration::from_secs(10),
    );
    let deadline = async {
        match a.timeout {
            Some(t) => tokio::time::sleep(Duration::from_secs(t)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline);
    let r = loop {
        tokio::select! {
            r = &mut request => break r.map_err(|e| refused(&e))?,
            _ = notice.tick() => eprintln!(
                "still waiting after {} s: the server or a payment's rail is slow",
                started.elapsed().as_secs()
            ),
            () = &mut deadline => {
                return Err(msg(format!(
                    "no answer within {} s (--timeout): a payment it started stays pending (`stipendex wallet pending`), and asking the same request again finishes it without paying twice",
                    a.timeout.unwrap_or_default()
                )));
            }
        }
    };
    eprintln!("{}{journal_note}", summary(&r));
    // A tab opened for this request is closed before the process ends: its unused cap is
    // released now, not when the tab would end.
    match Box::pin(client.close_tabs()).await {
        Ok(receipts) => {
            for t in receipts {
                eprintln!("{}", stipendex_app::show::tab_line(t.object()));
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

/// The failure as one sentence: the network's own (where the request went and why it got no
/// answer, and what became of a payment made before it), or the refusal naming the rule.
fn refused(e: &stipendex::Error) -> CliError {
    match e {
        stipendex::Error::Network(why) => msg(why.clone()),
        e => msg(format!("not paid ({}): {e}", e.code())),
    }
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

/// The wallet's HTTP client from the configuration at `path`, and what the summary says of
/// the journal.
async fn client(path: &Path) -> Result<(Client, &'static str), CliError> {
    let loaded = crate::wallet_config::load(path).await?;
    let note = loaded.journal_note();
    Ok((
        Client::new(
            stipendex::http::reqwest_builder(Duration::from_secs(60)),
            loaded.wallet,
        )?,
        note,
    ))
}
