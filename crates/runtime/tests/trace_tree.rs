//! One saga, one trace: with an in-memory exporter, a saga whose second step fails
//! fatally (so the first is compensated) yields exactly one trace, whose spans form a
//! tree rooted at `saga.start` and cover every hop.

#[path = "support/echo.rs"]
mod echo;
#[path = "support/settle.rs"]
mod settle;

use std::collections::{HashMap, HashSet};

use agentsaga_core::testing::{Backend, backends, fresh_url, wait_until};
use agentsaga_runtime::{Agent, AgentContext, Runtime, StepError};
use agentsaga_saga::{Saga, SagaState, Step};
use echo::Echo;
use opentelemetry::trace::{SpanId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::{Value, json};
use settle::settle;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{Layer, util::SubscriberInitExt};

/// The hotels' agent: no rooms left (a fatal answer to every booking).
struct NoRooms;

#[async_trait::async_trait]
impl Agent for NoRooms {
    type Command = Value;
    type Reply = ();
    fn destination(&self) -> &str {
        "hotels"
    }
    async fn handle(&self, ctx: &mut AgentContext<'_>, _: Value) -> Result<(), StepError> {
        if ctx.is_compensation() {
            return Ok(());
        }
        Err(StepError::fatal("no rooms left"))
    }
}

/// The names of `spans` by span id, and the names of those whose parent is not among
/// them (the roots of their tree).
fn tree<'a>(spans: &[&'a SpanData]) -> (HashMap<SpanId, &'a str>, Vec<&'a str>) {
    let ids: HashMap<_, _> = spans
        .iter()
        .map(|s| (s.span_context.span_id(), s.name.as_ref()))
        .collect();
    let roots = spans
        .iter()
        .filter(|s| !ids.contains_key(&s.parent_span_id))
        .map(|s| s.name.as_ref())
        .collect();
    (ids, roots)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_saga_with_a_compensation_is_one_trace() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("test"))
        .with_filter(agentsaga_runtime::telemetry::export_filter());
    tracing_subscriber::registry().with(layer).init();
    agentsaga_runtime::telemetry::install_propagator();

    let saga = Saga::<Value>::builder("trip", 1)
        .step(
            Step::new("reserve_flight", "flights")
                .compensate("flights", |_: &Value| json!("cancel")),
        )
        .step(
            Step::new("reserve_hotel", "hotels").compensate("hotels", |_: &Value| json!("cancel")),
        )
        .build()
        .unwrap();
    // On PostgreSQL the replies are applied in the set lane, which writes the saga's
    // next messages at the end of its batch, in its own task: they still carry the
    // trace context of the hop that produced them.
    for &backend in backends() {
        exporter.reset();
        one_trace(backend, &exporter, &provider, saga.clone()).await;
    }

    // Sagas started in one batch (`start_sagas_in`: one statement for all their first
    // commands) are still one trace each, rooted at their saga.start, their commands
    // under an outbox.enqueue of their own.
    exporter.reset();
    let runtime = flights_and_hotels(backends()[0], saga).await;
    let mut tx = runtime.store().begin().await.unwrap();
    let batch = runtime
        .start_sagas_in(
            &mut tx,
            "trip",
            &[json!({"who": "bo"}), json!({"who": "cy"})],
        )
        .await
        .unwrap();
    tx.commit().await.unwrap();
    for id in &batch {
        assert_eq!(settle(&runtime, *id).await, SagaState::Compensated);
    }
    runtime.shutdown().await;
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    for id in &batch {
        let saga_id = id.to_string();
        let of_saga: Vec<_> = spans
            .iter()
            .filter(|s| {
                s.attributes
                    .iter()
                    .any(|kv| kv.key.as_str() == "saga.id" && kv.value.as_str() == saga_id.as_str())
            })
            .collect();
        let traces: HashSet<_> = of_saga.iter().map(|s| s.span_context.trace_id()).collect();
        let names: Vec<&str> = of_saga.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(traces.len(), 1, "saga {saga_id}: {names:?}");
        let trace = traces.into_iter().next().unwrap();
        let in_trace: Vec<_> = spans
            .iter()
            .filter(|s| s.span_context.trace_id() == trace)
            .collect();
        let (ids, roots) = tree(&in_trace);
        assert_eq!(roots, vec!["saga.start"], "saga {saga_id}: {names:?}");
        let delivered: Vec<&str> = in_trace
            .iter()
            .filter(|s| s.name == "relay.deliver")
            .map(|s| ids.get(&s.parent_span_id).copied().unwrap_or("?"))
            .collect();
        assert_eq!(delivered.len(), 4, "saga {saga_id}: {names:?}");
        assert!(
            delivered.iter().all(|p| *p == "outbox.enqueue"),
            "{delivered:?}"
        );
    }

    // A child saga's spans are in its parent's trace: one trace per root saga.
    for &backend in backends() {
        exporter.reset();
        child_in_its_parents_trace(backend, &exporter, &provider).await;
    }

    for &backend in backends() {
        exporter.reset();
        a_signal_continues_the_trace(backend, &exporter, &provider).await;
    }

    exporter.reset();
    firings_are_a_trace_each(&exporter, &provider).await;
}

