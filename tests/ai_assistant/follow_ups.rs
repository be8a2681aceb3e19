//! The follow-up: after the email, each saga waits for the company's `reply`, which
//! ends by time (`--follow-up-after`); the follow-up is drafted unless the reply came
//! first (from the example's simulated inbox, `--reply-rate`, or from outside). The
//! run waits for those waits; the wait's time survives `kill -9`.

use super::*;

use agentsaga::saga::SignalSender;
use serde_json::json;

/// Completed saga `id`'s follow-up (`status`, its row's) as its wait for the reply
/// ended: the reply came (its data at `/results/await_reply`, the wait done before its
/// time): `replied`; none came (no result: the wait ended by time, when it was due):
/// `drafted`, by a `follow_up` dispatched once the wait ended.
/// The plan's wait ends by time, after the time the assistant set. Returns whether the
/// reply came.
pub(crate) async fn check_follow_up(store: &Store, id: &str, status: Option<&str>) -> bool {
    let saga = id.parse().unwrap();
    let data = query::data(store, saga).await.unwrap().unwrap();
    let steps = query::steps(store, saga).await.unwrap();
    let step = |name: &str| steps.iter().find(|s| s.name == name).unwrap().clone();
    let (wait, follow_up) = (step("await_reply"), step("follow_up"));
    assert_eq!(wait.destination, "signal:reply", "saga {id}");
    assert_eq!(wait.state, StepState::Succeeded, "saga {id}");
    let (reached, ended) = (wait.dispatched_at_ms.unwrap(), wait.replied_at_ms.unwrap());
    let due = wait.wakes_at_ms.unwrap();
    let planned = data["plan"]["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "await_reply")
        .cloned()
        .unwrap();
    assert_eq!(planned["wait_for"], "reply", "saga {id}: {planned}");
    assert!(planned["or_after"].is_string(), "saga {id}: {planned}");
    assert!(follow_up.dispatched_at_ms.unwrap() >= ended, "saga {id}");
    let reply = data["results"].get("await_reply");
    match reply {
        Some(reply) => {
            assert_eq!(status, Some("replied"), "saga {id}: {reply}");
            assert!(reply["text"].is_string(), "saga {id}: {reply}");
            assert!(ended < due, "saga {id}: replied at {ended}, due {due}");
        }
        None => {
            assert_eq!(status, Some("drafted"), "saga {id}");
            // Not before it was due (a wake-up's delay counts from its write, on
            // PostgreSQL too; times are whole milliseconds, read by one machine's clock).
            assert!(ended >= due - 1 && due > reached, "saga {id}: {wait:?}");
        }
    }
    reply.is_some()
}

/// The sagas waiting for the company's reply.
async fn waiting_for_reply(store: &Store) -> Vec<SagaId> {
    let waiting = waiting(store).await;
    let replying = waiting
        .into_iter()
        .filter(|s| s.waiting_for.as_deref() == Some("reply"));
    replying.map(|s| s.id).collect()
}

/// `--reply-rate 0.5`: some companies reply in time (no follow-up: `replied`), the
/// others do not, and their follow-up is drafted once the wait's time has passed
/// (`check_follow_up`, through `check_effects`); each wait lasted the time the
/// assistant set, whatever the plan said, and the run ended with every saga done.
async fn a_follow_up_unless_a_reply_came_first(backend: Backend) {
    let url = fresh_url(backend).await;
    let after = ["--reply-rate", "0.5", "--follow-up-after", "1500ms"];
    let mut args = vec!["--sagas", "16", "--fail-rate", "0", "--seed", "4"];
    args.extend(after);
    assistant(&url, &args);
    let store = Store::connect(&url).await.unwrap();
    assert_eq!(check_effects(&store).await, (16, 0));
    let follow_ups = text_rows(&store, "SELECT status, note FROM assistant_follow_ups").await;
    assert_eq!(follow_ups.len(), 16);
    let replied = follow_ups.iter().filter(|(s, _)| s == "replied").count();
    assert!(0 < replied && replied < 16, "{follow_ups:?}");
    for (status, note) in &follow_ups {
        let expected = if status == "replied" {
            " replied: "
        } else {
            "Following up with "
        };
        assert!(note.contains(expected), "{status}: {note}");
    }
    for (id, _) in assistant_sagas(&store).await {
        let steps = query::steps(&store, id.parse().unwrap()).await.unwrap();
        let wait = steps.iter().find(|s| s.name == "await_reply").unwrap();
        let lasts = wait.wakes_at_ms.unwrap() - wait.dispatched_at_ms.unwrap();
        assert!((1500..1600).contains(&lasts), "saga {id}: {wait:?}");
    }
}
both_backends!(follow_up_tests, a_follow_up_unless_a_reply_came_first);

/// A reply from outside: with no inbox (`--reply-rate 0`) and an hour to wait, the
/// approved sagas send their email and wait for the reply, and the run waits with
/// them (only a wait for a person's `approval` ends a run); an agent, which may not
/// approve an email, may send the `reply`: each saga then notes it (no follow-up) and
/// the run ends, long before the hour.
async fn a_reply_ends_the_wait_and_the_run(backend: Backend) {
    let url = fresh_url(backend).await;
    let args = [
        "--fail-rate",
        "0",
        "--seed",
        "2",
        "--reply-rate",
        "0",
        "--follow-up-after",
        "1h",
    ];
    let mut first = vec!["--sagas", "3"];
    first.extend(args);
    let out = assistant_unapproved(&url, &first);
    assert!(out.contains("waiting for a signal   : 3"), "{out}");
    let store = Store::connect(&url).await.unwrap();
    let parked: Vec<SagaId> = waiting(&store).await.iter().map(|s| s.id).collect();
    assert_eq!(parked.len(), 3);
    // An agent's approval is refused: a person's decision.
    let mut tx = store.begin().await.unwrap();
    let agent = SignalSender::Agent;
    let refused = Engine::signal_by(&mut tx, parked[0], "approval", approved_by_ann(), agent).await;
    assert!(
        matches!(refused, Err(agentsaga::saga::Error::SignalRefused { .. })),
        "{refused:?}"
    );
    drop(tx);
    signal_approvals(
        &store,
        parked.iter().map(|id| (*id, approved_by_ann())).collect(),
    )
    .await;

    let mut again = vec!["--sagas", "0"];
    again.extend(args);
    let child = support::spawn_with("ai_assistant", &url, &again, no_openai);
    let mut replying = Vec::new();
    wait_until(
        "the sagas wait for the reply",
        Duration::from_secs(120),
        async || {
            replying = waiting_for_reply(&store).await;
            replying.len() == 3
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut child = child;
    assert!(child.try_wait().unwrap().is_none(), "the run did not wait");
    assert!(rows(&store, "assistant_follow_ups").await.is_empty());
    let mut tx = store.begin().await.unwrap();
    for id in &replying {
        let reply = Signal::Approve(json!({ "text": "Yes, Tuesday works." }));
        Engine::signal_by(&mut tx, *id, "reply", reply, SignalSender::Agent)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let out = support::wait_bounded(child, Duration::from_secs(120));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("waiting for a signal   : 0"), "{stdout}");
    assert_eq!(check_effects(&store).await, (3, 0));
    let follow_ups = text_rows(&store, "SELECT status, note FROM assistant_follow_ups").await;
    assert_eq!(follow_ups.len(), 3);
    for (status, note) in &follow_ups {
        assert_eq!(status, "replied", "{note}");
        assert!(note.contains("Yes, Tuesday works."), "{note}");
    }
}
both_backends!(reply_tests, a_reply_ends_the_wait_and_the_run);

/// A saga waiting for its reply survives `kill -9`: its wake-up is in the outbox, due
/// at its time; the next run drafts each follow-up once, not before it was due.
async fn a_follow_up_survives_kill_9(backend: Backend) {
    let url = fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let args = [
        "--fail-rate",
        "0",
        "--seed",
        "6",
        "--reply-rate",
        "0",
        "--follow-up-after",
        "3s",
    ];
    let mut first = vec!["--sagas", "6", "--auto-approve"];
    first.extend(args);
    let mut child = support::spawn_with("ai_assistant", &url, &first, no_openai);
    wait_until(
        "a saga waits for its reply",
        Duration::from_secs(120),
        async || !waiting_for_reply(&store).await.is_empty(),
    )
    .await;
    let running = child.try_wait().unwrap().is_none();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(running, "the run ended before it could be killed");
    assert!(!waiting_for_reply(&store).await.is_empty());

    let mut again = vec!["--sagas", "0"];
    again.extend(args);
    assistant(&url, &again);
    assert_eq!(check_effects(&store).await, (6, 0));
    let follow_ups = support::statuses(&store, "assistant_follow_ups").await;
    assert_eq!(follow_ups.len(), 6);
    assert!(
        follow_ups.values().all(|s| s == "drafted"),
        "{follow_ups:?}"
    );
}
both_backends!(follow_up_kill_9_tests, a_follow_up_survives_kill_9);
