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
    check_sizes(report, backend, JOBS, 4, targets);
}

fn check_sizes(report: &Value, backend: &str, jobs: u64, slots: u64, targets: u64) {
    assert_eq!(report["backend"], backend);
    assert_eq!(report["jobs"], jobs);
    assert_eq!(report["slots"], slots);
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

/// `JOBDECK_DB` set for the operator's other commands names a real
/// database: the bench must not mix its jobs into it. It runs in a scratch
/// file beside it and removes that, leaving the directory as it was.
#[test]
fn the_named_sqlite_database_is_left_as_it_was() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("real.db").display());
    let cli = |args: &[&str]| {
        let out = jobdeck_in(dir.path())
            .env("JOBDECK_DB", &url)
            .args(args)
            .output()
            .expect("run jobdeck");
        stdout_json(out, &format!("{args:?}"))
    };
    cli(&["enqueue", "sync", "--target", "a", "--json"]);
    // Beside the real database's own files (its WAL comes and goes with
    // its connections).
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("read dir")
            .map(|e| e.expect("dir entry").file_name().into_string().unwrap())
            .filter(|name| !name.starts_with("real.db"))
            .collect();
        names.sort();
        names
    };
    let jobs = || {
        cli(&["jobs", "--json", "--limit", "1000"])
            .as_array()
            .expect("a list of jobs")
            .iter()
            .map(|j| format!("#{} {} {}", j["id"], j["pipeline"], j["state"]))
            .collect::<Vec<_>>()
    };
    let (jobs_before, files_before) = (jobs(), listing());
    assert_eq!(jobs_before.len(), 1, "{jobs_before:?}");

    let report = cli(&["bench", "--jobs", "50", "--latency-jobs", "5", "--json"]);
    check_sizes(&report, "sqlite", 50, 8, 0);
    assert_eq!(jobs(), jobs_before);
    assert_eq!(listing(), files_before);
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

/// `[workers] busy_poll` through the bench's own flag: the engine polls
/// for each cycle's answer instead of sleeping, with locks, on both
/// backends.
#[test]
fn busy_poll_on_both_backends() {
    check(
        &bench(&["--busy-poll", "50ms", "--targets", "3"]),
        "sqlite",
        3,
    );
    let Some(url) = postgres_url("postgres bench smoke test") else {
        return;
    };
    let report = bench(&["--db", &url, "--busy-poll", "50ms", "--targets", "3"]);
    check(&report, "postgres", 3);
}
