//! A hop's statements run on SQLite's connection from the calling thread.
//!
//! sqlx runs each SQLite connection on a thread of its own and sends it every query
//! through a channel, so each round trip of a hop is two hand-offs between threads: on
//! the saga bench, ~40 % of the writer's CPU and a third of the process's went to
//! putting threads to sleep and waking them, more than SQLite's own work. A hop of
//! SQLite's lane (see [`Store::hop`](crate::store::Store::hop)) runs its statements here
//! instead: the lane locks the connection away from its thread
//! ([`sqlx::sqlite::SqliteConnection::lock_handle`], sqlx's documented way to call
//! SQLite directly) and runs the statements through `rusqlite` over the handle sqlx
//! lends (`rusqlite` links the `libsqlite3-sys`, so the SQLite, sqlx links), on the
//! thread that holds the lock.
//!
//! The lock stays held from one statement to the next, across the hops' awaits, until
//! anything else uses the connection through sqlx (a statement of the caller's, the
//! commit): taking and giving it back is a round trip to sqlx's thread. sqlx's lock
//! borrows the connection, and the lane keeps both in its transaction (a struct), so
//! a [`Writer`] holds them as one: the connection moves into a future
//! ([`hold`]) that takes the lock, lends the handle to `rusqlite`, and waits, suspended
//! with the lock held, until it is told to give it back. The borrow of the connection
//! by the lock is then the compiler's, inside that future: no lifetime is forged. The
//! statements prepared under the lock (`rusqlite`'s statement cache) are finalized
//! before the lock is given back.
//!
//! Taking the lock costs a round trip to sqlx's thread (~8 µs a lock and its release in
//! a debug build, against ~1.2 µs a `SELECT 1` run here), hence held across awaits
//! rather than taken per statement. sqlx 0.9's `lock_handle` asks its thread to let go
//! of the lock (a message) while it waits for it; when the lock is free already (taken
//! again right after it was given back) the message is left over, and with 50 left
//! over (the channel's size) a `lock_handle` holds the lock while it waits for room in
//! the channel, which sqlx's thread, waiting for the lock, never makes (as sqlx's code
//! reads; seen: a plain loop of `lock_handle` and drop hangs within a few hundred
//! rounds). A statement through sqlx drains the channel (sqlx's thread takes the
//! messages in order), and the lane gives the lock back only for sqlx to use the
//! connection.
//!
//! `rusqlite` costs a little more per statement than the hand-written FFI it replaced
//! (~1.5 µs against ~1.2 µs for an insert, a select of one row or an update, in a
//! release build): its statement cache allocates the SQL text as its key per run and
//! updates its LRU order, and it binds text and blobs by copy. On the saga bench that
//! is within the spread between runs.
//!
//! Values are bound as sqlx binds them (text, 64-bit integers, reals, blobs, `NULL`; a
//! [`MessageId`](crate::MessageId) as hyphenated text), so rows written either way
//! read the same. A database error is reported as sqlx reports SQLite's: the extended
//! result code as the code.
//!
//! This module is the crate's only `unsafe` code: SQLite's memory statistics turned
//! off, and the handle lent to `rusqlite` ([`rusqlite::Connection::from_handle`]).
//! Miri cannot run SQLite (C); the tests in `direct/tests.rs` (the writer moving
//! between sqlx and the session, a lock cancelled midway) and `store::tests::stress`
//! (hops of every kind at once on one store, errors in the middle) exercise it instead.
#![allow(unsafe_code)]

use std::collections::HashMap;
use std::ffi::c_int;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use rusqlite::ffi;
use rusqlite::types::{ToSqlOutput, ValueRef};
use sqlx::Sqlite;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::SqliteConnection;
use tokio::sync::oneshot;

use super::statements::{Row, Statement, Value};
use crate::{Error, Result};

mod error;
use error::error;

