//! Exclusivity under load: several workers, many jobs over few targets; the
//! ledger proves that runs on one target never overlap, fences only grow,
//! and every job ran exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jobdeck::job::State;

use crate::harness::{Env, eventually};
use crate::on_both_backends;

const WORKERS: usize = 4;
const SLOTS: &str = "4";
const JOBS: usize = 500;
const TARGETS: usize = 10;

const CONFIG: &str = r#"
[workers]
lease = "10s"
kill_grace = "2s"

[[pipeline]]
name = "ledger"
# A failure must show up as a failed job, not hide behind a retry.
max_attempts = 1
[[pipeline.step]]
name = "write"
run = ["sh", "-c", '''
echo "start $JOBDECK_TARGET $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $JOBDECK_FENCE $(date +%s%N)" >> "$LEDGER"
sleep 0.01
echo "end $JOBDECK_TARGET $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $JOBDECK_FENCE $(date +%s%N)" >> "$LEDGER"
''']
"#;

/// One run as the ledger saw it.
#[derive(Debug, Default, Clone)]
struct Run {
    target: String,
    attempt: i64,
    fence: i64,
    start: Option<i128>,
    end: Option<i128>,
}

async fn exclusivity_under_load(env: Env) {
    let config = env.config("worker.toml", CONFIG);
    let mut ids = BTreeSet::new();
    for n in 0..JOBS {
        let target = format!("t{}", n % TARGETS);
        ids.insert(env.enqueue("ledger", Some(&target), &[]).await);
    }
    let workers: Vec<_> = (0..WORKERS)
        .map(|_| env.worker(&config, &["--slots", SLOTS, "--no-scheduler"]))
        .collect();

    eventually(
        "every job to finish",
        Duration::from_secs(150),
        async || {
            let counts = env.store.count_by_state().await.ok()?;
            let done: i64 = [State::Succeeded, State::Failed, State::Cancelled]
                .iter()
                .map(|s| counts.get(s).copied().unwrap_or(0))
                .sum();
            (done == JOBS as i64).then_some(())
        },
    )
    .await;
    let counts = env.store.count_by_state().await.expect("counts");
    assert_eq!(
        counts.get(&State::Succeeded).copied(),
        Some(JOBS as i64),
        "every job succeeds: {counts:?}"
    );

    // Each job id has exactly one start and one end line.
    let mut runs: BTreeMap<i64, Run> = BTreeMap::new();
    for line in env.ledger_lines() {
        let [kind, target, id, attempt, fence, ns] = line.as_slice() else {
            panic!("malformed ledger line {line:?}");
        };
        let id: i64 = id.parse().expect("job id");
        let ns: i128 = ns.parse().expect("timestamp");
        let run = runs.entry(id).or_insert_with(|| Run {
            target: target.clone(),
            attempt: attempt.parse().expect("attempt"),
            fence: fence.parse().expect("fence"),
            ..Run::default()
        });
        let slot = match kind.as_str() {
            "start" => &mut run.start,
            "end" => &mut run.end,
            _ => panic!("malformed ledger line {line:?}"),
        };
        assert!(slot.is_none(), "job {id} has two {kind} lines");
        *slot = Some(ns);
    }
    let seen: BTreeSet<i64> = runs.keys().copied().collect();
    assert_eq!(seen, ids, "the ledger names exactly the enqueued jobs");
    for (id, run) in &runs {
        assert!(
            run.start.is_some() && run.end.is_some(),
            "job {id} has an unfinished run {run:?}"
        );
        assert_eq!(run.attempt, 1, "job {id} ran once, on its first attempt");
    }

    // Per target: intervals in start order never overlap, fences grow.
    let mut by_target: BTreeMap<&str, Vec<(i64, &Run)>> = BTreeMap::new();
    for (id, run) in &runs {
        by_target.entry(&run.target).or_default().push((*id, run));
    }
    assert_eq!(by_target.len(), TARGETS);
    for (target, mut list) in by_target {
        list.sort_by_key(|(_, r)| r.start);
        for pair in list.windows(2) {
            let ((a, ra), (b, rb)) = (pair[0], pair[1]);
            assert!(
                rb.start >= ra.end,
                "target {target}: job {b} started before job {a} ended ({ra:?} / {rb:?})"
            );
            assert!(
                rb.fence > ra.fence,
                "target {target}: fence of job {b} ({}) not above job {a}'s ({})",
                rb.fence,
                ra.fence
            );
        }
    }

    // The load really was shared: more than one process ran jobs.
    let mut runners = BTreeSet::new();
    for id in &ids {
        for e in env.events(*id).await {
            if e.to == State::Running {
                runners.insert(e.actor);
            }
        }
    }
    assert!(runners.len() >= 2, "only {runners:?} ran jobs");
    drop(workers);
}

on_both_backends!(exclusivity_under_load, permits = 2);
