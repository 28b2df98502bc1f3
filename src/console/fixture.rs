//! A fixed cluster for snapshot tests and documentation captures: every
//! pane has rows, every waiting reason and lock case appears once.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone, Utc};

use super::catalog::{Catalog, PipelineInfo};
use super::snapshot::Snapshot;
use crate::engine::{EngineStatus, SlotStatus};
use crate::job::{Event, Job, StalePolicy, State};
use crate::store::{LockInfo, ScheduleDef, ScheduleInfo, WorkerInfo};

/// The fixed "now" of the fixture.
pub fn now() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 14, 12, 0, 0).unwrap()
}

fn at(secs: i64) -> DateTime<Utc> {
    now() + TimeDelta::seconds(secs)
}

pub fn job(id: i64, pipeline: &str, target: Option<&str>, state: State) -> Job {
    Job {
        id,
        pipeline: pipeline.into(),
        target: target.map(Into::into),
        args: serde_json::Map::new(),
        state,
        priority: 0,
        due_at: at(-60),
        attempt: 0,
        max_attempts: 3,
        step: 0,
        lease_owner: None,
        lease_token: None,
        lease_expires_at: None,
        lock_fence: None,
        unique_key: None,
        cancel_requested_at: None,
        last_error: None,
        on_stale: StalePolicy::Hold,
        schedule_id: None,
        created_at: at(-120),
        started_at: None,
        finished_at: None,
    }
}

fn leased_to(mut j: Job, worker: &str, token: i64, expires: i64) -> Job {
    j.lease_owner = Some(worker.into());
    j.lease_token = Some(token);
    j.lease_expires_at = Some(at(expires));
    j
}

pub const NODE: &str = "laptop-4242-a1";
const OTHER: &str = "server-77-b2";
const GONE: &str = "frozen-13-c3";

pub fn catalog() -> Catalog {
    let steps = |s: &[&str]| s.iter().map(|x| x.to_string()).collect();
    let mut pipelines = BTreeMap::new();
    pipelines.insert(
        "sync".into(),
        PipelineInfo {
            steps: steps(&["sync", "verify", "retention", "harvest"]),
            lease: Duration::from_secs(30),
        },
    );
    pipelines.insert(
        "stuck".into(),
        PipelineInfo {
            steps: steps(&["prepare", "hang"]),
            lease: Duration::from_secs(6),
        },
    );
    Catalog {
        pipelines,
        worker_alive: Duration::from_secs(30),
    }
}

