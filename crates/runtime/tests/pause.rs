//! An operator's pause through the runtime, on both backends and the test clock: a
//! paused saga's sleep ends but its next step is not sent, across a restart of the
//! runtime; resumed (by the runtime's engine, or by one without the saga's definition,
//! as the CLI resumes), it goes on, each step once.

#[path = "support/echo.rs"]
mod echo;
#[path = "support/under_test.rs"]
mod under_test;

use std::time::Duration;

use agentsaga_core::testing::Backend;
use agentsaga_runtime::{Runtime, RuntimeBuilder};
use agentsaga_saga::{Engine, Saga, SagaDefinition, SagaState, Step, query};
use echo::Echo;
use serde_json::{Value, json};

const HOUR: Duration = Duration::from_secs(3600);

fn follow_up() -> SagaDefinition {
    Saga::<Value>::builder("follow_up", 1)
        .step(Step::new("draft", "writer").nothing_to_undo())
        .step(Step::sleep("wait", HOUR))
        .pivot(Step::new("send", "mailer"))
        .build()
        .unwrap()
}

fn builder() -> RuntimeBuilder {
    Runtime::builder()
        .agent(Echo("writer"))
        .agent(Echo("mailer"))
        .saga(follow_up())
}

async fn a_paused_saga_waits_across_a_restart(backend: Backend) {
    for resumer_has_definition in [true, false] {
        let t = under_test::start(backend, builder()).await;
        let id = t.start_saga("follow_up", &json!({})).await.unwrap();
        t.run_until_idle().await.unwrap();
        assert_eq!(t.calls("writer").await.unwrap(), 1);

        let mut tx = t.store().begin().await.unwrap();
        t.engine()
            .pause(&mut tx, id, "ops-anna", "check the draft first")
            .await
            .unwrap();
        tx.commit().await.unwrap();
        // The sleep ends while paused; the pivot is not sent.
        t.advance(2 * HOUR).await.unwrap();
        assert_eq!(
            t.calls("mailer").await.unwrap(),
            0,
            "nothing new while paused"
        );
        let t = t.restart(builder()).await.unwrap();
        t.advance(HOUR).await.unwrap();
        assert_eq!(
            t.calls("mailer").await.unwrap(),
            0,
            "still paused after a restart"
        );
        let s = query::get(t.store(), id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Running);
        assert_eq!(s.paused.map(|p| p.by).as_deref(), Some("ops-anna"));

        let cli = Engine::new(Vec::<SagaDefinition>::new()).unwrap();
        let resumer = if resumer_has_definition {
            t.engine()
        } else {
            &cli
        };
        let mut tx = t.store().begin().await.unwrap();
        resumer.resume(&mut tx, id).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Completed);
        assert_eq!(t.calls("mailer").await.unwrap(), 1);
        assert_eq!(t.effects("mailer"), 1);
        t.check_promises(id).await.unwrap();
        t.shutdown().await;
    }
}
agentsaga_core::both_backends!(
    a_paused_saga_waits_across_a_restart,
    a_paused_saga_waits_across_a_restart
);
