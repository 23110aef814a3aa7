//! `stipendex ledger account new | fund | balance | history`: the accounts of the embedded
//! double-entry ledger (the `ledger` rail), from the command line.
//!
//! The ledger is named by a configuration file that has a `kind = "ledger"` rail (a wallet's,
//! a gateway's, `serve-mcp`'s or a bare registry; its relative paths are read beside it), or
//! directly by `--ledger URL`. With a configuration, the account defaults to the rail's own
//! (`payer_account` or `payee_account`, when it names exactly one).
//!
//! Money comes into a ledger from one funding account per asset, which may go below zero: its
//! balance is minus what was ever funded. `fund` is idempotent per `--reference` (a deposit's
//! reference): the same reference again does nothing, and with another amount or account it is
//! refused.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Subcommand;
use rail_ledger::{
    Account, AccountId, Created, Ledger, LedgerError, NewAccount, TransferError, TransferId,
    TransferKind, TransferRequest,
};
use sha2::{Digest as _, Sha256};
use stipendex::{Asset, Money};

use crate::{CliError, files, msg};

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Accounts: create, fund, read.
    #[command(subcommand)]
    Account(AccountCommand),
}

/// Where the ledger is.
#[derive(clap::Args, Clone)]
pub(crate) struct At {
    /// A configuration file with a `kind = "ledger"` rail (wallet.toml, gateway.toml, a
    /// registry): its ledger, asset and account.
    #[arg(long, conflicts_with = "ledger")]
    config: Option<PathBuf>,
    /// The ledger rail's name in that file, when it has several.
    #[arg(long, requires = "config")]
    rail: Option<String>,
    /// The ledger's URL without a configuration (`sqlite://ledger.db` or `postgres://…`).
    #[arg(long)]
    ledger: Option<String>,
    /// Its PostgreSQL schema (with --ledger).
    #[arg(long, requires = "ledger")]
    schema: Option<String>,
    /// The asset of its accounts (with --ledger: USD, USDC, ALGO, BTC).
    #[arg(long, requires = "ledger")]
    asset: Option<String>,
    /// The account (32 hex digits; default: the configuration's rail account).
    #[arg(long)]
    account: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum AccountCommand {
    /// Creates an account (no overdraft) and prints its id.
    New {
        #[command(flatten)]
        at: At,
    },
    /// Credits an account with AMOUNT from the asset's funding account, once per --reference.
    Fund {
        /// The amount, a decimal in the ledger's asset (`10.00`).
        amount: String,
        /// The deposit's reference: the same reference again does nothing.
        #[arg(long)]
        reference: String,
        #[command(flatten)]
        at: At,
    },
    /// Prints an account's balance: available and held.
    Balance {
        #[command(flatten)]
        at: At,
    },
    /// Prints the account's last journal entries, newest first.
    History {
        /// How many entries.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        #[command(flatten)]
        at: At,
    },
}

/// A ledger opened from a configuration or a URL, with its asset and default account.
pub(crate) struct Opened {
    pub(crate) ledger: Ledger,
    pub(crate) asset: Asset,
    account: Option<AccountId>,
    what: String,
}

/// Opens the ledger at `url` (`sqlite://…` created if missing, or `postgres://…`).
pub(crate) async fn open_url(url: &str, schema: Option<&str>) -> Result<Ledger, CliError> {
    let opened = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ledger::postgres(url, schema).await
    } else if url.starts_with("sqlite://") {
        Ledger::sqlite(url).await
    } else {
        return Err(msg(format!(
            "{url:?} is not a ledger URL: write sqlite://PATH or postgres://…"
        )));
    };
    opened.map_err(|e| msg(format!("cannot open the ledger at {}: {e}", redact(url))))
}

/// A URL without its password, for messages.
fn redact(url: &str) -> String {
    match (url.split_once("://"), url.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://…@{host}"),
        _ => url.to_owned(),
    }
}

fn asset_of(code: &str, what: &str) -> Result<Asset, CliError> {
    Asset::by_code(code).ok_or_else(|| {
        msg(format!(
            "{what}: asset {code:?} is not one of USD, USDC, ALGO, BTC"
        ))
    })
}

fn account_id(text: &str, what: &str) -> Result<AccountId, CliError> {
    text.trim().to_ascii_lowercase().parse().map_err(|_| {
        msg(format!(
            "{what} {text:?} is not a ledger account: write its 32 hex digits (`stipendex ledger account new` prints one)"
        ))
    })
}

impl At {
    /// Opens the ledger this names.
    async fn open(&self) -> Result<Opened, CliError> {
        let mut opened = match (&self.config, &self.ledger) {
            (Some(path), None) => from_config(path, self.rail.as_deref()).await?,
            (None, Some(url)) => {
                let asset = asset_of(self.asset.as_deref().unwrap_or("USD"), "--asset")?;
                Opened {
                    ledger: open_url(url, self.schema.as_deref()).await?,
                    asset,
                    account: None,
                    what: redact(url),
                }
            }
            _ => {
                return Err(msg(
                    "name the ledger: --config FILE (a wallet, gateway or registry file with a `kind = \"ledger\"` rail) or --ledger sqlite://PATH",
                ));
            }
        };
        if let Some(a) = &self.account {
            opened.account = Some(account_id(a, "--account")?);
        }
        Ok(opened)
    }
}

