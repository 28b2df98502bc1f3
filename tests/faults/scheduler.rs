//! Scenario 7, the scheduler on three nodes. The issue asks for 60 s; 20 s
//! (20 slots per schedule) is enough to see every slot fired exactly once
//! or skipped on three contending nodes and keeps the suite within its
//! budget on 2 cores (RELIABILITY.md says so). Two schedules run side by
//! side: per second with `overlap = "queue"`, and per second with `overlap
//! = "skip"` on a job that lasts 2.5 s, so that most slots are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::harness::{Env, Kind};
use crate::on_both_backends;

const RUN_FOR: Duration = Duration::from_secs(20);

const CONFIG: &str = r#"
[workers]
lease = "10s"
poll = "100ms"

[[pipeline]]
name = "tick"
[[pipeline.step]]
name = "noop"
builtin = "noop"

[[pipeline]]
name = "slow"
[[pipeline.step]]
name = "nap"
builtin = "sleep"
duration = "2500ms"

[[schedule]]
name = "queue"
pipeline = "tick"
cron = "* * * * * *"
overlap = "queue"

[[schedule]]
name = "skip"
pipeline = "slow"
cron = "* * * * * *"
overlap = "skip"
"#;

/// Fired slots (ms since the epoch) of schedule `name`, with their job ids.
async fn fires(env: &Env, name: &str) -> Vec<(i64, i64)> {
    let sql = match env.kind {
        Kind::Sqlite => format!(
            "SELECT j.fire_at, j.id FROM jobs j JOIN schedules s ON s.id = j.schedule_id \
             WHERE s.name = '{name}' ORDER BY j.fire_at"
        ),
        Kind::Postgres => format!(
            "SELECT (extract(epoch FROM j.fire_at) * 1000)::bigint, j.id FROM jobs j \
             JOIN schedules s ON s.id = j.schedule_id WHERE s.name = '{name}' ORDER BY j.fire_at"
        ),
    };
    env.query_ints(&sql)
        .await
        .into_iter()
        .map(|r| (r[0], r[1]))
        .collect()
}

fn slot_ms(text: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("slot {text:?}: {e}"))
        .timestamp_millis()
}

async fn three_node_scheduler(env: Env) {
    let config = env.config("sched.toml", CONFIG);
    let mut nodes: Vec<_> = (0..3)
        .map(|_| env.worker(&config, &["--slots", "2"]))
        .collect();
    tokio::time::sleep(RUN_FOR).await;
    for n in &nodes {
        n.signal(Signal::SIGTERM);
    }
    for n in &mut nodes {
        let status = n
            .exit_within(Duration::from_secs(20))
            .await
            .expect("the node drains and exits");
        assert_eq!(status.code(), Some(0));
    }

    // overlap = queue: one job per slot, no gap.
    let queued = fires(&env, "queue").await;
    let slots: BTreeSet<i64> = queued.iter().map(|f| f.0).collect();
    assert_eq!(slots.len(), queued.len(), "a slot fired twice: {queued:?}");
    assert!(queued.len() as u64 >= RUN_FOR.as_secs() - 3, "{queued:?}");
    let (first, last) = (queued[0].0, queued[queued.len() - 1].0);
    assert_eq!(
        queued.len() as i64,
        (last - first) / 1000 + 1,
        "every second has its job: {queued:?}"
    );

    // overlap = skip: each slot either fired once or was skipped once, and
    // each skip is an event on the job that blocked it.
    let fired = fires(&env, "skip").await;
    let fired_slots: BTreeSet<i64> = fired.iter().map(|f| f.0).collect();
    assert_eq!(
        fired_slots.len(),
        fired.len(),
        "a slot fired twice: {fired:?}"
    );
    let mut skipped: BTreeMap<i64, usize> = BTreeMap::new();
    for (_, id) in &fired {
        for e in env.events(*id).await {
            if let Some(rest) = e.detail.strip_prefix("schedule skip skipped slot ") {
                let text = rest.split(':').take(3).collect::<Vec<_>>().join(":");
                *skipped.entry(slot_ms(&text)).or_default() += 1;
            }
        }
    }
    assert!(
        skipped.values().all(|n| *n == 1),
        "a slot skipped twice: {skipped:?}"
    );
    assert!(
        skipped.keys().all(|s| !fired_slots.contains(s)),
        "a slot both fired and skipped"
    );
    assert!(
        skipped.len() >= fired.len(),
        "slow jobs make most slots skip: {skipped:?}"
    );
    let all: BTreeSet<i64> = fired_slots.iter().chain(skipped.keys()).copied().collect();
    let (lo, hi) = (*all.first().unwrap(), *all.last().unwrap());
    assert_eq!(
        all.len() as i64,
        (hi - lo) / 1000 + 1,
        "every slot fired or recorded a skip: fired {fired_slots:?}, skipped {skipped:?}"
    );
    eprintln!(
        "RESULT scheduler {:?}: 3 nodes, {}s; queue: {} slots fired once each; skip: {} fired, \
         {} skipped (each recorded), duplicates 0, gaps 0",
        env.kind,
        RUN_FOR.as_secs(),
        queued.len(),
        fired.len(),
        skipped.len()
    );
}

on_both_backends!(three_node_scheduler, permits = 2);
