//! Budgets: what a saga may spend (tokens in and out, cost, outside calls) and what it
//! has spent. Agents report a call's [`Usage`] with their reply; the orchestrator adds
//! it to the step and the saga in the transaction that applies the reply. Once a
//! saga's [`Budget`] is spent, no further forward step is dispatched: the saga
//! compensates, or waits for a person to raise the budget ([`OnBudgetSpent`]).
//!
//! Checked before each forward dispatch: a stage goes out step by step as far as the
//! budget has room beside the steps on their way (one outside call each, and the
//! saga's average of tokens and cost). A child saga's spending counts against its
//! ancestors' budgets as it happens. A budget is a ceiling, exceeded by at most what
//! the calls already on their way when it was reached use.

use std::fmt;
use std::ops::{Add, AddAssign};

use serde::{Deserialize, Serialize};

/// What work used: tokens in and out, cost in micro-units of a currency, outside
/// calls. Reported by an agent with its reply (`CallContext::report_usage` in
/// `agentsaga-runtime`, or the [`USAGE`](crate::protocol::USAGE) header on the
/// wire); a saga's usage is the sum of its steps' (its child sagas' included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Tokens sent to a model.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_in: u64,
    /// Tokens a model produced.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub tokens_out: u64,
    /// Cost, in micro-units of the application's currency (1 USD = 1,000,000).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_micros: u64,
    /// Calls to the outside world (a `CallingAgent` counts one per `call` by itself).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub calls: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Usage {
    /// `tokens_in` tokens sent to a model and `tokens_out` produced.
    pub fn tokens(tokens_in: u64, tokens_out: u64) -> Self {
        Self {
            tokens_in,
            tokens_out,
            ..Self::default()
        }
    }

    /// This usage with `cost_micros` of cost added.
    #[must_use]
    pub fn with_cost_micros(mut self, cost_micros: u64) -> Self {
        self.cost_micros = self.cost_micros.saturating_add(cost_micros);
        self
    }

    /// This usage with `calls` outside calls added.
    #[must_use]
    pub fn with_calls(mut self, calls: u64) -> Self {
        self.calls = self.calls.saturating_add(calls);
        self
    }

    /// Nothing used.
    pub fn is_zero(&self) -> bool {
        *self == Self::default()
    }

    /// What this usage has beyond `earlier` (none of a kind where it has less).
    pub(crate) fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            tokens_in: self.tokens_in.saturating_sub(earlier.tokens_in),
            tokens_out: self.tokens_out.saturating_sub(earlier.tokens_out),
            cost_micros: self.cost_micros.saturating_sub(earlier.cost_micros),
            calls: self.calls.saturating_sub(earlier.calls),
        }
    }
}

impl Add for Usage {
    type Output = Usage;

    fn add(self, o: Usage) -> Usage {
        Usage {
            tokens_in: self.tokens_in.saturating_add(o.tokens_in),
            tokens_out: self.tokens_out.saturating_add(o.tokens_out),
            cost_micros: self.cost_micros.saturating_add(o.cost_micros),
            calls: self.calls.saturating_add(o.calls),
        }
    }
}

impl AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        *self = *self + o;
    }
}

impl fmt::Display for Usage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} tokens in, {} out, cost {} µ, {} calls",
            self.tokens_in, self.tokens_out, self.cost_micros, self.calls
        )
    }
}

/// What a saga may spend: a limit per kind of [`Usage`], `None` for no limit. The
/// budget is spent once any kind reaches its limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// At most this many tokens in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_in: Option<u64>,
    /// At most this many tokens out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_out: Option<u64>,
    /// At most this cost, in micro-units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micros: Option<u64>,
    /// At most this many outside calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u64>,
}

impl Budget {
    /// No limit yet: add them with the builder methods.
    pub fn new() -> Self {
        Self::default()
    }

    /// At most `n` tokens in.
    #[must_use]
    pub fn tokens_in(mut self, n: u64) -> Self {
        self.tokens_in = Some(n);
        self
    }

    /// At most `n` tokens out.
    #[must_use]
    pub fn tokens_out(mut self, n: u64) -> Self {
        self.tokens_out = Some(n);
        self
    }

    /// At most `n` micro-units of cost.
    #[must_use]
    pub fn cost_micros(mut self, n: u64) -> Self {
        self.cost_micros = Some(n);
        self
    }

