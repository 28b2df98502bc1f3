//! Draining a worker on SIGTERM, and `jobdeck wait`'s exit codes.

use std::time::Duration;

use jobdeck::job::State;
use nix::sys::signal::Signal;

use crate::harness::{Env, alive};
use crate::on_both_backends;
use crate::scripts::{HANG_ONCE, count, pipeline, step_pid, workers};

/// Sleeps `$JOBDECK_ARG_SECS` on attempt 1, then records `done`.
const NAP: &str = r#"
echo "pid $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $$" >> "$LEDGER"
[ "$JOBDECK_ATTEMPT" = 1 ] && sleep "$JOBDECK_ARG_SECS"
echo "done $JOBDECK_JOB_ID $JOBDECK_ATTEMPT" >> "$LEDGER"
"#;

async fn drain_on_sigterm(env: Env) {
    // A job that fits in the drain grace finishes.
    let patient = env.config(
        "patient.toml",
        &[
            workers("10s", "drain_grace = \"5s\""),
            pipeline("nap", "", NAP),
        ]
        .concat(),
    );
    let mut w = env.worker(&patient, &["--no-scheduler"]);
    let short = env.enqueue("nap", Some("a"), &[("secs", "1")]).await;
    step_pid(&env, short, 1).await;
    w.signal(Signal::SIGTERM);
    let status = w
        .exit_within(Duration::from_secs(10))
        .await
        .expect("the worker exits after draining");
    assert_eq!(status.code(), Some(0));
    let job = env.job(short).await;
    assert_eq!(
        (job.state, job.attempt),
        (State::Succeeded, 1),
        "finished within the grace"
    );

    // One that does not is stopped and requeued as an interrupted attempt.
    let hasty = env.config(
        "hasty.toml",
        &[
            workers("10s", "drain_grace = \"1s\""),
            pipeline("nap", "", NAP),
        ]
        .concat(),
    );
    let mut w = env.worker(&hasty, &["--no-scheduler"]);
    let long = env.enqueue("nap", Some("b"), &[("secs", "60")]).await;
    let pid = step_pid(&env, long, 1).await;
    w.signal(Signal::SIGTERM);
    let status = w
        .exit_within(Duration::from_secs(10))
        .await
        .expect("the worker exits after the grace");
    assert_eq!(status.code(), Some(0));
    assert!(!alive(pid), "the step was stopped");
    let job = env.job(long).await;
    assert_eq!((job.state, job.attempt), (State::Queued, 1));
    let events = env.events(long).await;
    assert!(
        events
            .last()
            .is_some_and(|e| e.from == Some(State::Running) && e.detail.contains("interrupted")),
        "an interrupted attempt: {events:?}"
    );
    // The next worker completes it.
    let mut w = env.worker(&hasty, &["--no-scheduler", "--exit-when-idle"]);
    let status = w
        .exit_within(Duration::from_secs(20))
        .await
        .expect("--exit-when-idle exits");
    assert_eq!(status.code(), Some(0));
    let job = env.job(long).await;
    assert_eq!((job.state, job.attempt), (State::Succeeded, 2));
    assert_eq!(count(&env, "done", long), 1);
}

on_both_backends!(drain_on_sigterm);

async fn wait_exit_codes(env: Env) {
    let config = env.config(
        "w.toml",
        &[
            workers("10s", ""),
            pipeline("ok", "", HANG_ONCE),
            pipeline("bad", "max_attempts = 1", "exit 3"),
        ]
        .concat(),
    );
    let ok = env.enqueue("ok", None, &[]).await;
    let bad = env.enqueue("bad", None, &[]).await;
    let never = env.enqueue("nobody-runs-this", None, &[]).await;
    let _w = env.worker(&config, &["--no-scheduler"]);
    let wait = async |ids: &[i64], timeout: &str| {
        let mut args = vec!["wait".to_string(), "--timeout".into(), timeout.into()];
        args.extend(ids.iter().map(|i| i.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        env.cli(&args).await.code
    };
    assert_eq!(wait(&[ok], "20s").await, Some(0));
    assert_eq!(wait(&[bad], "20s").await, Some(1));
    assert_eq!(wait(&[ok, bad], "20s").await, Some(1));
    assert_eq!(wait(&[never], "1s").await, Some(124));
    assert_eq!(wait(&[ok, never], "1s").await, Some(124));
    assert_eq!(env.job(bad).await.state, State::Failed);
}

on_both_backends!(wait_exit_codes);
