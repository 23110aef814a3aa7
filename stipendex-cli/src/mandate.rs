//! `stipendex mandate new | sign | show | revoke`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;
use rail_core::KeyStore;
use stipendex::envelope::{Allow, Limits, Mandate, Party, Period, PublicKey, Signed};
use stipendex::{Amount, Asset};

use crate::{CliError, files, msg};

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Writes an unsigned mandate (JSON) for a wallet key: limits, allowlist, validity.
    New(Box<NewArgs>),
    /// Signs a mandate with the principal's key: writes its compact JWS.
    Sign {
        /// The principal's secret key file.
        #[arg(long)]
        key: PathBuf,
        /// The mandate (JSON, from `mandate new`).
        mandate: PathBuf,
        /// Where to write the signed mandate (an existing file only with --force).
        #[arg(long)]
        out: PathBuf,
        /// Overwrite --out if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Verifies a signed mandate and prints what it allows.
    Show {
        /// The signed mandate (compact JWS).
        mandate: PathBuf,
    },
    /// Revokes a signed mandate: writes the principal's signed revocation and, with `--store`,
    /// records it in the wallet's store, which the wallet reads before every payment.
    Revoke {
        /// The principal's secret key file.
        #[arg(long)]
        key: PathBuf,
        /// The signed mandate.
        mandate: PathBuf,
        /// The wallet's store (`sqlite://wallet.db` or a `postgres://` URL).
        #[arg(long, conflicts_with = "config")]
        store: Option<String>,
        /// The wallet's configuration: the revocation is recorded in the store it names (its
        /// relative paths read beside it), wherever this command runs.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to write the revocation (default: next to the mandate, `.revocation.jws`;
        /// an existing file only with --force).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Overwrite the revocation file if it exists.
        #[arg(long)]
        force: bool,
    },
}

#[derive(clap::Args)]
pub(crate) struct NewArgs {
    /// The principal's id (who grants the authority).
    #[arg(long, default_value = "principal")]
    principal_id: String,
    /// The principal's secret key file (only its public key goes into the mandate).
    #[arg(long)]
    principal_key: PathBuf,
    /// The wallet's public key (`ed25519:…`, as `stipendex key new` prints it).
    #[arg(long = "wallet-pubkey", alias = "wallet", value_name = "ed25519:KEY")]
    wallet: String,
    /// Days of validity from now (1 or more).
    #[arg(long, default_value_t = 30)]
    days: u64,
    /// The asset of the limits (`USD`, `USDC`, `ALGO`, `BTC`, or any code with `--scale`).
    #[arg(long, default_value = "USD")]
    asset: String,
    /// The asset's decimals (known for USD 2, EUR 2, USDC 6, ALGO 6, BTC 11).
    #[arg(long)]
    scale: Option<u8>,
    /// The most one payment may be.
    #[arg(long)]
    per_call: Option<String>,
    /// The most spent per period.
    #[arg(long)]
    per_period: Option<String>,
    /// The period, in seconds (86400: a UTC day).
    #[arg(long, default_value_t = 86_400)]
    period_seconds: u64,
    /// The most spent in total.
    #[arg(long)]
    total: Option<String>,
    /// The most spent with any one receiver.
    #[arg(long)]
    per_receiver: Option<String>,
    /// A human confirms payments above this amount.
    #[arg(long)]
    confirm_above: Option<String>,
    /// Tab sessions: the largest cap one tab may hold (without it the wallet opens no tab).
    #[arg(long)]
    tab_cap: Option<String>,
    /// Tab sessions: how many may be open at once (default 1).
    #[arg(long, requires = "tab_cap")]
    open_tabs: Option<u32>,
    /// A Stipendex receiver the wallet may pay: `ID=ed25519:KEY` (repeatable).
    #[arg(long = "allow-receiver")]
    allow_receiver: Vec<String>,
    /// An origin an allowed receiver is reached at over HTTP: `ID=https://host[:port]`, or
    /// just the origin when one receiver is allowed (repeatable). Over HTTP the wallet pays a
    /// receiver only at the origins pinned here.
    #[arg(long = "origin")]
    origin: Vec<String>,
    /// A plain x402 HTTP server: `https://origin=PAYTO` (repeatable).
    #[arg(long = "allow-x402-http")]
    allow_http: Vec<String>,
    /// A plain x402 MCP server: `SERVER=PAYTO` (repeatable).
    #[arg(long = "allow-x402-mcp")]
    allow_mcp: Vec<String>,
    /// A ContextVM server (MCP over Nostr, CEP-8 payments), by its Nostr public key (64 hex
    /// characters; repeatable).
    #[arg(long = "allow-contextvm")]
    allow_contextvm: Vec<String>,
    /// Sign away any amount: a mandate without --per-call, --per-period, --total or
    /// --per-receiver is refused without this.
    #[arg(long)]
    unlimited: bool,
    /// The allowed receivers are paid in process only (not over HTTP): a receiver without
    /// --origin is refused without this.
    #[arg(long)]
    in_process: bool,
    /// Rail kinds the wallet may pay over (comma-separated; default: any).
    #[arg(long, value_delimiter = ',')]
    rails: Option<Vec<String>>,
    /// What the mandate is for.
    #[arg(long)]
    description: Option<String>,
    /// Where to write the mandate (JSON; an existing file only with --force).
    #[arg(long)]
    out: PathBuf,
    /// Overwrite --out if it exists.
    #[arg(long)]
    force: bool,
}

