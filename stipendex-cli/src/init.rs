//! `stipendex init DIR --upstream URL`: a working local setup in one folder, for a first paid
//! call of one's own in three commands.
//!
//! ```text
//! DIR/
//!   ledger.db            the embedded ledger both sides use: the wallet's account funded 10.00 USD
//!   wallet/              what the agent's wallet may read
//!     wallet.key         its Ed25519 secret key (owner-only)
//!     mandate.jws        the principal's signed mandate: 1.00 per call, 5.00 a day, a human
//!                        above 0.50, 30 days, the receiver pinned by key and origin
//!     wallet.toml        principal pinned, store wallet.db (its journal inside)
//!   gateway/             the seller's side
//!     receiver.key       the receiver's Ed25519 secret key (owner-only)
//!     gateway.toml       GET /api/* at 0.01 USD in front of the upstream, the rest free
//! ```
//!
//! The principal's secret key signs the mandate and is never left where the wallet (and so
//! the agent) can read it: it goes to `--principal-key FILE` outside `DIR/wallet`, or is
//! printed once. Nothing existing is overwritten.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use rail_ledger::AccountId;
use stipendex::envelope::{Allow, Limits, Mandate, Party, Period, SecretKey, Signed};
use stipendex::{Asset, Money};

use crate::{CliError, files, ledger, msg};

/// `stipendex init`.
#[derive(clap::Args)]
pub(crate) struct Args {
    /// The folder to write (created; refused if it already holds a setup).
    dir: PathBuf,
    /// The API the gateway sells (`http://127.0.0.1:8080`): GET /api/* priced, the rest free.
    #[arg(long)]
    upstream: String,
    /// Where the gateway listens, and so the origin the mandate pins.
    #[arg(long, default_value = "127.0.0.1:8402")]
    listen: std::net::SocketAddr,
    /// Where to write the principal's secret key (outside DIR/wallet); without it the key is
    /// printed once.
    #[arg(long)]
    principal_key: Option<PathBuf>,
    /// The receiver's id (what Quotes, Receipts and the mandate name).
    #[arg(long, default_value = "my-api")]
    receiver_id: String,
}

/// What the setup holds, in USD.
const FUNDING: &str = "10.00";
const PRICE: &str = "0.01";
const PER_CALL: &str = "1.00";
const PER_DAY: &str = "5.00";
const CONFIRM_ABOVE: &str = "0.50";
const DAYS: u64 = 30;

fn usd(v: &str) -> Result<Money, CliError> {
    Money::parse(Asset::usd(), v).map_err(|e| msg(format!("{v} is not an amount of USD: {e}")))
}

fn mkdir(dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|e| msg(format!("cannot create {}: {e}", dir.display())))
}

/// Whether `inner` is `outer` or inside it (both made absolute, `..` resolved lexically).
fn within(inner: &Path, outer: &Path) -> bool {
    fn clean(p: &Path) -> PathBuf {
        let abs = std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        let mut out = PathBuf::new();
        for c in abs.components() {
            match c {
                std::path::Component::ParentDir => {
                    out.pop();
                }
                std::path::Component::CurDir => {}
                c => out.push(c),
            }
        }
        out
    }
    clean(inner).starts_with(clean(outer))
}

