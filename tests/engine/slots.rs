//! The slot cap: a node never runs more jobs at once than it has slots,
//! also while several of its cycles are in flight (Postgres; SQLite runs
//! one at a time whatever the setting) and while it polls for their
//! answers (`busy_poll`), and it fills them.

use std::collections::BTreeSet;
use std::time::Duration;

use jobdeck::job::State;

use crate::harness::{Env, eventually};
use crate::on_both_backends;

const SLOTS: usize = 4;
const JOBS: usize = 200;

const CONFIG: &str = r#"
[workers]
lease = "10s"
cycles_in_flight = 2
busy_poll = "5ms"

[[pipeline]]
name = "ledger"
max_attempts = 1
[[pipeline.step]]
name = "write"
run = ["sh", "-c", '''
echo "start $JOBDECK_JOB_ID $(date +%s%N)" >> "$LEDGER"
# Runs of different lengths end at different moments, so that cycles
# overlap.
sleep 0.0$((JOBDECK_JOB_ID % 9 + 1))
echo "end $JOBDECK_JOB_ID $(date +%s%N)" >> "$LEDGER"
''']
"#;

async fn a_node_runs_at_most_its_slots(env: Env) {
    let config = env.config("worker.toml", CONFIG);
    let mut ids = BTreeSet::new();
    for _ in 0..JOBS {
        ids.insert(env.enqueue("ledger", None, &[]).await);
    }
    let slots = SLOTS.to_string();
    let _worker = env.worker(&config, &["--slots", &slots, "--no-scheduler"]);
    eventually(
        "every job to succeed",
        Duration::from_secs(90),
        async || {
            let counts = env.store.count_by_state().await.ok()?;
            (counts.get(&State::Succeeded).copied() == Some(JOBS as i64)).then_some(())
        },
    )
    .await;

    // Every job ran once.
    let ran: BTreeSet<i64> = env
        .ledger_lines()
        .iter()
        .filter(|l| l.first().is_some_and(|k| k == "start"))
        .map(|l| l[1].parse().expect("job id"))
        .collect();
    assert_eq!(ran, ids, "every job ran once");

    // Sweep the jobs' database times in order: +1 at a start, -1 at a
    // finish. A job's time between the two is inside its time in a slot,
    // and other nodes and consoles see the node by them.
    let mut edges: Vec<(chrono::DateTime<chrono::Utc>, i32)> = Vec::new();
    for id in &ids {
        let job = env.job(*id).await;
        let (Some(start), Some(end)) = (job.started_at, job.finished_at) else {
            panic!("job {id} has no start or finish time: {job:?}");
        };
        edges.push((start, 1));
        edges.push((end, -1));
    }
    // Finishes before starts at the same instant: the cycle that finishes
    // one job may start the next in its slot.
    edges.sort();
    let (mut open, mut most) = (0, 0);
    for (_, d) in edges {
        open += d;
        most = most.max(open);
    }
    assert!(
        most <= SLOTS as i32,
        "{most} jobs ran at once on a node of {SLOTS} slots"
    );
    assert_eq!(most, SLOTS as i32, "the node never filled its slots");
}

on_both_backends!(a_node_runs_at_most_its_slots, permits = 1);
