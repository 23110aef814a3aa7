//! Shared by the CLI's tests: a ledger on SQLite with a bank, a funded agent and a shop.

#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

use std::path::Path;

use rail_ledger::{AccountId, Ledger, NewAccount, TransferId, TransferRequest};
use stipendex::Asset;

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
