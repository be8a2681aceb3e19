//! Scenarios of a saga going forward: the happy path, failures and retries before and
//! at the pivot, timeouts, dead letters, undecodable replies, the deadline.

use super::*;

/// Running --AllStepsSucceeded--> Completed, with every effect along the way.
pub(super) fn happy_path() -> Sim {
    let mut s = Sim::new(trip());
    let fx = s.start();
    assert_eq!(
        sent(&fx),
        [
            "deadline -> saga.trip.v1",
            "command#0 -> flight-agent",
            "start_timeout#0 -> saga.trip.v1",
        ]
    );
    assert_eq!(fx.send[0].delay, Duration::from_secs(60));
    assert_eq!(fx.send[2].delay, Duration::from_secs(5));
    let cmd = s.command(FLIGHT);
    assert_eq!(cmd.header(header::TIMEOUT_MS), Some("300"));
    assert_eq!(cmd.payload, r#"{"book":7}"#);
    // The ledger entry is written with the dispatch.
    let row = s.row(FLIGHT);
    assert_eq!(row.state, StepState::Dispatched);
    assert_eq!(row.compensation_state, Some(CompensationState::Recorded));
    assert_eq!(row.compensation_payload, Some(json!({ "cancel": 7 })));
    assert_eq!(row.command_id, Some(cmd.id));
    assert_eq!(row.dispatched_at, Some(NOW));
    assert_eq!(row.deadline_ms, Some(NOW + 5_000));
    let flight_timer = row.timer_id.unwrap();

    // The flight succeeds: its start timer is moot, the parallel stage goes out.
    let fx = s.reply(FLIGHT, StepOutcome::Ok(json!("LH 123")));
    assert_eq!(fx.cancel, [flight_timer]);
    assert_eq!(
        sent(&fx),
        ["command#1 -> hotel-agent", "command#2 -> car-agent"]
    );
    assert_eq!(
        s.inst.data["flight"], "LH 123",
        "the reply folded into the data"
    );
    assert_eq!(s.row(FLIGHT).state, StepState::Succeeded);
    // Half a stage: nothing yet.
    let fx = s.reply(HOTEL, ok());
    assert!(fx.send.is_empty() && fx.cancel.is_empty());
    let fx = s.reply(CAR, ok());
    assert_eq!(sent(&fx), ["command#3 -> charge-agent"]);
    assert_eq!(
        s.row(CHARGE).compensation_state,
        None,
        "the pivot has no compensation"
    );
    let fx = s.reply(CHARGE, ok());
    assert_eq!(sent(&fx), ["command#4 -> confirm-agent"]);
    let fx = s.reply(CONFIRM, ok());
    assert!(fx.send.is_empty());
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::AllStepsSucceeded)]
    );
    assert_eq!(s.state(), SagaState::Completed);
    assert!(s.inst.finished);

    // A duplicate of the last reply, and the deadline, change nothing.
    let before = s.inst.clone();
    let fx = s.reply(CONFIRM, ok());
    assert!(fx.ignored.unwrap().contains("late or duplicate"));
    let fx = s.fire(protocol::KIND_DEADLINE, None);
    assert!(fx.ignored.is_some());
    assert_eq!(s.inst, before);
    s
}

