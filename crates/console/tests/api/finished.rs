//! The finished sagas' counts follow every write.

use std::time::Duration;

use agentsaga_console::{Action, Console};
use agentsaga_core::Store;
use agentsaga_core::testing::Backend;
use agentsaga_saga::{SagaState, query};

use crate::fixture::*;

/// Runs `sql` in a transaction of its own (a write an operator makes by hand).
pub(crate) async fn by_hand(store: &Store, sql: &'static str) -> u64 {
    let mut tx = store.begin().await.expect("begin");
    let n = agentsaga_core::Sql::new(sql)
        .execute(tx.conn())
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
    tx.commit().await.expect("commit");
    n
}

/// The overview's finished counts against a count of every saga (what it replaces).
pub(crate) async fn assert_finished_counts(c: &Console, store: &Store, when: &str) -> u64 {
    let status = c.status().await.expect("status");
    let truth: std::collections::HashMap<SagaState, u64> = query::count_by_state(store)
        .await
        .expect("count")
        .into_iter()
        .collect();
    let mut finished = 0;
    for state in [
        SagaState::Completed,
        SagaState::Compensated,
        SagaState::Aborted,
    ] {
        let want = truth.get(&state).copied().unwrap_or(0);
        assert_eq!(status.sagas[state.as_str()], want, "{state} sagas {when}");
        finished += want;
    }
    assert_eq!(
        status.sagas_total,
        truth.values().sum::<u64>(),
        "all sagas {when}"
    );
    finished
}

// `saga_finished_counts` follows every write of saga_instances: the engine finishing,
// compensating and aborting sagas, a state changed by hand (out of a final state too),
// rows deleted by hand and by the prune.
pub(crate) async fn finished_counts_follow_every_write(backend: Backend) {
    let f = prepare(backend).await;
    let c = &f.console;
    let store = c.store().clone();
    assert!(assert_finished_counts(c, &store, "after the engine's writes").await >= 2);

    c.act(f.running, Action::Abort).await.expect("abort");
    pump(&store, &engine(), &[f.running]).await;
    assert_finished_counts(c, &store, "after an abort").await;

    by_hand(
        &store,
        "UPDATE saga_instances SET state = 'aborted' WHERE state = 'completed'",
    )
    .await;
    assert_finished_counts(c, &store, "after completed → aborted by hand").await;
    assert!(
        by_hand(
            &store,
            "UPDATE saga_instances SET state = 'running' WHERE state = 'aborted'"
        )
        .await
            > 0
    );
    assert_finished_counts(c, &store, "after aborted → running by hand").await;
    by_hand(
        &store,
        "UPDATE saga_instances SET state = 'completed' WHERE state = 'running'",
    )
    .await;
    assert!(assert_finished_counts(c, &store, "after running → completed by hand").await > 2);
    assert!(
        by_hand(
            &store,
            "DELETE FROM saga_instances WHERE state = 'compensated'"
        )
        .await
            > 0
    );
    assert_finished_counts(c, &store, "after a DELETE by hand").await;

    // PostgreSQL's deltas, folded into the counts: the sums do not move, each delta is
    // folded once. SQLite has none (its triggers update the counts).
    let folded = query::fold_finished_counts(&store).await.expect("fold");
    match backend {
        Backend::Sqlite => assert_eq!(folded, 0),
        Backend::Postgres => assert!(folded > 0, "the writes above appended deltas"),
    }
    assert_eq!(query::fold_finished_counts(&store).await.expect("fold"), 0);
    assert_finished_counts(c, &store, "after the fold").await;

    let before = assert_finished_counts(c, &store, "before the prune").await;
    let pruned = query::prune_finished(&store, Duration::ZERO)
        .await
        .expect("prune");
    assert!(pruned.sagas > 0, "{pruned:?}");
    // The sagas completed by hand have no `finished_at`: the prune keeps them. The
    // prune folds what it appended.
    let after = assert_finished_counts(c, &store, "after the prune").await;
    assert_eq!(after, before - pruned.sagas);
    assert_eq!(query::fold_finished_counts(&store).await.expect("fold"), 0);
}

// A fold takes the deltas a chunk at a time and counts each once, however many a
// prune (or an operator) appended: here more than one chunk's worth, written by hand.
pub(crate) async fn a_fold_takes_any_number_of_deltas(backend: Backend) {
    let url = agentsaga_core::testing::fresh_url(backend).await;
    let store = Store::connect(&url).await.unwrap();
    let before = query::count_finished(&store).await.unwrap();
    by_hand(
        &store,
        "INSERT INTO saga_finished_deltas (completed, compensated, aborted)
         SELECT 1, 0, 0 FROM (WITH RECURSIVE n(i) AS
             (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10005) SELECT i FROM n) AS x",
    )
    .await;
    assert_eq!(query::fold_finished_counts(&store).await.unwrap(), 10_005);
    assert_eq!(query::fold_finished_counts(&store).await.unwrap(), 0);
    let after = query::count_finished(&store).await.unwrap();
    let completed = |counts: &[(SagaState, u64)]| {
        counts
            .iter()
            .find(|(s, _)| *s == SagaState::Completed)
            .map_or(0, |(_, n)| *n)
    };
    assert_eq!(completed(&after), completed(&before) + 10_005);
    store.close().await;
}
