//! Reads: counts, listings with filters and orders, steps and checkpoints,
//! output, the throughput histogram.

use std::time::Duration;

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{JobFilter, JobOrder, NewJob, Outcome, StoreError};

use crate::common::*;

contract_test!(count_by_state_lists_all_states, |store| async move {
    let counts = store.count_by_state().await.unwrap();
    assert_eq!(counts.len(), 7);
    assert!(counts.values().all(|n| *n == 0));
    enqueue(&store, "p", None).await;
    enqueue(&store, "p", None).await;
    let c = enqueue(&store, "x", None).await;
    store.cancel(c, OPERATOR).await.unwrap();
    running_job(&store, "w-1", "r", None, spec(LONG, StalePolicy::Hold)).await;
    let counts = store.count_by_state().await.unwrap();
    let want: Vec<(State, i64)> = State::ALL
        .iter()
        .map(|s| {
            let n = match s {
                State::Queued => 2,
                State::Running | State::Cancelled => 1,
                _ => 0,
            };
            (*s, n)
        })
        .collect();
    assert_eq!(counts.into_iter().collect::<Vec<_>>(), want);
});

contract_test!(list_jobs_filters_and_orders, |store| async move {
    let now = store.now().await.unwrap();
    let add = |pipeline: &str, target: Option<&str>, priority: i32, ago: i64| NewJob {
        priority,
        run_at: Some(now - chrono::Duration::seconds(ago)),
        ..new_job(pipeline, target)
    };
    let a = store
        .enqueue(add("sync", Some("alpha"), 0, 30), OPERATOR)
        .await
        .unwrap()
        .id;
    let b = store
        .enqueue(add("sync", Some("beta"), 9, 10), OPERATOR)
        .await
        .unwrap()
        .id;
    let c = store
        .enqueue(add("verify", Some("alpha"), 0, 50), OPERATOR)
        .await
        .unwrap()
        .id;
    let d = store
        .enqueue(add("harvest", None, 9, 20), OPERATOR)
        .await
        .unwrap()
        .id;
    store.cancel(a, OPERATOR).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    store.cancel(d, OPERATOR).await.unwrap();

    let list = |f: JobFilter| {
        let store = store.clone();
        async move {
            store
                .list_jobs(&f)
                .await
                .unwrap()
                .into_iter()
                .map(|j| j.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(list(JobFilter::default()).await, vec![d, c, b, a]);
    assert_eq!(
        list(JobFilter {
            order: JobOrder::ClaimOrder,
            ..Default::default()
        })
        .await,
        vec![d, b, c, a]
    );
    let finished = JobFilter {
        order: JobOrder::RecentlyFinished,
        states: vec![State::Cancelled, State::Succeeded],
        ..Default::default()
    };
    assert_eq!(list(finished).await, vec![d, a]);
    assert_eq!(
        list(JobFilter {
            states: vec![State::Queued],
            ..Default::default()
        })
        .await,
        vec![c, b]
    );
    assert_eq!(
        list(JobFilter {
            pipeline: Some("sync".into()),
            ..Default::default()
        })
        .await,
        vec![b, a]
    );
    assert_eq!(
        list(JobFilter {
            target: Some("alpha".into()),
            ..Default::default()
        })
        .await,
        vec![c, a]
    );
    // Text: a substring of pipeline or target, or the id itself.
    assert_eq!(
        list(JobFilter {
            text: Some("lph".into()),
            ..Default::default()
        })
        .await,
        vec![c, a]
    );
    assert_eq!(
        list(JobFilter {
            text: Some("vest".into()),
            ..Default::default()
        })
        .await,
        vec![d]
    );
    assert_eq!(
        list(JobFilter {
            text: Some(b.to_string()),
            ..Default::default()
        })
        .await,
        vec![b]
    );
    assert!(
        list(JobFilter {
            text: Some("nothing".into()),
            ..Default::default()
        })
        .await
        .is_empty()
    );
    assert_eq!(
        list(JobFilter {
            limit: 2,
            ..Default::default()
        })
        .await,
        vec![d, c]
    );
    let combined = JobFilter {
        states: vec![State::Queued, State::Cancelled],
        pipeline: Some("sync".into()),
        target: Some("beta".into()),
        ..Default::default()
    };
    assert_eq!(list(combined).await, vec![b]);
    let job = store.get_job(b).await.unwrap();
    assert_eq!(
        (job.pipeline.as_str(), job.target.as_deref(), job.priority),
        ("sync", Some("beta"), 9)
    );
});

contract_test!(list_jobs_default_limit_is_100, |store| async move {
    for _ in 0..105 {
        enqueue(&store, "p", None).await;
    }
    assert_eq!(
        store.list_jobs(&JobFilter::default()).await.unwrap().len(),
        100
    );
});

contract_test!(steps_checkpoints_and_output, |store| async move {
    let mut args = serde_json::Map::new();
    args.insert("path".into(), serde_json::json!("/data/t"));
    let job = NewJob {
        args: args.clone(),
        ..new_job("retention", Some("t"))
    };
    let id = store.enqueue(job, OPERATOR).await.unwrap().id;
    assert_eq!(store.get_job(id).await.unwrap().args, args);
    let lease = claim_one(&store, "w-1", "retention", LONG).await;
    store
        .start(lease, &spec(LONG, StalePolicy::Hold), "w-1")
        .await
        .unwrap();
    let cp = |k: &str, v: &str| (k.to_string(), v.to_string());
    store
        .advance_step(lease, 0, &[cp("cursor", "41")])
        .await
        .unwrap();
    // Sent again after a lost reply: no double advance.
    store
        .advance_step(lease, 0, &[cp("cursor", "41")])
        .await
        .unwrap();
    assert_eq!(store.get_job(id).await.unwrap().step, 1);
    store
        .advance_step(lease, 1, &[cp("cursor", "42"), cp("marker", "m")])
        .await
        .unwrap();
    assert_eq!(store.get_job(id).await.unwrap().step, 2);
    assert_eq!(
        store.checkpoints("retention", Some("t")).await.unwrap(),
        vec![cp("cursor", "42"), cp("marker", "m")]
    );
    assert!(
        store
            .checkpoints("retention", Some("u"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .checkpoints("retention", None)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .checkpoints("sync", Some("t"))
            .await
            .unwrap()
            .is_empty()
    );
    // No event for a step.
    assert_eq!(store.job_events(id).await.unwrap().len(), 3);

    assert_eq!(store.job_output(id).await.unwrap(), None);
    store.save_output(lease, "a\nb").await.unwrap();
    store.save_output(lease, "b\nc").await.unwrap();
    assert_eq!(store.job_output(id).await.unwrap().as_deref(), Some("b\nc"));
    store
        .finish(lease, Outcome::Succeeded, "w-1")
        .await
        .unwrap();
    assert!(matches!(
        store.save_output(lease, "late").await,
        Err(StoreError::LeaseLost(_))
    ));
    assert!(matches!(
        store.advance_step(lease, 2, &[]).await,
        Err(StoreError::LeaseLost(_))
    ));
    assert_eq!(store.job_output(id).await.unwrap().as_deref(), Some("b\nc"));

    // Jobs without a target share the pipeline's checkpoints.
    let (l2, _) = running_job(
        &store,
        "w-1",
        "harvest",
        None,
        spec(LONG, StalePolicy::Hold),
    )
    .await;
    store
        .advance_step(l2, 0, &[cp("since", "2026-01-01")])
        .await
        .unwrap();
    assert_eq!(
        store.checkpoints("harvest", None).await.unwrap(),
        vec![cp("since", "2026-01-01")]
    );
});

contract_test!(finished_histogram_counts_recent_jobs, |store| async move {
    assert_eq!(
        store
            .finished_histogram(Duration::from_secs(60), 4)
            .await
            .unwrap(),
        vec![0; 4]
    );
    for _ in 0..2 {
        let (l, _) = running_job(&store, "w-1", "p", None, spec(LONG, StalePolicy::Hold)).await;
        store.finish(l, Outcome::Succeeded, "w-1").await.unwrap();
    }
    let c = enqueue(&store, "p", None).await;
    store.cancel(c, OPERATOR).await.unwrap();
    enqueue(&store, "p", None).await;
    assert_eq!(
        store
            .finished_histogram(Duration::from_secs(60), 4)
            .await
            .unwrap(),
        vec![0, 0, 0, 3]
    );
    assert_eq!(
        store
            .finished_histogram(Duration::from_secs(60), 1)
            .await
            .unwrap(),
        vec![3]
    );
});
