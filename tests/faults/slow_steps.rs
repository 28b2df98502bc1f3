//! Scenario 5, slow and hung steps: a step timeout stops the whole process
//! group (the step's own children too, even one that ignores SIGTERM), and
//! a step lasting more than five leases completes normally because its
//! lease is renewed.

use std::time::Duration;

use jobdeck::job::State;
use jobdeck::store::NewJob;

use crate::audit::{self, LEDGER_STEP};
use crate::harness::{Env, eventually};
use crate::on_both_backends;

/// Starts a grandchild (`sleep` in the background), records both pids, and
/// waits forever; with `$TRAP` set the shell also ignores SIGTERM.
const HANG: &str = r#"
if [ -n "$TRAP" ]; then trap '' TERM; fi
sleep 300 &
echo "kids $JOBDECK_JOB_ID $$ $!" >> "$LEDGER"
wait
"#;

fn config() -> String {
    format!(
        r#"[workers]
lease = "2s"
kill_grace = "1s"

[[pipeline]]
name = "hung"
[[pipeline.step]]
name = "hang"
run = ["sh", "-c", '''{HANG}''']
timeout = "1500ms"

[[pipeline]]
name = "stubborn"
[[pipeline.step]]
name = "hang"
run = ["sh", "-c", '''{HANG}''']
env = {{ TRAP = "1" }}
timeout = "1500ms"

[[pipeline]]
name = "whole"
timeout = "1500ms"
[[pipeline.step]]
name = "quick"
builtin = "noop"
[[pipeline.step]]
name = "hang"
run = ["sh", "-c", '''{HANG}''']

[[pipeline]]
name = "long"
[[pipeline.step]]
name = "slow"
run = ["sh", "-c", '''{LEDGER_STEP}''']
env = {{ PAUSE = "11" }}
"#
    )
}

/// A job of `pipeline` (target the same) with a single attempt, so that a
/// timeout ends it. (A pipeline's `max_attempts` is stamped on jobs by
/// `jobdeck enqueue --config` and the scheduler, not by the store.)
async fn once(env: &Env, pipeline: &str) -> i64 {
    let job = NewJob {
        pipeline: pipeline.into(),
        target: Some(pipeline.into()),
        max_attempts: Some(1),
        ..NewJob::default()
    };
    env.store
        .enqueue(job, "operator:test@host")
        .await
        .expect("enqueue")
        .id
}

async fn slow_and_hung_steps(env: Env) {
    let config = env.config("slow.toml", &config());
    let args = ["--slots", "4", "--no-scheduler"];
    // Two workers: if the long job's lease lapsed, the other would take it.
    let _w = [env.worker(&config, &args), env.worker(&config, &args)];
    let long = once(&env, "long").await;
    let mut hung = Vec::new();
    for pipeline in ["hung", "stubborn", "whole"] {
        hung.push(once(&env, pipeline).await);
    }
    for id in &hung {
        let kids: Vec<i32> = eventually("the step's pids", Duration::from_secs(20), async || {
            let line = env.ledger_of("kids", *id).into_iter().next()?;
            Some(vec![line[2].parse().ok()?, line[3].parse().ok()?])
        })
        .await;
        let job = env
            .wait_state(*id, State::Failed, Duration::from_secs(20))
            .await;
        assert_eq!(job.attempt, 1, "job {id} failed at its first timeout");
        let error = job.last_error.unwrap_or_default();
        assert!(
            error.contains("timed out") || error.contains("timeout"),
            "job {id}: {error}"
        );
        // The group went down with the step: the shell and its grandchild.
        let left = audit::survivors(&kids, Duration::from_secs(1)).await;
        assert!(left.is_empty(), "job {id}: {left:?} survived the timeout");
        audit::assert_valid_history(&env, *id).await;
    }
    let job = env
        .wait_state(long, State::Succeeded, Duration::from_secs(40))
        .await;
    assert_eq!(job.attempt, 1, "the long step ran once");
    let runs = audit::runs(&env);
    let run = runs.get(&(long, 1)).expect("the long step's run");
    let took = run.end.expect("it finished") - run.start;
    assert!(
        took > 10_000_000_000,
        "the long step lasted more than five leases: {} ms",
        took / 1_000_000
    );
    assert_eq!(runs.len(), 1, "nothing else ran the long job");
    audit::assert_valid_history(&env, long).await;
    eprintln!(
        "RESULT slow_steps {:?}: 3 timeouts (plain, SIGTERM ignored, pipeline-wide) with their \
         groups gone, 1 step of {:.1}s under a 2s lease succeeded on attempt 1",
        env.kind,
        took as f64 / 1e9
    );
}

on_both_backends!(slow_and_hung_steps);
