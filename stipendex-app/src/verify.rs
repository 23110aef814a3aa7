//! Verifying audit-chain files, as `stipendex verify-chain` and the demo do: a line per
//! chain, `ok` or `BROKEN` with why.

use std::path::PathBuf;
use std::process::ExitCode;

use stipendex::chain::{Chain, TabChain, TabVerifier, verify_chain};
use stipendex::envelope::{PublicKey, Revocation, Signed};

use crate::{Error as CliError, files, msg};

/// One line per verified chain: who, what, how much, over which rail.
pub fn summary(c: &Chain) -> String {
    let (m, p) = (c.mandate.object(), c.proof.object());
    let mut s = format!("mandate {} ({}) -> ", m.id, m.principal.id);
    if let Some(conf) = &c.confirmation {
        s.push_str(&format!(
            "confirmation {} (by {}) -> ",
            conf.object().id,
            conf.object().by
        ));
    }
    match (&c.quote, &p.challenge) {
        (Some(q), _) => {
            let q = q.object();
            let price = match (q.amount, q.estimate, q.tolerance) {
                (Some(a), _, _) => format!("{a} {}", q.asset),
                (None, Some(e), Some(t)) => format!("{e} +{t} {}", q.asset),
                _ => "?".into(),
            };
            s.push_str(&format!("quote {} ({price}, {}) -> ", q.id, q.receiver.id));
        }
        (None, Some(ch)) => s.push_str(&format!(
            "unsigned x402 challenge from {} to {} -> ",
            ch.origin, ch.pay_to
        )),
        (None, None) => {}
    }
    s.push_str(&format!(
        "proof {} ({} {} over {}, {})",
        p.id, p.amount, p.asset, p.rail, p.mode
    ));
    match &c.receipt {
        Some(r) => s.push_str(&format!(
            " -> receipt {} ({} {})",
            r.object().id,
            r.object().amount,
            r.object().asset
        )),
        None if c.quote.is_some() => s.push_str(" -> no receipt yet"),
        None => {}
    }
    s
}

/// One line for a verified tab: who, the cap, the calls, what was captured.
pub fn tab_summary(c: &TabChain) -> String {
    let (m, t, p) = (c.mandate.object(), c.tab.object(), c.proof.object());
    let mut s = format!("mandate {} ({}) -> ", m.id, m.principal.id);
    if let Some(conf) = &c.confirmation {
        s.push_str(&format!(
            "confirmation {} (by {}) -> ",
            conf.object().id,
            conf.object().by
        ));
    }
    s.push_str(&format!(
        "tab {} (cap {} {}, {}) -> hold {} over {} -> {} vouchers ({} {})",
        t.id, t.cap, t.asset, t.receiver.id, p.id, p.rail, c.vouchers, c.spent, t.asset
    ));
    match &c.receipt {
        Some(r) => s.push_str(&format!(
            " -> tab receipt {} ({} calls, captured {} {}{})",
            r.object().id,
            r.object().calls,
            r.object().captured,
            r.object().asset,
            if c.root_checked {
                ", root verified"
            } else {
                ", root not recomputed: some vouchers never reached the receiver"
            }
        )),
        None => s.push_str(" -> not closed yet"),
    }
    s
}

/// Prints `ok`/`BROKEN` for the chain `label`; whether it verified.
fn report(label: &str, checked: Result<String, String>, anchored: bool) -> bool {
    #[allow(clippy::print_stdout)]
    match checked {
        Ok(s) if anchored => println!("ok      {label}: {s}"),
        Ok(s) => println!("ok (unanchored) {label}: {s}"),
        Err(e) => {
            println!("BROKEN  {label}: {e}");
            return false;
        }
    }
    true
}

/// Verifies one chain's objects (a payment's, or a tab's), its revocations included; the
/// summary line, or why it is broken.
fn check_lines(
    objects: &[&str],
    anchor: Option<&PublicKey>,
    revocations: &[Signed<Revocation>],
) -> Result<String, String> {
    let tab = objects
        .iter()
        .find_map(|o| match stipendex::chain::claimed_kind(o).as_deref() {
            Some("mandate" | "confirmation") | None => None,
            Some(k) => Some(k == "tab"),
        })
        .unwrap_or(false);
    if tab {
        let mut v = TabVerifier::new(anchor).with_revocations(revocations);
        for o in objects.iter().filter(|o| !o.is_empty()) {
            v.push(o).map_err(|e| e.to_string())?;
        }
        return v
            .finish()
            .map(|c| tab_summary(&c))
            .map_err(|e| e.to_string());
    }
    let c = verify_chain(objects, anchor).map_err(|e| e.to_string())?;
    c.check_revocations(revocations)
        .map_err(|e| e.to_string())?;
    Ok(summary(&c))
}

/// Whether `path` is a SQLite database (its first 16 bytes are SQLite's header).
fn is_sqlite(path: &std::path::Path) -> Result<bool, CliError> {
    use std::io::Read as _;
    let mut head = [0u8; 16];
    let mut f = std::fs::File::open(path)
        .map_err(|e| msg(format!("cannot read {}: {e}", path.display())))?;
    Ok(f.read_exact(&mut head).is_ok() && &head == b"SQLite format 3\0")
}

/// Whether `path` holds a tab's chain: its first object past the mandate (and confirmation)
/// is a tab.
fn is_tab_chain(path: &std::path::Path) -> Result<bool, CliError> {
    use std::io::BufRead as _;
    let f = std::fs::File::open(path)
        .map_err(|e| msg(format!("cannot read {}: {e}", path.display())))?;
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(|e| msg(format!("cannot read {}: {e}", path.display())))?;
        match stipendex::chain::claimed_kind(line.trim()).as_deref() {
            Some("mandate" | "confirmation") | None => {}
            Some(k) => return Ok(k == "tab"),
        }
    }
    Ok(false)
}

