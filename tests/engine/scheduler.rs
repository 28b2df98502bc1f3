//! The scheduler on two nodes: a per-second schedule fires every slot, on
//! time, exactly once; a draining node fires no more.

use std::collections::BTreeSet;
use std::time::Duration;

use jobdeck::job::State;
use nix::sys::signal::Signal;

use crate::harness::{Env, Kind, eventually, now_ns};
use crate::on_both_backends;
use crate::scripts::{pipeline, step_pid, workers};

/// A no-op pipeline fired every second.
const TICK_EVERY_SECOND: &str = r#"
[[pipeline]]
name = "tick"
[[pipeline.step]]
name = "noop"
builtin = "noop"

[[schedule]]
name = "every-second"
pipeline = "tick"
cron = "* * * * * *"
overlap = "queue"
"#;

/// How late a fire may be created after its slot.
const ON_TIME: i64 = 1000;

async fn schedule_fires_each_slot_once(env: Env) {
    let config = env.config(
        "w.toml",
        &[workers("10s", ""), TICK_EVERY_SECOND.to_string()].concat(),
    );
    let mut nodes = vec![env.worker(&config, &[]), env.worker(&config, &[])];
    tokio::time::sleep(Duration::from_secs(8)).await;
    for n in &nodes {
        n.signal(Signal::SIGTERM);
    }
    for n in &mut nodes {
        let status = n
            .exit_within(Duration::from_secs(15))
            .await
            .expect("the node exits");
        assert_eq!(status.code(), Some(0));
    }

    let fires = fires(&env).await;
    assert!(
        fires.len() >= 6,
        "about one fire per second over 8 s: {fires:?}"
    );
    let slots: BTreeSet<i64> = fires.iter().map(|f| f.0).collect();
    assert_eq!(slots.len(), fires.len(), "a slot fired twice: {fires:?}");
    for (slot, created) in &fires {
        assert_eq!(slot % 1000, 0, "slots are whole seconds: {slot}");
        assert!(
            (0..ON_TIME).contains(&(created - slot)),
            "slot {slot} fired {} ms after its time",
            created - slot
        );
    }
    let (first, last) = (fires[0].0, fires[fires.len() - 1].0);
    assert_eq!(
        fires.len() as i64,
        (last - first) / 1000 + 1,
        "every second between the first and last fire has its job: {fires:?}"
    );
    // A draining node fires no more, but a tick already under way when
    // SIGTERM came may fire one last slot that no node is left to run: it
    // waits, queued, for the next start.
    let jobs = env.store.count_by_state().await.expect("counts");
    let count = |state| jobs.get(&state).copied().unwrap_or(0);
    assert!(count(State::Queued) <= 1, "{jobs:?}");
    assert_eq!(
        count(State::Succeeded) + count(State::Queued),
        fires.len() as i64,
        "every fired job ran, or waits: {jobs:?}"
    );
}

on_both_backends!(schedule_fires_each_slot_once);

/// (slot, created) in ms since the epoch, for every fired job.
async fn fires(env: &Env) -> Vec<(i64, i64)> {
    let sql = match env.kind {
        Kind::Sqlite => {
            "SELECT fire_at, created_at FROM jobs WHERE schedule_id IS NOT NULL ORDER BY fire_at"
        }
        Kind::Postgres => {
            "SELECT (extract(epoch FROM fire_at) * 1000)::bigint, \
                    (extract(epoch FROM created_at) * 1000)::bigint \
             FROM jobs WHERE schedule_id IS NOT NULL ORDER BY fire_at"
        }
    };
    env.query_ints(sql)
        .await
        .into_iter()
        .map(|r| (r[0], r[1]))
        .collect()
}

async fn draining_node_fires_no_more(env: Env) {
    // A running job holds the drain open for seconds.
    let config = env.config(
        "w.toml",
        &[
            workers("10s", "drain_grace = \"10s\""),
            pipeline(
                "nap",
                "",
                "echo \"pid $JOBDECK_JOB_ID $JOBDECK_ATTEMPT $$\" >> \"$LEDGER\"; sleep 5",
            ),
            TICK_EVERY_SECOND.to_string(),
        ]
        .concat(),
    );
    let mut node = env.worker(&config, &[]);
    let nap = env.enqueue("nap", None, &[]).await;
    step_pid(&env, nap, 1).await;
    eventually_fired(&env).await;
    let drain_began_ms = (now_ns() / 1_000_000) as i64;
    node.signal(Signal::SIGTERM);
    let status = node
        .exit_within(Duration::from_secs(15))
        .await
        .expect("the node exits after its job");
    assert_eq!(status.code(), Some(0));
    assert_eq!(env.job(nap).await.state, State::Succeeded);
    // A tick already under way at SIGTERM may still fire once.
    let late: Vec<_> = fires(&env)
        .await
        .into_iter()
        .filter(|(_, created)| *created > drain_began_ms + ON_TIME)
        .collect();
    assert!(late.is_empty(), "fired while draining: {late:?}");
}

/// Waits for the schedule's first fire.
async fn eventually_fired(env: &Env) {
    eventually(
        "the schedule to fire",
        Duration::from_secs(10),
        async || (!fires(env).await.is_empty()).then_some(()),
    )
    .await;
}

on_both_backends!(draining_node_fires_no_more);
