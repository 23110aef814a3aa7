//! `stipendex ledger account new | fund | balance | history` as a user runs them, and
//! `stipendex init`'s refusals.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::Path;
use std::process::{Command, Output};

fn stipendex(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stipendex"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(o: &Output) -> String {
    assert!(o.status.success(), "{}", text(o));
    text(o)
}

fn refused(o: &Output, says: &str) {
    let t = text(o);
    assert!(!o.status.success(), "{t}");
    assert!(t.contains(says), "expected {says:?} in: {t}");
    assert_eq!(t.trim().lines().count(), 1, "one sentence: {t}");
    assert!(
        !t.contains("Error {") && !t.contains("Some("),
        "no Debug dump: {t}"
    );
}

#[test]
fn accounts_are_created_funded_once_per_reference_and_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let l = ["--ledger", "sqlite://ledger.db"];
    let new = stipendex(dir, &[&["ledger", "account", "new"][..], &l].concat());
    let id = String::from_utf8_lossy(&new.stdout).trim().to_owned();
    ok(&new);
    assert_eq!(id.len(), 32, "{id}");
    assert!(
        dir.join("ledger.db").exists(),
        "a relative sqlite path is the working folder's"
    );

    let fund = |amount: &str, reference: &str| {
        stipendex(
            dir,
            &[
                &[
                    "ledger",
                    "account",
                    "fund",
                    amount,
                    "--reference",
                    reference,
                ][..],
                &l,
                &["--account", &id],
            ]
            .concat(),
        )
    };
    assert!(ok(&fund("10.00", "deposit-1")).contains(": 10.00 USD available"));
    // The same reference again does nothing; with another amount it is refused.
    let again = ok(&fund("10.00", "deposit-1"));
    assert!(
        again.contains("nothing done") && again.contains(": 10.00 USD available"),
        "{again}"
    );
    refused(&fund("5.00", "deposit-1"), "already funded");
    assert!(ok(&fund("2.50", "deposit-2")).contains(": 12.50 USD available"));
    refused(&fund("1.001", "deposit-3"), "is not an amount of USD");
    refused(&fund("0", "deposit-4"), "positive amount");

    let history = ok(&stipendex(
        dir,
        &[
            &["ledger", "account", "history"][..],
            &l,
            &["--account", &id],
        ]
        .concat(),
    ));
    let lines: Vec<&str> = history.lines().collect();
    assert_eq!(lines.len(), 3, "{history}");
    assert!(
        lines[1].contains("+2.50 USD") && lines[2].contains("+10.00 USD"),
        "{history}"
    );
    assert!(lines[1].starts_with("20"), "RFC 3339 times: {history}");

    // Refusals: one sentence each.
    refused(
        &stipendex(
            dir,
            &[
                "ledger",
                "account",
                "balance",
                "--ledger",
                "sqlite://ledger.db",
                "--account",
                "xyz",
            ],
        ),
        "is not a ledger account",
    );
    refused(
        &stipendex(
            dir,
            &[
                "ledger",
                "account",
                "balance",
                "--ledger",
                "sqlite://ledger.db",
                "--account",
                &"ab".repeat(16),
            ],
        ),
        "does not exist",
    );
    refused(
        &stipendex(
            dir,
            &[
                "ledger",
                "account",
                "balance",
                "--ledger",
                "sqlite://ledger.db",
            ],
        ),
        "give --account",
    );
    refused(
        &stipendex(dir, &["ledger", "account", "balance"]),
        "name the ledger",
    );
    std::fs::write(dir.join("empty.toml"), "[store]\nurl = \"sqlite://x.db\"\n").unwrap();
    refused(
        &stipendex(
            dir,
            &["ledger", "account", "balance", "--config", "empty.toml"],
        ),
        "has no `kind = \"ledger\"` rail",
    );
}

#[test]
fn init_refuses_to_overwrite_or_to_leave_the_principal_key_beside_the_wallet() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    refused(
        &stipendex(dir, &["init", "s", "--upstream", "localhost:8080"]),
        "is not an http(s) URL",
    );
    refused(
        &stipendex(
            dir,
            &[
                "init",
                "s",
                "--upstream",
                "http://127.0.0.1:8080",
                "--principal-key",
                "s/wallet/p.key",
            ],
        ),
        "where the wallet (and so the agent) can read it",
    );
    let out = ok(&stipendex(
        dir,
        &[
            "init",
            "s",
            "--upstream",
            "http://127.0.0.1:8080",
            "--principal-key",
            "keys/principal.key",
        ],
    ));
    assert!(out.contains("keys/principal.key"), "{out}");
    assert!(!out.contains("printed once"), "{out}");
    #[cfg(unix)]
    for key in [
        "keys/principal.key",
        "s/wallet/wallet.key",
        "s/gateway/receiver.key",
    ] {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(dir.join(key))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{key}");
    }
    let wallet = std::fs::read_to_string(dir.join("s/wallet/wallet.toml")).unwrap();
    assert!(wallet.contains("principal = \"ed25519:"), "{wallet}");
    refused(
        &stipendex(dir, &["init", "s", "--upstream", "http://127.0.0.1:8080"]),
        "init never overwrites",
    );
    // The mandate pins the receiver at the gateway's origin, and the wallet config reads.
    let show = ok(&stipendex(
        dir,
        &["mandate", "show", "s/wallet/mandate.jws"],
    ));
    assert!(show.contains("http://127.0.0.1:8402"), "{show}");
}
