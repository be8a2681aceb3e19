//! One runtime per SQLite file.
//!
//! SQLite serves one process well: two runtimes on one file would each be woken only by
//! their own commits, fight over the write lock through SQLite's busy handler (which
//! is not fair, and can starve the other's lease renewals, so that outside calls are
//! repeated), and degrade without a word. A runtime therefore holds an exclusive lock
//! on `<database>-runtime.lock` while it lives, and a second one is refused with
//! [`Error::SqliteInUse`](crate::Error::SqliteInUse), which names PostgreSQL for many
//! processes. The CLI and the console open the database without it: they are not
//! runtimes. The lock is the operating system's (`flock`): it goes with the process,
//! even after `kill -9`.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use agentsaga_core::Store;

use crate::{Error, Result};

/// The lock of a runtime on its SQLite file, released when dropped.
#[derive(Debug)]
pub(crate) struct SqliteLock {
    file: File,
}

impl Drop for SqliteLock {
    fn drop(&mut self) {
        // Unlocked explicitly, not only by closing the file: a process forked meanwhile
        // (a test's helper, a user's child process) holds a copy of the descriptor until
        // it execs, and with it the lock, so that a runtime started again at once would
        // be refused. Unlocking releases it for every copy.
        let _ = self.file.unlock();
    }
}

/// The lock file of database `db`.
pub(crate) fn lock_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push("-runtime.lock");
    PathBuf::from(name)
}

/// Takes the lock of `store`'s SQLite file, if it has one.
///
/// # Errors
/// [`Error::SqliteInUse`] if another runtime (in this process or another) holds it;
/// [`Error::Config`] if the lock file cannot be opened.
pub(crate) fn lock(store: &Store) -> Result<Option<SqliteLock>> {
    let Some(db) = store.sqlite_file() else {
        return Ok(None);
    };
    let path = lock_path(&db);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| Error::Config(format!("cannot open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {
            // Who holds it, for the error of the next one.
            let _ = file.set_len(0);
            let _ = file.rewind();
            let _ = write!(file, "{}", std::process::id());
            let _ = file.flush();
            Ok(Some(SqliteLock { file }))
        }
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            Err(Error::SqliteInUse {
                path: db,
                holder: holder.trim().parse().ok(),
            })
        }
        Err(TryLockError::Error(e)) => Err(Error::Config(format!(
            "cannot lock {}: {e}",
            path.display()
        ))),
    }
}
