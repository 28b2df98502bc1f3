//! Stopping a running step: operator cancel, cancel of a dead worker's job,
//! lease loss, and the step timeout.

use std::time::Duration;

use jobdeck::job::State;

use crate::harness::{Env, alive, now_ns, ns_of};
use crate::on_both_backends;
use crate::scripts::{HANG_ONCE, all_gone, count, pipeline, step_pid, workers};

const HANG: [(&str, &str); 1] = [("hang", "yes")];

async fn cancel_stops_the_process(env: Env) {
    let config = env.config(
        "w.toml",
        &[workers("3s", ""), pipeline("p", "", HANG_ONCE)].concat(),
    );
    let _w = env.worker(&config, &["--no-scheduler"]);
    let id = env.enqueue("p", Some("t"), &HANG).await;
    let pid = step_pid(&env, id, 1).await;
    let out = env.cli(&["cancel", &id.to_string()]).await;
    assert!(out.ok(), "cancel: {}", out.stderr);
    let job = env
        .wait_state(id, State::Cancelled, Duration::from_secs(10))
        .await;
    assert!(
        !alive(pid),
        "the step {pid} is gone once the job is cancelled"
    );
    assert_eq!(job.attempt, 1);
    assert!(
        env.cli_json(&["locks"])
            .await
            .as_array()
            .is_some_and(|l| l.is_empty())
    );
}

on_both_backends!(cancel_stops_the_process);

async fn cancel_of_a_dead_workers_job(env: Env) {
    // on_stale = retry would run it again: a pending cancel must win.
    let config = env.config(
        "w.toml",
        &[
            workers("2s", ""),
            pipeline("p", "on_stale = \"retry\"", HANG_ONCE),
        ]
        .concat(),
    );
    let mut a = env.worker(&config, &["--no-scheduler"]);
    let id = env.enqueue("p", Some("t"), &HANG).await;
    let pid = step_pid(&env, id, 1).await;
    a.kill9().await;
    all_gone(&[pid], Duration::from_millis(1500)).await;
    let out = env.cli(&["cancel", &id.to_string()]).await;
    assert!(out.ok(), "cancel: {}", out.stderr);
    assert_eq!(
        env.job(id).await.state,
        State::Running,
        "only requested while its lease runs"
    );
    let _b = env.worker(&config, &["--no-scheduler"]);
    let job = env
        .wait_state(id, State::Cancelled, Duration::from_secs(15))
        .await;
    assert_eq!(job.attempt, 1, "never retried");
    assert_eq!(count(&env, "pid", id), 1, "never ran again");
    let events = env.events(id).await;
    let last = events.last().expect("events");
    assert!(
        last.actor.starts_with("reaper:"),
        "the reaper ended it: {last:?}"
    );
    assert!(!events.iter().any(|e| e.to == State::Stale), "{events:?}");
}

on_both_backends!(cancel_of_a_dead_workers_job);

/// The worker's token stops matching (as after a takeover it did not see):
/// its next renewal finds the lease lost, it stops the step and writes
/// nothing more; the job goes stale, and an operator requeue runs it again.
async fn lease_loss_stops_the_process(env: Env) {
    let config = env.config(
        "w.toml",
        &[
            workers("3s", ""),
            pipeline("p", "on_stale = \"hold\"", HANG_ONCE),
        ]
        .concat(),
    );
    let w = env.worker(&config, &["--no-scheduler"]);
    let id = env.enqueue("p", Some("t"), &HANG).await;
    let pid = step_pid(&env, id, 1).await;
    let w_id = w.id(&env).await;
    let lost_at = now_ns();
    env.sql(&format!(
        "UPDATE jobs SET lease_token = lease_token + 7 WHERE id = {id}"
    ))
    .await;
    // Renewal every lease/3, then SIGTERM (the kill grace is 1 s).
    all_gone(&[pid], Duration::from_secs(4)).await;
    let job = env
        .wait_state(id, State::Stale, Duration::from_secs(15))
        .await;
    assert_eq!(job.attempt, 1);
    let late: Vec<_> = env
        .events(id)
        .await
        .into_iter()
        .filter(|e| e.actor == w_id && ns_of(e.at) > lost_at)
        .collect();
    assert!(
        late.is_empty(),
        "the worker wrote after losing the lease: {late:?}"
    );

    let out = env.cli(&["requeue", &id.to_string()]).await;
    assert!(out.ok(), "requeue: {}", out.stderr);
    let job = env
        .wait_state(id, State::Succeeded, Duration::from_secs(15))
        .await;
    assert_eq!(job.attempt, 2);
    assert_eq!(count(&env, "done", id), 1);
}

on_both_backends!(lease_loss_stops_the_process);

async fn step_timeout_kills_and_retries(env: Env) {
    let script = HANG_ONCE;
    let pipe = format!(
        "[[pipeline]]\nname = \"p\"\nbackoff = \"100ms\"\nmax_attempts = 2\n\
         [[pipeline.step]]\nname = \"slow\"\ntimeout = \"1s\"\nrun = [\"sh\", \"-c\", '''{script}''']\n"
    );
    let config = env.config("w.toml", &[workers("10s", ""), pipe].concat());
    let _w = env.worker(&config, &["--no-scheduler"]);
    let id = env.enqueue("p", Some("t"), &HANG).await;
    let pid = step_pid(&env, id, 1).await;
    // Timeout 1 s, then SIGTERM ends `sleep` at once.
    all_gone(&[pid], Duration::from_secs(4)).await;
    let job = env
        .wait_state(id, State::Succeeded, Duration::from_secs(15))
        .await;
    assert_eq!(job.attempt, 2, "the timeout took the retry path");
    let events = env.events(id).await;
    assert!(
        events.iter().any(|e| e.from == Some(State::Running)
            && e.to == State::Queued
            && e.detail.contains("timed out")),
        "a timed-out attempt: {events:?}"
    );
}

on_both_backends!(step_timeout_kills_and_retries);
