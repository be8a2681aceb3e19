//! The saga lifecycle: states, the events that move them, and the one transition
//! table. An event the table does not list for a state is an error
//! ([`Error::IllegalTransition`](crate::Error::IllegalTransition)): the transaction that
//! met it rolls back. The table itself is in `state/table.rs`.
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
//! Completed    --Undo--------------------> Compensating  (a child saga whose parent turns back)
//! Running      --Rewind------------------> Compensating  (an operator's rewind to a step)
//! Compensating --Rewound-----------------> Running       (its undos done: forward again)
//! ```

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

mod table;

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SagaEvent {
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
    /// The parent of a completed child saga (one without a pivot) turns back: the
    /// child's steps are undone, latest first, as if it had failed after its last.
    Undo,
    /// An operator rewinds the saga to a step: that step and those after it are
    /// undone, latest first.
    Rewind,
    /// A rewind's last undo is done: the saga runs forward again from the step.
    Rewound,
}

impl SagaState {
    /// Completed, compensated or aborted: nothing more will happen (but for a completed
    /// child saga, which its parent may still undo: [`SagaEvent::Undo`]).
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
pub enum CompensationState {
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
str_enum!(CompensationState {
    Recorded => "recorded", NotNeeded => "not_needed", Dispatched => "dispatched",
    Done => "done", Skipped => "skipped", Failed => "failed",
});

impl CompensationState {
    /// Nothing left to do for this compensation.
    pub fn is_resolved(self) -> bool {
        matches!(
            self,
            CompensationState::NotNeeded | CompensationState::Done | CompensationState::Skipped
        )
    }
}

/// Every saga state and every event, for the tests that walk the whole table.
#[cfg(test)]
pub(crate) mod all {
    use super::{SagaEvent as E, SagaState as S};

    pub(crate) const STATES: [S; 6] = [
        S::Running,
        S::Compensating,
        S::Completed,
        S::Compensated,
        S::Stuck,
        S::Aborted,
    ];

    pub(crate) const EVENTS: [E; 12] = [
        E::AllStepsSucceeded,
        E::StepFailed,
        E::StepFailedAfterPivot,
        E::Abort,
        E::AllCompensated,
        E::CompensationExhausted,
        E::Retry,
        E::Skip,
        E::RetryForward,
        E::Undo,
        E::Rewind,
        E::Rewound,
    ];

    // Does not compile when a state or an event is added: add it to the lists above.
    #[allow(dead_code)]
    fn listed(s: S, e: E) {
        match s {
            S::Running
            | S::Compensating
            | S::Completed
            | S::Compensated
            | S::Stuck
            | S::Aborted => {}
        }
        match e {
            E::AllStepsSucceeded
            | E::StepFailed
            | E::StepFailedAfterPivot
            | E::Abort
            | E::AllCompensated
            | E::CompensationExhausted
            | E::Retry
            | E::Skip
            | E::RetryForward
            | E::Undo
            | E::Rewind
            | E::Rewound => {}
        }
    }

    /// The table's rows, written out once more: (from, event, to).
    pub(crate) const ROWS: [(S, E, S); 13] = [
        (S::Running, E::AllStepsSucceeded, S::Completed),
        (S::Running, E::StepFailed, S::Compensating),
        (S::Running, E::Abort, S::Compensating),
        (S::Running, E::StepFailedAfterPivot, S::Stuck),
        (S::Compensating, E::AllCompensated, S::Compensated),
        (S::Compensating, E::CompensationExhausted, S::Stuck),
        (S::Stuck, E::Retry, S::Compensating),
        (S::Stuck, E::Skip, S::Compensating),
        (S::Stuck, E::RetryForward, S::Running),
        (S::Stuck, E::Abort, S::Aborted),
        (S::Completed, E::Undo, S::Compensating),
        (S::Running, E::Rewind, S::Compensating),
        (S::Compensating, E::Rewound, S::Running),
    ];
}

#[cfg(test)]
mod tests {
    use super::all::{EVENTS, ROWS, STATES};
    use super::{SagaEvent as E, SagaState as S};
    use crate::Error;

    // Every (state, event) pair: the 13 rows of the table lead where the table says,
    // the other 59 are refused with the pair.
    #[test]
    fn every_pair_of_the_table() {
        let mut allowed = 0;
        for s in STATES {
            for e in EVENTS {
                let row = ROWS.iter().find(|(f, ev, _)| *f == s && *ev == e);
                match (s.on(e), row) {
                    (Ok(to), Some((_, _, want))) => {
                        assert_eq!(to, *want, "{s} --{e:?}-->");
                        allowed += 1;
                    }
                    (Err(Error::IllegalTransition { from, event }), None) => {
                        assert_eq!((from, event), (s, e));
                    }
                    (got, want) => panic!("{s} --{e:?}--> {got:?}, expected {want:?}"),
                }
            }
        }
        assert_eq!(allowed, ROWS.len());
        assert_eq!(STATES.len() * EVENTS.len() - allowed, 59);
    }

    #[test]
    fn terminal_states_accept_nothing() {
        for s in [S::Completed, S::Compensated, S::Aborted] {
            assert!(s.is_terminal());
            for e in EVENTS {
                // A completed child saga is undone when its parent turns back.
                if (s, e) == (S::Completed, E::Undo) {
                    continue;
                }
                assert!(s.on(e).is_err(), "{s} --{e:?}--> should not exist");
            }
        }
        assert!(
            S::Compensating.on(E::Abort).is_err(),
            "abort while compensating is refused"
        );
        let refused = S::Running.on(E::AllCompensated).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "no transition from running on AllCompensated: the lifecycle table does not allow it"
        );
    }

    #[test]
    fn names_round_trip() {
        for s in STATES {
            assert_eq!(s.as_str().parse::<S>().unwrap(), s);
        }
    }
}