/// The `kind = "ledger"` rail of the configuration at `path` (named `rail` when it has several).
async fn from_config(path: &Path, rail: Option<&str>) -> Result<Opened, CliError> {
    let text = files::read(path)?;
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| msg(stipendex::registry::toml_error(path, &text, &e)))?;
    let rails = table
        .get("rails")
        .and_then(toml::Value::as_table)
        .cloned()
        .unwrap_or_default();
    let ledgers: Vec<(&String, &toml::Table)> = rails
        .iter()
        .filter_map(|(name, v)| v.as_table().map(|t| (name, t)))
        .filter(|(_, t)| t.get("kind").and_then(toml::Value::as_str) == Some("ledger"))
        .collect();
    let (name, section) = match (rail, ledgers.as_slice()) {
        (Some(r), _) => ledgers
            .iter()
            .find(|(n, _)| n.as_str() == r)
            .copied()
            .ok_or_else(|| {
                msg(format!(
                    "{} has no ledger rail [rails.{r}]: name one of {}",
                    path.display(),
                    names(&ledgers)
                ))
            })?,
        (None, [one]) => *one,
        (None, []) => {
            return Err(msg(format!(
                "{} has no `kind = \"ledger\"` rail: give --ledger sqlite://PATH instead",
                path.display()
            )));
        }
        (None, _) => {
            return Err(msg(format!(
                "{} has several ledger rails ({}): name one with --rail",
                path.display(),
                names(&ledgers)
            )));
        }
    };
    let what = format!("{} [rails.{name}]", path.display());
    let str_of = |key: &str| section.get(key).and_then(toml::Value::as_str);
    let url = match (str_of("url"), str_of("url_env")) {
        (Some(u), _) => u.to_owned(),
        (None, Some(var)) => std::env::var(var).map_err(|_| {
            msg(format!(
                "{what} url_env names {var}, which is not set: export the ledger's URL there"
            ))
        })?,
        (None, None) => return Err(msg(format!("{what} has no url"))),
    };
    // Read beside the file, as the registry reads it.
    let url = stipendex::registry::located(url, path.parent());
    let asset = asset_of(str_of("asset").unwrap_or("USD"), &what)?;
    let account = match (str_of("payer_account"), str_of("payee_account")) {
        (Some(a), None) => Some(account_id(a, &format!("{what} payer_account"))?),
        (None, Some(a)) => Some(account_id(a, &format!("{what} payee_account"))?),
        _ => None,
    };
    Ok(Opened {
        ledger: open_url(&url, str_of("schema")).await?,
        asset,
        account,
        what,
    })
}

