//! Group commit: a batch of starts or finishes gives each job the answer it
//! would get alone, and a lost lease in the batch spoils nothing else.

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{CycleRequest, LeaseRef, Outcome, StartOutcome, Store, StoreError};

use crate::common::*;

contract_test!(start_many_answers_per_job, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (holder, _) = running_job(&store, "w-0", "p", Some("busy"), sp).await;
    let free = enqueue(&store, "p", Some("free")).await;
    let none = enqueue(&store, "p", None).await;
    let lost = enqueue(&store, "p", None).await;
    let claimed = store
        .claim(&claim_req("w-1", &["p"], 10, LONG))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    let lease = |id: i64| {
        claimed
            .iter()
            .find(|j| j.id == id)
            .unwrap()
            .lease_ref()
            .unwrap()
    };
    // A job on the busy target, leased by hand (claims skip locked targets).
    let contender = enqueue(&store, "p", Some("busy")).await;
    raw_exec(
        &store,
        format!("UPDATE jobs SET state = 'leased', lease_owner = 'w-1', lease_token = 99 WHERE id = {contender}"),
    )
    .await;
    let items = vec![
        (lease(free), sp),
        (lease(none), sp),
        (
            LeaseRef {
                id: lost,
                token: 12345,
            },
            sp,
        ),
        (
            LeaseRef {
                id: contender,
                token: 99,
            },
            sp,
        ),
    ];
    let answers = store.start_many(&items, "w-1").await.unwrap();
    assert_eq!(answers.len(), 4);
    assert_eq!(
        answers[0].as_ref().unwrap(),
        &StartOutcome::Started {
            attempt: 1,
            fence: Some(1)
        }
    );
    assert_eq!(
        answers[1].as_ref().unwrap(),
        &StartOutcome::Started {
            attempt: 1,
            fence: None
        }
    );
    assert!(matches!(answers[2], Err(jobdeck::store::StoreError::LeaseLost(id)) if id == lost));
    assert!(matches!(
        answers[3].as_ref().unwrap(),
        StartOutcome::LockBusy { holder_job, .. } if *holder_job == holder.id
    ));
    assert_eq!(
        store.get_job(contender).await.unwrap().state,
        State::Leased,
        "busy: nothing written"
    );
    assert_eq!(store.get_job(free).await.unwrap().state, State::Running);
});

contract_test!(finish_many_answers_per_job, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (a, _) = running_job(&store, "w-1", "p", Some("ta"), sp).await;
    let (b, _) = running_job(&store, "w-1", "p", None, sp).await;
    let (c, _) = running_job(&store, "w-1", "p", Some("tc"), sp).await;
    let stale_token = LeaseRef {
        id: a.id,
        token: a.token.wrapping_add(1),
    };
    let items = vec![
        (a, Outcome::Succeeded),
        (b, Outcome::Succeeded),
        (
            c,
            Outcome::Failed {
                error: "boom".into(),
                retry: true,
            },
        ),
        (stale_token, Outcome::Succeeded),
    ];
    let answers = store.finish_many(&items, "w-1").await.unwrap();
    assert_eq!(answers[0].as_ref().unwrap(), &State::Succeeded);
    assert_eq!(answers[1].as_ref().unwrap(), &State::Succeeded);
    assert_eq!(answers[2].as_ref().unwrap(), &State::Queued, "retry path");
    assert!(matches!(
        answers[3],
        Err(jobdeck::store::StoreError::LeaseLost(_))
    ));
    assert!(
        store.list_locks().await.unwrap().is_empty(),
        "both locks released by fence"
    );
    let events = store.job_events(a.id).await.unwrap();
    let last = events.last().unwrap();
    assert_eq!(
        (last.from, last.to, last.actor.as_str()),
        (Some(State::Running), State::Succeeded, "w-1")
    );
    assert!(store.get_job(a.id).await.unwrap().finished_at.is_some());
    let retried = store.get_job(c.id).await.unwrap();
    assert_eq!(retried.last_error.as_deref(), Some("boom"));
    assert!(retried.lease_token.is_none());
});

