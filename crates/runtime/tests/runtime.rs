//! The runtime's promises about bad input and crashed actors, on both backends.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use agentsaga_core::testing::{Backend, backends, fresh_url};
use agentsaga_core::{RetryPolicy, both_backends};
use agentsaga_relay::RelayConfig;
use agentsaga_runtime::{Agent, AgentContext, Error, Runtime, StepError};
use agentsaga_saga::{Saga, SagaState, Step, query};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Expects `{"amount": <u64>}`; counts what it handled; panics on demand.
struct Billing {
    handled: Arc<AtomicU32>,
    panics_left: Arc<AtomicU32>,
}

#[derive(Deserialize)]
struct Charge {
    amount: u64,
}

#[async_trait::async_trait]
impl Agent for Billing {
    type Command = Charge;
    type Reply = u64;
    fn destination(&self) -> &str {
        "billing"
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Charge) -> Result<u64, StepError> {
        if ctx.is_compensation() {
            return Ok(0); // a refund of nothing charged: nothing to undo is success
        }
        if self
            .panics_left
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            panic!("billing crashed mid-message");
        }
        self.handled.fetch_add(1, Ordering::SeqCst);
        Ok(cmd.amount)
    }
}

/// Reserves and releases; counts undos.
struct Stock(Arc<AtomicU32>);

#[async_trait::async_trait]
impl Agent for Stock {
    type Command = Value;
    type Reply = Value;
    fn destination(&self) -> &str {
        "stock"
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, cmd: Value) -> Result<Value, StepError> {
        if ctx.is_compensation() {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        Ok(cmd)
    }
}

#[derive(Serialize, Deserialize)]
struct Order {
    amount: Value,
}

async fn runtime(backend: Backend, panics: u32) -> (Runtime, Arc<AtomicU32>, Arc<AtomicU32>) {
    let saga = Saga::<Order>::builder("order", 1)
        .step(Step::new("reserve", "stock").compensate("stock", |_: &Order| json!("release")))
        .step(
            Step::new("charge", "billing")
                .command(|o: &Order| json!({ "amount": o.amount }))
                .compensate("billing", |_: &Order| json!({ "amount": 0 })),
        )
        .build()
        .unwrap();
    let handled = Arc::new(AtomicU32::new(0));
    let undone = Arc::new(AtomicU32::new(0));
    let rt = Runtime::builder()
        .database(fresh_url(backend).await)
        .agent(Billing {
            handled: handled.clone(),
            panics_left: Arc::new(AtomicU32::new(panics)),
        })
        .agent(Stock(undone.clone()))
        .saga(saga)
        .relay_config(
            RelayConfig::default()
                .retry(RetryPolicy::new(
                    Duration::from_millis(10),
                    Duration::from_millis(50),
                    5,
                ))
                .lease(Duration::from_secs(2)),
        )
        .start()
        .await
        .unwrap();
    (rt, handled, undone)
}

async fn wait(rt: &Runtime, id: agentsaga_saga::SagaId) -> SagaState {
    tokio::time::timeout(Duration::from_secs(60), rt.wait(id))
        .await
        .expect("saga settles")
        .unwrap()
}

// A command whose payload does not decode into the agent's command type is
// dead-lettered with the decode error, and its saga compensates.
async fn undecodable_command_dead_letters_and_compensates(backend: Backend) {
    let (rt, handled, undone) = runtime(backend, 0).await;
    let id = rt
        .start_saga(
            "order",
            &Order {
                amount: json!("forty-two"),
            },
        )
        .await
        .unwrap();
    assert_eq!(wait(&rt, id).await, SagaState::Compensated);
    assert_eq!(handled.load(Ordering::SeqCst), 0);
    assert_eq!(
        undone.load(Ordering::SeqCst),
        1,
        "the reservation was released"
    );
    let dead = rt
        .store()
        .admin()
        .dead_letters(Some("billing"), 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);
    let why = dead[0].last_error.as_deref().unwrap();
    assert!(
        why.contains("does not decode") && why.contains("forty-two"),
        "{why}"
    );
    let saga = query::get(rt.store(), id).await.unwrap().unwrap();
    assert!(saga.error.unwrap().contains("delivery to `billing` failed"));
    // A well-formed order goes through.
    let ok = rt
        .start_saga("order", &Order { amount: json!(42) })
        .await
        .unwrap();
    assert_eq!(wait(&rt, ok).await, SagaState::Completed);
    rt.shutdown().await;
}
both_backends!(
    undecodable_tests,
    undecodable_command_dead_letters_and_compensates
);

// An agent actor that panics is restarted by the supervisor; the message it held is
// delivered again and processed once.
async fn crashed_agent_is_restarted(backend: Backend) {
    let (rt, handled, _) = runtime(backend, 2).await;
    let id = rt
        .start_saga("order", &Order { amount: json!(7) })
        .await
        .unwrap();
    assert_eq!(wait(&rt, id).await, SagaState::Completed);
    assert_eq!(
        handled.load(Ordering::SeqCst),
        1,
        "processed exactly once after two crashes"
    );
    // The restarted actors keep serving.
    let again = rt
        .start_saga("order", &Order { amount: json!(8) })
        .await
        .unwrap();
    assert_eq!(wait(&rt, again).await, SagaState::Completed);
    assert_eq!(handled.load(Ordering::SeqCst), 2);
    rt.shutdown().await;
}
both_backends!(crash_tests, crashed_agent_is_restarted);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_saga_name_is_a_typed_error() {
    let (rt, _, _) = runtime(backends()[0], 0).await;
    match rt.start_saga("no-such-saga", &json!({})).await {
        Err(Error::Saga(agentsaga_saga::Error::UnknownSaga(name))) => {
            assert_eq!(name, "no-such-saga")
        }
        other => panic!("expected UnknownSaga, got {other:?}"),
    }
    assert!(
        query::list(rt.store(), &Default::default())
            .await
            .unwrap()
            .is_empty()
    );
    rt.shutdown().await;
}

// SQLite's file (one runtime per file) and its in-memory database.
#[cfg(feature = "sqlite")]
#[tokio::test]
async fn builder_refuses_nonsense() {
    assert!(matches!(
        Runtime::builder().start().await,
        Err(Error::Config(_))
    ));
    let r = Runtime::builder().database("sqlite::memory:").start().await;
    assert!(matches!(r, Err(Error::Config(m)) if m.contains("nothing to host")));
    // A refused configuration creates no database (nor its lock file).
    let url = fresh_url(Backend::Sqlite).await;
    let file = std::path::PathBuf::from(url.trim_start_matches("sqlite://"));
    let r = Runtime::builder().database(&url).start().await;
    assert!(matches!(r, Err(Error::Config(m)) if m.contains("nothing to host")));
    let r = Runtime::builder()
        .database(&url)
        .agent(Stock(Default::default()))
        .max_in_flight_for("no-such-saga", Some(1))
        .start()
        .await;
    assert!(matches!(r, Err(Error::Config(m)) if m.contains("not a registered saga")));
    let dir = file.parent().expect("a directory");
    let made: Vec<_> = std::fs::read_dir(dir).map_or_else(|_| Vec::new(), |d| d.collect());
    assert!(made.is_empty(), "a refused runtime made {made:?}");
    let r = Runtime::builder()
        .database("mysql://x")
        .agent(Stock(Default::default()))
        .start()
        .await;
    assert!(matches!(
        r,
        Err(Error::Store(agentsaga_core::Error::InvalidUrl { .. }))
    ));
}

// SQLite serves one process: a second runtime on one file is refused with an error that
// names PostgreSQL, not left to degrade (no wake-ups across processes, an unfair busy
// handler starving the other's lease renewals). The CLI's connections are not runtimes
// and are not refused; once the first runtime is gone, another may start.
// SQLite's file (one runtime per file) and its in-memory database.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_runtime_on_one_sqlite_file_is_refused() {
    let url = fresh_url(Backend::Sqlite).await;
    let start = || {
        Runtime::builder()
            .database(&url)
            .agent(Stock(Default::default()))
            .start()
    };
    let first = start().await.unwrap();
    let second = match start().await {
        Ok(_) => panic!("a second runtime started on one SQLite file"),
        Err(e) => e,
    };
    let Error::SqliteInUse { holder, .. } = &second else {
        panic!("a second runtime on one SQLite file: {second}");
    };
    assert_eq!(*holder, Some(std::process::id()));
    let said = second.to_string();
    assert!(said.contains("PostgreSQL"), "{said}");
    // A store of the CLI's kind opens it all the same.
    let reader = agentsaga_core::Store::connect(&url).await.unwrap();
    assert!(reader.admin().stats().await.is_ok());
    first.shutdown().await;
    start().await.unwrap().shutdown().await;
}

