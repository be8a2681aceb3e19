//! The store's contract, one body per test, run on SQLite and on PostgreSQL; the tests
//! by concept in `tests/`, the helpers they share here.

/// Runs the same code on a [`Conn`](crate::Conn) of any driver: `$c` is the driver's
/// `&mut` connection in each arm (statements whose text suits every driver).
macro_rules! with_conn {
    ($conn:expr, $c:ident => $body:expr) => {
        crate::drivers::on_conn!($conn.0, _D, $c => $body)
    };
}

mod admin;
mod begin;
mod enqueue_dead;
mod exclusive;
mod handover;
mod hop;
mod migrations;
mod outbox;
mod queue;
mod sql;
// In a build with PostgreSQL alone, every store is PostgreSQL's: its `let … else` arms are dead.
#[cfg(feature = "postgres")]
#[allow(irrefutable_let_patterns)]
mod set_lane;
// In a build with SQLite alone, every store is SQLite's: its `let … else` arms are dead.
#[cfg(feature = "sqlite")]
#[allow(irrefutable_let_patterns)]
mod sqlite;
#[cfg(feature = "sqlite")]
#[allow(irrefutable_let_patterns)]
mod stress;
#[cfg(feature = "sqlite")]
mod tail;
mod unavailable;
mod write;

/// A load of the tests: a row of `load_p` with its rows of `load_c` (tables made by
/// [`load_tables`]).
static LOAD_P: crate::write::Table = crate::write::Table::new(
    "load_p",
    &[crate::write::Column::new("k", crate::write::Kind::Id)],
    1,
);
static LOAD_C: crate::write::Table = crate::write::Table::new(
    "load_c",
    &[
        crate::write::Column::new("k", crate::write::Kind::Id),
        crate::write::Column::new("i", crate::write::Kind::Int),
    ],
    2,
);
static LOAD: crate::read::Load = crate::read::Load::new(&LOAD_P, &["k"], &LOAD_C, &["i"]);

/// Creates [`LOAD`]'s tables.
async fn load_tables(store: &Store, backend: Backend) {
    let id = if backend == Backend::Sqlite {
        "TEXT"
    } else {
        "UUID"
    };
    let mut tx = store.begin().await.unwrap();
    for sql in [
        format!("CREATE TABLE load_p (k {id} PRIMARY KEY)"),
        format!("CREATE TABLE load_c (k {id}, i INTEGER, PRIMARY KEY (k, i))"),
    ] {
        crate::Sql::new(sql).execute(tx.conn()).await.unwrap();
    }
    tx.commit().await.unwrap();
}

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::admin::Stats;
use crate::drivers::Backend as Db;
use crate::queue::{Claim, DeadLetter, Retry};
use crate::testing::{Backend, fresh_url};
use crate::{Error, Message, MessageId, Receipt, Store, StoreConfig, both_backends};

/// A store whose hops are let go past a `hop_timeout` of 300 ms.
async fn open_bounded(backend: Backend) -> Store {
    let url = fresh_url(backend).await;
    let config = StoreConfig::default().hop_timeout(Duration::from_millis(300));
    Store::connect_with(&url, config).await.expect("open store")
}

async fn open(backend: Backend) -> (Store, String) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.expect("open store");
    (store, url)
}

fn dests(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| (*s).to_owned()).collect()
}

async fn claim_n(store: &Store, owner: &str, d: &[String], limit: u32) -> Vec<crate::Envelope> {
    store
        .queue()
        .claim(&Claim {
            owner,
            destinations: d,
            limit,
            lease: Duration::from_secs(30),
        })
        .await
        .expect("claim")
}

async fn enqueue_one(store: &Store, msg: &Message) {
    let mut tx = store.begin().await.expect("begin");
    tx.enqueue(msg).await.expect("enqueue");
    tx.commit().await.expect("commit");
}

async fn exec(store: &Store, sql: &'static str) {
    let mut tx = store.begin().await.unwrap();
    with_conn!(tx.conn(), c => {
        sqlx::query(sql).execute(c).await.unwrap();
    });
    tx.commit().await.unwrap();
}

