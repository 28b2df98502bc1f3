//! Several processes writing one SQLite file at full speed: four workers
//! whose engines cycle back to back, producers enqueueing from their own
//! processes, an operator's CLI reading. Every write waits its turn: no
//! process ever reports "database is locked", and every job runs once.

use std::time::Duration;

use jobdeck::job::State;
use jobdeck::store::NewJob;

use crate::harness::{Env, Kind, run_on};

const WORKERS: usize = 4;
const JOBS: usize = 4000;

const CONFIG: &str = r#"
[workers]
lease = "5s"
poll = "50ms"

[[pipeline]]
name = "fast"
[[pipeline.step]]
name = "noop"
builtin = "noop"
"#;

async fn many_writers_one_file(env: Env) {
    let config = env.config("w.toml", CONFIG);
    let jobs = (0..JOBS)
        .map(|n| NewJob {
            pipeline: "fast".into(),
            // Some on targets: their locks are written too.
            target: (n % 4 == 0).then(|| format!("t{}", n % 40)),
            ..NewJob::default()
        })
        .collect();
    env.store
        .enqueue_many(jobs, "operator:test@host")
        .await
        .expect("enqueue");
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| env.worker(&config, &["--slots", "8", "--no-scheduler"]))
        .collect();
    // Producers and readers in their own processes while the workers run.
    let mut extra = Vec::new();
    for _ in 0..20 {
        let out = env.cli(&["enqueue", "fast", "--json"]).await;
        assert!(out.ok(), "enqueue under load: {}", out.stderr);
        extra.push(
            serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()["id"]
                .as_i64()
                .unwrap(),
        );
        let out = env.cli(&["stats", "--json"]).await;
        assert!(out.ok(), "stats under load: {}", out.stderr);
    }
    crate::harness::eventually(
        "every job to succeed",
        Duration::from_secs(120),
        async || {
            let counts = env.store.count_by_state().await.ok()?;
            (counts.get(&State::Succeeded).copied().unwrap_or(0) == (JOBS + extra.len()) as i64)
                .then_some(())
        },
    )
    .await;
    for w in &workers {
        let log = w.log_text();
        assert!(
            !log.contains("locked"),
            "worker {} reported a busy database:\n{log}",
            w.pid
        );
    }
    // Each job ran once: one start per job in the event log.
    let starts = env
        .query_ints("SELECT COUNT(*) FROM job_events WHERE to_state = 'running'")
        .await;
    assert_eq!(starts[0][0], (JOBS + extra.len()) as i64);
    // And the file really had several writers at once.
    let per_worker = env
        .query_ints(
            "SELECT COUNT(*) FROM job_events WHERE to_state = 'running' \
             GROUP BY actor ORDER BY 1",
        )
        .await;
    eprintln!("starts per worker: {per_worker:?}");
    assert_eq!(per_worker.len(), WORKERS, "every worker took jobs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_writers_one_file_sqlite() {
    run_on(
        Kind::Sqlite,
        2,
        "many_writers_one_file",
        many_writers_one_file,
    )
    .await;
}
