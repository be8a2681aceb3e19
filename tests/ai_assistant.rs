//! The ai_assistant example as a child process, on both backends, against its local
//! LLM stub (`examples/support/llm_stub.rs`): normal answers with seeded rate limits
//! and refusals (the planner's a plan, which varies from saga to saga), and the test
//! modes (503, no answer, a reply of the wrong shape, 400, an invalid plan, no plan).
//! Every request the stub receives is in `assistant_llm_calls`, which tells which
//! idempotency keys were used for which saga step; the plan each saga ran is in
//! `assistant_plans`.

mod support;

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::time::Duration;

use agentsaga::core::sqlx::{self, AssertSqlSafe};
use agentsaga::core::testing::{Backend, fresh_url};
use agentsaga::core::{ReadPool, Store, both_backends};
use agentsaga::saga::{SagaState, query};

/// The undoable effect every plan has; the calendar slot, which only some plans
/// reserve, is checked against the plan ([`check_effects`]).
const UNDOABLE: &[(&str, &str)] = &[("assistant_drafts", "drafted")];
const FORWARD: &[(&str, &str)] = &[
    ("assistant_emails", "sent"),
    ("assistant_crm_records", "created"),
];

/// Every table the example writes its effects to, the planner's included.
const EFFECT_TABLES: &[&str] = &[
    "assistant_plans",
    "assistant_research",
    "assistant_calendar_slots",
    "assistant_drafts",
    "assistant_emails",
    "assistant_crm_records",
];

/// The child talks to its own stub whatever the developer's environment says.
fn no_openai(cmd: &mut Command) {
    for var in ["OPENAI_BASE_URL", "OPENAI_API_KEY", "OPENAI_MODEL"] {
        cmd.env_remove(var);
    }
}

/// A run that approves every email itself (`--auto-approve`).
fn assistant(url: &str, args: &[&str]) -> String {
    let mut args = args.to_vec();
    args.push("--auto-approve");
    support::run_with("ai_assistant", url, &args, no_openai)
}

/// A run that leaves the approvals to a person.
fn assistant_unapproved(url: &str, args: &[&str]) -> String {
    support::run_with("ai_assistant", url, args, no_openai)
}

/// A request the stub received.
#[derive(Debug)]
struct Call {
    key: String,
    saga: String,
    step: String,
    answer: String,
}

