//! The scheduler on two nodes: a per-second schedule fires every slot, on
//! time, exactly once.

use std::collections::BTreeSet;
use std::time::Duration;

use jobdeck::job::State;
use nix::sys::signal::Signal;

use crate::harness::{Env, Kind};
use crate::on_both_backends;

const CONFIG: &str = r#"
[workers]
lease = "10s"

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
    let config = env.config("w.toml", CONFIG);
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

    // (slot, created) in ms since the epoch, for every fired job.
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
    let fires: Vec<(i64, i64)> = env
        .query_ints(sql)
        .await
        .into_iter()
        .map(|r| (r[0], r[1]))
        .collect();
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
    let jobs = env.store.count_by_state().await.expect("counts");
    assert_eq!(
        jobs.get(&State::Succeeded).copied(),
        Some(fires.len() as i64),
        "{jobs:?}"
    );
}

on_both_backends!(schedule_fires_each_slot_once);
