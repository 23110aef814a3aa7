//! `stipendex demo`: a receiver and an agent wallet, end to end, over HTTP.
//!
//! Over the `ledger` rail on an embedded SQLite file (no service needed). The same scenario runs
//! over any rail's localnet from the test runner (`conformance demo --rail NAME`), which builds
//! a [`Stage`] from the rail's harness and calls [`run_stage`]. The receiver `demo-shop` prices
//! four routes; a second receiver, `stranger`, is not in the
//! mandate's allowlist. The wallet makes five calls:
//!
//! 1. a paid search (service profile);
//! 2. a report above the mandate's confirmation threshold: the human (the `--confirm` flag)
//!    answers, and the answer is a signed Confirmation in the chain;
//! 3. a checkout (estimate + tolerance): confirmed, held, captured for the final amount —
//!    where the rail can capture part of a hold;
//! 4. a dataset above the per-call limit: refused, nothing moves;
//! 5. the stranger's search: denied and escalated, nothing moves.
//!
//! Then every saved chain is verified offline (`stipendex verify-chain` does the same).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use axum::Router;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use rail_core::keys::sql::SqliteKeyStore;
use rail_core::{Asset, Money, PayerHandle, ReceiverHandle, SharedClock, SystemClock};
use stipendex::envelope::{Allow, Limits, Mandate, Party, Period, SecretKey, Signed};
use stipendex::http::{Binding, Client, FinalAmount};
use stipendex::ledger::{AccountId, Ledger, NewAccount, TransferId, TransferRequest};
use stipendex::receiver::{PricedCapability, Receiver, TabTerms};
use stipendex::wallet::{Answer, Callback, DirJournal, Wallet};

use crate::{Error as CliError, msg};

/// The demo's prices and limits, in minor units of the rail's asset.
#[derive(Clone, Debug)]
pub struct Prices {
    search: u128,
    report: u128,
    confirm_above: u128,
    per_call: u128,
    dataset: u128,
    order: u128,
    tolerance: u128,
    order_final: u128,
    per_period: u128,
    total: u128,
}

impl Prices {
    /// Dollars for the embedded ledger.
    #[must_use]
    pub fn usd() -> Self {
        Prices {
            search: 5,
            report: 250,
            confirm_above: 100,
            per_call: 500,
            dataset: 1_200,
            order: 300,
            tolerance: 50,
            order_final: 320,
            per_period: 2_000,
            total: 10_000,
        }
    }

    /// Multiples of `b` minor units for any rail (its smallest practical charge); `None` when
    /// a multiple does not fit in `u128` (checked, never wrapped).
    #[must_use]
    pub fn from_base(b: u128) -> Option<Self> {
        let times = |n: u128| b.checked_mul(n);
        Some(Prices {
            search: b,
            report: times(3)?,
            confirm_above: times(2)?,
            per_call: times(4)?,
            dataset: times(5)?,
            order: times(3)?,
            tolerance: b / 2,
            order_final: times(3)?.checked_add(b / 4)?,
            per_period: times(20)?,
            total: times(40)?,
        })
    }

    /// What the paid calls of the demo spend at most, in minor units: what the payer must hold
    /// (`None` if it does not fit in `u128`).
    #[must_use]
    pub fn needed(&self) -> Option<u128> {
        self.search
            .checked_add(self.report)?
            .checked_add(self.order)?
            .checked_add(self.tolerance)?
            .checked_add(self.tab_cap()?)
    }

    /// The cap of the demo's tab: ten searches.
    fn tab_cap(&self) -> Option<u128> {
        self.search.checked_mul(10)
    }
}

/// The rail the demo runs on: both sides, its asset and clock, and how to read balances.
pub struct Stage {
    /// What the demo prints the rail as.
    pub label: String,
    /// The agent's side of the rail.
    pub payer: PayerHandle,
    /// demo-shop's side of the rail.
    pub receiver: ReceiverHandle,
    /// The store the rails' records are in (the registry's `[store]`): a receiver deployed
    /// beside them (`stipendex gateway`, `serve-mcp`) keeps its own records there too.
    pub store: Option<Arc<dyn stipendex::KeyStore>>,
    /// The asset prices are in.
    pub asset: Asset,
    /// The clock both sides use.
    pub clock: SharedClock,
    /// The demo's prices and limits.
    pub prices: Prices,
    /// The parties' money.
    pub balances: Box<dyn ReadBalances>,
}

