//! `stipendex facilitator`: run the hosted facilitator, and the operator's commands (accounts,
//! funding, the review queue), which work on the facilitator's database directly.
//!
//! ```text
//! stipendex facilitator serve --db URL --network NAME [--listen ADDR] [--instance NAME]
//! stipendex facilitator account new --db URL --account-pubkey ed25519:… [--asset USD] [--review-above 10.00] [--label L] [--id HEX]
//! stipendex facilitator account fund --db URL ID AMOUNT --reference REF
//! stipendex facilitator account show --db URL ID
//! stipendex facilitator account list --db URL
//! stipendex facilitator review list --db URL [--all]
//! stipendex facilitator review approve --db URL PAYMENT [--by NAME] [--note TEXT]
//! stipendex facilitator review reject --db URL PAYMENT [--by NAME] [--note TEXT]
//! stipendex facilitator bench [--backend sqlite|postgres] [--clients 20] [--seconds 10]
//! ```
//!
//! `--db` may come from `STIPENDEX_FACILITATOR_DB` (a PostgreSQL URL with a password belongs
//! in the environment, not on a command line).

#![allow(clippy::print_stdout)] // a command's output

mod bench;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use rail_account::AccountPublicKey;
use stipendex::{Asset, Money};
use stipendex_facilitator::store::{ReviewRecord, ReviewState};
use stipendex_facilitator::{Config, Facilitator, NewAccount};

use crate::{CliError, msg};

/// Where the facilitator's data is.
#[derive(Args, Clone)]
pub(crate) struct Db {
    /// `sqlite://PATH` (one instance) or `postgres://…` (several instances).
    #[arg(long, env = "STIPENDEX_FACILITATOR_DB", hide_env_values = true)]
    db: String,
    /// PostgreSQL schema holding this facilitator's tables (created if missing).
    #[arg(long, env = "STIPENDEX_FACILITATOR_SCHEMA")]
    schema: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Serves the facilitator's HTTP API until interrupted (Ctrl-C or SIGTERM finish the
    /// requests in flight first).
    Serve {
        #[command(flatten)]
        db: Db,
        /// The facilitator's network name: every instance on one database uses the same, and
        /// its accounts' offers carry it.
        #[arg(long, env = "STIPENDEX_FACILITATOR_NETWORK")]
        network: String,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:8402")]
        listen: SocketAddr,
        /// This instance's name in logs and metrics.
        #[arg(long)]
        instance: Option<String>,
        /// Log as JSON lines (default: text).
        #[arg(long)]
        log_json: bool,
    },
    /// Accounts.
    #[command(subcommand)]
    Account(AccountCommand),
    /// The review queue: payments above their payer's threshold wait for a decision.
    #[command(subcommand)]
    Review(ReviewCommand),
    /// Measures paid payments per second through the facilitator (p50/p99) beside the
    /// embedded ledger rail on the same database, and the cost of request signing.
    Bench(bench::BenchArgs),
}

#[derive(Subcommand)]
pub(crate) enum AccountCommand {
    /// Opens an account for the holder of `--account-pubkey` (the public key printed by
    /// `stipendex key new`); prints its id.
    New {
        #[command(flatten)]
        db: Db,
        /// The public key that signs the account's requests (`ed25519:…`, as `stipendex key
        /// new` prints it).
        #[arg(long = "account-pubkey", alias = "key", value_name = "ed25519:KEY")]
        key: String,
        /// The asset it holds: USD, USDC, ALGO or BTC.
        #[arg(long, default_value = "USD")]
        asset: String,
        /// Payments above this amount wait for an operator's review.
        #[arg(long)]
        review_above: Option<String>,
        /// A name for operators.
        #[arg(long, default_value = "")]
        label: String,
        /// Its id (32 hex digits); random by default. An existing id gets the new key,
        /// threshold and label.
        #[arg(long)]
        id: Option<String>,
    },
    /// Credits an account from the treasury, once per reference.
    Fund {
        #[command(flatten)]
        db: Db,
        /// The account.
        id: String,
        /// How much, in the account's asset (`25.00`).
        amount: String,
        /// The deposit's reference (a bank transfer id, a ticket): the same reference again
        /// credits nothing more.
        #[arg(long)]
        reference: String,
    },
    /// Shows an account's balances and settings.
    Show {
        #[command(flatten)]
        db: Db,
        /// The account.
        id: String,
    },
    /// Lists the accounts.
    List {
        #[command(flatten)]
        db: Db,
    },
}

