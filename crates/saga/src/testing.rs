//! Test support for the crates whose tests read and act on sagas in a database (the
//! CLI's, the console's): the `trip` saga and its agents, an engine running it, a pump
//! that delivers until the sagas settle (its agents reporting the usage the data
//! names), a saga with a budget, two dead letters.
//!
//! Enabled by the `testing` feature.

use std::time::Duration;

use agentsaga_core::queue::DeadLetter;
use agentsaga_core::{Envelope, Message, MessageId, Receipt, RetryPolicy, Store, testing};

use serde_json::{Value, json};

use crate::protocol::{self, StepOutcome};
use crate::{
    Budget, Engine, OnBudgetSpent, Saga, SagaDefinition, SagaId, SagaState, Step, Usage, query,
};

/// reserve (undoable) → charge (the pivot) → confirm. What the agents answer depends on
/// the saga data's `case` (see [`trip_agent`]).
pub fn trip() -> SagaDefinition {
    trip_named("trip").build().expect("definition")
}

/// The steps of [`trip`], in a saga named `name`.
fn trip_named(name: &str) -> crate::SagaBuilder<Value, crate::AfterPivot> {
    Saga::<Value>::builder(name, 1)
        .step(
            Step::new("reserve", "reserve-agent")
                .command(|d: &Value| d.clone())
                .compensate("reserve-agent", |d: &Value| json!({"cancel": d["case"]})),
        )
        .pivot(Step::new("charge", "charge-agent").command(|d: &Value| d.clone()))
        .step(Step::new("confirm", "confirm-agent").command(|d: &Value| d.clone()))
}

/// The `trip` saga's agents, per the data's `case`: `ok`; `declined` (the charge fails:
/// compensated); `stuck` (the charge fails and so does the reservation's cancel);
/// `after_pivot` (confirm fails for good).
pub fn trip_agent(env: &Envelope) -> StepOutcome {
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
        ("confirm-agent", Some("after_pivot")) => {
            StepOutcome::Fatal("confirmation service gone".into())
        }
        _ => StepOutcome::Ok(json!("done")),
    }
}

/// What a forward command's agent reports it used: the saga data's `usage` (a
/// [`Usage`] as JSON, e.g. `{"tokens_out": 100}`), nothing without one.
pub fn trip_usage(env: &Envelope) -> Usage {
    let payload: Value = serde_json::from_str(&env.payload).expect("payload");
    if protocol::is_compensation(env) {
        return Usage::default();
    }
    payload
        .get("usage")
        .map(|u| serde_json::from_value(u.clone()).expect("a usage"))
        .unwrap_or_default()
}

/// `trip` as `capped` (the same steps and agents) with a budget of at most 100 tokens
/// out that waits for a raise once spent: started with `{"case": "ok", "usage":
/// {"tokens_out": 100}}`, it holds `charge` back after `reserve` (see
/// [`waiting_for_raise`]).
pub fn capped() -> SagaDefinition {
    trip_named("capped")
        .budget(Budget::new().tokens_out(100), OnBudgetSpent::Wait)
        .build()
        .expect("definition")
}

/// A planned saga named `name` over `search`, `calendar` and `mail` whose plan is made
/// at run time by its planner step `plan` (destination `planner`), sent the data's
/// `input`, with nothing to undo.
pub fn planned_by_planner(name: &str) -> SagaDefinition {
    crate::PlannedSaga::builder(name, 1)
        .destinations(["search", "calendar", "mail"])
        .planner(
            Step::new("plan", "planner")
                .command(|d: &Value| d["input"].clone())
                .nothing_to_undo(),
        )
        .build()
        .expect("definition")
}

/// Starts a [`capped`] saga (with `engine`, which must have its definition) whose
/// first step spends its budget, and delivers until it waits for a raise.
pub async fn waiting_for_raise(store: &Store, engine: &Engine) -> SagaId {
    let mut tx = store.begin().await.expect("begin");
    let data = json!({"case": "ok", "usage": {"tokens_in": 30, "tokens_out": 100}});
    let id = engine.start(&mut tx, "capped", &data).await.expect("start");
    tx.commit().await.expect("commit");
    pump_until(store, engine, "the saga waits for a raise", async || {
        query::spending(store, id)
            .await
            .expect("spending")
            .is_some_and(|s| s.waiting_for_raise)
    })
    .await;
    id
}

