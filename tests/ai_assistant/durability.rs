//! The assistant through kill -9 (running and waiting), approvals and re-runs, plans
//! that are not valid.

use super::*;

/// Killed (SIGKILL) while its LLM calls are in flight (the planner's turns among them),
/// then finished by `--sagas 0`: every saga ends completed or compensated with each
/// effect once, a resumed saga runs the plan it had and re-plans from where it was, no
/// turn of the planner is asked twice, and a call made again after the restart carries
/// the same key.
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
    // Re-planning across kill -9: no turn asked twice (one key per saga's turn), every
    // completed saga asked all three, in order (`check_effects` checked their ledgers,
    // and that a compensated saga undid its reservations, whichever turn made them).
    let pairs = check_turns(&store, &llm_calls(&store).await).await;
    assert!(pairs >= 3 * completed, "{pairs} turns asked");
}
both_backends!(kill_9_tests, survives_kill_9);

// Without `--auto-approve` the run ends with every saga waiting for a person, and says
// how to approve one; a person's approval (here through `Engine::signal`, as the CLI
// sends it) lets that saga finish on the next run; a rerun of the same requests starts
// nothing new (each was started with the key `request-<i>`), and an auto-approving
// run finishes the rest.
async fn approvals_and_reruns(backend: Backend) {
    let url = fresh_url(backend).await;
    let out = assistant_unapproved(&url, &["--sagas", "6", "--fail-rate", "0", "--seed", "3"]);
    assert!(out.contains("waiting for a signal   : 6"), "{out}");
    assert!(out.contains("sagas signal"), "{out}");
    let store = Store::connect(&url).await.unwrap();
    let parked = waiting(&store).await;
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
    signal_approvals(&store, vec![(approved, approved_by_ann())]).await;

    // The same six requests again: nothing new starts; the approved one finishes.
    let out = assistant_unapproved(&url, &["--sagas", "6", "--fail-rate", "0", "--seed", "3"]);
    assert!(out.contains("waiting for a signal   : 5"), "{out}");
    let assistants = query::ListFilter {
        name: Some(ASSISTANT.into()),
        ..query::ListFilter::default()
    };
    let all = query::list(&store, &assistants).await.unwrap();
    assert_eq!(all.len(), 6, "a rerun starts nothing new");
    assert!(
        all.iter()
            .all(|s| s.key.as_deref().is_some_and(|k| k.starts_with("request-")))
    );
    let emails = support::statuses(&store, "assistant_emails").await;
    assert_eq!(emails.keys().collect::<Vec<_>>(), [&approved.to_string()]);

    assistant(&url, &["--sagas", "0", "--fail-rate", "0", "--seed", "3"]);
    assert_eq!(check_effects(&store).await, (6, 0));
    assert!(waiting(&store).await.is_empty());
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
            "step `notify_team`: unknown destination `slack` (this saga allows: calendar, crm, drafts, email, follow_ups, research)",
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

/// A later turn is checked with the turns before it: an invalid second turn (a step for
/// an agent the assistant lacks) fails `plan_2` fatally, after the research of turn 1
/// ran; the saga compensates across turns (a slot turn 1 reserved is cancelled, its
/// children are compensated), and no other turn is asked.
async fn an_invalid_turn_compensates_the_turns_before_it(backend: Backend) {
    let url = fresh_url(backend).await;
    let args = ["--sagas", "8", "--fail-rate", "0", "--seed", "7"];
    let mut args = args.to_vec();
    args.extend(["--llm-stub-mode", "bad-plan", "--llm-stub-step", "plan_2"]);
    assistant(&url, &args);
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await, (0, 8));
    let reason = "step `notify_team`: unknown destination `slack`";
    let needles = [
        "step `plan_2` failed",
        "the planner's invalid plan: ",
        reason,
    ];
    all_compensated(&store, 8, &needles).await;
    let plans = plans(&store).await;
    let children = check_children(&store, &plans).await;
    assert_eq!(children.undone_completed, children.children, "{children:?}");
    for (id, _) in assistant_sagas(&store).await {
        let run = steps_run(&store, &id).await;
        assert_eq!(run.first().map(String::as_str), Some("plan"), "{run:?}");
        assert_eq!(run.last().map(String::as_str), Some("plan_2"), "{run:?}");
        assert!(run.contains(&"research".to_owned()), "{run:?}");
        // The turn 1 plan, recorded; nothing of turn 2's.
        assert!(!plans[&id].contains(&"draft_email".to_owned()), "{plans:?}");
    }
    let slots = support::statuses(&store, "assistant_calendar_slots").await;
    assert!(slots.values().all(|s| s == "cancelled"), "{slots:?}");
    for table in [
        "assistant_drafts",
        "assistant_emails",
        "assistant_crm_records",
    ] {
        assert!(rows(&store, table).await.is_empty(), "{table}");
    }
    let calls = llm_calls(&store).await;
    assert_eq!(check_turns(&store, &calls).await, 16);
    for c in &calls {
        let expected = if c.step == "plan_2" {
            "200 bad-plan"
        } else {
            "200"
        };
        assert_eq!(c.answer, expected, "{c:?}");
        assert!(c.step != "draft_email" && c.step != "plan_3", "{c:?}");
    }
}
both_backends!(
    invalid_turn_tests,
    an_invalid_turn_compensates_the_turns_before_it
);

/// A saga parked at its wait for `approval` survives `kill -9`: the run is killed
/// while some sagas wait and others are still on their way; one waiting saga is
/// approved and another rejected while no process runs (through `Engine::signal`, as
/// the CLI sends it); a `--sagas 0` run then sends the approved email, compensates the
/// rejected saga, and leaves the rest waiting, each with the plan it had.
async fn a_waiting_saga_survives_kill_9(backend: Backend) {
    let url = fresh_url(backend).await;
    // Connected (and migrated) before the child starts.
    let store = Store::connect(&url).await.unwrap();
    let args = ["--sagas", "10", "--fail-rate", "0", "--seed", "9"];
    let mut child = support::spawn_with("ai_assistant", &url, &args, no_openai);
    let mut parked = Vec::new();
    wait_until("two sagas wait", Duration::from_secs(120), async || {
        parked = waiting(&store).await;
        parked.len() >= 2
    })
    .await;
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
    let rejection = Signal::Reject("not this one".into());
    signal_approvals(
        &store,
        vec![(approved, approved_by_ann()), (rejected, rejection)],
    )
    .await;

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
    // The sagas that had a plan before the kill kept it (a later turn only appends).
    let plans_after = plans(&store).await;
    for (id, plan) in &plans_before {
        let after = plans_after.get(id).map_or(&[][..], Vec::as_slice);
        assert!(
            after.starts_with(plan),
            "saga {id}: {plan:?} then {after:?}"
        );
    }

    assistant(&url, &["--sagas", "0", "--fail-rate", "0", "--seed", "9"]);
    assert_eq!(check_effects(&store).await, (9, 1));
    check_turns(&store, &llm_calls(&store).await).await;
}
both_backends!(waiting_kill_9_tests, a_waiting_saga_survives_kill_9);
