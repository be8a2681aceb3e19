//! What a test runtime traced: its runtime's threads send their spans to an in-memory
//! exporter of its own ([`Tracing`]), read back per saga as a [`Trace`].

use std::collections::{HashMap, HashSet};

use agentsaga_saga::SagaId;
use opentelemetry::trace::{SpanId, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::{Error, Result};

/// A test runtime's tracing: the subscriber its threads use (OpenTelemetry spans to
/// an in-memory exporter, as `telemetry::init` exports them; logs to the test's output
/// when `RUST_LOG` is set), and what it collected.
pub(crate) struct Tracing {
    exporter: InMemorySpanExporter,
    provider: SdkTracerProvider,
    pub(crate) dispatch: tracing::Dispatch,
}

impl Tracing {
    pub(crate) fn new() -> Self {
        crate::telemetry::install_propagator();
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let spans = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("agentsaga-test"))
            .with_filter(crate::telemetry::export_filter());
        let logs = std::env::var_os("RUST_LOG").map(|_| {
            tracing_subscriber::fmt::layer()
                .with_test_writer()
                .with_filter(EnvFilter::from_default_env())
        });
        let subscriber = tracing_subscriber::registry().with(spans).with(logs);
        Self {
            exporter,
            provider,
            dispatch: tracing::Dispatch::new(subscriber),
        }
    }

    /// The trace of saga `id`: every finished span of the one trace its spans are in.
    pub(crate) fn trace(&self, id: SagaId) -> Result<Trace> {
        let _ = self.provider.force_flush();
        let spans = self
            .exporter
            .get_finished_spans()
            .map_err(|e| Error::NotAtRest(format!("the test's span exporter: {e}")))?;
        let saga = id.to_string();
        let traces: HashSet<TraceId> = spans
            .iter()
            .filter(|s| {
                s.attributes
                    .iter()
                    .any(|kv| kv.key.as_str() == "saga.id" && kv.value.as_str() == saga.as_str())
            })
            .map(|s| s.span_context.trace_id())
            .collect();
        let trace = match traces.len() {
            1 => traces.into_iter().next().unwrap_or(TraceId::INVALID),
            0 => {
                return Err(Error::PromiseBroken(format!(
                    "saga {id} has no finished span (is it one of this runtime's?)"
                )));
            }
            n => {
                return Err(Error::PromiseBroken(format!(
                    "saga {id}'s spans are in {n} traces, not one"
                )));
            }
        };
        let of_trace: Vec<&SpanData> = spans
            .iter()
            .filter(|s| s.span_context.trace_id() == trace)
            .collect();
        let names: HashMap<SpanId, String> = of_trace
            .iter()
            .map(|s| (s.span_context.span_id(), s.name.to_string()))
            .collect();
        Ok(Trace {
            spans: of_trace
                .iter()
                .map(|s| Span {
                    name: s.name.to_string(),
                    parent: names.get(&s.parent_span_id).cloned(),
                    saga: s
                        .attributes
                        .iter()
                        .find(|kv| kv.key.as_str() == "saga.id")
                        .map(|kv| kv.value.as_str().into_owned()),
                })
                .collect(),
        })
    }
}

/// One saga's trace, as a test runtime collected it
/// ([`TestRuntime::trace`](super::TestRuntime::trace)): the finished spans of the one
/// trace the saga's spans are in (a child saga's are in its parent's), in the order
/// they ended.
#[derive(Debug, Clone)]
pub struct Trace {
    spans: Vec<Span>,
}

/// A span of a [`Trace`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    /// Its name (`saga.start`, `outbox.enqueue`, `relay.deliver`, `agent.handle`, …).
    pub name: String,
    /// Its parent's name, if its parent is in the trace.
    pub parent: Option<String>,
    /// The saga it is about (its `saga.id`), if it names one.
    pub saga: Option<String>,
}

impl Trace {
    /// Its spans, in the order they ended.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// The names of the spans with no parent in the trace: `["saga.start"]` for one
    /// saga, one trace.
    pub fn roots(&self) -> Vec<&str> {
        self.spans
            .iter()
            .filter(|s| s.parent.is_none())
            .map(|s| s.name.as_str())
            .collect()
    }

    /// How many spans are named `name`.
    pub fn count(&self, name: &str) -> usize {
        self.spans.iter().filter(|s| s.name == name).count()
    }

    /// The sagas its spans name (the saga and its children).
    pub fn sagas(&self) -> Vec<String> {
        let mut sagas: Vec<String> = self.spans.iter().filter_map(|s| s.saga.clone()).collect();
        sagas.sort();
        sagas.dedup();
        sagas
    }
}
