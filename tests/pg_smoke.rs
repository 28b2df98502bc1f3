//! Quick checks of the Postgres store until the contract suite covers it.
//! Runs only when JOBDECK_TEST_POSTGRES is set.

mod common;

use std::time::{Duration, Instant};

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{
    CancelOutcome, FireResult, FireSlot, JobFilter, JobOrder, NewJob, Outcome, Renewal,
    ScheduleDef, StartOutcome, WorkerBeat,
};

use common::*;

const SHORT: Duration = Duration::from_millis(300);

fn beat(id: &str) -> WorkerBeat {
    WorkerBeat {
        id: id.into(),
        host: "h".into(),
        pid: 1,
        slots: 4,
        busy: 0,
        paused: false,
        pipelines: vec!["p".into()],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_one_per_target_in_order_and_fenced_start() {
    let Some((s, schema)) = postgres_store_named().await else {
        return;
    };
    let low = enqueue(&s, "p", Some("a")).await;
    let mut hi = new_job("p", Some("a"));
    hi.priority = 5;
    let hi = s.enqueue(hi, OPERATOR).await.unwrap().id;
    let free = enqueue(&s, "p", None).await;
    let other = enqueue(&s, "q", Some("b")).await;
    let got = s.claim(&claim_req("w1", &["p"], 10, LONG)).await.unwrap();
    let ids: Vec<i64> = got.iter().map(|j| j.id).collect();
    assert_eq!(ids, vec![hi, free], "one per target, priority first");
    assert!(got.iter().all(|j| j.state == State::Leased));
    // target a has a leased job: nothing more of it may be claimed
    assert!(
        s.claim(&claim_req("w2", &["p"], 10, LONG))
            .await
            .unwrap()
            .is_empty()
    );
    let lease = got[0].lease_ref().unwrap();
    let sp = spec(LONG, StalePolicy::Hold);
    assert_eq!(
        s.start(lease, &sp, "w1").await.unwrap(),
        StartOutcome::Started {
            attempt: 1,
            fence: Some(1)
        }
    );
    // a second start with the same lease is refused: it is running now
    assert!(s.start(lease, &sp, "w1").await.is_err());
    let locks = s.list_locks().await.unwrap();
    assert_eq!(locks.len(), 1);
    assert_eq!((locks[0].job_id, locks[0].waiting), (hi, 1));
    assert_eq!(
        s.finish(lease, Outcome::Succeeded, "w1").await.unwrap(),
        State::Succeeded
    );
    assert!(s.list_locks().await.unwrap().is_empty());
    let next = claim_one(&s, "w1", "p", LONG).await;
    assert_eq!(next.id, low);
    assert_eq!(
        s.start(next, &sp, "w1").await.unwrap(),
        StartOutcome::Started {
            attempt: 1,
            fence: Some(2)
        }
    );
    let _ = other;
    let events = s.job_events(hi).await.unwrap();
    let moves: Vec<_> = events.iter().map(|e| (e.from, e.to)).collect();
    assert_eq!(
        moves,
        vec![
            (None, State::Queued),
            (Some(State::Queued), State::Leased),
            (Some(State::Leased), State::Running),
            (Some(State::Running), State::Succeeded)
        ]
    );
    assert_eq!(events[2].detail, "attempt 1, fence 1");
    drop_schema(&schema).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_busy_writes_nothing_and_retry_keeps_step() {
    let Some((s, schema)) = postgres_store_named().await else {
        return;
    };
    let sp = spec(LONG, StalePolicy::Hold);
    let (a, _) = running_job(&s, "w1", "p", Some("t"), sp).await;
    // The claim filter keeps a second job of "t" out; lease one by hand as
    // a racing claimer would have.
    let b = enqueue(&s, "q", Some("t")).await;
    assert!(
        s.claim(&claim_req("w2", &["q"], 1, LONG))
            .await
            .unwrap()
            .is_empty()
    );
    sql(
        &schema,
        &format!("UPDATE {schema}.jobs SET state = 'leased', lease_token = 42 WHERE id = {b}"),
    )
    .await;
    let b_lease = jobdeck::store::LeaseRef { id: b, token: 42 };
    match s.start(b_lease, &sp, "w2").await.unwrap() {
        StartOutcome::LockBusy {
            holder_job,
            holder_worker,
        } => assert_eq!((holder_job, holder_worker.as_deref()), (a.id, Some("w1"))),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.get_job(b).await.unwrap().state, State::Leased);
    s.unclaim(b_lease, Duration::ZERO, "w2", "lock busy")
        .await
        .unwrap();
    s.advance_step(a, 0, &[("k".into(), "1".into()), ("k".into(), "2".into())])
        .await
        .unwrap();
    s.advance_step(a, 0, &[]).await.unwrap();
    assert_eq!(s.get_job(a.id).await.unwrap().step, 1);
    assert_eq!(
        s.checkpoints("p", Some("t")).await.unwrap(),
        vec![("k".to_string(), "2".to_string())]
    );
    s.save_output(a, "line\0with nul").await.unwrap();
    assert_eq!(
        s.job_output(a.id).await.unwrap().as_deref(),
        Some("linewith nul")
    );
    let to = s
        .finish(
            a,
            Outcome::Failed {
                error: "boom".into(),
                retry: true,
            },
            "w1",
        )
        .await
        .unwrap();
    assert_eq!(to, State::Queued);
    let j = s.get_job(a.id).await.unwrap();
    assert_eq!(
        (j.step, j.attempt, j.lease_token, j.last_error.as_deref()),
        (1, 1, None, Some("boom"))
    );
    assert!(matches!(
        s.finish(a, Outcome::Succeeded, "w1").await,
        Err(jobdeck::store::StoreError::LeaseLost(_))
    ));
    drop_schema(&schema).await;
}

/// Run one statement outside the store (to set up what a race would).
async fn sql(_schema: &str, stmt: &str) {
    let pool = sqlx::PgPool::connect(&std::env::var(PG_ENV).unwrap())
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(stmt.to_string()))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renew_cancel_extend_expire() {
    let Some((s, schema)) = postgres_store_named().await else {
        return;
    };
    let (a, _) = running_job(&s, "w1", "p", Some("t"), spec(SHORT, StalePolicy::Hold)).await;
    let bogus = jobdeck::store::LeaseRef {
        id: a.id,
        token: a.token + 1000,
    };
    let r = s.renew(&beat("w1"), &[a, bogus], LONG).await.unwrap();
    match r[0].1 {
        Renewal::Held {
            remaining,
            cancel_requested,
        } => assert!(remaining > Duration::from_secs(50) && !cancel_requested),
        Renewal::Lost => panic!("lost"),
    }
    assert_eq!(r[1].1, Renewal::Lost);
    // never shortened
    s.renew(&beat("w1"), &[a], SHORT).await.unwrap();
    assert!(
        matches!(s.renew(&beat("w1"), &[a], SHORT).await.unwrap()[0].1,
        Renewal::Held { remaining, .. } if remaining > Duration::from_secs(50))
    );
    let before = s.get_job(a.id).await.unwrap().lease_expires_at.unwrap();
    let after = s
        .extend(a.id, Duration::from_secs(30), LONG, OPERATOR)
        .await
        .unwrap();
    assert!(after >= before + chrono::Duration::seconds(30));
    assert_eq!(
        s.cancel(a.id, OPERATOR).await.unwrap(),
        CancelOutcome::Requested
    );
    assert!(matches!(
        s.renew(&beat("w1"), &[a], SHORT).await.unwrap()[0].1,
        Renewal::Held {
            cancel_requested: true,
            ..
        }
    ));
    assert_eq!(
        s.mark_gone_workers(Duration::ZERO).await.unwrap(),
        vec!["w1".to_string()]
    );
    let err = s.extend(a.id, LONG, LONG, OPERATOR).await.unwrap_err();
    assert!(err.to_string().contains("its worker w1 is gone"), "{err}");

    // A stale hold job keeps its lock; release_lock frees it.
    let (b, _) = running_job(&s, "w3", "q", Some("u"), spec(SHORT, StalePolicy::Hold)).await;
    let _ = (a, b);
    sqlx_shift_expiry(&schema).await;
    let rep = s.expire_leases(Duration::ZERO, "reaper").await.unwrap();
    assert_eq!(rep.finished, vec![a.id], "pending cancel wins");
    assert_eq!(rep.stale, vec![b.id]);
    assert_eq!(s.get_job(a.id).await.unwrap().state, State::Cancelled);
    let locks = s.list_locks().await.unwrap();
    assert_eq!(
        locks.iter().map(|l| l.job_id).collect::<Vec<_>>(),
        vec![b.id]
    );
    assert!(s.release_lock("t", OPERATOR).await.is_err());
    assert_eq!(s.release_lock("u", OPERATOR).await.unwrap(), b.id);
    s.requeue(b.id, OPERATOR).await.unwrap();
    let j = s.get_job(b.id).await.unwrap();
    assert_eq!((j.state, j.max_attempts, j.attempt), (State::Queued, 3, 1));
    assert_ne!(j.lease_token, Some(b.token));
    let counts = s.count_by_state().await.unwrap();
    assert_eq!(counts.len(), 7);
    assert_eq!(counts[&State::Queued], 1);
    drop_schema(&schema).await;
}

/// Move every lease into the past, as if time passed.
async fn sqlx_shift_expiry(schema: &str) {
    sql(
        schema,
        &format!(
            "UPDATE {schema}.jobs SET lease_expires_at = now() - interval '1 minute' \
             WHERE lease_expires_at IS NOT NULL"
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_fire_skip_and_notify() {
    let Some((s, schema)) = postgres_store_named().await else {
        return;
    };
    let pg = jobdeck::store::postgres::PgStore::connect(&format!(
        "{}?options=-c%20search_path%3D{schema}",
        std::env::var(PG_ENV).unwrap()
    ))
    .await
    .unwrap();
    let mut listener = pg.listen().await.unwrap();
    let t0 = chrono::DateTime::parse_from_rfc3339("2030-01-01T00:00:00Z")
        .unwrap()
        .to_utc();
    let t1 = t0 + chrono::Duration::hours(1);
    let def = ScheduleDef {
        name: "nightly".into(),
        pipeline: "p".into(),
        target: Some("t".into()),
        args: Default::default(),
        cron: "0 0 * * * *".into(),
        timezone: "UTC".into(),
        overlap_queue: false,
        enabled: true,
        max_attempts: Some(7),
    };
    s.sync_schedules(&[(def.clone(), Some(t0))]).await.unwrap();
    s.sync_schedules(&[(def.clone(), Some(t1))]).await.unwrap();
    let sc = &s.list_schedules().await.unwrap()[0];
    assert_eq!((sc.next_fire_at, sc.def.max_attempts), (Some(t0), Some(7)));
    let due = FireSlot::Due {
        expected_next: t0,
        next: Some(t1),
    };
    let FireResult::Fired { job_id } = s.fire_schedule(sc.id, due, "sched").await.unwrap() else {
        panic!("not fired")
    };
    assert_eq!(s.get_job(job_id).await.unwrap().max_attempts, 7);
    let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!((n.channel(), n.payload()), ("jobdeck_jobs", "p"));
    assert_eq!(
        s.fire_schedule(sc.id, due, "sched").await.unwrap(),
        FireResult::NotFired
    );
    let due2 = FireSlot::Due {
        expected_next: t1,
        next: Some(t1 + chrono::Duration::hours(1)),
    };
    assert_eq!(
        s.fire_schedule(sc.id, due2, "sched").await.unwrap(),
        FireResult::Skipped {
            blocking_job: job_id
        }
    );
    let last = s.job_events(job_id).await.unwrap().pop().unwrap();
    assert!(
        last.detail.starts_with("schedule nightly skipped slot"),
        "{}",
        last.detail
    );
    s.set_schedule_paused("nightly", true).await.unwrap();
    assert!(s.set_schedule_paused("nope", true).await.is_err());
    s.sync_schedules(&[(def, Some(t0))]).await.unwrap();
    assert!(s.list_schedules().await.unwrap()[0].paused);

    // cancel of a running job notifies its id
    let (a, _) = running_job(&s, "w1", "z", None, spec(LONG, StalePolicy::Hold)).await;
    s.cancel(a.id, OPERATOR).await.unwrap();
    loop {
        let n = tokio::time::timeout(Duration::from_secs(5), listener.recv())
            .await
            .unwrap()
            .unwrap();
        if n.channel() == "jobdeck_cancel" {
            assert_eq!(n.payload(), a.id.to_string());
            break;
        }
    }
    // filters and histogram
    let f = JobFilter {
        text: Some("z".into()),
        order: JobOrder::ClaimOrder,
        ..JobFilter::default()
    };
    assert_eq!(s.list_jobs(&f).await.unwrap().len(), 1);
    s.finish(a, Outcome::Cancelled, "w1").await.unwrap();
    let h = s
        .finished_histogram(Duration::from_secs(60), 5)
        .await
        .unwrap();
    assert_eq!(h, vec![0, 0, 0, 0, 1]);
    assert_eq!(s.prune_finished(Duration::ZERO).await.unwrap(), 1);
    assert!(s.get_job(a.id).await.is_err());
    drop_schema(&schema).await;
}

#[tokio::test]
async fn unique_key_dedupes_and_bad_connections_fail_fast() {
    if let Some((s, schema)) = postgres_store_named().await {
        let job = NewJob {
            unique_key: Some("k".into()),
            ..new_job("p", None)
        };
        let a = s.enqueue(job.clone(), OPERATOR).await.unwrap();
        let b = s.enqueue(job.clone(), OPERATOR).await.unwrap();
        assert!(!a.deduplicated && b.deduplicated && a.id == b.id);
        s.cancel(a.id, OPERATOR).await.unwrap();
        let c = s.enqueue(job, OPERATOR).await.unwrap();
        assert!(!c.deduplicated && c.id != a.id);
        drop_schema(&schema).await;
    } else {
        return;
    }
    let started = Instant::now();
    let err = jobdeck::store::connect("postgres://postgres:hunter2@127.0.0.1:5432/nosuchdb")
        .await
        .unwrap_err()
        .to_string();
    eprintln!("{err} ({:?})", started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(6), "{err}");
    assert!(
        !err.contains("hunter2") && err.contains("127.0.0.1") && !err.contains('\n'),
        "{err}"
    );
    // A server that accepts and then says nothing (a black hole): the
    // connect timeout must bound the wait.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let started = Instant::now();
    let err = jobdeck::store::connect(&format!("postgres://u:hunter2@127.0.0.1:{port}/x"))
        .await
        .unwrap_err()
        .to_string();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(7), "{took:?} {err}");
    assert!(
        !err.contains("hunter2") && err.contains("127.0.0.1") && !err.contains('\n'),
        "{err}"
    );
    drop(silent);
    eprintln!("{err}");
}
