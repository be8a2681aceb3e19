//! The saga bench's settings: its saga's shape (name, steps, where replies go), the
//! scenarios and the sizes of a run; shared by the driver, the runtime side, the floor
//! and the nested shape.

pub(super) const BENCH: &str = "saga";
pub(super) const SAGA: &str = "bench";
/// `saga.<name>.v<version>`: where replies go.
pub(super) const ORCHESTRATOR: &str = "saga.bench.v1";
/// (step name, agent destination), in order; the last is the pivot.
pub(super) const STEPS: [(&str, &str); 3] = [
    ("step_a", "agent_a"),
    ("step_b", "agent_b"),
    ("step_c", "agent_c"),
];
/// 1 in this many sagas fails at `step_c` in the compensating runs.
pub(super) const FAIL_EVERY: u64 = 5;
/// Hops per transaction of the physical reference.
pub(super) const PHYSICAL_BATCH: usize = 100;

/// How much work each figure does.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sizes {
    /// Sagas per run.
    pub(super) sagas: usize,
    /// Runs per side and scenario (the median is reported).
    pub(super) rounds: usize,
}

impl Sizes {
    pub(super) fn new(quick: bool) -> Self {
        if quick {
            Self {
                sagas: 300,
                rounds: 1,
            }
        } else {
            Self {
                sagas: 2_000,
                rounds: 2,
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scenario {
    Happy,
    Compensating,
}

impl Scenario {
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Happy => "happy",
            Self::Compensating => "compensating",
        }
    }

    pub(super) fn fails(self, n: u64) -> bool {
        self == Self::Compensating && n.is_multiple_of(FAIL_EVERY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_in_five_fails_when_compensating() {
        let fails = (0..100)
            .filter(|&n| Scenario::Compensating.fails(n))
            .count();
        assert_eq!(fails, 20);
        assert!((0..100).all(|n| !Scenario::Happy.fails(n)));
    }
}
