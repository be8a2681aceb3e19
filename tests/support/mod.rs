//! Shared by the whole-system tests: running the examples as child processes, and
//! checking the invariants in the agents' tables.

#![allow(dead_code, unreachable_pub)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use agentsaga::core::sqlx::{self, AssertSqlSafe};
use agentsaga::core::{ReadPool, Store};
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
    Command::new(example(name))
        .args(["--database-url", url, "--quiet", "--lease-ms", "1000"])
        .args(args)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn example")
}

/// Runs an example to the end (bounded), asserting success; returns its stdout.
pub fn run(name: &str, url: &str, args: &[&str]) -> String {
    let child = spawn(name, url, args);
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
    let rows: Vec<(String, String)> = match store.reader() {
        ReadPool::Sqlite(reader) => sqlx::query_as(AssertSqlSafe(sql))
            .fetch_all(reader)
            .await
            .unwrap(),
        ReadPool::Postgres(pool) => sqlx::query_as(AssertSqlSafe(sql))
            .fetch_all(pool)
            .await
            .unwrap(),
    };
    rows.into_iter().collect()
}

/// All sagas with their states.
pub async fn sagas(store: &Store) -> Vec<(String, SagaState)> {
    let list = query::list(
        store,
        &query::ListFilter {
            limit: u32::MAX,
            ..Default::default()
        },
    )
    .await
    .unwrap();
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
    let sagas = sagas(store).await;
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
    assert_eq!(stats.dead, 0, "dead letters: {stats:?}");
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
