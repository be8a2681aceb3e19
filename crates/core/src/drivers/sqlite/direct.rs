//! A hop's statements run on SQLite's connection from the calling thread.
//!
//! sqlx runs each SQLite connection on a thread of its own and sends it every query
//! through a channel, so each round trip of a hop is two hand-offs between threads: on
//! the saga bench, ~40 % of the writer's CPU and a third of the process's went to
//! putting threads to sleep and waking them, more than SQLite's own work. A hop of
//! SQLite's lane (see [`Store::begin`](crate::store::Store::begin)) runs its statements here
//! instead: the lane locks the connection away from its thread once
//! ([`sqlx::sqlite::SqliteConnection::lock_handle`], sqlx's documented way to call
//! SQLite directly) and runs the statements through `libsqlite3-sys` (the SQLite sqlx
//! itself links), on the thread that holds the lock.
//!
//! The lock is released before anything else uses the connection through sqlx (a
//! statement of the caller's, the commit), since sqlx's thread waits for it; the
//! statements prepared under it are finalized first. Values are bound as sqlx binds
//! them (text, 64-bit integers, reals, blobs, `NULL`; a [`MessageId`] as hyphenated
//! text), so rows written either way read the same.
//!
//! The lane's connection ([`LaneConn`]) is owned here, on the heap, so that the lock
//! can borrow it for as long as the session lives: the borrow checker sees a
//! `'static` borrow, and the lane connection keeps the promise that makes it one (the
//! session is dropped before the connection is freed, and nothing else uses the
//! connection while the session lives). This module is the crate's only `unsafe`
//! code; the lane's stress tests (`store::tests::hop`, `store::tests::tail`) and the
//! saga suites on SQLite run every block of it.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int};
use std::ptr::NonNull;
use std::sync::Arc;

use libsqlite3_sys as ffi;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{LockedSqliteHandle, Sqlite, SqliteConnection};

use super::statements::{DirectError, Row, Statement, Value};
use crate::{Error, Result};

/// Turns SQLite's memory statistics off, once per process, before the first
/// connection opens (afterwards SQLite refuses the change, and nothing changes): with
/// them on, every allocation SQLite makes takes a process-wide mutex to count it, ~4 %
/// of the saga bench's writer thread. `sqlite3_memory_used` then reports 0.
pub(crate) fn memory_statistics_off() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: SQLITE_CONFIG_MEMSTATUS takes one int. Before SQLite is initialized
        // it applies; after, it returns SQLITE_MISUSE and changes nothing.
        let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int) };
        tracing::debug!(rc, "sqlite memory statistics off");
    });
}

/// The writer connection of SQLite's lane: used through sqlx ([`sqlx`](Self::sqlx)) or
/// locked away from sqlx's thread for statements run here ([`session`](Self::session)),
/// one at a time.
pub(crate) struct LaneConn {
    /// The lock, while statements run here. Declared first: dropped before the
    /// connection is freed (and in `Drop`, explicitly, before that).
    session: Option<Session>,
    /// The connection, leaked from a `Box` in [`new`](Self::new) and freed in `Drop`:
    /// it does not move, so the session's lock can borrow it.
    conn: NonNull<PoolConnection<Sqlite>>,
    /// A transaction is open on it, or may be (one that failed to end). sqlx knows
    /// nothing of it: dropped so, the connection is closed instead of going back to
    /// the pool, and closing rolls the transaction back.
    pub(crate) open: bool,
}

// SAFETY: the lane connection owns the connection behind `conn` (a `PoolConnection`,
// which is `Send`: checked below) and the session (`Send`, above); both are used only
// through `&mut self`.
unsafe impl Send for LaneConn {}

/// The claim above, checked: a `PoolConnection<Sqlite>` that stopped being `Send` would
/// not compile here.
const _: fn() = || {
    fn send<T: Send>() {}
    send::<PoolConnection<Sqlite>>();
};

impl std::fmt::Debug for LaneConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaneConn")
            .field("session", &self.session)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

impl LaneConn {
    pub(crate) fn new(conn: PoolConnection<Sqlite>) -> Self {
        Self {
            session: None,
            conn: NonNull::from(Box::leak(Box::new(conn))),
            open: false,
        }
    }

