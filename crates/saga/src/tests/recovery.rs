//! Re-planning after a failure (`PlannedBuilder::replan_on_failure`): the planner is
//! asked again only when a step fails; the rest of that turn is dropped, the failure
//! is recorded for the planner, and what it answers runs instead.

use super::replanning::{answers, plan_json, run_planned, undoable};
use super::*;

/// A planned saga whose planner is asked again only after a failure, up to `turns`.
pub(super) fn careful(turns: u32) -> SagaDefinition {
    PlannedSaga::builder("careful", 1)
        .destinations(["search", "book", "mail"])
        .planner(
            Step::new("plan", "planner")
                .command(|d: &Value| json!({ "results": d["results"], "failed": d["failed"] }))
                .nothing_to_undo(),
        )
        .replan_on_failure(turns)
        .retry(fast())
        .build()
        .unwrap()
}

/// Runs one `careful(turns)` saga to its end (see `run_planned`).
async fn run(
    backend: Backend,
    turns: u32,
    by_turn: HashMap<String, Value>,
    failing: &'static [&'static str],
    duplicate_rate: f64,
) -> (World, SagaId, Vec<String>, Vec<String>) {
    run_planned(backend, careful(turns), by_turn, failing, duplicate_rate).await
}

/// Turn 1: `find`, then `book` (after `find`), then `mail`; after a failure, turn 2
/// books elsewhere (`rebook`), and mails.
fn plans() -> HashMap<String, Value> {
    answers(&[
        (
            "plan",
            plan_json(
                Plan::new()
                    .then(undoable("find", "search", None))
                    .then(undoable("book", "book", Some("find")))
                    .then(undoable("mail", "mail", Some("find"))),
            ),
        ),
        (
            "plan_2",
            plan_json(
                Plan::new()
                    .then(undoable("rebook", "book", Some("find")))
                    .then(undoable("mail_2", "mail", Some("rebook"))),
            ),
        ),
    ])
}

// Nothing fails: the planner is asked once, and the saga completes with its plan.
async fn without_a_failure_the_planner_is_asked_once(backend: Backend) {
    let (w, id, done, _) = run(backend, 3, plans(), &[], 0.0).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(done, ["plan", "find", "book", "mail"]);
}
both_backends!(once_tests, without_a_failure_the_planner_is_asked_once);

// `book` fails: nothing is undone, `mail` (the rest of the turn) is dropped, and the
// planner, told what failed, books elsewhere; then the saga completes, not asked a
// third time. Also with a third of the messages delivered twice.
async fn a_failure_asks_the_planner_again(backend: Backend) {
    for duplicate_rate in [0.0, 0.3] {
        let (w, id, done, undone) = run(backend, 3, plans(), &["book"], duplicate_rate).await;
        let s = query::get(&w.store, id).await.unwrap().unwrap();
        assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
        assert_eq!(done, ["plan", "find", "plan_2", "rebook", "mail_2"]);
        assert!(undone.is_empty(), "{undone:?}");
        let data = query::data(&w.store, id).await.unwrap().unwrap();
        assert_eq!(data["failures"][0]["step"], "book", "{data}");
        assert!(data["failed"].is_null(), "{data}");
        assert_eq!(data["turns"], json!([2, 2]), "`mail` dropped: {data}");
        let steps = query::steps(&w.store, id).await.unwrap();
        let book = steps.iter().find(|s| s.name == "book").unwrap();
        assert_eq!(book.state, StepState::Failed);
        assert!(!steps.iter().any(|s| s.name == "mail"), "{steps:?}");
    }
}
both_backends!(again_tests, a_failure_asks_the_planner_again);

// Out of turns, a failure compensates as usual: every turn's steps undone, latest
// first (the failed ones too: their outcome is not taken for granted).
async fn out_of_turns_a_failure_compensates(backend: Backend) {
    let (w, id, done, undone) = run(backend, 2, plans(), &["book", "rebook"], 0.0).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Compensated);
    assert!(s.error.unwrap_or_default().contains("rebook"));
    assert_eq!(done, ["plan", "find", "plan_2"]);
    assert_eq!(undone, ["rebook", "book", "find"]);
}
both_backends!(out_of_turns_tests, out_of_turns_a_failure_compensates);

// The planner may decide a failure needs nothing more: `{"done": true}`, and the saga
// completes, the failed step staying failed and `mail` never sent.
async fn the_planner_may_finish_after_a_failure(backend: Backend) {
    let mut by_turn = plans();
    by_turn.insert("plan_2".into(), json!({ "done": true }));
    let (w, id, done, _) = run(backend, 3, by_turn, &["book"], 0.0).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert_eq!(done, ["plan", "find", "plan_2"]);
}
both_backends!(finish_tests, the_planner_may_finish_after_a_failure);

// A member of a parallel group fails: the planner is asked once its sibling answered,
// told of the failure, and the sibling's result is kept.
async fn a_parallel_failure_waits_for_its_siblings(backend: Backend) {
    let mut by_turn = plans();
    by_turn.insert(
        "plan".into(),
        plan_json(
            Plan::new()
                .then(undoable("find", "search", None))
                .parallel([
                    undoable("book", "book", Some("find")),
                    undoable("mail", "mail", Some("find")),
                ]),
        ),
    );
    let (w, id, done, undone) = run(backend, 3, by_turn, &["book"], 0.0).await;
    let s = query::get(&w.store, id).await.unwrap().unwrap();
    assert_eq!(s.state, SagaState::Completed, "{:?}", s.error);
    assert!(undone.is_empty(), "{undone:?}");
    let at = |n: &str| done.iter().position(|d| d == n).unwrap();
    assert!(at("mail") < at("plan_2"), "{done:?}");
    assert_eq!(done.len(), 6, "{done:?}");
    let data = query::data(&w.store, id).await.unwrap().unwrap();
    assert_eq!(data["results"]["mail"], "mail done", "{data}");
}
both_backends!(parallel_tests, a_parallel_failure_waits_for_its_siblings);