/// A saga parked at a wait for a person, approved from outside any span (as the CLI
/// sends a signal): the steps after the approval are in the saga's trace, one tree
/// rooted at its `saga.start`. (Before the saga kept its trace context, the signal's
/// hop began a trace of its own.)
async fn a_signal_continues_the_trace(
    backend: Backend,
    exporter: &InMemorySpanExporter,
    provider: &SdkTracerProvider,
) {
    let saga = Saga::<Value>::builder("approved", 1)
        .step(Step::approval("manager"))
        .pivot(Step::new("book", "flights"))
        .build()
        .unwrap();
    let runtime = flights_and_hotels(backend, saga).await;
    let id = runtime.start_saga("approved", &json!({})).await.unwrap();
    wait_until(
        "the saga waits",
        std::time::Duration::from_secs(30),
        async || {
            agentsaga_saga::query::get(runtime.store(), id)
                .await
                .unwrap()
                .and_then(|s| s.waiting_for)
                .is_some()
        },
    )
    .await;
    let signal = agentsaga_saga::Signal::Approve(json!("ok"));
    // Sent on a thread of its own, outside every span of this test's subscriber.
    let sent = {
        let store = runtime.store().clone();
        std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    let mut tx = store.begin().await.unwrap();
                    agentsaga_saga::Engine::signal(&mut tx, id, "manager", signal)
                        .await
                        .unwrap();
                    tx.commit().await.unwrap();
                })
        })
    };
    sent.join().unwrap();
    assert_eq!(settle(&runtime, id).await, SagaState::Completed);
    runtime.shutdown().await;
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let ours = ours(&spans);
    let names: Vec<&str> = ours.iter().map(|s| s.name.as_ref()).collect();
    let traces: HashSet<_> = ours.iter().map(|s| s.span_context.trace_id()).collect();
    assert_eq!(
        traces.len(),
        1,
        "{backend:?}: one saga, one trace: {names:?}"
    );
    let (_, roots) = tree(&ours);
    assert_eq!(roots, vec!["saga.start"], "{backend:?}: {names:?}");
    assert!(
        names.contains(&"agent.handle"),
        "the step after the approval: {names:?}"
    );
}

