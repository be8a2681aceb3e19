//! The ai_assistant example as a child process, on both backends, against its local
//! LLM stub (`examples/support/llm_stub.rs`): normal answers with seeded rate limits
//! and refusals (the planner's a plan, which varies from saga to saga), and the test
//! modes (503, no answer, a reply of the wrong shape, 400, an invalid plan, no plan).
//! Every request the stub receives is in `assistant_llm_calls`, which tells which
//! idempotency keys were used for which saga step; the plan each saga ran is in
//! `assistant_plans`. Some plans delegate competitors' research to child
//! `competitor_research` sagas, each with its own plan (in `assistant_plans` too).
//! Every plan ends with a wait for the company's `reply` that ends by time, then a
//! follow-up (`assistant_follow_ups`), drafted unless the reply came.

mod durability;
mod follow_ups;
mod llm;
#[path = "../support/mod.rs"]
mod support;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::Duration;

use agentsaga::core::testing::{Backend, fresh_url, wait_until};
use agentsaga::core::{Store, both_backends};
use agentsaga::saga::{
    CompensationState, Engine, SagaId, SagaState, Signal, StepState, child_destination, query,
};

/// The assistant's saga, and the child saga its plans may delegate to.
pub(crate) const ASSISTANT: &str = "ai_assistant";
pub(crate) const CHILD: &str = "competitor_research";

/// The undoable effect every plan has; the calendar slot, which only some plans
/// reserve, is checked against the plan ([`check_effects`]).
pub(crate) const UNDOABLE: &[(&str, &str)] = &[("assistant_drafts", "drafted")];
pub(crate) const FORWARD: &[(&str, &str)] = &[
    ("assistant_emails", "sent"),
    ("assistant_crm_records", "created"),
];

/// Every table the example writes its effects to, the planner's included.
pub(crate) const EFFECT_TABLES: &[&str] = &[
    "assistant_plans",
    "assistant_research",
    "assistant_calendar_slots",
    "assistant_drafts",
    "assistant_emails",
    "assistant_crm_records",
    "assistant_follow_ups",
];

/// The child talks to its own stub whatever the developer's environment says.
pub(crate) fn no_openai(cmd: &mut Command) {
    for var in ["OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"] {
        cmd.env_remove(var);
    }
}

/// A run that approves every email itself (`--auto-approve`).
pub(crate) fn assistant(url: &str, args: &[&str]) -> String {
    let mut args = args.to_vec();
    args.push("--auto-approve");
    support::run_with("ai_assistant", url, &args, no_openai)
}

/// A run that leaves the approvals to a person.
pub(crate) fn assistant_unapproved(url: &str, args: &[&str]) -> String {
    support::run_with("ai_assistant", url, args, no_openai)
}

/// A request the stub received.
#[derive(Debug)]
pub(crate) struct Call {
    key: String,
    saga: String,
    step: String,
    answer: String,
}

pub(crate) async fn llm_calls(store: &Store) -> Vec<Call> {
    let sql = "SELECT idempotency_key, saga_id, step, answer FROM assistant_llm_calls";
    let rows: Vec<(String, String, String, String)> = support::rows_of(store, sql).await;
    rows.into_iter()
        .map(|(key, saga, step, answer)| Call {
            key,
            saga,
            step,
            answer,
        })
        .collect()
}

/// The rows of `sql` (text columns), on either backend.
pub(crate) async fn text_rows(store: &Store, sql: &str) -> Vec<(String, String)> {
    support::rows_of(store, sql).await
}

/// The step names of each saga's plan, in order, as the planner recorded it.
pub(crate) async fn plans(store: &Store) -> HashMap<String, Vec<String>> {
    text_rows(store, "SELECT saga_id, steps FROM assistant_plans")
        .await
        .into_iter()
        .map(|(saga, steps)| (saga, steps.split_whitespace().map(str::to_owned).collect()))
        .collect()
}

/// The sagas that have a row in `table`.
pub(crate) async fn rows(store: &Store, table: &str) -> Vec<String> {
    text_rows(store, &format!("SELECT saga_id, saga_id FROM {table}"))
        .await
        .into_iter()
        .map(|(saga, _)| saga)
        .collect()
}

