//! Scenario 6, cancel races: operators cancel jobs at random moments, so
//! that cancels meet jobs queued, leased, running and finishing. Each job
//! ends in exactly one terminal state, its event history is a path the
//! state machine allows, and a cancelled run's process is gone.
//!
//! Random picks alone once met no running job in a CI run (about 6 of
//! the 60 jobs run at any moment, and the workers may start late on a
//! loaded machine), so the plan starts once a job runs, and three of its
//! cancels go to a job that was running a moment before.

use std::collections::BTreeMap;
use std::time::Duration;

use jobdeck::job::State;
use jobdeck::store::{JobFilter, NewJob};
use rand::RngExt;

use crate::audit::{self, LEDGER_STEP, pipeline};
use crate::harness::{Env, alive, eventually};
use crate::on_both_backends;

const JOBS: usize = 60;
const TARGETS: usize = 12;

fn config() -> String {
    [
        "[workers]\nlease = \"3s\"\nkill_grace = \"500ms\"\npoll = \"50ms\"\n".to_string(),
        pipeline("c", "", LEDGER_STEP),
    ]
    .concat()
}

async fn cancel_races(env: Env) {
    let config = env.config("cancel.toml", &config());
    let args = ["--slots", "3", "--no-scheduler"];
    let _w = [env.worker(&config, &args), env.worker(&config, &args)];
    let mut rng = rand::rng();
    let jobs = (0..JOBS)
        .map(|n| {
            let pause = format!("0.{:02}", rng.random_range(5..90));
            NewJob {
                pipeline: "c".into(),
                target: Some(format!("t{n}", n = n % TARGETS)),
                args: [("pause".to_string(), serde_json::json!(pause))]
                    .into_iter()
                    .collect(),
                ..NewJob::default()
            }
        })
        .collect();
    let ids = env
        .store
        .enqueue_many(jobs, "operator:test@host")
        .await
        .expect("enqueue");
    // Three of four jobs get a cancel, at a random time within ~4 s, and
    // at 1, 2 and 3 s a job that is running then gets one.
    let mut plan: Vec<(u64, Cancel)> = vec![
        (1000, Cancel::Running),
        (2000, Cancel::Running),
        (3000, Cancel::Running),
    ];
    for id in &ids {
        if rng.random_range(0..4) != 0 {
            plan.push((rng.random_range(0..4000), Cancel::Job(*id)));
        }
    }
    drop(rng);
    plan.sort();
    eventually("a job to run", Duration::from_secs(30), async || {
        running_now(&env).await.first().copied()
    })
    .await;
    let began = tokio::time::Instant::now();
    let mut seen_as: BTreeMap<State, usize> = BTreeMap::new();
    let mut cancelled = Vec::new();
    for (at, cancel) in &plan {
        tokio::time::sleep_until(began + Duration::from_millis(*at)).await;
        let id = match cancel {
            Cancel::Job(id) => *id,
            Cancel::Running => {
                let running = running_now(&env).await;
                match running.into_iter().find(|id| !cancelled.contains(id)) {
                    Some(id) => id,
                    None => continue,
                }
            }
        };
        if cancelled.contains(&id) {
            continue;
        }
        // What the operator saw just before (the race is the point).
        let before = env.job(id).await.state;
        *seen_as.entry(before).or_default() += 1;
        let out = env.cli(&["cancel", &id.to_string()]).await;
        // A finished job refuses the cancel with one line; anything else
        // must succeed.
        if !out.ok() {
            assert!(
                out.stderr.contains("already finished") && out.stderr.trim().lines().count() == 1,
                "cancel {id}: {}",
                out.stderr
            );
        }
        cancelled.push(id);
    }

    eventually("every job to end", Duration::from_secs(60), async || {
        let counts = env.store.count_by_state().await.ok()?;
        let open: i64 = [State::Queued, State::Leased, State::Running, State::Stale]
            .iter()
            .map(|s| counts.get(s).copied().unwrap_or(0))
            .sum();
        (open == 0).then_some(())
    })
    .await;

    let runs = audit::runs(&env);
    audit::assert_exclusive(&runs);
    let mut ended: BTreeMap<State, usize> = BTreeMap::new();
    let mut finishing = 0;
    for id in &ids {
        let events = audit::assert_valid_history(&env, *id).await;
        let job = env.job(*id).await;
        let terminal: Vec<_> = events.iter().filter(|e| e.to.is_terminal()).collect();
        assert_eq!(
            terminal.len(),
            1,
            "job {id}: one terminal event: {events:?}"
        );
        *ended.entry(job.state).or_default() += 1;
        if !cancelled.contains(id) {
            assert_eq!(job.state, State::Succeeded, "job {id} was never cancelled");
        } else {
            assert!(
                [State::Succeeded, State::Cancelled].contains(&job.state),
                "job {id} ended {}",
                job.state
            );
        }
        if job.state == State::Cancelled {
            for run in runs.values().filter(|r| r.job == *id) {
                assert!(
                    !alive(run.pid),
                    "job {id}: cancelled step {} lives",
                    run.pid
                );
                // A cancel that meets a step writing its last line still
                // wins (DESIGN: a pending cancel always wins): counted.
                if run.end.is_some() {
                    finishing += 1;
                }
            }
        }
    }
    audit::assert_no_locks(&env).await;
    assert!(
        seen_as.contains_key(&State::Queued) && seen_as.contains_key(&State::Running),
        "the cancels met no queued or no running job: {seen_as:?}"
    );
    eprintln!(
        "RESULT cancel_races {:?}: {JOBS} jobs, {} cancels, seen before cancel {seen_as:?}, \
         ended {ended:?} ({finishing} cancelled while finishing), one terminal state each",
        env.kind,
        cancelled.len()
    );
}

/// A planned cancel: of a job picked at enqueue, or of one running then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Cancel {
    Job(i64),
    Running,
}

/// The jobs running now, as the store lists them.
async fn running_now(env: &Env) -> Vec<i64> {
    let filter = JobFilter {
        states: vec![State::Running],
        limit: 100,
        ..JobFilter::default()
    };
    let jobs = env
        .store
        .list_jobs(&filter)
        .await
        .expect("list running jobs");
    jobs.into_iter().map(|j| j.id).collect()
}

on_both_backends!(cancel_races);
