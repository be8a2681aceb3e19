//! A rewind, decided in memory: Running --Rewind--> Compensating --Rewound--> Running.

use super::*;

/// Paused with its parallel stage answered (the pivot held), rewound to `flight`: the
/// parallel stage is undone first, then `flight`; then `flight` is sent afresh with the
/// data as the saga began (no booking folded in), its row written anew.
pub(super) fn a_rewind_undoes_its_stages_then_sends_the_step_afresh() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    s.reply(FLIGHT, StepOutcome::Ok(json!("LH 123")));
    assert_eq!(s.inst.data["flight"], json!("LH 123"));
    s.run(|c| c.pause("ops-anna", "check the booking")).unwrap();
    s.reply(HOTEL, ok());
    let fx = s.reply(CAR, ok());
    assert_eq!(sent(&fx), Vec::<String>::new(), "the pivot is held");

    let fx = s
        .run(|c| c.rewind("flight", "ops-anna", "wrong airport"))
        .unwrap();
    assert_eq!(s.state(), SagaState::Compensating);
    assert_eq!(
        sent(&fx),
        ["compensate#1 -> hotel-agent", "compensate#2 -> car-agent"],
        "the latest stage first, as the pause ends"
    );
    assert!(s.inst.pause.is_none());
    s.reply_compensation(HOTEL, ok());
    let fx = s.reply_compensation(CAR, ok());
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    let fx = s.reply_compensation(FLIGHT, ok());
    assert_eq!(s.state(), SagaState::Running);
    assert_eq!(
        sent(&fx),
        [
            "command#0 -> flight-agent",
            "start_timeout#0 -> saga.trip.v1"
        ]
    );
    assert_eq!(fx.drop_steps_from, Some(FLIGHT));
    assert_eq!(s.inst.data, json!({ "trip": 7 }), "as the saga began");
    assert_eq!(s.inst.stage, 0);
    let row = s.row(FLIGHT);
    assert_eq!((row.attempts, row.state), (1, StepState::Dispatched));
    assert_eq!(row.compensation_state, Some(CompensationState::Recorded));
    assert_eq!(s.inst.steps.len(), 1, "the undone rows give way");
    let rewind = &s.inst.rewinds[0];
    assert_eq!(rewind.done_ms, Some(NOW));
    let undone: Vec<_> = rewind.undone.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(undone, ["car", "hotel", "flight"]);
    assert_eq!(rewind.undone[2].output, Some(json!("LH 123")));
    assert_eq!(
        &s.taken[s.taken.len() - 2..],
        [
            (SagaState::Running, SagaEvent::Rewind),
            (SagaState::Compensating, SagaEvent::Rewound)
        ]
    );
    // And on to the end, each step once more.
    s.reply(FLIGHT, StepOutcome::Ok(json!("LH 124")));
    s.reply(HOTEL, ok());
    s.reply(CAR, ok());
    s.reply(CHARGE, ok());
    s.reply(CONFIRM, ok());
    assert_eq!(s.state(), SagaState::Completed);
    assert_eq!(s.inst.data["flight"], json!("LH 124"));
    s
}

/// The saga's deadline passes while a rewind's undos run: the rewind is given up
/// (kept, with why), and the saga undoes every step it took, down to `flight`, and
/// ends compensated instead of running forward again without a deadline.
pub(super) fn a_deadline_during_a_rewind_gives_it_up() -> Sim {
    let mut s = Sim::new(trip());
    s.start();
    s.reply(FLIGHT, StepOutcome::Ok(json!("LH 123")));
    s.run(|c| c.pause("ops-anna", "check the booking")).unwrap();
    s.reply(HOTEL, ok());
    s.reply(CAR, ok());
    s.run(|c| c.rewind("hotel", "ops-anna", "wrong hotel"))
        .unwrap();
    let fx = s.fire("deadline", None);
    assert_eq!(
        sent(&fx),
        Vec::<String>::new(),
        "the undos on their way go on"
    );
    assert_eq!(s.state(), SagaState::Compensating);
    s.reply_compensation(HOTEL, ok());
    let fx = s.reply_compensation(CAR, ok());
    assert_eq!(
        sent(&fx),
        ["compensate#0 -> flight-agent"],
        "past the rewind's step, down to the first"
    );
    s.reply_compensation(FLIGHT, ok());
    assert_eq!(s.state(), SagaState::Compensated);
    let rewind = &s.inst.rewinds[0];
    assert_eq!(rewind.done_ms, None);
    assert_eq!(
        rewind.abandoned.as_deref(),
        Some("the saga's deadline passed")
    );
    assert!(s.error().contains("a rewind was given up"), "{}", s.error());
    s
}

/// A spent budget (calls, `Wait`) when a rewind turns forward: the stage sent afresh
/// is held with the budget's other holds, and goes once an operator raises it.
pub(super) fn a_spent_budget_holds_the_stage_a_rewind_sends_afresh() -> Sim {
    let undoable = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .compensate(format!("{n}-agent"), |_: &D| json!("undo"))
            .retry(fast())
    };
    let def = Saga::<D>::builder("counted", 1)
        .step(undoable("a"))
        .step(undoable("b"))
        .step(undoable("c"))
        .budget(crate::Budget::new().calls(2), crate::OnBudgetSpent::Wait)
        .build()
        .unwrap();
    let mut s = Sim::new(def);
    s.start();
    let one_call = crate::Usage {
        calls: 1,
        ..crate::Usage::default()
    };
    let answer = |s: &mut Sim, idx: usize| {
        let reply = protocol::reply(&s.command(idx), &ok()).unwrap().unwrap();
        s.receive(&protocol::with_usage(reply, &one_call)).unwrap()
    };
    answer(&mut s, 0);
    let fx = answer(&mut s, 1);
    assert_eq!(sent(&fx), Vec::<String>::new(), "spent: `c` is held");
    s.run(|c| c.rewind("b", "ops-anna", "again")).unwrap();
    let fx = s.reply_compensation(1, ok());
    assert_eq!(s.state(), SagaState::Running);
    assert_eq!(sent(&fx), Vec::<String>::new(), "still spent: `b` is held");
    let fx = s
        .run(|c| c.raise_budget(crate::Budget::new().calls(4)))
        .unwrap();
    assert_eq!(sent(&fx), ["command#1 -> b-agent"], "sent once raised");
    s
}
