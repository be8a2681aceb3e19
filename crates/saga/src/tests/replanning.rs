//! Re-planning (`PlannedBuilder::replan`): a planner that extends its plan turn by
//! turn, each turn a step of its own, checked with everything before it; compensation
//! covers every turn's steps, latest first.

use super::*;

/// A planned saga whose planner (destination `planner`) may take up to `turns` turns.
fn thinking(turns: u32) -> SagaDefinition {
    PlannedSaga::builder("thinking", 1)
        .destinations(["search", "book", "mail"])
        .planner(
            Step::new("plan", "planner")
                .command(|d: &Value| json!({ "results": d["results"], "turns": d["turns"] }))
                .nothing_to_undo(),
        )
        .replan(turns)
        .retry(fast())
        .build()
        .unwrap()
}

/// An undoable step `name` to `destination`, its command naming the earlier `from`.
pub(super) fn undoable(name: &str, destination: &str, from: Option<&str>) -> PlanStep {
    let command = match from {
        Some(f) => json!({ "after": { "$from": format!("/results/{f}") } }),
        None => json!({ "first": true }),
    };
    PlanStep::command(name, destination, command).compensate(destination, json!({ "undo": name }))
}

/// What the planner answers on each turn (by its step's name), as JSON.
pub(super) fn answers(turns: &[(&str, Value)]) -> std::collections::HashMap<String, Value> {
    turns
        .iter()
        .map(|(n, v)| ((*n).to_owned(), v.clone()))
        .collect()
}

pub(super) fn plan_json(plan: Plan) -> Value {
    serde_json::to_value(plan).unwrap()
}

/// Runs one `thinking(turns)` saga to its end: the planner answers from `by_turn`,
/// agents `ok` (`fail` answers fatally). The saga, the names of the steps whose
/// commands the agents did (in order, planner turns included) and undid.
async fn run(
    backend: Backend,
    turns: u32,
    by_turn: std::collections::HashMap<String, Value>,
    fail: Option<&'static str>,
    duplicate_rate: f64,
) -> (World, SagaId, Vec<String>, Vec<String>) {
    let failing: Vec<&str> = fail.into_iter().collect();
    run_planned(backend, thinking(turns), by_turn, &failing, duplicate_rate).await
}

/// Runs one saga of the planned `def` to its end: its planner answers from `by_turn`
/// (by its step's name), the steps named in `failing` answer fatally, the others
/// `ok`. The saga, and the names of the steps the agents did (in order, planner turns
/// included) and undid.
pub(super) async fn run_planned(
    backend: Backend,
    def: SagaDefinition,
    by_turn: std::collections::HashMap<String, Value>,
    failing: &[&str],
    duplicate_rate: f64,
) -> (World, SagaId, Vec<String>, Vec<String>) {
    let name = def.name().to_owned();
    let mut w = World::new(backend, vec![def], 60).await;
    w.duplicate_rate = duplicate_rate;
    let id = w.start(&name, json!({ "topic": "x" })).await;
    w.pump(
        &[id],
        |_, env, _| {
            let step = env.header(protocol::STEP_NAME).unwrap_or_default();
            Some(match by_turn.get(step) {
                Some(answer) => StepOutcome::Ok(answer.clone()),
                None if failing.contains(&step) => StepOutcome::Fatal("no".into()),
                None => StepOutcome::Ok(json!(format!("{step} done"))),
            })
        },
        |_, _| ok(),
    )
    .await;
    let steps = query::steps(&w.store, id).await.unwrap();
    let name_of = |i: usize| {
        steps
            .iter()
            .find(|s| s.idx == i as i64)
            .map(|s| s.name.clone())
            .unwrap_or_default()
    };
    let done = of(&w.ledger.done, id).into_iter().map(name_of).collect();
    let undone = of(&w.ledger.undone, id).into_iter().map(name_of).collect();
    (w, id, done, undone)
}