    /// At most `n` outside calls.
    #[must_use]
    pub fn calls(mut self, n: u64) -> Self {
        self.calls = Some(n);
        self
    }

    /// No limit at all.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Why `used` spends this budget (each kind at or past its limit), or `None` if
    /// something is left of every limit.
    pub fn spent_by(&self, used: &Usage) -> Option<String> {
        let kinds = [
            ("tokens_in", self.tokens_in, used.tokens_in),
            ("tokens_out", self.tokens_out, used.tokens_out),
            ("cost_micros", self.cost_micros, used.cost_micros),
            ("calls", self.calls, used.calls),
        ];
        let spent: Vec<String> = kinds
            .into_iter()
            .filter_map(|(name, limit, used)| {
                limit
                    .filter(|l| used >= *l)
                    .map(|l| format!("{name} {used} of {l}"))
            })
            .collect();
        (!spent.is_empty()).then(|| spent.join(", "))
    }

    /// This budget with the limits `raise` sets replacing its own (the others kept).
    #[must_use]
    pub fn raised_by(self, raise: Budget) -> Budget {
        Budget {
            tokens_in: raise.tokens_in.or(self.tokens_in),
            tokens_out: raise.tokens_out.or(self.tokens_out),
            cost_micros: raise.cost_micros.or(self.cost_micros),
            calls: raise.calls.or(self.calls),
        }
    }
}

/// What a saga does once its budget is spent (it dispatches no further forward step
/// either way).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBudgetSpent {
    /// Compensate what it did, as a failed step would. A saga past its pivot cannot:
    /// it waits, as with [`Wait`](Self::Wait).
    #[default]
    Compensate,
    /// Wait for a person to raise the budget (`Engine::raise_budget`, `agentsaga sagas
    /// raise-budget`, the console's API); then go on where it stopped.
    Wait,
}

/// A saga's budget as `saga_instances.budget` stores it (JSON): the limits, what to do
/// once they are spent, and the forward dispatches held back meanwhile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BudgetRecord {
    pub(crate) limit: Budget,
    pub(crate) on_spent: OnBudgetSpent,
    #[serde(default, skip_serializing_if = "Held::is_empty")]
    pub(crate) held: Held,
    /// Steps of the current stage not sent yet: what the steps on their way are
    /// expected to use left no room for them. They go as answers leave room.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) pending: Vec<usize>,
}

/// The forward dispatches a spent budget held back: the next stage, and steps whose
/// retry was due.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Held {
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) next_stage: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) steps: Vec<usize>,
}

impl Held {
    pub(crate) fn is_empty(&self) -> bool {
        !self.next_stage && self.steps.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spent_at_the_limit_and_says_which() {
        let b = Budget::new().tokens_out(100).calls(3);
        assert_eq!(b.spent_by(&Usage::tokens(500, 99).with_calls(2)), None);
        assert_eq!(
            b.spent_by(&Usage::tokens(0, 100)).as_deref(),
            Some("tokens_out 100 of 100")
        );
        assert_eq!(
            b.spent_by(&Usage::tokens(0, 120).with_calls(3)).as_deref(),
            Some("tokens_out 120 of 100, calls 3 of 3")
        );
        assert_eq!(Budget::new().spent_by(&Usage::tokens(u64::MAX, 1)), None);
    }

    #[test]
    fn a_raise_replaces_the_limits_it_names() {
        let b = Budget::new().tokens_out(100).calls(3);
        assert_eq!(
            b.raised_by(Budget::new().tokens_out(500)),
            Budget::new().tokens_out(500).calls(3)
        );
    }

    #[test]
    fn usage_adds_without_overflow_and_reads_strictly() {
        let u = Usage::tokens(u64::MAX, 1) + Usage::tokens(5, 2).with_cost_micros(7);
        assert_eq!(u, Usage::tokens(u64::MAX, 3).with_cost_micros(7));
        let wire: Usage = serde_json::from_str(r#"{"tokens_out":3}"#).unwrap();
        assert_eq!(wire, Usage::tokens(0, 3));
        assert!(serde_json::from_str::<Usage>(r#"{"tokens":3}"#).is_err());
        assert!(serde_json::from_str::<Usage>(r#"{"calls":-1}"#).is_err());
        assert_eq!(serde_json::to_string(&Usage::default()).unwrap(), "{}");
    }
}
