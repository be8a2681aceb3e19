//! A hop's opening round trip on SQLite: the end of the hop before it (its deferred
//! last write, the release of its savepoint), then this hop's savepoint, inbox record
//! and prefetch read, through sqlx or on the connection directly.

use std::time::Duration;

use sqlx::SqliteConnection;

use super::Sqlite;
use super::direct::Session;
use super::statements::{self, Statement, Statements, Value};
use super::tail::Tail;
use crate::store::prefetch::{Prefetch, Prefetched};
use crate::{Error, MessageId};

/// How long a hop's opening round trip is waited for without sleeping ([`Answer`]).
const ANSWER_SPIN: Duration = Duration::from_micros(300);

/// A hop's inbox record, around its values (consumer, message id, time): returns a
/// row if the message was recorded now, none if it was there already.
const INBOX_RECORD_HEAD: &str = "INSERT INTO inbox (consumer, message_id, received_at) VALUES (";
const INBOX_RECORD_TAIL: &str = ") ON CONFLICT DO NOTHING RETURNING 1";

/// Waits for the items of a hop's opening round trip to the writer's thread without a
/// wake-up per item, where it can.
///
/// sqlx sends a round trip's results one item at a time (a row, a statement's count),
/// each through a channel to the waiting task; a task that sleeps between items is woken
/// for each (a hop's round trip has ten or more), and on this project's 2-vCPU VMs a
/// wake-up that crosses vCPUs costs more than the statement it waits for. So for up to
/// [`ANSWER_SPIN`] from the round trip's start, the items are polled without a waker,
/// the thread yielding between polls (to the connection's thread, if they share a
/// vCPU); after that, the wait sleeps as any other. Measured on the saga bench
/// (2026-11-25): +10–20 % sagas/s on SQLite. The budget bounds how long a round trip
/// keeps its tokio worker from other tasks. (Waiting alike for `BEGIN`, `COMMIT` and
/// the relay's claims and acknowledgements, which also run in the lane, made no
/// measurable difference: they are a few round trips per batch of hops.)
struct Answer {
    until: std::time::Instant,
}

impl Answer {
    fn new() -> Self {
        Self {
            until: std::time::Instant::now() + ANSWER_SPIN,
        }
    }

    async fn wait<F: std::future::Future>(&mut self, fut: F) -> F::Output {
        use std::task::{Context, Poll, Waker};
        let mut fut = std::pin::pin!(fut);
        loop {
            // The context lives in this block alone: it is not `Send`, and the wait below
            // is an await point.
            let polled = fut.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            if let Poll::Ready(v) = polled {
                return v;
            }
            if std::time::Instant::now() >= self.until {
                return fut.await;
            }
            std::thread::yield_now();
        }
    }
}

impl Sqlite {
    /// Runs `prefix` (`statements` savepoint statements, each ending in `;`) and then,
    /// if `inbox` is given, records that message in the inbox, all in one round trip
    /// (one hand-off to the connection's thread). `Ok(Some(true))`: recorded now;
    /// `Ok(Some(false))`: it was there already. On an error, also how many statements
    /// of the prefix completed before it, so the caller knows which hop it belongs to.
    ///
    /// Several statements in one query is a SQLite-only feature of sqlx (deprecated
    /// upstream, sqlx#3108, but supported by the 0.9 the lockfile pins); the hop tests
    /// fail if it goes.
    pub(crate) async fn open_hop(
        c: &mut SqliteConnection,
        tail: Option<&mut Tail>,
        prefix: &'static str,
        statements: usize,
        inbox: Option<(&str, MessageId)>,
        prefetch: Option<&Prefetch>,
        now_ms: i64,
    ) -> std::result::Result<Opened, OpenFailed> {
        use sqlx::Executor;
        // One query, its parameters all `?` (a numbered one would count from the first
        // statement's): the tail's statements, the prefix, the inbox record, the read.
        let (mut q, tail_statements) = match tail {
            Some(t) => {
                let mut q = t.query.to_sqlx();
                q.push(";\n");
                (q, t.query.len())
            }
            None => (sqlx::QueryBuilder::new(""), 0),
        };
        q.push(prefix);
        if let Some((consumer, id)) = inbox {
            q.push(INBOX_RECORD_HEAD);
            q.separated(", ")
                .push_bind(consumer.to_owned())
                .push_bind(id)
                .push_bind(now_ms);
            q.push(INBOX_RECORD_TAIL);
            q.push(";\n");
        }
        if let Some(read) = prefetch {
            // The load's one `?`, its key.
            let mut parts = Sqlite::load_sql(read.load).split('?');
            q.push(parts.next().unwrap_or_default());
            for part in parts {
                q.push_bind(read.key.hyphenated().to_string());
                q.push(part);
            }
        }
        let mut opened = Opened::default();
        if tail_statements == 0 && prefix.is_empty() && inbox.is_none() && prefetch.is_none() {
            return Ok(opened);
        }
        // Count the statements that completed. The rows of the tail's statements are
        // its leased messages'; the inbox record returns a row if it was written now;
        // the rows after it are the read's.
        let reads_from = tail_statements + statements + usize::from(inbox.is_some());
        let mut done = 0;
        let mut recorded = false;
        let mut rows = Vec::new();
        let mut results = c.fetch_many(q.build());
        let mut answer = Answer::new();
        let failed = |done: usize, error: Error, tail_rows| OpenFailed {
            // A failure in the tail counts as one before the prefix's first statement
            // completed.
            prefix_done: done.saturating_sub(tail_statements).min(statements),
            error,
            tail_rows,
        };
        while let Some(step) = answer
            .wait(std::future::poll_fn(|cx| results.as_mut().poll_next(cx)))
            .await
        {
            match step {
                Ok(sqlx::Either::Left(_)) => done += 1,
                Ok(sqlx::Either::Right(row)) => {
                    let row = match statements::Row::from_sqlite(&row) {
                        Ok(row) => row,
                        Err(e) => return Err(failed(done, e, opened.tail_rows)),
                    };
                    if done < tail_statements {
                        opened.tail_rows.push((done, row));
                    } else if done >= reads_from {
                        rows.push(row);
                    } else {
                        recorded = true;
                    }
                }
                Err(e) => return Err(failed(done, e.into(), opened.tail_rows)),
            }
        }
        opened.recorded = inbox.map(|_| recorded);
        if let Some(read) = prefetch {
            match Sqlite::split(read.load, rows) {
                Ok(loaded) => opened.read = Some(Prefetched { loaded }),
                Err(e) => return Err(failed(done, e, opened.tail_rows)),
            }
        }
        Ok(opened)
    }

