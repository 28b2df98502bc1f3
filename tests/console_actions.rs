//! Console actions against a real SQLite store (temp file): each command
//! goes through the store as the operator and answers with a flash line.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{LONG, OPERATOR, enqueue, running_job, spec, sqlite_store, worker_beat};
use jobdeck::console::Command;
use jobdeck::console::actions::{Ctx, EnqueueSpec, execute};
use jobdeck::console::snapshot::fetch::{FetchRequest, fetch};
use jobdeck::console::snapshot::why::{Wait, why_waiting};
use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{ScheduleDef, Store};

fn ctx(store: &Store) -> Ctx {
    Ctx {
        store: store.clone(),
        engine: None,
        actor: OPERATOR.into(),
        worker_alive: Duration::from_secs(90),
        max_attempts: [("sync".to_string(), 5)].into_iter().collect(),
    }
}

#[tokio::test]
async fn cancel_a_queued_job_and_explain_a_refusal() {
    let (store, _dir) = sqlite_store().await;
    let a = enqueue(&store, "p", Some("t1")).await;
    let b = enqueue(&store, "p", Some("t2")).await;

    let flash = execute(Command::Cancel(vec![a]), &ctx(&store)).await;
    assert!(!flash.error, "{flash:?}");
    assert_eq!(flash.text, format!("job {a} cancelled"));
    assert_eq!(store.get_job(a).await.unwrap().state, State::Cancelled);
    let events = store.job_events(a).await.unwrap();
    assert_eq!(events.last().unwrap().actor, OPERATOR);

    // Several at once: the finished one is refused in the store's words.
    let flash = execute(Command::Cancel(vec![a, b]), &ctx(&store)).await;
    assert!(flash.error);
    assert_eq!(
        flash.text,
        format!(
            "1 of 2 jobs cancelled; 1 refused, first: job {a} is cancelled: it has already finished"
        )
    );
    assert_eq!(store.get_job(b).await.unwrap().state, State::Cancelled);
}

#[tokio::test]
async fn cancel_a_running_job_is_a_request() {
    let (store, _dir) = sqlite_store().await;
    let (lease, _) = running_job(&store, "w1", "p", Some("t"), spec(LONG, StalePolicy::Hold)).await;
    let flash = execute(Command::Cancel(vec![lease.id]), &ctx(&store)).await;
    assert_eq!(
        flash.text,
        format!("job {} cancel requested (its worker stops it)", lease.id)
    );
    let job = store.get_job(lease.id).await.unwrap();
    assert!(job.cancel_requested_at.is_some());
}

#[tokio::test]
async fn requeue_cancelled_and_refuse_running() {
    let (store, _dir) = sqlite_store().await;
    let a = enqueue(&store, "p", None).await;
    store.cancel(a, OPERATOR).await.unwrap();
    let flash = execute(Command::Requeue(vec![a]), &ctx(&store)).await;
    assert_eq!(flash.text, format!("job {a} requeued"));
    assert_eq!(store.get_job(a).await.unwrap().state, State::Queued);

    let (lease, _) = running_job(&store, "w1", "q", Some("t"), spec(LONG, StalePolicy::Hold)).await;
    let flash = execute(Command::Requeue(vec![lease.id]), &ctx(&store)).await;
    assert!(flash.error);
    assert_eq!(
        flash.text,
        format!("job {} is running: cancel it first", lease.id)
    );
}