fn names(ledgers: &[(&String, &toml::Table)]) -> String {
    ledgers
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// A 128-bit id from a label: the first 16 bytes of its SHA-256, never zero, never reserved.
fn derived(label: &str) -> u128 {
    let digest = Sha256::digest(label.as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(digest.get(..16).unwrap_or(&[0; 16]));
    (u128::from_be_bytes(b) | 1) & !rail_ledger::RESERVED_BIT
}

/// The asset's funding account: where deposits come from (it may go below zero).
pub(crate) fn funding_account(asset: &Asset) -> AccountId {
    AccountId(derived(&format!(
        "stipendex ledger funding {}",
        asset.code()
    )))
}

/// Creates `id` in `asset` (idempotent: the same account again is fine).
pub(crate) async fn create(
    ledger: &Ledger,
    id: AccountId,
    asset: &Asset,
    no_overdraft: bool,
) -> Result<(), CliError> {
    ledger
        .create_account(NewAccount {
            id,
            asset: asset.clone(),
            no_overdraft,
        })
        .await
        .map(|_| ())
        .map_err(|e| match e {
            LedgerError::Refused(TransferError::AccountExistsWithDifferentFields) => msg(format!(
                "account {id} already exists in another asset or with other flags"
            )),
            e => msg(format!("cannot create account {id}: {e}")),
        })
}

/// Credits `account` with `amount` from the funding account, once per `reference`; says
/// whether it was done now (`false`: that reference had funded it before).
pub(crate) async fn fund(
    ledger: &Ledger,
    account: AccountId,
    amount: &Money,
    reference: &str,
) -> Result<bool, CliError> {
    let units = u64::try_from(amount.minor_units()).map_err(|_| {
        msg(format!(
            "{} is more than the ledger holds",
            amount.to_fixed()
        ))
    })?;
    if units == 0 {
        return Err(msg("a funding of 0 moves nothing: give a positive amount"));
    }
    let source = funding_account(amount.asset());
    create(ledger, source, amount.asset(), false).await?;
    let id = TransferId(derived(&format!(
        "stipendex ledger fund {account} {reference}"
    )));
    let request = TransferRequest::Single {
        id,
        debit: source,
        credit: account,
        amount: units,
        user_data: 0,
    };
    match ledger.transfer(request).await {
        Ok(Created::Created(_)) => Ok(true),
        Ok(Created::Exists(_)) => Ok(false),
        Err(LedgerError::Refused(TransferError::ExistsWithDifferentFields)) => Err(msg(format!(
            "reference {reference:?} already funded account {account} with another amount: give another --reference"
        ))),
        Err(LedgerError::Refused(TransferError::CreditAccountNotFound)) => Err(msg(format!(
            "account {account} does not exist: create it with `stipendex ledger account new`"
        ))),
        Err(e) => Err(msg(format!("cannot fund account {account}: {e}"))),
    }
}

/// `units` minor units of `asset` as a decimal (negative allowed: the funding account).
fn decimal(asset: &Asset, units: i128) -> String {
    let sign = if units < 0 { "-" } else { "" };
    let m = Money::from_minor(asset.clone(), units.unsigned_abs());
    match m {
        Ok(m) => format!("{sign}{}", m.to_fixed()),
        Err(_) => format!("{units} minor units"),
    }
}

fn account_line(a: &Account) -> String {
    let held = i128::from(a.debits_pending);
    format!(
        "{}: {} {} available, {} held",
        a.id,
        decimal(&a.asset, a.available()),
        a.asset.code(),
        decimal(&a.asset, held)
    )
}

/// Runs a `ledger` command.
pub(crate) async fn run(c: Command) -> Result<ExitCode, CliError> {
    let Command::Account(c) = c;
    #[allow(clippy::print_stdout)]
    match c {
        AccountCommand::New { at } => {
            let o = at.open().await?;
            let id = match (&at.account, o.account) {
                (Some(_), Some(id)) => id,
                _ => AccountId::random(),
            };
            create(&o.ledger, id, &o.asset, true).await?;
            println!("{id}");
            eprintln!(
                "created account {id} ({}) in {}: fund it with `stipendex ledger account fund AMOUNT --reference REF --account {id} …`",
                o.asset.code(),
                o.what
            );
        }
        AccountCommand::Fund {
            amount,
            reference,
            at,
        } => {
            let o = at.open().await?;
            let account = o.account_or_refuse()?;
            let money = Money::parse(o.asset.clone(), &amount).map_err(|e| {
                msg(format!(
                    "{amount:?} is not an amount of {} ({e}): write a decimal such as 10.00",
                    o.asset.code()
                ))
            })?;
            let done = fund(&o.ledger, account, &money, &reference).await?;
            if done {
                eprintln!(
                    "funded {account} with {} {} (reference {reference})",
                    money.to_fixed(),
                    o.asset.code()
                );
            } else {
                eprintln!("reference {reference} had already funded {account}: nothing done");
            }
            print_balance(&o, account).await?;
        }
        AccountCommand::Balance { at } => {
            let o = at.open().await?;
            let account = o.account_or_refuse()?;
            print_balance(&o, account).await?;
        }
        AccountCommand::History { limit, at } => {
            let o = at.open().await?;
            let account = o.account_or_refuse()?;
            print_balance(&o, account).await?;
            let entries = o
                .ledger
                .history(account, limit)
                .await
                .map_err(|e| msg(format!("cannot read the ledger: {e}")))?;
            for t in entries {
                let (sign, other) = if t.credit == account {
                    ("+", t.debit)
                } else {
                    ("-", t.credit)
                };
                let amount = i128::from(t.amount);
                let kind = match t.kind {
                    TransferKind::Single => "transfer",
                    TransferKind::Pending => "hold",
                    TransferKind::PostPending => "capture",
                    TransferKind::VoidPending => "release",
                    TransferKind::ExpirePending => "expired hold",
                    TransferKind::Reversal => "refund",
                };
                println!(
                    "{}  #{:<6} {kind:<12} {sign}{} {}  {} {other}  transfer {}",
                    t.timestamp.rfc3339(),
                    t.seq,
                    decimal(&o.asset, amount),
                    o.asset.code(),
                    if sign == "+" { "from" } else { "to" },
                    t.id
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn print_balance(o: &Opened, account: AccountId) -> Result<(), CliError> {
    let a = o
        .ledger
        .account(account)
        .await
        .map_err(|e| msg(format!("cannot read the ledger: {e}")))?
        .ok_or_else(|| {
            msg(format!(
                "account {account} does not exist in {}: create it with `stipendex ledger account new`",
                o.what
            ))
        })?;
    #[allow(clippy::print_stdout)]
    {
        println!("{}", account_line(&a));
    }
    Ok(())
}

impl Opened {
    fn account_or_refuse(&self) -> Result<AccountId, CliError> {
        self.account.ok_or_else(|| {
            msg(format!(
                "which account? {} names none (or both a payer and a payee account): give --account ID",
                self.what
            ))
        })
    }
}