fn asset(code: &str, scale: Option<u8>) -> Result<Asset, CliError> {
    let known = match code {
        "USD" | "EUR" | "GBP" => Some(2),
        "USDC" | "ALGO" => Some(6),
        "BTC" => Some(11),
        _ => None,
    };
    let scale = scale.or(known).ok_or_else(|| {
        msg(format!(
            "--asset {code} has no known scale: give its decimals with --scale"
        ))
    })?;
    Asset::new(code, scale).map_err(|e| msg(format!("--asset {code}: {e}")))
}

fn amount(flag: &str, value: Option<&String>, asset: &Asset) -> Result<Option<Amount>, CliError> {
    value
        .map(|v| {
            stipendex::Money::parse(asset.clone(), v)
                .map(|m| m.amount())
                .map_err(|e| {
                    msg(format!(
                        "--{flag} {v:?} is not an amount of {asset} ({e}): write a decimal such as 1.25"
                    ))
                })
        })
        .transpose()
}

fn pair<'a>(flag: &str, v: &'a str, shape: &str) -> Result<(&'a str, &'a str), CliError> {
    v.rsplit_once('=')
        .filter(|(a, b)| !a.is_empty() && !b.is_empty())
        .ok_or_else(|| msg(format!("--{flag} {v:?} must be written {shape}")))
}

