//! Reading and writing the files the commands use: secret keys, signed objects, chains.

use std::io::Write as _;
use std::path::Path;

use stipendex::envelope::{Object, SecretKey, Signed};

use crate::{Error as CliError, msg};

/// Reads a file as text; the error names the file.
pub fn read(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|e| msg(format!("cannot read {}: {e}", path.display())))
}

/// Reads a secret key file (64 hex digits).
pub fn read_secret(path: &Path) -> Result<SecretKey, CliError> {
    SecretKey::from_hex(&read(path)?).map_err(|_| {
        msg(format!(
            "{} is not a 32-byte hex key: write one with `stipendex key new --out {}`",
            path.display(),
            path.display()
        ))
    })
}

/// Writes a secret key file, readable by its owner only; never overwrites.
pub fn write_secret(path: &Path, key: &SecretKey) -> Result<(), CliError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(|e| {
        msg(format!(
            "cannot create {}: {e} (a key file is never overwritten)",
            path.display()
        ))
    })?;
    f.write_all(format!("{}\n", key.to_hex().as_str()).as_bytes())
        .map_err(|e| msg(format!("cannot write {}: {e}", path.display())))
}

/// Writes a text file the command itself creates (in a directory it made or checked).
pub fn write(path: &Path, text: &str) -> Result<(), CliError> {
    std::fs::write(path, text).map_err(|e| msg(format!("cannot write {}: {e}", path.display())))
}

/// Writes a text file a user named (`--out`): the one rule of every command that writes a
/// file — an existing file is never overwritten unless `force` (`--force`); the refusal names
/// the file and both ways on.
pub fn write_new(path: &Path, text: &str, force: bool) -> Result<(), CliError> {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true);
    if force {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts.open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            msg(format!(
                "{} already exists: write to another file, or give --force to overwrite it",
                path.display()
            ))
        } else {
            msg(format!("cannot write {}: {e}", path.display()))
        }
    })?;
    f.write_all(text.as_bytes())
        .map_err(|e| msg(format!("cannot write {}: {e}", path.display())))
}

/// Whether colour (ANSI escapes) may go to `stream`: it is a terminal and `NO_COLOR` is not
/// set (<https://no-color.org>: any non-empty value turns colour off).
pub fn colour(stream: &impl std::io::IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Reads a signed object from a file holding its compact JWS (or the JSON wire form
/// `{"stipendex": …, "jws": …}`).
pub fn read_signed<T: Object>(path: &Path) -> Result<Signed<T>, CliError> {
    let text = read(path)?;
    let text = text.trim();
    let parsed = if text.starts_with('{') {
        serde_json::from_str::<Signed<T>>(text)
            .map_err(|e| stipendex::Error::Malformed(e.to_string()))
    } else {
        Signed::<T>::parse(text)
    };
    parsed.map_err(|e| {
        msg(format!(
            "{} is not a valid signed {}: {e}",
            path.display(),
            T::KIND
        ))
    })
}

/// The secret key a configuration section names by exactly one of `key_file` (relative to
/// `dir`) and `key_env` (64 hex digits in that variable); `section` names it in errors.
pub fn key_of(
    section: &str,
    dir: &Path,
    key_file: Option<&Path>,
    key_env: Option<&str>,
) -> Result<SecretKey, CliError> {
    match (key_file, key_env) {
        (Some(f), None) => read_secret(&if f.is_absolute() {
            f.to_path_buf()
        } else {
            dir.join(f)
        }),
        (None, Some(var)) => {
            let v = std::env::var(var).map_err(|_| {
                msg(format!(
                    "[{section}] key_env names {var}, which is not set: export the key there"
                ))
            })?;
            SecretKey::from_hex(v.trim())
                .map_err(|_| msg(format!("{var} is not a 32-byte hex key")))
        }
        _ => Err(msg(format!(
            "[{section}] needs exactly one of key_file and key_env: the secret key"
        ))),
    }
}
