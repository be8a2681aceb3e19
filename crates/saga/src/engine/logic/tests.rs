//! The engine's decisions with no store: a saga held in memory is fed what its
//! orchestrator would receive (built with the protocol's own builders: replies,
//! timeout notices, dead-letter notices, timers) and what operators do, through
//! [`Ctx`], as the engine does it; each test checks the states and the effects (the
//! messages sent, the timers cancelled). As the engine's transaction does, an event
//! that fails leaves the instance as it was.
//!
//! Transition coverage, after Temporal's state-machine tests: every scenario records
//! the lifecycle transitions it takes, and [`every_row_of_the_table_is_taken`] checks
//! that together they take each of the table's rows; [`illegal_transitions_change_nothing`]
//! checks that the pairs the table lacks are refused.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use agentsaga_core::{DeliveryFailed, Envelope, Message, RetryPolicy, header};
use serde_json::{Value, json};

use super::{Ctx, Effects};
use crate::engine::model::{Instance, StepRow};
use crate::protocol::{self, Inbound, StepOutcome, envelope};
use crate::state::all::{EVENTS, ROWS, STATES};
use crate::tests::{booked, fast};
use crate::{
    CompensationState, Error, Result, Saga, SagaDefinition, SagaEvent, SagaId, SagaState, Step,
    StepState,
};

type D = Value;

const NOW: i64 = 1_700_000_000_000;

fn ok() -> StepOutcome {
    StepOutcome::Ok(json!("ok"))
}

fn fatal(e: &str) -> StepOutcome {
    StepOutcome::Fatal(e.into())
}

fn retryable(e: &str) -> StepOutcome {
    StepOutcome::Retryable(e.into())
}

// Steps of `trip`, by index.
const FLIGHT: usize = 0;
const HOTEL: usize = 1;
const CAR: usize = 2;
const CHARGE: usize = 3;
const CONFIRM: usize = 4;

/// Flight (start timeout 5 s; its reply folds into the data), then hotel and car in
/// parallel, then the pivot, then a confirmation; a deadline of one minute.
fn trip() -> SagaDefinition {
    let undoable = |n: &str| {
        Step::<D>::new(n, format!("{n}-agent"))
            .command(|d: &D| json!({ "book": d["trip"] }))
            .compensate(format!("{n}-agent"), |d: &D| json!({ "cancel": d["trip"] }))
            .retry(fast())
            .timeout(Duration::from_millis(300))
    };
    Saga::<D>::builder("trip", 1)
        .step(
            undoable("flight")
                .start_timeout(Duration::from_secs(5))
                .on_reply(|d: &mut D, booking: String| d["flight"] = json!(booking)),
        )
        .parallel([undoable("hotel"), undoable("car")])
        .pivot(Step::new("charge", "charge-agent").retry(fast()))
        .step(Step::new("confirm", "confirm-agent").retry(fast()))
        .deadline(Duration::from_secs(60))
        .build()
        .unwrap()
}

fn reserved(id: &str) -> StepOutcome {
    StepOutcome::Ok(json!({ "id": id }))
}

/// One message, for the eye: `kind#step -> destination` (`kind -> destination` without
/// a step).
fn show(m: &Message) -> String {
    let h = &m.headers;
    let kind = h.get(header::KIND).map_or("?", String::as_str);
    match h.get(protocol::STEP) {
        Some(step) => format!("{kind}#{step} -> {}", m.destination),
        None => format!("{kind} -> {}", m.destination),
    }
}

fn sent(fx: &Effects) -> Vec<String> {
    fx.send.iter().map(show).collect()
}

/// A saga in memory and everything its orchestrator sent.
struct Sim {
    def: Arc<SagaDefinition>,
    /// Is the definition registered (operators may act without it)?
    registered: bool,
    inst: Instance,
    compensation_retry: RetryPolicy,
    outbox: Vec<Message>,
    /// Every lifecycle transition taken, in order.
    taken: Vec<(SagaState, SagaEvent)>,
    seed: u64,
    /// The signals received (as the engine loads them from `saga_signals`).
    signals: BTreeMap<String, StepOutcome>,
}

