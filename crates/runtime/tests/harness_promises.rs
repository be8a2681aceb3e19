//! `testing::TestRuntime` for what a saga promises: its ledger as it happened, the
//! promises of `docs/guarantees.md` checked under random faults from seeds, and an
//! LLM's calls recorded once and replayed without the call.

#[path = "support/echo.rs"]
mod echo;
#[path = "support/under_test.rs"]
mod under_test;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentsaga_core::RetryPolicy;
use agentsaga_core::testing::{Backend, fresh_url};
use agentsaga_runtime::testing::{Action, Entry, Fault, RandomFaults, Recording, TestRuntime};
use agentsaga_runtime::{AgentContext, CallContext, CallingAgent, Error, Runtime, StepError};
use agentsaga_saga::{Saga, SagaDefinition, SagaState, Step, Usage, query};
use echo::Echo;
use serde_json::{Value, json};

const MINUTE: Duration = Duration::from_secs(60);

/// Flights and a hotel, booked side by side, a car, then the charge (the pivot), then
/// the confirmation: each booking undone by its cancellation.
fn holiday() -> SagaDefinition {
    let retry = RetryPolicy::new(MINUTE, 10 * MINUTE, 4);
    let undo = |dest: &'static str| {
        Step::new(dest, dest)
            .compensate(dest, |_: &Value| json!({ "cancel": true }))
            .timeout(30 * MINUTE)
            .retry(retry)
    };
    Saga::<Value>::builder("holiday", 1)
        .parallel([undo("flights"), undo("hotel")])
        .step(undo("car"))
        .pivot(
            Step::new("charge", "payments")
                .timeout(30 * MINUTE)
                .retry(retry),
        )
        .step(Step::new("confirm", "mailer").retry(retry))
        .build()
        .unwrap()
}

fn holiday_runtime() -> agentsaga_runtime::RuntimeBuilder {
    ["flights", "hotel", "car", "payments", "mailer"]
        .into_iter()
        .fold(Runtime::builder(), |b, d| b.agent(Echo(d)))
        .saga(holiday())
}

fn entry(idx: usize, step: &str, action: Action) -> Entry {
    Entry {
        idx,
        step: step.into(),
        destination: step.into(),
        action,
    }
}

// The ledger shows what took effect, in the order it committed: declined at the pivot,
// the car is undone before the flights and the hotel (a later stage first); faulted
// deliveries took no effect and are not in it.
async fn the_ledger_shows_what_took_effect_in_order(backend: Backend) {
    let t = under_test::start(backend, holiday_runtime()).await;
    t.fail_next("car", 1, &Fault::Retryable("busy".into()));
    t.fail_next("payments", 1, &Fault::Fatal("card declined".into()));
    let id = t.start_saga("holiday", &json!({})).await.unwrap();
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Compensated);

    let ledger = t.ledger(id);
    let (first, rest) = ledger.split_at(2);
    let mut first = first.to_vec();
    first.sort_by_key(|e| e.idx); // one stage: either may commit first
    assert_eq!(
        first,
        [
            entry(0, "flights", Action::Done),
            entry(1, "hotel", Action::Done)
        ]
    );
    assert_eq!(rest[0], entry(2, "car", Action::Done));
    assert_eq!(rest[1], entry(2, "car", Action::Undone), "{ledger:#?}");
    let mut last: Vec<Entry> = rest[2..].to_vec();
    last.sort_by_key(|e| e.idx);
    // The charge (the step that failed) is compensated too: its outcome may be
    // unknown; it declared no compensation of its own here, so nothing is sent.
    assert_eq!(
        last,
        [
            entry(0, "flights", Action::Undone),
            entry(1, "hotel", Action::Undone)
        ]
    );
    assert_eq!(
        t.effects("car"),
        2,
        "booked once (after a busy try), cancelled once"
    );
    assert_eq!(
        t.calls("car").await.unwrap(),
        3,
        "the busy try is a message handled"
    );
    assert_eq!(t.effects("payments"), 0);
    t.check_promises(id).await.unwrap();
    // One saga, one trace: rooted at its start, an agent's span for every delivery
    // that reached an agent (the faulted ones do not).
    let trace = t.trace(id).unwrap();
    assert_eq!(trace.roots(), ["saga.start"], "{:?}", trace.spans());
    assert_eq!(trace.count("saga.start"), 1);
    assert!(
        trace.count("agent.handle") >= ledger.len(),
        "{:?}",
        trace.spans()
    );
    t.shutdown().await;
}

