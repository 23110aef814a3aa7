//! The project's rule for tests that need a local network or service (PostgreSQL, a devnet):
//! in CI (`CI=true`) a missing localnet is a failure; on a developer's machine the test is
//! skipped with a visible message.

/// Whether we run in CI (`CI` is `true` or `1`).
#[must_use]
pub fn in_ci() -> bool {
    matches!(std::env::var("CI").as_deref(), Ok("true" | "1"))
}

/// The PostgreSQL URL for localnet tests: `STIPENDEX_PG_URL`, else the project machines'
/// service (`postgres://postgres@127.0.0.1:5432/test`).
#[must_use]
pub fn postgres_url() -> String {
    std::env::var("STIPENDEX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

/// Reports a missing localnet: panics in CI, prints a visible SKIPPED line elsewhere.
///
/// # Panics
/// In CI, always: a localnet test that cannot find its localnet fails loudly.
#[allow(clippy::print_stderr)]
pub fn missing(what: &str, why: &str) {
    assert!(
        !in_ci(),
        "localnet {what} is required in CI but unavailable: {why}"
    );
    eprintln!(
        "SKIPPED: localnet {what} unavailable ({why}); set it up with scripts/setup-localnets or point the env var at it"
    );
}
