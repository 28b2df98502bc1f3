//! Scenario 4, SQLite crash consistency: every worker SIGKILLed at a random
//! moment, in the middle of claims, starts, renewals and finishes, ten times
//! over. After each round the file passes `PRAGMA integrity_check`; at the
//! end every job has succeeded and the ledger's invariants hold.

use std::collections::BTreeSet;
use std::time::Duration;

use jobdeck::store::NewJob;
use rand::RngExt;

use crate::audit::{self, LEDGER_STEP, descendants, pipeline, survivors};
use crate::harness::{Env, Kind, Worker};

const ROUNDS: usize = 10;
const JOBS: usize = 300;
const TARGETS: usize = 10;

fn config() -> String {
    [
        "[workers]\nlease = \"2s\"\nkill_grace = \"500ms\"\npoll = \"50ms\"\n".to_string(),
        pipeline("crash", "on_stale = \"retry\"", LEDGER_STEP),
    ]
    .concat()
}

async fn integrity(env: &Env) -> String {
    let pool = sqlx::SqlitePool::connect(&env.url)
        .await
        .expect("open the SQLite file");
    let verdict: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&pool)
        .await
        .expect("integrity_check");
    pool.close().await;
    verdict
}

async fn sqlite_crash_consistency(env: Env) {
    assert_eq!(env.kind, Kind::Sqlite);
    let config = env.config("crash.toml", &config());
    let jobs = (0..JOBS)
        .map(|n| NewJob {
            pipeline: "crash".into(),
            // Kills use attempts up (a pipeline's max_attempts is stamped by
            // `jobdeck enqueue --config`, not by the store).
            max_attempts: Some(50),
            target: Some(format!("t{n}", n = n % TARGETS)),
            ..NewJob::default()
        })
        .collect();
    let ids: BTreeSet<i64> = env
        .store
        .enqueue_many(jobs, "operator:test@host")
        .await
        .expect("enqueue")
        .into_iter()
        .collect();
    let start = |env: &Env| -> Worker { env.worker(&config, &["--slots", "4", "--no-scheduler"]) };
    let mut kills = 0;
    for round in 0..ROUNDS {
        let mut workers: Vec<Worker> = (0..3).map(|_| start(&env)).collect();
        let ms = rand::rng().random_range(400..1500);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        let mut family = Vec::new();
        for w in &workers {
            family.extend(descendants(w.pid));
        }
        for w in &mut workers {
            w.kill9().await;
            kills += 1;
        }
        let left = survivors(&family, Duration::from_millis(1500)).await;
        assert!(
            left.is_empty(),
            "round {round}: {left:?} outlived their worker"
        );
        let verdict = integrity(&env).await;
        assert_eq!(verdict, "ok", "round {round}: integrity_check");
    }

    let _workers: Vec<Worker> = (0..2).map(|_| start(&env)).collect();
    let requeued = audit::drain(&env, Duration::from_secs(120)).await;
    let runs = audit::runs(&env);
    audit::assert_exclusive(&runs);
    let cut = audit::assert_all_succeeded(&env, &ids, &runs).await;
    audit::assert_no_locks(&env).await;
    for id in ids.iter().step_by(5) {
        audit::assert_valid_history(&env, *id).await;
    }
    assert_eq!(integrity(&env).await, "ok");
    eprintln!(
        "RESULT sqlite_crash: {JOBS} jobs, {ROUNDS} rounds, {kills} SIGKILLs, {} runs, \
         {cut} cut short, {requeued} requeued, integrity ok, overlaps 0, lost 0",
        runs.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_crash() {
    crate::harness::run_on(Kind::Sqlite, 2, "sqlite_crash", sqlite_crash_consistency).await;
}