/// Running --StepFailed--> Compensating --AllCompensated--> Compensated: a fatal
/// reply in the parallel stage undoes that stage together, then the stage before.
pub(super) fn fatal_before_the_pivot_compensates_in_reverse() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    s.reply(FLIGHT, ok());
    let fx = s.reply(CAR, fatal("no cars"));
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailed)]
    );
    assert_eq!(s.state(), SagaState::Compensating);
    assert_eq!(s.error(), "step `car` failed: no cars");
    // Both of the stage's compensations, the hotel's still in flight included.
    assert_eq!(
        sent(&fx),
        ["compensate#1 -> hotel-agent", "compensate#2 -> car-agent"]
    );
    assert_eq!(fx.compensating.as_deref(), Some("hotel"));
    let undo = s.compensation(CAR);
    assert_eq!(
        undo.key,
        s.command(CAR).key,
        "an undo never overtakes its do"
    );
    assert_eq!(undo.payload, r#"{"cancel":7}"#);
    // The hotel's late reply is not folded in: the saga is compensating.
    let fx = s.reply(HOTEL, ok());
    assert!(fx.ignored.unwrap().contains("while compensating"));
    assert_eq!(s.row(HOTEL).state, StepState::Dispatched);

    let fx = s.reply_compensation(HOTEL, ok());
    assert!(fx.send.is_empty(), "the car's undo is still out");
    let fx = s.reply_compensation(CAR, ok());
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    // A duplicate compensation reply changes nothing.
    let fx = s.reply_compensation(CAR, ok());
    assert!(fx.ignored.unwrap().contains("duplicate compensation reply"));
    let fx = s.reply_compensation(FLIGHT, ok());
    assert_eq!(
        fx.transitions,
        [(SagaState::Compensating, SagaEvent::AllCompensated)]
    );
    assert_eq!(s.state(), SagaState::Compensated);
    assert!(s.inst.finished);
    for i in [FLIGHT, HOTEL, CAR] {
        assert_eq!(s.row(i).compensation_state, Some(CompensationState::Done));
        assert_eq!(s.row(i).compensated_at, Some(NOW));
    }
    assert_eq!(s.inst.steps.len(), 3, "the pivot was never dispatched");
    s
}

/// The pivot itself fails fatally: still before the point of no return.
pub(super) fn fatal_pivot_compensates() -> Sim {
    let mut s = Sim::new(trip());
    s.run_to_pivot();
    let fx = s.reply(CHARGE, fatal("card declined"));
    assert_eq!(
        sent(&fx),
        ["compensate#1 -> hotel-agent", "compensate#2 -> car-agent"]
    );
    assert_eq!(s.state(), SagaState::Compensating);
    s
}

/// Retryable answers are sent again with a backoff until the budget is used up.
pub(super) fn retryable_until_exhausted() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    let first = s.command(FLIGHT);
    let first_timer = s.row(FLIGHT).timer_id.unwrap();
    let fx = s.reply(FLIGHT, retryable("busy"));
    assert_eq!(
        sent(&fx),
        [
            "command#0 -> flight-agent",
            "start_timeout#0 -> saga.trip.v1"
        ]
    );
    let backoff = fx.send[0].delay;
    assert!(backoff <= fast().ceiling(1), "a backoff: {backoff:?}");
    assert_eq!(
        fx.send[1].delay,
        backoff + Duration::from_secs(5),
        "the start timer counts from the new dispatch"
    );
    assert_eq!(fx.cancel, [first_timer], "the old start timer goes");
    assert_ne!(fx.send[0].id, first.id, "a new message");
    assert_eq!(
        fx.send[0].headers.get(header::IDEMPOTENCY_KEY).unwrap(),
        first.header(header::IDEMPOTENCY_KEY).unwrap(),
        "one idempotency key for every attempt"
    );
    assert_eq!(s.row(FLIGHT).attempts, 2);
    // A reply to the superseded command is late.
    let late = protocol::reply(&first, &ok()).unwrap().unwrap();
    assert!(s.receive(&late).unwrap().ignored.is_some());
    assert_eq!(s.row(FLIGHT).state, StepState::Dispatched);

    s.reply(FLIGHT, retryable("busy"));
    assert_eq!(s.row(FLIGHT).attempts, 3);
    let fx = s.reply(FLIGHT, retryable("busy"));
    assert_eq!(
        fx.transitions[0],
        (SagaState::Running, SagaEvent::StepFailed)
    );
    assert_eq!(
        s.error(),
        "step `flight` failed: busy (gave up after 3 attempts)"
    );
    // The failed step is compensated too: its outcome may be unknown.
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    s
}

