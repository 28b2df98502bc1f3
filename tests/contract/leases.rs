//! Renewals, operator extensions, and what the reaper does with expired
//! leases under each `on_stale` policy. Leases are 300 ms and the tests
//! really wait, once per test.

use std::time::Duration;

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{NewJob, Renewal, StartOutcome};

use crate::common::*;

const SHORT: Duration = Duration::from_millis(300);
const REAPER: &str = "reaper:test";

fn held(r: Renewal) -> (Duration, bool) {
    match r {
        Renewal::Held {
            remaining,
            cancel_requested,
        } => (remaining, cancel_requested),
        Renewal::Lost => panic!("lease lost"),
    }
}

contract_test!(renew_extends_and_never_shortens, |store| async move {
    let sp = spec(SHORT, StalePolicy::Hold);
    let (run, _) = running_job(&store, "w-1", "p", Some("t"), sp).await;
    enqueue(&store, "p", None).await;
    let leased = claim_one(&store, "w-1", "p", SHORT).await;
    let beat = worker_beat("w-1");
    let got = store
        .renew(&beat, &[run, leased], Duration::from_secs(20))
        .await
        .unwrap();
    assert_eq!(got.len(), 2);
    for (i, l) in [run, leased].into_iter().enumerate() {
        assert_eq!(got[i].0, l);
        let (left, cancel) = held(got[i].1);
        assert!(
            left > Duration::from_secs(19) && left <= Duration::from_secs(20),
            "{left:?}"
        );
        assert!(!cancel);
    }
    let job = store.get_job(run.id).await.unwrap();
    let locks = store.list_locks().await.unwrap();
    assert_eq!(
        locks[0].expires_at, job.lease_expires_at,
        "lock shows the renewed lease"
    );

    // The heartbeat registered the worker.
    let workers = store.list_workers().await.unwrap();
    assert_eq!(workers.len(), 1);
    let w = &workers[0];
    assert_eq!(
        (w.id.as_str(), w.host.as_str(), w.pid, w.slots),
        ("w-1", "host-a", 4242, 4)
    );
    assert_eq!((w.busy, w.paused, w.gone), (1, false, false));
    assert_eq!(w.pipelines, vec!["p".to_string()]);

    // An operator extension outlives shorter renewals.
    let until = store
        .extend(run.id, Duration::from_secs(600), LONG, OPERATOR)
        .await
        .unwrap();
    assert_eq!(
        store.get_job(run.id).await.unwrap().lease_expires_at,
        Some(until)
    );
    let now = store.now().await.unwrap();
    assert!(until > now + chrono::Duration::seconds(600));
    let got = store.renew(&beat, &[run], SHORT).await.unwrap();
    let (left, _) = held(got[0].1);
    assert!(
        left > Duration::from_secs(600),
        "renewal shortened an extension: {left:?}"
    );
    assert_eq!(
        store.get_job(run.id).await.unwrap().lease_expires_at,
        Some(until)
    );
    let events = store.job_events(run.id).await.unwrap();
    let last = events.last().unwrap();
    assert_eq!((last.from, last.to), (Some(State::Running), State::Running));
    assert_eq!(
        (last.actor.as_str(), last.detail.as_str()),
        (OPERATOR, "lease extended by 10m")
    );

    // A cancel request reaches the worker through its renewal.
    store.cancel(run.id, OPERATOR).await.unwrap();
    let got = store.renew(&beat, &[run], SHORT).await.unwrap();
    assert!(held(got[0].1).1);
    // Unknown leases are lost; the heartbeat still counts.
    let bogus = jobdeck::store::LeaseRef {
        id: 999_999,
        token: 1,
    };
    let got = store.renew(&beat, &[bogus], SHORT).await.unwrap();
    assert_eq!(got, vec![(bogus, Renewal::Lost)]);
});

contract_test!(extend_needs_a_live_worker, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (run, _) = running_job(&store, "w-1", "p", None, sp).await;
    // w-1 never sent a heartbeat: unknown counts as gone.
    let e = store
        .extend(run.id, LONG, LONG, OPERATOR)
        .await
        .unwrap_err();
    let want = format!(
        "job {}: its worker w-1 is gone; requeue or cancel it instead",
        run.id
    );
    assert_eq!(e.to_string(), want);
    store
        .renew(&worker_beat("w-1"), &[run], LONG)
        .await
        .unwrap();
    let before = store
        .get_job(run.id)
        .await
        .unwrap()
        .lease_expires_at
        .unwrap();
    let until = store
        .extend(run.id, Duration::from_secs(30), LONG, OPERATOR)
        .await
        .unwrap();
    assert_eq!(until, before + chrono::Duration::seconds(30));
    store.worker_stopped("w-1").await.unwrap();
    let e = store
        .extend(run.id, LONG, LONG, OPERATOR)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), want);
    let w = &store.list_workers().await.unwrap()[0];
    assert_eq!((w.gone, w.busy), (true, 0));
    // A heartbeat brings it back.
    store
        .renew(&worker_beat("w-1"), &[run], LONG)
        .await
        .unwrap();
    store.extend(run.id, LONG, LONG, OPERATOR).await.unwrap();
});