#[tokio::test]
async fn extend_lengthens_a_live_workers_lease_and_refuses_a_gone_one() {
    let (store, _dir) = sqlite_store().await;
    let (lease, _) = running_job(&store, "w1", "p", Some("t"), spec(LONG, StalePolicy::Hold)).await;
    let mut beat = worker_beat("w1");
    beat.pipelines = vec!["p".into()];
    store.renew(&beat, &[lease], LONG).await.unwrap();
    let before = store
        .get_job(lease.id)
        .await
        .unwrap()
        .lease_expires_at
        .unwrap();

    let cmd = Command::Extend {
        ids: vec![lease.id],
        by: Duration::from_secs(600),
    };
    let flash = execute(cmd.clone(), &ctx(&store)).await;
    assert!(!flash.error, "{flash:?}");
    let after = store
        .get_job(lease.id)
        .await
        .unwrap()
        .lease_expires_at
        .unwrap();
    assert!(
        after - before >= chrono::TimeDelta::seconds(500),
        "{before} → {after}"
    );

    // The worker falls silent: with a zero "alive" window it counts as gone.
    let strict = Ctx {
        worker_alive: Duration::ZERO,
        ..ctx(&store)
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let flash = execute(cmd, &strict).await;
    assert!(flash.error, "{flash:?}");
    assert_eq!(
        store
            .get_job(lease.id)
            .await
            .unwrap()
            .lease_expires_at
            .unwrap(),
        after
    );
}

#[tokio::test]
async fn release_a_stale_holders_lock() {
    let (store, _dir) = sqlite_store().await;
    let short = Duration::from_millis(100);
    let (lease, _) = running_job(
        &store,
        "w1",
        "p",
        Some("ds"),
        spec(short, StalePolicy::Hold),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let report = store.expire_leases(Duration::ZERO, "reaper").await.unwrap();
    assert_eq!(report.stale, vec![lease.id]);
    assert_eq!(store.list_locks().await.unwrap().len(), 1);

    let flash = execute(Command::ReleaseLock("ds".into()), &ctx(&store)).await;
    assert_eq!(
        flash.text,
        format!("lock on ds released (held by stale job {})", lease.id)
    );
    assert!(store.list_locks().await.unwrap().is_empty());
    let flash = execute(Command::ReleaseLock("ds".into()), &ctx(&store)).await;
    assert!(flash.error);
}

#[tokio::test]
async fn enqueue_from_the_dialog() {
    let (store, _dir) = sqlite_store().await;
    let mut args = serde_json::Map::new();
    args.insert("days".into(), serde_json::json!(7));
    let flash = execute(
        Command::Enqueue(EnqueueSpec {
            pipeline: "sync".into(),
            target: Some("dataset-a".into()),
            args,
        }),
        &ctx(&store),
    )
    .await;
    assert!(!flash.error, "{flash:?}");
    let snap = fetch(&store, &FetchRequest::default()).await.unwrap();
    assert_eq!(snap.queued.len(), 1);
    let job = &snap.queued[0];
    assert_eq!(flash.text, format!("enqueued job {} (sync)", job.id));
    assert_eq!(job.target.as_deref(), Some("dataset-a"));
    assert_eq!(job.args["days"], serde_json::json!(7));
    assert_eq!(
        job.max_attempts, 5,
        "the pipeline's max_attempts, as `jobdeck enqueue` gives"
    );
}

#[tokio::test]
async fn schedules_pause_resume_and_fire_now() {
    let (store, _dir) = sqlite_store().await;
    let def = ScheduleDef {
        name: "nightly".into(),
        pipeline: "p".into(),
        target: Some("t".into()),
        args: serde_json::Map::new(),
        cron: "0 0 3 * * *".into(),
        timezone: "UTC".into(),
        overlap_queue: false,
        enabled: true,
        max_attempts: None,
    };
    let next = chrono::Utc::now() + chrono::TimeDelta::hours(5);
    store.sync_schedules(&[(def, Some(next))]).await.unwrap();
    let id = store.list_schedules().await.unwrap()[0].id;

    let pause = |paused| Command::SetSchedulePaused {
        name: "nightly".into(),
        paused,
    };
    assert_eq!(
        execute(pause(true), &ctx(&store)).await.text,
        "schedule nightly paused"
    );
    assert!(store.list_schedules().await.unwrap()[0].paused);
    execute(pause(false), &ctx(&store)).await;
    assert!(!store.list_schedules().await.unwrap()[0].paused);

    let fire = Command::FireNow {
        id,
        name: "nightly".into(),
    };
    let flash = execute(fire.clone(), &ctx(&store)).await;
    let job = store.list_schedules().await.unwrap()[0]
        .last_job_id
        .unwrap();
    assert_eq!(flash.text, format!("schedule nightly fired: job {job}"));
    // Overlap "skip": the first job is still queued.
    let flash = execute(fire, &ctx(&store)).await;
    assert!(flash.error);
    assert_eq!(
        flash.text,
        format!("schedule nightly skipped: its previous job {job} is unfinished")
    );
}

#[tokio::test]
async fn filter_fetches_only_matching_rows() {
    let (store, _dir) = sqlite_store().await;
    let a = enqueue(&store, "sync", Some("dataset-a")).await;
    enqueue(&store, "sync", Some("dataset-b")).await;
    enqueue(&store, "verify", Some("dataset-c")).await;
    let all = fetch(&store, &FetchRequest::default()).await.unwrap();
    assert_eq!(all.queued.len(), 3);
    assert_eq!(all.count(State::Queued), 3);

    let only = |text: &str| FetchRequest {
        filter: Some(text.into()),
        detail: None,
    };
    let snap = fetch(&store, &only("dataset-b")).await.unwrap();
    assert_eq!(snap.queued.len(), 1);
    assert_eq!(snap.queued[0].target.as_deref(), Some("dataset-b"));
    let snap = fetch(&store, &only("sync")).await.unwrap();
    assert_eq!(snap.queued.len(), 2);
    let snap = fetch(&store, &only(&a.to_string())).await.unwrap();
    assert!(snap.queued.iter().any(|j| j.id == a));
    // Totals stay the cluster's.
    assert_eq!(snap.count(State::Queued), 3);
}

#[tokio::test]
async fn snapshot_explains_waits_and_carries_the_detail() {
    let (store, _dir) = sqlite_store().await;
    let (lease, fence) =
        running_job(&store, "w1", "p", Some("ds"), spec(LONG, StalePolicy::Hold)).await;
    let mut beat = worker_beat("w1");
    beat.pipelines = vec!["p".into()];
    store.renew(&beat, &[lease], LONG).await.unwrap();
    let blocked = enqueue(&store, "p", Some("ds")).await;
    let orphan = enqueue(&store, "nobody-runs-this", None).await;

    let req = FetchRequest {
        filter: None,
        detail: Some(lease.id),
    };
    let snap = fetch(&store, &req).await.unwrap();
    let now = snap.db_now.unwrap();
    let job = |id| snap.queued.iter().find(|j| j.id == id).unwrap();
    assert_eq!(
        why_waiting(job(blocked), &snap, now),
        Wait::BlockedBy(lease.id)
    );
    assert_eq!(
        why_waiting(job(orphan), &snap, now),
        Wait::NoWorker("nobody-runs-this".into())
    );
    assert_eq!(snap.locks[0].fence, fence.unwrap());
    assert_eq!(snap.locks[0].waiting, 1);
    let detail = snap.detail.unwrap();
    assert_eq!(detail.job.id, lease.id);
    assert!(detail.events.iter().any(|e| e.to == State::Running));
}

/// An engine of two slots on `store`, without the scheduler.
fn two_slot_engine(
    store: &Store,
    config: jobdeck::config::Config,
    dir: &tempfile::TempDir,
) -> jobdeck::engine::EngineHandle {
    jobdeck::engine::start(
        store.clone(),
        Arc::new(config),
        jobdeck::engine::EngineOptions {
            slots: Some(2),
            scheduler: false,
            log_dir: dir.path().to_path_buf(),
        },
    )
}

/// The Running slots the console shows come from the engine's status:
/// every running job with the step it is on, then none once they end.
#[tokio::test]
async fn the_engine_status_follows_its_running_jobs() {
    let (store, dir) = sqlite_store().await;
    let config = jobdeck::config::parse(
        r#"
[[pipeline]]
name = "two"
[[pipeline.step]]
name = "first"
builtin = "sleep"
duration = "300ms"
[[pipeline.step]]
name = "second"
builtin = "sleep"
duration = "300ms"
"#,
        "test.toml",
    )
    .unwrap();
    let ids = [
        enqueue(&store, "two", None).await,
        enqueue(&store, "two", None).await,
    ];
    let engine = two_slot_engine(&store, config, &dir);
    let mut status = engine.subscribe();
    let on_step = |s: &jobdeck::engine::EngineStatus, name: &str| {
        s.running.len() == 2 && s.running.iter().all(|r| r.step_name == name)
    };
    for step in ["first", "second"] {
        tokio::time::timeout(
            Duration::from_secs(5),
            status.wait_for(|s| on_step(s, step)),
        )
        .await
        .unwrap_or_else(|_| panic!("both jobs shown on their {step} step"))
        .unwrap();
    }
    let running: Vec<i64> = status.borrow().running.iter().map(|r| r.job_id).collect();
    assert_eq!(running, ids);
    tokio::time::timeout(
        Duration::from_secs(5),
        status.wait_for(|s| s.running.is_empty()),
    )
    .await
    .expect("no job shown once both ended")
    .unwrap();
    engine.stop().await;
    for id in ids {
        assert_eq!(store.get_job(id).await.unwrap().state, State::Succeeded);
    }
}

#[tokio::test]
async fn node_pause_and_slots_go_through_the_engine() {
    let (store, dir) = sqlite_store().await;
    let engine = two_slot_engine(&store, jobdeck::config::Config::default_empty(), &dir);
    let c = Ctx {
        engine: Some(engine.clone()),
        ..ctx(&store)
    };
    let mut status = engine.subscribe();
    let flash = execute(Command::ToggleNodePause, &c).await;
    assert_eq!(
        flash.text,
        "this node stopped claiming jobs (running ones go on)"
    );
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.paused))
        .await
        .expect("engine paused")
        .unwrap();
    execute(Command::ToggleNodePause, &c).await;
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| !s.paused))
        .await
        .expect("engine resumed")
        .unwrap();

    assert_eq!(execute(Command::Slots(1), &c).await.text, "slots: 2 → 3");
    tokio::time::timeout(Duration::from_secs(5), status.wait_for(|s| s.slots == 3))
        .await
        .expect("three slots")
        .unwrap();
    engine.stop().await;

    // Without workers the console says so instead of pretending.
    let flash = execute(Command::ToggleNodePause, &ctx(&store)).await;
    assert!(flash.error);
    assert!(flash.text.contains("--no-workers"));
}