/// Turns SQLite's memory statistics off, once per process, before the first
/// connection opens (afterwards SQLite refuses the change, and nothing changes): with
/// them on, every allocation SQLite makes takes a process-wide mutex to count it, ~4 %
/// of the saga bench's writer thread. `sqlite3_memory_used` then reports 0.
pub(crate) fn memory_statistics_off() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: SQLITE_CONFIG_MEMSTATUS takes one int (the variadic argument is
        // passed as one). Before SQLite is initialized it applies; after, it returns
        // SQLITE_MISUSE and changes nothing. No pointer is involved.
        let rc = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, 0 as c_int) };
        tracing::debug!(rc, "sqlite memory statistics off");
    });
}

/// How many statements `rusqlite` keeps prepared per session (its default is 16): the
/// lane's all fit (a few dozen texts: lists of rows are bound as one JSON array).
const STATEMENT_CACHE: usize = 256;

/// The future that holds the lock: see [`hold`].
type Held = Pin<Box<dyn Future<Output = PoolConnection<Sqlite>> + Send>>;

/// What [`hold`] lends: the handle as `rusqlite`'s connection, or why not.
type Lent = std::result::Result<rusqlite::Connection, Error>;

/// Locks `conn` away from sqlx's thread, sends the handle it lends on `lent` as a
/// `rusqlite` connection, and holds the lock until `release` is sent or dropped (the
/// connection lent must be dropped before: see [`Session`]); then gives the
/// connection back. Dropped before it ends, it closes the connection instead of
/// giving it back to the pool (a transaction may be open on it).
async fn hold(
    conn: PoolConnection<Sqlite>,
    lent: oneshot::Sender<Lent>,
    release: oneshot::Receiver<()>,
) -> PoolConnection<Sqlite> {
    let mut conn = Closing(Some(conn));
    if let Some(c) = conn.0.as_mut() {
        match c.lock_handle().await {
            Err(e) => {
                let _ = lent.send(Err(e.into()));
            }
            Ok(mut lock) => {
                let db = lock.as_raw_handle().as_ptr();
                // SAFETY: `db` is the live connection whose lock `lock` holds: sqlx's
                // thread, the only other user of it, waits for the lock. The
                // `rusqlite` connection made of it does not close it when dropped
                // (`from_handle`, not `from_handle_owned`), and is used and dropped
                // only while this future is suspended at the `release.await` below,
                // `lock` held: `Session` keeps it beside this future, declared (so
                // dropped) first, and `Session::release` drops it before polling
                // this future again. Nothing else takes the handle from it.
                let connection = unsafe { rusqlite::Connection::from_handle(db) };
                let _ = lent.send(connection.map_err(error));
                let _ = release.await;
                drop(lock);
            }
        }
    }
    conn.0.take().unwrap_or_else(|| unreachable!("taken once"))
}

/// The connection inside [`hold`]: closed if the future is dropped before it ends.
struct Closing(Option<PoolConnection<Sqlite>>);

impl Drop for Closing {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            c.close_on_drop();
        }
    }
}

/// [`hold`] under way: the lock asked for, not yet granted.
struct Locking {
    held: Held,
    lent: oneshot::Receiver<Lent>,
    release: oneshot::Sender<()>,
    /// The connection [`hold`] returned, if it ended without lending (the lock not
    /// taken).
    ended: Option<PoolConnection<Sqlite>>,
}

impl Locking {
    fn new(conn: PoolConnection<Sqlite>) -> Self {
        let (lent_tx, lent) = oneshot::channel();
        let (release, released) = oneshot::channel();
        Self {
            held: Box::pin(hold(conn, lent_tx, released)),
            lent,
            release,
            ended: None,
        }
    }

    /// Polls [`hold`] until it lends the handle, or fails to.
    fn poll_lent(&mut self, cx: &mut Context<'_>) -> Poll<Lent> {
        if let Poll::Ready(conn) = self.held.as_mut().poll(cx) {
            self.ended = Some(conn);
        }
        match self.lent.try_recv() {
            Ok(lent) => Poll::Ready(lent),
            Err(oneshot::error::TryRecvError::Empty) if self.ended.is_none() => Poll::Pending,
            Err(_) => Poll::Ready(Err(Error::Database(sqlx::Error::WorkerCrashed))),
        }
    }