/// Runs `stipendex init`.
pub(crate) async fn run(a: Args) -> Result<ExitCode, CliError> {
    let upstream = url::Url::parse(&a.upstream)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host().is_some())
        .ok_or_else(|| {
            msg(format!(
                "--upstream {:?} is not an http(s) URL: name your API, such as http://127.0.0.1:8080",
                a.upstream
            ))
        })?;
    let dir = std::path::absolute(&a.dir)
        .map_err(|e| msg(format!("cannot resolve {}: {e}", a.dir.display())))?;
    let (wallet_dir, gateway_dir) = (dir.join("wallet"), dir.join("gateway"));
    for taken in [
        dir.join("ledger.db"),
        wallet_dir.join("wallet.toml"),
        gateway_dir.join("gateway.toml"),
    ] {
        if taken.exists() {
            return Err(msg(format!(
                "{} already holds a setup ({} exists): give another folder (init never overwrites)",
                dir.display(),
                taken.display()
            )));
        }
    }
    if let Some(p) = &a.principal_key {
        if within(p, &wallet_dir) {
            return Err(msg(format!(
                "--principal-key {} is inside {}, where the wallet (and so the agent) can read it: write it elsewhere",
                p.display(),
                wallet_dir.display()
            )));
        }
        if p.exists() {
            return Err(msg(format!(
                "--principal-key {} exists: init never overwrites a key; name a new file",
                p.display()
            )));
        }
    }
    mkdir(&wallet_dir)?;
    mkdir(&gateway_dir)?;
    let origin = format!("http://{}", a.listen);

    // Keys: the wallet's and the receiver's in their folders, the principal's never there.
    let (principal, wallet_key, receiver_key) = (
        SecretKey::generate(),
        SecretKey::generate(),
        SecretKey::generate(),
    );
    files::write_secret(&wallet_dir.join("wallet.key"), &wallet_key)?;
    files::write_secret(&gateway_dir.join("receiver.key"), &receiver_key)?;

    // The mandate: small limits, a human above the threshold, the receiver pinned.
    let mut m = Mandate::draft(
        Party {
            id: "principal".into(),
            key: principal.public(),
        },
        wallet_key.public(),
        crate::mandate::now(),
        DAYS * 86_400,
    );
    m.limits.push(Limits {
        per_call: Some(usd(PER_CALL)?.amount()),
        per_period: Some(Period {
            seconds: 86_400,
            amount: usd(PER_DAY)?.amount(),
        }),
        total: None,
        per_receiver: None,
        confirm_above: Some(usd(CONFIRM_ABOVE)?.amount()),
        tab_cap: None,
        open_tabs: None,
        asset: Asset::usd(),
    });
    m.allow.push(Allow::Receiver {
        id: a.receiver_id.clone(),
        key: receiver_key.public(),
        origins: vec![origin.clone()],
    });
    m.description = Some(format!("first paid calls to {} at {origin}", a.receiver_id));
    let mandate = Signed::sign(m, &principal)?;
    files::write(
        &wallet_dir.join("mandate.jws"),
        &format!("{}\n", mandate.jws()),
    )?;

    // The ledger: the wallet's account funded, the receiver's empty.
    let ledger_path = dir.join("ledger.db");
    let ledger = ledger::open_url(&format!("sqlite://{}", ledger_path.display()), None).await?;
    let (payer, payee) = (AccountId::random(), AccountId::random());
    ledger::create(&ledger, payer, &Asset::usd(), true).await?;
    ledger::create(&ledger, payee, &Asset::usd(), true).await?;
    ledger::fund(&ledger, payer, &usd(FUNDING)?, "stipendex init").await?;

    files::write(
        &wallet_dir.join("wallet.toml"),
        &wallet_toml(&principal, payer),
    )?;
    files::write(
        &gateway_dir.join("gateway.toml"),
        &gateway_toml(&a, &origin, upstream.as_str(), payee),
    )?;

    let principal_note = match &a.principal_key {
        Some(p) => {
            if let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
                mkdir(parent)?;
            }
            files::write_secret(p, &principal)?;
            format!(
                "the principal's secret key is in {} (owner-only), not beside the wallet: it signs mandates, and the agent must never read it",
                p.display()
            )
        }
        None => format!(
            "the principal's secret key, printed once and written nowhere (it signs mandates: keep it where the agent cannot read it, `stipendex mandate sign --key FILE` reads it from a file):\n  {}",
            principal.to_hex().as_str()
        ),
    };
    let rel = |p: &Path| -> String {
        let shown = a.dir.join(p.strip_prefix(&dir).unwrap_or(p));
        shown.display().to_string()
    };
    #[allow(clippy::print_stdout)]
    {
        println!("wrote a local setup in {}:", dir.display());
        println!(
            "  {}  the wallet: its key, the signed mandate (per call {PER_CALL}, per day {PER_DAY}, a human above {CONFIRM_ABOVE} USD, {DAYS} days; {} pinned at {origin}), wallet.toml",
            rel(&wallet_dir),
            a.receiver_id
        );
        println!(
            "  {}  the gateway in front of {}: GET /api/* at {PRICE} USD, the rest free",
            rel(&gateway_dir),
            upstream.as_str().trim_end_matches('/')
        );
        println!(
            "  {}  the local ledger: the wallet's account {payer} holds {FUNDING} USD",
            rel(&ledger_path)
        );
        println!("principal {}", principal.public());
        println!("{principal_note}");
        println!("next:");
        println!(
            "  stipendex gateway --config {}",
            rel(&gateway_dir.join("gateway.toml"))
        );
        println!(
            "  stipendex fetch --config {} {origin}/api/hello",
            rel(&wallet_dir.join("wallet.toml"))
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn wallet_toml(principal: &SecretKey, payer: AccountId) -> String {
    format!(
        r#"# The agent's wallet (written by `stipendex init`); relative paths are read beside this file.
[wallet]
key_file = "wallet.key"          # the wallet's Ed25519 secret key: it signs Proofs
mandate = "mandate.jws"          # the principal's signed mandate: limits, the receiver it may pay
principal = "{principal}"   # only mandates this key signed are obeyed
journal = "store"                # one audit chain per payment, in wallet.db (`stipendex verify-chain wallet.db`)
confirm = "refuse"               # above the mandate's threshold: "refuse", or "terminal" to ask

[store]
url = "sqlite://wallet.db"       # spend counters, paid Quotes, revocations

[rails.house]
kind = "ledger"
url = "sqlite://../ledger.db"
payer_account = "{payer}"
"#,
        principal = principal.public()
    )
}

fn gateway_toml(a: &Args, origin: &str, upstream: &str, payee: AccountId) -> String {
    format!(
        r#"# The gateway (written by `stipendex init`); relative paths are read beside this file.
[store]
url = "sqlite://gateway.db"      # Proofs accepted once, paid answers kept for a lost-answer replay

[rails.house]
kind = "ledger"
url = "sqlite://../ledger.db"
payee_account = "{payee}"

[receiver]
id = "{id}"
key_file = "receiver.key"        # or key_env = "VARIABLE" (64 hex digits) in production
origins = ["{origin}"]   # where wallets reach the gateway: Quotes are bound to it

[gateway]
listen = "{listen}"

[upstream]
url = "{upstream}"

# Priced: every GET under /api/. Every other path is forwarded free.
[[price]]
kind = "route"
method = "GET"
pattern = "/api/{{*path}}"
amount = "{PRICE}"
asset = "USD"
"#,
        id = a.receiver_id,
        listen = a.listen,
    )
}
