//! Plans that run, compensate, survive a restart.

use super::*;

// The plan runs in order, with its references resolved; the results land in the data.
async fn a_plan_runs(backend: Backend) {
    let w = world(backend, true).await;
    let id =
        w.rt.start_saga("errand", &errand_start(false))
            .await
            .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Completed);
    let seen = seen(&w);
    assert_eq!(seen[0], ("search".into(), json!({ "q": "sagas" })));
    let calendar: Vec<&Value> = seen[1..3].iter().map(|(_, v)| v).collect();
    assert!(calendar.contains(&&json!({ "book": "sagas" })), "{seen:?}");
    assert!(calendar.contains(&&json!({ "book": "b" })), "{seen:?}");
    assert_eq!(seen[3], ("calendar".into(), json!({ "book": "c" })));
    assert_eq!(seen[4], ("mail".into(), json!({ "to": "ann@example.com" })));
    assert_eq!(seen.len(), 5);
    let data = query::data(w.rt.store(), id).await.unwrap().unwrap();
    assert_eq!(data["results"]["send"], json!({ "to": "ann@example.com" }));
    assert!(data["plan"]["steps"].is_array(), "the plan is stored");
    assert_eq!(data["input"]["topic"], "sagas");
}
both_backends!(runs_tests, a_plan_runs);

// The pivot fails: the bookings are undone in reverse (the later stage first, then
// the parallel group), each by the event id its own reply gave.
async fn a_failed_plan_compensates_in_reverse(backend: Backend) {
    let w = world(backend, true).await;
    let id =
        w.rt.start_saga("errand", &errand_start(true))
            .await
            .unwrap();
    assert_eq!(settle(&w.rt, id).await, SagaState::Compensated);
    let seen = seen(&w);
    let event = |step: &str| {
        let saga = seen
            .iter()
            .position(|(d, v)| d == "calendar" && v["book"] == json!(step));
        format!("ev-{}", saga.expect("booked") + 1)
    };
    let cancels: Vec<Value> = seen
        .iter()
        .filter(|(_, v)| v.get("cancel").is_some())
        .map(|(_, v)| v["cancel"].clone())
        .collect();
    assert_eq!(cancels.len(), 3, "{seen:?}");
    assert_eq!(
        cancels[0],
        json!(event("c")),
        "the last stage is undone first"
    );
    let group: Vec<&Value> = cancels[1..].iter().collect();
    assert!(group.contains(&&json!(event("sagas"))), "{cancels:?}");
    assert!(group.contains(&&json!(event("b"))), "{cancels:?}");
    assert_error_contains(&w.rt, id, "mailbox full").await;
}
both_backends!(compensates_tests, a_failed_plan_compensates_in_reverse);

// The plan lives with the saga: a new process, which never saw it, resumes it.
async fn a_plan_survives_a_restart(backend: Backend) {
    let w = world(backend, false).await;
    let id =
        w.rt.start_saga("errand", &errand_start(true))
            .await
            .unwrap();
    let World {
        rt,
        gates,
        plan_text,
    } = w;
    // The first command is out (its agent waits at the gate); stop the process there.
    wait_until(
        "the search is dispatched",
        Duration::from_secs(30),
        async || {
            query::steps(rt.store(), id)
                .await
                .unwrap()
                .iter()
                .any(|st| st.name == "look")
        },
    )
    .await;
    rt.shutdown().await;
    gates.open.send_replace(true);
    let rt = start_runtime(&gates, &plan_text).await;
    assert_eq!(settle(&rt, id).await, SagaState::Compensated);
    let cancels = gates
        .seen()
        .iter()
        .filter(|(_, v)| v.get("cancel").is_some())
        .count();
    assert_eq!(cancels, 3);
    rt.shutdown().await;
}
both_backends!(restart_tests, a_plan_survives_a_restart);
