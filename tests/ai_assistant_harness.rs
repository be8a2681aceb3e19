//! The ai_assistant example (`examples/ai_assistant/`: its planned saga that re-plans
//! in three LLM turns, may delegate to child sagas, waits for a person's approval and
//! for the company's reply, its LLM and database agents) on
//! `agentsaga::testing::TestRuntime`, in one process, against the example's LLM stub
//! answering at once: random faults from seeds, the approval given as the person would,
//! the two-hour wait for a reply skipped by the clock. Each run is checked against the
//! promises (children included) and against the example's tables. The runs of the
//! example as a process, `kill -9` included, stay in `tests/ai_assistant/`.

// The example's modules, as its `main.rs` declares them; what this test does not call
// of them is the example's.
#![allow(dead_code, unused_imports)]

#[path = "../examples/ai_assistant/agents.rs"]
mod agents;
#[path = "../examples/ai_assistant/data.rs"]
mod data;
#[path = "../examples/ai_assistant/llm.rs"]
mod llm;
#[path = "../examples/support/llm_stub.rs"]
mod llm_stub;
#[path = "../examples/ai_assistant/planner.rs"]
mod planner;
#[path = "../examples/ai_assistant/rules.rs"]
mod rules;
#[path = "../examples/ai_assistant/setup.rs"]
mod setup;
#[path = "../examples/support/mod.rs"]
mod support;

use agents::*;
use data::*;
use llm::*;
use planner::*;
use rules::*;
use setup::*;

use std::sync::Arc;
use std::time::Duration;

use agentsaga::core::Sql;
use agentsaga::prelude::*;
use agentsaga::runtime::RuntimeBuilder;
use agentsaga::saga::query::{self, ListFilter};
use agentsaga::saga::{PlanStage, SagaDefinition, SagaId};
use agentsaga_runtime::testing::{self, SEED_VAR, TestRuntime};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// How long a plan waits for the company's reply: hours of clock, no real time.
const FOLLOW_UP_AFTER: &str = "2h";

async fn stub(seed: u64) -> llm_stub::Stub {
    llm_stub::start(llm_stub::Config {
        seed,
        fail_rate: 0.0,
        mode: llm_stub::Mode::Normal,
        only_step: None,
        store: None,
        requests_per_minute: None,
        follow_up_after: Some(FOLLOW_UP_AFTER.into()),
        instant: true,
    })
    .await
    .expect("the LLM stub")
}

fn runtime(stub: &llm_stub::Stub, seed: u64) -> RuntimeBuilder {
    let step_timeout = Duration::from_secs(20);
    let llm = Arc::new(
        Llm::new(
            &stub.base_url,
            Some(llm_stub::API_KEY.into()),
            "gpt-4o-mini".into(),
            step_timeout * 3 / 4,
            true,
        )
        .expect("the LLM client"),
    );
    let settings = Settings {
        step_timeout,
        budget_tokens_out: 20_000,
        follow_up_after: FOLLOW_UP_AFTER.into(),
        llm_rpm: 12_000,
        seed,
        fail_rate: 0.0,
    };
    assistant(Runtime::builder(), &llm, &settings).expect("the assistant")
}

/// Saga `id`'s row in `table`: its status, if any.
async fn status(store: &Store, table: &str, id: SagaId) -> Option<String> {
    Sql::new(format!("SELECT status FROM {table} WHERE saga_id = ?"))
        .bind(id.to_string())
        .fetch_optional(store.reader())
        .await
        .expect("the example's table")
        .map(|r| r.text("status").expect("a status"))
}

/// What the example's tables must say of a request that ended `state`: a completed
/// one researched, drafted, sent its email, recorded the contact and followed up (no
/// reply comes in this test: it drafted the follow-up); a compensated one sent
/// nothing and left no draft, slot or follow-up in force; a stuck one (a fatal error
/// after the email) sent its email.
async fn tables_agree(store: &Store, id: SagaId, state: SagaState) -> Result<(), String> {
    let mut rows = Vec::new();
    for table in [
        "assistant_research",
        "assistant_drafts",
        "assistant_calendar_slots",
        "assistant_emails",
        "assistant_crm_records",
        "assistant_follow_ups",
    ] {
        rows.push((table, status(store, table, id).await));
    }
    let of = |t: &str| {
        rows.iter()
            .find(|(table, _)| *table == t)
            .and_then(|(_, s)| s.as_deref())
    };
    let ok = match state {
        SagaState::Completed => {
            of("assistant_research") == Some("done")
                && of("assistant_drafts") == Some("drafted")
                && of("assistant_emails") == Some("sent")
                && of("assistant_crm_records") == Some("created")
                && of("assistant_follow_ups") == Some("drafted")
                && of("assistant_calendar_slots").is_none_or(|s| s == "reserved")
        }
        SagaState::Compensated => {
            of("assistant_emails").is_none()
                && of("assistant_crm_records").is_none()
                && of("assistant_follow_ups").is_none()
                && of("assistant_drafts") != Some("drafted")
                && of("assistant_calendar_slots") != Some("reserved")
        }
        SagaState::Stuck => of("assistant_emails") == Some("sent"),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("a {} request left {rows:?}", state.as_str()))
    }
}

