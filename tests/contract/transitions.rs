//! Allowed and refused moves, and the event history they leave.

use std::time::Duration;

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{CancelOutcome, Outcome, Store, StoreError};

use crate::common::*;

/// (from, to, actor) of every event of job `id`.
async fn history(store: &Store, id: i64) -> Vec<(Option<State>, State, String)> {
    store
        .job_events(id)
        .await
        .expect("events")
        .into_iter()
        .map(|e| (e.from, e.to, e.actor))
        .collect()
}

fn refused(err: StoreError) -> String {
    match err {
        StoreError::Refused(r) => r.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

contract_test!(happy_path_records_each_move, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (lease, fence) = running_job(&store, "w-1", "p", Some("t"), sp).await;
    assert_eq!(fence, Some(1));
    let state = store
        .finish(lease, Outcome::Succeeded, "w-1")
        .await
        .unwrap();
    assert_eq!(state, State::Succeeded);
    let job = store.get_job(lease.id).await.unwrap();
    assert_eq!(job.state, State::Succeeded);
    assert_eq!(job.attempt, 1);
    assert!(job.finished_at.is_some() && job.started_at.is_some());
    assert_eq!(
        history(&store, lease.id).await,
        vec![
            (None, State::Queued, OPERATOR.to_string()),
            (Some(State::Queued), State::Leased, "w-1".into()),
            (Some(State::Leased), State::Running, "w-1".into()),
            (Some(State::Running), State::Succeeded, "w-1".into()),
        ]
    );
    let events = store.job_events(lease.id).await.unwrap();
    assert_eq!(events[2].detail, "attempt 1, fence 1");
});

contract_test!(
    failure_without_retry_and_stop_for_cancel,
    |store| async move {
        let sp = spec(LONG, StalePolicy::Hold);
        let (a, _) = running_job(&store, "w-1", "p", None, sp).await;
        let err = Outcome::Failed {
            error: "exit 3".into(),
            retry: false,
        };
        assert_eq!(store.finish(a, err, "w-1").await.unwrap(), State::Failed);
        let job = store.get_job(a.id).await.unwrap();
        assert_eq!(job.last_error.as_deref(), Some("exit 3"));
        let events = store.job_events(a.id).await.unwrap();
        assert_eq!(events.last().unwrap().detail, "exit 3");

        let (b, _) = running_job(&store, "w-1", "p", None, sp).await;
        assert_eq!(
            store.cancel(b.id, OPERATOR).await.unwrap(),
            CancelOutcome::Requested
        );
        assert_eq!(
            store.finish(b, Outcome::Cancelled, "w-1").await.unwrap(),
            State::Cancelled
        );
        assert_eq!(
            history(&store, b.id).await[3..],
            [
                (Some(State::Running), State::Running, OPERATOR.to_string()),
                (Some(State::Running), State::Cancelled, "w-1".into()),
            ]
        );
    }
);

contract_test!(unclaim_and_fail_leased, |store| async move {
    let id = enqueue(&store, "p", Some("t")).await;
    let lease = claim_one(&store, "w-1", "p", LONG).await;
    store
        .unclaim(lease, Duration::ZERO, "w-1", "lock busy")
        .await
        .unwrap();
    let job = store.get_job(id).await.unwrap();
    assert_eq!(job.state, State::Queued);
    assert_eq!(job.attempt, 0, "giving a job back is not an attempt");
    assert!(job.lease_owner.is_none() && job.lease_expires_at.is_none());
    // The old token is spent.
    assert!(matches!(
        store.unclaim(lease, Duration::ZERO, "w-1", "again").await,
        Err(StoreError::LeaseLost(_))
    ));

    let lease = claim_one(&store, "w-2", "p", LONG).await;
    store
        .fail_leased(lease, "w-2", "target t is locked by job 9")
        .await
        .unwrap();
    let job = store.get_job(id).await.unwrap();
    assert_eq!(job.state, State::Failed);
    assert_eq!(
        job.last_error.as_deref(),
        Some("target t is locked by job 9")
    );
    assert!(job.finished_at.is_some());
    let h = history(&store, id).await;
    assert_eq!(h[2], (Some(State::Leased), State::Queued, "w-1".into()));
    assert_eq!(h[4], (Some(State::Leased), State::Failed, "w-2".into()));
    assert_eq!(store.job_events(id).await.unwrap()[2].detail, "lock busy");
});

contract_test!(refusals_are_worded_for_operators, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (run, _) = running_job(&store, "w-1", "p", Some("t"), sp).await;
    let queued = enqueue(&store, "other", None).await;
    let r = run.id;

    let e = store.requeue(r, OPERATOR).await.unwrap_err();
    assert_eq!(refused(e), format!("job {r} is running: cancel it first"));
    let e = store.requeue(queued, OPERATOR).await.unwrap_err();
    assert_eq!(
        refused(e),
        format!("job {queued} is queued: it is already queued")
    );
    let e = store
        .extend(queued, LONG, LONG, OPERATOR)
        .await
        .unwrap_err();
    assert_eq!(
        refused(e),
        format!("job {queued} is queued: only leased and running jobs have a lease to extend")
    );
    let e = store.release_lock("t", OPERATOR).await.unwrap_err();
    assert_eq!(
        refused(e),
        format!("job {r} is running: only a stale job's lock can be released by hand")
    );

    store.finish(run, Outcome::Succeeded, "w-1").await.unwrap();
    let e = store.cancel(r, OPERATOR).await.unwrap_err();
    assert_eq!(
        refused(e),
        format!("job {r} is succeeded: it has already finished")
    );
    let e = store.requeue(r, OPERATOR).await.unwrap_err();
    assert_eq!(
        refused(e),
        format!("job {r} is succeeded: it succeeded; enqueue a new job instead")
    );
    let e = store.release_lock("t", OPERATOR).await.unwrap_err();
    assert_eq!(e.to_string(), "target t is not locked");

    // A refusal writes nothing.
    assert_eq!(store.job_events(queued).await.unwrap().len(), 1);
    assert_eq!(store.get_job(r).await.unwrap().state, State::Succeeded);

    let e = store.cancel(987_654, OPERATOR).await.unwrap_err();
    assert!(matches!(e, StoreError::NotFound(987_654)));
    assert_eq!(e.to_string(), "job 987654 not found");
    assert!(matches!(
        store.get_job(987_654).await,
        Err(StoreError::NotFound(987_654))
    ));
});