impl Sim {
    fn new(def: SagaDefinition) -> Self {
        let inst = Instance {
            id: SagaId::new(),
            name: def.name().to_owned(),
            version: def.version(),
            state: SagaState::Running,
            data: json!({ "trip": 7 }),
            error: None,
            stage: 0,
            steps: BTreeMap::new(),
            finished: false,
        };
        Self {
            def: Arc::new(def),
            registered: true,
            inst,
            compensation_retry: fast(),
            outbox: Vec::new(),
            taken: Vec::new(),
            seed: 0,
            signals: BTreeMap::new(),
        }
    }

    /// Runs one decision on a copy of the instance, kept only if it succeeds.
    fn run(&mut self, decide: impl FnOnce(&mut Ctx<'_>) -> Result<()>) -> Result<Effects> {
        let mut inst = self.inst.clone();
        self.seed += 1;
        let def = self
            .registered
            .then(|| self.def.for_data(&inst.data))
            .transpose()?;
        let mut ctx = Ctx {
            inst: &mut inst,
            def,
            compensation_retry: self.compensation_retry,
            now_ms: NOW,
            fx: Effects::default(),
            rng: fastrand::Rng::with_seed(self.seed),
            signals: self.signals.clone(),
        };
        decide(&mut ctx)?;
        let fx = std::mem::take(&mut ctx.fx);
        self.inst = inst;
        self.outbox.extend(fx.send.iter().cloned());
        self.taken.extend(fx.transitions.iter().copied());
        Ok(fx)
    }

    /// What the orchestrator received: parsed as the engine parses it.
    fn receive(&mut self, msg: &Message) -> Result<Effects> {
        let env = envelope(msg);
        assert_eq!(protocol::saga_id(&env).unwrap(), self.inst.id);
        let inbound = Inbound::parse(&env)?;
        self.run(|c| c.receive(inbound))
    }

    fn start(&mut self) -> Effects {
        self.run(|c| c.start(Duration::ZERO)).unwrap()
    }

    /// The latest message of `kind` about step `idx` that the orchestrator sent.
    fn last(&self, kind: &str, idx: usize) -> Envelope {
        let step = idx.to_string();
        let msg = self
            .outbox
            .iter()
            .rev()
            .find(|m| {
                let h = &m.headers;
                h.get(header::KIND).map(String::as_str) == Some(kind)
                    && h.get(protocol::STEP) == Some(&step)
            })
            .unwrap_or_else(|| panic!("no {kind} sent for step {idx}"));
        envelope(msg)
    }

    fn command(&self, idx: usize) -> Envelope {
        self.last(protocol::KIND_COMMAND, idx)
    }

    fn compensation(&self, idx: usize) -> Envelope {
        self.last(protocol::KIND_COMPENSATE, idx)
    }

    /// Step `idx`'s agent answers its latest command.
    fn reply(&mut self, idx: usize, out: StepOutcome) -> Effects {
        let reply = protocol::reply(&self.command(idx), &out).unwrap().unwrap();
        self.receive(&reply).unwrap()
    }

    /// Step `idx`'s agent answers its latest compensation.
    fn reply_compensation(&mut self, idx: usize, out: StepOutcome) -> Effects {
        let reply = protocol::reply(&self.compensation(idx), &out)
            .unwrap()
            .unwrap();
        self.receive(&reply).unwrap()
    }

    /// Step `idx`'s agent gives up on `env` past its timeout.
    fn time_out(&mut self, env: &Envelope) -> Effects {
        let notice = protocol::timed_out(env).unwrap();
        self.receive(&notice).unwrap()
    }

    /// The relay dead-letters `env`.
    fn dead_letter(&mut self, env: &Envelope) -> Effects {
        let notice = DeliveryFailed::notice_for(env, "no such agent")
            .unwrap()
            .unwrap();
        self.receive(&notice).unwrap()
    }

    /// A timer the orchestrator set fires (a start timeout: its command withdrawn).
    fn fire(&mut self, kind: &str, idx: Option<usize>) -> Effects {
        let timer = self
            .outbox
            .iter()
            .rev()
            .find(|m| {
                let h = &m.headers;
                h.get(header::KIND).map(String::as_str) == Some(kind)
                    && h.get(protocol::STEP).cloned() == idx.map(|i| i.to_string())
            })
            .unwrap_or_else(|| panic!("no {kind} timer"))
            .clone();
        self.receive(&timer).unwrap()
    }

    fn abort(&mut self) -> Result<Effects> {
        self.run(|c| c.abort())
    }

    fn retry(&mut self) -> Result<Effects> {
        self.run(|c| c.retry())
    }

    fn skip(&mut self) -> Result<Effects> {
        self.run(|c| c.skip())
    }

    fn fail(&mut self, idx: Option<usize>) -> Effects {
        self.run(|c| c.fail_processing(idx, "the saga data outgrew the limit".into()))
            .unwrap()
    }

    fn row(&self, idx: usize) -> &StepRow {
        &self.inst.steps[&idx]
    }

    fn state(&self) -> SagaState {
        self.inst.state
    }

    fn error(&self) -> &str {
        self.inst.error.as_deref().unwrap_or_default()
    }

    /// Runs the trip to its pivot: flight, hotel and car succeeded, charge dispatched.
    fn run_to_pivot(&mut self) {
        self.start();
        self.reply(FLIGHT, StepOutcome::Ok(json!("LH 123")));
        self.reply(HOTEL, ok());
        self.reply(CAR, ok());
        assert_eq!(self.inst.stage, 2);
    }

    /// Runs the trip past its pivot: charge succeeded, confirm dispatched.
    fn run_past_pivot(&mut self) {
        self.run_to_pivot();
        self.reply(CHARGE, ok());
        assert_eq!(self.inst.stage, 3);
    }
}

/// A refused operator action: `WrongState`, and the instance as it was.
fn refused(sim: &mut Sim, action: fn(&mut Sim) -> Result<Effects>, why: &str) {
    let before = sim.inst.clone();
    match action(sim) {
        Err(Error::WrongState { state, why: w, .. }) => {
            assert_eq!(state, before.state);
            assert!(w.contains(why), "`{w}` does not say `{why}`");
        }
        other => panic!("expected WrongState, got {other:?}"),
    }
    assert_eq!(sim.inst, before);
}

// ----- scenarios -------------------------------------------------------------------

/// Running --AllStepsSucceeded--> Completed, with every effect along the way.
fn happy_path() -> Sim {
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
fn fatal_before_the_pivot_compensates_in_reverse() -> Sim {
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
fn fatal_pivot_compensates() -> Sim {
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
fn retryable_until_exhausted() -> Sim {
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
fn retryable_after_the_pivot_has_no_budget() -> Sim {
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
fn timeout_before_the_pivot_compensates() -> Sim {
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
fn timeout_at_the_pivot_sends_again() -> Sim {
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
fn start_timeout_compensates() -> Sim {
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
fn delivery_failed_compensates() -> Sim {
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
fn undecodable_reply_fails_the_step() -> Sim {
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
fn deadline_aborts_before_the_pivot() -> Sim {
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

/// Running --StepFailedAfterPivot--> Stuck --Abort--> Aborted.
fn fatal_after_the_pivot_is_stuck_then_aborted() -> Sim {
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
fn stuck_after_the_pivot_retried_forward() -> Sim {
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
fn stuck_compensation_retried_then_skipped() -> Sim {
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
fn nothing_to_undo_is_compensated_at_once() -> Sim {
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
fn operator_abort_without_the_definition() -> Sim {
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
fn unprocessable_messages_fail_the_saga() -> Sim {
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
fn operators_refused() -> Sim {
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
fn stray_messages() -> Sim {
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

/// A compensation built from its step's reply: the ledger says at dispatch that the
/// step must be undone, the payload is built (and recorded) when the compensation is
/// dispatched, with the reply of a step that succeeded and `None` for one that timed
/// out or was still in flight; its retries send the same payload.
fn compensation_built_from_the_reply() -> Sim {
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
    s.reply_compensation(HOTEL, ok());
    let fx = s.reply_compensation(CAR, ok());
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    assert_eq!(
        s.compensation(FLIGHT).payload,
        r#"{"cancel":"F-1","trip":7}"#
    );
    s.reply_compensation(FLIGHT, ok());
    assert_eq!(s.state(), SagaState::Compensated);

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
fn a_reply_the_compensation_cannot_read_is_stuck() -> Sim {
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
fn compensation_from_the_reply_without_the_definition() -> Sim {
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
    s.reply_compensation(HOTEL, ok());
    let fx = s.reply_compensation(CAR, ok());
    assert_eq!(sent(&fx), ["compensate#0 -> flight-agent"]);
    assert_eq!(
        s.compensation(FLIGHT).payload,
        r#"{"cancel":"F-1","trip":7}"#
    );
    s.reply_compensation(FLIGHT, ok());
    assert_eq!(s.state(), SagaState::Compensated);
    s
}

/// A planned saga with a planner step: its plan comes back as the planner's text.
fn planned() -> SagaDefinition {
    crate::PlannedSaga::builder("errand", 1)
        .destinations(["search", "calendar", "mail"])
        .planner(
            Step::new("plan", "planner")
                .command(|d: &Value| d["input"].clone())
                .nothing_to_undo(),
        )
        .build()
        .unwrap()
}

/// The plan the planner answers with, amid prose: search, book (undone from its
/// result), then the pivot.
const PLAN_TEXT: &str = r#"Here you go:
```json
{"steps": [
  {"name": "look", "destination": "search", "command": {"q": {"$from": "/input/topic"}}, "nothing_to_undo": true},
  {"name": "book", "destination": "calendar", "command": {"about": {"$from": "/results/look"}},
   "compensate": {"destination": "calendar", "command": {"cancel": {"$from": "/results/book/event_id"}}}},
  {"name": "send", "destination": "mail", "command": "done", "pivot": true}
]}
```"#;

fn planned_sim() -> Sim {
    let mut s = Sim::new(planned());
    s.inst.data = crate::plan::initial_data(json!({ "topic": "sagas" }), None).unwrap();
    let fx = s.start();
    assert_eq!(sent(&fx), ["command#0 -> planner"]);
    assert_eq!(s.command(0).payload, r#"{"topic":"sagas"}"#);
    s
}

/// The planner's plan runs: its steps are dispatched in order with their references
/// resolved; a failure compensates in reverse with the undo built from the result.
fn a_plan_made_at_run_time_runs_and_compensates() -> Sim {
    let mut s = planned_sim();
    let fx = s.reply(0, StepOutcome::Ok(json!(PLAN_TEXT)));
    assert_eq!(sent(&fx), ["command#1 -> search"]);
    assert_eq!(s.command(1).payload, r#"{"q":"sagas"}"#);
    assert!(s.inst.data["plan"]["steps"].is_array());
    s.reply(1, StepOutcome::Ok(json!(["a", "b"])));
    assert_eq!(s.command(2).payload, r#"{"about":["a","b"]}"#);
    s.reply(2, StepOutcome::Ok(json!({ "event_id": "ev-9" })));
    assert_eq!(
        s.inst.data["results"]["book"],
        json!({ "event_id": "ev-9" })
    );
    let fx = s.reply(3, fatal("mail server says no"));
    assert_eq!(s.state(), SagaState::Compensating);
    assert_eq!(sent(&fx), ["compensate#2 -> calendar"]);
    assert_eq!(s.compensation(2).payload, r#"{"cancel":"ev-9"}"#);
    s.reply_compensation(2, ok());
    assert_eq!(s.state(), SagaState::Compensated);
    assert!(s.error().contains("mail server says no"), "{}", s.error());
    s
}

/// A planner's answer that is not a valid plan fails the planner step, fatally, with
/// the reason; nothing of it runs.
fn an_invalid_plan_fails_the_planner_step() -> Sim {
    let mut s = planned_sim();
    let bad = r#"{"steps": [{"name": "pay", "destination": "payments", "nothing_to_undo": true}]}"#;
    let fx = s.reply(0, StepOutcome::Ok(json!(bad)));
    assert!(
        sent(&fx).iter().all(|m| !m.starts_with("command")),
        "{fx:?}"
    );
    assert_eq!(s.state(), SagaState::Compensated);
    assert!(
        s.error().contains("invalid plan") && s.error().contains("unknown destination `payments`"),
        "{}",
        s.error()
    );
    assert!(s.inst.data.get("plan").is_none());
    s
}

/// A scenario: runs, checks itself, and hands back its saga (with the transitions
/// it took).
type Scenario = fn() -> Sim;

/// Each scenario a test of its own, and all of them in `SCENARIOS`, for coverage.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        mod scenario {
            $(
                #[test]
                fn $name() {
                    super::$name();
                }
            )*
        }

        const SCENARIOS: &[(&str, Scenario)] = &[$((stringify!($name), $name)),*];
    };
}

scenarios!(
    happy_path,
    fatal_before_the_pivot_compensates_in_reverse,
    fatal_pivot_compensates,
    retryable_until_exhausted,
    retryable_after_the_pivot_has_no_budget,
    timeout_before_the_pivot_compensates,
    timeout_at_the_pivot_sends_again,
    start_timeout_compensates,
    delivery_failed_compensates,
    undecodable_reply_fails_the_step,
    deadline_aborts_before_the_pivot,
    fatal_after_the_pivot_is_stuck_then_aborted,
    stuck_after_the_pivot_retried_forward,
    stuck_compensation_retried_then_skipped,
    nothing_to_undo_is_compensated_at_once,
    operator_abort_without_the_definition,
    unprocessable_messages_fail_the_saga,
    operators_refused,
    stray_messages,
    compensation_built_from_the_reply,
    a_reply_the_compensation_cannot_read_is_stuck,
    compensation_from_the_reply_without_the_definition,
    a_plan_made_at_run_time_runs_and_compensates,
    an_invalid_plan_fails_the_planner_step,
);

// ----- coverage ----------------------------------------------------------------------

/// Every row of the lifecycle table is taken by some scenario, through the engine's
/// decisions (not by calling the table), and no scenario takes a transition the table
/// lacks.
#[test]
fn every_row_of_the_table_is_taken() {
    let mut taken: BTreeMap<(String, String), Vec<&str>> = BTreeMap::new();
    for (name, scenario) in SCENARIOS {
        for (from, event) in scenario().taken {
            assert!(from.on(event).is_ok(), "{name}: {from} --{event:?}-->");
            taken
                .entry((from.to_string(), format!("{event:?}")))
                .or_default()
                .push(name);
        }
    }
    let rows: BTreeSet<(String, String)> = ROWS
        .iter()
        .map(|(from, event, _)| (from.to_string(), format!("{event:?}")))
        .collect();
    let covered: BTreeSet<(String, String)> = taken.keys().cloned().collect();
    let missing: Vec<_> = rows.difference(&covered).collect();
    assert!(missing.is_empty(), "rows no scenario takes: {missing:?}");
    assert_eq!(taken.len(), ROWS.len());
}

/// The pairs the table lacks are refused with `IllegalTransition`, and a decision
/// that meets one leaves the instance as it was, whatever it changed before.
#[test]
fn illegal_transitions_change_nothing() {
    let mut refused = 0;
    for from in STATES {
        for event in EVENTS {
            if ROWS.iter().any(|(f, e, _)| *f == from && *e == event) {
                continue;
            }
            let mut s = Sim::new(trip());
            s.start();
            s.inst.state = from;
            let before = s.inst.clone();
            let result = s.run(|c| {
                // A change made while deciding, before the refused transition.
                c.inst.steps.get_mut(&FLIGHT).unwrap().state = StepState::Failed;
                c.inst.error = Some("changed".into());
                c.transition(event)
            });
            match result {
                Err(Error::IllegalTransition { from: f, event: e }) => {
                    assert_eq!((f, e), (from, event));
                }
                other => panic!("{from} --{event:?}--> {other:?}"),
            }
            assert_eq!(s.inst, before, "{from} --{event:?}--> left changes");
            assert!(s.taken.is_empty());
            refused += 1;
        }
    }
    assert_eq!(refused, 44);
}

/// A legal transition records itself in the effects.
#[test]
fn transitions_are_recorded() {
    let mut s = Sim::new(trip());
    s.start();
    let fx = s.run(|c| c.transition(SagaEvent::Abort)).unwrap();
    assert_eq!(fx.transitions, [(SagaState::Running, SagaEvent::Abort)]);
    assert_eq!(s.state(), SagaState::Compensating);
    assert!(!s.inst.finished);
}
