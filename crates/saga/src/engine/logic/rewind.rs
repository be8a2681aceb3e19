//! An operator's rewind of a saga to one of its steps: that step and every step done
//! after it are undone, latest stage first, each by its compensation as the ledger
//! recorded it (the compensation machinery's, stopping at the step's stage); then the
//! saga runs forward again from the step's stage with its data as that stage began
//! (kept on the stage's first step, `data_before`). The undone steps' rows give way to
//! their next run; what they were is kept in the rewind ([`Rewind::undone`]).

use agentsaga_core::Message;

use super::Ctx;
use super::budget::Dispatch;
use crate::engine::model::PauseRecord;
use crate::{
    Error, Result, Rewind, SagaDefinition, SagaEvent, SagaState, StepState, UndoneStep, protocol,
};

impl Ctx<'_> {
    /// An operator rewinds the saga to step `to` (`by`, for `reason`). Refused, with
    /// nothing changed, unless the saga is running with `to` taken, no step of `to`'s
    /// stage or later in flight (pause it first, and rewind once they answered), and
    /// each of them undoable (none at or past the pivot). A rewind ends a pause: the
    /// undos go now, and the saga then runs forward from `to`'s stage.
    pub(crate) fn rewind(&mut self, to: &str, by: &str, reason: &str) -> Result<()> {
        if self.inst.state != SagaState::Running {
            let why = match self.inst.state {
                SagaState::Compensating if self.inst.rewinding().is_some() => {
                    ": a rewind is under way".to_owned()
                }
                _ => ": only a running saga is rewound".to_owned(),
            };
            return Err(self.wrong("rewind", why));
        }
        let Some(stage) = self
            .inst
            .steps
            .values()
            .find(|r| r.name == to)
            .map(|r| r.stage)
        else {
            return Err(self.wrong("rewind", format!(": it has taken no step `{to}`")));
        };
        let undone = || self.inst.steps.values().filter(move |r| r.stage >= stage);
        if let Some(r) = undone().find(|r| r.state == StepState::Dispatched) {
            return Err(self.wrong(
                "rewind",
                format!(
                    ": step `{}` is in flight (pause the saga, and rewind once it answered)",
                    r.name
                ),
            ));
        }
        if let Some(r) = undone().find(|r| r.compensation_state.is_none()) {
            return Err(self.wrong(
                "rewind",
                format!(", past its pivot: step `{}` cannot be undone", r.name),
            ));
        }
        let kept = undone().find_map(|r| r.data_before.as_deref().filter(|_| r.stage == stage));
        if kept.is_some_and(|d| serde_json::from_str::<serde_json::Value>(d).is_err()) {
            return Err(Error::Corrupt(format!(
                "saga {}: the data kept for step `{to}`'s stage does not decode",
                self.inst.id
            )));
        }
        if kept.is_none() {
            return Err(self.wrong(
                "rewind",
                format!(
                    ": its data as step `{to}`'s stage began was not kept (it started \
                     before rewinds were)"
                ),
            ));
        }
        self.inst.rewinds.push(Rewind {
            to: to.to_owned(),
            stage,
            by: by.to_owned(),
            reason: reason.to_owned(),
            at_ms: self.now_ms,
            done_ms: None,
            abandoned: None,
            undone: Vec::new(),
        });
        // The undos go now; what a pause or a spent budget held back of the stages
        // undone is moot.
        self.inst.pause = None;
        if let Some(budget) = &mut self.inst.budget {
            budget.pending.clear();
            budget.held = Default::default();
        }
        self.transition(SagaEvent::Rewind)?;
        self.advance_compensation()
    }

    /// `msg`, a start or undo of step `idx`'s child saga, addressed to the child of
    /// the step's run: a rewind that undid the step gave its next run a child of its
    /// own (`protocol::CHILD_RUN`; the first run's messages carry no such header).
    pub(super) fn with_child_run(&self, idx: usize, msg: Message) -> Message {
        let run = self
            .inst
            .rewinds
            .iter()
            .filter(|r| r.undone.iter().any(|u| u.idx == idx))
            .count();
        if run == 0 {
            msg
        } else {
            msg.header(protocol::CHILD_RUN, run.to_string())
        }
    }

    /// The stage a rewind under way stops undoing at (`None` when none is: the saga
    /// undoes every step it took). Only while it undoes (compensating, or stuck on an
    /// undo): a saga that left that path some other way is not rewinding.
    pub(super) fn rewind_floor(&self) -> Option<usize> {
        let undoing = matches!(self.inst.state, SagaState::Compensating | SagaState::Stuck);
        self.inst.rewinding().filter(|_| undoing).map(|r| r.stage)
    }

    /// Gives up the rewind under way, if any, for `why`: the saga goes on undoing down
    /// to its first step, and ends compensated. `true` if there was one.
    pub(super) fn abandon_rewind(&mut self, why: &str) -> bool {
        if self.rewind_floor().is_none() {
            return false;
        }
        let rewind = self.inst.rewinds.last_mut().expect("under way");
        rewind.abandoned = Some(why.to_owned());
        self.inst.error = Some(format!("a rewind was given up: {why}"));
        true
    }

    /// The rewind's last undo is done: the undone steps' rows go (kept in the
    /// rewind), the data is as the stage began, and the stage is sent afresh.
    pub(super) fn rewound(&mut self) -> Result<()> {
        let stage = self.rewind_floor().expect("a rewind is under way");
        let undone: Vec<_> = self
            .inst
            .steps
            .values()
            .filter(|r| r.stage >= stage)
            .map(|r| r.idx)
            .collect();
        let rows: Vec<_> = undone
            .iter()
            .filter_map(|idx| self.inst.steps.remove(idx))
            .collect();
        let data = rows
            .iter()
            .find_map(|r| r.data_before.as_deref().filter(|_| r.stage == stage))
            .ok_or_else(|| Error::Corrupt(format!("no data kept for stage {stage}")))?;
        let data: serde_json::Value = serde_json::from_str(data)
            .map_err(|e| Error::Corrupt(format!("the data kept for stage {stage}: {e}")))?;
        self.fx.drop_steps_from = undone.first().copied();
        // The signals the undone waits took belong to the run undone: forgotten, so
        // that they wait afresh (a signal for a wait not reached stays).
        let waits: Vec<String> = rows
            .iter()
            .filter(|r| r.state != StepState::Dispatched)
            .filter_map(|r| r.destination.strip_prefix("signal:").map(str::to_owned))
            .collect();
        for name in &waits {
            self.signals.remove(name);
        }
        // An approval of a command is registered when its wait is reached: its row
        // goes (with the definition here to say which waits those are).
        let registered_when_reached = |name: &str| {
            self.def.as_ref().is_some_and(|def| {
                def.steps()
                    .any(|(_, sd)| sd.approves.is_some() && sd.wait.as_deref() == Some(name))
            })
        };
        let (dropped, reset): (Vec<String>, Vec<String>) =
            waits.into_iter().partition(|w| registered_when_reached(w));
        self.fx.reset_signals.extend(reset);
        self.fx.drop_signals.extend(dropped);
        self.fx
            .cancel
            .extend(rows.iter().filter_map(|r| r.timer_id));
        let now = self.now_ms;
        let rewind = self.inst.rewinds.last_mut().expect("under way");
        rewind.done_ms = Some(now);
        rewind.undone = rows
            .into_iter()
            .rev()
            .map(|r| UndoneStep {
                idx: r.idx,
                name: r.name,
                output: r.output,
                compensation: r.compensation_state,
                compensated_at: r.compensated_at,
            })
            .collect();
        self.inst.data = data;
        self.inst.stage = stage;
        self.inst.error = None;
        self.transition(SagaEvent::Rewound)?;
        if let Some(def) = self.def.clone() {
            // A planned saga plans again from there.
            self.def = Some(SagaDefinition::for_data(&def, &self.inst.data)?);
        }
        self.send_stage_afresh(stage)
    }

    /// Sends stage `stage` afresh (a rewind's): now, or, while paused or without the
    /// definition here, once the saga is resumed or its orchestrator woken.
    pub(super) fn send_stage_afresh(&mut self, stage: usize) -> Result<()> {
        if self.paused() || self.def.is_none() {
            let paused = self.paused();
            self.inst
                .pause
                .get_or_insert_with(PauseRecord::default)
                .stage = Some(stage);
            if !paused {
                let wake = protocol::resumed(self.inst.id, &self.orchestrator());
                self.fx.send.push(wake);
            }
            return Ok(());
        }
        // A spent budget holds the stage's steps (sent once it is raised), or turns the
        // saga back, as it does any forward step.
        if self.spent().is_some() {
            for idx in self.def()?.stage_range(stage) {
                if !self.budget_allows(Dispatch::Again(idx))?
                    && self.inst.state != SagaState::Running
                {
                    return Ok(());
                }
            }
            return Ok(());
        }
        self.dispatch_stage(stage)
    }
}
