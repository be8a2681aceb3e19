//! What a saga used and may use, as words: the lines `sagas show` prints and the page
//! shows (the JSON documents carry [`Spending`] as it is).

use agentsaga_saga::query::Spending;
use agentsaga_saga::{Budget, OnBudgetSpent, Usage};

/// The kinds of a usage or a budget: their names (as the API's fields), their
/// `sagas raise-budget` flags, the usage and the limit of each.
fn kinds(usage: &Usage, budget: &Budget) -> [(&'static str, &'static str, u64, Option<u64>); 4] {
    [
        (
            "tokens_in",
            "--tokens-in",
            usage.tokens_in,
            budget.tokens_in,
        ),
        (
            "tokens_out",
            "--tokens-out",
            usage.tokens_out,
            budget.tokens_out,
        ),
        (
            "cost_micros",
            "--cost-micros",
            usage.cost_micros,
            budget.cost_micros,
        ),
        ("calls", "--calls", usage.calls, budget.calls),
    ]
}

/// `tokens_in 30, tokens_out 100`: the kinds used, `none` for nothing.
pub fn usage_text(usage: &Usage) -> String {
    let used: Vec<String> = kinds(usage, &Budget::new())
        .iter()
        .filter(|k| k.2 > 0)
        .map(|(name, _, n, _)| format!("{name} {n}"))
        .collect();
    if used.is_empty() {
        "none".to_owned()
    } else {
        used.join(", ")
    }
}

/// `at most tokens_out 100; once spent, wait for a raise`: a budget's limits and what
/// the saga does once they are spent.
pub fn budget_text(budget: &Budget, on_spent: Option<OnBudgetSpent>) -> String {
    let limits: Vec<String> = kinds(&Usage::default(), budget)
        .iter()
        .filter_map(|(name, _, _, limit)| limit.map(|l| format!("{name} {l}")))
        .collect();
    let then = match on_spent {
        Some(OnBudgetSpent::Wait) => "wait for a raise",
        _ => "compensate",
    };
    if limits.is_empty() {
        format!("no limit; once spent, {then}")
    } else {
        format!("at most {}; once spent, {then}", limits.join(", "))
    }
}

/// The command that raises saga `id`'s spent limits: `agentsaga sagas raise-budget ID
/// --tokens-out N` (a flag for each kind at or past its limit).
pub fn raise_command(id: &str, spending: &Spending) -> String {
    let budget = spending.budget.unwrap_or_default();
    let mut command = format!("agentsaga sagas raise-budget {id}");
    for (_, flag, used, limit) in kinds(&spending.usage, &budget) {
        if limit.is_some_and(|l| used >= l) {
            command += &format!(" {flag} N");
        }
    }
    command
}

/// Why the saga is held, for a person, if it waits for a raise: `spent: tokens_out 100
/// of 100, waiting for a raise: `agentsaga sagas raise-budget ID --tokens-out N``.
pub fn waiting_text(id: &str, spending: &Spending) -> Option<String> {
    if !spending.waiting_for_raise {
        return None;
    }
    Some(match &spending.spent {
        Some(spent) => format!(
            "spent: {spent}, waiting for a raise: `{}` (or POST /api/v1/sagas/{id}/budget)",
            raise_command(id, spending)
        ),
        None => "raised: the steps held back go out once the saga's runtime picks it up".to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words() {
        assert_eq!(usage_text(&Usage::default()), "none");
        assert_eq!(
            usage_text(&Usage::tokens(30, 100).with_calls(2)),
            "tokens_in 30, tokens_out 100, calls 2"
        );
        let budget = Budget::new().tokens_out(100).calls(5);
        assert_eq!(
            budget_text(&budget, Some(OnBudgetSpent::Wait)),
            "at most tokens_out 100, calls 5; once spent, wait for a raise"
        );
        let mut spending = Spending {
            usage: Usage::tokens(30, 100),
            budget: Some(budget),
            on_spent: Some(OnBudgetSpent::Wait),
            spent: budget.spent_by(&Usage::tokens(30, 100)),
            waiting_for_raise: false,
        };
        assert_eq!(waiting_text("x", &spending), None);
        spending.waiting_for_raise = true;
        assert_eq!(
            waiting_text("x", &spending).unwrap(),
            "spent: tokens_out 100 of 100, waiting for a raise: \
             `agentsaga sagas raise-budget x --tokens-out N` (or POST /api/v1/sagas/x/budget)"
        );
        spending.spent = None;
        assert!(waiting_text("x", &spending).unwrap().starts_with("raised"));
    }
}