#[derive(Subcommand)]
pub(crate) enum ReviewCommand {
    /// Lists the payments waiting for a decision (every decision with `--all`).
    List {
        #[command(flatten)]
        db: Db,
        /// Decided ones too.
        #[arg(long)]
        all: bool,
    },
    /// Approves a payment: a payment is paid to its payee, a hold becomes verifiable.
    Approve(Decision),
    /// Rejects a payment: the held funds go back to the payer (told it was declined in review).
    Reject(Decision),
}

/// One decision on one payment in review.
#[derive(Args)]
pub(crate) struct Decision {
    #[command(flatten)]
    db: Db,
    /// The payment id (from `review list`).
    payment: String,
    /// Who decides (recorded).
    #[arg(long, env = "USER", default_value = "operator")]
    by: String,
    /// Why (recorded).
    #[arg(long)]
    note: Option<String>,
}

impl Command {
    /// Whether this command serves (logs at `info`, per request).
    pub(crate) fn serving(&self) -> Option<bool> {
        match self {
            Command::Serve { log_json, .. } => Some(*log_json),
            _ => None,
        }
    }
}

async fn open(db: &Db, network: &str, instance: Option<&str>) -> Result<Facilitator, CliError> {
    let mut config = Config::new(network);
    if let Some(i) = instance {
        config = config.with_instance(i);
    }
    stipendex_facilitator::open(&db.db, db.schema.as_deref(), config, None)
        .await
        .map_err(|e| msg(format!("cannot open the facilitator's database: {e}")))
}

/// Operator commands do not serve: any network name opens the database.
async fn operate(db: &Db) -> Result<Facilitator, CliError> {
    open(db, "operator", Some("operator")).await
}

fn asset(code: &str) -> Result<Asset, CliError> {
    Asset::by_code(code).ok_or_else(|| {
        msg(format!(
            "--asset {code:?} is not one of USD, USDC, ALGO, BTC"
        ))
    })
}

fn account_id(text: &str) -> Result<rail_ledger::AccountId, CliError> {
    text.parse().map_err(|_| {
        msg(format!(
            "{text:?} is not an account id: an id is 32 lowercase hex digits"
        ))
    })
}

fn refused(what: &str, e: impl std::fmt::Display) -> CliError {
    msg(format!("{what}: {e}"))
}

pub(crate) async fn run(cmd: Command) -> Result<ExitCode, CliError> {
    match cmd {
        Command::Serve {
            db,
            network,
            listen,
            instance,
            log_json: _,
        } => serve(&db, &network, listen, instance.as_deref()).await,
        Command::Account(c) => account(c).await,
        Command::Review(c) => review(c).await,
        Command::Bench(a) => bench::run(a).await,
    }
}

