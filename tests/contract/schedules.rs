//! Schedules: sync, firing each slot once, overlap, manual fires, pause.

use chrono::{DateTime, TimeZone, Utc};

use jobdeck::job::State;
use jobdeck::store::{FireResult, FireSlot, ScheduleDef, ScheduleInfo, Store, StoreError};

use crate::common::*;

fn t(h: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2030, 1, 1, h, 0, 0).unwrap()
}

fn def(name: &str, cron: &str, overlap_queue: bool) -> ScheduleDef {
    let mut args = serde_json::Map::new();
    args.insert("mode".into(), serde_json::json!("full"));
    ScheduleDef {
        name: name.into(),
        pipeline: "sync".into(),
        target: Some("t".into()),
        args,
        cron: cron.into(),
        timezone: "UTC".into(),
        overlap_queue,
        enabled: true,
        max_attempts: Some(5),
    }
}

async fn schedule(store: &Store, name: &str) -> ScheduleInfo {
    store
        .list_schedules()
        .await
        .unwrap()
        .into_iter()
        .find(|s| s.def.name == name)
        .unwrap_or_else(|| panic!("no schedule {name}"))
}

fn due(expected: DateTime<Utc>, next: DateTime<Utc>) -> FireSlot {
    FireSlot::Due {
        expected_next: expected,
        next: Some(next),
    }
}

contract_test!(sync_keeps_the_slot_and_the_pause, |store| async move {
    store
        .sync_schedules(&[
            (def("nightly", "0 0 1 * * *", false), Some(t(1))),
            (def("a-first", "0 0 * * * *", true), Some(t(2))),
        ])
        .await
        .unwrap();
    let all = store.list_schedules().await.unwrap();
    let names: Vec<&str> = all.iter().map(|s| s.def.name.as_str()).collect();
    assert_eq!(names, vec!["a-first", "nightly"]);
    let s = &all[1];
    assert_eq!(s.def, def("nightly", "0 0 1 * * *", false));
    assert_eq!(
        (s.next_fire_at, s.paused, s.last_fire_at, s.last_job_id),
        (Some(t(1)), false, None, None)
    );

    store.set_schedule_paused("nightly", true).await.unwrap();
    // Same timing: the pending slot stays; other fields follow the config.
    let mut changed = def("nightly", "0 0 1 * * *", true);
    changed.pipeline = "verify".into();
    store
        .sync_schedules(&[(changed.clone(), Some(t(3)))])
        .await
        .unwrap();
    let s = schedule(&store, "nightly").await;
    assert_eq!((s.next_fire_at, s.paused), (Some(t(1)), true));
    assert_eq!(s.def, changed);
    // New timing: the slot is recomputed; the pause survives.
    let retimed = def("nightly", "0 0 2 * * *", true);
    store
        .sync_schedules(&[(retimed, Some(t(4)))])
        .await
        .unwrap();
    let s = schedule(&store, "nightly").await;
    assert_eq!((s.next_fire_at, s.paused), (Some(t(4)), true));
    store.set_schedule_paused("nightly", false).await.unwrap();
    assert!(!schedule(&store, "nightly").await.paused);
    let e = store.set_schedule_paused("nope", true).await.unwrap_err();
    assert!(matches!(e, StoreError::Invalid(_)));
    assert_eq!(e.to_string(), "no schedule named nope");
});