    /// Gives the lock back (or stops asking for it) and returns the connection.
    fn finish(self) -> PoolConnection<Sqlite> {
        // A handle lent and not taken goes before the lock (see `hold`).
        drop(self.lent);
        match self.ended {
            Some(conn) => conn,
            None => finish(self.held, self.release),
        }
    }
}

/// Tells [`hold`] to give the lock back, and takes the connection it returns: at
/// once, since all that is left of it is dropping the lock; only after a lock asked
/// for but not yet granted (a [`Writer::session`] cancelled midway) does this wait
/// (the calling thread parked) for the grant, a hand-off with sqlx's thread.
fn finish(mut held: Held, release: oneshot::Sender<()>) -> PoolConnection<Sqlite> {
    drop(release);
    if let Poll::Ready(conn) = held.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        return conn;
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    loop {
        if let Poll::Ready(conn) = held.as_mut().poll(&mut Context::from_waker(&waker)) {
            return conn;
        }
        std::thread::park();
    }
}

/// Wakes a thread parked in [`finish`].
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// The connection locked away from sqlx's thread, lent to `rusqlite`, with the
/// statements prepared under the lock.
pub(crate) struct Session {
    /// The handle lent. Declared first, so dropped (its statements finalized) before
    /// `held` gives the lock back; [`release`](Self::release) drops it first too.
    db: rusqlite::Connection,
    /// Each statement's columns, by SQL text, taken when it first returns a row: a
    /// fast hash (foldhash), not std's SipHash. The keys are our own statements, so
    /// hash flooding is no concern.
    columns: HashMap<String, Arc<[String]>, foldhash::fast::FixedState>,
    held: Held,
    release: oneshot::Sender<()>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("columns", &self.columns.len())
            .finish_non_exhaustive()
    }
}

impl Session {
    fn new(db: rusqlite::Connection, locking: Locking) -> Self {
        db.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // The query planner's stability guarantee: a statement is not prepared again
        // when a bound value changes (SQLite does so for a bound value it could plan
        // with, such as the relay's `LIMIT ?`: ~2 % of the saga bench's CPU). Plans
        // here do not depend on values (keys, ids, states).
        let _ = db.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
            true,
        );
        Self {
            db,
            columns: HashMap::default(),
            held: locking.held,
            release: locking.release,
        }
    }

    /// Finalizes the statements, gives the lock back and returns the connection.
    fn release(self) -> PoolConnection<Sqlite> {
        let Self {
            db, held, release, ..
        } = self;
        // The lent handle goes before the lock: see `hold`.
        drop(db);
        finish(held, release)
    }

    /// Rows changed by the last statement run.
    pub(crate) fn changes(&self) -> u64 {
        self.db.changes()
    }

    /// Sets the connection's busy timeout (how long a statement waits for another
    /// process's lock).
    pub(crate) fn busy_timeout(&mut self, timeout: std::time::Duration) {
        let _ = self.db.busy_timeout(timeout);
    }

    /// Runs one statement, passing each row it returns to `row`.
    pub(crate) fn run(&mut self, st: &Statement, mut row: impl FnMut(Row)) -> Result<()> {
        let mut stmt = self.db.prepare_cached(&st.sql).map_err(error)?;
        let count = stmt.parameter_count();
        if count != st.binds.len() {
            return Err(Error::Database(sqlx::Error::Protocol(format!(
                "{} values for {count} parameters",
                st.binds.len()
            ))));
        }
        for (i, value) in st.binds.iter().enumerate() {
            let value = match value {
                Value::Null => ValueRef::Null,
                Value::Int(v) => ValueRef::Integer(*v),
                Value::Real(v) => ValueRef::Real(*v),
                Value::Text(v) => ValueRef::Text(v.as_bytes()),
                Value::Blob(v) => ValueRef::Blob(v),
            };
            stmt.raw_bind_parameter(i + 1, ToSqlOutput::Borrowed(value))
                .map_err(error)?;
        }
        let mut rows = stmt.raw_query();
        let mut columns: Option<Arc<[String]>> = None;
        while let Some(r) = rows.next().map_err(error)? {
            let columns = match &columns {
                Some(c) => c,
                None => {
                    let c = match self.columns.get(&st.sql) {
                        Some(c) => Arc::clone(c),
                        None => {
                            let c: Arc<[String]> = r
                                .as_ref()
                                .column_names()
                                .into_iter()
                                .map(str::to_owned)
                                .collect();
                            self.columns.insert(st.sql.clone(), Arc::clone(&c));
                            c
                        }
                    };
                    columns.insert(c)
                }
            };
            let mut values = Vec::with_capacity(columns.len());
            for i in 0..columns.len() {
                values.push(match r.get_ref(i).map_err(error)? {
                    ValueRef::Null => Value::Null,
                    ValueRef::Integer(v) => Value::Int(v),
                    ValueRef::Real(v) => Value::Real(v),
                    ValueRef::Text(v) => Value::Text(String::from_utf8_lossy(v).into_owned()),
                    ValueRef::Blob(v) => Value::Blob(v.to_vec()),
                });
            }
            row(Row {
                columns: Arc::clone(columns),
                values,
            });
        }
        Ok(())
    }
}

