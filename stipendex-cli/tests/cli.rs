//! The `stipendex` command as a user runs it: the demo, verify-chain on its files (and on a
//! tampered one), and the mandate life cycle; errors are one sentence and a non-zero exit.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    missing_docs
)]

use std::path::Path;
use std::process::{Command, Output};

fn stipendex(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stipendex"))
        .args(args)
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

fn chains(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("chains"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "jws"))
        .map(|p| p.display().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn the_demo_runs_and_its_chains_verify_and_a_tampered_one_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    // A relative --dir, as CI gives it: every file the demo names is found where it was written.
    let out = Command::new(env!("CARGO_BIN_EXE_stipendex"))
        .args(["demo", "--dir", "demo"])
        .current_dir(tmp.path())
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for expected in [
        "paid 0.05 USD over ledger",
        "human asked: pay 2.5 USD to demo-shop",
        "receipt",
        "REFUSED (limit_exceeded)",
        "escalated to the principal",
        "REFUSED (denied)",
        ": 5 calls, captured 0.25 of cap 0.50 USD",
        "root verified",
        "money: the agent spent 6 USD, demo-shop received 6 USD",
    ] {
        assert!(t.contains(expected), "missing {expected:?} in:\n{t}");
    }
    assert_eq!(t.matches("\nok ").count(), 4, "{t}");
    assert!(t.contains("\n     tab t_"), "{t}");

    // verify-chain, as the demo prints it (three payments and a tab).
    let files = chains(&dir);
    assert_eq!(files.len(), 4);
    // Without a trust anchor it refuses to say `ok` (a forged chain is consistent too).
    let args: Vec<&str> = std::iter::once("verify-chain")
        .chain(files.iter().map(String::as_str))
        .collect();
    let out = stipendex(&args);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("--principal"), "{}", text(&out));
    let args: Vec<&str> = ["verify-chain", "--unanchored"]
        .into_iter()
        .chain(files.iter().map(String::as_str))
        .collect();
    let out = stipendex(&args);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        text(&out).matches("ok (unanchored)").count(),
        4,
        "{}",
        text(&out)
    );

    // The same chains kept in a wallet's store (`journal = "store"`): verify-chain reads
    // every chain in the file, and names a tampered one by the file and the chain.
    store_journal_verifies_and_names_a_tampered_chain(&tmp.path().join("wallet.db"), &files);
    // And in a wallet's PostgreSQL store, given by its URL.
    pg_journal_verifies_and_names_a_tampered_chain(&files);

    // A flipped byte in a proof's signature: exit 1, the proof named as the broken link.
    let victim = &files[0];
    let lines: Vec<String> = std::fs::read_to_string(victim)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let proof_line = lines
        .iter()
        .position(|l| {
            let payload = l.split('.').nth(1).unwrap();
            let json = base64_decode(payload);
            json.contains("\"proof/0.1\"")
        })
        .unwrap();
    let mut tampered = lines.clone();
    tampered[proof_line] = flipped(&tampered[proof_line]);
    std::fs::write(victim, tampered.join("\n")).unwrap();
    let out = stipendex(&["verify-chain", "--unanchored", victim]);
    let t = text(&out);
    assert!(!out.status.success());
    assert!(
        t.contains("BROKEN") && t.contains("broken chain at the proof"),
        "{t}"
    );
    assert!(t.contains("stipendex: 1 of 1 chains are broken"), "{t}");
}

/// Records each chain file of `files` in `journal`, as a chain named by the file.
async fn record_files(journal: &dyn stipendex::wallet::Journal, files: &[String]) {
    for f in files {
        let name = Path::new(f)
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(f).unwrap();
        let objects: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        journal
            .record_then(&name, &objects, stipendex::wallet::Then::Keep)
            .await
            .unwrap();
    }
}

/// The first of `rows` (`(seq, jws)`, in order) that is a Proof.
fn first_proof(rows: Vec<(i64, String)>) -> (i64, String) {
    rows.into_iter()
        .find(|(_, j)| base64_decode(j.split('.').nth(1).unwrap()).contains("\"proof/0.1\""))
        .expect("a proof in the store")
}

/// `jws` with one byte of its signature flipped, as someone with write access would.
fn flipped(jws: &str) -> String {
    let mut bytes = jws.as_bytes().to_vec();
    let n = bytes.len() - 4;
    bytes[n] = if bytes[n] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).unwrap()
}

