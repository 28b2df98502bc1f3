//! What only the Postgres backend has, beyond the shared contract suite:
//! LISTEN/NOTIFY wake-ups, connection errors within the connect timeout,
//! unique-key races settled by the index, text that Postgres cannot store.
//! Runs only when JOBDECK_TEST_POSTGRES is set.

mod common;

use std::time::{Duration, Instant};

use futures::StreamExt;
use jobdeck::job::StalePolicy;
use jobdeck::store::postgres::PgStore;
use jobdeck::store::{FireResult, FireSlot, NewJob, Notice, Outcome, ScheduleDef};
use sqlx::postgres::PgListener;

use common::*;

/// A second handle on the test schema, typed, for `listen()`.
async fn pg_handle(schema: &str) -> PgStore {
    let base = std::env::var(PG_ENV).expect("set by postgres_store_named");
    let sep = if base.contains('?') { '&' } else { '?' };
    PgStore::connect(&format!("{base}{sep}options=-c%20search_path%3D{schema}"))
        .await
        .expect("connect to the test schema")
}

async fn next_on(listener: &mut PgListener, channel: &str) -> String {
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
            .await
            .unwrap_or_else(|_| panic!("no notification on {channel} within 5s"))
            .expect("listener connection");
        if n.channel() == channel {
            return n.payload().to_string();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_fire_and_cancel_notify_listeners() {
    let Some((s, schema)) = postgres_store_named().await else {
        return;
    };
    let mut listener = pg_handle(&schema).await.listen().await.unwrap();

    enqueue(&s, "sync", None).await;
    assert_eq!(next_on(&mut listener, "jobdeck_jobs").await, "sync");

    let t0 = chrono::DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
        .unwrap()
        .to_utc();
    let def = ScheduleDef {
        name: "nightly".into(),
        pipeline: "verify".into(),
        target: None,
        args: Default::default(),
        cron: "0 0 * * * *".into(),
        timezone: "UTC".into(),
        overlap_queue: true,
        enabled: true,
        max_attempts: None,
    };
    s.sync_schedules(&[(def, Some(t0))]).await.unwrap();
    let id = s.list_schedules().await.unwrap()[0].id;
    let slot = FireSlot::Due {
        expected_next: t0,
        next: None,
    };
    assert!(matches!(
        s.fire_schedule(id, slot, "scheduler").await.unwrap(),
        FireResult::Fired { .. }
    ));
    assert_eq!(next_on(&mut listener, "jobdeck_jobs").await, "verify");

    let (lease, _) = running_job(&s, "w-1", "harvest", None, spec(LONG, StalePolicy::Hold)).await;
    s.cancel(lease.id, OPERATOR).await.unwrap();
    assert_eq!(
        next_on(&mut listener, "jobdeck_cancel").await,
        lease.id.to_string()
    );
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_stream_wakes_and_names_cancelled_jobs() {
    let Some((s, schema)) = postgres_store_named().await else {
        return;
    };
    let mut notices = s.notices().await.unwrap().expect("Postgres pushes notices");
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(5), notices.next())
            .await
            .expect("a notice within 5s")
            .expect("the stream goes on")
            .expect("no error")
    };
    enqueue(&s, "sync", None).await;
    assert_eq!(next().await, Notice::JobsAvailable);
    let (lease, _) = running_job(&s, "w-1", "harvest", None, spec(LONG, StalePolicy::Hold)).await;
    assert_eq!(
        next().await,
        Notice::JobsAvailable,
        "the enqueue inside running_job"
    );
    s.cancel(lease.id, OPERATOR).await.unwrap();
    assert_eq!(next().await, Notice::CancelRequested(lease.id));
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_many_inserts_in_order_with_events() {
    let Some((s, schema)) = postgres_store_named().await else {
        return;
    };
    let jobs: Vec<NewJob> = (0..5)
        .map(|i| NewJob {
            priority: i,
            max_attempts: Some(i + 1),
            ..new_job("bench", Some(&format!("t{i}")))
        })
        .collect();
    let ids = s.enqueue_many(jobs, OPERATOR).await.unwrap();
    assert_eq!(ids.len(), 5);
    for (i, id) in ids.iter().enumerate() {
        let j = s.get_job(*id).await.unwrap();
        assert_eq!(
            (j.priority, j.max_attempts, j.target.as_deref()),
            (i as i32, i as i32 + 1, Some(format!("t{i}").as_str()))
        );
        let ev = s.job_events(*id).await.unwrap();
        assert_eq!((ev.len(), ev[0].detail.as_str()), (1, "enqueued"));
    }
    let bad = NewJob {
        unique_key: Some("k".into()),
        ..new_job("bench", None)
    };
    let err = s
        .enqueue_many(vec![new_job("bench", None), bad], OPERATOR)
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "job #2 of the batch has a unique key; enqueue it on its own"
    );
    assert_eq!(
        s.enqueue_many(Vec::new(), OPERATOR).await.unwrap(),
        Vec::<i64>::new()
    );
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_enqueues_of_one_unique_key_make_one_job() {
    let Some((s, schema)) = postgres_store_named().await else {
        return;
    };
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move {
                let job = NewJob {
                    unique_key: Some("nightly-sync".into()),
                    ..new_job("sync", None)
                };
                s.enqueue(job, OPERATOR).await.unwrap()
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.push(t.await.unwrap());
    }
    let fresh: Vec<_> = results.iter().filter(|r| !r.deduplicated).collect();
    assert_eq!(fresh.len(), 1, "{results:?}");
    assert!(results.iter().all(|r| r.id == fresh[0].id), "{results:?}");
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_bytes_in_output_and_errors_are_dropped_not_fatal() {
    let Some((s, schema)) = postgres_store_named().await else {
        return;
    };
    let (lease, _) = running_job(&s, "w-1", "sync", None, spec(LONG, StalePolicy::Hold)).await;
    s.save_output(lease, "bin\0ary").await.unwrap();
    assert_eq!(
        s.job_output(lease.id).await.unwrap().as_deref(),
        Some("binary")
    );
    s.advance_step(lease, 0, &[("k\0".into(), "v\0".into())])
        .await
        .unwrap();
    assert_eq!(
        s.checkpoints("sync", None).await.unwrap(),
        vec![("k".to_string(), "v".to_string())]
    );
    let error = "step sync failed: \0".to_string();
    s.finish(
        lease,
        Outcome::Failed {
            error,
            retry: false,
        },
        "w-1",
    )
    .await
    .unwrap();
    assert_eq!(
        s.get_job(lease.id).await.unwrap().last_error.as_deref(),
        Some("step sync failed: ")
    );
    drop_schema(&schema).await;
}

#[tokio::test]
async fn connection_errors_are_one_line_name_the_host_and_hide_the_password() {
    if std::env::var(PG_ENV).is_err() {
        return;
    }
    // The server refuses (no such database): an immediate answer.
    let base = std::env::var(PG_ENV).unwrap();
    let Some(host_and_rest) = base.split_once('@').map(|(_, r)| r.to_string()) else {
        panic!("{PG_ENV} should be postgres://USER@HOST/DB");
    };
    let host = host_and_rest.split('/').next().unwrap();
    let started = Instant::now();
    let err = jobdeck::store::connect(&format!(
        "postgres://postgres:hunter2@{host}/jobdeck_no_such_db"
    ))
    .await
    .unwrap_err()
    .to_string();
    assert!(started.elapsed() < Duration::from_secs(2), "{err}");
    assert_eq!(
        err,
        format!(
            "database unreachable: postgres://postgres:***@{host}/jobdeck_no_such_db: \
             database \"jobdeck_no_such_db\" does not exist"
        )
    );

    // A black hole (accepts, never answers): bounded by the 5 s timeout.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let started = Instant::now();
    let err = jobdeck::store::connect(&format!("postgres://u:hunter2@127.0.0.1:{port}/x"))
        .await
        .unwrap_err()
        .to_string();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(7), "{took:?} {err}");
    assert_eq!(
        err,
        format!("database unreachable: postgres://u:***@127.0.0.1:{port}/x: no answer within 5s")
    );
    drop(silent);

    // Nobody listening: refused at once.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let started = Instant::now();
    let err = jobdeck::store::connect(&format!("postgres://u:hunter2@127.0.0.1:{port}/x"))
        .await
        .unwrap_err()
        .to_string();
    assert!(started.elapsed() < Duration::from_secs(2), "{err}");
    assert!(
        err.starts_with(&format!(
            "database unreachable: postgres://u:***@127.0.0.1:{port}/x: "
        )) && !err.contains("hunter2")
            && !err.contains('\n'),
        "{err}"
    );
}

#[tokio::test]
async fn the_cycle_function_runs_without_jit() {
    // Its generic plans are costed for a tenth of the queue: at 100,000
    // queued jobs that passed jit_above_cost and every claim paid ~67 ms of
    // compilation (found by `jobdeck bench --scale --explain`).
    let Some((_store, schema)) = postgres_store_named().await else {
        return;
    };
    let base = std::env::var(PG_ENV).expect("set");
    let pool = sqlx::PgPool::connect(&base).await.expect("connect");
    let config: Option<Vec<String>> = sqlx::query_scalar(
        "SELECT p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
         WHERE p.proname = 'jobdeck_cycle' AND n.nspname = $1",
    )
    .bind(&schema)
    .fetch_one(&pool)
    .await
    .expect("the cycle function exists");
    let config = config.unwrap_or_default();
    assert!(config.iter().any(|c| c == "jit=off"), "{config:?}");
    pool.close().await;
    drop_schema(&schema).await;
}
