//! Set-based starts: a batch of starts, and a cycle's claim, take their
//! targets' locks together and must answer each job as a start of its own
//! would: one job per target, the fence one past the last holder's, a lock
//! held elsewhere left as it was (its contender told who holds it), and
//! every move in the job's history, in order.

#[macro_use]
#[path = "common/mod.rs"]
mod common;

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{CycleOutcome, CycleRequest, LeaseRef, Outcome, StartOutcome, Store};

use common::*;

/// Put job `id` in `leased` under `token` by hand: a claim never hands out
/// two jobs of one target, or one whose target is locked, and these tests
/// need both.
async fn lease_by_hand(store: &Store, id: i64, token: i64) -> LeaseRef {
    raw_exec(
        store,
        format!(
            "UPDATE jobs SET state = 'leased', lease_owner = 'w-1', lease_token = {token} \
             WHERE id = {id}"
        ),
    )
    .await;
    LeaseRef { id, token }
}

/// (from, to, detail) of each event of job `id`, oldest first.
async fn moves(store: &Store, id: i64) -> Vec<(Option<State>, State, String)> {
    store
        .job_events(id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.from, e.to, e.detail))
        .collect()
}

/// How a claimed job started: (attempt, fence), or `None` when left leased.
type Started = Option<(i32, Option<i64>)>;

/// What a cycle claimed, in order, and how each claimed job started.
fn starts(out: &CycleOutcome) -> Vec<(i64, Started)> {
    out.claimed.iter().map(|c| (c.job.id, c.started)).collect()
}

/// A target whose lock was taken and released `times` times (fence = times).
async fn used_target(store: &Store, target: &str, times: i64) {
    let sp = spec(LONG, StalePolicy::Hold);
    for n in 1..=times {
        let (lease, fence) = running_job(store, "w-0", "used", Some(target), sp).await;
        assert_eq!(fence, Some(n));
        let to = store
            .finish(lease, Outcome::Succeeded, "w-0")
            .await
            .unwrap();
        assert_eq!(to, State::Succeeded);
    }
}

contract_test!(start_many_takes_free_locks_together, |store| async move {
    let sp = spec(LONG, StalePolicy::Release);
    let (holder, holder_fence) = running_job(&store, "w-0", "p", Some("busy"), sp).await;
    used_target(&store, "again", 2).await;
    let first = enqueue(&store, "p", Some("dup")).await;
    let second = enqueue(&store, "p", Some("dup")).await;
    let again = enqueue(&store, "p", Some("again")).await;
    let contender = enqueue(&store, "p", Some("busy")).await;
    let plain = enqueue(&store, "p", None).await;
    let lost = enqueue(&store, "p", Some("lost")).await;
    let mut items = Vec::new();
    for (i, id) in [second, first, again, contender, plain]
        .into_iter()
        .enumerate()
    {
        items.push((lease_by_hand(&store, id, 500 + i as i64).await, sp));
    }
    lease_by_hand(&store, lost, 7).await;
    items.push((LeaseRef { id: lost, token: 8 }, sp));

    let answers = store.start_many(&items, "w-1").await.unwrap();
    assert_eq!(answers.len(), items.len());
    let started = |a: &Result<StartOutcome, _>| match a {
        Ok(StartOutcome::Started { attempt, fence }) => Some((*attempt, *fence)),
        _ => None,
    };
    // One job per target: the smaller id takes "dup", the other is told.
    assert_eq!(started(&answers[1]), Some((1, Some(1))), "first on dup");
    assert!(
        matches!(&answers[0], Ok(StartOutcome::LockBusy { holder_job, holder_worker })
            if *holder_job == first && holder_worker.as_deref() == Some("w-1")),
        "second on dup: {:?}",
        answers[0]
    );
    assert_eq!(started(&answers[2]), Some((1, Some(3))), "fence + 1");
    assert!(
        matches!(&answers[3], Ok(StartOutcome::LockBusy { holder_job, holder_worker })
            if *holder_job == holder.id && holder_worker.as_deref() == Some("w-0")),
        "busy: {:?}",
        answers[3]
    );
    assert_eq!(started(&answers[4]), Some((1, None)), "no target, no lock");
    assert!(
        matches!(&answers[5], Err(jobdeck::store::StoreError::LeaseLost(id)) if *id == lost),
        "lost: {:?}",
        answers[5]
    );

    // The busy lock is as it was; the losers wrote nothing.
    let locks = store.list_locks().await.unwrap();
    let lock = |t: &str| locks.iter().find(|l| l.target == t).cloned();
    let busy = lock("busy").expect("busy lock");
    assert_eq!(
        (busy.job_id, busy.fence, busy.worker_id.as_deref()),
        (holder.id, holder_fence.unwrap(), Some("w-0"))
    );
    let dup = lock("dup").expect("dup lock");
    assert_eq!((dup.job_id, dup.fence), (first, 1));
    let again_lock = lock("again").expect("again lock");
    assert_eq!(
        (
            again_lock.job_id,
            again_lock.fence,
            again_lock.worker_id.as_deref()
        ),
        (again, 3, Some("w-1"))
    );
    assert!(lock("lost").is_none(), "a lost lease takes no lock");
    for id in [second, contender, lost] {
        let job = store.get_job(id).await.unwrap();
        assert_eq!((job.state, job.attempt), (State::Leased, 0), "job {id}");
        assert!(
            moves(&store, id)
                .await
                .iter()
                .all(|m| m.1 != State::Running),
            "job {id}: no start recorded"
        );
    }
    for (id, fence) in [(first, Some(1)), (again, Some(3)), (plain, None)] {
        let job = store.get_job(id).await.unwrap();
        assert_eq!(
            (job.state, job.attempt, job.lock_fence, job.on_stale),
            (State::Running, 1, fence, StalePolicy::Release),
            "job {id}"
        );
        assert!(job.started_at.is_some());
        let detail = match fence {
            Some(f) => format!("attempt 1, fence {f}"),
            None => "attempt 1".to_string(),
        };
        assert_eq!(
            moves(&store, id).await.last().unwrap(),
            &(Some(State::Leased), State::Running, detail),
            "job {id}"
        );
    }
});