contract_test!(
    a_due_slot_fires_once_and_overlap_skips,
    |store| async move {
        store
            .sync_schedules(&[(def("nightly", "0 0 * * * *", false), Some(t(1)))])
            .await
            .unwrap();
        let id = schedule(&store, "nightly").await.id;
        let fired = store
            .fire_schedule(id, due(t(1), t(2)), "scheduler:n1")
            .await
            .unwrap();
        let FireResult::Fired { job_id } = fired else {
            panic!("expected a fire, got {fired:?}");
        };
        // The other node, a moment late, with the same expected slot.
        assert_eq!(
            store
                .fire_schedule(id, due(t(1), t(2)), "scheduler:n2")
                .await
                .unwrap(),
            FireResult::NotFired
        );
        let s = schedule(&store, "nightly").await;
        assert_eq!((s.next_fire_at, s.last_job_id), (Some(t(2)), Some(job_id)));
        assert!(s.last_fire_at.is_some() && s.last_skip_at.is_none());
        let job = store.get_job(job_id).await.unwrap();
        assert_eq!(job.schedule_id, Some(id));
        assert_eq!(
            (job.pipeline.as_str(), job.target.as_deref()),
            ("sync", Some("t"))
        );
        assert_eq!((job.state, job.max_attempts), (State::Queued, 5));
        assert_eq!(job.args.get("mode"), Some(&serde_json::json!("full")));
        let ev = store.job_events(job_id).await.unwrap();
        assert_eq!(
            (ev[0].from, ev[0].to, ev[0].actor.as_str()),
            (None, State::Queued, "scheduler:n1")
        );
        assert_eq!(ev[0].detail, "schedule nightly, slot 2030-01-01T01:00:00Z");

        // Its job is unfinished: the next slot is skipped, and says so.
        let skipped = store
            .fire_schedule(id, due(t(2), t(3)), "scheduler:n1")
            .await
            .unwrap();
        assert_eq!(
            skipped,
            FireResult::Skipped {
                blocking_job: job_id
            }
        );
        let s = schedule(&store, "nightly").await;
        assert_eq!(s.next_fire_at, Some(t(3)));
        assert!(s.last_skip_at.is_some());
        let ev = store.job_events(job_id).await.unwrap();
        let last = ev.last().unwrap();
        assert_eq!((last.from, last.to), (Some(State::Queued), State::Queued));
        assert_eq!(
            last.detail,
            format!("schedule nightly skipped slot 2030-01-01T02:00:00Z: job #{job_id} unfinished")
        );
        assert_eq!(store.count_by_state().await.unwrap()[&State::Queued], 1);

        // By hand: same overlap rule, the cron slot untouched.
        assert_eq!(
            store
                .fire_schedule(id, FireSlot::Manual, OPERATOR)
                .await
                .unwrap(),
            FireResult::Skipped {
                blocking_job: job_id
            }
        );
        store.cancel(job_id, OPERATOR).await.unwrap();
        let FireResult::Fired { job_id: manual } = store
            .fire_schedule(id, FireSlot::Manual, OPERATOR)
            .await
            .unwrap()
        else {
            panic!("manual fire refused");
        };
        let s = schedule(&store, "nightly").await;
        assert_eq!((s.next_fire_at, s.last_job_id), (Some(t(3)), Some(manual)));
        assert_eq!(store.get_job(manual).await.unwrap().schedule_id, Some(id));
    }
);

contract_test!(overlap_queue_and_pause, |store| async move {
    store
        .sync_schedules(&[
            (def("q", "0 0 * * * *", true), Some(t(1))),
            (def("off", "0 0 * * * *", false), Some(t(1))),
        ])
        .await
        .unwrap();
    let q = schedule(&store, "q").await.id;
    let a = store.fire_schedule(q, due(t(1), t(2)), "s").await.unwrap();
    let b = store.fire_schedule(q, due(t(2), t(3)), "s").await.unwrap();
    assert!(matches!(
        (a, b),
        (FireResult::Fired { .. }, FireResult::Fired { .. })
    ));
    assert_eq!(store.count_by_state().await.unwrap()[&State::Queued], 2);

    store.set_schedule_paused("off", true).await.unwrap();
    let off = schedule(&store, "off").await.id;
    assert_eq!(
        store
            .fire_schedule(off, due(t(1), t(2)), "s")
            .await
            .unwrap(),
        FireResult::NotFired
    );
    let s = schedule(&store, "off").await;
    assert_eq!(
        (s.next_fire_at, s.last_job_id),
        (Some(t(2)), None),
        "a paused slot still moves on"
    );
    // Disabled in the config: the same.
    let mut disabled = def("off", "0 0 * * * *", false);
    disabled.enabled = false;
    store.set_schedule_paused("off", false).await.unwrap();
    store
        .sync_schedules(&[(disabled, Some(t(9)))])
        .await
        .unwrap();
    assert_eq!(
        store
            .fire_schedule(off, due(t(2), t(3)), "s")
            .await
            .unwrap(),
        FireResult::NotFired
    );
    assert_eq!(schedule(&store, "off").await.next_fire_at, Some(t(3)));
    assert_eq!(store.count_by_state().await.unwrap()[&State::Queued], 2);
});
