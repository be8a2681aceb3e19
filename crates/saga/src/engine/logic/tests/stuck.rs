//! Scenarios past the pivot and of stuck compensations, operators' actions (with and
//! without the definition), and messages that cannot be processed or are stray.

use super::*;

/// Running --StepFailedAfterPivot--> Stuck --Abort--> Aborted.
pub(super) fn fatal_after_the_pivot_is_stuck_then_aborted() -> Sim {
    let mut s = Sim::new(trip());
    s.run_past_pivot();
    let fx = s.reply(CONFIRM, fatal("mailbox gone"));
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailedAfterPivot)]
    );
    assert!(fx.send.is_empty(), "nothing is undone after the pivot");
    assert_eq!(s.state(), SagaState::Stuck);
    assert!(!s.inst.finished);
    refused(&mut s, Sim::skip, "skip applies to a stuck compensation");
    let fx = s.abort().unwrap();
    assert_eq!(fx.transitions, [(SagaState::Stuck, SagaEvent::Abort)]);
    assert!(fx.send.is_empty());
    assert_eq!(s.state(), SagaState::Aborted);
    assert!(s.inst.finished);
    assert!(s.error().ends_with("(aborted by an operator)"));
    s
}

/// Stuck --RetryForward--> Running: the failed step after the pivot goes again.
pub(super) fn stuck_after_the_pivot_retried_forward() -> Sim {
    let mut s = Sim::new(trip());
    s.run_past_pivot();
    s.reply(CONFIRM, fatal("mailbox gone"));
    let fx = s.retry().unwrap();
    assert_eq!(
        fx.transitions,
        [(SagaState::Stuck, SagaEvent::RetryForward)]
    );
    assert_eq!(sent(&fx), ["command#4 -> confirm-agent"]);
    assert_eq!(s.state(), SagaState::Running);
    assert_eq!(s.inst.error, None);
    s.reply(CONFIRM, ok());
    assert_eq!(s.state(), SagaState::Completed);
    s
}

/// Compensating --CompensationExhausted--> Stuck --Retry--> Compensating, stuck
/// again, then Stuck --Skip--> Compensating --AllCompensated--> Compensated.
pub(super) fn stuck_compensation_retried_then_skipped() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    s.reply(FLIGHT, ok());
    s.reply(HOTEL, ok());
    s.reply(CAR, fatal("no cars"));
    s.reply_compensation(CAR, ok());
    // The hotel's undo: a failure, a timeout, a failure: three attempts.
    let fx = s.reply_compensation(HOTEL, fatal("cancel API down"));
    assert_eq!(sent(&fx), ["compensate#1 -> hotel-agent"]);
    assert!(fx.send[0].delay <= fast().ceiling(1));
    let undo = s.compensation(HOTEL);
    let fx = s.time_out(&undo);
    assert_eq!(sent(&fx), ["compensate#1 -> hotel-agent"]);
    let fx = s.reply_compensation(HOTEL, fatal("cancel API down"));
    assert_eq!(
        fx.transitions,
        [(SagaState::Compensating, SagaEvent::CompensationExhausted)]
    );
    assert_eq!(s.state(), SagaState::Stuck);
    assert_eq!(
        s.row(HOTEL).compensation_state,
        Some(CompensationState::Failed)
    );
    assert_eq!(
        s.error(),
        "compensation of step `hotel` failed 3 times: cancel API down"
    );
    refused(
        &mut s,
        Sim::abort,
        "a compensation failed; use retry or skip",
    );

    let fx = s.retry().unwrap();
    assert_eq!(fx.transitions, [(SagaState::Stuck, SagaEvent::Retry)]);
    assert_eq!(sent(&fx), ["compensate#1 -> hotel-agent"]);
    assert_eq!(s.row(HOTEL).compensation_attempts, 1, "a fresh budget");
    for _ in 0..3 {
        s.reply_compensation(HOTEL, fatal("still down"));
    }
    assert_eq!(s.state(), SagaState::Stuck);

    let fx = s.skip().unwrap();
    assert_eq!(fx.transitions, [(SagaState::Stuck, SagaEvent::Skip)]);
    assert_eq!(
        s.row(HOTEL).compensation_state,
        Some(CompensationState::Skipped)
    );
    assert!(
        s.row(HOTEL)
            .compensation_error
            .as_deref()
            .unwrap()
            .ends_with("(skipped by an operator)")
    );
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    s.reply_compensation(FLIGHT, ok());
    assert_eq!(s.state(), SagaState::Compensated);
    s
}

/// Nothing to undo: Compensating and Compensated in one event.
pub(super) fn nothing_to_undo_is_compensated_at_once() -> Sim {
    let def = Saga::<D>::builder("lookup", 1)
        .step(Step::new("read", "reader").nothing_to_undo())
        .step(Step::new("write", "writer").nothing_to_undo())
        .build()
        .unwrap();
    let mut s = Sim::new(def);
    let fx = s.start();
    assert_eq!(sent(&fx), ["command#0 -> reader"]);
    assert_eq!(
        s.row(0).compensation_state,
        Some(CompensationState::NotNeeded)
    );
    s.reply(0, ok());
    let fx = s.reply(1, fatal("disk full"));
    assert_eq!(
        fx.transitions,
        [
            (SagaState::Running, SagaEvent::StepFailed),
            (SagaState::Compensating, SagaEvent::AllCompensated),
        ]
    );
    assert!(fx.send.is_empty());
    assert_eq!(s.state(), SagaState::Compensated);
    s
}