// The lock is the file's, not the name's: a second runtime reaching the same SQLite file
// through a symlink to it, or through a symlink to its directory, is refused as one
// reaching it by its own name is.
// SQLite's file (one runtime per file) and its in-memory database.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_runtime_through_another_path_to_the_file_is_refused() {
    let url = fresh_url(Backend::Sqlite).await;
    let file = std::path::PathBuf::from(url.trim_start_matches("sqlite://"));
    let dir = file.parent().expect("a directory");
    let start = |url: String| async move {
        Runtime::builder()
            .database(&url)
            .agent(Stock(Default::default()))
            .start()
            .await
    };
    let first = start(url.clone()).await.unwrap();
    let linked_file = dir.join("linked.db");
    std::os::unix::fs::symlink(&file, &linked_file).unwrap();
    let linked_dir = dir.with_extension("linked");
    std::os::unix::fs::symlink(dir, &linked_dir).unwrap();
    let dotted = dir.join(".").join("test.db");
    for other in [linked_file, linked_dir.join("test.db"), dotted] {
        let other = format!("sqlite://{}", other.display());
        match start(other.clone()).await {
            Ok(_) => panic!("a second runtime started on one SQLite file as {other}"),
            Err(Error::SqliteInUse { holder, .. }) => {
                assert_eq!(holder, Some(std::process::id()), "{other}");
            }
            Err(e) => panic!("{other}: {e}"),
        }
    }
    first.shutdown().await;
    let _ = std::fs::remove_file(&linked_dir);
}

// The lock comes first: a runtime refused because another holds the file's lock has
// not opened the database (no DDL of a newer version applied under a live older one; no
// file made where none was).
// SQLite's file (one runtime per file) and its in-memory database.
#[cfg(feature = "sqlite")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_refused_for_the_lock_has_not_opened_the_database() {
    let url = fresh_url(Backend::Sqlite).await;
    let file = std::path::PathBuf::from(url.trim_start_matches("sqlite://"));
    // Another runtime's lock, held here by hand on a file not yet made.
    let lock = std::fs::File::create(format!("{}-runtime.lock", file.display())).unwrap();
    lock.try_lock().unwrap();
    let r = Runtime::builder()
        .database(&url)
        .agent(Stock(Default::default()))
        .start()
        .await;
    assert!(matches!(r, Err(Error::SqliteInUse { .. })), "{:?}", r.err());
    assert!(
        !file.exists(),
        "the refused runtime made {}",
        file.display()
    );
    lock.unlock().unwrap();
}