contract_test!(expiry_applies_each_policy, |store| async move {
    // Five runs and a leased job, all on 300 ms leases; one on a long lease.
    let leased_id = enqueue(&store, "lease-only", Some("tl")).await;
    let leased = claim_one(&store, "w-0", "lease-only", SHORT).await;
    // A backoff long enough to still be in the future when checked on a
    // loaded machine.
    let run = |p: StalePolicy| jobdeck::store::StartSpec {
        backoff: Duration::from_secs(30),
        ..spec(SHORT, p)
    };
    let (hold, _) = running_job(&store, "w-1", "hold", Some("th"), run(StalePolicy::Hold)).await;
    let (rel, _) = running_job(&store, "w-1", "rel", Some("tr"), run(StalePolicy::Release)).await;
    let (retry, _) = running_job(&store, "w-1", "retry", Some("tt"), run(StalePolicy::Retry)).await;
    let last_try = NewJob {
        max_attempts: Some(1),
        ..new_job("last", Some("tx"))
    };
    store.enqueue(last_try, OPERATOR).await.unwrap();
    let last = claim_one(&store, "w-1", "last", SHORT).await;
    assert!(matches!(
        store
            .start(last, &run(StalePolicy::Retry), "w-1")
            .await
            .unwrap(),
        StartOutcome::Started { attempt: 1, .. }
    ));
    let (cancelled, _) =
        running_job(&store, "w-1", "cx", Some("tc"), run(StalePolicy::Retry)).await;
    store.cancel(cancelled.id, OPERATOR).await.unwrap();
    let (alive, _) = running_job(
        &store,
        "w-2",
        "alive",
        Some("ta"),
        spec(LONG, StalePolicy::Hold),
    )
    .await;

    tokio::time::sleep(Duration::from_millis(450)).await;
    // Within the grace, running jobs are left alone; leased ones are not.
    let first = store.expire_leases(LONG, REAPER).await.unwrap();
    assert_eq!(first.requeued, vec![leased_id]);
    assert!(first.stale.is_empty() && first.retried.is_empty() && first.finished.is_empty());
    let mut report = store.expire_leases(Duration::ZERO, REAPER).await.unwrap();
    report.stale.sort();
    report.finished.sort();
    assert!(report.requeued.is_empty());
    assert_eq!(report.stale, vec![hold.id, rel.id]);
    assert_eq!(report.retried, vec![retry.id]);
    assert_eq!(report.finished, vec![last.id, cancelled.id]);
    assert_eq!(
        store.expire_leases(Duration::ZERO, REAPER).await.unwrap(),
        Default::default()
    );

    let job = |id| {
        let store = store.clone();
        async move { store.get_job(id).await.unwrap() }
    };
    // Leased: back to the queue, not an attempt, the old token is dead.
    let j = job(leased_id).await;
    assert_eq!(
        (j.state, j.attempt, j.lease_owner.clone()),
        (State::Queued, 0, None)
    );
    assert!(matches!(
        store.start(leased, &run(StalePolicy::Hold), "w-0").await,
        Err(jobdeck::store::StoreError::LeaseLost(_))
    ));
    let e = store.job_events(leased_id).await.unwrap();
    let e = e.last().unwrap();
    assert_eq!((e.from, e.to), (Some(State::Leased), State::Queued));
    assert_eq!(
        (e.actor.as_str(), e.detail.as_str()),
        (REAPER, "lease of w-0 expired before start")
    );

    // hold keeps the lock (quarantine), release frees it.
    assert_eq!(job(hold.id).await.state, State::Stale);
    assert_eq!(job(rel.id).await.state, State::Stale);
    let mut locked: Vec<(String, State)> = store
        .list_locks()
        .await
        .unwrap()
        .into_iter()
        .map(|l| (l.target, l.job_state))
        .collect();
    locked.sort();
    assert_eq!(
        locked,
        vec![
            ("ta".to_string(), State::Running),
            ("th".to_string(), State::Stale)
        ]
    );
    let e = store.job_events(hold.id).await.unwrap();
    let e = e.last().unwrap();
    assert_eq!((e.from, e.to), (Some(State::Running), State::Stale));
    assert_eq!(
        (e.actor.as_str(), e.detail.as_str()),
        (REAPER, "lease of w-1 expired; worker presumed dead")
    );

    // retry: queued with backoff, the attempt stays used.
    let j = job(retry.id).await;
    assert_eq!((j.state, j.attempt), (State::Queued, 1));
    assert!(j.lease_token.is_none() && j.lease_owner.is_none());
    assert!(j.due_at > store.now().await.unwrap(), "backoff applied");
    // Out of attempts: failed. A pending cancel wins over retry.
    let j = job(last.id).await;
    assert_eq!(j.state, State::Failed);
    assert!(j.finished_at.is_some());
    let j = job(cancelled.id).await;
    assert_eq!(j.state, State::Cancelled);
    assert!(j.finished_at.is_some());
    assert_eq!(job(alive.id).await.state, State::Running);

    // Stale workers can write nothing; the operator resolves stale jobs.
    assert!(matches!(
        store
            .finish(hold, jobdeck::store::Outcome::Succeeded, "w-1")
            .await,
        Err(jobdeck::store::StoreError::LeaseLost(_))
    ));
    // The quarantined target takes no new run; the released one does.
    let next_th = enqueue(&store, "hold", Some("th")).await;
    let next_tr = enqueue(&store, "rel", Some("tr")).await;
    let got = store
        .claim(&claim_req("w-3", &["hold", "rel"], 10, LONG))
        .await
        .unwrap();
    assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![next_tr]);
    assert_eq!(store.release_lock("th", OPERATOR).await.unwrap(), hold.id);
    assert_eq!(store.list_locks().await.unwrap().len(), 1);
    let e = store.job_events(hold.id).await.unwrap();
    let e = e.last().unwrap();
    assert_eq!(
        (e.from, e.to, e.detail.as_str()),
        (Some(State::Stale), State::Stale, "lock on th released")
    );
    let e = store.release_lock("th", OPERATOR).await.unwrap_err();
    assert_eq!(e.to_string(), "target th is not locked");
    // The fence survived the release.
    let lease = claim_one(&store, "w-3", "hold", LONG).await;
    assert_eq!(lease.id, next_th);
    let out = store
        .start(lease, &spec(LONG, StalePolicy::Hold), "w-3")
        .await
        .unwrap();
    assert_eq!(
        out,
        StartOutcome::Started {
            attempt: 1,
            fence: Some(2)
        }
    );
    // Requeue a stale job: fresh token, lock (if held) released.
    store.requeue(rel.id, OPERATOR).await.unwrap();
    let j = job(rel.id).await;
    assert_eq!(j.state, State::Queued);
    assert_ne!(j.lease_token, Some(rel.token));
});