    /// As [`open_hop`](Self::open_hop), the statements run by `session` on the
    /// connection directly (SQLite's lane; see [`direct`](super::direct)).
    pub(crate) fn open_hop_direct(
        session: &mut Session,
        tail: Option<&mut Tail>,
        prefix: &'static str,
        statements: usize,
        inbox: Option<(&str, MessageId)>,
        prefetch: Option<&Prefetch>,
        now_ms: i64,
    ) -> std::result::Result<Opened, OpenFailed> {
        let mut opened = Opened::default();
        if let Some(t) = tail {
            for (k, st) in t.query.statements().iter().enumerate() {
                let rows = &mut opened.tail_rows;
                if let Err(error) = session.run(st, |row| rows.push((k, row))) {
                    return Err(OpenFailed {
                        prefix_done: 0,
                        error,
                        tail_rows: Vec::new(),
                    });
                }
            }
        }
        let failed = |prefix_done, error, opened: Opened| OpenFailed {
            prefix_done,
            error,
            tail_rows: opened.tail_rows,
        };
        let mut done = 0;
        for sql in prefix.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            if let Err(e) = session.run(&Statement::plain(sql), |_| {}) {
                return Err(failed(done, e, opened));
            }
            done += 1;
        }
        debug_assert_eq!(done, statements, "the prefix's statement count");
        if let Some((consumer, id)) = inbox {
            let mut record = Statements::new(INBOX_RECORD_HEAD);
            record
                .separated(", ")
                .push_bind(consumer)
                .push_bind(id)
                .push_bind(now_ms);
            record.push(INBOX_RECORD_TAIL);
            let mut recorded = false;
            for st in record.statements() {
                if let Err(e) = session.run(st, |_| recorded = true) {
                    return Err(failed(statements, e, opened));
                }
            }
            opened.recorded = Some(recorded);
        }
        if let Some(read) = prefetch {
            let st = Statement::with(
                Sqlite::load_sql(read.load),
                [Value::Text(read.key.hyphenated().to_string())],
            );
            let mut rows = Vec::new();
            if let Err(e) = session.run(&st, |row| rows.push(row)) {
                return Err(failed(statements, e, opened));
            }
            match Sqlite::split(read.load, rows) {
                Ok(loaded) => opened.read = Some(Prefetched { loaded }),
                Err(e) => return Err(failed(statements, e, opened)),
            }
        }
        Ok(opened)
    }
}

/// Why a hop's opening round trip failed (SQLite).
#[derive(Debug)]
pub(crate) struct OpenFailed {
    /// The prefix's statements that completed (none if the tail failed).
    pub(crate) prefix_done: usize,
    pub(crate) error: Error,
    /// The rows of the tail's statements, if they all ran.
    pub(crate) tail_rows: Vec<(usize, statements::Row)>,
}

/// What a hop's opening round trip found (SQLite).
#[derive(Debug, Default)]
pub(crate) struct Opened {
    /// The inbox record's: written now (`Some(true)`), a duplicate, or none asked.
    pub(crate) recorded: Option<bool>,
    /// The prefetch's rows, if one was asked.
    pub(crate) read: Option<Prefetched>,
    /// The rows of the tail's statements, with each statement's index.
    pub(crate) tail_rows: Vec<(usize, statements::Row)>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Answer;

    // A wait that outlasts the budget must sleep on a real waker: were the future left
    // with the no-op waker of the polls before, nothing would wake it and this would
    // time out.
    #[tokio::test]
    async fn an_answer_later_than_the_budget_is_still_awaited() {
        let mut answer = Answer::new();
        let late = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            7
        };
        let got = tokio::time::timeout(Duration::from_secs(10), answer.wait(late)).await;
        assert_eq!(got.ok(), Some(7));
        // The budget is spent: a later item of the same round trip is awaited at once.
        let again = tokio::time::timeout(
            Duration::from_secs(10),
            answer.wait(tokio::time::sleep(Duration::from_millis(1))),
        )
        .await;
        assert!(again.is_ok());
    }

    #[tokio::test]
    async fn a_ready_answer_is_returned_without_waiting() {
        let mut answer = Answer::new();
        assert_eq!(answer.wait(std::future::ready("now")).await, "now");
    }
}