    /// The connection for sqlx: the session, if any, is ended first (its statements
    /// finalized, the lock given back to sqlx's thread, which waits for it).
    pub(crate) fn sqlx(&mut self) -> &mut SqliteConnection {
        self.session = None;
        // SAFETY: `conn` is live until `Drop`, and with the session dropped nothing
        // else borrows it: this borrow is the only one, for as long as `&mut self`.
        unsafe { self.conn.as_mut() }
    }

    /// The session in which statements run here, the connection locked now if need
    /// be.
    ///
    /// # Errors
    /// [`Error::Database`] if sqlx's thread could not give the connection up.
    pub(crate) async fn session(&mut self) -> Result<&mut Session> {
        let session = match self.session.take() {
            Some(session) => session,
            None => {
                // SAFETY: `conn` is live until `Drop`, which drops the session (whose
                // lock holds this borrow) before freeing it; while the session lives
                // nothing else borrows the connection (`sqlx` drops the session
                // first). If the lock fails or this call is cancelled, the borrow
                // ends with it.
                let conn: &'static mut PoolConnection<Sqlite> = unsafe { &mut *self.conn.as_ptr() };
                Session::lock(conn).await?
            }
        };
        Ok(self.session.insert(session))
    }

    /// The session, if the connection is locked now.
    pub(crate) fn locked(&mut self) -> Option<&mut Session> {
        self.session.as_mut()
    }
}

impl Drop for LaneConn {
    fn drop(&mut self) {
        self.session = None;
        // SAFETY: `conn` was leaked from a `Box` in `new` and is freed only here; the
        // session, whose lock was its one lasting borrow, is dropped.
        let mut conn = unsafe { Box::from_raw(self.conn.as_ptr()) };
        if self.open {
            conn.close_on_drop();
        }
    }
}

/// A prepared statement and its columns' names.
struct Prepared {
    stmt: NonNull<ffi::sqlite3_stmt>,
    columns: Arc<[String]>,
}

/// The connection locked away from sqlx's thread, with the statements prepared under
/// the lock. Dropping it finalizes them and gives the connection back.
pub(crate) struct Session {
    db: NonNull<ffi::sqlite3>,
    /// Keyed by SQL text, looked up once per statement run: a fast hash (foldhash), not
    /// std's SipHash, which cost ~3 % of the saga bench's CPU hashing SQL text twice per
    /// run. The keys are our own statements, so hash flooding is no concern.
    prepared: HashMap<String, Prepared, foldhash::fast::FixedState>,
    /// Declared last: dropped after the statements are finalized (in `Drop`).
    _lock: LockedSqliteHandle<'static>,
}

// SAFETY: the handle and the statements are used only through `&mut Session`, by one
// thread at a time, while the lock keeps sqlx's thread off the connection (SQLite is
// built thread-safe; a connection may move between threads when not in use).
unsafe impl Send for Session {}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("prepared", &self.prepared.len())
            .finish_non_exhaustive()
    }
}

impl Session {
    /// Locks `c` away from sqlx's thread, for as long as the session lives (`c` is
    /// borrowed for good: see [`LaneConn::session`], which owns the connection).
    async fn lock(c: &'static mut SqliteConnection) -> Result<Self> {
        let mut lock = c.lock_handle().await?;
        let db = lock.as_raw_handle();
        // The query planner's stability guarantee: a statement is not prepared again
        // when a bound value changes (SQLite does so for a bound value it could plan
        // with, such as the relay's `LIMIT ?`: ~2 % of the saga bench's CPU). Plans
        // here do not depend on values (keys, ids, states).
        // SAFETY: `db` is live and locked; the option takes an int and an out-pointer
        // that may be null.
        unsafe {
            ffi::sqlite3_db_config(
                db.as_ptr(),
                ffi::SQLITE_DBCONFIG_ENABLE_QPSG,
                1 as c_int,
                std::ptr::null_mut::<c_int>(),
            );
        }
        Ok(Self {
            db,
            prepared: HashMap::default(),
            _lock: lock,
        })
    }

    /// Rows changed by the last statement run.
    pub(crate) fn changes(&self) -> u64 {
        // SAFETY: `db` is a live connection this session holds the lock of.
        let n = unsafe { ffi::sqlite3_changes64(self.db.as_ptr()) };
        u64::try_from(n).unwrap_or(0)
    }