/// Turn 1 plans `find`; turn 2, having seen its result, adds `book` (referring to
/// `find`); turn 3 says it is done.
fn three_turns() -> std::collections::HashMap<String, Value> {
    answers(&[
        (
            "plan",
            plan_json(Plan::new().then(undoable("find", "search", None))),
        ),
        (
            "plan_2",
            plan_json(Plan::new().then(undoable("book", "book", Some("find")))),
        ),
        ("plan_3", json!("All set: ```json\n{\"done\": true}\n```")),
    ])
}

// The planner is asked again once its stages have ran, each turn once, in order; its
// last turn says it is done; the saga completes with every turn's results.
async fn a_planner_extends_its_plan_turn_by_turn(backend: Backend) {
    for duplicate_rate in [0.0, 0.3] {
        let (w, id, done, undone) = run(backend, 5, three_turns(), None, duplicate_rate).await;
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
        assert_eq!(done, ["plan", "find", "plan_2", "book", "plan_3"]);
        assert!(undone.is_empty(), "{undone:?}");
        let data = query::data(&w.store, id).await.unwrap().unwrap();
        assert_eq!(data["turns"], json!([1, 1, 0]), "{data}");
        assert_eq!(data["done"], json!(true));
        assert_eq!(data["results"]["book"], json!("book done"));
    }
}
both_backends!(turn_by_turn_tests, a_planner_extends_its_plan_turn_by_turn);

// Past its most turns the planner is not asked again: with 2 turns, `plan_3` never runs.
async fn the_planner_is_not_asked_past_its_turns(backend: Backend) {
    let (w, id, done, _) = run(backend, 2, three_turns(), None, 0.0).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(done, ["plan", "find", "plan_2", "book"]);
}
both_backends!(max_turns_tests, the_planner_is_not_asked_past_its_turns);

// A step of the second turn fails: the saga undoes the steps of every turn, latest
// first (the failed `book`, whose outcome the engine does not take for granted, then
// the first turn's `find`).
async fn compensation_crosses_turns(backend: Backend) {
    let (w, id, done, undone) = run(backend, 5, three_turns(), Some("book"), 0.0).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert_eq!(done, ["plan", "find", "plan_2"]);
    assert_eq!(undone, ["book", "find"], "latest first, across turns");
}
both_backends!(compensation_tests, compensation_crosses_turns);

// A turn that breaks a rule with what came before fails, fatally, with the reason, and
// the earlier turns' steps are undone: a name taken by an earlier turn, a reference to
// no earlier step, an undoable step after the first turn's pivot, a step named like a
// planner turn.
async fn a_turn_is_checked_with_every_turn_before_it(backend: Backend) {
    let pivoted = Plan::new()
        .then(undoable("find", "search", None))
        .then(PlanStep::command("send", "mail", json!("hi")).pivot());
    let cases = [
        (
            Plan::new().then(undoable("find", "search", None)),
            Plan::new().then(undoable("find", "book", None)),
            "two steps are named `find`",
        ),
        (
            Plan::new().then(undoable("find", "search", None)),
            Plan::new().then(undoable("book", "book", Some("nowhere"))),
            "nowhere",
        ),
        (
            pivoted,
            Plan::new().then(undoable("book", "book", Some("find"))),
            "pivot",
        ),
        (
            Plan::new().then(undoable("find", "search", None)),
            Plan::new().then(undoable("plan_3", "book", None)),
            "name its planner's turns",
        ),
    ];
    for (first, second, why) in cases {
        let by_turn = answers(&[
            ("plan", plan_json(first.clone())),
            ("plan_2", plan_json(second)),
        ]);
        let (w, id, done, undone) = run(backend, 5, by_turn, None, 0.0).await;
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        let error = s.error.clone().unwrap_or_default();
        assert!(error.contains(why), "`{error}` does not say `{why}`");
        assert!(!done.contains(&"book".to_owned()), "{done:?}");
        if first.steps.len() == 1 {
            assert_eq!(s.state, SagaState::Compensated, "{error}");
            assert_eq!(undone, ["find"], "the first turn's step undone");
        } else {
            // Past the first turn's pivot the saga cannot turn back: stuck.
            assert_eq!(s.state, SagaState::Stuck, "{error}");
            assert!(undone.is_empty(), "{undone:?}");
        }
    }
}
both_backends!(checked_tests, a_turn_is_checked_with_every_turn_before_it);