contract_test!(cycle_finishes_then_claims_and_starts, |store| async move {
    let sp = spec(LONG, StalePolicy::Release);
    let (holder, fence) = running_job(&store, "w-1", "p", Some("t"), sp).await;
    assert_eq!(fence, Some(1));
    let (other, _) = running_job(&store, "w-1", "p", None, sp).await;
    // Blocked by the holder's lock until the cycle's finish frees it.
    let same_target = enqueue(&store, "p", Some("t")).await;
    let untargeted = enqueue(&store, "p", None).await;
    // A pipeline without a spec: claimed, left leased.
    let unstarted = enqueue(&store, "q", None).await;
    let lost = LeaseRef {
        id: other.id,
        token: other.token.wrapping_add(1),
    };
    let req = CycleRequest {
        finishes: vec![(holder, Outcome::Succeeded), (lost, Outcome::Succeeded)],
        claim: Some(claim_req("w-1", &["p", "q"], 10, LONG)),
        specs: vec![("p".into(), sp)],
    };
    let out = store.cycle(&req, "w-1").await.unwrap();
    assert_eq!(out.finished.len(), 2);
    assert_eq!(out.finished[0].as_ref().unwrap(), &State::Succeeded);
    assert!(matches!(out.finished[1], Err(StoreError::LeaseLost(id)) if id == other.id));
    assert_eq!(
        store.get_job(other.id).await.unwrap().state,
        State::Running,
        "a lost finish writes nothing"
    );
    let started = |id: i64| {
        out.claimed
            .iter()
            .find(|c| c.job.id == id)
            .unwrap_or_else(|| panic!("job {id} not claimed: {:?}", out.claimed))
            .started
    };
    assert_eq!(out.claimed.len(), 3);
    assert_eq!(started(same_target), Some((1, Some(2))), "fence grows");
    assert_eq!(started(untargeted), Some((1, None)));
    assert_eq!(started(unstarted), None);
    let job = store.get_job(same_target).await.unwrap();
    assert_eq!(
        (job.state, job.attempt, job.lock_fence, job.on_stale),
        (State::Running, 1, Some(2), StalePolicy::Release)
    );
    assert_eq!(store.get_job(unstarted).await.unwrap().state, State::Leased);
    let locks = store.list_locks().await.unwrap();
    assert_eq!(locks.len(), 1);
    assert_eq!(locks[0].job_id, same_target);
    let moves = moves(&store, same_target).await;
    assert_eq!(
        &moves[moves.len() - 2..],
        &[
            (Some(State::Queued), State::Leased, String::new()),
            (
                Some(State::Leased),
                State::Running,
                "attempt 1, fence 2".to_string()
            ),
        ]
    );
    // The cycle's moves are counted once each, whoever counts them.
    let nonzero = nonzero_counts(&store).await;
    assert_eq!(
        nonzero,
        vec![
            (State::Leased, 1),
            (State::Running, 3),
            (State::Succeeded, 1)
        ]
    );
});

// A queue without targets (on Postgres, the claim's leaner statement):
// jobs are taken in claim order (priority, then due time, then id), those
// whose pipeline has a spec start with it, the others stay leased, and
// every move is logged and counted.
contract_test!(
    cycle_without_targets_claims_in_order_and_starts,
    |store| async move {
        let sp = spec(LONG, StalePolicy::Release);
        let (done, _) = running_job(&store, "w-1", "p", None, sp).await;
        let low = enqueue(&store, "p", None).await;
        let unstarted = enqueue(&store, "q", None).await;
        let left = enqueue(&store, "p", None).await;
        let high = enqueue_at_priority(&store, "p", 5).await;
        let req = CycleRequest {
            finishes: vec![(done, Outcome::Succeeded)],
            claim: Some(claim_req("w-1", &["p", "q"], 3, LONG)),
            specs: vec![("p".into(), sp)],
        };
        let out = store.cycle(&req, "w-1").await.unwrap();
        assert_eq!(out.finished[0].as_ref().unwrap(), &State::Succeeded);
        let mut claimed: Vec<_> = out.claimed.iter().map(|c| (c.job.id, c.started)).collect();
        claimed.sort();
        let mut want = vec![
            (low, Some((1, None))),
            (unstarted, None),
            (high, Some((1, None))),
        ];
        want.sort();
        assert_eq!(claimed, want, "the highest priority first, then by id");
        assert_eq!(store.get_job(left).await.unwrap().state, State::Queued);
        let job = store.get_job(high).await.unwrap();
        assert_eq!(
            (job.state, job.attempt, job.lock_fence, job.on_stale),
            (State::Running, 1, None, StalePolicy::Release)
        );
        assert_eq!(job.lease_owner.as_deref(), Some("w-1"));
        assert!(job.started_at.is_some() && job.lease_expires_at.is_some());
        let job = store.get_job(unstarted).await.unwrap();
        assert_eq!((job.state, job.attempt), (State::Leased, 0));
        let moves = moves(&store, low).await;
        assert_eq!(
            &moves[moves.len() - 2..],
            &[
                (Some(State::Queued), State::Leased, String::new()),
                (Some(State::Leased), State::Running, "attempt 1".to_string()),
            ]
        );
        let nonzero = nonzero_counts(&store).await;
        assert_eq!(
            nonzero,
            vec![
                (State::Queued, 1),
                (State::Leased, 1),
                (State::Running, 2),
                (State::Succeeded, 1)
            ]
        );
    }
);

