//! The database the tests read and act on: one saga of each kind, dead letters.

use std::time::Duration;

use agentsaga_console::Console;
use agentsaga_core::queue::DeadLetter;
use agentsaga_core::testing::{self, Backend, fresh_url};
use agentsaga_core::{Message, MessageId, Receipt, RetryPolicy, Store};
use agentsaga_saga::protocol::{self, StepOutcome};
use agentsaga_saga::{Engine, Saga, SagaDefinition, SagaId, SagaState, Step, query};
use serde_json::{Value, json};

/// reserve (undoable) → charge (the pivot) → confirm; the agents answer per the data's
/// `case` (see [`agent`]).
pub(crate) fn trip() -> SagaDefinition {
    Saga::<Value>::builder("trip", 1)
        .step(
            Step::new("reserve", "reserve-agent")
                .command(|d: &Value| d.clone())
                .compensate("reserve-agent", |d: &Value| json!({"cancel": d["case"]})),
        )
        .pivot(Step::new("charge", "charge-agent").command(|d: &Value| d.clone()))
        .step(Step::new("confirm", "confirm-agent").command(|d: &Value| d.clone()))
        .build()
        .expect("definition")
}

/// One step: wait for the signal `approval`.
pub(crate) fn waits() -> SagaDefinition {
    Saga::<Value>::builder("waits", 1)
        .step(Step::wait_for("approval"))
        .build()
        .expect("definition")
}

/// `ok`; `declined` (the charge fails: compensated); `stuck` (the charge fails and so
/// does the reservation's cancel); `after_pivot` (confirm fails for good).
pub(crate) fn agent(env: &agentsaga_core::Envelope) -> StepOutcome {
    let payload: Value = serde_json::from_str(&env.payload).expect("payload");
    if protocol::is_compensation(env) {
        return if payload["cancel"] == "stuck" {
            StepOutcome::Fatal("cancel API down".into())
        } else {
            StepOutcome::Ok(json!("cancelled"))
        };
    }
    match (env.destination.as_str(), payload["case"].as_str()) {
        ("charge-agent", Some("declined" | "stuck")) => StepOutcome::Fatal("card declined".into()),
        ("confirm-agent", Some("after_pivot")) => StepOutcome::Fatal("confirmation gone".into()),
        _ => StepOutcome::Ok(json!("done")),
    }
}

pub(crate) fn engine() -> Engine {
    Engine::new([trip(), waits()])
        .expect("engine")
        .with_compensation_retry(RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(4),
            2,
        ))
}

/// A database holding one saga of each kind, a stalled one, a waiting one, a running
/// one and two dead letters (besides the stalled saga's dead reply).
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
    let mut tx = store.begin().await.expect("begin");
    tx.receive("reserve-agent", command.id)
        .await
        .expect("receive");
    tx.enqueue(
        &protocol::reply(&command, &agent(&command))
            .unwrap()
            .unwrap(),
    )
    .await
    .expect("reply");
    tx.commit().await.expect("commit");
    store
        .queue()
        .mark_delivered("t", &[command.seq])
        .await
        .expect("delivered");
    let reply = testing::claim(&store, &["saga.trip.v1".to_owned()], 10)
        .await
        .remove(0);
    let lost = DeadLetter {
        seq: reply.seq,
        reason: "lost".into(),
        notice: None,
    };
    store.queue().dead_letter("t", &[lost]).await.expect("dead");

    let waiting = start(&store, &engine, "waits", None, json!({})).await;
    let mut ids = Vec::new();
    for case in ["ok", "declined", "stuck", "stuck", "after_pivot"] {
        let key = (case == "ok").then_some("req-ok");
        ids.push(start(&store, &engine, "trip", key, json!({"case": case})).await);
    }
    pump(&store, &engine, &ids).await;
    let running = start(&store, &engine, "trip", None, json!({"case": "ok"})).await;

    let mut tx = store.begin().await.expect("begin");
    let mailer = Message::to("mailer")
        .key("ops")
        .json(&json!({"to": "ops@example.com"}))
        .expect("json")
        .header("trace", "t-1");
    let sms = Message::to("sms")
        .json(&json!({"to": "+100"}))
        .expect("json");
    let (dead_mailer, dead_sms) = (mailer.id, sms.id);
    tx.enqueue_batch(&[mailer, sms]).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let claimed = testing::claim(&store, &["mailer".to_owned(), "sms".to_owned()], 10).await;
    let dead: Vec<DeadLetter> = claimed
        .iter()
        .map(|e| DeadLetter {
            seq: e.seq,
            reason: format!("{}: 550 mailbox unavailable", e.destination),
            notice: None,
        })
        .collect();
    assert_eq!(
        store.queue().dead_letter("t", &dead).await.expect("dead"),
        2
    );

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

/// Delivers every ready message until every saga in `ids` is terminal or stuck.
pub(crate) async fn pump(store: &Store, engine: &Engine, ids: &[SagaId]) {
    let mut destinations = engine.orchestrator_destinations();
    for d in engine.definitions() {
        destinations.extend(d.agent_destinations());
    }
    testing::pump(
        store,
        &destinations,
        "the sagas settle",
        Duration::from_secs(30),
        async || {
            let mut settled = 0;
            for id in ids {
                let s = query::get(store, *id).await.expect("get").expect("saga");
                if s.state.is_terminal() || s.state == SagaState::Stuck {
                    settled += 1;
                }
            }
            settled == ids.len()
        },
        async |batch| {
            for env in batch.iter() {
                let mut tx = store.begin().await.expect("begin");
                if env.destination.starts_with("saga.") {
                    engine.handle(&mut tx, env).await.expect("handle");
                } else if tx.receive(&env.destination, env.id).await.expect("receive")
                    == Receipt::First
                {
                    let reply = protocol::reply(env, &agent(env)).unwrap().unwrap();
                    tx.enqueue(&reply).await.expect("enqueue reply");
                }
                tx.commit().await.expect("commit");
            }
        },
    )
    .await;
}
