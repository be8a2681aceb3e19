//! The promise checker catches each broken promise it names, and passes the ledgers
//! the runtime writes.

use super::{Ended, Row, judge};
use crate::testing::{Action, Entry};
use agentsaga_saga::{CompensationState, SagaState};

fn done(idx: usize) -> Entry {
    entry(idx, Action::Done)
}

fn undone(idx: usize) -> Entry {
    entry(idx, Action::Undone)
}

fn entry(idx: usize, action: Action) -> Entry {
    Entry {
        idx,
        step: format!("s{idx}"),
        destination: format!("d{idx}"),
        action,
    }
}

/// Three steps in stages 0, 1, 2 (stage = index), each with something to undo, whose
/// compensations stand at `undo`.
fn rows(undo: CompensationState) -> Vec<Row> {
    (0..3)
        .map(|idx| Row {
            idx,
            stage: i64::try_from(idx).unwrap(),
            undo: Some(undo),
        })
        .collect()
}

fn ended(state: SagaState, pivot: Option<usize>) -> Ended<'static> {
    Ended {
        state,
        error: Some("why"),
        pivot,
    }
}

#[test]
fn kept_promises_pass() {
    let compensated = ended(SagaState::Compensated, Some(2));
    let ledger = [done(0), done(1), undone(1), undone(0)];
    assert_eq!(
        judge(&compensated, &ledger, &rows(CompensationState::Done)),
        Ok(())
    );
    // The step that failed is compensated too: an undo without its do is allowed.
    let ledger = [done(0), undone(1), undone(0)];
    assert_eq!(
        judge(&compensated, &ledger, &rows(CompensationState::Done)),
        Ok(())
    );
    let completed = ended(SagaState::Completed, Some(1));
    let ledger = [done(0), done(1), done(2)];
    assert_eq!(
        judge(&completed, &ledger, &rows(CompensationState::Recorded)),
        Ok(())
    );
    let stuck = ended(SagaState::Stuck, Some(1));
    assert_eq!(
        judge(&stuck, &ledger[..2], &rows(CompensationState::Recorded)),
        Ok(())
    );
}

#[test]
fn each_broken_promise_is_named() {
    let compensated = ended(SagaState::Compensated, None);
    let all_done = rows(CompensationState::Done);
    let broken = |saga: &Ended<'_>, ledger: &[Entry], steps: &[Row]| {
        judge(saga, ledger, steps).expect_err("a broken promise passed")
    };

    let e = broken(&ended(SagaState::Running, None), &[], &all_done);
    assert!(e.contains("has not ended"), "{e}");
    let stuck = Ended {
        error: None,
        ..ended(SagaState::Stuck, None)
    };
    assert!(broken(&stuck, &[], &all_done).contains("without a reason"));

    let e = broken(&compensated, &[done(0), done(0), undone(0)], &all_done);
    assert!(e.contains("`s0`'s command took effect twice"), "{e}");
    let e = broken(&compensated, &[done(0), undone(0), undone(0)], &all_done);
    assert!(e.contains("compensation took effect twice"), "{e}");
    let e = broken(&compensated, &[undone(0), done(0)], &all_done);
    assert!(e.contains("before its command"), "{e}");
    let e = broken(
        &compensated,
        &[done(0), done(1), undone(0), undone(1)],
        &all_done,
    );
    assert!(
        e.contains("`s0` was undone before step `s1`, a later stage"),
        "{e}"
    );
    let e = broken(&compensated, &[done(0), done(1), undone(1)], &all_done);
    assert!(e.contains("`s0` took effect and was never undone"), "{e}");
    let left = rows(CompensationState::Dispatched);
    let e = broken(&compensated, &[done(0)], &left);
    assert!(e.contains("never undone"), "{e}");

    let pivot_at_1 = ended(SagaState::Compensated, Some(1));
    let e = broken(
        &pivot_at_1,
        &[done(0), done(1), done(2), undone(2)],
        &all_done,
    );
    assert!(e.contains("`s2`, after the pivot, was undone"), "{e}");
    let e = broken(&pivot_at_1, &[done(0), done(1), undone(0)], &all_done);
    assert!(
        e.contains("the pivot took effect, yet step `s0` was undone"),
        "{e}"
    );
    let e = broken(&pivot_at_1, &[done(0), done(1)], &all_done);
    assert!(e.contains("ended compensated"), "{e}");

    let completed = ended(SagaState::Completed, None);
    let e = broken(
        &completed,
        &[done(0), done(1), undone(1), done(1)],
        &all_done,
    );
    assert!(e.contains("twice") || e.contains("undone"), "{e}");
    let e = broken(&completed, &[done(0), undone(0)], &all_done);
    assert!(e.contains("it completed, yet step `s0` was undone"), "{e}");
}
