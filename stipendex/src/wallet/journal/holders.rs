//! The processes that make payments with a journal: each holds an exclusive lock on a file of
//! its own in a folder for as long as it runs (the operating system releases it when the
//! process ends, however it ends), so another process that finds a payment it left can tell at
//! once that it is gone.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// A journal's holders folder, and this process's lock in it (made on first use).
#[derive(Clone, Debug)]
pub(super) struct Holders {
    folder: PathBuf,
    mine: Arc<OnceLock<Option<(String, std::fs::File)>>>,
}

impl Holders {
    /// The holders kept in `folder` (made when first needed).
    pub(super) fn in_folder(folder: PathBuf) -> Self {
        Holders {
            folder,
            mine: Arc::default(),
        }
    }

    /// This process's name (its lock file's path), locking it on first use; `None` if it
    /// cannot be made (payments are then taken over after their lease, as without a holder).
    pub(super) fn mine(&self) -> Option<String> {
        self.mine
            .get_or_init(|| lock_in(&self.folder))
            .as_ref()
            .map(|(path, _)| path.clone())
    }

    /// Whether the process named `holder` still runs: `false` only for a lock file of this
    /// folder that is gone or unlocked (a name elsewhere is not looked at: `true`).
    pub(super) fn alive(&self, holder: &str) -> bool {
        if self.mine().as_deref() == Some(holder) {
            return true;
        }
        let path = Path::new(holder);
        if path.parent() != Some(self.folder.as_path()) {
            return true;
        }
        match std::fs::File::open(path) {
            Ok(f) => f.try_lock().is_err(),
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        }
    }
}

/// A lock file of this process's own in the folder `holders` (created if missing), locked for
/// as long as the file is kept open; `None` if it cannot be made.
fn lock_in(holders: &Path) -> Option<(String, std::fs::File)> {
    std::fs::create_dir_all(holders).ok()?;
    // Locks of processes that ended are removed on the way.
    if let Ok(entries) = std::fs::read_dir(holders) {
        for e in entries.flatten() {
            let path = e.path();
            if let Ok(f) = std::fs::File::open(&path)
                && f.try_lock().is_ok()
            {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    // Made, then locked: another process cleaning up in between may lock it, find it free
    // and remove it. A lock on a removed file names no one: checked, and made again.
    for _ in 0..3 {
        let name = format!(
            "{}-{}.lock",
            std::process::id(),
            hex::encode(rand::random::<[u8; 4]>())
        );
        let path = holders.join(name);
        let file = std::fs::File::create(&path).ok()?;
        file.lock().ok()?;
        if same_file(&file, &path) {
            return Some((path.display().to_string(), file));
        }
    }
    None
}

/// Whether `path` still names the open `file` (not removed, not replaced).
fn same_file(file: &std::fs::File, path: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        match (file.metadata(), std::fs::metadata(path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        path.exists()
    }
}
