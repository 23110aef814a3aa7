//! The wallet's configuration file, read by every command that pays (`fetch`, `proxy`, `wallet
//! pending | resume`): the registry's TOML (`[store]`, `[rails.*]`) plus `[wallet]`.
//!
//! ```toml
//! [wallet]
//! key_file = "keys/wallet.key"   # or key_env = "STIPENDEX_WALLET_KEY" (64 hex digits)
//! mandate = "mandate.jws"        # signed by the principal (`stipendex mandate sign`)
//! principal = "ed25519:…"        # required: the key whose mandates this wallet obeys
//! journal = "store"              # chains in the [store]'s SQLite file or PostgreSQL database
//!                                # (what `stipendex init` writes); a folder ("chains", the
//!                                # default when unset), or `false`: no audit trail
//! confirm = "refuse"             # or "terminal": ask on the terminal above the threshold
//!
//! [store]
//! url = "sqlite://wallet.db"     # the spend counters, paid Quotes and revocations
//! ```
//!
//! Every relative path — the key, the mandate, the journal, a `sqlite://` store or ledger — is
//! read beside this file, never from the directory the command runs in. A revocation written
//! beside the mandate (`stipendex mandate revoke` writes `<mandate>.revocation.jws`) is honoured
//! whichever store is open. At start the store and the journal are checked to belong together
//! ([`stipendex::wallet::Wallet::check_records`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use stipendex::Registry;
use stipendex::envelope::{Mandate, PublicKey, Revocation, Signed};
use stipendex::wallet::{
    Confirmer, DirJournal, PgJournal, Refuse, SqliteJournal, Terminal, Wallet,
};

use crate::{CliError, files, msg};

/// `[wallet] confirm`: who answers above the confirmation threshold.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Confirm {
    /// Nobody: every payment above the threshold is refused.
    #[default]
    Refuse,
    /// The human at the terminal.
    Terminal,
}

/// `[wallet] journal`: `"store"` (the `[store]`'s SQLite file or PostgreSQL database), a
/// folder, `true` (the default folder), or `false` (no audit trail).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum JournalKey {
    On(bool),
    Dir(PathBuf),
}

/// The value of `[wallet] journal` that keeps the chains in the store (a folder of that name is
/// written `"./store"`).
pub(crate) const IN_STORE: &str = "store";

/// Where a wallet's journal is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JournalAt {
    /// Chain files in a folder.
    Dir(PathBuf),
    /// Tables of the store's SQLite file.
    Store(PathBuf),
    /// Tables of the store's PostgreSQL database.
    Postgres,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WalletSection {
    key_file: Option<PathBuf>,
    key_env: Option<String>,
    mandate: PathBuf,
    principal: Option<String>,
    journal: Option<JournalKey>,
    #[serde(default)]
    confirm: Confirm,
}

#[derive(Debug, Deserialize)]
struct File {
    wallet: Option<WalletSection>,
}

/// The journal's folder when `[wallet] journal` is not set.
pub(crate) const DEFAULT_JOURNAL: &str = "chains";

/// A wallet as its configuration describes it.
pub(crate) struct Loaded {
    /// The wallet.
    pub(crate) wallet: Wallet,
    /// Its journal; `None` when the configuration turned the journal off.
    pub(crate) journal: Option<JournalAt>,
}

impl Loaded {
    /// What every payment's summary says when no audit trail is kept.
    pub(crate) fn journal_note(&self) -> &'static str {
        if self.journal.is_none() {
            " (no audit journal: [wallet] journal = false)"
        } else {
            ""
        }
    }
}

