//! `jobdeck bench --scale` end to end at a smoke size: it seeds both
//! scratch databases, times every query it lists on both, and reports a
//! positive cost for each. No timing is asserted: at this size the ratios
//! are noise; the full-size figures are in BENCHMARKS.md.
//!
//! The fix the scale check led to (per-state counts kept by triggers,
//! migration 0002) is checked here too: through every kind of move the
//! counts equal the jobs the table really holds.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use jobdeck::job::{StalePolicy, State};
use jobdeck::store::{CycleRequest, JobFilter, NewJob, Outcome, Store};
use serde_json::Value;

use common::*;

/// The claim plus every store call of the console's refresh, and the
/// refresh as a whole.
const QUERIES: usize = 12;

fn scale(extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = jobdeck_in(dir.path())
        .args([
            "bench",
            "--scale",
            "--scale-finished",
            "2000",
            "--scale-queued",
            "200",
            "--json",
        ])
        .args(extra)
        .output()
        .expect("run jobdeck");
    stdout_json(out, &format!("bench --scale {extra:?}"))
}

fn check(report: &Value, backend: &str) {
    assert_eq!(report["backend"], backend);
    assert_eq!(report["large"]["finished"], 2000);
    assert_eq!(report["large"]["queued"], 200);
    let small = report["small"]["jobs"].as_i64().unwrap_or(0);
    let large = report["large"]["jobs"].as_i64().unwrap_or(0);
    assert!(
        small > 0 && large > small * 5,
        "seeded {small} and {large} jobs"
    );
    for per_call in report["claimed_per_call"].as_array().expect("claims") {
        assert!(
            per_call.as_f64().unwrap_or(0.0) > 0.0,
            "a claim took no job"
        );
    }
    let queries = report["queries"].as_array().expect("queries");
    assert_eq!(queries.len(), QUERIES, "{queries:?}");
    // A claim takes jobs, so each of its samples is one call.
    assert_eq!(queries[0]["query"], "claim (limit 8)");
    assert_eq!(queries[0]["calls"], 1);
    for q in queries {
        for key in [
            "small_ms",
            "large_ms",
            "small_p95_ms",
            "large_p95_ms",
            "calls",
            "ratio",
        ] {
            let v = q[key].as_f64().unwrap_or(0.0);
            assert!(v > 0.0, "{}: {key} = {v}", q["query"]);
        }
        assert!(q["pass"].is_boolean());
    }
    assert!(report["pass"].is_boolean());
}

#[test]
fn sqlite() {
    check(&scale(&[]), "sqlite");
}

#[test]
fn postgres_with_plans() {
    let Some(url) = postgres_url("postgres scale smoke test") else {
        return;
    };
    // A set but unreachable server fails here: the bench cannot connect.
    let report = scale(&["--db", &url, "--explain"]);
    check(&report, "postgres");
    let plans = report["plans"].as_array().expect("plans with --explain");
    assert!(
        plans
            .iter()
            .any(|p| p.as_str().is_some_and(|p| p.contains("jobs_claim"))),
        "no plan of the claim among {plans:?}"
    );
}

#[test]
fn explain_on_sqlite_is_refused_up_front() {
    let out = Command::new(env!("CARGO_BIN_EXE_jobdeck"))
        .env_remove("JOBDECK_DB")
        .args(["bench", "--scale", "--explain"])
        .output()
        .expect("run jobdeck");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--explain needs a Postgres"), "{err}");
}

/// Jobs per state as the table holds them, counted from a full listing.
async fn real_counts(store: &Store) -> BTreeMap<State, i64> {
    let all = store
        .list_jobs(&JobFilter {
            limit: 100_000,
            ..JobFilter::default()
        })
        .await
        .expect("list every job");
    let mut counts: BTreeMap<State, i64> = State::ALL.iter().map(|s| (*s, 0)).collect();
    for job in all {
        *counts.entry(job.state).or_default() += 1;
    }
    counts
}

