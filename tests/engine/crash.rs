//! Crash recovery: `kill -9` of a worker in the middle of running command
//! jobs. Its steps die with it, its running jobs go stale after lease +
//! grace and follow their `on_stale`, its leased-but-not-started job goes
//! back to the queue, and a second worker carries on.

use std::time::Duration;

use jobdeck::job::{Job, State};

use crate::harness::{Env, eventually, ns_of};
use crate::on_both_backends;
use crate::scripts::{HANG_ONCE, all_gone, count, pipeline, step_pid, workers};

/// DESIGN.md: grace before stale = max(2 s, lease/10).
const GRACE: Duration = Duration::from_secs(2);

fn config() -> String {
    [
        workers("2s", ""),
        pipeline("hold", "on_stale = \"hold\"", HANG_ONCE),
        pipeline("release", "on_stale = \"release\"", HANG_ONCE),
        pipeline("retry", "on_stale = \"retry\"", HANG_ONCE),
        pipeline("quick", "", HANG_ONCE),
    ]
    .concat()
}

async fn locked_targets(env: &Env) -> Vec<(String, i64, String)> {
    let locks = env.cli_json(&["locks"]).await;
    locks
        .as_array()
        .expect("locks --json is an array")
        .iter()
        .map(|l| {
            (
                l["target"].as_str().unwrap_or_default().to_string(),
                l["job_id"].as_i64().unwrap_or_default(),
                l["job_state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The time of the job's move into `to` (the last one).
fn moved_at(events: &[jobdeck::job::Event], to: State) -> Option<i128> {
    events
        .iter()
        .rev()
        .find(|e| e.to == to)
        .map(|e| ns_of(e.at))
}

/// A stale job went stale no earlier than its lease's end plus the grace.
fn assert_stale_after_grace(job: &Job, events: &[jobdeck::job::Event]) {
    let expiry = job
        .lease_expires_at
        .expect("a stale job keeps its lease expiry");
    let stale_at = moved_at(events, State::Stale).expect("a stale event");
    assert!(
        stale_at >= ns_of(expiry) + GRACE.as_nanos() as i128,
        "job {} went stale {} ms after its lease ended, before the grace",
        job.id,
        (stale_at - ns_of(expiry)) / 1_000_000
    );
}

async fn crash_recovery(env: Env) {
    let config = env.config("worker.toml", &config());
    // The job on t-leased stays leased on worker A: its start keeps failing.
    env.block_start("t-leased").await;
    let mut a = env.worker(&config, &["--slots", "8", "--no-scheduler"]);
    let hang = [("hang", "yes")];
    let hold = env.enqueue("hold", Some("t-hold"), &hang).await;
    let hold2 = env.enqueue("hold", Some("t-hold2"), &hang).await;
    let release = env.enqueue("release", Some("t-release"), &hang).await;
    let retry = env.enqueue("retry", Some("t-retry"), &hang).await;
    let leased = env.enqueue("quick", Some("t-leased"), &[]).await;
    let mut pids = Vec::new();
    for id in [hold, hold2, release, retry] {
        pids.push(step_pid(&env, id, 1).await);
    }
    let a_id = a.id(&env).await;
    eventually(
        "the blocked job to be leased by A",
        Duration::from_secs(10),
        async || {
            let job = env.job(leased).await;
            (job.state == State::Leased && job.lease_owner.as_deref() == Some(&a_id)).then_some(())
        },
    )
    .await;

    a.kill9().await;
    // The supervisors see their worker die and take the steps down.
    all_gone(&pids, Duration::from_millis(1500)).await;
    env.unblock_start().await;
    let waiting_hold = env.enqueue("quick", Some("t-hold"), &[]).await;
    let waiting_release = env.enqueue("quick", Some("t-release"), &[]).await;
    let _b = env.worker(&config, &["--slots", "8", "--no-scheduler"]);

    // Leased, never started: back to the queue without using an attempt,
    // then run by B.
    let job = env
        .wait_state(leased, State::Succeeded, Duration::from_secs(20))
        .await;
    assert_eq!(
        job.attempt, 1,
        "an expired lease before start is not an attempt"
    );
    let events = env.events(leased).await;
    assert!(
        events
            .iter()
            .any(|e| e.from == Some(State::Leased) && e.to == State::Queued),
        "job {leased} went back to queued: {events:?}"
    );
    assert!(
        events
            .iter()
            .all(|e| !(e.to == State::Running && e.actor == a_id)),
        "the killed worker never started job {leased}"
    );

    // on_stale = retry: back to the queue (attempt used), run again by B.
    let job = env
        .wait_state(retry, State::Succeeded, Duration::from_secs(20))
        .await;
    assert_eq!(job.attempt, 2);
    let events = env.events(retry).await;
    let expired = events
        .iter()
        .find(|e| e.from == Some(State::Running) && e.to == State::Queued)
        .unwrap_or_else(|| panic!("job {retry} was not put back by the reaper: {events:?}"));
    assert!(expired.actor.starts_with("reaper:"), "{expired:?}");

    // on_stale = hold / release: stale; hold keeps the lock, release frees it.
    for id in [hold, hold2, release] {
        let job = env
            .wait_state(id, State::Stale, Duration::from_secs(20))
            .await;
        assert_stale_after_grace(&job, &env.events(id).await);
    }
    env.wait_state(waiting_release, State::Succeeded, Duration::from_secs(20))
        .await;
    let locks = locked_targets(&env).await;
    assert!(
        locks.contains(&("t-hold".into(), hold, "stale".into())),
        "{locks:?}"
    );
    assert!(
        locks.contains(&("t-hold2".into(), hold2, "stale".into())),
        "{locks:?}"
    );
    assert!(
        !locks.iter().any(|l| l.0 == "t-release"),
        "release frees the lock: {locks:?}"
    );
    assert_eq!(
        env.job(waiting_hold).await.state,
        State::Queued,
        "t-hold is quarantined while its stale job holds the lock"
    );

    // Operators: release the lock of one held job (it stays stale), requeue
    // the others; everything then completes.
    let out = env.cli(&["release", "t-hold2"]).await;
    assert!(out.ok(), "release t-hold2: {}", out.stderr);
    assert!(!locked_targets(&env).await.iter().any(|l| l.0 == "t-hold2"));
    assert_eq!(env.job(hold2).await.state, State::Stale);
    for id in [hold, hold2, release] {
        let out = env.cli(&["requeue", &id.to_string()]).await;
        assert!(out.ok(), "requeue {id}: {}", out.stderr);
    }
    for id in [hold, hold2, release, waiting_hold] {
        env.wait_state(id, State::Succeeded, Duration::from_secs(20))
            .await;
    }
    assert!(locked_targets(&env).await.is_empty());

    // Every job accounted for: succeeded, finished its script exactly once;
    // the hung ones were started twice (attempts 1 and 2), the others once.
    for id in [
        hold,
        hold2,
        release,
        retry,
        leased,
        waiting_hold,
        waiting_release,
    ] {
        assert_eq!(env.job(id).await.state, State::Succeeded, "job {id}");
        assert_eq!(
            count(&env, "done", id),
            1,
            "job {id} finished its script once"
        );
    }
    for id in [hold, hold2, release, retry] {
        assert_eq!(count(&env, "pid", id), 2, "job {id} ran twice");
    }
    for id in [leased, waiting_hold, waiting_release] {
        assert_eq!(count(&env, "pid", id), 1, "job {id} ran once");
    }
}

on_both_backends!(crash_recovery);