pub fn snapshot() -> Snapshot {
    let mut queued = vec![
        job(11, "sync", Some("dataset-a"), State::Queued),
        job(12, "sync", Some("dataset-d"), State::Queued),
        job(13, "sync", Some("dataset-e"), State::Queued),
        job(14, "report", None, State::Queued),
        job(15, "sync", Some("dataset-f"), State::Queued),
    ];
    queued[0].priority = 5;
    queued[1].attempt = 1;
    queued[1].due_at = at(12);
    queued[1].last_error = Some("step verify exited with status 2".into());
    queued[2].due_at = at(5);

    let leased = vec![leased_to(
        job(16, "sync", Some("dataset-c"), State::Leased),
        OTHER,
        901,
        25,
    )];

    let mut r1 = leased_to(
        job(7, "sync", Some("dataset-a"), State::Running),
        NODE,
        880,
        22,
    );
    r1.step = 1;
    r1.attempt = 1;
    r1.lock_fence = Some(41);
    r1.started_at = Some(at(-75));
    let mut r2 = leased_to(
        job(8, "sync", Some("dataset-b"), State::Running),
        OTHER,
        881,
        6,
    );
    r2.step = 3;
    r2.attempt = 2;
    r2.lock_fence = Some(12);
    r2.started_at = Some(at(-200));
    let running = vec![r1, r2];

    let mut s1 = leased_to(
        job(5, "stuck", Some("dataset-stuck"), State::Stale),
        GONE,
        870,
        -14,
    );
    s1.step = 1;
    s1.attempt = 1;
    s1.lock_fence = Some(3);
    s1.started_at = Some(at(-40));
    let stale = vec![s1];

    let mut f1 = job(4, "sync", Some("dataset-c"), State::Succeeded);
    f1.started_at = Some(at(-300));
    f1.finished_at = Some(at(-30));
    let mut f2 = job(3, "sync", Some("dataset-d"), State::Failed);
    f2.started_at = Some(at(-400));
    f2.finished_at = Some(at(-320));
    f2.last_error = Some("step harvest exited with status 1: disk full".into());
    let mut f3 = job(2, "report", None, State::Cancelled);
    f3.started_at = Some(at(-500));
    f3.finished_at = Some(at(-480));
    f3.last_error = Some("cancelled by operator:ana@ops".into());
    let finished = vec![f1, f2, f3];

    let lock =
        |target: &str, fence, job_id, job_state, worker: &str, held: i64, waiting| LockInfo {
            target: target.into(),
            fence,
            job_id,
            job_state,
            worker_id: Some(worker.into()),
            acquired_at: at(-held),
            expires_at: None,
            waiting,
        };
    let locks = vec![
        lock("dataset-a", 41, 7, State::Running, NODE, 75, 1),
        lock("dataset-b", 12, 8, State::Running, OTHER, 200, 0),
        lock("dataset-stuck", 3, 5, State::Stale, GONE, 40, 0),
    ];

    let worker = |id: &str, host: &str, pid, busy, beat: i64, gone| WorkerInfo {
        id: id.into(),
        host: host.into(),
        pid,
        slots: 4,
        busy,
        paused: false,
        pipelines: vec!["sync".into(), "stuck".into()],
        started_at: at(-3600),
        heartbeat_at: at(-beat),
        gone,
    };
    let workers = vec![
        worker(NODE, "laptop", 4242, 1, 2, false),
        worker(OTHER, "server", 77, 2, 4, false),
        worker(GONE, "frozen", 13, 1, 95, true),
    ];

    let schedules = vec![ScheduleInfo {
        id: 1,
        def: ScheduleDef {
            name: "nightly-sync".into(),
            pipeline: "sync".into(),
            target: Some("dataset-a".into()),
            args: serde_json::Map::new(),
            cron: "*/10 * * * * *".into(),
            timezone: "UTC".into(),
            overlap_queue: false,
            enabled: true,
            max_attempts: None,
        },
        paused: false,
        next_fire_at: Some(at(4)),
        last_fire_at: Some(at(-6)),
        last_job_id: Some(11),
        last_skip_at: Some(at(-16)),
    }];

    let counts = BTreeMap::from([
        (State::Queued, 5),
        (State::Leased, 1),
        (State::Running, 2),
        (State::Stale, 1),
        (State::Succeeded, 40),
        (State::Failed, 3),
        (State::Cancelled, 1),
    ]);

    Snapshot {
        db_now: Some(now()),
        clock_skew: TimeDelta::zero(),
        counts,
        queued,
        leased,
        running,
        stale,
        finished,
        locks,
        workers,
        schedules,
        histogram: vec![0, 1, 2, 1, 0, 3, 4, 2, 1, 0, 2, 5, 3, 1, 2, 0, 1, 4, 6, 3],
        detail: None,
        error: None,
    }
}

/// Events and output for the detail view of job 7.
pub fn with_detail(mut snap: Snapshot, id: i64) -> Snapshot {
    let job = snap.job(id).cloned().expect("fixture job");
    let ev = |n: i64, secs: i64, from: Option<State>, to: State, actor: &str, detail: &str| Event {
        id: n,
        job_id: id,
        at: at(secs),
        from,
        to,
        actor: actor.into(),
        detail: detail.into(),
    };
    snap.detail = Some(super::snapshot::Detail {
        job,
        events: vec![
            ev(1, -120, None, State::Queued, "operator:ana@ops", "enqueued"),
            ev(2, -80, Some(State::Queued), State::Leased, NODE, "claimed"),
            ev(
                3,
                -75,
                Some(State::Leased),
                State::Running,
                NODE,
                "lock dataset-a fence 41",
            ),
        ],
        output: Some("syncing dataset-a\n1200 files copied\nverifying checksums…\n".into()),
    });
    snap
}

/// This node's engine: one slot busy with job 7, running.
pub fn engine() -> EngineStatus {
    EngineStatus {
        worker_id: NODE.into(),
        slots: 4,
        paused: false,
        draining_until: None,
        database_error: None,
        running: vec![SlotStatus {
            job_id: 7,
            pipeline: "sync".into(),
            target: Some("dataset-a".into()),
            step: 1,
            step_name: "verify".into(),
            steps_total: 4,
            started_at: at(-75),
        }],
        leased: 0,
        ..EngineStatus::default()
    }
}
