//! SQLite's side of [`Store::try_exclusive`](crate::Store::try_exclusive): a lock on a
//! file beside the database.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::Path;

/// The file at `path` (made if need be), locked exclusively, or `None` if another
/// holder has it locked.
pub(crate) fn try_lock(path: &Path) -> std::io::Result<Option<File>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(file)),
        Err(TryLockError::WouldBlock) => Ok(None),
        Err(TryLockError::Error(e)) => Err(e),
    }
}

/// SQLite's hold of an exclusive right: the locked file (the lock lives as long as it
/// is open), or, for an in-memory database (one process), the name among those the
/// process holds.
#[derive(Debug)]
pub(crate) enum Hold {
    File(#[allow(dead_code, reason = "held, not read: closing it unlocks")] File),
    Memory(String),
}

/// The names held in in-memory databases, by the process.
static IN_MEMORY: std::sync::Mutex<Option<std::collections::HashSet<String>>> =
    std::sync::Mutex::new(None);

impl Hold {
    /// Takes the right `name` over the database at `file` (`None`: in memory).
    pub(crate) fn take(file: Option<&Path>, name: &str) -> crate::Result<Option<Self>> {
        let Some(db) = file else {
            let mut held = IN_MEMORY
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let fresh = held.get_or_insert_default().insert(name.to_owned());
            return Ok(fresh.then(|| Self::Memory(name.to_owned())));
        };
        let path = db.with_file_name(format!(
            "{}-{name}.lock",
            db.file_name().unwrap_or_default().to_string_lossy()
        ));
        Ok(try_lock(&path)
            .map_err(|e| crate::Error::Exclusive {
                name: name.to_owned(),
                reason: format!("lock file {}: {e}", path.display()),
            })?
            .map(Self::File))
    }

    /// Held while the process lives.
    #[allow(clippy::unused_async)] // the same call as other drivers' holds
    pub(crate) async fn still_held(&mut self) -> bool {
        true
    }

    /// Lets it go (dropping it does).
    #[allow(clippy::unused_async)]
    pub(crate) async fn release(self) {}
}

impl Drop for Hold {
    fn drop(&mut self) {
        if let Self::Memory(name) = self
            && let Some(held) = IN_MEMORY
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_mut()
        {
            held.remove(name);
        }
    }
}