/// Two slots of a schedule fired at once: each firing is one trace, rooted at its
/// `schedule.fire`, with its saga's `saga.start` in it.
async fn firings_are_a_trace_each(exporter: &InMemorySpanExporter, provider: &SdkTracerProvider) {
    use agentsaga_saga::schedule::{CatchUp, Overlap, Schedule};
    let saga = Saga::<Value>::builder("brief", 1)
        .pivot(Step::new("draft", "flights"))
        .build()
        .unwrap();
    let runtime = flights_and_hotels(backends()[0], saga).await;
    // Not 90 s before an hour turns nor a minute (`late_after`) after: a slot due or in
    // time would fire too (a third firing, which CI runs saw at 01:00:14 and 02:00:04).
    let hour = 3_600_000;
    let wait = match agentsaga_core::clock::system_now_ms() % hour {
        i if i < 65_000 => 65_000 - i,
        i if hour - i < 90_000 => hour - i + 65_000,
        _ => 0,
    };
    tokio::time::sleep(std::time::Duration::from_millis(wait.try_into().unwrap())).await;
    let s = Schedule::new("hourly", "brief", "0 * * * *")
        .overlap(Overlap::Allow)
        .catch_up(CatchUp::All { max: 2 });
    let created = runtime.schedules().create(&s).await.unwrap();
    let next = created.next_slot_ms.unwrap();
    let mut tx = runtime.store().begin().await.unwrap();
    agentsaga_core::Sql::new("UPDATE saga_schedules SET next_slot_ms = ?, next_due_ms = ?")
        .bind(next - 3 * 3_600_000)
        .bind(next - 3 * 3_600_000)
        .execute(tx.conn())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    runtime.schedules().fire_due().await.unwrap();
    // Fired here, or by the runtime's own firing task if it came first (it asks every
    // second): the two slots' sagas, whichever fired them.
    let filter = agentsaga_saga::query::ListFilter {
        name: Some("brief".into()),
        ..Default::default()
    };
    let mut fired = Vec::new();
    wait_until(
        "two firings",
        std::time::Duration::from_secs(30),
        async || {
            fired = agentsaga_saga::query::list(runtime.store(), &filter)
                .await
                .unwrap();
            fired.len() >= 2
        },
    )
    .await;
    assert_eq!(fired.len(), 2, "{fired:?}");
    for f in &fired {
        assert_eq!(settle(&runtime, f.id).await, SagaState::Completed);
    }
    runtime.shutdown().await;
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let fires: Vec<_> = spans.iter().filter(|s| s.name == "schedule.fire").collect();
    assert_eq!(fires.len(), 2);
    let traces: HashSet<_> = fires.iter().map(|s| s.span_context.trace_id()).collect();
    assert_eq!(traces.len(), 2, "a trace per firing");
    for trace in traces {
        let in_trace: Vec<_> = spans
            .iter()
            .filter(|s| s.span_context.trace_id() == trace)
            .collect();
        let (_, roots) = tree(&in_trace);
        let names: Vec<&str> = in_trace.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(roots, vec!["schedule.fire"], "{names:?}");
        assert_eq!(
            names.iter().filter(|n| **n == "saga.start").count(),
            1,
            "{names:?}"
        );
        assert!(names.contains(&"agent.handle"), "{names:?}");
    }
}

/// A parent whose second step is a child saga: every span of either saga is in one
/// trace, a tree with one root, the parent's `saga.start`; the child's `saga.start`
/// hangs in it.
async fn child_in_its_parents_trace(
    backend: Backend,
    exporter: &InMemorySpanExporter,
    provider: &SdkTracerProvider,
) {
    let child = Saga::<Value>::builder("booking", 1)
        .step(Step::new("reserve_flight", "flights").compensate("flights", |_: &Value| "cancel"))
        .build()
        .unwrap();
    let parent = Saga::<Value>::builder("travel", 1)
        .step(Step::new("visa", "visas").compensate("visas", |_: &Value| "cancel"))
        .step(Step::saga("book", "booking"))
        .build()
        .unwrap();
    let runtime = Runtime::builder()
        .database(fresh_url(backend).await)
        .agent(Echo("flights"))
        .agent(Echo("visas"))
        .saga(child)
        .saga(parent)
        .start()
        .await
        .unwrap();
    let id = runtime
        .start_saga("travel", &json!({"who": "di"}))
        .await
        .unwrap();
    assert_eq!(settle(&runtime, id).await, SagaState::Completed);
    runtime.shutdown().await;
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let ours = ours(&spans);
    let names: Vec<&str> = ours.iter().map(|s| s.name.as_ref()).collect();
    let traces: HashSet<_> = ours.iter().map(|s| s.span_context.trace_id()).collect();
    assert_eq!(
        traces.len(),
        1,
        "{backend:?}: a parent and its child, one trace: {names:?}"
    );
    let (_, roots) = tree(&ours);
    assert_eq!(roots, vec!["saga.start"], "{backend:?}: {names:?}");
    let starts = ours.iter().filter(|s| s.name == "saga.start").count();
    assert_eq!(starts, 2, "the parent's start and the child's: {names:?}");
}