async fn llm_calls(store: &Store) -> Vec<Call> {
    let sql = "SELECT idempotency_key, saga_id, step, answer FROM assistant_llm_calls";
    let rows: Vec<(String, String, String, String)> = match store.reader() {
        ReadPool::Sqlite(reader) => sqlx::query_as(AssertSqlSafe(sql))
            .fetch_all(reader)
            .await
            .unwrap(),
        ReadPool::Postgres(pool) => sqlx::query_as(AssertSqlSafe(sql))
            .fetch_all(pool)
            .await
            .unwrap(),
    };
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
async fn text_rows(store: &Store, sql: &str) -> Vec<(String, String)> {
    match store.reader() {
        ReadPool::Sqlite(reader) => sqlx::query_as(AssertSqlSafe(sql.to_owned()))
            .fetch_all(reader)
            .await
            .unwrap(),
        ReadPool::Postgres(pool) => sqlx::query_as(AssertSqlSafe(sql.to_owned()))
            .fetch_all(pool)
            .await
            .unwrap(),
    }
}

/// The step names of each saga's plan, in order, as the planner recorded it.
async fn plans(store: &Store) -> HashMap<String, Vec<String>> {
    text_rows(store, "SELECT saga_id, steps FROM assistant_plans")
        .await
        .into_iter()
        .map(|(saga, steps)| (saga, steps.split_whitespace().map(str::to_owned).collect()))
        .collect()
}

/// The sagas that have a row in `table`.
async fn rows(store: &Store, table: &str) -> Vec<String> {
    text_rows(store, &format!("SELECT saga_id, saga_id FROM {table}"))
        .await
        .into_iter()
        .map(|(saga, _)| saga)
        .collect()
}

/// The names of the steps saga `id` dispatched, in order.
async fn steps_run(store: &Store, id: &str) -> Vec<String> {
    query::steps(store, id.parse().unwrap())
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

/// The effects match each saga's outcome and plan: `support::check_invariants` for
/// the effects of the steps every plan has (the draft, the email, the CRM record;
/// every saga terminal, the outbox drained), and, per saga, the calendar slot if its
/// plan reserved one and none if it did not. A completed saga ran the planner's step
/// and then exactly the steps of its plan, its research done. Returns (completed,
/// compensated).
async fn check_effects(store: &Store) -> (usize, usize) {
    let counts = support::check_invariants(store, UNDOABLE, FORWARD).await;
    let plans = plans(store).await;
    let slots = support::statuses(store, "assistant_calendar_slots").await;
    let research = support::statuses(store, "assistant_research").await;
    for (id, state) in support::sagas(store).await {
        let plan = plans.get(&id);
        let with_slot = plan.is_some_and(|p| p.iter().any(|s| s == "reserve_calendar_slot"));
        let slot = slots.get(&id).map(String::as_str);
        if state == SagaState::Completed {
            let plan = plan.unwrap_or_else(|| panic!("completed saga {id} has no plan"));
            assert_eq!(slot, with_slot.then_some("reserved"), "saga {id}: {plan:?}");
            assert_eq!(research.get(&id).map(String::as_str), Some("done"));
            let planned: Vec<&str> = std::iter::once("plan")
                .chain(plan.iter().map(String::as_str))
                .collect();
            assert_eq!(steps_run(store, &id).await, planned, "saga {id}");
        } else {
            assert_ne!(slot, Some("reserved"), "compensated saga {id}");
            if !with_slot {
                assert_eq!(slot, None, "saga {id} reserved a slot it did not plan");
            }
        }
    }
    counts
}

/// Each idempotency key the stub saw belongs to exactly one (saga, step) pair, and
/// each pair used one key. Returns the number of requests per key.
fn check_keys(calls: &[Call]) -> HashMap<&str, usize> {
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

/// Every saga with its state and error.
async fn outcomes(store: &Store) -> Vec<(String, SagaState, String)> {
    let list = query::list(
        store,
        &query::ListFilter {
            limit: u32::MAX,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    list.into_iter()
        .map(|s| (s.id.to_string(), s.state, s.error.unwrap_or_default()))
        .collect()
}

/// Every saga compensated, each error containing all of `needles`.
async fn all_compensated(store: &Store, n: usize, needles: &[&str]) {
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

async fn happy_path(backend: Backend) {
    let url = fresh_url(backend).await;
    assistant(&url, &["--sagas", "30", "--fail-rate", "0", "--seed", "1"]);
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await, (30, 0));
    assert_eq!(
        support::statuses(&store, "assistant_research").await.len(),
        30
    );
    // The planner's plans vary: some reserve a calendar slot, some do not.
    let plans = plans(&store).await;
    assert_eq!(plans.len(), 30);
    let with_slot = plans
        .values()
        .filter(|p| p.iter().any(|s| s == "reserve_calendar_slot"))
        .count();
    assert!(0 < with_slot && with_slot < 30, "{plans:?}");
    assert_eq!(
        support::statuses(&store, "assistant_calendar_slots")
            .await
            .len(),
        with_slot
    );
    // Three LLM steps per saga (the planner's, the research, the draft), one key each.
    let calls = llm_calls(&store).await;
    let requests = check_keys(&calls);
    assert_eq!(requests.len(), 90, "{calls:?}");
    let steps: HashSet<&str> = calls.iter().map(|c| c.step.as_str()).collect();
    assert_eq!(steps, HashSet::from(["plan", "research", "draft_email"]));
    assert!(calls.iter().all(|c| c.answer == "200"), "{calls:?}");
}
both_backends!(happy_path_tests, happy_path);

async fn failures_compensate(backend: Backend) {
    let url = fresh_url(backend).await;
    assistant(
        &url,
        &["--sagas", "80", "--fail-rate", "0.4", "--seed", "5"],
    );
    let store = Store::connect(&url).await.unwrap();
    let (completed, compensated) = check_effects(&store).await;
    assert_eq!(completed + compensated, 80);
    assert!(
        completed > 0 && compensated > 0,
        "{completed} / {compensated}"
    );
    // A compensated saga's slot was cancelled (or never reserved); research, read-only,
    // is left as it was.
    let slots = support::statuses(&store, "assistant_calendar_slots").await;
    assert!(slots.values().any(|s| s == "cancelled"));
    // A rate-limited request was tried again with the same key; a refusal is fatal.
    let calls = llm_calls(&store).await;
    let requests = check_keys(&calls);
    assert!(calls.iter().any(|c| c.answer == "429"));
    assert!(requests.values().any(|n| *n > 1), "no key was retried");
    let outcomes = outcomes(&store).await;
    assert!(
        outcomes
            .iter()
            .any(|(_, s, e)| *s == SagaState::Compensated && e.contains("the model refused")),
        "{outcomes:?}"
    );
}
both_backends!(failure_tests, failures_compensate);

/// The endpoint answers 503 to every draft: the step is retried with the same key,
/// then the saga compensates: the slot is cancelled, no draft exists.
async fn failing_llm_compensates(backend: Backend) {
    let url = fresh_url(backend).await;
    assistant(
        &url,
        &[
            "--sagas",
            "8",
            "--fail-rate",
            "0",
            "--seed",
            "2",
            "--llm-stub-mode",
            "fail",
            "--llm-stub-step",
            "draft_email",
        ],
    );
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await, (0, 8));
    all_compensated(
        &store,
        8,
        &["draft_email", "LLM endpoint", "HTTP 503", "gave up"],
    )
    .await;
    // Each slot a plan reserved was cancelled, with the id its reservation returned.
    let plans = plans(&store).await;
    let slots = support::statuses(&store, "assistant_calendar_slots").await;
    assert_eq!(
        slots.len(),
        plans
            .values()
            .filter(|p| p.iter().any(|s| s == "reserve_calendar_slot"))
            .count()
    );
    assert!(slots.values().all(|s| s == "cancelled"), "{slots:?}");
    assert!(
        support::statuses(&store, "assistant_drafts")
            .await
            .is_empty()
    );
    let calls = llm_calls(&store).await;
    let requests = check_keys(&calls);
    let drafts: Vec<&Call> = calls.iter().filter(|c| c.step == "draft_email").collect();
    assert!(drafts.iter().all(|c| c.answer == "503"), "{drafts:?}");
    for c in &drafts {
        assert!(requests[c.key.as_str()] > 1, "{} was not retried", c.key);
    }
}
both_backends!(failing_llm_tests, failing_llm_compensates);

/// The endpoint never answers the research: each request times out (3/4 of the 3 s
/// step timeout, longer than the stub takes to answer the planner), the step is
/// retried, and the saga compensates; none is left running.
async fn hanging_llm_compensates(backend: Backend) {
    let url = fresh_url(backend).await;
    let started = std::time::Instant::now();
    assistant(
        &url,
        &[
            "--sagas",
            "8",
            "--fail-rate",
            "0",
            "--seed",
            "3",
            "--llm-stub-mode",
            "hang",
            "--llm-stub-step",
            "research",
            "--step-timeout-ms",
            "3000",
        ],
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await, (0, 8));
    all_compensated(&store, 8, &["research", "timed out"]).await;
    assert!(
        support::statuses(&store, "assistant_research")
            .await
            .is_empty()
    );
    let calls = llm_calls(&store).await;
    check_keys(&calls);
    for c in &calls {
        let expected = if c.step == "research" { "hang" } else { "200" };
        assert_eq!(c.answer, expected, "{c:?}");
    }
}
both_backends!(hanging_llm_tests, hanging_llm_compensates);

/// A 200 whose body is not a chat completion (here, the research's) is fatal at once,
/// with the reason.
async fn wrong_shape_is_fatal(backend: Backend) {
    let url = fresh_url(backend).await;
    assistant(
        &url,
        &[
            "--sagas",
            "6",
            "--fail-rate",
            "0",
            "--seed",
            "4",
            "--llm-stub-mode",
            "bad-shape",
            "--llm-stub-step",
            "research",
        ],
    );
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await, (0, 6));
    all_compensated(
        &store,
        6,
        &["research", "is not a chat completion", "`choices`"],
    )
    .await;
    let calls = llm_calls(&store).await;
    let requests = check_keys(&calls);
    assert_eq!(requests.len(), 12, "the planner's and the research's");
    assert!(
        requests.values().all(|n| *n == 1),
        "a fatal reply was retried"
    );
}
both_backends!(wrong_shape_tests, wrong_shape_is_fatal);

/// A 4xx other than 429 is fatal at once: the draft step's 400 undoes the slot.
async fn client_error_is_fatal(backend: Backend) {
    let url = fresh_url(backend).await;
    assistant(
        &url,
        &[
            "--sagas",
            "6",
            "--fail-rate",
            "0",
            "--seed",
            "6",
            "--llm-stub-mode",
            "bad-request",
            "--llm-stub-step",
            "draft_email",
        ],
    );
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await, (0, 6));
    all_compensated(&store, 6, &["draft_email", "HTTP 400", "context length"]).await;
    let slots = support::statuses(&store, "assistant_calendar_slots").await;
    assert!(slots.values().all(|s| s == "cancelled"), "{slots:?}");
    let calls = llm_calls(&store).await;
    let requests = check_keys(&calls);
    assert_eq!(
        requests.len(),
        18,
        "the planner's, the research's and the draft's"
    );
    assert!(
        requests.values().all(|n| *n == 1),
        "a fatal answer was retried"
    );
}
both_backends!(client_error_tests, client_error_is_fatal);

/// Killed (SIGKILL) while its LLM calls are in flight (the planner's among them), then
/// finished by `--sagas 0`: every saga ends completed or compensated with each effect
/// once, a resumed saga runs the plan it had, and a call made again after the restart
/// carries the same key.
async fn survives_kill_9(backend: Backend) {
    let url = fresh_url(backend).await;
    let mut interrupted = 0;
    for (round, wait_ms) in [(0, 1500), (1, 700)] {
        let sagas = if round == 0 { "100" } else { "0" };
        let mut child = support::spawn_with(
            "ai_assistant",
            &url,
            &[
                "--sagas",
                sagas,
                "--fail-rate",
                "0.2",
                "--seed",
                "8",
                "--auto-approve",
            ],
            no_openai,
        );
        std::thread::sleep(Duration::from_millis(wait_ms));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            interrupted += 1;
        }
        child.wait().unwrap();
    }
    assert!(interrupted >= 1, "no run was killed mid-way");
    assistant(&url, &["--sagas", "0", "--fail-rate", "0.2", "--seed", "8"]);
    let store = Store::connect(&url).await.unwrap();
    let (completed, compensated) = check_effects(&store).await;
    let total = completed + compensated;
    assert!(total > 0 && total % 50 == 0, "{total} sagas");
    check_keys(&llm_calls(&store).await);
}
both_backends!(kill_9_tests, survives_kill_9);

// Without `--auto-approve` the run ends with every saga waiting for a person, and says
// how to approve one; a person's approval (here through `Engine::signal`, as the CLI
// sends it) lets that saga finish on the next run; a rerun of the same requests starts
// nothing new (each was started with the key `request-<i>`), and an auto-approving
// run finishes the rest.
async fn approvals_and_reruns(backend: Backend) {
    use agentsaga::saga::query::ListFilter;
    use agentsaga::saga::{Engine, Signal};
    let url = fresh_url(backend).await;
    let out = assistant_unapproved(&url, &["--sagas", "6", "--fail-rate", "0", "--seed", "3"]);
    assert!(out.contains("waiting for a signal   : 6"), "{out}");
    assert!(out.contains("sagas signal"), "{out}");
    let store = Store::connect(&url).await.unwrap();
    let waiting = |store: Store| async move {
        query::list(
            &store,
            &ListFilter {
                waiting: true,
                ..ListFilter::default()
            },
        )
        .await
        .unwrap()
    };
    let parked = waiting(store.clone()).await;
    assert_eq!(parked.len(), 6);
    assert!(
        parked
            .iter()
            .all(|s| s.waiting_for.as_deref() == Some("approval"))
    );
    assert!(
        support::statuses(&store, "assistant_emails")
            .await
            .is_empty(),
        "nothing sent"
    );

    let approved = parked[0].id;
    let mut tx = store.begin().await.unwrap();
    Engine::signal(
        &mut tx,
        approved,
        "approval",
        Signal::Approve(serde_json::json!({ "by": "ann" })),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    // The same six requests again: nothing new starts; the approved one finishes.
    let out = assistant_unapproved(&url, &["--sagas", "6", "--fail-rate", "0", "--seed", "3"]);
    assert!(out.contains("waiting for a signal   : 5"), "{out}");
    let all = query::list(&store, &ListFilter::default()).await.unwrap();
    assert_eq!(all.len(), 6, "a rerun starts nothing new");
    assert!(
        all.iter()
            .all(|s| s.key.as_deref().is_some_and(|k| k.starts_with("request-")))
    );
    let emails = support::statuses(&store, "assistant_emails").await;
    assert_eq!(emails.keys().collect::<Vec<_>>(), [&approved.to_string()]);

    assistant(&url, &["--sagas", "0", "--fail-rate", "0", "--seed", "3"]);
    assert_eq!(check_effects(&store).await, (6, 0));
    assert!(waiting(store.clone()).await.is_empty());
}
both_backends!(approval_tests, approvals_and_reruns);

/// A planner's answer that is not a valid plan (a step for an agent the assistant lacks;
/// prose with no plan in it) fails the planner's step, fatally, with the reason: each
/// saga is compensated, its error names the reason, and nothing else ran: no step of a
/// plan, no effect, no other LLM call.
async fn invalid_plans_are_fatal(backend: Backend) {
    for (mode, reason) in [
        (
            "bad-plan",
            "step `notify_team`: unknown destination `slack` (this saga allows: calendar, crm, drafts, email, research)",
        ),
        ("no-plan", "no JSON plan in the planner's answer"),
    ] {
        let url = fresh_url(backend).await;
        assistant(
            &url,
            &[
                "--sagas",
                "4",
                "--fail-rate",
                "0",
                "--seed",
                "7",
                "--llm-stub-mode",
                mode,
            ],
        );
        let store = Store::connect(&url).await.unwrap();
        assert_eq!(check_effects(&store).await, (0, 4), "{mode}");
        all_compensated(
            &store,
            4,
            &["step `plan` failed", "the planner's invalid plan: ", reason],
        )
        .await;
        for table in EFFECT_TABLES {
            assert!(rows(&store, table).await.is_empty(), "{mode}: {table}");
        }
        for (id, _) in support::sagas(&store).await {
            assert_eq!(steps_run(&store, &id).await, ["plan"], "{mode}: saga {id}");
        }
        // The planner was asked once per saga (a fatal answer is not asked again), and
        // no one else was.
        let calls = llm_calls(&store).await;
        let requests = check_keys(&calls);
        assert_eq!(requests.len(), 4, "{calls:?}");
        let label = format!("200 {mode}");
        assert!(
            calls.iter().all(|c| c.step == "plan" && c.answer == label),
            "{calls:?}"
        );
    }
}
both_backends!(invalid_plan_tests, invalid_plans_are_fatal);

/// A saga parked at its wait for `approval` survives `kill -9`: the run is killed
/// while some sagas wait and others are still on their way; one waiting saga is
/// approved and another rejected while no process runs (through `Engine::signal`, as
/// the CLI sends it); a `--sagas 0` run then sends the approved email, compensates the
/// rejected saga, and leaves the rest waiting, each with the plan it had.
async fn a_waiting_saga_survives_kill_9(backend: Backend) {
    use agentsaga::saga::query::ListFilter;
    use agentsaga::saga::{Engine, Signal};
    let url = fresh_url(backend).await;
    // Connected (and migrated) before the child starts.
    let store = Store::connect(&url).await.unwrap();
    let waiting = |store: Store| async move {
        query::list(
            &store,
            &ListFilter {
                waiting: true,
                ..ListFilter::default()
            },
        )
        .await
        .unwrap()
    };
    let args = ["--sagas", "10", "--fail-rate", "0", "--seed", "9"];
    let mut child = support::spawn_with("ai_assistant", &url, &args, no_openai);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let parked = loop {
        let parked = waiting(store.clone()).await;
        if parked.len() >= 2 {
            break parked;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no two sagas waited in time"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let running = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(running, "the run ended before it could be killed");
    assert!(
        support::statuses(&store, "assistant_emails")
            .await
            .is_empty(),
        "nothing sent"
    );
    let plans_before = plans(&store).await;

    let (approved, rejected) = (parked[0].id, parked[1].id);
    let mut tx = store.begin().await.unwrap();
    Engine::signal(
        &mut tx,
        approved,
        "approval",
        Signal::Approve(serde_json::json!({ "by": "ann" })),
    )
    .await
    .unwrap();
    Engine::signal(
        &mut tx,
        rejected,
        "approval",
        Signal::Reject("not this one".into()),
    )
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let out = assistant_unapproved(&url, &["--sagas", "0", "--fail-rate", "0", "--seed", "9"]);
    assert!(out.contains("waiting for a signal   : 8"), "{out}");
    let state = |id| {
        let store = store.clone();
        async move { query::get(&store, id).await.unwrap().unwrap() }
    };
    assert_eq!(state(approved).await.state, SagaState::Completed);
    let refused = state(rejected).await;
    assert_eq!(refused.state, SagaState::Compensated);
    assert!(
        refused
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("not this one"),
        "{refused:?}"
    );
    let emails = support::statuses(&store, "assistant_emails").await;
    assert_eq!(emails.keys().collect::<Vec<_>>(), [&approved.to_string()]);
    let crm = text_rows(&store, "SELECT saga_id, note FROM assistant_crm_records").await;
    assert_eq!(crm.len(), 1);
    assert!(crm[0].1.contains("approved by ann"), "{crm:?}");
    let drafts = support::statuses(&store, "assistant_drafts").await;
    assert_eq!(drafts[&rejected.to_string()], "discarded");
    // The sagas that had a plan before the kill kept it.
    let plans_after = plans(&store).await;
    for (id, plan) in &plans_before {
        assert_eq!(plans_after.get(id), Some(plan), "saga {id}");
    }

    assistant(&url, &["--sagas", "0", "--fail-rate", "0", "--seed", "9"]);
    assert_eq!(check_effects(&store).await, (9, 1));
    check_keys(&llm_calls(&store).await);
}
both_backends!(waiting_kill_9_tests, a_waiting_saga_survives_kill_9);
