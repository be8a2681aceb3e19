//! Scenarios of compensations built from the step's reply.

use super::*;

/// The hotel's and the car's undos succeed; then, and only then, the flight's is sent
/// (with the booking its reply gave) and succeeds: the saga is compensated.
fn hotel_and_car_then_flight_undone(s: &mut Sim) {
    s.reply_compensation(HOTEL, ok());
    let fx = s.reply_compensation(CAR, ok());
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    assert_eq!(
        s.compensation(FLIGHT).payload,
        r#"{"cancel":"F-1","trip":7}"#
    );
    s.reply_compensation(FLIGHT, ok());
    assert_eq!(s.state(), SagaState::Compensated);
}

/// A compensation built from its step's reply: the ledger says at dispatch that the
/// step must be undone, the payload is built (and recorded) when the compensation is
/// dispatched, with the reply of a step that succeeded and `None` for one that timed
/// out or was still in flight; its retries send the same payload.
pub(super) fn compensation_built_from_the_reply() -> Sim {
    let mut s = Sim::new(booked());
    s.start();
    let row = s.row(FLIGHT);
    assert_eq!(row.compensation_state, Some(CompensationState::Recorded));
    assert_eq!(
        row.compensation_destination.as_deref(),
        Some("flight-agent")
    );
    assert_eq!(row.compensation_payload, None, "built when dispatched");
    s.reply(FLIGHT, reserved("F-1"));
    s.reply(HOTEL, reserved("H-1"));
    assert_eq!(s.row(HOTEL).compensation_payload, None);
    let fx = s.time_out(&s.command(CAR));
    assert_eq!(
        sent(&fx),
        ["compensate#1 -> hotel-agent", "compensate#2 -> car-agent"]
    );
    assert_eq!(
        s.compensation(HOTEL).payload,
        r#"{"cancel":"H-1","trip":7}"#
    );
    assert_eq!(
        s.compensation(CAR).payload,
        r#"{"cancel":null,"trip":7}"#,
        "the car timed out: its outcome is unknown"
    );
    // Recorded in the ledger as sent.
    assert_eq!(
        s.row(HOTEL).compensation_payload,
        Some(json!({ "cancel": "H-1", "trip": 7 }))
    );
    assert_eq!(
        s.row(CAR).compensation_payload,
        Some(json!({ "cancel": null, "trip": 7 }))
    );
    assert_eq!(
        s.row(FLIGHT).compensation_payload,
        None,
        "not dispatched yet"
    );
    // A retry sends what was recorded.
    s.reply_compensation(HOTEL, retryable("busy"));
    assert_eq!(
        s.compensation(HOTEL).payload,
        r#"{"cancel":"H-1","trip":7}"#
    );
    hotel_and_car_then_flight_undone(&mut s);

    // A step still in flight when the saga turns back: `None`, and a reply that
    // comes after is not used.
    let mut f = Sim::new(booked());
    f.start();
    f.reply(FLIGHT, reserved("F-2"));
    let fx = f.reply(CAR, fatal("no cars"));
    assert_eq!(
        sent(&fx),
        ["compensate#1 -> hotel-agent", "compensate#2 -> car-agent"]
    );
    assert_eq!(f.compensation(HOTEL).payload, r#"{"cancel":null,"trip":7}"#);
    assert_eq!(f.compensation(CAR).payload, r#"{"cancel":null,"trip":7}"#);
    assert!(f.reply(HOTEL, reserved("H-2")).ignored.is_some());
    s
}

/// A reply that succeeded but does not decode as the compensation's reply type: the
/// compensation cannot be built, no retry can help. None of its stage goes out and the
/// saga is stuck, with the reason; retry finds the same, skip goes on.
pub(super) fn a_reply_the_compensation_cannot_read_is_stuck() -> Sim {
    let mut s = Sim::new(booked());
    s.start();
    s.reply(FLIGHT, reserved("F-1"));
    s.reply(HOTEL, StepOutcome::Ok(json!(42)));
    s.reply(CAR, reserved("C-1"));
    let fx = s.reply(CHARGE, fatal("card declined"));
    assert_eq!(
        fx.transitions,
        [
            (SagaState::Running, SagaEvent::StepFailed),
            (SagaState::Compensating, SagaEvent::CompensationExhausted),
        ]
    );
    assert!(fx.send.is_empty(), "none of the stage: {:?}", sent(&fx));
    assert_eq!(s.state(), SagaState::Stuck);
    assert!(
        s.error().starts_with(
            "compensation of step `hotel` cannot be built: the step's reply does not decode as `"
        ),
        "{}",
        s.error()
    );
    let hotel = s.row(HOTEL);
    assert_eq!(hotel.compensation_state, Some(CompensationState::Failed));
    assert!(
        hotel
            .compensation_error
            .as_deref()
            .unwrap()
            .contains("Reservation")
    );
    assert_eq!(hotel.compensation_payload, None);
    assert_eq!(
        s.row(CAR).compensation_state,
        Some(CompensationState::Recorded)
    );
    assert_eq!(s.row(CAR).compensation_payload, None, "nothing recorded");

    let fx = s.retry().unwrap();
    assert_eq!(
        fx.transitions,
        [
            (SagaState::Stuck, SagaEvent::Retry),
            (SagaState::Compensating, SagaEvent::CompensationExhausted),
        ]
    );
    assert!(fx.send.is_empty());
    // Undone by hand: the rest of the stage goes out, then the flight's.
    let fx = s.skip().unwrap();
    assert_eq!(sent(&fx), ["compensate#2 -> car-agent"]);
    assert_eq!(s.compensation(CAR).payload, r#"{"cancel":"C-1","trip":7}"#);
    let fx = s.reply_compensation(CAR, ok());
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    s.reply_compensation(FLIGHT, ok());
    assert_eq!(s.state(), SagaState::Compensated);
    s
}

/// An operator without the definition (the CLI) aborts: the compensations built from
/// replies are asked of the saga's orchestrator, which builds and sends them.
pub(super) fn compensation_from_the_reply_without_the_definition() -> Sim {
    let mut s = Sim::new(booked());
    s.start();
    s.reply(FLIGHT, reserved("F-1"));
    s.reply(HOTEL, reserved("H-1"));
    s.registered = false;
    let fx = s.abort().unwrap();
    assert_eq!(fx.transitions, [(SagaState::Running, SagaEvent::Abort)]);
    assert_eq!(
        sent(&fx),
        [
            "build_compensation#1 -> saga.booked.v1",
            "build_compensation#2 -> saga.booked.v1",
        ]
    );
    assert!(fx.send.iter().all(|m| m.key.is_none()));
    let hotel = s.row(HOTEL);
    assert_eq!(
        hotel.compensation_state,
        Some(CompensationState::Dispatched)
    );
    assert_eq!(hotel.compensation_message_id, Some(fx.send[0].id));
    assert_eq!(
        hotel.compensation_attempts, 0,
        "nothing sent to an agent yet"
    );

    // The orchestrator, which has the definition, builds and sends them.
    s.registered = true;
    let fx = s.fire(protocol::KIND_BUILD_COMPENSATION, Some(HOTEL));
    assert_eq!(sent(&fx), ["compensate#1 -> hotel-agent"]);
    assert_eq!(
        s.compensation(HOTEL).payload,
        r#"{"cancel":"H-1","trip":7}"#
    );
    assert_eq!(s.row(HOTEL).compensation_attempts, 1);
    assert_eq!(
        s.row(HOTEL).compensation_message_id,
        Some(s.compensation(HOTEL).id)
    );
    // The same request again is stale.
    let before = s.inst.clone();
    let fx = s.fire(protocol::KIND_BUILD_COMPENSATION, Some(HOTEL));
    assert!(fx.ignored.unwrap().contains("stale request"));
    assert_eq!(s.inst, before);
    let fx = s.fire(protocol::KIND_BUILD_COMPENSATION, Some(CAR));
    assert_eq!(sent(&fx), ["compensate#2 -> car-agent"]);
    assert_eq!(s.compensation(CAR).payload, r#"{"cancel":null,"trip":7}"#);
    hotel_and_car_then_flight_undone(&mut s);
    s
}
