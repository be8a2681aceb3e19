//! Waiting starts that cannot start: refused before they are queued, or set aside.

use super::*;

/// Rows written so far: sagas, outbox rows (any state), waiting starts.
async fn written(rt: &Runtime) -> (u64, u64, u64) {
    let sagas = agentsaga_saga::query::count_by_state(rt.store())
        .await
        .unwrap()
        .iter()
        .map(|(_, n)| n)
        .sum();
    let s = rt.store().admin().stats().await.unwrap();
    (
        sagas,
        s.pending + s.in_flight + s.delivered + s.dead,
        waiting(rt).await,
    )
}

/// A start that must wait for room is checked in full before it is stored: data that
/// does not decode as the saga's input, or a first command over the store's message
/// size limit, is refused with a typed error and nothing is written (its idempotency
/// key stays free); the starts behind it are not held up.
async fn a_bad_waiting_start_is_refused(backend: Backend) {
    let config = StoreConfig::default().max_message_bytes(1024);
    let GatedRuntime { rt, open, .. } = gated_runtime_at(fresh_url(backend).await, 1, config).await;
    let first = rt.start_saga("job", &Job { n: 0 }).await.unwrap();
    let copy = rt.start_saga("copy", &json!({"n": 10})).await.unwrap();
    let mut tx = rt.store().begin().await.unwrap();
    rt.start_saga_in(&mut tx, "job", &Job { n: 1 })
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(waiting(&rt).await, 1, "the bound is full: starts wait");
    let before = written(&rt).await;

    let mut tx = rt.store().begin().await.unwrap();
    let undecodable = rt
        .start_saga_in_with_key(&mut tx, "job", "k-1", &json!({"n": "not a number"}))
        .await
        .unwrap_err();
    assert!(
        matches!(
            undecodable,
            agentsaga_runtime::Error::Saga(agentsaga_saga::Error::Data(_))
        ),
        "{undecodable:?}"
    );
    let oversized = rt
        .start_saga_in_with_key(
            &mut tx,
            "copy",
            "k-2",
            &json!({"n": 2, "pad": "x".repeat(2000)}),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            oversized,
            agentsaga_runtime::Error::Saga(agentsaga_saga::Error::Store(
                agentsaga_core::Error::PayloadTooLarge { limit: 1024, .. }
            ))
        ),
        "{oversized:?}"
    );
    // The caller's transaction goes on and commits: the refusals left nothing in it.
    let behind = rt
        .start_saga_in_with_key(&mut tx, "job", "k-1", &Job { n: 3 })
        .await
        .unwrap();
    let behind_copy = rt
        .start_saga_in_with_key(&mut tx, "copy", "k-2", &json!({"n": 11}))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let (sagas, rows, waits) = written(&rt).await;
    assert_eq!((sagas, rows, waits), (before.0, before.1, before.2 + 2));
    let batch = {
        let mut tx = rt.store().begin().await.unwrap();
        let e = rt
            .start_sagas_in(&mut tx, "job", &[json!({"n": 4}), json!({"n": []})])
            .await
            .unwrap_err();
        tx.commit().await.unwrap();
        e
    };
    assert!(
        matches!(
            batch,
            agentsaga_runtime::Error::Saga(agentsaga_saga::Error::Data(_))
        ),
        "{batch:?}"
    );
    assert_eq!(
        written(&rt).await,
        (sagas, rows, waits),
        "a refused batch writes nothing"
    );

    open.send_replace(true);
    all_complete(&rt, &[first, copy, behind, behind_copy]).await;
    assert_eq!(waiting(&rt).await, 0);
    assert!(
        agentsaga_saga::Engine::set_aside_starts(rt.store())
            .await
            .unwrap()
            .is_empty()
    );
    rt.shutdown().await;
}
both_backends!(bad_waiting_start_tests, a_bad_waiting_start_is_refused);

/// A stored start that cannot begin when its turn comes (here: accepted while the saga
/// took any JSON, then a deploy made its input a `Job`) is set aside with the reason;
/// the starts behind it run; `start_saga` and `wait` on it answer a typed error; an
/// operator removes it.
async fn a_start_that_became_unstartable_is_set_aside(backend: Backend) {
    let url = fresh_url(backend).await;
    // Before the deploy: the saga takes any JSON. One saga in flight (its command is
    // left pending), then four starts wait: a bad one first.
    let store = agentsaga_core::Store::connect(&url).await.unwrap();
    let before = Saga::<serde_json::Value>::builder("job", 1)
        .step(
            Step::new("work", "gated")
                .command(|j: &serde_json::Value| j.clone())
                .nothing_to_undo(),
        )
        .build()
        .unwrap();
    let engine = Engine::new([before]).unwrap().with_max_in_flight(Some(1));
    let mut tx = store.begin().await.unwrap();
    let mut good = Vec::new();
    let mut accepted = Vec::new();
    for data in [
        json!({"n": 0}),
        json!({"n": "zero"}),
        json!({"n": 1}),
        json!({"n": 2}),
        json!({"n": 3}),
    ] {
        accepted.push(engine.accept(&mut tx, "job", data).await.unwrap());
    }
    tx.commit().await.unwrap();
    store.close().await;
    assert!(matches!(accepted[0], agentsaga_saga::Accepted::Started(_)));
    assert!(
        accepted[1..]
            .iter()
            .all(|a| matches!(a, agentsaga_saga::Accepted::Waiting(_)))
    );
    let bad = accepted[1].id();
    good.push(accepted[0].id());
    good.extend(accepted[2..].iter().map(|a| a.id()));

    // After the deploy: `Job`, one in flight.
    let GatedRuntime {
        rt, open, order, ..
    } = gated_runtime_at(url, 1, StoreConfig::default()).await;
    open.send_replace(true);
    all_complete(&rt, &good).await;
    let mut ran = order.lock().unwrap().clone();
    ran.sort_unstable();
    assert_eq!(ran, vec![0, 1, 2, 3], "the starts behind the bad one ran");
    assert_eq!(waiting(&rt).await, 0);
    let aside = Engine::set_aside_starts(rt.store()).await.unwrap();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(aside[0].id, bad);
    assert_eq!(aside[0].name, "job");
    assert_eq!(aside[0].data, json!({"n": "zero"}));
    assert!(aside[0].error.contains("saga data"), "{}", aside[0].error);
    // Whoever waits for it learns why.
    let err = rt.wait(bad).await.unwrap_err();
    assert!(
        matches!(
            &err,
            agentsaga_runtime::Error::Saga(agentsaga_saga::Error::StartSetAside { id, .. }) if *id == bad
        ),
        "{err:?}"
    );
    // An operator removes it; removing it again, or a start that is not set aside, is
    // refused.
    let mut tx = rt.store().begin().await.unwrap();
    Engine::remove_set_aside(&mut tx, bad).await.unwrap();
    assert!(matches!(
        Engine::remove_set_aside(&mut tx, bad).await,
        Err(agentsaga_saga::Error::NotFound(_))
    ));
    assert!(matches!(
        Engine::remove_set_aside(&mut tx, good[0]).await,
        Err(agentsaga_saga::Error::NotFound(_))
    ));
    tx.commit().await.unwrap();
    assert!(
        Engine::set_aside_starts(rt.store())
            .await
            .unwrap()
            .is_empty()
    );
    rt.shutdown().await;
}
both_backends!(
    set_aside_tests,
    a_start_that_became_unstartable_is_set_aside
);