/// Runs request `id` to its end, approving its email as the person would whenever it
/// waits for the approval.
async fn run(t: &TestRuntime, id: SagaId) -> agentsaga::runtime::Result<SagaState> {
    for _ in 0..4 {
        let state = t.run_to_end(id).await?;
        let waits = query::get(t.store(), id).await?.and_then(|s| s.waiting_for);
        if state != SagaState::Running || waits.as_deref() != Some(APPROVAL) {
            return Ok(state);
        }
        t.signal(id, APPROVAL, Signal::Approve(json!({ "by": "a test" })))
            .await?;
    }
    t.state(id).await
}

// 12 requests, each under random faults from its seed (a tenth of the deliveries):
// planned by the LLM in three turns, sometimes delegating to child sagas, approved,
// waiting two hours (of clock) for a reply that does not come, following up. Each keeps
// every promise, children included, and the example's tables agree with how it ended.
#[tokio::test]
async fn requests_under_random_faults_keep_their_promises() {
    let seeds = testing::seeds(0..12).unwrap();
    let (mut completed, mut compensated, mut children) = (0, 0, 0);
    for seed in seeds {
        let stub = stub(seed).await;
        let t = TestRuntime::start(runtime(&stub, seed)).await.unwrap();
        support::create_tables(t.store(), DDL).await.unwrap();
        t.random_faults(seed, 0.1);
        let input = Input {
            company: format!("Acme #{seed}"),
        };
        let id = t.start_saga("ai_assistant", &input).await.unwrap();
        let rerun = format!("seed {seed} (run it alone with {SEED_VAR}={seed})");
        let state = run(&t, id).await.unwrap_or_else(|e| panic!("{rerun}: {e}"));
        let all = query::list(
            t.store(),
            &ListFilter {
                limit: 100,
                ..ListFilter::default()
            },
        )
        .await
        .unwrap();
        for saga in &all {
            t.check_promises(saga.id)
                .await
                .unwrap_or_else(|e| panic!("{rerun}: {e}"));
        }
        tables_agree(t.store(), id, state)
            .await
            .unwrap_or_else(|e| panic!("{rerun}, faults {:?}: {e}", t.faults_drawn()));
        children += all.len() - 1;
        match state {
            SagaState::Completed => completed += 1,
            SagaState::Compensated => compensated += 1,
            _ => {}
        }
        t.shutdown().await;
    }
    eprintln!("{completed} completed, {compensated} compensated, {children} child sagas");
    if std::env::var(SEED_VAR).is_err() {
        assert!(completed > 0 && compensated > 0, "both ends reached");
    }
}

// The email refused for good (its pivot): the request turns back, and the draft (and
// the calendar slot, if the plan reserved one) are undone by the ids their steps
// answered; nothing is sent. Then the same request with the email sent: completed.
#[tokio::test]
async fn a_refused_email_undoes_the_draft() {
    for (refused, want) in [
        (true, SagaState::Compensated),
        (false, SagaState::Completed),
    ] {
        let stub = stub(1).await;
        let t = TestRuntime::start(runtime(&stub, 1)).await.unwrap();
        support::create_tables(t.store(), DDL).await.unwrap();
        if refused {
            t.fail_next(
                EMAIL,
                1,
                &agentsaga_runtime::testing::Fault::Fatal("bounced".into()),
            );
        }
        let input = Input {
            company: "Initech".into(),
        };
        let id = t.start_saga("ai_assistant", &input).await.unwrap();
        assert_eq!(run(&t, id).await.unwrap(), want);
        t.check_promises(id).await.unwrap();
        tables_agree(t.store(), id, want).await.unwrap();
        if refused {
            let draft = status(t.store(), "assistant_drafts", id).await;
            assert_eq!(draft.as_deref(), Some("discarded"), "drafted, then undone");
        }
        t.shutdown().await;
    }
}
