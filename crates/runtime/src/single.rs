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
//!
//! The lock is taken before the database is opened (so a refused runtime has neither
//! created the file nor migrated it under a live one) and is the file's, not its
//! name's: its path is the database's canonical path (symlinks, `.` and `..`
//! resolved), so a second path to the same file finds the same lock. Hard links are not
//! followed: SQLite itself does not support a database reached by two hard links.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use agentsaga_core::{Store, StoreConfig};

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

/// The lock file of database `db`: beside its canonical path. A file not made yet is
/// named by its directory's canonical path; `None` if even that does not exist (opening
/// the database fails then, and says why).
fn lock_path(db: &Path) -> Option<PathBuf> {
    let real = match db.canonicalize() {
        Ok(real) => real,
        Err(_) => {
            let dir = match db.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            };
            dir.canonicalize().ok()?.join(db.file_name()?)
        }
    };
    let mut name = real.into_os_string();
    name.push("-runtime.lock");
    Some(PathBuf::from(name))
}

/// The runtime's store with its lock: `store` if given (locked once open), else `url`
/// opened only once its file's lock is held (SQLite), so that nothing is created or
/// migrated under a live runtime.
///
/// # Errors
/// As [`lock`], and the store's errors.
pub(crate) async fn open(
    store: Option<Store>,
    url: &str,
    config: StoreConfig,
) -> Result<(Store, Option<SqliteLock>)> {
    if let Some(store) = store {
        let lock = lock(&store)?;
        return Ok((store, lock));
    }
    let early = lock_url(url)?;
    let store = Store::connect_with(url, config).await?;
    let lock = match early {
        Some(lock) => Some(lock),
        None => lock(&store)?,
    };
    Ok((store, lock))
}

/// Takes the lock of the SQLite file that `url` names, before it is opened: `None` for
/// PostgreSQL, an in-memory database, or a file whose directory does not exist.
///
/// # Errors
/// As [`lock`].
pub(crate) fn lock_url(url: &str) -> Result<Option<SqliteLock>> {
    Store::database_file_of(url).map_or(Ok(None), lock_file)
}

/// Takes the lock of `store`'s SQLite file, if it has one.
///
/// # Errors
/// [`Error::SqliteInUse`] if another runtime (in this process or another) holds it;
/// [`Error::Config`] if the lock file cannot be opened.
pub(crate) fn lock(store: &Store) -> Result<Option<SqliteLock>> {
    store.database_file().map_or(Ok(None), lock_file)
}

fn lock_file(db: PathBuf) -> Result<Option<SqliteLock>> {
    let Some(path) = lock_path(&db) else {
        return Ok(None);
    };
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
