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

/// Verifies each file (and, with `revoked`, no Proof made after its mandate's revocation);
/// exit 1 if any chain is broken.
pub fn run(
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
    for path in paths {
        // A tab's chain can hold millions of vouchers: it is verified as it is read.
        if is_tab_chain(path)? {
            #[allow(clippy::print_stdout)]
            match verify_tab_file(path, anchor.as_ref(), &revocations) {
                Ok(c) if anchor.is_some() => {
                    println!("ok      {}: {}", path.display(), tab_summary(&c));
                }
                Ok(c) => println!("ok (unanchored) {}: {}", path.display(), tab_summary(&c)),
                Err(e) => {
                    broken += 1;
                    println!("BROKEN  {}: {e}", path.display());
                }
            }
            continue;
        }
        let text = files::read(path)?;
        let objects: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let checked = match verify_chain(&objects, anchor.as_ref()) {
            Ok(c) => match c.check_revocations(&revocations) {
                Ok(()) => Ok(c),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        #[allow(clippy::print_stdout)]
        match checked {
            Ok(c) if anchor.is_some() => println!("ok      {}: {}", path.display(), summary(&c)),
            Ok(c) => println!("ok (unanchored) {}: {}", path.display(), summary(&c)),
            Err(e) => {
                broken += 1;
                println!("BROKEN  {}: {e}", path.display());
            }
        }
    }
    if broken > 0 {
        return Err(msg(format!(
            "{broken} of {} chains are broken (see above)",
            paths.len()
        )));
    }
    Ok(ExitCode::SUCCESS)
}
