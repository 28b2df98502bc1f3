//! Scenario 3, a network partition of one worker, simulated by SIGSTOP past
//! its lease then SIGCONT. Its steps are killed by their supervisors before
//! the lease ends, its jobs go stale (`on_stale = "retry"` runs them again,
//! `"release"` frees the target for the next job), each target's lock moves
//! to a new holder with a higher fence, and the woken worker writes nothing
//! about the jobs it lost.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use jobdeck::job::State;
use nix::sys::signal::Signal;

use crate::audit::{self, LEDGER_STEP, pipeline};
use crate::harness::{Env, alive, eventually, now_ns, ns_of};
use crate::on_both_backends;

const LEASE: Duration = Duration::from_secs(2);

/// Attempt 1 ticks for ~10 s (far past the lease) before its end line;
/// later attempts are quick.
const LONG_FIRST: &str = r#"
echo "start $JOBDECK_TARGET $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $JOBDECK_FENCE $(date +%s%N) $$" >> "$LEDGER"
n=0
if [ "$JOBDECK_ATTEMPT" = 1 ]; then n=100; fi
while [ $n -gt 0 ]; do
  echo "tick $JOBDECK_TARGET $JOBDECK_JOB_ID $(date +%s%N)" >> "$LEDGER"; sleep 0.1; n=$((n-1))
done
echo "end $JOBDECK_TARGET $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $JOBDECK_FENCE $(date +%s%N) $$" >> "$LEDGER"
"#;

fn config() -> String {
    [
        "[workers]\nlease = \"2s\"\nkill_grace = \"500ms\"\npoll = \"100ms\"\n".to_string(),
        pipeline("retry", "on_stale = \"retry\"", LONG_FIRST),
        pipeline("release", "on_stale = \"release\"", LONG_FIRST),
        pipeline("next", "", LEDGER_STEP),
    ]
    .concat()
}

async fn partitioned_worker(env: Env) {
    let config = env.config("partition.toml", &config());
    let args = ["--slots", "4", "--no-scheduler"];
    let a = env.worker(&config, &args);
    let mut first = BTreeMap::new();
    for (pipeline, target) in [
        ("retry", "t0"),
        ("retry", "t1"),
        ("release", "t2"),
        ("release", "t3"),
    ] {
        first.insert(env.enqueue(pipeline, Some(target), &[]).await, target);
    }
    let runs_of_a = eventually("A to start all four", Duration::from_secs(20), async || {
        let runs = audit::runs(&env);
        let mine: Vec<_> = first
            .keys()
            .filter_map(|id| runs.get(&(*id, 1)).cloned())
            .collect();
        (mine.len() == first.len()).then_some(mine)
    })
    .await;
    let a_id = a.id(&env).await;

    let frozen_at = now_ns();
    a.signal(Signal::SIGSTOP);
    // Work waiting for the released targets, then the new holder.
    let mut next = BTreeSet::new();
    for target in ["t2", "t3"] {
        next.insert(env.enqueue("next", Some(target), &[]).await);
    }
    let b = env.worker(&config, &args);

    // The supervisors fence A's steps before the lease can run out.
    for run in &runs_of_a {
        let expiry = ns_of(
            env.job(run.job)
                .await
                .lease_expires_at
                .expect("a running job has a lease"),
        );
        let gone = eventually("A's step to be killed", LEASE * 3, async || {
            (!alive(run.pid)).then(now_ns)
        })
        .await;
        assert!(
            gone < expiry + 200_000_000,
            "job {}: step outlived its lease by {} ms",
            run.job,
            (gone - expiry) / 1_000_000
        );
    }
    for (id, target) in &first {
        let want = if ["t0", "t1"].contains(target) {
            State::Succeeded
        } else {
            State::Stale
        };
        env.wait_state(*id, want, Duration::from_secs(30)).await;
    }
    for id in &next {
        env.wait_state(*id, State::Succeeded, Duration::from_secs(30))
            .await;
    }
    let b_id = b.id(&env).await;

    // Every target moved on: a later run by B under a higher fence, and
    // A's ticks stopped before it began.
    let runs = audit::runs(&env);
    let ticks = env.ledger_lines();
    for a_run in &runs_of_a {
        let later = runs
            .values()
            .filter(|r| r.target == a_run.target && r.start > a_run.start)
            .min_by_key(|r| r.start)
            .unwrap_or_else(|| panic!("target {} never moved on", a_run.target));
        assert!(later.fence > a_run.fence, "{later:?} after {a_run:?}");
        assert!(a_run.end.is_none(), "A's run finished: {a_run:?}");
        let holder = env.events(later.job).await;
        assert!(
            holder
                .iter()
                .any(|e| e.to == State::Running && e.actor.contains(&b_id)),
            "B ran job {}",
            later.job
        );
        let last_tick: i128 = ticks
            .iter()
            .filter(|l| l[0] == "tick" && l[2] == a_run.job.to_string())
            .filter_map(|l| l[3].parse().ok())
            .filter(|t| *t < later.start + 1)
            .max()
            .unwrap_or(0);
        let late = ticks
            .iter()
            .filter(|l| l[0] == "tick" && l[2] == a_run.job.to_string())
            .filter_map(|l| l[3].parse::<i128>().ok())
            .filter(|t| *t > later.start)
            .count();
        assert_eq!(late, 0, "job {}: A's step wrote after B started", a_run.job);
        assert!(last_tick > 0, "job {}: A's step never ticked", a_run.job);
    }

    a.signal(Signal::SIGCONT);
    // A heartbeat (lease/3) and the executors' reports of the fenced steps.
    tokio::time::sleep(LEASE * 2).await;
    assert!(alive(a.pid), "A survives losing its jobs");
    let mut all: BTreeSet<i64> = first.keys().copied().collect();
    all.extend(&next);
    for id in &all {
        let late: Vec<_> = env
            .events(*id)
            .await
            .into_iter()
            .filter(|e| e.actor.contains(&a_id) && ns_of(e.at) > frozen_at)
            .collect();
        assert!(late.is_empty(), "A wrote after its freeze: {late:?}");
    }

    // The operator requeues the released ones; everything then finishes.
    let requeued = audit::drain(&env, Duration::from_secs(40)).await;
    assert_eq!(requeued, 2, "the two released jobs needed the operator");
    let runs = audit::runs(&env);
    audit::assert_exclusive(&runs);
    audit::assert_all_succeeded(&env, &all, &runs).await;
    audit::assert_no_locks(&env).await;
    for id in &all {
        audit::assert_valid_history(&env, *id).await;
    }
    eprintln!(
        "RESULT partition {:?}: {} jobs, 1 worker frozen, {} steps fenced, \
         4 targets moved to B under higher fences, writes by A after freeze 0",
        env.kind,
        all.len(),
        runs_of_a.len()
    );
}

on_both_backends!(partitioned_worker);