// Cycles without targets in a row: jobs are taken in claim order and
// started with their own pipeline's spec, and the counts (on Postgres,
// netted at the cycle's end) follow each cycle, whether it claims more
// jobs than it finishes or as many.
contract_test!(
    cycle_without_targets_all_specced_starts_and_counts,
    |store| async move {
        let p = spec(LONG, StalePolicy::Release);
        let q = spec(LONG, StalePolicy::Retry);
        let (first, _) = running_job(&store, "w-1", "p", None, p).await;
        let low = enqueue(&store, "p", None).await;
        let last = enqueue(&store, "p", None).await;
        let high = enqueue_at_priority(&store, "q", 5).await;
        let cycle = |done: LeaseRef, limit: usize| CycleRequest {
            finishes: vec![(done, Outcome::Succeeded)],
            claim: Some(claim_req("w-1", &["p", "q"], limit, LONG)),
            specs: vec![("p".into(), p), ("q".into(), q)],
        };

        let out = store.cycle(&cycle(first, 2), "w-1").await.unwrap();
        assert_eq!(out.finished[0].as_ref().unwrap(), &State::Succeeded);
        let claimed: Vec<_> = out.claimed.iter().map(|c| (c.job.id, c.started)).collect();
        assert_eq!(
            claimed,
            vec![(high, Some((1, None))), (low, Some((1, None)))]
        );
        let job = store.get_job(high).await.unwrap();
        assert_eq!(
            (
                job.state,
                job.attempt,
                job.on_stale,
                job.lease_owner.as_deref()
            ),
            (State::Running, 1, StalePolicy::Retry, Some("w-1"))
        );
        assert_eq!(
            store.get_job(low).await.unwrap().on_stale,
            StalePolicy::Release
        );
        assert_eq!(
            nonzero_counts(&store).await,
            vec![
                (State::Queued, 1),
                (State::Running, 2),
                (State::Succeeded, 1)
            ]
        );
        let moves = moves(&store, low).await;
        assert_eq!(
            &moves[moves.len() - 2..],
            &[
                (Some(State::Queued), State::Leased, String::new()),
                (Some(State::Leased), State::Running, "attempt 1".to_string()),
            ]
        );

        // One finished, one claimed: `running` does not move.
        let high_lease = out.claimed[0].job.lease_ref().unwrap();
        let out = store.cycle(&cycle(high_lease, 2), "w-1").await.unwrap();
        assert_eq!(out.finished[0].as_ref().unwrap(), &State::Succeeded);
        let claimed: Vec<_> = out.claimed.iter().map(|c| c.job.id).collect();
        assert_eq!(claimed, vec![last]);
        assert_eq!(
            nonzero_counts(&store).await,
            vec![(State::Running, 2), (State::Succeeded, 2)]
        );
    }
);

// Successes with and without a target, and a lost lease, in a cycle whose
// claim finds no queued job with a target (on Postgres, the lean claim of
// migration 0010): the lock is freed and the next job on its target takes
// it under the next fence, the lost finish writes nothing, and every move
// is logged and counted once.
contract_test!(
    cycle_frees_its_successes_locks_when_no_queued_job_has_a_target,
    |store| async move {
        let sp = spec(LONG, StalePolicy::Hold);
        let (plain, _) = running_job(&store, "w-1", "p", None, sp).await;
        let (held, fence) = running_job(&store, "w-1", "p", Some("t"), sp).await;
        let (other, _) = running_job(&store, "w-1", "p", None, sp).await;
        let lost = LeaseRef {
            id: other.id,
            token: other.token.wrapping_add(1),
        };
        let next = enqueue(&store, "p", None).await;
        let req = CycleRequest {
            finishes: vec![
                (held, Outcome::Succeeded),
                (lost, Outcome::Succeeded),
                (plain, Outcome::Succeeded),
            ],
            claim: Some(claim_req("w-1", &["p"], 10, LONG)),
            specs: vec![("p".into(), sp)],
        };
        let out = store.cycle(&req, "w-1").await.unwrap();
        assert_eq!(out.finished[0].as_ref().unwrap(), &State::Succeeded);
        assert!(matches!(out.finished[1], Err(StoreError::LeaseLost(id)) if id == other.id));
        assert_eq!(out.finished[2].as_ref().unwrap(), &State::Succeeded);
        assert_eq!(store.get_job(other.id).await.unwrap().state, State::Running);
        let claimed: Vec<_> = out.claimed.iter().map(|c| (c.job.id, c.started)).collect();
        assert_eq!(claimed, vec![(next, Some((1, None)))]);
        assert!(store.list_locks().await.unwrap().is_empty(), "t is free");
        for id in [held.id, plain.id] {
            let moves = moves(&store, id).await;
            assert_eq!(
                moves.last().unwrap(),
                &(Some(State::Running), State::Succeeded, String::new())
            );
        }
        assert_eq!(
            nonzero_counts(&store).await,
            vec![(State::Running, 2), (State::Succeeded, 2)]
        );

        // The next job on t takes the freed lock under the next fence.
        let waiting = enqueue(&store, "p", Some("t")).await;
        let req = CycleRequest {
            finishes: Vec::new(),
            claim: Some(claim_req("w-1", &["p"], 10, LONG)),
            specs: vec![("p".into(), sp)],
        };
        let out = store.cycle(&req, "w-1").await.unwrap();
        let claimed: Vec<_> = out.claimed.iter().map(|c| (c.job.id, c.started)).collect();
        assert_eq!(claimed, vec![(waiting, Some((1, fence.map(|f| f + 1))))]);
    }
);