// A planner with nothing to do says so on its first turn: the saga completes with no
// step; one that gives its last stages with "done" is not asked again.
async fn done_on_any_turn(backend: Backend) {
    let at_once = answers(&[("plan", json!({ "done": true }))]);
    let (w, id, done, _) = run(backend, 5, at_once, None, 0.0).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(done, ["plan"]);
    let mut last =
        serde_json::to_value(Plan::new().then(undoable("find", "search", None))).unwrap();
    last["done"] = json!(true);
    let (w, id, done, _) = run(backend, 5, answers(&[("plan", last)]), None, 0.0).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(done, ["plan", "find"]);
}
both_backends!(done_tests, done_on_any_turn);

// A saga keeps the most turns it was started under: registered again with fewer
// while it runs, its planner is still asked for the turns it was promised.
async fn a_saga_keeps_its_turns(backend: Backend) {
    let mut w = World::new(backend, vec![thinking(5)], 61).await;
    let id = w.start("thinking", json!({ "topic": "x" })).await;
    let by_turn = three_turns();
    let answer = |env: &Envelope| {
        let step = env.header(protocol::STEP_NAME).unwrap_or_default();
        Some(match by_turn.get(step) {
            Some(a) => StepOutcome::Ok(a.clone()),
            None => ok(),
        })
    };
    // The first turn runs under 5 turns (its answer folded: `find` is sent)...
    let (store, destinations) = (w.store.clone(), w.destinations.clone());
    let first = std::cell::Cell::new(true);
    testing::pump(
        &store,
        &destinations,
        "the first turn's plan is sent",
        Duration::from_secs(30),
        async || !first.get(),
        async |batch| {
            for env in batch.iter() {
                if env.header(protocol::STEP_NAME) == Some("find") {
                    first.set(false);
                }
                w.deliver(env, &mut |_, e, _| answer(e), &mut |_, _| ok())
                    .await;
            }
        },
    )
    .await;
    // ...then the process runs a definition that allows 1.
    w.engine = Engine::new([thinking(1)]).unwrap();
    w.pump(&[id], |_, e, _| answer(e), |_, _| ok()).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    let steps: Vec<String> = query::steps(&w.store, id)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(steps, ["plan", "find", "plan_2", "book", "plan_3"]);
}
both_backends!(kept_turns_tests, a_saga_keeps_its_turns);

#[test]
fn a_turn_is_checked_as_the_engine_will() {
    let def = thinking(3);
    let so_far = Plan::new().then(undoable("find", "search", None));
    def.check_turn(
        &so_far,
        &Plan::new().then(undoable("book", "book", Some("find"))),
    )
    .unwrap();
    let err = def
        .check_turn(&so_far, &Plan::new().then(undoable("find", "book", None)))
        .unwrap_err();
    assert!(
        err.to_string().contains("two steps are named `find`"),
        "{err}"
    );
    let err = def
        .check_plan(&Plan::new().then(undoable("plan_7", "book", None)))
        .unwrap_err();
    assert!(
        err.to_string().contains("name its planner's turns"),
        "{err}"
    );
}

#[test]
fn replan_needs_a_planner_and_a_turn() {
    for b in [
        PlannedSaga::builder("x", 1).destinations(["a"]).replan(3),
        PlannedSaga::builder("x", 1)
            .destinations(["a"])
            .planner(Step::new("plan", "planner").nothing_to_undo())
            .replan(0),
    ] {
        let err = b.build().unwrap_err();
        assert!(
            matches!(&err, Error::InvalidDefinition(why) if why.contains("replan")),
            "{err:?}"
        );
    }
}