contract_test!(a_stale_token_can_write_nothing, |store| async move {
    let sp = spec(LONG, StalePolicy::Release);
    let (old, _) = running_job(&store, "w-1", "p", Some("t"), sp).await;
    // The run is cancelled, an operator requeues the job and another worker
    // takes it: the first worker's token is now stale.
    store.cancel(old.id, OPERATOR).await.unwrap();
    assert_eq!(
        store.finish(old, Outcome::Cancelled, "w-1").await.unwrap(),
        State::Cancelled
    );
    store.requeue(old.id, OPERATOR).await.unwrap();
    let new = claim_one(&store, "w-2", "p", LONG).await;
    assert_eq!(new.id, old.id);
    assert_ne!(new.token, old.token);
    store.start(new, &sp, "w-2").await.unwrap();

    let lost =
        |r: Result<_, StoreError>| matches!(r, Err(StoreError::LeaseLost(id)) if id == old.id);
    assert!(lost(store.advance_step(old, 0, &[]).await));
    assert!(lost(store.save_output(old, "late").await));
    assert!(lost(
        store
            .finish(old, Outcome::Succeeded, "w-1")
            .await
            .map(|_| ())
    ));
    assert!(lost(store.start(old, &sp, "w-1").await.map(|_| ())));
    let beat = worker_beat("w-1");
    let renewed = store.renew(&beat, &[old, new], LONG).await.unwrap();
    assert_eq!(renewed[0], (old, jobdeck::store::Renewal::Lost));
    assert!(matches!(renewed[1].1, jobdeck::store::Renewal::Held { .. }));
    // The new owner's run is untouched.
    let job = store.get_job(new.id).await.unwrap();
    assert_eq!(job.state, State::Running);
    assert_eq!(job.step, 0);
    assert_eq!(store.job_output(new.id).await.unwrap(), None);
    assert_eq!(
        store.finish(new, Outcome::Succeeded, "w-2").await.unwrap(),
        State::Succeeded
    );
});