/// How the demo reads the parties' money on its rail.
#[async_trait::async_trait]
pub trait ReadBalances: Send + Sync {
    /// (what the agent can spend, what the shop received), in minor units.
    async fn read(&self) -> Result<(i128, i128), String>;
    /// Releases what the rail holds (servers, databases) once the demo is over.
    async fn teardown(&self) {}
}

struct LedgerBalances {
    ledger: Ledger,
    agent: AccountId,
    shop: AccountId,
}

#[async_trait::async_trait]
impl ReadBalances for LedgerBalances {
    async fn read(&self) -> Result<(i128, i128), String> {
        let get = |id: AccountId| async move {
            self.ledger
                .account(id)
                .await
                .map_err(|e| format!("cannot read the ledger: {e}"))?
                .ok_or_else(|| "a demo account is missing from the ledger".to_owned())
        };
        let (a, s) = (get(self.agent).await?, get(self.shop).await?);
        let i = i128::from;
        Ok((
            i(a.credits_posted) - i(a.debits_posted) - i(a.debits_pending),
            i(s.credits_posted) - i(s.debits_posted),
        ))
    }
}

/// The ledger rail on an embedded SQLite file in `dir`, the agent funded with `funding` cents.
pub async fn embedded_ledger(dir: &Path, funding: u64) -> Result<Stage, CliError> {
    ledger_stage(dir, funding, None).await
}

/// A PostgreSQL server and a schema of it (which must exist) to hold a bench's records.
pub struct PgSchema<'a> {
    /// The server's URL.
    pub url: &'a str,
    /// The schema.
    pub schema: &'a str,
}

impl PgSchema<'_> {
    /// The URL of this schema: the server's, its connections' `search_path` set to it.
    #[must_use]
    pub fn schema_url(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!(
            "{}{sep}options=-c%20search_path%3D{}",
            self.url, self.schema
        )
    }
}

/// The ledger rail with its ledger and records on embedded SQLite files in `dir`, or in a
/// PostgreSQL schema; the agent funded with `funding` cents.
pub async fn ledger_stage(
    dir: &Path,
    funding: u64,
    pg: Option<&PgSchema<'_>>,
) -> Result<Stage, CliError> {
    // The rails.toml written below names files in `dir`, read beside that file: absolute names.
    let dir = &std::path::absolute(dir)
        .map_err(|e| msg(format!("cannot resolve {}: {e}", dir.display())))?;
    let db = dir.join("ledger.db");
    let (url, where_) = match pg {
        None => (
            format!("sqlite://{}", db.display()),
            format!("embedded SQLite ({})", db.display()),
        ),
        Some(p) => (
            p.url.to_owned(),
            format!("PostgreSQL (schema {})", p.schema),
        ),
    };
    let ledger = match pg {
        None => Ledger::sqlite(&url).await,
        Some(p) => Ledger::postgres(&url, Some(p.schema)).await,
    }
    .map_err(|e| msg(format!("cannot create the ledger on {where_}: {e}")))?;
    let (bank, agent, shop) = (
        AccountId::random(),
        AccountId::random(),
        AccountId::random(),
    );
    for (id, no_overdraft) in [(bank, false), (agent, true), (shop, true)] {
        ledger
            .create_account(NewAccount {
                id,
                asset: Asset::usd(),
                no_overdraft,
            })
            .await
            .map_err(|e| msg(format!("cannot open a ledger account: {e}")))?;
    }
    ledger
        .transfer(TransferRequest::Single {
            id: TransferId::random(),
            debit: bank,
            credit: agent,
            amount: funding,
            user_data: 0,
        })
        .await
        .map_err(|e| msg(format!("cannot fund the agent: {e}")))?;
    // The rails come from a registry configuration, as a wallet's and a receiver's would.
    let (store_url, schema) = match pg {
        None => (
            format!("sqlite://{}", dir.join("records.db").display()),
            String::new(),
        ),
        Some(p) => (p.schema_url(), format!("schema = \"{}\"\n", p.schema)),
    };
    let config = format!(
        "[store]\nurl = \"{store_url}\"\n\n[rails.house]\nkind = \"ledger\"\nurl = \"{url}\"\n{schema}asset = \"USD\"\npayer_account = \"{agent}\"   # the agent pays from it\npayee_account = \"{shop}\"    # demo-shop is paid into it\n"
    );
    crate::files::write(&dir.join("rails.toml"), &config)?;
    let registry = stipendex::Registry::from_file(dir.join("rails.toml")).await?;
    Ok(Stage {
        label: format!("the ledger rail on {where_}"),
        payer: registry.payer("house")?.clone(),
        receiver: registry.receiver("house")?.clone(),
        store: registry.store().cloned(),
        asset: Asset::usd(),
        clock: Arc::new(SystemClock),
        prices: Prices::usd(),
        balances: Box::new(LedgerBalances {
            ledger,
            agent,
            shop,
        }),
    })
}

