//! Scenario 1, the worker kill storm: four workers, one SIGKILLed and
//! replaced every ~2 s, 1,000 quick jobs over 20 targets, the test acting as
//! the operator who requeues what went stale. Nothing overlaps, nothing is
//! lost, no step outlives its worker.

use std::collections::BTreeSet;
use std::time::Duration;

use jobdeck::store::NewJob;
use rand::RngExt;

use crate::audit::{self, LEDGER_STEP, descendants, pipeline, requeue_stale, survivors};
use crate::harness::{Env, Worker};
use crate::on_both_backends;

const WORKERS: usize = 4;
const JOBS: usize = 1000;
const TARGETS: usize = 20;
const KILL_EVERY: Duration = Duration::from_secs(2);

fn config() -> String {
    [
        "[workers]\nlease = \"2s\"\nkill_grace = \"500ms\"\npoll = \"100ms\"\n".to_string(),
        // hold (the default): a killed run quarantines its target until the
        // operator requeues it. Attempts generous: kills use them up.
        pipeline("storm", "", LEDGER_STEP),
    ]
    .concat()
}

fn start(env: &Env, config: &std::path::Path) -> Worker {
    env.worker(config, &["--slots", "4", "--no-scheduler"])
}

async fn kill_storm(env: Env) {
    let config = env.config("storm.toml", &config());
    let jobs = (0..JOBS)
        .map(|n| NewJob {
            pipeline: "storm".into(),
            // The pipeline's max_attempts is stamped by `jobdeck enqueue
            // --config`, not by the store: say it here.
            max_attempts: Some(50),
            target: Some(format!("t{:02}", n % TARGETS)),
            // Long enough that a kill usually lands in the middle of steps.
            args: [("pause".to_string(), serde_json::json!("0.2"))]
                .into_iter()
                .collect(),
            ..NewJob::default()
        })
        .collect();
    let ids: BTreeSet<i64> = env
        .store
        .enqueue_many(jobs, "operator:test@host")
        .await
        .expect("enqueue")
        .into_iter()
        .collect();
    let mut workers: Vec<Worker> = (0..WORKERS).map(|_| start(&env, &config)).collect();

    let began = tokio::time::Instant::now();
    let mut next_kill = began + KILL_EVERY;
    let (mut kills, mut requeued, mut orphans_checked) = (0usize, 0usize, 0usize);
    loop {
        let counts = env.store.count_by_state().await.unwrap_or_default();
        let done = counts
            .get(&jobdeck::job::State::Succeeded)
            .copied()
            .unwrap_or(0);
        if done == JOBS as i64 {
            break;
        }
        assert!(
            began.elapsed() < Duration::from_secs(300),
            "storm did not finish: {counts:?} after {kills} kills"
        );
        if tokio::time::Instant::now() >= next_kill {
            let victim = rand::rng().random_range(0..WORKERS);
            // Its supervisors and steps, taken just before the kill.
            let family = descendants(workers[victim].pid);
            workers[victim].kill9().await;
            let left = survivors(&family, Duration::from_millis(1500)).await;
            assert!(
                left.is_empty(),
                "processes {left:?} of killed worker {} outlived it",
                workers[victim].pid
            );
            orphans_checked += family.len();
            workers[victim] = start(&env, &config);
            kills += 1;
            next_kill = tokio::time::Instant::now() + KILL_EVERY;
        }
        requeued += requeue_stale(&env).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let elapsed = began.elapsed();
    drop(workers);

    let runs = audit::runs(&env);
    let targets = audit::assert_exclusive(&runs);
    assert_eq!(targets, TARGETS);
    let cut = audit::assert_all_succeeded(&env, &ids, &runs).await;
    audit::assert_no_locks(&env).await;
    for id in ids.iter().step_by(10) {
        audit::assert_valid_history(&env, *id).await;
    }
    assert!(
        kills >= 5,
        "only {kills} kills: the storm was too short to mean much"
    );
    eprintln!(
        "RESULT storm {:?}: {JOBS} jobs, {} runs, {kills} kills, {cut} runs cut short, \
         {requeued} stale requeued, {orphans_checked} worker descendants checked gone, \
         overlaps 0, lost 0, {:.0}s",
        env.kind,
        runs.len(),
        elapsed.as_secs_f64()
    );
}

on_both_backends!(kill_storm, permits = 2);
