//! The database the tests read and act on: one saga of each kind, dead letters.

use agentsaga_console::Console;
use agentsaga_core::testing::{self, Backend, fresh_url};
use agentsaga_core::{MessageId, Store};
use agentsaga_saga::schedule::{self, Schedule};
use agentsaga_saga::testing::{answer, dead_letter, quick_engine, trip_agent, two_dead_letters};
pub(crate) use agentsaga_saga::testing::{pump, trip};
use agentsaga_saga::{Engine, Saga, SagaDefinition, SagaId, Step};
use serde_json::{Value, json};

/// One step: wait for the signal `approval`.
pub(crate) fn waits() -> SagaDefinition {
    Saga::<Value>::builder("waits", 1)
        .step(Step::wait_for("approval"))
        .build()
        .expect("definition")
}

/// An engine of `trip` and `waits`, quick to give up on compensations.
pub(crate) fn engine() -> Engine {
    quick_engine([trip(), waits()])
}

/// The schedule the fixture holds: `trip` at 03:00 UTC every day (no one fires it).
pub(crate) const NIGHTLY: &str = "nightly";

/// A database holding one saga of each kind, a stalled one, a waiting one, a running
/// one, two dead letters (besides the stalled saga's dead reply) and a schedule.
pub(crate) struct Fixture {
    /// A console as `agentsaga serve` has it: no definitions.
    pub(crate) console: Console,
    pub(crate) completed: SagaId,
    pub(crate) compensated: SagaId,
    pub(crate) stuck: [SagaId; 2],
    pub(crate) after_pivot: SagaId,
    /// Running, its reply dead-lettered: stalled.
    pub(crate) stalled: SagaId,
    /// Parked at its wait for `approval`.
    pub(crate) waiting: SagaId,
    /// Running, its first command pending.
    pub(crate) running: SagaId,
    pub(crate) dead_mailer: MessageId,
    pub(crate) dead_sms: MessageId,
}

pub(crate) async fn start(
    store: &Store,
    engine: &Engine,
    name: &str,
    key: Option<&str>,
    data: Value,
) -> SagaId {
    let mut tx = store.begin().await.expect("begin");
    let id = engine
        .accept_keyed(&mut tx, name, key, data)
        .await
        .expect("start")
        .id();
    tx.commit().await.expect("commit");
    id
}

pub(crate) async fn prepare(backend: Backend) -> Fixture {
    let store = Store::connect(&fresh_url(backend).await)
        .await
        .expect("connect");
    let engine = engine();

    // The stalled saga: its agent answers, and the reply is dead-lettered.
    let stalled = start(&store, &engine, "trip", None, json!({"case": "ok"})).await;
    let command = testing::claim(&store, &["reserve-agent".to_owned()], 10)
        .await
        .remove(0);
    answer(&store, &command, &trip_agent(&command)).await;
    let reply = testing::claim(&store, &["saga.trip.v1".to_owned()], 10)
        .await
        .remove(0);
    dead_letter(&store, reply.seq, "lost").await;

    let waiting = start(&store, &engine, "waits", None, json!({})).await;
    let mut ids = Vec::new();
    for case in ["ok", "declined", "stuck", "stuck", "after_pivot"] {
        let key = (case == "ok").then_some("req-ok");
        ids.push(start(&store, &engine, "trip", key, json!({"case": case})).await);
    }
    pump(&store, &engine, &ids).await;
    let running = start(&store, &engine, "trip", None, json!({"case": "ok"})).await;

    let (dead_mailer, dead_sms) = two_dead_letters(&store).await;
    let nightly = Schedule::new(NIGHTLY, "trip", "0 3 * * *").input(json!({"case": "ok"}));
    schedule::create(&store, &nightly).await.expect("schedule");

    Fixture {
        console: Console::new(store),
        completed: ids[0],
        compensated: ids[1],
        stuck: [ids[2], ids[3]],
        after_pivot: ids[4],
        stalled,
        waiting,
        running,
        dead_mailer,
        dead_sms,
    }
}
