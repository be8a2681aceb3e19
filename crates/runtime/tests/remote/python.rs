//! The `payments` destination served by a Python agent
//! (`examples/python_agent/payments.py`: `nats-py` and its own SQLite file) that knows
//! agentsaga only through the wire format of docs/remote.md: the shop's sagas settle,
//! and every charge and refund happens once in the agent's database, across a
//! `kill -9` of the agent between a commit and its acknowledgement; input it cannot
//! serve is kept in its dead letters with the reason.
//!
//! The Python is `AGENTSAGA_PYTHON`, else the venv `scripts/test` makes in
//! `target/python-venv`; without either the test fails and says so.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use agentsaga_core::sqlx::sqlite::SqliteConnectOptions;
use agentsaga_core::sqlx::{self, ConnectOptions};
use agentsaga_core::testing::{Backend, NatsServer, fresh_url};
use agentsaga_saga::{SagaId, SagaState};

use super::{effects, settle, shop, start_orders};

/// A Python with `nats-py`: `AGENTSAGA_PYTHON`, else `target/python-venv/bin/python`.
pub(super) fn python() -> PathBuf {
    let (path, from) = match std::env::var_os("AGENTSAGA_PYTHON") {
        Some(p) => (PathBuf::from(p), "AGENTSAGA_PYTHON"),
        None => (
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/python-venv/bin/python"),
            "the default venv",
        ),
    };
    assert!(
        path.exists(),
        "no Python with nats-py at {} ({from}): run scripts/test, which makes the venv \
         target/python-venv with nats-py, or set AGENTSAGA_PYTHON to a Python that has it",
        path.display()
    );
    path
}

/// The Python agent, a child process; killed when dropped.
pub(super) struct PythonAgent {
    child: Child,
}

impl PythonAgent {
    /// Starts it on `db` (its log appended to `log`) and waits (bounded) for its
    /// `ready`. With `crash_before_ack`, it SIGKILLs itself after that many commits,
    /// between the last one's commit and its acknowledgement.
    fn start(nats: &str, db: &Path, log: &Path, crash_before_ack: Option<u32>) -> Self {
        match crash_before_ack {
            Some(n) => Self::start_with(nats, db, log, &["--crash-before-ack", &n.to_string()]),
            None => Self::start_with(nats, db, log, &[]),
        }
    }

    /// [`start`](Self::start) with `args` besides (`--fail-writes 1`, `--charge-ms 400`).
    pub(super) fn start_with(nats: &str, db: &Path, log: &Path, args: &[&str]) -> Self {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python_agent/payments.py");
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("the agent's log file");
        let mut command = Command::new(python());
        command
            .arg(script)
            .args(["--nats", nats, "--ack-wait", "2", "--db"])
            .arg(db)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        command.args(args);
        let mut child = command.spawn().expect("the Python agent starts");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        // Reads its `ready`, then drains its stdout until it exits.
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            let _ = tx.send(lines.next());
            lines.for_each(drop);
        });
        let mut agent = Self { child };
        let first = tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(30)));
        if !matches!(&first, Ok(Some(Ok(line))) if line == "ready") {
            let status = agent.child.try_wait();
            panic!(
                "the Python agent did not say ready within 30 s ({first:?}, exit {status:?}); \
                 its log: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        agent
    }

    /// Its exit status, waited for up to `within`.
    fn exit_within(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        tokio::task::block_in_place(|| {
            loop {
                if let Some(status) = self.child.try_wait().expect("the agent's status") {
                    return Some(status);
                }
                if Instant::now() >= deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        })
    }

    /// Sends it SIGTERM and waits (bounded) for it to exit.
    pub(super) fn stop(mut self, log: &Path) -> ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status();
        assert!(sent.is_ok_and(|s| s.success()), "SIGTERM to the agent");
        self.exit_within(Duration::from_secs(20))
            .unwrap_or_else(|| {
                panic!(
                    "the agent did not stop within 20 s of a SIGTERM; its log: {}",
                    std::fs::read_to_string(log).unwrap_or_default()
                )
            })
    }
}