contract_test!(
    cancel_and_requeue_of_a_stale_hold_job_free_its_lock,
    |store| async move {
        let sp = spec(SHORT, StalePolicy::Hold);
        let (a, _) = running_job(&store, "w-1", "p", Some("ta"), sp).await;
        let (b, _) = running_job(&store, "w-1", "p", Some("tb"), sp).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
        let report = store.expire_leases(Duration::ZERO, REAPER).await.unwrap();
        assert_eq!(report.stale.len(), 2);
        assert_eq!(store.list_locks().await.unwrap().len(), 2);
        assert_eq!(
            store.cancel(a.id, OPERATOR).await.unwrap(),
            jobdeck::store::CancelOutcome::Cancelled
        );
        store.requeue(b.id, OPERATOR).await.unwrap();
        assert!(store.list_locks().await.unwrap().is_empty());
        let j = store.get_job(a.id).await.unwrap();
        assert_eq!(j.state, State::Cancelled);
        // The requeued job runs again with the next fence.
        let lease = claim_one(&store, "w-2", "p", LONG).await;
        assert_eq!(lease.id, b.id);
        let out = store
            .start(lease, &spec(LONG, StalePolicy::Hold), "w-2")
            .await
            .unwrap();
        assert_eq!(
            out,
            StartOutcome::Started {
                attempt: 2,
                fence: Some(2)
            }
        );
    }
);

contract_test!(
    renewals_are_not_starved_by_a_busy_writer,
    |store| async move {
        let sp = spec(LONG, StalePolicy::Hold);
        let (lease, _) = running_job(&store, "w-1", "p", None, sp).await;
        // Back-to-back write transactions of the same process, as a busy
        // engine's cycles are (three writers, so one is always queued and the
        // write lock is never free for long): the renewal must get its turn.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writers: Vec<_> = (0..3)
            .map(|_| {
                let busy = store.clone();
                let stopped = stop.clone();
                tokio::spawn(async move {
                    let mut writes = 0u32;
                    while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                        let jobs = (0..200).map(|_| new_job("other", None)).collect();
                        busy.enqueue_many(jobs, "w-2").await.expect("enqueue");
                        writes += 1;
                    }
                    writes
                })
            })
            .collect();
        for _ in 0..20 {
            let renewed = store
                .renew(&worker_beat("w-1"), &[lease], LONG)
                .await
                .expect("a renewal is never starved by the busy writer");
            assert!(matches!(renewed[0].1, Renewal::Held { .. }));
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in writers {
            assert!(w.await.unwrap() > 0, "the writers kept writing meanwhile");
        }
    }
);