fn money(asset: &Asset, minor: u128) -> Result<Money, CliError> {
    Money::from_minor(asset.clone(), minor).map_err(|e| msg(format!("a demo price: {e}")))
}

/// `amount` of `asset` with all its decimals (`3.50`).
fn fixed(asset: &Asset, amount: rail_core::Amount) -> String {
    Money::new(asset.clone(), amount).map_or_else(|_| amount.to_string(), |m| m.to_fixed())
}

fn show(m: &Money) -> String {
    format!("{} {}", m.amount(), m.asset())
}

/// A listener on `127.0.0.1:0` and its origin (`http://127.0.0.1:PORT`): a receiver names its
/// origin before it serves.
async fn listen() -> Result<(tokio::net::TcpListener, String), CliError> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| msg(format!("cannot listen on 127.0.0.1: {e}")))?;
    let addr = listener
        .local_addr()
        .map_err(|e| msg(format!("cannot listen on 127.0.0.1: {e}")))?;
    Ok((listener, format!("http://{addr}")))
}

/// Serves `binding`'s routes; with `relay`, also `GET /api/relayed`, a free route that answers
/// with whatever `relay` answers it (another receiver's 402 for this server's own query: the
/// confused deputy the origin binding refuses).
fn serve(
    listener: tokio::net::TcpListener,
    binding: &Binding,
    final_amount: Money,
    relay: Option<String>,
) {
    let mut router = Router::new();
    if let Some(target) = relay {
        router = router.route(
            "/api/relayed",
            get(move || {
                let target = target.clone();
                async move {
                    let Ok(got) = reqwest::get(&target).await else {
                        return axum::http::StatusCode::BAD_GATEWAY.into_response();
                    };
                    let status = axum::http::StatusCode::from_u16(got.status().as_u16())
                        .unwrap_or(axum::http::StatusCode::BAD_GATEWAY);
                    (status, got.bytes().await.unwrap_or_default()).into_response()
                }
            }),
        );
    }
    let app = binding.apply(
        router
            .route("/api/search", get(|| async { "3 results for your query" }))
            .route("/api/report", get(|| async { "the quarterly report" }))
            .route("/api/dataset", get(|| async { "a large dataset" }))
            .route(
                "/api/order",
                post(move || {
                    let m = final_amount.clone();
                    async move {
                        let mut r = "order #42 confirmed".into_response();
                        r.extensions_mut().insert(FinalAmount(m));
                        r
                    }
                }),
            ),
    );
    tokio::spawn(async move {
        // With the peer's address: quotes with costly offers are limited per client.
        let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "demo server stopped");
        }
    });
}

/// The demo's directory, absolute: `dir` (created), or a new temporary one (kept); refused if
/// it already holds a demo. Absolute because the demo writes config files that name files in
/// it, and a config's relative paths are read beside the config.
///
/// # Errors
/// When it cannot be created, or already holds a demo's chains.
pub fn demo_dir(dir: Option<PathBuf>) -> Result<PathBuf, CliError> {
    let dir = match dir {
        Some(d) => {
            std::fs::create_dir_all(&d)
                .map_err(|e| msg(format!("cannot create {}: {e}", d.display())))?;
            std::path::absolute(&d)
                .map_err(|e| msg(format!("cannot resolve {}: {e}", d.display())))?
        }
        None => tempfile::Builder::new()
            .prefix("stipendex-demo-")
            .tempdir()
            .map_err(|e| msg(format!("cannot create a temporary directory: {e}")))?
            .keep(),
    };
    if dir.join("chains").exists() {
        return Err(msg(format!(
            "{} already holds a demo: give another --dir",
            dir.display()
        )));
    }
    Ok(dir)
}