/// Copies the chain `files` into a wallet's PostgreSQL store (a fresh schema), verifies it by
/// the store's URL, then flips a byte of one proof in it; the password is never printed.
fn pg_journal_verifies_and_names_a_tampered_chain(files: &[String]) {
    use stipendex::wallet::PgJournal;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let base = test_kit::localnet::postgres_url();
    let schema = format!("chains_{:016x}", rand::random::<u64>());
    let admin = match rt.block_on(async {
        tokio::time::timeout(
            std::time::Duration::from_secs(5),
            rail_core::keys::sql::postgres_pool(&base, None),
        )
        .await
    }) {
        Ok(Ok(p)) => p,
        Ok(Err(e)) => return test_kit::localnet::missing("PostgreSQL", &e.to_string()),
        Err(_) => return test_kit::localnet::missing("PostgreSQL", "connection timed out"),
    };
    let url = format!("{base}?options=-c%20search_path%3D{schema}");
    // No journal in the schema yet: a sentence, not an empty success.
    rt.block_on(sqlx::query(&format!("CREATE SCHEMA {schema}")).execute(&admin))
        .unwrap();
    let out = stipendex(&["verify-chain", "--unanchored", &url]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("no wallet journal"), "{t}");
    rt.block_on(async {
        let pool = rail_core::keys::sql::postgres_pool(&base, Some(&schema))
            .await
            .unwrap();
        let j = PgJournal::new(pool).await.unwrap();
        record_files(&j, files).await;
    });
    let out = stipendex(&["verify-chain", "--unanchored", &url]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(t.matches("ok (unanchored)").count(), files.len(), "{t}");
    // Named by the store's host and database: no user part, no query.
    let shown = base.split_once('@').map_or(base.as_str(), |(_, h)| h);
    assert!(
        t.contains(&format!("{shown}#")),
        "each chain named in its store: {t}"
    );
    assert!(
        !t.contains("search_path"),
        "the URL's query is not printed: {t}"
    );

    // A proof's signature altered in the database, as someone with write access would.
    let table = format!("{schema}.stipendex_chain");
    let rows: Vec<(i64, String)> = rt
        .block_on(
            sqlx::query_as(&format!("SELECT seq, jws FROM {table} ORDER BY seq")).fetch_all(&admin),
        )
        .unwrap();
    let (seq, jws) = first_proof(rows);
    rt.block_on(
        sqlx::query(&format!("UPDATE {table} SET jws = $1 WHERE seq = $2"))
            .bind(flipped(&jws))
            .bind(seq)
            .execute(&admin),
    )
    .unwrap();
    let out = stipendex(&["verify-chain", "--unanchored", &url]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("BROKEN") && t.contains("broken chain at the proof"),
        "{t}"
    );
    // A URL with a password: verified under the URL without it.
    if let Some((scheme, rest)) = base.split_once("://")
        && let Some((user, host)) = rest.split_once('@')
        && !user.contains(':')
    {
        let secret = format!(
            "{scheme}://{user}:not-the-password@{host}?options=-c%20search_path%3D{schema}"
        );
        let out = stipendex(&["verify-chain", "--unanchored", &secret]);
        assert!(!text(&out).contains("not-the-password"), "{}", text(&out));
    }
    rt.block_on(sqlx::query(&format!("DROP SCHEMA {schema} CASCADE")).execute(&admin))
        .unwrap();
}

/// Copies the chain `files` into a wallet's store, verifies it whole, then flips a byte of one
/// proof in it; a SQLite file without a journal is refused with a sentence.
fn store_journal_verifies_and_names_a_tampered_chain(db: &Path, files: &[String]) {
    use stipendex::wallet::SqliteJournal;
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let j = SqliteJournal::open(db).await.unwrap();
        record_files(&j, files).await;
    });
    let db_arg = db.display().to_string();
    let out = stipendex(&["verify-chain", "--unanchored", &db_arg]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert_eq!(t.matches("ok (unanchored)").count(), files.len(), "{t}");
    assert!(
        t.contains(&format!("{db_arg}#")),
        "each chain named in its file: {t}"
    );

    // Tamper with a proof's signature in the file, as someone with write access to it would.
    let c = rusqlite::Connection::open(db).unwrap();
    let proof: (i64, String) = {
        let mut rows = c
            .prepare("SELECT seq, jws FROM stipendex_chain ORDER BY seq")
            .unwrap();
        let all: Vec<(i64, String)> = rows
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        first_proof(all)
    };
    c.execute(
        "UPDATE stipendex_chain SET jws = ?1 WHERE seq = ?2",
        rusqlite::params![flipped(&proof.1), proof.0],
    )
    .unwrap();
    drop(c);
    let out = stipendex(&["verify-chain", "--unanchored", &db_arg]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("BROKEN") && t.contains("broken chain at the proof"),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "stipendex: 1 of {} chains are broken",
            files.len()
        )),
        "{t}"
    );

    // A journal that holds no chain yet: a sentence and a failure, not an empty success.
    let empty = db.with_file_name("empty.db");
    rt.block_on(async { SqliteJournal::open(&empty).await.unwrap() });
    let out = stipendex(&["verify-chain", "--unanchored", &empty.display().to_string()]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("holds no chain yet"), "{t}");

    // A SQLite file that holds no journal: a sentence, not a crash or an empty success.
    let other = db.with_file_name("other.db");
    rusqlite::Connection::open(&other)
        .unwrap()
        .execute_batch("CREATE TABLE t (x INTEGER)")
        .unwrap();
    let out = stipendex(&["verify-chain", "--unanchored", &other.display().to_string()]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("holds no wallet journal"), "{t}");
}

