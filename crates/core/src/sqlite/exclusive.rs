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
