//! A plan stage that is a child saga (`{"saga": "<name>", "input": …}`): checked by the
//! same rules as the typed builder's, run and undone as `Step::saga` is.

use super::held::pivoted_booking;
use super::*;

/// A planned saga whose plans may run `child` as a child saga.
fn errand(child: &SagaDefinition) -> SagaDefinition {
    PlannedSaga::builder("errand", 1)
        .destinations(["visa-agent", "expense-agent"])
        .child_sagas([child])
        .retry(fast())
        .build()
        .unwrap()
}

fn plan(fail_expense: bool) -> PlanStart {
    let visa =
        PlanStep::command("visa", "visa-agent", json!({})).compensate("visa-agent", json!("undo"));
    let book = PlanStep::saga(
        "book",
        "booking",
        json!({ "trip": { "$from": "/input/trip" } }),
    );
    let expense = PlanStep::command("expense", "expense-agent", json!({ "fail": fail_expense }))
        .compensate("expense-agent", json!("undo"));
    let plan = Plan::new().then(visa).then(book).then(expense);
    PlanStart::new(plan, json!({ "trip": 16 })).unwrap()
}

// Run: the child gets its input through the plan's reference, and its data is the
// step's result. Turned back by the expense: the child is undone as a whole.
async fn a_plan_runs_and_undoes_a_child(backend: Backend) {
    let mut w = World::new(backend, vec![booking(), errand(&booking())], 10).await;
    let agent = |_: &mut fastrand::Rng, env: &Envelope, _: usize| {
        let fail = serde_json::from_str::<Value>(&env.payload)
            .is_ok_and(|p| p.get("fail") == Some(&json!(true)));
        Some(if fail {
            StepOutcome::Fatal("refused".into())
        } else {
            ok()
        })
    };
    let id = w
        .start("errand", serde_json::to_value(plan(false)).unwrap())
        .await;
    w.pump(&[id], agent, |_, _| ok()).await;
    assert_eq!(
        state(&query::get(&w.store, id).await.unwrap()),
        SagaState::Completed
    );
    let data = query::data(&w.store, id).await.unwrap().unwrap();
    assert_eq!(data["results"]["book"]["trip"], 16, "{data}");
    assert_eq!(
        state(&query::get(&w.store, child_id(id, 1)).await.unwrap()),
        SagaState::Completed
    );

    let id = w
        .start("errand", serde_json::to_value(plan(true)).unwrap())
        .await;
    w.pump(&[id], agent, |_, _| ok()).await;
    assert_eq!(
        state(&query::get(&w.store, id).await.unwrap()),
        SagaState::Compensated
    );
    let child = child_id(id, 1);
    assert_eq!(
        state(&query::get(&w.store, child).await.unwrap()),
        SagaState::Compensated
    );
    assert_eq!(of(&w.ledger.undone, child), vec![1, 0]);
    assert_eq!(
        of(&w.ledger.undone, id),
        vec![2, 0],
        "the expense, the visa"
    );
}
both_backends!(plan_tests, a_plan_runs_and_undoes_a_child);

#[test]
fn plans_with_children_are_checked_as_the_builder_checks_steps() {
    let def = errand(&booking());
    let refused = |def: &SagaDefinition, plan: Plan, why: &str| {
        let err = def.check_plan(&plan).unwrap_err();
        assert!(
            err.to_string().contains(why),
            "`{err}` does not say `{why}`"
        );
    };
    let visa = || PlanStep::command("visa", "visa-agent", json!({})).nothing_to_undo();
    let book = || PlanStep::saga("b", "booking", json!({ "trip": 1 }));
    refused(
        &def,
        Plan::new().then(PlanStep::saga("r", "research", json!({}))),
        "unknown child saga `research`",
    );
    refused(
        &def,
        Plan::new().then(book().compensate("visa-agent", json!(1))),
        "undone by compensating it",
    );
    refused(
        &def,
        Plan::new().then(book().nothing_to_undo()),
        "undone by compensating it",
    );
    def.check_plan(&Plan::new().then(visa()).then(book()))
        .unwrap();
    // As an LLM writes it: `input` is the child's input.
    let written = Plan::from_json(json!([
        { "name": "b", "saga": "booking", "input": { "trip": 1 } }
    ]))
    .unwrap();
    assert_eq!(written, Plan::new().then(book()));
    // A child with a pivot: only as the plan's pivot, or after it.
    let pivoted = errand(&pivoted_booking());
    refused(
        &pivoted,
        Plan::new().then(book()).then(visa()),
        "must be the plan's pivot or a step after it",
    );
    pivoted
        .check_plan(&Plan::new().then(visa()).then(book().pivot()))
        .unwrap();
    // An engine refuses a planned saga whose child is not registered as it was given.
    let err = Engine::new([errand(&booking())]).unwrap_err();
    assert!(err.to_string().contains("not registered"), "{err}");
    let err = Engine::new([pivoted_booking(), errand(&booking())]).unwrap_err();
    assert!(err.to_string().contains("with or without a pivot"), "{err}");
    Engine::new([booking(), errand(&booking())]).unwrap();
}