contract_test!(a_cycle_starts_what_it_claims_in_order, |store| async move {
    let sp = spec(LONG, StalePolicy::Hold);
    let (holder, _) = running_job(&store, "w-0", "p", Some("busy"), sp).await;
    used_target(&store, "again", 1).await;
    let blocked = enqueue(&store, "p", Some("busy")).await;
    let again = enqueue(&store, "p", Some("again")).await;
    let fresh = enqueue(&store, "p", Some("fresh")).await;
    let twin = enqueue(&store, "p", Some("fresh")).await;
    let plain = enqueue(&store, "p", None).await;
    let req = CycleRequest {
        finishes: Vec::new(),
        claim: Some(claim_req("w-1", &["p"], 10, LONG)),
        specs: vec![("p".into(), sp)],
    };
    let out = store.cycle(&req, "w-1").await.unwrap();
    let got = starts(&out);
    assert_eq!(
        got,
        vec![
            (again, Some((1, Some(2)))),
            (fresh, Some((1, Some(1)))),
            (plain, Some((1, None))),
        ],
        "claim order; one job per target; none on a held lock"
    );
    for id in [blocked, twin] {
        assert_eq!(store.get_job(id).await.unwrap().state, State::Queued);
    }
    let busy = store.list_locks().await.unwrap();
    let busy = busy.iter().find(|l| l.target == "busy").unwrap();
    assert_eq!((busy.job_id, busy.fence), (holder.id, 1));
    for (id, detail) in [
        (again, "attempt 1, fence 2"),
        (fresh, "attempt 1, fence 1"),
        (plain, "attempt 1"),
    ] {
        let job = store.get_job(id).await.unwrap();
        assert_eq!((job.state, job.attempt), (State::Running, 1), "job {id}");
        let history = moves(&store, id).await;
        assert_eq!((history[0].0, history[0].1), (None, State::Queued));
        assert_eq!(
            history[1..],
            [
                (Some(State::Queued), State::Leased, String::new()),
                (Some(State::Leased), State::Running, detail.to_string()),
            ],
            "job {id}"
        );
    }

    // The next cycle finishes them and hands the freed targets on, each
    // with the next fence.
    let finishes = out
        .claimed
        .iter()
        .map(|c| (c.job.lease_ref().unwrap(), Outcome::Succeeded))
        .collect();
    let req = CycleRequest {
        finishes,
        claim: Some(claim_req("w-1", &["p"], 10, LONG)),
        specs: vec![("p".into(), sp)],
    };
    let out = store.cycle(&req, "w-1").await.unwrap();
    assert!(
        out.finished
            .iter()
            .all(|f| matches!(f, Ok(State::Succeeded)))
    );
    let got = starts(&out);
    assert_eq!(got, vec![(twin, Some((1, Some(2))))]);
    let locks = store.list_locks().await.unwrap();
    let mut held: Vec<(String, i64, i64)> = locks
        .iter()
        .map(|l| (l.target.clone(), l.job_id, l.fence))
        .collect();
    held.sort();
    assert_eq!(
        held,
        vec![("busy".into(), holder.id, 1), ("fresh".into(), twin, 2)]
    );
    assert_eq!(
        moves(&store, fresh).await.last().unwrap(),
        &(Some(State::Running), State::Succeeded, String::new())
    );
});

contract_test!(
    a_lost_finish_keeps_its_lock_from_the_claim,
    |store| async move {
        // The cycle's claim counts the locks of the jobs it finishes as free,
        // but only of those whose success was written: a job whose lease ran
        // out under `on_stale = hold` keeps its target quarantined.
        let sp = spec(LONG, StalePolicy::Hold);
        let (lost, fence) = running_job(&store, "w-1", "p", Some("kept"), sp).await;
        raw_exec(
            &store,
            format!("UPDATE jobs SET state = 'stale' WHERE id = {}", lost.id),
        )
        .await;
        let behind = enqueue(&store, "p", Some("kept")).await;
        let plain = enqueue(&store, "p", None).await;
        let req = CycleRequest {
            finishes: vec![(lost, Outcome::Succeeded)],
            claim: Some(claim_req("w-1", &["p"], 10, LONG)),
            specs: vec![("p".into(), sp)],
        };
        let out = store.cycle(&req, "w-1").await.unwrap();
        assert!(
            matches!(&out.finished[..], [Err(jobdeck::store::StoreError::LeaseLost(id))] if *id == lost.id),
            "{:?}",
            out.finished
        );
        assert_eq!(starts(&out), vec![(plain, Some((1, None)))]);
        assert_eq!(store.get_job(behind).await.unwrap().state, State::Queued);
        assert_eq!(store.get_job(lost.id).await.unwrap().state, State::Stale);
        let locks = store.list_locks().await.unwrap();
        let kept = locks
            .iter()
            .find(|l| l.target == "kept")
            .expect("kept lock");
        assert_eq!((kept.job_id, Some(kept.fence)), (lost.id, fence));
    }
);
