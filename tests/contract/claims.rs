//! Enqueue (dedupe) and claim: order, batch size, pipelines, due time, one
//! job per target, and many claimers at once.

use std::collections::HashSet;
use std::time::Duration;

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{NewJob, Outcome};

use crate::common::*;

contract_test!(unique_key_dedupes_until_finished, |store| async move {
    let keyed = || NewJob {
        unique_key: Some("sync:t".into()),
        ..new_job("p", Some("t"))
    };
    let first = store.enqueue(keyed(), OPERATOR).await.unwrap();
    assert!(!first.deduplicated);
    let again = store.enqueue(keyed(), OPERATOR).await.unwrap();
    assert_eq!((again.id, again.deduplicated), (first.id, true));
    assert_eq!(store.count_by_state().await.unwrap()[&State::Queued], 1);
    // Still taken while the job runs.
    let lease = claim_one(&store, "w-1", "p", LONG).await;
    store
        .start(lease, &spec(LONG, StalePolicy::Hold), "w-1")
        .await
        .unwrap();
    assert_eq!(store.enqueue(keyed(), OPERATOR).await.unwrap(), again);
    // A finished job frees the key.
    store
        .finish(lease, Outcome::Succeeded, "w-1")
        .await
        .unwrap();
    let fresh = store.enqueue(keyed(), OPERATOR).await.unwrap();
    assert!(!fresh.deduplicated);
    assert_ne!(fresh.id, first.id);
    let job = store.get_job(fresh.id).await.unwrap();
    assert_eq!(job.unique_key.as_deref(), Some("sync:t"));
    assert_eq!(job.max_attempts, jobdeck::job::DEFAULT_MAX_ATTEMPTS);
});

contract_test!(claim_order_batch_and_filters, |store| async move {
    let now = store.now().await.unwrap();
    let at = |secs_ago: i64, priority: i32| NewJob {
        run_at: Some(now - chrono::Duration::seconds(secs_ago)),
        priority,
        ..new_job("p", None)
    };
    let a = store.enqueue(at(10, 0), OPERATOR).await.unwrap().id;
    let b = store.enqueue(at(1, 5), OPERATOR).await.unwrap().id;
    let c = store.enqueue(at(5, 5), OPERATOR).await.unwrap().id;
    let d = store.enqueue(at(10, 0), OPERATOR).await.unwrap().id;
    // Not due yet, or of a pipeline this worker does not run.
    let later = NewJob {
        delay: Some(Duration::from_secs(3600)),
        priority: 99,
        ..new_job("p", None)
    };
    let later = store.enqueue(later, OPERATOR).await.unwrap().id;
    let future = NewJob {
        run_at: Some(now + chrono::Duration::seconds(3600)),
        priority: 99,
        ..new_job("p", None)
    };
    store.enqueue(future, OPERATOR).await.unwrap();
    let other = store.enqueue(at(100, 100), OPERATOR).await.unwrap().id;
    store.cancel(other, OPERATOR).await.unwrap();
    let foreign = enqueue(&store, "x", None).await;

    let first = store
        .claim(&claim_req("w-1", &["p", "q"], 2, LONG))
        .await
        .unwrap();
    let ids: Vec<i64> = first.iter().map(|j| j.id).collect();
    assert_eq!(ids, vec![c, b], "priority first, then due time");
    for j in &first {
        assert_eq!(j.state, State::Leased);
        assert_eq!(j.lease_owner.as_deref(), Some("w-1"));
        assert!(j.lease_token.is_some());
        assert!(j.lease_expires_at.unwrap() > now + chrono::Duration::seconds(50));
    }
    let rest = store
        .claim(&claim_req("w-2", &["p"], 10, LONG))
        .await
        .unwrap();
    let ids: Vec<i64> = rest.iter().map(|j| j.id).collect();
    assert_eq!(
        ids,
        vec![a, d],
        "equal priority and due time: lower id first"
    );
    assert!(
        store
            .claim(&claim_req("w-2", &["p"], 10, LONG))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.get_job(later).await.unwrap().state, State::Queued);
    let got = store
        .claim(&claim_req("w-3", &["x"], 10, LONG))
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, foreign);
    assert_eq!(got[0].lease_owner.as_deref(), Some("w-3"));
});

// Of a target's queued jobs the claim takes the one it would take first
// without targets: highest priority, then earliest due, then lowest id.
contract_test!(
    one_job_per_target_is_its_first_in_claim_order,
    |store| async move {
        let now = store.now().await.unwrap();
        let at = |target: &str, secs_ago: i64, priority: i32| NewJob {
            run_at: Some(now - chrono::Duration::seconds(secs_ago)),
            priority,
            ..new_job("p", Some(target))
        };
        // t: the later-enqueued, higher-priority job wins over an older one.
        enqueue_job(&store, at("t", 30, 0)).await;
        let t_first = enqueue_job(&store, at("t", 1, 5)).await;
        // u: equal priority, the earlier due time wins over the lower id.
        enqueue_job(&store, at("u", 1, 2)).await;
        let u_first = enqueue_job(&store, at("u", 20, 2)).await;
        // v: equal priority and due time, the lower id wins.
        let v_first = enqueue_job(&store, at("v", 10, 1)).await;
        enqueue_job(&store, at("v", 10, 1)).await;
        let got = store
            .claim(&claim_req("w-1", &["p"], 10, LONG))
            .await
            .unwrap();
        let ids: Vec<i64> = got.iter().map(|j| j.id).collect();
        assert_eq!(
            ids,
            vec![t_first, u_first, v_first],
            "one per target, in claim order"
        );
    }
);