    /// Sets the connection's busy timeout (how long a statement waits for another
    /// process's lock).
    pub(crate) fn busy_timeout(&mut self, timeout: std::time::Duration) {
        let ms = c_int::try_from(timeout.as_millis()).unwrap_or(c_int::MAX);
        // SAFETY: `db` is a live connection this session holds the lock of.
        unsafe { ffi::sqlite3_busy_timeout(self.db.as_ptr(), ms) };
    }

    fn error(&self, code: c_int) -> Error {
        // SAFETY: `db` is a live connection this session holds the lock of.
        let message = unsafe {
            let m = ffi::sqlite3_errmsg(self.db.as_ptr());
            if m.is_null() {
                format!("sqlite error {code}")
            } else {
                CStr::from_ptr(m).to_string_lossy().into_owned()
            }
        };
        // SAFETY: as above.
        let code = unsafe { ffi::sqlite3_extended_errcode(self.db.as_ptr()) };
        Error::Database(sqlx::Error::Database(Box::new(DirectError {
            code,
            message,
        })))
    }

    /// The statement prepared for `sql` (prepared now if need be), and its columns.
    fn prepare(&mut self, sql: &str) -> Result<(NonNull<ffi::sqlite3_stmt>, Arc<[String]>)> {
        if let Some(p) = self.prepared.get(sql) {
            return Ok((p.stmt, Arc::clone(&p.columns)));
        }
        let len = c_int::try_from(sql.len())
            .map_err(|_| Error::Database(sqlx::Error::Protocol("statement too long".to_owned())))?;
        let mut stmt = std::ptr::null_mut();
        let mut tail: *const c_char = std::ptr::null();
        // SAFETY: `sql` is valid for `len` bytes; the out-pointers are valid.
        let rc = unsafe {
            ffi::sqlite3_prepare_v3(
                self.db.as_ptr(),
                sql.as_ptr().cast::<c_char>(),
                len,
                ffi::SQLITE_PREPARE_PERSISTENT,
                &mut stmt,
                &mut tail,
            )
        };
        if rc != ffi::SQLITE_OK {
            return Err(self.error(rc));
        }
        let Some(stmt) = NonNull::new(stmt) else {
            return Err(Error::Database(sqlx::Error::Protocol(
                "an empty statement".to_owned(),
            )));
        };
        // SAFETY: `tail` points into `sql` (or at its end).
        let rest = unsafe { tail.offset_from(sql.as_ptr().cast::<c_char>()) };
        let rest = usize::try_from(rest).unwrap_or(sql.len());
        if !sql.get(rest..).unwrap_or_default().trim().is_empty() {
            // SAFETY: `stmt` was just prepared and is not kept.
            unsafe { ffi::sqlite3_finalize(stmt.as_ptr()) };
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "one statement expected: {sql}"
            ))));
        }
        // SAFETY: `stmt` is a prepared statement.
        let n = unsafe { ffi::sqlite3_column_count(stmt.as_ptr()) };
        let columns = (0..n)
            .map(|i| {
                // SAFETY: `i` is a column of `stmt`.
                let name = unsafe { ffi::sqlite3_column_name(stmt.as_ptr(), i) };
                if name.is_null() {
                    String::new()
                } else {
                    // SAFETY: SQLite returns a NUL-terminated string.
                    unsafe { CStr::from_ptr(name) }
                        .to_string_lossy()
                        .into_owned()
                }
            })
            .collect::<Arc<[String]>>();
        self.prepared.insert(
            sql.to_owned(),
            Prepared {
                stmt,
                columns: Arc::clone(&columns),
            },
        );
        Ok((stmt, columns))
    }

    /// Runs one statement, passing each row it returns to `row`.
    pub(crate) fn run(&mut self, st: &Statement, mut row: impl FnMut(Row)) -> Result<()> {
        let (stmt, columns) = self.prepare(&st.sql)?;
        let stmt = stmt.as_ptr();
        let result = self.bind_and_step(stmt, st, &columns, &mut row);
        // SAFETY: `stmt` is a prepared statement of this connection; the values bound
        // (borrowed from `st`, `SQLITE_STATIC`) are cleared before `st` can go.
        unsafe {
            ffi::sqlite3_reset(stmt);
            ffi::sqlite3_clear_bindings(stmt);
        }
        result
    }

    fn bind_and_step(
        &self,
        stmt: *mut ffi::sqlite3_stmt,
        st: &Statement,
        columns: &Arc<[String]>,
        row: &mut impl FnMut(Row),
    ) -> Result<()> {
        // SAFETY: `stmt` is a prepared statement of this connection.
        let count = unsafe { ffi::sqlite3_bind_parameter_count(stmt) };
        if usize::try_from(count).ok() != Some(st.binds.len()) {
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "{} values for {count} parameters",
                st.binds.len()
            ))));
        }
        for (i, value) in st.binds.iter().enumerate() {
            let i = c_int::try_from(i + 1).unwrap_or(c_int::MAX);
            // SAFETY: `i` is a parameter of `stmt`; text and blobs are bound static,
            // valid until the bindings are cleared (in `run`, before `st` can go).
            let rc = unsafe {
                match value {
                    Value::Null => ffi::sqlite3_bind_null(stmt, i),
                    Value::Int(v) => ffi::sqlite3_bind_int64(stmt, i, *v),
                    Value::Real(v) => ffi::sqlite3_bind_double(stmt, i, *v),
                    Value::Text(v) => ffi::sqlite3_bind_text64(
                        stmt,
                        i,
                        v.as_ptr().cast::<c_char>(),
                        v.len() as u64,
                        ffi::SQLITE_STATIC(),
                        ffi::SQLITE_UTF8 as u8,
                    ),
                    Value::Blob(v) => ffi::sqlite3_bind_blob64(
                        stmt,
                        i,
                        v.as_ptr().cast(),
                        v.len() as u64,
                        ffi::SQLITE_STATIC(),
                    ),
                }
            };
            if rc != ffi::SQLITE_OK {
                return Err(self.error(rc));
            }
        }
        loop {
            // SAFETY: as above.
            let rc = unsafe { ffi::sqlite3_step(stmt) };
            match rc {
                ffi::SQLITE_DONE => return Ok(()),
                ffi::SQLITE_ROW => row(Self::read(stmt, columns)),
                _ => return Err(self.error(rc)),
            }
        }
    }

    /// The bytes of column `i` of `stmt`'s row, at `p` (its text or blob; null for an
    /// empty one).
    ///
    /// # Safety
    /// `stmt` has a row, `i` is one of its columns and `p` its text or blob pointer,
    /// just taken: the slice is valid until the next step, reset or conversion.
    unsafe fn column_bytes<'a>(stmt: *mut ffi::sqlite3_stmt, i: c_int, p: *const u8) -> &'a [u8] {
        if p.is_null() {
            return &[];
        }
        // SAFETY: as the caller promises; SQLite gives the size after the pointer.
        unsafe {
            let n = usize::try_from(ffi::sqlite3_column_bytes(stmt, i)).unwrap_or(0);
            std::slice::from_raw_parts(p, n)
        }
    }

    fn read(stmt: *mut ffi::sqlite3_stmt, columns: &Arc<[String]>) -> Row {
        let mut values = Vec::with_capacity(columns.len());
        for i in 0..columns.len() {
            let i = c_int::try_from(i).unwrap_or(c_int::MAX);
            // SAFETY: `stmt` has a row, `i` is one of its columns; the text and blob
            // pointers are valid until the next step, and copied here.
            let value = unsafe {
                match ffi::sqlite3_column_type(stmt, i) {
                    ffi::SQLITE_INTEGER => Value::Int(ffi::sqlite3_column_int64(stmt, i)),
                    ffi::SQLITE_FLOAT => Value::Real(ffi::sqlite3_column_double(stmt, i)),
                    ffi::SQLITE_TEXT => {
                        let p = ffi::sqlite3_column_text(stmt, i);
                        let bytes = Self::column_bytes(stmt, i, p);
                        Value::Text(String::from_utf8_lossy(bytes).into_owned())
                    }
                    ffi::SQLITE_BLOB => {
                        let p = ffi::sqlite3_column_blob(stmt, i).cast::<u8>();
                        Value::Blob(Self::column_bytes(stmt, i, p).to_vec())
                    }
                    _ => Value::Null,
                }
            };
            values.push(value);
        }
        Row {
            columns: Arc::clone(columns),
            values,
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        for (_, p) in self.prepared.drain() {
            // SAFETY: each statement was prepared on this connection, is not in use,
            // and is finalized once; the lock is still held.
            unsafe { ffi::sqlite3_finalize(p.stmt.as_ptr()) };
        }
    }
}