/// Seconds since the Unix epoch, by this machine's clock (a mandate's `iat`/`nbf`).
pub(crate) fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn new(a: NewArgs) -> Result<(), CliError> {
    if a.days == 0 {
        return Err(msg(
            "--days 0 makes a mandate that has expired when it is signed: give --days 1 or more",
        ));
    }
    let principal = files::read_secret(&a.principal_key)?;
    let wallet = PublicKey::parse(&a.wallet).map_err(|_| {
        msg(format!(
            "--wallet-pubkey {:?} is not a public key: write it as ed25519:<base64url> (`stipendex key new` prints one)",
            a.wallet
        ))
    })?;
    let asset = asset(&a.asset, a.scale)?;
    let mut m = Mandate::draft(
        Party {
            id: a.principal_id,
            key: principal.public(),
        },
        wallet,
        now(),
        a.days.saturating_mul(86_400),
    );
    m.limits.push(Limits {
        per_call: amount("per-call", a.per_call.as_ref(), &asset)?,
        per_period: amount("per-period", a.per_period.as_ref(), &asset)?.map(|amount| Period {
            seconds: a.period_seconds,
            amount,
        }),
        total: amount("total", a.total.as_ref(), &asset)?,
        per_receiver: amount("per-receiver", a.per_receiver.as_ref(), &asset)?,
        confirm_above: amount("confirm-above", a.confirm_above.as_ref(), &asset)?,
        tab_cap: amount("tab-cap", a.tab_cap.as_ref(), &asset)?,
        open_tabs: a.open_tabs,
        asset,
    });
    for v in &a.allow_receiver {
        let (id, key) = pair("allow-receiver", v, "ID=ed25519:KEY")?;
        let key = PublicKey::parse(key).map_err(|_| {
            msg(format!(
                "--allow-receiver {v:?}: {key:?} is not a key (ed25519:<base64url>)"
            ))
        })?;
        m.allow.push(Allow::Receiver {
            id: id.to_owned(),
            key,
            origins: Vec::new(),
        });
    }
    for v in &a.origin {
        pin_origin(&mut m, v)?;
    }
    for v in &a.allow_http {
        let (origin, pay_to) = pair("allow-x402-http", v, "https://ORIGIN=PAYTO")?;
        m.allow.push(Allow::X402Http {
            origin: origin.to_owned(),
            pay_to: pay_to.to_owned(),
        });
    }
    for v in &a.allow_mcp {
        let (server, pay_to) = pair("allow-x402-mcp", v, "SERVER=PAYTO")?;
        m.allow.push(Allow::X402Mcp {
            server: server.to_owned(),
            pay_to: pay_to.to_owned(),
        });
    }
    for v in &a.allow_contextvm {
        if v.len() != 64 || !v.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(msg(format!(
                "--allow-contextvm {v:?} is not a Nostr public key: write its 64 hex characters"
            )));
        }
        m.allow.push(Allow::Contextvm {
            server: v.to_ascii_lowercase(),
        });
    }
    let limited = m.limits.iter().any(|l| {
        l.per_call.is_some()
            || l.per_period.is_some()
            || l.total.is_some()
            || l.per_receiver.is_some()
    });
    if !limited && !a.unlimited {
        return Err(msg(
            "the mandate sets no limit, so the wallet could pay any amount: give --per-call, --per-period, --total or --per-receiver (or --unlimited to mean it)",
        ));
    }
    if !a.in_process
        && let Some(id) = m.allow.iter().find_map(|x| match x {
            Allow::Receiver { id, origins, .. } if origins.is_empty() => Some(id.clone()),
            _ => None,
        })
    {
        return Err(msg(format!(
            "--allow-receiver {id} has no --origin, and over HTTP the wallet pays a receiver only at an origin its mandate pins: add --origin {id}=https://host[:port] (or --in-process for a wallet that pays it in process only)"
        )));
    }
    m.rails = a.rails;
    m.description = a.description;
    let json = serde_json::to_string_pretty(&m)
        .map_err(|e| msg(format!("cannot write the mandate: {e}")))?;
    files::write_new(&a.out, &format!("{json}\n"), a.force)?;
    #[allow(clippy::print_stdout)]
    {
        println!(
            "wrote {} (unsigned): sign it with `stipendex mandate sign --key {} {} --out mandate.jws`",
            a.out.display(),
            a.principal_key.display(),
            a.out.display()
        );
    }
    Ok(())
}

/// `--origin [ID=]https://host[:port]`: pins the origin on the receiver entry `ID` (or on the
/// one receiver entry).
fn pin_origin(m: &mut Mandate, v: &str) -> Result<(), CliError> {
    let (id, origin) = match v.split_once('=') {
        Some((id, o)) if !id.contains("://") => (Some(id), o),
        _ => (None, v),
    };
    let origin = stipendex::origin::parse(origin).map_err(|_| {
        msg(format!(
            "--origin {v:?}: {origin:?} is not an origin: write https://host[:port] (scheme, host and port, no path)"
        ))
    })?;
    let mut entries: Vec<&mut Vec<String>> = m
        .allow
        .iter_mut()
        .filter_map(|a| match a {
            Allow::Receiver {
                id: rid, origins, ..
            } if id.is_none_or(|i| i == rid) => Some(origins),
            _ => None,
        })
        .collect();
    match (entries.len(), id) {
        (1, _) => {
            if let Some(o) = entries.pop()
                && !o.contains(&origin)
            {
                o.push(origin);
            }
            Ok(())
        }
        (0, Some(id)) => Err(msg(format!(
            "--origin {v:?} names receiver {id}, which no --allow-receiver allows: add --allow-receiver {id}=ed25519:KEY"
        ))),
        (0, None) => Err(msg(format!(
            "--origin {v:?} needs a receiver to pin it on: add --allow-receiver ID=ed25519:KEY"
        ))),
        _ => Err(msg(format!(
            "--origin {v:?}: several receivers are allowed; say which one with --origin ID={origin}"
        ))),
    }
}