contract_test!(cycle_without_claim_only_finishes, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (a, _) = running_job(&store, "w-1", "p", None, sp).await;
    let queued = enqueue(&store, "p", None).await;
    let req = CycleRequest {
        finishes: vec![(
            a,
            Outcome::Failed {
                error: "boom".into(),
                retry: false,
            },
        )],
        claim: None,
        specs: vec![("p".into(), sp)],
    };
    let out = store.cycle(&req, "w-1").await.unwrap();
    assert_eq!(out.finished[0].as_ref().unwrap(), &State::Failed);
    assert!(out.claimed.is_empty());
    assert_eq!(store.get_job(queued).await.unwrap().state, State::Queued);
});

// Successes with nothing to claim: the one-call path counts them without
// the claim's statement.
contract_test!(
    cycle_of_successes_without_claim_counts_them,
    |store| async move {
        let sp = spec(LONG, StalePolicy::Hold);
        let (a, _) = running_job(&store, "w-1", "p", None, sp).await;
        let (b, _) = running_job(&store, "w-1", "p", Some("t"), sp).await;
        enqueue(&store, "p", None).await;
        let req = CycleRequest {
            finishes: vec![(a, Outcome::Succeeded), (b, Outcome::Succeeded)],
            claim: None,
            specs: vec![("p".into(), sp)],
        };
        let out = store.cycle(&req, "w-1").await.unwrap();
        assert!(
            out.finished
                .iter()
                .all(|f| f.as_ref().ok() == Some(&State::Succeeded))
        );
        assert!(out.claimed.is_empty());
        let nonzero = nonzero_counts(&store).await;
        assert_eq!(nonzero, vec![(State::Queued, 1), (State::Succeeded, 2)]);
    }
);

// A cycle with a failure takes the statement-by-statement path (the full
// decision of each failed job); its claim and starts answer as the
// one-call path does.
contract_test!(
    cycle_with_a_failure_still_claims_and_starts,
    |store| async move {
        let sp = spec(LONG, StalePolicy::Hold);
        let (ok, _) = running_job(&store, "w-1", "p", Some("t"), sp).await;
        let (bad, _) = running_job(&store, "w-1", "p", None, sp).await;
        let next = enqueue(&store, "p", Some("t")).await;
        let req = CycleRequest {
            finishes: vec![
                (ok, Outcome::Succeeded),
                (
                    bad,
                    Outcome::Failed {
                        error: "boom".into(),
                        retry: true,
                    },
                ),
            ],
            claim: Some(claim_req("w-1", &["p"], 10, LONG)),
            specs: vec![("p".into(), sp)],
        };
        let out = store.cycle(&req, "w-1").await.unwrap();
        assert_eq!(out.finished[0].as_ref().unwrap(), &State::Succeeded);
        assert_eq!(out.finished[1].as_ref().unwrap(), &State::Queued, "retry");
        let ids: Vec<i64> = out.claimed.iter().map(|c| c.job.id).collect();
        assert_eq!(ids, vec![next], "the retried job waits for its backoff");
        assert_eq!(out.claimed[0].started, Some((1, Some(2))));
        let job = store.get_job(next).await.unwrap();
        assert_eq!((job.state, job.lock_fence), (State::Running, Some(2)));
        // Every move counted once (on Postgres this cycle runs on a pooled
        // connection, where the count trigger counts its moves).
        assert_eq!(
            nonzero_counts(&store).await,
            vec![
                (State::Queued, 1),
                (State::Running, 1),
                (State::Succeeded, 1)
            ]
        );
    }
);