/// Verifies the tab's chain in `path`, line by line.
fn verify_tab_file(
    path: &std::path::Path,
    anchor: Option<&PublicKey>,
    revocations: &[Signed<Revocation>],
) -> Result<TabChain, String> {
    use std::io::BufRead as _;
    let io = |e: std::io::Error| format!("cannot read it: {e}");
    let f = std::fs::File::open(path).map_err(io)?;
    let mut v = TabVerifier::new(anchor).with_revocations(revocations);
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(io)?;
        if !line.trim().is_empty() {
            v.push(&line).map_err(|e| e.to_string())?;
        }
    }
    v.finish().map_err(|e| e.to_string())
}

/// The revocations in `paths` (one compact JWS per line).
fn revocations(paths: &[PathBuf]) -> Result<Vec<Signed<Revocation>>, CliError> {
    let mut out = Vec::new();
    for path in paths {
        for line in files::read(path)?
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
        {
            out.push(Signed::<Revocation>::parse(line).map_err(|e| {
                msg(format!(
                    "--revocation {}: not a signed revocation ({e}); write one with `stipendex mandate revoke`",
                    path.display()
                ))
            })?);
        }
    }
    Ok(out)
}

/// Verifies every chain of a wallet's store, each reported as `<store>#<chain>`: how many,
/// and how many are broken.
fn verify_store(
    label: &str,
    chains: &[(String, Vec<String>)],
    anchor: Option<&PublicKey>,
    revocations: &[Signed<Revocation>],
) -> Result<(usize, usize), CliError> {
    if chains.is_empty() {
        return Err(msg(format!(
            "{label} holds no chain yet (no payment journaled in it): nothing to verify"
        )));
    }
    let mut broken = 0;
    for (name, objects) in chains {
        let lines: Vec<&str> = objects.iter().map(|o| o.trim()).collect();
        if !report(
            &format!("{label}#{name}"),
            check_lines(&lines, anchor, revocations),
            anchor.is_some(),
        ) {
            broken += 1;
        }
    }
    Ok((chains.len(), broken))
}

/// `url` as it may be printed: its scheme, host (and port) and database only. The user part
/// (up to its last `@`, as the URL is read when connecting) and the query (where `password=`
/// may be) are left out.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "the PostgreSQL store".to_owned();
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    // Whatever comes before the last `@` may be a user part: never printed.
    let rest = rest.rsplit_once('@').map_or(rest, |(_, after)| after);
    format!("{scheme}://{rest}")
}

/// Verifies each file or wallet's store (a SQLite file, or a `postgres://` URL), and, with
/// `revoked`, that no Proof was made after its mandate's revocation; exit 1 if any chain is
/// broken.
pub async fn run(
    principal: Option<&str>,
    revoked: &[PathBuf],
    paths: &[PathBuf],
) -> Result<ExitCode, CliError> {
    let revocations = revocations(revoked)?;
    let anchor = principal
        .map(|p| {
            PublicKey::parse(p).map_err(|_| {
                msg(format!(
                    "--principal-pubkey {p:?} is not a key: write it as ed25519:<base64url>"
                ))
            })
        })
        .transpose()?;
    let mut broken = 0;
    let mut count = 0;
    for path in paths {
        // A wallet's PostgreSQL store (`[wallet] journal = "store"`): all its chains.
        if let Some(url) = path
            .to_str()
            .filter(|p| p.starts_with("postgres://") || p.starts_with("postgresql://"))
        {
            let label = without_password(url);
            let chains = stipendex::wallet::PgJournal::read_chains(url)
                .await
                .map_err(|e| {
                    msg(format!(
                        "{label}: {e}: give chain files, or a wallet's store"
                    ))
                })?;
            let (n, bad) = verify_store(&label, &chains, anchor.as_ref(), &revocations)?;
            (count, broken) = (count + n, broken + bad);
            continue;
        }
        // A wallet's SQLite store holds all its chains too.
        if is_sqlite(path)? {
            let chains = stipendex::wallet::SqliteJournal::read_chains(path)
                .map_err(|e| msg(format!("{e}: give chain files, or a wallet's store")))?;
            let (n, bad) = verify_store(
                &path.display().to_string(),
                &chains,
                anchor.as_ref(),
                &revocations,
            )?;
            (count, broken) = (count + n, broken + bad);
            continue;
        }
        count += 1;
        // A tab's chain can hold millions of vouchers: it is verified as it is read.
        if is_tab_chain(path)? {
            let checked =
                verify_tab_file(path, anchor.as_ref(), &revocations).map(|c| tab_summary(&c));
            if !report(&path.display().to_string(), checked, anchor.is_some()) {
                broken += 1;
            }
            continue;
        }
        let text = files::read(path)?;
        let objects: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let checked = check_lines(&objects, anchor.as_ref(), &revocations);
        if !report(&path.display().to_string(), checked, anchor.is_some()) {
            broken += 1;
        }
    }
    if broken > 0 {
        return Err(msg(format!(
            "{broken} of {count} chains are broken (see above)"
        )));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn a_store_url_is_printed_without_its_user_part_or_query() {
        for (url, shown) in [
            (
                "postgres://u:secret@db.example:5432/w",
                "postgres://db.example:5432/w",
            ),
            ("postgres://u:p@ss@h/db", "postgres://h/db"),
            ("postgres://u:p/w@h/db", "postgres://h/db"),
            (
                "postgres://h/db?password=secret&sslmode=require",
                "postgres://h/db",
            ),
            ("postgresql://h/db#frag", "postgresql://h/db"),
            ("not a url", "the PostgreSQL store"),
        ] {
            assert_eq!(without_password(url), shown, "{url}");
        }
    }
}