/// Whether the mandate is outside its validity at `now` (Unix seconds), as the wallet judges
/// it (valid from `nbf`, up to but not including `exp`): the line that says so, if it is.
fn validity(m: &Mandate, now: u64) -> Option<String> {
    if now >= m.exp {
        Some(format!(
            "EXPIRED at {}: the wallet pays nothing under it; sign a new mandate",
            rail_core::clock::rfc3339(m.exp)
        ))
    } else if now < m.nbf {
        Some(format!(
            "NOT YET VALID: the wallet pays nothing under it before {}",
            rail_core::clock::rfc3339(m.nbf)
        ))
    } else {
        None
    }
}

async fn open_store(url: &str) -> Result<Arc<dyn KeyStore>, CliError> {
    let store = match rail_core::keys::StoreUrl::parse(url) {
        Some(rail_core::keys::StoreUrl::Memory) => {
            return Err(msg(
                "--store memory keeps nothing after this command: use sqlite://FILE or postgres://…",
            ));
        }
        Some(store) => store,
        None => {
            return Err(msg(format!(
                "--store {url:?} is not a store URL: use sqlite://FILE or postgres://…"
            )));
        }
    };
    rail_core::keys::open_at(store, None)
        .await
        .map_err(|e| match store {
            // A PostgreSQL URL may carry a password: never echoed.
            rail_core::keys::StoreUrl::Postgres(_) => msg(format!("cannot open the store: {e}")),
            _ => msg(format!("cannot open the store {url}: {e}")),
        })
}

#[allow(clippy::print_stdout)]
pub(crate) async fn run(c: Command) -> Result<ExitCode, CliError> {
    match c {
        Command::New(a) => new(*a)?,
        Command::Sign {
            key: key_file,
            mandate,
            out,
            force,
        } => {
            let key = files::read_secret(&key_file)?;
            let text = files::read(&mandate)?;
            let m: Mandate = serde_json::from_str(&text)
                .map_err(|e| msg(format!("{} is not a mandate: {e}", mandate.display())))?;
            let named = m.principal.key;
            let signed = Signed::sign(m, &key).map_err(|e| match e {
                stipendex::Error::Untrusted(_) => msg(format!(
                    "--key {} is the key {}, but {} names the principal key {}: sign with the principal's own key",
                    key_file.display(),
                    key.public(),
                    mandate.display(),
                    named
                )),
                e => CliError::from(e),
            })?;
            files::write_new(&out, &format!("{}\n", signed.jws()), force)?;
            println!("signed mandate {} -> {}", signed.object().id, out.display());
        }
        Command::Show { mandate } => {
            let m = files::read_signed::<Mandate>(&mandate)?;
            print!("{}", stipendex_app::show::describe(m.object()));
            println!(
                "  signature: valid (principal {})",
                m.object().principal.key
            );
            if let Some(line) = validity(m.object(), now()) {
                println!("  {line}");
            }
        }
        Command::Revoke {
            key,
            mandate,
            store,
            config,
            out,
            force,
        } => {
            let secret = files::read_secret(&key)?;
            let m = files::read_signed::<Mandate>(&mandate)?;
            let revocation = stipendex::wallet::revoke(&m, &secret, now()).map_err(|_| {
                msg(format!(
                    "--key {} is the key {}, but mandate {} is signed by the principal key {}: only that principal's secret key revokes it",
                    key.display(),
                    secret.public(),
                    m.object().id,
                    m.object().principal.key
                ))
            })?;
            let out = out.unwrap_or_else(|| mandate.with_extension("revocation.jws"));
            files::write_new(&out, &format!("{}\n", revocation.jws()), force)?;
            println!("revoked mandate {} -> {}", m.object().id, out.display());
            if let Some(url) = store {
                let store = open_store(&url).await?;
                stipendex::wallet::Revocations::new(store)
                    .record(&revocation)
                    .await?;
                println!(
                    "recorded in {url}: the wallet refuses every payment under it from now on"
                );
            }
            if let Some(config) = config {
                let registry = stipendex::Registry::from_file(&config).await?;
                let store = registry.store().cloned().ok_or_else(|| {
                    msg(format!(
                        "{} has no [store]: the wallet keeps no revocation there; keep the revocation file beside the mandate",
                        config.display()
                    ))
                })?;
                stipendex::wallet::Revocations::new(store)
                    .record(&revocation)
                    .await?;
                println!(
                    "recorded in the store of {}: the wallet refuses every payment under it from now on",
                    config.display()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