impl Drop for PythonAgent {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What the agent's database holds: its effects (`saga`, `effect`) in order, the
/// reasons of its dead letters, and the number of rows of its inbox, its outbox and its
/// unpublished outbox.
pub(super) async fn python_db(db: &Path) -> (Vec<(String, String)>, Vec<String>, [i64; 3]) {
    let mut c = SqliteConnectOptions::new()
        .filename(db)
        .read_only(true)
        .connect()
        .await
        .expect("the agent's database");
    let effects = sqlx::query_as("SELECT saga, effect FROM effects ORDER BY rowid")
        .fetch_all(&mut c)
        .await
        .unwrap();
    let dead = sqlx::query_scalar("SELECT reason FROM dead ORDER BY stream_seq")
        .fetch_all(&mut c)
        .await
        .unwrap();
    let mut counts = [0; 3];
    for (i, sql) in [
        "SELECT count(*) FROM inbox",
        "SELECT count(*) FROM outbox",
        "SELECT count(*) FROM outbox WHERE published = 0",
    ]
    .into_iter()
    .enumerate()
    {
        counts[i] = sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap();
    }
    (effects, dead, counts)
}

/// Publishes, with `python`'s `nats-py`, two messages to `payments` that it cannot
/// serve: a body that is not JSON, and a command without `reply_to`.
fn publish_bad_input(nats: &str) {
    const SCRIPT: &str = r#"
import asyncio, json, sys, uuid, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    js = nc.jetstream()
    await js.publish("agentsaga.payments", b"not json")
    headers = {"kind": "command", "saga_id": "s", "step": "1", "step_name": "charge"}
    await js.publish("agentsaga.payments", json.dumps({
        "seq": 1, "id": str(uuid.uuid4()), "destination": "payments", "key": None,
        "payload": "{}", "headers": headers, "attempts": 1, "created_at_ms": 0,
    }).encode())
    await nc.close()
asyncio.run(main())
"#;
    let status = tokio::task::block_in_place(|| {
        Command::new(python())
            .args(["-c", SCRIPT, nats])
            .stdin(Stdio::null())
            .status()
    });
    assert!(status.is_ok_and(|s| s.success()), "publishing bad input");
}

/// Whether the agent's `log` says `what`, `times` times or more, within 30 s.
pub(super) async fn log_says(log: &Path, what: &str, times: usize) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if std::fs::read_to_string(log).is_ok_and(|l| l.matches(what).count() >= times) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

pub(super) fn of(all: &[(String, String)], id: SagaId) -> Vec<String> {
    all.iter()
        .filter(|(s, _)| *s == id.to_string())
        .map(|(_, e)| e.clone())
        .collect()
}

// The shop's `payments` is the Python agent; it is killed (-9) after its third commit,
// before that message's acknowledgement, and started again: the message comes back,
// its inbox recognises it, and nothing is lost or done twice. Two bad messages are
// dead-lettered there with their reasons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_agent_serves_payments_once_across_a_kill_9() {
    let server = NatsServer::start();
    let url_shop = fresh_url(Backend::Sqlite).await;
    let dir = PathBuf::from(
        fresh_url(Backend::Sqlite)
            .await
            .trim_start_matches("sqlite://"),
    )
    .parent()
    .expect("a fresh directory")
    .to_owned();
    let (db, log) = (dir.join("payments.db"), dir.join("payments.log"));
    let shop = shop(&url_shop, &server).await;

