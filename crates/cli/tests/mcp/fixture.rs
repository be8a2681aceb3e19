//! The sagas the tests act on, beside `prepare`'s, and what an action could change.

use agentsaga_core::{MessageId, Store};
use agentsaga_saga::{Engine, Saga, SagaDefinition, SagaId, Step, query};
use serde_json::{Value, json};

use crate::common::{self, json};

/// draft → wait for `approval` → send (the pivot).
pub(crate) fn mail() -> SagaDefinition {
    Saga::<Value>::builder("mail", 1)
        .step(Step::new("draft", "drafts").nothing_to_undo())
        .step(
            Step::wait_for("approval")
                .agents_may_signal()
                .on_reply(|d: &mut Value, a: Value| d["approved"] = a),
        )
        .pivot(Step::new("send", "sender"))
        .build()
        .expect("definition")
}

/// approve the transfer (a person's decision: a plain wait, not marked, is one) →
/// transfer (the pivot).
pub(crate) fn transfer() -> SagaDefinition {
    Saga::<Value>::builder("transfer", 1)
        .step(Step::wait_for("sign_off"))
        .pivot(Step::new("transfer", "bank"))
        .build()
        .expect("definition")
}

/// The sagas the test acts on, beside `prepare`'s.
pub(crate) struct Extra {
    /// Parked at its wait for `approval`.
    pub(crate) waiting: SagaId,
    /// Started, its first command not delivered.
    pub(crate) running: SagaId,
    /// A saga command whose saga has since compensated.
    pub(crate) moot: MessageId,
}

pub(crate) async fn add_sagas(store: &Store, engine: &Engine) -> Extra {
    // A moot dead letter: the command dies, its notice makes the saga compensate.
    let (_, moot) = common::moot_dead_letter(store, engine).await;

    let waiting = common::start(store, engine, "mail", &json!({"to": "ann"})).await;
    common::pump_until(store, engine, "the saga waits", async || {
        let saga = query::get(store, waiting).await.unwrap().unwrap();
        saga.waiting_for.is_some()
    })
    .await;

    let running = common::start(store, engine, "trip", &json!({"case": "ok"})).await;
    Extra {
        waiting,
        running,
        moot,
    }
}

/// Everything of the database an action could change, as the CLI prints it.
pub(crate) fn everything(url: &str) -> Value {
    let mut status = json(url, &["status", "--json"]);
    status["outbox"]["oldest_pending_age_ms"] = Value::Null;
    let sagas = json(url, &["sagas", "list", "--json"]);
    let shown: Vec<Value> = sagas["sagas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| json(url, &["sagas", "show", s["id"].as_str().unwrap(), "--json"]))
        .collect();
    json!({
        "status": status,
        "sagas": shown,
        "dead": json(url, &["dead", "list", "--json"]),
    })
}