/// Running --Abort--> Compensating by an operator, with the ledger alone (this
/// process lacks the definition).
pub(super) fn operator_abort_without_the_definition() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    s.reply(FLIGHT, ok());
    s.registered = false;
    let fx = s.abort().unwrap();
    assert_eq!(fx.transitions, [(SagaState::Running, SagaEvent::Abort)]);
    assert_eq!(
        sent(&fx),
        ["compensate#1 -> hotel-agent", "compensate#2 -> car-agent"]
    );
    assert_eq!(s.error(), "aborted by an operator");
    // Replies of the steps in flight are not folded in any more.
    s.registered = true;
    assert!(s.reply(HOTEL, ok()).ignored.is_some());
    s
}

/// What the runtime does with a message the engine could not process.
pub(super) fn unprocessable_messages_fail_the_saga() -> Sim {
    // A dispatched step before the pivot: it fails, the saga compensates.
    let mut s = Sim::new(trip());
    s.start();
    let timer = s.row(FLIGHT).timer_id.unwrap();
    let fx = s.fail(Some(FLIGHT));
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailed)]
    );
    assert!(fx.cancel.contains(&timer));
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    // While compensating: stuck.
    let fx = s.fail(Some(FLIGHT));
    assert_eq!(
        fx.transitions,
        [(SagaState::Compensating, SagaEvent::CompensationExhausted)]
    );
    assert_eq!(s.state(), SagaState::Stuck);
    // When stuck (or finished): nothing more.
    let fx = s.fail(None);
    assert!(fx.ignored.unwrap().contains("while stuck"));

    // No step at fault, before the pivot: the saga compensates.
    let mut before = Sim::new(trip());
    before.start();
    before.reply(FLIGHT, ok());
    let fx = before.fail(None);
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailed)]
    );
    assert_eq!(before.error(), "the saga data outgrew the limit");

    // The dispatched pivot: it may have happened, so stuck, not undone.
    let mut pivot = Sim::new(trip());
    pivot.run_to_pivot();
    let fx = pivot.fail(Some(CHARGE));
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailedAfterPivot)]
    );
    assert!(fx.send.is_empty());
    assert_eq!(pivot.row(CHARGE).state, StepState::Failed);
    assert_eq!(
        pivot.error(),
        "step `charge`: the saga data outgrew the limit"
    );

    // No step at fault, past the pivot: stuck.
    let mut after = Sim::new(trip());
    after.run_past_pivot();
    let fx = after.fail(Some(99));
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailedAfterPivot)]
    );
    s
}

/// Operator actions a state does not allow are refused and change nothing.
pub(super) fn operators_refused() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    refused(&mut s, Sim::retry, "only stuck sagas are retried");
    refused(&mut s, Sim::skip, "skip applies to a stuck compensation");
    s.reply(FLIGHT, ok());
    s.reply(HOTEL, ok());
    s.reply(CAR, ok());
    refused(&mut s, Sim::abort, "past its pivot: it can only go forward");

    let mut c = Sim::new(trip());
    c.start();
    c.reply(FLIGHT, fatal("no"));
    assert_eq!(c.state(), SagaState::Compensating);
    refused(&mut c, Sim::abort, "");

    // Stuck after the pivot, in a process without the definition: abort works,
    // retrying forward needs the definition.
    let mut stuck = Sim::new(trip());
    stuck.run_past_pivot();
    stuck.reply(CONFIRM, fatal("gone"));
    stuck.registered = false;
    refused(
        &mut stuck,
        Sim::retry,
        "its definition is not registered here",
    );

    // Finished: everything is refused.
    let mut done = happy_path();
    let actions: [fn(&mut Sim) -> Result<Effects>; 3] = [Sim::abort, Sim::retry, Sim::skip];
    for action in actions {
        refused(&mut done, action, "");
    }
    s
}

/// Replies and notices about steps never dispatched, and messages that do not parse.
pub(super) fn stray_messages() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    let before = s.inst.clone();
    // A reply to a command of step 4, which was never dispatched.
    let mut stray = s.command(FLIGHT);
    stray
        .headers
        .insert(protocol::STEP.into(), CONFIRM.to_string());
    let reply = protocol::reply(&stray, &ok()).unwrap().unwrap();
    assert!(
        s.receive(&reply)
            .unwrap()
            .ignored
            .unwrap()
            .contains("never dispatched")
    );
    let notice = protocol::timed_out(&stray).unwrap();
    assert!(
        s.receive(&notice)
            .unwrap()
            .ignored
            .unwrap()
            .contains("never dispatched")
    );
    // Without a step header: malformed, refused before any decision.
    let mut bad = envelope(&reply);
    bad.headers.remove(protocol::STEP);
    assert!(matches!(Inbound::parse(&bad), Err(Error::Malformed(_))));
    assert_eq!(s.inst, before);
    s
}