async fn serve(
    db: &Db,
    network: &str,
    listen: SocketAddr,
    instance: Option<&str>,
) -> Result<ExitCode, CliError> {
    let fac = open(db, network, instance).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| msg(format!("cannot listen on {listen}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| msg(format!("cannot listen on {listen}: {e}")))?;
    tracing::info!(
        network,
        instance = %fac.config().instance,
        backend = fac.pool().backend(),
        listen = %bound,
        "facilitator serving"
    );
    println!(
        "stipendex facilitator {} serving on http://{bound}",
        fac.config().instance
    );
    stipendex_facilitator::serve(listener, fac, shutdown())
        .await
        .map_err(|e| msg(format!("the server stopped: {e}")))?;
    Ok(ExitCode::SUCCESS)
}

/// Ctrl-C or SIGTERM.
async fn shutdown() {
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            () = term => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutting down: finishing the requests in flight");
}

async fn account(cmd: AccountCommand) -> Result<ExitCode, CliError> {
    match cmd {
        AccountCommand::New {
            db,
            key,
            asset: code,
            review_above,
            label,
            id,
        } => {
            let key = AccountPublicKey::parse(&key).map_err(|e| {
                msg(format!("--account-pubkey is not a public key ({e}): give the ed25519:… line `stipendex key new` printed"))
            })?;
            let asset = asset(&code)?;
            let review_above = review_above
                .map(|v| {
                    Money::parse(asset.clone(), &v).map_err(|e| {
                        msg(format!(
                            "--review-above {v:?} is not an amount of {asset}: {e}"
                        ))
                    })
                })
                .transpose()?;
            let id = id.as_deref().map(account_id).transpose()?;
            let fac = operate(&db).await?;
            let record = fac
                .create_account(NewAccount {
                    id,
                    key,
                    asset,
                    review_above,
                    label,
                })
                .await
                .map_err(|e| refused("the account was not opened", e))?;
            println!("{}", record.id);
        }
        AccountCommand::Fund {
            db,
            id,
            amount,
            reference,
        } => {
            let id = account_id(&id)?;
            let fac = operate(&db).await?;
            let account = fac
                .ledger()
                .account(id)
                .await
                .map_err(|e| refused("cannot read the account", e))?
                .ok_or_else(|| msg(format!("account {id} does not exist: open it with `stipendex facilitator account new`")))?;
            let money = Money::parse(account.asset.clone(), &amount).map_err(|e| {
                msg(format!(
                    "{amount:?} is not an amount of {}: {e}",
                    account.asset
                ))
            })?;
            let created = fac
                .fund(id, &money, &reference)
                .await
                .map_err(|e| refused("the account was not funded", e))?;
            let verb = match created {
                rail_ledger::Created::Created(_) => "credited",
                rail_ledger::Created::Exists(_) => "was already credited by this reference:",
            };
            println!("{id} {verb} {money}");
        }
        AccountCommand::Show { db, id } => {
            let id = account_id(&id)?;
            let fac = operate(&db).await?;
            let view = fac
                .account_view(id)
                .await
                .map_err(|e| refused(&format!("account {id}"), e))?;
            println!(
                "{}",
                serde_json::to_string_pretty(&view).map_err(|e| msg(e.to_string()))?
            );
        }
        AccountCommand::List { db } => {
            let fac = operate(&db).await?;
            let accounts = fac
                .pool()
                .accounts()
                .await
                .map_err(|e| refused("cannot list the accounts", e))?;
            for a in accounts {
                let review = a
                    .review_above
                    .map_or_else(|| "-".to_owned(), |v| v.to_string());
                println!(
                    "{}  review above {review}  {}  {}",
                    a.id, a.public_key, a.label
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn line(r: &ReviewRecord) -> String {
    let amount = asset(&r.asset)
        .ok()
        .and_then(|a| Money::from_minor(a, u128::try_from(r.amount).ok()?).ok())
        .map_or_else(
            || format!("{} minor units of {}", r.amount, r.asset),
            |m| m.to_string(),
        );
    let decided = match (&r.decided_by, &r.note) {
        (Some(by), Some(note)) => format!("  by {by}: {note}"),
        (Some(by), None) => format!("  by {by}"),
        _ => String::new(),
    };
    format!(
        "{}  {:<8}  {} {} → {}  {}  offer {}  ({}){decided}",
        r.payment_id,
        r.state.as_str(),
        r.mode,
        amount,
        r.payee,
        r.payer,
        r.offer_id,
        r.reason
    )
}

async fn review(cmd: ReviewCommand) -> Result<ExitCode, CliError> {
    match cmd {
        ReviewCommand::List { db, all } => {
            let fac = operate(&db).await?;
            let state = if all {
                None
            } else {
                Some(ReviewState::Pending)
            };
            let queue = fac
                .reviews(state, 1000)
                .await
                .map_err(|e| refused("cannot read the review queue", e))?;
            if queue.is_empty() {
                println!("no payment waits for review");
            }
            for r in &queue {
                println!("{}", line(r));
            }
        }
        ReviewCommand::Approve(d) => decide(d, true).await?,
        ReviewCommand::Reject(d) => decide(d, false).await?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Approves (`approve`) or rejects one payment in review; prints the review.
async fn decide(d: Decision, approve: bool) -> Result<(), CliError> {
    let fac = operate(&d.db).await?;
    let (done, verb) = if approve {
        (
            fac.approve(&d.payment, &d.by, d.note.as_deref()).await,
            "approved",
        )
    } else {
        (
            fac.reject(&d.payment, &d.by, d.note.as_deref()).await,
            "rejected",
        )
    };
    let r = done.map_err(|e| refused(&format!("payment {} was not {verb}", d.payment), e))?;
    println!("{}", line(&r));
    Ok(())
}
