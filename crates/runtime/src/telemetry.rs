//! One call sets up telemetry for a binary: a console log driven by `RUST_LOG`, and —
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set —
//! an OTLP trace exporter (`grpc` or `http/protobuf` per `OTEL_EXPORTER_OTLP_PROTOCOL`,
//! default `http/protobuf`), named by `OTEL_SERVICE_NAME` or the binary's default.
//! W3C trace context travels in message headers, so one saga is one trace.

use std::collections::BTreeMap;

use agentsaga_core::propagation::{self, Propagator};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
#[cfg(feature = "otlp")]
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

struct Headers<'a>(&'a mut BTreeMap<String, String>);
struct ReadHeaders<'a>(&'a BTreeMap<String, String>);

impl Injector for Headers<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), value);
    }
}

impl Extractor for ReadHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// W3C trace context between `tracing` spans (through `tracing-opentelemetry`) and
/// message headers.
#[derive(Debug, Default)]
pub struct W3cPropagator(TraceContextPropagator);

impl Propagator for W3cPropagator {
    fn inject(&self, headers: &mut BTreeMap<String, String>) {
        let cx = tracing::Span::current().context();
        if cx.span().span_context().is_valid() {
            self.0.inject_context(&cx, &mut Headers(headers));
        }
    }

    fn adopt(&self, span: &tracing::Span, headers: &BTreeMap<String, String>) {
        let cx = self.0.extract(&ReadHeaders(headers));
        if cx.span().span_context().is_valid() {
            let _ = span.set_parent(cx);
        }
    }
}

/// Installs the W3C propagator for agentsaga's messages (done by [`init`] when
/// exporting; call it yourself with a subscriber of your own). Idempotent.
pub fn install_propagator() {
    let _ = propagation::set_propagator(W3cPropagator::default());
}

/// What gets exported: agentsaga's spans and the application's, not ractor's
/// per-actor lifetime spans nor the HTTP/gRPC plumbing of the exporter itself.
pub fn export_filter() -> Targets {
    Targets::new()
        .with_default(LevelFilter::INFO)
        .with_target("ractor", LevelFilter::OFF)
        .with_target("sqlx", LevelFilter::WARN)
        .with_target("h2", LevelFilter::OFF)
        .with_target("hyper", LevelFilter::OFF)
        .with_target("hyper_util", LevelFilter::OFF)
        .with_target("tonic", LevelFilter::OFF)
        .with_target("tower", LevelFilter::OFF)
        .with_target("reqwest", LevelFilter::OFF)
        .with_target("opentelemetry", LevelFilter::OFF)
        .with_target("opentelemetry_sdk", LevelFilter::OFF)
        .with_target("opentelemetry_otlp", LevelFilter::OFF)
}

/// Keeps the exporter alive; [`shutdown`](Telemetry::shutdown) flushes it.
#[must_use = "dropping it without shutdown() may lose the last spans"]
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are being exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes and stops the exporter (blocking work, done off the async threads).
    pub async fn shutdown(mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = tokio::task::spawn_blocking(move || {
                if let Err(e) = provider.shutdown() {
                    eprintln!("telemetry: flushing spans failed: {e}");
                }
            })
            .await;
        }
    }
}

/// Why [`init`] could not set up the OTLP exporter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TelemetryError {
    /// `OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL` names a protocol other than `grpc` or
    /// `http/protobuf`.
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL `{0}` is not supported: use grpc or http/protobuf")]
    UnsupportedProtocol(String),
    /// An OTLP endpoint is configured, but this build has no exporter (the `otlp`
    /// feature is off).
    #[error(
        "OTEL_EXPORTER_OTLP_ENDPOINT is set, but agentsaga was built without the `otlp` feature"
    )]
    OtlpNotCompiled,
    /// The exporter could not be built (e.g. a malformed endpoint).
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

/// Sets up the global subscriber: console logs per `RUST_LOG` (default `warn`) on
/// stderr, and the OTLP exporter when an endpoint is configured. Call once, inside the
/// Tokio runtime (the gRPC exporter needs it).
///
/// # Errors
/// [`TelemetryError`] if the exporter cannot be built (bad endpoint, bad protocol).
pub fn init(default_service_name: &str) -> Result<Telemetry, TelemetryError> {
    let console = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")));
    let endpoint = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var(v).is_ok_and(|s| !s.is_empty()));
    if !endpoint {
        let _ = tracing_subscriber::registry().with(console).try_init();
        return Ok(Telemetry { provider: None });
    }
    otlp(default_service_name, console)
}

/// Without the `otlp` feature there is no exporter to build.
#[cfg(not(feature = "otlp"))]
fn otlp<L>(_: &str, _: L) -> Result<Telemetry, TelemetryError> {
    Err(TelemetryError::OtlpNotCompiled)
}

#[cfg(feature = "otlp")]
fn otlp<L>(default_service_name: &str, console: L) -> Result<Telemetry, TelemetryError>
where
    L: Layer<tracing_subscriber::Registry> + Send + Sync + 'static,
{
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|_| "http/protobuf".into());
    let exporter = match protocol.as_str() {
        "grpc" => opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build(),
        "http/protobuf" => opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .build(),
        other => {
            return Err(TelemetryError::UnsupportedProtocol(other.to_owned()));
        }
    }
    .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let service =
        std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| default_service_name.to_owned());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .build(),
        )
        .build();
    let tracer = provider.tracer("agentsaga");
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(export_filter());
    let _ = tracing_subscriber::registry()
        .with(console)
        .with(otel)
        .try_init();
    install_propagator();
    Ok(Telemetry {
        provider: Some(provider),
    })
}