/// Reads the wallet's configuration at `path` and builds its wallet.
///
/// # Errors
/// One sentence naming what is wrong and how to fix it: a file that does not read, a
/// `[wallet]` without `principal`, a mandate that does not verify or is another principal's,
/// a store and a journal that do not belong together.
pub(crate) async fn load(path: &Path) -> Result<Loaded, CliError> {
    let text = files::read(path)?;
    let file: File =
        toml::from_str(&text).map_err(|e| msg(stipendex::registry::toml_error(path, &text, &e)))?;
    let w = file.wallet.ok_or_else(|| {
        msg(format!(
            "{} has no [wallet] section: add one with the wallet's key_file, mandate and principal",
            path.display()
        ))
    })?;
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
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
    let Some(principal) = &w.principal else {
        return Err(msg(format!(
            "{}: [wallet] principal is not set, so a mandate signed by anyone would pay: add principal = \"KEY\", the public key of the principal whose authority this wallet holds (the mandate at hand is signed by {}: set it only if that is your principal's)",
            path.display(),
            mandate.object().principal.key
        )));
    };
    let principal = PublicKey::parse(principal).map_err(|_| {
        msg(format!(
            "{}: [wallet] principal {principal:?} is not a public key: write ed25519:<base64url>, as `stipendex key new` prints it",
            path.display()
        ))
    })?;
    // The spend counters must outlive the process: without a lasting store every run would
    // count the mandate's limits from zero (and the journal's first payment would make the
    // next run refuse the store as a stranger).
    let store_url = toml::from_str::<toml::Table>(&text)
        .ok()
        .and_then(|t| t.get("store").and_then(toml::Value::as_table).cloned())
        .map(|s| {
            (
                s.get("url")
                    .and_then(toml::Value::as_str)
                    .map(str::to_owned),
                s.contains_key("url_env"),
            )
        });
    match store_url {
        None => {
            return Err(msg(format!(
                "{} has no [store], so the wallet's spend counters would start from zero on every run: add [store] with url = \"sqlite://wallet.db\" (or a postgres:// URL)",
                path.display()
            )));
        }
        Some((Some(u), false)) if u == "memory" => {
            return Err(msg(format!(
                "{}: [store] url = \"memory\" forgets the wallet's spend counters when the process ends, so its limits would restart on every run: use url = \"sqlite://wallet.db\" (or a postgres:// URL)",
                path.display()
            )));
        }
        Some(_) => {}
    }
    let in_store = matches!(&w.journal, Some(JournalKey::Dir(d)) if d.as_os_str() == IN_STORE);
    let not_a_database = || {
        msg(format!(
            "{}: [wallet] journal = \"store\" keeps the chains in the [store]'s SQLite file or PostgreSQL database, and this [store] is neither: use url = \"sqlite://wallet.db\" (or a postgres:// URL), or journal = \"chains\" (a folder)",
            path.display()
        ))
    };
    let registry = Registry::from_file(path).await?;
    let store: Arc<dyn rail_core::KeyStore> = registry.store().cloned().ok_or_else(|| {
        msg(format!(
            "{} has no [store]: add [store] with url = \"sqlite://wallet.db\"",
            path.display()
        ))
    })?;
    let confirmer: Arc<dyn Confirmer> = match w.confirm {
        Confirm::Refuse => Arc::new(Refuse),
        Confirm::Terminal => Arc::new(Terminal),
    };
    let journal = match w.journal {
        None | Some(JournalKey::On(true)) => Some(JournalAt::Dir(at(Path::new(DEFAULT_JOURNAL)))),
        Some(JournalKey::On(false)) => None,
        Some(JournalKey::Dir(_)) if in_store => {
            // `url_env` is known only now.
            match (registry.store_file(), registry.store_pool()) {
                (Some(file), _) => Some(JournalAt::Store(file.to_path_buf())),
                (None, Some(_)) => Some(JournalAt::Postgres),
                (None, None) => return Err(not_a_database()),
            }
        }
        Some(JournalKey::Dir(d)) => Some(JournalAt::Dir(at(&d))),
    };
    let mut b = Wallet::builder(key, mandate.clone())
        .registry(&registry)
        .store(store.clone())
        .confirmer(confirmer)
        .principal(principal);
    match &journal {
        Some(JournalAt::Dir(d)) => b = b.journal(Arc::new(DirJournal::new(d)?)),
        Some(JournalAt::Store(f)) => b = b.journal(Arc::new(SqliteJournal::open(f).await?)),
        Some(JournalAt::Postgres) => {
            let pool = registry.store_pool().cloned().ok_or_else(not_a_database)?;
            b = b.journal(Arc::new(PgJournal::new(pool).await?));
        }
        None => {}
    }
    let wallet = b.build()?;
    // A revocation kept beside the mandate is honoured whichever store is open.
    let beside = mandate_path.with_extension("revocation.jws");
    if beside.exists() {
        let r = files::read_signed::<Revocation>(&beside)?;
        let o = r.object();
        if o.mandate != *mandate.digest() || o.principal != mandate.object().principal.key {
            return Err(msg(format!(
                "{} is not a revocation of {} by its principal: remove it, or revoke the mandate with `stipendex mandate revoke`",
                beside.display(),
                mandate_path.display()
            )));
        }
        stipendex::wallet::Revocations::new(store)
            .record(&r)
            .await?;
    }
    wallet
        .check_records()
        .await
        .map_err(|e| msg(format!("{}: {e}", path.display())))?;
    Ok(Loaded { wallet, journal })
}