    let mut agent = PythonAgent::start(&server.url(), &db, &log, Some(3));
    let mut ids = start_orders(&shop, 0..8).await;
    let status = agent.exit_within(Duration::from_secs(60));
    assert_eq!(
        status.and_then(|s| s.signal()),
        Some(9),
        "the agent was to kill itself (-9) after its third commit: {status:?}"
    );
    ids.extend(start_orders(&shop, 8..12).await);
    let agent = PythonAgent::start(&server.url(), &db, &log, None);
    publish_bad_input(&server.url());
    let states = settle(&shop, &ids).await;
    // The message committed but not acknowledged before the kill comes back (after the
    // consumer's ack wait, 2 s), and the agent's inbox knows it.
    let repeat = log_says(&log, "is a repeat: acknowledged, not applied again", 1).await;
    let dead_lettered = log_says(&log, "dead letter", 2).await;
    let status = agent.stop(&log);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        status.success(),
        "the agent's exit on SIGTERM: {status:?}; log: {log}"
    );

    let here = effects(shop.store()).await;
    let (there, dead, [inbox, outbox, unpublished]) = python_db(&db).await;
    let mut compensated = 0;
    for (n, (id, state)) in ids.iter().zip(&states).enumerate() {
        if n % 4 == 3 {
            compensated += 1;
            assert_eq!(*state, SagaState::Compensated, "saga {id} (n = {n})");
            assert_eq!(of(&here, *id), ["stock/do", "stock/undo"], "saga {id}");
            assert_eq!(
                of(&there, *id),
                ["payments/do", "payments/undo"],
                "saga {id}"
            );
        } else {
            assert_eq!(*state, SagaState::Completed, "saga {id} (n = {n})");
            assert_eq!(of(&here, *id), ["stock/do", "ship/do"], "saga {id}");
            assert_eq!(of(&there, *id), ["payments/do"], "saga {id}");
        }
    }
    // Its inbox holds each command and compensation once, each answered by one reply,
    // every reply published; only the bad input is dead-lettered, with its reason.
    let handled = i64::try_from(ids.len()).unwrap() + compensated;
    assert_eq!([inbox, outbox, unpublished], [handled, handled, 0]);
    assert!(dead_lettered, "the bad input was not dead-lettered: {log}");
    assert_eq!(dead.len(), 2, "{dead:?}");
    assert!(dead[0].starts_with("the body is not JSON"), "{dead:?}");
    assert_eq!(dead[1], "the command has no reply_to header", "{dead:?}");
    assert_eq!(there.len(), usize::try_from(handled).unwrap(), "{there:?}");
    assert!(
        repeat,
        "no redelivery of the message killed before its ack: {log}"
    );
    let stats = shop.store().admin().stats().await.unwrap();
    assert_eq!(stats.dead, 0, "the shop's dead letters: {stats:?}");
    shop.shutdown().await;
}

// The Python agent reaches a broker that asks for a user and password, given by
// agentsaga's variables (docs/remote.md): it connects, makes its consumer and says
// `ready`; the broker has its consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_agent_reaches_a_secured_broker() {
    let server = NatsServer::start_with(&["--user", "ops", "--pass", "s3cret"]);
    let dir = PathBuf::from(
        fresh_url(Backend::Sqlite)
            .await
            .trim_start_matches("sqlite://"),
    )
    .parent()
    .expect("a fresh directory")
    .to_owned();
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python_agent/payments.py");
    let mut child = Command::new(python())
        .arg(script)
        .args(["--nats", &server.url(), "--db"])
        .arg(dir.join("payments.db"))
        .env("AGENTSAGA_NATS_USER", "ops")
        .env("AGENTSAGA_NATS_PASSWORD", "s3cret")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the Python agent starts");
    let stdout = child.stdout.take().expect("its stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(BufReader::new(stdout).lines().next());
    });
    let first = tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(30)));
    let ready = matches!(&first, Ok(Some(Ok(line))) if line == "ready");
    let _ = child.kill();
    let out = child.wait_with_output().expect("its output");
    assert!(
        ready,
        "not ready ({first:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let to = agentsaga_relay::nats::NatsConnect::new(&server.url()).user_password("ops", "s3cret");
    let lags = agentsaga_relay::nats::NatsTransport::connect(to)
        .await
        .unwrap()
        .consumer_lag("AGENTSAGA")
        .await
        .unwrap();
    assert!(
        lags.iter().any(|l| l.consumer == "python-payments"),
        "{lags:?}"
    );
}
