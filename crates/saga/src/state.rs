//! The saga lifecycle: states and the one transition table.
//!
//! ```text
//! Running      --AllStepsSucceeded-------> Completed
//! Running      --StepFailed (before pivot)> Compensating
//! Running      --Abort (before pivot)-----> Compensating
//! Running      --StepFailed (after pivot)-> Stuck         (fatal: cannot go on, cannot undo)
//! Compensating --AllCompensated----------> Compensated
//! Compensating --CompensationExhausted---> Stuck
//! Stuck        --Retry-------------------> Compensating  (a stuck compensation, again)
//! Stuck        --Skip--------------------> Compensating  (recorded as skipped by hand)
//! Stuck        --RetryForward------------> Running       (a stuck step after the pivot)
//! Stuck        --Abort-------------------> Aborted       (after the pivot: give up, undo nothing)
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Where a saga instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SagaState {
    /// Forward steps in progress.
    Running,
    /// Undoing the steps taken, latest first.
    Compensating,
    /// Every step succeeded. Terminal.
    Completed,
    /// Every step taken was undone. Terminal.
    Compensated,
    /// A compensation kept failing past its retry budget, or a step after the pivot
    /// failed fatally: an operator must retry, skip or abort.
    Stuck,
    /// An operator gave up on a saga stuck after its pivot. Terminal.
    Aborted,
}

/// What happens to a saga, as the transition table sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lifecycle {
    /// The last forward step succeeded.
    AllStepsSucceeded,
    /// A forward step failed before or at the pivot: compensate.
    StepFailed,
    /// A step after the pivot failed fatally.
    StepFailedAfterPivot,
    /// An operator (or the saga deadline) aborts.
    Abort,
    /// The last compensation succeeded.
    AllCompensated,
    /// A compensation used up its retry budget.
    CompensationExhausted,
    /// An operator retries the stuck compensation.
    Retry,
    /// An operator marks the stuck compensation done by hand.
    Skip,
    /// An operator retries the stuck step after the pivot.
    RetryForward,
}

impl SagaState {
    /// The one transition table. `None`: the event does not apply in this state.
    pub fn on(self, event: Lifecycle) -> Option<SagaState> {
        use Lifecycle as E;
        use SagaState as S;
        Some(match (self, event) {
            (S::Running, E::AllStepsSucceeded) => S::Completed,
            (S::Running, E::StepFailed | E::Abort) => S::Compensating,
            (S::Running, E::StepFailedAfterPivot) => S::Stuck,
            (S::Compensating, E::AllCompensated) => S::Compensated,
            (S::Compensating, E::CompensationExhausted) => S::Stuck,
            (S::Stuck, E::Retry | E::Skip) => S::Compensating,
            (S::Stuck, E::RetryForward) => S::Running,
            (S::Stuck, E::Abort) => S::Aborted,
            _ => return None,
        })
    }

    /// Completed, compensated or aborted: nothing more will happen.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            SagaState::Completed | SagaState::Compensated | SagaState::Aborted
        )
    }

    /// The name stored in `saga_instances.state`.
    pub fn as_str(self) -> &'static str {
        match self {
            SagaState::Running => "running",
            SagaState::Compensating => "compensating",
            SagaState::Completed => "completed",
            SagaState::Compensated => "compensated",
            SagaState::Stuck => "stuck",
            SagaState::Aborted => "aborted",
        }
    }
}

impl fmt::Display for SagaState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SagaState {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "running" => SagaState::Running,
            "compensating" => SagaState::Compensating,
            "completed" => SagaState::Completed,
            "compensated" => SagaState::Compensated,
            "stuck" => SagaState::Stuck,
            "aborted" => SagaState::Aborted,
            other => return Err(format!("unknown saga state `{other}`")),
        })
    }
}

/// A forward step's state (`saga_steps.state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Its command is on its way, or being retried.
    Dispatched,
    /// Its agent replied with success.
    Succeeded,
    /// It failed, timed out, or its command was dead-lettered.
    Failed,
}

/// A step's compensation-ledger state (`saga_steps.compensation_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompState {
    /// Written with the step's dispatch; not needed yet.
    Recorded,
    /// The step declared nothing to undo.
    NotNeeded,
    /// The compensation command is on its way (or being retried).
    Dispatched,
    /// Undone.
    Done,
    /// Marked done by an operator.
    Skipped,
    /// Exhausted its retries: the saga is stuck.
    Failed,
}

macro_rules! str_enum {
    ($t:ty { $($v:ident => $s:literal),* $(,)? }) => {
        impl $t {
            /// The name stored in the database.
            pub fn as_str(self) -> &'static str { match self { $(Self::$v => $s),* } }
        }
        impl FromStr for $t {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s { $($s => Ok(Self::$v),)* other => Err(format!("unknown state `{other}`")) }
            }
        }
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.as_str()) }
        }
    };
}
str_enum!(StepState { Dispatched => "dispatched", Succeeded => "succeeded", Failed => "failed" });
str_enum!(CompState {
    Recorded => "recorded", NotNeeded => "not_needed", Dispatched => "dispatched",
    Done => "done", Skipped => "skipped", Failed => "failed",
});

impl CompState {
    /// Nothing left to do for this compensation.
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            CompState::NotNeeded | CompState::Done | CompState::Skipped
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{Lifecycle as E, SagaState as S};

    #[test]
    fn happy_and_compensating_paths() {
        assert_eq!(S::Running.on(E::AllStepsSucceeded), Some(S::Completed));
        assert_eq!(S::Running.on(E::StepFailed), Some(S::Compensating));
        assert_eq!(S::Compensating.on(E::AllCompensated), Some(S::Compensated));
        assert_eq!(S::Compensating.on(E::CompensationExhausted), Some(S::Stuck));
    }

    #[test]
    fn operator_actions() {
        assert_eq!(S::Running.on(E::Abort), Some(S::Compensating));
        assert_eq!(S::Stuck.on(E::Retry), Some(S::Compensating));
        assert_eq!(S::Stuck.on(E::Skip), Some(S::Compensating));
        assert_eq!(S::Stuck.on(E::RetryForward), Some(S::Running));
        assert_eq!(S::Stuck.on(E::Abort), Some(S::Aborted));
    }

    #[test]
    fn terminal_states_accept_nothing() {
        let all = [
            E::AllStepsSucceeded,
            E::StepFailed,
            E::StepFailedAfterPivot,
            E::Abort,
            E::AllCompensated,
            E::CompensationExhausted,
            E::Retry,
            E::Skip,
            E::RetryForward,
        ];
        for s in [S::Completed, S::Compensated, S::Aborted] {
            assert!(s.is_terminal());
            for e in all {
                assert_eq!(s.on(e), None, "{s} --{e:?}--> should not exist");
            }
        }
        assert_eq!(
            S::Compensating.on(E::Abort),
            None,
            "abort while compensating is a no-op"
        );
        assert_eq!(S::Running.on(E::AllCompensated), None);
    }

    #[test]
    fn names_round_trip() {
        for s in [
            S::Running,
            S::Compensating,
            S::Completed,
            S::Compensated,
            S::Stuck,
            S::Aborted,
        ] {
            assert_eq!(s.as_str().parse::<S>().unwrap(), s);
        }
    }
}