// The history a cycle writes: each job's moves once, in order, by the
// worker; a success running → succeeded, a claimed job queued → leased
// and, when it started, leased → running. (Across jobs of one commit the
// order is the backend's.)
contract_test!(cycle_writes_each_jobs_moves_in_order, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (a, _) = running_job(&store, "w-1", "p", None, sp).await;
    let (b, _) = running_job(&store, "w-1", "p", None, sp).await;
    let low = enqueue(&store, "p", None).await;
    let unstarted = enqueue(&store, "q", None).await;
    let high = enqueue_at_priority(&store, "p", 5).await;
    let jobs = [a.id, b.id, low, unstarted, high];
    let history = |store: Store| async move {
        let mut all = Vec::new();
        for id in jobs {
            all.extend(store.job_events(id).await.unwrap());
        }
        all.sort_by_key(|e| e.id);
        all
    };
    let before = history(store.clone()).await.last().unwrap().id;
    let req = CycleRequest {
        finishes: vec![(b, Outcome::Succeeded), (a, Outcome::Succeeded)],
        claim: Some(claim_req("w-1", &["p", "q"], 3, LONG)),
        specs: vec![("p".into(), sp)],
    };
    store.cycle(&req, "w-1").await.unwrap();
    let mut written = std::collections::BTreeMap::<i64, Vec<_>>::new();
    for e in history(store.clone()).await {
        if e.id > before {
            let moved = (e.from, e.to, e.detail, e.actor);
            written.entry(e.job_id).or_default().push(moved);
        }
    }
    let step = |from: State, to: State, detail: &str| {
        (Some(from), to, detail.to_string(), "w-1".to_string())
    };
    let succeeded = vec![step(State::Running, State::Succeeded, "")];
    let started = vec![
        step(State::Queued, State::Leased, ""),
        step(State::Leased, State::Running, "attempt 1"),
    ];
    let want = std::collections::BTreeMap::from([
        (a.id, succeeded.clone()),
        (b.id, succeeded),
        (low, started.clone()),
        (high, started),
        (unstarted, vec![step(State::Queued, State::Leased, "")]),
    ]);
    assert_eq!(written, want);
});

// SQLite writes a cycle in one query up to its COMMIT, so the check of its
// locks runs in SQL: a lock that does not end up as the claim predicted
// (here a trigger bumps its fence behind the cycle's back) fails the
// cycle, and nothing of it is written.
#[tokio::test]
async fn sqlite_cycle_whose_lock_went_astray_writes_nothing() {
    let (store, _dir) = sqlite_store().await;
    let sp = spec(LONG, StalePolicy::Hold);
    let (holder, fence) = running_job(&store, "w-1", "p", Some("t"), sp).await;
    let next = enqueue(&store, "p", Some("t")).await;
    let history = |store: Store| async move {
        let mut n = store.job_events(holder.id).await.unwrap().len();
        n += store.job_events(next).await.unwrap().len();
        n
    };
    let events = history(store.clone()).await;
    raw_exec(
        &store,
        "CREATE TRIGGER astray AFTER UPDATE ON locks BEGIN
             UPDATE locks SET fence = fence + 10 WHERE target = NEW.target;
         END"
        .into(),
    )
    .await;
    let req = CycleRequest {
        finishes: vec![(holder, Outcome::Succeeded)],
        claim: Some(claim_req("w-1", &["p"], 1, LONG)),
        specs: vec![("p".into(), sp)],
    };
    let err = store.cycle(&req, "w-1").await.unwrap_err().to_string();
    assert!(
        err.contains("cycle_locks_went_as_the_claim_predicted"),
        "{err}"
    );
    assert_eq!(
        store.get_job(holder.id).await.unwrap().state,
        State::Running
    );
    assert_eq!(store.get_job(next).await.unwrap().state, State::Queued);
    assert_eq!(history(store.clone()).await, events);
    let locks = store.list_locks().await.unwrap();
    assert_eq!(
        (locks[0].job_id, Some(locks[0].fence)),
        (holder.id, fence),
        "the lock is still the holder's"
    );
    // Without the trigger the same cycle goes through.
    raw_exec(&store, "DROP TRIGGER astray".into()).await;
    let out = store.cycle(&req, "w-1").await.unwrap();
    assert_eq!(out.claimed[0].started, Some((1, Some(2))));
}
