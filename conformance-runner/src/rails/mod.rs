//! The rails the suite knows. A new rail adds its harness module here and its entry to [`all`].

pub mod account;
pub mod exact_algo;
pub mod exact_avm;
pub mod ledger;
pub mod ln_nwc;
pub mod pg;
pub mod stripe;
pub mod x402;
mod x402_checks;

use stipendex_conformance::StipendexEntry;

/// Every rail under test.
#[must_use]
pub fn all() -> Vec<StipendexEntry> {
    vec![
        ledger::ENTRY,
        account::ENTRY,
        exact_algo::ENTRY,
        exact_avm::ENTRY,
        stripe::ENTRY,
        ln_nwc::ENTRY,
        x402::ENTRY,
    ]
}

/// The rail named `name`.
#[must_use]
pub fn find(name: &str) -> Option<StipendexEntry> {
    all().into_iter().find(|e| e.name == name)
}
