//! Shared by the whole-system tests: running the examples as child processes, and
//! checking the invariants in the agents' tables.

// Support of several targets: cargo would take a file beside the targets for a target
// of its own.
#![allow(clippy::mod_module_files)]
#![allow(dead_code, unreachable_pub)]

/// The trip_booking example's car rental company (its API and its log), run by the
/// whole-system tests in the test process, outside the example's processes.
#[path = "../../examples/support/car_rental.rs"]
pub mod car_rental;

use std::path::PathBuf;

pub mod clock;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agentsaga::core::Store;
use agentsaga::core::sqlx::{self, AssertSqlSafe};
use agentsaga::saga::{SagaState, query};

/// The example binary that `cargo test` built beside the test binaries.
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test` (it builds the examples)",
        path.display()
    );
    path
}

/// Starts an example as a child process.
pub fn spawn(name: &str, url: &str, args: &[&str]) -> Child {
    spawn_with(name, url, args, |_| {})
}

/// Runs an example to the end (bounded), asserting success; returns its stdout.
pub fn run(name: &str, url: &str, args: &[&str]) -> String {
    run_with(name, url, args, |_| {})
}

/// Waits for `child` to exit, at most `limit` (then kills it and panics), and returns
/// its output. Its stdout and stderr are read while it runs: a child whose pipe filled
/// up (64 KiB of warnings) would block on its next write, its work and its locks with
/// it.
pub fn wait_bounded(mut child: Child, limit: Duration) -> std::process::Output {
    fn drain(
        pipe: Option<impl std::io::Read + Send + 'static>,
    ) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        })
    }
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let stderr = stderr.join().unwrap_or_default();
            panic!(
                "child did not finish in {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// `(saga_id, status)` rows of an effect table.
pub async fn statuses(store: &Store, table: &str) -> std::collections::HashMap<String, String> {
    let sql = format!("SELECT saga_id, status FROM {table}");
    let rows: Vec<(String, String)> = rows_of(store, sql).await;
    rows.into_iter().collect()
}

/// The rows of `sql`, on either backend.
pub async fn rows_of<T>(store: &Store, sql: impl Into<String>) -> Vec<T>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>
        + for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>
        + Send
        + Unpin,
{
    let sql = AssertSqlSafe(sql.into());
    let reader = store.reader();
    if let Some(reader) = reader.sqlite() {
        return sqlx::query_as(sql).fetch_all(reader).await.unwrap();
    }
    let pool = reader.postgres().expect("a SQLite or PostgreSQL store");
    sqlx::query_as(sql).fetch_all(pool).await.unwrap()
}

/// All sagas.
pub async fn all_sagas(store: &Store) -> Vec<query::SagaSummary> {
    let all = query::ListFilter {
        limit: u32::MAX,
        ..Default::default()
    };
    query::list(store, &all).await.unwrap()
}

/// All sagas with their states.
pub async fn sagas(store: &Store) -> Vec<(String, SagaState)> {
    let list = all_sagas(store).await;
    list.into_iter()
        .map(|s| (s.id.to_string(), s.state))
        .collect()
}

/// The effect tables' invariants: a completed saga has every effect in force, a
/// compensated one has none in force, no effect of an unknown saga exists, and the
/// outbox is drained. `forward` are the undoable tables with their "in force" status,
/// `pivot_and_after` the tables only a completed saga may have rows in.
pub async fn check_invariants(
    store: &Store,
    undoable: &[(&str, &str)],
    pivot_and_after: &[(&str, &str)],
) -> (usize, usize) {
    check_invariants_of(store, None, undoable, pivot_and_after).await
}

/// [`check_invariants`] over the sagas named `name` only (those whose steps have the
/// effects: the children, of parents that have none of their own).
pub async fn check_invariants_of(
    store: &Store,
    name: Option<&str>,
    undoable: &[(&str, &str)],
    pivot_and_after: &[(&str, &str)],
) -> (usize, usize) {
    let sagas: Vec<(String, SagaState)> = all_sagas(store)
        .await
        .into_iter()
        .filter(|s| name.is_none_or(|n| s.name == n))
        .map(|s| (s.id.to_string(), s.state))
        .collect();
    let mut completed = 0;
    let mut compensated = 0;
    let tables: Vec<_> = {
        let mut v = Vec::new();
        for (t, s) in undoable.iter().chain(pivot_and_after) {
            v.push((*t, *s, statuses(store, t).await));
        }
        v
    };
    let ids: std::collections::HashSet<&String> = sagas.iter().map(|(id, _)| id).collect();
    for (t, _, rows) in &tables {
        for id in rows.keys() {
            assert!(ids.contains(id), "{t} has a row for unknown saga {id}");
        }
    }
    for (id, state) in &sagas {
        match state {
            SagaState::Completed => {
                completed += 1;
                for (t, in_force, rows) in &tables {
                    assert_eq!(
                        rows.get(id).map(String::as_str),
                        Some(*in_force),
                        "completed saga {id}: {t}"
                    );
                }
            }
            SagaState::Compensated => {
                compensated += 1;
                for (t, in_force, rows) in &tables[..undoable.len()] {
                    assert_ne!(
                        rows.get(id).map(String::as_str),
                        Some(*in_force),
                        "compensated saga {id}: {t} still in force"
                    );
                }
                for (t, _, rows) in &tables[undoable.len()..] {
                    assert!(
                        !rows.contains_key(id),
                        "compensated saga {id} has a {t} row"
                    );
                }
            }
            other => panic!("saga {id} is {other}, not terminal"),
        }
    }
    let stats = store.admin().stats().await.unwrap();
    assert_eq!(stats.in_flight, 0, "outbox not drained: {stats:?}");
    assert_eq!(
        stats.oldest_pending_age_ms, None,
        "ready messages left: {stats:?}"
    );
    if stats.dead != 0 {
        let dead = store.admin().dead_letters(None, 10).await.unwrap();
        let why: Vec<_> = dead
            .iter()
            .map(|d| (&d.envelope.destination, &d.last_error))
            .collect();
        panic!("dead letters: {stats:?}: {why:?}");
    }
    (completed, compensated)
}

/// Like [`spawn`], with the command adjusted first (its environment, say).
pub fn spawn_with(
    name: &str,
    url: &str,
    args: &[&str],
    adjust: impl FnOnce(&mut Command),
) -> Child {
    let mut cmd = Command::new(example(name));
    cmd.args(["--database-url", url, "--quiet", "--lease-ms", "1000"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    adjust(&mut cmd);
    cmd.spawn().expect("spawn example")
}

/// Like [`run`], with the command adjusted first (its environment, say).
pub fn run_with(name: &str, url: &str, args: &[&str], adjust: impl FnOnce(&mut Command)) -> String {
    let child = spawn_with(name, url, args, adjust);
    let out = wait_bounded(child, Duration::from_secs(240));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} {args:?} failed: {}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The outside world's invariants, from the log of the car rental company that the
/// trip_booking example's `reserve_car` step calls (run by the test, outside the
/// example's processes, so that what a frozen or killed process sent still lands):
///
/// - every idempotency key belongs to one saga and one operation, a step's command's
///   (`…:command`, reservations) or its compensation's (`…:compensate`, cancellations),
///   and a saga's reservations all carry one key: a redelivery, a retry or a re-send
///   of the step is recognised by the service as a repeat;
/// - so a saga's car is reserved at most once (its key done at most once);
/// - no reservation takes effect after its saga's first cancellation request: a "do"
///   never lands after its "undo" (a repeated request may arrive late, and changes
///   nothing: it is counted);
/// - a completed saga has its one rental in force, a compensated one none in force;
///   no request names a saga that does not exist.
///
pub fn check_outside_calls(
    log: &[car_rental::Event],
    sagas: &[(String, SagaState)],
) -> OutsideCalls {
    use car_rental::Outcome;
    use std::collections::HashMap;
    let states: HashMap<&str, SagaState> = sagas.iter().map(|(id, s)| (id.as_str(), *s)).collect();
    let mut key_owner: HashMap<&str, (&str, &str)> = HashMap::new();
    let mut by_saga: HashMap<&str, Vec<&car_rental::Event>> = HashMap::new();
    for e in log {
        assert!(
            states.contains_key(e.reference.as_str()),
            "a rental request for unknown saga {}: {e:?}",
            e.reference
        );
        let kind = match e.op.as_str() {
            "reserve" => ":command",
            "cancel" => ":compensate",
            other => panic!("unknown operation {other}"),
        };
        assert!(
            e.key.starts_with(&format!("agentsaga:{}:", e.reference)) && e.key.ends_with(kind),
            "key {} on a {} of saga {}",
            e.key,
            e.op,
            e.reference
        );
        let owner = *key_owner.entry(&e.key).or_insert((&e.reference, &e.op));
        assert_eq!(
            owner,
            (e.reference.as_str(), e.op.as_str()),
            "key {} reused",
            e.key
        );
        by_saga.entry(&e.reference).or_default().push(e);
    }
    let (mut made, mut cancels, mut repeats, mut late_repeats) = (0, 0, 0, 0);
    for (saga, state) in &states {
        let events = by_saga.get(saga).map(Vec::as_slice).unwrap_or_default();
        let reserve_keys: std::collections::HashSet<&str> = events
            .iter()
            .filter(|e| e.op == "reserve")
            .map(|e| e.key.as_str())
            .collect();
        assert!(
            reserve_keys.len() <= 1,
            "saga {saga}: its car step was called with {reserve_keys:?}"
        );
        let reserved: Vec<&str> = events
            .iter()
            .filter(|e| e.outcome == Outcome::Reserved)
            .flat_map(|e| e.rentals.iter().map(String::as_str))
            .collect();
        assert!(
            reserved.len() <= 1,
            "saga {saga}: cars reserved {reserved:?}: {events:#?}"
        );
        if let Some(undo) = events.iter().find(|e| e.op == "cancel") {
            let late: Vec<_> = events
                .iter()
                .filter(|e| e.op == "reserve" && e.seq > undo.seq)
                .collect();
            assert!(
                late.iter().all(|e| e.outcome == Outcome::Repeat),
                "saga {saga}: a reservation landed after its cancellation: {events:#?}"
            );
            late_repeats += late.len();
        }
        let cancelled: std::collections::HashSet<&str> = events
            .iter()
            .filter(|e| e.op == "cancel")
            .flat_map(|e| e.rentals.iter().map(String::as_str))
            .collect();
        let in_force: Vec<&&str> = reserved
            .iter()
            .filter(|r| !cancelled.contains(**r))
            .collect();
        match state {
            SagaState::Completed => assert_eq!(
                in_force.len(),
                1,
                "completed saga {saga}: rentals in force {in_force:?}: {events:#?}"
            ),
            SagaState::Compensated => assert!(
                in_force.is_empty(),
                "compensated saga {saga}: rentals still in force {in_force:?}: {events:#?}"
            ),
            other => panic!("saga {saga} is {other}, not terminal"),
        }
        made += reserved.len();
        cancels += events.iter().filter(|e| e.op == "cancel").count();
        repeats += events
            .iter()
            .filter(|e| e.outcome == Outcome::Repeat)
            .count();
    }
    OutsideCalls {
        made,
        cancels,
        repeats,
        late_repeats,
    }
}

/// What [`check_outside_calls`] counted.
#[derive(Debug, Clone, Copy)]
pub struct OutsideCalls {
    /// Rentals made.
    pub made: usize,
    /// Cancellation requests.
    pub cancels: usize,
    /// Requests answered as repeats (a key seen before).
    pub repeats: usize,
    /// Of those, reservation requests that came after their saga's cancellation: a
    /// call already under way (its lease lost) that went out anyway, and took no effect.
    pub late_repeats: usize,
}

/// One row of `agent_deliveries` (the examples' `--record-deliveries`).
#[derive(Debug, Clone)]
pub struct Delivery {
    pub destination: String,
    pub msg_key: String,
    pub seq: i64,
    pub message_id: String,
    pub started_us: i64,
    pub finished_us: i64,
}

/// Per-key order, from what the agents recorded (`--record-deliveries`) of the
/// messages they handled (committed handlings only): no message handled twice, and the
/// messages of one key handled one at a time (a handling starts after the previous one
/// of its key finished) and in their enqueue order (outbox `seq`).
///
/// Returns (handlings, keys with more than one message).
pub async fn check_per_key_order(store: &Store) -> (usize, usize) {
    let sql = "SELECT destination, msg_key, seq, message_id, started_us, finished_us FROM agent_deliveries";
    type Row = (String, String, i64, String, i64, i64);
    let rows: Vec<Row> = rows_of(store, sql).await;
    let rows: Vec<Delivery> = rows
        .into_iter()
        .map(
            |(destination, msg_key, seq, message_id, started_us, finished_us)| Delivery {
                destination,
                msg_key,
                seq,
                message_id,
                started_us,
                finished_us,
            },
        )
        .collect();
    assert!(
        !rows.is_empty(),
        "nothing recorded: run with --record-deliveries"
    );
    let mut ids = std::collections::HashSet::new();
    let mut by_key: std::collections::HashMap<&str, Vec<&Delivery>> = Default::default();
    for d in &rows {
        assert!(ids.insert(&d.message_id), "message handled twice: {d:?}");
        assert!(d.started_us <= d.finished_us, "{d:?}");
        if !d.msg_key.is_empty() {
            by_key.entry(&d.msg_key).or_default().push(d);
        }
    }
    let mut shared = 0;
    for (key, handled) in &mut by_key {
        if handled.len() < 2 {
            continue;
        }
        shared += 1;
        handled.sort_by_key(|d| (d.started_us, d.finished_us));
        for pair in handled.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(
                a.finished_us <= b.started_us,
                "key {key}: two messages handled at once: {a:?} and {b:?}"
            );
            assert!(
                a.seq < b.seq,
                "key {key}: handled out of enqueue order: {a:?} before {b:?}"
            );
        }
    }
    (rows.len(), shared)
}
