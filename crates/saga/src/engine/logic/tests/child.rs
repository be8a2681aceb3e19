//! A child saga's side: its answer to the parent step that started it, and its undo
//! when that parent turns back.

use super::*;
use crate::engine::model::ParentLink;
use agentsaga_core::MessageId;

/// Completed --Undo--> Compensating --AllCompensated--> Compensated: a child saga
/// answers its parent's command with its data when it completes; when the parent turns
/// back, its steps are undone latest first, and it answers the parent's compensation.
pub(super) fn a_completed_child_is_undone() -> Sim {
    let def = Saga::<D>::builder("booking", 1)
        .step(Step::new("flight", "flight-agent").compensate("flight-agent", |_: &D| "undo flight"))
        .step(Step::new("hotel", "hotel-agent").compensate("hotel-agent", |_: &D| "undo hotel"))
        .build()
        .unwrap();
    let mut s = Sim::new(def);
    let (parent, command) = (SagaId::new(), MessageId::new());
    s.inst.parent = Some(ParentLink {
        saga: parent,
        step: 3,
        step_name: "book".into(),
        reply_to: "saga.travel.v1".into(),
        command,
        compensation: None,
        depth: 1,
    });
    s.start();
    s.reply(0, ok());
    let fx = s.reply(1, ok());
    assert_eq!(
        fx.transitions,
        [(SagaState::Running, SagaEvent::AllStepsSucceeded)]
    );
    let answer = envelope(fx.send.last().expect("the answer to the parent"));
    assert_eq!(answer.destination, "saga.travel.v1");
    assert_eq!(
        answer.header(header::SAGA_ID),
        Some(parent.to_string().as_str())
    );
    assert_eq!(answer.header(protocol::STEP), Some("3"));
    assert_eq!(
        answer.header(header::CAUSATION_ID),
        Some(command.to_string().as_str())
    );
    let outcome: StepOutcome = serde_json::from_str(&answer.payload).unwrap();
    assert_eq!(outcome, StepOutcome::Ok(s.inst.data.clone()), "its data");

    let undo = MessageId::new();
    let fx = s.run(|c| c.undo_as_child(undo)).unwrap();
    assert_eq!(fx.transitions, [(SagaState::Completed, SagaEvent::Undo)]);
    assert_eq!(
        sent(&fx),
        ["compensate#1 -> hotel-agent"],
        "the latest first"
    );
    let fx = s.reply_compensation(1, ok());
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    let fx = s.reply_compensation(0, ok());
    assert_eq!(
        fx.transitions,
        [(SagaState::Compensating, SagaEvent::AllCompensated)]
    );
    let answer = envelope(fx.send.last().expect("the answer to the undo"));
    assert_eq!(
        answer.header(header::CAUSATION_ID),
        Some(undo.to_string().as_str())
    );
    let outcome: StepOutcome = serde_json::from_str(&answer.payload).unwrap();
    assert_eq!(outcome, StepOutcome::Ok(Value::Null));
    // Undone: asked again, it answers at once, and nothing else happens.
    let again = MessageId::new();
    let fx = s.run(|c| c.undo_as_child(again)).unwrap();
    assert!(fx.transitions.is_empty());
    assert_eq!(fx.send.len(), 1);
    assert_eq!(
        envelope(&fx.send[0]).header(header::CAUSATION_ID),
        Some(again.to_string().as_str())
    );
    s
}

/// A child that completed past its pivot is not undone by halves: the parent's undo
/// fails (its compensation fails, and the parent is stuck for an operator).
#[test]
fn a_child_past_its_pivot_refuses_to_be_undone() {
    let def = Saga::<D>::builder("booking", 1)
        .step(Step::new("flight", "flight-agent").compensate("flight-agent", |_: &D| "undo"))
        .pivot(Step::new("pay", "pay-agent"))
        .build()
        .unwrap();
    let mut s = Sim::new(def);
    s.inst.parent = Some(ParentLink {
        saga: SagaId::new(),
        step: 0,
        step_name: "book".into(),
        reply_to: "saga.travel.v1".into(),
        command: MessageId::new(),
        compensation: None,
        depth: 1,
    });
    s.start();
    s.reply(0, ok());
    s.reply(1, ok());
    assert_eq!(s.state(), SagaState::Completed);
    let undo = MessageId::new();
    let fx = s.run(|c| c.undo_as_child(undo)).unwrap();
    assert!(
        fx.transitions.is_empty(),
        "nothing undone: {:?}",
        fx.transitions
    );
    assert_eq!(s.state(), SagaState::Completed);
    let answer = envelope(&fx.send[0]);
    assert_eq!(
        answer.header(header::CAUSATION_ID),
        Some(undo.to_string().as_str())
    );
    let outcome: StepOutcome = serde_json::from_str(&answer.payload).unwrap();
    assert!(
        matches!(&outcome, StepOutcome::Fatal(why) if why.contains("cannot be undone")),
        "{outcome:?}"
    );
}