/// An engine of `definitions` whose compensations are retried twice, quickly (1 ms, then
/// up to 4 ms), before a saga is stuck.
pub fn quick_engine(definitions: impl IntoIterator<Item = SagaDefinition>) -> Engine {
    Engine::new(definitions)
        .expect("engine")
        .with_compensation_retry(RetryPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(4),
            2,
        ))
}

/// Delivers every ready message (the engine's to it, the agents' answered per
/// [`trip_agent`]) until every saga in `ids` is terminal or stuck.
pub async fn pump(store: &Store, engine: &Engine, ids: &[SagaId]) {
    pump_until(store, engine, "the sagas settle", async || {
        let mut settled = 0;
        for id in ids {
            let s = query::get(store, *id).await.expect("get").expect("saga");
            if s.state.is_terminal() || s.state == SagaState::Stuck {
                settled += 1;
            }
        }
        settled == ids.len()
    })
    .await;
}

/// Delivers every ready message (the engine's to it, the agents' answered per
/// [`trip_agent`], reporting [`trip_usage`]) until `done`, within 30 s.
pub async fn pump_until(
    store: &Store,
    engine: &Engine,
    what: &str,
    done: impl AsyncFnMut() -> bool,
) {
    let mut destinations = engine.orchestrator_destinations();
    for d in engine.definitions() {
        destinations.extend(d.agent_destinations());
    }
    testing::pump(
        store,
        &destinations,
        what,
        Duration::from_secs(30),
        done,
        async |batch| {
            for env in batch.iter() {
                let mut tx = store.begin().await.expect("begin");
                if env.destination.starts_with("saga.") {
                    engine.handle(&mut tx, env).await.expect("handle");
                } else if tx.receive(&env.destination, env.id).await.expect("receive")
                    == Receipt::First
                {
                    let reply = protocol::reply(env, &trip_agent(env))
                        .expect("reply")
                        .expect("reply_to");
                    let reply = protocol::with_usage(reply, &trip_usage(env));
                    tx.enqueue(&reply).await.expect("enqueue reply");
                }
                tx.commit().await.expect("commit");
            }
        },
    )
    .await;
}

/// Two dead letters, each `<destination>: 550 mailbox unavailable`: one to `mailer`
/// (keyed `ops`, with the header `trace: t-1`), one to `sms`. Their ids, in that order.
pub async fn two_dead_letters(store: &Store) -> (MessageId, MessageId) {
    let mut tx = store.begin().await.expect("begin");
    let mailer = Message::to("mailer")
        .key("ops")
        .json(&json!({"to": "ops@example.com", "subject": "trip booked"}))
        .expect("json")
        .header("trace", "t-1");
    let sms = Message::to("sms")
        .json(&json!({"to": "+100"}))
        .expect("json");
    let ids = (mailer.id, sms.id);
    tx.enqueue_batch(&[mailer, sms]).await.expect("enqueue");
    tx.commit().await.expect("commit");
    let destinations = ["mailer".to_owned(), "sms".to_owned()];
    let claimed = testing::claim(store, &destinations, 10).await;
    assert_eq!(claimed.len(), 2);
    let dead: Vec<DeadLetter> = claimed
        .iter()
        .map(|e| DeadLetter {
            seq: e.seq,
            reason: format!("{}: 550 mailbox unavailable", e.destination),
            notice: None,
        })
        .collect();
    assert_eq!(
        store
            .queue()
            .dead_letter("t", &dead)
            .await
            .expect("dead letter"),
        2
    );
    ids
}

/// `command`'s agent handles it, answering `outcome` (its inbox record and its reply
/// committed together), and the relay (owner `t`, which claimed it) acknowledges it.
pub async fn answer(store: &Store, command: &Envelope, outcome: &StepOutcome) {
    let mut tx = store.begin().await.expect("begin");
    tx.receive(&command.destination, command.id)
        .await
        .expect("receive");
    let reply = protocol::reply(command, outcome)
        .expect("reply")
        .expect("reply_to");
    tx.enqueue(&reply).await.expect("enqueue reply");
    tx.commit().await.expect("commit");
    store
        .queue()
        .mark_delivered("t", &[command.seq])
        .await
        .expect("delivered");
}

/// The message `seq`, claimed by the owner `t`, dead-lettered for `reason` (no notice).
pub async fn dead_letter(store: &Store, seq: i64, reason: &str) {
    let dead = DeadLetter {
        seq,
        reason: reason.into(),
        notice: None,
    };
    store
        .queue()
        .dead_letter("t", &[dead])
        .await
        .expect("dead letter");
}
