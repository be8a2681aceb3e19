//! The assistant against its LLM: the happy path, failures, a failing, hanging or
//! misbehaving LLM, a client error.

use super::*;

/// Plans that reserve a calendar slot.
fn with_slot(plans: &HashMap<String, Vec<String>>) -> usize {
    plans
        .values()
        .filter(|p| p.iter().any(|s| s == "reserve_calendar_slot"))
        .count()
}

/// The keys of the requests made for the assistant's sagas (not for their children,
/// which a parent turning back may stop at any point).
async fn parents_keys(store: &Store, calls: &[Call]) -> usize {
    let parents: HashSet<String> = assistant_sagas(store)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let keys: HashSet<&str> = calls
        .iter()
        .filter(|c| parents.contains(&c.saga))
        .map(|c| c.key.as_str())
        .collect();
    keys.len()
}

/// An auto-approving run of `sagas` sagas (no business failures, seed `seed`) whose LLM
/// stub misbehaves (`mode`) on the step `step`; `extra` arguments after those.
async fn misbehaving(
    url: &str,
    sagas: &str,
    seed: &str,
    (mode, step): (&str, &str),
    extra: &[&str],
) -> Store {
    let mut args = vec![
        "--sagas",
        sagas,
        "--fail-rate",
        "0",
        "--seed",
        seed,
        "--llm-stub-mode",
        mode,
        "--llm-stub-step",
        step,
    ];
    args.extend_from_slice(extra);
    assistant(url, &args);
    Store::connect(url).await.unwrap()
}

async fn happy_path(backend: Backend) {
    let url = fresh_url(backend).await;
    assistant(&url, &["--sagas", "30", "--fail-rate", "0", "--seed", "1"]);
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await, (30, 0));
    // The planner's plans vary: some reserve a calendar slot, some do not, some
    // delegate three competitors' research to child sagas (each with its own plan).
    let plans = plans(&store).await;
    let Children {
        parents: delegating,
        children,
        ..
    } = check_children(&store, &plans).await;
    assert!(0 < delegating && delegating < 30, "{plans:?}");
    assert_eq!(children, 3 * delegating);
    assert_eq!(plans.len(), 30 + children);
    assert_eq!(
        support::statuses(&store, "assistant_research").await.len(),
        30 + children
    );
    let parents: HashSet<String> = assistant_sagas(&store)
        .await
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    let with_slot = with_slot(&plans);
    assert!(0 < with_slot && with_slot < 30, "{plans:?}");
    assert_eq!(
        support::statuses(&store, "assistant_calendar_slots")
            .await
            .len(),
        with_slot
    );
    // Five LLM steps per saga (the planner's three turns, the research, the draft), two
    // per child (its planner's, its research), one key each, each asked once.
    let calls = llm_calls(&store).await;
    let requests = check_keys(&calls);
    assert_eq!(requests.len(), 150 + 2 * children, "{calls:?}");
    assert!(requests.values().all(|n| *n == 1), "{calls:?}");
    assert_eq!(check_turns(&store, &calls).await, 90);
    // What the calls used is recorded with each request (its children's included):
    // its five calls, two per child, with the tokens the stub counted.
    let mut used = 0;
    for id in &parents {
        let spent = query::spending(&store, id.parse().unwrap())
            .await
            .unwrap()
            .unwrap();
        assert!(
            spent.usage.tokens_in > 0 && spent.usage.tokens_out > 0,
            "{spent:?}"
        );
        used += spent.usage.calls as usize;
    }
    assert_eq!(used, 150 + 2 * children);
    let steps: HashSet<&str> = calls.iter().map(|c| c.step.as_str()).collect();
    let all = ["plan", "plan_2", "plan_3", "research", "draft_email"];
    assert_eq!(steps, HashSet::from(all));
    let of_children: HashSet<&str> = calls
        .iter()
        .filter(|c| !parents.contains(&c.saga))
        .map(|c| c.step.as_str())
        .collect();
    assert_eq!(of_children, HashSet::from(["plan", "research"]));
    assert!(calls.iter().all(|c| c.answer == "200"), "{calls:?}");
    // Every plan that delegates started its children.
    let delegated = plans
        .iter()
        .filter(|(id, p)| parents.contains(*id) && p.iter().any(|s| s == "competitor_1"))
        .count();
    assert_eq!(delegated, delegating);
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
    let store = misbehaving(&url, "8", "2", ("fail", "draft_email"), &[]).await;
    assert_eq!(check_effects(&store).await, (0, 8));
    all_compensated(
        &store,
        8,
        &["draft_email", "LLM endpoint", "HTTP 503", "gave up"],
    )
    .await;
    // Each slot a plan reserved was cancelled, with the id its reservation returned.
    let plans = plans(&store).await;
    // A delegating saga's children completed before the draft; each was compensated.
    let children = check_children(&store, &plans).await;
    assert!(children.parents > 0, "no plan delegated: {plans:?}");
    assert_eq!(children.undone_completed, children.children, "{children:?}");
    let slots = support::statuses(&store, "assistant_calendar_slots").await;
    assert_eq!(slots.len(), with_slot(&plans));
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
    let timeout = ["--step-timeout-ms", "3000"];
    let store = misbehaving(&url, "8", "3", ("hang", "research"), &timeout).await;
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(check_effects(&store).await, (0, 8));
    // Each saga turned back on its research timing out, or, one that delegated, on a
    // child whose research hung too (the child stage's deadline bounds the child).
    let plans = plans(&store).await;
    let outcomes = outcomes(&store).await;
    assert_eq!(outcomes.len(), 8);
    for (id, state, error) in &outcomes {
        assert_eq!(*state, SagaState::Compensated, "saga {id}: {error}");
        let delegates = plans.get(id).is_some_and(|p| planned_children(p) > 0);
        let research = error.contains("research") && error.contains("timed out");
        let child = delegates && error.contains("the child saga `competitor_research`");
        assert!(research || child, "saga {id}: {error}");
    }
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
    let store = misbehaving(&url, "6", "4", ("bad-shape", "research"), &[]).await;
    assert_eq!(check_effects(&store).await, (0, 6));
    all_compensated(
        &store,
        6,
        &["research", "is not a chat completion", "`choices`"],
    )
    .await;
    let calls = llm_calls(&store).await;
    let requests = check_keys(&calls);
    assert_eq!(
        parents_keys(&store, &calls).await,
        12,
        "the planner's and the research's"
    );
    assert!(
        requests.values().all(|n| *n == 1),
        "a fatal reply was retried"
    );
}
both_backends!(wrong_shape_tests, wrong_shape_is_fatal);

