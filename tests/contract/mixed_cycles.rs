//! Cycles over a queue that mixes jobs with and without a target:
//! whichever way a backend writes them (on Postgres, a lean statement for
//! what needs no lock and the cycle function for the rest), each job gets
//! the same moves, locks and counts.

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{CycleOutcome, CycleRequest, Outcome, Store};

use crate::common::*;

/// Every job's state as the jobs themselves say, counted per state.
async fn states_of(store: &Store, ids: &[i64]) -> Vec<(State, i64)> {
    let mut counts: Vec<(State, i64)> = Vec::new();
    for id in ids {
        let state = store.get_job(*id).await.unwrap().state;
        match counts.iter_mut().find(|(s, _)| *s == state) {
            Some((_, n)) => *n += 1,
            None => counts.push((state, 1)),
        }
    }
    counts.sort_by_key(|(s, _)| *s as u8);
    counts
}

/// `Some((attempt, fence))` for a job its cycle started.
type Started = Option<(i32, Option<i64>)>;

/// The claimed jobs' ids, in the order returned, with their starts.
fn started_by_id(out: &CycleOutcome) -> Vec<(i64, Started)> {
    out.claimed.iter().map(|c| (c.job.id, c.started)).collect()
}

contract_test!(
    cycle_claims_jobs_with_and_without_targets_together,
    |store| async move {
        let sp = spec(LONG, StalePolicy::Hold);
        let first = enqueue(&store, "p", None).await;
        let on_a = enqueue(&store, "p", Some("a")).await;
        let second = enqueue(&store, "p", None).await;
        let on_b = enqueue(&store, "p", Some("b")).await;
        let all = [first, on_a, second, on_b];
        let req = CycleRequest {
            finishes: Vec::new(),
            claim: Some(claim_req("w-1", &["p"], 4, LONG)),
            specs: vec![("p".into(), sp)],
        };
        let out = store.cycle(&req, "w-1").await.unwrap();
        let claimed = started_by_id(&out);
        assert_eq!(
            claimed,
            vec![
                (first, Some((1, None))),
                (on_a, Some((1, Some(1)))),
                (second, Some((1, None))),
                (on_b, Some((1, Some(1)))),
            ],
            "all four start, in claim order, the targeted ones under their locks"
        );
        let mut holders: Vec<i64> = store
            .list_locks()
            .await
            .unwrap()
            .iter()
            .map(|l| l.job_id)
            .collect();
        holders.sort();
        assert_eq!(holders, vec![on_a, on_b]);
        assert_eq!(
            moves(&store, on_a).await[1..],
            [
                (Some(State::Queued), State::Leased, String::new()),
                (
                    Some(State::Leased),
                    State::Running,
                    "attempt 1, fence 1".to_string()
                ),
            ]
        );
        assert_eq!(
            moves(&store, second).await[1..],
            [
                (Some(State::Queued), State::Leased, String::new()),
                (Some(State::Leased), State::Running, "attempt 1".to_string()),
            ]
        );
        assert_eq!(nonzero_counts(&store).await, vec![(State::Running, 4)]);

        // All four succeed together: the targeted ones free their locks.
        let finish_all = CycleRequest {
            finishes: out
                .claimed
                .iter()
                .map(|c| (c.job.lease_ref().unwrap(), Outcome::Succeeded))
                .collect(),
            claim: Some(claim_req("w-1", &["p"], 4, LONG)),
            specs: vec![("p".into(), sp)],
        };
        let done = store.cycle(&finish_all, "w-1").await.unwrap();
        assert!(
            done.finished
                .iter()
                .all(|f| f.as_ref().ok() == Some(&State::Succeeded)),
            "{:?}",
            done.finished
        );
        assert!(done.claimed.is_empty());
        assert!(
            store.list_locks().await.unwrap().is_empty(),
            "no lock is held once its job succeeded"
        );
        assert_eq!(states_of(&store, &all).await, vec![(State::Succeeded, 4)]);
        assert_eq!(nonzero_counts(&store).await, vec![(State::Succeeded, 4)]);

        // The next targeted job on `a` takes its lock under the next fence.
        let next_on_a = enqueue(&store, "p", Some("a")).await;
        let later = enqueue(&store, "p", None).await;
        let out = store.cycle(&req, "w-1").await.unwrap();
        let claimed = started_by_id(&out);
        assert_eq!(
            claimed,
            vec![(next_on_a, Some((1, Some(2)))), (later, Some((1, None)))]
        );
    }
);