async fn counts_match(store: &Store, after: &str) {
    assert_eq!(
        store.count_by_state().await.expect("count_by_state"),
        real_counts(store).await,
        "after {after}"
    );
}

contract_test!(state_counts_follow_every_move, |store| async move {
    let sp = spec(Duration::from_millis(300), StalePolicy::Hold);
    counts_match(&store, "nothing").await;
    let batch: Vec<NewJob> = (0..30)
        .map(|i| new_job("p", Some(&format!("t{i}"))))
        .collect();
    store.enqueue_many(batch, OPERATOR).await.unwrap();
    let lone = enqueue(&store, "q", None).await;
    counts_match(&store, "enqueue").await;

    let claimed = store
        .claim(&claim_req("w-1", &["p"], 6, LONG))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 6);
    counts_match(&store, "claim").await;
    let leases: Vec<_> = claimed.iter().filter_map(|j| j.lease_ref()).collect();
    store
        .unclaim(leases[0], Duration::ZERO, "w-1", "lock busy")
        .await
        .unwrap();
    store.fail_leased(leases[1], "w-1", "held").await.unwrap();
    counts_match(&store, "unclaim and fail_leased").await;
    let starts: Vec<_> = leases[2..].iter().map(|l| (*l, sp)).collect();
    store.start_many(&starts, "w-1").await.unwrap();
    counts_match(&store, "start_many").await;
    store
        .finish_many(
            &[
                (leases[2], Outcome::Succeeded),
                (
                    leases[3],
                    Outcome::Failed {
                        error: "exit 1".into(),
                        retry: true,
                    },
                ),
            ],
            "w-1",
        )
        .await
        .unwrap();
    counts_match(&store, "finish_many").await;

    let cycle = CycleRequest {
        finishes: vec![(leases[4], Outcome::Succeeded)],
        claim: Some(claim_req("w-1", &["p"], 3, LONG)),
        specs: vec![("p".into(), sp)],
    };
    store.cycle(&cycle, "w-1").await.unwrap();
    counts_match(&store, "cycle").await;

    store.cancel(lone, OPERATOR).await.unwrap();
    store.cancel(leases[5].id, OPERATOR).await.unwrap();
    store.requeue(leases[1].id, OPERATOR).await.unwrap();
    counts_match(&store, "cancel and requeue").await;

    // The running jobs stop renewing: stale, then pruned once finished.
    tokio::time::sleep(Duration::from_millis(500)).await;
    store
        .expire_leases(Duration::from_millis(50), "reaper")
        .await
        .unwrap();
    counts_match(&store, "expire_leases").await;
    assert!(
        real_counts(&store).await[&State::Stale] > 0,
        "nothing went stale"
    );
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(
        store
            .prune_finished(Duration::from_millis(50))
            .await
            .unwrap()
            > 0
    );
    counts_match(&store, "prune_finished").await;
});

// On Postgres a single enqueue counts its own job and the count trigger
// steps aside for it (migration 0013); a bulk enqueue right after, on the
// same pool, still counts through the trigger, so the setting that tells
// the trigger to step aside must end with the single enqueue's statement.
// A deduplicated enqueue writes no job and counts none.
contract_test!(
    state_counts_follow_single_and_bulk_enqueues,
    |store| async move {
        let keyed = || NewJob {
            unique_key: Some("nightly".into()),
            ..new_job("p", None)
        };
        for round in 0..6 {
            enqueue(&store, "p", None).await;
            let bulk: Vec<NewJob> = (0..3).map(|_| new_job("q", None)).collect();
            store.enqueue_many(bulk, OPERATOR).await.unwrap();
            let first = store.enqueue(keyed(), OPERATOR).await.unwrap();
            let again = store.enqueue(keyed(), OPERATOR).await.unwrap();
            assert_eq!(
                (first.deduplicated, again.deduplicated, again.id),
                (round > 0, true, first.id),
                "round {round}"
            );
            counts_match(&store, &format!("round {round}")).await;
        }
        assert_eq!(real_counts(&store).await[&State::Queued], 6 * 4 + 1);
    }
);