fn base64_decode(s: &str) -> String {
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .unwrap();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[test]
fn mandate_life_cycle_and_one_sentence_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let p = |name: &str| tmp.path().join(name).display().to_string();
    let out = stipendex(&["key", "new", "--out", &p("principal.key")]);
    assert!(out.status.success(), "{}", text(&out));
    let out = stipendex(&["key", "new", "--out", &p("wallet.key")]);
    let wallet = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    assert!(wallet.starts_with("ed25519:"));
    let out = stipendex(&["key", "new", "--out", &p("shop.key")]);
    let shop = String::from_utf8(out.stdout).unwrap().trim().to_owned();

    let out = stipendex(&[
        "mandate",
        "new",
        "--principal-key",
        &p("principal.key"),
        "--wallet",
        &wallet,
        "--per-call",
        "1.00",
        "--per-period",
        "10.00",
        "--confirm-above",
        "0.50",
        "--allow-receiver",
        &format!("demo-shop={shop}"),
        "--origin",
        "demo-shop=https://shop.example",
        "--allow-x402-http",
        "https://api.example.com=0x209693Bc6afc0C5328bA36FaF03C514EF312287C",
        "--out",
        &p("mandate.json"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = stipendex(&[
        "mandate",
        "sign",
        "--key",
        &p("principal.key"),
        &p("mandate.json"),
        "--out",
        &p("mandate.jws"),
    ]);
    assert!(out.status.success(), "{}", text(&out));
    let out = stipendex(&["mandate", "show", &p("mandate.jws")]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("1 USD per call") || t.contains("1.00 USD per call"),
        "{t}"
    );
    assert!(t.contains("allows: receiver demo-shop"), "{t}");
    assert!(
        t.contains("x402 over HTTP from https://api.example.com"),
        "{t}"
    );
    assert!(t.contains("signature: valid"), "{t}");

    // Signing with another key than the mandate's principal is refused in one sentence.
    let out = stipendex(&[
        "mandate",
        "sign",
        "--key",
        &p("wallet.key"),
        &p("mandate.json"),
        "--out",
        &p("other.jws"),
    ]);
    let t = text(&out);
    assert!(!out.status.success());
    assert!(
        t.starts_with("stipendex: ") && t.contains("sign with the principal's own key"),
        "{t}"
    );
    assert_eq!(t.trim().lines().count(), 1, "{t}");

    // A key file that is not a key.
    std::fs::write(p("bad.key"), "not a key").unwrap();
    let out = stipendex(&[
        "mandate",
        "sign",
        "--key",
        &p("bad.key"),
        &p("mandate.json"),
        "--out",
        &p("x.jws"),
    ]);
    let t = text(&out);
    assert!(t.contains("bad.key is not a 32-byte hex key"), "{t}");
    assert!(!t.contains("Error("), "no Debug dumps: {t}");

    // Revocation into the wallet's store.
    let store = format!("sqlite://{}", p("wallet.db"));
    let out = stipendex(&[
        "mandate",
        "revoke",
        "--key",
        &p("principal.key"),
        &p("mandate.jws"),
        "--store",
        &store,
    ]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("the wallet refuses every payment under it"),
        "{t}"
    );
    assert!(Path::new(&p("mandate.revocation.jws")).exists());

    // A mandate without any limit, or allowing a receiver with no origin to pay it at: refused,
    // each naming the flag that means it (issue 45).
    let base_args = [
        "mandate",
        "new",
        "--principal-key",
        &p("principal.key"),
        "--wallet",
        &wallet,
    ];
    let run = |extra: &[&str]| {
        let mut args: Vec<&str> = base_args.to_vec();
        args.extend_from_slice(extra);
        stipendex(&args)
    };
    let shop_arg = format!("demo-shop={shop}");
    let out = run(&[
        "--allow-receiver",
        &shop_arg,
        "--origin",
        "https://shop.example",
        "--out",
        &p("m1.json"),
    ]);
    let t = text(&out);
    assert!(!out.status.success());
    assert!(
        t.contains("sets no limit") && t.contains("--unlimited"),
        "{t}"
    );
    assert_eq!(t.trim().lines().count(), 1, "{t}");
    let out = run(&[
        "--per-call",
        "1.00",
        "--allow-receiver",
        &shop_arg,
        "--out",
        &p("m2.json"),
    ]);
    let t = text(&out);
    assert!(!out.status.success());
    assert!(
        t.contains("has no --origin") && t.contains("--in-process"),
        "{t}"
    );
    let out = run(&[
        "--unlimited",
        "--per-call",
        "1.00",
        "--allow-receiver",
        &shop_arg,
        "--in-process",
        "--out",
        &p("m3.json"),
    ]);
    assert!(out.status.success(), "{}", text(&out));

    // A tampered mandate is not shown.
    let jws = std::fs::read_to_string(p("mandate.jws")).unwrap();
    let mut b = jws.trim().as_bytes().to_vec();
    let n = b.len() - 3;
    b[n] = if b[n] == b'A' { b'B' } else { b'A' };
    std::fs::write(p("tampered.jws"), b).unwrap();
    let out = stipendex(&["mandate", "show", &p("tampered.jws")]);
    let t = text(&out);
    assert!(!out.status.success());
    assert!(
        t.contains("is not a valid signed mandate: bad signature"),
        "{t}"
    );
}

/// The product's demo runs on the embedded ledger only: asked for a rail's localnet, it says in
/// one sentence where that demo lives and exits non-zero, before it creates anything.
#[test]
fn the_demo_over_a_localnet_is_the_runners() {
    let dir = tempfile::tempdir().unwrap();
    let out = stipendex(&[
        "demo",
        "--rail",
        "x402",
        "--dir",
        dir.path().join("d").to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    let t = text(&out);
    assert!(t.contains("conformance -- demo --rail x402"), "{t}");
    assert_eq!(t.trim().lines().count(), 1, "one sentence: {t}");
    assert!(!dir.path().join("d").exists(), "nothing was created");
}

/// A case of the tab-chain test vectors (`stipendex/tests/vectors/tab-chain.json`, written by
/// the vectors' generator in `stipendex/tests/vectors.rs`): its lines, and the principal they
/// are verified against.
fn tab_vector(name: &str) -> (Vec<String>, String) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../stipendex/tests/vectors/tab-chain.json");
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let case = f["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no case {name} in {}", path.display()));
    let lines = case["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap().to_owned())
        .collect();
    (lines, f["principal"].as_str().unwrap().to_owned())
}

/// `stipendex verify-chain --principal-pubkey …` on the tab chain of the vector `name`, written
/// to a file as the wallet journals it.
fn verify_tab_vector(name: &str) -> Output {
    let (lines, principal) = tab_vector(name);
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join(format!("{name}.jws"));
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    stipendex(&[
        "verify-chain",
        "--principal-pubkey",
        &principal,
        file.to_str().unwrap(),
    ])
}

/// The one line `verify-chain` prints for a broken chain: `BROKEN  <file>: <one sentence>`.
fn broken_line(o: &Output) -> String {
    let t = text(o);
    assert!(!o.status.success(), "exit 0 on a broken chain:\n{t}");
    let lines: Vec<&str> = t.lines().filter(|l| l.starts_with("BROKEN")).collect();
    assert_eq!(lines.len(), 1, "{t}");
    let why = lines[0].split_once(".jws: ").unwrap().1.to_owned();
    // One sentence: no full stop inside it, no line break.
    assert!(!why.trim_end_matches('.').contains(". "), "{why}");
    assert!(t.contains("stipendex: 1 of 1 chains are broken"), "{t}");
    why
}

#[test]
fn verify_chain_accepts_the_valid_tab_vector() {
    let out = verify_tab_vector("valid");
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.starts_with("ok ") && t.contains("root verified"), "{t}");
}

#[test]
fn verify_chain_refuses_a_tab_receipt_with_another_cap() {
    let why = broken_line(&verify_tab_vector("tab_receipt_with_another_cap"));
    assert!(
        why.starts_with("broken chain at the tab-receipt: "),
        "{why}"
    );
    assert!(why.contains("cap"), "{why}");
}

#[test]
fn verify_chain_refuses_a_voucher_whose_request_is_not_its_resource_digest() {
    let why = broken_line(&verify_tab_vector(
        "voucher_whose_request_is_not_its_resource_digest",
    ));
    assert!(why.starts_with("broken chain at the voucher: "), "{why}");
    assert!(
        why.contains("v_vector-voucher-1") && why.contains("request") && why.contains("resource"),
        "{why}"
    );
}