/// Runs the demo's five calls on `stage`, keeping its files in `dir`; the human answers
/// confirmations with `confirm`. Verifies every saved chain and fails when a call did not end
/// as expected.
///
/// # Errors
/// A call that did not end as expected, a broken chain, or the set-up failing.
#[allow(clippy::print_stdout, clippy::too_many_lines)]
pub async fn run_stage(stage: Stage, dir: &Path, confirm: bool) -> Result<ExitCode, CliError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = dir.to_path_buf();
    let (p, a) = (&stage.prices, &stage.asset);
    println!("stipendex demo: {}", stage.label);
    println!("  files in {}", dir.display());

    // The parties and their keys.
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys)
        .map_err(|e| msg(format!("cannot create {}: {e}", keys.display())))?;
    let (principal, wallet_key, shop_key, stranger_key) = (
        SecretKey::generate(),
        SecretKey::generate(),
        SecretKey::generate(),
        SecretKey::generate(),
    );
    for (name, k) in [
        ("principal", &principal),
        ("wallet", &wallet_key),
        ("demo-shop", &shop_key),
    ] {
        crate::files::write_secret(&keys.join(format!("{name}.key")), k)?;
    }

    // Where the receivers will be reached: the mandate pins demo-shop's origins (the second
    // offers tabs).
    let (shop_listener, shop_url) = listen().await?;
    let (stranger_listener, stranger_url) = listen().await?;
    let (tab_listener, tab_url) = listen().await?;
    let caps = stage.receiver.receiver.capabilities();
    let tabs_ok = caps.hold && caps.partial_capture && stage.receiver.hold_receiver.is_some();
    let tab_cap = money(
        a,
        p.tab_cap()
            .ok_or_else(|| msg("the demo's tab cap does not fit"))?,
    )?;

    // The principal's mandate.
    let now = u64::try_from(stage.clock.now().unix_seconds()).unwrap_or(0);
    let mut m = Mandate::draft(
        Party {
            id: "alice".into(),
            key: principal.public(),
        },
        wallet_key.public(),
        now.saturating_sub(60),
        30 * 86_400,
    );
    m.description = Some("research agent: search and reports from demo-shop".into());
    m.limits.push(Limits {
        asset: a.clone(),
        per_call: Some(money(a, p.per_call)?.amount()),
        per_period: Some(Period {
            seconds: 86_400,
            amount: money(a, p.per_period)?.amount(),
        }),
        total: Some(money(a, p.total)?.amount()),
        per_receiver: None,
        confirm_above: Some(money(a, p.confirm_above)?.amount()),
        tab_cap: tabs_ok.then(|| tab_cap.amount()),
        open_tabs: tabs_ok.then_some(1),
    });
    m.allow.push(Allow::Receiver {
        id: "demo-shop".into(),
        key: shop_key.public(),
        origins: vec![shop_url.clone(), tab_url.clone()],
    });
    let mandate = Signed::sign(m, &principal)?;
    crate::files::write(&dir.join("mandate.jws"), &format!("{}\n", mandate.jws()))?;
    println!();
    print!("{}", crate::show::describe(mandate.object()));

    // Two receivers over HTTP: demo-shop (allowlisted) and stranger (not).
    let receiver = |id: &str,
                    key: &SecretKey,
                    origin: &str,
                    tabs: Option<TabTerms>|
     -> Result<Receiver, CliError> {
        let mut b = Receiver::builder(id, key.clone())
            .origin(origin)
            .rail(stage.payer.payer.id().as_str(), stage.receiver.clone())
            .price(
                PricedCapability::fixed("GET", "/api/search", money(a, p.search)?)
                    .describe("one web search"),
            )
            .price(
                PricedCapability::fixed("GET", "/api/report", money(a, p.report)?)
                    .describe("the quarterly report"),
            )
            .price(
                PricedCapability::fixed("GET", "/api/dataset", money(a, p.dataset)?)
                    .describe("the full dataset"),
            )
            .clock(stage.clock.clone());
        let caps = stage.receiver.receiver.capabilities();
        if caps.hold && caps.partial_capture && stage.receiver.hold_receiver.is_some() {
            b = b.price(
                PricedCapability::estimate(
                    "POST",
                    "/api/order",
                    money(a, p.order)?,
                    money(a, p.tolerance)?.amount(),
                )
                .describe("an order, final price known after packing"),
            );
        }
        if let Some(t) = tabs {
            b = b.tabs(t);
        }
        Ok(b.build()?)
    };
    let shop = Binding::new(receiver("demo-shop", &shop_key, &shop_url, None)?)?;
    if tabs_ok {
        serve(
            tab_listener,
            &Binding::new(receiver(
                "demo-shop",
                &shop_key,
                &tab_url,
                Some(TabTerms::new(tab_cap.clone()).lanes(4)),
            )?)?,
            money(a, p.order_final)?,
            None,
        );
    }
    let can_checkout = shop.receiver().descriptor().profiles.len() > 1;
    serve(shop_listener, &shop, money(a, p.order_final)?, None);
    serve(
        stranger_listener,
        &Binding::new(receiver("stranger", &stranger_key, &stranger_url, None)?)?,
        money(a, p.order_final)?,
        Some(format!(
            "{shop_url}/api/search?q=the+stranger%27s+own+query"
        )),
    );
    println!(
        "  receiver demo-shop at {shop_url} (key {})",
        shop_key.public()
    );
    println!("  receiver stranger  at {stranger_url} (not in the allowlist)");

    // The agent's wallet: durable spend records in SQLite, chains in files.
    let confirmer = Callback::new(move |ask| {
        let yes = confirm;
        // The receiver's description is on a line of its own (`Ask::text`): indented here.
        println!(
            "     human asked: {} -> {} (flag --confirm)",
            ask.text().replace('\n', "\n                  "),
            if yes { "yes" } else { "no" }
        );
        if yes {
            Answer::Yes { by: "flag".into() }
        } else {
            Answer::No {
                why: "the human said no (--confirm no)".into(),
            }
        }
    })
    .on_denial(|d| {
        println!(
            "     escalated to the principal: {}",
            stipendex::wallet::printable(&d.why)
        );
    });
    let store = SqliteKeyStore::open(&dir.join("wallet.db"))
        .await
        .map_err(|e| msg(format!("cannot open the wallet's store: {e}")))?
        .with_clock(stage.clock.clone());
    let chains = dir.join("chains");
    let wallet = Wallet::builder(wallet_key, mandate.clone())
        .rail(stage.payer.payer.id().as_str(), stage.payer.clone())
        .store(Arc::new(store))
        .confirmer(Arc::new(confirmer))
        .journal(Arc::new(DirJournal::new(&chains)?))
        .clock(stage.clock.clone())
        .principal(principal.public())
        .build()?;
    let client = Client::new(
        stipendex::http::reqwest_builder(std::time::Duration::from_secs(60)),
        wallet,
    )?;

    let before = stage.balances.read().await.map_err(msg)?;
    println!();
    println!("the agent calls (the wallet decides, the agent only sees results):");
    // Each call and the outcome the demo expects of it ("paid" or an error code).
    let confirmed = if confirm { "paid" } else { "not_confirmed" };
    let calls: Vec<(&str, String, bool, String, &str)> = vec![
        (
            "GET",
            format!("{shop_url}/api/search?q=stablecoins"),
            true,
            format!("{} search", show(&money(a, p.search)?)),
            "paid",
        ),
        (
            "GET",
            format!("{shop_url}/api/report"),
            true,
            format!(
                "{} report, above the {} threshold",
                show(&money(a, p.report)?),
                show(&money(a, p.confirm_above)?)
            ),
            confirmed,
        ),
        (
            "POST",
            format!("{shop_url}/api/order"),
            can_checkout,
            format!(
                "checkout, estimate {} + {}",
                show(&money(a, p.order)?),
                show(&money(a, p.tolerance)?)
            ),
            confirmed,
        ),
        (
            "GET",
            format!("{shop_url}/api/dataset"),
            true,
            format!(
                "{} dataset, above the {} per-call limit",
                show(&money(a, p.dataset)?),
                show(&money(a, p.per_call)?)
            ),
            "limit_exceeded",
        ),
        (
            "GET",
            format!("{stranger_url}/api/search?q=stablecoins"),
            true,
            "the stranger's search".into(),
            "denied",
        ),
        (
            "GET",
            format!("{stranger_url}/api/relayed"),
            true,
            "the stranger relays demo-shop's quote for its own query".into(),
            "denied",
        ),
    ];
    let mut unexpected = Vec::new();
    for (i, (method, url, run, what, expect)) in calls.into_iter().enumerate() {
        let path = url.split_once("/api").map_or(url.as_str(), |(_, r)| r);
        println!("  {}. {method} /api{path}  ({what})", i + 1);
        if !run {
            println!("     skipped: this rail cannot capture part of a hold (checkout needs it)");
            continue;
        }
        let out = match method {
            "POST" => client.post(&url).await,
            _ => client.get(&url).await,
        };
        let got = match &out {
            Ok(r) if r.receipt.is_some() => "paid".to_owned(),
            Ok(r) => format!("status {}", r.status.as_u16()),
            Err(e) => e.code().to_owned(),
        };
        if got != expect {
            unexpected.push(format!("call {} ended {got}, expected {expect}", i + 1));
        }
        match out {
            Ok(r) => {
                let body = String::from_utf8_lossy(&r.body);
                match (&r.paid, &r.receipt) {
                    // A checkout: what was held, and what of it was captured.
                    (Some(paid), Some(receipt))
                        if paid.proof.object().mode == rail_core::PaymentMode::Hold =>
                    {
                        let (proof, receipt) = (paid.proof.object(), receipt.object());
                        println!(
                            "     held {}, captured {} {} over {} -> {} {:?}; receipt {}",
                            fixed(&proof.asset, proof.amount),
                            fixed(&receipt.asset, receipt.amount),
                            receipt.asset,
                            paid.rail,
                            r.status.as_u16(),
                            body,
                            receipt.id
                        );
                    }
                    (Some(paid), Some(receipt)) => println!(
                        "     paid {} {} over {} -> {} {:?}; receipt {} for {} {}",
                        paid.proof.object().amount,
                        paid.proof.object().asset,
                        paid.rail,
                        r.status.as_u16(),
                        body,
                        receipt.object().id,
                        receipt.object().amount,
                        receipt.object().asset
                    ),
                    _ => println!("     {} {:?}", r.status.as_u16(), body),
                }
            }
            Err(e) => println!("     REFUSED ({}): {e}", e.code()),
        }
    }
    // A tab: one hold, many calls, one capture.
    if tabs_ok {
        println!(
            "  7. GET /api/search x5 at {tab_url}  (a tab of up to {}: one hold, five calls paid by vouchers, one capture)",
            show(&tab_cap)
        );
        for i in 0..5 {
            match client.get(&format!("{tab_url}/api/search?q=tab+{i}")).await {
                Ok(r) if r.tab_call.is_some() => {}
                Ok(r) => unexpected.push(format!(
                    "tab call {} was not paid in the tab (HTTP {})",
                    i + 1,
                    r.status.as_u16()
                )),
                Err(e) => unexpected.push(format!("tab call {} ended {}", i + 1, e.code())),
            }
        }
        match Box::pin(client.close_tabs()).await {
            Ok(receipts) => {
                for r in &receipts {
                    println!("     {}", crate::show::tab_line(r.object()));
                }
                if receipts.len() != 1 {
                    unexpected.push(format!("{} tabs closed, expected 1", receipts.len()));
                }
            }
            Err(e) => unexpected.push(format!("the tab did not close: {e}")),
        }
    } else {
        println!(
            "  7. a tab  (skipped: this rail cannot capture part of a hold, which a tab needs)"
        );
    }
    let after = stage.balances.read().await.map_err(msg)?;
    let minor = |v: i128| {
        Money::from_minor(a.clone(), v.unsigned_abs())
            .ok()
            .map_or_else(
                || v.to_string(),
                |m| format!("{}{}", if v < 0 { "-" } else { "" }, show(&m)),
            )
    };
    println!();
    println!(
        "money: the agent spent {}, demo-shop received {}, the stranger nothing",
        minor(before.0 - after.0),
        minor(after.1 - before.1)
    );

    // The audit: every chain, verified offline against the principal's key.
    println!();
    println!(
        "audit chains (stipendex verify-chain --principal-pubkey {} {}/*.jws):",
        principal.public(),
        chains.display()
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(&chains)
        .map_err(|e| msg(format!("cannot read {}: {e}", chains.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jws"))
        .collect();
    files.sort();
    let verified = crate::verify::run(Some(&principal.public().to_string()), &[], &files).await;
    stage.balances.teardown().await;
    let code = verified?;
    if !unexpected.is_empty() {
        return Err(msg(format!(
            "the demo did not go as expected: {}",
            unexpected.join("; ")
        )));
    }
    Ok(code)
}
