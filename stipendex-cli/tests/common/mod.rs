//! Shared by the CLI's tests: a ledger on SQLite with a bank, a funded agent and a shop.

#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

use std::path::Path;

use rail_ledger::{AccountId, Ledger, NewAccount, TransferId, TransferRequest};
use stipendex::Asset;
use stipendex::envelope::{Allow, Limits, Mandate, SecretKey, Signed};
use stipendex_test_kit as kit;

/// The ledger at `dir/ledger.db`, its URL, the agent's account (funded with `cents`) and the
/// shop's.
pub async fn funded_ledger(dir: &Path, cents: u64) -> (Ledger, String, AccountId, AccountId) {
    let url = format!("sqlite://{}", dir.join("ledger.db").display());
    let ledger = Ledger::sqlite(&url).await.unwrap();
    let (agent, shop) = fund(&ledger, cents).await;
    (ledger, url, agent, shop)
}

/// In `ledger` (any backend): a bank, an agent funded with `cents` and a shop; the agent's and
/// the shop's accounts.
pub async fn fund(ledger: &Ledger, cents: u64) -> (AccountId, AccountId) {
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
            .unwrap();
    }
    ledger
        .transfer(TransferRequest::Single {
            id: TransferId::random(),
            debit: bank,
            credit: agent,
            amount: cents,
            user_data: 0,
        })
        .await
        .unwrap();
    (agent, shop)
}

/// Seconds since the Unix epoch, now.
pub fn now() -> u64 {
    kit::now()
}

/// A fresh principal's key and a fresh wallet key, the latter written to `dir/wallet.key`.
pub fn wallet_keys(dir: &Path) -> (SecretKey, SecretKey) {
    let (principal, wallet_key) = (SecretKey::generate(), SecretKey::generate());
    std::fs::write(dir.join("wallet.key"), wallet_key.to_hex().as_str()).unwrap();
    (principal, wallet_key)
}

/// A mandate from `principal` (as "alice") to `wallet`, valid from a minute ago for a day.
pub fn draft(principal: &SecretKey, wallet: &SecretKey) -> Mandate {
    kit::mandate(principal, wallet.public())
        .from(now() - 60)
        .draft()
}

/// Limits in `asset`: `per_call` a call, `total` in all (if any), nothing else.
pub fn limits_in(asset: Asset, per_call: &str, total: Option<&str>) -> Limits {
    kit::limits(asset, per_call, total)
}

/// Limits in USD: `per_call` a call, `total` in all.
pub fn limits(per_call: &str, total: &str) -> Limits {
    kit::limits(Asset::usd(), per_call, total)
}

/// The receiver "shop" of `key`, pinned at `origin`.
pub fn allow_shop(key: &SecretKey, origin: &str) -> Allow {
    kit::receiver("shop", key.public(), vec![origin.to_owned()])
}

/// `m` signed by `principal`, written to `dir/file`.
pub fn sign_to(dir: &Path, file: &str, m: Mandate, principal: &SecretKey) -> Signed<Mandate> {
    let signed = kit::sign(m, principal);
    std::fs::write(dir.join(file), signed.jws()).unwrap();
    signed
}

/// A wallet's `wallet.toml`: its key `wallet.key`, the mandate `mandate`, `extra` lines in
/// `[wallet]`, its store at `store`, then `rail` (if any, after a blank line).
pub fn wallet_toml(
    mandate: &str,
    principal: &SecretKey,
    extra: &str,
    store: &str,
    rail: &str,
) -> String {
    let mut toml = format!(
        "[wallet]\nkey_file = \"wallet.key\"\nmandate = \"{mandate}\"\nprincipal = \"{}\"\n{extra}\n[store]\nurl = \"{store}\"\n",
        principal.public()
    );
    if !rail.is_empty() {
        toml.push('\n');
        toml.push_str(rail);
    }
    toml
}

/// The wallet's files in `dir`: a fresh key, a fresh principal's mandate (`limits`, `allow`) in
/// `mandate.jws`, and `wallet.toml` ([`wallet_toml`] with `extra`, `store`, `rail`): the
/// principal and the mandate.
pub fn write_wallet(
    dir: &Path,
    limits: Limits,
    allow: Vec<Allow>,
    extra: &str,
    store: &str,
    rail: &str,
) -> (SecretKey, Signed<Mandate>) {
    let (principal, wallet_key) = wallet_keys(dir);
    let mut m = draft(&principal, &wallet_key);
    m.limits.push(limits);
    m.allow.extend(allow);
    let mandate = sign_to(dir, "mandate.jws", m, &principal);
    std::fs::write(
        dir.join("wallet.toml"),
        wallet_toml("mandate.jws", &principal, extra, store, rail),
    )
    .unwrap();
    (principal, mandate)
}

/// A receiving registry's TOML: its store at `sqlite://STORE`, the `house` ledger rail at
/// `ledger_url` paying into `shop`.
pub fn payee_rails(store: &Path, ledger_url: &str, shop: AccountId) -> String {
    format!(
        "[store]\nurl = \"sqlite://{}\"\n[rails.house]\nkind = \"ledger\"\nurl = \"{ledger_url}\"\npayee_account = \"{shop}\"\n",
        store.display()
    )
}

/// The wallet's `house` ledger rail at `ledger_url`, paying from `agent`.
pub fn payer_rail(ledger_url: &str, agent: AccountId) -> String {
    format!(
        "[rails.house]\nkind = \"ledger\"\nurl = \"{ledger_url}\"\npayer_account = \"{agent}\"\n"
    )
}

/// How many `.jws` files `dir` holds (none if it does not exist).
pub fn count_jws(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter(|e| {
                e.as_ref()
                    .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "jws"))
            })
            .count()
        })
        .unwrap_or(0)
}
