//! Traces on the wire: the trip_booking example, run as a child process with
//! `OTEL_EXPORTER_OTLP_ENDPOINT` pointing at a small OTLP/HTTP receiver in this test
//! (127.0.0.1, port 0), exports its spans; each saga is one trace, across two services
//! linked by NATS too (the cross_service example).

mod support;

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentsaga::core::Store;
use agentsaga::core::testing::{Backend, NatsServer, fresh_url, pg_server};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message as _;

/// A span as received: service, trace id, name, saga.id attribute.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    trace: Vec<u8>,
    name: String,
    saga: Option<String>,
}

/// Accepts OTLP/HTTP protobuf exports until the test ends (bounded: each connection
/// is served until the client closes it; the thread dies with the test process).
fn receiver() -> (String, Arc<Mutex<Vec<Received>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let spans = Arc::new(Mutex::new(Vec::new()));
    let sink = spans.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let sink = sink.clone();
            std::thread::spawn(move || serve(stream, &sink));
        }
    });
    (url, spans)
}

fn serve(stream: std::net::TcpStream, sink: &Mutex<Vec<Received>>) {
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut len = 0usize;
        let mut line = String::new();
        let mut first = true;
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if first {
                assert!(
                    line.starts_with("POST /v1/traces"),
                    "unexpected request: {line}"
                );
                first = false;
            }
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        reader.read_exact(&mut body).unwrap();
        let req = ExportTraceServiceRequest::decode(body.as_slice())
            .expect("an OTLP protobuf trace export");
        let mut got = Vec::new();
        for rs in req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone())
                .map(|v| match v {
                    Value::StringValue(s) => s,
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    let saga = s
                        .attributes
                        .iter()
                        .find(|kv| kv.key == "saga.id")
                        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
                            Value::StringValue(v) if !v.is_empty() => Some(v.clone()),
                            _ => None,
                        });
                    got.push(Received {
                        service: service.clone(),
                        trace: s.trace_id,
                        name: s.name,
                        saga,
                    });
                }
            }
        }
        sink.lock().unwrap().extend(got);
        let _ = out.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

fn run_exporting(
    url: &str,
    endpoint: &str,
    service: Option<&str>,
    seed: &str,
) -> std::process::Child {
    let mut cmd = Command::new(support::example("trip_booking"));
    cmd.args([
        "--database-url",
        url,
        "--quiet",
        "--sagas",
        "20",
        "--fail-rate",
        "0.3",
        "--seed",
        seed,
    ])
    .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    .env("RUST_LOG", "warn")
    .stdin(Stdio::null())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    match service {
        Some(s) => cmd.env("OTEL_SERVICE_NAME", s),
        None => cmd.env_remove("OTEL_SERVICE_NAME"),
    };
    cmd.spawn().unwrap()
}

/// Every saga of the database: its spans, all in one trace, and one trace per saga.
async fn check_one_trace_per_saga(
    url: &str,
    spans: &[Received],
) -> HashMap<String, HashSet<String>> {
    let store = Store::connect(url).await.unwrap();
    let sagas = support::sagas(&store).await;
    assert!(!sagas.is_empty());
    let mut traces_by_saga: HashMap<&str, HashSet<&[u8]>> = HashMap::new();
    let mut services_by_saga: HashMap<String, HashSet<String>> = HashMap::new();
    for s in spans {
        if let Some(saga) = &s.saga {
            traces_by_saga.entry(saga).or_default().insert(&s.trace);
            services_by_saga
                .entry(saga.clone())
                .or_default()
                .insert(s.service.clone());
        }
    }
    let mut all_traces = HashSet::new();
    for (id, _) in &sagas {
        let traces = traces_by_saga
            .get(id.as_str())
            .unwrap_or_else(|| panic!("no spans for saga {id}"));
        assert_eq!(traces.len(), 1, "saga {id} spans {} traces", traces.len());
        let trace = *traces.iter().next().unwrap();
        assert!(all_traces.insert(trace), "two sagas share a trace");
        let names: HashSet<&str> = spans
            .iter()
            .filter(|s| s.trace == trace)
            .map(|s| s.name.as_str())
            .collect();
        for hop in [
            "saga.start",
            "outbox.enqueue",
            "relay.deliver",
            "agent.handle",
            "saga.step",
        ] {
            assert!(
                names.contains(hop),
                "saga {id} has no {hop} span: {names:?}"
            );
        }
    }
    services_by_saga
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_exports_one_trace_per_saga() {
    let (endpoint, spans) = receiver();
    let url = fresh_url(Backend::Sqlite).await;
    let out = support::wait_bounded(
        run_exporting(&url, &endpoint, None, "4"),
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = spans.lock().unwrap().clone();
    assert!(
        spans.iter().all(|s| s.service == "trip_booking"),
        "service.name"
    );
    assert!(
        !spans.iter().any(|s| s.name == "Actor"),
        "ractor's actor-lifetime spans must stay out"
    );
    check_one_trace_per_saga(&url, &spans).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_postgres_share_each_sagas_trace() {
    let (endpoint, spans) = receiver();
    let url = pg_server().fresh_database_url().await;
    let a = run_exporting(&url, &endpoint, Some("booking-a"), "5");
    let b = run_exporting(&url, &endpoint, Some("booking-b"), "6");
    for child in [a, b] {
        let out = support::wait_bounded(child, Duration::from_secs(120));
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let spans = spans.lock().unwrap().clone();
    let services = check_one_trace_per_saga(&url, &spans).await;
    // Both processes claimed from one outbox: some saga has spans from both, in its
    // one trace.
    assert!(
        services.values().any(|s| s.len() == 2),
        "no saga crossed processes: {services:?}"
    );
}

// Across two services, two databases and a broker: the cross_service example's shop
// and payments service export to one receiver; each saga is still one trace, and it
// holds both services' spans (the trace context crosses NATS in the message headers,
// which the payments service keeps in its own outbox).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saga_across_two_services_is_one_trace() {
    let (endpoint, spans) = receiver();
    let server = NatsServer::start();
    let (shop_url, pay_url) = (
        fresh_url(Backend::Sqlite).await,
        fresh_url(Backend::Sqlite).await,
    );
    // The shop's output is read while it runs (`wait_bounded`); the payments service's,
    // read by nobody until the end, goes nowhere (a full pipe would block it).
    let service = |role: &str, url: &str, extra: &[&str]| {
        let out = || {
            if role == "shop" {
                Stdio::piped()
            } else {
                Stdio::null()
            }
        };
        Command::new(support::example("cross_service"))
            .arg(role)
            .args(["--nats", &server.url(), "--database-url", url])
            .args(extra)
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
            .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
            .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .env_remove("OTEL_SERVICE_NAME")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(out())
            .stderr(out())
            .spawn()
            .unwrap()
    };
    let payments = service("payments", &pay_url, &[]);
    let shop = service("shop", &shop_url, &["--quiet", "--sagas", "12"]);
    let out = support::wait_bounded(shop, Duration::from_secs(120));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Stopped (SIGTERM), the payments service flushes its spans.
    let term = Command::new("kill")
        .args(["-TERM", &payments.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let out = support::wait_bounded(payments, Duration::from_secs(30));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spans = spans.lock().unwrap().clone();
    let services = check_one_trace_per_saga(&shop_url, &spans).await;
    for (saga, by) in &services {
        assert!(
            by.contains("shop") && by.contains("payments"),
            "saga {saga}: spans of {by:?} only"
        );
    }
}
