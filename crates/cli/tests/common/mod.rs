//! Shared helpers of the CLI tests: databases prepared by the saga engine, and the
//! `agentsaga` binary run against them.

// Support of several targets: cargo would take a file beside the targets for a target
// of its own.
#![allow(clippy::mod_module_files)]
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use agentsaga_core::queue::{Claim, DeadLetter};
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_core::{DeliveryFailed, MessageId, Store};
// Not every test binary including this module pumps until a condition.
#[allow(unused_imports)]
pub use agentsaga_saga::testing::{pump, pump_until, trip};
use agentsaga_saga::testing::{quick_engine, two_dead_letters};
use agentsaga_saga::{Engine, SagaId};
use serde_json::{Value, json};

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `agentsaga --database-url <url> <args>` (no `DATABASE_URL` inherited).
pub fn run(url: &str, args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentsaga"));
    cmd.env_remove("DATABASE_URL")
        .arg("--database-url")
        .arg(url)
        .args(args);
    run_cmd(cmd)
}

/// Runs `agentsaga <args>` with `cmd`'s settings.
pub fn run_cmd(mut cmd: Command) -> Run {
    let out = cmd.output().expect("run agentsaga");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The command succeeded; its stdout.
pub fn ok(url: &str, args: &[&str]) -> String {
    let r = run(url, args);
    assert_eq!(r.code, Some(0), "agentsaga {args:?} failed: {r:?}");
    r.stdout
}

/// The command succeeded and printed one JSON document.
pub fn json(url: &str, args: &[&str]) -> Value {
    let out = ok(url, args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {out}"))
}

/// The command failed with one line on stderr and nothing on stdout; that line.
pub fn fails(url: &str, args: &[&str]) -> String {
    expect_failure(&run(url, args), args)
}

/// `r` is a failure with one `error: ` line on stderr and nothing on stdout.
pub fn expect_failure(r: &Run, what: &(impl std::fmt::Debug + ?Sized)) -> String {
    assert!(
        matches!(r.code, Some(c) if c != 0),
        "{what:?} should fail: {r:?}"
    );
    assert!(r.stdout.is_empty(), "{what:?}: stdout on failure: {r:?}");
    let lines: Vec<&str> = r.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what:?}: want one line on stderr: {r:?}");
    assert!(lines[0].starts_with("error: "), "{what:?}: {r:?}");
    lines[0].to_owned()
}

/// The sorted keys of a JSON object.
pub fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .cloned()
        .collect();
    k.sort();
    k
}

/// Asserts `v` is an object with exactly these keys.
pub fn assert_keys(v: &Value, expected: &[&str]) {
    let mut want: Vec<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    want.sort();
    assert_eq!(keys(v), want, "{v}");
}

/// A database prepared by the saga engine.
pub struct Prepared {
    pub url: String,
    pub completed: SagaId,
    pub compensated: SagaId,
    /// Two sagas whose compensation always fails.
    pub stuck: [SagaId; 2],
    /// A saga stuck after its pivot (its last step failed fatally).
    pub after_pivot: SagaId,
    /// Dead letters to `mailer` and to `sms`.
    pub dead_mailer: MessageId,
    pub dead_sms: MessageId,
}

/// A fresh database of `backend` holding one saga of each kind and two dead letters.
pub async fn prepare(backend: Backend) -> Prepared {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.expect("connect");
    let engine = quick_engine([trip()]);
    let mut ids = Vec::new();
    for case in ["ok", "declined", "stuck", "stuck", "after_pivot"] {
        let mut tx = store.begin().await.expect("begin");
        // The completed one is started with an idempotency key.
        let key = (case == "ok").then_some("req-ok");
        ids.push(
            engine
                .accept_keyed(&mut tx, "trip", key, json!({"case": case}))
                .await
                .expect("start")
                .id(),
        );
        tx.commit().await.expect("commit");
    }
    pump(&store, &engine, &ids).await;

    let (dead_mailer, dead_sms) = two_dead_letters(&store).await;
    store.close().await;
    Prepared {
        url,
        completed: ids[0],
        compensated: ids[1],
        stuck: [ids[2], ids[3]],
        after_pivot: ids[4],
        dead_mailer,
        dead_sms,
    }
}

/// The file behind a `sqlite://` URL.
pub fn sqlite_path(url: &str) -> &Path {
    Path::new(url.strip_prefix("sqlite://").expect("a sqlite:// url"))
}

/// Starts saga `name` with `data`, in a transaction of its own.
pub async fn start(store: &Store, engine: &Engine, name: &str, data: &Value) -> SagaId {
    let mut tx = store.begin().await.expect("begin");
    let id = engine.start(&mut tx, name, data).await.expect("start");
    tx.commit().await.expect("commit");
    id
}

/// A moot dead letter: a `trip` saga's first command dies, and the notice of its death
/// makes the saga compensate (the undo is delivered). The saga, and the dead command.
pub async fn moot_dead_letter(store: &Store, engine: &Engine) -> (SagaId, MessageId) {
    let id = start(store, engine, "trip", &json!({"case": "ok"})).await;
    let destinations = vec!["reserve-agent".to_owned()];
    let claim = Claim {
        owner: "t",
        destinations: &destinations,
        limit: 1,
        lease: Duration::from_secs(60),
    };
    let command = store.queue().claim(&claim).await.expect("claim").remove(0);
    let reason = "reserve-agent: attempts exhausted";
    let notice = DeliveryFailed::notice_for(&command, reason).expect("notice");
    let dead = DeadLetter {
        seq: command.seq,
        reason: reason.into(),
        notice,
    };
    store
        .queue()
        .dead_letter("t", &[dead])
        .await
        .expect("dead letter");
    pump(store, engine, &[id]).await;
    (id, command.id)
}

/// Polls `done` every 20 ms until it holds; fails the test (panics) if it does not
/// within `within`, naming `what`. `agentsaga_core::testing::wait_until` for the
/// blocking code that drives a child process.
pub fn wait_for(what: &str, within: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (`within` at most) until `child` has exited, naming `what` if it does not;
/// its exit status.
pub fn exited(child: &mut Child, what: &str, within: Duration) -> ExitStatus {
    let mut status = None;
    wait_for(what, within, || {
        status = child.try_wait().expect("try_wait");
        status.is_some()
    });
    status.expect("exited")
}
