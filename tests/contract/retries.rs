//! Attempts, retry backoff, max_attempts, and cancel winning over retry.

use std::time::Duration;

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{NewJob, Outcome, StartOutcome, StartSpec};

use crate::common::*;

fn failed(msg: &str) -> Outcome {
    Outcome::Failed {
        error: msg.into(),
        retry: true,
    }
}

contract_test!(
    retry_backs_off_and_resumes_at_the_failed_step,
    |store| async move {
        let sp = StartSpec {
            backoff: Duration::from_secs(20),
            ..spec(LONG, StalePolicy::Hold)
        };
        let (lease, _) = running_job(&store, "w-1", "p", Some("t"), sp).await;
        store.advance_step(lease, 0, &[]).await.unwrap();
        let before = store.now().await.unwrap();
        assert_eq!(
            store
                .finish(lease, failed("step verify failed"), "w-1")
                .await
                .unwrap(),
            State::Queued
        );
        let after = store.now().await.unwrap();
        let j = store.get_job(lease.id).await.unwrap();
        assert_eq!((j.state, j.attempt, j.step), (State::Queued, 1, 1));
        assert_eq!(j.last_error.as_deref(), Some("step verify failed"));
        assert!(j.lease_token.is_none() && j.lease_owner.is_none() && j.lease_expires_at.is_none());
        assert!(j.finished_at.is_none());
        // 20 s ± 10 % jitter from the moment of the failure.
        assert!(
            j.due_at >= before + chrono::Duration::milliseconds(17_900),
            "{:?}",
            j.due_at - before
        );
        assert!(
            j.due_at <= after + chrono::Duration::milliseconds(22_100),
            "{:?}",
            j.due_at - after
        );
        assert!(
            store.list_locks().await.unwrap().is_empty(),
            "a retry frees the lock"
        );
        let e = store.job_events(lease.id).await.unwrap();
        let e = e.last().unwrap();
        assert_eq!(
            (e.from, e.to, e.detail.as_str()),
            (Some(State::Running), State::Queued, "step verify failed")
        );
        // Not due: nobody claims it yet.
        assert!(
            store
                .claim(&claim_req("w-2", &["p"], 5, LONG))
                .await
                .unwrap()
                .is_empty()
        );
    }
);

contract_test!(
    attempts_run_out_and_requeue_grants_one_more,
    |store| async move {
        let sp = StartSpec {
            backoff: Duration::ZERO,
            ..spec(LONG, StalePolicy::Hold)
        };
        let job = NewJob {
            max_attempts: Some(2),
            ..new_job("p", Some("t"))
        };
        let id = store.enqueue(job, OPERATOR).await.unwrap().id;
        let mut states = Vec::new();
        let mut tokens = Vec::new();
        for _ in 0..2 {
            let lease = claim_one(&store, "w-1", "p", LONG).await;
            tokens.push(lease.token);
            store.start(lease, &sp, "w-1").await.unwrap();
            states.push(store.finish(lease, failed("boom"), "w-1").await.unwrap());
        }
        assert_eq!(states, vec![State::Queued, State::Failed]);
        let j = store.get_job(id).await.unwrap();
        assert_eq!((j.attempt, j.max_attempts), (2, 2));
        assert!(j.finished_at.is_some());

        store.requeue(id, OPERATOR).await.unwrap();
        let j = store.get_job(id).await.unwrap();
        assert_eq!((j.state, j.attempt, j.max_attempts), (State::Queued, 2, 3));
        assert!(j.finished_at.is_none() && j.lease_owner.is_none());
        assert!(
            !tokens.contains(&j.lease_token.unwrap()),
            "requeue changes the token"
        );
        let e = store.job_events(id).await.unwrap();
        let e = e.last().unwrap();
        assert_eq!(
            (e.from, e.to, e.actor.as_str()),
            (Some(State::Failed), State::Queued, OPERATOR)
        );
        let lease = claim_one(&store, "w-1", "p", LONG).await;
        assert_eq!(
            store.start(lease, &sp, "w-1").await.unwrap(),
            StartOutcome::Started {
                attempt: 3,
                fence: Some(3)
            }
        );
        assert_eq!(
            store.finish(lease, failed("boom"), "w-1").await.unwrap(),
            State::Failed
        );
    }
);

contract_test!(a_pending_cancel_beats_retry, |store| async move {
    let sp = spec(LONG, StalePolicy::Retry);
    let (a, _) = running_job(&store, "w-1", "p", None, sp).await;
    store.cancel(a.id, OPERATOR).await.unwrap();
    assert_eq!(
        store.finish(a, failed("killed"), "w-1").await.unwrap(),
        State::Cancelled
    );
    let (b, _) = running_job(&store, "w-1", "p", None, sp).await;
    store.cancel(b.id, OPERATOR).await.unwrap();
    let no_retry = Outcome::Failed {
        error: "bad config".into(),
        retry: false,
    };
    assert_eq!(
        store.finish(b, no_retry, "w-1").await.unwrap(),
        State::Cancelled
    );
    let j = store.get_job(b.id).await.unwrap();
    assert!(j.finished_at.is_some() && j.cancel_requested_at.is_some());
    // Requeue clears the request: the next failure retries again.
    store.requeue(a.id, OPERATOR).await.unwrap();
    assert!(
        store
            .get_job(a.id)
            .await
            .unwrap()
            .cancel_requested_at
            .is_none()
    );
    let lease = claim_one(&store, "w-1", "p", LONG).await;
    store.start(lease, &sp, "w-1").await.unwrap();
    assert_eq!(
        store.finish(lease, failed("again"), "w-1").await.unwrap(),
        State::Queued
    );
});
