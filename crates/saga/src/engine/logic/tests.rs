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

mod child;
mod forward;
mod planned;
mod replies;
mod rewind;
mod stuck;

use child::*;
use forward::*;
use planned::*;
use replies::*;
use rewind::*;
use stuck::*;

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
        let inst = Instance::new(
            SagaId::new(),
            def.name(),
            def.version(),
            json!({ "trip": 7 }),
            None,
        );
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
            spenders: Vec::new(),
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

    /// The latest message of `kind` about step `idx` (`None`: about no step) that the
    /// orchestrator sent.
    fn latest(&self, kind: &str, idx: Option<usize>) -> Option<&Message> {
        let step = idx.map(|i| i.to_string());
        self.outbox.iter().rev().find(|m| {
            let h = &m.headers;
            h.get(header::KIND).map(String::as_str) == Some(kind)
                && h.get(protocol::STEP).cloned() == step
        })
    }

    /// The latest message of `kind` about step `idx` that the orchestrator sent.
    fn last(&self, kind: &str, idx: usize) -> Envelope {
        let msg = self
            .latest(kind, Some(idx))
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
            .latest(kind, idx)
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
    a_completed_child_is_undone,
    a_rewind_undoes_its_stages_then_sends_the_step_afresh,
    a_deadline_during_a_rewind_gives_it_up,
    a_spent_budget_holds_the_stage_a_rewind_sends_afresh,
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
    assert_eq!(refused, 59);
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
