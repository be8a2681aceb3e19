//! What agents report they used (`CallContext::report_usage`) travels with their
//! reply and is recorded with its step and its saga; a spent budget stops the saga.

use agentsaga_saga::{Budget, OnBudgetSpent, Usage};

use super::*;

/// An LLM-like calling agent: its call reports `tokens`, its record a cost; it fails
/// fatally (after using its tokens) when the command says so.
struct Llm {
    destination: &'static str,
    tokens: Usage,
}

#[async_trait::async_trait]
impl CallingAgent for Llm {
    type Command = Value;
    type Output = ();
    type Reply = &'static str;

    fn destination(&self) -> &str {
        self.destination
    }

    async fn call(&self, ctx: &CallContext<'_>, command: &Value) -> Result<(), StepError> {
        ctx.report_usage(self.tokens);
        if command["fail"] == json!(true) && !ctx.is_compensation() {
            return Err(StepError::fatal("the model refused"));
        }
        Ok(())
    }

    async fn record(
        &self,
        ctx: &mut AgentContext<'_>,
        _: Value,
        (): (),
    ) -> Result<&'static str, StepError> {
        ctx.report_usage(Usage::default().with_cost_micros(5));
        Ok("written")
    }
}

/// A database agent that reports a model call it made itself.
struct Local;

#[async_trait::async_trait]
impl Agent for Local {
    type Command = Value;
    type Reply = ();

    fn destination(&self) -> &str {
        "local"
    }

    async fn handle(&self, ctx: &mut AgentContext<'_>, _: Value) -> Result<(), StepError> {
        ctx.report_usage(Usage::tokens(1, 2).with_calls(1));
        Ok(())
    }
}

fn llm_step(name: &str, fail: bool) -> Step<Value, Undoable> {
    Step::<Value>::new(name, "llm")
        .command(move |_: &Value| json!({ "fail": fail }))
        .compensate("llm", |_: &Value| json!({ "undo": true }))
}

async fn runtime(backend: Backend, sagas: Vec<SagaDefinition>) -> Runtime {
    let mut b = builder(backend)
        .await
        .calling_agent(Llm {
            destination: "llm",
            tokens: Usage::tokens(100, 20),
        })
        .agent(Local);
    for s in sagas {
        b = b.saga(s);
    }
    b.start().await.unwrap()
}

// Each step's usage is what its agent reported (a calling agent's `call` and `record`
// add up, with one outside call counted by itself); the saga's is their sum; a call
// that failed counts, and so does its compensation.
async fn usage_travels_with_replies(backend: Backend) {
    let ok = Saga::<Value>::builder("spends", 1)
        .step(llm_step("ask", false))
        .step(
            Step::<Value>::new("store", "local")
                .command(|_: &Value| json!({}))
                .nothing_to_undo(),
        )
        .build()
        .unwrap();
    let failing = Saga::<Value>::builder("refused", 1)
        .step(llm_step("ask", false))
        .step(llm_step("again", true))
        .build()
        .unwrap();
    let rt = runtime(backend, vec![ok, failing]).await;
    let id = rt.start_saga("spends", &json!({})).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Completed);
    let ask = Usage::tokens(100, 20).with_cost_micros(5).with_calls(1);
    let store = Usage::tokens(1, 2).with_calls(1);
    let steps = query::steps(rt.store(), id).await.unwrap();
    assert_eq!(
        steps.iter().map(|s| s.usage).collect::<Vec<_>>(),
        [ask, store]
    );
    let spent = query::spending(rt.store(), id).await.unwrap().unwrap();
    assert_eq!(spent.usage, ask + store);
    assert_eq!(spent.budget, None);

    let id = rt.start_saga("refused", &json!({})).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Compensated);
    let refused = Usage::tokens(100, 20).with_calls(1); // no record: no cost
    let steps = query::steps(rt.store(), id).await.unwrap();
    // Both steps are undone (a failed step too: it may have done part of its work),
    // each undo one more call with its record's cost.
    assert_eq!(steps[0].usage, ask + ask);
    assert_eq!(steps[1].usage, refused + ask);
    let spent = query::spending(rt.store(), id).await.unwrap().unwrap();
    assert_eq!(spent.usage, ask + ask + refused + ask);
    rt.shutdown().await;
}
both_backends!(usage_tests, usage_travels_with_replies);

// A budget of one outside call: after `first`, the budget is spent; `second` is never
// called and `first` is undone.
async fn a_spent_budget_stops_the_saga(backend: Backend) {
    let saga = Saga::<Value>::builder("capped", 1)
        .step(llm_step("first", false))
        .step(llm_step("second", false))
        .budget(Budget::new().calls(1), OnBudgetSpent::Compensate)
        .build()
        .unwrap();
    let rt = runtime(backend, vec![saga]).await;
    let id = rt.start_saga("capped", &json!({})).await.unwrap();
    assert_eq!(settle(&rt, id).await, SagaState::Compensated);
    let s = query::get(rt.store(), id).await.unwrap().unwrap();
    assert!(
        s.error
            .as_deref()
            .unwrap_or_default()
            .contains("budget spent: calls 1 of 1"),
        "{:?}",
        s.error
    );
    let steps = query::steps(rt.store(), id).await.unwrap();
    assert_eq!(steps.len(), 1, "`second` was never dispatched");
    rt.shutdown().await;
}
both_backends!(budget_tests, a_spent_budget_stops_the_saga);