/// Awaits `opening` (a hop's), telling `queued` once its first poll has queued it for
/// the lane (on SQLite), so that a test queues hops in the order it means.
async fn after_queueing<F: std::future::Future>(
    opening: F,
    queued: tokio::sync::oneshot::Sender<()>,
) -> F::Output {
    let mut opening = std::pin::pin!(opening);
    let mut queued = Some(queued);
    std::future::poll_fn(|cx| {
        let polled = opening.as_mut().poll(cx);
        if let Some(q) = queued.take() {
            let _ = q.send(());
        }
        polled
    })
    .await
}

/// A handover that takes up to `cap` rows of destination "direct" and records what it
/// was given.
/// Messages that test the handover's rules: two keyed rows of one key, a delayed one,
/// another destination, then three more for "direct" (past a cap of 3).
struct Mix {
    first: Message,
    second: Message,
    delayed: Message,
    other: Message,
    more: Vec<Message>,
}

impl Mix {
    fn new() -> Self {
        Self {
            first: Message::to("direct").key("k").json(&1).unwrap(),
            second: Message::to("direct").key("k").json(&2).unwrap(),
            delayed: Message::to("direct")
                .json(&3)
                .unwrap()
                .delay(Duration::from_secs(60)),
            other: Message::to("elsewhere").json(&4).unwrap(),
            more: (5..8)
                .map(|i| Message::to("direct").json(&i).unwrap())
                .collect(),
        }
    }
}

struct FakeHandover {
    cap: usize,
    used: Mutex<usize>,
    taken: Mutex<Vec<crate::Envelope>>,
    lease: Duration,
}

impl FakeHandover {
    /// A fake with `cap` slots, set as `store`'s handover.
    fn installed(store: &Store, cap: usize, lease: Duration) -> Arc<Self> {
        let fake = Arc::new(Self {
            cap,
            used: Mutex::new(0),
            taken: Mutex::new(Vec::new()),
            lease,
        });
        store.set_handover(Arc::clone(&fake) as _);
        fake
    }
}

impl crate::handover::Handover for FakeHandover {
    fn owner(&self) -> &str {
        "fake-relay"
    }
    fn lease(&self) -> Duration {
        self.lease
    }
    fn reserve(&self, destination: &str) -> bool {
        let mut used = self.used.lock().unwrap();
        if destination == "direct" && *used < self.cap {
            *used += 1;
            true
        } else {
            false
        }
    }
    fn cancel(&self, _: &str) {
        *self.used.lock().unwrap() -= 1;
    }
    fn take(&self, rows: Vec<crate::Envelope>, _: crate::clock::Instant) {
        self.taken.lock().unwrap().extend(rows);
    }
}

async fn count_rows(store: &Store, id: MessageId) -> i64 {
    match store.backend_ref() {
        #[cfg(feature = "sqlite")]
        Db::Sqlite(db) => sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = ?")
            .bind(id)
            .fetch_one(&db.reader)
            .await
            .unwrap(),
        #[cfg(feature = "postgres")]
        Db::Postgres(db) => sqlx::query_scalar("SELECT count(*) FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap(),
    }
}

/// Creates `parent` and `child`, whose foreign key is checked at commit: a hop that
/// inserts a `child` row without its parent fails the commit of its transaction (on
/// SQLite, the shared one) with no error before.
async fn commit_poison_tables(store: &Store) {
    let mut tx = store.begin().await.unwrap();
    for sql in [
        "CREATE TABLE parent (id INTEGER PRIMARY KEY)",
        "CREATE TABLE child (p INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED)",
    ] {
        with_conn!(tx.conn(), c => sqlx::query(sql).execute(c).await.unwrap().rows_affected());
    }
    tx.commit().await.unwrap();
}

/// Inserts an orphan `child` row in `tx`: its commit will fail.
async fn poison_commit(tx: &mut super::Tx) {
    with_conn!(tx.conn(), c => {
        sqlx::query("INSERT INTO child (p) VALUES (1)").execute(c).await.unwrap().rows_affected()
    });
}