/// A 4xx other than 429 is fatal at once: the draft step's 400 undoes the slot.
async fn client_error_is_fatal(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = misbehaving(&url, "6", "6", ("bad-request", "draft_email"), &[]).await;
    assert_eq!(check_effects(&store).await, (0, 6));
    all_compensated(&store, 6, &["draft_email", "HTTP 400", "context length"]).await;
    let slots = support::statuses(&store, "assistant_calendar_slots").await;
    assert!(slots.values().all(|s| s == "cancelled"), "{slots:?}");
    let calls = llm_calls(&store).await;
    let requests = check_keys(&calls);
    assert_eq!(
        parents_keys(&store, &calls).await,
        24,
        "the planner's first two turns, the research's and the draft's"
    );
    assert!(
        requests.values().all(|n| *n == 1),
        "a fatal answer was retried"
    );
}
both_backends!(client_error_tests, client_error_is_fatal);

/// Each request's budget is one token out: the planner's first answer spends it, so
/// every saga compensates before its research, saying why; what the planner used is
/// recorded with the saga.
async fn a_spent_budget_compensates(backend: Backend) {
    let url = fresh_url(backend).await;
    let args = ["--sagas", "4", "--fail-rate", "0", "--seed", "2"];
    assistant(&url, &[&args[..], &["--budget-tokens-out", "1"]].concat());
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await, (0, 4));
    all_compensated(&store, 4, &["budget spent: tokens_out"]).await;
    for (id, _) in assistant_sagas(&store).await {
        let spent = query::spending(&store, id.parse().unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(spent.usage.calls, 1, "the planner's first turn alone");
        assert!(spent.usage.tokens_out >= 1, "{spent:?}");
    }
    assert!(
        support::statuses(&store, "assistant_research")
            .await
            .is_empty()
    );
}
both_backends!(budget_tests, a_spent_budget_compensates);

/// The stub's account allows 1,200 requests a minute (a burst of 20). Declared as the rate limit (300
/// a minute for each of the four LLM destinations), no request is refused; with a
/// limit far above the account's (the stub's 60: one a second, no burst), the stub refuses some ("429
/// limit"), and the sagas still complete: a 429 pauses its destination and spends no
/// retry.
#[tokio::test]
async fn the_account_limit_holds() {
    let args = ["--sagas", "2", "--fail-rate", "0", "--seed", "4"];
    let url = fresh_url(Backend::Sqlite).await;
    assistant(&url, &[&args[..], &["--llm-rpm", "1200"]].concat());
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await.0, 2);
    let calls = llm_calls(&store).await;
    assert!(calls.iter().all(|c| c.answer == "200"), "{calls:?}");

    let url = fresh_url(Backend::Sqlite).await;
    let over = ["--llm-rpm", "60000", "--llm-stub-rpm", "60"];
    assistant(&url, &[&args[..], &over].concat());
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await.0, 2);
    let calls = llm_calls(&store).await;
    assert!(calls.iter().any(|c| c.answer == "429 limit"), "{calls:?}");
}
