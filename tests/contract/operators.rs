//! Operator moves on jobs and workers, and pruning.

use std::time::Duration;

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{CancelOutcome, Outcome, StoreError};

use crate::common::*;

contract_test!(cancel_by_state, |store| async move {
    let queued = enqueue(&store, "q", None).await;
    assert_eq!(
        store.cancel(queued, OPERATOR).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let j = store.get_job(queued).await.unwrap();
    assert_eq!(j.state, State::Cancelled);
    assert!(j.finished_at.is_some() && j.cancel_requested_at.is_some());

    enqueue(&store, "p", None).await;
    let leased = claim_one(&store, "w-1", "p", LONG).await;
    assert_eq!(
        store.cancel(leased.id, OPERATOR).await.unwrap(),
        CancelOutcome::Cancelled
    );
    let j = store.get_job(leased.id).await.unwrap();
    assert_eq!(j.state, State::Cancelled);
    assert!(j.lease_owner.is_none() && j.lease_expires_at.is_none());
    assert!(matches!(
        store
            .start(leased, &spec(LONG, StalePolicy::Hold), "w-1")
            .await,
        Err(StoreError::LeaseLost(_))
    ));
    let e = store.job_events(leased.id).await.unwrap();
    let e = e.last().unwrap();
    assert_eq!(
        (e.from, e.to, e.actor.as_str()),
        (Some(State::Leased), State::Cancelled, OPERATOR)
    );

    let (run, _) = running_job(&store, "w-1", "p", Some("t"), spec(LONG, StalePolicy::Hold)).await;
    assert_eq!(
        store.cancel(run.id, OPERATOR).await.unwrap(),
        CancelOutcome::Requested
    );
    let first = store
        .get_job(run.id)
        .await
        .unwrap()
        .cancel_requested_at
        .unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        store.cancel(run.id, "operator:other@host").await.unwrap(),
        CancelOutcome::Requested
    );
    let j = store.get_job(run.id).await.unwrap();
    assert_eq!(
        j.state,
        State::Running,
        "a running job ends only when its worker stops it"
    );
    assert_eq!(
        j.cancel_requested_at,
        Some(first),
        "the first request's time is kept"
    );
    let e = store.job_events(run.id).await.unwrap();
    let e = &e[3];
    assert_eq!(
        (e.from, e.to, e.detail.as_str()),
        (Some(State::Running), State::Running, "cancel requested")
    );
    assert_eq!(
        store.finish(run, Outcome::Cancelled, "w-1").await.unwrap(),
        State::Cancelled
    );
    assert!(store.list_locks().await.unwrap().is_empty());
});

contract_test!(requeue_of_leased_and_cancelled_jobs, |store| async move {
    let id = enqueue(&store, "p", None).await;
    let old = claim_one(&store, "w-1", "p", LONG).await;
    store.requeue(id, OPERATOR).await.unwrap();
    let j = store.get_job(id).await.unwrap();
    assert_eq!((j.state, j.attempt), (State::Queued, 0));
    assert!(j.lease_owner.is_none() && j.lease_expires_at.is_none());
    assert_ne!(j.lease_token, Some(old.token));
    assert!(matches!(
        store
            .start(old, &spec(LONG, StalePolicy::Hold), "w-1")
            .await,
        Err(StoreError::LeaseLost(_))
    ));
    store.cancel(id, OPERATOR).await.unwrap();
    store.requeue(id, OPERATOR).await.unwrap();
    let j = store.get_job(id).await.unwrap();
    assert_eq!(j.state, State::Queued);
    assert!(j.cancel_requested_at.is_none() && j.finished_at.is_none());
    let now = store.now().await.unwrap();
    assert!(j.due_at <= now, "a requeued job is due at once");
    let to: Vec<(Option<State>, State)> = store
        .job_events(id)
        .await
        .unwrap()
        .iter()
        .map(|e| (e.from, e.to))
        .collect();
    use State::*;
    assert_eq!(
        to,
        vec![
            (None, Queued),
            (Some(Queued), Leased),
            (Some(Leased), Queued),
            (Some(Queued), Cancelled),
            (Some(Cancelled), Queued),
        ]
    );
});

contract_test!(silent_workers_are_marked_gone, |store| async move {
    store.renew(&worker_beat("w-old"), &[], LONG).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    store.renew(&worker_beat("w-new"), &[], LONG).await.unwrap();
    assert!(store.mark_gone_workers(LONG).await.unwrap().is_empty());
    assert_eq!(
        store
            .mark_gone_workers(Duration::from_millis(250))
            .await
            .unwrap(),
        vec!["w-old".to_string()]
    );
    // Already gone: not reported twice.
    assert!(
        store
            .mark_gone_workers(Duration::from_millis(250))
            .await
            .unwrap()
            .is_empty()
    );
    let ws = store.list_workers().await.unwrap();
    let ids: Vec<(&str, bool)> = ws.iter().map(|w| (w.id.as_str(), w.gone)).collect();
    assert_eq!(
        ids,
        vec![("w-new", false), ("w-old", true)],
        "newest heartbeat first"
    );
    assert!(ws[0].heartbeat_at > ws[1].heartbeat_at);
    assert!(ws[1].started_at <= ws[1].heartbeat_at);
    // A heartbeat revives a worker, keeping its start time.
    let started = ws[1].started_at;
    store.renew(&worker_beat("w-old"), &[], LONG).await.unwrap();
    let ws = store.list_workers().await.unwrap();
    let w = ws.iter().find(|w| w.id == "w-old").unwrap();
    assert!(!w.gone);
    assert_eq!(w.started_at, started);
});

contract_test!(prune_removes_old_finished_jobs_only, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (done, _) = running_job(&store, "w-1", "p", None, sp).await;
    store.save_output(done, "line 1\nline 2").await.unwrap();
    store.finish(done, Outcome::Succeeded, "w-1").await.unwrap();
    let cancelled = enqueue(&store, "q", None).await;
    store.cancel(cancelled, OPERATOR).await.unwrap();
    let queued = enqueue(&store, "q", None).await;
    let (running, _) = running_job(&store, "w-1", "p", None, sp).await;
    assert_eq!(store.prune_finished(LONG).await.unwrap(), 0);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        store
            .prune_finished(Duration::from_millis(50))
            .await
            .unwrap(),
        2
    );
    for id in [done.id, cancelled] {
        assert!(matches!(
            store.get_job(id).await,
            Err(StoreError::NotFound(_))
        ));
        assert!(store.job_events(id).await.unwrap().is_empty());
    }
    assert_eq!(store.job_output(done.id).await.unwrap(), None);
    assert_eq!(store.get_job(queued).await.unwrap().state, State::Queued);
    assert_eq!(
        store.get_job(running.id).await.unwrap().state,
        State::Running
    );
    assert_eq!(store.job_events(queued).await.unwrap().len(), 1);
});
