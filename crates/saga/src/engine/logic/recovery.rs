//! Re-planning after a failure (`PlannedBuilder::replan_on_failure`): a step whose
//! agent answered a failure is not compensated at once; its turn's later stages are
//! dropped, and once its stage has answered, the planner is asked what to do instead.

use super::Ctx;
use crate::{Result, SagaDefinition, SagaState, StepState};

impl Ctx<'_> {
    /// Step `idx` failed for good, its agent said (`error`): ask the planner again if
    /// the saga re-plans after failures and may, else fail the step (compensate before
    /// the pivot, stuck after it).
    pub(super) fn recover_or_fail(&mut self, idx: usize, error: String) -> Result<()> {
        if !self.recovers(idx)? {
            return self.fail_step(idx, error);
        }
        let def = self.def.clone().expect("recovers checked it");
        let planned = def.planned.as_ref().expect("recovers checked it");
        let row = self.inst.steps.get_mut(&idx).expect("dispatched");
        row.state = StepState::Failed;
        row.error = Some(error.clone());
        let name = row.name.clone();
        planned.recover(&mut self.inst.data, self.inst.stage, &name, &error)?;
        tracing::info!(saga.id = %self.inst.id, step = %name, %error, "step failed: the planner is asked again");
        self.def = Some(SagaDefinition::for_data(&def, &self.inst.data)?);
        self.advance_forward()
    }

    /// May step `idx`'s failure be answered by the planner: a planned saga that
    /// re-plans after failures, with turns left, running, nothing past its pivot
    /// dispatched, and the step not a planner's turn itself?
    fn recovers(&self, idx: usize) -> Result<bool> {
        let def = self.def()?;
        let (Some(planned), Some(step)) = (&def.planned, def.step(idx)) else {
            return Ok(false);
        };
        if self.inst.state != SagaState::Running || self.past_pivot() || planned.is_turn(&step.name)
        {
            return Ok(false);
        }
        planned.recovers(&self.inst.data)
    }
}
