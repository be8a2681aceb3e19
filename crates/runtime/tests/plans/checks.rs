//! Invalid plans, a planner choosing the steps, a plan's wait.

use super::*;

// Plans that break the rules are refused with the reason; nothing is written.
async fn invalid_plans_write_nothing(backend: Backend) {
    let w = world(backend, true).await;
    let before = w.rt.store().admin().stats().await.unwrap();
    let undone = |s: PlanStep| s.nothing_to_undo();
    let cases: Vec<(Value, &str)> = vec![
        (
            json!(
                PlanStart::new(
                    Plan::new().then(PlanStep::command("a", "search", Value::Null)),
                    Value::Null
                )
                .unwrap()
            ),
            "must say how to undo",
        ),
        (
            json!(
                PlanStart::new(
                    Plan::new().then(undone(PlanStep::command("a", "payments", Value::Null))),
                    Value::Null
                )
                .unwrap()
            ),
            "unknown destination `payments`",
        ),
        (
            json!(
                PlanStart::new(
                    Plan::new()
                        .then(undone(PlanStep::command("a", "search", Value::Null)))
                        .then(undone(PlanStep::command("a", "mail", Value::Null))),
                    Value::Null
                )
                .unwrap()
            ),
            "two steps are named `a`",
        ),
        (json!({ "topic": "no plan at all" }), "start it with a plan"),
        (
            json!({ "plan": { "steps": [{ "name": "a", "destination": "search", "run": "sh" }] } }),
            "unknown field `run`",
        ),
    ];
    for (start, why) in &cases {
        let err = w.rt.start_saga("errand", start).await.unwrap_err();
        assert!(
            matches!(&err, agentsaga_runtime::Error::Saga(SagaError::InvalidPlan(w)) if w.contains(why)),
            "{start}: {err}"
        );
    }
    // A batch with a valid plan first and an invalid one after is refused whole, before
    // anything is written: its transaction commits nothing of it.
    let valid = json!(
        PlanStart::new(
            Plan::new().then(undone(PlanStep::command("a", "search", Value::Null))),
            Value::Null
        )
        .unwrap()
    );
    let mut tx = w.rt.store().begin().await.unwrap();
    let err =
        w.rt.start_sagas_in(&mut tx, "errand", &[valid, cases[0].0.clone()])
            .await
            .unwrap_err();
    assert!(
        matches!(&err, agentsaga_runtime::Error::Saga(SagaError::InvalidPlan(w)) if w.contains(cases[0].1)),
        "{err}"
    );
    tx.commit().await.unwrap();
    let sagas = query::list(w.rt.store(), &ListFilter::default())
        .await
        .unwrap();
    assert!(sagas.is_empty(), "no saga written: {sagas:?}");
    let after = w.rt.store().admin().stats().await.unwrap();
    assert_eq!(
        (after.pending, after.in_flight, after.delivered, after.dead),
        (
            before.pending,
            before.in_flight,
            before.delivered,
            before.dead
        ),
        "no message written"
    );
    assert!(seen(&w).is_empty());
}
both_backends!(invalid_tests, invalid_plans_write_nothing);

// A planner's answer, prose around fenced JSON, becomes the plan; an answer that is
// not a valid plan fails the saga with the reason, and nothing of it runs.
async fn a_planner_chooses_the_steps(backend: Backend) {
    let w = world(backend, true).await;
    *w.plan_text.lock().unwrap() = format!(
        "Sure! Here is my plan:\n```json\n{}\n```\nLet me know.",
        serde_json::to_string_pretty(&errand_plan(false)).unwrap()
    );
    let input = json!({ "topic": "planning", "to": "bob@example.com" });
    let id = w.rt.start_saga("assistant", &input).await.unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Completed);
    let seen_ok = seen(&w);
    assert_eq!(seen_ok[0], ("planner".into(), input));
    assert_eq!(seen_ok[1], ("search".into(), json!({ "q": "planning" })));
    assert_eq!(seen_ok.last().unwrap().0, "mail");

    *w.plan_text.lock().unwrap() =
        r#"{"steps": [{"name": "pay", "destination": "payments", "nothing_to_undo": true}]}"#
            .into();
    let id =
        w.rt.start_saga("assistant", &json!({ "topic": "x" }))
            .await
            .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Compensated);
    let saga = query::get(w.rt.store(), id).await.unwrap().unwrap();
    let error = saga.error.unwrap_or_default();
    assert!(
        error.contains("invalid plan") && error.contains("unknown destination `payments`"),
        "{error}"
    );
    assert_eq!(
        seen(&w).len(),
        seen_ok.len() + 1,
        "only the planner was asked"
    );

    *w.plan_text.lock().unwrap() = "I'm sorry, I cannot plan that.".into();
    let id =
        w.rt.start_saga("assistant", &json!({ "topic": "y" }))
            .await
            .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Compensated);
    assert_error_contains(&w.rt, id, "no JSON plan").await;
}
both_backends!(planner_tests, a_planner_chooses_the_steps);

// A plan's wait parks the saga until its signal; the payload lands in the results.
async fn a_plans_wait_takes_its_signal(backend: Backend) {
    let w = world(backend, true).await;
    let plan = Plan::new()
        .then(PlanStep::wait_for("approve", "approval"))
        .then(
            PlanStep::command(
                "send",
                "mail",
                json!({ "by": { "$from": "/results/approve/by" } }),
            )
            .pivot(),
        );
    let id =
        w.rt.start_saga("errand", &PlanStart::new(plan, Value::Null).unwrap())
            .await
            .unwrap();
    wait_until("the saga waits", Duration::from_secs(30), async || {
        query::get(w.rt.store(), id)
            .await
            .unwrap()
            .and_then(|s| s.waiting_for)
            .as_deref()
            == Some("approval")
    })
    .await;
    assert_signal_refused(&w.rt, id, "other").await;
    w.rt.signal(id, "approval", Signal::Approve(json!({ "by": "ops" })))
        .await
        .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Completed);
    assert_eq!(seen(&w), [("mail".to_owned(), json!({ "by": "ops" }))]);
}
both_backends!(wait_tests, a_plans_wait_takes_its_signal);
