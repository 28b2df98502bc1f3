//! Resource locks: one run per target, fences that only grow, contention.

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{NewJob, Outcome, StartOutcome};

use crate::common::*;

contract_test!(
    fence_grows_per_acquisition_and_survives_release,
    |store| async move {
        let sp = spec(LONG, StalePolicy::Hold);
        for expected in 1..=3 {
            let (lease, fence) = running_job(&store, "w-1", "p", Some("t"), sp).await;
            assert_eq!(fence, Some(expected));
            assert_eq!(
                store.get_job(lease.id).await.unwrap().lock_fence,
                Some(expected)
            );
            let locks = store.list_locks().await.unwrap();
            assert_eq!(locks.len(), 1);
            assert_eq!((locks[0].fence, locks[0].job_id), (expected, lease.id));
            store
                .finish(lease, Outcome::Succeeded, "w-1")
                .await
                .unwrap();
            assert!(
                store.list_locks().await.unwrap().is_empty(),
                "finish frees the lock"
            );
        }
        // Other targets count on their own; no target, no lock.
        let (_, fence) = running_job(&store, "w-1", "p", Some("u"), sp).await;
        assert_eq!(fence, Some(1));
        let (lease, fence) = running_job(&store, "w-1", "q", None, sp).await;
        assert_eq!(fence, None);
        assert_eq!(store.get_job(lease.id).await.unwrap().lock_fence, None);
    }
);

contract_test!(concurrent_starts_on_one_target, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    for round in 0..5 {
        let target = format!("t{round}");
        let a = enqueue(&store, "p", Some(&target)).await;
        let b = enqueue(&store, "p", Some(&target)).await;
        let la = claim_one(&store, "w-a", "p", LONG).await;
        assert_eq!(la.id, a);
        // Two leased jobs on one target is what two concurrent Postgres
        // claims can produce; make it directly, with a token of our own.
        let token = 7_000 + round;
        raw_exec(
            &store,
            format!(
                "UPDATE jobs SET state = 'leased', lease_owner = 'w-b', lease_token = {token}, \
                 lease_expires_at = (SELECT lease_expires_at FROM jobs WHERE id = {a}) \
                 WHERE id = {b}"
            ),
        )
        .await;
        let lb = jobdeck::store::LeaseRef { id: b, token };
        let events_before = |id| {
            let store = store.clone();
            async move { store.job_events(id).await.unwrap().len() }
        };
        let (ea, eb) = (events_before(a).await, events_before(b).await);
        let (ra, rb) = tokio::join!(store.start(la, &sp, "w-a"), store.start(lb, &sp, "w-b"));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        let (winner, loser, winner_worker) = match (&ra, &rb) {
            (StartOutcome::Started { .. }, StartOutcome::LockBusy { .. }) => (a, b, "w-a"),
            (StartOutcome::LockBusy { .. }, StartOutcome::Started { .. }) => (b, a, "w-b"),
            other => panic!("exactly one start must win: {other:?}"),
        };
        let busy = if winner == a { rb } else { ra };
        assert_eq!(
            busy,
            StartOutcome::LockBusy {
                holder_job: winner,
                holder_worker: Some(winner_worker.into()),
            }
        );
        // The loser wrote nothing: still leased, no attempt counted.
        let lost = store.get_job(loser).await.unwrap();
        assert_eq!(
            (lost.state, lost.attempt, lost.lock_fence),
            (State::Leased, 0, None)
        );
        let before = if loser == a { ea } else { eb };
        assert_eq!(store.job_events(loser).await.unwrap().len(), before);
        let won = store.get_job(winner).await.unwrap();
        assert_eq!(
            (won.state, won.attempt, won.lock_fence),
            (State::Running, 1, Some(1))
        );
    }
});

contract_test!(list_locks_shows_holder_and_waiting, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (lease, _) = running_job(&store, "w-1", "p", Some("t"), sp).await;
    let first = enqueue(&store, "p", Some("t")).await;
    enqueue(&store, "other", Some("t")).await;
    enqueue(&store, "p", Some("u")).await;
    let delayed = NewJob {
        delay: Some(std::time::Duration::from_secs(600)),
        ..new_job("p", Some("t"))
    };
    store.enqueue(delayed, OPERATOR).await.unwrap();
    let now = store.now().await.unwrap();
    let locks = store.list_locks().await.unwrap();
    assert_eq!(locks.len(), 1, "only held locks are listed: {locks:?}");
    let l = &locks[0];
    assert_eq!(l.target, "t");
    assert_eq!(l.fence, 1);
    assert_eq!(l.job_id, lease.id);
    assert_eq!(l.job_state, State::Running);
    assert_eq!(l.worker_id.as_deref(), Some("w-1"));
    assert_eq!(l.waiting, 3, "queued jobs of the target, due or not");
    assert!(l.acquired_at <= now && l.acquired_at > now - chrono::Duration::seconds(30));
    assert!(l.expires_at.unwrap() > now + chrono::Duration::seconds(30));

    // The count follows every way a job leaves or rejoins the queue.
    store.cancel(first, OPERATOR).await.unwrap();
    let locks = store.list_locks().await.unwrap();
    assert_eq!(locks[0].waiting, 2, "after a cancel");
    store.requeue(first, OPERATOR).await.unwrap();
    let locks = store.list_locks().await.unwrap();
    assert_eq!(locks[0].waiting, 3, "after a requeue");
});