// Random faults of every kind, drawn from 40 seeds, on a saga with a parallel stage,
// a pivot and a step after it: every run ends and keeps every promise, and the faults
// did bite (both ends reached, each kind drawn). A failing seed is named in the error
// with how to run it alone (`AGENTSAGA_SEED=N`).
async fn random_faults_keep_every_promise(backend: Backend) {
    let report = RandomFaults::new(0..40)
        .rate(0.25)
        .check_on(
            async || fresh_url(backend).await,
            holiday_runtime,
            "holiday",
            &json!({}),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{report}");
    if std::env::var(agentsaga_runtime::testing::SEED_VAR).is_err() {
        assert_eq!(report.runs, 40);
        assert!(report.ended("completed") > 0, "{report}");
        assert!(report.ended("compensated") > 0, "{report}");
        for kind in ["retryable", "fatal", "timed out", "dead letter", "twice"] {
            assert!(report.drawn(kind) > 0, "no {kind} fault drawn: {report}");
        }
    }
}

// One seed draws the same faults again: two runs of a seed take the same path.
#[tokio::test]
async fn a_seed_replays_its_faults() {
    let mut paths = Vec::new();
    for _ in 0..2 {
        let t = TestRuntime::start(holiday_runtime()).await.unwrap();
        t.random_faults(7, 0.3);
        let id = t.start_saga("holiday", &json!({})).await.unwrap();
        let end = t.run_to_end(id).await.unwrap();
        let mut ledger = t.ledger(id);
        // Within a stage the two bookings may commit in either order.
        ledger.sort_by_key(|e| (e.action == Action::Undone, e.idx));
        paths.push((end, ledger, t.faults_drawn()));
        t.shutdown().await;
    }
    assert!(!paths[0].2.is_empty(), "seed 7 draws faults: {paths:?}");
    assert_eq!(paths[0], paths[1]);
}

/// An LLM that drafts a reply to a question: busy on its first call when asked to be,
/// counting the calls it answers.
struct Llm {
    calls: Arc<AtomicUsize>,
    busy_first: bool,
}

#[async_trait::async_trait]
impl CallingAgent for Llm {
    type Command = Value;
    type Output = String;
    type Reply = Value;
    fn destination(&self) -> &str {
        "llm"
    }
    async fn call(&self, ctx: &CallContext<'_>, command: &Value) -> Result<String, StepError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 && self.busy_first {
            return Err(StepError::retryable("overloaded"));
        }
        ctx.report_usage(Usage {
            tokens_out: 42,
            ..Usage::default()
        });
        Ok(format!("A draft about {}", command["topic"]))
    }
    async fn record(
        &self,
        _: &mut AgentContext<'_>,
        _: Value,
        draft: String,
    ) -> Result<Value, StepError> {
        Ok(json!({ "draft": draft }))
    }
}

fn drafting() -> SagaDefinition {
    Saga::<Value>::builder("draft", 1)
        .pivot(
            Step::new("write", "llm")
                .command(|d: &Value| json!({ "topic": d["topic"] }))
                .on_reply(|d: &mut Value, r: Value| d["draft"] = r["draft"].clone())
                .retry(RetryPolicy::new(MINUTE, MINUTE, 3)),
        )
        .build()
        .unwrap()
}

/// The saga's data once drafted, and the tokens its steps reported.
async fn drafted(recording: &Recording, llm: Llm, topic: &str) -> Result<(Value, u64), Error> {
    let builder = Runtime::builder()
        .calling_agent(recording.wrap(llm))
        .saga(drafting());
    let t = TestRuntime::start(builder).await?;
    let id = t.start_saga("draft", &json!({ "topic": topic })).await?;
    let end = t.run_to_end(id).await;
    let data = query::data(t.store(), id).await?;
    let spent = query::spending(t.store(), id)
        .await?
        .map(|s| s.usage.tokens_out);
    t.shutdown().await;
    assert_eq!(end?, SagaState::Completed);
    Ok((data.unwrap_or_default(), spent.unwrap_or_default()))
}

// Recorded once for real (busy, then a draft), replayed without the call: the same
// path (a retry after the recorded error) and the same draft. A call the recording
// does not hold is an error naming the step and the file, not a live call.
#[tokio::test]
async fn an_llm_answers_once_and_is_replayed() {
    let dir = tempfile_dir();
    let file = dir.join("recordings/draft.json");
    let live = Arc::new(AtomicUsize::new(0));
    let recording = Recording::record(&file);
    let llm = Llm {
        calls: Arc::clone(&live),
        busy_first: true,
    };
    let (data, tokens) = drafted(&recording, llm, "tides").await.unwrap();
    assert_eq!(tokens, 42);
    assert_eq!(data["draft"], "A draft about \"tides\"");
    assert_eq!(live.load(Ordering::SeqCst), 2, "busy, then the draft");
    assert_eq!(
        Recording::replay(&file).unwrap().keys(),
        ["llm:write:command"]
    );

    let replayed = Arc::new(AtomicUsize::new(0));
    let offline = || Llm {
        calls: Arc::clone(&replayed),
        busy_first: false,
    };
    let recording = Recording::replay(&file).unwrap();
    let (data, tokens) = drafted(&recording, offline(), "tides").await.unwrap();
    assert_eq!(tokens, 42, "the recorded usage counts again, for budgets");
    assert_eq!(data["draft"], "A draft about \"tides\"");
    assert_eq!(
        replayed.load(Ordering::SeqCst),
        0,
        "no live call in a replay"
    );

    let recording = Recording::replay(&file).unwrap();
    let err = drafted(&recording, offline(), "storms").await.unwrap_err();
    let Error::NotRecorded(why) = &err else {
        panic!("expected NotRecorded, got {err}");
    };
    assert!(
        why.contains("step `write`") && why.contains("draft.json"),
        "{why}"
    );
    assert!(why.contains("AGENTSAGA_RECORD=1"), "{why}");
    assert_eq!(
        replayed.load(Ordering::SeqCst),
        0,
        "no live call for a miss either"
    );
    let _ = std::fs::remove_dir_all(dir);
}