/// After the pivot there is no budget: retried forward for as long as it takes.
pub(super) fn retryable_after_the_pivot_has_no_budget() -> Sim {
    let mut s = Sim::new(trip());
    s.run_past_pivot();
    for attempt in 2..=6 {
        let fx = s.reply(CONFIRM, retryable("smtp down"));
        assert_eq!(sent(&fx), ["command#4 -> confirm-agent"]);
        assert_eq!(s.row(CONFIRM).attempts, attempt);
    }
    s.reply(CONFIRM, ok());
    assert_eq!(s.state(), SagaState::Completed);
    s
}

/// A timed-out step before the pivot is compensated (its outcome is unknown).
pub(super) fn timeout_before_the_pivot_compensates() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    s.reply(FLIGHT, ok());
    s.reply(HOTEL, ok());
    let car = s.command(CAR);
    let fx = s.time_out(&car);
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailed)]
    );
    assert_eq!(
        s.error(),
        "step `car` failed: timed out: the outcome is unknown"
    );
    assert_eq!(
        sent(&fx),
        ["compensate#1 -> hotel-agent", "compensate#2 -> car-agent"]
    );
    // The same notice again is stale.
    assert!(s.time_out(&car).ignored.is_some());
    s
}

/// At or after the pivot a lost command is sent again, never compensated.
pub(super) fn timeout_at_the_pivot_sends_again() -> Sim {
    let mut s = Sim::new(trip());
    s.run_to_pivot();
    let charge = s.command(CHARGE);
    let fx = s.time_out(&charge);
    assert!(fx.transitions.is_empty());
    assert_eq!(sent(&fx), ["command#3 -> charge-agent"]);
    assert_eq!(s.state(), SagaState::Running);
    assert_eq!(s.row(CHARGE).attempts, 2);
    let fx = s.dead_letter(&s.command(CHARGE));
    assert_eq!(sent(&fx), ["command#3 -> charge-agent"]);
    assert!(
        s.row(CHARGE)
            .error
            .as_deref()
            .unwrap()
            .contains("no such agent")
    );
    s
}

/// A command no agent took within its start timeout is withdrawn (by the engine)
/// and counts as timed out.
pub(super) fn start_timeout_compensates() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    let timer = s.row(FLIGHT).timer_id.unwrap();
    let fx = s.fire(protocol::KIND_START_TIMEOUT, Some(FLIGHT));
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailed)]
    );
    assert!(s.error().contains("not started within its start timeout"));
    assert_eq!(fx.cancel, [timer]);
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    s
}

/// A dead-lettered command before the pivot fails its step.
pub(super) fn delivery_failed_compensates() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    let fx = s.dead_letter(&s.command(FLIGHT));
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailed)]
    );
    assert_eq!(
        s.error(),
        "step `flight` failed: delivery to `flight-agent` failed: no such agent"
    );
    s
}

/// A reply that does not decode into what the step folds fails the step.
pub(super) fn undecodable_reply_fails_the_step() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    let fx = s.reply(FLIGHT, StepOutcome::Ok(json!(42)));
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::StepFailed)]
    );
    assert!(s.error().contains("the reply did not decode"));
    s
}

/// Running --Abort--> Compensating on the deadline; after the pivot it is ignored.
pub(super) fn deadline_aborts_before_the_pivot() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    s.reply(FLIGHT, ok());
    let fx = s.fire(protocol::KIND_DEADLINE, None);
    assert_eq!(fx.transitions, [(SagaState::Running, SagaEvent::Abort)]);
    assert_eq!(s.error(), "the saga's deadline passed");
    assert_eq!(
        sent(&fx),
        ["compensate#1 -> hotel-agent", "compensate#2 -> car-agent"]
    );

    let mut late = Sim::new(trip());
    late.run_to_pivot();
    let before = late.inst.clone();
    let fx = late.fire(protocol::KIND_DEADLINE, None);
    assert!(fx.ignored.is_some() && fx.send.is_empty());
    assert_eq!(late.inst, before);
    s
}
