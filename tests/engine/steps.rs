//! Pipelines across runs: checkpoints reach the next run, a retry resumes
//! at the step that failed.

use std::time::Duration;

use jobdeck::job::State;

use crate::harness::Env;
use crate::on_both_backends;
use crate::scripts::{count, workers};

const CHECKPOINT: &str = r#"
[[pipeline]]
name = "scan"
[[pipeline.step]]
name = "scan"
run = ["sh", "-c", '''
echo "seen $JOBDECK_JOB_ID $JOBDECK_CHECKPOINT_POS" >> "$LEDGER"
echo "::jobdeck checkpoint POS=after-$JOBDECK_JOB_ID"
''']
"#;

async fn checkpoint_round_trip(env: Env) {
    let config = env.config(
        "w.toml",
        &[workers("10s", ""), CHECKPOINT.to_string()].concat(),
    );
    let _w = env.worker(&config, &["--no-scheduler"]);
    let first = env.enqueue("scan", Some("d"), &[]).await;
    env.wait_state(first, State::Succeeded, Duration::from_secs(15))
        .await;
    let second = env.enqueue("scan", Some("d"), &[]).await;
    env.wait_state(second, State::Succeeded, Duration::from_secs(15))
        .await;
    assert_eq!(
        env.ledger_of("seen", first),
        vec![vec!["seen".to_string(), first.to_string()]]
    );
    assert_eq!(
        env.ledger_of("seen", second),
        vec![vec![
            "seen".to_string(),
            second.to_string(),
            format!("after-{first}")
        ]],
        "run 2 sees run 1's checkpoint"
    );
}

on_both_backends!(checkpoint_round_trip);

const TWO_STEPS: &str = r#"
[[pipeline]]
name = "two"
backoff = "100ms"
max_attempts = 3
[[pipeline.step]]
name = "first"
run = ["sh", "-c", 'echo "first $JOBDECK_JOB_ID $JOBDECK_ATTEMPT" >> "$LEDGER"']
[[pipeline.step]]
name = "second"
run = ["sh", "-c", 'echo "second $JOBDECK_JOB_ID $JOBDECK_ATTEMPT" >> "$LEDGER"; [ "$JOBDECK_ATTEMPT" -ge 2 ]']
"#;

async fn retry_resumes_at_the_failed_step(env: Env) {
    let config = env.config(
        "w.toml",
        &[workers("10s", ""), TWO_STEPS.to_string()].concat(),
    );
    let _w = env.worker(&config, &["--no-scheduler"]);
    let id = env.enqueue("two", Some("d"), &[]).await;
    let job = env
        .wait_state(id, State::Succeeded, Duration::from_secs(20))
        .await;
    assert_eq!(job.attempt, 2);
    assert_eq!(
        count(&env, "first", id),
        1,
        "step 1 ran once: {:?}",
        env.ledger_lines()
    );
    let second: Vec<String> = env
        .ledger_of("second", id)
        .into_iter()
        .map(|l| l[2].clone())
        .collect();
    assert_eq!(
        second,
        ["1", "2"],
        "step 2 failed on attempt 1, passed on attempt 2"
    );
}

on_both_backends!(retry_resumes_at_the_failed_step);
