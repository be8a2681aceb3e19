//! The one transition table of the saga lifecycle (see the `state` module): the only
//! place a saga's state changes.

use super::{SagaEvent, SagaState};
use crate::{Error, Result};

impl SagaState {
    /// The one transition table: the state `event` leads to from this one.
    ///
    /// # Errors
    /// [`Error::IllegalTransition`] if the table has no such row.
    pub fn on(self, event: SagaEvent) -> Result<SagaState> {
        use SagaEvent as E;
        use SagaState as S;
        Ok(match (self, event) {
            (S::Running, E::AllStepsSucceeded) => S::Completed,
            (S::Running, E::StepFailed | E::Abort) => S::Compensating,
            (S::Running, E::StepFailedAfterPivot) => S::Stuck,
            (S::Compensating, E::AllCompensated) => S::Compensated,
            (S::Compensating, E::CompensationExhausted) => S::Stuck,
            (S::Stuck, E::Retry | E::Skip) => S::Compensating,
            (S::Stuck, E::RetryForward) => S::Running,
            (S::Stuck, E::Abort) => S::Aborted,
            (S::Completed, E::Undo) => S::Compensating,
            (S::Running, E::Rewind) => S::Compensating,
            (S::Compensating, E::Rewound) => S::Running,
            (from, event) => return Err(Error::IllegalTransition { from, event }),
        })
    }
}