/// The writer connection of SQLite's lane: free for sqlx, or locked for statements
/// run here (see the module docs). Dropped locked, it gives the lock back first.
pub(crate) struct Writer {
    state: State,
}

enum State {
    Free(PoolConnection<Sqlite>),
    /// A lock asked for and not yet granted: only while [`Writer::session`] waits, or
    /// after it was cancelled there.
    Locking(Locking),
    Locked(Session),
    /// Only within one of `Writer`'s methods, between taking the state and putting
    /// one back (no await nor anything that can fail in between).
    Moved,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Free(_) => "free",
            State::Locking(_) => "locking",
            State::Locked(_) => "locked",
            State::Moved => "moved",
        };
        f.debug_struct("Writer").field("state", &state).finish()
    }
}

impl Writer {
    pub(crate) fn new(conn: PoolConnection<Sqlite>) -> Self {
        Self {
            state: State::Free(conn),
        }
    }

    /// Gives the lock back if it is held (finalizing the statements prepared under it).
    pub(crate) fn unlock(&mut self) {
        self.state = match std::mem::replace(&mut self.state, State::Moved) {
            State::Free(c) => State::Free(c),
            State::Locking(l) => State::Free(l.finish()),
            State::Locked(s) => State::Free(s.release()),
            State::Moved => unreachable!("a writer's state is put back"),
        };
    }

    /// The connection, for sqlx: the lock given back first.
    pub(crate) fn conn(&mut self) -> &mut SqliteConnection {
        self.unlock();
        match &mut self.state {
            State::Free(c) => c,
            _ => unreachable!("unlocked above"),
        }
    }

    /// Closes the connection when it is dropped, instead of giving it back to the
    /// pool.
    pub(crate) fn close_on_drop(&mut self) {
        self.unlock();
        if let State::Free(c) = &mut self.state {
            c.close_on_drop();
        }
    }

    /// The session if the connection is locked.
    pub(crate) fn locked(&mut self) -> Option<&mut Session> {
        match &mut self.state {
            State::Locked(s) => Some(s),
            _ => None,
        }
    }

    /// The connection locked for statements run here, locked now if need be.
    pub(crate) async fn session(&mut self) -> Result<&mut Session> {
        if matches!(self.state, State::Free(_)) {
            let State::Free(conn) = std::mem::replace(&mut self.state, State::Moved) else {
                unreachable!("matched above")
            };
            self.state = State::Locking(Locking::new(conn));
        }
        if let State::Locking(l) = &mut self.state {
            let lent = std::future::poll_fn(|cx| l.poll_lent(cx)).await;
            let State::Locking(l) = std::mem::replace(&mut self.state, State::Moved) else {
                unreachable!("matched above")
            };
            match lent {
                Ok(db) => self.state = State::Locked(Session::new(db, l)),
                Err(e) => {
                    self.state = State::Free(l.finish());
                    return Err(e);
                }
            }
        }
        match &mut self.state {
            State::Locked(s) => Ok(s),
            _ => unreachable!("locked above"),
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.unlock();
    }
}

#[cfg(test)]
mod tests;