// A recording that is not one (truncated, hand-edited, another file) or cannot be read
// is a typed error naming the file, not a panic and not an empty recording that would
// fail later, step by step, or call the LLM live.
#[test]
fn a_broken_recording_is_refused_by_name() {
    let dir = tempfile_dir();
    let corrupt = dir.join("llm.json");
    std::fs::write(&corrupt, "{\"calls\": [ {\"key\": \"draft:0:command\"").unwrap();
    let err = Recording::replay(&corrupt).unwrap_err();
    assert!(
        matches!(&err, Error::NotRecorded(why)
            if why.contains("llm.json") && why.contains("is not a recording")),
        "{err}"
    );
    std::fs::write(&corrupt, "[1, 2, 3]").unwrap();
    let err = Recording::replay(&corrupt).unwrap_err();
    assert!(
        matches!(&err, Error::NotRecorded(why) if why.contains("is not a recording")),
        "{err}"
    );
    // A directory where the file should be: cannot be read.
    let err = Recording::replay(&dir).unwrap_err();
    assert!(
        matches!(&err, Error::NotRecorded(why) if why.contains("cannot be read")),
        "{err}"
    );
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "agentsaga-recording-{}-{}",
        std::process::id(),
        agentsaga_saga::SagaId::new()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn renewal_runtime() -> agentsaga_runtime::RuntimeBuilder {
    let renewal = Saga::<Value>::builder("renewal", 1)
        .step(Step::new("remind", "mailer").nothing_to_undo())
        .step(Step::sleep("grace", Duration::from_secs(3 * 86_400)))
        .pivot(Step::new("charge", "payments").retry(RetryPolicy::new(MINUTE, MINUTE, 3)))
        .build()
        .unwrap();
    Runtime::builder()
        .agent(Echo("mailer"))
        .agent(Echo("payments"))
        .saga(renewal)
}

// A saga asleep for three days when its runtime restarts (a deploy): the next runtime,
// on the same database and clock, wakes it on time and finishes it; the fault queued
// before the restart and the ledger carry over.
async fn a_sleeping_saga_survives_a_restart(backend: Backend) {
    let t = under_test::start(backend, renewal_runtime()).await;
    let id = t.start_saga("renewal", &json!({})).await.unwrap();
    t.run_until_idle().await.unwrap();
    let asleep = query::get(t.store(), id).await.unwrap().unwrap();
    let wakes = asleep.sleeping_until_ms.expect("asleep after the reminder");
    t.fail_next("payments", 1, &Fault::Retryable("busy".into()));

    let t = t.restart(renewal_runtime()).await.unwrap();
    t.advance(Duration::from_secs(86_400)).await.unwrap();
    assert_eq!(
        t.state(id).await.unwrap(),
        SagaState::Running,
        "still asleep"
    );
    assert_eq!(t.effects("payments"), 0);
    assert_eq!(t.run_to_end(id).await.unwrap(), SagaState::Completed);
    assert!(t.now_ms() >= wakes, "woken at its time, not before");
    assert_eq!(
        t.calls("payments").await.unwrap(),
        2,
        "busy (the fault), then charged"
    );
    let steps: Vec<String> = t.ledger(id).into_iter().map(|e| e.step).collect();
    assert_eq!(steps, ["remind", "charge"], "the ledger across the restart");
    t.check_promises(id).await.unwrap();
    t.shutdown().await;
}

agentsaga_core::both_backends!(
    the_ledger_shows_what_took_effect_in_order,
    the_ledger_shows_what_took_effect_in_order
);
agentsaga_core::both_backends!(
    random_faults_keep_every_promise,
    random_faults_keep_every_promise
);
agentsaga_core::both_backends!(
    a_sleeping_saga_survives_a_restart,
    a_sleeping_saga_survives_a_restart
);
