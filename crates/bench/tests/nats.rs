//! The benches over NATS run end to end in their smoke size: `saga --transport nats`
//! (its agents in a second process of this binary, across a throwaway `nats-server`)
//! and `relay --transport nats` print each of their figures, with a floor.

use std::process::Command;

use serde_json::Value;

/// The JSON figures of `agentsaga-bench <args>`, which must succeed.
fn figures(args: &[&str]) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_agentsaga-bench"))
        .args(args)
        .output()
        .expect("the bench runs");
    assert!(
        out.status.success(),
        "agentsaga-bench {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).expect("a JSON figure"))
        .collect()
}

/// Checks `figures` are exactly `metrics`, each positive with a positive floor.
fn check(figures: &[Value], metrics: &[&str]) {
    let names: Vec<&str> = figures
        .iter()
        .map(|f| f["metric"].as_str().expect("a metric"))
        .collect();
    assert_eq!(names, metrics);
    for f in figures {
        assert!(f["value"].as_f64().is_some_and(|v| v > 0.0), "{f}");
        assert!(f["floor"].as_f64().is_some_and(|v| v > 0.0), "{f}");
    }
}

#[test]
fn the_saga_bench_runs_over_nats() {
    let figures = figures(&[
        "saga",
        "--backend",
        "sqlite",
        "--quick",
        "--transport",
        "nats",
    ]);
    check(
        &figures,
        &[
            "nats_happy_rate",
            "nats_happy_latency_p50",
            "nats_happy_latency_p99",
            "nats_compensating_rate",
            "nats_compensating_latency_p50",
            "nats_compensating_latency_p99",
        ],
    );
}

#[test]
fn the_relay_bench_publishes_to_nats() {
    let figures = figures(&[
        "relay",
        "--backend",
        "sqlite",
        "--quick",
        "--transport",
        "nats",
    ]);
    check(&figures, &["nats_publish_rate"]);
}