/// The names of the steps saga `id` dispatched, in order.
pub(crate) async fn steps_run(store: &Store, id: &str) -> Vec<String> {
    query::steps(store, id.parse().unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

/// The effects match each saga's outcome and plan: `support::check_invariants_of` the
/// assistant's sagas for the effects of the steps every plan has (the draft, the
/// email, the CRM record; every saga terminal, the outbox drained), and, per saga, the
/// calendar slot if its plan reserved one and none if it did not. A completed saga ran
/// exactly the steps of its plan, in the planner's turns ([`check_replanned`]), its
/// research done, and followed up as its wait for the reply ended
/// ([`follow_ups::check_follow_up`]); a compensated one has no follow-up.
/// The child sagas ([`check_children`]) too. Returns (completed, compensated) of the
/// assistant's sagas.
pub(crate) async fn check_effects(store: &Store) -> (usize, usize) {
    let counts = support::check_invariants_of(store, Some(ASSISTANT), UNDOABLE, FORWARD).await;
    let plans = plans(store).await;
    let slots = support::statuses(store, "assistant_calendar_slots").await;
    let research = support::statuses(store, "assistant_research").await;
    let follow_ups = support::statuses(store, "assistant_follow_ups").await;
    for (id, state) in assistant_sagas(store).await {
        let plan = plans.get(&id);
        let with_slot = plan.is_some_and(|p| p.iter().any(|s| s == "reserve_calendar_slot"));
        let slot = slots.get(&id).map(String::as_str);
        if state == SagaState::Completed {
            let plan = plan.unwrap_or_else(|| panic!("completed saga {id} has no plan"));
            assert_eq!(slot, with_slot.then_some("reserved"), "saga {id}: {plan:?}");
            assert_eq!(research.get(&id).map(String::as_str), Some("done"));
            check_replanned(store, &id, plan).await;
            let status = follow_ups.get(&id).map(String::as_str);
            follow_ups::check_follow_up(store, &id, status).await;
        } else {
            assert_eq!(follow_ups.get(&id), None, "compensated saga {id}");
            assert_ne!(slot, Some("reserved"), "compensated saga {id}");
            if !with_slot {
                assert_eq!(slot, None, "saga {id} reserved a slot it did not plan");
            }
        }
    }
    check_children(store, &plans).await;
    counts
}

/// The planner's steps of a saga's turns: the research, the rest, done.
pub(crate) const TURN_STEPS: [&str; 3] = ["plan", "plan_2", "plan_3"];

/// Completed saga `id` re-planned: its ledger has the planner's three turns, `plan`
/// first, `plan_2` between the research (turn 1) and the draft (turn 2), `plan_3`
/// last, and between them exactly the steps of its `plan`; its data has three
/// `turns`, and the planner said it is done.
pub(crate) async fn check_replanned(store: &Store, id: &str, plan: &[String]) {
    let run = steps_run(store, id).await;
    let (turns, planned): (Vec<&str>, Vec<&str>) = run
        .iter()
        .map(String::as_str)
        .partition(|s| TURN_STEPS.contains(s));
    assert_eq!(turns, TURN_STEPS, "saga {id}: {run:?}");
    assert_eq!(planned, plan, "saga {id}");
    let at = |name: &str| run.iter().position(|s| s == name).unwrap();
    assert_eq!((at("plan"), at("plan_3")), (0, run.len() - 1), "{run:?}");
    assert!(at("research") < at("plan_2") && at("plan_2") < at("draft_email"));
    let after_the_email = [
        "send_email",
        "create_crm_record",
        "await_reply",
        "follow_up",
    ];
    let order: Vec<usize> = after_the_email.iter().map(|s| at(s)).collect();
    assert!(order.is_sorted(), "saga {id}: {run:?}");
    let data = query::data(store, id.parse().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(data["turns"].as_array().map(Vec::len), Some(3), "{data}");
    assert_eq!(data["done"], true, "saga {id}");
}

/// No turn asked twice: each (saga, planner turn) the stub received was asked with one
/// idempotency key ([`check_keys`]); each assistant's saga was asked its first turns
/// in order, a completed one all three. Returns the (saga, turn) pairs asked.
pub(crate) async fn check_turns(store: &Store, calls: &[Call]) -> usize {
    check_keys(calls);
    let mut asked: HashMap<&str, HashSet<&str>> = HashMap::new();
    for c in calls
        .iter()
        .filter(|c| TURN_STEPS.contains(&c.step.as_str()))
    {
        asked.entry(&c.saga).or_default().insert(&c.step);
    }
    let mut pairs = 0;
    for (id, state) in assistant_sagas(store).await {
        let turns = asked.get(id.as_str()).cloned().unwrap_or_default();
        let first: HashSet<&str> = TURN_STEPS[..turns.len()].iter().copied().collect();
        assert_eq!(turns, first, "saga {id}");
        if state == SagaState::Completed {
            assert_eq!(turns.len(), 3, "saga {id}");
        }
        pairs += turns.len();
    }
    pairs
}

/// The assistant's sagas (not their children), with their states.
pub(crate) async fn assistant_sagas(store: &Store) -> Vec<(String, SagaState)> {
    support::all_sagas(store)
        .await
        .into_iter()
        .filter(|s| s.name == ASSISTANT)
        .map(|s| (s.id.to_string(), s.state))
        .collect()
}

/// The planned steps of a plan that are child sagas (the stub names them
/// `competitor_<n>`).
pub(crate) fn planned_children(plan: &[String]) -> usize {
    plan.iter().filter(|s| s.starts_with("competitor_")).count()
}

/// The child sagas: each a `competitor_research` of an assistant's saga, started only
/// by a plan that delegates, and terminal. A completed parent's children all
/// completed, one per child stage of its plan, each having run its own plan (its
/// planner's step, then `research`, done); a compensated parent's children are all
/// compensated, those that had completed included (the parent's step of such a
/// child succeeded, and its compensation is done). Returns what it counted.
pub(crate) async fn check_children(
    store: &Store,
    plans: &HashMap<String, Vec<String>>,
) -> Children {
    let all = support::all_sagas(store).await;
    let parents: HashMap<String, SagaState> = all
        .iter()
        .filter(|s| s.name == ASSISTANT)
        .map(|s| (s.id.to_string(), s.state))
        .collect();
    let research = support::statuses(store, "assistant_research").await;
    let mut by_parent: HashMap<String, Vec<(String, SagaState)>> = HashMap::new();
    for s in &all {
        assert!(
            s.name == ASSISTANT || s.name == CHILD,
            "unknown saga {}: {}",
            s.id,
            s.name
        );
        if s.name == ASSISTANT {
            assert_eq!(s.parent_id, None, "saga {} is a child", s.id);
            continue;
        }
        let parent = s
            .parent_id
            .unwrap_or_else(|| panic!("child saga {} has no parent", s.id))
            .to_string();
        assert!(parents.contains_key(&parent), "child {} of {parent}", s.id);
        let id = s.id.to_string();
        match s.state {
            SagaState::Completed => {
                let plan = plans
                    .get(&id)
                    .unwrap_or_else(|| panic!("child {id}: no plan"));
                assert_eq!(plan, &["research"], "child {id}");
                assert_eq!(steps_run(store, &id).await, ["plan", "research"]);
                assert_eq!(research.get(&id).map(String::as_str), Some("done"));
            }
            SagaState::Compensated => {}
            other => panic!("child saga {id} is {other}, not terminal"),
        }
        by_parent.entry(parent).or_default().push((id, s.state));
    }
    // The same, as the table has it: the children are the rows with a parent.
    let sql = "SELECT CAST(id AS TEXT), CAST(parent_id AS TEXT) FROM saga_instances \
               WHERE parent_id IS NOT NULL AND name = 'competitor_research'";
    let rows: Vec<(String, String)> = text_rows(store, sql).await;
    assert_eq!(rows.len(), by_parent.values().map(Vec::len).sum::<usize>());
    let mut undone_completed = 0;
    for (parent, state) in &parents {
        let children = by_parent.get(parent).map(Vec::as_slice).unwrap_or_default();
        let planned = plans.get(parent).map_or(0, |p| planned_children(p));
        assert!(children.len() <= planned, "saga {parent}: {children:?}");
        match state {
            SagaState::Completed => {
                assert_eq!(children.len(), planned, "saga {parent}: {children:?}");
                assert!(
                    children.iter().all(|(_, s)| *s == SagaState::Completed),
                    "completed saga {parent}: {children:?}"
                );
            }
            _ => {
                assert!(
                    children.iter().all(|(_, s)| *s == SagaState::Compensated),
                    "compensated saga {parent}: {children:?}"
                );
                let id = parent.parse().unwrap();
                for step in query::steps(store, id).await.unwrap() {
                    let child = step.destination == child_destination(CHILD);
                    if child && step.state == StepState::Succeeded {
                        assert_eq!(
                            step.compensation_state,
                            Some(CompensationState::Done),
                            "compensated saga {parent}: {step:?}"
                        );
                        undone_completed += 1;
                    }
                }
            }
        }
    }
    Children {
        parents: by_parent.len(),
        children: rows.len(),
        undone_completed,
    }
}

/// What [`check_children`] counted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Children {
    /// The assistant's sagas that started children.
    pub(crate) parents: usize,
    /// The children.
    pub(crate) children: usize,
    /// The children that completed, then were compensated with their parent.
    pub(crate) undone_completed: usize,
}
/// Each idempotency key the stub saw belongs to exactly one (saga, step) pair, and
/// each pair used one key. Returns the number of requests per key.
pub(crate) fn check_keys(calls: &[Call]) -> HashMap<&str, usize> {
    let mut owner: HashMap<&str, (&str, &str)> = HashMap::new();
    let mut key_of: HashMap<(&str, &str), &str> = HashMap::new();
    let mut requests: HashMap<&str, usize> = HashMap::new();
    for c in calls {
        assert!(
            !c.key.is_empty() && !c.saga.is_empty() && !c.step.is_empty(),
            "{c:?}"
        );
        let pair = (c.saga.as_str(), c.step.as_str());
        let first = *owner.entry(&c.key).or_insert(pair);
        assert_eq!(first, pair, "key {} used by two saga steps", c.key);
        let key = *key_of.entry(pair).or_insert(&c.key);
        assert_eq!(key, c.key, "saga step {pair:?} used two keys");
        *requests.entry(&c.key).or_default() += 1;
    }
    requests
}

/// Every assistant's saga (not the children) with its state and error.
pub(crate) async fn outcomes(store: &Store) -> Vec<(String, SagaState, String)> {
    let list = support::all_sagas(store).await;
    list.into_iter()
        .filter(|s| s.name == ASSISTANT)
        .map(|s| (s.id.to_string(), s.state, s.error.unwrap_or_default()))
        .collect()
}

/// Every saga compensated, each error containing all of `needles`.
pub(crate) async fn all_compensated(store: &Store, n: usize, needles: &[&str]) {
    let outcomes = outcomes(store).await;
    assert_eq!(outcomes.len(), n);
    for (id, state, error) in &outcomes {
        assert_eq!(*state, SagaState::Compensated, "saga {id}: {error}");
        for needle in needles {
            assert!(
                error.contains(needle),
                "saga {id}: `{needle}` not in {error}"
            );
        }
    }
}

/// The sagas waiting for a signal.
pub(crate) async fn waiting(store: &Store) -> Vec<query::SagaSummary> {
    let waiting = query::ListFilter {
        waiting: true,
        ..query::ListFilter::default()
    };
    query::list(store, &waiting).await.unwrap()
}

/// Sends each `(saga, signal)` to its saga's wait for `approval`, in one transaction (as
/// the CLI sends it).
pub(crate) async fn signal_approvals(store: &Store, signals: Vec<(SagaId, Signal)>) {
    let mut tx = store.begin().await.unwrap();
    for (id, signal) in signals {
        Engine::signal(&mut tx, id, "approval", signal)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
}

/// Ann's approval.
pub(crate) fn approved_by_ann() -> Signal {
    Signal::Approve(serde_json::json!({ "by": "ann" }))
}