contract_test!(
    one_job_per_target_and_busy_targets_skipped,
    |store| async move {
        let t1 = enqueue(&store, "p", Some("t")).await;
        let t2 = enqueue(&store, "p", Some("t")).await;
        let u1 = enqueue(&store, "p", Some("u")).await;
        let n1 = enqueue(&store, "p", None).await;
        let n2 = enqueue(&store, "p", None).await;
        let got = store
            .claim(&claim_req("w-1", &["p"], 10, LONG))
            .await
            .unwrap();
        let ids: HashSet<i64> = got.iter().map(|j| j.id).collect();
        assert_eq!(ids, HashSet::from([t1, u1, n1, n2]));
        // t has a leased job: its second job waits.
        assert!(
            store
                .claim(&claim_req("w-2", &["p"], 10, LONG))
                .await
                .unwrap()
                .is_empty()
        );
        let t1_lease = got
            .iter()
            .find(|j| j.id == t1)
            .unwrap()
            .lease_ref()
            .unwrap();
        store
            .start(t1_lease, &spec(LONG, StalePolicy::Hold), "w-1")
            .await
            .unwrap();
        // Now t is locked by a running job: still skipped.
        assert!(
            store
                .claim(&claim_req("w-2", &["p"], 10, LONG))
                .await
                .unwrap()
                .is_empty()
        );
        store
            .finish(t1_lease, Outcome::Succeeded, "w-1")
            .await
            .unwrap();
        let got = store
            .claim(&claim_req("w-2", &["p"], 10, LONG))
            .await
            .unwrap();
        assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![t2]);
    }
);

contract_test!(concurrent_claimers_never_share_a_job, |store| async move {
    const JOBS: usize = 2000;
    const CLAIMERS: usize = 8;
    // Half the jobs have a target of their own, half none.
    let batch = (0..JOBS)
        .map(|i| {
            let target = (i % 2 == 0).then(|| format!("t{i}"));
            new_job("p", target.as_deref())
        })
        .collect();
    let all: HashSet<i64> = store
        .enqueue_many(batch, OPERATOR)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(all.len(), JOBS);

    let mut claimers = Vec::new();
    for c in 0..CLAIMERS {
        let store = store.clone();
        claimers.push(tokio::spawn(async move {
            let worker = format!("w-{c}");
            let mut mine = Vec::new();
            loop {
                let got = store
                    .claim(&claim_req(&worker, &["p"], 16, LONG))
                    .await
                    .expect("claim under contention");
                if got.is_empty() {
                    break;
                }
                for j in got {
                    assert_eq!(j.lease_owner.as_deref(), Some(worker.as_str()));
                    mine.push(j.id);
                }
            }
            mine
        }));
    }
    let mut seen = HashSet::new();
    for c in claimers {
        for id in c.await.unwrap() {
            assert!(seen.insert(id), "job {id} was claimed twice");
        }
    }
    assert_eq!(seen, all, "together the claimers took every job");
    assert_eq!(
        store.count_by_state().await.unwrap()[&State::Leased],
        JOBS as i64
    );
});

contract_test!(enqueue_many_is_all_or_nothing, |store| async move {
    assert!(
        store
            .enqueue_many(Vec::new(), OPERATOR)
            .await
            .unwrap()
            .is_empty()
    );
    let batch = vec![
        NewJob {
            priority: 3,
            ..new_job("p", Some("a"))
        },
        NewJob {
            delay: Some(Duration::from_secs(600)),
            ..new_job("q", None)
        },
        new_job("p", Some("b")),
    ];
    let ids = store.enqueue_many(batch, "producer:x").await.unwrap();
    assert_eq!(ids.len(), 3);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids in input order: {ids:?}"
    );
    let jobs: Vec<_> = futures::future::join_all(ids.iter().map(|id| store.get_job(*id)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let shape: Vec<(&str, Option<&str>, i32)> = jobs
        .iter()
        .map(|j| (j.pipeline.as_str(), j.target.as_deref(), j.priority))
        .collect();
    assert_eq!(
        shape,
        vec![("p", Some("a"), 3), ("q", None, 0), ("p", Some("b"), 0)]
    );
    let now = store.now().await.unwrap();
    assert!(jobs[1].due_at > now + chrono::Duration::seconds(500));
    assert!(
        jobs.iter()
            .all(|j| j.state == State::Queued && j.max_attempts == 3)
    );
    for id in &ids {
        let ev = store.job_events(*id).await.unwrap();
        assert_eq!(ev.len(), 1);
        assert_eq!(
            (ev[0].from, ev[0].to, ev[0].actor.as_str()),
            (None, State::Queued, "producer:x")
        );
    }

    let bad = |job: NewJob| vec![new_job("p", None), job];
    let keyed = NewJob {
        unique_key: Some("k".into()),
        ..new_job("p", None)
    };
    let e = store.enqueue_many(bad(keyed), OPERATOR).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "job #2 of the batch has a unique key; enqueue it on its own"
    );
    let zero = NewJob {
        max_attempts: Some(0),
        ..new_job("p", None)
    };
    let e = store
        .enqueue_many(bad(zero.clone()), OPERATOR)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "max_attempts must be at least 1 (got 0)");
    let e = store.enqueue(zero, OPERATOR).await.unwrap_err();
    assert!(matches!(e, jobdeck::store::StoreError::Invalid(_)));
    let e = store
        .enqueue(new_job(" ", None), OPERATOR)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "a job needs a pipeline");
    // Nothing of a refused batch was written.
    let total: i64 = store.count_by_state().await.unwrap().values().sum();
    assert_eq!(total, 3);
});
