//! `jobdeck bench` end to end at a smoke size, on both backends: it runs
//! the real engine over every job it enqueued and reports the figures the
//! issue names. No timing is asserted; BENCHMARKS.md has the figures.

mod common;

use serde_json::Value;

use common::{jobdeck_in, postgres_url, stdout_json};

const JOBS: u64 = 200;

fn bench(extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = jobdeck_in(dir.path())
        .args(["bench", "--jobs", &JOBS.to_string(), "--slots", "4"])
        .args(["--latency-jobs", "5", "--json"])
        .args(extra)
        .output()
        .expect("run jobdeck");
    stdout_json(out, &format!("bench {extra:?}"))
}

fn check(report: &Value, backend: &str, targets: u64) {
    assert_eq!(report["backend"], backend);
    assert_eq!(report["jobs"], JOBS);
    assert_eq!(report["slots"], 4);
    assert_eq!(report["targets"], targets);
    for key in ["enqueue_per_s", "process_per_s"] {
        let v = report[key].as_f64().unwrap_or(0.0);
        assert!(v > 0.0 && v.is_finite(), "{key} = {}", report[key]);
    }
    let l = &report["latency_ms"];
    let (p50, p95, p99) = (l["p50"].as_f64(), l["p95"].as_f64(), l["p99"].as_f64());
    let (Some(p50), Some(p95), Some(p99)) = (p50, p95, p99) else {
        panic!("latency_ms without p50/p95/p99: {l}");
    };
    assert!(0.0 <= p50 && p50 <= p95 && p95 <= p99, "{l}");
}

#[test]
fn sqlite() {
    check(&bench(&[]), "sqlite", 0);
}

/// Two cycles in flight, each for half the slots, with locks: the path
/// `[workers] cycles_in_flight` opens, through the bench's own flag.
#[test]
fn postgres_with_two_cycles_in_flight_and_targets() {
    let Some(url) = postgres_url("postgres bench smoke test") else {
        return;
    };
    let report = bench(&["--db", &url, "--cycles-in-flight", "2", "--targets", "7"]);
    check(&report, "postgres", 7);
}