/// The spans of agentsaga's hops among `spans`.
fn ours(spans: &[SpanData]) -> Vec<&SpanData> {
    spans
        .iter()
        .filter(|s| {
            ["saga.", "relay.deliver", "agent.handle", "outbox.enqueue"]
                .iter()
                .any(|p| s.name.starts_with(p))
        })
        .collect()
}

/// A runtime of `saga` on `backend` whose `flights` agent answers and whose `hotels`
/// agent refuses every booking.
async fn flights_and_hotels(backend: Backend, saga: agentsaga_saga::SagaDefinition) -> Runtime {
    Runtime::builder()
        .database(fresh_url(backend).await)
        .agent(Echo("flights"))
        .agent(NoRooms)
        .saga(saga)
        .start()
        .await
        .unwrap()
}

/// Runs one saga whose second step fails (so the first is compensated) on `backend`
/// and checks that its spans are one trace, a tree rooted at `saga.start`.
async fn one_trace(
    backend: Backend,
    exporter: &InMemorySpanExporter,
    provider: &SdkTracerProvider,
    saga: agentsaga_saga::SagaDefinition,
) {
    let runtime = flights_and_hotels(backend, saga).await;
    let id = runtime
        .start_saga("trip", &json!({"who": "ada"}))
        .await
        .unwrap();
    assert_eq!(settle(&runtime, id).await, SagaState::Compensated);
    runtime.shutdown().await;
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let ours = ours(&spans);
    let traces: HashSet<_> = ours.iter().map(|s| s.span_context.trace_id()).collect();
    let names: Vec<&str> = ours.iter().map(|s| s.name.as_ref()).collect();
    assert_eq!(
        traces.len(),
        1,
        "one saga, one trace; got {} traces over {names:?}",
        traces.len()
    );

    // A tree: one root (saga.start); every other span's parent is in the trace.
    let (ids, roots) = tree(&ours);
    assert_eq!(roots, vec!["saga.start"], "{names:?}");
    let parent_of = |name: &str| -> Vec<&str> {
        ours.iter()
            .filter(|s| s.name == name)
            .map(|s| ids.get(&s.parent_span_id).copied().unwrap_or("?"))
            .collect()
    };
    // Commands hang under the enqueue that wrote them; deliveries under the enqueue;
    // handling under the delivery; the orchestrator's steps under their delivery.
    assert!(
        parent_of("relay.deliver")
            .iter()
            .all(|p| *p == "outbox.enqueue"),
        "{:?}",
        parent_of("relay.deliver")
    );
    assert!(
        parent_of("agent.handle")
            .iter()
            .all(|p| *p == "relay.deliver")
    );
    // Each reply is applied to the saga in its agent's transaction
    // (`answers_in_agent_transaction`): its saga.step hangs under the agent.handle.
    assert!(
        parent_of("saga.step").iter().all(|p| *p == "agent.handle"),
        "{:?}",
        parent_of("saga.step")
    );
    // Two compensations (the failed hotel step's outcome counts as unknown, then the
    // flight), each enqueued under a saga.compensate span.
    assert_eq!(parent_of("saga.compensate"), vec!["saga.step", "saga.step"]);
    // Every hop is there: 2 commands + 2 compensations delivered and handled, and
    // their 4 replies applied.
    let count = |n: &str| names.iter().filter(|x| **x == n).count();
    assert_eq!(count("agent.handle"), 4, "{names:?}");
    assert_eq!(count("saga.step"), 4, "{names:?}");
    assert_eq!(count("relay.deliver"), 4, "{names:?}");
    // saga.id on every span of the saga.
    let saga_id = id.to_string();
    for s in &ours {
        let has = s
            .attributes
            .iter()
            .any(|kv| kv.key.as_str() == "saga.id" && kv.value.as_str() == saga_id.as_str());
        assert!(has, "{} lacks saga.id", s.name);
    }
}
